"""A matrix times a vector (`A @ v`, or a one-column `B`): the tracer computes each result as the dot product of a
row of A with the vector (a vectorized row reduction, a GEMV), where the matmul template would pad its one
column to a vector of columns. Against numpy over dtypes, odd shapes, batch broadcasting and symbolic rows."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop
from jitop.graph.ir import toposort

DTYPES = ["float32", "float64", "int8", "int32", "uint8", "bool"]


def _prims(f, *args) -> set[str]:
    return {n.prim for n in toposort(f.trace(list(args)).results)}


def _operands(rng: np.random.Generator, dtype: str, a_shape: tuple, v_shape: tuple):
    def one(shape):
        if dtype == "bool":
            return rng.random(shape) < 0.5
        if np.dtype(dtype).kind == "f":
            return rng.standard_normal(shape).astype(dtype)
        info = np.iinfo(dtype)  # the whole range: products and sums wrap as numpy's do
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return one(a_shape), one(v_shape)


def _assert_matches(got: np.ndarray, a: np.ndarray, v: np.ndarray) -> None:
    want = a @ v
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want)
        return
    # both sum k products in the result dtype, in different orders: each error is at most k * eps * sum|a*v|
    k = a.shape[-1]
    bound = (k + 1) * np.finfo(want.dtype).eps * (np.abs(a.astype(np.float64)) @ np.abs(v.astype(np.float64)))
    assert np.all(np.abs(got.astype(np.float64) - want.astype(np.float64)) <= bound + np.finfo(want.dtype).tiny)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), batch=st.sampled_from([(), (1,), (3,), (2, 1)]),
       m=st.sampled_from([0, 1, 2, 7, 33]), k=st.sampled_from([0, 1, 3, 16, 67]),
       column=st.booleans(), vbatch=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_matrix_times_vector_matches_numpy(dtype, batch, m, k, column, vbatch, seed) -> None:
    rng = np.random.default_rng(seed)
    v_shape = ((*batch[-1:],) if vbatch and column else ()) + ((k, 1) if column else (k,))
    a, v = _operands(rng, dtype, (*batch, m, k), v_shape)
    f = jitop.kernel(lambda a, v: a @ v, fallback=False)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("error", jitop.JitopFallbackWarning)
        _assert_matches(f(a, v), a, v)


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_a_column_is_a_row_reduction_not_the_template(dtype) -> None:
    a, v = _operands(np.random.default_rng(0), dtype, (37, 19), (19,))
    f = jitop.kernel(lambda a, v: a @ v, fallback=False)
    assert "matmul" not in _prims(f, a, v) and "reduce" in _prims(f, a, v)
    assert "matmul" in _prims(f, a, v[:, None].repeat(2, axis=1))  # two columns: the template


def test_symbolic_rows_serve_every_length_of_a_growing_cache() -> None:
    """A decode step's scores (`cache[:t] @ q` of a cache growing a row per step): one compile for every t."""
    f = jitop.kernel(lambda cache, q: cache @ q / 8.0, dynamic={"cache": [0]}, fallback=False)
    rng = np.random.default_rng(1)
    cache, q = rng.standard_normal((70, 64), dtype=np.float32), rng.standard_normal(64, dtype=np.float32)
    for t in (17, 40, 69):
        _assert_matches(f(cache[:t], q) * np.float32(8.0), cache[:t], q)  # (exact: a power of two)
    assert f.traces == 1
