"""Compile time (lower + LLVM) and load time of a saved module.

    python benchmarks/bench_compile.py

Built for jitop.Target.current() (the host, or the CPU named by JITOP_CPU); the GEMM kernel is the
walk-through's register-tile step (bench_gemm.register_tile: its tile follows the Target).
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import jitop

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_chain import chain_schedule  # noqa: E402
from bench_gemm import TILE, register_tile_step  # noqa: E402
from common import machine, table  # noqa: E402


def timed(fn, repeat: int = 5) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def run() -> str:
    rows = []
    cases = [("chain (2**24, vectorized, parallel)", lambda: chain_schedule(2 ** 24)),
             (f"GEMM 1024 register tile {TILE}", lambda: register_tile_step(1024))]
    with tempfile.TemporaryDirectory() as d:
        for name, make in cases:
            lower_s, _ = timed(lambda: jitop.lower(*make()))
            build_s, mod = timed(lambda: jitop.build(*make()))
            path = os.path.join(d, "k.jitop")
            mod.save(path)
            load_s, _ = timed(lambda: jitop.load_module(path), repeat=20)
            rows.append([name, f"{lower_s * 1e3:.1f}", f"{build_s * 1e3:.1f}", f"{load_s * 1e3:.2f}"])
    return table(["kernel", "lower ms", "lower+LLVM (build) ms", "load saved module ms"], rows)


def main() -> None:
    print(f"Compile and load times (median) — {machine()}\n")
    print(run())


if __name__ == "__main__":
    main()
