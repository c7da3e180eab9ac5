"""Schedules on symbolic extents through jitop.build, against numpy at sizes 0, 1, primes and multiples of
the tiles: one compiled kernel per schedule serves every size. The main loops of a split carry no run-time
bounds checks (Module.checked lists the accesses the prover could not bound)."""
from __future__ import annotations

import functools

import numpy as np
import pytest

import jitop
from jitop import te
from jitop.driver import default_target

SIZES = [0, 1, 2, 7, 8, 9, 16, 31, 100, 1001]
SIZES_2D = [(0, 5), (1, 1), (3, 7), (4, 8), (5, 17), (9, 33), (64, 3)]
TARGET = default_target().replace(parallel_min_work=1)  # parallel loops really run on threads


def _vector_add():
    n = te.var("n")
    A, B = te.placeholder((n,), name="A"), te.placeholder((n,), name="B")
    C = te.compute(A.shape, lambda i: A[i] + B[i], name="C")
    return A, B, C


def _split(kind_outer: str, factor: int = 8):
    def schedule(s, C):
        xo, xi = s[C].split(C.op.axis[0], factor)
        s[C].vectorize(xi)
        if kind_outer == "parallel":
            s[C].parallel(xo)
        elif kind_outer == "unroll":
            s[C].unroll(xo)
    return schedule


def _nparts(s, C):
    xo, xi = s[C].split(C.op.axis[0], nparts=3)
    s[C].parallel(xo)


ONE_D = {
    "default": lambda s, C: None,
    "split8_vectorize": _split("serial"),
    "split8_vectorize_parallel": _split("parallel"),
    "split3_vectorize": _split("serial", 3),
    "split_nparts_parallel": _nparts,
    "split_split": lambda s, C: s[C].split(s[C].split(C.op.axis[0], 16)[1], 4),
}


@functools.cache
def built_1d(name: str):
    A, B, C = _vector_add()
    s = jitop.create_schedule(C.op)
    ONE_D[name](s, C)
    return jitop.build(s, [A, B, C], target=TARGET)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", list(ONE_D))
def test_one_dimensional_schedules(name, n):
    g = np.random.default_rng(n)
    a, b = g.standard_normal(n).astype("float32"), g.standard_normal(n).astype("float32")
    np.testing.assert_array_equal(built_1d(name)(a, b), a + b)


def test_no_access_is_checked_at_run_time():
    for name in ONE_D:
        assert not built_1d(name).checked, (name, built_1d(name).checked)
    for name in TWO_D:
        assert not built_2d(name).checked, (name, built_2d(name).checked)


def _matrix(kind: str):
    n, m = te.var("n"), te.var("m")
    X = te.placeholder((n, m), name="X")
    if kind == "rowsum":
        k = te.reduce_axis((0, m), "k")
        Y = te.compute((n,), lambda i: te.sum(X[i, k], axis=k), name="Y")
    else:
        Y = te.compute((n, m), lambda i, j: X[i, j] * 2.0 + 1.0, name="Y")
    return X, Y


def _tile_fuse(s, X, Y):
    xo, yo, xi, yi = s[Y].tile(Y.op.axis[0], Y.op.axis[1], 4, 8)
    s[Y].parallel(s[Y].fuse(xo, yo))
    s[Y].vectorize(yi)


def _rowsum_split(s, X, Y):
    ko, ki = s[Y].split(Y.op.reduce_axis[0], 4)
    s[Y].parallel(Y.op.axis[0])


def _reorder_unroll(s, X, Y):
    i, j = Y.op.axis
    jo, ji = s[Y].split(j, 4)
    s[Y].reorder(jo, i, ji)
    s[Y].unroll(ji)


def _cache_write_rowsum(s, X, Y):
    cache = s.cache_write(Y, "local")
    io, ii = s[Y].split(Y.op.axis[0], 4)
    s[cache].compute_at(s[Y], io)
    ko, ki = s[cache].split(s[cache].op.reduce_axis[0], 8)


def _cache_read(s, X, Y):
    XL = s.cache_read(X, "local", [Y])
    yo, yi = s[Y].split(Y.op.axis[1], 8)
    s[XL].compute_at(s[Y], yo)
    s[Y].vectorize(yi)


TWO_D = {
    "tile_fuse_parallel_vectorize": ("map", _tile_fuse),
    "rowsum_split_reduce_axis": ("rowsum", _rowsum_split),
    "default": ("map", lambda s, X, Y: None),
    "reorder_unroll": ("map", _reorder_unroll),
    "cache_write_compute_at_rowsum": ("rowsum", _cache_write_rowsum),
    "cache_read_compute_at": ("map", _cache_read),
}


@functools.cache
def built_2d(name: str):
    kind, schedule = TWO_D[name]
    X, Y = _matrix(kind)
    s = jitop.create_schedule(Y.op)
    schedule(s, X, Y)
    return jitop.build(s, [X, Y], target=TARGET)


def _reference(name: str, x):
    return x.sum(axis=1, dtype=np.float64) if TWO_D[name][0] == "rowsum" else x * 2.0 + 1.0


@pytest.mark.parametrize("shape", SIZES_2D)
@pytest.mark.parametrize("name", list(TWO_D))
def test_two_symbol_schedules(name, shape):
    x = np.random.default_rng(1).standard_normal(shape).astype("float32")
    np.testing.assert_allclose(built_2d(name)(x), _reference(name, x), rtol=1e-5, atol=1e-5)


@functools.cache
def built_compute_at(axis: int, factor: int):
    n, m = te.var("n"), te.var("m")
    X = te.placeholder((n, m), name="X")
    E = te.compute((n, m), lambda i, j: X[i, j] + 1.0, name="E")
    F = te.compute((n, m), lambda i, j: E[i, j] * 2.0, name="F")
    s = jitop.create_schedule(F.op)
    fo, fi = s[F].split(F.op.axis[axis], factor)
    s[E].compute_at(s[F], fo)
    if axis == 1:
        s[F].vectorize(fi)
    return jitop.build(s, [X, F], target=TARGET)


@pytest.mark.parametrize("shape", SIZES_2D)
@pytest.mark.parametrize("axis, factor", [(0, 4), (1, 8)])
def test_compute_at_on_symbolic_extents(axis, factor, shape):
    x = np.random.default_rng(2).standard_normal(shape).astype("float32")
    np.testing.assert_allclose(built_compute_at(axis, factor)(x), (x + 1.0) * 2.0, rtol=1e-6)
