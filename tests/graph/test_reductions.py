"""Conformance of @jitop.kernel reductions against numpy: values, dtype and shape.

sum prod mean max min amax amin argmax argmin var std all any, as np.* functions and as array
methods, over axis None / int / negative / tuple, with keepdims, dtype= (sum, mean), ddof (var, std),
initial= and where= (sum prod max min all any; where= of mean var std), NaN handling, integer widening, empty reductions and long
float32 sums.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop
from kernel_checks import assert_same, batched  # noqa: E402


# ** helpers **

def numpy_ref(fn, *args):
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # mean of empty slice, ddof >= n
        return fn(*args)


def jit_call(k, *args):
    """Call a kernel; a fallback warning is an error (it would make the comparison vacuous)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("error", jitop.JitopFallbackWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        return k(*args)


def compiled_result(tag: str, fns: dict, name, x: np.ndarray):
    res = batched(tag, fns, jit_call, x)
    if res is not None:
        return res[name]
    return jit_call(jitop.kernel(fns[name]), x)


# float results: sums in a different order than numpy's pairwise summation
RTOL = {np.dtype("float32"): 2e-6, np.dtype("float64"): 1e-13}


def tol(expected) -> float | None:
    return RTOL.get(np.asarray(expected).dtype)


def data(dtype: str, shape=(3, 4, 5), seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    lo = max(np.iinfo(dt).min, -100)
    return rng.integers(lo, 100, shape).astype(dt)


# ** every reduction, as function and method, over every kind of axis **

NAMES = ["sum", "prod", "mean", "max", "min", "amax", "amin", "argmax", "argmin", "var", "std", "all", "any"]
AXES = [None, 1, -1, (0, 2), (-1, 0)]
R_DTYPES = ["float64", "float32", "int8", "bool"]  # uint8 and int64: see the widening and dtype= tests

def _fns(name: str) -> dict:
    out = {}
    for axis in AXES:
        if name in ("argmax", "argmin") and isinstance(axis, tuple):
            continue
        for kd in (False, True):
            fn = getattr(np, name)
            out[("fn", axis, kd)] = (lambda a, fn=fn, axis=axis, kd=kd: fn(a, axis=axis, keepdims=kd))
            if name not in ("amax", "amin") and (kd is False or axis is None):
                out[("method", axis, kd)] = (lambda a, axis=axis, kd=kd: getattr(a, name)(axis=axis, keepdims=kd))
    return out


@pytest.mark.parametrize("dtype", R_DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_reduction(name: str, dtype: str) -> None:
    """Every axis/keepdims/function-or-method form of one reduction; all mismatches reported together."""
    x = data(dtype)
    fns = _fns(name)
    failures = []
    for key, fn in fns.items():
        try:
            expected = numpy_ref(fn, x)
        except TypeError as e:  # e.g. np.var of bool: numpy has no boolean subtract
            try:
                jit_call(jitop.kernel(fn), x)
                failures.append(f"{key}: numpy raises {type(e).__name__}, jitop does not")
            except type(e):
                pass
            continue
        try:
            assert_same(compiled_result(name, fns, key, x), expected, tol(expected))
        except Exception as e:  # noqa: BLE001 - collected and reported below
            failures.append(f"{key}: {type(e).__name__}: {str(e).strip()[:400]}")
    assert not failures, f"{len(failures)} of {len(fns)} forms differ from numpy:\n" + "\n".join(failures)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argreduce_axis_none_keepdims(name: str) -> None:
    @jitop.kernel
    def f(a):
        return getattr(np, name)(a, axis=None, keepdims=True), getattr(a, name)(keepdims=True)
    x = data("float64")
    for g, e in zip(jit_call(f, x), numpy_ref(f.fn, x)):
        assert_same(g, e)


@pytest.mark.parametrize("name", NAMES)  # 0-d: fell back as an internal error until commit 49c8327
def test_reduction_of_0d_and_size_one(name: str) -> None:
    @jitop.kernel
    def f(a, b, c):
        fn = getattr(np, name)
        return fn(a), fn(b), fn(b, axis=0), fn(c, axis=1, keepdims=True), fn(c)
    a, b, c = np.array(2.5), np.array([3.5]), np.arange(6.0).reshape(6, 1)
    for g, e in zip(jit_call(f, a, b, c), numpy_ref(f.fn, a, b, c)):
        assert_same(g, e, tol(e))


def test_reduction_of_0d_array_with_axis_0() -> None:
    @jitop.kernel(fallback=False)
    def f(a):
        return (np.sum(a, axis=0), a.max(axis=0, keepdims=True), np.argmax(a, axis=0), np.min(a, axis=-1),
                np.argmin(a, axis=-1, keepdims=True), np.squeeze(a, axis=-1), np.any(a, axis=0))
    a = np.array(2.0)
    got, expected = f(a), f.fn(a)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert_same(g, e)


@pytest.mark.parametrize("form", [
    lambda a: np.sum(a, axis=(0,)), lambda a: np.sum(a, axis=1), lambda a: np.mean(a, axis=0),
    lambda a: np.std(a, axis=-1), lambda a: np.argmax(a, axis=1), lambda a: np.squeeze(a, axis=(0,)),
    lambda a: np.flip(a, 0), lambda a: np.concatenate([a, a]), lambda a: np.expand_dims(a, 2),
])
def test_0d_axis_errors_are_numpys(form) -> None:
    """numpy's quirks on 0-d arrays: an int axis 0/-1 is accepted by ufunc reductions, argmax and squeeze,
    a tuple axis or mean/std/flip's axis is an AxisError; concatenate refuses 0-d arrays."""
    a = np.array(2.0)
    with pytest.raises(Exception) as numpy_error:
        form(a)
    with pytest.raises(numpy_error.type):
        jitop.kernel(form, fallback=False)(a)


def test_axis_out_of_bounds_raises_axis_error() -> None:
    @jitop.kernel
    def f(a):
        return a.sum(axis=3)
    with pytest.raises(np.exceptions.AxisError):
        f.fn(np.ones((2, 3)))
    with pytest.raises(np.exceptions.AxisError):
        jit_call(f, np.ones((2, 3)))


# ** dtype=, ddof, integer widening **

@pytest.mark.parametrize("src", ["int8", "uint8", "bool", "float32"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "uint64"])
def test_sum_and_mean_dtype_argument(src: str, dtype: str) -> None:
    @jitop.kernel
    def f(a):
        return (np.sum(a, dtype=dtype), a.sum(axis=1, dtype=dtype), np.mean(a, axis=0, dtype=dtype),
                a.mean(dtype=dtype), np.prod(a[:, :3], axis=-1, dtype=dtype))
    x = data(src, (4, 6))
    if dtype.startswith("u"):
        x = abs(x)  # casting a negative float to uint64 is undefined (numpy's answer is platform-specific)
    for g, e in zip(jit_call(f, x), numpy_ref(f.fn, x)):
        assert_same(g, e, tol(e))


@pytest.mark.parametrize("dtype, wide", [("int8", "int64"), ("uint8", "uint64"), ("int32", "int64"),
                                         ("uint64", "uint64"), ("bool", "int64")])
def test_integer_sums_widen(dtype: str, wide: str) -> None:
    @jitop.kernel
    def f(a):
        return a.sum(), np.sum(a, axis=0), a.prod(axis=1), a.sum(keepdims=True)
    x = np.full((50, 7), 100 if dtype != "bool" else True, dtype=dtype)  # 50*7*100 overflows int8/uint8
    got = jit_call(f, x)
    for g, e in zip(got, numpy_ref(f.fn, x)):
        assert_same(g, e)
    assert np.asarray(got[0]).dtype == np.dtype(wide)
    assert int(got[0]) == (35000 if dtype != "bool" else 350)


def test_integer_product_wraps_like_numpy() -> None:
    @jitop.kernel
    def f(a):
        return a.prod(), a.prod(axis=0)
    x = np.arange(1, 41, dtype=np.int64).reshape(20, 2)  # 40! overflows int64
    for g, e in zip(jit_call(f, x), numpy_ref(f.fn, x)):
        assert_same(g, e)


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
def test_var_std_ddof(dtype: str) -> None:
    @jitop.kernel
    def f(a):
        return [(np.var(a, ddof=ddof), np.std(a, axis=0, ddof=ddof), a.var(axis=1, ddof=ddof, keepdims=True),
                 a.std(axis=(0, 1), ddof=ddof)) for ddof in (0, 1, 2, 5, 7)]  # 5 rows, 6 columns: ddof >= n too
    x = data(dtype, (5, 6))
    got, expected = jit_call(f, x), numpy_ref(f.fn, x)
    assert isinstance(got, list) and len(got) == 5
    for g, e in zip(sum(got, ()), sum(expected, ())):
        assert_same(g, e, tol(e) * 10 if tol(e) else None)


# ** NaN and inf **

@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nan_propagates_through_max_min_sum_and_argmax_finds_it(dtype: str) -> None:
    @jitop.kernel
    def f(a):
        return (a.max(), a.min(axis=1), np.amax(a, axis=0), a.sum(axis=1), a.mean(), np.argmax(a, axis=1),
                np.argmin(a), a.argmin(axis=0), np.any(a, axis=1), np.all(a, axis=0), a.prod(axis=0),
                np.maximum.reduce(a, axis=1), np.minimum.reduce(a), a.var(axis=1), a.std())
    x = data(dtype, (4, 33))
    x[1, 5] = np.nan
    x[2, 30] = np.nan
    x[2, 2] = np.nan
    x[3, 0] = np.inf
    x[0, 32] = -np.inf
    for g, e in zip(jit_call(f, x), numpy_ref(f.fn, x)):
        assert_same(g, e, tol(e))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fmax_fmin_reduce_of_all_nan_slice_is_nan(dtype: str) -> None:
    @jitop.kernel
    def f(a):
        return np.fmax.reduce(a, axis=1), np.fmin.reduce(a, axis=1)
    x = data(dtype, (3, 5))
    x[1, :] = np.nan
    for g, e in zip(jit_call(f, x), numpy_ref(f.fn, x)):
        assert_same(g, e)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fmax_fmin_reduce_ignore_nan(dtype: str) -> None:
    @jitop.kernel
    def f(a):
        return np.fmax.reduce(a, axis=1), np.fmin.reduce(a, axis=0), np.fmax.reduce(a, axis=None)
    x = data(dtype, (4, 33))
    x[1, 1:] = np.nan
    x[2, 7] = np.nan
    x[0, 0] = np.nan
    for g, e in zip(jit_call(f, x), numpy_ref(f.fn, x)):
        assert_same(g, e)


@pytest.mark.parametrize("dtype", ["float64", "int32", "bool"])
def test_ufunc_reduce_methods(dtype: str) -> None:
    @jitop.kernel
    def f(a):
        return (np.add.reduce(a), np.add.reduce(a, axis=1), np.multiply.reduce(a, axis=-1),
                np.maximum.reduce(a, axis=0), np.minimum.reduce(a, axis=None), np.logical_and.reduce(a, axis=0),
                np.logical_or.reduce(a, axis=1), np.add.reduce(a, axis=(0, 1)))
    x = data(dtype, (3, 7))
    for g, e in zip(jit_call(f, x), numpy_ref(f.fn, x)):
        assert_same(g, e, tol(e))


# ** empty reductions **

@pytest.mark.parametrize("dtype", ["float64", "int32", "bool"])
def test_empty_reductions_with_identity(dtype: str) -> None:
    @jitop.kernel
    def f(a, b):
        return (a.sum(), a.prod(), np.all(a), np.any(a), b.sum(axis=0), b.prod(axis=0), b.sum(axis=1),
                b.max(axis=1), b.argmax(axis=1), b.any(axis=0), b.all(axis=0), b.sum(axis=0, keepdims=True))
    a, b = np.zeros(0, dtype), np.zeros((0, 3), dtype)
    for g, e in zip(jit_call(f, a, b), numpy_ref(f.fn, a, b)):
        assert_same(g, e)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_mean_var_of_empty_are_nan(dtype: str) -> None:
    @jitop.kernel
    def f(a, b):
        return a.mean(), b.mean(axis=0), a.var(), b.std(axis=0)
    a, b = np.zeros(0, dtype), np.zeros((0, 3), dtype)
    for g, e in zip(jit_call(f, a, b), numpy_ref(f.fn, a, b)):
        assert_same(g, e)


@pytest.mark.parametrize("op", ["max", "min", "amax", "argmax", "argmin"])
def test_reduction_without_identity_of_empty_raises_value_error(op: str) -> None:
    @jitop.kernel
    def f(a):
        return getattr(np, op)(a)

    @jitop.kernel
    def g(b):
        return getattr(np, op)(b, axis=0)
    with pytest.raises(ValueError):
        f.fn(np.zeros(0))
    with pytest.raises(ValueError):
        jit_call(f, np.zeros(0))
    with pytest.raises(ValueError):
        g.fn(np.zeros((0, 3)))
    with pytest.raises(ValueError):
        jit_call(g, np.zeros((0, 3)))


# ** long sums **

@pytest.mark.parametrize("n", [1_000_003, 4097])
def test_float32_sum_of_many_elements(n: int) -> None:
    @jitop.kernel
    def f(a):
        return a.sum(), a.mean(), np.sum(a * 2.0), a.reshape(-1, 1).sum(axis=0)
    x = (np.random.default_rng(0).random(n, dtype=np.float32) + np.float32(0.1)).astype(np.float32)
    exact = x.astype(np.float64).sum()
    got = jit_call(f, x)
    for g, e in zip(got, numpy_ref(f.fn, x)):
        assert_same(g, e, 1e-5)
    assert abs(float(got[0]) - exact) <= 1e-5 * exact


def test_float32_column_sum_of_many_rows() -> None:
    @jitop.kernel
    def f(a):
        return a.sum(axis=0), a.mean(axis=0), a.max(axis=0)
    x = np.random.default_rng(1).random((20001, 3), dtype=np.float32)
    for g, e in zip(jit_call(f, x), numpy_ref(f.fn, x)):
        assert_same(g, e, 1e-5)


# ** fused reduction patterns **



@pytest.mark.parametrize("shape, axis", [
    pytest.param((3, 3, 3), 0),
    pytest.param((3, 3, 3), 1),
    pytest.param((2, 64, 64), 1),
    ((3, 3, 3), 2), ((4, 5, 6), 0), ((4, 5, 6), 1), ((8, 1000), 0), ((1000, 8), 1), ((5, 7, 9, 3), 2),
], ids=str)
def test_softmax_over_any_axis(shape, axis: int) -> None:
    @jitop.kernel(fallback=False)
    def f(a):
        e = np.exp(a - a.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)
    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert_same(f(a), f.fn(a), 1e-5)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_layernorm_and_logsumexp(axis: int) -> None:
    @jitop.kernel(fallback=False)
    def f(a, g):
        mu = a.mean(axis=axis, keepdims=True)
        var = ((a - mu) ** 2).mean(axis=axis, keepdims=True)
        m = a.max(axis=axis, keepdims=True)
        return (a - mu) / np.sqrt(var + 1e-5) * g, np.log(np.exp(a - m).sum(axis=axis)) + m.squeeze(axis)
    a = np.random.default_rng(1).standard_normal((6, 33)).astype(np.float64)
    g = np.linspace(0.5, 1.5, 33)
    for x, e in zip(f(a, g), f.fn(a, g)):
        assert_same(x, e, 1e-12)


# ** initial= and where= **

INITIAL_WHERE = {
    "max-initial": lambda a: np.max(a, axis=-1, initial=0.5),
    "min-initial-where": lambda a: np.min(a, axis=0, initial=1, where=a > 0),
    "sum-where": lambda a: np.sum(a, axis=(0, 2), where=a > 0),
    "sum-initial-where-keepdims": lambda a: a.sum(initial=7, where=np.array([True, False, True, True, False]),
                                                  keepdims=True),
    "prod-initial": lambda a: np.prod(a[:, :2, :1], axis=1, initial=3),
    "max-initial-empty": lambda a: np.max(a[:, :0], axis=1, initial=2),
    "any-where": lambda a: np.any(a > 1, axis=1, where=np.array([[True], [False], [True], [False]])),
    "all-where": lambda a: np.all(a > -3, where=a < 2),
    "maximum-reduce-initial": lambda a: np.maximum.reduce(a, axis=2, initial=1.5),
    "axis-empty-tuple": lambda a: np.sum(a, axis=(), initial=2, where=a > 0),
    "mean-where": lambda a: np.mean(a, axis=(0, 2), where=a > 0),  # divided by each count of True
    "mean-where-none-true": lambda a: a.mean(axis=1, where=a > 1000, keepdims=True),  # 0 / 0: NaN
    "var-where": lambda a: np.var(a, axis=-1, where=a > -1),
    "std-where-ddof": lambda a: a.std(axis=(0, 1), where=a < 1, ddof=1, keepdims=True),  # max(count - 1, 0)
}


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "int32", "uint8"])
@pytest.mark.parametrize("name", list(INITIAL_WHERE))
def test_initial_and_where_match_numpy(name, dtype) -> None:
    """initial= is cast to the result's dtype (0.5 to an int truncates) and combined with it; where='s False
    elements count as the identity (max/min: as `initial`). NaNs included: max(NaN, initial) is NaN."""
    x = data(dtype, (3, 4, 5), seed=3)
    if dtype.startswith("float"):
        x[1, 2, 3] = np.nan
    fn = INITIAL_WHERE[name]
    want = numpy_ref(fn, x)
    got = jit_call(jitop.kernel(fn), x)
    result = np.asarray(want).dtype  # a mean or var of ints is float64: rounded too
    terms = x.size  # a sum of at most every element
    assert_same(got, want, terms * np.finfo(result).eps if result.kind == "f" else None)


@pytest.mark.parametrize("fn, error", [
    (lambda a: np.max(a, initial=300), OverflowError),               # a Python int beyond int8, as numpy
    (lambda a: np.max(a, where=a > 1), ValueError),                   # max has no identity: where needs initial
    (lambda a: np.sum(a, where=np.array([1, 0, 1, 1, 0])), TypeError),  # where is not boolean
    (lambda a: np.sum(a, where=np.ones((2, 4, 5), bool)), ValueError),  # where does not broadcast to a
], ids=["initial-overflow", "max-where-no-initial", "where-int", "where-shape"])
def test_initial_and_where_errors_are_numpys(fn, error) -> None:
    x = data("int8", (4, 4, 5))
    with pytest.raises(error):
        fn(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", jitop.JitopFallbackWarning)  # raised by the trace, not by a fallback
        with pytest.raises(error):
            jitop.kernel(fn)(x)


# ** argmax / argmin: two vectorized reductions (the best value, then the first index holding it) **


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 150), st.sampled_from(["float32", "float64", "int32", "int8"]),
       st.integers(0, 2**32 - 1), st.booleans())
def test_argmax_argmin_along_each_axis_find_numpys_index(rows, width, dtype, seed, nans):
    """Rows as wide as several vectors and not a multiple of one: ties (few distinct values), a NaN at a
    random place (the first NaN wins, as numpy's), the first index of the best value on either side of a lane
    boundary, along the last axis (per-lane partials) and the first (a data axis in lanes)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-3, 4, (rows, width)).astype(dtype)
    if nans and np.dtype(dtype).kind == "f":
        a[rng.integers(0, rows), rng.integers(0, width)] = np.nan
    f = jitop.kernel(lambda x: (x.argmax(axis=1), x.argmin(axis=-1), x.argmax(axis=0), np.argmin(x, axis=0)))
    for g, e in zip(jit_call(f, a), numpy_ref(f.fn, a)):
        assert_same(g, e)


def test_a_reduction_over_rows_carries_four_vectors_of_columns() -> None:
    """sum/max over leading axes: 4 vectors of output columns per step (256 contiguous bytes of a row, four
    accumulator chains) when the columns are wide enough; a column tail that is not a whole vector still
    matches numpy."""
    lanes = jitop.Target.current().lanes(4)
    wide = np.random.default_rng(3).standard_normal((4, 16384)).astype(np.float32)
    f = jitop.kernel(lambda a: a.sum(axis=0))
    assert f"vectorized({4 * lanes})" in jitop.explain(f, wide).split("loop IR")[1]
    for shape in ((7, 1000), (3, 5, 4 * lanes + 3), (200, 17)):
        a = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
        g = jitop.kernel(lambda a: (a.sum(axis=0), a.max(axis=0), np.min(a, axis=0)))
        got, want = jit_call(g, a), numpy_ref(g.fn, a)
        bound = shape[0] * np.finfo(np.float32).eps * np.abs(a).sum(axis=0).max()  # a float32 sum's rounding
        np.testing.assert_allclose(got[0], want[0], rtol=0, atol=bound)
        assert_same(got[1], want[1])
        assert_same(got[2], want[2])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_float_product_overflows_and_meets_zero_in_numpys_order(dtype) -> None:
    """numpy multiplies a row one element after another: a running product that overflows to inf and then meets a
    0 is nan, one that meets the 0 first stays 0. Partial products per SIMD lane would decide otherwise (and round
    otherwise): the product is computed in numpy's order, bit for bit."""
    big = np.sqrt(np.finfo(dtype).max) * 2  # big * big overflows
    rows = np.ones((4, 67), dtype)
    rows[0, [3, 5, 40]] = big, big, 0       # inf, then 0: nan
    rows[1, [3, 40, 50]] = 0, big, big      # 0, then inf: 0 (0 * finite, 0 * big)
    rows[2, [10, 18, 26]] = 0, big, big     # a 0 and two big values a vector's lanes apart: 0
    rows[3] = np.round(np.random.default_rng(3).uniform(-10, 10, 67) * 8) / 8  # 10**60 overflows float32
    k = jitop.kernel(lambda a: np.prod(a, axis=-1), fallback=False)
    got, want = jit_call(k, rows), numpy_ref(np.prod, rows, -1)
    np.testing.assert_array_equal(got, want, strict=True)
    assert np.isnan(got[0]) and got[1] == 0


# ** over the first axis of an array past L2: read in blocks of whole rows (te_rules._row_blocks) **

FIRST_AXIS = {
    "sum": lambda a: a.sum(axis=0), "max": lambda a: a.max(axis=0), "min": lambda a: np.min(a, axis=0),
    "mean": lambda a: a.mean(axis=0), "any": lambda a: (a > 0).any(axis=0), "all": lambda a: (a > -50).all(axis=0),
    "argmax": lambda a: a.argmax(axis=0), "sumsq 3-d": lambda a: (a * a).reshape(a.shape[0], -1, 1).sum(axis=0),
    # read again by an elementwise consumer (a row-fusion candidate: the reduction's row blocks go with it)
    "centred": lambda a: a - a.mean(axis=0),
    "softmax": lambda a: np.exp(a - a.max(axis=0)) / np.exp(a - a.max(axis=0)).sum(axis=0),
}


@pytest.mark.parametrize("rows, cols", [(1031, 523), (1024, 1024)])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int8", "bool"])
def test_reductions_over_the_first_axis_of_a_big_array_equal_numpy(dtype, rows, cols, capsys):
    """1031 rows (prime: the last block is short) or 1024, past te_rules.ROW_BLOCK_BYTES in every dtype (the
    columns scale with the item size; a comparison's bool array is smaller, and keeps the one-pass schedule); a
    NaN in a float column propagates as numpy's does."""
    x = data(dtype, (rows, cols * 4 // np.dtype(dtype).itemsize), seed=7)
    if x.dtype.kind == "f":
        x[517, 3] = np.nan
    for name, fn in FIRST_AXIS.items():
        if dtype == "bool" and name in ("mean", "sumsq 3-d", "centred", "softmax") or \
                dtype == "int8" and name == "softmax":  # (numpy's exp of int8 is float16, which jitop does not take)
            continue
        k = jitop.kernel(fn, fallback=False)
        got, want = jit_call(k, x), numpy_ref(fn, x)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        # each float column is a sum of `rows` terms in another order than numpy's: within n * eps of sum |terms|
        bound = x.shape[0] * np.finfo(want.dtype).eps * 4 if want.dtype.kind == "f" else 0
        big = float(np.nanmax(np.abs(x))) if x.dtype != bool else 1.0
        terms = {"sum": x.shape[0] * big, "sumsq 3-d": x.shape[0] * big * big, "centred": big}.get(name, 1.0)
        np.testing.assert_allclose(got, want, rtol=bound, atol=bound * terms, err_msg=name)
        if x.nbytes >= 2 << 20 and name == "sum":
            k.explain(x)
            assert "_blocks" in capsys.readouterr().out  # (the row-block schedule, not the one-pass one)


@pytest.mark.parametrize("name,fn", [
    ("int sum times 0", lambda a, b: a.sum(0) * 0),
    ("isnan of an int max", lambda a, b: np.isnan(a.max())),
    ("isfinite of any", lambda a, b: np.isfinite(np.any(a, axis=0))),
    ("row-fused, both folded", lambda a, b: (a - a.max(-1, keepdims=True)) * 0 + a.sum(-1, keepdims=True) * 0),
    ("matmul times 0", lambda a, b: (a @ b) * 0),
    ("one dead, one live", lambda a, b: (a.sum(0) * 0, a.max(0) + 1)),
])
def test_a_reduction_whose_value_folds_away_in_its_reader_is_not_computed(name, fn) -> None:
    """An int `x.sum() * 0` is 0 once its expression is simplified: the reduction's stage is read by no output
    and is dropped (it was left in the schedule and failed the compile, so the function ran as numpy)."""
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    b = np.ones((4, 5), np.int32)
    got, expected = jit_call(jitop.kernel(fn, fallback=False), a, b), fn(a, b)
    for g, e in zip(*(r if isinstance(r, tuple) else (r,) for r in (got, expected)), strict=True):
        assert_same(g, e)
