"""Compile time of deep programs under one @jitop.kernel against their depth (issue 21): it must grow
linearly, so a whole model (ONNX next) compiles in time proportional to its size.

    python benchmarks/bench_deep.py [--quick] [--no-resnet]
    python benchmarks/bench_deep.py --models [gpt2 decode resnet18]

--models (issue 23, part 6): the cold compile of bench_models' GPT-2-small block (T=128), its decode step
(S=128) and ResNet-18, each phase on its own: trace, fuse + pick, to_te + schedule (Python), lower to loop IR,
LLVM IR (Python: building and printing it), LLVM (optimise + emit object code); then the steady-state time
of a call of the compiled program (median of 20).

Programs (tests/graph/test_deep_programs.py checks them against numpy):
- chain: N elementwise ops on 1000 float32 (tanh, x * 1.0001 + 0.5 in turn), N = 250 ... 5000;
- mlp: L residual layers h = h + relu(h @ W + b), h 16x32, L = 25 ... 200;
- resnet: bottleneck ResNets on a 1x3x32x32 image, base width 4, from 1-1-1-1 blocks (17 convs) to
  ResNet-50's 3-4-6-3 (53 convs, 108 array parameters).
Each point is one cold compile (no disk cache): trace, fuse + pick configs, to loop IR + LLVM IR (Python),
LLVM (optimise + emit object code). "per unit" is the total over the depth; linear growth keeps it flat,
and the log-log slope of total time against depth is ~1 (2 would be quadratic).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

os.environ["JITOP_CACHE"] = "0"  # every point compiles cold
# one compile process: each phase is timed in the process that runs it (a user's large kernel forks its parts
# over up to 4 processes, jitop.codegen.forked)
os.environ["JITOP_COMPILE_JOBS"] = "1"

import numpy as np  # noqa: E402

import jitop  # noqa: E402
import jitop.codegen.forked as forked  # noqa: E402
from jitop.graph.compile import build, prepare  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "graph"))
from test_deep_programs import (TRACED, chain, mlp_params, residual_mlp, resnet50,  # noqa: E402
                                resnet50_convs, resnet50_params)

sys.path.insert(0, os.path.dirname(__file__))
from common import cpu_name, lscpu_model, table  # noqa: E402

_llvm_seconds = 0.0
_SPENT: dict[str, float] = {}  # seconds inside each wrapped step of the pipeline, since the last reset


def _llvm_timed(fn):
    def wrapper(*args, **kwargs):
        global _llvm_seconds
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _llvm_seconds += time.perf_counter() - t0
    return wrapper


def _timed(name: str, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _SPENT[name] = _SPENT.get(name, 0.0) + time.perf_counter() - t0
    return wrapper


forked.optimised_module = _llvm_timed(forked.optimised_module)  # LLVM: optimise, then emit object code
forked.emit_object = _llvm_timed(forked.emit_object)
_compile_module = sys.modules["jitop.graph.compile"]
_compile_module.lower = _timed("lower", _compile_module.lower)
_compile_module.compile_func = _timed("codegen", _compile_module.compile_func)


def compile_phases(fn, args: list) -> dict[str, float]:
    """Seconds of each phase of one cold compile of fn(*args); also checks it compiled (no fallback)."""
    global _llvm_seconds
    k = jitop.kernel(fn, fallback=False)
    t0 = time.perf_counter()
    tr = k.trace(list(args))
    t1 = time.perf_counter()
    prep = prepare("deep", tr.inputs, tr.names, tr.plan, tr.results)
    t2 = time.perf_counter()
    _llvm_seconds = 0.0
    exe = build(prep)
    t3 = time.perf_counter()
    assert exe is not None
    return {"trace": t1 - t0, "fuse+pick": t2 - t1, "IR (Python)": t3 - t2 - _llvm_seconds,
            "LLVM": _llvm_seconds, "total": t3 - t0, "stages": len(exe.groups), "exe": exe}


def series(name: str, unit: str, points: list[tuple[int, object, list]]) -> str:
    rows, xs, ts = [], [], []
    for depth, fn, args in points:
        p = compile_phases(fn, args)
        xs.append(depth)
        ts.append(p["total"])
        rows.append([depth, p["stages"], f"{p['trace']:.2f}", f"{p['fuse+pick']:.2f}", f"{p['IR (Python)']:.2f}",
                     f"{p['LLVM']:.2f}", f"{p['total']:.2f}", f"{1e3 * p['total'] / depth:.2f}"])
        print(f"  {name} {depth} {unit}: {p['total']:.2f} s", file=sys.stderr, flush=True)
    slope = np.polyfit(np.log(xs), np.log(ts), 1)[0] if len(xs) > 1 else math.nan
    # the last doubling alone: a quadratic pass shows there first
    last = math.log(ts[-1] / ts[-2]) / math.log(xs[-1] / xs[-2]) if len(xs) > 1 else math.nan
    head = [unit, "stages", "trace s", "fuse+pick s", "IR (Python) s", "LLVM s", "total s", f"ms per {unit[:-1]}"]
    return (f"### {name}\n\n" + table(head, rows) +
            f"\n\nlog-log slope of total time vs {unit}: {slope:.2f} over the whole range, {last:.2f} over the "
            "last step (1 = linear, 2 = quadratic)\n")


def model_phases(fn, args: list, leaves: list, repeat: int = 20) -> dict[str, float]:
    """compile_phases of fn(*args) with `IR (Python)` split into to_te + schedule, lower and LLVM IR, and the
    median time of a steady-state call of the compiled program (with the arrays `leaves`)."""
    _SPENT.clear()
    p = compile_phases(fn, args)
    codegen_python = _SPENT["codegen"] - p["LLVM"]
    p["to_te+schedule"] = p["IR (Python)"] - _SPENT["lower"] - codegen_python
    p["lower"], p["LLVM IR (Python)"] = _SPENT["lower"], codegen_python
    exe = p.pop("exe")
    exe(*leaves)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        exe(*leaves)
        times.append(time.perf_counter() - t0)
    p["call ms"] = 1e3 * float(np.median(times))
    return p


def models_table(names: list[str]) -> str:
    """The phases of a cold compile of each bench_models program named (gpt2, decode, resnet18)."""
    import bench_models as bm
    programs = {"gpt2": ("GPT-2-small block, T=128", bm.gpt2_block, lambda a: a),
                "decode": ("GPT-2-small decode step, S=128", bm.gpt2_decode_step, lambda a: a),
                "resnet18": ("ResNet-18, 1x3x224x224", bm.resnet18_forward_list, lambda a: [a[0], list(a[1:])])}
    make = {"gpt2": bm.args_gpt2, "decode": bm.args_decode, "resnet18": bm.args_resnet18}
    cols = ["trace", "fuse+pick", "to_te+schedule", "lower", "LLVM IR (Python)", "LLVM", "total"]
    rows = []
    for name in names:
        title, fn, as_params = programs[name]
        leaves = list(make[name]())
        p = model_phases(fn, as_params(leaves), leaves)
        rows.append([title, p["stages"]] + [f"{p[c]:.2f}" for c in cols] + [f"{p['call ms']:.2f}"])
        print(f"  {title}: {p['total']:.2f} s", file=sys.stderr, flush=True)
    return table(["program", "stages"] + [f"{c} s" for c in cols] + ["call ms"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer, smaller points")
    ap.add_argument("--no-resnet", action="store_true", help="skip the conv nets (the slowest series)")
    ap.add_argument("--models", nargs="*", choices=["gpt2", "decode", "resnet18"], default=None,
                    help="only the cold compile of these bench_models programs, phase by phase")
    opts = ap.parse_args()
    if opts.models is not None:
        jitop.kernel(lambda x: x + 1, fallback=False)(np.zeros(4, np.float32))  # one-time start-up, not counted
        print(f"# Cold compile of whole programs, phase by phase\n\nmachine: {lscpu_model()}, {os.cpu_count()} "
              f"cores; Target: {jitop.Target.current().describe()}; JITOP_CACHE=0\n")
        print(models_table(opts.models or ["gpt2", "decode", "resnet18"]))
        return
    rng = np.random.default_rng(0)
    print(f"# Compile time vs depth\n\nmachine: {lscpu_model()}, {os.cpu_count()} cores; "
          f"Target: {jitop.Target.current().describe()}; one cold compile per point (JITOP_CACHE=0)\n")
    x = rng.standard_normal(1000).astype(np.float32)
    chain_ops = [250, 500, 1000] if opts.quick else [250, 500, 1000, 2000, 5000]
    print(series("elementwise chain (1000 float32)", "ops",
                 [(n, lambda x, n=n: chain(x, n, TRACED), [x]) for n in chain_ops]))
    h = rng.standard_normal((16, 32)).astype(np.float32)
    mlp_layers = [25, 50] if opts.quick else [25, 50, 100, 200]
    points = []
    for layers in mlp_layers:
        ws, bs = mlp_params(layers, 32, seed=layers)
        points.append((layers, lambda h, ws=ws, bs=bs: residual_mlp(h, ws, bs, TRACED), [h]))
    print(series("residual MLP (16x32)", "layers", points))
    if not opts.no_resnet:
        img = rng.random((1, 3, 32, 32)).astype(np.float32)
        points = []
        for blocks in [(1, 1, 1, 1), (2, 2, 2, 2)] + ([] if opts.quick else [(3, 4, 6, 3)]):
            params = resnet50_params(4, 10, seed=sum(blocks), blocks=blocks)
            forward = (lambda x, params, blocks=blocks: resnet50(x, params, TRACED, blocks))  # forward(x, params)
            points.append((len(resnet50_convs(4, blocks)), forward, [img, params]))
        print(series("bottleneck ResNet (1x3x32x32, width 4; 3-4-6-3 blocks = ResNet-50)", "convs", points))


if __name__ == "__main__":
    main()
