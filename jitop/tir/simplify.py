"""Integer index arithmetic: a linear canonical form, interval bounds and a prover.

Index expressions are sums of coefficient * atom plus a constant; `(io*8 + ii) // 8` becomes
`io` when `ii` is known to lie in [0, 8). Loop variables' ranges come in as {var: (lo, hi)}.

With symbolic shapes an endpoint may be an expression of shape symbols and outer loop variables
(`i.outer` in [0, (n + 7) // 8 - 1]); a symbol's own range is [0, SYMBOL_MAX]. `bounds` stays integer
(an endpoint is resolved through the ranges of the variables it uses); `prove` then tries a symbolic step
that keeps the symbols: each loop variable is replaced by the endpoint that maximises the difference,
and floor divisions by constants are eliminated (c * (x // c) == x - x % c), so `i.outer * 8 + i.inner < n`
is proved for `i.outer < n // 8`.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

from jitop.te.expr import Expr, Op, const, free_vars, is_size_var, rebuild, walk
from jitop.dtypes import DType

Endpoint = int | Expr
Ranges = dict[Expr, tuple[Endpoint, Endpoint]]
Interval = Optional[tuple[int, int]]
# the largest value of a shape symbol this module assumes (the runtime checks it): dims of real arrays are
# far below, and symbolic bounds stay small Python ints
SYMBOL_MAX = 2 ** 48 - 1
_MAX_CANDIDATES = 8  # upper bounds tried by one symbolic proof (a min(a, b) endpoint branches)
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
            if atom.op is Op.FLOORMOD and atom.src[1].op is not Op.CONST and atom in lin.terms:
                lin, changed = _merge_symbolic_divmod(lin, atom, coef, ranges, memo)
                if changed:
                    break
                continue
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


def _merge_symbolic_divmod(lin: Lin, atom: Expr, coef: int, ranges: Ranges, memo: Memo) -> tuple[Lin, bool]:
    """c*(x % m) + c*((x // m) * m) == c*x for a symbolic divisor m (a flat index split by a symbolic width and
    flattened again: a convolution's output rows x columns). Exact for m >= 1 only (x // 0 and x % 0 are 0,
    so the split is 0 where x is not): applied where the ranges prove m >= 1."""
    x, m = atom.src
    bounds = lin_bounds(to_lin(m, ranges, memo), ranges, memo)
    if bounds is None or bounds[0] < 1:
        return lin, False
    q = Expr(Op.FLOORDIV, atom.dtype, (x, m))
    for prod in (Expr(Op.MUL, atom.dtype, (q, m)), Expr(Op.MUL, atom.dtype, (m, q))):
        if lin.terms.get(prod) == coef:
            terms = {a: v for a, v in lin.terms.items() if a is not atom and a is not prod}
            return Lin(terms, lin.const) + to_lin(x, ranges, memo).scale(coef), True
    return lin, False


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
        return _var_bounds(e, ranges, memo)
    if e.op is Op.CONST and not e.dtype.is_float:
        return int(e.value), int(e.value)
    if e.op in (Op.FLOORDIV, Op.FLOORMOD) and e.src[1].op is not Op.CONST and e.dtype.is_int \
            and _symbolic(e, ranges, memo):
        return _symbolic_divisor_bounds(e, ranges, memo)
    if e.op is Op.MUL and e.dtype.is_int and _symbolic(e, ranges, memo):
        a, b = bounds(e.src[0], ranges, memo), bounds(e.src[1], ranges, memo)
        if a is None or b is None:
            return None
        corners = [x * y for x in a for y in b]
        return min(corners), max(corners)
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


def _var_bounds(v: Expr, ranges: Ranges, memo: Memo) -> Interval:
    """A variable's integer range; a symbolic endpoint is resolved by the bounds of its expression."""
    r = ranges.get(v)
    if r is None or (type(r[0]) is int and type(r[1]) is int):
        return r
    lo = r[0] if isinstance(r[0], int) else bounds(r[0], ranges, memo)
    hi = r[1] if isinstance(r[1], int) else bounds(r[1], ranges, memo)
    if lo is None or hi is None:
        return None
    return (lo if isinstance(lo, int) else lo[0]), (hi if isinstance(hi, int) else hi[1])


def _symbolic_divisor_bounds(e: Expr, ranges: Ranges, memo: Memo) -> Interval:
    """x // d and x % d for a divisor d >= 0 known only by its range (a symbolic extent). Division by zero
    gives 0 (numpy's and the generated code's answer), so a divisor that may be 0 adds 0 to the range."""
    x, d = bounds(e.src[0], ranges, memo), bounds(e.src[1], ranges, memo)
    if x is None or d is None or d[0] < 0 or d[1] < 1:
        return None
    if e.op is Op.FLOORMOD:
        return (0, min(d[1] - 1, x[1])) if x[0] >= 0 else (0, d[1] - 1)
    # floor division is monotone in x, and in d for a fixed sign of x: the corners bound it
    corners = [a // b for a in x for b in (max(d[0], 1), d[1])] + ([0] if d[0] == 0 else [])
    return min(corners), max(corners)


def _symbolic(e: Expr, ranges: Ranges, memo: Memo) -> bool:
    """Does `e` use a shape symbol or a variable with a symbolic endpoint? Only then is the symbolic
    machinery worth its time: constant shapes keep exactly the integer reasoning."""
    key = (_symbolic, e)
    if key not in memo:
        memo[key] = any(_symbolic_var(v, ranges) for v in free_vars(e))
    return memo[key]


def _symbolic_var(v: Expr, ranges: Ranges) -> bool:
    r = ranges.get(v)
    return r is not None and (not isinstance(r[0], int) or not isinstance(r[1], int) or is_symbol(v, ranges))


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
    if cond.op is Op.AND and cond.dtype.is_bool:  # (an integer `&` is no conjunction: x & 0 is 0, not False)
        a, b = prove(cond.src[0], ranges, memo), prove(cond.src[1], ranges, memo)
        return False if False in (a, b) else (True if a and b else None)
    if cond.op not in (Op.LT, Op.LE, Op.GT, Op.GE) or not cond.src[0].dtype.is_int:
        return None
    a, b = cond.src
    if cond.op in (Op.GT, Op.GE):
        a, b = b, a  # a > b  <=>  b < a
    memo = {} if memo is None else memo
    diff = a - b  # holds iff diff < 0 (LT) or diff <= 0 (LE)
    strict = cond.op in (Op.LT, Op.GT)
    found = _decide(bounds(diff, ranges, memo), strict)
    if found is None and _symbolic(diff, ranges, memo):
        lin = to_lin(diff, ranges, memo)
        hi = _upper(lin, ranges, memo)
        if hi is not None and (hi < 0 or (not strict and hi <= 0)):
            return True
        neg_lo = _upper(lin.scale(-1), ranges, memo)
        if neg_lo is not None and (-neg_lo > 0 or (strict and -neg_lo >= 0)):
            return False
    return found


def _decide(d: Interval, strict: bool) -> bool | None:
    if d is None:
        return None
    if d[1] < 0 or (not strict and d[1] <= 0):
        return True
    if d[0] >= 0 and strict or d[0] > 0:
        return False
    return None


# ** symbolic bounds: keep the symbols while loop variables are replaced by their endpoints **

def symbolic_bounds(e: Expr, ranges: Ranges, memo: Memo | None = None) -> Interval:
    """Integer [lo, hi] of `e`, found through its symbols' relations (tighter than `bounds` when loop ranges
    are symbolic: `i.outer * 8 + i.inner - n` for i.outer < n // 8 is at most -1, for any n)."""
    memo = {} if memo is None else memo
    lin = to_lin(e, ranges, memo)
    hi, neg_lo = _upper(lin, ranges, memo), _upper(lin.scale(-1), ranges, memo)
    if hi is None or neg_lo is None:
        return None
    return -neg_lo, hi


def symbolic_upper(e: Expr, ranges: Ranges, memo: Memo | None = None) -> int | None:
    """An integer upper bound of `e` found as in symbolic_bounds (None if unknown)."""
    memo = {} if memo is None else memo
    return _upper(to_lin(e, ranges, memo), ranges, memo)


def _upper(lin: Lin, ranges: Ranges, memo: Memo) -> int | None:
    """An integer upper bound of `lin`: the best over candidate symbolic upper bounds."""
    best = None
    for cand in _upper_candidates(lin, ranges, memo):
        for form in (cand, _without_floordiv(cand, ranges, memo)):
            if form is None:
                continue
            lin_form, scale = form if isinstance(form, tuple) else (form, 1)
            b = lin_bounds(lin_form, ranges, memo)
            if b is not None:
                best = b[1] // scale if best is None else min(best, b[1] // scale)
    return best


def _upper_candidates(lin: Lin, ranges: Ranges, memo: Memo) -> list[Lin]:
    """Linear forms that are each >= `lin` everywhere in the ranges, with loop variables of symbolic ranges
    replaced by endpoints (max for a positive coefficient, min for a negative one) and min(a, b) terms of a
    positive coefficient by one of their arguments."""
    work, done = [lin], []
    while work:
        cur = work.pop()
        nxt = _expand(cur, ranges, memo)
        if nxt is None or len(done) + len(work) + len(nxt) > _MAX_CANDIDATES:
            done.append(cur)
        else:
            work.extend(nxt)
    return done


def _expand(lin: Lin, ranges: Ranges, memo: Memo) -> list[Lin] | None:
    """One step of _upper_candidates, or None when nothing is left to replace."""
    inside = set().union(*(free_vars(a) for a in lin.terms if a.op is not Op.VAR))
    present = inside | {a for a in lin.terms if a.op is Op.VAR}
    # a variable whose range another present variable's endpoint uses goes after that one (innermost first)
    used = set().union(*(_endpoint_vars(v, ranges) for v in present))
    for atom, coef in lin.terms.items():
        if atom.op is Op.VAR and atom not in inside and atom not in used and _has_expr_endpoint(atom, ranges):
            end = ranges[atom][1 if coef > 0 else 0]
            return [_replace(lin, atom, to_lin(end, ranges, memo) if isinstance(end, Expr) else Lin({}, end))]
    for atom, coef in lin.terms.items():
        if (atom.op is Op.MIN and coef > 0) or (atom.op is Op.MAX and coef < 0):
            return [_replace(lin, atom, to_lin(arg, ranges, memo)) for arg in atom.src]
    return None


def _replace(lin: Lin, atom: Expr, by: Lin) -> Lin:
    coef = lin.terms[atom]
    return Lin({a: c for a, c in lin.terms.items() if a is not atom}, lin.const) + by.scale(coef)


def is_symbol(v: Expr, ranges: Ranges) -> bool:
    """A shape symbol: a te.size_var (its range may be narrowed by the guards its callers check) or another
    variable ranging over [0, SYMBOL_MAX] (loop variables have smaller ranges)."""
    r = ranges.get(v)
    return r is not None and (is_size_var(v) or isinstance(r[1], int) and r[1] >= SYMBOL_MAX)


def max_over(lin: Lin, eliminate: set[Expr], ranges: Ranges, memo: Memo | None = None) -> Lin | None:
    """A linear form >= `lin` for every value of the variables in `eliminate` (inner loops), in terms of the
    others (symbols, outer loops): each is replaced by its maximising endpoint, innermost first. None when
    one of them sits inside a non-linear term, or comes back through an endpoint."""
    memo = {} if memo is None else memo
    for _ in range(4 * len(eliminate) + 4):
        inside = set().union(*(free_vars(a) for a in lin.terms if a.op is not Op.VAR))
        todo = [a for a in lin.terms if a in eliminate]
        if inside & eliminate:
            lin = _open_min(lin, eliminate, ranges, memo)
            if lin is None:
                return None
            continue
        if not todo:
            return lin
        used = set().union(*(_endpoint_vars(v, ranges) for v in todo))
        v = next((a for a in todo if a not in used), None)
        if v is None or v not in ranges:
            return None
        end = ranges[v][1 if lin.terms[v] > 0 else 0]
        lin = _replace(lin, v, to_lin(end, ranges, memo) if isinstance(end, Expr) else Lin({}, end))
    return None


def _open_min(lin: Lin, eliminate: set[Expr], ranges: Ranges, memo: Memo) -> Lin | None:
    """Replace a min (max) term of positive (negative) coefficient that holds an eliminated variable by one
    of its arguments, preferring one without eliminated variables (each argument bounds it)."""
    for atom, coef in lin.terms.items():
        if free_vars(atom) & eliminate and ((atom.op is Op.MIN and coef > 0) or (atom.op is Op.MAX and coef < 0)):
            args = sorted(atom.src, key=lambda a: bool(free_vars(a) & eliminate))
            return _replace(lin, atom, to_lin(args[0], ranges, memo))
    return None


def _has_expr_endpoint(v: Expr, ranges: Ranges) -> bool:
    r = ranges.get(v)
    return r is not None and (isinstance(r[0], Expr) or isinstance(r[1], Expr))


def _endpoint_vars(v: Expr, ranges: Ranges) -> set[Expr]:
    r = ranges.get(v)
    if r is None:
        return set()
    return set().union(*(free_vars(x) for x in r if isinstance(x, Expr)))


def _without_floordiv(lin: Lin, ranges: Ranges, memo: Memo) -> tuple[Lin, int] | None:
    """(L * lin with every k * (x // c) written k * (x - x % c) / c, L): the same value scaled by L > 0,
    so n // 8 * 8 - n is seen to be -(n % 8), at most 0. None when `lin` has no such term."""
    divs = {a for a in lin.terms if a.op is Op.FLOORDIV and a.src[1].op is Op.CONST and a.src[1].value > 0}
    if not divs:
        return None
    scale = 1
    for a in divs:
        scale = math.lcm(scale, int(a.src[1].value))
    out = Lin({a: c * scale for a, c in lin.terms.items() if a not in divs}, lin.const * scale)
    for a in divs:
        x, c = a.src[0], int(a.src[1].value)
        k = lin.terms[a] * scale // c
        rem = Expr(Op.FLOORMOD, a.dtype, a.src)
        out = out + to_lin(x, ranges, memo).scale(k) + Lin({rem: -k})
    return out, scale


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
        elif node.op in (Op.LT, Op.LE, Op.GT, Op.GE) or node.op is Op.AND and node.dtype.is_bool:
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
