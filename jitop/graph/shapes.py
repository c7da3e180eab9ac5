"""Symbolic dims while tracing: a ShapeEnv per trace and the SymInt that user code sees (issue 23, S1).

A symbolic dim of a graph node is a te `Expr` over shape symbols (`te.size_var`s named after the argument and
dim, `x_0`); constant dims stay Python ints. The ShapeEnv of a trace knows each symbol's current size (its
*hint*) and its range, [MIN_SYMBOL, SYMBOL_MAX]: sizes 0 and 1 are never symbolic (broadcasting), so a symbol
is at least 2.

What the trace learns about the symbols is recorded, so that the kernel built from it is used only where it
holds:

- a comparison the simplifier proves for every size records nothing (`n > 1`, `n != 0`, `n + 1 > n`);
- any other comparison is decided by the hints, and the relation (or its negation) becomes a `Guard`;
- an equality that holds is solved where it can be (`Tie`): a later symbol is replaced by an expression of
  earlier ones (`v_0 := k_0`, `b_0 := a_0 + 1`), or a symbol by a constant;
- converting a dim to a Python int (`int()`, `range()`, `np.zeros((n, 4))`, `len(x)`, `for row in x`, hashing,
  `str`) *specialises* it: it equals its hint from then on (a `Specialisation`, with the user's source line).

A heuristic that only picks a faster form decides at the representative size instead (`decide_rep`) and
records nothing. The pipeline after tracing adds no guards.

>>> env = ShapeEnv()
>>> n = env.sym("n", 7)
>>> with env.active():
...     (n + 1, n > 1, n > 5, (n * 4) // 4)
(n + 1, True, True, n)
>>> [str(g) for g in env.guards]
['n >= 6']
"""
from __future__ import annotations

import contextlib
import math
import contextvars
import linecache
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from jitop.te.expr import COMPARISONS, Expr, Op, binary, const, free_vars, size_var, substitute
from jitop.tir.simplify import SYMBOL_MAX, Lin, from_lin, prove, simplify, to_lin

MIN_SYMBOL = 2  # sizes 0 and 1 stay constants (they broadcast): a symbol is at least 2
# the representative size of a symbol for heuristics (never for semantics); tuner/registry.py is its home
# once part 2's templates land (T1), and this module then imports it from there
DEFAULT_REP = 256

Dim = int | Expr
_JITOP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NUMPY_DIR = os.path.dirname(os.path.abspath(np.__file__))
_CURRENT: contextvars.ContextVar["ShapeEnv | None"] = contextvars.ContextVar("jitop_shape_env", default=None)
_FLIP = {Op.LT: Op.GE, Op.LE: Op.GT, Op.GT: Op.LE, Op.GE: Op.LT, Op.EQ: Op.NE, Op.NE: Op.EQ}


# ** records **

@dataclass(frozen=True)
class Guard:
    """A relation over the symbols the kernel relies on, in the normal form `expr op 0`, op '==', '>=' or '!='."""

    expr: Expr
    op: str
    line: str | None = None   # where the trace decided it: "file.py:12: if n > 5:"
    why: str = ""

    @property
    def relation(self) -> Expr:
        """The guard as a comparison Expr (`n - 5 >= 0`)."""
        return binary({"==": Op.EQ, ">=": Op.GE, "!=": Op.NE}[self.op], self.expr, 0)

    def __str__(self) -> str:
        return _readable(self.expr, self.op)


@dataclass(frozen=True)
class Tie:
    """A symbol replaced by an expression it must equal (`v_0 := k_0`, `n := 5`)."""

    symbol: Expr
    value: Expr
    line: str | None = None
    why: str = ""

    def __str__(self) -> str:
        return f"{self.symbol.name} := {self.value!r}"


@dataclass(frozen=True)
class Specialisation:
    """A symbolic dim the user's code converted to a Python int: it is `value` from then on."""

    expr: str          # the printed expression that was converted
    value: int
    symbols: tuple[str, ...]
    what: str          # "int()", "len()", "an index (range(), a shape, ...)", ...
    line: str | None = None

    def __str__(self) -> str:
        where = f" at {self.line}" if self.line else ""
        return f"{self.expr} = {self.value}: {self.what}{where}"


def _readable(e: Expr, op: str) -> str:
    """`n - 5 >= 0` as 'n >= 5', `-n + 9 >= 0` as 'n <= 9'."""
    lin = to_lin(e, {})
    if lin.terms and all(c < 0 for c in lin.terms.values()):
        lin, op = lin.scale(-1), {">=": "<=", "==": "==", "!=": "!="}[op]
    if not lin.terms:
        return f"{lin.const} {op} 0"
    return f"{from_lin(Lin(lin.terms), e.dtype)!r} {op} {-lin.const}"


# ** the environment of one trace **

class ShapeEnv:
    """The symbols of one trace: hints, ranges, ties, guards and specialisations.

    `user_files`: the source files of the traced function; a record's line is the innermost frame in one of
    them (without them: the innermost frame outside jitop and numpy).
    """

    def __init__(self, user_files: set[str] | frozenset[str] = frozenset(), rep: int = DEFAULT_REP):
        self.hints: dict[Expr, int] = {}
        self.ranges: dict[Expr, tuple[int, int]] = {}
        self.symbols: list[Expr] = []            # in creation order: a tie replaces the later one
        self.subst: dict[Expr, Expr] = {}        # tie solutions, each fully resolved
        self.guards: list[Guard] = []
        self.ties: list[Tie] = []
        self.specialised: list[Specialisation] = []
        self.held: dict[Expr, Any] = {}  # a symbol that is a Python int argument's value -> its input node
        self.user_files = frozenset(_path(f) for f in user_files)
        self.rep = rep

    def __repr__(self) -> str:
        syms = ", ".join(f"{s.name}={self.hints[s]}" for s in self.symbols)
        return f"ShapeEnv({syms}; guards {[str(g) for g in self.guards]}; ties {[str(t) for t in self.ties]})"

    # ** symbols **
    def symbol(self, name: str, hint: int) -> Dim:
        """A new symbol of size `hint` now; sizes below MIN_SYMBOL stay the int itself."""
        hint = int(hint)
        if hint < MIN_SYMBOL:
            return hint
        s = size_var(name, min_value=MIN_SYMBOL)  # lowering may rely on it: every call checks it
        self.hints[s], self.ranges[s] = hint, (MIN_SYMBOL, SYMBOL_MAX)
        self.symbols.append(s)
        return s

    def sym(self, name: str, hint: int) -> "SymInt | int":
        """`symbol` as user code sees it."""
        return SymInt.of(self.symbol(name, hint), self)

    @contextlib.contextmanager
    def active(self) -> Iterator["ShapeEnv"]:
        """Make this the environment of the trace running inside the block."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    # ** values **
    def resolve(self, d: Dim) -> Dim:
        """`d` with the ties substituted and simplified; an int once it is constant."""
        if not isinstance(d, Expr):
            return int(d)
        e = simplify(substitute(d, self.subst), self.ranges)
        return e.value if e.op is Op.CONST and not e.dtype.is_bool else e

    def hint(self, d: Dim) -> int:
        """The value of `d` at this call's sizes."""
        return self._at(d, self.hints)

    def rep_value(self, d: Dim) -> int:
        """The value of `d` with every symbol at the representative size (for heuristics only)."""
        return self._at(substitute(d, self.subst) if isinstance(d, Expr) else d, {s: self.rep for s in self.symbols})

    def _at(self, d: Dim, values: dict[Expr, int]) -> Any:
        if not isinstance(d, Expr):
            return d
        e = simplify(substitute(d, {s: const(v, s.dtype) for s, v in values.items()}))
        if e.op is not Op.CONST:
            raise ValueError(f"{d!r} has no value at {values} (a division by zero?)")
        return e.value

    # ** decisions **
    def prove(self, rel: Expr) -> bool | None:
        """True/False if the comparison holds/fails at every size the symbols may take, else None."""
        rel = simplify(substitute(rel, self.subst), self.ranges)
        if rel.op is Op.CONST:
            return bool(rel.value)
        if rel.op in (Op.EQ, Op.NE):
            a, b = rel.src
            if prove(binary(Op.LT, a, b), self.ranges) or prove(binary(Op.GT, a, b), self.ranges):
                return rel.op is Op.NE
            if prove(binary(Op.LE, a, b), self.ranges) and prove(binary(Op.GE, a, b), self.ranges):
                return rel.op is Op.EQ
            return None
        return prove(rel, self.ranges)

    def decide(self, rel: Expr, why: str = "") -> bool:
        """Whether the comparison holds: proved (nothing recorded), else at the hints (recorded)."""
        if rel.op not in COMPARISONS:
            raise TypeError(f"decide takes a comparison, not {rel!r}")
        found = self.prove(rel)
        if found is not None:
            return found
        rel = simplify(substitute(rel, self.subst), self.ranges)
        value = bool(self.hint(rel))
        if (rel.op is Op.EQ) == value and rel.op in (Op.EQ, Op.NE):
            self._equal(rel.src[0], rel.src[1], why or "an equality")
        else:
            self._guard(rel if value else _negate(rel), why)
        return value

    def decide_rep(self, rel: Expr) -> bool:
        """Whether the comparison holds: proved, else at the representative size. Records nothing (heuristics)."""
        found = self.prove(rel)
        return found if found is not None else bool(self.rep_value(rel))

    def require_eq(self, a: Dim, b: Dim, why: str = "") -> bool:
        """Make a == b hold: True if proved or equal at the hints (then tied or guarded), False if they differ."""
        a, b = self.resolve(a), self.resolve(b)
        found = self.prove(binary(Op.EQ, a, b))
        if found is not None:
            return found
        if self.hint(a) != self.hint(b):
            return False
        self._equal(a, b, why or f"{a!r} == {b!r}")
        return True

    def specialise(self, d: Dim, what: str) -> int:
        """The Python int of `d` at this call; `d` equals it from now on (recorded with the user's line)."""
        d = self.resolve(d)
        if not isinstance(d, Expr):
            return d
        value = self.hint(d)
        names = tuple(sorted(v.name for v in free_vars(d)))
        self.specialised.append(Specialisation(repr(d), value, names, what, self.user_line()))
        self.require_eq(d, value, f"specialised by {what}")
        return value

    # ** recording **
    def _equal(self, a: Dim, b: Dim, why: str) -> None:
        """a == b holds at the hints: tie a symbol if the difference is solvable, else guard it."""
        diff = self.resolve(binary(Op.SUB, a, b))
        solved = self._solve(diff) if isinstance(diff, Expr) else None
        if solved is None:
            self._guard(binary(Op.EQ, diff, 0), why)
            return
        s, value = solved
        self._tie(s, value, why)
        if isinstance(value, Expr):  # the solution takes the symbol's place, and its range
            self.decide(binary(Op.GE, value, MIN_SYMBOL), f"{s.name} := {value!r} is a size")

    def _solve(self, diff: Expr) -> tuple[Expr, Dim] | None:
        """(s, value) with diff == 0 <=> s == value: the latest symbol found only in a term of its own whose
        coefficient divides the rest (`v - k`: v := k; `2 * n - 14`: n := 7)."""
        lin = to_lin(diff, self.ranges)
        order = {s: k for k, s in enumerate(self.symbols)}

        def solvable(s: Expr, c: int) -> bool:
            rest = [v for a, v in lin.terms.items() if a is not s] + [lin.const]
            return s in order and all(v % c == 0 for v in rest) and \
                not any(s in free_vars(a) for a in lin.terms if a is not s)
        candidates = [s for s, c in lin.terms.items() if solvable(s, c)]
        if not candidates:
            return None
        s = max(candidates, key=order.__getitem__)
        coef = lin.terms[s]
        rest = Lin({a: -v // coef for a, v in lin.terms.items() if a is not s}, -lin.const // coef)
        return s, self.resolve(from_lin(rest, s.dtype))

    def _tie(self, s: Expr, value: Dim, why: str) -> None:
        v = value if isinstance(value, Expr) else const(value, s.dtype)
        for k, e in self.subst.items():
            self.subst[k] = simplify(substitute(e, {s: v}), self.ranges)
        self.subst[s] = v
        self.ties.append(Tie(s, v, self.user_line(), why))

    def _guard(self, rel: Expr, why: str) -> None:
        a, b = rel.src
        if rel.op in (Op.LT, Op.LE):
            a, b = b, a
        e = binary(Op.SUB, a, b)
        if rel.op in (Op.LT, Op.GT):
            e = binary(Op.SUB, e, 1)
        op = {Op.EQ: "==", Op.NE: "!="}.get(rel.op, ">=")
        e = simplify(e, self.ranges)
        if not any(self._implies(x, e, op) for x in self.guards):
            new = Guard(e, op, self.user_line(), why)  # a guard the new one implies is dropped (x >= 3, x >= 5)
            self.guards = [x for x in self.guards if not self._implies(new, x.expr, x.op)] + [new]

    def _implies(self, g: Guard, e: Expr, op: str) -> bool:
        """Whether guard g makes `e op 0` hold (the same relation, or e >= 0 from a guard x >= 0 with e >= x)."""
        if g.op != op:
            return False
        e_now, g_now = (simplify(substitute(x, self.subst), self.ranges) for x in (e, g.expr))
        return e_now is g_now or op == ">=" and prove(binary(Op.GE, e_now, g_now), self.ranges) is True

    def current_guards(self) -> list[Guard]:
        """The guards with the ties substituted, those the ties settle left out."""
        out = []
        for g in self.guards:
            e = simplify(substitute(g.expr, self.subst), self.ranges)
            if self.prove(binary({"==": Op.EQ, ">=": Op.GE, "!=": Op.NE}[g.op], e, 0)) is None:
                out.append(Guard(e, g.op, g.line, g.why))
        return out

    def bounds(self) -> dict[str, tuple[int, int]]:
        """symbol name -> (lowest, highest) value the guards leave it (`-t + 255 >= 0`: t <= 255), for the
        symbols a guard bounds on its own: every call checks the guards before the kernel runs, so lowering may
        prove its accesses with them (a Python int argument used as a size has no array dim to bound it)."""
        out: dict[str, tuple[int, int]] = {}
        for g in self.current_guards():
            lin = to_lin(g.expr, self.ranges)
            if g.op == "!=" or len(lin.terms) != 1:
                continue
            (s, a), = lin.terms.items()
            if s.op is not Op.VAR:
                continue
            c = lin.const
            if g.op == "==" and a < 0:
                a, c = -a, -c
            lo, hi = out.get(s.name, self.ranges.get(s, (MIN_SYMBOL, SYMBOL_MAX)))
            if a > 0:  # a*s + c >= 0 (or == 0): s >= ceil(-c / a)
                lo = max(lo, -(c // a))
            if a < 0 or g.op == "==":  # s <= floor(-c / a)
                hi = min(hi, -c // a)
            out[s.name] = (lo, hi)
        return out

    def user_line(self) -> str | None:
        """'file.py:12: source' of the innermost frame in the traced function's files (or outside jitop/numpy)."""
        f = sys._getframe(1)
        while f is not None:
            path = _path(f.f_code.co_filename)
            ours = path.startswith((_JITOP_DIR + os.sep, _NUMPY_DIR + os.sep, "<"))
            if (path in self.user_files) if self.user_files else not ours:
                text = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
                return f"{os.path.basename(path)}:{f.f_lineno}: {text}"
            f = f.f_back
        return None


def _path(filename: str) -> str:
    return filename if filename.startswith("<") else os.path.abspath(filename)


def _negate(rel: Expr) -> Expr:
    return binary(_FLIP[rel.op], *rel.src)


def current() -> ShapeEnv | None:
    """The ShapeEnv of the trace running now, if any."""
    return _CURRENT.get()


def _env() -> ShapeEnv:
    env = _CURRENT.get()
    if env is None:
        raise RuntimeError("a symbolic dim outside a trace with symbolic shapes (no ShapeEnv is active)")
    return env


# ** SymInt: a symbolic size as user code sees it **

def _operand(o: Any, env: ShapeEnv) -> Dim | None:
    if isinstance(o, SymInt):
        return o.expr
    if isinstance(o, (int, np.integer)) and not isinstance(o, (bool, np.bool_)):
        return int(o)
    return None


class SymInt:
    """A size that depends on symbolic dims: an int for arithmetic, comparisons decide, conversions specialise.

    `+ - * // % abs` give a SymInt (an int once it folds to a constant); comparisons and `bool` give bools through
    `ShapeEnv.decide`; `int()`, `__index__` (range, np.zeros, slicing), `hash`, `str`, `format` and `/` with
    floats specialise the dims it uses. `repr` shows the expression (`x_0 + 1`) and records nothing.
    """

    __slots__ = ("expr", "env")
    __array_ufunc__ = None  # numpy scalars defer to the reflected operator

    def __init__(self, expr: Expr, env: ShapeEnv):
        self.expr = expr
        self.env = env

    @staticmethod
    def of(d: Dim, env: ShapeEnv) -> "SymInt | int":
        """`d` as user code sees it: an int if constant after the ties, else a SymInt."""
        d = env.resolve(d)
        return d if isinstance(d, int) else SymInt(d, env)

    def as_expr(self) -> Expr:
        """The expression (te operators and graph node shapes accept a SymInt through this)."""
        d = self.env.resolve(self.expr)
        return d if isinstance(d, Expr) else const(d, self.expr.dtype)

    @property
    def hint(self) -> int:
        """The value at this call (no record)."""
        return self.env.hint(self.expr)

    def __repr__(self) -> str:
        return repr(self.env.resolve(self.expr))

    # ** arithmetic **
    def _binary(self, op: Op, other: Any, reflected: bool = False) -> Any:
        o = _operand(other, self.env)
        if o is None:
            if isinstance(other, float) and op in (Op.ADD, Op.SUB, Op.MUL, Op.FLOORDIV, Op.FLOORMOD):
                mine = float(self.specialise("arithmetic with a float"))
                return _PY_OPS[op](other, mine) if reflected else _PY_OPS[op](mine, other)
            return NotImplemented
        if op in (Op.FLOORDIV, Op.FLOORMOD) and not reflected and type(o) is int and o == 0:
            raise ZeroDivisionError("integer division or modulo by zero")
        a, b = (o, self.expr) if reflected else (self.expr, o)
        return SymInt.of(binary(op, a, b), self.env)

    def __add__(self, o): return self._binary(Op.ADD, o)
    def __radd__(self, o): return self._binary(Op.ADD, o, True)
    def __sub__(self, o): return self._binary(Op.SUB, o)
    def __rsub__(self, o): return self._binary(Op.SUB, o, True)
    def __mul__(self, o): return self._binary(Op.MUL, o)
    def __rmul__(self, o): return self._binary(Op.MUL, o, True)
    def __floordiv__(self, o): return self._binary(Op.FLOORDIV, o)
    def __rfloordiv__(self, o): return self._binary(Op.FLOORDIV, o, True)
    def __mod__(self, o): return self._binary(Op.FLOORMOD, o)
    def __rmod__(self, o): return self._binary(Op.FLOORMOD, o, True)
    def __neg__(self): return SymInt.of(binary(Op.SUB, 0, self.expr), self.env)
    def __pos__(self): return self
    def __abs__(self): return self if self >= 0 else -self
    def __trunc__(self): return self
    def __floor__(self): return self
    def __ceil__(self): return self
    def __round__(self, ndigits: int | None = None): return self

    def __truediv__(self, o):
        return self.specialise("true division (/)") / o if _operand(o, self.env) is not None or \
            isinstance(o, float) else NotImplemented

    def __rtruediv__(self, o):
        return o / self.specialise("true division (/)") if _operand(o, self.env) is not None or \
            isinstance(o, float) else NotImplemented

    def __pow__(self, o):
        if type(o) is not int or o < 0:
            return self.specialise("a power") ** o
        out: Any = 1
        for _ in range(o):
            out = out * self
        return out

    # ** comparisons decide **
    def _compare(self, op: Op, other: Any) -> Any:
        o = _operand(other, self.env)
        if o is None:
            return NotImplemented
        return self.env.decide(binary(op, self.expr, o), "a comparison")

    def __lt__(self, o): return self._compare(Op.LT, o)
    def __le__(self, o): return self._compare(Op.LE, o)
    def __gt__(self, o): return self._compare(Op.GT, o)
    def __ge__(self, o): return self._compare(Op.GE, o)
    def __eq__(self, o): return self._compare(Op.EQ, o)  # type: ignore[override]
    def __ne__(self, o): return self._compare(Op.NE, o)  # type: ignore[override]

    def __bool__(self) -> bool:
        return self.env.decide(binary(Op.NE, self.expr, 0), "truth value")

    # ** conversions specialise **
    def specialise(self, what: str) -> int:
        """This size as a Python int; the dims it uses are fixed at their current sizes (recorded)."""
        return self.env.specialise(self.expr, what)

    def __index__(self) -> int: return self.specialise("use as an int (range(), a shape, an index)")
    def __int__(self) -> int: return self.specialise("int()")
    def __float__(self) -> float: return float(self.specialise("float()"))
    def __hash__(self) -> int: return hash(self.specialise("hashing (a dict key or set member)"))
    def __str__(self) -> str: return str(self.specialise("str() or print()"))
    def __format__(self, spec: str) -> str: return format(self.specialise("formatting (an f-string)"), spec)


_PY_OPS = {Op.ADD: lambda a, b: a + b, Op.SUB: lambda a, b: a - b, Op.MUL: lambda a, b: a * b,
           Op.FLOORDIV: lambda a, b: a // b, Op.FLOORMOD: lambda a, b: a % b}


# ** helpers for code that works on Node.shape (int | Expr) **

def is_symbolic(d: Any) -> bool:
    """True for an Expr dim or a SymInt."""
    return isinstance(d, (Expr, SymInt))


def as_dim(d: Any) -> Dim:
    """A dim for a graph node: an int, or the Expr of a symbolic one (a SymInt is not specialised)."""
    if isinstance(d, SymInt):
        d = d.as_expr()
    if isinstance(d, Expr):
        return canonical(d)
    return int(d)


def canonical(d: Expr) -> Dim:
    """The simplified form of a dim expression (its symbols at least MIN_SYMBOL); a constant folds to int."""
    if d.op is Op.VAR:  # a bare symbol (most symbolic dims): already simplified
        return d
    if d.op is Op.CONST:
        return d.value
    found = _CANONICAL.get(id(d))
    if found is not None and found[0] is d:
        return found[1]
    e = simplify(d, {v: (MIN_SYMBOL, SYMBOL_MAX) for v in free_vars(d)})
    out = e.value if e.op is Op.CONST else e
    if len(_CANONICAL) >= _CANONICAL_MAX:
        _CANONICAL.clear()
    _CANONICAL[id(d)] = (d, out)  # d kept alive with its entry, so its id is not reused meanwhile
    return out


# canonical() per dim expression (hash-consed: one object per expression); every node of a trace asks for its
# dims', and a simplify per ask cost a decode step's trace 30 ms
_CANONICAL: dict[int, tuple[Expr, Dim]] = {}
_CANONICAL_MAX = 4096


def sym(d: Dim) -> "SymInt | int":
    """A node's dim as user code sees it: ints stay ints, an Expr is a SymInt of the active ShapeEnv."""
    return d if not isinstance(d, Expr) else SymInt.of(d, _env())


def _expr(d: Any) -> Dim:
    return d.expr if isinstance(d, SymInt) else d


def _decide(op: Op, a: Any, b: Any, why: str) -> bool:
    a, b = _expr(a), _expr(b)
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        return bool(binary(op, int(a), int(b)).value)
    return _env().decide(binary(op, a, b), why)


def same(a: Any, b: Any) -> bool:
    """a == b (semantic: unproven, the hints decide and the answer is recorded)."""
    return _decide(Op.EQ, a, b, "same size")


def same_shape(a: tuple, b: tuple) -> bool:
    """Equal ranks and every dim `same`."""
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def is_one(d: Any) -> bool:
    """d == 1 (False for a symbol without a record: symbols are at least 2)."""
    return _decide(Op.EQ, d, 1, "size 1")


def known_zero(d: Any) -> bool:
    """d == 0 (False for a symbol without a record)."""
    return _decide(Op.EQ, d, 0, "size 0")


def known_nonzero(d: Any) -> bool:
    """d != 0 (True for a symbol without a record)."""
    return _decide(Op.NE, d, 0, "size 0")


def require(rel: Expr, why: str) -> bool:
    """Whether the relation holds (proved, else at the hints and recorded with `why`)."""
    return rel.value if rel.op is Op.CONST else _env().decide(rel, why)


def require_eq(a: Any, b: Any, why: str) -> bool:
    """Make a == b hold (tie or guard); False if they differ at this call (the caller raises numpy's error)."""
    a, b = _expr(a), _expr(b)
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        return int(a) == int(b)
    return _env().require_eq(a, b, why)


def decide_rep(rel: Expr) -> bool:
    """Whether the relation holds: proved, else at the representative size; no record (heuristics only)."""
    if rel.op is Op.CONST:
        return bool(rel.value)
    env = current()
    if env is not None:
        return env.decide_rep(rel)
    found = prove(rel, {v: (MIN_SYMBOL, SYMBOL_MAX) for v in free_vars(rel)})
    return found if found is not None else bool(rep(rel))


def sym_min(a: Any, b: Any) -> Any:
    """min(a, b) without a decision: the smaller if proved, else a `min` expression (ints: Python's min)."""
    return _min_max(Op.MIN, a, b)


def sym_max(a: Any, b: Any) -> Any:
    """max(a, b) without a decision: the larger if proved, else a `max` expression (ints: Python's max)."""
    return _min_max(Op.MAX, a, b)


def _min_max(op: Op, a: Any, b: Any) -> Any:
    x, y = _expr(a), _expr(b)
    if not isinstance(x, Expr) and not isinstance(y, Expr):
        return (min if op is Op.MIN else max)(int(x), int(y))
    env = _env()
    le = env.prove(binary(Op.LE, x, y))
    if le is not None:
        return SymInt.of(x if le == (op is Op.MIN) else y, env)
    return SymInt.of(binary(op, x, y), env)


def rep(d: Any) -> int:
    """A dim at the representative size (its int if constant): inside a trace with the ties substituted, after
    it (the compile pipeline, whose graph dims are resolved) every symbol at DEFAULT_REP."""
    d = _expr(d)
    if not isinstance(d, Expr):
        return int(d)
    env = current()
    if env is not None:
        return env.rep_value(d)
    e = simplify(substitute(d, {v: const(DEFAULT_REP, v.dtype) for v in free_vars(d)}))
    if e.op is not Op.CONST:
        raise ValueError(f"{d!r} has no value at the representative size")
    return e.value if not e.dtype.is_bool else bool(e.value)


def hint(d: Any) -> int:
    """A dim at this call's sizes (its int if constant); records nothing."""
    d = _expr(d)
    return int(d) if not isinstance(d, Expr) else _env().hint(d)


# ** helpers of the numpy API (S2): dims as ints or Exprs, without a record unless said **

def prod(dims: Any) -> Dim:
    """The product of dims (ints, Exprs or SymInts): an int, or a canonical Expr."""
    out: Any = 1
    for d in dims:
        d = _expr(d)
        out = out * d if isinstance(out, Expr) or isinstance(d, Expr) else out * int(d)
    return as_dim(out)


def provably_same(a: Any, b: Any) -> bool:
    """a == b for every size of the symbols (ints: equal); records nothing."""
    a, b = _expr(a), _expr(b)
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        return int(a) == int(b)
    env = current()
    if env is None:
        return as_dim(a) is as_dim(b)
    return env.prove(binary(Op.EQ, a, b)) is True


def same_dims(a: tuple, b: tuple) -> bool:
    """Equal ranks and every dim `provably_same` (records nothing)."""
    return len(a) == len(b) and all(provably_same(x, y) for x, y in zip(a, b))


def at_most(limit: int, extent: Any) -> int:
    """min(limit, extent) for a constant extent; `limit` for a symbolic one (a tile or vector of a symbolic
    extent takes its full width, and the loop gets a tail)."""
    e = _expr(extent)
    if isinstance(e, Expr) and e.op is not Op.CONST:
        return limit
    return min(limit, int(e.value if isinstance(e, Expr) else e))


def resolved(d: Any) -> Dim:
    """A dim with the ties of the active trace substituted (an int stays itself)."""
    d = _expr(d)
    if not isinstance(d, Expr):
        return int(d)
    env = current()
    return as_dim(env.resolve(d) if env is not None else d)


def rep_le(a: Any, b: Any) -> bool:
    """a <= b: exactly for ints, else proved or at the representative size (a heuristic: no record)."""
    a, b = _expr(a), _expr(b)
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        return int(a) <= int(b)
    return decide_rep(binary(Op.LE, a, b))


def show(shape: tuple) -> str:
    """A shape for an error message: symbolic dims printed as expressions (no record)."""
    return "(" + ", ".join(repr(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def reduce_fraction(a: Any, b: Any) -> tuple[Dim, Dim]:
    """(a', b') with a / b == a' / b' and the common factor of b and a's linear form divided out
    (`x * 4`, 8 -> `x`, 2), so that `a % b == 0` reads `x % 2 == 0` and `a // b` reads `x // 2`."""
    a, b = _expr(a), _expr(b)
    if isinstance(b, Expr):  # k * s / (c * s) -> k / c; other symbolic divisors stay as they are
        la, lb = to_lin(a, {}) if isinstance(a, Expr) else None, to_lin(b, {})
        if la is not None and len(lb.terms) == 1 and not lb.const and not la.const and la.terms.keys() == lb.terms.keys():
            (s_,) = lb.terms
            return reduce_fraction(la.terms[s_], lb.terms[s_])
        return as_dim(a), as_dim(b)
    if not isinstance(a, Expr):
        g = math.gcd(int(a), b) or 1
        return int(a) // g, b // g
    lin = to_lin(a, {})
    g = math.gcd(b, lin.const, *lin.terms.values())
    if g <= 1:
        return as_dim(a), b
    return as_dim(from_lin(Lin({k: v // g for k, v in lin.terms.items()}, lin.const // g), a.dtype)), b // g
