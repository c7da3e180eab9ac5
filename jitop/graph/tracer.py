"""The Tracer: an abstract array that records numpy calls as graph nodes (JAX's Tracer, for numpy).

numpy's own protocols (`__array_ufunc__`, `__array_function__`) route `np.*` calls here, so the
user's unmodified numpy code builds a graph. Anything jitop cannot express raises Unsupported,
which makes the dispatcher fall back to plain numpy.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from jitop import dtypes
from jitop.errors import TracerConversionError, Unsupported  # noqa: F401 - raised here, imported from here
from jitop.graph.ir import Node, node


def as_node(x: Any) -> Node:
    """A graph node for a tracer, a Python/numpy scalar or a constant numpy array."""
    if isinstance(x, Tracer):
        return x.node
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        return scalar_const(x, weak=True)
    if isinstance(x, np.generic):
        return scalar_const(x.item(), dtype=x.dtype, weak=False)
    if isinstance(x, np.ndarray):
        return array_const(x)
    if isinstance(x, (list, tuple)):
        return array_const(np.asarray(x))
    raise Unsupported(f"a value of type {type(x).__name__} in an array expression")


def scalar_const(value: Any, dtype: Any = None, weak: bool = False) -> Node:
    if isinstance(value, complex) or (dtype is not None and np.dtype(dtype).kind == "c"):
        raise Unsupported("complex numbers")
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.scalar_dtype(value)
    if weak and isinstance(value, int) and not isinstance(value, bool):
        return node("const", (), dt, weak=True, value=int(value))  # exact: it may not fit int64 (NEP 50)
    return node("const", (), dt, weak=weak, value=_canonical(value, dt))


def _canonical(value: Any, dt: dtypes.DType) -> Any:
    return bool(value) if dt.is_bool else (int(value) if dt.is_int else float(value))


def array_const(a: np.ndarray) -> Node:
    """A constant array captured from the enclosing scope (passed to the kernel as an input)."""
    if a.dtype.kind not in "biuf" or a.dtype.name not in dtypes.DTYPES:
        raise Unsupported(f"an array of dtype {a.dtype}")
    if a.ndim == 0:
        return scalar_const(a.item(), a.dtype)
    data = np.ascontiguousarray(a)
    return node("array_const", data.shape, dtypes.as_dtype(a.dtype), data=data.tobytes())


def weak_proxy(n: Node) -> Any:
    """What numpy's type resolution should see for this node: a dtype, or a Python type if weak."""
    if n.weak:  # a Python bool promotes like the bool dtype (it is the lowest kind anyway)
        return n.dtype.np if n.dtype.is_bool else (int if n.dtype.is_int else float)
    return n.dtype.np


class Tracer:
    """A stand-in for a numpy array during tracing; shape and dtype are known, values are not."""

    __slots__ = ("node", "array0d")
    __array_priority__ = 1000

    def __init__(self, n: Node, array0d: bool = False):
        self.node = n
        self.array0d = array0d  # a 0-d result numpy returns as an array (shape functions), not a scalar

    # ** what numpy users read off an array **
    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> np.dtype:
        return self.node.dtype.np

    @property
    def ndim(self) -> int:
        return self.node.ndim

    @property
    def size(self) -> int:
        return self.node.size

    @property
    def T(self) -> "Tracer":
        from jitop.graph import numpy_api
        return numpy_api.transpose(self)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __repr__(self) -> str:
        return f"Tracer({self.dtype.name}{list(self.shape)})"

    # ** values that do not exist while tracing **
    def __array__(self, dtype: Any = None, copy: Any = None):
        raise TracerConversionError(
            f"a traced {self.dtype.name}{list(self.shape)} array was converted to a concrete numpy array "
            "(np.asarray, a non-numpy library, or array.tolist()); jitop cannot compile that. Keep to numpy "
            "operations inside @jitop.kernel, or call the function with fallback=True (the default)")

    def __bool__(self) -> bool:
        raise Unsupported("Python control flow on a traced value (`if`, `while`, `and`/`or` on an array)",
                          "use np.where(cond, a, b) instead of if/else, or mark the argument static")

    def _concrete(self, what: str):
        raise Unsupported(f"{what} of a traced array (its value is only known when the kernel runs)")

    def __int__(self): self._concrete("int()")
    def __float__(self): self._concrete("float()")
    def __index__(self): self._concrete("use as an index")
    def item(self, *args): self._concrete(".item()")
    def tolist(self): self._concrete(".tolist()")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise Unsupported(f"ndarray.{name}")

    def __setitem__(self, key, value):
        raise Unsupported("in-place assignment to an array (a[...] = ...)",
                          "build a new array with np.where or np.concatenate instead")

    # ** numpy protocols **
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any):
        from jitop.graph import numpy_api
        return numpy_api.apply_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        from jitop.graph import numpy_api
        impl = numpy_api.FUNCTIONS.get(func)
        if impl is None:
            raise Unsupported(f"np.{func.__name__}")
        return impl(*args, **kwargs)

    def __getitem__(self, key: Any) -> "Tracer":
        from jitop.graph import indexing
        return indexing.getitem(self, key)


def _in_place(name: str):
    def method(self, other):
        raise Unsupported(f"in-place operator (x {_SYMBOL[name]}= ...), which would mutate an argument",
                          f"write x = x {_SYMBOL[name]} ... instead")
    return method


_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%", "pow": "**",
           "and": "&", "or": "|", "xor": "^", "lshift": "<<", "rshift": ">>", "matmul": "@"}


def _install_operators() -> None:
    binary = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.true_divide,
              "floordiv": np.floor_divide, "mod": np.remainder, "pow": np.power, "and": np.bitwise_and,
              "or": np.bitwise_or, "xor": np.bitwise_xor, "lshift": np.left_shift, "rshift": np.right_shift}
    for name, uf in binary.items():
        setattr(Tracer, f"__{name}__", lambda self, other, uf=uf: uf(self, other))
        setattr(Tracer, f"__r{name}__", lambda self, other, uf=uf: uf(other, self))
    for name, uf in {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
                     "eq": np.equal, "ne": np.not_equal}.items():
        setattr(Tracer, f"__{name}__", lambda self, other, uf=uf: uf(self, other))
    Tracer.__hash__ = None  # like numpy arrays: __eq__ is elementwise
    Tracer.__neg__ = lambda self: np.negative(self)
    Tracer.__pos__ = lambda self: np.positive(self)
    Tracer.__abs__ = lambda self: np.absolute(self)
    Tracer.__invert__ = lambda self: np.invert(self)
    for name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift",
                 "matmul"):
        setattr(Tracer, f"__i{name}__", _in_place(name))
    Tracer.__matmul__ = lambda self, other: np.matmul(self, other)
    Tracer.__rmatmul__ = lambda self, other: np.matmul(other, self)


_install_operators()

# numpy's functions and the array methods (x.sum(), x.reshape(), ...) are defined there, on Tracer
from jitop.graph import numpy_api as _numpy_api  # noqa: E402,F401
