"""numpy's advanced indexing by integer arrays under @jitop.kernel (jitop.graph.advanced): reads with several index
arrays (`x[rows, labels]`, adjacent or not, broadcast together) and assignments through them (`a[idx] = v`,
`onehot[np.arange(n), labels] = 1`, `a[idx] += 1`), with numpy's values (a position written twice keeps its last
value), its errors, its effect on the caller's array, for constant and run-time indices and varying sizes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop
from kernel_checks import assert_same


def _copies(args):
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def check(fn, *args):
    """fn compiled (a fallback fails the test) and as numpy on copies of args: equal results, and equal
    arguments after (an assignment to an argument changes the caller's array)."""
    mine, theirs = _copies(args), _copies(args)
    want = fn(*theirs)
    got = jitop.kernel(fn, fallback=False)(*mine)
    assert_same(got, want)
    for m, t in zip(mine, theirs):
        if isinstance(t, np.ndarray):
            assert_same(m, t)


def scatter(a, idx, v):
    a[idx] = v
    return a


def scatter_add(a, idx, v):
    a[idx] += v  # numpy's buffered update: a repeated position gets one addition, the last
    return a


def onehot(labels):
    out = np.zeros((labels.shape[0], 5), np.float32)
    out[np.arange(labels.shape[0]), labels] = 1
    return out


RNG = np.random.default_rng(7)
A = RNG.standard_normal(11)
B = RNG.standard_normal((4, 3, 5)).astype(np.float32)


@pytest.mark.parametrize("fn, args", [
    (scatter, (A, np.array([3, 1, -1, 3, 10]), np.arange(5.0))),         # repeated: the last write stays
    (scatter, (A, np.array([[0, 2], [4, 4]]), 7)),                        # a 2-D index, a scalar value
    (scatter, (A.astype(np.int8), np.array([5, 0], np.uint8), np.array([300.7, -2.0]).astype(np.int16))),
    (scatter, (A, np.array([], np.int64), np.zeros(0))),
    (scatter_add, (A, np.array([1, 1, 2, -10]), np.array([1.0, 2.0, 3.0, 4.0]))),
    (lambda a, i: scatter(a, i, np.float32(2.5)), (B, np.array([3, 0, 3]))),           # whole rows
    (lambda a, i, v: scatter(a, (slice(None), i), v), (B, np.array([2, 0]), np.ones((4, 2, 5), np.float32))),
    (lambda a, i, j: scatter(a, (i, j), -1), (B, np.array([0, 3, 3]), np.array([2, -1, -1]))),
    (lambda a, i, j, v: scatter(a, (i, slice(None), j), v), (B, np.array([[0], [3]]), np.array([1, 4]),
                                                              np.arange(3.0, dtype=np.float32))),
    (lambda a, i, j: scatter(a, (Ellipsis, i, j), 0), (B, np.array([2]), np.array([0, 4]))),
    (lambda a, i: scatter(a, (1, i), 9), (B, np.array([0, 2]))),          # an integer is an index array too
    (lambda a: scatter(a, [1, -2, 1], [5, 6, 7]), (A,)),                  # constant lists
    (lambda a: scatter(a, ([0, 3], [2, 2], [4, 0]), 1), (B,)),
    (lambda a: a[[1, 3, -1]] * 2, (A,)),
    (lambda x, i, j: x[i, j], (B, np.array([0, 3, -4]), np.array([[2], [0]]))),        # broadcast together
    (lambda x, i, j: x[i, :, j], (B, np.array([0, 3, -4]), np.array([4, 4, 0]))),      # not adjacent: in front
    (lambda x, i: x[:, 2, i] + x[0, i, 1], (B, np.array([1, -1]))),
    (onehot, (np.array([0, 4, 2, 2, 1, 3, 0]),)),
    (lambda x, labels: -np.log(x[np.arange(x.shape[0]), labels]).mean(), (np.abs(B[0]), np.array([4, 0, 2]))),
])
def test_values_dtypes_and_the_callers_array_are_numpys(fn, args):
    check(fn, *args)


def test_a_position_written_twice_keeps_the_last_value_at_every_size():
    """One kernel for varying sizes; the values are stored in one ordered pass."""
    f = jitop.kernel(scatter, fallback=False)
    rng = np.random.default_rng(1)
    for n, m in ((50, 7), (13, 40), (1000, 3000), (8, 8), (31, 2)):
        a, idx, v = rng.standard_normal(n), rng.integers(-n, n, m), rng.standard_normal(m)
        expected = scatter(a.copy(), idx, v)
        assert_same(f(a, idx, v), expected)
        assert_same(a, expected)
    assert f.traces <= 3


def test_an_assignment_is_one_ordered_pass():
    """The loop IR copies the array, then stores each value at its position, in order: no loop over the index
    inside a loop over the positions (the definition's quadratic reduction)."""
    f = jitop.kernel(scatter, fallback=False)
    args = (np.zeros(40), np.array([3, 1, 3]), np.ones(3))
    f(*args)
    text = jitop.explain(f, *args)
    assert "for m in" in text and text.rstrip().endswith("] = v[m]") and "for k in" not in text, text


def _set_then_write(a, j):
    a[:, j] = 1.0
    a[0, 0] = 2.0  # into the scatter's result, a copy of its own (not a view of a transpose)
    return a


def _add_at_then_add(a, i, j):
    np.add.at(a, (i, j), 1.0)
    a += 1
    return a


def _gather_then_update(a, i):
    t = a[i]  # a copy: the update below leaves it
    a[i] += 1
    return t


def _run_gather_then_update(a):
    a[[1, 3]] += 1  # a constant run of positions is gathered as a slice: still a copy
    b = a[[0, 1]]
    a[0] = 100.0
    return b


@pytest.mark.parametrize("fn, args", [
    (_set_then_write, (np.zeros((2, 3)), np.array([1, 2]))),
    (_add_at_then_add, (np.zeros((2, 3)), np.array([1, 1]), np.array([0, -1]))),
    (_gather_then_update, (np.arange(5.0), np.array([0, 3, 0]))),
    (_run_gather_then_update, (np.arange(4.0),)),
    (lambda a, i: a[[0], i], (np.zeros((0, 2)), np.zeros(0, np.int64))),       # nothing is checked: nothing used
    (lambda a, i: (np.add.at(a, i, 300), a)[1], (np.zeros(3, np.int8), np.array([0, 2]))),   # numpy's unsafe cast
])
def test_assignments_after_advanced_indexing_and_edge_cases(fn, args):
    check(fn, *args)


@pytest.mark.parametrize("fn, args", [
    (lambda a, i, j: a[i, j], (np.array([[10.0]]), np.array([5]), np.array([0]))),
    (lambda a, i: a[i, 0], (np.array([[10.0]]), np.array([5]))),
    (lambda a, i, k: a[i, :, k], (np.ones((1, 2, 1)), np.array([0]), np.array([-3]))),
])
def test_an_index_beyond_an_axis_of_size_1_raises(fn, args):
    """The load of an axis of size 1 needs no position: the positions' checks still run."""
    with pytest.raises(IndexError):
        fn(*args)
    with pytest.raises(IndexError, match="out of bounds"):
        jitop.kernel(fn, fallback=False)(*args)


@pytest.mark.parametrize("fn, args, error, message", [
    (scatter, (np.zeros(5), np.array([1, 5]), np.ones(2)), IndexError, "out of bounds"),
    (scatter, (np.zeros(5), np.array([1, -6]), np.ones(2)), IndexError, "out of bounds"),
    (lambda a: scatter(a, [1, 7], 0), (np.zeros(5),), IndexError, "index 7 is out of bounds"),
    (lambda x, i, j: x[i, j], (np.zeros((3, 4)), np.array([0, 1]), np.array([0, 1, 2])), IndexError,
     "shape mismatch"),
    (lambda x, i: x[i, 0], (np.zeros((3, 4)), np.array([0.0])), IndexError, "integer"),
    (scatter, (np.zeros(5), np.array([1, 2]), np.ones(3)), ValueError, "broadcast"),
    # an empty result or region reads no index: numpy checks them all the same
    (lambda a, i: a[:, i], (np.zeros((0, 2)), np.array([2])), IndexError, "out of bounds"),
    (lambda a, i: scatter(a, (slice(None), i), 1.0), (np.zeros((0, 2)), np.array([5])), IndexError, "out of bounds"),
    (lambda a, i: np.add.at(a, (slice(None), i), 1.0), (np.zeros((0, 2)), np.array([5])), IndexError,
     "out of bounds"),
    (lambda a, i: scatter(a[2:], i, 1.0), (np.zeros(2), np.array([0])), IndexError, "out of bounds"),
    (lambda i: np.add.at(np.zeros(0), i, 1.0), (np.array([0]),), IndexError, "out of bounds"),
])
def test_bad_indices_are_numpys_errors(fn, args, error, message):
    with pytest.raises(error, match=message):
        fn(*_copies(args))
    with pytest.raises(error, match=message):
        jitop.kernel(fn, fallback=False)(*_copies(args))


@pytest.mark.parametrize("fn", [lambda x, i: x[i, 1:], lambda x, i: x[i, None], lambda x, i: x[i[:1], x[0] > 0]])
def test_mixes_with_other_indices_run_as_numpy_and_say_what_to_write(fn):
    x, i = np.arange(12.0).reshape(3, 4), np.array([2, 0])
    with pytest.warns(jitop.JitopFallbackWarning, match="index|mask"):
        got = jitop.kernel(fn)(x, i)
    assert_same(got, fn(x, i))


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3), data=st.data())
def test_scatter_and_gather_hypothesis(shape, data):
    ndim = len(shape)
    axes = sorted(data.draw(st.sets(st.integers(0, ndim - 1), min_size=1)))
    index_shape = tuple(data.draw(st.lists(st.integers(0, 4), max_size=2)))
    arrays = [RNG.integers(-shape[d], shape[d], index_shape) for d in axes]

    def key(arrays):
        given = iter(arrays)
        return tuple(next(given) if d in axes else slice(None) for d in range(ndim))
    a = RNG.standard_normal(shape)
    check(lambda a, *arrays: a[key(arrays)] * 2, a, *arrays)
    check(lambda a, *arrays: scatter(a, key(arrays), 3.5), a, *arrays)


# ** unbuffered updates: np.add.at & co. **

def add_at(a, idx, v):
    np.add.at(a, idx, v)
    return a


def histogram(x, bins):
    counts = np.zeros(bins, np.int64)
    np.add.at(counts, x, 1)
    return counts


def embedding_grad(ids, g):
    grad = np.zeros((10, g.shape[1]), np.float32)
    np.add.at(grad, ids, g)
    return grad


@pytest.mark.parametrize("fn, args", [
    (add_at, (A, np.array([1, 1, -1, 3, 1]), np.arange(5.0) / 3)),       # every value, in numpy's order
    (add_at, (A.astype(np.float32), np.array([[2, 2], [0, 2]]), np.float32(0.1))),
    (add_at, (np.zeros(4, np.int8), np.array([0, 0, 0]), np.array([100, 100, 100]))),    # wraps as numpy's
    (histogram, (RNG.integers(0, 6, 50), 6)),
    (embedding_grad, (RNG.integers(0, 10, 30), RNG.standard_normal((30, 5)).astype(np.float32))),
    (lambda a, i, v: add_at(a, (Ellipsis, i), v), (B, np.array([4, 0, 4]), np.ones((4, 3, 3), np.float32))),
    (lambda a, i, j: add_at(a, (i, j), np.float32(-2)), (B, np.array([0, 0, 2]), np.array([[1], [-1]]))),
    (lambda a, i, v: (np.maximum.at(a, i, v), a)[1], (np.zeros(5), np.array([0, 0, 2]), np.array([np.nan, 1, -1]))),
    (lambda a, i, v: (np.minimum.at(a, i, v), a)[1], (A, np.array([3, 3]), np.array([-9.0, -8.0]))),
    (lambda a, i, v: (np.multiply.at(a, i, v), a)[1], (A, np.array([3, 3, 0]), np.array([2.0, 3.0, 0.5]))),
    (lambda a: add_at(a, [1, 1], 2.0), (A,)),                              # constant indices
])
def test_add_at_and_its_kin_are_numpys(fn, args):
    with np.errstate(invalid="ignore"):
        check(fn, *args)


def test_add_at_is_one_ordered_pass_at_every_size():
    f = jitop.kernel(add_at, fallback=False)
    rng = np.random.default_rng(2)
    for n, m in ((40, 7), (13, 300), (1000, 20000), (9, 2)):
        a, idx, v = rng.standard_normal(n), rng.integers(-n, n, m), rng.standard_normal(m)
        assert_same(f(a.copy(), idx, v), add_at(a.copy(), idx, v))  # bit for bit: numpy's order of additions
    text = jitop.explain(f, a, idx, v)
    assert "for m in" in text and "add_at[max(min(" in text and "for k in" not in text, text


@pytest.mark.parametrize("fn, construct", [
    (lambda a, i, v: add_at(a.astype(np.float32), i, v), "computing in float64"),
    (lambda a, i, v: add_at(a.astype(np.float32), i, 0.1), "computing in float64"),  # (ufunc.at: a float is float64)
    (lambda a, i, v: (np.subtract.at(a, i, v), a)[1], "np.subtract.at"),
])
def test_other_updates_run_as_numpy_and_say_why(fn, construct):
    args = (A, np.array([1, 1]), np.array([0.5, 0.25]))
    with pytest.warns(jitop.JitopFallbackWarning, match=construct):
        got = jitop.kernel(fn)(*_copies(args))
    assert_same(got, fn(*_copies(args)))
