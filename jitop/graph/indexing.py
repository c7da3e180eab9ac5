"""Basic indexing of traced arrays: integers, slices (with steps), None and Ellipsis.

On a symbolic axis (jitop.graph.shapes) the start and length of a slice are expressions: a negative constant
bound is `size + k`; a bound that may lie beyond the axis is clamped as the hints decide (recorded: `x[:5]`
of a symbolic axis holds where `size >= 5`); an integer index is checked in range the same way. The spec
tuples then hold Exprs."""
from __future__ import annotations

from typing import Any

import numpy as np

from jitop import dtypes
from jitop.graph import shapes as sh
from jitop.graph.ir import Node, node
from jitop.graph.tracer import Tracer, Unsupported


def _normalise(key: Any, ndim: int, positions: bool = False) -> list[Any]:
    items = list(key) if isinstance(key, tuple) else [key]
    for it in items:
        if positions and _position(it):
            continue
        if isinstance(it, (Tracer, np.ndarray, list)) or (isinstance(it, np.generic) and it.dtype == bool) \
                or isinstance(it, bool):
            raise Unsupported("advanced or boolean-mask indexing (data-dependent output)",
                              "use np.where(mask, a, 0) to keep the shape")
        if not (it is None or it is Ellipsis or isinstance(it, (int, np.integer, slice, sh.SymInt))):
            raise IndexError(f"only integers, slices (`:`), ellipsis (`...`) and numpy.newaxis (`None`) are valid "
                             f"indices, got {type(it).__name__}")
    return expand_ellipsis(items, ndim)


def expand_ellipsis(items: list[Any], ndim: int) -> list[Any]:
    """A key's items with its Ellipsis as the full slices it stands for; numpy's IndexErrors for two ellipses and
    for more indices than dimensions (None indexes none)."""
    if sum(it is Ellipsis for it in items) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(1 for it in items if it is not None and it is not Ellipsis)
    if used > ndim:
        raise IndexError(f"too many indices for array: array is {ndim}-dimensional, but {used} were indexed")
    dots = [k for k, it in enumerate(items) if it is Ellipsis]  # (by identity: `in` would compare a tracer)
    if dots:
        items[dots[0]:dots[0] + 1] = [slice(None)] * (ndim - used)
    return items


def getitem(t: Tracer, key: Any) -> Tracer:
    """t[key] as an 'index' node: each source dimension is fixed (int) or sliced onto an output axis; one
    integer array among full slices (`a[rows]`, `a[:, cols]`) is numpy's gather along that axis (np.take).
    A result that is an array is a view of `t` in numpy: jitop.graph.mutation keeps it one."""
    gather = _gather(key)
    if gather is not None:
        from jitop.graph.take import take  # take builds on numpy_api, which imports this module
        axis, index = gather
        picked = take(t, index, axis=axis)
        from jitop.graph import mutation
        if _position(index):  # a traced integer scalar is an integer index to numpy: a view, not a copy
            mutation.note_view(picked, t, key)
            return picked
        return Tracer(mutation.fresh(picked.node), array0d=picked.array0d, order=picked.order)  # a copy, own memory
    mask = _mask_read(key)
    if mask is not None:
        from jitop.graph import masked
        return masked.read(t, mask)
    from jitop.graph import advanced
    if advanced.has_index_arrays(key, scalars=True):
        return advanced.getitem(t, key)
    n = t.node
    # numpy: a 0-d result is a scalar unless the key holds an Ellipsis (x[()] is a scalar, x[...] an array)
    array0d = key is Ellipsis or (isinstance(key, tuple) and any(k is Ellipsis for k in key))
    spec, shape = basic_index(n, key)
    if whole(n, spec, shape):
        if t.array0d == array0d or n.ndim:
            return t
        view = Tracer(n, array0d=array0d, order=t.order)
    else:
        view = Tracer(node("index", tuple(shape), n.dtype, (n,), spec=tuple(spec)), array0d=array0d, order=t.order)
    if array0d or view.node.ndim:  # an array (a numpy scalar is a copy)
        from jitop.graph import mutation
        mutation.note_view(view, t, key)
    return view


def _mask_read(key: Any) -> Any:
    """The mask of a key that is one boolean array (`x[x > 0]`), else None."""
    mask = key[0] if isinstance(key, tuple) and len(key) == 1 else key
    if isinstance(mask, Tracer) and mask.node.dtype.is_bool and not mask.node.weak and mask.node.ndim \
            or isinstance(mask, np.ndarray) and mask.dtype == bool and mask.ndim:
        return mask
    return None


def index_node(n: Node, key: Any) -> Node:
    """The node of n[key] for a key `getitem` keeps as a view (what it computes, without a tracer)."""
    gather = _gather(key)
    if gather is not None:
        from jitop.graph.take import gather as gathered, indices_node
        return gathered(n, indices_node(gather[1]), gather[0], "raise")
    spec, shape = basic_index(n, key)
    return n if whole(n, spec, shape) else node("index", tuple(shape), n.dtype, (n,), spec=tuple(spec))


def whole(n: Node, spec: list, shape: list) -> bool:
    """Whether an index selects all of n as it is (every axis a full slice, no new axis)."""
    return all(s[0] == "slice" and type(s[1]) is int and s[1] == 0 and s[2] == 1 for s in spec) \
        and all(sh.provably_same(a, b) for a, b in zip(shape, n.shape)) and len(shape) == n.ndim


def _position(it: Any) -> bool:
    """A traced integer scalar (a Python int argument, say) used as an index: a position known when it runs."""
    return isinstance(it, Tracer) and it.node.ndim == 0 and it.node.dtype.is_int and not it.node.dtype.is_bool \
        or _held(it) is not None


def _held(it: Any) -> Node | None:
    """The input node of a Python int argument traced as a size symbol, for `it` that symbol (an assignment at
    it then writes where the argument says, as at a traced int: before the kernel where it can)."""
    if not isinstance(it, sh.SymInt):
        return None
    return it.env.held.get(it.env.resolve(it.expr))


def basic_index(n: Node, key: Any, positions: list[Node] | None = None) -> tuple[list, list]:
    """(spec, shape) of n[key] for a basic index: each source dim's ("int", k) or ("slice", start, step, axis)
    (axis: its position in the result), and the result's shape (None's new axes included). With `positions`,
    a traced integer scalar in the key is ("at", j), its int64 node appended to positions as the j-th."""
    items = _normalise(key, n.ndim, positions is not None)
    items += [slice(None)] * (n.ndim - sum(1 for it in items if it is not None))
    spec, shape, dim = [], [], 0
    for it in items:
        if it is None:
            shape.append(1)
            continue
        size = n.shape[dim]
        if positions is not None and _position(it):
            if type(size) is int and size == 0:
                raise IndexError(f"index is out of bounds for axis {dim} with size 0")
            p = it.node if isinstance(it, Tracer) else _held(it)
            positions.append(p if p.dtype is dtypes.int64 else node("cast", (), dtypes.int64, (p,)))
            spec.append(("at", len(positions) - 1))
        elif isinstance(it, slice) and _constant(it, size):
            start, stop, step = it.indices(size)
            length = len(range(start, stop, step))
            spec.append(("slice", start, step, len(shape)))
            shape.append(length)
        elif isinstance(it, slice):
            start, step, length = _symbolic_slice(it, sh.sym(size))
            spec.append(("slice", sh.as_dim(start), step, len(shape)))
            shape.append(sh.as_dim(length))
        elif type(size) is int and not isinstance(it, sh.SymInt):
            k = int(it)
            if not -size <= k < size:
                raise IndexError(f"index {k} is out of bounds for axis {dim} with size {size}")
            spec.append(("int", k % size))
        else:
            spec.append(("int", sh.as_dim(_symbolic_index(it, sh.sym(size), dim))))
        dim += 1
    return spec, shape


def _gather(key: Any) -> tuple[int, Any] | None:
    """(position, array) of the one integer index array of `key` when every other item is a full slice `:`
    (numpy's advanced indexing is then np.take along that axis), else None."""
    items = key if isinstance(key, tuple) else (key,)
    arrays = [k for k, it in enumerate(items) if isinstance(it, (Tracer, np.ndarray, list))]
    if len(arrays) != 1:
        return None
    k = arrays[0]
    # compared part by part: a symbolic bound must not be asked whether it equals None
    full = [isinstance(it, slice) and it.start is None and it.stop is None and it.step is None for it in items]
    if not all(full[:k] + full[k + 1:]):
        return None
    index = items[k]
    kind = np.dtype(index.node.dtype.name).kind if isinstance(index, Tracer) else np.asarray(index).dtype.kind
    return (k, index) if kind in "iu" else None


def _constant(it: slice, size: Any) -> bool:
    return type(size) is int and not any(isinstance(v, sh.SymInt) for v in (it.start, it.stop, it.step))


def _step(it: slice) -> int:
    step = 1 if it.step is None else int(it.step)  # a symbolic step is specialised
    if step == 0:
        raise ValueError("slice step cannot be zero")
    return step


def _symbolic_slice(it: slice, size: Any) -> tuple[Any, int, Any]:
    """slice.indices on a symbolic axis (or with symbolic bounds): (start, step, length), ints or SymInts; the
    clamps the hints decide are recorded."""
    step = _step(it)

    def bound(b: Any, default: Any, lo: Any, hi: Any) -> Any:
        if b is None:
            return default
        b = b if isinstance(b, sh.SymInt) else int(b)
        if b < 0:
            b = b + size
            return lo if b < lo else b
        return hi if b > hi else b
    if step > 0:
        start, stop = bound(it.start, 0, 0, size), bound(it.stop, size, 0, size)
        length = _nonnegative((stop - start + step - 1) // step)
    else:
        start, stop = bound(it.start, size - 1, -1, size - 1), bound(it.stop, -1, -1, size - 1)
        length = _nonnegative((start - stop - step - 1) // -step)
    return start, step, length


def _nonnegative(n: Any) -> Any:
    """max(0, n) for a slice's length: proved, else as the hints decide (recorded: an empty slice of a
    symbolic axis is another kernel)."""
    return n if n >= 0 else 0


def _symbolic_index(it: Any, size: Any, dim: int) -> Any:
    """An integer index on a symbolic axis (or a symbolic index): in range as the hints decide (recorded)."""
    k = it if isinstance(it, sh.SymInt) else int(it)
    if not (-size <= k and k < size):
        raise IndexError(f"index {k!r} is out of bounds for axis {dim} with size {size!r}")
    return k + size if k < 0 else k
