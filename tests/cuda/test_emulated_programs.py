"""A cross-section of the GPU suite's programs, and sampled points of the GPU tuning spaces, run by the emulated GPU
(tests/emulated_gpu.py: the LLVM IR the NVPTX back end emitted, on this CPU) against numpy: shuffles and shared
rows, shared-memory and double-buffered matmul tiles, a convolution's register tile, symbolic sizes, a split
build's modules linked, and what a tuner on a GPU would try (FP32, TF32 and BF16 matmuls, conv2d).
"""
from __future__ import annotations

import os
import random

import numpy as np
import pytest

import emulated_gpu
import jitop
from jitop.codegen import mma
from jitop.topi.cuda_templates import CudaConv2dWorkload, CudaMatmulWorkload
from jitop.tuner.task import Task

import test_gpu_dynamic_shapes
import test_gpu_graph_conv
import test_gpu_graph_matmul
import test_gpu_rows
import test_gpu_run
import test_gpu_sim
import test_ptx_shares
from test_ptx_shares import forking  # noqa: F401  (a fixture of the split build's test)

EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture(autouse=True)
def gpu(monkeypatch):
    """The emulated GPU, for these tests and for those that ask `sim_gpu.gpu_or_simulated` for one."""
    return emulated_gpu.install(monkeypatch)


# ** programs of the GPU suite (the fixture above makes the emulated GPU theirs) **

@pytest.mark.parametrize("m,n,threads", [(5, 300, 128), (3, 17, 16), (2, 5000, 1024)])
def test_cross_thread_sums(m, n, threads) -> None:
    test_gpu_run.test_cross_thread_sum(m, n, threads)


@pytest.mark.parametrize("m,n,k", [(37, 53, 19), (130, 1, 5)])
def test_shared_memory_matmul_tiles(m, n, k) -> None:
    test_gpu_run.test_matmul_shared_tiles(m, n, k)


@pytest.mark.parametrize("n", [0, 255, 100_003])
def test_a_symbolic_size(n) -> None:
    test_gpu_run.test_symbolic_size_serves_every_n(n)


@pytest.mark.parametrize("fn", [test_gpu_rows.layer_norm, test_gpu_rows.softmax], ids=lambda f: f.__name__)
@pytest.mark.parametrize("shape", [(9, 129), (1, 1), (4, 2049)], ids=str)
def test_a_row_operator(fn, shape, monkeypatch) -> None:
    test_gpu_rows.test_a_row_operator_is_one_kernel_equal_to_numpy(fn, shape, monkeypatch)


@pytest.mark.parametrize("m,k,n", [(129, 7, 131), (50, 40, 1)], ids=str)
def test_the_double_buffered_sgemm(m, k, n, monkeypatch) -> None:
    test_gpu_graph_matmul.test_the_sgemm_equals_numpy(m, k, n, monkeypatch)


def test_a_convolution_with_its_epilogue() -> None:
    test_gpu_graph_conv.test_bias_relu_and_a_residual_run_on_the_convolutions_register_tile()


@pytest.mark.parametrize("fn, shape", [(test_gpu_dynamic_shapes.softmax, (None, 33)),
                                       (test_gpu_dynamic_shapes.mlp, (6, None))], ids=["softmax-rows", "mlp-k"])
def test_a_dim_that_varies(fn, shape, monkeypatch) -> None:
    test_gpu_dynamic_shapes.test_a_dim_that_varies_becomes_symbolic_and_later_sizes_trace_nothing(fn, shape,
                                                                                                   monkeypatch)


def test_a_split_build(forking, monkeypatch) -> None:
    test_ptx_shares.test_a_traced_function_built_by_several_processes_runs_to_numpy_s_results(forking, monkeypatch)


# ** points of the GPU tuning spaces: what a tuner on a GPU would try, each run against numpy **

def _sampled(task: Task, count: int, **fixed) -> list:
    """`count` points (JITOP_EMULATED_POINTS, if set) of the task's space with the `fixed` knob values, spread
    deterministically."""
    points = [c for c in task.config_space() if all(c[k] == v for k, v in fixed.items())]
    count = int(os.environ.get("JITOP_EMULATED_POINTS", count))
    return random.Random(task.key).sample(points, min(count, len(points)))


@pytest.mark.parametrize("precision", ["float32", "tf32", "bf16"])
def test_sampled_matmul_points_equal_numpy(precision) -> None:
    wl = CudaMatmulWorkload(100, 70, 33, precision=precision)
    task = Task("cuda.matmul", wl, jitop.driver.cuda_target())
    fixed = {} if precision == "float32" else {"tc": precision}
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((100, 33), np.float32), rng.standard_normal((33, 70), np.float32)
    for config in _sampled(task, 2, **fixed):
        s, tensors = task.build(config)
        c = np.full((100, 70), np.nan, np.float32)
        jitop.build(s, tensors, target=task.target)(a, b, c)
        if precision == "float32":
            test_gpu_sim.assert_gemm(c, a, b)
        else:  # the products of the rounded operands are exact: what is left is the float32 sum's rounding
            test_gpu_sim.assert_gemm(c, mma.round_operand(a, precision), mma.round_operand(b, precision))


def test_sampled_conv2d_points_equal_numpy() -> None:
    wl = CudaConv2dWorkload(1, 8, 10, 10, 16, 3, 3, padding=(1, 1))
    task = Task("cuda.conv2d", wl, jitop.driver.cuda_target())
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((1, 8, 10, 10), np.float32), rng.standard_normal((16, 8, 3, 3), np.float32)
    exact, mag = test_gpu_sim.conv2d_exact(x, w, 1, 1)
    for config in _sampled(task, 2):
        s, tensors = task.build(config)
        y = np.full(exact.shape, np.nan, np.float32)
        jitop.build(s, tensors, target=task.target)(x, w, y)
        test_gpu_sim.assert_within(y, exact, 8 * 9 * EPS32 * mag)


def test_a_running_sum_on_the_gpu() -> None:
    """np.cumsum on the GPU: each thread computes its element from the definition (the sum over the prefix);
    the one-pass loop is the CPU's schedule."""
    f = jitop.kernel(lambda x: (np.cumsum(x, axis=-1) * 2, np.cumprod(x, axis=0)), target="cuda", fallback=False)
    x = np.random.default_rng(7).standard_normal((3, 37)).astype(np.float32)
    got_sum, got_prod = f(x)
    np.testing.assert_allclose(got_sum, np.cumsum(x, axis=-1) * 2, rtol=40 * EPS32, atol=40 * EPS32 * 8)
    np.testing.assert_allclose(got_prod, np.cumprod(x, axis=0), rtol=4 * EPS32)


def test_an_integer_array_assignment_on_the_gpu() -> None:
    """a[idx] = v and a gather by two index arrays on the GPU: each thread finds the last value written to its
    position from the definition (a reduction over the values in order); the one ordered pass is the CPU's."""
    def scatter_and_pick(a, idx, v, rows, cols):
        a = a.copy()  # (a GPU kernel does not write its numpy arguments)
        a[idx] = v
        m = a.reshape(1, -1)
        return a * 2, m[rows * 0, cols] + m[0, rows]
    f = jitop.kernel(scatter_and_pick, target="cuda", fallback=False)
    rng = np.random.default_rng(3)
    a, v = rng.standard_normal(41).astype(np.float32), rng.standard_normal(9).astype(np.float32)
    idx, rows, cols = rng.integers(-41, 41, 9), rng.integers(0, 41, 5), rng.integers(-41, 0, 5)
    idx[3] = idx[7]  # written twice: the later value stays
    expected = scatter_and_pick(a.copy(), idx, v, rows, cols)
    for got, want in zip(f(a, idx, v, rows, cols), expected):
        np.testing.assert_array_equal(got, want)


def test_add_at_on_the_gpu() -> None:
    """np.add.at on the GPU: each thread reduces its position's values from the definition, in their order."""
    def histogram(x):
        counts = np.zeros(7, np.int32)
        np.add.at(counts, x, 1)
        return counts
    x = np.random.default_rng(4).integers(-7, 7, 300)
    np.testing.assert_array_equal(jitop.kernel(histogram, target="cuda", fallback=False)(x), histogram(x))
