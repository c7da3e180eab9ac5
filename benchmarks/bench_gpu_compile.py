"""How long compiling ONNX models for an NVIDIA GPU takes on this CPU (no GPU needed): each model loaded with
`jitop.onnx.load(path, target="cuda -arch=sm_90")`, traced and compiled (lowering, PTX from LLVM) with the
persistent cache off, then checked by ptxas where it is installed. Each compile runs in a fresh process, once
with JITOP_COMPILE_JOBS=1 (the kernels generated in one process) and once with the default (up to 4 processes,
jitop.codegen.ptx_shares). Prints a markdown table row per model: compile seconds each way, kernel launches,
distinct kernels (.entry in the PTX), PTX size, ptxas seconds (checking the default build's PTX).

    python benchmarks/onnx_models.py /tmp/onnxm           # the models, once
    python benchmarks/bench_gpu_compile.py --model-dir /tmp/onnxm
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

MODELS = [("resnet18", 1), ("resnet50", 1), ("resnet50", 8), ("mobilenet_v2", 1), ("bert_base_encoder", 1)]


def compile_once(path: str, batch: int, target: str) -> dict:
    """What compiling the model at `batch` took in this process (JITOP_COMPILE_JOBS as the environment sets it)."""
    import jitop.onnx
    from jitop.codegen.nvptx import check_ptx, ptxas_path
    from jitop.graph.gpu import compile_graph_gpu
    model = jitop.onnx.load(path, target=target)
    args = [np.zeros(tuple(d if isinstance(d, int) else batch for d in v.shape), v.dtype) for v in model.inputs]
    kf = model.kernel
    t0 = time.perf_counter()
    tr = kf.trace(args)
    built = compile_graph_gpu(kf.__name__, tr.inputs, tr.names, tr.plan, tr.results, kf.gpu).function.built
    seconds = time.perf_counter() - t0
    ptxas = None
    if ptxas_path() is not None:
        t0 = time.perf_counter()
        check_ptx(built.ptx, target.split("=")[-1] if "-arch=" in target else "sm_90")
        ptxas = time.perf_counter() - t0
    return {"seconds": seconds, "launches": len(built.kernels), "kernels": built.ptx.count(".entry"),
            "ptx_mb": len(built.ptx) / 1e6, "ptxas": ptxas}


def compile_row(path: str, batch: int, target: str) -> str:
    """The model's row: its compile in one process, then with the default jobs (each in a fresh process)."""
    from jitop.config import compile_jobs
    runs = []
    for jobs in ("1", ""):
        env = {**os.environ, "JITOP_CACHE": "0", "JITOP_COMPILE_JOBS": jobs}
        out = subprocess.run([sys.executable, __file__, "--child", path, str(batch), target], env=env, check=True,
                             capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    one, default = runs
    ptxas = "n/a" if default["ptxas"] is None else f"{default['ptxas']:.1f}"  # of the PTX linked from the runs
    name = os.path.splitext(os.path.basename(path))[0]
    return (f"| {name} | {batch} | {one['seconds']:.1f} | {default['seconds']:.1f} ({compile_jobs()}) | "
            f"{one['launches']} | {one['kernels']} | {one['ptx_mb']:.2f} | {ptxas} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", default="/tmp/onnxm", help="where benchmarks/onnx_models.py wrote the models")
    p.add_argument("--target", default="cuda -arch=sm_90")
    p.add_argument("--models", nargs="*", default=None, help="only these models (e.g. bert_base_encoder)")
    p.add_argument("--child", nargs=3, metavar=("PATH", "BATCH", "TARGET"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(compile_once(args.child[0], int(args.child[1]), args.child[2])))
        return
    print("| model | batch | compile s, 1 process | compile s, default (processes) | launches | kernels | PTX MB | "
          "ptxas s |\n|---|---|---|---|---|---|---|---|")
    for name, batch in MODELS:
        if args.models and name not in args.models:
            continue
        print(compile_row(os.path.join(args.model_dir, f"{name}.onnx"), batch, args.target), flush=True)


if __name__ == "__main__":
    main()
