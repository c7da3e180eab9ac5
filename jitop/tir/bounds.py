"""Proving memory accesses in bounds.

An index is bounded by the loop ranges, tightened by the guards around it (`if e < c` bounds any
index that differs from `e` by a bounded amount). The code generator asks at every access; what
cannot be proved is checked at run time and reported as IndexError, never read out of bounds.

A symbolic dimension (`n`) is proved by the simplifier's symbolic step: from the loop ranges
(`i.outer * 8 + i.inner < n` for i.outer < n // 8) or from an enclosing guard (`if i.outer * 8 + i.inner < n`).
"""
from __future__ import annotations

from jitop.te.expr import Expr, Op
from jitop.tir.nodes import Buffer
from jitop.tir.simplify import Ranges, bounds, prove, symbolic_bounds, to_lin


def _conjuncts(cond: Expr, positive: bool) -> list[tuple[Expr, int]]:
    """Facts `e <= hi` as (e, hi) and `e >= lo` as (-e, -lo), from a condition known to be `positive`."""
    if cond.op is Op.AND and positive:
        return _conjuncts(cond.src[0], True) + _conjuncts(cond.src[1], True)
    if cond.op is Op.NOT:
        return _conjuncts(cond.src[0], not positive)
    if cond.op not in (Op.LT, Op.LE, Op.GT, Op.GE) or not cond.src[0].dtype.is_int:
        return []
    a, b = cond.src
    op = cond.op if positive else {Op.LT: Op.GE, Op.LE: Op.GT, Op.GT: Op.LE, Op.GE: Op.LT}[cond.op]
    if op in (Op.GT, Op.GE):
        a, b = b, a
        op = Op.LT if op is Op.GT else Op.LE
    # a < b  ->  a - b <= -1 ;  a <= b  ->  a - b <= 0
    return [(a - b, -1 if op is Op.LT else 0)]


class BoundsCheck:
    """Loop ranges plus a stack of facts from the guards enclosing the current point."""

    def __init__(self, ranges: Ranges):
        self.ranges = ranges  # narrowed by single-variable guards (`if v < 42`) inside them, restored on pop
        self.facts: list[tuple[Expr, int]] = []
        self.narrowed: list[list[tuple[Expr, tuple[int, int]]]] = []

    def in_bounds(self, idx: Expr, dim: int | Expr) -> bool:
        b = bounds(idx, self.ranges)
        if b is None:
            return False
        lo, hi = b
        symbolic = not isinstance(dim, int)
        for e, bound in self.facts:  # idx = e + (idx - e) <= bound + max(idx - e)
            if not symbolic and hi >= dim:
                d = bounds(idx - e, self.ranges)
                if d is not None:
                    hi = min(hi, bound + d[1])
            if lo < 0:
                d = bounds(idx + e, self.ranges)  # -e <= bound  ->  idx = (idx + e) - e >= min(idx + e) - bound
                if d is not None:
                    lo = max(lo, d[0] - bound)
        if symbolic:
            return lo >= 0 and self._below(idx, dim)
        return lo >= 0 and hi < dim

    def _below(self, idx: Expr, dim: Expr) -> bool:
        """idx < dim for a symbolic dim, from the ranges or from a fact e <= bound:
        idx - dim = (idx - dim - e) + e <= max(idx - dim - e) + bound."""
        if prove(idx < dim, self.ranges) is True:
            return True
        for e, bound in self.facts:
            d = symbolic_bounds(idx - dim - e, self.ranges)
            if d is not None and d[1] + bound < 0:
                return True
        return False

    def proves(self, buf: Buffer, indices: tuple[Expr, ...]) -> bool:
        """True if every index is within the buffer's shape under the current facts."""
        return all(self.in_bounds(i, d) for i, d in zip(indices, buf.shape))

    def push(self, cond: Expr, positive: bool = True) -> int:
        facts = _conjuncts(cond, positive)
        self.facts.extend(facts)
        self.narrowed.append([self._narrow(e, bound) for e, bound in facts])
        return len(facts)

    def _narrow(self, e: Expr, bound: int) -> tuple[Expr, tuple[int, int]] | None:
        """`c*v + k <= bound` tightens v's range: an index like 6*v + i is then bounded exactly."""
        lin = to_lin(e, self.ranges)
        if len(lin.terms) != 1:
            return None
        (v, c), = lin.terms.items()
        if v not in self.ranges or not all(isinstance(x, int) for x in self.ranges[v]):
            return None  # a symbolic range stays: the fact itself is kept and used
        old = lo, hi = self.ranges[v]
        if c > 0:
            hi = min(hi, (bound - lin.const) // c)
        else:
            lo = max(lo, -((bound - lin.const) // -c))
        self.ranges[v] = (lo, hi)
        return v, old

    def pop(self, n: int) -> None:
        del self.facts[len(self.facts) - n:]
        for undo in reversed(self.narrowed.pop()):
            if undo is not None:
                self.ranges[undo[0]] = undo[1]
