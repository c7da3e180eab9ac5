"""Integer index arithmetic: a linear canonical form, interval bounds and a prover.

Index expressions are sums of coefficient * atom plus a constant; `(io*8 + ii) // 8` becomes
`io` when `ii` is known to lie in [0, 8). Loop variables' ranges come in as {var: (lo, hi)}.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from jitop.te.expr import Expr, Op, const, rebuild, walk
from jitop.dtypes import DType

Ranges = dict[Expr, tuple[int, int]]
Interval = Optional[tuple[int, int]]
# What one query has worked out about each node (its linear form, bounds, simplified form), valid while its
# ranges hold: (the function that computed it, or "simplify", the node) -> result
Memo = dict[tuple[Any, Expr], Any]
_LINEAR = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.NEG, Op.FLOORDIV, Op.FLOORMOD, Op.CONST})


class Lin:
    """sum(coef * atom) + const over integer atoms."""

    __slots__ = ("terms", "const")

    def __init__(self, terms: dict[Expr, int] | None = None, c: int = 0):
        self.terms = {k: v for k, v in (terms or {}).items() if v != 0}
        self.const = c

    def __add__(self, o: "Lin") -> "Lin":
        terms = dict(self.terms)
        for k, v in o.terms.items():
            terms[k] = terms.get(k, 0) + v
        return Lin(terms, self.const + o.const)

    def scale(self, k: int) -> "Lin":
        return Lin({a: v * k for a, v in self.terms.items()}, self.const * k)

    def split_multiples(self, c: int) -> tuple["Lin", "Lin"]:
        """(q, r) with self == q*c + r, q taking every term whose coefficient c divides."""
        q = {a: v // c for a, v in self.terms.items() if v % c == 0}
        r = {a: v for a, v in self.terms.items() if v % c != 0}
        return Lin(q, self.const // c), Lin(r, self.const % c)


def to_lin(e: Expr, ranges: Ranges, memo: Memo | None = None) -> Lin:
    """The linear form of an integer expression (non-linear parts become atoms).

    `memo` (shared by one top-level query, while `ranges` stay the same) visits each node of the expression
    DAG once: index math reuses subexpressions (a reshape's p // W and p % W), and walking it as a tree
    grows exponentially with the reshapes one fused expression inlines."""
    return _memoised(_to_lin, e, ranges, memo)


def _memoised(compute: Callable[[Expr, Ranges, Memo], Any], e: Expr, ranges: Ranges, memo: Memo | None) -> Any:
    """compute(e, ranges, memo), once per (compute, e) in `memo` (a fresh memo when None)."""
    memo = {} if memo is None else memo
    key = (compute, e)
    if key not in memo:
        memo[key] = compute(e, ranges, memo)
    return memo[key]


def _to_lin(e: Expr, ranges: Ranges, memo: Memo) -> Lin:
    op = e.op
    if op is Op.CONST:
        return Lin({}, int(e.value))
    if op is Op.ADD:
        return to_lin(e.src[0], ranges, memo) + to_lin(e.src[1], ranges, memo)
    if op is Op.SUB:
        return to_lin(e.src[0], ranges, memo) + to_lin(e.src[1], ranges, memo).scale(-1)
    if op is Op.NEG:
        return to_lin(e.src[0], ranges, memo).scale(-1)
    if op is Op.MUL:
        a, b = to_lin(e.src[0], ranges, memo), to_lin(e.src[1], ranges, memo)
        if not b.terms:
            return a.scale(b.const)
        if not a.terms:
            return b.scale(a.const)
    if op in (Op.FLOORDIV, Op.FLOORMOD) and e.src[1].op is Op.CONST and e.src[1].value > 0:
        return _divmod_lin(e, ranges, memo)
    return Lin({_simplify_atom(e, ranges, memo): 1})


def _divmod_lin(e: Expr, ranges: Ranges, memo: Memo) -> Lin:
    c = int(e.src[1].value)
    q, r = to_lin(e.src[0], ranges, memo).split_multiples(c)
    rb = lin_bounds(r, ranges, memo)
    if rb is not None and 0 <= rb[0] and rb[1] < c:
        return q if e.op is Op.FLOORDIV else r  # the remainder never crosses a multiple of c
    inner = from_lin(r, e.dtype)
    if e.op is Op.FLOORDIV:
        if inner.op is Op.FLOORDIV and inner.src[1].op is Op.CONST and inner.src[1].value > 0:
            # (x // a) // c == x // (a * c): one canonical atom, so x // 9 meets (x // 3) // 3
            return q + Lin({Expr(Op.FLOORDIV, e.dtype, (inner.src[0], const(c * int(inner.src[1].value), e.dtype))): 1})
        return q + Lin({Expr(Op.FLOORDIV, e.dtype, (inner, e.src[1])): 1})
    return Lin({Expr(Op.FLOORMOD, e.dtype, (inner, e.src[1])): 1})


def merge_divmod(lin: Lin, ranges: Ranges, memo: Memo | None = None) -> Lin:
    """c*(x % m) + c*m*(x // m) == c*x: index math that splits a flat index (p // W, p % W) and
    flattens it again (row * W + col) becomes p, so the access is seen as contiguous."""
    memo = {} if memo is None else memo
    changed = True
    while changed:
        changed = False
        for atom, coef in list(lin.terms.items()):
            if atom.op is not Op.FLOORMOD or atom.src[1].op is not Op.CONST or atom.src[1].value <= 0 \
                    or atom not in lin.terms:
                continue
            x, m = atom.src[0], int(atom.src[1].value)
            div = _divmod_lin(Expr(Op.FLOORDIV, atom.dtype, (x, atom.src[1])), ranges, memo)
            if len(div.terms) != 1 or div.const:
                continue
            (q, qc), = div.terms.items()
            if qc != 1 or lin.terms.get(q) != coef * m:
                continue
            terms = {a: v for a, v in lin.terms.items() if a is not atom and a is not q}
            lin = Lin(terms, lin.const) + to_lin(x, ranges, memo).scale(coef)
            changed = True
    return lin


def _simplify_atom(e: Expr, ranges: Ranges, memo: Memo) -> Expr:
    if not e.src:
        return e
    return rebuild(e, tuple(simplify(s, ranges, memo) for s in e.src))


def from_lin(lin: Lin, dtype: DType) -> Expr:
    """Rebuild an expression: positive terms first, then subtracted ones, the constant last."""
    out: Expr | None = None
    for atom, coef in sorted(lin.terms.items(), key=lambda kv: kv[1] < 0):
        term = atom if abs(coef) == 1 else atom * const(abs(coef), dtype)
        if out is None:
            out = term if coef > 0 else -term
        else:
            out = out + term if coef > 0 else out - term
    if out is None:
        return const(lin.const, dtype)
    if lin.const:
        out = out + const(lin.const, dtype) if lin.const > 0 else out - const(-lin.const, dtype)
    return out


def lin_bounds(lin: Lin, ranges: Ranges, memo: Memo | None = None) -> Interval:
    lo = hi = lin.const
    for atom, coef in lin.terms.items():
        b = atom_bounds(atom, ranges, memo)
        if b is None:
            return None
        lo += min(coef * b[0], coef * b[1])
        hi += max(coef * b[0], coef * b[1])
    return lo, hi


def atom_bounds(e: Expr, ranges: Ranges, memo: Memo | None = None) -> Interval:
    return _memoised(_atom_bounds, e, ranges, memo)


def _atom_bounds(e: Expr, ranges: Ranges, memo: Memo) -> Interval:
    if e.op is Op.VAR:
        return ranges.get(e)
    if e.op is Op.CONST and not e.dtype.is_float:
        return int(e.value), int(e.value)
    if e.op in (Op.FLOORDIV, Op.FLOORMOD) and e.src[1].op is Op.CONST and e.src[1].value > 0:
        c = int(e.src[1].value)
        inner = bounds(e.src[0], ranges, memo)
        if e.op is Op.FLOORMOD:
            return (inner[0] % c, inner[1] % c) if inner and inner[0] // c == inner[1] // c else (0, c - 1)
        return None if inner is None else (inner[0] // c, inner[1] // c)
    if e.op in (Op.MIN, Op.MAX):
        a, b = bounds(e.src[0], ranges, memo), bounds(e.src[1], ranges, memo)
        if a is None or b is None:
            return None
        f = min if e.op is Op.MIN else max
        return f(a[0], b[0]), f(a[1], b[1])
    if e.op is Op.CAST and e.dtype.is_int and e.src[0].dtype.is_bool:
        return 0, 1
    return None


def bounds(e: Expr, ranges: Ranges, memo: Memo | None = None) -> Interval:
    """Constant [lo, hi] of an integer expression given variable ranges, or None if unknown."""
    if e.dtype.is_float:
        return None
    memo = {} if memo is None else memo
    return lin_bounds(to_lin(e, ranges, memo), ranges, memo)


def prove(cond: Expr, ranges: Ranges, memo: Memo | None = None) -> bool | None:
    """True/False if a comparison of integers holds/fails for every value in `ranges`, else None."""
    if cond.op is Op.CONST:
        return bool(cond.value)
    if cond.op is Op.AND:
        a, b = prove(cond.src[0], ranges, memo), prove(cond.src[1], ranges, memo)
        return False if False in (a, b) else (True if a and b else None)
    if cond.op not in (Op.LT, Op.LE, Op.GT, Op.GE) or not cond.src[0].dtype.is_int:
        return None
    a, b = cond.src
    if cond.op in (Op.GT, Op.GE):
        a, b = b, a  # a > b  <=>  b < a
    d = bounds(a - b, ranges, memo)  # holds iff d < 0 (LT) or d <= 0 (LE)
    if d is None:
        return None
    strict = cond.op in (Op.LT, Op.GT)
    if d[1] < 0 or (not strict and d[1] <= 0):
        return True
    if d[0] >= 0 and strict or d[0] > 0:
        return False
    return None


def simplify(e: Expr, ranges: Ranges | None = None, memo: Memo | None = None) -> Expr:
    """Canonicalise integer arithmetic and decide comparisons the ranges settle."""
    ranges = ranges or {}
    memo = {} if memo is None else memo  # expressions are DAGs: visit each shared node once

    def visit(node: Expr) -> Expr:
        key = ("simplify", node)
        if key in memo:
            return memo[key]
        if node.dtype.is_int and node.op in _LINEAR:
            out = from_lin(merge_divmod(to_lin(node, ranges, memo), ranges, memo), node.dtype)
        elif node.op in (Op.LT, Op.LE, Op.GT, Op.GE, Op.AND):
            out = rebuild(node, tuple(visit(s) for s in node.src))
            p = prove(out, ranges, memo)
            out = out if p is None else const(p)
        else:
            out = rebuild(node, tuple(visit(s) for s in node.src)) if node.src else node
        memo[key] = out
        return out
    return visit(e)


def depends_on(e: Expr, v: Expr) -> bool:
    return any(n is v for n in walk(e))
