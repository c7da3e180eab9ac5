"""TVM's "How to optimize GEMM on CPU" walk-through in jitop, float32, next to numpy.

Each step adds one schedule idea to the previous one, as in the TVM tutorial (bn=32, k split 4).
The last two rows are jitop's own choices for the Target (`jitop.Target.current()`: the host, or the CPU
named by JITOP_CPU): an mr x (v * lanes) block of C held in mr * v vector registers (the OpenBLAS/BLIS
micro-kernel shape; `register_tile` derives mr and v from the Target's vector width and register count, e.g.
6x64 = 6 x 4 zmm with AVX-512's 32 registers, 6x16 = 6 x 2 ymm with AVX2's 16) with B packed in panels as
wide as the tile, then the panel loop moved outermost so each panel of B stays in L2 while every row block
streams past it. "% of peak" is against the FP32 peak measured at the start of the run (benchmarks/peak.py):
the one-thread peak for the serial steps, the all-thread peak for the parallel ones and numpy.

    python benchmarks/bench_gemm.py [--sizes 1024 2048] [--skip-slow]
    JITOP_CPU=haswell python benchmarks/bench_gemm.py    # the AVX2 code path on an AVX-512 machine
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import jitop
from jitop import te

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import (CORETYPES, best_of, machine, numpy_label, numpy_matmul_seconds, pct_of_peak,  # noqa: E402
                    peak_gflops, table)

BN, KFACTOR = 32, 4
TARGET = jitop.Target.current()


def register_tile(target: jitop.Target = TARGET) -> tuple[int, int, int]:
    """(mr, v, lanes) of the micro-kernel: an mr x (v * lanes) float32 block of C in mr * v vector registers.

    Per k step the kernel loads v vectors of B and broadcasts mr elements of A for mr * v FMAs, so it wants
    the fewest loads per FMA, (mr + v) / (mr * v), with mr * v accumulators + v B vectors + 1 broadcast
    register fitting the Target's registers; v a power of two, so the panel width divides the usual sizes.
    AVX-512 (32 registers): 6 x 4 (6x64); AVX2 (16): 6 x 2 (6x16)."""
    regs, lanes = target.vector_registers, target.lanes(4)
    best = None
    for v in (1, 2, 4, 8):
        mr = min((regs - 1 - v) // v, 16)
        if mr < 1:
            continue
        cost = (mr + v) / (mr * v)
        if best is None or cost < best[0]:
            best = (cost, mr, v)
    _, mr, v = best
    return mr, v, lanes


def definition(n: int, packed_bn: int | None = None):
    A = te.placeholder((n, n), "float32", "A")
    B = te.placeholder((n, n), "float32", "B")
    k = te.reduce_axis((0, n), "k")
    if packed_bn is None:
        C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
        return A, B, C, None, k
    pB = te.compute((n // packed_bn, n, packed_bn), lambda x, y, z: B[y, x * packed_bn + z], name="packedB")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * pB[j // packed_bn, k, j % packed_bn], axis=k), name="C")
    return A, B, C, pB, k


def baseline(n: int):
    A, B, C, _, _ = definition(n)
    return jitop.create_schedule(C.op), [A, B, C]


def blocking(n: int, vectorize: bool = False, permute: bool = False):
    A, B, C, _, k = definition(n)
    s = jitop.create_schedule(C.op)
    xo, yo, xi, yi = s[C].tile(C.op.axis[0], C.op.axis[1], BN, BN)
    ko, ki = s[C].split(k, factor=KFACTOR)
    if permute:
        s[C].reorder(xo, yo, ko, xi, ki, yi)
    else:
        s[C].reorder(xo, yo, ko, ki, xi, yi)
    if vectorize:
        s[C].vectorize(yi)
    return s, [A, B, C]


def packing(n: int):
    A, B, C, pB, k = definition(n, BN)
    s = jitop.create_schedule(C.op)
    xo, yo, xi, yi = s[C].tile(C.op.axis[0], C.op.axis[1], BN, BN)
    ko, ki = s[C].split(k, factor=KFACTOR)
    s[C].reorder(xo, yo, ko, xi, ki, yi)
    s[C].vectorize(yi)
    x, y, z = s[pB].op.axis
    s[pB].vectorize(z)
    s[pB].parallel(x)
    return s, [A, B, C]


def write_cache(n: int, parallel: bool = False, mr: int = BN, bn: int = BN, swap: bool = False,
                registers: bool = False):
    """TVM's write-cache step (mr = bn = 32); registers=True: the mr x bn block of C is the register tile
    (k outermost in the block, the mr rows unrolled, bn vectorized)."""
    A, B, C, pB, k = definition(n, bn)
    s = jitop.create_schedule(C.op)
    CC = s.cache_write(C, "local")
    xo, yo, xi, yi = s[C].tile(C.op.axis[0], C.op.axis[1], mr, bn)
    if swap:  # keep one B panel in L2 while all row blocks stream past it
        s[C].reorder(yo, xo, xi, yi)
    s[CC].compute_at(s[C], xo if swap else yo)
    xc, yc = s[CC].op.axis
    ko, ki = s[CC].split(k, factor=KFACTOR)
    s[CC].reorder(ko, xc, ki, yc)
    s[CC].unroll(ki)
    s[CC].vectorize(yc)
    if registers:
        s[CC].reorder(ko, ki, xc, yc)
        s[CC].unroll(xc)
    s[C].vectorize(yi)
    x, y, z = s[pB].op.axis
    s[pB].vectorize(z)
    s[pB].parallel(x)
    if parallel:
        s[C].parallel(yo if swap else xo)
    return s, [A, B, C]


def register_tile_step(n: int, swap: bool = False):
    mr, v, lanes = register_tile()
    return write_cache(n, parallel=True, mr=mr, bn=v * lanes, swap=swap, registers=True)


MR, V, LANES = register_tile()
TILE = f"{MR}x{V * LANES}"
STEPS = [
    ("baseline", baseline),
    ("blocking", blocking),
    ("vectorization", lambda n: blocking(n, vectorize=True)),
    ("loop permutation", lambda n: blocking(n, vectorize=True, permute=True)),
    ("array packing", packing),
    ("write cache", write_cache),
    ("parallel", lambda n: write_cache(n, parallel=True)),
    (f"register tile {TILE} = {MR}x{V} vectors (jitop)", register_tile_step),
    ("+ B panel outermost, in L2 (jitop)", lambda n: register_tile_step(n, swap=True)),
]
SLOW = {"baseline", "blocking"}
SERIAL = {"baseline", "blocking", "vectorization", "loop permutation", "array packing", "write cache"}


def run(sizes: list[int], skip_slow: bool) -> str:
    peak_1, peak_all = peak_gflops(1), peak_gflops()
    rows = []
    for n in sizes:
        a = np.random.rand(n, n).astype(np.float32)
        b = np.random.rand(n, n).astype(np.float32)
        c = np.empty((n, n), np.float32)
        ref = a @ b
        flops = 2.0 * n ** 3
        for name, make in STEPS:
            if skip_slow and name in SLOW:
                continue
            t0 = time.perf_counter()
            f = jitop.build(*make(n), target=TARGET)
            compile_s = time.perf_counter() - t0
            secs = best_of(lambda: f(a, b, c), repeat=1 if name in SLOW else 7)
            err = float(np.abs(c - ref).max() / np.abs(ref).max())
            g = flops / secs / 1e9
            rows.append([n, name, g, pct_of_peak(g, peak_1 if name in SERIAL else peak_all),
                         f"{compile_s * 1e3:.0f}", f"{err:.1e}"])
        for _, core in CORETYPES:
            g = flops / numpy_matmul_seconds(n, n, n, core) / 1e9
            rows.append([n, numpy_label(core), g, pct_of_peak(g, peak_all), "", ""])
    return table(["N", "step", "GFLOP/s", "% of peak", "compile ms", "max rel err"], rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048])
    p.add_argument("--skip-slow", action="store_true", help="skip the baseline and blocking steps")
    args = p.parse_args()
    print(f"GEMM walk-through, float32 — {machine()}; register tile {TILE} ({MR} rows x {V} vectors of "
          f"{LANES} float32)\n")
    print(run(args.sizes, args.skip_slow))


if __name__ == "__main__":
    main()
