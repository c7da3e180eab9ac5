"""`@jitop.kernel(target="cuda")` computes a traced 2-D float32 matmul with topi.cuda's SGEMM (the "cuda.matmul"
template), with the config `pick` chooses for its task: a tuned record applies to the graph as to
`topi.cuda.schedule_matmul`. Other matmuls (batched, other dtypes) keep the graph's 16 x 16 schedule.

Without a GPU: the launch shapes and PTX (accepted by ptxas) show the SGEMM's block and register tiles; a record
applied changes the traced graph's launch and its cache entry. With one: results equal numpy's within
K * eps of |A| @ |B|."""
from __future__ import annotations

import os

import numpy as np
import pytest

import gpu_sim
import jitop
import sim_gpu
from jitop.codegen.nvptx import check_ptx, ptxas_path
from jitop.graph.gpu import compile_graph_gpu
from jitop.graph.gpu_schedule import MATMUL_TILE
from jitop.target import Target
from jitop.topi import cuda
from jitop.topi.cuda_space import to_cfg
from jitop.topi.cuda_templates import CudaMatmulWorkload
from jitop.tuner.measure import ErrorCode, MeasureResult
from jitop.tuner.records import Record
from jitop.tuner.task import Task

SM90 = Target.from_string("cuda -arch=sm_90")
SM90_NAME = "cuda -arch=sm_90"
EPS32 = np.finfo(np.float32).eps
# (m, k, n): square, primes, five rows (the fewest the SGEMM takes: fewer are a GEMV, tests/cuda/test_gemv.py),
# one column (M x 1: the dot products of A's rows with the column, a row reduction)
SHAPES = [(1024, 1024, 1024), (127, 61, 253), (5, 300, 77), (50, 40, 1)]


def mm(a, b):
    return a @ b


def scaled_transposed(a, b):
    return (a.T * 2) @ b


def cast_operand(a, b):
    return a.astype(np.float32) @ b


def _operands(m: int, k: int, n: int, dtype=np.float32, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)]


def _build(fn, args):
    kf = jitop.kernel(fn, target=SM90_NAME)
    tr = kf.trace(args)
    return compile_graph_gpu(fn.__name__, tr.inputs, tr.names, tr.plan, tr.results, kf.gpu).function.built


def _check_ptx(ptx: str) -> None:
    if ptxas_path() is not None or os.environ.get("JITOP_REQUIRE_PTXAS") == "1":
        check_ptx(ptx, "sm_90")


def _sgemm_launch(m: int, k: int, n: int, cfg: dict) -> tuple:
    """(grid, block, shared bytes) of the SGEMM kernel of an m x k by k x n product with `cfg`. The shared tiles
    are the block's whole tiles (every thread copies its register fragment from them, unguarded), except along a
    dim that one thread's register tile covers (m <= tm): they then shrink to the matrix."""
    grid = (-(-n // cfg["bn"]), -(-m // cfg["bm"]), 1)
    block = (cfg["bn"] // cfg["tn"], cfg["bm"] // cfg["tm"], 1)
    rows, cols = (d if d <= cfg[t] else cfg[b] for d, b, t in ((m, "bm", "tm"), (n, "bn", "tn")))
    return grid, block, (rows + cols) * cfg["bk"] * 4


def _launch(built) -> tuple:
    (kernel,) = built.kernels
    return kernel.grid, kernel.block, kernel.shared_bytes


@pytest.mark.usefixtures("private_cache")
@pytest.mark.parametrize("m,k,n", [s for s in SHAPES if s[2] != 1], ids=lambda v: str(v))
def test_a_traced_matmul_is_the_sgemm(m, k, n) -> None:
    built = _build(mm, _operands(m, k, n))
    cfg = cuda.default_matmul_config(m, n, k, SM90)
    assert _launch(built) == _sgemm_launch(m, k, n, cfg)
    # each thread accumulates a tm x tn register tile (the 16 x 16 schedule: one output per thread)
    assert built.ptx.count("fma.rn.f32") >= cfg["tm"] * cfg["tn"]
    _check_ptx(built.ptx)


@pytest.mark.usefixtures("private_cache")
def test_a_matrix_times_one_column_is_a_row_reduction() -> None:
    """A @ v (one column): the tracer's dot products of A's rows with v, the GPU's row reduction (a block per
    row, its threads' partial sums combined by warp shuffles), not the SGEMM padding its one column to a tile."""
    built = _build(mm, _operands(50, 40, 1))
    grid, block, _ = _launch(built)
    assert grid == (50, 1, 1) and block[0] >= 32 and "shfl.sync" in built.ptx
    _check_ptx(built.ptx)


@pytest.mark.usefixtures("private_cache")
@pytest.mark.parametrize("fn,dtype", [(scaled_transposed, np.float32), (cast_operand, np.int32)],
                         ids=["a.T*2", "int-cast"])
def test_fused_operands_are_computed_in_the_shared_fill(fn, dtype) -> None:
    a, b = _operands(64, 96, 80)
    a = a.T.copy() if fn is scaled_transposed else a.astype(dtype)
    built = _build(fn, [a, b])
    assert _launch(built) == _sgemm_launch(64, 96, 80, cuda.default_matmul_config(64, 80, 96, SM90))  # one kernel
    _check_ptx(built.ptx)


@pytest.mark.usefixtures("private_cache")
@pytest.mark.parametrize("args", [_operands(30, 40, 20, np.float64), [np.ones((3, 20, 7), np.float32),
                                                                      np.ones((3, 7, 11), np.float32)]],
                         ids=["float64", "batched"])
def test_other_matmuls_keep_the_graph_schedule(args) -> None:
    built = _build(mm, args)
    assert built.kernels[0].block == (MATMUL_TILE, MATMUL_TILE, 1)
    _check_ptx(built.ptx)


def dense_relu(x, w):
    return np.maximum(x @ w, 0)


@pytest.mark.usefixtures("private_cache")
@pytest.mark.parametrize("fn", [mm, dense_relu])
def test_a_batched_a_times_a_matrix_is_the_sgemm_of_its_stacked_rows(fn) -> None:
    """[2, 3, 37, 19] @ [19, 23]: one SGEMM of 222 x 19 by 19 x 23, written from its register tiles in the node's
    shape (the same bytes), its elementwise tail (relu) computed before the store: one kernel."""
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((2, 3, 37, 19)).astype(np.float32), rng.standard_normal((19, 23)).astype(np.float32)
    built = _build(fn, [x, w])
    assert [k.shared_bytes > 0 for k in built.kernels] == [True]
    assert built.kernels[0].grid == _sgemm_launch(222, 19, 23, cuda.default_matmul_config(222, 23, 19, SM90))[0]
    _check_ptx(built.ptx)
    (got,), (task,) = gpu_sim.run_traced(jitop.kernel(fn, target=SM90_NAME), x, w)
    assert task.workload == CudaMatmulWorkload(222, 23, 19)
    want = x.astype(np.float64) @ w.astype(np.float64)
    bound = 19 * EPS32 * (np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64))
    expected = want if fn is mm else np.maximum(want, 0)  # relu moves no value further from its reference
    assert got.shape == want.shape and np.all(np.abs(got - expected) <= bound)


def _tuned_record(m: int, k: int, n: int) -> tuple[Record, dict]:
    """A record of the workload's task whose config launches another block than the default."""
    task = Task("cuda.matmul", CudaMatmulWorkload(m, n, k), SM90)
    default = _sgemm_launch(m, k, n, cuda.default_matmul_config(m, n, k, SM90))
    space = task.config_space()
    config = next(c for c in map(space.get, range(len(space))) if _sgemm_launch(m, k, n, to_cfg(c))[1] != default[1])
    return Record(task, config, MeasureResult((1e-4,), ErrorCode.NO_ERROR)), to_cfg(config)


@pytest.mark.usefixtures("private_cache")
def test_an_applied_record_changes_the_graph_kernel_and_its_cache_entry(monkeypatch) -> None:
    import jitop.graph.gpu as gpu
    compiled = []
    real = gpu.compile_gpu_func
    monkeypatch.setattr(gpu, "compile_gpu_func", lambda func, target: compiled.append(1) or real(func, target))
    m, k, n = 200, 64, 96
    args = _operands(m, k, n)
    default = _launch(_build(mm, args))
    record, cfg = _tuned_record(m, k, n)
    with jitop.apply_records([record]):
        assert _launch(_build(mm, args)) == _sgemm_launch(m, k, n, cfg) != default
    assert _launch(_build(mm, args)) == default  # the default kernel again, from the cache
    assert len(compiled) == 2


def _assert_matmul_close(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """Within K * eps of |A| @ |B| (float32 summation in any order)."""
    want = a.astype(np.float64) @ b.astype(np.float64)
    bound = a.shape[-1] * EPS32 * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)) + 1e-30
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.all(np.abs(got - want) <= bound)


@pytest.mark.parametrize("m,k,n", SHAPES + [(129, 7, 131)], ids=lambda v: str(v))
def test_the_sgemm_equals_numpy(m, k, n, monkeypatch) -> None:
    if sim_gpu.gpu_or_simulated(monkeypatch) is not None and m * n * k > 1 << 22:
        pytest.skip("too large for the simulated GPU")
    a, b = _operands(m, k, n, seed=1)
    _assert_matmul_close(np.asarray(jitop.kernel(mm, target="cuda")(a, b)), a, b)


def test_fused_operands_and_a_tuned_config_equal_numpy(monkeypatch) -> None:
    sim_gpu.gpu_or_simulated(monkeypatch)
    a, b = _operands(96, 200, 80, seed=2)
    got = np.asarray(jitop.kernel(scaled_transposed, target="cuda")(a.T.copy(), b))
    _assert_matmul_close(got, a * 2, b)
    record, _ = _tuned_record(130, 70, 90)
    a, b = _operands(130, 70, 90, seed=3)
    with jitop.apply_records([record]):
        _assert_matmul_close(np.asarray(jitop.kernel(mm, target="cuda")(a, b)), a, b)
