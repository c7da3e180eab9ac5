"""Storage of a kernel's intermediates: one arena, each intermediate at a byte offset in it, sharing bytes
with intermediates that are dead by the time it is written (TVM's storage rewrite, onnxruntime's memory
pattern planner).

With a buffer of its own per intermediate, a deep network's kernel writes every layer's activations into
memory last touched a whole call ago: every store misses the caches. Planned, the live activations of a
ResNet stay a few MiB that the next layer finds in cache.

A lifetime is the span of top-level loop nests (run one after the other) that touch the buffer. Buffers whose
lifetimes overlap get disjoint bytes; the others may share. Placement is greedy, largest first, at the lowest
offset that fits between the ranges of the buffers it must not overlap. Buffers of a symbolic size keep a
parameter of their own.

>>> from jitop.dtypes import as_dtype
>>> f32 = as_dtype("float32")
>>> a, b, c = (Buffer(n, f32, (16,), "param") for n in "abc")
>>> arena = place([a, b, c], {a: (0, 1), b: (1, 2), c: (2, 3)})
>>> arena.offsets[a], arena.offsets[b], arena.offsets[c], arena.size
(0, 64, 0, 128)
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from jitop.dtypes import as_dtype
from jitop.te.expr import Expr, Op, walk
from jitop.tir.nodes import Buffer, For, IfThenElse, PrimFunc, Seq, Stmt, Store, walk_stmts

ALIGN = 64  # every intermediate starts on a cache line (a separate numpy array would be at least 16-aligned)


@dataclass(frozen=True)
class Arena:
    """Where each planned intermediate lives: its byte offset in the arena parameter `param`."""

    offsets: dict[Buffer, int]
    size: int
    param: int = -1  # index of the arena among the function's parameters

    def __str__(self) -> str:  # part of the kernel's cache key (the compiled code depends on it)
        return f"arena({self.size}: {', '.join(f'{b.name}@{o}' for b, o in self.offsets.items())})"


def plan_arena(func: PrimFunc, scratch: int) -> PrimFunc:
    """`func` with its last `scratch` parameters (intermediates of the caller, outputs of the function) of a
    constant size placed in one arena: a uint8 output parameter where the first of them stood, the others
    gone from the parameters (the code generator points them into the arena: attrs["arena"]). Returned as
    it is when fewer than two intermediates could share."""
    first = len(func.params) - scratch
    planned = [b for b in func.params[first:] if not b.symbolic]
    if len(planned) < 2:
        return func
    arena = place(planned, lifetimes(func.body, planned))
    buffer = Buffer(f"{func.name}_arena", as_dtype("uint8"), (max(arena.size, 1),), "param")
    kept = [b for b in func.params[first:] if b.symbolic]
    params = (*func.params[:first], buffer, *kept)
    outputs = tuple(k for k in func.outputs if k < first) + tuple(range(first, len(params)))
    return replace(func, params=params, outputs=outputs,
                   attrs={**func.attrs, "arena": replace(arena, param=first)})


def storage(func: PrimFunc) -> str:
    """What `plan_arena` did, for explain: how many intermediates share how many bytes."""
    arena = func.attrs.get("arena")
    if arena is None:
        return "each intermediate has a buffer of its own"
    alone = sum(_nbytes(b) for b in arena.offsets)
    return (f"{len(arena.offsets)} intermediates share one arena of {arena.size / 2**20:.2f} MiB "
            f"({alone / 2**20:.2f} MiB as buffers of their own)")


def lifetimes(body: Stmt, buffers: Sequence[Buffer]) -> dict[Buffer, tuple[int, int]]:
    """(first, last) top-level nest that touches each buffer; a buffer nothing touches gets (-1, -1)."""
    wanted = set(buffers)
    spans: dict[Buffer, tuple[int, int]] = {}
    nests = body.stmts if isinstance(body, Seq) else (body,)
    for k, nest in enumerate(nests):
        for buf in touched(nest) & wanted:
            spans[buf] = (spans.get(buf, (k, k))[0], k)
    return {b: spans.get(b, (-1, -1)) for b in buffers}


def touched(s: Stmt) -> set[Buffer]:
    """The buffers a statement stores to or loads from (also in indices, conditions and loop extents)."""
    out: set[Buffer] = set()
    for st in walk_stmts(s):
        exprs: tuple[Expr, ...] = ()
        if isinstance(st, Store):
            out.add(st.buffer)
            exprs = (*st.indices, st.value)
        elif isinstance(st, IfThenElse):
            exprs = (st.cond,)
        elif isinstance(st, For):
            exprs = (st.extent,)
        for e in exprs:
            out.update(n.arg for n in walk(e) if n.op is Op.LOAD)
    return out


def place(buffers: Sequence[Buffer], spans: dict[Buffer, tuple[int, int]]) -> Arena:
    """Offsets for `buffers` such that two whose spans overlap never share a byte (largest placed first)."""
    offsets: dict[Buffer, int] = {}
    for buf in sorted(buffers, key=lambda b: (-_nbytes(b), buffers.index(b))):
        start, end = spans[buf]
        taken = sorted((offsets[o], offsets[o] + _nbytes(o)) for o in offsets
                       if spans[o][0] <= end and start <= spans[o][1])
        offset = 0
        for low, high in taken:
            if offset + _nbytes(buf) <= low:
                break
            offset = max(offset, _aligned(high))
        offsets[buf] = offset
    size = max((offsets[b] + _nbytes(b) for b in buffers), default=0)
    return Arena({b: offsets[b] for b in buffers}, _aligned(size))


def _nbytes(buf: Buffer) -> int:
    return _aligned(max(buf.size * buf.dtype.itemsize, 1))


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN
