"""Where a model's time goes, jitop next to onnxruntime: time per output shape, summed over the layers that
write it (jitop's loop nests by `kernel.profile`, onnxruntime's nodes by its profiler), in one process.

    python benchmarks/bench_onnx_layers.py --model resnet50 --batch 1 [--rounds 3] [--model-dir DIR]

A 4-D output is compared channels-last: onnxruntime's NCHW / NCHWc node outputs as (n, h, w, c), jitop's NHWC
nests as they are. A jitop nest that pads a convolution's input has a shape of its own (the padded one): a row
onnxruntime has nothing in (it pads inside its kernels). Each implementation is profiled
`--rounds` times, alternating, and the median per layer is taken. The columns say how many layers each
side has at that shape: fusion differs (jitop's convolutions carry their bias, residual and activation;
onnxruntime fuses some of those too), so a shape's total is what compares, not a layer's.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
for _var in ("JITOP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "2")
THREADS = int(os.environ["JITOP_NUM_THREADS"])

import numpy as np  # noqa: E402

import onnx_models as om  # noqa: E402
from common import machine, table  # noqa: E402


def jitop_layers(model, feed: dict, rounds: int, repeat: int) -> dict[tuple, list[float]]:
    """{output shape: [median ms of each nest writing it]} from `rounds` profiles."""
    times: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(rounds):
        for nest in model.kernel.profile(*feed.values(), repeat=repeat).nests:
            times[nest.writes].append(nest.ms)
    shapes: dict[tuple, list[float]] = collections.defaultdict(list)
    for writes, ms in times.items():
        dims = tuple(int(d) for d in re.findall(r"\d+", writes.split("[", 1)[1])) if "[" in writes else ()
        shapes[dims].append(float(np.median(ms)))
    return shapes


def ort_layers(path: str, feed: dict, rounds: int, repeat: int) -> dict[tuple, list[float]]:
    """{output shape (4-D as (n, h, w, c)): [median ms of each node writing it]} from onnxruntime's profiler."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = THREADS, 1
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    for _ in range(3):
        session.run(None, feed)
    for _ in range(rounds * repeat):
        session.run(None, feed)
    profile = session.end_profiling()
    events = json.load(open(profile))
    os.remove(profile)
    times: dict[str, list[float]] = collections.defaultdict(list)
    shape_of: dict[str, tuple] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"][:-len("_kernel_time")]
            times[name].append(e["dur"] / 1e3)
            out = (e["args"].get("output_type_shape") or [{}])[0]
            dims = tuple(next(iter(out.values()))) if out else ()
            shape_of[name] = (dims[0], dims[2], dims[3], dims[1]) if len(dims) == 4 else dims
    shapes: dict[tuple, list[float]] = collections.defaultdict(list)
    for name, ms in times.items():
        shapes[shape_of[name]].append(float(np.median(ms[-rounds * repeat:])))
    return shapes


def compare(ours: dict[tuple, list[float]], theirs: dict[tuple, list[float]]) -> list[list[object]]:
    """One row per output shape, the largest gap (jitop ms - onnxruntime ms) first."""
    rows = []
    for shape in set(ours) | set(theirs):
        j, o = ours.get(shape, []), theirs.get(shape, [])
        rows.append([str(shape), len(o), sum(o), len(j), sum(j), sum(j) - sum(o)])
    rows.sort(key=lambda r: -r[-1])
    total = ["total", sum(r[1] for r in rows), sum(r[2] for r in rows), sum(r[3] for r in rows),
             sum(r[4] for r in rows), sum(r[5] for r in rows)]
    fmt = [[r[0], r[1], f"{r[2]:.3f}", r[3], f"{r[4]:.3f}", f"{r[5]:+.3f}"] for r in rows + [total]]
    return fmt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50", choices=["resnet18", "resnet50", "mobilenet_v2", "bert_base_encoder"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=20, help="calls per profile")
    p.add_argument("--model-dir", default=str(pathlib.Path(tempfile.gettempdir()) / "jitop-bench-onnx"))
    args = p.parse_args()
    import jitop.onnx as jo
    print(machine())
    path = getattr(om, args.model)(args.model_dir, batch=args.batch)
    feed = om.sample_inputs(args.model, args.batch)
    model = jo.load(path, shapes={k: v.shape for k, v in feed.items()})
    model(**feed)
    ours = jitop_layers(model, feed, args.rounds, args.repeat)
    theirs = ort_layers(path, feed, args.rounds, args.repeat)
    print(f"\n{args.model}, batch {args.batch}: ms per call by output shape (sum over its layers)\n")
    print(table(["output shape", "ort layers", "ort ms", "jitop nests", "jitop ms", "jitop - ort ms"],
                compare(ours, theirs)))


if __name__ == "__main__":
    main()
