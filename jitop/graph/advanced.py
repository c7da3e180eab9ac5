"""numpy's advanced indexing by integer arrays: reads (`x[rows, labels]`, a gather), assignments
(`a[idx] = v`, `onehot[np.arange(n), labels] = 1`, a scatter) and unbuffered updates (`np.add.at(a, idx, v)`).

The indexed axes are moved to the front when the index arrays are not adjacent (numpy then puts the broadcast
index dimensions first) and merged into one axis; the index arrays become one array of flat positions into it,
each wrapped and checked as numpy does (its IndexError beyond an axis). A read is then np.take along the merged
axis. An assignment and an unbuffered update (np.add.at, np.maximum.at, ...) are a "scatter" node along the
merged axis (moved first): the old array, then every value stored at (combined into) its position in numpy's
order, so a position named twice keeps the value written last (gets both values).

Other items of the key must be full slices `:` (or an Ellipsis); a boolean array among them is not supported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from jitop import dtypes
from jitop.graph import shapes as sh
from jitop.graph.capture import live_node
from jitop.graph.indexing import expand_ellipsis
from jitop.graph.ir import Node, node
from jitop.graph.tracer import Tracer, Unsupported, array_const

_FLOAT_INDEX = "arrays used as indices must be of integer (or boolean) type"


@dataclass(frozen=True)
class Plan:
    """How a key indexes an array: `perm` moves the indexed axes to the front (None: they are adjacent and stay),
    `first` is where they start after it, `count` how many there are, `flat` the flat positions into the merged
    axis (a Tracer, or a numpy array when every index is a constant along an axis of known size)."""

    perm: tuple[int, ...] | None
    first: int
    count: int
    flat: Any


def has_index_arrays(key: Any, scalars: bool = False) -> bool:
    """Whether the key holds an integer index array (traced, a numpy array or a list), numpy's advanced index;
    with `scalars`, a traced integer scalar counts as one (a read takes it so; an assignment at it is basic
    indexing's, jitop.graph.mutation)."""
    return any(_index_array(it) is not None or scalars and _traced_scalar(it)
               for it in (key if isinstance(key, tuple) else (key,)))


def getitem(t: Tracer, key: Any) -> Tracer:
    """t[key] for a key with integer index arrays (numpy's advanced indexing: a copy)."""
    from jitop.graph.take import take  # take builds on numpy_api, which imports this module's callers
    from jitop.graph.mutation import fresh
    plan = plan_of(t.node, key)
    moved = _moved(t.node, plan)
    _check_if_empty(plan, moved.shape[:plan.first] + moved.shape[plan.first + plan.count:])
    merged = _merged(moved, plan)
    # the positions are in range (checked): "clip" only bounds the load. Along an axis of size 1 that clamp folds
    # the positions away, and their checks with them: "raise" checks them again, which keeps them
    size = merged.shape[plan.first]
    mode = "raise" if type(size) is int and size == 1 else "clip"
    picked = take(Tracer(merged), plan.flat, axis=plan.first, mode=mode)
    return Tracer(fresh(picked.node), array0d=picked.array0d, order=picked.order)  # a copy: memory of its own


def assigned(n: Node, key: Any, value: Any, region_value: Any) -> Node:
    """The node of n after n[key] = value for a key with integer index arrays; `region_value(value, n, shape)`
    is the assignment's value as a node of the indexed region's shape (numpy's casts and broadcasting)."""
    return _scatter(n, plan_of(n, key), value, region_value, "assign")


def scattered(ufunc: np.ufunc, n: Node, key: Any, value: Any, region_value: Any) -> Node:
    """The node of n after np.<ufunc>.at(n, key, value): unbuffered, each value combined into the element its
    index names, in order (a position named twice gets both). `region_value` as for `assigned`."""
    from jitop.graph.te_rules import SCATTER_REDUCERS
    if ufunc.__name__ not in SCATTER_REDUCERS:
        raise Unsupported(f"np.{ufunc.__name__}.at", "np.add.at, np.multiply.at, np.maximum.at and np.minimum.at "
                          "compile")
    _check_loop_dtype(ufunc, n, value)
    if not isinstance(value, Tracer):  # numpy's ufunc.at makes an array of it and casts unsafely (300 into int8)
        value = np.asarray(value).astype(n.dtype.np)
    return _scatter(n, plan_of(n, key), value, region_value, ufunc.__name__)


def _scatter(n: Node, plan: Plan, value: Any, region_value: Any, op: str) -> Node:
    """n with the value's elements combined by `op` into the positions the plan names, in order: a "scatter" node
    along the merged indexed axis, moved first, and moved back."""
    from jitop.graph.numpy_api import reshape, transpose
    moved = _moved(n, plan)
    merged = _merged(moved, plan)
    head, tail = moved.shape[:plan.first], moved.shape[plan.first + plan.count:]
    index_shape = _shape(plan.flat)
    v = region_value(value, n, head + index_shape + tail)
    writes = sh.prod(index_shape)
    if sh.known_zero(writes) or any(sh.known_zero(d) for d in head + tail):
        _check_if_empty(plan, head + tail)
        return n  # nothing is written
    if sh.known_zero(sh.prod(moved.shape[plan.first:plan.first + plan.count])):
        raise IndexError(f"index is out of bounds for axis {plan.first} with size 0")  # (numpy: any index is)
    values = node("reshape", head + (writes,) + tail, n.dtype, (v,))
    front = (plan.first,) + tuple(d for d in range(merged.ndim) if d != plan.first)  # the indexed axis first
    rows, vals = (node("transpose", tuple(x.shape[d] for d in front), x.dtype, (x,), perm=front) if plan.first
                  else x for x in (merged, values))
    new = Tracer(node("scatter", rows.shape, n.dtype, (rows, _raveled(plan.flat), vals), op=op))
    if plan.first:
        new = transpose(new, tuple(np.argsort(front)))
    if plan.count != 1:
        new = reshape(new, tuple(sh.sym(d) for d in moved.shape))
    if plan.perm is not None:
        new = transpose(new, tuple(np.argsort(plan.perm)))
    # the array's new memory, not a view of the scatter's (a later assignment writes into it)
    return new.node if new.node.prim == "scatter" else node("copy", n.shape, n.dtype, (new.node,))


def _check_if_empty(plan: Plan, others: tuple) -> None:
    """Where the other axes leave the result empty, nothing reads the positions: numpy still checks them (its
    IndexError), so the kernel computes them for their checks alone."""
    from jitop.graph.mutation import note_check
    if isinstance(plan.flat, Tracer) and any(sh.known_zero(d) for d in others):
        note_check(plan.flat.node)


def _check_loop_dtype(ufunc: np.ufunc, n: Node, value: Any) -> None:
    """The update computes in n's dtype, as numpy's loop does for these operands; a loop in another dtype (a
    float64 value into a float32 array) is not supported. numpy's ufunc.at takes a Python float as float64 (not
    as a weak scalar). Integer sums and products wrap alike in any width."""
    given = value.node.dtype.np if isinstance(value, Tracer) else np.asarray(value).dtype
    loop = ufunc.resolve_dtypes((n.dtype.np, given, None), casting="unsafe")[-1]
    wraps = ufunc.__name__ in ("add", "multiply") and n.dtype.np.kind in "iu" and loop.kind in "iu"
    if loop != n.dtype.np and not wraps:
        raise Unsupported(f"np.{ufunc.__name__}.at computing in {loop} into a {n.dtype.name} array",
                          f"cast the values to {n.dtype.name}")


def plan_of(n: Node, key: Any) -> Plan:
    """The Plan of n[key]; numpy's IndexErrors for a bad key, Unsupported for the mixes jitop does not take."""
    items = _expanded(key, n.ndim)
    if any(isinstance(it, (Tracer, np.ndarray)) and _kind(it) == "b" for it in items):
        raise Unsupported("a boolean mask combined with index arrays", "use np.where to keep the shape")
    arrays = [d for d, it in enumerate(items) if _index_array(it) is not None or _scalar_index(it)]
    others = [it for d, it in enumerate(items) if d not in arrays]
    if not all(isinstance(it, slice) and it == slice(None) for it in others):
        raise Unsupported("integer-array indexing combined with a slice, a new axis or an ellipsis in the middle",
                          "index the array with the slices first, then with the arrays")
    adjacent = arrays == list(range(arrays[0], arrays[-1] + 1))
    perm = None if adjacent else tuple(arrays) + tuple(d for d in range(n.ndim) if d not in arrays)
    sizes = [n.shape[d] for d in arrays]
    positions = [_positions(items[d], size, d) for d, size in zip(arrays, sizes)]
    _check_broadcast(positions)
    flat = positions[0]
    for p, size in zip(positions[1:], sizes[1:]):
        flat = flat * (size if type(size) is int else sh.sym(size)) + p
    return Plan(perm, arrays[0] if adjacent else 0, len(arrays), flat)


def _expanded(key: Any, ndim: int) -> list[Any]:
    """The key's items, one per axis: its Ellipsis and the missing trailing axes as full slices."""
    items = [np.asarray(it) if isinstance(it, list) else it for it in (key if isinstance(key, tuple) else (key,))]
    if any(it is None for it in items):
        raise Unsupported("integer-array indexing with a new axis (None)", "add the axis to the result after")
    items = expand_ellipsis(items, ndim)
    return items + [slice(None)] * (ndim - len(items))


def _index_array(it: Any) -> Any:
    """The item as an index array (a traced array or a numpy array of integers; lists are numpy arrays by
    now), or None for any other item (a boolean mask too). numpy's IndexError for a float array."""
    if _traced_scalar(it):
        return None  # basic indexing's position, unless arrays are about
    if isinstance(it, list):
        it = np.asarray(it)
    if not isinstance(it, (Tracer, np.ndarray)):
        return None
    kind = _kind(it)
    if kind == "b":
        return None  # a boolean mask (plan_of refuses one among index arrays)
    if kind not in "iu":
        raise IndexError(_FLOAT_INDEX)
    return it


def _kind(it: Any) -> str:
    return np.dtype(it.node.dtype.name).kind if isinstance(it, Tracer) else it.dtype.kind


def _scalar_index(it: Any) -> bool:
    """An integer among index arrays (numpy takes it as a 0-d index array), traced or not."""
    return isinstance(it, (int, np.integer, sh.SymInt)) and not isinstance(it, bool) or _traced_scalar(it)


def _traced_scalar(it: Any) -> bool:
    return isinstance(it, Tracer) and it.node.ndim == 0 and it.node.dtype.is_int and not it.node.dtype.is_bool


def _positions(it: Any, size: Any, axis: int) -> Any:
    """An index's elements as positions in [0, size): numpy's own wrap and IndexError now for a constant along
    an axis of known size, else a "position" node that wraps and checks them when the kernel runs."""
    from jitop.graph.take import indices_node, positions
    # (an empty axis: numpy checks only the elements the broadcast index uses, perhaps none; the kernel checks)
    if not isinstance(it, Tracer) and (not isinstance(it, np.ndarray) or live_node(it) is None) \
            and type(size) is int and size > 0 and not isinstance(it, sh.SymInt):
        return np.asarray(positions(np.asarray(it, dtype=np.intp), size, axis, "raise"), np.int64)
    ind = indices_node(it if isinstance(it, (Tracer, np.ndarray)) else np.int64(int(it)))
    return Tracer(node("position", ind.shape, dtypes.int64, (ind,), size=size, axis=axis))


def _check_broadcast(positions: list[Any]) -> None:
    """numpy's IndexError for index arrays of shapes that do not broadcast together (of known shapes)."""
    shapes = [_shape(p) for p in positions]
    if all(type(d) is int for s in shapes for d in s):
        try:
            np.broadcast_shapes(*shapes)
        except ValueError:
            raise IndexError("shape mismatch: indexing arrays could not be broadcast together with shapes "
                             + " ".join(str(s).replace(" ", "") for s in shapes)) from None


def _shape(positions: Any) -> tuple:
    return tuple(positions.node.shape) if isinstance(positions, Tracer) else np.shape(positions)


def _moved(n: Node, plan: Plan) -> Node:
    if plan.perm is None:
        return n
    return node("transpose", tuple(n.shape[d] for d in plan.perm), n.dtype, (n,), perm=plan.perm)


def _merged(n: Node, plan: Plan) -> Node:
    """n with its indexed axes merged into one."""
    if plan.count == 1:
        return n
    f, c = plan.first, plan.count
    return node("reshape", n.shape[:f] + (sh.prod(n.shape[f:f + c]),) + n.shape[f + c:], n.dtype, (n,))


def _raveled(flat: Any) -> Node:
    """The flat positions as one 1-D int64 node."""
    positions = flat.node if isinstance(flat, Tracer) else array_const(np.asarray(flat, np.int64).reshape(-1))
    if positions.ndim == 1:
        return positions
    return node("reshape", (sh.prod(positions.shape),), dtypes.int64, (positions,))
