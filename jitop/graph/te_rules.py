"""Each primitive's lowering to tensor expressions, as jitop.graph.prims' table names them: an injective
primitive's expression emitter (its value at an output index, as index math on its sources) and the stage
builder of a primitive that gets a loop nest of its own (reductions, templates).

The rules reach the graph being lowered only through `Lowerer` (jitop.graph.to_te.ToTE implements it), so
this module imports nothing of to_te and the table can sit below it."""
from __future__ import annotations

import math
from typing import Any, Callable, Protocol

import numpy as np

from jitop import te
from jitop.graph.ir import Node
from jitop.graph.shapes import rep
from jitop.graph.ufuncs import UFUNCS, raise_if
from jitop.schedule.schedule import ceildiv
from jitop.te.expr import Expr, Op, as_expr, binary, const
from jitop.te.tensor import broadcast_index

Index = tuple[Expr, ...]
# A row reduction keeps per-lane partial results in up to four vector registers, so independent
# accumulator chains hide the add/max latency.
RFACTOR_VECTORS = 4
# a reduction over the first axis of a source this big (past L2) reads it in blocks of whole rows, one partial
# result per block (`_row_blocks`): each thread streams its rows in order, where a block of columns read down every
# row took a few hundred bytes per row (sum(axis=0) of 4096x4096 float32 2.55 -> 1.28 ms on Zen 5, numpy 1.9-2.1)
ROW_BLOCK_BYTES = 2 << 20
ROW_BLOCKS = 8  # at least; two per thread where there are more threads


class Lowerer(Protocol):
    """What a rule asks of the lowering of a graph (jitop.graph.to_te.ToTE)."""

    st: Any  # to_te.Stages: the rules record their stages' kinds and a reduction's partial stages
    vector_partials: bool  # row reductions keep per-lane partials (a CPU); False: plain (threads split them)
    target: Any  # jitop.target.Target: its threads decide how many blocks of rows a column reduction takes

    def at(self, n: Node, idx: Index) -> Expr: ...
    def fresh_name(self, base: str) -> str: ...
    def lanes(self, n: Node) -> int: ...
    def template(self, n: Node, readers: tuple) -> te.Tensor: ...


def unravel(flat: Expr, shape: tuple[int, ...]) -> Index:
    out = []
    for k, d in enumerate(shape):
        stride = math.prod(shape[k + 1:])
        v = flat if isinstance(stride, int) and stride <= 1 else flat // stride
        out.append(v % d if k > 0 else v)
    return tuple(out)


def ravel(idx: Index, shape: tuple[int, ...]) -> Expr:
    flat: Expr = const(0)
    for i, d in zip(idx, shape):
        flat = flat * d + i
    return flat


# ** stages of their own: reductions and templates **

def build_reduce(c: Lowerer, n: Node) -> te.Tensor:
    """A reduction over `axes`; over the last axis, per-lane partials first (`_rfactor`)."""
    (src,) = n.src
    return _reduction(c, n.shape, n, src, n.param("axes"), n.param("op"), lambda idx: c.at(src, idx))


def _reduction(c: Lowerer, shape: tuple, lanes_of: Node, src: Node, axes: tuple[int, ...], op: str,
               value: Callable[[Index], Expr], name: str | None = None) -> te.Tensor:
    """REDUCERS[op] of value(index into src) over `axes` of src, a stage of `shape`; over the last axis,
    per-lane partials first (`_rfactor`, as many lanes as a vector register holds of `lanes_of`'s dtype)."""
    last = src.ndim - 1
    # heuristics on a symbolic width decide at its representative size (lanes only where vectors are kept:
    # a GPU target has none)
    if c.vector_partials and axes and axes[-1] == last and op in REDUCERS and not _in_order(op, lanes_of) \
            and rep(src.shape[last]) >= 2 * (vec := c.lanes(lanes_of)):
        return _rfactor(c, shape, vec, src, axes, op, value, name or op)
    if c.vector_partials and _streams_rows(src, axes, shape, op, lanes_of):
        return _row_blocks(c, shape, src, op, value, name or op)
    rs = [te.reduce_axis((0, src.shape[a]), f"k{a}") for a in axes]

    def body(*i: Expr) -> Expr:
        return REDUCERS[op](value(_merge(i, rs, axes, src.ndim)), axis=rs)
    t = te.compute(shape, body, name=c.fresh_name(name or op))
    # reducing leading axes leaves the contiguous last axis as a data axis: vectorize along it
    c.st.kind[t] = "reduce" if last in axes else "reduce_outer"
    if last not in axes and max(axes, default=last) < last - 1:  # data axes after the last reduced one: one
        c.st.contiguous_tail[t] = last - max(axes)                # run of memory in the source (x.sum(axis=1))
    return t


def build_scan(c: Lowerer, n: Node) -> te.Tensor:
    """A running sum or product along an axis (np.cumsum / np.cumprod). Defined as out[..., j, ...] = the
    reduction of src[..., k, ...] over k <= j, which every pass reads as the usual reduction; the loop lowering
    runs it in one pass (jitop.tir.lower: a stage with the "scan" attribute), in numpy's order, one element
    after another, so float results are numpy's to the bit."""
    (src,) = n.src
    ax = n.param("axis")
    k = te.reduce_axis((0, src.shape[ax]), "k")
    op = n.param("op")

    def body(*i: Expr) -> Expr:
        return REDUCERS[op](c.at(src, i[:ax] + (k.var,) + i[ax + 1:]), axis=k, where=k.var <= i[ax])
    t = te.compute(n.shape, body, name=c.fresh_name(f"cum{op}"), attrs={"scan": op, "scan_axis": ax})
    c.st.kind[t] = "scan"
    return t


# an assignment through index arrays or an unbuffered update (np.add.at and its kin, jitop.graph.advanced): the
# reducer that combines the writes into a position, in order (an assignment's keeps the last)
SCATTER_REDUCERS = {"add": te.sum, "multiply": te.prod, "maximum": te.max, "minimum": te.min,
                    "assign": te.comm_reducer(lambda old, new: new, lambda dt: 0, "assign")}


def build_scatter(c: Lowerer, n: Node) -> te.Tensor:
    """a[idx] = v, np.add.at(a, idx, v) and its kin along the first axis: out[j, r...] combines a[j, r...] and, in
    order, every values[m, r...] whose position[m] is j. Defined as a reduction over k in [0, M]: k = 0 is the old element,
    k = m + 1 the m-th value where its position is j; the loop lowering runs it as numpy does (jitop.tir.lower:
    a stage with the "scatter" attribute): the old array copied, then each value combined into its row, in order,
    which the op's attributes give it as expressions (old, value and position at the loop variable m)."""
    old, positions, values = n.src
    k = te.reduce_axis((0, positions.shape[0] + 1), "k")
    m = te.var("m")
    reducer = SCATTER_REDUCERS[n.param("op")]
    parts: dict[str, Expr] = {}

    def body(j: Expr, *r: Expr) -> Expr:
        parts.update(old=c.at(old, (j,) + r), value=c.at(values, (m,) + r), position=c.at(positions, (m,)))
        before = te.max(k.var - 1, const(0, k.var.dtype))
        first = k.var == 0
        value = te.select(first, c.at(old, (j,) + r), c.at(values, (before,) + r))
        return reducer(value, axis=k, where=first | (c.at(positions, (before,)) == j))
    t = te.compute(n.shape, body, name=c.fresh_name(f"{n.param('op')}_at"), attrs={"scatter": (m, parts)})
    c.st.kind[t] = "scatter"
    return t


def _streams_rows(src: Node, axes: tuple[int, ...], shape: tuple, op: str, lanes_of: Node) -> bool:
    """Whether a reduction is over the first axis only of a source of constant shape past ROW_BLOCK_BYTES."""
    return axes == (0,) and src.ndim >= 2 and len(shape) == src.ndim - 1 and op in REDUCERS \
        and not _in_order(op, lanes_of) and all(type(d) is int for d in src.shape) \
        and math.prod(src.shape) * src.dtype.itemsize >= ROW_BLOCK_BYTES and src.shape[0] >= 4 * ROW_BLOCKS


def _row_blocks(c: Lowerer, shape: tuple, src: Node, op: str, value: Callable[[Index], Expr],
                name: str) -> te.Tensor:
    """reduce over the first axis = combine over ROW_BLOCKS partials, each reducing a block of whole rows in
    order (the partial stage, kind "reduce_rows": parallel over blocks, vectorized along the rows)."""
    rows, blocks = src.shape[0], max(ROW_BLOCKS, 2 * c.target.threads)
    per = -(-rows // blocks)
    r = te.reduce_axis((0, per), "r")

    def partial(block: Expr, *i: Expr) -> Expr:
        row = block * per + r.var
        return REDUCERS[op](value((row,) + i), axis=r, where=row < rows if per * blocks != rows else None)
    p = te.compute((blocks,) + tuple(shape), partial, name=c.fresh_name(f"{name}_blocks"))
    b = te.reduce_axis((0, blocks), "b")
    t = te.compute(shape, lambda *i: REDUCERS[op](p[(b.var,) + i], axis=b), name=c.fresh_name(name))
    c.st.kind[p], c.st.kind[t] = "reduce_rows", "reduce_outer"
    c.st.helpers.append(p)
    c.st.row_blocks[t] = p
    return t


def _in_order(op: str, n: Node) -> bool:
    """A float product is computed in numpy's order, one element after another: which partial product overflows
    to inf before another meets a zero decides between nan and 0 (a row of 257 values up to 10 with a 0 among
    them: numpy's running product is inf, then nan), and lanes of partials would decide otherwise."""
    return op == "prod" and not (n.dtype.is_int or n.dtype.is_bool)


def _rfactor(c: Lowerer, shape: tuple, vec: int, src: Node, axes: tuple[int, ...], op: str,
             value: Callable[[Index], Expr], name: str) -> te.Tensor:
    """reduce = combine over lanes of per-lane partials; the partial loop vectorizes over lanes."""
    width = src.shape[-1]
    vectors = max(1, min(RFACTOR_VECTORS, rep(width) // (2 * vec)))
    lanes = vectors * vec
    outer = te.reduce_axis((0, ceildiv(width, lanes)), "ko")
    others = [te.reduce_axis((0, src.shape[a]), f"k{a}") for a in axes[:-1]]
    tail = isinstance(width, Expr) or width % lanes != 0

    def partial(*i: Expr) -> Expr:
        data, lane = i[:-1], i[-1]
        col = outer * lanes + lane
        idx = _merge(data, others, axes[:-1], src.ndim - 1) + (col,)
        return REDUCERS[op](value(idx), axis=others + [outer], where=(col < width) if tail else None)
    p = te.compute(shape + (lanes,), partial, name=c.fresh_name(f"{name}_partial"))
    # combine the accumulator vectors lane-wise first (vectorized), then the lanes of one vector
    j = te.reduce_axis((0, vectors), "j")
    q = te.compute(shape + (vec,), lambda *i: REDUCERS[op](p[i[:-1] + (j * vec + i[-1],)], axis=j),
                   name=c.fresh_name(f"{name}_lanes"))
    lane = te.reduce_axis((0, vec), "lane")
    t = te.compute(shape, lambda *i: REDUCERS[op](q[i + (lane,)], axis=lane), name=c.fresh_name(name))
    c.st.kind[p], c.st.kind[q], c.st.kind[t] = "partial", "partial", "reduce"
    c.st.partials[t] = [q, p]
    return t


def build_argreduce(c: Lowerer, n: Node) -> te.Tensor:
    """argmax/argmin: the best value along the axis, then the first index holding it (or a NaN): two reductions
    as `build_reduce` makes them (per-lane partials along the last axis), the first a helper stage
    (`Stages.helpers`) the scheduler schedules as a node's reduction."""
    (src,) = n.src
    ax, width = n.param("axis"), src.shape[n.param("axis")]
    best_op = "max" if n.param("op") == "argmax" else "min"
    best = _reduction(c, n.shape, src, src, (ax,), best_op, lambda idx: c.at(src, idx))
    c.st.helpers.append(best)

    def first_index(idx: Index) -> Expr:
        x, at = c.at(src, idx), idx[:ax] + idx[ax + 1:]
        hit = (x == best[at]) | te.isnan(x) if src.dtype.is_float else x == best[at]
        return te.select(hit, idx[ax], as_expr(width))
    return _reduction(c, n.shape, n, src, (ax,), "min", first_index, n.param("op"))


def build_matmul(c: Lowerer, n: Node) -> te.Tensor:
    """The matmul template's stages; its operands read through the producers inlined into them."""
    a, b = n.src
    return c.template(n, (lambda ai, i, r: c.at(a, ai + (i, r)), lambda bi, r, j: c.at(b, bi + (r, j))))


def build_conv2d(c: Lowerer, n: Node) -> te.Tensor:
    """The conv2d template's stages; its operands read through the producers inlined into them."""
    x, w = n.src
    nchw = n.param("layout") == "NCHW"
    return c.template(n, (lambda b, ch, y, xx: c.at(x, (b, ch, y, xx) if nchw else (b, y, xx, ch)),
                          lambda o, i, r, s: c.at(w, (o, i, r, s))))


def _merge(data: Index, reduce_axes: list, axes: tuple[int, ...], ndim: int) -> Index:
    """A source index from the output's data index and the reduce axes at positions `axes`."""
    it, out = iter(data), []
    for d in range(ndim):
        out.append(reduce_axes[axes.index(d)].var if d in axes else next(it))
    return tuple(out)


REDUCERS: dict[str, te.Reducer] = {
    "sum": te.sum, "prod": te.prod, "max": te.max, "min": te.min, "all": te.min, "any": te.max,
    # NaN is the identity of fmax/fmin (they ignore it), so an all-NaN slice stays NaN as in numpy
    "fmax": te.comm_reducer(UFUNCS["fmax"], lambda dt: np.nan if dt.is_float else np.iinfo(dt.np).min, "fmax"),
    "fmin": te.comm_reducer(UFUNCS["fmin"], lambda dt: np.nan if dt.is_float else np.iinfo(dt.np).max, "fmin"),
    # a max whose NaN handling is unspecified (one maxps per vector): for a shift like softmax's, where a
    # NaN in the row makes the result NaN anyway
    "shift_max": te.comm_reducer(lambda a, b: te.select(a > b, a, b),
                                 lambda dt: -np.inf if dt.is_float else np.iinfo(dt.np).min, "shift_max"),
}


# ** injective nodes as index math **

def emit_const(c: Lowerer, n: Node, idx: Index) -> Expr:
    return const(n.param("value"), n.dtype)


def emit_dim(c: Lowerer, n: Node, idx: Index) -> Expr:
    return te.cast(n.param("expr"), n.dtype)  # a size: an expression of the kernel's shape symbols


def emit_ufunc(c: Lowerer, n: Node, idx: Index) -> Expr:
    # a constant operand is made in the loop dtype directly (a Python int may not fit int64)
    args = [const(s.param("value"), dt) if s.prim == "const" else
            te.cast(c.at(s, broadcast_index(s.shape, n.shape, idx)), dt)
            for s, dt in zip(n.src, n.param("in_dtypes"))]
    return te.cast(UFUNCS[n.param("name")](*args), n.dtype)


def emit_cast(c: Lowerer, n: Node, idx: Index) -> Expr:
    return te.cast(c.at(n.src[0], idx), n.dtype)


def emit_broadcast(c: Lowerer, n: Node, idx: Index) -> Expr:
    return c.at(n.src[0], broadcast_index(n.src[0].shape, n.shape, idx))


def emit_reshape(c: Lowerer, n: Node, idx: Index) -> Expr:
    src = n.src[0]
    groups = reshape_groups(tuple(n.shape), tuple(src.shape))
    if groups is None:
        return c.at(src, unravel(ravel(idx, n.shape), src.shape))
    src_idx: list[Expr] = []
    for outs, srcs in groups:  # each group's index on its own: a unit dim or a kept dim needs no div/mod
        if len(outs) == 1 and len(srcs) == 1:
            src_idx.append(idx[outs[0]])
        elif not outs:  # a unit dim of the source
            src_idx.append(const(0))
        elif srcs:
            src_idx.extend(unravel(ravel(tuple(idx[k] for k in outs), tuple(n.shape[k] for k in outs)),
                                   tuple(src.shape[k] for k in srcs)))
    return c.at(src, tuple(src_idx))


def reshape_groups(out: tuple, src: tuple) -> list[tuple[tuple[int, ...], tuple[int, ...]]] | None:
    """A reshape's axes in groups (output axes, source axes) of equal sizes, each as small as it can be: a unit
    dim alone, a dim both keep, or dims split or merged (constant sizes); None where symbolic sizes do not pair
    up one to one.

    >>> reshape_groups((4, 1, 20, 16), (4, 20, 16)), reshape_groups((6, 5), (2, 3, 5))
    ([((0,), (0,)), ((1,), ()), ((2,), (1,)), ((3,), (2,))], [((0,), (0, 1)), ((1,), (2,))])
    """
    def unit(d: Any) -> bool:
        return type(d) is int and d == 1

    groups, i, j = [], 0, 0
    while i < len(out) or j < len(src):
        if i < len(out) and unit(out[i]):
            groups.append(((i,), ()))
            i += 1
        elif j < len(src) and unit(src[j]):
            groups.append(((), (j,)))
            j += 1
        elif i == len(out) or j == len(src):
            return None
        elif out[i] is src[j] or type(out[i]) is int and type(src[j]) is int and out[i] == src[j]:
            groups.append(((i,), (j,)))
            i, j = i + 1, j + 1
        else:
            span = _equal_products(out, src, i, j)
            if span is None:
                return None
            groups.append((tuple(range(i, span[0])), tuple(range(j, span[1]))))
            i, j = span
    return groups


def _equal_products(out: tuple, src: tuple, i: int, j: int) -> tuple[int, int] | None:
    """The ends (i', j') of the shortest runs out[i:i'], src[j:j'] of constant sizes with equal products."""
    po = ps = 1
    i0, j0 = i, j
    while True:
        if po == ps and i > i0 and j > j0:
            return i, j
        if po <= ps and i < len(out) and type(out[i]) is int:
            po, i = po * out[i], i + 1
        elif ps < po and j < len(src) and type(src[j]) is int:
            ps, j = ps * src[j], j + 1
        else:
            return None


def emit_transpose(c: Lowerer, n: Node, idx: Index) -> Expr:
    perm = n.param("perm")
    src_idx = [None] * len(perm)
    for k, p in enumerate(perm):
        src_idx[p] = idx[k]
    return c.at(n.src[0], tuple(src_idx))


def emit_index(c: Lowerer, n: Node, idx: Index) -> Expr:
    src_idx = tuple(as_expr(s[1]) if s[0] == "int" else idx[s[3]] * s[2] + s[1] for s in n.param("spec"))
    return c.at(n.src[0], src_idx)


def emit_update(c: Lowerer, n: Node, idx: Index) -> Expr:
    """n[spec] = value (jitop.graph.mutation): the value's element where idx lies in the region, else the old
    one. The value's index is clamped into its shape, so neither side reads outside its array; with a
    symbolic region (possibly empty) the value is read only inside it."""
    old, value, *positions = n.src
    inside, at, bad = [], [], []
    for d, (i, s) in enumerate(zip(idx, n.param("spec"))):
        if s[0] == "int":
            inside.append(i == as_expr(s[1]))
            continue
        if s[0] == "at" and positions[s[1]].prim == "position":  # wrapped and checked once, by its own stage
            inside.append(i == c.at(positions[s[1]], ()))
            continue
        if s[0] == "at":  # a traced index: numpy's negative positions, and its IndexError beyond the axis
            p, size = c.at(positions[s[1]], ()), old.shape[d]
            inside.append(i == te.select(p < 0, p + size, p))
            bad.append((d, (p < -size) | (p >= size)))
            continue
        start, step, length = as_expr(s[1]), s[2], value.shape[len(at)]
        if _whole_axis(s, length, old.shape[d]):  # i is inside, and a valid index of the value as it is
            at.append(i)
            continue
        offset = i - start if step > 0 else start - i
        q = offset // abs(step) if abs(step) != 1 else offset
        inside += [offset >= 0, q < length] + ([offset % abs(step) == 0] if abs(step) != 1 else [])
        at.append(te.max(te.min(q, length - 1), const(0, q.dtype)))
    cond = inside[0]
    for part in inside[1:]:
        cond = cond & part
    new, kept = c.at(value, tuple(at)), c.at(old, idx)
    out = te.select(cond, new, kept) if all(type(d) is int for d in value.shape) else te.if_then_else(cond, new, kept)
    for d, beyond in bad:
        out = raise_if(out, beyond, _out_of_bounds(d, old.shape[d]))
    return out


def _whole_axis(s: tuple, length: Any, size: Any) -> bool:
    """Whether a slice entry of an update's spec covers its axis from the start, in order (no clamp needed:
    a clamped index would defeat the vectorized load of the value)."""
    return type(s[1]) is int and s[1] == 0 and s[2] == 1 and type(length) is int and type(size) is int \
        and length == size


def emit_position(c: Lowerer, n: Node, idx: Index) -> Expr:
    """Traced indices into an axis of `size` (an assignment's `cache[t]`, an index array's elements): numpy's
    negative positions wrapped, and its IndexError beyond the axis."""
    p, size, axis = c.at(n.src[0], idx), n.param("size"), n.param("axis")
    inside = te.select(p < 0, p + size, p)
    message = _out_of_bounds(axis, size)
    return raise_if(inside, (p < -size) | (p >= size), message)


def emit_concat(c: Lowerer, n: Node, idx: Index) -> Expr:
    ax = n.param("axis")
    parts, start = [], 0
    for s in n.src:
        if isinstance(s.shape[ax], Expr) or s.shape[ax]:  # a symbolic part that is empty is never selected
            parts.append((s, start))
        start += s.shape[ax]
    if not parts:
        return const(0, n.dtype)  # every part empty: so is the result
    return _select_part(c, parts, idx, ax)


def _select_part(c: Lowerer, parts: list[tuple[Node, int]], idx: Index, ax: int) -> Expr:
    """The value of the part (node, start) that holds idx[ax]: a balanced tree of selects on the parts'
    starts, so a concatenation of k arrays nests log2(k) deep, not k (the expression passes recurse)."""
    if len(parts) == 1:
        s, lo = parts[0]
        return c.at(s, idx[:ax] + (idx[ax] - lo,) + idx[ax + 1:])
    mid = len(parts) // 2
    return te.if_then_else(idx[ax] < parts[mid][1], _select_part(c, parts[:mid], idx, ax),
                           _select_part(c, parts[mid:], idx, ax))


def emit_where(c: Lowerer, n: Node, idx: Index) -> Expr:
    cond, a, b = (c.at(s, broadcast_index(s.shape, n.shape, idx)) for s in n.src)
    return te.if_then_else(cond, a, b)


def emit_iota(c: Lowerer, n: Node, idx: Index) -> Expr:
    return te.cast(idx[n.param("axis")], n.dtype)


def emit_copy(c: Lowerer, n: Node, idx: Index) -> Expr:
    return c.at(n.src[0], idx)


def emit_take(c: Lowerer, n: Node, idx: Index) -> Expr:
    """src at the position its int64 index gives (jitop.graph.take): clamped into the axis for the load in
    every mode, so an index that raises never reads outside src."""
    src, ind = n.src
    ax, k, mode = n.param("axis"), ind.ndim, n.param("mode")
    size = src.shape[ax]
    if type(size) is int and size == 0:
        return const(0, n.dtype)  # the tracer refused a non-empty take from it: there is no element
    i = c.at(ind, idx[ax:ax + k])
    if mode == "wrap":
        pos = binary(Op.FLOORMOD, i, size)
    else:
        pos = te.select(i < 0, i + size, i) if mode == "raise" else i
    # clip's clamp; for the others a no-op (a wrapped index is in range, a bad one raises) the bounds prover sees
    pos = te.max(te.min(pos, size - 1), const(0, i.dtype))
    value = c.at(src, idx[:ax] + (pos,) + idx[ax + k:])
    if mode != "raise":
        return value
    bad = (i < -size) | (i >= size)
    return raise_if(value, bad, _out_of_bounds(ax, size))


def _out_of_bounds(axis: int, size: Any) -> str:
    """numpy's IndexError for an index beyond an axis (a varying size is not known when the message is made)."""
    return f"IndexError: index out of bounds for axis {axis}" + (f" with size {size}" if type(size) is int else "")
