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
from jitop.te.expr import Expr, Op, const, walk
from jitop.tir.nodes import Buffer, For, ForKind, IfThenElse, PrimFunc, Seq, Stmt, Store, walk_stmts

ALIGN = 64  # every intermediate starts on a cache line (a separate numpy array would be at least 16-aligned)


@dataclass(frozen=True)
class Arena:
    """Where each planned intermediate lives: its byte offset in the arena parameter `param`."""

    offsets: dict[Buffer, int]
    size: int
    param: int = -1  # index of the arena among the function's parameters
    in_place: tuple[tuple[str, str], ...] = ()  # (output, input) names: an output written over its input

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
    spans = lifetimes(func.body, planned)
    takes_over = in_place(func.body, planned, spans)
    arena = replace(place(planned, spans, takes_over),
                    in_place=tuple((out.name, src.name) for out, src in takes_over.items()))
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
    over = f"; {len(arena.in_place)} written over their input in place" if arena.in_place else ""
    return (f"{len(arena.offsets)} intermediates share one arena of {arena.size / 2**20:.2f} MiB "
            f"({alone / 2**20:.2f} MiB as buffers of their own){over}")


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
        if isinstance(st, Store):
            out.add(st.buffer)
        out.update(n.arg for n in loads_of(st))
    return out


def loads_of(st: Stmt) -> list[Expr]:
    """The loads in a statement's own expressions (a store's indices and value, a condition, a loop's extent;
    not its children's)."""
    if isinstance(st, Store):
        exprs: tuple[Expr, ...] = (*st.indices, st.value)
    elif isinstance(st, IfThenElse):
        exprs = (st.cond,)
    elif isinstance(st, For):
        exprs = (st.extent,)
    else:
        return []
    return [n for e in exprs for n in walk(e) if n.op is Op.LOAD]


def place(buffers: Sequence[Buffer], spans: dict[Buffer, tuple[int, int]],
          takes_over: dict[Buffer, Buffer] | None = None) -> Arena:
    """Offsets for `buffers` such that two whose spans overlap never share a byte (largest placed first), except
    that a buffer of `takes_over` (output -> input, from `in_place`) gets the bytes of its input: the two are
    placed as one, over both spans."""
    units: dict[Buffer, list[Buffer]] = {}  # the first buffer of each chain -> the chain
    first: dict[Buffer, Buffer] = {}
    for buf in sorted(buffers, key=lambda b: spans[b][0]):  # an input's span starts before its output's
        head = first.get((takes_over or {}).get(buf), buf)
        first[buf] = head
        units.setdefault(head, []).append(buf)
    unit_span = {h: (min(spans[b][0] for b in u), max(spans[b][1] for b in u)) for h, u in units.items()}
    offsets: dict[Buffer, int] = {}
    for head in sorted(units, key=lambda b: (-_nbytes(b), buffers.index(b))):
        start, end = unit_span[head]
        taken = sorted((offsets[o], offsets[o] + _nbytes(o)) for o in offsets
                       if unit_span[o][0] <= end and start <= unit_span[o][1])
        offset = 0
        for low, high in taken:
            if offset + _nbytes(head) <= low:
                break
            offset = max(offset, _aligned(high))
        offsets[head] = offset
    size = max((offsets[h] + _nbytes(h) for h in units), default=0)
    return Arena({b: offsets[first[b]] for b in buffers}, _aligned(size))


def in_place(body: Stmt, buffers: Sequence[Buffer], spans: dict[Buffer, tuple[int, int]]) -> dict[Buffer, Buffer]:
    """output -> input for the intermediates a nest may write over the bytes of one it reads (onnxruntime's and
    TVM's in-place reuse): the input is dead after that nest, both have the same shape and dtype, and the nest
    reads the input only in its stores to the output, each at exactly the element that store writes (a
    residual connection's add in a convolution's epilogue). Each element is then read before it is overwritten,
    and never after. Such an output's writes land on cache lines the input's reads just brought in: no DRAM read
    for ownership of lines of its own, and the arena holds one buffer fewer.

    >>> from jitop.dtypes import as_dtype
    >>> from jitop.te.expr import var
    >>> f32, i = as_dtype("float32"), var("i")
    >>> r, o = Buffer("r", f32, (16,), "param"), Buffer("o", f32, (16,), "param")
    >>> nest = For(i, const(16), ForKind.SERIAL, Store(o, (i,), r.load((i,)) + const(1.0, "float32")))
    >>> fill = For(i, const(16), ForKind.SERIAL, Store(r, (i,), const(0.0, "float32")))
    >>> body = Seq((fill, nest))
    >>> in_place(body, [r, o], lifetimes(body, [r, o]))
    {Buffer(o, float32[16], param): Buffer(r, float32[16], param)}
    """
    nests = body.stmts if isinstance(body, Seq) else (body,)
    taken: dict[Buffer, Buffer] = {}
    for out in buffers:
        k = spans[out][0]
        for src in buffers if k >= 0 else ():
            # the same shape, not just as many bytes: the same indices must name the same bytes
            if src is not out and src not in taken.values() and spans[src][1] == k and spans[src][0] < k \
                    and src.shape == out.shape and src.dtype == out.dtype \
                    and _reads_only_where_it_writes(nests[k], src, out):
                taken[out] = src
                break
    return taken


def _reads_only_where_it_writes(nest: Stmt, src: Buffer, out: Buffer) -> bool:
    """Whether every read of `src` in `nest` is in a store to `out` at that store's own indices, every store to
    `out` reads `src` there, and nothing stores to `src`."""
    def loads(e: Expr) -> list[Expr]:
        return [n for n in walk(e) if n.op is Op.LOAD and n.arg is src]
    for st in walk_stmts(nest):
        if isinstance(st, Store):
            reads = loads(st.value)
            if st.buffer is src or any(loads(i) for i in st.indices):
                return False
            if st.buffer is out and (not reads or not all(_same(r.src, st.indices) for r in reads)):
                return False
            if st.buffer is not out and reads:
                return False
        elif isinstance(st, IfThenElse) and loads(st.cond) or isinstance(st, For) and loads(st.extent):
            return False
    return True


def _same(a: Sequence[Expr], b: Sequence[Expr]) -> bool:
    """Whether two index tuples are the same expressions (interned: equal iff identical)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _nbytes(buf: Buffer) -> int:
    return _aligned(max(buf.size * buf.dtype.itemsize, 1))


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN
