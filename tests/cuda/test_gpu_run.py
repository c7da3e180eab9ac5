"""GPU functions run on a GPU against numpy: odd shapes, several dtypes, symbolic sizes, shared-memory tiles,
cross-thread reductions, device arrays in and out, checked accesses. Where there is no GPU (CI) they run on the
simulated one (tests/sim_gpu.py: the runtime's launches executed by the GPU simulator), except the checked
accesses, which the simulator stops at the access itself; benchmarks/gpu_check.sh runs them all on a GPU."""
from __future__ import annotations

import numpy as np
import pytest

import gpu_cases
import jitop
import sim_gpu
from jitop import te

driver = pytest.importorskip("jitop.runtime.cuda.driver")
memory = pytest.importorskip("jitop.runtime.cuda.memory")
REAL_GPU = driver.available()


@pytest.fixture(autouse=True)
def gpu(monkeypatch):
    """This machine's GPU, or where it has none the simulated one (tests/sim_gpu.py)."""
    return sim_gpu.gpu_or_simulated(monkeypatch)
EPS32 = np.finfo(np.float32).eps


def build(case, *args, **kw):
    s, tensors, ref = case(*args, **kw)
    return jitop.build(s, tensors, target="cuda"), ref


def rand(shape, dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-100, 100, shape).astype(dtype)


@pytest.mark.parametrize("n", [1, 7, 128, 1000, 4099])
def test_elementwise(n):
    f, ref = build(gpu_cases.elementwise, n)
    a, b = rand(n), rand(n, seed=1)
    np.testing.assert_allclose(f(a, b), ref(a, b), rtol=4 * EPS32, atol=4 * EPS32)


def test_elementwise_float64_and_outputs_given():
    f, ref = build(gpu_cases.elementwise, 77, 32, "float64")
    a, b = rand(77, "float64"), rand(77, "float64", 1)
    out = np.empty(77)
    assert f(a, b, out) is None
    np.testing.assert_allclose(out, ref(a, b), rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("n", [0, 1, 255, 256, 100_003])
def test_symbolic_size_serves_every_n(n):
    f, ref = build(gpu_cases.elementwise, te.size_var("n"), 256)
    a, b = rand(n), rand(n, seed=2)
    got = f(a, b)
    assert got.shape == (n,) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref(a, b), rtol=4 * EPS32, atol=4 * EPS32)


@pytest.mark.parametrize("m,n,k", [(64, 64, 64), (37, 53, 19), (1, 17, 300), (130, 1, 5)])
def test_matmul_shared_tiles(m, n, k):
    f, ref = build(gpu_cases.matmul_shared, m, n, k)
    a, b = rand((m, k)), rand((k, n), seed=3)
    bound = k * EPS32 * (np.abs(a) @ np.abs(b))  # accumulation length x eps x the sum of |products|
    assert np.all(np.abs(f(a, b) - ref(a, b)) <= bound + 1e-30)


@pytest.mark.parametrize("m,n,threads", [(5, 300, 128), (3, 17, 16), (2, 5000, 1024), (9, 33, 32)])
def test_cross_thread_sum(m, n, threads):
    f, ref = build(gpu_cases.row_reduce, m, n, te.sum, threads)
    x = rand((m, n))
    bound = n * EPS32 * np.abs(x).sum(axis=1)
    assert np.all(np.abs(f(x) - ref(x)) <= bound)


@pytest.mark.parametrize("dtype,reducer", [("float32", te.max), ("float64", te.min), ("int64", te.sum),
                                           ("int32", te.max), ("int8", te.min)])
def test_cross_thread_reducers_and_dtypes(dtype, reducer):
    f, ref = build(gpu_cases.row_reduce, 6, 999, reducer, 256, dtype)
    x = rand((6, 999), dtype)
    np.testing.assert_array_equal(f(x), ref(x)) if dtype[0] == "i" or reducer is not te.sum else None
    if dtype[0] == "f":
        np.testing.assert_allclose(f(x), ref(x), rtol=999 * np.finfo(dtype).eps)


def test_max_propagates_nan():
    f, _ = build(gpu_cases.row_reduce, 2, 100, te.max, 32)
    x = rand((2, 100))
    x[1, 50] = np.nan
    got = f(x)
    assert got[0] == x[0].max() and np.isnan(got[1])


def test_rows_per_block():
    f, ref = build(gpu_cases.rows_per_block_reduce, 10, 100)
    x = rand((10, 100))
    np.testing.assert_allclose(f(x), ref(x), rtol=100 * EPS32, atol=1e-5)


def test_device_arrays_in_and_out():
    f, ref = build(gpu_cases.elementwise, 1000)
    a, b = rand(1000), rand(1000, seed=4)
    da, db = memory.to_device(a), memory.to_device(b)
    out = f(da, db)
    assert isinstance(out, memory.DeviceArray)
    np.testing.assert_allclose(out.get(), ref(a, b), rtol=4 * EPS32, atol=4 * EPS32)
    dc = memory.empty((1000,), np.float32)
    assert f(da, db, dc) is None
    np.testing.assert_allclose(dc.get(), ref(a, b), rtol=4 * EPS32, atol=4 * EPS32)


def test_torch_tensors_are_used_in_place():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    f, ref = build(gpu_cases.elementwise, 1000)
    a, b = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    c = torch.empty(1000, device="cuda")
    f(a, b, c)
    torch.cuda.synchronize()
    np.testing.assert_allclose(c.cpu().numpy(), ref(a.cpu().numpy(), b.cpu().numpy()), rtol=4 * EPS32, atol=4 * EPS32)


def test_bad_arguments_are_refused_before_the_gpu():
    f, _ = build(gpu_cases.elementwise, 1000)
    with pytest.raises(TypeError, match="dtype float32"):
        f(np.zeros(1000), np.zeros(1000))
    with pytest.raises(ValueError, match="shape"):
        f(np.zeros(999, np.float32), np.zeros(999, np.float32))
    with pytest.raises(TypeError, match="takes its 2 inputs"):
        f(np.zeros(1000, np.float32))


@pytest.mark.skipif(not REAL_GPU, reason="the kernel's own bounds check runs on a GPU; the simulator stops earlier")
def test_out_of_bounds_gather_raises_and_touches_nothing():
    f, ref = build(gpu_cases.gather, 100, 37)
    x = rand(100)
    idx = np.arange(37, dtype=np.int64)
    np.testing.assert_array_equal(f(x, idx), ref(x, idx))
    idx[5] = 100
    with pytest.raises(IndexError, match="read of X"):
        f(x, idx)
    idx[5] = 3
    np.testing.assert_array_equal(f(x, idx), ref(x, idx))  # the flag was reset


def test_device_array_calls_take_a_plan_per_shape_and_bad_ones_raise_each_time():
    f, ref = build(gpu_cases.elementwise, 1000)
    a, b = rand(1000), rand(1000, seed=5)
    da, db, dc = memory.to_device(a), memory.to_device(b), memory.empty((1000,), np.float32)
    for _ in range(3):  # the first call makes the plan, the others take it
        assert f(da, db, dc) is None
    np.testing.assert_allclose(dc.get(), ref(a, b), rtol=4 * EPS32, atol=4 * EPS32)
    assert len(f._plans) == 1
    for _ in range(2):  # a refused call keeps no plan: the second is checked (and refused) again
        with pytest.raises(ValueError, match="shape"):
            f(da, db, memory.empty((999,), np.float32))
        with pytest.raises(TypeError, match="dtype"):
            f(da, db, memory.empty((1000,), np.float64))
    assert len(f._plans) == 1
    np.testing.assert_allclose(f(a, b), ref(a, b), rtol=4 * EPS32, atol=4 * EPS32)  # numpy: copies


def test_a_symbolic_function_on_device_arrays_sizes_each_plan_at_its_call(monkeypatch):
    monkeypatch.setattr(jitop.runtime.cuda.function, "MAX_PLANS", 3)
    f, ref = build(gpu_cases.elementwise, te.size_var("n"), 64)
    for n in (5, 300, 5, 1, 129, 64, 300, 0):
        a, b = rand(n, seed=n), rand(n, seed=n + 1)
        got = f(memory.to_device(a), memory.to_device(b))
        assert isinstance(got, memory.DeviceArray) and got.shape == (n,)
        np.testing.assert_allclose(got.get(), ref(a, b), rtol=4 * EPS32, atol=4 * EPS32)
        assert len(f._plans) <= 3  # the oldest go first
    out = memory.empty((7,), np.float32)
    with pytest.raises(ValueError, match="must equal argument .A."):  # the output is tied to the inputs
        f(memory.to_device(rand(9)), memory.to_device(rand(9)), out)
