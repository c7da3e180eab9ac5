"""The float32 FMA peak (and the STREAM triad bandwidth) of the machine the benchmarks build for, measured at
the start of a run.

The measuring itself lives in the package, `jitop.tuner.peak` (the figure `jitop tune`, `jitop explain` and
`jitop cache list` divide by): a short loop built with jitop's own code generator for `jitop.Target.current()`
(the host, or the CPU named by JITOP_CPU: under JITOP_CPU=haswell it measures the AVX2 peak of an AVX-512
machine) of independent FMA chains on full vector registers, timed on one thread and on `target.threads`
threads through jitop's thread pool; and a multi-threaded triad a[i] = b[i] + s*c[i] over arrays far larger
than the caches, counted as STREAM counts (24 bytes per element). See that module for the details.

    python benchmarks/peak.py            # print the Target, the peak, the bandwidth and the checks of the loop's assembly
    python benchmarks/peak.py --asm      # and the hot loop's assembly

A run of several scripts measures once: `export_env()` puts the figures in JITOP_BENCH_PEAK, and `peak()` in
a child process reuses them when the child's Target key (CPU, features, threads, ...) is the same. Unlike the
package, the benchmarks measure afresh at the start of each run (not the figure kept in the cache).
"""
from __future__ import annotations

import argparse
import functools
import os

from jitop.target import Target
from jitop.tuner.peak import (Peak, accumulators_for, arith, check_asm, compiled, fma_loop_ir,  # noqa: F401
                              hot_loop, measure)

ENV = "JITOP_BENCH_PEAK"


@functools.cache
def _peak_for(key: str) -> Peak:
    env = os.environ.get(ENV)
    if env:
        try:
            p = Peak.from_json(env)
            if p.target_key == key:
                return p
        except (ValueError, TypeError, KeyError):
            pass
    return measure()


def peak() -> Peak:
    """The peak of Target.current(), measured once per process (or taken from JITOP_BENCH_PEAK when a parent
    process measured it for the same Target)."""
    return _peak_for(Target.current().key)


def export_env(p: Peak | None = None) -> None:
    """Hand the peak to child processes (they reuse it when their Target key is the same)."""
    os.environ[ENV] = (p or peak()).to_json()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--asm", action="store_true", help="print the hot loop's assembly")
    args = ap.parse_args()
    target = Target.current()
    p = measure(target)
    print(f"Target: {target.describe()} [{target.key}]")
    print(p.describe())
    print("hot loop check: " + (f"{arith(target)} on registers only, no memory operands, no spills"
                                if not p.asm_problems else "; ".join(p.asm_problems)))
    if args.asm:
        print(hot_loop(compiled(target)[0], arith(target)))


if __name__ == "__main__":
    main()
