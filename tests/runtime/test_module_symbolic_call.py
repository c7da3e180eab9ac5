"""Module.__call__ through the native entry (jitop.runtime.fastcall): a symbolic module's call (inputs only, or
every array given) is served without running Python, as a specialised module's is; anything the entry does not
serve takes the Python path, which raises the same errors as before (issue 23: a symbolic kernel at size n costs
what the kernel specialised on n costs)."""
from __future__ import annotations

import functools

import numpy as np
import pytest

import jitop
from jitop import te
from jitop.runtime import fastcall
from jitop.tir.simplify import SYMBOL_MAX

pytestmark = pytest.mark.skipif(not fastcall.available(), reason="the native entry is not available here")
SIZES = [0, 1, 7, 8, 9, 64, 1000]


def _schedule(s, C):
    outer, inner = s[C].split(C.op.axis[0], factor=8)
    s[C].vectorize(inner)
    s[C].parallel(outer)


@functools.cache
def vadd(n: int | None = None):
    """TVM's first example: C = A + B over (n,), split by 8, vectorized, parallel (symbolic n, or this n)."""
    N = te.var("n") if n is None else n
    A, B = te.placeholder((N,), name="A"), te.placeholder((N,), name="B")
    C = te.compute(A.shape, lambda i: A[i] + B[i], name="C")
    s = jitop.create_schedule(C.op)
    _schedule(s, C)
    return jitop.build(s, [A, B, C])


@functools.cache
def two_outputs():
    """S = A + B[j], D = A * 2 over symbolic (n, m): two outputs, a tied dim and a dim read from a second input."""
    n, m = te.var("n"), te.var("m")
    A, B = te.placeholder((n, m), name="A"), te.placeholder((m,), name="B")
    S = te.compute((n, m), lambda i, j: A[i, j] + B[j], name="S")
    D = te.compute((n, m), lambda i, j: A[i, j] * 2, name="D")
    return jitop.build(jitop.create_schedule([S.op, D.op]), [A, B, S, D])


def _python_only(monkeypatch, f):
    """Make every call of `f` that reaches the Python path fail (the native entry must serve it)."""
    def boom(*_):
        raise AssertionError("the Python path ran")
    monkeypatch.setattr(f, "_run", boom)
    monkeypatch.setattr(f, "_output_shapes", boom)


def _ab(n, dtype="float32"):
    rng = np.random.default_rng(n)
    return rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("symbolic", [True, False])
def test_the_native_entry_serves_both_calling_conventions(monkeypatch, n, symbolic):
    f = vadd() if symbolic else vadd(n)
    a, b = _ab(n)
    _python_only(monkeypatch, f)
    c = f(a, b)
    assert type(c) is np.ndarray and c.shape == (n,) and c.dtype == np.float32
    np.testing.assert_array_equal(c, a + b)
    out = np.full(n, np.nan, np.float32)
    assert f(a, b, out) is None
    np.testing.assert_array_equal(out, a + b)
    if n:
        assert f(a, b) is not f(a, b)  # a fresh output each call, as before


@pytest.mark.parametrize("n, m", [(0, 3), (3, 0), (1, 1), (5, 7), (64, 9)])
def test_several_outputs_and_symbols(monkeypatch, n, m):
    f = two_outputs()
    a = np.arange(n * m, dtype=np.float32).reshape(n, m)
    b = np.arange(m, dtype=np.float32) * 10
    _python_only(monkeypatch, f)
    s, d = f(a, b)
    np.testing.assert_array_equal(s, a + b)
    np.testing.assert_array_equal(d, a * 2)
    s2, d2 = np.empty_like(a), np.empty_like(a)
    assert f(a, b, s2, d2) is None
    np.testing.assert_array_equal(s2, a + b)
    np.testing.assert_array_equal(d2, a * 2)


def test_results_equal_the_python_paths(monkeypatch):
    """With the entry disabled every call takes the Python path: the same results."""
    f = vadd()
    for n in SIZES:
        a, b = _ab(n)
        np.testing.assert_array_equal(f(a, b), a + b)
    monkeypatch.setattr(fastcall, "ENABLED", False)
    monkeypatch.setattr(f, "_fast", None)
    for n in SIZES:
        a, b = _ab(n)
        np.testing.assert_array_equal(f(a, b), a + b)
        out = np.empty(n, np.float32)
        f(a, b, out)
        np.testing.assert_array_equal(out, a + b)
    assert f._fast[3](*_ab(3)) is fastcall.MISS


def _raises(f, args, error, match):
    with pytest.raises(error, match=match):
        f(*args)


@pytest.mark.parametrize("symbolic", [True, False])
def test_errors_are_the_python_paths(symbolic):
    """Whatever the entry does not serve reaches the Python path and its errors, in both conventions."""
    f = vadd() if symbolic else vadd(8)
    a, b = _ab(8)
    c = np.empty(8, np.float32)
    _raises(f, (a.astype("float64"), b), TypeError, "must have dtype float32")
    _raises(f, (a, b.astype(">f4")), TypeError, "native-byte-order")
    _raises(f, (a, b, c.astype("float64")), TypeError, "argument 'C' .* must have dtype float32")
    _raises(f, (list(a), b), TypeError, "must be a numpy.ndarray")
    _raises(f, (a, b, list(c)), TypeError, "must be a numpy.ndarray")
    _raises(f, (np.zeros(16, np.float32)[::2], b), ValueError, "C-contiguous")
    _raises(f, (a, b, np.zeros(16, np.float32)[::2]), ValueError, "C-contiguous")
    misaligned = np.frombuffer(np.zeros(33, np.uint8).data, np.float32, 8, 1)
    _raises(f, (a, misaligned), ValueError, "not aligned")
    ro = np.empty(8, np.float32)
    ro.flags.writeable = False
    _raises(f, (a, b, ro), ValueError, "output but read-only")
    _raises(f, (a, b, a), ValueError, "shares memory")
    _raises(f, (a, b, b), ValueError, "shares memory")
    whole = np.zeros(16, np.float32)
    _raises(f, (whole[:8], b, whole[4:12]), ValueError, "shares memory")
    _raises(f, (a, b, c, c), TypeError, "takes 3 arrays")
    _raises(f, (a,), TypeError, "takes 3 arrays")
    _raises(f, (a.reshape(2, 4), b.reshape(2, 4)), ValueError, "must have shape")
    if symbolic:
        _raises(f, (a, np.zeros(9, np.float32)), ValueError, r"argument 'B' \(position 1\) dimension 0 is 9, but it "
                                                             r"must equal argument 'A' \(position 0\) dimension 0")
        _raises(f, (a, b, np.zeros(9, np.float32)), ValueError, r"argument 'C' \(position 2\) dimension 0 is 9")
    else:
        _raises(f, (a, np.zeros(9, np.float32)), ValueError, "compiled for that shape")
        _raises(f, (a, b, np.zeros(9, np.float32)), ValueError, "compiled for that shape")


def test_separate_views_of_one_buffer_are_served():
    """Outputs that only numpy's bounds test could confuse with an input: disjoint halves of one buffer."""
    f = vadd()
    whole = np.arange(24, dtype=np.float32)
    a, b, c = whole[:8], whole[8:16], whole[16:]
    f(a, b, c)
    np.testing.assert_array_equal(c, np.arange(8) * 2 + 8)


def test_subclasses_take_the_python_path():
    class Sub(np.ndarray):
        pass
    f = vadd()
    a, b = _ab(9)
    np.testing.assert_array_equal(f(a.view(Sub), b), a + b)
    out = np.empty(9, np.float32).view(Sub)
    f(a, b, out)
    np.testing.assert_array_equal(out, a + b)


def test_symbol_limits_stay_checked():
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n, m), name="A")
    B = te.compute((n, m), lambda i, j: A[i, j] * 2, name="B")
    f = jitop.build(jitop.create_schedule(B.op), [A, B])
    huge = np.empty((SYMBOL_MAX + 1, 0), np.float32)
    with pytest.raises(ValueError, match="too large for symbol n"):
        f(huge)
    with pytest.raises(ValueError, match="too large for symbol n"):
        f(huge, np.empty((SYMBOL_MAX + 1, 0), np.float32))
    assert f(np.empty((SYMBOL_MAX, 0), np.float32)).shape == (SYMBOL_MAX, 0)


def test_a_loaded_module_is_served(tmp_path, monkeypatch):
    path = tmp_path / "vadd.jitop"
    vadd().save(path)
    g = jitop.load_module(path)
    assert g._entry_may_compile is False
    a, b = _ab(100)
    _python_only(monkeypatch, g)  # the entry is loaded in this process already: the loaded module uses it
    np.testing.assert_array_equal(g(a, b), a + b)


@pytest.mark.parametrize("symbolic", [True, False])
def test_a_checked_access_raises_through_the_native_entry(monkeypatch, symbolic):
    """A gather whose index is checked at run time: the IndexError comes from the entry as from the Python path,
    and the flag is cleared for the next call."""
    n = te.var("n") if symbolic else 8
    A = te.placeholder((n,), "float32", name="A")
    idx = te.placeholder((4,), "int64", name="I")
    B = te.compute((4,), lambda i: A[idx[i]], name="B")
    f = jitop.build(jitop.create_schedule(B.op), [A, idx, B])
    assert f.checked
    a, good, bad = np.arange(8, dtype=np.float32), np.array([0, 7, 3, 1]), np.array([0, 8, 3, 1])
    _python_only(monkeypatch, f)
    with pytest.raises(IndexError, match="out-of-bounds"):
        f(a, bad)
    with pytest.raises(IndexError, match="out-of-bounds"):
        f(a, bad, np.empty(4, np.float32))
    np.testing.assert_array_equal(f(a, good), a[good])


@functools.cache
def diff_and_repeat():
    """D = A[1:] - A[:-1] (shape n - 1) and R = A repeated twice (shape n * 2): outputs whose dims are expressions."""
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    D = te.compute((n - 1,), lambda i: A[i + 1] - A[i], name="D")
    R = te.compute((n * 2,), lambda i: A[i // 2], name="R")
    return jitop.build(jitop.create_schedule([D.op, R.op]), [A, D, R])


@pytest.mark.parametrize("n", [1, 2, 9, 100])
def test_outputs_of_expression_dims(monkeypatch, n):
    f = diff_and_repeat()
    a = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    want = (np.diff(a), np.repeat(a, 2))
    _python_only(monkeypatch, f)
    for got, w in zip(f(a), want):
        np.testing.assert_array_equal(got, w)
    d, r = np.empty(n - 1, np.float32), np.empty(2 * n, np.float32)
    f(a, d, r)
    np.testing.assert_array_equal(d, want[0])
    np.testing.assert_array_equal(r, want[1])


def test_expression_dims_of_given_outputs_and_negative_dims_are_the_python_paths_errors():
    f = diff_and_repeat()
    a = np.zeros(4, np.float32)
    _raises(f, (a, np.empty(3, np.float32), np.empty(7, np.float32)), ValueError,
            r"argument 'R' \(position 2\) dimension 0 is 7, but it must be n \* 2 = 8")
    _raises(f, (a, np.empty(4, np.float32), np.empty(8, np.float32)), ValueError,
            r"argument 'D' \(position 1\) dimension 0 is 4, but it must be n - 1 = 3")
    _raises(f, (np.zeros(0, np.float32),), ValueError, "negative")
