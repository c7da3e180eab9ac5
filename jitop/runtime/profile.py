"""Time by loop nest: run a profiling build of an Executable and report where a call's time goes.

A profiling build (`compile_graph(..., profile=True)`) reads the CPU's cycle counter around each top-level
loop nest (one per fusion group, or a template's packing and product) and sums the ticks per nest; the
shares of the ticks, scaled by the measured time per call, give each nest's time. Parallel nests are timed
on the calling thread, from launch to the last worker's finish.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class NestTime:
    """One top-level loop nest: the buffers it writes, its time per call and its share of the kernel's."""

    writes: str
    ms: float
    share: float


@dataclass(frozen=True)
class Profile:
    """Loop nests of a compiled function by time, slowest first; `ms_per_call` is the whole call's mean."""

    name: str
    ms_per_call: float
    nests: tuple[NestTime, ...]

    def top(self, k: int = 10) -> str:
        """The k slowest nests as text lines."""
        lines = [f"{self.name}: {self.ms_per_call:.3f} ms per call; loop nests by time (what each writes):"]
        for t in self.nests[:k]:
            lines.append(f"  {t.ms:9.3f} ms {100 * t.share:5.1f} %  {t.writes}")
        if len(self.nests) > k:
            rest = sum(t.ms for t in self.nests[k:])
            lines.append(f"  {rest:9.3f} ms {100 * sum(t.share for t in self.nests[k:]):5.1f} %  "
                         f"({len(self.nests) - k} more nests)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.top()


def profile_executable(exe: Any, values: list[Any], repeat: int = 10) -> Profile:
    """Run a profiling build `repeat` times (after one warm-up call) on `values`; time per nest.

    >>> p = profile_executable(exe, [a, b])   # doctest: +SKIP
    >>> print(p.top(5))                       # doctest: +SKIP
    """
    counters = exe.module.profile_counters
    if counters is None:
        raise ValueError("this Executable is not a profiling build (compile_graph(..., profile=True))")
    exe.call(values)
    before = np.array(counters[:], dtype=np.float64)
    times = []
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        exe.call(values)
        times.append(time.perf_counter() - start)
    ticks = np.array(counters[:], dtype=np.float64) - before
    # each nest's share of the ticks times the mean call (the call's few microseconds outside the kernel
    # are spread over the nests: negligible for a call that takes milliseconds)
    shares = ticks / max(float(ticks.sum()), 1.0)
    per_call = float(np.mean(times)) * 1e3
    labels = exe.module.meta["profile_stages"]
    nests = sorted((NestTime(w, per_call * s, float(s)) for w, s in zip(labels, shares)), key=lambda t: -t.ms)
    return Profile(exe.module.name, per_call, tuple(nests))
