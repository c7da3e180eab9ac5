"""The GPU simulator (gpu_sim.py) runs real GPU schedules (topi.cuda, gpu_cases) to numpy's results on a machine
without a GPU, and catches what lockstep execution would hide: races on shared memory (a barrier taken out of an
SGEMM), out-of-bounds accesses, barriers some threads of a block never reach.

Float tolerances come from the arithmetic: a sum of K products in float32 is within K * eps * sum |a| |b| of the
exact one (eps = 2**-23 is twice the unit roundoff, which covers gamma_K = K u / (1 - K u)); a float64 numpy
reference stands for the exact value.
"""
from __future__ import annotations

import dataclasses
import itertools
import os

import numpy as np
import pytest

import gpu_cases
import gpu_sim
import jitop
from jitop import dtypes, te
from jitop.te.expr import Op, const, rewrite, var
from jitop.tir.nodes import Allocate, Barrier, Buffer, For, ForKind, IfThenElse, PrimFunc, Store, seq
from jitop.tir.passes import map_stmt
from jitop.codegen.nvptx import build_ptx, check_ptx, ptxas_path
from jitop.target import CudaTarget
from jitop.topi import cuda

EPS = float(np.finfo(np.float32).eps)
F32 = dtypes.float32


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def assert_within(got: np.ndarray, exact: np.ndarray, bound: np.ndarray) -> None:
    """|got - exact| <= bound everywhere (NaN anywhere fails)."""
    err = np.abs(got.astype(np.float64) - exact)
    ok = err <= bound
    assert ok.all(), f"{(~ok).sum()} elements off, worst {np.nanmax(err - bound):.3g} past its bound"


def assert_gemm(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """c = a @ b to K * eps * (|a| @ |b|)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert_within(c, a64 @ b64, a.shape[1] * EPS * (np.abs(a64) @ np.abs(b64)))


def sgemm(m: int, n: int, k: int, cfg: dict) -> PrimFunc:
    A, B = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
    C = cuda.matmul(A, B)
    return jitop.lower(cuda.schedule_matmul(C, cfg), [A, B, C])


def run_sgemm(func: PrimFunc, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    (m, k), (_, n) = func.params[0].shape, func.params[1].shape
    a, b = normal(rng, m, k), normal(rng, k, n)
    c = np.full((m, n), np.nan, np.float32)
    gpu_sim.run(func, a, b, c)
    return a, b, c


# ** real schedules give numpy's results **

SGEMM_CFGS = [{"bm": 16, "bn": 16, "bk": 8, "tm": 4, "tn": 4}, {"bm": 32, "bn": 16, "bk": 4, "tm": 4, "tn": 2}]


@pytest.mark.parametrize("cfg", SGEMM_CFGS, ids=["16x16x8", "32x16x4"])
@pytest.mark.parametrize("shape", [(37, 29, 45), (33, 47, 9)], ids=["37x29x45", "33x47x9"])
def test_sgemm_odd_shapes(shape, cfg, rng):
    a, b, c = run_sgemm(sgemm(*shape, cfg), rng)
    assert_gemm(c, a, b)


@pytest.mark.parametrize("shape, cfg", [((5, 3, 7), SGEMM_CFGS[0]), ((37, 29, 45), None), ((50, 1, 40), None),
                                        ((129, 131, 7), None)],
                         ids=["5x3x7-16x16x8", "37x29x45-default", "50x1x40-default", "129x131x7-default"])
def test_sgemm_tile_larger_than_the_matrix(shape, cfg, rng):
    """A matrix smaller than the block's tile: the shared tiles keep the whole tile (filled up to the matrix's
    edge), since every thread copies its register fragment from the whole tile. They were clipped to the matrix,
    and those copies read past them (on a GPU: the emitted bounds checks, GpuBuild.checked, raised IndexError).
    (m, n, k) = (50, 1, 40) and (129, 131, 7) are shapes of test_gpu_graph_matmul's GPU-only SGEMM tests."""
    func = sgemm(*shape, cfg)
    a, b, c = run_sgemm(func, rng)
    assert_gemm(c, a, b)
    assert not [c for c in build_ptx(func, "k", CudaTarget()).checked if ".shared" in c]


@pytest.mark.parametrize("shape", [(37, 29, 45), (33, 47, 9), (5, 3, 7), (64, 64, 64)])
@pytest.mark.parametrize("cfg", SGEMM_CFGS, ids=["16x16x8", "32x16x4"])
def test_double_buffered_sgemm(shape, cfg, rng):
    """stages=2 (two copies of each shared tile, one barrier per K step) gives the same C, race-free."""
    a, b, c = run_sgemm(sgemm(*shape, {**cfg, "stages": 2}), rng)
    assert_gemm(c, a, b)


def test_double_buffered_conv2d(rng):
    X, W = te.placeholder((2, 3, 9, 9), name="X"), te.placeholder((8, 3, 3, 3), name="W")
    Y = cuda.conv2d_nchw(X, W, stride=2, padding=1)
    s = cuda.schedule_conv2d(Y, {"bm": 8, "bn": 16, "bk": 4, "tm": 2, "tn": 2, "stages": 2})
    x, w = normal(rng, 2, 3, 9, 9), normal(rng, 8, 3, 3, 3)
    y = np.full(Y.shape, np.nan, np.float32)
    gpu_sim.run(jitop.lower(s, [X, W, Y]), x, w, y)
    exact, mag = conv2d_exact(x, w, 2, 1)
    assert_within(y, exact, 3 * 3 * 3 * EPS * mag)


@pytest.mark.parametrize("cfg", [{"bm": 8, "bn": 32, "bk": 4, "tm": 2, "tn": 4}, None], ids=["cfg", "default"])
@pytest.mark.parametrize("batch", [1, 2, 5])
def test_conv2d_of_a_symbolic_batch_serves_every_batch(batch, cfg, rng):
    """One implicit GEMM for any batch: its columns N*P*Q symbolic, the last column tile partly outside.
    Without a cfg, the tiles are those of a batch of SYMBOLIC_BATCH (tuned or default)."""
    n = te.size_var("n")
    X, W = te.placeholder((n, 3, 9, 7), name="X"), te.placeholder((8, 3, 3, 3), name="W")
    Y = cuda.conv2d_nchw(X, W, stride=2, padding=1)
    s = cuda.schedule_conv2d(Y, cfg)
    x, w = normal(rng, batch, 3, 9, 7), normal(rng, 8, 3, 3, 3)
    y = np.full((batch, 8, 5, 4), np.nan, np.float32)
    gpu_sim.run(jitop.lower(s, [X, W, Y]), x, w, y)
    exact, mag = conv2d_exact(x, w, 2, 1)
    assert_within(y, exact, 3 * 3 * 3 * EPS * mag)
    if batch == 1 and (ptxas_path() is not None or os.environ.get("JITOP_REQUIRE_PTXAS") == "1"):
        check_ptx(jitop.build(s, [X, W, Y], target="cuda -arch=sm_90").get_source("ptx"), "sm_90")


def test_sgemm_of_gpu_cases(rng):
    s, tensors, ref = gpu_cases.matmul_shared(40, 24, 40)
    a, b = normal(rng, 40, 40), normal(rng, 40, 24)
    c = np.full((40, 24), np.nan, np.float32)
    gpu_sim.run(jitop.lower(s, tensors), a, b, c)
    assert_gemm(c, a, b)


@pytest.mark.parametrize("threads, per_thread, rows", [(256, None, 300), (64, 4, 300), (64, 4, 299)],
                         ids=["default", "contiguous", "strided"])
def test_injective(threads, per_thread, rows, rng):
    """exp(A) * b + A // 2 with a broadcast b, and integer // and % of negative numbers (Python's convention)."""
    A, b = te.placeholder((rows, 7), name="A"), te.placeholder((7,), name="b")
    I = te.placeholder((rows, 7), "int32", name="I")
    E = te.compute((rows, 7), lambda i, j: te.exp(A[i, j]) * b[j] + A[i, j] // 2.0, name="E")
    D = te.compute((rows, 7), lambda i, j: I[i, j] // 3 + I[i, j] % 5 * 7 - te.truncdiv(I[i, j], 4), name="D")
    F = te.compute((rows, 7), lambda i, j: E[i, j] + D[i, j].astype("float32"), name="F")
    s = cuda.schedule_injective(F, threads=threads, per_thread=per_thread)
    a, bb = normal(rng, rows, 7), normal(rng, 7)
    ii = rng.integers(-50, 50, (rows, 7), dtype=np.int32)
    out = np.full((rows, 7), np.nan, np.float32)
    gpu_sim.run(jitop.lower(s, [A, b, I, F]), a, bb, ii, out)
    d = ii // 3 + ii % 5 * 7 - np.trunc(ii / 4).astype(np.int32)
    np.testing.assert_array_equal(out, np.exp(a) * bb + a // np.float32(2) + d.astype(np.float32))


def test_symbolic_size(rng):
    """A size_var read from the arrays' shapes."""
    s, tensors, ref = gpu_cases.elementwise(te.size_var("n"), threads=64)
    a, b = normal(rng, 1000), normal(rng, 1000)
    c = np.full(1000, np.nan, np.float32)
    gpu_sim.run(jitop.lower(s, tensors), a, b, c)
    np.testing.assert_array_equal(c, ref(a, b))


@pytest.mark.parametrize("shape, threads", [((5, 70), None), ((3, 300), None), ((3, 300), 64), ((2, 1000), 128)],
                         ids=["5x70", "3x300", "3x300-64", "2x1000-128"])
def test_softmax(shape, threads, rng):
    """Row maxima and sums as thread_reduce (butterflies; across warps for 64 and 128 threads)."""
    X = te.placeholder(shape, name="X")
    Y = cuda.softmax(X)
    x = normal(rng, *shape) * 4
    y = np.full(shape, np.nan, np.float32)
    gpu_sim.run(jitop.lower(cuda.schedule_row_reduce(Y, threads=threads), [X, Y]), x, y)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    exact = e / e.sum(axis=1, keepdims=True)
    assert_within(y, exact, (shape[1] + 8) * EPS * exact)  # n terms of the sum, then exp, division: a few eps


@pytest.mark.parametrize("shape", [(5, 70), (6, 256)])
def test_layer_norm(shape, rng):
    m, n = shape
    X, G, B = te.placeholder(shape, name="X"), te.placeholder((n,), name="g"), te.placeholder((n,), name="b")
    Y = cuda.layer_norm(X, G, B)
    x, g, b = normal(rng, *shape) + 3, normal(rng, n), normal(rng, n)
    y = np.full(shape, np.nan, np.float32)
    gpu_sim.run(jitop.lower(cuda.schedule_row_reduce(Y), [X, G, B, Y]), x, g, b, y)
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1, keepdims=True)
    rstd = 1 / np.sqrt(((x64 - mean) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    exact = (x64 - mean) * rstd * g + b
    # the mean is off by n eps |x|, the variance (so rstd) by a few n eps relatively, then a few roundings
    scale = (np.abs(x64 - mean) + np.abs(x64).mean(axis=1, keepdims=True)) * rstd * np.abs(g)
    assert_within(y, exact, 4 * n * EPS * scale + 4 * EPS * np.abs(b))


@pytest.mark.parametrize("case, args, red", [(gpu_cases.row_reduce, (5, 300), np.sum),
                                             (gpu_cases.row_reduce, (3, 100, te.max, 64), np.max),
                                             (gpu_cases.rows_per_block_reduce, (10, 50), np.sum)],
                         ids=["sum", "max", "rows-per-block"])
def test_row_reductions_of_gpu_cases(case, args, red, rng):
    """Every lane of a row stores the row's result: the same value, not a race."""
    s, tensors, _ = case(*args)
    m, n = args[:2]
    x, r = normal(rng, m, n), np.full(m, np.nan, np.float32)
    gpu_sim.run(jitop.lower(s, tensors), x, r)
    assert_within(r, red(x.astype(np.float64), axis=1), n * EPS * np.abs(x).astype(np.float64).sum(axis=1))


@pytest.mark.parametrize("dtype, reducer", [("int32", te.min), ("int64", te.sum), ("float64", te.max)])
def test_row_reductions_of_other_dtypes(dtype, reducer, rng):
    s, tensors, ref = gpu_cases.row_reduce(6, 999, reducer, 256, dtype)
    x = rng.integers(-1000, 1000, (6, 999)).astype(dtype)
    r = np.zeros(6, dtype)
    gpu_sim.run(jitop.lower(s, tensors), x, r)
    np.testing.assert_array_equal(r, ref(x))  # integers (and float64 sums of small integers) are exact


def test_gather(rng):
    s, tensors, ref = gpu_cases.gather(100, 70)
    x, idx, y = normal(rng, 100), rng.integers(0, 100, 70), np.full(70, np.nan, np.float32)
    gpu_sim.run(jitop.lower(s, tensors), x, idx, y)
    np.testing.assert_array_equal(y, ref(x, idx))
    idx[5] = 100
    with pytest.raises(gpu_sim.OutOfBoundsError, match=r"read of X\[100\] out of bounds"):
        gpu_sim.run(jitop.lower(s, tensors), x, idx, y)


def conv2d_exact(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """The float64 convolution of x and w, and that of |x| and |w| (the error bound's sum of |products|)."""
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    p, q = (h + 2 * pad - r) // stride + 1, (wd + 2 * pad - s) // stride + 1
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out, mag = np.zeros((n, k, p, q)), np.zeros((n, k, p, q))
    for i, j in itertools.product(range(r), range(s)):
        patch = xp[:, :, i:i + stride * p:stride, j:j + stride * q:stride]
        out += np.einsum("nchw,kc->nkhw", patch, w[:, :, i, j].astype(np.float64))
        mag += np.einsum("nchw,kc->nkhw", np.abs(patch), np.abs(w[:, :, i, j]).astype(np.float64))
    return out, mag


@pytest.mark.parametrize("k, c, cfg", [(8, 3, {"bm": 8, "bn": 16, "bk": 8, "tm": 2, "tn": 2}), (16, 4, None)],
                         ids=["8x3-8x16x8", "16x4-default"])
def test_conv2d(k, c, cfg, rng):
    """The implicit GEMM: im2col taps inside the padding read 0 through a guarded select. 16 output channels
    and C*R*S = 4 are less than the default tile (bm = 32, bk = 8)."""
    r = 3 if c == 3 else 1
    X, W = te.placeholder((2, c, 9, 9), name="X"), te.placeholder((k, c, r, r), name="W")
    Y = cuda.conv2d_nchw(X, W, stride=2, padding=1)
    s = cuda.schedule_conv2d(Y, cfg)
    x, w = normal(rng, 2, c, 9, 9), normal(rng, k, c, r, r)
    y = np.full(Y.shape, np.nan, np.float32)
    gpu_sim.run(jitop.lower(s, [X, W, Y]), x, w, y)
    exact, mag = conv2d_exact(x, w, 2, 1)
    assert_within(y, exact, c * r * r * EPS * mag)


# ** the simulator fails where the code is wrong **

def without_barrier(func: PrimFunc, which: int) -> PrimFunc:
    """`func` with its `which`-th barrier (in program order) taken out."""
    seen = itertools.count()
    body = map_stmt(func.body, lambda s: None if isinstance(s, Barrier) and next(seen) == which else s)
    return dataclasses.replace(func, body=body)


@pytest.mark.parametrize("which", [0, 1], ids=["before-the-fill", "after-the-fill"])
def test_a_missing_barrier_is_a_race(which, rng):
    """Without the barrier after the fill, threads read tiles others are writing; without the one before it, the
    next K step's fill overwrites what others still read. Lockstep execution alone would give the right C."""
    func = sgemm(37, 29, 45, SGEMM_CFGS[0])
    run_sgemm(func, rng)  # the schedule as made is race-free
    with pytest.raises(gpu_sim.RaceError, match=r"data race on shared buffer '(A\.T|B)\.shared'") as err:
        run_sgemm(without_barrier(func, which), rng)
    assert "thread (" in str(err.value) and "no barrier() between" in str(err.value)


@pytest.mark.parametrize("which", [0, 1, 2], ids=["after-the-first-fill", "in-the-loop", "after-the-loop"])
def test_a_missing_barrier_of_the_double_buffered_loop_is_a_race(which, rng):
    """Each of the double-buffered SGEMM's barriers is needed: without the first, the first K step reads the tile
    others still write; without the loop's, the next step's stores overwrite the copy others still read."""
    func = sgemm(37, 29, 45, {**SGEMM_CFGS[0], "stages": 2})
    run_sgemm(func, rng)
    with pytest.raises(gpu_sim.RaceError, match=r"data race on shared buffer '(A\.T|B)\.shared'"):
        run_sgemm(without_barrier(func, which), rng)


def test_out_of_bounds_store(rng):
    """The tail thread's store one past the end of C."""
    s, tensors, _ = gpu_cases.elementwise(100, threads=64)
    func = jitop.lower(s, tensors)
    shifted = map_stmt(func.body, lambda x: Store(x.buffer, (x.indices[0] + 1,), x.value) if isinstance(x, Store)
                       else x)
    a, b, c = normal(rng, 100), normal(rng, 100), np.zeros(100, np.float32)
    with pytest.raises(gpu_sim.OutOfBoundsError, match=r"write to C\[100\] out of bounds of its shape \[100\]"):
        gpu_sim.run(dataclasses.replace(func, body=shifted), a, b, c)


def test_out_of_bounds_shared_read(rng):
    """A thread's register fragment of B read one column too far, past the end of B's shared tile."""
    func = sgemm(37, 29, 45, SGEMM_CFGS[0])

    def shift(e):
        if e.op is Op.LOAD and e.arg.name == "B.shared":
            return e.arg.load((e.src[0], e.src[1] + 1))
        return None

    def fn(s):
        return Store(s.buffer, s.indices, rewrite(s.value, shift)) if isinstance(s, Store) else s

    with pytest.raises(gpu_sim.OutOfBoundsError, match=r"read of B\.shared\[\d+, 16\] .* \(shared\) by block"):
        run_sgemm(dataclasses.replace(func, body=map_stmt(func.body, fn)), rng)


# hand-written kernels: 2 blocks of 32 threads; each thread stages A[i] in shared memory, then reads its neighbour's

BX, TX = var("bx"), var("tx")
A_BUF, OUT = Buffer("A", F32, (64,), "param"), Buffer("out", F32, (64,), "param")
TILE = Buffer("tile", F32, (32,), "shared")


def neighbours(middle, read=None) -> PrimFunc:
    """out[i] = A[the next i of the block], `middle` between the tile's fill and its read."""
    i = BX * 32 + TX
    read = read if read is not None else Store(OUT, (i,), TILE.load(((TX + 1) % 32,)))
    body = seq(Store(TILE, (TX,), A_BUF.load((i,))), middle, read)
    nest = For(BX, const(2), ForKind.BLOCK_X, For(TX, const(32), ForKind.THREAD_X, Allocate(TILE, body)))
    return PrimFunc("neighbours", (A_BUF, OUT), nest, outputs=(1,))


def run_neighbours(func: PrimFunc, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    a, out = normal(rng, 64), np.full(64, np.nan, np.float32)
    gpu_sim.run(func, a, out)
    return a, out


def test_hand_written_kernel_with_its_barrier(rng):
    a, out = run_neighbours(neighbours(Barrier()), rng)
    np.testing.assert_array_equal(out, np.roll(a.reshape(2, 32), -1, axis=1).ravel())


def test_hand_written_kernel_without_its_barrier(rng):
    with pytest.raises(gpu_sim.RaceError, match=r"'tile' at tile\[1\]: read by block \(0, 0, 0\) thread \(0, 0, 0\)"
                                                r", and written by block \(0, 0, 0\) thread \(1, 0, 0\)"):
        run_neighbours(neighbours(None), rng)


@pytest.mark.parametrize("divergent", ["if-else", "loop"])
def test_barrier_some_threads_skip(divergent, rng):
    """A barrier under a condition on threadIdx (with an else: guards_off_barriers leaves it), or in a loop whose
    trip count depends on threadIdx."""
    if divergent == "if-else":
        middle = IfThenElse(TX < 16, Barrier(), Store(OUT, (BX * 32 + TX,), const(0.0, "float32")))
    else:
        k = var("k")
        middle = For(k, TX % 2 + 1, ForKind.SERIAL, Barrier())
    with pytest.raises(gpu_sim.DivergenceError, match=r"barrier\(\) reached by 16 of the 32 threads of block"):
        run_neighbours(neighbours(middle), rng)


@pytest.mark.parametrize("scope", ["shared", "local"])
def test_unwritten_memory_reads_nan(scope, rng):
    """A read of shared or local memory no thread wrote gives NaN (never a value lockstep order left there), and
    so does a read, in the next iteration, of what a buffer allocated inside the loop held in the last one."""
    skipped = Buffer("skipped", F32, (32,), scope)
    func = neighbours(Barrier(), read=Allocate(skipped, Store(OUT, (BX * 32 + TX,), skipped.load((TX,)))))
    _, out = run_neighbours(func, rng)
    assert np.isnan(out).all()
    k = var("k")
    per_iteration = Allocate(skipped, IfThenElse(k < 1, Store(skipped, (TX,), const(1.0, "float32")),
                                                 Store(OUT, (BX * 32 + TX,), skipped.load((TX,)))))
    _, out = run_neighbours(neighbours(Barrier(), read=For(k, const(2), ForKind.SERIAL, per_iteration)), rng)
    assert np.isnan(out).all()


@pytest.mark.parametrize("max_lanes", [gpu_sim.MAX_LANES, 32], ids=["grid-at-once", "block-by-block"])
def test_blocks_writing_one_element_race(max_lanes, rng):
    """Every block writes out[tx] (another value each): a race across the blocks of a launch, whether they run
    together or one after another."""
    func = neighbours(Barrier(), read=Store(OUT, (TX,), TILE.load((TX,))))
    a, out = normal(rng, 64), np.zeros(64, np.float32)
    with pytest.raises(gpu_sim.RaceError, match=r"'out' at out\[0\]: written by block \(1, 0, 0\) thread \(0, 0, 0\), "
                                                r"and written by block \(0, 0, 0\).*blocks of one launch never"):
        gpu_sim.run(func, a, out, max_lanes=max_lanes)


def test_blocks_in_chunks_give_the_same_result(rng):
    """A grid run a block at a time (max_lanes: one block's threads) gives bit for bit what the whole grid does."""
    func = sgemm(37, 29, 45, SGEMM_CFGS[1])
    a, b = normal(rng, 37, 45), normal(rng, 45, 29)
    whole, chunked = np.full((37, 29), np.nan, np.float32), np.full((37, 29), np.nan, np.float32)
    gpu_sim.run(func, a, b, whole)
    gpu_sim.run(func, a, b, chunked, max_lanes=64)
    np.testing.assert_array_equal(whole, chunked)
    assert_gemm(whole, a, b)


def test_tensor_cores_are_not_simulated(rng):
    A, B = te.placeholder((32, 32), name="A"), te.placeholder((32, 32), name="B")
    C = cuda.matmul(A, B, tc="tf32")
    func = jitop.lower(cuda.schedule_matmul(C, {"bm": 32, "bn": 32, "bk": 8, "tm": 4, "tn": 4, "tc": "tf32"}),
                       [A, B, C])
    with pytest.raises(NotImplementedError, match="tensor-core"):
        gpu_sim.run(func, normal(rng, 32, 32), normal(rng, 32, 32), np.zeros((32, 32), np.float32))
