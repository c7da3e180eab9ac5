"""np.cumsum / np.cumprod (the array methods, ufunc.accumulate) under @jitop.kernel: numpy's values to the bit (one
ordered pass, as numpy adds, a leading -0.0 kept; along a leading axis, whole vectors of a row at a time), dtype
(small ints and bool widen as np.sum does), shape, errors; along any axis, fused with what produces and consumes
them, one kernel for every length of a varying axis."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop
from kernel_checks import assert_same

CALLS = ["np.cumsum(x)", "np.cumsum(x, axis=0)", "np.cumsum(x, axis=-1)", "x.cumsum(axis=-1)", "np.cumprod(x, axis=-1)",
         "x.cumprod()", "np.cumsum(x, axis=0, dtype=np.float64)", "np.cumsum(x, -1, dtype=np.int8)",
         "np.cumsum(x * 2, axis=-1) + 1", "np.cumsum(x[..., ::-1], axis=-1)",
         "np.cumsum(np.cumsum(x, axis=0), axis=-1)",
         "np.maximum.accumulate(x)", "np.minimum.accumulate(x, axis=-1)", "np.fmax.accumulate(x, axis=-1)",
         "np.add.accumulate(x, axis=-1)", "np.multiply.accumulate(x, dtype=np.float64)", "np.add.accumulate(x, None)"]
SHAPES = [(7,), (3, 5), (2, 3, 17), (0, 4), (4, 0), (1,), (5, 1)]


def _data(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    x = (np.random.default_rng(seed).standard_normal(shape) * 5).astype(dtype)
    if x.dtype.kind == "f" and x.size > 3:
        x.flat[0], x.flat[1] = -0.0, -0.0  # a running sum of -0.0s is -0.0 in numpy
        x.flat[-1] = np.nan
    return x


def _same_bits(got, expected) -> None:
    assert_same(got, expected)
    if np.asarray(expected).dtype.kind == "f":
        np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))


def _check(call: str, x: np.ndarray) -> None:
    fn = eval(f"lambda x: {call}")  # noqa: S307 - the calls above
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            expected = fn(x)
        except (ValueError, TypeError, np.exceptions.AxisError) as err:
            with pytest.raises(type(err)):
                jitop.kernel(fn, fallback=False)(x)
            return
        got = jitop.kernel(fn, fallback=False)(x)
    _same_bits(got, expected)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "uint8", "bool", "int8"])
@pytest.mark.parametrize("call", CALLS)
def test_running_sums_and_products_match_numpy_bit_for_bit(call: str, dtype: str) -> None:
    for k, shape in enumerate(SHAPES):
        _check(call, _data(shape, dtype, seed=k))


@pytest.mark.parametrize("call", ["np.cumsum(x, axis=0)", "np.cumsum(x, axis=-1)", "np.cumsum(x)",
                                  "np.cumsum(x, axis=1)", "np.cumsum(x, out=np.empty(1))"])
def test_a_0d_array_is_taken_as_1d_and_bad_options_are_numpys_errors(call: str) -> None:
    with np.errstate(all="ignore"):
        try:
            expected = eval(f"lambda x: {call}")(np.ones(()))  # noqa: S307 - the calls above
        except Exception as err:  # noqa: BLE001 - numpy's own error: jitop's must be of its type
            expected = err
    fn = jitop.kernel(eval(f"lambda x: {call}"))  # noqa: S307
    if isinstance(expected, Exception):
        with pytest.raises(type(expected)):
            fn(np.ones(()))
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jitop.JitopFallbackWarning)  # (out=: not compiled, numpy's result)
        _same_bits(fn(np.ones(())), expected)


def test_one_kernel_for_every_length_of_the_scanned_axis() -> None:
    f = jitop.kernel(lambda x: (np.cumsum(x, axis=-1), np.cumprod(x, axis=0)), fallback=False)
    for n in (5, 9, 2, 17, 100, 3):
        x = _data((4, n), "float32", seed=n)
        for got, expected in zip(f(x), (np.cumsum(x, axis=-1), np.cumprod(x, axis=0))):
            _same_bits(got, expected)
    assert f.traces <= 2


def test_a_long_row_is_one_pass() -> None:
    """The loop IR holds one running accumulator per row: no loop over the prefix of each element."""
    f = jitop.kernel(lambda x: np.cumsum(x, axis=-1), fallback=False)
    x = np.random.default_rng(1).standard_normal((3, 10_000)).astype(np.float32)
    _same_bits(f(x), np.cumsum(x, axis=-1))
    text = jitop.explain(f, x)
    assert "cumsum.acc[0] = cumsum.acc[0] + x[" in text and "for k in" not in text, text


def test_a_long_column_is_one_pass_of_whole_vectors() -> None:
    """Along a leading axis each step combines a vector of the previous row's running values with the row's own:
    no loop over the prefix of each element."""
    f = jitop.kernel(lambda x: np.cumsum(x, axis=0), fallback=False)
    x = np.random.default_rng(2).standard_normal((3000, 37)).astype(np.float32)
    _same_bits(f(x), np.cumsum(x, axis=0))
    text = jitop.explain(f, x)
    assert "cumsum[max(i0 - 1, 0)" in text and "vectorized" in text and "for k in" not in text, text


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(0, 5), cols=st.integers(0, 70), axis=st.sampled_from([None, 0, 1, -1]),
       dtype=st.sampled_from(["float32", "float64", "int16", "uint32"]), seed=st.integers(0, 1000),
       op=st.sampled_from(["cumsum", "cumprod"]))
def test_scans_hypothesis(rows: int, cols: int, axis, dtype: str, seed: int, op: str) -> None:
    x = (np.random.default_rng(seed).standard_normal((rows, cols)) * 2).astype(dtype)
    _check(f"np.{op}(x, axis={axis})", x)
