"""ShapeEnv and SymInt (issue 23, S1): symbolic dims while tracing, without LLVM.

Decisions: a comparison the simplifier proves records nothing; any other is decided at this call's sizes (the
hints) and recorded as a guard; an equality that holds ties a symbol; converting a size to a Python int
specialises it, recorded with the user's source line.
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest

from jitop import te
from jitop.dtypes import as_dtype
from jitop.graph import shapes
from jitop.graph.ir import node
from jitop.graph.shapes import DEFAULT_REP, ShapeEnv, SymInt
from jitop.graph.tracer import Tracer, trace_symbolic
from jitop.te.expr import SymbolicTruthError, as_expr


def here(offset: int = 0) -> int:
    """The caller's line number (+ offset)."""
    return inspect.currentframe().f_back.f_lineno + offset


@pytest.fixture
def env():
    e = ShapeEnv(user_files={__file__})
    with e.active():
        yield e


# ** symbols and SymInt arithmetic **

def test_symbols_and_hints(env):
    assert env.symbol("z", 0) == 0 and env.symbol("o", 1) == 1  # 0 and 1 stay constants (broadcasting)
    n = env.sym("n", 7)
    assert isinstance(n, SymInt) and n.hint == 7 and repr(n) == "n"
    assert env.ranges[n.expr] == (shapes.MIN_SYMBOL, shapes.SYMBOL_MAX)
    assert shapes.rep(n) == DEFAULT_REP and shapes.hint(n * 2 + 1) == 15
    assert not env.guards and not env.ties and not env.specialised


def test_arithmetic_and_printing(env):
    n, m = env.sym("n", 7), env.sym("m", 3)
    assert repr(n + 1) == "n + 1" and repr(2 * n) == "n * 2" and repr(n - m) == "n - m"
    assert repr((n + 7) // 8) == "(n + 7) // 8" and repr(n % 4) == "n % 4"
    assert repr(10 - n) == "-n + 10" and repr(-n) == "-n" and repr(n * m) == "n * m"
    assert repr(n * 3 // 3) == "n" and repr(np.int64(3) + n) == "n + 3"
    assert type(n - n) is int and n - n == 0 and type(n * 0) is int
    assert repr((n + 1) ** 2) == "(n + 1) * (n + 1)"
    assert shapes.hint((n + 7) // 8 * m) == 3
    with pytest.raises(ZeroDivisionError):
        n // 0
    assert not env.guards and not env.ties and not env.specialised  # arithmetic records nothing


def test_te_and_nodes_take_symints(env):
    n = env.sym("n", 7)
    a = node("arg", (n, 4), as_dtype("float32"), index=0)
    assert a.shape == (n.expr, 4) and type(a.shape[1]) is int
    b = node("neg", ((n * 4) // 4, np.int64(4)), a.dtype, (a,))
    assert b.shape[0] is n.expr and type(b.shape[1]) is int  # simplified on entry: equal dims are one object
    assert node("neg", (n, 4), a.dtype, (a,)) is b
    assert repr(a.size) == "n * 4" and repr(a) == "arg[n, 4]:float32"
    assert node("arg", (n - n + 5,), a.dtype, index=1).shape == (5,)  # a dim that folds is an int
    assert (as_expr(n) + 1) is (n + 1).expr


# ** decisions **

def test_proved_comparisons_record_nothing(env):
    n, m = env.sym("n", 7), env.sym("m", 3)
    assert n > 1 and n >= 2 and n != 0 and n != 1 and not n == 1 and n + 1 > n and n + m > m
    assert bool(n) and shapes.known_nonzero(n) and not shapes.known_zero(n) and not shapes.is_one(n)
    assert not env.guards and not env.ties and not env.specialised


def test_unproved_comparison_decided_by_hint_and_guarded(env):
    n = env.sym("n", 7)
    line = here(1)
    assert n > 5
    assert not n < 5  # n >= 5: implied by the first guard
    assert n < 10
    assert [str(g) for g in env.guards] == ["n >= 6", "n <= 9"]
    assert env.guards[0].line == f"test_shape_env.py:{line}: assert n > 5"
    assert env.guards[0].op == ">=" and repr(env.guards[0].relation) == "n - 6 >= 0"
    assert n > 5 and len(env.guards) == 2  # the same relation again: one guard
    assert not env.ties and not env.specialised


def test_builtin_min_and_max_guard(env):
    n = env.sym("n", 7)
    assert min(n, 4) == 4 and max(n, 4) is n  # 4 < n, then 4 > n: implied by the first guard
    assert [str(g) for g in env.guards] == ["n >= 5"]


def test_sym_min_max_record_nothing(env):
    n = env.sym("n", 7)
    assert repr(shapes.sym_min(n, 4)) == "min(n, 4)" and repr(shapes.sym_max(n + 1, 4)) == "max(n + 1, 4)"
    assert repr(shapes.sym_min(n, n + 1)) == "n" and repr(shapes.sym_max(n, 1)) == "n"
    assert shapes.sym_min(3, 5) == 3 and shapes.hint(shapes.sym_min(n, 4)) == 4
    assert not env.guards and not env.ties


def test_decide_rep_records_nothing(env):
    n = env.sym("n", 7)
    assert shapes.decide_rep(n.expr > 100) and not shapes.decide_rep(n.expr < 100)
    assert shapes.decide_rep(n.expr > 1)
    assert not env.guards and not env.ties


def test_equalities_and_inequalities(env):
    n, m = env.sym("n", 7), env.sym("m", 8)
    assert n != m and not n == m  # unequal at the hints: guarded
    assert [str(g) for g in env.guards] == ["n - m != 0"] and not env.ties


def test_symbolic_truth_error():
    n = te.size_var("n")
    with pytest.raises(SymbolicTruthError, match="truth value of the symbolic expression n > 1 is unknown"):
        bool(n > 1)
    assert issubclass(SymbolicTruthError, TypeError)
    assert bool(n == n) and not bool(n != n)  # identity still answers


def test_no_env_outside_a_trace():
    assert shapes.current() is None
    with pytest.raises(RuntimeError, match="no ShapeEnv"):
        shapes.sym(te.size_var("n"))
    assert shapes.same(3, 3) and shapes.is_one(1) and not shapes.known_zero(4) and shapes.sym(5) == 5
    assert shapes.require_eq(4, 4, "x") and not shapes.require_eq(4, 5, "x") and shapes.rep(6) == 6


# ** ties **

def test_tie_later_symbol_by_earlier(env):
    a, b = env.sym("a", 5), env.sym("b", 5)
    line = here(1)
    assert a == b
    assert [str(t) for t in env.ties] == ["b := a"] and env.ties[0].line.endswith(f":{line}: assert a == b")
    assert repr(b + 1) == "a + 1" and b - a == 0 and not env.guards
    assert env.resolve(b.expr) is a.expr


def test_tie_solves_linear_difference(env):
    k, v = env.sym("k", 9), env.sym("v", 10)
    assert shapes.require_eq(k + 1, v, "matmul core dims")
    assert [str(t) for t in env.ties] == ["v := k + 1"] and not env.guards  # k + 1 >= 2 is proved
    w = env.sym("w", 8)
    assert shapes.same(k, w + 1)  # w is later: w := k - 1, a size only if k >= 3
    assert [str(t) for t in env.ties][1] == "w := k - 1" and [str(g) for g in env.guards] == ["k >= 3"]
    assert repr(v + w) == "k * 2"


def test_ties_compose_and_pin(env):
    a, b, c = env.sym("a", 4), env.sym("b", 4), env.sym("c", 4)
    assert b == c and a == b
    assert repr(c) == "a" and repr(b) == "a"
    assert shapes.require_eq(a, 4, "constant")  # a symbol meeting a constant becomes that constant
    assert type(SymInt.of(c.expr, env)) is int and c - 0 == 4 and not env.guards


def test_unsolvable_equality_is_a_guard_and_different_hints_fail(env):
    n, m = env.sym("n", 3), env.sym("m", 4)
    assert not shapes.require_eq(n, m, "broadcast") and not env.guards and not env.ties
    assert n * m == 12
    assert [str(g) for g in env.guards] == ["n * m == 12"] and not env.ties
    assert [str(g) for g in env.current_guards()] == ["n * m == 12"]


def test_current_guards_substitute_ties(env):
    a, b = env.sym("a", 6), env.sym("b", 6)
    assert b > 5 and a == b
    assert [str(g) for g in env.guards] == ["b >= 6"] and [str(g) for g in env.current_guards()] == ["a >= 6"]


# ** specialisation **

def test_specialise_records_the_line(env):
    n = env.sym("n", 7)
    line = here(1)
    k = int(n + 1)
    assert k == 8 and type(k) is int
    s = env.specialised[0]
    assert (s.expr, s.value, s.symbols, s.what) == ("n + 1", 8, ("n",), "int()")
    assert s.line == f"test_shape_env.py:{line}: k = int(n + 1)"
    assert [str(t) for t in env.ties] == ["n := 7"] and not env.guards
    assert type(n * 2) is int and n * 2 == 14  # n is 7 from now on
    assert len(env.specialised) == 1  # a constant converts without a record


def test_specialise_solves_scaled_and_guards_the_rest(env):
    n, m = env.sym("n", 7), env.sym("m", 6)
    assert int(n * 2) == 14 and [str(t) for t in env.ties] == ["n := 7"]
    assert int(m // 4) == 1 and [str(g) for g in env.guards] == ["m // 4 == 1"]  # 4 <= m < 8
    assert isinstance(m + 1, SymInt) and [s.expr for s in env.specialised] == ["n * 2", "m // 4"]


@pytest.mark.parametrize("convert, what", [
    (lambda n: list(range(n)), "use as an int"),
    (lambda n: np.zeros((n, 4)).shape, "use as an int"),
    (lambda n: [0] * n, "use as an int"),
    (lambda n: {n: 1}, "hashing"),
    (lambda n: str(n), "str()"),
    (lambda n: f"{n:>3}", "formatting"),
    (lambda n: n / 2, "true division"),
    (lambda n: n * 0.5, "arithmetic with a float"),
    (lambda n: float(n), "float()"),
])
def test_conversions_specialise(env, convert, what):
    n = env.sym("n", 6)
    convert(n)
    assert len(env.specialised) == 1 and env.specialised[0].what.startswith(what)
    assert env.specialised[0].line.startswith("test_shape_env.py:")
    assert type(SymInt.of(n.expr, env)) is int


# ** the tracer **

def test_trace_shape_size_len_iter():
    def f(x, y):
        a = x.shape[0] + y.shape[1]
        checks = (x.shape[0] > 1, x.shape[1] == 4, y.ndim == 2)
        return a, x.size, checks, x.shape, y.shape

    tr = trace_symbolic(f, [np.zeros((5, 4)), np.ones((3, 6))], {0: (0,), 1: (0, 1)})
    a, size, checks, xs, ys = tr.result
    assert repr(a) == "x_0 + y_1" and repr(size) == "x_0 * 4" and checks == (True, True, True)
    assert type(xs[1]) is int and repr(xs) == "(x_0, 4)" and repr(ys) == "(y_0, y_1)"
    assert [repr(n.shape) for n in tr.inputs] == ["(x_0, 4)", "(y_0, y_1)"]
    assert [s.name for s in tr.env.symbols] == ["x_0", "y_0", "y_1"] and not tr.env.guards


def test_trace_len_and_iteration_specialise_with_the_line():
    def f(x):
        rows = iter(x)  # (indexing a symbolic dim is S2's; specialising the dim happens here)
        return len(x), rows is not None, x.shape

    line = inspect.getsourcelines(f)[1] + 1
    tr = trace_symbolic(f, [np.zeros((5, 3))], {0: (0,)})
    assert tr.result == (5, True, (5, 3)) and type(tr.result[2][0]) is int
    s = tr.env.specialised
    assert [x.what for x in s] == ["iteration over an array (for row in x)"]  # len(x) then finds a constant
    assert s[0].line.startswith(f"test_shape_env.py:{line}: rows = iter(x)")


def test_trace_ties_two_arguments():
    def f(x, y):
        assert x.shape[0] == y.shape[0]
        return y.shape[0] * 2

    tr = trace_symbolic(f, [np.zeros((5,)), np.zeros((5,))], {0: (0,), 1: (0,)})
    assert repr(tr.result) == "x_0 * 2" and [str(t) for t in tr.env.ties] == ["y_0 := x_0"]


def test_trace_constant_shapes_unchanged():
    def f(x):
        return x.shape, x.size, len(x)

    x = np.zeros((5, 3))
    tr = trace_symbolic(f, [x], {})
    assert tr.result == ((5, 3), 15, 5)
    assert all(type(d) is int for d in tr.result[0]) and not tr.env.symbols
    t = Tracer(node("arg", (np.int64(5), 3), as_dtype("float64"), index=0))
    assert t.shape is t.node.shape and type(t.shape[0]) is int and t.size == 15
    assert trace_symbolic(f, [np.zeros((1, 0))], {0: (0, 1)}).result == ((1, 0), 0, 1)  # 0 and 1 stay ints
