"""Products of a few rows on the GPU (topi/cuda_gemv.py, the "cuda.gemv" template): a block per few columns of a
row, the reduction split over threadIdx.y (columns along threadIdx.x: B's rows read coalesced) or threadIdx.x,
the partial sums combined across the threads (a cross-thread reduction along threadIdx.y or x, which this
file also checks on its own). A traced decode step's dense layers take it instead of the SGEMM's 64-row tiles.

Results equal numpy's (the simulated GPU, tests/gpu_sim.py, or this machine's); tolerance: K float32 products
summed in any order, K eps of |A| @ |B|."""
from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest

import gpu_sim
import jitop
import sim_gpu
from jitop import te
from jitop.codegen.nvptx import check_ptx, ptxas_path
from jitop.graph.gpu import compile_graph_gpu
from jitop.graph.gpu_schedule import FEW_ROWS_COLS
from jitop.target import Target
from jitop.topi import cuda_gemv
from jitop.topi.cuda_templates import CudaGemvWorkload
from jitop.tuner import registry
from jitop.tuner.task import Task

SM90 = Target.from_string("cuda -arch=sm_90")
EPS32 = np.finfo(np.float32).eps
TY, TX = te.thread_axis("threadIdx.y"), te.thread_axis("threadIdx.x")
BX = te.thread_axis("blockIdx.x")


def _check_ptx(ptx: str) -> None:
    if ptxas_path() is not None or os.environ.get("JITOP_REQUIRE_PTXAS") == "1":
        check_ptx(ptx, "sm_90")


def _close(got: np.ndarray, a: np.ndarray, b: np.ndarray, want: np.ndarray | None = None) -> None:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = a64 @ b64 if want is None else want
    bound = (a.shape[-1] + 2) * EPS32 * (np.abs(a64) @ np.abs(b64)) + 1e-30
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= bound)


# ** the cross-thread reduction along threadIdx.y (and x, z) **

def _column_reduce(rows: int, cols: int, block: tuple[int, int, int], axis: str, reducer=te.sum,
                   dtype: str = "float32"):
    """R[j] = reduce_i X[i, j]: blocks of columns; the reduction over `axis` (block[axis] threads), the columns
    over the other thread axes."""
    X = te.placeholder((rows, cols), dtype, name="X")
    r = te.reduce_axis((0, rows), "r")
    R = te.compute((cols,), lambda j: reducer(X[r, j], axis=r), name="R")
    s = jitop.create_schedule(R)
    (j,) = s[R].op.axis
    red = {"x": block[0], "y": block[1], "z": block[2]}[axis]
    others = [a for a in "xyz" if a != axis]
    sizes = {"x": block[0], "y": block[1], "z": block[2]}
    bj, jt = s[R].split(j, factor=sizes[others[0]] * sizes[others[1]])
    j1, j0 = s[R].split(jt, factor=sizes[others[0]])
    s[R].bind(bj, BX)
    s[R].bind(j0, te.thread_axis(f"threadIdx.{others[0]}"))
    s[R].bind(j1, te.thread_axis(f"threadIdx.{others[1]}"))
    ro, rt = s[R].split(s[R].op.reduce_axis[0], factor=red)
    s[R].bind(rt, te.thread_axis(f"threadIdx.{axis}"))
    return s, [X, R]


# (block, axis): the reduced threads 1 apart (x), a power of two under a warp apart (shuffles, then shared
# memory), a warp or more apart (shared memory only), a stride that is no power of two (shared memory only)
BLOCKS = [((32, 8, 1), "y"), ((4, 16, 1), "y"), ((8, 64, 1), "y"), ((3, 16, 1), "y"), ((16, 2, 4), "z"),
          ((1, 64, 1), "y"), ((64, 4, 1), "x"), ((2, 4, 8), "y")]


@pytest.mark.parametrize("block,axis", BLOCKS, ids=str)
@pytest.mark.parametrize("reducer", [te.sum, te.max], ids=["sum", "max"])
def test_a_reduction_along_any_thread_axis_equals_numpy(block, axis, reducer) -> None:
    rng = np.random.default_rng(sum(block))
    rows, cols = 131, 45  # a tail along the reduction and along the columns
    s, args = _column_reduce(rows, cols, block, axis, reducer)
    built = jitop.build(s, args, target="cuda -arch=sm_90").built
    assert built.kernels[0].block == block
    _check_ptx(built.ptx)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    out = np.zeros(cols, np.float32)
    gpu_sim.run(jitop.lower(s, args), x, out)
    if reducer is te.max:
        np.testing.assert_array_equal(out, x.max(axis=0))
    else:
        np.testing.assert_allclose(out, x.astype(np.float64).sum(0), rtol=0,
                                   atol=(rows + 2) * EPS32 * np.abs(x).sum(0).max())


def test_a_float64_and_an_int_reduction_along_threadidx_y() -> None:
    rng = np.random.default_rng(7)
    for dtype in ("float64", "int32"):
        s, args = _column_reduce(70, 20, (4, 16, 1), "y", dtype=dtype)
        _check_ptx(jitop.build(s, args, target="cuda -arch=sm_90").built.ptx)
        x = (rng.standard_normal((70, 20)) * 100).astype(dtype)
        out = np.zeros(20, dtype)
        gpu_sim.run(jitop.lower(s, args), x, out)
        np.testing.assert_allclose(out, x.sum(0, dtype=dtype), rtol=1e-12)


def test_a_reduction_over_part_of_an_axis_is_refused() -> None:
    """Bound to 8 of threadIdx.y's 16 threads (another stage's loop sets the block): a clear error."""
    X = te.placeholder((64, 16), name="X")
    r = te.reduce_axis((0, 64), "r")
    R = te.compute((16,), lambda j: te.sum(X[r, j], axis=r), name="R")
    Y = te.compute((16, 16), lambda i, j: R[j] * 2.0, name="Y")
    s = jitop.create_schedule(Y)
    i, j = s[Y].op.axis
    s[Y].bind(i, TY)
    s[Y].bind(j, TX)
    s[R].compute_at(s[Y], j)
    _, rt = s[R].split(s[R].op.reduce_axis[0], factor=8)
    s[R].bind(rt, TY)
    with pytest.raises(jitop.errors.ScheduleError, match="reduced across 8 threads of threadIdx.y"):
        jitop.build(s, [X, Y], target="cuda -arch=sm_90")


# ** the GEMV schedule **

CONFIGS = [None, {"cols": 32, "ks": 8, "lanes": "n", "unroll": 4}, {"cols": 8, "ks": 32, "lanes": "k", "unroll": 2},
           {"cols": 3, "ks": 16, "lanes": "n", "unroll": 1}, {"cols": 64, "ks": 1, "lanes": "n", "unroll": 8},
           {"cols": 1, "ks": 128, "lanes": "k", "unroll": 1}]


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("m,n,k", [(1, 77, 50), (3, 130, 301), (1, 1, 1), (4, 9, 1000), (2, 256, 7)], ids=str)
def test_gemv_equals_numpy_for_every_config(m, n, k, cfg) -> None:
    rng = np.random.default_rng(m * n * k)
    A, B = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
    C = cuda_gemv.gemv(A, B)
    s = cuda_gemv.schedule_gemv(C, cfg)
    built = jitop.build(s, [A, B, C], target="cuda -arch=sm_90").built
    full = {**cuda_gemv.default_gemv_config(m, n, k), **(cfg or {})}
    assert built.kernels[0].grid == (-(-n // full["cols"]), m, 1)
    _check_ptx(built.ptx)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    c = np.full((m, n), np.nan, np.float32)
    gpu_sim.run(jitop.lower(s, [A, B, C]), a, b, c)
    _close(c, a, b)


def test_every_point_of_the_space_is_launchable_and_the_default_is_one() -> None:
    wl = CudaGemvWorkload(1, 768, 3072)
    task = Task("cuda.gemv", wl, SM90)
    space = task.config_space()
    assert space.index_of(registry.get("cuda.gemv").default_config(wl, SM90)) >= 0
    for config in space:
        cfg = cuda_gemv.to_gemv_cfg(config)
        assert not cuda_gemv.gemv_problems(cfg, SM90) and 32 <= cfg["cols"] * cfg["ks"] <= 1024


def test_a_bad_config_names_the_problem() -> None:
    A, B = te.placeholder((1, 64), name="A"), te.placeholder((64, 64), name="B")
    with pytest.raises(ValueError, match="ks=6 threads along k"):
        cuda_gemv.schedule_gemv(cuda_gemv.gemv(A, B), {"ks": 6})
    with pytest.raises(ValueError, match="2048 threads per block"):
        cuda_gemv.schedule_gemv(cuda_gemv.gemv(A, B), {"cols": 64, "ks": 32})
    with pytest.raises(ValueError, match="unknown config keys"):
        cuda_gemv.schedule_gemv(cuda_gemv.gemv(A, B), {"bm": 64})


def test_the_template_builds_and_checks_every_sampled_point() -> None:
    """What the tuner measures: `build` of sampled points."""
    from jitop.tuner import registry
    template = registry.get("cuda.gemv")
    rng = np.random.default_rng(3)
    for wl in (CudaGemvWorkload(2, 40, 70), CudaGemvWorkload(1, 33, 96)):
        space = template.config_space(wl, SM90)
        for index in rng.choice(len(space), 4, replace=False):
            s, (A, B, C) = template.build(wl, space.get(int(index)), SM90)
            a = rng.standard_normal(A.shape).astype(np.float32)
            b = rng.standard_normal(B.shape).astype(np.float32)
            c = np.zeros(C.shape, np.float32)
            gpu_sim.run(jitop.lower(s, [A, B, C]), a, b, c)
            _close(c, a, b)


# ** traced graphs: a decode step's dense layers **

def dense_gelu(x, w, bias):
    h = x @ w + bias
    return 0.5 * h * (1 + np.tanh(0.7978845608 * (h + 0.044715 * h ** 3)))


def projections(x, w_t, w2):
    """`x @ W.T`, then a product of x's rows (stacked where x is batched: [1, 2, k] @ [k, n])."""
    return (x @ w_t.T) @ w2


def _built(fn, args):
    kf = jitop.kernel(fn, target="cuda -arch=sm_90")
    tr = kf.trace(list(args))
    return compile_graph_gpu(fn.__name__, tr.inputs, tr.names, tr.plan, tr.results, kf.gpu).function.built


@pytest.mark.usefixtures("private_cache")
def test_a_traced_one_row_dense_layer_is_a_gemv_with_its_epilogue(monkeypatch) -> None:
    rng = np.random.default_rng(11)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((1, 96), (96, 200), (200,))]
    built = _built(dense_gelu, args)
    (kernel,) = built.kernels  # bias and GELU computed from the reduced value: one launch
    assert kernel.block[0] * kernel.block[1] == 256 and kernel.grid[1] == 1
    _check_ptx(built.ptx)
    text = jitop.kernel(dense_gelu, target="cuda -arch=sm_90").explain(*args)
    assert "template cuda.gemv" in text and "is computed from cuda.gemv's register tile (its epilogue)" in text
    sim_gpu.gpu_or_simulated(monkeypatch)
    got = np.asarray(jitop.kernel(dense_gelu, target="cuda")(*args))
    want = dense_gelu(*[a.astype(np.float64) for a in args])
    h = np.abs(args[0].astype(np.float64)) @ np.abs(args[1]) + np.abs(args[2])
    np.testing.assert_allclose(got, want, rtol=0, atol=float(((96 + 8) * EPS32 * h).max()) * 2)


@pytest.mark.usefixtures("private_cache")
@pytest.mark.parametrize("rows", [(1, 64), (1, 2, 64), (4, 64)], ids=str)
def test_transposed_weights_and_stacked_rows(rows, monkeypatch) -> None:
    rng = np.random.default_rng(len(rows))
    x = rng.standard_normal(rows).astype(np.float32)
    w_t, w2 = rng.standard_normal((48, 64)).astype(np.float32), rng.standard_normal((48, 30)).astype(np.float32)
    tasks = gpu_sim.lower_traced(jitop.kernel(projections, target="cuda -arch=sm_90"), x, w_t, w2).tasks
    # x @ W.T of few rows is the tracer's dot products of rows (a row reduction); the second product a GEMV of
    # the rows stacked
    assert [t.template for t in tasks] == ["cuda.gemv"] and tasks[0].workload.m == int(np.prod(rows[:-1]))
    sim_gpu.gpu_or_simulated(monkeypatch)
    got = np.asarray(jitop.kernel(projections, target="cuda")(x, w_t, w2))
    want = projections(*(a.astype(np.float64) for a in (x, w_t, w2)))
    scale = (np.abs(x.astype(np.float64)) @ np.abs(w_t.T)) @ np.abs(w2)
    np.testing.assert_allclose(got, want, rtol=0, atol=float((120 * EPS32 * scale).max()))


@pytest.mark.usefixtures("private_cache")
def test_five_rows_take_the_sgemm() -> None:
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((5, 96), (96, 200), (200,))]
    text = jitop.kernel(dense_gelu, target="cuda -arch=sm_90").explain(*args)
    assert "template cuda.matmul" in text and "cuda.gemv" not in text


# ** a batched product of few rows (B batched too: the graph's own schedule, no template) **

def weights_times_values(p, v):
    """A decode step's attention: each head's weights row times its value cache ([h, 1, s] @ [h, s, d])."""
    return p @ v


@pytest.mark.usefixtures("private_cache")
@pytest.mark.parametrize("shapes,dtype", [(((12, 1, 21), (12, 21, 64)), np.float32),
                                          (((3, 4, 70), (3, 70, 9)), np.float64),
                                          (((2, 2, 1, 300), (2, 1, 300, 33)), np.float32),
                                          (((5, 3, 40), (5, 40, 7)), np.int32),
                                          (((2, 1, 0), (2, 0, 5)), np.float32)], ids=str)
def test_a_batched_product_of_few_rows_splits_its_reduction_over_threads(shapes, dtype, monkeypatch) -> None:
    rng = np.random.default_rng(len(shapes[0]))
    p, v = ((rng.standard_normal(s) * (10 if dtype == np.int32 else 1)).astype(dtype) for s in shapes)
    built = _built(weights_times_values, [p, v])
    (kernel,) = built.kernels
    k = shapes[0][-1]
    threads_k = min(8, 1 << max(0, (k - 1).bit_length())) if shapes[1][-1] > 16 else kernel.block[1]
    assert kernel.block[0] * kernel.block[1] <= 256 and kernel.block[1] == threads_k
    assert kernel.grid[1] == int(np.prod(np.broadcast_shapes(shapes[0][:-1], shapes[1][:-2] + (1,))))
    _check_ptx(built.ptx)
    sim_gpu.gpu_or_simulated(monkeypatch)
    got = np.asarray(jitop.kernel(weights_times_values, target="cuda")(p, v))
    want = p @ v
    assert got.dtype == want.dtype and got.shape == want.shape
    if dtype == np.int32:
        np.testing.assert_array_equal(got, want)
    else:
        eps = np.finfo(dtype).eps
        bound = (k + 2) * eps * (np.abs(p).astype(np.float64) @ np.abs(v))
        assert np.all(np.abs(got - (p.astype(np.float64) @ v)) <= bound)


@pytest.mark.usefixtures("private_cache")
def test_a_growing_value_cache_is_one_kernel_for_every_length(monkeypatch) -> None:
    """The cache length symbolic: threadIdx.y splits a reduction of any length (below and past the threads)."""
    rng = np.random.default_rng(9)
    p, v = rng.standard_normal((4, 1, 5)).astype(np.float32), rng.standard_normal((4, 5, 40)).astype(np.float32)
    dynamic = {0: [2], 1: [1]}
    kf = jitop.kernel(weights_times_values, target="cuda -arch=sm_90")
    tr = kf.trace([p, v], dynamic=dynamic)
    (kernel,) = compile_graph_gpu(kf.__name__, tr.inputs, tr.names, tr.plan, tr.results, kf.gpu).function.built.kernels
    assert kernel.grid == (2, 4, 1) and kernel.block == (32, 8, 1)
    sim_gpu.gpu_or_simulated(monkeypatch)
    run = jitop.kernel(weights_times_values, target="cuda", dynamic={"p": (2,), "v": (1,)}, fallback=False)
    for s in (5, 2, 8, 9, 77):  # (a length of 1 is traced apart: a broadcasting size)
        p, v = rng.standard_normal((4, 1, s)).astype(np.float32), rng.standard_normal((4, s, 40)).astype(np.float32)
        _close(np.asarray(run(p, v)), p, v)
    assert run.traces == 1


# ** a costly row operand is computed once per block, not once per column **

def mlp_down(x, w1, b1, w2):
    """A GELU between two dense layers (float32 throughout: a Python float's constants keep the dtype)."""
    h = x @ w1 + b1
    return (0.5 * h * (1 + np.tanh(0.7978845608 * (h + 0.044715 * h ** 3)))) @ w2


def mlp_down_float64(x, w1, b1, w2):
    """picoGPT's GELU: np.sqrt(2 / np.pi) is a float64 scalar, so numpy computes the GELU and the second product
    in float64 (the graph's few-row schedule, not the float32 GEMV)."""
    h = x @ w1 + b1
    return (0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))) @ w2


def tanh_weights_times_values(p, v):
    return np.tanh(p) @ v


def _tanh_calls(fn, args) -> tuple[int, list[np.ndarray], gpu_sim.Traced]:
    traced = gpu_sim.lower_traced(jitop.kernel(fn, target="cuda -arch=sm_90"), *args)
    calls: Counter = Counter()
    gpu_sim.run(traced.func, *traced.arrays, *traced.outputs, calls=calls)
    return calls["tanh"], traced.outputs, traced


@pytest.mark.usefixtures("private_cache")
@pytest.mark.parametrize("fn", [mlp_down, mlp_down_float64], ids=lambda f: f.__name__)
def test_a_gelu_between_dense_layers_is_evaluated_once_per_block(fn) -> None:
    """Read where the reduction reads it, the second product's operand was evaluated once per column of its
    result (a tanh and a pow per multiply-add); each block now computes its row into shared memory first."""
    rng = np.random.default_rng(5)
    hidden, n = 256, 96
    args = [rng.standard_normal(s).astype(np.float32) for s in ((1, 64), (64, hidden), (hidden,), (hidden, n))]
    tanh, (got,), traced = _tanh_calls(fn, args)
    assert [t.template for t in traced.tasks] == ["cuda.gemv"] * (2 if fn is mlp_down else 1)
    cols = cuda_gemv.default_gemv_config(1, n, hidden, SM90)["cols"] if fn is mlp_down else FEW_ROWS_COLS
    assert tanh == -(-n // cols) * hidden < n * hidden  # blocks x k, not columns x k
    want = fn(*[a.astype(np.float64) for a in args])
    assert got.dtype == fn(*args).dtype
    h = np.abs(args[0].astype(np.float64)) @ np.abs(args[1]) + np.abs(args[2])
    scale = (h + 1) @ np.abs(args[3].astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=0, atol=float((hidden + 80) * EPS32 * scale.max()))


@pytest.mark.usefixtures("private_cache")
def test_a_batched_product_of_few_rows_computes_its_row_operand_once_per_block() -> None:
    rng = np.random.default_rng(6)
    p, v = rng.standard_normal((3, 2, 1, 40)).astype(np.float32), rng.standard_normal((2, 40, 70)).astype(np.float32)
    tanh, (got,), _ = _tanh_calls(tanh_weights_times_values, [p, v])
    assert tanh == 3 * 2 * -(-70 // FEW_ROWS_COLS) * 40
    _close(got, np.tanh(p), v)


def test_a_row_past_half_the_shared_memory_is_read_where_needed() -> None:
    """k = 8192 float32 (32 KiB) would cap the blocks an SM holds: the GEMV reads A in place, and is right."""
    k = 8192
    assert not cuda_gemv.stages_row(k, 4, SM90) and cuda_gemv.stages_row(k // 2, 4, SM90)
    A, B = te.placeholder((1, k), name="A"), te.placeholder((k, 9), name="B")
    G = te.compute((1, k), lambda i, j: te.tanh(A[i, j]), name="G")
    C = cuda_gemv.gemv(G, B)
    func = jitop.lower(cuda_gemv.schedule_gemv(C, {"cols": 8, "ks": 32}, SM90), [A, B, C])
    assert "shared" not in str(func).split("thread_reduce")[0]
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((1, k)).astype(np.float32), rng.standard_normal((k, 9)).astype(np.float32)
    c = np.zeros((1, 9), np.float32)
    calls: Counter = Counter()
    gpu_sim.run(func, a, b, c, calls=calls)
    assert calls["tanh"] == 9 * k
    _close(c, np.tanh(a), b)
