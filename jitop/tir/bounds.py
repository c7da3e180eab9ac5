"""Proving memory accesses in bounds.

An index is bounded by the loop ranges, tightened by the guards around it (`if e < c` bounds any
index that differs from `e` by a bounded amount); a clamp `max(min(x, hi), lo)` by its ends, whatever x is (a
gather's loaded index). The code generator asks at every access; what
cannot be proved is checked at run time and reported as IndexError, never read out of bounds.

A symbolic dimension (`n`) is proved by the simplifier's symbolic step: from the loop ranges
(`i.outer * 8 + i.inner < n` for i.outer < n // 8) or from an enclosing guard (`if i.outer * 8 + i.inner < n`).
"""
from __future__ import annotations

import math

from jitop.te.expr import Expr, Op, as_expr, binary, free_vars
from jitop.tir.nodes import Buffer
from jitop.tir.simplify import (Lin, Memo, Ranges, bounds, from_lin, is_symbol, max_over, prove, simplify,
                                symbolic_upper, to_lin)


def facts(cond: Expr, positive: bool = True) -> list[tuple[Expr, int]]:
    """Facts `e <= hi` as (e, hi) and `e >= lo` as (-e, -lo), from a condition known to be `positive`. Parts
    that are no integer comparison (and a negated conjunction) give no fact: a caller that needs every part
    understood checks each comparison on its own."""
    if cond.op is Op.AND and positive:
        return facts(cond.src[0], True) + facts(cond.src[1], True)
    if cond.op is Op.NOT:
        return facts(cond.src[0], not positive)
    if cond.op not in (Op.LT, Op.LE, Op.GT, Op.GE) or not cond.src[0].dtype.is_int:
        return []
    a, b = cond.src
    op = cond.op if positive else {Op.LT: Op.GE, Op.LE: Op.GT, Op.GT: Op.LE, Op.GE: Op.LT}[cond.op]
    if op in (Op.GT, Op.GE):
        a, b = b, a
        op = Op.LT if op is Op.GT else Op.LE
    # a < b  ->  a - b <= -1 ;  a <= b  ->  a - b <= 0
    return [(a - b, -1 if op is Op.LT else 0)]


def _clamp_ends(idx: Expr) -> tuple[Expr, tuple[Expr, ...]] | None:
    """max(min(x, hi), lo) or min(max(x, lo), hi) as (the outer end, the inner operands): it lies in [lo, max(hi,
    lo)] (in [min(lo, hi), hi]), so it is in bounds when the outer end and one inner operand are."""
    inner_op = {Op.MAX: Op.MIN, Op.MIN: Op.MAX}.get(idx.op)
    for k in (0, 1) if inner_op is not None else ():
        if idx.src[k].op is inner_op:
            return idx.src[1 - k], idx.src[k].src
    return None


def _relaxed(lin: Lin, ranges: Ranges) -> tuple[Expr, int] | None:
    """(R, L): an expression R >= L * lin without floor divisions, L the lcm of lin's divisors by constants
    (None when it has none). k (x // c) = k (x - x % c) / c, and x % c lies in [0, c - 1]: times L it is at
    most (L k / c) x for k > 0, (L k / c) x + (L |k| / c)(c - 1) for k < 0. Its loop variables then stand
    alone, so a symbolic upper bound can replace them by their ends (the fused index f = 256 o + t of
    f // 768 - n, o < 3 n + 3: 768 (f // 768) - 768 n <= 256 (3 n + 2) + 255 - 768 n = 767)."""
    divs = {a for a in lin.terms if a.op is Op.FLOORDIV and a.src[1].op is Op.CONST and a.src[1].value > 0}
    if not divs:
        return None
    scale = math.lcm(*(int(a.src[1].value) for a in divs))
    out = Lin({a: k * scale for a, k in lin.terms.items() if a not in divs}, lin.const * scale)
    for a in divs:
        c, k = int(a.src[1].value), lin.terms[a]
        per = k * scale // c
        out = out + to_lin(a.src[0], ranges).scale(per) + Lin({}, -per * (c - 1) if k < 0 else 0)
    dtype = next(iter(divs)).dtype
    return from_lin(out, dtype), scale


class BoundsCheck:
    """Loop ranges plus a stack of facts from the guards enclosing the current point."""

    def __init__(self, ranges: Ranges):
        self.ranges = ranges  # narrowed by single-variable guards (`if v < 42`) inside them, restored on pop
        self.facts: list[tuple[Expr, int]] = []
        self.narrowed: list[list[tuple[Expr, tuple[int, int]]]] = []
        # answers by (facts, buffer, indices): the narrowed ranges follow from the facts, and an unrolled
        # register tile asks the same few questions in every copy of its body
        self._proved: dict[tuple, bool] = {}
        # what the simplifier worked out (linear forms, bounds), one memo per level of guards: valid while the
        # ranges are that level's (a push narrows them, its pop restores them)
        self._memos: list[Memo] = [{}]

    @property
    def memo(self) -> Memo:
        return self._memos[-1]

    def in_bounds(self, idx: Expr, dim: int | Expr) -> bool:
        ends = _clamp_ends(idx)  # a clamp lies between its ends, whatever it clamps (a gather's loaded index)
        if ends is not None and self.in_bounds(ends[0], dim) and any(self.in_bounds(e, dim) for e in ends[1]):
            return True
        b = bounds(idx, self.ranges, self.memo)
        if b is None:  # an index of symbols (a concatenation's row past a cache of n rows: f // 768 - n)
            return self._at_most(-idx, 0) and self._at_most(idx - dim, -1)
        lo, hi = b
        symbolic = not isinstance(dim, int)
        if not symbolic and hi >= dim:
            hi = self._upper(idx, hi)
        for e, bound in self.facts:
            if lo < 0:
                # -e <= bound  ->  idx = (idx + e) - e >= min(idx + e) - bound
                d = bounds(idx + e, self.ranges, self.memo)
                if d is not None:
                    lo = max(lo, d[0] - bound)
        if symbolic:
            return lo >= 0 and self._below(idx, dim)
        # an index of symbols has only huge constant bounds (a symbol may be up to SYMBOL_MAX): prove it from them
        return lo >= 0 and hi < dim or self._at_most(-idx, 0) and self._at_most(idx - dim, -1)

    def _upper(self, idx: Expr, hi: int) -> int:
        """`hi` (idx's bound from the ranges) tightened by the facts: idx = e + (idx - e) <= bound + max(idx - e).
        A floor division by a constant c is bounded by its numerator's tightened bound // c (a fused index
        `f // 37` under `if f < 37000` is below 1000)."""
        for e, bound in self.facts:
            d = bounds(idx - e, self.ranges, self.memo)
            if d is not None:
                hi = min(hi, bound + d[1])
        hi = self._upper_relaxed(idx, hi)
        num, div = idx.src if idx.op is Op.FLOORDIV else (None, None)
        if num is not None and div.op is Op.CONST and div.value > 0:
            b = bounds(num, self.ranges, self.memo)
            if b is not None:
                hi = min(hi, self._upper(num, b[1]) // int(div.value))
        return hi

    def _upper_relaxed(self, idx: Expr, hi: int) -> int:
        """`hi` tightened through the facts with each quotient x // c of idx (positive coefficient) relaxed to
        x / c: L idx <= relaxed for L the divisors' lcm, so idx <= (bound + max(relaxed - e)) // L. A fused
        index's row `8 o + t // 2` under the guard `16 o + t < 64` is at most 31; an im2col channel
        `(y + 46) // 49 + 2` under `y + 144 < 147` at most 2."""
        lin = to_lin(idx, self.ranges, self.memo)
        divs = {a: k for a, k in lin.terms.items()
                if k > 0 and a.op is Op.FLOORDIV and a.src[1].op is Op.CONST and a.src[1].value > 0}
        if not divs or not self.facts:
            return hi
        lcm = math.lcm(*(int(a.src[1].value) for a in divs))
        relaxed = Lin({a: k * lcm for a, k in lin.terms.items() if a not in divs}, lin.const * lcm)
        for a, k in divs.items():
            relaxed = relaxed + to_lin(a.src[0], self.ranges, self.memo).scale(k * lcm // int(a.src[1].value))
        upper = from_lin(relaxed, idx.dtype)
        for e, bound in self.facts:
            d = bounds(upper - e, self.ranges, self.memo)
            if d is not None:
                hi = min(hi, (bound + d[1]) // lcm)
        return hi

    def _below(self, idx: Expr, dim: Expr) -> bool:
        """idx < dim for a symbolic dim."""
        return self._at_most(idx - dim, -1)

    def _at_most(self, z: Expr, hi: int) -> bool:
        """z <= hi for an integer expression of symbols, from the ranges or from a fact e <= bound, scaled by the
        lcm L of z's floor divisors (1 too): L z = (L z - e) + e <= max(L z - e) + bound, below L (hi + 1) proves
        it. The scale lets a guard on a fused index meet its quotient: under `if f < 768 n + 768`, f // 768 - n
        <= 0, as 768 (f // 768) - f <= 0."""
        if prove(z <= hi, self.ranges, self.memo) is True:
            return True
        bounded = self._symbolic_divisions_bounded(to_lin(z, self.ranges, self.memo))
        forms = [(from_lin(bounded, z.dtype), 1)]
        relaxed = _relaxed(bounded, self.ranges)
        if relaxed is not None:
            forms.append(relaxed)
        for form, scale in forms:
            d = symbolic_upper(form, self.ranges, self.memo)
            if d is not None and d < scale * (hi + 1):
                return True
            for e, bound in self.facts:
                d = symbolic_upper(form - e, self.ranges, self.memo)
                if d is not None and d + bound < scale * (hi + 1):
                    return True
        return False

    def _symbolic_divisions_bounded(self, lin: Lin) -> Lin:
        """A linear form >= `lin` with its quotients and remainders by a symbolic divisor d >= 1 bounded (a fused
        index g over 12 heads of n + 1 cache rows: g // (n + 1), g % (n + 1)): x % d by d - 1 (positive
        coefficient) or 0; x // d by m - 1 for an m proved to give x < m d (positive coefficient), or by 0 where
        x >= 0. A term it cannot bound stays."""
        out = Lin({}, lin.const)
        for atom, k in lin.terms.items():
            by = None
            if atom.op in (Op.FLOORDIV, Op.FLOORMOD) and atom.src[1].op is not Op.CONST \
                    and prove(atom.src[1] >= 1, self.ranges, self.memo) is True:
                x, d = atom.src
                if k < 0:
                    by = Lin({}, 0) if atom.op is Op.FLOORMOD or prove(x >= 0, self.ranges, self.memo) is True else None
                elif atom.op is Op.FLOORMOD:
                    by = to_lin(d, self.ranges, self.memo) + Lin({}, -1)
                else:
                    m = self._quotient_bound(x, d)
                    by = None if m is None else Lin({}, m - 1)
            out = out + (by.scale(k) if by is not None else Lin({atom: k}))
        return out

    def _quotient_bound(self, x: Expr, d: Expr) -> int | None:
        """An m with x < m d (d >= 1 symbolic), proved; candidates from x's upper end in symbols, by its loop
        variables' ends or by a guard's fact (f < 4 n + 4 over blocks of 256: 4 for d = n + 1). None if none."""
        loops = {v for v in free_vars(x) if v in self.ranges and not is_symbol(v, self.ranges)}
        den = to_lin(d, self.ranges, self.memo)
        ends = [to_lin(x, self.ranges, self.memo)] + [to_lin(x - e, self.ranges, self.memo) + Lin({}, bound)
                                                      for e, bound in self.facts]
        for end in ends:
            top = max_over(end, loops, self.ranges, self.memo)
            if top is None or not den.terms or any(den.terms.get(a, 0) <= 0 for a in top.terms):
                continue
            m = max([-(-c // den.terms[a]) for a, c in top.terms.items()] + [1])
            if self._at_most(x - d * m, -1):
                return m
        return None

    def proves(self, buf: Buffer, indices: tuple[Expr, ...]) -> bool:
        """True if every index is within the buffer's shape under the current facts."""
        key = (tuple(self.facts), buf, tuple(indices))
        known = self._proved.get(key)
        if known is None:
            known = self._proved[key] = self._unreachable() or all(
                self.in_bounds(i, d) for i, d in zip(indices, buf.shape))
        return known

    def _unreachable(self) -> bool:
        """The guards leave some loop variable no value (`if 8 * v + 1 < 1` with v >= 0: a tail row of a
        register tile that does not exist): nothing under them runs, so every access there is in bounds."""
        for level in self.narrowed:
            for undo in level:
                lo, hi = self.ranges[undo[0]] if undo is not None else (0, 0)
                if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
                    return True
        return False

    def push(self, cond: Expr, positive: bool = True) -> int:
        found = facts(cond, positive)
        self.facts.extend(found)
        self.narrowed.append([self._narrow(e, bound) for e, bound in found])
        self._memos.append({})
        return len(found)

    def _narrow(self, e: Expr, bound: int) -> tuple[Expr, tuple[int, int]] | None:
        """`c*v + k <= bound` tightens v's range: an index like 6*v + i is then bounded exactly."""
        lin = to_lin(e, self.ranges)
        if len(lin.terms) != 1:
            return self._narrow_symbolic(lin, bound)
        (v, c), = lin.terms.items()
        if v not in self.ranges or not all(isinstance(x, int) for x in self.ranges[v]):
            return self._narrow_symbolic(lin, bound)
        old = lo, hi = self.ranges[v]
        if c > 0:
            hi = min(hi, (bound - lin.const) // c)
        else:
            lo = max(lo, -((bound - lin.const) // -c))
        self.ranges[v] = (lo, hi)
        return v, old

    def _narrow_symbolic(self, lin: Lin, bound: int) -> tuple[Expr, tuple] | None:
        """`c*v + rest <= bound` with `rest` a function of the shape symbols alone (`io < n // 8`) gives v a
        symbolic endpoint; a fact with other loop variables is only kept as a fact (no cycles of endpoints)."""
        loops = [a for a in lin.terms if a.op is Op.VAR and a in self.ranges and not is_symbol(a, self.ranges)]
        if len(loops) != 1:
            return None
        v, c = loops[0], lin.terms[loops[0]]
        rest = Lin({a: k for a, k in lin.terms.items() if a is not v}, lin.const)
        if not all(is_symbol(x, self.ranges) for a in rest.terms for x in free_vars(a)):
            return None
        room = from_lin(rest.scale(-1) + Lin({}, bound), v.dtype)  # c*v <= bound - rest
        old = lo, hi = self.ranges[v]
        # an integer endpoint stays in a min/max: resolving a symbolic one to integers is looser
        if c > 0:
            new = simplify(room // c, self.ranges)
            hi = new if isinstance(hi, Expr) and prove(new <= hi, self.ranges) else binary(Op.MIN, as_expr(hi), new)
        else:
            new = simplify(-(room // -c), self.ranges)
            lo = new if isinstance(lo, Expr) and prove(new >= lo, self.ranges) else binary(Op.MAX, as_expr(lo), new)
        self.ranges[v] = (lo, hi)
        return v, old

    def pop(self, n: int) -> None:
        self._memos.pop()
        del self.facts[len(self.facts) - n:]
        for undo in reversed(self.narrowed.pop()):
            if undo is not None:
                self.ranges[undo[0]] = undo[1]
