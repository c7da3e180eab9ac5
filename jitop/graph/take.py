"""np.take: a gather along one axis by an index array, constant or known only when the kernel runs.

A run-time index array (an argument, a captured array, a computed one) becomes a "take" node: element
`out[i..., j..., k...]` is `src[i..., pos(indices[j...]), k...]`, where the node's mode makes each index a
position in [0, n) as numpy does ("raise": index + n for a negative one, and an index outside [-n, n) makes
the call raise numpy's IndexError; "clip": clamped; "wrap": index mod n). Each mode also clamps the
position it loads from (to_te), so the kernel never reads outside the array, not even for an index that
raised. Constant indices are checked now by numpy itself and become positions: an int is an 'index' node
(basic indexing), an arithmetic run a slice, others a "take" of a constant array.
"""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from jitop import dtypes
from jitop.graph import shapes as sh
from jitop.graph.capture import live_node
from jitop.graph.ir import Node, node
from jitop.graph.numpy_api import _axes, array_node, cast_node, implements, order_of, ravel, wrap
from jitop.graph.tracer import Tracer, Unsupported, array_const

MODES = ("raise", "clip", "wrap")


@implements(np.take)
def take(a: Any, indices: Any, axis: Any = None, out: Any = None, mode: str = "raise") -> Tracer:
    """np.take(a, indices, axis, mode=mode) of traced or constant arrays; its value and errors are numpy's.

    >>> import jitop
    >>> f = jitop.kernel(lambda table, ids: np.take(table, ids, axis=0))
    >>> f(np.arange(6.0).reshape(3, 2), np.array([2, -3]))
    array([[4., 5.],
           [0., 1.]])
    """
    if out is not None:
        raise Unsupported("np.take(..., out=...)")
    if mode not in MODES:
        raise ValueError(f"clipmode must be one of 'clip', 'raise', or 'wrap' (got {mode!r})")
    src = array_node(a)
    if axis is None:  # numpy takes from the flattened array
        src, ax = ravel(wrap(src)).node, 0
    else:
        ax = _axes(operator.index(axis), src.ndim)[0]
    if isinstance(indices, Tracer) or (isinstance(indices, np.ndarray) and live_node(indices) is not None):
        r = gather(src, indices_node(indices), ax, mode)
        _check_if_empty(r, src, ax, mode)
    elif type(src.shape[ax]) is int:
        r = _take_constant(src, positions(indices, src.shape[ax], ax, mode), ax)
    elif np.ndim(indices) == 0 and mode == "raise":  # basic indexing checks it against the symbolic size
        r = wrap(src)[(slice(None),) * ax + (int(constant_indices(indices)),)].node
    else:  # a symbolic axis: the positions depend on its size, so the kernel makes them
        r = gather(src, array_const(constant_indices(indices)), ax, mode)
    return Tracer(r, order=order_of(a))


def positions(indices: Any, n: int, ax: int, mode: str) -> np.ndarray:
    """Constant indices as positions along an axis of size n, by numpy itself (its errors, axis included)."""
    grid = np.arange(n).reshape((1,) * ax + (n,))
    return np.take(grid, indices, axis=ax, mode=mode).reshape(np.shape(indices))


def indices_node(indices: Any) -> Node:
    """The int64 node of a run-time index array; numpy's TypeError for a dtype it does not take as indices."""
    n = array_node(indices)
    if not np.can_cast(n.dtype.np, np.intp, "same_kind"):
        raise _cast_error(n.dtype.np)
    return cast_node(n, dtypes.int64)


def constant_indices(indices: Any) -> np.ndarray:
    """Constant indices as numpy's take converts them: an array by its dtype (same_kind), a list or scalar
    elementwise."""
    if not isinstance(indices, np.ndarray):
        return np.array(indices, dtype=np.intp)
    if not np.can_cast(indices.dtype, np.intp, "same_kind"):
        raise _cast_error(indices.dtype)
    return indices.astype(np.intp)


def _cast_error(dt: np.dtype) -> TypeError:
    return TypeError(f"Cannot cast array data from {dt!r} to {np.dtype(np.intp)!r} according to the rule "
                     "'same_kind'")


def gather(src: Node, ind: Node, ax: int, mode: str) -> Node:
    """The "take" node: src along axis `ax` at the int64 indices `ind` (their shape replaces that axis)."""
    if sh.known_zero(src.shape[ax]) and not sh.known_zero(ind.size):
        raise IndexError("cannot do a non-empty take from an empty axes.")
    shape = src.shape[:ax] + ind.shape + src.shape[ax + 1:]
    return node("take", shape, src.dtype, (src, ind), axis=ax, mode=mode)


def _check_if_empty(r: Node, src: Node, ax: int, mode: str) -> None:
    """A result left empty by the other axes reads no index: numpy still checks them (its IndexError), so the
    kernel computes them for their checks alone."""
    from jitop.graph.mutation import note_check  # mutation builds on numpy_api too
    ind = r.src[1]
    if mode == "raise" and sh.known_zero(r.size) and not sh.known_zero(ind.size):
        note_check(node("position", ind.shape, ind.dtype, (ind,), size=src.shape[ax], axis=ax))


def _take_constant(src: Node, pos: np.ndarray, ax: int) -> Node:
    """src at constant positions `pos` (in range, numpy checked them) along `ax`: basic indexing where it
    can express them, else a "take" of a constant array ("clip" only bounds the loads)."""
    before = (slice(None),) * ax
    if pos.ndim == 0:
        return wrap(src)[before + (int(pos),)].node
    if pos.ndim == 1 and _arithmetic(pos):
        step = int(pos[1] - pos[0]) if pos.size >= 2 else 1
        start = int(pos[0]) if pos.size else 0
        return wrap(src)[before + (slice(start, start + step * pos.size, step),)].node
    return gather(src, array_const(pos.astype(np.int64)), ax, "clip")


def _arithmetic(pos: np.ndarray) -> bool:
    """The 1-D positions are a slice's: empty, or rising by one positive step."""
    if pos.size < 2:
        return True
    step = pos[1] - pos[0]
    return bool(step > 0 and np.array_equal(pos, pos[0] + step * np.arange(pos.size)))
