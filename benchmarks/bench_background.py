"""Background tuning with hot swap: a program calling one untuned conv2d in a loop, with
JITOP_AUTOTUNE=background, on a fresh cache directory, for each of several layers. The child process records
every call's time, when each background build of a new kernel ran and when the kernel was swapped in. Per
layer the table shows the per-call time before the first swap and at the end, and whether a call was held up
by a build: the slowest and the 99th-percentile call while a build ran against the same for every other call
(from 1 s on; the tuner runs beside the program throughout).

    python benchmarks/bench_background.py [--seconds 120] [--budget 60s] [--layers r18-down,b4-down,odd] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cpu_name, table  # noqa: E402

# name -> (description, x shape, w shape, stride, padding)
LAYERS = {
    "r18-down": ("ResNet-18 stride-2 conv into layer3, batch 1", (1, 128, 28, 28), (256, 128, 3, 3), 2, 1),
    "b4-down": ("the same conv, batch 4", (4, 128, 28, 28), (256, 128, 3, 3), 2, 1),
    "odd": ("3x3 conv, 37 -> 53 channels at 61x61 (no tile divides)", (1, 37, 61, 61), (53, 37, 3, 3), 1, 1),
}

CHILD = """import json, sys, time
import numpy as np
import jitop
from jitop import autotune

seconds, xs, ws, stride, padding = float(sys.argv[1]), *json.loads(sys.argv[2])
rng = np.random.default_rng(0)
x = rng.standard_normal(xs).astype(np.float32)
w = (rng.standard_normal(ws) * 0.05).astype(np.float32)
builds, quietly = [], autotune._build_quietly


def timed_build(*args):  # notes when each background build ran (the benchmark's only look inside)
    t0 = time.perf_counter()
    try:
        return quietly(*args)
    finally:
        builds.append((t0 - start, time.perf_counter() - start))


autotune._build_quietly = timed_build
want = jitop.conv2d(x, w, stride=stride, padding=padding)  # the first call compiles the default
calls, swaps, wrong, last, seen, put_back = [], [], 0, None, [], 0
start = time.perf_counter()
while time.perf_counter() - start < seconds:
    t0 = time.perf_counter()
    out = jitop.conv2d(x, w, stride=stride, padding=padding)
    t1 = time.perf_counter()
    calls.append((t0 - start, t1 - t0))
    wrong += not np.allclose(out, want, rtol=1e-3, atol=1e-3)
    entry = next(iter(jitop.ops.conv._conv.cache.values()), None)  # the kernel jitop.conv2d dispatches to
    if entry is not None and entry is not last:
        put_back += any(entry is e for e in seen)  # the program found the new kernel slower: the old one again
        swaps.append(t1 - start)
        seen.append(entry)
        last = entry
print(json.dumps({"calls": calls, "swaps": swaps[1:], "builds": builds, "wrong": wrong, "put_back": put_back}))
"""


def run(layer: str, seconds: float, budget: str) -> dict:
    _, xs, ws, stride, padding = LAYERS[layer]
    cache = tempfile.mkdtemp(prefix="jitop-bench-bg-")
    env = {**os.environ, "JITOP_CACHE_DIR": cache, "JITOP_AUTOTUNE": "background", "JITOP_AUTOTUNE_BUDGET": budget,
           "JITOP_NUM_THREADS": os.environ.get("JITOP_NUM_THREADS", "2")}
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, str(seconds), json.dumps([xs, ws, stride, padding])],
                             env=env, capture_output=True, text=True, check=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def window(calls: list, lo: float, hi: float) -> list[float]:
    return [dt for t, dt in calls if lo <= t < hi]


def during(calls: list, builds: list) -> tuple[list[float], list[float]]:
    """The calls that started while a build ran (or within 0.2 s after it: the swap), and all others from 1 s."""
    inside = [(t, dt) for t, dt in calls if any(lo <= t <= hi + 0.2 for lo, hi in builds)]
    marked = set(t for t, _ in inside)
    return [dt for _, dt in inside], [dt for t, dt in calls if t >= 1.0 and t not in marked]


def p99(times: list[float]) -> float:
    return sorted(times)[int(0.99 * (len(times) - 1))]


def summarise(layer: str, r: dict, seconds: float) -> tuple[list, float]:
    calls, swaps = r["calls"], r["swaps"]
    first = swaps[0] if swaps else seconds
    before, end = window(calls, 1.0, first), window(calls, seconds - 5, seconds)
    speedup = statistics.median(before) / statistics.median(end)
    building, other = during(calls, r["builds"])
    ms = lambda v: f"{v * 1e3:.2f}" if v else "-"  # noqa: E731
    return [LAYERS[layer][0], ms(statistics.median(before)), ms(statistics.median(end)), f"{speedup:.2f}x",
            f"{len(swaps) - r['put_back']} / {r['put_back']} / {len(r['builds'])}",
            f"{sum(hi - lo for lo, hi in r['builds']):.1f}",
            ms(max(building) if building else 0), ms(p99(building) if building else 0), ms(max(other)),
            ms(p99(other)), f"{r['wrong']} of {len(calls)}"], speedup


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=120.0, help="how long each program runs")
    p.add_argument("--budget", default="60s", help="JITOP_AUTOTUNE_BUDGET of the background tuner")
    p.add_argument("--layers", default=",".join(LAYERS), help=f"comma-separated, of: {', '.join(LAYERS)}")
    p.add_argument("--quick", action="store_true", help="40 s, budget 20s, the odd layer only")
    args = p.parse_args()
    seconds, budget = (40.0, "20s") if args.quick else (args.seconds, args.budget)
    layers = ["odd"] if args.quick else [name.strip() for name in args.layers.split(",")]
    unknown = [name for name in layers if name not in LAYERS]
    if unknown:
        p.error(f"--layers: unknown {', '.join(unknown)}; expected some of {', '.join(LAYERS)}")
    rows, speedups = [], []
    for layer in layers:
        row, speedup = summarise(layer, run(layer, seconds, budget), seconds)
        rows.append(row)
        speedups.append(speedup)
    print(f"Background tuning — {cpu_name()}, {os.cpu_count()} cores; each program {seconds:.0f} s, tuner budget "
          f"{budget}; ms per call (median before the first swap and in the last 5 s; slowest and 99th percentile "
          f"of the calls during builds and of all other calls from 1 s)\n")
    print(table(["layer (batch 1 unless noted, NCHW f32)", "before", "last 5 s", "speed-up",
                 "swaps / put back / builds",
                 "build s", "max in builds", "p99 in builds", "max other", "p99 other", "wrong"], rows))
    print(f"\nspeed-up >= 1.2x (target): {sum(s >= 1.2 for s in speedups)} of {len(speedups)} layers")


if __name__ == "__main__":
    main()
