"""GPU schedules the tests build: each returns (schedule, argument tensors, numpy reference of the inputs).

Used by test_gpu_codegen.py (loop IR, PTX, ptxas; no GPU needed) and test_gpu_run.py (run on a GPU).
"""
from __future__ import annotations

import numpy as np

import jitop
from jitop import te

BX, BY = te.thread_axis("blockIdx.x"), te.thread_axis("blockIdx.y")
TX, TY = te.thread_axis("threadIdx.x"), te.thread_axis("threadIdx.y")


def elementwise(n, threads: int = 128, dtype: str = "float32"):
    """C = exp(A) * B + 1 over a 1-D range split into blocks of `threads` (n may be a te.size_var)."""
    A = te.placeholder((n,), dtype, name="A")
    B = te.placeholder((n,), dtype, name="B")
    C = te.compute((n,), lambda i: te.exp(A[i]) * B[i] + 1.0, name="C")
    s = jitop.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=threads)
    s[C].bind(bx, BX)
    s[C].bind(tx, TX)
    return s, [A, B, C], lambda a, b: np.exp(a) * b + 1


def matmul_shared(m: int, n: int, k: int, tile: int = 16):
    """C = A @ B with tile x tile blocks, A and B tiles staged in shared memory, one output per thread."""
    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), "r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    s = jitop.create_schedule(C)
    AA, BB = s.cache_read(A, "shared", [C]), s.cache_read(B, "shared", [C])
    bi, ti = s[C].split(C.op.axis[0], factor=tile)
    bj, tj = s[C].split(C.op.axis[1], factor=tile)
    ro, ri = s[C].split(r, factor=tile)
    s[C].reorder(bi, bj, ti, tj, ro, ri)
    for iv, tag in ((bi, BY), (bj, BX), (ti, TY), (tj, TX)):
        s[C].bind(iv, tag)
    for X in (AA, BB):
        s[X].compute_at(s[C], ro)
        s[X].bind(s[X].op.axis[0], TY)
        s[X].bind(s[X].op.axis[1], TX)
    return s, [A, B, C], lambda a, b: a @ b


def row_reduce(m: int, n: int, reducer=te.sum, threads: int = 128, dtype: str = "float32"):
    """R[i] = reducer over row i: one block per row, the row split over `threads` threads (cross-thread)."""
    X = te.placeholder((m, n), dtype, name="X")
    r = te.reduce_axis((0, n), "r")
    R = te.compute((m,), lambda i: reducer(X[i, r], axis=r), name="R")
    s = jitop.create_schedule(R)
    ro, ri = s[R].split(r, factor=threads)
    s[R].bind(R.op.axis[0], BX)
    s[R].bind(ri, TX)
    ref = {"sum": np.sum, "max": np.max, "min": np.min}[reducer.name]
    return s, [X, R], lambda x: ref(x, axis=1).astype(dtype)


def rows_per_block_reduce(m: int, n: int, rows: int = 4, threads: int = 32):
    """Sums of rows, `rows` rows per block along threadIdx.y, each reduced across `threads` lanes."""
    X = te.placeholder((m, n), name="X")
    r = te.reduce_axis((0, n), "r")
    R = te.compute((m,), lambda i: te.sum(X[i, r], axis=r), name="R")
    s = jitop.create_schedule(R)
    bo, bi = s[R].split(R.op.axis[0], factor=rows)
    ro, ri = s[R].split(r, factor=threads)
    s[R].reorder(bo, bi, ro, ri)
    s[R].bind(bo, BX)
    s[R].bind(bi, TY)
    s[R].bind(ri, TX)
    return s, [X, R], lambda x: x.sum(axis=1)


def gather(n: int, m: int):
    """Y[i] = X[I[i]] with indices read from memory: the access is checked at run time."""
    X = te.placeholder((n,), name="X")
    I = te.placeholder((m,), "int64", name="I")
    Y = te.compute((m,), lambda i: X[I[i]], name="Y")
    s = jitop.create_schedule(Y)
    bx, tx = s[Y].split(Y.op.axis[0], factor=64)
    s[Y].bind(bx, BX)
    s[Y].bind(tx, TX)
    return s, [X, I, Y], lambda x, idx: x[idx]


def run_tc_matmul(mode: str, m: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """topi's tensor-core matmul (TF32 or BF16 `mode`) for this process's GPU, run on random operands into a
    NaN-filled output: (the result, the float64 product, the float64 product of the operands rounded as the
    emitted code rounds them)."""
    from jitop.codegen import mma
    from jitop.topi import cuda
    target = jitop.driver.cuda_target()
    A, B = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
    C = cuda.matmul(A, B, tc=mode)
    f = jitop.build(cuda.schedule_matmul(C, {"tc": mode}, target), [A, B, C], target=target)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    c = np.full((m, n), np.nan, np.float32)
    f(a, b, c)
    exact = mma.round_operand(a, mode).astype(np.float64) @ mma.round_operand(b, mode)
    return c, a.astype(np.float64) @ b, exact
