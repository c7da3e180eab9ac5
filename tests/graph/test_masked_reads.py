"""Boolean-mask reads reduced in the kernel (jitop.graph.masked): `x[x > 0].sum()`, `np.mean(x[valid])`,
`x[rows].max(0)` compile as reductions over the mask, with numpy's values, dtypes and errors (a maximum of no
element raises ValueError when the kernel runs); a read used as an array (returned, its length) runs as numpy with
the warning."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop
from kernel_checks import assert_close

RNG = np.random.default_rng(3)
X = RNG.standard_normal((6, 5))
X[1, 1] = np.nan

CALLS = [
    "x[x > 0].sum()", "np.mean(x[x > 0])", "(x[x > 0] * 2 - 1).max()", "x[x < -9].sum()", "x[x < -9].mean()",
    "np.std(x[np.isfinite(x)], ddof=1)", "x[x[:, 0] > 0].sum(axis=0)", "x[x[:, 0] > 0].max(axis=0)",
    "(x[x[:, 0] > 0] - x.mean(0)).mean(0)", "x[x > 0].min(initial=0.5)", "x[x > 0].astype(np.float32).sum()",
    "(x[x > 0] > 1).any()", "np.sum(x[x > 0] ** 2)", "abs(-x[x > 1]).prod()", "x[x > 0].sum(axis=0)",
    "(-x[x > 0]).min()", "np.var(x[x != 0], axis=0)", "x.astype(np.int32)[x > 0].sum()", "np.max(x[x > 0])",
    "(x[x > 0] * x[x > 0]).sum()", "x[np.isnan(x)].sum()", "x[x < -9].max(initial=-1.0)",
]


def _both(fn, *args):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            expected = fn(*args)
        except (ValueError, TypeError, IndexError) as err:
            with pytest.raises(type(err)):
                jitop.kernel(fn, fallback=False)(*args)
            return
        got = jitop.kernel(fn, fallback=False)(*args)
    rtol = 1e-5 if np.asarray(expected).dtype == np.float32 else 1e-12
    assert_close(got, expected, rtol=rtol)


@pytest.mark.parametrize("call", CALLS)
def test_reductions_of_a_mask_read_match_numpy(call: str) -> None:
    _both(eval(f"lambda x: {call}"), X)  # noqa: S307 - the calls above


@pytest.mark.parametrize("call", ["x[x > 9].max()", "x[x[:, 0] > 9].min(axis=0)", "np.max(x[x > 9])"])
def test_a_maximum_of_no_element_raises_numpys_error_when_the_kernel_runs(call: str) -> None:
    fn = eval(f"lambda x: {call}")  # noqa: S307 - the calls above
    f = jitop.kernel(fn, fallback=False)
    assert_close(f(X * 10), fn(X * 10))  # the same kernel: whether there is an element is the data's
    for g in (fn, f):
        with pytest.raises(ValueError, match="zero-size array"):
            g(X)


@pytest.mark.parametrize("call", ["x[x > 0]", "len(x[x > 0])", "x[x > 0][0]", "x[x > 0] + np.arange(8.0)",
                                  "np.cumsum(x[x > 0])", "x[x > 0].shape"])
def test_a_read_used_as_an_array_runs_as_numpy_with_the_warning(call: str) -> None:
    fn = eval(f"lambda x: {call}")  # noqa: S307 - the calls above
    x = np.arange(12.0).reshape(3, 4) - 3
    with pytest.warns(jitop.JitopFallbackWarning, match="boolean-mask read"):
        got = jitop.kernel(fn)(x)
    expected = fn(x)
    assert np.array_equal(np.asarray(got), np.asarray(expected))


def test_a_mask_that_does_not_fit_is_numpys_index_error() -> None:
    fn = lambda x, m: x[m].sum()  # noqa: E731
    for fn_ in (fn, jitop.kernel(fn, fallback=False)):
        with pytest.raises(IndexError, match="boolean index did not match"):
            fn_(X, np.ones(4, bool))


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 9), threshold=st.floats(-2, 2), seed=st.integers(0, 999),
       dtype=st.sampled_from(["float32", "float64", "int64", "uint8"]))
def test_masked_reductions_hypothesis(rows, cols, threshold, seed, dtype):
    x = (np.random.default_rng(seed).standard_normal((rows, cols)) * 4).astype(dtype)
    t = np.asarray(threshold).astype(dtype)[()]
    for fn in (lambda x: x[x > t].sum(), lambda x: x[x > t].min(initial=0), lambda x: np.mean(x[x[:, 0] >= t], axis=0)):
        _both(fn, x)
