"""Shared assertions of the operator-library tests (tests/ops)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import jitop
from kernel_checks import assert_close, assert_like  # noqa: F401 - shared with tests/graph


@pytest.fixture(autouse=True)
def no_fallback():
    """Supported dtypes compile: a JitopFallbackWarning from an operator is a test failure.
    (pytest.warns inside a test still records the warnings it expects.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("error", jitop.JitopFallbackWarning)
        yield


def assert_matmul(got, a, b) -> None:
    """got == np.matmul(a, b): numpy's container, dtype and shape; integers and bools exact; floats within
    the rounding error bound of a K-term dot product, 2 * K * eps * (|a| @ |b|), against a float64 product."""
    a, b = np.asarray(a), np.asarray(b)
    expected = np.matmul(a, b)
    assert_like(got, expected)
    if expected.dtype.kind != "f":
        np.testing.assert_array_equal(np.asarray(got), expected, strict=True)
        return
    k = a.shape[-1]
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    scale = np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
    bound = 2 * max(k, 1) * np.finfo(expected.dtype).eps * scale + np.finfo(expected.dtype).tiny
    err = np.abs(np.asarray(got, np.float64) - exact)
    assert np.all(err <= bound), f"max error {np.max(err / bound, initial=0):.3g} x the bound (K={k})"


def rand(rng: np.random.Generator, shape, dtype, scale: float = 1.0) -> np.ndarray:
    """Random values of dtype: normal floats, or integers in [-50, 50] (unsigned: [0, 100])."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * scale).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    lo = 0 if dtype.kind == "u" else -50
    return rng.integers(lo, lo + 101, shape).astype(dtype)
