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
    python benchmarks/peak.py --stream   # and jitop's triad side by side with a C STREAM triad (gcc -O3 -fopenmp,
                                         #   same array size and thread count), alternating, 5 rounds

A run of several scripts measures once: `export_env()` puts the figures in JITOP_BENCH_PEAK, and `peak()` in
a child process reuses them when the child's Target key (CPU, features, threads, ...) is the same. Unlike the
package, the benchmarks measure afresh at the start of each run (not the figure kept in the cache).
"""
from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import tempfile

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
    return measure(bandwidth=False)  # the scripts divide by the FMA peak only


def peak() -> Peak:
    """The peak of Target.current(), measured once per process (or taken from JITOP_BENCH_PEAK when a parent
    process measured it for the same Target)."""
    return _peak_for(Target.current().key)


def export_env(p: Peak | None = None) -> None:
    """Hand the peak to child processes (they reuse it when their Target key is the same)."""
    os.environ[ENV] = (p or peak()).to_json()


C_TRIAD = r"""
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
static double now(void) { return omp_get_wtime(); }
int main(int argc, char **argv) {
    long n = atol(argv[1]);
    double *a = malloc(n * 8), *b = malloc(n * 8), *c = malloc(n * 8), s = 3.0, best = 1e30;
    #pragma omp parallel for
    for (long i = 0; i < n; i++) { a[i] = 1.0; b[i] = 2.0; c[i] = 1.0; }
    for (int r = 0; r < 10; r++) {
        double t = now();
        #pragma omp parallel for
        for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
        t = now() - t;
        if (r > 0 && t < best) best = t;
    }
    printf("%.3f %g\n", 3.0 * 8 * n / best / 1e9, a[n / 2]);
    return 0;
}
"""


def stream_comparison(target: Target, rounds: int = 5) -> None:
    """jitop's triad (jitop.tuner.peak) and a C STREAM triad of the same size and threads, alternating."""
    from jitop.runtime import parallel
    from jitop.tuner import peak as peak_mod
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        print("no C compiler: no STREAM comparison")
        return
    nbytes = peak_mod.triad_array_bytes(target)
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "triad.c"), os.path.join(tmp, "triad")
        with open(src, "w") as f:
            f.write(C_TRIAD)
        subprocess.run([gcc, "-O3", "-march=native", "-fopenmp", src, "-o", exe], check=True)
        triad = peak_mod.triad_kernel(target, nbytes // 8)
        old = parallel.get_num_threads()
        parallel.set_num_threads(target.threads)
        env = {**os.environ, "OMP_NUM_THREADS": str(target.threads), "OMP_PROC_BIND": "false"}
        print(f"STREAM triad, 3 x {nbytes >> 20} MiB float64, {target.threads} threads, GB/s (24 bytes per element):")
        print(f"{'round':>5} {'jitop':>8} {'C':>8} {'jitop/C':>8}")
        try:
            for r in range(rounds):
                j = peak_mod._triad_gbs(triad, nbytes)
                c = float(subprocess.run([exe, str(nbytes // 8)], env=env, capture_output=True, text=True,
                                         check=True).stdout.split()[0])
                print(f"{r:>5} {j:>8.1f} {c:>8.1f} {j / c:>8.2f}")
        finally:
            parallel.set_num_threads(old)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--asm", action="store_true", help="print the hot loop's assembly")
    ap.add_argument("--stream", action="store_true", help="compare jitop's triad with a C STREAM triad (needs gcc)")
    args = ap.parse_args()
    target = Target.current()
    p = measure(target)
    print(f"Target: {target.describe()} [{target.key}]")
    print(p.describe())
    print("hot loop check: " + (f"{arith(target)} on registers only, no memory operands, no spills"
                                if not p.asm_problems else "; ".join(p.asm_problems)))
    if args.asm:
        print(hot_loop(compiled(target)[0], arith(target)))
    if args.stream:
        stream_comparison(target)


if __name__ == "__main__":
    main()
