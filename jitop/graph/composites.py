"""numpy functions that are compositions of others: np.select, np.roll, np.repeat, np.tile, np.linalg.norm,
np.diagonal, np.trace, np.diag, np.average (unweighted) and np.count_nonzero (along axes),
written as numpy's own implementations write them, on the primitives the tracer has (slices and concatenation,
broadcast and reshape, where, reductions), so fusion and symbolic sizes apply to them unchanged. Their values,
dtypes and errors are numpy's; what depends on data (a traced shift, one repeat count per element, the spectral
norm) is unsupported.

>>> import jitop
>>> f = jitop.kernel(lambda x: (np.roll(x, 1), np.repeat(x, 2), np.tile(x, 2), np.linalg.norm(x)))
>>> f(np.array([3.0, 4.0]))
(array([4., 3.]), array([3., 3., 4., 4.]), array([3., 4., 3., 4.]), np.float64(5.0))
"""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from jitop.graph import mutation, shapes as sh
from jitop.graph.numpy_api import (_axes, _cast, array_node, broadcast_shapes, broadcast_to, concatenate,
                                   expand_dims, full_node, implements, max_, mean, min_, ravel, reshape, size_value,
                                   sum_, where)
from jitop import dtypes
from jitop.graph.ir import node
from jitop.graph.take import take
from jitop.graph.tracer import Tracer, Unsupported

__all__ = ["average", "count_nonzero", "diag", "diagonal", "norm", "repeat", "roll", "select", "tile", "trace"]


def _static_int(value: Any, what: str, decides: str = "the result's shape") -> int:
    """A Python (or numpy) int that `decides` something the kernel is built with; a traced one is data the
    build cannot wait for."""
    if isinstance(value, Tracer):
        raise Unsupported(f"{what} computed by the kernel ({decides} would depend on it)",
                          "pass it as a static argument (static_argnames=)")
    return operator.index(value)


@implements(np.select)
def select(condlist, choicelist, default=0):
    if len(condlist) != len(choicelist):
        raise ValueError("list of cases must be same length as list of conditions")
    if len(condlist) == 0:
        raise ValueError("select with an empty condition list is not possible")
    # numpy's own select on empty stand-ins: its dtype (Python scalars weak) and its errors (a condition that is
    # not boolean, choices without a common dtype or that do not cast into it)
    dt = np.select([mutation.sample(c) for c in condlist], [mutation.sample(c) for c in choicelist],
                   mutation.sample(default)).dtype
    result = _cast(default, dt)
    for cond, choice in zip(reversed(condlist), reversed(choicelist)):  # the first true condition wins
        result = where(cond, _cast(choice, dt), result)
    shape = broadcast_shapes(*(tuple(array_node(x).shape) for x in (*condlist, *choicelist, default)))
    have = tuple(array_node(result).shape)
    if len(have) == len(shape) and all(sh.provably_same(a, b) for a, b in zip(have, shape)):
        return result
    return broadcast_to(result, shape).copy()  # a condition or choice wider than the others decides the shape


@implements(np.roll)
def roll(a, shift, axis=None):
    """Each axis's total shift as two slices swapped by a concatenation (axis=None: of the flattened array)."""
    if axis is None:
        return reshape(roll(ravel(a), shift, 0), tuple(array_node(a).shape))
    node = array_node(a)
    shifts: dict[int, int] = {}
    shifts_given = [_static_int(s, "np.roll's shift", "where the slices are cut") for s in np.atleast_1d(shift)]
    for s, ax in np.broadcast(np.asarray(shifts_given),
                              np.asarray(axis)):
        (ax,) = _axes(int(ax), node.ndim)
        shifts[ax] = shifts.get(ax, 0) + int(s)
    out = a
    for ax, s in shifts.items():
        n = out.shape[ax]
        if n == 0:
            continue
        s %= n
        if s == 0:
            continue
        head, tail = [slice(None)] * node.ndim, [slice(None)] * node.ndim
        head[ax], tail[ax] = slice(n - s, None), slice(None, n - s)
        out = concatenate([out[tuple(head)], out[tuple(tail)]], axis=ax)
    return out if out is not a else a.copy()


@implements(np.repeat)
def repeat(a, repeats, axis=None):
    """One count for every element: a new axis of that length broadcast after `axis`, then merged into it."""
    if isinstance(repeats, Tracer) and repeats.node.ndim == 0:
        _static_int(repeats, "np.repeat's count")  # (raises)
    counts = np.atleast_1d(repeats) if not isinstance(repeats, Tracer) else repeats
    if isinstance(counts, Tracer) or counts.size != 1:
        raise Unsupported("np.repeat with a count per element (the result's length depends on them)")
    r = int(counts.astype(np.intp).reshape(()))  # numpy converts the count unsafely: 2.5 and True are counts
    if r < 0:
        raise ValueError("repeats may not contain negative values.")
    if axis is None:
        a, axis = ravel(a), 0
    node = array_node(a)
    (axis,) = _axes(axis, node.ndim)
    shape = list(node.shape)
    spread = broadcast_to(expand_dims(a, axis + 1), tuple(shape[:axis + 1] + [r] + shape[axis + 1:]))
    return reshape(spread, tuple(shape[:axis] + [shape[axis] * r] + shape[axis + 1:]))


@implements(np.tile)
def tile(A, reps):
    """Each axis n with its count r interleaved as (r, n), broadcast, then merged: numpy's copies of the block."""
    reps = tuple(_static_int(r, "np.tile's reps") for r in (reps if np.ndim(reps) else (reps,)))
    node = array_node(A)
    shape = (1,) * (len(reps) - node.ndim) + tuple(node.shape)
    reps = (1,) * (len(shape) - len(reps)) + reps
    if any(r < 0 for r in reps):
        out = tuple(r * n for r, n in zip(reps, shape))
        if not sh.known_zero(node.size) or any(d < 0 for d in out):  # numpy repeats only a non-empty array
            raise ValueError("negative dimensions are not allowed")
        return full_node(out, 0, node.dtype)
    if all(r <= CONCATENATED_TILES for r in reps) and any(r > 1 for r in reps) and all(r > 0 for r in reps):
        return _tiled_by_concatenation(reshape(A, shape), reps)
    interleaved = [d for n in shape for d in (1, n)]
    spread = broadcast_to(reshape(A, tuple(interleaved)), tuple(d for r, n in zip(reps, shape) for d in (r, n)))
    return reshape(spread, tuple(r * n for r, n in zip(reps, shape)))


# np.tile with at most this many copies along every axis concatenates them: each vector of the result then
# reads one run of the source (the broadcast form reads it through a division per element: tile(x, (1, 2)) of
# 2048x1024 float32 took 0.54 ms, the concatenation 0.13, numpy 0.39)
CONCATENATED_TILES = 8


def _tiled_by_concatenation(a: Any, reps: tuple[int, ...]) -> Any:
    for axis, r in enumerate(reps):
        if r > 1:
            a = concatenate([a] * r, axis=axis)
    return a


@implements(np.linalg.norm)
def norm(x, ord=None, axis=None, keepdims=False):
    """numpy's branches: the 2-norm of everything as sqrt(dot), vector norms over one axis, matrix norms over two
    (but those of singular values); integers in float64."""
    if not array_node(x).dtype.is_float:
        x = _cast(x, np.float64)
    nd = array_node(x).ndim
    if axis is None and (ord is None or ord in ("f", "fro") and nd == 2 or ord == 2 and nd == 1):
        flat = ravel(x)
        r = np.sqrt(np.dot(flat, flat))
        return reshape(r, (1,) * nd) if keepdims else r
    axes = tuple(range(nd)) if axis is None else axis if isinstance(axis, tuple) else (int(axis),)
    if len(axes) == 1:
        return _vector_norm(x, ord, axes, keepdims)
    if len(axes) == 2:
        return _matrix_norm(x, ord, _axes(axes[0], nd) + _axes(axes[1], nd), keepdims)
    raise ValueError("Improper number of dimensions to norm.")


def _vector_norm(x: Any, ord: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    if isinstance(ord, np.generic):
        ord = ord.item()  # numpy raises |x| to it in place (`absx **= ord`): x's dtype stays
    if ord == np.inf:
        return max_(np.abs(x), axis, None, keepdims, initial=0)  # (numpy's: the norm of nothing is 0)
    if ord == -np.inf:
        return min_(np.abs(x), axis, None, keepdims)
    if ord == 0:
        return sum_(_cast(np.not_equal(x, 0), array_node(x).dtype.np), axis, None, None, keepdims)
    if ord == 1:
        return sum_(np.abs(x), axis, None, None, keepdims)
    if ord is None or ord == 2:
        return np.sqrt(sum_(np.multiply(x, x), axis, None, None, keepdims))
    if isinstance(ord, str):
        raise ValueError(f"Invalid norm order '{ord}' for vectors")
    total = sum_(np.power(np.abs(x), ord), axis, None, None, keepdims)
    return np.power(total, np.reciprocal(ord, dtype=array_node(total).dtype.np))


def _matrix_norm(x: Any, ord: Any, axes: tuple[int, int], keepdims: bool) -> Any:
    row, col = axes
    if row == col:
        raise ValueError("Duplicate axes given.")
    if ord in (1, -1):  # the largest (smallest) column sum (numpy's largest of none is 0)
        r = max_(sum_(np.abs(x), row), col - (col > row), initial=0) if ord == 1 else \
            min_(sum_(np.abs(x), row), col - (col > row))
    elif ord in (np.inf, -np.inf):  # the largest (smallest) row sum
        r = max_(sum_(np.abs(x), col), row - (row > col), initial=0) if ord == np.inf else \
            min_(sum_(np.abs(x), col), row - (row > col))
    elif ord in (None, "fro", "f"):
        r = np.sqrt(sum_(np.multiply(x, x), axes))
    elif ord in (2, -2, "nuc"):
        raise Unsupported(f"np.linalg.norm with ord={ord!r} (singular values)")
    else:
        raise ValueError("Invalid norm order for matrices.")
    if keepdims:
        shape = [1 if i in axes else d for i, d in enumerate(array_node(x).shape)]
        r = reshape(r, tuple(shape))
    return r


@implements(np.diagonal)
def diagonal(a, offset=0, axis1=0, axis2=1):
    """The diagonal of the two axes, as the last axis: a gather from the flattened pair, every (m + 1)th element
    from the first one the offset picks."""
    nd = array_node(a).ndim
    if nd < 2:
        raise ValueError("diag requires an array of at least two dimensions")
    (ax1,), (ax2,) = _axes(axis1, nd), _axes(axis2, nd)
    if ax1 == ax2:
        raise ValueError("axis1 and axis2 cannot be the same")
    offset = _static_int(offset, "np.diagonal's offset")
    pair = np.moveaxis(a, (ax1, ax2), (-2, -1))
    *lead, n, m = pair.shape  # (SymInts where symbolic: their arithmetic with tracers reads the sizes at run time)
    length = sh.sym_max(sh.sym_min(n, m - offset) if offset >= 0 else sh.sym_min(n + offset, m), 0)
    start = offset if offset >= 0 else -offset * m
    flat = reshape(pair, tuple(lead) + (n * m,))
    index = Tracer(node("iota", (sh.as_dim(length),), dtypes.int64, axis=0)) * (m + 1) + start
    return take(flat, index, axis=-1)


@implements(np.trace)
def trace(a, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    if out is not None:
        raise Unsupported("np.trace with out=")
    return sum_(diagonal(a, offset, axis1, axis2), -1, dtype)


@implements(np.diag)
def diag(v, k=0):
    nd = array_node(v).ndim
    if nd == 2:
        return diagonal(v, k)
    if nd != 1:
        raise ValueError("Input must be 1- or 2-d.")
    k = _static_int(k, "np.diag's k")
    length = np.shape(v)[0]  # (a SymInt where symbolic)
    n = sh.as_dim(length + abs(k))
    if sh.known_zero(length):
        return full_node((n, n), 0, array_node(v).dtype)  # nothing to take: all zeros
    i = Tracer(node("iota", (n, n), dtypes.int64, axis=0))
    j = Tracer(node("iota", (n, n), dtypes.int64, axis=1))
    at = np.minimum(i if k >= 0 else j, size_value(length - 1))  # (in range where it is not kept)
    return where(np.equal(np.subtract(j, i), k), take(v, at, mode="clip"), np.zeros((), array_node(v).dtype.np))


@implements(np.average)
def average(a, axis=None, weights=None, returned=False, *, keepdims=np._NoValue):
    """numpy's: the mean, or with weights sum(a * w) / sum(w) in numpy's result dtype, with numpy's
    ZeroDivisionError where a slice's weights sum to zero (checked when the kernel runs); `returned` adds the sum of
    the weights (the count without them), broadcast to the average's shape."""
    n = array_node(a)
    axes = None if axis is None else _axes(axis, n.ndim)
    keep = keepdims is not np._NoValue and bool(keepdims)
    if weights is None:
        avg = mean(a, axes, None, None, keep)
        scale = np.true_divide(size_value(n.size), size_value(array_node(avg).size))
        scale = _cast(scale, array_node(avg).dtype.np)
    else:
        w = _weights(weights, n, axes)
        kinds = (n.dtype.np,) + ((np.dtype("f8"),) if n.dtype.np.kind in "biu" else ())
        dt = np.result_type(*kinds, array_node(w).dtype.np)
        total = sum_(w, axes, dt, None, keep)
        scale = Tracer(node("ufunc", array_node(total).shape, array_node(total).dtype, (array_node(total),),
                            name="py_weights_sum", in_dtypes=(dt.name,)))
        avg = np.true_divide(sum_(np.multiply(a, w, dtype=dt), axes, None, None, keep), scale)
    if not returned:
        return avg
    shape = tuple(array_node(avg).shape)
    return avg, (scale if tuple(array_node(scale).shape) == shape else broadcast_to(scale, shape).copy())


def _weights(weights: Any, n: Any, axes: tuple[int, ...] | None) -> Any:
    """np.average's weights as an array that broadcasts against a; numpy's errors for one that does not fit."""
    w = array_node(weights)
    if sh.same_shape(tuple(w.shape), tuple(n.shape)):
        return weights
    if axes is None:
        raise TypeError("Axis must be specified when shapes of a and weights differ.")
    if not sh.same_shape(tuple(w.shape), tuple(n.shape[ax] for ax in axes)):
        raise ValueError("Shape of weights must be consistent with shape of a along specified axis.")
    moved = np.transpose(weights, tuple(np.argsort(axes))) if len(axes) > 1 else weights
    return reshape(moved, tuple((sh.sym(d) if ax in axes else 1) for ax, d in enumerate(n.shape)))


@implements(np.count_nonzero)
def count_nonzero(a, axis=None, *, keepdims=False):
    """The count of nonzero elements along axes, intp as numpy's (without axes numpy returns a Python int, which a
    kernel's result cannot be)."""
    if axis is None and not keepdims:
        raise Unsupported("np.count_nonzero without axis= (numpy returns a Python int)",
                          "use np.sum(a != 0), an int64 scalar, or pass axis=")
    return sum_(np.not_equal(a, 0), axis, np.intp, None, keepdims)
