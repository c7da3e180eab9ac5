"""Basic indexing of traced arrays: integers, slices (with steps), None and Ellipsis."""
from __future__ import annotations

from typing import Any

import numpy as np

from jitop.graph.ir import node
from jitop.graph.tracer import Tracer, Unsupported


def _normalise(key: Any, ndim: int) -> list[Any]:
    items = list(key) if isinstance(key, tuple) else [key]
    for it in items:
        if isinstance(it, (Tracer, np.ndarray, list)) or (isinstance(it, np.generic) and it.dtype == bool) \
                or isinstance(it, bool):
            raise Unsupported("advanced or boolean-mask indexing (data-dependent output)",
                              "use np.where(mask, a, 0) to keep the shape")
        if not (it is None or it is Ellipsis or isinstance(it, (int, np.integer, slice))):
            raise IndexError(f"only integers, slices (`:`), ellipsis (`...`) and numpy.newaxis (`None`) are valid "
                             f"indices, got {type(it).__name__}")
    if sum(it is Ellipsis for it in items) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(1 for it in items if it is not None and it is not Ellipsis)
    if used > ndim:
        raise IndexError(f"too many indices for array: array is {ndim}-dimensional, but {used} were indexed")
    if Ellipsis in items:
        k = items.index(Ellipsis)
        items[k:k + 1] = [slice(None)] * (ndim - used)
    return items


def getitem(t: Tracer, key: Any) -> Tracer:
    """t[key] as an 'index' node: each source dimension is fixed (int) or sliced onto an output axis."""
    n = t.node
    # numpy: a 0-d result is a scalar unless the key holds an Ellipsis (x[()] is a scalar, x[...] an array)
    array0d = key is Ellipsis or (isinstance(key, tuple) and any(k is Ellipsis for k in key))
    items = _normalise(key, n.ndim)
    items += [slice(None)] * (n.ndim - sum(1 for it in items if it is not None))
    spec, shape, dim = [], [], 0
    for it in items:
        if it is None:
            shape.append(1)
            continue
        size = n.shape[dim]
        if isinstance(it, slice):
            start, stop, step = it.indices(size)
            length = len(range(start, stop, step))
            spec.append(("slice", start, step, len(shape)))
            shape.append(length)
        else:
            k = int(it)
            if not -size <= k < size:
                raise IndexError(f"index {k} is out of bounds for axis {dim} with size {size}")
            spec.append(("int", k % size))
        dim += 1
    if all(s[0] == "slice" and s[1] == 0 and s[2] == 1 for s in spec) and tuple(shape) == n.shape:
        return t if t.array0d == array0d or n.ndim else Tracer(n, array0d=array0d, order=t.order)
    return Tracer(node("index", tuple(shape), n.dtype, (n,), spec=tuple(spec)), array0d=array0d, order=t.order)
