"""TVM's "How to optimize GEMM on CPU" walk-through in jitop, float32, next to numpy.

Each step adds one schedule idea to the previous one, as in the TVM tutorial (bn=32, k split 4).
The last two rows are jitop's own choices for this CPU: a 6x64 block of C held in 24 zmm registers
(the OpenBLAS/BLIS micro-kernel shape) with B packed in 64-wide panels, then the panel loop moved
outermost so each 64-wide panel of B stays in L2 while every row block streams past it.

    python benchmarks/bench_gemm.py [--sizes 1024 2048] [--skip-slow]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import jitop
from jitop import te

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import best_of, machine, numpy_matmul_seconds, table  # noqa: E402

BN, KFACTOR = 32, 4


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


def write_cache(n: int, parallel: bool = False, mr: int = BN, bn: int = BN, swap: bool = False):
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
    if mr != BN:
        s[CC].reorder(ko, ki, xc, yc)
        s[CC].unroll(xc)
    s[C].vectorize(yi)
    x, y, z = s[pB].op.axis
    s[pB].vectorize(z)
    s[pB].parallel(x)
    if parallel:
        s[C].parallel(yo if swap else xo)
    return s, [A, B, C]


STEPS = [
    ("baseline", baseline),
    ("blocking", blocking),
    ("vectorization", lambda n: blocking(n, vectorize=True)),
    ("loop permutation", lambda n: blocking(n, vectorize=True, permute=True)),
    ("array packing", packing),
    ("write cache", write_cache),
    ("parallel", lambda n: write_cache(n, parallel=True)),
    ("register tile 6x64 (jitop)", lambda n: write_cache(n, parallel=True, mr=6, bn=64)),
    ("+ B panel outermost, in L2 (jitop)", lambda n: write_cache(n, parallel=True, mr=6, bn=64, swap=True)),
]
SLOW = {"baseline", "blocking"}


def run(sizes: list[int], skip_slow: bool) -> str:
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
            f = jitop.build(*make(n))
            compile_s = time.perf_counter() - t0
            secs = best_of(lambda: f(a, b, c), repeat=1 if name in SLOW else 7)
            err = float(np.abs(c - ref).max() / np.abs(ref).max())
            rows.append([n, name, flops / secs / 1e9, f"{compile_s * 1e3:.0f}", f"{err:.1e}"])
        for label, core in (("numpy (OPENBLAS_CORETYPE=Haswell, AVX2)", "Haswell"),
                            ("numpy (OPENBLAS_CORETYPE unset, AVX-512)", None)):
            rows.append([n, label, flops / numpy_matmul_seconds(n, n, n, core) / 1e9, "", ""])
    return table(["N", "step", "GFLOP/s", "compile ms", "max rel err"], rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048])
    p.add_argument("--skip-slow", action="store_true", help="skip the baseline and blocking steps")
    args = p.parse_args()
    print(f"GEMM walk-through, float32 — {machine()}\n")
    print(run(args.sizes, args.skip_slow))


if __name__ == "__main__":
    main()
