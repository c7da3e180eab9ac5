"""Loop-IR passes: small functions from Stmt to Stmt."""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable

from jitop import dtypes
from jitop.te.expr import Expr, Op, binary, const, free_vars, substitute, var
from jitop.tir.nodes import (Allocate, Barrier, For, ForKind, IfThenElse, Seq, Stmt, Store, ThreadReduce, seq,
                              walk_stmts)
from jitop.tir.simplify import Ranges, from_lin, is_symbol, lin_bounds, max_over, prove, simplify, to_lin, Lin


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



@functools.lru_cache(maxsize=1 << 16)
def _simplified(e: Expr) -> Expr:
    """simplify(e) without ranges, memoized: an unrolled body's copies hold the same expressions again and again
    (expressions are interned, so equal ones are one key)."""
    return simplify(e)


def substitute_stmt(s: Stmt, mapping: dict[Expr, Expr], ranges: Ranges | None = None) -> Stmt:
    """Replace variables in every expression of `s` (and re-simplify with `ranges`)."""
    rebuilt: dict[Expr, Expr] = {}  # shared by the statements' expressions: an unrolled body's loads share indices

    def simple(e: Expr) -> Expr:
        e = substitute(e, mapping, rebuilt)
        return simplify(e, ranges) if ranges else _simplified(e)

    def visit(n: Stmt) -> Stmt:
        if isinstance(n, Store):
            return Store(n.buffer, tuple(simple(i) for i in n.indices), simple(n.value))
        if isinstance(n, IfThenElse):
            cond = simple(n.cond)
            if cond.op is Op.CONST:
                return n.then if cond.value else n.else_
            return IfThenElse(cond, n.then, n.else_)
        if isinstance(n, For) and free_vars(n.extent) & mapping.keys():  # (a split's symbolic tail names it)
            return replace(n, extent=simple(n.extent))
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


SYMBOLIC_CUTS = 64  # symbolic cuts per function: each copies a loop's body, and nested ones multiply the copies


@dataclass(frozen=True)
class _Scope:
    """Where loop partitioning is. `lanes`: the variables of the vectorized loops around it; a cut that depends
    on one differs between lanes (one trip count for all would run some lanes past their end), so such a guard
    stays a guard, a per-lane mask. `cuts_left`: one count for the whole function; past it, guards stay guards
    (correct, slower code) rather than the compile growing without bound (five nested splits of one symbolic
    axis under a compute_at took 7 s to lower, a padded stencil's tiles minutes)."""

    lanes: frozenset[Expr]
    cuts_left: list[int]

    def inside(self, lane: Expr) -> "_Scope":
        return _Scope(self.lanes | {lane}, self.cuts_left)

    def take_cut(self) -> bool:
        if self.cuts_left[0] <= 0:
            return False
        self.cuts_left[0] -= 1
        return True


def partition_loops(s: Stmt, ranges: Ranges, scope: "_Scope | None" = None) -> Stmt:
    """Split serial/parallel loops at the first iteration a tail guard can fail (TVM's loop partition).

    Outer loops first: once an outer loop's main part is guard-free, its inner loops need no split. `scope`: the
    vectorized loops around `s` and the symbolic cuts left (see _Scope).
    """
    scope = scope if scope is not None else _Scope(frozenset(), [SYMBOLIC_CUTS])
    if isinstance(s, For) and s.kind in (ForKind.SERIAL, ForKind.PARALLEL):
        guards = [g.cond for g in walk_stmts(s.body)
                  if isinstance(g, IfThenElse) and not (scope.lanes and free_vars(g.cond) & scope.lanes)]
        if s.extent.op is not Op.CONST or any(_uses_symbols(g, ranges) for g in guards):
            out = _partition_symbolic(s, guards, ranges, scope)
            if out is not None:
                return out
        if s.extent.op is Op.CONST:
            extent = int(s.extent.value)
            cuts = [c for c in (_guard_free_extent(s, g, ranges) for g in guards) if c is not None and 0 < c < extent]
            if cuts:
                return _partition(s, min(cuts), ranges, scope)
    if isinstance(s, For) and s.kind is ForKind.VECTORIZED and \
            (hoisted := _hoist_vector_guard(s, ranges, scope)) is not None:
        return hoisted
    if isinstance(s, For) and s.extent.op is Op.CONST and int(s.extent.value) == 1 and s.kind is not ForKind.VECTORIZED:
        return _loop(s.var, 1, s.kind, s.body, ranges, scope)  # one iteration: no loop
    if isinstance(s, For) and s.kind is ForKind.VECTORIZED:
        return replace(s, body=partition_loops(s.body, ranges, scope.inside(s.var)))
    if isinstance(s, (For, Allocate)):
        return replace(s, body=partition_loops(s.body, ranges, scope))
    if isinstance(s, Seq):
        return seq(*(partition_loops(x, ranges, scope) for x in s.stmts))
    if isinstance(s, IfThenElse):
        other = partition_loops(s.else_, ranges, scope) if s.else_ is not None else None
        return IfThenElse(s.cond, partition_loops(s.then, ranges, scope), other)
    return s


def _partition(loop: For, cut: int, ranges: Ranges, scope: "_Scope") -> Stmt:
    extent = int(loop.extent.value)
    if loop.kind is ForKind.PARALLEL:
        return _partition_parallel(loop, cut, ranges, scope)
    # fresh variables for both parts, so the shared range table stays exact for each
    parts = []
    for start, n in ((0, cut), (cut, extent - cut)):
        v = var(loop.var.name)
        ranges[v] = (0, n - 1)
        body = simplify_stmt(substitute_stmt(loop.body, {loop.var: v + start}, ranges), ranges)
        parts.append(_loop(v, n, loop.kind, body, ranges, scope))
    return seq(*parts)


def _partition_parallel(loop: For, cut: int, ranges: Ranges, scope: "_Scope") -> Stmt:
    """`if v < cut: main else: tail` inside one parallel loop: peeling the tail out would run it on one
    thread while the others wait. Each branch is simplified with v's range narrowed to it."""
    v, extent = loop.var, int(loop.extent.value)
    branches = []
    for lo, hi in ((0, cut - 1), (cut, extent - 1)):
        ranges[v] = (lo, hi)
        # a one-iteration tail gets v as a constant, so guards in its unrolled loops fold away
        body = substitute_stmt(loop.body, {v: const(lo)}, ranges) if lo == hi else loop.body
        branches.append(partition_loops(simplify_stmt(body, ranges), ranges, scope))
    ranges[v] = (0, extent - 1)
    return For(v, loop.extent, loop.kind, IfThenElse(v < cut, branches[0], branches[1]))


def _loop(v: Expr, extent: int, kind: ForKind, body: Stmt, ranges: Ranges, scope: "_Scope") -> Stmt:
    """A partitioned loop; one iteration needs no loop at all, an empty body none either."""
    if isinstance(body, Seq) and not body.stmts:
        return body
    if extent == 1:
        return partition_loops(simplify_stmt(substitute_stmt(body, {v: const(0)}, ranges), ranges), ranges, scope)
    return For(v, const(extent), kind, partition_loops(body, ranges, scope))


# ** symbolic extents: cut at an expression of the symbols (`n // 8`), keep the tail (peeled, or guarded) **

def _uses_symbols(e: Expr, ranges: Ranges) -> bool:
    return any(is_symbol(v, ranges) for v in free_vars(e))


def _symbolic_cut(loop: For, cond: Expr, inner: set[Expr], ranges: Ranges) -> tuple[Expr, bool] | None:
    """The first iteration of `loop` where `cond` (a linear `a < b`, increasing in the loop variable) can
    fail, as an expression of symbols and outer loops: `io * 8 + ii < n` with ii < 8 gives n // 8; and
    whether it is exact (no inner loop in `cond`: it fails at every later iteration)."""
    if cond.op not in (Op.LT, Op.LE, Op.GT, Op.GE) or not cond.src[0].dtype.is_int:
        return None
    a, b = cond.src if cond.op in (Op.LT, Op.LE) else cond.src[::-1]
    lin = to_lin(a - b, ranges) + Lin({}, 0 if cond.op in (Op.LT, Op.GT) else -1)  # holds iff lin < 0
    v = loop.var
    coef = lin.terms.get(v, 0)
    rest = Lin({x: c for x, c in lin.terms.items() if x is not v}, lin.const)
    if coef <= 0 or any(v in free_vars(x) for x in rest.terms):
        return None
    top = max_over(rest, inner, ranges)
    if top is None or any(v in free_vars(x) for x in top.terms):
        return None
    # coef * v + top < 0  <=>  v <= (-1 - top) // coef
    room = from_lin(top.scale(-1) + Lin({}, -1), dtypes.INDEX)
    exact = not any(free_vars(x) & inner for x in rest.terms)
    return simplify((room // coef if coef > 1 else room) + 1, ranges), exact


def _partition_symbolic(loop: For, guards: list[Expr], ranges: Ranges, scope: "_Scope") -> Stmt | None:
    """Main part of `loop` without the guards, then the tail: `for io in range(n // 8)` + one peeled
    iteration (a parallel loop: `if io < n // 8: main else: tail`). None when no guard gives a cut."""
    inner = {s.var for s in walk_stmts(loop.body) if isinstance(s, For)}
    found = {g: c for g in dict.fromkeys(guards) if (c := _symbolic_cut(loop, g, inner, ranges)) is not None}
    found = {g: c for g, c in found.items()
             if prove(c[0] >= loop.extent, ranges) is not True and prove(c[0] <= 0, ranges) is not True}
    if not found or not scope.take_cut():
        return None
    cuts = [c for c, _ in found.values()]
    cut = cuts[0]
    for c in cuts[1:]:
        cut = c if prove(c <= cut, ranges) else cut if prove(cut <= c, ranges) else binary(Op.MIN, cut, c)
    exact = {g for g, (c, ok) in found.items() if ok and (c is cut or prove(c <= cut, ranges))}
    dead_tail = loop.kind is ForKind.SERIAL and _stores_guarded(loop.body, lambda g: g in exact, False)
    if prove(cut >= 0, ranges) is not True and not dead_tail:
        cut = binary(Op.MAX, cut, const(0))  # a serial loop of a negative extent runs no iteration
    if prove(cut <= loop.extent, ranges) is not True:
        cut = binary(Op.MIN, cut, loop.extent)
    cut = _readable(simplify(cut, ranges), ranges)
    if loop.kind is ForKind.PARALLEL:
        return _parallel_symbolic(loop, cut, ranges, scope)
    main = _part(loop, cut, const(0), ranges, scope)
    # every store of the tail is under a guard that fails from the cut on: no tail
    return main if dead_tail else seq(main, _tail(loop, cut, ranges, scope))


def _part(loop: For, extent: Expr, start: Expr, ranges: Ranges, scope: "_Scope") -> Stmt:
    """Iterations [start, start + extent) of `loop` as a loop of their own (a fresh variable)."""
    v = var(loop.var.name)
    ranges[v] = (0, simplify(extent - 1, ranges))
    body = simplify_stmt(substitute_stmt(loop.body, {loop.var: v + start}, ranges), ranges)
    if isinstance(body, Seq) and not body.stmts:
        return body
    return For(v, extent, loop.kind, partition_loops(body, ranges, scope))


def _tail(loop: For, cut: Expr, ranges: Ranges, scope: "_Scope") -> Stmt | None:
    """Iterations [cut, extent): one at most is peeled (substituted, its guards left to masks), behind a test
    of cut < extent unless every store under it is guarded away when the tail is empty."""
    rest = _readable(simplify(loop.extent - cut, ranges), ranges)
    if prove(rest <= 0, ranges) is True:
        return None
    if prove(rest <= 1, ranges) is not True:
        return _part(loop, rest, cut, ranges, scope)
    body = simplify_stmt(substitute_stmt(loop.body, {loop.var: cut}, ranges), ranges)
    if not _stores_guarded(loop.body, lambda g: _fails_past_end(g, loop, ranges), False):
        body = IfThenElse(simplify(cut < loop.extent, ranges), body)
    return partition_loops(body, ranges, scope)


def _stores_guarded(s: Stmt, kills: Callable[[Expr], bool], guarded: bool) -> bool:
    """Whether every store of `s` is under a guard `kills` accepts."""
    if isinstance(s, Store):
        return guarded
    if isinstance(s, IfThenElse):
        ok = _stores_guarded(s.then, kills, guarded or kills(s.cond))
        return ok and (s.else_ is None or _stores_guarded(s.else_, kills, guarded))
    if isinstance(s, Seq):
        return all(_stores_guarded(x, kills, guarded) for x in s.stmts)
    if isinstance(s, (For, Allocate)):
        return _stores_guarded(s.body, kills, guarded)
    return False


def _readable(e: Expr, ranges: Ranges) -> Expr:
    """k*x - k*c*(x // c) written k*(x % c): a tail's extent reads `n % 8`."""
    lin = to_lin(e, ranges)
    for q, t in list(lin.terms.items()):
        if q.op is not Op.FLOORDIV or q.src[1].op is not Op.CONST or q not in lin.terms:
            continue
        c = int(q.src[1].value)
        if c <= 0 or t % c:
            continue
        k = -t // c
        x = to_lin(q.src[0], ranges)
        new = lin + x.scale(-k) + Lin({q: -t, Expr(Op.FLOORMOD, q.dtype, q.src): k})
        if len(new.terms) < len(lin.terms):
            lin = new
    return from_lin(lin, e.dtype)


def _fails_past_end(cond: Expr, loop: For, ranges: Ranges) -> bool:
    # increasing in the loop variable and false at v = extent: false for every v >= extent
    v = loop.var
    if cond.op not in (Op.LT, Op.LE) or any(v in free_vars(x) for u in free_vars(cond) if u is not v
                                            for x in ranges.get(u, ()) if isinstance(x, Expr)):
        return False
    lin = to_lin(cond.src[0] - cond.src[1], ranges)
    if lin.terms.get(v, 0) <= 0 or any(v in free_vars(x) for x in lin.terms if x is not v):
        return False
    return prove(substitute(cond, {v: loop.extent}), ranges) is False


def _parallel_symbolic(loop: For, cut: Expr, ranges: Ranges, scope: "_Scope") -> Stmt:
    """`if v < cut: main else: tail` inside the parallel loop, each branch simplified under its own range
    of v (a one-iteration tail gets v = cut substituted)."""
    v, whole = loop.var, ranges[loop.var]
    ranges[v] = (0, simplify(cut - 1, ranges))
    main = partition_loops(simplify_stmt(loop.body, ranges), ranges, scope)
    ranges[v] = (cut, whole[1])
    body = loop.body
    if prove(loop.extent - cut <= 1, ranges) is True:
        body = substitute_stmt(body, {v: cut}, ranges)
    tail = partition_loops(simplify_stmt(body, ranges), ranges, scope)
    ranges[v] = whole
    return For(v, loop.extent, loop.kind, IfThenElse(v < cut, main, tail))


def _hoist_vector_guard(loop: For, ranges: Ranges, scope: "_Scope") -> Stmt | None:
    """A vectorized loop of a constant width under a symbolic guard that grows with its variable
    (`q * 8 + j < m`, q a non-linear function of a fused loop that partitioning cannot cut): when the
    guard holds for the last lane it holds for every lane, so `if guard(last lane): unmasked else: masked`."""
    g = loop.body
    if loop.extent.op is not Op.CONST or not isinstance(g, IfThenElse) or g.else_ is not None \
            or g.cond.op not in (Op.LT, Op.LE) or not _uses_symbols(g.cond, ranges):
        return None
    inner = {x.var for x in walk_stmts(g.then) if isinstance(x, For)}
    lin = to_lin(g.cond.src[0] - g.cond.src[1], ranges)
    v = loop.var
    if lin.terms.get(v, 0) <= 0 or any(free_vars(a) & (inner | {v}) for a in lin.terms if a is not v):
        return None
    last = simplify(substitute(g.cond, {v: const(int(loop.extent.value) - 1)}), ranges)
    if last.op is Op.CONST:
        return None
    fast = For(v, loop.extent, loop.kind, partition_loops(g.then, ranges, scope.inside(v)))
    return IfThenElse(last, fast, loop)


# ** GPU: no barrier under a condition some threads of a block may fail **

def guards_off_barriers(s: Stmt) -> Stmt:
    """Move each guard that encloses a barrier down to the stores it protects, so every thread of a block
    reaches every barrier (`__syncthreads()` in divergent code hangs or is undefined). A guard does not move
    onto stores to shared memory: those are the block's cooperative fills, which must be complete for every
    thread, and which carry their own bounds guards.

    >>> from jitop.tir.nodes import Barrier, Buffer
    >>> from jitop import dtypes
    >>> x, buf = var("x"), Buffer("B", dtypes.float32, (4,))
    >>> print(guards_off_barriers(IfThenElse(x < 4, seq(Barrier(), Store(buf, (x,), const(1.0, "float32"))))))
    barrier()
    if x < 4:
        B[x] = 1.0f
    """
    if isinstance(s, IfThenElse) and s.else_ is None and _has_barrier(s.then):
        return _guard_stores(guards_off_barriers(s.then), s.cond)
    if isinstance(s, (For, Allocate)):
        return replace(s, body=guards_off_barriers(s.body))
    if isinstance(s, Seq):
        return seq(*(guards_off_barriers(x) for x in s.stmts))
    if isinstance(s, IfThenElse):
        other = guards_off_barriers(s.else_) if s.else_ is not None else None
        return IfThenElse(s.cond, guards_off_barriers(s.then), other)
    return s


def _has_barrier(s: Stmt) -> bool:
    """Whether `s` holds a statement every thread of the block must reach (a barrier, a cross-thread reduction)."""
    return any(isinstance(x, (Barrier, ThreadReduce)) for x in walk_stmts(s))


def _guard_stores(s: Stmt, cond: Expr) -> Stmt:
    """`s` with `cond` guarding each of its statements that holds no barrier, except fills of shared memory."""
    if not _has_barrier(s):
        if all(x.buffer.scope == "shared" for x in walk_stmts(s) if isinstance(x, Store)):
            return s
        return IfThenElse(cond, s)
    if isinstance(s, (For, Allocate)):
        return replace(s, body=_guard_stores(s.body, cond))
    if isinstance(s, Seq):
        return seq(*(_guard_stores(x, cond) for x in s.stmts))
    if isinstance(s, IfThenElse):
        other = _guard_stores(s.else_, cond) if s.else_ is not None else None
        return IfThenElse(s.cond, _guard_stores(s.then, cond), other)
    return s  # the barrier itself: every thread reaches it
