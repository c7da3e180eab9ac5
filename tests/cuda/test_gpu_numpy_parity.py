"""`@jitop.kernel(target="cuda")` gives numpy's answer where the CPU kernels do: the shape, indexing and linear
algebra cases of tests/graph/test_shapes.py, Python scalars and their overflow rules, captured data that changes,
empty reductions. On this machine's GPU, else on the simulated one (tests/sim_gpu.py)."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import jitop
import sim_gpu

sys.path.insert(0, str(Path(__file__).parent.parent / "graph"))
from test_shapes import CASES, DTYPES, RTOL_GROUPS, _input, assert_same, numpy_ref  # noqa: E402


def gpu_kernel(fn, **kwargs):
    return jitop.kernel(fn, target="cuda", fallback=False, **kwargs)


def gpu_call(k, *args):
    """A GPU kernel's call; a fallback to numpy is an error (it would make the comparison vacuous)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("error", jitop.JitopFallbackWarning)
        return k(*args)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", sorted(CASES))
def test_the_shape_cases_of_the_cpu_tests_equal_numpy_on_the_gpu(group, dtype, monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    x = _input(dtype)
    for name, fn in CASES[group].items():
        got = gpu_call(gpu_kernel(fn), x)
        try:
            assert_same(got, numpy_ref(fn, x), RTOL_GROUPS.get(group))
        except AssertionError as err:
            raise AssertionError(f"{group}: {name}: {err}") from None


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_reductions_with_initial_and_where_equal_numpy_on_the_gpu(dtype, monkeypatch):
    from test_reductions import INITIAL_WHERE, data
    sim_gpu.gpu_or_simulated(monkeypatch)
    x = data(dtype, (3, 4, 5), seed=3)
    for name, fn in INITIAL_WHERE.items():
        want = numpy_ref(fn, x)
        try:
            assert_same(gpu_call(gpu_kernel(fn), x), want, x.size * np.finfo(np.float32).eps)
        except AssertionError as err:
            raise AssertionError(f"{name}: {err}") from None


@pytest.mark.parametrize("value, dtype", [(300, "int8"), (-1, "uint8"), (-40000, "int16"), (-1, "uint64"),
                                          (2 ** 63, "int64")])
def test_a_python_int_beyond_the_arrays_dtype_raises_numpys_overflow_error(value, dtype, monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    k = gpu_kernel(lambda x, y: x + y)
    a = np.ones(3, dtype)
    np.testing.assert_array_equal(gpu_call(k, a, 1), a + 1)
    with pytest.raises(OverflowError) as raised:
        gpu_call(k, a, value)  # it wrapped around silently (300 + 1 in int8 was 45)
    with pytest.raises(OverflowError) as numpys:
        a + value
    assert str(raised.value) == str(numpys.value)


def test_a_python_int_result_beyond_int64_runs_that_call_as_numpy(monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    k = gpu_kernel(lambda a, n: a * (n * n * n))
    a = np.ones(2)
    for n in (3, 2 ** 30):  # 2 ** 90 overflows the kernel's int64 arithmetic: numpy's float64 of the Python int
        np.testing.assert_array_equal(gpu_call(k, a, n), a * (n * n * n))


@pytest.mark.parametrize("operand", [np.array(3, np.int16), np.array(2.5, np.float32)], ids=["int16", "float32"])
def test_a_0d_array_captured_by_the_function_is_a_0d_constant_on_the_gpu(operand, monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    k = gpu_kernel(lambda x: (x + operand, np.minimum(operand, x), x >= operand))
    x = np.arange(11, dtype=np.int32)
    assert_same(gpu_call(k, x), numpy_ref(k.fn, x))


def test_a_rebound_global_is_traced_again_not_read_stale(monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    scale = np.array([2.0])
    k = gpu_kernel(lambda a: a * scale)
    a = np.ones(3)
    np.testing.assert_array_equal(gpu_call(k, a), 2 * a)
    scale = np.array([3.0])  # noqa: F841 - rebinds the closure cell the kernel reads
    np.testing.assert_array_equal(gpu_call(k, a), 3 * a)  # it returned 2 * a: the first trace's constant
    scale = np.array([4.0])  # noqa: F841
    # device arrays in: traced again with host stand-ins (it ran as numpy, which cannot read them: TypeError)
    out = gpu_call(k, jitop.cuda.to_device(a))
    assert isinstance(out, jitop.cuda.DeviceArray) and np.array_equal(out.get(), 4 * a)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "bool"])
def test_reductions_of_nothing_give_numpys_identities(dtype, monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)

    def f(a, b):
        return (a.sum(), a.prod(), np.all(a), np.any(a), b.sum(axis=0), b.prod(axis=0), b.sum(axis=1),
                b.max(axis=1), b.any(axis=0), b.sum(axis=0, keepdims=True))
    a, b = np.zeros(0, dtype), np.zeros((0, 3), dtype)
    assert_same(gpu_call(gpu_kernel(f), a, b), numpy_ref(f, a, b))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_mean_and_spread_of_nothing_are_nan(dtype, monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)

    def f(a, b):
        return a.mean(), b.mean(axis=0), a.var(), b.std(axis=0)
    a, b = np.zeros(0, dtype), np.zeros((0, 3), dtype)
    assert_same(gpu_call(gpu_kernel(f), a, b), numpy_ref(f, a, b))


@pytest.mark.parametrize("shape", [(1, 0), (3, 0), (0, 0, 2), (0, 5)], ids=str)
def test_row_groups_and_reductions_over_empty_axes(shape, monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)  # found by test_gpu_random_programs: they failed to schedule

    def f(a):
        return a - a.mean(axis=-1, keepdims=True), a.sum(), np.abs(a).sum(axis=0)
    a = np.zeros(shape, np.float32)
    assert_same(gpu_call(gpu_kernel(f), a), numpy_ref(f, a))


def test_an_in_place_change_of_a_captured_array_is_seen_and_nothing_else_is_copied_again(monkeypatch):
    import jitop.graph.gpu as gpu
    sim_gpu.gpu_or_simulated(monkeypatch)
    uploads = []
    real = gpu._upload
    monkeypatch.setattr(gpu, "_upload", lambda a: uploads.append(a.shape) or real(a))
    w = np.array([1.5, -2.0, np.nan])
    k = gpu_kernel(lambda a: a * w + w[:2].sum())
    a = np.ones(3)
    for _ in range(3):
        assert_same(gpu_call(k, a), k.fn(a))
    assert len(uploads) == 1  # unchanged (its NaN too): the device copy is reused
    w[:] = [2.0, 2.0, 2.5]  # numpy reads the new values; the GPU kernel read the first upload's
    assert_same(gpu_call(k, a), k.fn(a))
    assert len(uploads) == 2


def test_a_numpy_scalars_power_is_c_pow_and_an_arrays_is_sqrt(monkeypatch):
    # numpy: np.float64(-0.0) ** 0.5 is C's pow (0.0; inf for -inf), an array's ** 0.5 is np.sqrt (-0.0; nan)
    sim_gpu.gpu_or_simulated(monkeypatch)
    k = gpu_kernel(lambda a: a ** 0.5)
    for a in [np.float64(-0.0), np.float32(-np.inf), np.array(-0.0), np.array([-0.0, -np.inf, 4.0])]:
        got, want = gpu_call(k, a), numpy_ref(k.fn, a)
        assert_same(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def _filled(x, t):
    out = np.zeros((x.shape[0], 3), x.dtype)
    out[:, 0] = x.sum(axis=1)
    out[:, 1:] = x[:, :2]
    y = x.copy()
    y[t] = -1        # a traced position
    y[:, ::2] *= 2   # a strided region, in place
    return out, y


def test_in_place_assignment_inside_the_function_equals_numpy_on_the_gpu(monkeypatch):
    """Assignments to arrays the function made (the CPU's tests/graph/test_assignment.py) compile for the GPU."""
    sim_gpu.gpu_or_simulated(monkeypatch)
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    for t in (1, -1):
        for got, want in zip(gpu_call(gpu_kernel(_filled), x, t), _filled(x, t)):
            assert_same(got, want)


def test_assigning_a_computed_value_to_an_argument_says_what_to_do_on_the_gpu(monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)

    def bump(a):
        a += 1
        return a
    with pytest.raises(jitop.FallbackError, match="in-place assignment of a computed value to an argument of a GPU"):
        gpu_kernel(bump)(np.ones(3, np.float32))


def _decode(cache, k, q, t):
    cache[t] = k
    s = cache @ q
    return s - s.max()


def test_a_decode_step_writes_a_given_row_into_its_cache_argument_on_the_gpu(monkeypatch):
    """`cache[t] = k`, k and t arguments: the row is written before the kernel (into the host array the call then
    copies in, or on the GPU into a device array, which the kernel reads in place), as on the CPU."""
    sim_gpu.gpu_or_simulated(monkeypatch)
    f = gpu_kernel(_decode)
    mine = np.arange(40, dtype=np.float32).reshape(10, 4)
    theirs = mine.copy()
    q = np.array([1, 2, -1, 0.5], np.float32)  # (sums of small multiples of 1/4: exact in float32)
    for t in (0, 3, -1):
        k = np.full(4, t + 0.5, np.float32)
        assert_same(np.asarray(gpu_call(f, mine, k, q, t)), _decode(theirs, k, q, t))
        assert_same(mine, theirs)
    device = jitop.cuda.to_device(theirs)
    for t in (1, -2):
        k = np.full(4, t + 0.25, np.float32)
        got = gpu_call(f, device, jitop.cuda.to_device(k), jitop.cuda.to_device(q), t)
        assert_same(got.get(), _decode(theirs, k, q, t))
        assert_same(device.get(), theirs)
    with pytest.raises(IndexError):
        gpu_call(f, device, jitop.cuda.to_device(k), jitop.cuda.to_device(q), 10)
    assert_same(device.get(), theirs)
