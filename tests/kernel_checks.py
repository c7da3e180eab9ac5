"""Shared assertions of the kernel conformance tests."""
from __future__ import annotations

import numpy as np


def assert_same(got, expected, rtol: float | None = None) -> None:
    """Same container kind (array vs numpy scalar), dtype, shape and values (NaN == NaN)."""
    assert isinstance(got, np.ndarray) == isinstance(expected, np.ndarray), (type(got), type(expected))
    if not isinstance(expected, np.ndarray):
        assert isinstance(got, np.generic), type(got)
    g, e = np.asarray(got), np.asarray(expected)
    assert g.dtype == e.dtype, (g.dtype, e.dtype)
    assert g.shape == e.shape, (g.shape, e.shape)
    if rtol is None or e.dtype.kind != "f":
        np.testing.assert_array_equal(g, e, strict=True)
    else:
        np.testing.assert_allclose(g, e, rtol=rtol, atol=0, equal_nan=True, strict=True)
