"""Views of a C-contiguous device array: where a basic index (ints, slices, `...`, None) or a reshape puts the
region it selects, when that region is itself C-contiguous (a device array has no strides). Pure index
arithmetic: no memory is touched here.

>>> contiguous_region((4, 5, 6), 4, (2, slice(1, 3)))   # a[2, 1:3]: 2 rows of 6, 3 rows of 6 in
(264, (2, 6))
>>> reshaped((2, 6), (3, -1))
(3, 4)
"""
from __future__ import annotations

import math
import operator
from typing import Any

from jitop.runtime.args import reshape_target

ADVANCED = ("arrays, lists and booleans as indices (numpy's advanced indexing) copy and gather: take .get() "
            "first, or index inside a @jitop.kernel function")


def contiguous_region(shape: tuple[int, ...], itemsize: int, index: Any) -> tuple[int, tuple[int, ...]]:
    """(byte offset, shape) of the region `array[index]` selects in a C-contiguous array of `shape`.
    IndexError for an index out of range or too many indices (numpy's messages); TypeError for an index that is
    not basic or whose region is not C-contiguous (it would need strides)."""
    picks = _per_axis(shape, index)
    out_shape = tuple(n for kind, _, n, _ in picks if kind != "int")
    axes = [(start, n, step) for kind, start, n, step in picks if kind != "new"]  # one per axis of the array
    if math.prod(out_shape) == 0:
        return 0, out_shape  # nothing is read: the view starts where the array does
    if not _contiguous(shape, axes):
        raise TypeError(f"index {_show(index)} of an array of shape {shape} selects elements that are not "
                        "contiguous in memory; a device array is a C-contiguous block: take .get() first, or "
                        "compute the selection in a @jitop.kernel function")
    return sum(start * stride for (start, _, _), stride in zip(axes, c_strides(shape, itemsize))), out_shape


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The byte strides of a C-contiguous array of `shape` (numpy's: a size-0 axis counts as 1)."""
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def reshaped(shape: tuple[int, ...], new: Any) -> tuple[int, ...]:
    """The shape numpy's reshape of an array of `shape` to `new` gives (one -1 inferred); ValueError otherwise."""
    dims = tuple(new[0]) if len(new) == 1 and not _is_int(new[0]) else tuple(new)
    try:
        dims = tuple(operator.index(d) for d in dims)
    except TypeError:
        raise TypeError(f"reshape takes ints (or one tuple of them), got {new!r}") from None
    return reshape_target(dims, math.prod(shape))


def _is_int(x: Any) -> bool:
    try:
        operator.index(x)
        return True
    except TypeError:
        return False


def _per_axis(shape: tuple[int, ...], index: Any) -> list[tuple[str, int, int, int]]:
    """Per axis of the array, and per None, what the index takes: ("int" | "slice" | "new", start, count, step)."""
    items = list(index) if type(index) is tuple else [index]
    for item in items:
        if isinstance(item, bool) or not (item is None or item is Ellipsis or type(item) is slice or _is_int(item)):
            raise TypeError(f"index {_show(index)}: {ADVANCED}")
    if items.count(Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(item is not None and item is not Ellipsis for item in items)
    if used > len(shape):
        raise IndexError(f"too many indices for array: array is {len(shape)}-dimensional, but {used} were indexed")
    fill = [slice(None)] * (len(shape) - used)  # what `...` stands for, or what follows the last index
    if any(item is Ellipsis for item in items):
        items = [x for item in items for x in (fill if item is Ellipsis else [item])]
    else:
        items += fill
    picks, axis = [], 0
    for item in items:
        if item is None:
            picks.append(("new", 0, 1, 1))
            continue
        n = shape[axis]
        if type(item) is slice:
            start, stop, step = item.indices(n)
            picks.append(("slice", start, len(range(start, stop, step)), step))
        else:
            i = operator.index(item)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
            picks.append(("int", i % n, 1, 1))
        axis += 1
    return picks


def _contiguous(shape: tuple[int, ...], axes: list[tuple[int, int, int]]) -> bool:
    """Whether the selected (start, count, step) per axis is one C-contiguous block (count > 0 everywhere):
    every axis after the last partly taken one is whole, that one steps by 1 (or takes one element), and every
    axis before it takes one element."""
    partial = [k for k, (start, n, _) in enumerate(axes) if (start, n) != (0, shape[k])]
    if not partial:
        return True  # every axis whole: the array itself
    last = partial[-1]
    _, n, step = axes[last]
    return (step == 1 or n == 1) and all(count == 1 for _, count, _ in axes[:last])


def _show(index: Any) -> str:
    items = index if type(index) is tuple else (index,)
    shown = []
    for item in items:
        if type(item) is slice:
            shown.append(":".join("" if x is None else str(x) for x in (item.start, item.stop, item.step))
                         .rstrip(":") or ":")
        else:
            shown.append("..." if item is Ellipsis else repr(item))
    return "[" + ", ".join(shown) + "]"
