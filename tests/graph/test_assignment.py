"""In-place assignment in a traced function (`a[i] = v`, `a += b`, an output filled row by row): compiled, with
numpy's results, numpy's errors, and numpy's effect on the caller's arrays and on views (jitop.graph.mutation).
A construct jitop does not follow (writing through a transpose, reading a reshape after its base changed) runs
as numpy, with the warning."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop


def compiled(fn, **options):
    """A kernel whose calls must compile: a fallback is an error (it would make a test vacuous)."""
    k = jitop.kernel(fn, fallback=False, **options)
    return k


def same(got, want) -> None:
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, tuple):
        for g, w in zip(got, want):
            same(g, w)
        return
    assert np.asarray(got).dtype == np.asarray(want).dtype and np.shape(got) == np.shape(want)
    np.testing.assert_array_equal(got, want)


def run_both(fn, *args, **options):
    """fn compiled and as numpy, each on its own copies of the arguments: (results, arguments after)."""
    mine = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    theirs = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    got = compiled(fn, **options)(*mine)
    want = fn(*theirs)
    same(got, want)
    for m, t in zip(mine, theirs):
        if isinstance(t, np.ndarray):
            same(m, t)
    return mine


# ** arguments changed in place **

def iadd(a):
    a += 1
    return a * 2


def setitem(a):
    a[0] = 100
    return a + 1


def setslice(a, b):
    a[1:] = b[:-1]
    return a.sum()


@pytest.mark.parametrize("fn, nargs", [(iadd, 1), (setitem, 1), (setslice, 2)])
def test_an_argument_changed_in_place_changes_the_callers_array_on_every_call(fn, nargs):
    k = compiled(fn)
    x, y, b = np.arange(5.0), np.arange(5.0), np.arange(10.0, 15.0)
    for _ in range(2):  # a second call changes it again, as numpy does
        same(k(x, b) if nargs == 2 else k(x), fn(y, b) if nargs == 2 else fn(y))
        same(x, y)
    assert k.traces == 1


def test_an_argument_changed_and_returned_is_the_callers_array():
    def bump(a, b):
        a += b
        return a, a.sum()
    k = compiled(bump)
    x = np.ones(4, np.float32)
    got, total = k(x, np.arange(4, dtype=np.float32))
    assert got is x and total == 10.0
    np.testing.assert_array_equal(x, [1, 2, 3, 4])


def test_a_decode_step_writes_one_row_of_a_cache_at_a_traced_position():
    """A Python int position is a run-time value of the kernel: one compile serves every step."""
    def step(cache, row, t):
        cache[t] = row
        return cache.sum(axis=0)
    k = compiled(step)
    mine, numpys = np.zeros((6, 3), np.float32), np.zeros((6, 3), np.float32)
    for t in (0, 1, 2, 5, -1, -6):
        row = np.full(3, t + 0.5, np.float32)
        same(k(mine, row, t), step(numpys, row, t))
        same(mine, numpys)
    assert k.traces == 1
    for bad in (6, -7):
        with pytest.raises(IndexError):
            step(numpys.copy(), np.zeros(3, np.float32), bad)
        with pytest.raises(IndexError):
            k(mine, np.zeros(3, np.float32), bad)


def test_a_read_only_argument_raises_numpys_error():
    x = np.arange(3.0)
    x.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        setitem(x)
    with pytest.raises(ValueError, match="read-only"):
        compiled(setitem)(x)
    np.testing.assert_array_equal(x, np.arange(3.0))


def bump_then_read(a, b):
    a += 1
    return b * 1


def test_arguments_sharing_memory_run_as_numpy():
    """f(a, a) or overlapping views: numpy's code sees its own writes through the other argument."""
    k = compiled(bump_then_read)
    x, y = np.arange(6.0), np.arange(6.0)
    same(k(x, x), bump_then_read(y, y))
    same(x, y)
    x, y = np.arange(8.0), np.arange(8.0)
    same(k(x[:6], x[2:]), bump_then_read(y[:6], y[2:]))
    same(x, y)
    same(k(x[:4], x[4:]), bump_then_read(y[:4], y[4:]))  # apart: compiled
    same(x, y)


# ** numpy's rules for what is assigned **

def test_in_place_operators_follow_numpys_casting_and_shapes():
    def add_into(a, b):
        a += b
        return a
    run_both(add_into, np.arange(4, dtype=np.float32), np.linspace(0, 1, 4))  # same_kind: float64 into float32
    run_both(add_into, np.arange(6.0).reshape(2, 3), np.arange(3.0))  # b broadcast over a
    with pytest.raises(TypeError):  # UFuncTypeError: float64 into int64 is not same_kind
        compiled(add_into)(np.arange(3), np.ones(3))
    with pytest.raises(ValueError, match="non-broadcastable output"):
        compiled(add_into)(np.arange(3.0), np.ones((2, 3)))

    def add_300(a):
        a += 300
        return a
    with pytest.raises(OverflowError):
        add_300(np.zeros(2, np.int8))
    with pytest.raises(OverflowError):
        compiled(add_300)(np.zeros(2, np.int8))


@pytest.mark.parametrize("value, error", [(300, OverflowError), (float("nan"), ValueError)])
def test_a_constant_that_does_not_fit_raises_numpys_error(value, error):
    def put(a):
        a[0] = value
        return a
    with pytest.raises(error):
        put(np.zeros(2, np.int8))
    with pytest.raises(error):
        compiled(put)(np.zeros(2, np.int8))


def test_values_are_cast_and_broadcast_as_numpy_assigns_them():
    def fill(a, v):
        out = a.copy()
        out[1:, ::2] = v
        out[0] = 7.9  # truncated into an int array
        return out
    run_both(fill, np.arange(20, dtype=np.int32).reshape(4, 5), np.array([[1.5, -2.5, 3.5]]))
    run_both(fill, np.arange(20.0).reshape(4, 5), np.float32(2.5))
    with pytest.raises(ValueError, match="could not broadcast"):
        fill(np.zeros((4, 5)), np.ones(2))
    with pytest.raises(ValueError, match="could not broadcast"):
        compiled(fill)(np.zeros((4, 5)), np.ones(2))


def test_a_numpy_scalar_is_rebound_not_changed():
    def acc(x):
        s = x.sum()
        t = s
        s += 1  # s is a numpy scalar: a new value, t keeps the old one
        return s, t
    run_both(acc, np.arange(4.0))


# ** arrays the function creates and fills **

def test_an_output_filled_row_by_row_compiles():
    def rows(x):
        out = np.zeros((x.shape[0], 3))
        for i in range(x.shape[0]):
            out[i, 0] = x[i].sum()
            out[i, 1:] = x[i, :2] * 2
        out[-1] += 1
        return out
    run_both(rows, np.random.default_rng(0).standard_normal((5, 4)))


def test_softmax_written_in_place_compiles():
    def softmax(x):
        x = x.copy()
        x -= x.max(axis=-1, keepdims=True)
        x = np.exp(x)
        x /= x.sum(axis=-1, keepdims=True)
        return x
    x = np.random.default_rng(1).standard_normal((7, 33)).astype(np.float32)
    got = compiled(softmax)(x)
    np.testing.assert_allclose(got, softmax(x), rtol=33 * np.finfo(np.float32).eps)


def test_arrays_made_alike_are_different_arrays():
    """Two np.zeros of one shape, a copy, an astype: writing one leaves the others, as in numpy."""
    def two(x):
        a, b = np.zeros(3), np.zeros(3)
        c, d = x.copy(), x.astype(x.dtype)
        a[0], c[0] = 1, -1
        return a, b, c, d, x
    run_both(two, np.arange(3.0))


def test_creation_used_as_a_python_value_still_runs():
    """np.zeros made a numpy array before: code reading its values in Python is traced again with numpy's."""
    def branch(x):
        mask = np.ones(3, bool)
        return x * 2 if mask.all() else x
    same(compiled(branch)(np.arange(3.0)), branch(np.arange(3.0)))


# ** views **

def test_views_by_index_follow_their_base_and_write_into_it():
    def views(x):
        y = x * 1
        row, col, inner = y[1], y[:, 2], y[1:, 1:]
        row[0] = -1          # writes y[1, 0]
        y[2, 2] = -2         # seen by col and inner
        inner[0, 1:] += 10   # writes y[1, 2:]
        col[::2] = 5         # writes y[0, 2] and y[2, 2]
        return y, row * 1, col * 1, inner * 1
    run_both(views, np.arange(12.0).reshape(3, 4))


def test_a_view_of_an_argument_writes_the_argument():
    def tail(a):
        t = a[..., 1:]
        t *= 2
        return a.sum()
    run_both(tail, np.arange(12.0).reshape(3, 4))


@pytest.mark.parametrize("body", ["reshape read", "transpose write"])
def test_aliases_jitop_does_not_follow_run_as_numpy(body):
    def reshape_read(x):
        y = x.copy()
        flat = y.reshape(-1)
        y[0, 0] = 100
        return flat * 1

    def transpose_write(x):
        y = x.copy()
        y.T[0] = 100
        return y

    fn = {"reshape read": reshape_read, "transpose write": transpose_write}[body]
    k = jitop.kernel(fn)
    x = np.arange(6.0).reshape(2, 3)
    with pytest.warns(jitop.JitopFallbackWarning):
        got = k(x.copy())
    same(got, fn(x.copy()))


# ** random assignments against numpy **

def _keys(shape):
    def axis_item(n):
        ints = st.integers(-n, n - 1) if n else st.nothing()
        bound = st.none() | st.integers(-n - 2, n + 2)
        slices = st.builds(slice, bound, bound, st.none() | st.sampled_from([1, 2, 3, -1, -2]))
        return ints | slices
    items = st.tuples(*[axis_item(n) for n in shape])
    return items.flatmap(lambda t: st.sampled_from([t, t[:1], (Ellipsis,) + t[1:], (None,) + t]))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_basic_assignments_match_numpy(data):
    shape = data.draw(st.lists(st.sampled_from([1, 2, 3, 5]), min_size=1, max_size=3).map(tuple))
    key = data.draw(_keys(shape))
    dtype = data.draw(st.sampled_from([np.float64, np.float32, np.int32, np.int64, np.uint8, np.bool_]))
    x = (np.arange(np.prod(shape)).reshape(shape) % 7).astype(dtype)
    region = x[key].shape
    scalar = data.draw(st.booleans())
    value = np.asarray(3) if scalar else (np.arange(np.prod(region)).reshape(region) % 5 + 1)

    def assign(a, v):
        a[key] = v
        b = a * 1
        b[key] += v  # read, add, write back through the same index
        return b
    run_both(assign, x, value.astype(dtype))


def test_verification_against_numpy_changes_the_arguments_once(monkeypatch):
    """JITOP_VERIFY=1 runs the new kernel and numpy on copies: the call itself changes the caller's array once."""
    monkeypatch.setenv("JITOP_VERIFY", "1")
    x, y = np.ones(3), np.ones(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same(compiled(iadd)(x), iadd(y))
    same(x, y)


def test_assignments_on_symbolic_sizes_compile_once():
    """dynamic=True: a slice of a symbolic axis, a value tied to it, a traced position: one kernel for every
    size."""
    def shift(x, v):
        y = x * 1
        y[1:] = v[:-1] * 2
        y[-1] += 1
        y[:, 0] = 0
        return y

    def write_row(cache, row, t):
        cache[t] = row
        return cache * 2
    rng = np.random.default_rng(2)
    k1, k2 = compiled(shift, dynamic=True), compiled(write_row, dynamic=True)
    for n in (5, 7, 12):
        run_both(shift, rng.standard_normal((n, 3)), rng.standard_normal((n, 3)), dynamic=True)
        same(k1(*(2 * [np.arange(n * 3.0).reshape(n, 3)])), shift(*(2 * [np.arange(n * 3.0).reshape(n, 3)])))
        mine, theirs, row = rng.standard_normal((n, 3)), None, rng.standard_normal(3)
        theirs = mine.copy()
        same(k2(mine, row, n - 2), write_row(theirs, row, n - 2))
        same(mine, theirs)
    assert k1.traces <= 2 and k2.traces == 1 and not k1.policy.refused() and not k2.policy.refused()


def given(cache, k, t):
    cache[t] = k
    return cache @ k


def computed(cache, k, t):
    cache[t] = k * 2 + 1
    return cache @ k


def read_first(cache, k, t):
    before = cache @ k
    cache[t] = k
    return before + cache @ k


def two_writes(cache, k, t):
    cache[t] = k
    cache[0] += 1
    return cache @ k


@pytest.mark.parametrize("fn, how", [(given, "before"), (computed, "region"), (read_first, "region"),
                                     (two_writes, "whole")])
def test_each_way_of_writing_an_argument_back_matches_numpy(fn, how):
    """A given row at a given position is written into the caller's array before the kernel (which reads it
    there); a computed row, or one the function read the array before, after it; anything else whole."""
    k = compiled(fn)
    rng = np.random.default_rng(3)
    mine = rng.standard_normal((9, 4))
    theirs = mine.copy()
    for t in (0, 8, -2):
        row = rng.standard_normal(4)
        np.testing.assert_allclose(k(mine, row, t), fn(theirs, row, t), rtol=1e-12, atol=1e-12)
        same(mine, theirs)
    (write,) = next(iter(k.cache.values())).trace.writes
    assert (write.early is not None, write.spec is not None) == {"before": (True, True), "region": (False, True),
                                                                 "whole": (False, False)}[how]


def test_a_row_at_a_traced_position_is_a_view():
    """cache[t] with t a Python int is numpy's basic indexing: a view that follows the cache and writes it."""
    def view_at(cache, k, t):
        row = cache[t]
        cache[t] = k
        seen = row * 1
        row[0] = -1
        return seen, cache.sum(axis=1)
    rng = np.random.default_rng(4)
    for t in (1, -1):
        run_both(view_at, rng.standard_normal((5, 3)), rng.standard_normal(3), t)


SCALE = 2.0


def scaled_write(a, row, t):
    a[t] = row * SCALE
    return a.sum()


def test_a_function_reading_a_global_writes_as_the_global_says_after_it_changes():
    """A captured global is checked before each call; rebound, the function is traced again and its writes
    follow the new value."""
    global SCALE
    k = compiled(scaled_write)
    mine, theirs = np.zeros((3, 2)), np.zeros((3, 2))
    try:
        for scale, t in ((2.0, 0), (5.0, 1), (5.0, 2)):
            SCALE = scale
            same(k(mine, np.ones(2), t), scaled_write(theirs, np.ones(2), t))
            same(mine, theirs)
    finally:
        SCALE = 2.0
    assert k.traces == 2


def test_ufunc_out_writes_the_output_as_numpy_does():
    """out= of a traced array: numpy's same_kind rule (or the casting given), inputs broadcast to the output's
    shape, the output returned."""
    def outs(x, y):
        z = x.copy()
        same_object = np.absolute(z, out=z) is z
        np.add(z, y, out=z)
        big = np.empty((2,) + x.shape)
        np.multiply(x, 2, out=big)  # the inputs broadcast to the output's shape
        ints = np.zeros(x.shape, np.int32)
        np.multiply(x, 3.7, out=ints, casting="unsafe")
        np.subtract(x, 1, out=x)
        return z, big, ints, same_object
    run_both(outs, np.linspace(-1, 1, 12).reshape(3, 4), np.arange(4.0))

    def into_ints(a):
        np.exp(a, out=a)
        return a
    with pytest.raises(TypeError):
        into_ints(np.arange(3))
    with pytest.raises(TypeError):
        compiled(into_ints)(np.arange(3))

    def too_big(a, b):
        np.add(a, b, out=a)
        return a
    with pytest.raises(ValueError, match="non-broadcastable output"):
        compiled(too_big)(np.arange(3.0), np.ones((2, 3)))


def test_copyto_follows_numpys_casting_rule():
    def copies(a, b):
        out = np.zeros((2, 3), np.float32)
        np.copyto(out, b)  # float64 into float32: same_kind
        np.copyto(a, 7)
        np.copyto(out[0], [1.5, 2.5, 3.5])
        return out, a
    run_both(copies, np.arange(3), np.linspace(0, 1, 3))

    def into_int(a, b):
        np.copyto(a, b)
        return a
    for fn in (into_int, compiled(into_int)):
        with pytest.raises(TypeError):
            fn(np.arange(3), np.ones(3))


# ** boolean-mask assignment: a[mask] = scalar, numpy's most common write, keeps the shape **

def _masked(body: str):
    namespace = {"np": np}
    exec(f"def f(a, m):\n    {body}\n    return a", namespace)  # noqa: S102 - the bodies below
    return namespace["f"]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int8", "uint8", "bool"])
@pytest.mark.parametrize("body", [
    "a[a > 0] = 0", "a[a > 1] = 2.7", "a[m] = 5", "a[m] = a.max()", "a[a < 1] = np.float32(-1.5)",
    "a[m[:, 0]] = 3",  # a mask over the leading dimension: whole rows
    "a[m[:, 0]] = np.arange(a.shape[1])",  # one row broadcast over the selected rows
    "a[m[:, 0]] = np.ones((1, a.shape[1]))", "r = a[1]\n    r[r > 0] = 9",  # through a view: its base changes
    "a[m] = -a.min()",
])
def test_boolean_mask_assignment_matches_numpy(body: str, dtype: str) -> None:
    a = (np.arange(-6, 9).reshape(3, 5) % 4).astype(dtype)
    m = (np.arange(15).reshape(3, 5) % 3 == 0)
    m[1, :] = False
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            _masked(body)(a.copy(), m)
        except (TypeError, ValueError, OverflowError) as err:  # numpy refuses it (a value that does not fit)
            with pytest.raises(type(err)):
                compiled(_masked(body))(a.copy(), m)
            return
        run_both(_masked(body), a, m)


@pytest.mark.parametrize("body,error", [
    ("a[np.ones(2, bool)] = 1", IndexError),  # the mask's shape is not the array's
    ("a[m] = np.ones((1, 1))", TypeError),  # a full mask takes a 0-d or 1-d value
    ("a[m] = np.nan", None),  # numpy's conversion error for the int array
])
def test_boolean_mask_assignment_raises_numpys_errors(body: str, error) -> None:
    a, m = np.arange(15).reshape(3, 5), np.arange(15).reshape(3, 5) > 7
    with pytest.raises(Exception) as numpy_error:
        _masked(body)(a.copy(), m)
    assert error is None or numpy_error.type is error
    with pytest.raises(numpy_error.type):
        compiled(_masked(body))(a.copy(), m)


def test_one_value_per_true_element_runs_as_numpy_with_a_warning() -> None:
    """a[mask] = values with one value per True element: how many, only the data says (not compiled)."""
    f = jitop.kernel(_masked("a[m] = np.arange(3.0)"))
    a, m = np.zeros(6), np.arange(6) % 2 == 0
    with pytest.warns(jitop.JitopFallbackWarning, match="boolean mask"):
        got = f(a.copy(), m)
    want = a.copy()
    want[m] = np.arange(3.0)
    np.testing.assert_array_equal(got, want)
