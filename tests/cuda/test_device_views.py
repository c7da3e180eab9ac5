"""Views of device arrays (jitop/runtime/cuda/views.py, DeviceArray.__getitem__ / __setitem__ / reshape / copy)
against numpy's basic indexing, on the fake libcuda (host memory posing as the GPU's; its device-to-device copy
refuses overlapping regions, as CUDA leaves them undefined) and the simulated GPU for kernels given views."""
from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop
import sim_gpu
from jitop.runtime.cuda import memory


@pytest.fixture
def gpu(monkeypatch):
    return sim_gpu.install(monkeypatch)


@pytest.fixture
def any_gpu(monkeypatch):
    """This machine's GPU where it has one (benchmarks/gpu_check.sh), else the simulated one."""
    return sim_gpu.gpu_or_simulated(monkeypatch)


def _arrays(shape):
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return a, jitop.cuda.to_device(a)


@st.composite
def basic_indices(draw):
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
    items = []
    for n in shape[:draw(st.integers(0, len(shape) + 1))]:
        kind = draw(st.sampled_from(["int", "slice", "none", "ellipsis"]))
        if kind == "int":
            items.append(draw(st.integers(-n - 1, n)))
        elif kind == "slice":
            bound = st.none() | st.integers(-n - 2, n + 2)
            items.append(slice(draw(bound), draw(bound), draw(st.none() | st.sampled_from([1, 2, -1]))))
        else:
            items.append(None if kind == "none" else Ellipsis)
    index = tuple(items) if draw(st.booleans()) or len(items) != 1 else items[0]
    return shape, index


def _numpy_view(a, index):
    """numpy's a[index] as a view, or the exception numpy raises."""
    try:
        return a[index]
    except (IndexError, TypeError) as e:
        return e


@settings(max_examples=300, deadline=None)
@given(basic_indices())
def test_a_basic_index_is_numpys_view_when_contiguous_and_refused_otherwise(case):
    shape, index = case
    with pytest.MonkeyPatch.context() as mp:
        sim_gpu.install(mp)
        a, d = _arrays(shape)
        want = np.asarray(_numpy_view(a, index)) if not isinstance(_numpy_view(a, index), Exception) \
            else _numpy_view(a, index)
        if isinstance(want, Exception):
            with pytest.raises(type(want)):
                d[index]
            return
        if not want.flags.c_contiguous:
            with pytest.raises(TypeError, match="not contiguous in memory"):
                d[index]
            return
        view = d[index]
        assert view.shape == want.shape and view.dtype == want.dtype
        np.testing.assert_array_equal(view.get(), want)
        items = index if type(index) is tuple else (index,)
        in_place = a[items if any(i is Ellipsis for i in items) else (*items, ...)]  # a 0-d view, not a scalar
        if want.size:  # the same memory: a view, not a copy
            assert view.ptr == d.ptr + (in_place.__array_interface__["data"][0] - a.__array_interface__["data"][0])


@settings(max_examples=200, deadline=None)
@given(basic_indices(), st.integers(0, 2))
def test_writing_through_an_index_matches_numpys_assignment(case, value_kind):
    shape, index = case
    with pytest.MonkeyPatch.context() as mp:
        sim_gpu.install(mp)
        a, d = _arrays(shape)
        want = _numpy_view(a, index)
        if isinstance(want, Exception) or not want.flags.c_contiguous:
            return
        value = [-7.5, -np.arange(want.size, dtype=np.float32).reshape(want.shape),
                 jitop.cuda.to_device(-np.arange(want.size, dtype=np.float32).reshape(want.shape))][value_kind]
        d[index] = value
        a[index] = value.get() if value_kind == 2 else value
        np.testing.assert_array_equal(d.get(), a)


def test_assignment_casts_and_checks_host_values_as_numpy_does(gpu):
    d = jitop.cuda.zeros((3, 4), np.int8)
    d[1] = np.array([1.9, -2.9, 3, 4])  # numpy's unsafe cast of a float array
    d[2, 1:3] = [5, 6]
    np.testing.assert_array_equal(d.get(), [[0] * 4, [1, -2, 3, 4], [0, 5, 6, 0]])
    with pytest.raises(OverflowError):  # a Python int beyond int8, as numpy refuses it
        d[0, 0] = 300
    with pytest.raises(ValueError, match="could not broadcast"):
        d[0] = np.ones(3)


def test_device_values_copy_on_the_gpu_and_leading_ones_aside_need_the_views_shape_and_dtype(gpu):
    cache = jitop.cuda.zeros((4, 3), np.float32)
    row = jitop.cuda.to_device(np.array([[1, 2, 3]], np.float32))  # (1, 3) into a (3,) view: numpy allows it
    copies = [name for name, _ in gpu.calls].count("cuMemcpyDtoD_v2")
    cache[2] = row
    assert [name for name, _ in gpu.calls].count("cuMemcpyDtoD_v2") == copies + 1
    np.testing.assert_array_equal(cache.get()[2], [1, 2, 3])
    with pytest.raises(ValueError, match=r"device array of shape \(1, 3\) and dtype float64 into a view of shape "
                                         r"\(3,\) and dtype float32"):
        cache[1] = jitop.cuda.to_device(np.ones((1, 3)))
    with pytest.raises(ValueError, match="no broadcasting or casting"):
        cache[:2] = row  # (1, 3) broadcast over two rows: a numpy value would do it


def test_an_overlapping_device_copy_goes_through_a_temporary(gpu):
    a = np.arange(10, dtype=np.float32)
    d = jitop.cuda.to_device(a)
    d[1:] = d[:-1]  # the fake driver refuses an overlapping device copy, as CUDA leaves it undefined
    a[1:] = a[:-1].copy()
    np.testing.assert_array_equal(d.get(), a)
    d[:] = d  # the same memory: nothing to do
    np.testing.assert_array_equal(d.get(), a)


def test_reshape_and_ravel_are_views_with_numpys_rules(gpu):
    a, d = _arrays((2, 6))
    for shape in [(3, 4), (3, -1), ((4, 3),), (-1,), (12, 1, 1), (1, -1, 2)]:
        view = d.reshape(*shape)
        np.testing.assert_array_equal(view.get(), a.reshape(*shape))
        assert view.ptr == d.ptr
    np.testing.assert_array_equal(d.ravel().get(), a.ravel())
    for bad in [(5,), (-1, 5), (-1, -1), (-2, -6)]:
        with pytest.raises(ValueError):
            a.reshape(*bad)
        with pytest.raises(ValueError):
            d.reshape(*bad)
    empty, d0 = np.zeros((0, 3), np.float32), jitop.cuda.zeros((0, 3), np.float32)
    for shape in [(3, 0, -1), (-1, 0), (-1,), (0, 5), (3, 0)]:  # numpy infers -1 only beside no 0
        try:
            want = empty.reshape(*shape).shape
        except ValueError:
            with pytest.raises(ValueError, match="cannot reshape array of size 0"):
                d0.reshape(*shape)
        else:
            assert d0.reshape(*shape).shape == want
    with pytest.raises(TypeError, match="reshape takes ints"):
        d.reshape(2.0, 6)


def test_a_copy_owns_its_memory_and_a_view_keeps_its_base_alive(gpu):
    a, d = _arrays((4, 5))
    c = d.copy()
    assert c.ptr != d.ptr
    d[0] = -1.0
    np.testing.assert_array_equal(c.get(), a)
    view, held = d[1:3], memory.POOL.held
    del d
    gc.collect()
    assert memory.POOL.held == held  # the base's block is not back in the pool while its view lives
    np.testing.assert_array_equal(view.get(), a[1:3])
    del view
    gc.collect()
    assert memory.POOL.held > held


def test_a_kernel_reads_a_growing_view_of_a_preallocated_cache(any_gpu):
    """The decode loop without a copy of the cache per token: rows written in place, the kernel given the
    rows so far (a view: one symbolic function serves every length)."""
    rng = np.random.default_rng(3)
    scores = jitop.kernel(lambda k, q: np.exp(k @ q - (k @ q).max()), target="cuda")
    cache, q = jitop.cuda.zeros((16, 8), np.float32), rng.standard_normal(8).astype(np.float32)
    rows = rng.standard_normal((6, 8)).astype(np.float32)
    for t, row in enumerate(rows):
        cache[t] = row
        got = scores(cache[:t + 1], jitop.cuda.to_device(q))
        k = rows[:t + 1]
        np.testing.assert_allclose(got.get(), np.exp(k @ q - (k @ q).max()), rtol=1e-5, atol=1e-6)
    assert scores.dispatcher.compiles == 2  # the first length, then one symbolic function for every other


def test_a_view_at_an_address_kernels_cannot_load_from_is_refused_by_name(any_gpu):
    f = jitop.kernel(lambda x: x * 2, target="cuda")
    d = jitop.cuda.to_device(np.arange(12, dtype=np.float32))
    np.testing.assert_array_equal(f(d[4:]).get(), np.arange(4, 12) * 2)  # 16 bytes in: aligned
    with pytest.raises(ValueError, match="not a multiple of 16 bytes"):
        f(d[1:])


def test_get_into_an_array_given_allocates_nothing_and_refuses_one_that_does_not_fit(gpu):
    a, d = _arrays((3, 4))
    out = np.full((3, 4), -1, np.float32)
    assert d.get(out=out) is out
    np.testing.assert_array_equal(out, a)
    np.testing.assert_array_equal(d[1].get(out=out[2]), a[1])  # a row of out: C-contiguous, writeable
    assert (out[2] == a[1]).all()
    for bad in [np.empty((4, 3), np.float32), np.empty((3, 4)), np.empty((4, 3), np.float32).T,
                np.broadcast_to(np.float32(0), (3, 4)), [[0.0] * 4] * 3]:
        with pytest.raises(ValueError, match=r"get\(out=...\): out must be a writeable C-contiguous"):
            d.get(out=bad)


def test_the_readmes_decode_loop_with_a_preallocated_cache(any_gpu):
    """README "NVIDIA GPUs": new keys and values written into caches allocated once, attention over the rows so
    far (views), against numpy's loop."""
    C, T = 16, 5
    rng = np.random.default_rng(7)
    w, xs = rng.standard_normal((C, 3 * C)).astype(np.float32), rng.standard_normal((T, 1, C)).astype(np.float32)

    def project(x, w):
        return np.split(x @ w, 3, axis=-1)

    def attend(q, keys, values):
        s = q @ keys.T / np.sqrt(np.float32(q.shape[-1]))
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        return (p / p.sum(axis=-1, keepdims=True)) @ values

    gpu_project, gpu_attend = (jitop.kernel(f, target="cuda") for f in (project, attend))
    wd = jitop.cuda.to_device(w)
    keys, values = jitop.cuda.empty((64, C), np.float32), jitop.cuda.empty((64, C), np.float32)
    for t in range(T):
        q, k, v = gpu_project(jitop.cuda.to_device(xs[t]), wd)
        keys[t], values[t] = k, v  # (1, C) into a (C,) row: copied on the GPU
        out = gpu_attend(q, keys[:t + 1], values[:t + 1]).get()
        hq, hk, hv = project(xs[t], w)
        want_keys = np.concatenate([project(x, w)[1] for x in xs[:t + 1]])
        want_values = np.concatenate([project(x, w)[2] for x in xs[:t + 1]])
        # float32 sums of 16 products of |q|, |k| ~ 5: ~1e-5 absolute, then a softmax of 5 and a sum of 5
        np.testing.assert_allclose(out, attend(hq, want_keys, want_values), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype, value, setter", [
    ("float32", 1.5, "cuMemsetD32_v2"), ("float64", 0.0, "cuMemsetD8_v2"), ("float64", 2.0, "cuMemcpyHtoD_v2"),
    ("float64", -0.0, "cuMemcpyHtoD_v2"), ("int8", -1, "cuMemsetD8_v2"), ("int16", 300, "cuMemsetD16_v2"),
    ("int64", -1, "cuMemsetD8_v2"), ("bool", True, "cuMemsetD8_v2"), ("uint16", 257, "cuMemsetD8_v2"),
    ("int32", np.float32(7.9), "cuMemsetD32_v2")])
def test_fill_and_scalar_assignment_set_memory_with_the_gpus_memset_where_the_bytes_repeat(gpu, dtype, value, setter):
    want = np.arange(10).astype(dtype)
    d = jitop.cuda.to_device(want)
    calls = len(gpu.calls)
    d[2:7] = value
    want[2:7] = value
    np.testing.assert_array_equal(d.get(), want)
    assert [name for name, _ in gpu.calls[calls:]][0] == setter
    np.testing.assert_array_equal(d.fill(value).get(), np.full(10, value, dtype))


def test_fill_casts_as_numpy_and_an_unaligned_view_takes_the_host_copy(gpu):
    with pytest.raises(OverflowError):
        jitop.cuda.zeros(3, np.uint8).fill(300)
    with pytest.raises(OverflowError):
        jitop.cuda.zeros(0, np.uint8).fill(300)  # checked even where nothing is set, as numpy does
    d = jitop.cuda.zeros(5, np.float32)
    odd = jitop.cuda.DeviceArray((4,), np.float32, d.ptr + 2, owner=d)  # not 4-byte aligned: no 32-bit memset
    calls = len(gpu.calls)
    odd.fill(1.0)
    assert [name for name, _ in gpu.calls[calls:]] == ["cuMemcpyHtoD_v2"]
