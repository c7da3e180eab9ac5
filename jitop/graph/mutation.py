"""In-place assignment to traced arrays (`a[i] = v`, `a += b`), recorded as functional updates.

numpy code writes into arrays: an output filled row by row, `x -= x.max(axis=-1, keepdims=True)`, a cache row
set in place. A graph has no memory, so an assignment gives the tracer a new node, its old value with the
region replaced (an 'update' node; torch.compile's functionalization does the same), and what numpy's aliasing
makes visible is kept:
- a view made by basic indexing (`row = x[i]`, `x[:, 1:]`) is derived again from its base after the base
  changes, and writing into one writes its base;
- an argument written in place gets its new value in the caller's array (jitop.graph.writeback: a given row
  written before the kernel, a computed one copied in after it, by the native entry where it can);
- any other tracer that may share the changed memory (a reshape or transpose of it, an alias jitop does not
  follow) is marked stale: a trace that goes on to use one falls back to numpy rather than compute from the
  old value. Writing through such a view, or into a captured global array, falls back too.

Outside a trace that tracks assignments (jitop.kernel's) an assignment is not supported.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from typing import Any, Iterable, Iterator

import numpy as np

from jitop.errors import Unsupported
from jitop.graph import advanced, indexing, shapes as sh
from jitop.graph.ir import Node, node, toposort
from jitop.graph.tracer import Tracer, as_node

# primitives whose result reads its source's memory as it is (numpy returns views for them)
_VIEW_PRIMS = frozenset({"index", "reshape", "transpose", "broadcast"})

_IN_PLACE_UFUNCS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.true_divide,
                    "floordiv": np.floor_divide, "mod": np.remainder, "pow": np.power, "and": np.bitwise_and,
                    "or": np.bitwise_or, "xor": np.bitwise_xor, "lshift": np.left_shift, "rshift": np.right_shift}

_state = threading.local()


class Tracking:
    """One trace's record of what its assignments need: the live tracers (which may alias what changes), the
    basic-index views (view, base, key) in the order they were made, and the arguments written (argument
    index -> the tracer holding its value). Also the integer dtypes each Python int argument met in a ufunc
    (argument index -> dtype names): numpy checks the value at the operation, whether or not its result is
    used, so the call checks them even where the graph dropped the operation (an empty region assigned); and nodes
    computed for their checks alone (`note_check`)."""

    def __init__(self) -> None:
        self.live: weakref.WeakValueDictionary[int, Tracer] = weakref.WeakValueDictionary()
        self.views: dict[int, tuple[Tracer, Tracer, Any]] = {}  # id(view) -> (view, base, key), in order
        self.written: dict[int, Tracer] = {}
        self.serial = itertools.count()  # tells apart nodes that are equal but not the same memory
        self.python_ints: dict[int, set[str]] = {}
        self.checks: list[Node] = []  # nodes computed for their run-time checks alone (results of their own)

    def view_of(self, t: Tracer) -> tuple[Tracer, Any] | None:
        seen = self.views.get(id(t))
        return None if seen is None else seen[1:]


@contextlib.contextmanager
def tracking() -> Iterator[Tracking]:
    """with tracking() as t: ... -- assignments to tracers made inside are recorded in t."""
    saved = getattr(_state, "tracking", None)
    _state.tracking = t = Tracking()
    try:
        yield t
    finally:
        _state.tracking = saved


def _current() -> Tracking | None:
    return getattr(_state, "tracking", None)


def note_tracer(t: Tracer) -> None:
    """A new tracer: it may alias memory an assignment changes later."""
    tracking_now = _current()
    if tracking_now is not None:
        tracking_now.live[id(t)] = t


def note_view(view: Tracer, base: Tracer, key: Any) -> None:
    """`view` is base[key] (a basic index): numpy's view of base's memory."""
    tracking_now = _current()
    if tracking_now is not None:
        tracking_now.views[id(view)] = (view, base, key)


def note_python_int(index: int, dtype: str) -> None:
    """The Python int argument `index` met integer dtype `dtype` in a ufunc (numpy's OverflowError beyond it)."""
    tracking_now = _current()
    if tracking_now is not None:
        tracking_now.python_ints.setdefault(index, set()).add(dtype)


def note_check(n: Node) -> None:
    """`n` is computed for its run-time checks (numpy's IndexError for indices of an empty region, which no
    element of the result reads)."""
    tracking_now = _current()
    if tracking_now is not None:
        tracking_now.checks.append(n)


def fresh(n: Node) -> Node:
    """n as a node of its own (a new array: np.zeros, a copy), so an equal array made elsewhere is not taken
    for the same memory."""
    tracking_now = _current()
    if tracking_now is None:
        return n
    if n.prim == "broadcast":  # np.zeros's scalar broadcast stays one (passes match it: a padding's fill)
        return node("broadcast", n.shape, n.dtype, n.src, n.weak, fresh=next(tracking_now.serial))
    return node("copy", n.shape, n.dtype, (n,), fresh=next(tracking_now.serial))


def assign(t: Tracer, key: Any, value: Any) -> None:
    """t[key] = value, numpy's assignment: the value cast to t's dtype and broadcast over the region."""
    if t.node.weak:
        raise TypeError(f"'{t.python_type().__name__}' object does not support item assignment")
    if t.node.ndim == 0 and not t.array0d:
        raise TypeError(f"'numpy.{t.dtype.name}' object does not support item assignment")
    tracking_now = _current()
    if tracking_now is None:
        raise Unsupported("in-place assignment to an array outside jitop.kernel")
    if t.order is not None:
        raise Unsupported(f"in-place assignment to a {t.order.str} array (a non-native byte order)")
    mask = boolean_mask(key, t.node)
    if mask is not None:
        new = _masked(t.node, mask, value)
    elif advanced.has_index_arrays(key):
        new = advanced.assigned(t.node, key, value, _region_value)
    else:
        new = _updated(tracking_now, t.node, key, value)
    _commit(tracking_now, t, new)


def ufunc_at(ufunc: np.ufunc, a: Any, indices: Any, b: Any = None) -> None:
    """np.<ufunc>.at(a, indices, b): a's elements at the indices combined with b in place, unbuffered (a
    position named twice gets every value, in order); returns None, as numpy does."""
    if b is None:
        raise Unsupported(f"np.{ufunc.__name__}.at without values", "np.add.at(a, indices, values) compiles")
    if not isinstance(a, Tracer) or a.node.weak:
        raise Unsupported(f"np.{ufunc.__name__}.at into an array the kernel does not trace",
                          "make it with np.zeros & co. in the function, or pass it as an argument")
    tracking_now = _current()
    if tracking_now is None or a.order is not None or (a.node.ndim == 0 and not a.array0d):
        raise Unsupported(f"np.{ufunc.__name__}.at into this array (a scalar, a non-native byte order, or outside "
                          "jitop.kernel)")
    _commit(tracking_now, a, advanced.scattered(ufunc, a.node, indices, b, _region_value))


def _commit(tracking_now: Tracking, t: Tracer, new: Node) -> None:
    """t's memory now holds `new`: through its base if t is a view."""
    seen = tracking_now.view_of(t)
    if seen is not None:  # a view: its base's region takes the view's new value
        base, base_key = seen
        assign(base, base_key, Tracer(new, array0d=True))
        return
    _replace(tracking_now, t, new)


def in_place(t: Tracer, name: str, other: Any) -> Tracer:
    """t <op>= other (`x += y`): numpy's ufunc with out=t."""
    ufunc = _IN_PLACE_UFUNCS.get(name)
    if ufunc is None:
        raise Unsupported("in-place matrix product (x @= y)", "write x = x @ y instead")
    result = ufunc(t, other)
    if t.node.ndim == 0 and not t.array0d:
        return result  # a numpy scalar is immutable: x += y rebinds x
    return into(t, ufunc, (t, other), result)


def into(out: Tracer, ufunc: np.ufunc, inputs: tuple, result: Tracer, casting: str = "same_kind") -> Tracer:
    """numpy's ufunc(*inputs, out=out), given the ufunc's `result`: cast into out's dtype as `casting` allows and
    broadcast to out's shape (numpy's errors otherwise); returns out, as numpy does."""
    if not np.can_cast(result.dtype, out.dtype, casting=casting):
        ufunc(*map(sample, inputs), out=np.empty(0, out.dtype), casting=casting)  # raises numpy's error
        raise TypeError(f"Cannot cast ufunc '{ufunc.__name__}' output from {result.dtype!r} to {out.dtype!r} with "
                        f"casting rule {casting!r}")
    shape, target = tuple(result.node.shape), tuple(out.node.shape)
    if len(shape) > len(target) or not all(_one(a) or sh.provably_same(a, b)
                                           for a, b in zip(shape[::-1], target[::-1])):
        raise ValueError(f"non-broadcastable output operand with shape {tuple(out.shape)} doesn't match the "
                         f"broadcast shape {tuple(result.shape)}")
    assign(out, Ellipsis, result)
    return out


def sample(value: Any) -> Any:
    """An empty stand-in of `value` numpy casts as it casts value (the same ufunc loop, the same copyto rule): a
    Python scalar as it is (numpy checks its value), an array as an empty one of its dtype."""
    if isinstance(value, Tracer):
        return value.python_type()(0) if value.node.weak else np.empty(0, value.dtype)
    return value if np.ndim(value) == 0 else np.empty(0, np.asarray(value).dtype)


def _updated(tracking_now: Tracking, n: Node, key: Any, value: Any) -> Node:
    """The node of n after n[key] = value."""
    positions: list[Node] = []  # traced integer indices (`cache[t] = row`), read when the kernel runs
    spec, shape = indexing.basic_index(n, key, positions)
    for d, s in enumerate(spec):
        if s[0] == "at" and type(n.shape[d]) is int:  # numpy's wrap and IndexError, once per call
            positions[s[1]] = node("position", (), positions[s[1]].dtype, (positions[s[1]],), size=n.shape[d],
                                   axis=d)
    v = _region_value(value, n, tuple(shape))
    if any(type(d) is int and d == 0 for d in shape):
        return n  # an empty region: nothing changes
    region = tuple(shape[s[3]] for s in spec if s[0] == "slice")
    if len(shape) != len(region):  # the new axes (None) of the index hold nothing in n
        v = node("reshape", region, n.dtype, (v,))
    if all(s[0] == "slice" for s in spec) and indexing.whole(n, spec, list(region)):
        return node("copy", n.shape, n.dtype, (v,), fresh=next(tracking_now.serial))
    return node("update", n.shape, n.dtype, (n, v, *positions), spec=tuple(spec))


def boolean_mask(key: Any, n: Node) -> Node | None:
    """The node of a boolean-mask key (`a[a < 0] = 0`), or None for any other key. numpy's IndexError for a mask
    whose shape is not that of n's leading dimensions."""
    if not (isinstance(key, Tracer) and key.node.dtype.is_bool and not key.node.weak
            or isinstance(key, np.ndarray) and key.dtype == bool):
        return None
    mask = as_node(key)
    if mask.ndim > n.ndim:
        raise IndexError(f"too many indices for array: array is {n.ndim}-dimensional, but {mask.ndim} were indexed")
    for axis, (a, b) in enumerate(zip(n.shape, mask.shape)):
        if not sh.provably_same(a, b):
            if type(a) is int and type(b) is int:
                raise IndexError(f"boolean index did not match indexed array along axis {axis}; size of axis is "
                                 f"{a} but size of corresponding boolean axis is {b}")
            raise Unsupported("a boolean mask whose dimensions may differ from the array's")
    return mask


def _masked(n: Node, mask: Node, value: Any) -> Node:
    """The node of n after n[mask] = value: where the mask holds, the value (numpy's cast to n's dtype, broadcast
    over n's dimensions past the mask's). A value with one element per True of the mask (its length known only
    when the kernel runs) is not supported."""
    from jitop.graph.numpy_api import where  # numpy_api imports this module
    trailing = tuple(n.shape[mask.ndim:])
    given = tuple(value.node.shape) if isinstance(value, Tracer) else np.shape(value)
    if not trailing and len(given) > 1:
        raise TypeError("NumPy boolean array indexing assignment requires a 0 or 1-dimensional input, input has "
                        f"{len(given)} dimensions")
    if not _broadcasts(_without_leading_ones(given, trailing), trailing):  # (the checks _region_value makes)
        raise Unsupported("assigning an array through a boolean mask (one value per True element)",
                          "assign a scalar, or use np.where(mask, values, a)")
    v = _region_value(value, n, trailing)
    keep = node("reshape", tuple(mask.shape) + (1,) * len(trailing), mask.dtype, (mask,)) if trailing else mask
    return where(Tracer(keep), Tracer(v), Tracer(n)).node


def _region_value(value: Any, n: Node, shape: tuple) -> Node:
    """The assigned value as a node of the region's shape and n's dtype (numpy's casts and broadcasting; its
    errors for a constant value, found by numpy itself)."""
    dt = n.dtype
    if isinstance(value, Tracer):
        v = _traced_value(value, dt)
    else:
        if isinstance(value, (complex, np.complexfloating)) or np.asarray(value).dtype.kind not in "biuf":
            raise Unsupported(f"assigning a value of type {type(value).__name__}")
        arr = np.asarray(value)
        np.empty(arr.shape, dt.np)[...] = value  # numpy's own conversion errors (OverflowError, NaN to int)
        v = as_node(arr.astype(dt.np) if arr.ndim else dt.np.type(value))
        if v.dtype is not dt:  # a 0-d constant of another dtype
            v = node("cast", (), dt, (v,))
    given = tuple(v.shape)
    vshape = _without_leading_ones(given, shape)
    if len(vshape) != len(given):
        v = node("reshape", vshape, dt, (v,))
    if not _broadcasts(vshape, shape):
        raise ValueError(f"could not broadcast input array from shape {given} into shape {shape}")
    if len(vshape) == len(shape) and all(sh.provably_same(a, b) for a, b in zip(vshape, shape)):
        return v
    return node("broadcast", shape, dt, (v,))


def _without_leading_ones(vshape: tuple, shape: tuple) -> tuple:
    """A value's shape as numpy assigns it into a region of `shape`: its leading 1s beyond the region's rank dropped."""
    while len(vshape) > len(shape) and _one(vshape[0]):
        vshape = vshape[1:]
    return vshape


def _broadcasts(vshape: tuple, shape: tuple) -> bool:
    """Whether a value of shape `vshape` (leading 1s dropped) broadcasts over a region of `shape`."""
    return len(vshape) <= len(shape) and all(_fits(a, b) for a, b in zip(vshape[::-1], shape[::-1]))


def _one(d: Any) -> bool:
    return type(d) is int and d == 1


def _fits(d: Any, region: Any) -> bool:
    """Whether a value's dim d broadcasts over a region's dim (a symbolic one: decided and recorded, as
    broadcasting decides it)."""
    if _one(d) or sh.provably_same(d, region):
        return True
    if type(d) is int and type(region) is int:
        return False
    return sh.is_one(d) or sh.require_eq(region, d, "assignment")


def _traced_value(value: Tracer, dt: Any) -> Node:
    v = value.node
    if not v.weak or v.dtype.is_bool or dt.is_float or v.dtype is dt:
        return v if v.dtype is dt else node("cast", v.shape, dt, (v,))
    if v.dtype.is_int and dt.is_int:  # numpy refuses a Python int beyond the dtype: the call checks it
        return node("cast", (), dt, (v,), fit=True)
    raise Unsupported(f"assigning a Python {value.python_type().__name__} argument into a {dt.name} array "
                      "(numpy checks its value when it runs)", "mark the argument static")


def _replace(tracking_now: Tracking, root: Tracer, new: Node) -> None:
    """root's memory now holds `new`: its views are derived again, other tracers that may alias it go stale."""
    old = root.node
    if old.param("stale") is not None:
        raise Unsupported(_STALE)
    if _base(old) is not old:
        raise Unsupported("in-place assignment through a reshaped, transposed or broadcast view of an array",
                          "assign through an index of the array itself")
    if old.prim == "array_const":
        raise Unsupported("in-place assignment to a captured global array", "pass it as an argument")
    if old.prim == "arg":
        tracking_now.written[old.param("index")] = root
    for k, w in list(tracking_now.written.items()):
        if w.node is old:
            tracking_now.written[k] = root
    root.node = new
    derived = {id(root)}
    for view, base, key in tracking_now.views.values():
        if id(base) in derived:
            view.node = indexing.index_node(base.node, key)
            derived.add(id(view))
    for t in list(tracking_now.live.values()):
        if id(t) not in derived and _reaches(t.node, old):
            t.node = node("copy", t.node.shape, t.node.dtype, (t.node,), stale=next(tracking_now.serial))


def _creation(n: Node) -> bool:
    return n.prim == "broadcast" and n.src[0].prim == "const"


def _base(n: Node) -> Node:
    """The node whose memory n reads as it is (n itself unless n is a view)."""
    while n.prim in _VIEW_PRIMS and not _creation(n):
        n = n.src[0]
    return n


def _reaches(n: Node, old: Node) -> bool:
    """Whether n is `old` or a view of it."""
    while n is not old:
        if n.prim not in _VIEW_PRIMS or _creation(n):
            return False
        n = n.src[0]
    return True


_STALE = "reading an array after memory it shares changed in place (a reshape or transpose of it, or an alias " \
         "jitop does not follow)"


def check(results: Iterable[Node]) -> None:
    """Raise Unsupported if the results read a stale tracer's value."""
    if any(n.param("stale") is not None for n in toposort(results)):
        raise Unsupported(_STALE, "copy the array before the assignment, or assign through an index of it")
