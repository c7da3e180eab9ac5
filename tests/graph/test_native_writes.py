"""A function that writes a row into its argument (a decode step's `cache[t] = k`, k given or computed) is served
by the native entry, which copies the row into the caller's array itself (jitop.runtime.copy_in): a given row
before the kernel, which then reads the cache in place; a computed one after it. The same results and the same
arrays after each call as numpy (arguments viewing the cache included), and numpy's errors and answers through
the Python path, which serves every call the entry's checks turn away (a position outside the axis, a read-only
cache, an argument sharing memory with a row written after the kernel)."""
from __future__ import annotations

import numpy as np
import pytest

import jitop
from jitop.runtime import fastcall
from jitop.runtime.copy_in import CopyIn, section

pytestmark = pytest.mark.skipif(not fastcall.available(), reason="the native entry is not available here")


def decode(cache, k, q, t):
    cache[t] = k
    scores = cache @ q
    return scores - scores.max()


def two_caches(kc, vc, k, v, q, layer, t):
    kc[layer, t] = k
    vc[layer, t] = v
    w = np.exp(kc[layer] @ q)
    return w @ vc[layer]


def assert_scores(got, want, cache, q) -> None:
    """Equal within the rounding of two sums of k products in different orders (and the max subtracted)."""
    eps = np.finfo(want.dtype).eps
    bound = 4 * (cache.shape[-1] + 1) * eps * (np.abs(cache) @ np.abs(q)).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=bound)


def computed(cache, x, w, q, t):
    cache[t] = x @ w
    return cache @ q


def natively_served(f) -> int:
    """Calls the native entry served for f."""
    return sum(ov.spec.calls for ov in f.dispatcher.native())


def warm(f, *args) -> None:
    """Enough calls on copies for the dispatcher to hand the signature to the native entry."""
    for _ in range(3):
        f(*[a.copy() if isinstance(a, np.ndarray) else a for a in args])


def test_a_decode_step_runs_natively_and_writes_the_callers_cache():
    rng = np.random.default_rng(0)
    f = jitop.kernel(decode, fallback=False)
    mine = rng.standard_normal((11, 5))
    theirs = mine.copy()
    q = rng.standard_normal(5)
    warm(f, mine, q, q, 0)
    before = natively_served(f)
    for t in (0, 3, 10, -1, -11, 7):
        k = rng.standard_normal(5)
        assert_scores(f(mine, k, q, t), decode(theirs, k, q, t), theirs, q)
        np.testing.assert_array_equal(mine, theirs)
    assert natively_served(f) - before == 6 and f.traces == 1


def test_two_caches_and_a_layer_index_are_written_natively():
    rng = np.random.default_rng(1)
    f = jitop.kernel(two_caches, fallback=False)
    kc, vc = rng.standard_normal((2, 2, 7, 4), dtype=np.float32)
    mine, theirs = (kc, vc), (kc.copy(), vc.copy())
    k, v, q = rng.standard_normal((3, 4), dtype=np.float32)
    warm(f, *mine, k, v, q, 1, 0)
    before = natively_served(f)
    for t in range(7):
        k, v = rng.standard_normal((2, 4), dtype=np.float32)
        got, want = f(*mine, k, v, q, 1, t), two_caches(*theirs, k, v, q, 1, t)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        for m, t_ in zip(mine, theirs):
            np.testing.assert_array_equal(m, t_)
    assert natively_served(f) - before == 7


@pytest.mark.parametrize("t", [11, -12, 2 ** 40])
def test_a_position_outside_the_axis_raises_numpys_error_and_writes_nothing(t):
    f = jitop.kernel(decode, fallback=False)
    rng = np.random.default_rng(2)
    cache, q = rng.standard_normal((11, 5)), rng.standard_normal(5)
    warm(f, cache, q, q, 0)
    kept = cache.copy()
    with pytest.raises(IndexError):
        decode(cache.copy(), q, q, t)
    with pytest.raises(IndexError):
        f(cache, q + 1, q, t)
    np.testing.assert_array_equal(cache, kept)
    f(cache, q + 1, q, 4)  # and the entry still serves the next call
    np.testing.assert_array_equal(cache[4], q + 1)


def test_a_read_only_cache_raises_numpys_error_and_writes_nothing():
    f = jitop.kernel(decode, fallback=False)
    cache, q = np.zeros((11, 5)), np.ones(5)
    warm(f, cache, q, q, 0)
    cache.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        f(cache, q, q, 3)
    assert not cache.any()


@pytest.mark.parametrize("alias", ["k is a row of the cache", "q is a row of the cache"])
def test_arguments_sharing_the_caches_memory_get_numpys_answer(alias):
    """numpy writes the row, then reads: an argument viewing the cache sees the new row. So does the kernel,
    which reads after the entry's copy."""
    f = jitop.kernel(decode, fallback=False)
    rng = np.random.default_rng(3)
    mine = rng.standard_normal((11, 5))
    theirs = mine.copy()
    warm(f, mine, mine[0].copy(), mine[0].copy(), 0)
    before = natively_served(f)
    for t in (2, 5, 6):
        row = 6 if alias.startswith("k") else t
        pick = (lambda c: (c[row], c[1])) if alias.startswith("k") else (lambda c: (c[1] * 2, c[row]))
        assert_scores(f(mine, *pick(mine), t), decode(theirs, *pick(theirs), t), theirs, pick(theirs)[1])
        np.testing.assert_array_equal(mine, theirs)
    assert natively_served(f) - before == 3


def reread(cache, k, t):
    cache[t] = k
    return cache[t] * 2, cache.sum(axis=1) + k.sum()


def test_a_given_row_overlapping_the_row_it_is_written_to_is_read_as_numpy_reads_it():
    """k spans half of row 0 and half of row 1 of the cache, and the function writes it into row 0: numpy copies
    k first (the row gets k's old values), then k.sum() reads k's memory as the write left it."""
    f = jitop.kernel(reread, fallback=False)
    for _ in range(4):
        mine, theirs = (np.arange(6 * 64, dtype=np.float32).reshape(6, 64) for _ in range(2))
        got, want = f(mine, mine.ravel()[32:96], 0), reread(theirs, theirs.ravel()[32:96], 0)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(mine, theirs)
    assert natively_served(f) > 0


def test_a_computed_row_is_copied_in_natively_after_the_kernel():
    rng = np.random.default_rng(4)
    f = jitop.kernel(computed, fallback=False)
    mine, x, w, q = rng.standard_normal((9, 4)), rng.standard_normal(6), rng.standard_normal((6, 4)), \
        rng.standard_normal(4)
    theirs = mine.copy()
    warm(f, mine, x, w, q, 0)
    before = natively_served(f)
    for t in (0, 4, 8, -1, -9):
        x = rng.standard_normal(6)
        assert_scores(f(mine, x, w, q, t), computed(theirs, x, w, q, t), theirs, q)
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=8 * np.finfo(float).eps * (np.abs(x) @ np.abs(w)).max())
    (write,) = next(iter(f.cache.values())).trace.writes
    assert write.early is None and natively_served(f) - before == 5
    kept = mine.copy()
    for t, error in ((9, IndexError), (-10, IndexError)):
        with pytest.raises(error):
            f(mine, x, w, q, t)
        np.testing.assert_array_equal(mine, kept)
    mine.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        f(mine, x, w, q, 2)
    np.testing.assert_array_equal(mine, kept)


def computed_at_three(cache, x, w, q):
    cache[3] = x @ w
    return cache @ q


def test_a_computed_row_at_a_constant_index_is_copied_in_natively_too():
    """A region with no traced position (its index a constant) is as plain a copy as one at `t`."""
    rng = np.random.default_rng(6)
    f = jitop.kernel(computed_at_three, fallback=False)
    mine, w, q = rng.standard_normal((9, 4)), rng.standard_normal((6, 4)), rng.standard_normal(4)
    theirs = mine.copy()
    warm(f, mine, np.zeros(6), w, q)
    before = natively_served(f)
    for _ in range(3):
        x = rng.standard_normal(6)
        assert_scores(f(mine, x, w, q), computed_at_three(theirs, x, w, q), theirs, q)
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=8 * np.finfo(float).eps * (np.abs(x) @ np.abs(w)).max())
    assert natively_served(f) - before == 3


def test_an_argument_sharing_memory_with_a_row_written_after_the_kernel_gets_numpys_answer():
    """numpy's `cache @ q` sees the new row through q = cache[t]; the kernel read q before the row was copied
    in, so the entry turns the call away and it runs as numpy."""
    rng = np.random.default_rng(5)
    f = jitop.kernel(computed, fallback=False)
    mine, x, w = rng.standard_normal((9, 4)), rng.standard_normal(6), rng.standard_normal((6, 4))
    theirs = mine.copy()
    warm(f, mine, x, w, mine[0].copy(), 0)
    for t in (3, 5):
        assert_scores(f(mine, x, w, mine[t], t), computed(theirs, x, w, theirs[t], t), theirs, theirs[t])
        np.testing.assert_allclose(mine, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("k, native", [(np.arange(5.0), False), (np.arange(5, dtype=np.float32)[None], True)],
                         ids=["float64 row: cast by numpy", "1x5 row: the kernel's output"])
def test_a_row_that_needs_a_cast_or_a_reshape(k, native):
    """A given row of another dtype is cast by numpy's indexing on the Python path; one of another shape is the
    kernel's output (its region value), copied in after it by the entry."""
    f = jitop.kernel(decode, fallback=False)
    mine = np.zeros((11, 5), np.float32)
    theirs = mine.copy()
    q = np.ones(5, np.float32)
    for t in (1, 2, 3, 4, 5):
        assert_scores(f(mine, k + t, q, t), decode(theirs, k + t, q, t), theirs, q)
    np.testing.assert_array_equal(mine, theirs)
    assert (natively_served(f) > 0) == native


@pytest.mark.parametrize("copy, why", [
    (CopyIn(0, 1, (0, ("arg", 2))), "region's shape"),          # the source is a row, the region one element
    (CopyIn(0, ("out", 1), (("arg", 2),)), "region's shape"),    # an output of another shape
    (CopyIn(0, 0, (("arg", 2),)), "source another or an output"),
    (CopyIn(0, ("out", 2), (("arg", 2),)), "source another or an output"),
    (CopyIn(0, 1, (("arg", 3),)), "not an int argument"),
    (CopyIn(0, 1, (4,)), "inside an axis"),
    (CopyIn(0, 1, (-5,)), "inside an axis"),
    (CopyIn(0, 3, (1,)), "source another or an output"),
])
def test_a_copy_the_entry_cannot_make_as_numpy_would_is_refused(copy, why):
    inputs = [("array", 0, np.dtype("f4"), (4, 3)), ("array", 1, np.dtype("f4"), (3,)), ("int", 2), ("other",)]
    outputs = [(np.dtype("f4"), (3,)), (np.dtype("f4"), (4,))]
    with pytest.raises(ValueError, match=why):
        section([copy], inputs, outputs)
    with pytest.raises(ValueError, match="dtype"):
        section([CopyIn(0, 1, (1,))], [inputs[0], ("array", 1, np.dtype("f8"), (3,))], [])
