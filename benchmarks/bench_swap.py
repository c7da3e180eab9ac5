"""Does a background rebuild hold up the program's calls? One process calls an untuned conv2d (ResNet-18's
stride-2 conv into layer3, batch 1, NCHW) in a loop; after 0.5 s a tuned record for it appears (a config
other than the default, as if the background tuner had found it) and the watcher's rebuild-and-swap runs in
a thread, as JITOP_AUTOTUNE=background does, with no tuner process beside it (only the build competes with
the program). Calls are timed during the build and outside it, with the build thread at the lowest CPU
priority (what jitop does) and, for comparison, at the program's priority.

    python benchmarks/bench_swap.py [--runs 3]
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

CHILD = """import json, sys, threading, time
import numpy as np
import jitop
from jitop import autotune
from jitop.tuner import cached
from jitop.tuner.measure import ErrorCode, MeasureResult
from jitop.tuner.records import Record
from jitop.tuner.registry import get

if sys.argv[1] == "program":
    autotune._lowest_priority = lambda: None  # the comparison: the build at the program's priority
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 128, 28, 28)).astype(np.float32)
w = (rng.standard_normal((256, 128, 3, 3)) * 0.05).astype(np.float32)
want = jitop.conv2d(x, w, stride=2, padding=1)
kf = jitop.ops.conv._conv
((key, old),) = kf.cache.items()
(task,) = old.tasks
space, default = task.config_space(), get(task.template).default_config(task.workload, task.target)
other = next(space.get(i) for i in range(7, len(space), 13) if space.get(i) != default)
cached.save_best([Record(task, other, MeasureResult((1e-6,), ErrorCode.NO_ERROR))])
build = {}


def watcher():
    time.sleep(0.5)
    build["start"] = time.perf_counter() - start
    new = autotune._build_quietly(kf, old)  # what the watcher does, without the confirmation's waits
    kf.replace(key, old, new)
    build["end"] = time.perf_counter() - start


start = time.perf_counter()
t = threading.Thread(target=watcher)
t.start()
calls, wrong = [], 0
while "end" not in build or time.perf_counter() - start < build["end"] + 0.5:
    t0 = time.perf_counter()
    out = jitop.conv2d(x, w, stride=2, padding=1)
    calls.append((t0 - start, time.perf_counter() - t0))
    wrong += not np.allclose(out, want, rtol=1e-3, atol=1e-3)
t.join()
swapped = next(iter(kf.cache.values())) is not old
print(json.dumps({"calls": calls, "build": build, "wrong": wrong, "swapped": swapped}))
"""


def run(priority: str) -> dict:
    env = {**os.environ, "JITOP_CACHE_DIR": tempfile.mkdtemp(prefix="jitop-bench-swap-"),
           "JITOP_NUM_THREADS": os.environ.get("JITOP_NUM_THREADS", "2")}
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, priority], env=env, capture_output=True, text=True,
                             check=True)
    finally:
        shutil.rmtree(env["JITOP_CACHE_DIR"], ignore_errors=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def p99(times: list[float]) -> float:
    return sorted(times)[int(0.99 * (len(times) - 1))]


def row(priority: str, r: dict) -> list:
    lo, hi = r["build"]["start"], r["build"]["end"]
    inside = [dt for t, dt in r["calls"] if lo <= t <= hi]
    outside = [dt for t, dt in r["calls"] if t >= 0.1 and not lo <= t <= hi]
    ms = lambda v: f"{v * 1e3:.2f}"  # noqa: E731
    return [priority, f"{hi - lo:.2f}", ms(statistics.median(inside)), ms(p99(inside)), ms(max(inside)),
            ms(statistics.median(outside)), ms(p99(outside)), ms(max(outside)),
            "yes" if r["swapped"] else "NO", f"{r['wrong']} of {len(r['calls'])}"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="processes per priority (alternating)")
    args = p.parse_args()
    rows = []
    for _ in range(args.runs):
        for priority in ("lowest", "program"):
            rows.append(row(priority, run(priority)))
    print(f"Calls during a background rebuild — {cpu_name()}, {os.cpu_count()} cores; conv2d 1x128x28x28 -> 256, "
          f"3x3/2, NCHW f32; ms per call\n")
    print(table(["build thread priority", "build s", "median in build", "p99 in build", "max in build",
                 "median outside", "p99 outside", "max outside", "swapped", "wrong"], rows))


if __name__ == "__main__":
    main()
