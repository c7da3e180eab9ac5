"""np.pad (constant, edge, reflect, symmetric and wrap modes) and np.outer compile, with numpy's results, dtypes and
errors; np.pad's statistic and ramp modes run as numpy with the fallback warning."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop

DTYPES = ["float32", "float64", "int8", "int32", "uint8", "bool"]


def _array(rng: np.random.Generator, dtype: str, shape: tuple) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 100, shape).astype(dtype)


def _same(got, want) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def _compiled(fn):
    """A kernel whose calls must compile (a fallback would make the comparison vacuous)."""
    k = jitop.kernel(fn, fallback=False)

    def call(*args):
        with warnings.catch_warnings():
            warnings.simplefilter("error", jitop.JitopFallbackWarning)
            return k(*args)
    return call


widths = st.one_of(st.integers(0, 3), st.tuples(st.integers(0, 3), st.integers(0, 3)))


def _widths(rng: np.random.Generator, width, shape: tuple, widest: int):
    """The drawn width, or for "per axis" a (before, after) pair below `widest` per axis."""
    if width != "per axis":
        return width
    return tuple((int(rng.integers(0, widest)), int(rng.integers(0, widest))) for _ in shape)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), shape=st.sampled_from([(5,), (0,), (3, 4), (1, 7), (2, 0, 3), (2, 3, 5)]),
       width=st.one_of(widths, st.just("per axis")), value=st.sampled_from([0, 1, -2.5, 7, "per side"]),
       seed=st.integers(0, 2 ** 16))
def test_constant_padding_matches_numpy(dtype, shape, width, value, seed):
    rng = np.random.default_rng(seed)
    x, width = _array(rng, dtype, shape), _widths(rng, width, shape, 3)
    kwargs = {} if value == 0 else {"constant_values": value}
    if value == "per side":  # a pair per axis: a corner takes the later axis's value, as in numpy
        kwargs["constant_values"] = tuple((int(rng.integers(0, 50)), int(rng.integers(50, 99))) for _ in shape)
    fn = lambda a: np.pad(a, width, **kwargs)  # noqa: E731
    _same(_compiled(fn)(x), fn(x))


def test_padding_with_a_traced_value_and_then_computing():
    fn = lambda a, v: np.pad(a * 2, ((1, 0), (2, 2)), constant_values=v).sum(axis=0)  # noqa: E731
    x = np.arange(12.0).reshape(3, 4)
    _same(_compiled(fn)(x, 0.5), fn(x, 0.5))


@pytest.mark.parametrize("width, error", [(-1, ValueError), (1.5, TypeError), (((1, 2), (3, 4), (5, 6)), ValueError)])
def test_bad_pad_widths_raise_numpys_errors(width, error):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(error):
        np.pad(x, width)
    with pytest.raises(error):
        jitop.kernel(lambda a: np.pad(a, width))(x)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), shape=st.sampled_from([(5,), (1,), (3, 4), (1, 7), (2, 3, 5)]),
       width=st.one_of(widths, st.just("per axis"), st.just(9)), mode=st.sampled_from(["edge", "reflect", "symmetric",
                                                                                       "wrap"]),
       seed=st.integers(0, 2 ** 16))
def test_padding_with_the_arrays_own_elements_matches_numpy(dtype, shape, width, mode, seed):
    """numpy's positions along each axis, gathered: pads wider than the axis reflect or wrap again, as numpy's."""
    rng = np.random.default_rng(seed)
    x, width = _array(rng, dtype, shape), _widths(rng, width, shape, 7)
    fn = lambda a: np.pad(a, width, mode=mode) + 0  # noqa: E731
    _same(_compiled(fn)(x), fn(x))


def test_an_empty_axis_cannot_be_extended_as_in_numpy():
    fn = lambda a: np.pad(a, 1, mode="edge")  # noqa: E731
    x = np.ones((0, 3), np.float32)
    with pytest.raises(ValueError, match="empty axis"):
        fn(x)
    with pytest.raises(ValueError, match="empty axis"):
        jitop.kernel(fn)(x)


@pytest.mark.parametrize("mode, kwargs", [("mean", {}), ("linear_ramp", {}), ("reflect", {"reflect_type": "odd"})])
def test_other_modes_run_as_numpy_with_the_warning(mode, kwargs):
    x = np.arange(6.0).reshape(2, 3)
    k = jitop.kernel(lambda a: np.pad(a, 1, mode=mode, **kwargs))
    with pytest.warns(jitop.JitopFallbackWarning, match=f"mode='{mode}'"):
        _same(k(x), np.pad(x, 1, mode=mode, **kwargs))


@settings(max_examples=40, deadline=None)
@given(a_dtype=st.sampled_from(DTYPES), b_dtype=st.sampled_from(DTYPES),
       a_shape=st.sampled_from([(4,), (0,), (2, 3), ()]), b_shape=st.sampled_from([(5,), (1,), (3, 1)]),
       seed=st.integers(0, 2 ** 16))
def test_outer_matches_numpy(a_dtype, b_dtype, a_shape, b_shape, seed):
    rng = np.random.default_rng(seed)
    a, b = _array(rng, a_dtype, a_shape), _array(rng, b_dtype, b_shape)
    with np.errstate(all="ignore"):
        _same(_compiled(np.outer)(a, b), np.outer(a, b))
