"""Background tuning with hot swap: a program calling an untuned conv2d in a loop, with
JITOP_AUTOTUNE=background, on a fresh cache directory. The child process records every call's time and the
moment each new kernel was swapped in; the table shows the per-call time before the first swap and at the end,
the tuner's budget, and the slowest call around each swap (no call waits for a build; calls do share the
interpreter with the build thread).

    python benchmarks/bench_background.py [--seconds 150] [--budget 90s] [--quick]
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

CHILD = """import json, sys, time
import numpy as np
import jitop

seconds = float(sys.argv[1])
rng = np.random.default_rng(0)
# ResNet-18's stride-2 convolution into layer3 (batch 1, NCHW): its default config is among the weakest
x = rng.standard_normal((1, 128, 28, 28)).astype(np.float32)
w = (rng.standard_normal((256, 128, 3, 3)) * 0.05).astype(np.float32)
want = jitop.conv2d(x, w, stride=2, padding=1)  # the first call compiles the default
calls, swaps, wrong, last = [], [], 0, None
start = time.perf_counter()
while time.perf_counter() - start < seconds:
    t0 = time.perf_counter()
    out = jitop.conv2d(x, w, stride=2, padding=1)
    t1 = time.perf_counter()
    calls.append((t0 - start, t1 - t0))
    wrong += not np.allclose(out, want, rtol=1e-3, atol=1e-3)
    entry = next(iter(jitop.ops.conv._conv.cache.values()), None)  # the kernel jitop.conv2d dispatches to
    if entry is not None and entry is not last:
        swaps.append(t1 - start)
        last = entry
print(json.dumps({"calls": calls, "swaps": swaps[1:], "wrong": wrong}))
"""


def run(seconds: float, budget: str) -> dict:
    cache = tempfile.mkdtemp(prefix="jitop-bench-bg-")
    env = {**os.environ, "JITOP_CACHE_DIR": cache, "JITOP_AUTOTUNE": "background", "JITOP_AUTOTUNE_BUDGET": budget,
           "JITOP_NUM_THREADS": os.environ.get("JITOP_NUM_THREADS", "2")}
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, str(seconds)], env=env, capture_output=True, text=True,
                             check=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def window(calls: list, lo: float, hi: float) -> list[float]:
    return [dt for t, dt in calls if lo <= t < hi]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=150.0, help="how long the program runs")
    p.add_argument("--budget", default="90s", help="JITOP_AUTOTUNE_BUDGET of the background tuner")
    p.add_argument("--quick", action="store_true", help="40 s, budget 20s")
    args = p.parse_args()
    seconds, budget = (40.0, "20s") if args.quick else (args.seconds, args.budget)
    r = run(seconds, budget)
    calls, swaps = r["calls"], r["swaps"]
    first = swaps[0] if swaps else seconds
    before = window(calls, 1.0, first)
    end = window(calls, seconds - 5, seconds)
    rows = [["before the first swap (from 1 s)", f"{statistics.median(before) * 1e3:.3f}", len(before)],
            ["last 5 s", f"{statistics.median(end) * 1e3:.3f}", len(end)]]
    for k, t in enumerate(swaps):
        around = window(calls, t - 1.0, t + 1.0)
        rows.append([f"swap {k + 1} at {t:.1f} s: slowest call within 1 s", f"{max(around) * 1e3:.3f}", len(around)])
    print(f"Background tuning — {cpu_name()}, {os.cpu_count()} cores; program {seconds:.0f} s, tuner budget "
          f"{budget}\n")
    print(table(["window", "ms per call (median; max for swaps)", "calls"], rows))
    speedup = statistics.median(before) / statistics.median(end)
    print(f"\nspeed-up, before the first swap -> last 5 s: {speedup:.2f}x (target >= 1.2x: "
          f"{'met' if speedup >= 1.2 else 'NOT met'}); wrong results: {r['wrong']} of {len(calls)} calls; "
          f"{len(swaps)} swap(s)")


if __name__ == "__main__":
    main()
