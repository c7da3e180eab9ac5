"""np.take under @jitop.kernel (ONNX Gather): run-time and constant indices against numpy, on every axis, with
negative indices, odd shapes (1, 0, primes), fused with what follows, numpy's IndexError for an index out of
range (when the kernel runs), clip/wrap modes, and an index length that varies under dynamic=True."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jitop
from jitop.errors import FallbackError
from jitop.graph import fusion
from jitop.graph.tracer import trace_symbolic


def kernel(fn, **kw):
    return jitop.kernel(fn, fallback=False, **kw)


def same(got, want) -> None:
    """Exactly numpy's values, dtype and shape (a gather copies elements)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_array_equal(got, want)


def table(rng, shape, dtype=np.float32):
    return (rng.standard_normal(shape) * 100).astype(dtype)


def prims(fn, *args) -> list[str]:
    """The primitives of fn's traced result node and its sources (no LLVM)."""
    n = trace_symbolic(fn, args, {}).result.node
    return [n.prim] + [s.prim for s in n.src]


def take0(t, ids):
    return np.take(t, ids, axis=0)


# ** run-time indices **
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_embedding_lookup_of_a_batch_is_numpys(dtype, index_dtype):
    rng = np.random.default_rng(0)
    t = table(rng, (13, 7), dtype)
    ids = rng.integers(-13, 13, (2, 5)).astype(index_dtype)  # (batch, seq) -> (batch, seq, hidden)
    same(kernel(take0)(t, ids), np.take(t, ids, axis=0))


@pytest.mark.parametrize("axis", [0, 1, -1, None])
@pytest.mark.parametrize("index_shape", [(4,), (2, 3)])
def test_every_axis(axis, index_shape):
    rng = np.random.default_rng(1)
    t = table(rng, (3, 5, 7))
    n = t.size if axis is None else t.shape[axis]
    ids = rng.integers(-n, n, index_shape)
    f = kernel(lambda t, ids: np.take(t, ids, axis=axis))
    same(f(t, ids), np.take(t, ids, axis=axis))


def test_0d_index_array_and_python_int_argument():
    rng = np.random.default_rng(2)
    t = table(rng, (4, 6))
    f = kernel(lambda t, i: np.take(t, i, axis=1))
    for i in (np.array(-2), 3):
        same(f(t, i), np.take(t, i, axis=1))
    g = kernel(lambda v, i: np.take(v, i))
    same(g(t[0], np.array(5)), np.take(t[0], np.array(5)))


@pytest.mark.parametrize("shape, axis, ids", [((1, 1), 0, [0, 0, -1]), ((0, 3), 0, np.zeros((0, 2), np.int64)),
                                              ((3, 0), 0, [2, 0]), ((97, 5), 0, [96, -97, 50]),
                                              ((5, 97), 1, [[96], [-1]]), ((2, 3), 1, np.zeros(0, np.int64))])
def test_odd_shapes(shape, axis, ids):
    t = table(np.random.default_rng(3), shape)
    ids = np.asarray(ids)
    same(kernel(lambda t, ids: np.take(t, ids, axis=axis))(t, ids), np.take(t, ids, axis=axis))


def test_computed_indices_method_and_other_integer_dtypes():
    rng = np.random.default_rng(4)
    t = table(rng, (9, 4))
    f = kernel(lambda t, ids: t.take(ids % 9 - 4, axis=0) * 2)
    ids = rng.integers(-50, 50, 11)
    same(f(t, ids), t.take(ids % 9 - 4, axis=0) * 2)
    for ids in (np.array([3, 8], np.uint8), np.array([True, False])):
        same(kernel(take0)(t, ids), np.take(t, ids, axis=0))


def test_a_float_index_is_numpys_type_error():
    t = np.zeros((3, 2), np.float32)
    with pytest.raises(TypeError, match="Cannot cast array data from dtype\\('float64'\\) to dtype\\('int64'\\)"):
        kernel(take0)(t, np.array([1.0]))


# ** constant indices: basic indexing where it can be **
def test_constant_indices_become_index_nodes_or_a_constant_take():
    t = np.zeros((4, 6), np.float32)
    assert prims(lambda x: np.take(x, 2, axis=1), t) == ["index", "arg"]
    assert prims(lambda x: np.take(x, [1, 3, 5], axis=1), t) == ["index", "arg"]
    assert prims(lambda x: np.take(x, [[0, -1]], axis=1), t) == ["take", "arg", "array_const"]
    assert prims(lambda x, i: np.take(x, i, axis=1), t, np.array([0])) == ["take", "arg", "arg"]
    rng = np.random.default_rng(5)
    t = table(rng, (4, 6))
    for ids in (2, -1, [1, 3, 5], [[0, -1]], [], [5, 5, 0], np.array([-6, 0], np.int32)):
        f = kernel(lambda x, ids=ids: np.take(x, ids, axis=1) + 1)
        same(f(t), np.take(t, ids, axis=1) + 1)


def test_constant_index_out_of_range_is_numpys_error_when_tracing():
    t = np.zeros((4, 6), np.float32)
    with pytest.raises(IndexError, match="^index 6 is out of bounds for axis 1 with size 6$"):
        kernel(lambda x: np.take(x, [0, 6], axis=1))(t)
    with pytest.raises(IndexError, match="cannot do a non-empty take from an empty axes"):
        kernel(take0)(np.zeros((0, 3)), np.array([0]))


# ** out-of-range run-time indices and modes **
def test_out_of_range_index_raises_index_error_and_the_next_call_runs():
    rng = np.random.default_rng(6)
    t = table(rng, (10, 8))
    f = kernel(lambda t, ids: np.take(t, ids, axis=0) + 1)
    for bad in (10, -11, 1 << 40, -(1 << 62)):
        with pytest.raises(IndexError, match="^index out of bounds for axis 0 with size 10$"):
            f(t, np.array([1, bad, 2]))
    ids = np.array([9, -10, 0])
    same(f(t, ids), np.take(t, ids, axis=0) + 1)


@pytest.mark.parametrize("mode", ["clip", "wrap"])
def test_clip_and_wrap_modes(mode):
    rng = np.random.default_rng(7)
    t = table(rng, (5, 7))
    # (numpy's wrap mode subtracts n until an index fits: a huge one would take numpy minutes)
    ids = np.array([[-100, -8, -7, -1], [0, 6, 7, 1 << 40 if mode == "clip" else 1000]])
    for axis in (0, 1):
        f = kernel(lambda t, ids: np.take(t, ids, axis=axis, mode=mode))
        same(f(t, ids), np.take(t, ids, axis=axis, mode=mode))
        g = kernel(lambda t: np.take(t, [-9, 3, 12], axis=axis, mode=mode))
        same(g(t), np.take(t, [-9, 3, 12], axis=axis, mode=mode))


def test_unknown_mode_and_out_are_refused():
    t, ids = np.zeros((3, 2)), np.array([0])
    with pytest.raises(ValueError, match="clipmode must be one of 'clip', 'raise', or 'wrap'"):
        kernel(lambda t, ids: np.take(t, ids, mode="nearest"))(t, ids)
    with pytest.raises(FallbackError, match="out="):
        kernel(lambda t, ids: np.take(t, ids, out=np.zeros(1)))(t, ids)


# ** fusion **
def embed(words, positions, ids, g, b):
    x = np.take(words, ids, axis=0) + positions[: ids.shape[-1]]
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + 1e-5) * g + b


def test_embedding_plus_position_then_layer_norm_fuses_the_gather():
    rng = np.random.default_rng(8)
    words, positions = table(rng, (50, 32)) / 100, table(rng, (16, 32)) / 100
    g, b, ids = table(rng, (32,)) / 100, table(rng, (32,)) / 100, rng.integers(0, 50, (3, 11))
    node = trace_symbolic(embed, [words, positions, ids, g, b], {}).result.node
    gathers = [n for n in fusion.materialize([node]) if n.prim == "take"]
    assert gathers == []  # inlined into its consumers, never written out
    got, want = kernel(embed)(words, positions, ids, g, b), embed(words, positions, ids, g, b)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ** symbolic dims (issue 23) **
def test_a_varying_index_length_under_dynamic_is_one_kernel():
    rng = np.random.default_rng(9)
    words, positions = table(rng, (50, 8)), table(rng, (64, 8))
    f = kernel(lambda w, p, ids: np.take(w, ids, axis=0) + p[: ids.shape[-1]], dynamic=True)
    for n in (2, 3, 7, 16, 31, 64):
        ids = rng.integers(-50, 50, (2, n))
        same(f(words, positions, ids), np.take(words, ids, axis=0) + positions[:n])
    assert f.traces == 1
    with pytest.raises(IndexError, match="out of bounds for axis 0"):
        f(words, positions, np.array([[0, 50, 1]]))


@pytest.mark.parametrize("ids, mode", [([0, -1, 1], "raise"), (-2, "raise"), ([[5, -9]], "wrap"), ([7], "clip")])
def test_a_symbolic_axis_with_constant_indices(ids, mode):
    rng = np.random.default_rng(10)
    # defaults, not a closure: a kernel reading a closure cell is traced again at each new shape
    f = kernel(lambda x, ids=ids, mode=mode: np.take(x, ids, axis=1, mode=mode), dynamic=True)
    for n in (2, 5, 13):
        x = table(rng, (3, n))
        same(f(x), np.take(x, ids, axis=1, mode=mode))
    assert f.traces == 1
    if mode == "raise":
        with pytest.raises(IndexError):
            f(table(rng, (3, 1)))  # size 1 is a constant: numpy's error at the trace


def test_a_constant_int_on_a_symbolic_axis_is_basic_indexing():
    x = np.zeros((3, 5), np.float32)
    n = trace_symbolic(lambda x: np.take(x, -2, axis=1), [x], {0: (1,)}).result.node
    assert n.prim == "index" and n.shape == (3,)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from([1, 2, 3, 5, 8]), min_size=1, max_size=3), st.data())
def test_hypothesis_shapes_axes_and_indices(shape, data):
    axis = data.draw(st.sampled_from([None] + list(range(-len(shape), len(shape)))))
    n = int(np.prod(shape)) if axis is None else shape[axis]
    index_shape = data.draw(st.lists(st.sampled_from([0, 1, 2, 3]), max_size=2))
    ids = np.array(data.draw(st.lists(st.integers(-n, n - 1), min_size=int(np.prod(index_shape)),
                                      max_size=int(np.prod(index_shape))))).reshape(index_shape).astype(np.int64)
    t = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    f = kernel(lambda t, ids: np.take(t, ids, axis=axis) * 2)
    same(f(t, ids), np.take(t, ids, axis=axis) * 2)


@pytest.mark.parametrize("index_dtype", ["int64", "int32", "uint8"])
def test_an_integer_array_index_among_full_slices_is_a_gather(index_dtype):
    """a[rows], a[:, cols], a[..., with a list]: numpy's advanced indexing with one integer array is np.take
    along its axis (negative indices count from the end; out of range is numpy's IndexError)."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((40, 9, 3)).astype(np.float32)
    low = 0 if index_dtype == "uint8" else -9
    rows, cols = rng.integers(low, 9, 13).astype(index_dtype), rng.integers(low, 9, (2, 5)).astype(index_dtype)
    f = jitop.kernel(lambda a, r, c: (a[r] * 2, a[:, c] + 1, a[:, :, [2, -1]], a[r, :, :]), fallback=False)
    for got, want in zip(f(a, rows, cols), (a[rows] * 2, a[:, cols] + 1, a[:, :, [2, -1]], a[rows, :, :])):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    with pytest.raises(IndexError):
        f(a, np.array([40], index_dtype), cols)


def test_a_boolean_mask_read_still_runs_as_numpy():
    """a[a > 5]: its length depends on the data (a fallback); several index arrays are
    tests/graph/test_advanced_indexing.py's."""
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    with pytest.warns(jitop.JitopFallbackWarning):
        got = jitop.kernel(lambda a: a[a > 5])(a)
    np.testing.assert_array_equal(got, a[a > 5])
