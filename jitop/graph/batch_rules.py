"""How a graph primitive computes H copies of itself at once, for jitop.graph.batching (JAX's batching rules,
one per primitive, in jitop.graph.prims' table).

A rule takes the node of the first copy and its sources, each either *batched* (the H copies' values stacked
on a new leading axis) or *shared* (one value every copy reads), at least one batched, and returns the
batched node: the H copies' results stacked on a leading axis. None where the primitive cannot do that.

>>> from jitop.dtypes import as_dtype
>>> x = node("arg", (4, 3, 5), as_dtype("float32"), index=0)
>>> one = node("reduce", (5,), x.dtype, (node("arg", (3, 5), x.dtype, index=1),), op="sum", axes=(0,))
>>> batch_reduce(one, [(x, True)])
reduce[4, 5]:float32
"""
from __future__ import annotations

from jitop.graph.ir import Node, node

Source = tuple[Node, bool]  # a source and whether it is batched (a leading axis of the copies)


def copies(srcs: list[Source]) -> int:
    """H: the leading extent of the batched sources."""
    return next(n.shape[0] for n, batched in srcs if batched)


def lift(src: Source, rank: int) -> Node:
    """A batched source made `rank` + 1 dims by unit axes after the copies' axis, so that numpy's broadcasting
    (right-aligned) lines its copies up with an output of `rank` dims; a shared source as it is."""
    n, batched = src
    missing = rank + 1 - n.ndim
    if not batched or missing == 0:
        return n
    return node("reshape", (n.shape[0],) + (1,) * missing + tuple(n.shape[1:]), n.dtype, (n,))


def _rebuilt(n: Node, src: tuple[Node, ...], h: int, **params) -> Node:
    return node(n.prim, (h,) + tuple(n.shape), n.dtype, src, n.weak, **dict(n.params, **params))


def batch_broadcasting(n: Node, srcs: list[Source]) -> Node:
    """ufunc, where, cast, copy: the sources broadcast against each other as numpy does."""
    return _rebuilt(n, tuple(lift(s, n.ndim) for s in srcs), copies(srcs))


def batch_broadcast(n: Node, srcs: list[Source]) -> Node:
    return _rebuilt(n, (lift(srcs[0], n.ndim),), copies(srcs))


def batch_reshape(n: Node, srcs: list[Source]) -> Node:
    return _rebuilt(n, (srcs[0][0],), copies(srcs))  # row-major: the copies' axis outermost stays outermost


def batch_transpose(n: Node, srcs: list[Source]) -> Node:
    return _rebuilt(n, (srcs[0][0],), copies(srcs), perm=(0,) + tuple(p + 1 for p in n.param("perm")))


def batch_index(n: Node, srcs: list[Source]) -> Node:
    spec = tuple(shifted_entry(e) for e in n.param("spec"))
    return _rebuilt(n, (srcs[0][0],), copies(srcs), spec=(("slice", 0, 1, 0),) + spec)


def shifted_entry(entry: tuple) -> tuple:
    """An index entry with its output axis one further (a leading axis was added before it)."""
    return entry if entry[0] == "int" else entry[:3] + (entry[3] + 1,)


def batch_reduce(n: Node, srcs: list[Source]) -> Node:
    return _rebuilt(n, (srcs[0][0],), copies(srcs), axes=tuple(a + 1 for a in n.param("axes")))


def batch_argreduce(n: Node, srcs: list[Source]) -> Node:
    return _rebuilt(n, (srcs[0][0],), copies(srcs), axis=n.param("axis") + 1)


def batch_concat(n: Node, srcs: list[Source]) -> Node | None:
    if not all(batched for _, batched in srcs):
        return None  # a shared part would have to be repeated per copy
    return _rebuilt(n, tuple(s for s, _ in srcs), copies(srcs), axis=n.param("axis") + 1)


def batch_take(n: Node, srcs: list[Source]) -> Node | None:
    (src, batched), (ind, ind_batched) = srcs
    if ind_batched or not batched:
        return None  # indices per copy would need a gather of its own
    return _rebuilt(n, (src, ind), copies(srcs), axis=n.param("axis") + 1)


def batch_matmul(n: Node, srcs: list[Source]) -> Node:
    """A batched matmul: the copies' axis leads the batch dims (numpy broadcasts the batch dims of a @ b)."""
    return _rebuilt(n, tuple(lift(s, n.ndim) for s in srcs), copies(srcs))
