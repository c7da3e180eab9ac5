"""Unsupported constructs in a @jitop.kernel function run as plain numpy: exactly one
JitopFallbackWarning per construct naming it and the user's source line, and numpy's answer
(including numpy's side effects on the caller's arrays). fallback=False raises FallbackError;
genuine numpy errors raise numpy's exception."""
from __future__ import annotations

import inspect
import re
import warnings

import numpy as np
import pytest

import jitop


def _line_of(fn, needle: str) -> int:
    """The file line number of the first source line of `fn` containing `needle`."""
    lines, start = inspect.getsourcelines(fn)
    for k, text in enumerate(lines):
        if needle in text:
            return start + k
    raise AssertionError(f"{needle!r} not in the source of {fn.__name__}")


def _calls(k, *args):
    """Call k twice; return the results and the fallback warnings of both calls."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        first = k(*args)
        second = k(*args)
    return first, second, [x for x in w if issubclass(x.category, jitop.JitopFallbackWarning)]


def assert_same(got, expected) -> None:
    assert type(got) is type(expected), (type(got), type(expected))
    if isinstance(expected, (tuple, list)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_same(g, e)
        return
    np.testing.assert_array_equal(got, expected, strict=True)


# ** each construct: one warning naming it and the line, numpy's answer **

def mask_index(a):
    return a[a > 0] * 2


def nonzero(a):
    return np.nonzero(a > 0)


def python_if(a):
    if a.sum() > 0:
        return a * 2
    return -a


def python_while(a):
    while a.max() > 1:
        a = a / 2
    return a


def unique(a):
    return np.unique(a)


def sort(a):
    return np.sort(a) + 1


def complex_scalar(a):
    return a * 1j


def float16_scalar(a):
    return np.float16(2) * a


def as_numpy(a):
    return np.asarray(a) + 1


def to_float(a):
    return float(a.sum()) + a


def item(a):
    return a.max().item() * a


def out_where(a):
    return np.add(a, 1, out=np.zeros_like(a), where=a > 1)


def var_given_mean(a):
    return np.var(a, mean=np.mean(a, keepdims=True))


def and_or(a):
    return a * ((a.sum() > 0) and (a.max() < 5))


FALLBACKS = {  # function -> (argument, words the warning must contain, source line marker)
    "boolean-mask indexing": (mask_index, np.arange(-2.0, 4.0), "mask", "a[a > 0]"),
    "np.nonzero": (nonzero, np.arange(-2.0, 4.0), "nonzero", "np.nonzero"),
    "Python if": (python_if, np.arange(3.0), "control flow", "if a.sum()"),
    "Python while": (python_while, np.arange(9.0), "control flow", "while a.max()"),
    "Python and/or": (and_or, np.arange(3.0), "control flow", "(a.sum() > 0) and"),
    "np.unique": (unique, np.array([3.0, 1.0, 3.0]), "unique", "np.unique"),
    "np.sort": (sort, np.array([3.0, 1.0, 2.0]), "sort", "np.sort"),
    "complex scalar": (complex_scalar, np.arange(3.0), "complex", "a * 1j"),
    "float16 scalar": (float16_scalar, np.arange(3.0), "scalar of dtype float16", "np.float16(2)"),
    "np.asarray(tracer)": (as_numpy, np.arange(3.0), "concrete", "np.asarray"),
    "float(tracer)": (to_float, np.arange(3.0), "float()", "float(a.sum())"),
    ".item()": (item, np.arange(3.0), "item", ".item()"),
    "out= with where=": (out_where, np.arange(3.0), "where", "where=a > 1"),
    "var(mean=)": (var_given_mean, np.arange(-2.0, 3.0), "mean=", "mean=np.mean"),
}


@pytest.mark.parametrize("construct", list(FALLBACKS))
def test_construct_falls_back_with_one_warning_naming_it_and_the_line(construct: str) -> None:
    fn, x, words, marker = FALLBACKS[construct]
    k = jitop.kernel(fn)
    first, second, ws = _calls(k, x.copy())
    expected = fn(x.copy())
    assert_same(first, expected)
    assert_same(second, expected)
    assert len(ws) == 1, [str(w.message) for w in ws]
    msg = str(ws[0].message)
    assert words.lower() in msg.lower(), msg
    assert f"{__file__}:{_line_of(fn, marker)}" in msg, msg
    assert fn.__name__ in msg, msg
    assert k.misses == 1 and k.hits == 1  # the fallback decision is cached per signature


@pytest.mark.parametrize("construct", list(FALLBACKS))
def test_fallback_false_raises_fallback_error_with_a_helpful_message(construct: str) -> None:
    fn, x, words, marker = FALLBACKS[construct]
    k = jitop.kernel(fn, fallback=False)
    with pytest.raises(jitop.FallbackError) as err:
        k(x.copy())
    msg = str(err.value)
    assert fn.__name__ in msg and words.lower() in msg.lower(), msg
    assert f"{__file__}:{_line_of(fn, marker)}" in msg, msg
    assert isinstance(err.value, NotImplementedError)


def test_fallback_error_hints_at_a_fix() -> None:
    k = jitop.kernel(python_if, fallback=False)
    with pytest.raises(jitop.FallbackError, match=r"np\.where|static"):
        k(np.arange(3.0))
    k = jitop.kernel(mask_index, fallback=False)
    with pytest.raises(jitop.FallbackError, match=r"np\.where"):
        k(np.arange(3.0))


# ** ndarray methods and attributes jitop does not implement **

def argsort_method(a):
    return a.argsort() * 2


def real_attr(a):
    return a.real + a.itemsize


def searchsorted_method(a):
    return a.searchsorted(2.5)


@pytest.mark.parametrize("fn", [argsort_method, real_attr, searchsorted_method], ids=lambda f: f.__name__)
def test_unimplemented_array_method_falls_back_with_numpys_answer(fn) -> None:
    k = jitop.kernel(fn)
    x = np.arange(4.0)
    first, second, ws = _calls(k, x)
    assert_same(first, fn(x))
    assert_same(second, fn(x))
    assert len(ws) == 1


@pytest.mark.parametrize("fn, marker", [(argsort_method, "a.argsort()"), (real_attr, "a.real")],
                         ids=["argsort", "real"])
def test_unimplemented_array_method_warning_names_the_line(fn, marker: str) -> None:
    k = jitop.kernel(fn)
    with pytest.warns(jitop.JitopFallbackWarning) as w:
        k(np.arange(4.0))
    msg = str(w[0].message)
    assert f"{__file__}:{_line_of(fn, marker)}" in msg and "internal error" not in msg, msg


# ** unsupported argument dtypes **

def double(a):
    return a * 2


def equal_c(a):
    return a == "c"


DTYPE_ARGS = {
    "object": (double, np.array([1, "a"], dtype=object)),
    "str": (equal_c, np.array(["ab", "c"])),
    "complex": (double, np.arange(3) + 1j),
    "float16": (double, np.arange(3, dtype=np.float16)),
    "datetime": (lambda a: a + np.timedelta64(1, "D"), np.array(["2020-01-01"], dtype="datetime64[D]")),
}


@pytest.mark.parametrize("kind", list(DTYPE_ARGS))
def test_unsupported_argument_dtype_falls_back_with_one_warning(kind: str) -> None:
    fn, x = DTYPE_ARGS[kind]
    k = jitop.kernel(fn)
    first, second, ws = _calls(k, x.copy())
    assert_same(first, fn(x.copy()))
    assert_same(second, fn(x.copy()))
    assert len(ws) == 1
    assert str(x.dtype) in str(ws[0].message) and "'a'" in str(ws[0].message)
    with pytest.raises(jitop.FallbackError, match=re.escape(str(x.dtype))):
        jitop.kernel(fn, fallback=False)(x.copy())


def test_unsupported_argument_dtype_warning_names_a_source_line() -> None:
    k = jitop.kernel(double)
    with pytest.warns(jitop.JitopFallbackWarning) as w:
        k(np.array([1, "a"], dtype=object))
    assert f"{__file__}:" in str(w[0].message), str(w[0].message)


# ** in-place assignment (compiled: tests/graph/test_assignment.py) **

def test_in_place_operator_on_a_local_temporary_gives_numpy_answer() -> None:
    # `y = a * 2; y += 1` mutates no argument; whether it compiles or falls back, the answer is numpy's
    def fn(a):
        y = a * 2
        y += 1
        return y
    k = jitop.kernel(fn)
    x = np.arange(4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jitop.JitopFallbackWarning)
        assert_same(k(x), fn(x))
    np.testing.assert_array_equal(x, np.arange(4.0))


# ** warnings: one per construct, not per call or per signature **

def test_one_warning_per_construct_across_signatures_and_a_new_one_for_a_new_construct() -> None:
    def fn(a):
        if a.ndim == 2:
            return np.sort(a)  # a second construct, only in the 2-d signature
        return a[a > 1]

    k = jitop.kernel(fn)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in (3, 4, 5, 3):
            assert_same(k(np.arange(float(n))), fn(np.arange(float(n))))
        assert_same(k(np.ones((2, 2))), fn(np.ones((2, 2))))
        assert_same(k(np.ones((3, 2))), fn(np.ones((3, 2))))
    ws = [str(x.message) for x in w if issubclass(x.category, jitop.JitopFallbackWarning)]
    assert len(ws) == 2, ws
    assert "mask" in ws[0] and "sort" in ws[1]


def test_fallback_of_one_signature_does_not_stop_another_compiling() -> None:
    def fn(a):
        return a[a > 1] if a.ndim == 1 else a * 2

    k = jitop.kernel(fn)
    with pytest.warns(jitop.JitopFallbackWarning):
        assert_same(k(np.arange(4.0)), fn(np.arange(4.0)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", jitop.JitopFallbackWarning)
        assert_same(k(np.ones((2, 3))), fn(np.ones((2, 3))))
    assert k.misses == 2


def test_warning_points_at_the_callers_line() -> None:
    k = jitop.kernel(mask_index)
    with pytest.warns(jitop.JitopFallbackWarning) as w:
        k(np.arange(3.0))
    assert w[0].filename == __file__


# ** genuine numpy errors are numpy's errors, not fallbacks **

@pytest.mark.parametrize("fallback", [True, False])
def test_shape_mismatch_raises_numpys_value_error(fallback: bool) -> None:
    def fn(a, b):
        return a + b

    k = jitop.kernel(fn, fallback=fallback)
    a, b = np.ones(3), np.ones(4)
    with pytest.raises(ValueError) as numpy_err:
        fn(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error", jitop.JitopFallbackWarning)
        with pytest.raises(type(numpy_err.value)) as err:
            k(a, b)
    assert not isinstance(err.value, jitop.FallbackError)


@pytest.mark.parametrize("body, exc", [
    ("a.reshape(5)", ValueError),
    ("a.sum(axis=2)", np.exceptions.AxisError),
    ("a[5]", IndexError),
    ("a & a", TypeError),
    ("np.concatenate([a, a.reshape(1, -1)])", ValueError),
    ("a @ a", ValueError),
])
def test_numpy_errors_propagate_with_numpys_type(body: str, exc: type) -> None:
    fn = eval(f"lambda a: {body}")
    a = np.arange(6.0).reshape(2, 3)
    with pytest.raises(exc):
        fn(a)
    with warnings.catch_warnings():
        warnings.simplefilter("error", jitop.JitopFallbackWarning)
        with pytest.raises(exc):
            jitop.kernel(fn)(a)
        with pytest.raises(exc):
            jitop.kernel(fn, fallback=False)(a)
