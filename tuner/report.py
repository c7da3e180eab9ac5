"""What a tuning run shows: progress lines while it runs, and the before/after table it returns.

Progress goes to stderr: one line per batch when stderr is not a terminal (logs, CI), one line rewritten in
place when it is. No dependency: a tuner's progress is a few numbers per task.
"""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from jitop.target import Target
from jitop.tuner.task import Task


def describe_task(task: Task) -> str:
    """A short name: "matmul 1024x1024x1024 float32", "conv2d 1x256x14x14 oc256 3x3/1 NCHW"."""
    wl = task.workload
    if task.template == "matmul":
        batch = "x".join(map(str, getattr(wl, "batch", ())))
        return f"matmul {batch + ' ' if batch else ''}{wl.m}x{wl.n}x{wl.k} {wl.dtype}"
    if task.template == "conv2d":
        return (f"conv2d {wl.n}x{wl.c}x{wl.h}x{wl.w} oc{wl.oc} {wl.kh}x{wl.kw}/{wl.stride[0]} "
                f"{wl.layout} {wl.dtype}")
    if callable(getattr(wl, "describe", None)):  # a workload that names itself (the GPU templates')
        return f"{wl.describe()} on {task.target.arch}" if getattr(task.target, "kind", "") == "cuda" else wl.describe()
    return f"{task.template} {task.key[:8]}"


def measured_peak_gflops(target: Target, at_least: float | None = None) -> float | None:
    """`target`'s FP32 peak on `target.threads` threads as measured on this machine (jitop.tuner.peak: once
    per Target, kept in the cache); None where it cannot be measured here. `at_least`: a figure a kernel
    reached, which makes a lower stored peak be measured again. Never raises: a report without % of peak is
    better than no report."""
    from jitop.tuner.peak import machine_peak
    try:
        return machine_peak(target, at_least=at_least, bandwidth=False).per_thread(target.threads)
    except Exception as err:  # noqa: BLE001 - the peak is a bonus of the report
        import warnings
        warnings.warn(f"jitop: the FP32 peak could not be measured ({type(err).__name__}: {err}); no % of peak",
                      RuntimeWarning, stacklevel=2)
        return None


@dataclass
class TaskReport:
    """One task's outcome."""

    task: Task
    count: float
    default_gflops: float
    best_gflops: float
    trials: int
    seconds: float
    best_config: str

    @property
    def speedup(self) -> float:
        return self.best_gflops / self.default_gflops if self.default_gflops > 0 else math.inf


@dataclass
class TuneReport:
    """Per-task default and best GFLOP/s, % of peak, trials and time; `print(report)` shows the table."""

    tasks: list[TaskReport]
    seconds: float
    peak_gflops: float | None = None
    split: dict | None = None   # seconds spent in build / measure / model / search
    applied: Any = None         # the apply_records serving the results in this process (`.remove()` it)

    def program_ms(self, tuned: bool) -> float:
        """Estimated time of one program run spent in the tuned tasks (calls x latency)."""
        return sum(r.count * r.task.flops / ((r.best_gflops if tuned else r.default_gflops) * 1e6)
                   for r in self.tasks if r.best_gflops > 0 and r.default_gflops > 0)

    def __str__(self) -> str:
        peak = self.peak_gflops
        head = f"{'task':<44} {'calls':>5} {'default':>9} {'tuned':>9} {'x':>5} {'%peak':>6} {'trials':>6} {'s':>6}"
        lines = [head, "-" * len(head)]
        for r in self.tasks:
            pct = f"{100 * r.best_gflops / peak:5.1f}%" if peak else "    -"
            lines.append(f"{describe_task(r.task)[:44]:<44} {r.count:>5g} {r.default_gflops:>9.1f} "
                         f"{r.best_gflops:>9.1f} {r.speedup:>5.2f} {pct:>6} {r.trials:>6} {r.seconds:>6.1f}")
        before, after = self.program_ms(False), self.program_ms(True)
        lines.append(f"program (tuned tasks): {before:.3f} ms -> {after:.3f} ms per run "
                     f"({before / after if after else math.inf:.2f}x), {self.seconds:.0f} s of tuning")
        if self.split:
            lines.append("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.split.items()))
        if peak:
            lines.append(f"GFLOP/s; %peak: of {peak:.{0 if peak >= 10 else 2}f} GFLOP/s, the FP32 FMA peak measured on this machine "
                         "(jitop.tuner.peak)")
        return "\n".join(lines)


class Progress:
    """Progress of a tuning run, per batch: task, trials, best GFLOP/s, speed-up over its default."""

    def __init__(self, stream: TextIO | None = None, enabled: bool = True):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty() and os.environ.get("TERM") != "dumb"
        self.start = time.perf_counter()

    def batch(self, task: Task, trials: int, total_trials: int, best_gflops: float, default_gflops: float) -> None:
        """One batch of `task` finished."""
        if not self.enabled:
            return
        speedup = best_gflops / default_gflops if default_gflops > 0 else math.inf
        line = (f"[{time.perf_counter() - self.start:6.1f}s] {total_trials:5d} trials | {describe_task(task)[:40]:<40} "
                f"{trials:4d} trials  best {best_gflops:7.1f} GFLOP/s  x{speedup:.2f} over default")
        self.stream.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
