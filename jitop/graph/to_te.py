"""Graph -> tensor expressions: one te stage per materialized node, injective nodes inlined as index math."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from jitop import te
from jitop.graph.fusion import INPUTS
from jitop.graph import tasks
from jitop.graph.ir import Node
from jitop.graph.shapes import rep
from jitop.graph.ufuncs import UFUNCS, raise_if
from jitop.target import Target
from jitop.te.expr import Expr, Op, as_expr, binary, const
from jitop.schedule.schedule import ceildiv
from jitop.te.tensor import broadcast_index
from jitop.tuner import registry
from jitop.tuner.task import Choice, Task

Index = tuple[Expr, ...]
# A row reduction keeps per-lane partial results in up to four vector registers, so independent
# accumulator chains hide the add/max latency.
RFACTOR_VECTORS = 4


@dataclass
class Stages:
    """The te tensors of a lowered graph and what the scheduler needs to know about them."""

    placeholders: dict[Node, te.Tensor] = field(default_factory=dict)
    tensors: dict[Node, te.Tensor] = field(default_factory=dict)      # materialized node -> its tensor
    partials: dict[te.Tensor, list[te.Tensor]] = field(default_factory=dict)  # reduction -> its partial stages,
    #                                                                              consumer first
    kind: dict[te.Tensor, str] = field(default_factory=dict)          # "injective" | "reduce" | "matmul" | ...
    # complex-out-fusable stage (matmul, conv2d) -> its template's schedule(s, epilogue or None)
    templates: dict[te.Tensor, Callable] = field(default_factory=dict)
    chosen: dict[te.Tensor, str] = field(default_factory=dict)  # template stage -> its config, for explain()


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


class ToTE:
    """Builds te tensors for the materialized nodes of a graph; templated nodes (matmul, conv2d) with the
    config picked for their task."""

    def __init__(self, materialized: dict[Node, str], target: Target, choices: dict[Node, tuple[Task, Choice]]):
        self.materialized, self.target, self.choices = materialized, target, choices
        self.st = Stages()
        self.names: dict[str, int] = {}
        self.packed: dict[Node, list[te.Tensor]] = {}  # templated node -> its prepacked weights (inputs)

    def _vector(self, n: Node) -> int:
        """Lanes of one vector register of the Target for n's dtype."""
        return self.target.lanes(n.dtype.itemsize)

    def _name(self, base: str) -> str:
        k = self.names.get(base, 0)
        self.names[base] = k + 1
        return f"{base}_{k}" if k else base

    def placeholder(self, n: Node, name: str) -> te.Tensor:
        t = te.placeholder(n.shape, n.dtype, name)
        self.st.placeholders[n] = t
        return t

    # ** values at an index **
    def at(self, n: Node, idx: Index) -> Expr:
        if n in self.st.placeholders:
            return self.st.placeholders[n][idx]
        if n in self.materialized:
            return self.tensor(n)[idx]
        return EMIT[n.prim](self, n, idx)

    def tensor(self, n: Node) -> te.Tensor:
        if n not in self.st.tensors:
            self.st.tensors[n] = BUILD.get(n.prim, ToTE._injective)(self, n)
        return self.st.tensors[n]

    def _injective(self, n: Node) -> te.Tensor:
        name = self._name(n.param("name") if n.prim == "ufunc" else n.prim)
        t = te.compute(n.shape, lambda *i: EMIT[n.prim](self, n, i), name=name)
        self.st.kind[t] = "injective"
        return t

    # ** materialized bodies **
    def _reduce(self, n: Node) -> te.Tensor:
        (src,) = n.src
        axes = n.param("axes")
        op = n.param("op")
        last = src.ndim - 1
        # heuristics on a symbolic width decide at its representative size
        if axes and axes[-1] == last and rep(src.shape[last]) >= 2 * self._vector(n) and op in _REDUCERS:
            return self._rfactor(n, src, axes, op)
        rs = [te.reduce_axis((0, src.shape[a]), f"k{a}") for a in axes]

        def body(*i: Expr) -> Expr:
            return _REDUCERS[op](self.at(src, _merge(i, rs, axes, src.ndim)), axis=rs)
        t = te.compute(n.shape, body, name=self._name(op))
        # reducing leading axes leaves the contiguous last axis as a data axis: vectorize along it
        self.st.kind[t] = "reduce" if last in axes else "reduce_outer"
        return t

    def _rfactor(self, n: Node, src: Node, axes: tuple[int, ...], op: str) -> te.Tensor:
        """reduce = combine over lanes of per-lane partials; the partial loop vectorizes over lanes."""
        width = src.shape[-1]
        vectors = max(1, min(RFACTOR_VECTORS, rep(width) // (2 * self._vector(n))))
        lanes = vectors * self._vector(n)
        outer = te.reduce_axis((0, ceildiv(width, lanes)), "ko")
        others = [te.reduce_axis((0, src.shape[a]), f"k{a}") for a in axes[:-1]]
        tail = isinstance(width, Expr) or width % lanes != 0

        def partial(*i: Expr) -> Expr:
            data, lane = i[:-1], i[-1]
            col = outer * lanes + lane
            idx = _merge(data, others, axes[:-1], src.ndim - 1) + (col,)
            return _REDUCERS[op](self.at(src, idx), axis=others + [outer], where=(col < width) if tail else None)
        p = te.compute(n.shape + (lanes,), partial, name=self._name(f"{op}_partial"))
        # combine the accumulator vectors lane-wise first (vectorized), then the lanes of one vector
        vec = self._vector(n)
        j = te.reduce_axis((0, vectors), "j")
        q = te.compute(n.shape + (vec,), lambda *i: _REDUCERS[op](p[i[:-1] + (j * vec + i[-1],)], axis=j),
                       name=self._name(f"{op}_lanes"))
        lane = te.reduce_axis((0, vec), "lane")
        t = te.compute(n.shape, lambda *i: _REDUCERS[op](q[i + (lane,)], axis=lane), name=self._name(op))
        self.st.kind[p], self.st.kind[q], self.st.kind[t] = "partial", "partial", "reduce"
        self.st.partials[t] = [q, p]
        return t

    def _argreduce(self, n: Node) -> te.Tensor:
        (src,) = n.src
        ax, width = n.param("axis"), src.shape[n.param("axis")]
        best_op = "max" if n.param("op") == "argmax" else "min"
        k1 = te.reduce_axis((0, width), "k")
        best = te.compute(n.shape, lambda *i: _REDUCERS[best_op](self.at(src, _merge(i, [k1], (ax,), src.ndim)),
                                                                 axis=k1), name=self._name(best_op))
        k2 = te.reduce_axis((0, width), "k")

        def first_index(*i: Expr) -> Expr:
            x = self.at(src, _merge(i, [k2], (ax,), src.ndim))
            hit = (x == best[i]) | te.isnan(x) if src.dtype.is_float else x == best[i]
            return te.min(te.select(hit, k2.var, width), axis=k2)
        t = te.compute(n.shape, first_index, name=self._name(n.param("op")))
        self.st.kind[best], self.st.kind[t] = "reduce", "reduce"
        return t

    def _matmul(self, n: Node) -> te.Tensor:
        a, b = n.src
        return self._template(n, (lambda ai, i, r: self.at(a, ai + (i, r)), lambda bi, r, j: self.at(b, bi + (r, j))))

    def _conv2d(self, n: Node) -> te.Tensor:
        x, w = n.src
        nchw = n.param("layout") == "NCHW"
        return self._template(n, (lambda b, ch, y, xx: self.at(x, (b, ch, y, xx) if nchw else (b, y, xx, ch)),
                                  lambda o, i, r, s: self.at(w, (o, i, r, s))))

    def _template(self, n: Node, readers: tuple) -> te.Tensor:
        """The node's template computes it with the config picked for its task; its operands are read
        through `readers` (the producers inlined into them)."""
        task, choice = self.choices[n]
        template = registry.get(task.template)
        stages = template.compute(task.workload, choice.config, self.target, readers, name=self._name(task.template),
                                  binding=tasks.binding(n) or None, packed=self.packed.get(n, ()))
        out = stages.out
        self.st.kind[out] = task.template
        size = len(template.config_space(task.workload, self.target))
        self.st.chosen[out] = choice_line(out.name, task, choice, self.target, size)
        self.st.templates[out] = lambda s, epilogue=None: template.schedule(s, stages, task.workload, choice.config,
                                                                            self.target, epilogue)
        return out


def choice_line(label: str, task: Any, choice: Any, target: Any, size: int | None = None) -> str:
    """One line for explain(): a templated stage's task, the config picked for it and where it came from."""
    if size is None:
        size = len(registry.get(task.template).config_space(task.workload, target))
    return (f"{label}: template {task.template}, {choice.source} config {choice.config.to_json()} "
            f"(one of {size} in its space; task {task.key}" + (f"; {choice.note})" if choice.note else ")"))


def _merge(data: Index, reduce_axes: list, axes: tuple[int, ...], ndim: int) -> Index:
    """A source index from the output's data index and the reduce axes at positions `axes`."""
    it, out = iter(data), []
    for d in range(ndim):
        out.append(reduce_axes[axes.index(d)].var if d in axes else next(it))
    return tuple(out)


_REDUCERS: dict[str, te.Reducer] = {
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

def _emit_const(c: ToTE, n: Node, idx: Index) -> Expr:
    return const(n.param("value"), n.dtype)


def _emit_dim(c: ToTE, n: Node, idx: Index) -> Expr:
    return te.cast(n.param("expr"), n.dtype)  # a size: an expression of the kernel's shape symbols


def _emit_ufunc(c: ToTE, n: Node, idx: Index) -> Expr:
    # a constant operand is made in the loop dtype directly (a Python int may not fit int64)
    args = [const(s.param("value"), dt) if s.prim == "const" else
            te.cast(c.at(s, broadcast_index(s.shape, n.shape, idx)), dt)
            for s, dt in zip(n.src, n.param("in_dtypes"))]
    return te.cast(UFUNCS[n.param("name")](*args), n.dtype)


def _emit_cast(c: ToTE, n: Node, idx: Index) -> Expr:
    return te.cast(c.at(n.src[0], idx), n.dtype)


def _emit_broadcast(c: ToTE, n: Node, idx: Index) -> Expr:
    return c.at(n.src[0], broadcast_index(n.src[0].shape, n.shape, idx))


def _emit_reshape(c: ToTE, n: Node, idx: Index) -> Expr:
    src = n.src[0]
    return c.at(src, unravel(ravel(idx, n.shape), src.shape))


def _emit_transpose(c: ToTE, n: Node, idx: Index) -> Expr:
    perm = n.param("perm")
    src_idx = [None] * len(perm)
    for k, p in enumerate(perm):
        src_idx[p] = idx[k]
    return c.at(n.src[0], tuple(src_idx))


def _emit_index(c: ToTE, n: Node, idx: Index) -> Expr:
    src_idx = tuple(as_expr(s[1]) if s[0] == "int" else idx[s[3]] * s[2] + s[1] for s in n.param("spec"))
    return c.at(n.src[0], src_idx)


def _emit_concat(c: ToTE, n: Node, idx: Index) -> Expr:
    ax = n.param("axis")
    parts, start = [], 0
    for s in n.src:
        if isinstance(s.shape[ax], Expr) or s.shape[ax]:  # a symbolic part that is empty is never selected
            parts.append((s, start))
        start += s.shape[ax]
    if not parts:
        return const(0, n.dtype)  # every part empty: so is the result
    return _select_part(c, parts, idx, ax)


def _select_part(c: ToTE, parts: list[tuple[Node, int]], idx: Index, ax: int) -> Expr:
    """The value of the part (node, start) that holds idx[ax]: a balanced tree of selects on the parts'
    starts, so a concatenation of k arrays nests log2(k) deep, not k (the expression passes recurse)."""
    if len(parts) == 1:
        s, lo = parts[0]
        return c.at(s, idx[:ax] + (idx[ax] - lo,) + idx[ax + 1:])
    mid = len(parts) // 2
    return te.if_then_else(idx[ax] < parts[mid][1], _select_part(c, parts[:mid], idx, ax),
                           _select_part(c, parts[mid:], idx, ax))


def _emit_where(c: ToTE, n: Node, idx: Index) -> Expr:
    cond, a, b = (c.at(s, broadcast_index(s.shape, n.shape, idx)) for s in n.src)
    return te.if_then_else(cond, a, b)


def _emit_iota(c: ToTE, n: Node, idx: Index) -> Expr:
    return te.cast(idx[n.param("axis")], n.dtype)


def _emit_copy(c: ToTE, n: Node, idx: Index) -> Expr:
    return c.at(n.src[0], idx)


def _emit_take(c: ToTE, n: Node, idx: Index) -> Expr:
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
    return raise_if(value, bad, f"IndexError: index out of bounds for axis {ax} with size {size}")


EMIT: dict[str, Callable[[ToTE, Node, Index], Expr]] = {
    "copy": _emit_copy,
    "const": _emit_const, "dim": _emit_dim, "ufunc": _emit_ufunc, "cast": _emit_cast, "broadcast": _emit_broadcast,
    "reshape": _emit_reshape, "transpose": _emit_transpose, "index": _emit_index, "concat": _emit_concat,
    "where": _emit_where, "iota": _emit_iota, "take": _emit_take,
}
BUILD: dict[str, Callable[[ToTE, Node], te.Tensor]] = {
    "reduce": ToTE._reduce, "argreduce": ToTE._argreduce, "matmul": ToTE._matmul,
    "conv2d": ToTE._conv2d,
}
assert not (set(EMIT) & INPUTS)
