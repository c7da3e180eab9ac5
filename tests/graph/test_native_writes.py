"""A function that writes a given row into its argument before reading it (a decode step's `cache[t] = k`) is
served by the native entry, which copies the row into the caller's array itself (jitop.runtime.copy_in): the
same results and the same arrays after each call as numpy (arguments viewing the cache included), and numpy's
errors through the Python path, which serves every call the entry's checks turn away (a position outside the
axis, a read-only cache)."""
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
    np.testing.assert_allclose(got, want, rtol=0, atol=4 * (cache.shape[-1] + 1) * eps * (np.abs(cache) @ np.abs(q)).max())


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


def test_a_row_that_needs_a_cast_or_a_broadcast_takes_the_python_path():
    f = jitop.kernel(decode, fallback=False)
    for k in (np.arange(5.0), np.arange(5, dtype=np.float32)[None]):
        mine = np.zeros((11, 5), np.float32)
        theirs = mine.copy()
        q = np.ones(5, np.float32)
        for t in (1, 2, 3, 4):
            assert_scores(f(mine, k + t, q, t), decode(theirs, k + t, q, t), theirs, q)
        np.testing.assert_array_equal(mine, theirs)
    assert natively_served(f) == 0


@pytest.mark.parametrize("copy, why", [
    (CopyIn(0, 1, (0, ("arg", 2))), "region's shape"),          # the source is a row, the region one element
    (CopyIn(0, 0, (("arg", 2),)), "two array arguments"),
    (CopyIn(0, 1, (("arg", 3),)), "not an int argument"),
    (CopyIn(0, 1, (4,)), "inside an axis"),
    (CopyIn(0, 1, (-5,)), "inside an axis"),
    (CopyIn(0, 3, (1,)), "two array arguments"),
])
def test_a_copy_the_entry_cannot_make_as_numpy_would_is_refused(copy, why):
    inputs = [("array", 0, np.dtype("f4"), (4, 3)), ("array", 1, np.dtype("f4"), (3,)), ("int", 2), ("other",)]
    with pytest.raises(ValueError, match=why):
        section([copy], inputs)
    with pytest.raises(ValueError, match="dtype"):
        section([CopyIn(0, 1, (1,))], [inputs[0], ("array", 1, np.dtype("f8"), (3,))])
