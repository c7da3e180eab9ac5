"""np.nansum / nanprod / nanmax / nanmin / nanmean / nanvar / nanstd, np.ptp and np.nan_to_num under
@jitop.kernel against numpy: values (NaN where numpy has NaN: all-NaN slices, too few elements for ddof),
dtype and shape, over axis None / int / negative / tuple with keepdims, float and integer dtypes, empty and
size-1 shapes; numpy's errors where numpy raises (a max of an empty slice)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop
from kernel_checks import assert_close

FUNCTIONS = ["nansum", "nanprod", "nanmax", "nanmin", "nanmean", "nanvar", "nanstd", "ptp"]
RTOL = {np.dtype("float32"): 2e-5, np.dtype("float64"): 1e-12}


def _data(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    """Values with NaN every third element, +-inf, and a whole NaN row (an all-NaN slice) where there is one."""
    x = (np.random.default_rng(seed).standard_normal(shape) * 10).astype(dtype)
    if x.dtype.kind == "f" and x.size:
        x.flat[::3] = np.nan
        if x.size > 4:
            x.flat[1], x.flat[2] = np.inf, -np.inf
        if x.ndim == 2 and x.shape[0] > 1:
            x[-1] = np.nan
    return x


def _numpy(fn, x):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices, degrees of freedom <= 0
        return fn(x)


def _check(fn, x) -> None:
    try:
        expected = _numpy(fn, x)
    except (ValueError, TypeError) as err:  # numpy's own error, raised by the kernel's trace as well
        with pytest.raises(type(err)):
            jitop.kernel(fn, fallback=False)(x)
        return
    got = jitop.kernel(fn, fallback=False)(x)
    rtol = RTOL.get(np.asarray(expected).dtype, 0.0)
    assert_close(got, expected, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "uint8"])
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (-1, True), ((0, 1), False)])
def test_nan_reductions_match_numpy(name: str, dtype: str, axis, keepdims: bool) -> None:
    x = _data((4, 7), dtype)
    _check(lambda x: getattr(np, name)(x, axis=axis, keepdims=keepdims), x)


@pytest.mark.parametrize("shape", [(0,), (0, 3), (1,), (5, 1), (2, 3, 5)], ids=str)
@pytest.mark.parametrize("name", FUNCTIONS)
def test_nan_reductions_of_empty_and_size_one_shapes(name: str, shape) -> None:
    _check(lambda x: getattr(np, name)(x, axis=0), _data(shape, "float64", seed=1))


@pytest.mark.parametrize("call", ["np.nanvar(x, axis=1, ddof=1)", "np.nanstd(x, correction=2)",
                                  "np.nanmax(x, axis=1, initial=-5.0)", "np.nanmin(x, axis=0, initial=50.0)",
                                  "np.nansum(x, axis=1, dtype=np.float64)", "np.nanmean(x, axis=0, dtype=np.float64)",
                                  "np.nanprod(x, axis=1, initial=2.0)", "np.nanvar(x, axis=1, ddof=0.5)",
                                  "np.nanstd(x.astype(np.int32), axis=1, ddof=1.5)", "np.var(x, ddof=2.5)",
                                  "np.std(x, axis=0, ddof=7.5)"])
def test_nan_reduction_options(call: str) -> None:
    _check(eval(f"lambda x: {call}"), _data((4, 7), "float32", seed=2))  # noqa: S307 - the calls above


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "bool"])
@pytest.mark.parametrize("options", [{}, {"nan": -1.0}, {"nan": 7.0, "posinf": 1e3, "neginf": -1e3}, {"posinf": 1e300}],
                         ids=str)
def test_nan_to_num_matches_numpy(dtype: str, options: dict) -> None:
    _check(lambda x: np.nan_to_num(x, **options), _data((3, 5), dtype, seed=3))


def test_nan_to_num_in_place_and_of_a_0d_array() -> None:
    """copy=False changes the argument (numpy's in-place conversion); a 0-d array gives a numpy scalar."""
    def in_place(x):
        np.nan_to_num(x, copy=False, nan=-1.0)
        return x - 1
    x = _data((3, 5), "float32", seed=4)
    mine, theirs = x.copy(), x.copy()
    assert_close(jitop.kernel(in_place, fallback=False)(mine), in_place(theirs))
    assert_close(mine, theirs)
    scalar = np.array(np.nan, np.float32)
    assert_close(jitop.kernel(np.nan_to_num, fallback=False)(scalar), np.nan_to_num(scalar))


def test_one_kernel_serves_every_row_length() -> None:
    """A dimension that varies becomes symbolic: the NaN counts and means come from the row length at run time."""
    f = jitop.kernel(lambda x: (np.nanmean(x, axis=-1), np.nanstd(x, axis=-1), np.nanmax(x, axis=0)), fallback=False)
    for n in (5, 9, 17, 100):
        x = _data((3, n), "float32", seed=n)
        for got, expected in zip(f(x), _numpy(lambda x: (np.nanmean(x, axis=-1), np.nanstd(x, axis=-1),
                                                          np.nanmax(x, axis=0)), x)):
            assert_close(got, expected, rtol=2e-5, atol=2e-5)
    assert f.traces <= 2


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 6), cols=st.integers(1, 40), nan_every=st.integers(1, 5), seed=st.integers(0, 99),
       name=st.sampled_from(FUNCTIONS), axis=st.sampled_from([None, 0, 1]))
def test_nan_reductions_hypothesis(rows: int, cols: int, nan_every: int, seed: int, name: str, axis) -> None:
    x = np.random.default_rng(seed).standard_normal((rows, cols))
    x.flat[::nan_every] = np.nan
    _check(lambda x: getattr(np, name)(x, axis=axis), x)
