"""Data a traced function reads from its module's globals and its closure, and the guards that keep a
compiled kernel in step with it.

numpy reads such a value on every call, so a kernel must not freeze it:

- a captured C-contiguous array is traced as a *live* constant: the kernel reads the array's own memory on
  each call (no copy), so an in-place update (W[:] = ...) is seen for free, and W.sum(), W.T, W[0] are
  traced computations on it, not numbers frozen at trace time;
- every captured name is guarded by what it was bound to at trace time: identity for such arrays, identity
  and contents for anything read as a value (Python scalars, strings, lists and tuples of them, arrays that
  cannot be shared: strided or byte-swapped ones, or any array the function used outside the tracer).
  A kernel checks its guards before each call (a dict lookup and an identity test per name) and is traced
  again when one fails (W or EPS was rebound).

Modules, functions and classes are not guarded (rebinding np or a helper is not followed), nor are values
reached through attributes (cfg.eps) or read by other functions the kernel calls.
"""
from __future__ import annotations

import dis
import math
import threading
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from jitop import dtypes
from jitop.errors import Unsupported
from jitop.graph.ir import Node, node

_DATA = (np.ndarray, np.generic, bool, int, float, complex, str, bytes, type(None), list, tuple, dict)
_EMPTY = object()


class LiveArray(np.ndarray):
    """A view of a captured array as a graph parameter: hashed and compared by identity (the node stands for
    whatever the array holds when the kernel runs), its buffer the array's own memory."""

    source: np.ndarray  # the captured array itself (its .base may be shared by other views)

    def __hash__(self) -> int:
        return id(self.source)

    def __eq__(self, other: Any) -> bool:  # type: ignore[override]
        return isinstance(other, LiveArray) and other.source is self.source

    def __ne__(self, other: Any) -> bool:  # type: ignore[override]
        return not self.__eq__(other)

    def __repr__(self) -> str:
        return f"<live {self.dtype}{list(self.shape)} array {id(self.source):#x}>"


class _Same:
    """A snapshot element compared by identity (an array read in place)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj


def shareable_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) and shareable(x)


def shareable(a: np.ndarray) -> bool:
    """An array a kernel can read in place: a supported, native, aligned, C-contiguous exact ndarray."""
    return (type(a) is np.ndarray and a.dtype.name in dtypes.DTYPES and a.dtype.isnative and a.flags.c_contiguous
            and a.flags.aligned)


def live_const(a: np.ndarray) -> Node:
    """The graph node of a captured array, read in place when the kernel runs."""
    view = a.view(LiveArray)
    view.source = a
    view.flags.writeable = False
    return node("array_const", a.shape, dtypes.as_dtype(a.dtype), data=view)


@dataclass
class Guard:
    """One captured name: where it is read (a globals dict or a closure cell), and what it was bound to."""

    where: Any          # dict (module globals) or types.CellType
    name: str
    value: Any          # the object seen while tracing
    snapshot: Any = _EMPTY  # a copy compared by contents (arrays, containers); _EMPTY: identity suffices

    def current(self) -> Any:
        if isinstance(self.where, dict):
            return self.where.get(self.name, _EMPTY)
        try:
            return self.where.cell_contents
        except ValueError:
            return _EMPTY

    def holds(self) -> bool:
        v = self.current()
        if self.snapshot is _EMPTY:
            return v is self.value
        return same_value(v, self.snapshot)

    def __repr__(self) -> str:
        return f"Guard({self.name})"


def holds(guards: list[Guard]) -> bool:
    for g in guards:
        if not g.holds():
            return False
    return True


def same_value(v: Any, snap: Any) -> bool:
    """v equals the snapshot exactly: same types, NaN equal to NaN, -0.0 not equal to 0.0, arrays byte for byte."""
    if type(snap) is _Same:
        return v is snap.obj
    if type(v) is not type(snap):
        return False
    if isinstance(snap, np.ndarray):
        return v.dtype == snap.dtype and v.shape == snap.shape and np.ascontiguousarray(v).tobytes() == snap.tobytes()
    if isinstance(snap, (list, tuple)):
        return len(v) == len(snap) and all(same_value(a, b) for a, b in zip(v, snap))
    if isinstance(snap, dict):
        return v.keys() == snap.keys() and all(same_value(v[k], snap[k]) for k in snap)
    if isinstance(snap, (float, np.floating, complex)):
        return bool(v == snap and math.copysign(1.0, v.real) == math.copysign(1.0, snap.real)) or \
            bool(v != v and snap != snap)
    try:
        return bool(v == snap)
    except Exception:  # noqa: BLE001 - an object that cannot compare is not the same value
        return False


def snapshot(v: Any) -> Any:
    """A copy of v for `same_value` (arrays copied, containers rebuilt, scalars as they are)."""
    if isinstance(v, np.ndarray):
        return np.array(v, copy=True)
    if isinstance(v, (list, tuple)):
        return type(v)(snapshot(x) for x in v) if type(v) in (list, tuple) else v
    if isinstance(v, dict):
        return {k: snapshot(x) for k, x in v.items()}
    return v


# ** what the function reads **

def code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    """`code` and every code object nested in it (comprehensions, lambdas, inner functions)."""
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from code_objects(c)


def _names(fn: Callable) -> tuple[set[str], set[str]]:
    """The global names fn's code (and its comprehensions/lambdas) loads, and those it assigns."""
    loads, stores = set(), set()
    for code in code_objects(fn.__code__):
        for ins in dis.get_instructions(code):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                loads.add(ins.argval)
            elif ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                stores.add(ins.argval)
    return loads, stores


def _stored_freevars(fn: Callable) -> set[str]:
    return {ins.argval for ins in dis.get_instructions(fn.__code__) if ins.opname in ("STORE_DEREF", "DELETE_DEREF")}


@dataclass
class Capture:
    """The function to trace (captured arrays bound to tracers of live constants), its guards, and the
    captured arrays the tracer reads in place wherever they appear (id -> node)."""

    fn: Callable
    guards: list[Guard]
    live: dict[int, Node]


def capture(fn: Callable, live: bool, make_tracer: Callable[[Node], Any], numpy: Any = None) -> Capture:
    """What `fn` reads from its globals and closure. live=False: arrays are guarded by contents and traced as
    the constants the function computes with (when it uses them outside the tracer, e.g. in an `if`). `numpy`:
    what the function sees for the numpy module it reads by name (numpy itself if None)."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType) or not isinstance(getattr(fn, "__globals__", None), dict):
        return Capture(fn, [], {})
    ns = fn.__globals__
    loads, stores = _names(fn)
    if stores or (fn.__closure__ and _stored_freevars(fn)):
        raise Unsupported("assigning a global or nonlocal variable (a side effect the compiled kernel would not "
                          "repeat on each call)", "return the value instead")
    guards: list[Guard] = []
    live_nodes: dict[int, Node] = {}
    bound: dict[str, Any] = {}

    def watch(where: Any, name: str, v: Any) -> Any:
        """The guard for one captured value; returns what the traced function should see instead (or v)."""
        if v is np and numpy is not None:
            return numpy
        if not isinstance(v, _DATA):
            return v
        if isinstance(v, np.ndarray) and live and shareable(v):
            guards.append(Guard(where, name, v))
            n = live_nodes.setdefault(id(v), live_const(v))
            return make_tracer(n)
        if type(v) in (list, tuple) and live and any(shareable_array(x) for x in v):
            # arrays inside are read in place (compared by identity), everything else by contents; the function
            # sees a copy of the sequence holding tracers of its arrays
            guards.append(Guard(where, name, v, type(v)(_Same(x) if shareable_array(x) else snapshot(x) for x in v)))
            return type(v)(make_tracer(live_nodes.setdefault(id(x), live_const(x))) if shareable_array(x) else x
                           for x in v)
        guards.append(Guard(where, name, v, snapshot(v)))
        return v

    for name in sorted(loads):
        if name in ns:
            seen = watch(ns, name, ns[name])
            if seen is not ns[name]:
                bound[name] = seen
    cells = {}
    if fn.__closure__:
        for name, cell in zip(code.co_freevars, fn.__closure__):
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            seen = watch(cell, name, v)
            if seen is not v:
                cells[name] = seen
    if not bound and not cells:
        return Capture(fn, guards, live_nodes)
    globs = {**ns, **bound} if bound else ns
    closure = fn.__closure__
    if cells:
        closure = tuple(types.CellType(cells[name]) if name in cells else cell
                        for name, cell in zip(code.co_freevars, fn.__closure__))
    traced = types.FunctionType(code, globs, fn.__name__, fn.__defaults__, closure)
    traced.__kwdefaults__ = fn.__kwdefaults__
    return Capture(traced, guards, live_nodes)


# ** the arrays the tracer reads in place, while a trace runs **

_state = threading.local()


def live_node(a: np.ndarray) -> Node | None:
    """The live node of a captured array during a trace, if it is one."""
    table = getattr(_state, "live", None)
    return table.get(id(a)) if table else None


class reading:
    """with reading(live): ... -- the tracer reads these captured arrays in place."""

    def __init__(self, live: dict[int, Node]):
        self.live = live

    def __enter__(self) -> None:
        self.saved = getattr(_state, "live", None)
        _state.live = self.live

    def __exit__(self, *exc: Any) -> None:
        _state.live = self.saved
