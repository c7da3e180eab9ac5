"""The traced graph: hash-consed array nodes (equal subgraphs are one object, so CSE is free).

A Node is an array value: its primitive, shape, dtype, inputs and hashable params. A dim is an int, or a
te `Expr` over shape symbols where the trace made it symbolic (jitop.graph.shapes): simplified on entry, so
equal dims are one object; hints (this call's sizes) are never stored in nodes.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import os
import struct
import weakref
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from jitop.dtypes import DType
from jitop.graph.shapes import Dim, as_dim
from jitop.te.expr import Expr


class ConstData:
    """The value of an array constant: a read-only, C-contiguous array that nothing writes (a copy of what
    the trace saw, or an array its owner handed over with `adopted`, which is not copied again). Node
    interning hashes a sample of its bytes (Python's hash of 100 MB of weights would be a pass over them; a
    repeated constant still compares in full), and the cache key its sha256, computed once.

    >>> a, b = ConstData.of(np.zeros(250, np.float32)), ConstData.of(np.zeros(250, np.float32))
    >>> hash(a) == hash(b) and a == b and a.digest == b.digest and not a.array.flags.writeable
    True
    """

    SAMPLE = 256  # bytes of the content the hash reads, spread evenly over it

    def __init__(self, array: np.ndarray):
        """Wraps `array` as it is (read-only, C-contiguous): build with `of`."""
        self.array = array
        self.bytes = memoryview(array).cast("B") if array.size else memoryview(b"")  # no cast of a 0 in a shape

    @staticmethod
    def of(a: np.ndarray) -> "ConstData":
        """The constant for `a`: the one `adopted` registered for this very array, else a private copy."""
        found = _ADOPTED.get(id(a))
        if found is not None and found.array is a:
            return found
        copy = np.array(a, order="C", copy=True)
        copy.flags.writeable = False
        return ConstData(copy)

    def __len__(self) -> int:
        return len(self.bytes)

    def __hash__(self) -> int:
        step = max(1, len(self) // self.SAMPLE)
        return hash((len(self), self.bytes[::step].tobytes(), self.bytes[-8:].tobytes()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConstData) and (self.array is other.array or len(self) == len(other) and bool(
            np.array_equal(np.frombuffer(self.bytes, np.uint8), np.frombuffer(other.bytes, np.uint8))))

    def __repr__(self) -> str:
        return f"ConstData({self.array.dtype}{list(self.array.shape)})"

    @functools.cached_property
    def digest(self) -> str:
        """sha256 of the bytes, as hex."""
        return hashlib.sha256(self.bytes).hexdigest()


_ADOPTED: dict[int, ConstData] = {}  # id(array) -> its constant, while an owner hands arrays over


@contextlib.contextmanager
def adopted(constants: Iterable[ConstData]) -> Iterator[None]:
    """Inside the block, a trace that meets the array of one of `constants` uses that constant as it is
    (`ConstData.of`), without a copy: for arrays their owner never writes (a loaded model's weights)."""
    added = [c for c in constants if _ADOPTED.setdefault(id(c.array), c) is c]
    try:
        yield
    finally:
        for c in added:
            _ADOPTED.pop(id(c.array), None)


def adopt(a: np.ndarray) -> ConstData | None:
    """A constant of `a` itself, made read-only (None unless `a` is a C-contiguous array of at least one dim):
    its owner promises never to write it."""
    if not isinstance(a, np.ndarray) or a.ndim == 0 or not a.flags.c_contiguous:
        return None
    a.flags.writeable = False
    return ConstData(a)


PARALLEL_DIGEST_BYTES = 32 << 20  # constants this large in all are hashed on every core (ResNet-50: 98 MB)


def digest_all(datas: Iterable[ConstData]) -> None:
    """Compute the digests of many constants, on every core when they are large in all (hashlib releases
    the GIL; the threads are joined before this returns, so none outlives it)."""
    todo = [d for d in dict.fromkeys(datas) if "digest" not in d.__dict__]
    workers = min(len(todo), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1, 8)
    if workers < 2 or sum(len(d) for d in todo) < PARALLEL_DIGEST_BYTES:
        return
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for d, digest in zip(todo, pool.map(lambda d: hashlib.sha256(d.bytes).hexdigest(), todo)):
            d.__dict__["digest"] = digest


class Node:
    """One array value of a traced function. Build with `node(...)`, never directly."""

    __slots__ = ("prim", "shape", "dtype", "src", "params", "weak", "_hash", "_key", "__weakref__")
    _intern: "weakref.WeakValueDictionary[tuple, Node]" = weakref.WeakValueDictionary()

    prim: str
    shape: tuple[Dim, ...]
    dtype: DType
    src: tuple["Node", ...]
    params: tuple
    weak: bool  # a Python scalar: promotes like one (NEP 50)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> Dim:
        """The number of elements: an int, or an Expr if a dim is symbolic."""
        n: Dim = 1
        for d in self.shape:
            n *= d
        return as_dim(n) if isinstance(n, Expr) else n

    def param(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"{self.prim}{list(self.shape)}:{self.dtype}"

    @property
    def key(self) -> str:
        """Stable content hash of the node and everything it depends on (computed once per node).

        >>> from jitop.dtypes import as_dtype
        >>> a = node("arg", (3,), as_dtype("float32"), index=0)
        >>> node("neg", (3,), a.dtype, (a,)).key == node("neg", (3,), a.dtype, (a,)).key
        True
        """
        if self._key is None:
            # inputs first, iteratively: a shared subgraph is hashed once and a deep chain
            # does not recurse (each node's sources already have their key when it is hashed)
            for n in toposort([self], skip=_has_key):
                object.__setattr__(n, "_key", _content_key(n))
        return self._key


def _has_key(n: Node) -> bool:
    return n._key is not None


def _content_key(n: Node) -> str:
    h = hashlib.sha256(f"{n.prim}|{n.shape}|{n.dtype}|{n.weak}|{_stable(n.params)}".encode())
    for s in n.src:
        h.update(s._key.encode())
    return h.hexdigest()


def _stable(params: tuple) -> str:
    return repr(tuple((k, data_key(v) if isinstance(v, ConstData) else v) for k, v in params))


def data_key(v: ConstData) -> str:
    """What a key holds for an array constant: its sha256, computed once per constant."""
    return "sha256:" + v.digest


def _exact(v: Any) -> Any:
    """A parameter as an interning key: -0.0 and 0.0 are equal but different constants; an expression by
    identity (Exprs are hash-consed, so equal ones are one object; comparing them with == would build a
    comparison, and a content hash names symbols only by name: another trace's `x_0` is another symbol)."""
    if isinstance(v, Expr):
        return ("expr", id(v))
    if type(v) is tuple and any(isinstance(x, (Expr, tuple)) for x in v):
        return tuple(_exact(x) for x in v)
    return ("float", struct.pack("<d", v)) if type(v) is float else v


def _dims_key(shape: tuple) -> tuple:
    # an Expr dim is keyed wrapped: an int never meets an Expr in a key comparison (whose truth would raise)
    return tuple(("sym", id(d)) if isinstance(d, Expr) else d for d in shape)  # hash-consed: identity


def _params_key(params: tuple) -> tuple:
    return tuple((k, _exact(v)) for k, v in params)


def same_op(a: Node, b: Node) -> bool:
    """Whether `a` and `b` apply the same primitive with the same parameters, giving the same shape and dtype
    (their sources aside).

    >>> from jitop.dtypes import as_dtype
    >>> x, y = (node("arg", (3,), as_dtype("float32"), index=k) for k in (0, 1))
    >>> same_op(node("copy", (3,), x.dtype, (x,)), node("copy", (3,), x.dtype, (y,))), same_op(x, y)
    (True, False)
    """
    return (a.prim == b.prim and a.dtype is b.dtype and a.weak == b.weak and len(a.src) == len(b.src)
            and _dims_key(a.shape) == _dims_key(b.shape) and _params_key(a.params) == _params_key(b.params))


def same_dims(a: tuple, b: tuple) -> bool:
    """Whether two shapes are the same dims (a symbolic dim by identity: equal expressions are one object)."""
    return _dims_key(a) == _dims_key(b)


def same_value(x: Any, y: Any) -> bool:
    """Whether two parameter values are the same (an expression by identity, -0.0 is not 0.0)."""
    return _exact(x) == _exact(y)


def node(prim: str, shape: Iterable[Any], dtype: DType, src: Iterable[Node] = (), weak: bool = False,
         **params: Any) -> Node:
    """The unique node for (prim, shape, dtype, src, params). Dims: ints (numpy integers too), or symbolic
    (an Expr or a SymInt, kept symbolic and simplified; one that folds to a constant is an int)."""
    src = tuple(src)
    ps = tuple(sorted(params.items()))
    shape = tuple(as_dim(d) for d in shape)
    key = (prim, _dims_key(shape), dtype, tuple(id(s) for s in src), _params_key(ps), weak)
    found = Node._intern.get(key)
    if found is not None and all(a is b for a, b in zip(found.src, src)):
        return found
    n = object.__new__(Node)
    for name, value in (("prim", prim), ("shape", shape), ("dtype", dtype), ("src", src), ("params", ps),
                        ("weak", weak), ("_hash", hash(key)), ("_key", None)):
        object.__setattr__(n, name, value)
    Node._intern[key] = n
    return n


def toposort(outputs: Iterable[Node], skip: Callable[[Node], bool] | None = None) -> list[Node]:
    """Every node the outputs depend on, inputs first; `skip(n)` true leaves out n and what only it reaches."""
    order: list[Node] = []
    seen: set[int] = set()
    stack = [(o, False) for o in outputs]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if id(n) in seen or (skip is not None and skip(n)):
            continue
        seen.add(id(n))
        stack.append((n, True))
        stack.extend((s, False) for s in reversed(n.src))
    return order


def substituted(outputs: list[Node], replace: dict[int, Node]) -> list[Node]:
    """The outputs with each node whose id is in `replace` replaced by its value there (readers rebuilt)."""
    new: dict[int, Node] = dict(replace)
    for n in toposort(outputs, skip=lambda m: id(m) in replace):
        src = tuple(new.get(id(s), s) for s in n.src)
        new[id(n)] = n if all(a is b for a, b in zip(src, n.src)) else \
            node(n.prim, n.shape, n.dtype, src, n.weak, **dict(n.params))
    return [new[id(o)] for o in outputs]


def consumers(order: list[Node]) -> dict[Node, list[Node]]:
    """Node -> the nodes that read it (each reader once)."""
    out: dict[Node, list[Node]] = {n: [] for n in order}
    for n in order:
        for s in dict.fromkeys(n.src):
            out[s].append(n)
    return out


def resolve_graph(env: Any, inputs: list[Node], results: list[Node]) -> tuple[list[Node], list[Node]]:
    """The graph with the trace's ties substituted (`env`: its jitop.graph.shapes.ShapeEnv): a symbol solved as
    an expression of earlier ones (`v_0 := k_0`) or a constant is replaced in every dim and parameter, so the
    kernel sees one symbol per independent size and the tied dims are checked at call time, not re-traced."""
    if not env.subst:
        return inputs, results
    new: dict[int, Node] = {}
    resolved: dict[int, Any] = {}  # id of a dim -> its resolved form (the nodes keep each dim alive meanwhile)

    def resolve(d: Any) -> Any:
        if not isinstance(d, Expr):
            return d
        k = id(d)
        if k not in resolved:
            resolved[k] = env.resolve(d)
        return resolved[k]

    def param(v: Any) -> Any:
        if isinstance(v, Expr):
            d = resolve(v)
            return as_dim(d) if isinstance(d, Expr) else d
        return tuple(param(x) for x in v) if type(v) is tuple else v

    for n in toposort(inputs + results):
        src = tuple(new[id(s)] for s in n.src)
        shape = [resolve(d) for d in n.shape]
        # an input holding a size symbol keeps it (its value is read on each call; a tie is a guard)
        new[id(n)] = node(n.prim, shape, n.dtype, src, n.weak, **{k: v if k == "holds" else param(v)
                                                                  for k, v in n.params})
    return [new[id(n)] for n in inputs], [new[id(n)] for n in results]
