"""Launch overhead of `jitop_parallel_for` with an empty body.

A JIT-compiled driver calls `jitop_parallel_for` 100k times in a loop, so ctypes is not in
the figure ("hot": workers are still spinning between launches). The "after idle" row times
single launches made after the workers went to sleep on their futex (2 ms pauses), minus the
cost of the same ctypes call that launches nothing. Chunks are claimed dynamically, so with
the empty body the caller usually runs them all before a woken worker arrives: that row is
the caller's cost of waking the workers, not the wake-up latency. Last, the spread of 200 calls of
one 128x768x2304 matmul (p25..p90 and p90/p50, all threads and one, numpy alongside): a worker that
starts late must not stretch the call.

    python benchmarks/bench_launch.py
"""
from __future__ import annotations

import ctypes
import statistics
import sys
import time

import llvmlite
import numpy as np

from jitop.codegen.loader import load_object
from jitop.codegen.target import compile_ir
from jitop.runtime.parallel import parallel_for_address, set_num_threads
from jitop.target import Target

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import machine  # noqa: E402

LAUNCHES = 100_000
REPEATS = 7
N = 1024  # loop size handed to the pool; the body ignores it

DRIVER_IR = r"""
declare void @jitop_parallel_for(ptr, ptr, i64)

define void @empty_body(i64 %begin, i64 %end, ptr %closure) {
  ret void
}

define void @drive(i64 %n, i64 %reps) {
entry:
  %none = icmp sle i64 %reps, 0
  br i1 %none, label %out, label %loop
loop:
  %r = phi i64 [ 0, %entry ], [ %next, %loop ]
  call void @jitop_parallel_for(ptr @empty_body, ptr null, i64 %n)
  %next = add i64 %r, 1
  %last = icmp eq i64 %next, %reps
  br i1 %last, label %out, label %loop
out:
  ret void
}
"""


def load_driver():
    parallel_for_address()  # compiles the pool and registers the symbol the driver links to
    addrs = load_object(compile_ir(DRIVER_IR, Target.current())[1], ["drive"])
    return ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64)(addrs["drive"])


def hot_launch_us(drive) -> list[float]:
    """Per-launch time of back-to-back launches, one figure per repeat."""
    drive(N, 1_000)  # create the workers and warm up
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        drive(N, LAUNCHES)
        times.append((time.perf_counter() - t0) / LAUNCHES * 1e6)
    return times


def idle_launch_us(drive, samples: int = 200) -> list[float]:
    """Single launches after the workers fell asleep, ctypes call cost subtracted."""
    def timed(reps: int) -> float:
        time.sleep(0.002)  # longer than the ~100 us spin: workers are on their futex
        t0 = time.perf_counter()
        drive(N, reps)
        return time.perf_counter() - t0

    drive(N, 1_000)
    baseline = statistics.median(timed(0) for _ in range(samples))
    return [(timed(1) - baseline) * 1e6 for _ in range(samples)]


def main() -> None:
    threads_all = max(2, Target.current().threads)
    print(f"Parallel launch overhead — {machine()}; llvmlite {llvmlite.__version__}")
    drive = load_driver()
    rows = []
    for threads in (1, threads_all):
        set_num_threads(threads)
        rows.append((threads, "hot (back-to-back)", hot_launch_us(drive)))
    set_num_threads(threads_all)
    rows.append((threads_all, "after idle (futex wake)", idle_launch_us(drive)))
    print(f"\n{'threads':>7}  {'launch':<24} {'median us':>10} {'min us':>8}")
    for threads, mode, times in rows:
        print(f"{threads:>7}  {mode:<24} {statistics.median(times):>10.3f} {min(times):>8.3f}")
    matmul_spread(threads_all)


def _call_times_ms(call, calls: int) -> np.ndarray:
    for _ in range(10):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return np.array(times) * 1e3


def matmul_spread(threads: int, calls: int = 200) -> None:
    """A late worker stretches a whole call: the spread of many calls of one matmul (issue 10's
    128x768x2304), jitop on all threads and on one, numpy alongside."""
    import jitop
    rng = np.random.default_rng(0)
    a = rng.standard_normal((128, 768), dtype=np.float32)
    b = rng.standard_normal((768, 2304), dtype=np.float32)
    out = np.empty((128, 2304), np.float32)
    assert np.allclose(jitop.matmul(a, b), a @ b, rtol=1e-3, atol=1e-3)
    rows = []
    for label, n in ((f"jitop.matmul, {threads} threads", threads), ("jitop.matmul, 1 thread", 1)):
        set_num_threads(n)
        rows.append((label, _call_times_ms(lambda: jitop.matmul(a, b), calls)))
    set_num_threads(threads)
    rows.append((f"numpy a @ b (OpenBLAS {threads} threads)", _call_times_ms(lambda: np.matmul(a, b, out=out), calls)))
    print(f"\n(128, 768) @ (768, {b.shape[1]}) float32, {calls} calls (ms):")
    print(f"{'':36} {'p25':>7} {'p50':>7} {'p75':>7} {'p90':>7} {'p90/p50':>8}")
    for label, t in rows:
        p = np.percentile(t, [25, 50, 75, 90])
        print(f"{label:36} " + " ".join(f"{x:7.3f}" for x in p) + f" {p[3] / p[1]:8.2f}")


if __name__ == "__main__":
    main()
