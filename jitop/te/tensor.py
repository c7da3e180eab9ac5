"""Tensors and the operations that define them: placeholder, compute, reduce_axis."""
from __future__ import annotations

import hashlib
import inspect
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from jitop import dtypes
from jitop.dtypes import DType
from jitop.te.expr import Expr, Op, binary, promote_operands as _binary_operands, as_expr, cast, const, var, walk

_op_ids = itertools.count()
Dim = int | Expr  # a dimension or extent: a Python int, or an int64 expression of shape symbols


def as_dim(d: Any, what: str) -> Dim:
    """`d` as a dimension: ints stay Python ints (a constant expression folds to one); an expression must be an
    int64 function of te.var/te.size_var symbols."""
    if isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)):
        if d < 0:
            raise ValueError(f"{what}: dimension {int(d)} is negative; dimensions are sizes (>= 0)")
        return int(d)
    if isinstance(d, IterVar):
        d = d.var
    if not isinstance(d, Expr):
        raise TypeError(f"{what}: dimension {d!r} ({type(d).__name__}) must be an int or an int64 expression of "
                        "te.var / te.size_var symbols")
    if d.op is Op.CONST and d.dtype.is_int:
        return as_dim(int(d.value), what)
    if d.dtype is not dtypes.INDEX:
        raise TypeError(f"{what}: dimension {d!r} has dtype {d.dtype}; a symbolic dimension must be int64 "
                        "(te.var(name) and te.size_var(name) are int64 by default)")
    bad = [n for n in walk(d) if n.op in (Op.LOAD, Op.REDUCE, Op.CALL, Op.DIV)]
    if bad:
        raise TypeError(f"{what}: dimension {d!r} must be integer arithmetic of symbols, not {bad[0]!r}")
    return d


class IterVar:
    """A loop axis: a variable with a domain [0, extent). Supports arithmetic like its variable.

    >>> k = reduce_axis((0, 16), "k")
    >>> k.extent
    16
    """

    __slots__ = ("var", "extent", "kind", "__weakref__")

    def __init__(self, name: str, extent: Dim, kind: str = "data"):
        self.var = var(name)
        self.extent: Dim = as_dim(extent, f"axis '{name}'")
        self.kind = kind  # "data" | "reduce"

    @property
    def name(self) -> str:
        return self.var.name

    @property
    def dom(self) -> tuple[int, Dim]:
        """(min, extent) as TVM's Range."""
        return (0, self.extent)

    def as_expr(self) -> Expr:
        return self.var

    def __repr__(self) -> str:
        return f"IterVar({self.name}, extent={self.extent}, {self.kind})"


THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")


@dataclass(frozen=True)
class ThreadAxis:
    """A GPU thread index a loop can be bound to (`Stage.bind`): blockIdx.x/y/z or threadIdx.x/y/z.

    >>> thread_axis("threadIdx.x")
    ThreadAxis(tag='threadIdx.x')
    """

    tag: str


def thread_axis(tag: str) -> ThreadAxis:
    """The GPU index named `tag` ("blockIdx.x" ... "threadIdx.z"), for `s[T].bind(axis, thread_axis(tag))`.

    >>> thread_axis("blockIdx.y").tag
    'blockIdx.y'
    """
    if tag not in THREAD_TAGS:
        raise ValueError(f"thread_axis({tag!r}): unknown tag; expected one of {', '.join(THREAD_TAGS)}")
    return ThreadAxis(tag)


def _forward(name: str) -> Callable:
    def method(self: IterVar, *args: Any) -> Any:
        return getattr(self.var, name)(*(a.var if isinstance(a, IterVar) else a for a in args))
    return method


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__",
              "__rfloordiv__", "__mod__", "__rmod__", "__truediv__", "__rtruediv__", "__lt__", "__le__",
              "__gt__", "__ge__", "__neg__", "astype"):
    setattr(IterVar, _name, _forward(_name))


class Tensor:
    """The value_index-th output of an operation; `T[i, j]` reads it inside a compute.

    >>> A = placeholder((4, 4), "float32", "A")
    >>> A.shape, A.dtype
    ((4, 4), float32)
    """

    __slots__ = ("op", "value_index", "shape", "dtype", "__weakref__")

    def __init__(self, op: "Operation", value_index: int, shape: tuple[Dim, ...], dtype: DType):
        self.op, self.value_index, self.shape, self.dtype = op, value_index, shape, dtype

    @property
    def name(self) -> str:
        return self.op.name if len(self.op.outputs) == 1 else f"{self.op.name}.v{self.value_index}"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, indices: Any) -> Expr:
        idx = indices if isinstance(indices, tuple) else (indices,)
        if len(idx) != self.ndim:
            raise IndexError(f"tensor '{self.name}' has {self.ndim} dimensions {self.shape}; indexed with {len(idx)}")
        raw = tuple(as_expr(i) for i in idx)
        for i, e in zip(idx, raw):
            if not (e.dtype.is_int or e.dtype.is_bool):
                raise TypeError(f"index {i!r} of tensor '{self.name}' must be an integer expression, got {e.dtype}; "
                                "convert explicitly with te.floor(x).astype('int64') if that is what you mean")
        held = getattr(self.op, "value", None)
        if held is not None:  # a te.size_param's value is its symbol: no kernel reads its (host-side) buffer
            return held
        return Expr(Op.LOAD, self.dtype, tuple(cast(e, dtypes.INDEX) for e in raw), self)

    def __call__(self, *indices: Any) -> Expr:
        return self[indices]

    @property
    def key(self) -> str:
        """Stable content hash: the producing operation's definition, shape, dtype and output index."""
        return hashlib.sha256(f"{self.op.key}|{self.value_index}|{self.shape}|{self.dtype}".encode()).hexdigest()

    def __repr__(self) -> str:
        return f"Tensor({self.name}, shape={self.shape}, {self.dtype})"


class Operation:
    """Base of PlaceholderOp and ComputeOp: a named producer of one or more tensors."""

    name: str
    outputs: tuple[Tensor, ...]

    def output(self, index: int) -> Tensor:
        return self.outputs[index]

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    @property
    def input_tensors(self) -> list[Tensor]:
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class PlaceholderOp(Operation):
    """An input tensor's op (an argument of the built function); `value`: the shape symbol a 0-d int64 input
    holds (its value binds the symbol at call time, as an input's dimension binds one)."""

    def __init__(self, name: str, shape: tuple[Dim, ...], dtype: DType, value: Expr | None = None):
        self.name = name
        self.value = value
        self.outputs = (Tensor(self, 0, shape, dtype),)

    @property
    def key(self) -> str:
        t = self.outputs[0]
        held = f"|{self.value.name}" if self.value is not None else ""
        return hashlib.sha256(f"placeholder|{self.name}|{t.shape}|{t.dtype}{held}".encode()).hexdigest()


class ComputeOp(Operation):
    """out[axis] = body, optionally reducing over reduce_axis; several bodies share one loop nest."""

    def __init__(self, name: str, axis: tuple[IterVar, ...], reduce_axis: tuple[IterVar, ...],
                 body: tuple[Expr, ...], tag: str = "", attrs: dict | None = None):
        self.name, self.axis, self.reduce_axis, self.body = name, axis, reduce_axis, body
        self.tag, self.attrs = tag, dict(attrs or {})
        shape = tuple(iv.extent for iv in axis)
        self.outputs = tuple(Tensor(self, k, shape, b.dtype) for k, b in enumerate(body))

    @property
    def key(self) -> str:
        axes = ",".join(f"{iv.name}:{iv.extent}" for iv in self.axis + self.reduce_axis)
        return hashlib.sha256(f"compute|{self.name}|{axes}|{'|'.join(b.key for b in self.body)}".encode()).hexdigest()

    @property
    def input_tensors(self) -> list[Tensor]:
        return read_tensors(self.body)


def tensor_loads(e: Expr) -> Iterator[Expr]:
    """The reads of tensors in `e` (each distinct LOAD node once; walk also enters reductions)."""
    return (n for n in walk(e) if n.op is Op.LOAD and isinstance(n.arg, Tensor))


def read_tensors(bodies: Sequence[Expr]) -> list[Tensor]:
    """The distinct tensors that `bodies` read, in first-read order."""
    found: dict[int, Tensor] = {}
    for b in bodies:
        for n in tensor_loads(b):
            found.setdefault(id(n.arg), n.arg)
    return list(found.values())


def read_along(op: ComputeOp, axis: IterVar) -> list[Tensor]:
    """The tensors `op` reads with `axis` as their last index, in first-read order: of a product
    sum_k A[i, k] * B[k, j], the row operand A (the one a GPU block of a few rows keeps whole in shared memory).

    >>> from jitop import te
    >>> A, B = te.placeholder((2, 8), name="A"), te.placeholder((8, 3), name="B")
    >>> k = te.reduce_axis((0, 8), "k")
    >>> C = te.compute((2, 3), lambda i, j: te.sum(B[k, j] * A[i, k], axis=k), name="C")
    >>> [t.name for t in read_along(C.op, k)]
    ['A']
    """
    return read_tensors([n for b in op.body for n in tensor_loads(b) if n.src and n.src[-1] is axis.var])


def _shape(shape: Any, what: str) -> tuple[Dim, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer, Expr, IterVar)) else tuple(shape)
    return tuple(as_dim(d, f"{what}, dimension {k} of shape {tuple(dims)}") for k, d in enumerate(dims))


def placeholder(shape: Sequence[Dim] | Dim, dtype: Any = "float32", name: str = "placeholder") -> Tensor:
    """An input tensor; a dimension is an int or a symbol (te.var) read from the argument's shape at run time.

    >>> A = placeholder((1024,), "float32", name="A")
    >>> from jitop.te.expr import var
    >>> n = var("n")
    >>> placeholder((n, 4), name="X").shape
    (n, 4)
    """
    return PlaceholderOp(name, _shape(shape, f"placeholder '{name}'"), dtypes.as_dtype(dtype)).output(0)


def size_param(symbol: Expr) -> Tensor:
    """A 0-d int64 input whose value is `symbol` (a te.var / te.size_var) at run time: the symbol need not be
    any input's dimension (TVM passes such a var as an argument of its own). Pass it among the arguments.

    >>> from jitop.te.expr import size_var
    >>> t = size_var("t")
    >>> size_param(t).shape, size_param(t).op.value
    ((), t)
    """
    if not (isinstance(symbol, Expr) and symbol.op is Op.VAR and symbol.dtype == dtypes.int64):
        raise TypeError(f"size_param takes an int64 te.var or te.size_var, got {symbol!r}")
    return PlaceholderOp(symbol.name, (), dtypes.int64, value=symbol).output(0)


def reduce_axis(dom: tuple[Dim, Dim] | Dim, name: str = "rv") -> IterVar:
    """A reduction axis over [0, extent); `dom` is (0, extent) as in TVM, or just the extent (an int or a symbol).

    >>> k = reduce_axis((0, 128), "k")
    """
    if isinstance(dom, (tuple, list)):
        lo, hi = (as_dim(d, f"reduce_axis '{name}' domain {tuple(dom)}") for d in dom)
    else:
        lo, hi = 0, dom
    if not isinstance(lo, int) or lo != 0:
        raise NotImplementedError(f"reduce_axis '{name}' must start at 0 (got {dom}); offset the index instead: A[k + {lo}]")
    return IterVar(name, hi, "reduce")


def _axis_names(fcompute: Callable, ndim: int) -> list[str]:
    params = list(inspect.signature(fcompute).parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return [f"i{k}" for k in range(ndim)]
    if len(params) != ndim:
        raise TypeError(f"fcompute takes {len(params)} index arguments but the shape has {ndim} dimensions")
    return [p.name for p in params]


def compute(shape: Sequence[Dim] | Dim, fcompute: Callable[..., Any], name: str = "compute",
            tag: str = "", attrs: dict | None = None) -> Tensor | tuple[Tensor, ...]:
    """A tensor defined elementwise by `fcompute(*indices)`; a tuple result gives several tensors.

    >>> A = placeholder((8,), "float32", "A")
    >>> B = compute((8,), lambda i: A[i] * 2.0, name="B")
    """
    dims = _shape(shape, f"compute '{name}'")
    axis = tuple(IterVar(n, d) for n, d in zip(_axis_names(fcompute, len(dims)), dims))
    result = fcompute(*(iv.var for iv in axis))
    bodies = tuple(as_expr(r) for r in (result if isinstance(result, (tuple, list)) else (result,)))
    reduce_axes = _reduce_axes(name, bodies)
    op = ComputeOp(name, axis, reduce_axes, bodies, tag, attrs)
    return op.outputs[0] if len(op.outputs) == 1 else op.outputs


def _reduce_axes(name: str, bodies: tuple[Expr, ...]) -> tuple[IterVar, ...]:
    tops = [b for b in bodies if b.op is Op.REDUCE]
    for b in bodies:
        nested = [n for n in walk(b) if n.op is Op.REDUCE and n is not b]
        if nested:
            raise ValueError(f"compute '{name}': a reduction must be the whole body (e.g. te.sum(A[i, k], axis=k)); "
                             "compute it in its own te.compute and use the result here")
    if tops and len(tops) != len(bodies):
        raise ValueError(f"compute '{name}': with several outputs, all or none must be reductions")
    axes = [t.arg.axes for t in tops]
    if any(a != axes[0] for a in axes):
        raise ValueError(f"compute '{name}': all reductions of one compute must use the same reduce axes")
    return axes[0] if axes else ()


# ** reductions **

@dataclass(frozen=True, eq=False)
class Reducer:
    """A commutative reducer: combine(x, y) and its identity element for a dtype."""

    name: str
    combine: Callable[[Expr, Expr], Expr]
    identity: Callable[[DType], Expr]

    def __call__(self, expr: Any, axis: Any, where: Any = None) -> Expr:
        if not isinstance(axis, (IterVar, list, tuple)):
            # TVM's te.max(a, b) on two expressions is the elementwise combine
            x, y = _binary_operands(expr, axis)
            return self.combine(x, y)
        axes = (axis,) if isinstance(axis, IterVar) else tuple(axis)
        for a in axes:
            if not isinstance(a, IterVar) or a.kind != "reduce":
                raise TypeError(f"{self.name}(..., axis=...) needs te.reduce_axis axes, got {a!r}")
        src = as_expr(expr)
        cond = const(True) if where is None else cast(as_expr(where), dtypes.bool_)
        return Expr(Op.REDUCE, src.dtype, (src, cond), ReduceArg(self, axes))

    @property
    def key(self) -> str:
        x, y = var("x", "float64"), var("y", "float64")
        return hashlib.sha256(f"{self.name}|{self.combine(x, y).key}".encode()).hexdigest()


@dataclass(frozen=True)
class ReduceArg:
    reducer: Reducer
    axes: tuple[IterVar, ...]

    @property
    def key(self) -> str:
        return f"{self.reducer.key}|{','.join(f'{a.name}:{a.extent}' for a in self.axes)}"


def comm_reducer(fcombine: Callable[[Expr, Expr], Expr], fidentity: Callable[[DType], Any],
                 name: str = "reduce") -> Reducer:
    """A user-defined commutative reducer, as TVM's te.comm_reducer.

    >>> mysum = comm_reducer(lambda x, y: x + y, lambda t: 0, name="mysum")
    """
    return Reducer(name, fcombine, lambda dt: cast(as_expr(fidentity(dt)), dt))


def _lowest(dt: DType) -> Expr:
    return const(-np.inf if dt.is_float else (False if dt.is_bool else np.iinfo(dt.np).min), dt)


def _highest(dt: DType) -> Expr:
    return const(np.inf if dt.is_float else (True if dt.is_bool else np.iinfo(dt.np).max), dt)


sum = Reducer("sum", lambda x, y: x + y, lambda dt: const(0, dt))  # noqa: A001 - TVM's name
prod = Reducer("prod", lambda x, y: x * y, lambda dt: const(1, dt))
max = Reducer("max", lambda x, y: binary(Op.MAX, x, y), _lowest)  # noqa: A001
min = Reducer("min", lambda x, y: binary(Op.MIN, x, y), _highest)  # noqa: A001


def broadcast_index(src_shape: tuple[Dim, ...], out_shape: tuple[Dim, ...],
                    idx: tuple[Expr, ...]) -> tuple[Expr, ...]:
    """The index into an operand of shape `src_shape` broadcast (numpy's rules) to `out_shape` at `idx`:
    leading dims dropped, size-1 dims pinned to 0 (a symbolic dim is never 1 here: sizes 0 and 1 stay constants).

    >>> i, j = var("i"), var("j")
    >>> broadcast_index((1, 3), (2, 3), (i, j))[1] is j
    True
    """
    lead = len(out_shape) - len(src_shape)
    return tuple(const(0) if _is_one(d) and not _is_one(out_shape[lead + k]) else idx[lead + k]
                 for k, d in enumerate(src_shape))


def _is_one(d: Dim) -> bool:
    return isinstance(d, int) and d == 1
