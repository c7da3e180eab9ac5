"""Property tests of the simplifier with symbolic ranges: every answer of prove, bounds, symbolic_bounds
and simplify is checked against brute-force evaluation at every point of the ranges, for every value of
the shape symbols in 0..64 (two symbols: 0..12). A wrong `prove` is a silent out-of-bounds access."""
from __future__ import annotations

from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jitop import te
from jitop.te.printer import expr_str
from jitop.tir.simplify import SYMBOL_MAX, bounds, prove, simplify, symbolic_bounds

N, M = te.var("n"), te.var("m")
IO, II, J = te.var("io"), te.var("ii"), te.var("j")


def _scenarios(f: int) -> dict[str, tuple[dict, int]]:
    """name -> (ranges, largest symbol value tried): the loop shapes lowering and partitioning produce."""
    sym = {N: (0, SYMBOL_MAX)}
    return {
        "split": ({**sym, IO: (0, (N + (f - 1)) // f - 1), II: (0, f - 1)}, 64),
        "main": ({**sym, IO: (0, N // f - 1), II: (0, f - 1)}, 64),
        "tail": ({**sym, IO: (N // f, (N + (f - 1)) // f - 1), II: (0, f - 1)}, 64),
        "min_inner": ({**sym, IO: (0, (N + (f - 1)) // f - 1), II: (0, te.min(f, N - IO * f) - 1)}, 64),
        "upper_half": ({**sym, IO: (N // 2, N - 1), II: (0, f - 1)}, 64),
        "two_symbols": ({**sym, M: (0, SYMBOL_MAX), IO: (0, N - 1), J: (0, (M + (f - 1)) // f - 1),
                         II: (0, f - 1)}, 12),
    }


@lru_cache(maxsize=None)
def _points(name: str, f: int) -> tuple[dict, ...]:
    """Every assignment of the scenario's symbols (0..limit) and loop variables (within their ranges)."""
    ranges, limit = _scenarios(f)[name]
    syms = [v for v in (N, M) if v in ranges]
    loops = [v for v in (IO, J, II) if v in ranges]
    out = []

    def visit(env: dict, rest: list) -> None:
        if not rest:
            out.append(dict(env))
            return
        v, tail = rest[0], rest[1:]
        lo, hi = (_eval(x, env) if isinstance(x, te.Expr) else x for x in ranges[v])
        for value in range(lo, min(hi, limit) + 1):
            env[v.name] = value
            visit(env, tail)
        env.pop(v.name, None)
    visit({}, syms + loops)
    return tuple(out)


def _eval(e: te.Expr, env: dict) -> int:
    return eval(compile(expr_str(e), "<expr>", "eval"), {"min": min, "max": max}, env)  # Python's // and % floor


def _values(e: te.Expr, points) -> list:
    code = compile(expr_str(e), "<expr>", "eval")
    return [eval(code, {"min": min, "max": max}, p) for p in points]


def exprs(names: tuple[str, ...]):
    leaves = st.one_of(st.sampled_from([v for v in (N, M, IO, II, J) if v.name in names]), st.integers(-9, 9))

    def extend(inner):
        c = st.integers(1, 9)
        return st.one_of(
            st.tuples(inner, inner).map(lambda t: t[0] + t[1]),
            st.tuples(inner, inner).map(lambda t: t[0] - t[1]),
            st.tuples(inner, st.integers(-4, 4)).map(lambda t: t[0] * t[1]),
            st.tuples(inner, c).map(lambda t: t[0] // t[1]),
            st.tuples(inner, c).map(lambda t: t[0] % t[1]),
            st.tuples(inner, inner).map(lambda t: te.min(t[0], t[1])),
            st.tuples(inner, inner).map(lambda t: te.max(t[0], t[1])),
            st.tuples(inner, st.sampled_from([v for v in (N, M) if v.name in names])).map(lambda t: t[0] // (t[1] + 1)),
            st.tuples(inner, st.sampled_from([v for v in (N, M) if v.name in names])).map(lambda t: t[0] % (t[1] + 1)),
            st.tuples(inner, st.sampled_from([v for v in (IO, N) if v.name in names])).map(lambda t: t[0] * t[1]),
        )
    return st.recursive(leaves, extend, max_leaves=8).map(lambda e: te.const(e) if isinstance(e, int) else e)


CASES = [(name, f) for f in (1, 3, 4, 8) for name in _scenarios(f)]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _names(name: str, f: int) -> tuple[str, ...]:
    return tuple(v.name for v in _scenarios(f)[name][0])


@pytest.mark.parametrize("name, f", CASES)
@SETTINGS
@given(data=st.data())
def test_prove_agrees_with_brute_force(name, f, data):
    ranges = _scenarios(f)[name][0]
    a, b = data.draw(exprs(_names(name, f))), data.draw(exprs(_names(name, f)))
    cond = data.draw(st.sampled_from([a < b, a <= b, a > b, a >= b]))
    if cond.op is te.Op.CONST:
        return
    got = prove(cond, dict(ranges))
    if got is None:
        return
    truth = _values(cond, _points(name, f))
    assert all(t == got for t in truth), f"prove({cond}) = {got}, but it is {not got} at some point"


@pytest.mark.parametrize("name, f", CASES)
@SETTINGS
@given(data=st.data())
def test_bounds_and_simplify_agree_with_brute_force(name, f, data):
    ranges = _scenarios(f)[name][0]
    e = data.draw(exprs(_names(name, f)))
    points = _points(name, f)
    truth = _values(e, points)
    for how in (bounds, symbolic_bounds):
        b = how(e, dict(ranges))
        if b is not None and truth:
            assert b[0] <= min(truth) and max(truth) <= b[1], f"{how.__name__}({e}) = {b}, values {min(truth)}..{max(truth)}"
    s = simplify(e, dict(ranges))
    assert _values(s, points) == truth, f"simplify({e}) = {s} differs"


def index_vs_extent(names: tuple[str, ...]):
    """`c1*io + c2*ii + k  <  (a*n + b) // q + k2`: the shape of an access or a tail guard, so that many
    draws are near the boundary where a proof is both possible and easy to get wrong."""
    loops = [v for v in (IO, J, II) if v.name in names]
    syms = [v for v in (N, M) if v.name in names]
    coef = st.integers(-2, 9)
    index = st.tuples(st.lists(coef, min_size=len(loops), max_size=len(loops)), st.integers(-9, 9)).map(
        lambda t: sum((c * v for c, v in zip(t[0], loops)), te.const(t[1])))
    extent = st.tuples(st.sampled_from(syms), st.integers(1, 3), st.integers(-8, 8), st.integers(1, 9),
                       st.integers(-2, 2)).map(lambda t: (t[0] * t[1] + t[2]) // t[3] + t[4])
    return st.tuples(index, extent, st.booleans()).map(lambda t: t[0] < t[1] if t[2] else t[0] <= t[1])


@pytest.mark.parametrize("name, f", CASES)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_prove_of_index_against_extent(name, f, data):
    ranges = _scenarios(f)[name][0]
    cond = data.draw(index_vs_extent(_names(name, f)))
    got = prove(cond, dict(ranges)) if cond.op is not te.Op.CONST else None
    if got is not None:
        truth = _values(cond, _points(name, f))
        assert all(t == got for t in truth), f"prove({cond}) = {got}, but it is {not got} at some point"


@pytest.mark.parametrize("cond, name, expected", [
    (IO * 8 + II < N, "main", True),          # the main part of a split needs no guard
    (IO * 8 + II < N, "split", None),         # the last iteration of the outer loop may fail it
    (IO * 8 + II < N, "min_inner", True),     # an inner extent min(8, n - io*8) keeps it in range
    (IO * 8 + II >= 0, "min_inner", True),
    (N // 8 <= (N + 7) // 8, "split", True),
    (IO >= N // 8, "tail", True),
    (IO < N // 8, "tail", False),
    (IO * 8 + II < N, "upper_half", None),
])
def test_the_facts_lowering_relies_on(cond, name, expected):
    assert prove(cond, dict(_scenarios(8)[name][0])) is expected


def test_simplify_keeps_symbols_readable():
    ranges = _scenarios(8)["main"][0]
    assert repr(simplify((N - 8) // 8 + 1, ranges)) == "n // 8"
    assert repr(simplify((IO * 8 + II) // 8, ranges)) == "io"
    assert repr(simplify((N + 7) // 8, ranges)) == "(n + 7) // 8"


class _Z(int):
    """An int whose // and % by zero give 0, as numpy and the generated code do."""

    def __floordiv__(self, o): return _Z(0 if o == 0 else int(self) // int(o))
    def __rfloordiv__(self, o): return _Z(0 if self == 0 else int(o) // int(self))
    def __mod__(self, o): return _Z(0 if o == 0 else int(self) % int(o))
    def __rmod__(self, o): return _Z(0 if self == 0 else int(o) % int(self))
    def __add__(self, o): return _Z(int(self) + int(o))
    __radd__ = __add__
    def __sub__(self, o): return _Z(int(self) - int(o))
    def __rsub__(self, o): return _Z(int(o) - int(self))
    def __mul__(self, o): return _Z(int(self) * int(o))
    __rmul__ = __mul__
    def __neg__(self): return _Z(-int(self))


@pytest.mark.parametrize("name", ["split", "two_symbols"])
@SETTINGS
@given(data=st.data())
def test_bounds_with_a_divisor_that_may_be_zero(name, data):
    """x // n and x % n with n in 0..: the bounds include the 0 a division by zero gives."""
    ranges = _scenarios(8)[name][0]
    x = data.draw(exprs(_names(name, 8)))
    d = data.draw(st.sampled_from([v for v in (N, M, IO) if v in ranges]))
    e = data.draw(st.sampled_from([x // d, x % d, d // (x * x + 1)]))
    points = [{k: _Z(v) for k, v in p.items()} for p in _points(name, 8)]
    truth = _values(e, points)
    for how in (bounds, symbolic_bounds):
        b = how(e, dict(ranges))
        if b is not None and truth:
            assert b[0] <= min(truth) and max(truth) <= b[1], f"{how.__name__}({e}) = {b}, values {min(truth)}..{max(truth)}"


def test_a_negative_dividend_over_a_zero_divisor_gives_zero():
    ranges = _scenarios(8)["split"][0]
    for how in (bounds, symbolic_bounds):
        lo, hi = how((-1 - N) // IO, dict(ranges))
        assert lo < 0 <= hi  # io may be 0: (-1 - n) // 0 is 0


def test_the_divmod_merge_needs_a_divisor_proved_at_least_one():
    # x % m + x // m * m is x only for m >= 1: with m == 0 both parts are 0 (x // 0 and x % 0 are 0 here)
    from jitop import te
    from jitop.tir.simplify import simplify
    x, m = te.var("x"), te.size_var("m")
    e = x % m + x // m * m
    assert simplify(e, {x: (0, 100), m: (0, 100)}) is not x
    assert simplify(e, {x: (0, 100), m: (1, 100)}) is x
