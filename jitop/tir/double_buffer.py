"""Double-buffered shared-memory tiles (`Stage.double_buffer`): the loop that fills shared tiles and computes
on them, software-pipelined so that one barrier per iteration separates writing a tile from reading it.

A shared tile filled at each iteration of a serial loop lowers to

    for ko in range(n):  barrier; fill(ko); barrier; compute(ko)

Double-buffered, every tile has two slots and the next iteration's fill is split into loads into registers
(issued before the arithmetic, so their latency hides behind it) and stores into the other slot after it:

    fill(0) -> slot 0; barrier
    for ko in range(n):
        if ko + 1 < n: registers = fill's loads at ko + 1
        compute(ko) on slot ko % 2
        if ko + 1 < n: slot (ko + 1) % 2 = registers
        barrier

The stores of iteration ko write the slot that compute(ko - 1) read, which every thread finished before the
barrier that ended iteration ko - 1; compute(ko + 1) reads them after the barrier that ends iteration ko. A fill
that is not a nest of loops with constant extents around stores is not staged through registers: it then
stores into the other slot before the arithmetic (still one barrier per iteration).
"""
from __future__ import annotations

import math

from jitop.schedule.schedule import ForKind
from jitop.te.expr import Expr, Op, const, rewrite
from jitop.tir.nodes import Allocate, Barrier, Buffer, For, IfThenElse, Seq, Stmt, Store, seq
from jitop.tir.passes import map_stmt, substitute_stmt

SLOTS = 2


class _NotStaged(Exception):
    """The fill has a shape `_staged` does not stage through registers."""


def pipeline(var: Expr, extent: Expr, fills: list[Stmt], tiles: list[Buffer], body: Stmt) -> Stmt:
    """The serial loop `for var in range(extent): barrier; fills; barrier; body`, double-buffered: `tiles` (the
    shared buffers the fills write and the body reads) get a leading slot dimension of 2.

    >>> from jitop.te.expr import var as v
    >>> from jitop import dtypes
    >>> A = Buffer("A", dtypes.as_dtype("float32"), (64,), "param")
    >>> T = Buffer("T", dtypes.as_dtype("float32"), (16,), "shared")
    >>> ko, i = v("ko"), v("i")
    >>> fill = For(i, const(16), ForKind.VECTORIZED, Store(T, (i,), A.load((ko * 16 + i,))))
    >>> print(pipeline(ko, const(4), [fill], [T], Store(A, (ko,), T.load((const(0),)))))  # doctest: +ELLIPSIS
    T = allocate(float32[2, 16], 'shared')
    ...
    """
    doubled = {b: Buffer(b.name, b.dtype, (SLOTS, *b.shape), b.scope) for b in tiles}
    following = var + 1
    has_next = following < extent
    first = IfThenElse(const(0) < extent, _in_slot(substitute_stmt(seq(*fills), {var: const(0)}), doubled, const(0)))
    upcoming = substitute_stmt(seq(*fills), {var: following})
    try:
        loads, stores, registers = _staged(upcoming)
    except _NotStaged:
        loads, stores, registers = upcoming, None, []
    ahead = IfThenElse(has_next, loads if stores is not None else _in_slot(loads, doubled, following % SLOTS))
    behind = IfThenElse(has_next, _in_slot(stores, doubled, following % SLOTS)) if stores is not None else None
    step = seq(ahead, _in_slot(body, doubled, var % SLOTS), behind, Barrier())
    out: Stmt = seq(first, Barrier(), For(var, extent, ForKind.SERIAL, step))
    for buf in [*registers, *doubled.values()]:
        out = Allocate(buf, out)
    return out


def _in_slot(s: Stmt, doubled: dict[Buffer, Buffer], slot: Expr) -> Stmt:
    """`s` with every access to a doubled tile redirected to its copy `slot`."""
    def load(e: Expr) -> Expr | None:
        if e.op is Op.LOAD and e.arg in doubled:
            return doubled[e.arg].load((slot, *e.src))
        return None

    def expr(e: Expr) -> Expr:
        return rewrite(e, load)

    def visit(n: Stmt) -> Stmt:
        if isinstance(n, Store):
            buf = doubled.get(n.buffer, n.buffer)
            idx = (slot, *n.indices) if n.buffer in doubled else n.indices
            return Store(buf, tuple(expr(i) for i in idx), expr(n.value))
        if isinstance(n, IfThenElse):
            return IfThenElse(expr(n.cond), n.then, n.else_)
        return n
    return map_stmt(s, visit) or Seq(())


def _staged(fill: Stmt) -> tuple[Stmt, Stmt, list[Buffer]]:
    """(loads, stores, registers): each store of `fill` split into a store of its value into a per-thread
    register array (indexed by the enclosing loops that are not thread indices) and a store of that register
    into the original place, each half in a copy of the enclosing loops and guards."""
    registers: list[Buffer] = []

    def split(s: Stmt, loops: list[tuple[Expr, int]]) -> tuple[Stmt, Stmt]:
        if isinstance(s, Seq):
            halves = [split(x, loops) for x in s.stmts]
            return seq(*(a for a, _ in halves)), seq(*(b for _, b in halves))
        if isinstance(s, IfThenElse) and s.else_ is None:
            a, b = split(s.then, loops)
            return IfThenElse(s.cond, a), IfThenElse(s.cond, b)
        if isinstance(s, For):
            inner = loops if s.kind.is_thread else [*loops, (s.var, _constant(s.extent))]
            a, b = split(s.body, inner)
            return For(s.var, s.extent, s.kind, a), For(s.var, s.extent, s.kind, b)
        if isinstance(s, Store):
            reg = Buffer(f"{s.buffer.name}.staged{len(registers)}", s.buffer.dtype,
                         (max(1, math.prod(n for _, n in loops)),), "local")
            registers.append(reg)
            flat = _flat_index(loops)
            return Store(reg, (flat,), s.value), Store(s.buffer, s.indices, reg.load((flat,)))
        raise _NotStaged(type(s).__name__)
    loads, stores = split(fill, [])
    return loads, stores, registers


def _constant(extent: Expr) -> int:
    if extent.op is not Op.CONST:
        raise _NotStaged("a loop of symbolic extent")
    return int(extent.value)


def _flat_index(loops: list[tuple[Expr, int]]) -> Expr:
    """The row-major position of the loop variables' values among the loops' extents."""
    flat: Expr = const(0)
    for v, n in loops:
        flat = flat * n + v
    return flat
