"""Loop-IR passes: small functions from Stmt to Stmt."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from jitop.te.expr import Expr, Op, const, free_vars, substitute, var
from jitop.tir.nodes import Allocate, For, ForKind, IfThenElse, Seq, Stmt, Store, seq, walk_stmts
from jitop.tir.simplify import Ranges, lin_bounds, simplify, to_lin, Lin


def map_stmt(s: Stmt, fn: Callable[[Stmt], Stmt | None]) -> Stmt | None:
    """Rebuild `s` bottom-up; `fn` gets each rebuilt statement and returns its replacement (None drops it)."""
    if isinstance(s, For):
        body = map_stmt(s.body, fn)
        return fn(replace(s, body=body)) if body is not None else None
    if isinstance(s, Allocate):
        body = map_stmt(s.body, fn)
        return fn(replace(s, body=body)) if body is not None else None
    if isinstance(s, Seq):
        stmts = [x for x in (map_stmt(c, fn) for c in s.stmts) if x is not None]
        return fn(seq(*stmts)) if stmts else None
    if isinstance(s, IfThenElse):
        then = map_stmt(s.then, fn)
        other = map_stmt(s.else_, fn) if s.else_ is not None else None
        if then is None and other is None:
            return None
        return fn(IfThenElse(s.cond, then if then is not None else Seq(()), other))
    return fn(s)


def simplify_stmt(s: Stmt, ranges: Ranges) -> Stmt:
    """Simplify every expression; drop guards the loop ranges prove and code they prove dead."""
    def visit(node: Stmt) -> Stmt | None:
        if isinstance(node, Store):
            return Store(node.buffer, tuple(simplify(i, ranges) for i in node.indices), simplify(node.value, ranges))
        if isinstance(node, IfThenElse):
            cond = simplify(node.cond, ranges)
            if cond.op is Op.CONST:
                return node.then if cond.value else node.else_
            return IfThenElse(cond, node.then, node.else_)
        if isinstance(node, For):
            extent = simplify(node.extent, ranges)
            if (extent.op is Op.CONST and extent.value <= 0) or (isinstance(node.body, Seq) and not node.body.stmts):
                return None
            return replace(node, extent=extent)
        return node
    out = map_stmt(s, visit)
    return out if out is not None else Seq(())



def substitute_stmt(s: Stmt, mapping: dict[Expr, Expr], ranges: Ranges | None = None) -> Stmt:
    """Replace variables in every expression of `s` (and re-simplify with `ranges`)."""
    def visit(n: Stmt) -> Stmt:
        if isinstance(n, Store):
            return Store(n.buffer, tuple(simplify(substitute(i, mapping), ranges) for i in n.indices),
                         simplify(substitute(n.value, mapping), ranges))
        if isinstance(n, IfThenElse):
            cond = simplify(substitute(n.cond, mapping), ranges)
            if cond.op is Op.CONST:
                return n.then if cond.value else n.else_
            return IfThenElse(cond, n.then, n.else_)
        return n
    return map_stmt(s, visit) or Seq(())


# ** loop partitioning: run the iterations where tail guards always hold in a loop without them **

def _guard_free_extent(loop: For, cond: Expr, ranges: Ranges) -> int | None:
    """Largest n such that `cond` holds for every iteration v < n of `loop` (None if not a tail guard)."""
    if cond.op is not Op.LT or not cond.src[0].dtype.is_int or cond.src[1].op is not Op.CONST:
        return None
    lin = to_lin(cond.src[0], ranges)
    coef = lin.terms.get(loop.var, 0)
    rest = Lin({a: c for a, c in lin.terms.items() if a is not loop.var}, lin.const)
    if coef <= 0 or any(loop.var in free_vars(a) for a in rest.terms):
        return None
    b = lin_bounds(rest, ranges)
    if b is None:
        return None
    # coef*v + rest_hi < N  <=>  v <= (N - 1 - rest_hi) // coef
    return max(0, (int(cond.src[1].value) - 1 - b[1]) // coef + 1)


def partition_loops(s: Stmt, ranges: Ranges) -> Stmt:
    """Split serial/parallel loops at the first iteration a tail guard can fail (TVM's loop partition).

    Outer loops first: once an outer loop's main part is guard-free, its inner loops need no split.
    """
    if isinstance(s, For) and s.extent.op is not Op.CONST:
        return replace(s, body=partition_loops(s.body, ranges))
    if isinstance(s, For) and s.kind in (ForKind.SERIAL, ForKind.PARALLEL):
        extent = int(s.extent.value)
        cuts = [c for c in (_guard_free_extent(s, g.cond, ranges) for g in walk_stmts(s.body)
                            if isinstance(g, IfThenElse)) if c is not None and 0 < c < extent]
        if cuts:
            return _partition(s, min(cuts), ranges)
    if isinstance(s, For) and int(s.extent.value) == 1 and s.kind is not ForKind.VECTORIZED:
        return _loop(s.var, 1, s.kind, s.body, ranges)  # one iteration: no loop
    if isinstance(s, (For, Allocate)):
        return replace(s, body=partition_loops(s.body, ranges))
    if isinstance(s, Seq):
        return seq(*(partition_loops(x, ranges) for x in s.stmts))
    if isinstance(s, IfThenElse):
        other = partition_loops(s.else_, ranges) if s.else_ is not None else None
        return IfThenElse(s.cond, partition_loops(s.then, ranges), other)
    return s


def _partition(loop: For, cut: int, ranges: Ranges) -> Stmt:
    extent = int(loop.extent.value)
    if loop.kind is ForKind.PARALLEL:
        return _partition_parallel(loop, cut, ranges)
    # fresh variables for both parts, so the shared range table stays exact for each
    parts = []
    for start, n in ((0, cut), (cut, extent - cut)):
        v = var(loop.var.name)
        ranges[v] = (0, n - 1)
        body = simplify_stmt(substitute_stmt(loop.body, {loop.var: v + start}, ranges), ranges)
        parts.append(_loop(v, n, loop.kind, body, ranges))
    return seq(*parts)


def _partition_parallel(loop: For, cut: int, ranges: Ranges) -> Stmt:
    """`if v < cut: main else: tail` inside one parallel loop: peeling the tail out would run it on one
    thread while the others wait. Each branch is simplified with v's range narrowed to it."""
    v, extent = loop.var, int(loop.extent.value)
    branches = []
    for lo, hi in ((0, cut - 1), (cut, extent - 1)):
        ranges[v] = (lo, hi)
        # a one-iteration tail gets v as a constant, so guards in its unrolled loops fold away
        body = substitute_stmt(loop.body, {v: const(lo)}, ranges) if lo == hi else loop.body
        branches.append(partition_loops(simplify_stmt(body, ranges), ranges))
    ranges[v] = (0, extent - 1)
    return For(v, loop.extent, loop.kind, IfThenElse(v < cut, branches[0], branches[1]))


def _loop(v: Expr, extent: int, kind: ForKind, body: Stmt, ranges: Ranges) -> Stmt:
    """A partitioned loop; one iteration needs no loop at all, an empty body none either."""
    if isinstance(body, Seq) and not body.stmts:
        return body
    if extent == 1:
        return partition_loops(simplify_stmt(substitute_stmt(body, {v: const(0)}, ranges), ranges), ranges)
    return For(v, const(extent), kind, partition_loops(body, ranges))
