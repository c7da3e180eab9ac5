"""A Python int argument used as a size inside the kernel (`cache[:t + 1]`, `np.zeros(n)`) is a size symbol once
its value varied (jitop.shape_policy.IntPolicy): one kernel serves every value in range, bound from the int on
each call (by the native entry too), its guards checked before the kernel runs; values 0 and 1, and ints the
code needs as Python ints (`range(t)`), are keyed by value as before."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop
from jitop import te
from jitop.graph.shapes import ShapeEnv, SymInt
from jitop.runtime import fastcall

pytestmark = pytest.mark.usefixtures("private_cache")


def decode_step(cache, k, q, t):
    cache[t] = k
    kc = cache[:t + 1]
    s = kc @ q / 8.0
    e = np.exp(s - s.max())
    return (e / e.sum()) @ kc


def _size_overloads(kf) -> list:
    return [ov for key, ov in kf.cache.items() if any(s[:1] == ("symint",) for s in key)]


def test_a_decode_step_slicing_its_cache_by_t_compiles_once_for_every_t():
    kf = jitop.kernel(decode_step, fallback=False)
    rng = np.random.default_rng(0)
    mine, theirs = np.zeros((64, 16), np.float32), np.zeros((64, 16), np.float32)
    for t in range(64):
        k, q = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
        got, want = kf(mine, k, q, t), decode_step(theirs, k, q, t)
        assert got.dtype == want.dtype and got.shape == want.shape
        # t + 1 terms of products of 16 values near 1: float32 rounding only
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * (t + 1))
        np.testing.assert_array_equal(mine, theirs)
    assert kf.int_sizes.symbolic == {"t"}
    assert kf.traces <= 4  # t = 0 (twice: a run-time value, then static), 1, then the symbolic kernel
    (ov,) = _size_overloads(kf)
    assert ov.spec is not None and ov.spec.calls > 50  # the native entry served the steps (its copy too)
    assert not ov.exe.module.checked  # every access proved in bounds (the guards bound t), none checked per call


def test_a_size_beyond_the_array_is_numpys_error_and_a_size_inside_it_still_works():
    kf = jitop.kernel(decode_step, fallback=False)
    cache, k, q = np.zeros((8, 4), np.float32), np.ones(4, np.float32), np.ones(4, np.float32)
    for t in range(5):
        kf(cache, k, q, t)
    with pytest.raises(IndexError):
        kf(cache, k, q, 8)
    np.testing.assert_allclose(kf(cache, k, q, 7), decode_step(cache.copy(), k, q, 7), rtol=1e-6)


def sizes(x, n):
    head = x[:n] * 2
    pad = np.zeros(n, x.dtype) + x[n - 2]
    return head + pad, np.arange(n) * x[:n].sum(), x[n // 2:n].mean()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(-12, 40), min_size=3, max_size=12))
def test_int_sizes_in_any_order_match_numpy(values):
    """Values in any order (0, 1, negative, beyond the array: numpy's slicing clamps) against numpy."""
    x = np.random.default_rng(1).standard_normal(29).astype(np.float32)
    kf = jitop.kernel(sizes)
    for n in values:
        try:
            want = sizes(x, n)
        except (ValueError, IndexError) as err:
            with pytest.raises(type(err)):
                kf(x, n)
            continue
        got = kf(x, n)
        for g, w in zip(got, want):
            assert np.asarray(g).dtype == np.asarray(w).dtype and np.shape(g) == np.shape(w)
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * 29, equal_nan=True)


def test_the_decision_is_kept_for_the_next_process(monkeypatch):
    """A fresh function object of the same code (a new process's) starts with t a size symbol: its first call
    traces once (without the warm record that would name the kernel: jitop.graph.warm)."""
    monkeypatch.setenv("JITOP_WARM_RECORDS", "0")
    x = np.arange(30.0)
    first = jitop.kernel(lambda x, n: x[:n] * 2)
    for n in (4, 5, 6):
        first(x, n)
    assert first.int_sizes.symbolic == {"n"}
    again = jitop.kernel(first.fn)
    np.testing.assert_array_equal(again(x, 9), x[:9] * 2)
    assert again.traces == 1 and again.int_sizes.symbolic == {"n"}


def test_an_int_the_code_needs_as_an_int_stays_static():
    f = jitop.kernel(lambda x, n: sum(x[i] for i in range(n)))
    x = np.arange(10.0)
    for n in (3, 4, 5):
        np.testing.assert_array_equal(f(x, n), x[:n].sum())
    assert not f.int_sizes.symbolic and "range" in f.int_sizes.demoted["n"]
    assert len(f.cache) == 3


def test_explain_names_the_int_a_symbol_comes_from():
    kf = jitop.kernel(lambda x, n: x[:n] * 2)
    x = np.arange(30.0)
    for n in (4, 5, 6):
        kf(x, n)
    assert "n = the Python int n (traced at 5)" in jitop.explain(kf, x, 6)


def test_a_te_size_param_binds_its_symbol_from_its_value():
    n = te.size_var("n")
    A = te.placeholder((64,), "float32", name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
    f = jitop.build(jitop.create_schedule(B.op), [A, te.size_param(n), B])
    a = np.arange(64, dtype=np.float32)
    np.testing.assert_array_equal(f(a, np.array(5)), a[:5] * 2)
    with pytest.raises(ValueError, match="argument 'n' .* value is -3"):
        f(a, np.array(-3))
    with pytest.raises(IndexError):  # n beyond A: the unproved read is checked, never made
        f(a, np.array(100))


def test_the_native_entry_binds_a_symbol_from_an_int_and_checks_a_dim_equal_to_it():
    """An int argument after the array whose dim must equal it: the entry checks that dim once every input
    matched (never against a slot not yet bound)."""
    n = te.size_var("n")
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    f = jitop.build(jitop.create_schedule(B.op), [A, te.size_param(n), B])
    spec = fastcall.Spec(2, f.address, [fastcall.Array(0, np.dtype("f4"), ("n",)),
                                        fastcall.Scalar(1, int, 0, 2 ** 40, symbol="n")],
                         [fastcall.Output(np.dtype("f4"), ("n",))], 0, symbols=["n"], guards=["n >= 1"])
    entry = fastcall.Table([spec]).entry()
    a = np.arange(6, dtype=np.float32)
    np.testing.assert_array_equal(entry(a, 6), a + 1)
    assert entry(a, 5) is fastcall.MISS and entry(a, -1) is fastcall.MISS and entry(a, 6.0) is fastcall.MISS
    assert spec.calls == 1


def test_guards_bound_a_symbol_for_lowering():
    env = ShapeEnv()
    with env.active():
        t, u = SymInt(env.symbol("t", 5), env), SymInt(env.symbol("u", 9), env)
        assert t + 1 <= 256 and 3 * u >= 20 and t * u > 3
    assert env.bounds() == {"t": (2, 255), "u": (7, 2 ** 48 - 1)}


def test_a_call_numpy_rejects_raises_numpys_error_and_keeps_the_size_symbol():
    """numpy's error for one bad call (a broadcast of mismatched sizes) is the call's; the int stays a symbol."""
    kf = jitop.kernel(lambda x, y, n: x[:n] + y)
    x, y = np.arange(20.0), np.ones(6)
    for n in (4, 5, 6):
        np.testing.assert_array_equal(kf(x, np.ones(n), n), x[:n] + 1)
    with pytest.raises(ValueError):
        kf(x, y, 9)
    assert kf.int_sizes.symbolic == {"n"} and not kf.int_sizes.demoted
    np.testing.assert_array_equal(kf(x, np.ones(7), 7), x[:7] + 1)


def branchy(x, n):
    if n > 10:  # the same graph either way: only the guard differs
        return x[:n] * 2
    return x[:n] * 2


def test_kernels_of_one_graph_under_other_guards_are_stored_apart(monkeypatch):
    """`if n > 10:` on an int argument makes it static on use, then a size symbol with the branch as a guard (it
    ran as numpy before). A kernel stored for n <= 10 is not the kernel of a trace that decided n > 10 (the disk
    cache's key holds the guards): a new function object finds its own."""
    monkeypatch.setenv("JITOP_WARM_RECORDS", "0")
    x = np.arange(40.0)
    first = jitop.kernel(branchy, fallback=False)
    for n in (4, 5, 6):
        first(x, n)
    again = jitop.kernel(branchy, fallback=False)
    np.testing.assert_array_equal(again(x, 20), x[:20] * 2)
    np.testing.assert_array_equal(again(x, 7), x[:7] * 2)
