"""The Tracer: an abstract array that records numpy calls as graph nodes (JAX's Tracer, for numpy).

numpy's own protocols (`__array_ufunc__`, `__array_function__`) route `np.*` calls here, so the
user's unmodified numpy code builds a graph. Anything jitop cannot express raises Unsupported,
which makes the dispatcher fall back to plain numpy.

A symbolic dim (jitop.graph.shapes) reads as a SymInt from `shape`, `size`, `len` and iteration; constant
shapes read exactly as numpy's.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jitop import dtypes
from jitop.errors import ScalarNeeded, TracerConversionError, Unsupported  # noqa: F401 - raised here, imported here
from jitop.graph import shapes
from jitop.graph.ir import ConstData, Node, node, toposort
from jitop.graph.shapes import ShapeEnv, SymInt


def as_node(x: Any) -> Node:
    """A graph node for a tracer, a Python/numpy scalar or a constant numpy array."""
    if isinstance(x, Tracer):
        return x.node
    if isinstance(x, SymInt):  # a symbolic size as a value: a Python int the kernel computes from its symbols
        return node("dim", (), dtypes.int64, weak=True, expr=x.as_expr())
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        return scalar_const(x, weak=True)
    if isinstance(x, np.generic):
        return scalar_const(x.item(), dtype=x.dtype, weak=False)
    if isinstance(x, np.ndarray):
        from jitop.graph.capture import live_node
        return live_node(x) or array_const(x)  # a captured array is read in place by the kernel
    if isinstance(x, (list, tuple)):
        return array_const(np.asarray(x))
    raise Unsupported(f"a value of type {type(x).__name__} in an array expression")


def scalar_const(value: Any, dtype: Any = None, weak: bool = False) -> Node:
    if isinstance(value, complex) or (dtype is not None and np.dtype(dtype).kind == "c"):
        raise Unsupported("complex numbers")
    if dtype is not None and np.dtype(dtype).name not in dtypes.DTYPES:  # as an array of that dtype is
        raise Unsupported(f"a scalar of dtype {np.dtype(dtype)}")
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
    return node("array_const", a.shape, dtypes.as_dtype(a.dtype), data=ConstData.of(a))


def weak_proxy(n: Node) -> Any:
    """What numpy's type resolution should see for this node: a dtype, or a Python type if weak."""
    if n.weak:  # a Python bool promotes like the bool dtype (it is the lowest kind anyway)
        return n.dtype.np if n.dtype.is_bool else (int if n.dtype.is_int else float)
    return n.dtype.np


class Tracer:
    """A stand-in for a numpy array during tracing; shape and dtype are known, values are not."""

    __slots__ = ("node", "array0d", "order", "__weakref__")
    __array_priority__ = 1000

    def __init__(self, n: Node, array0d: bool = False, order: np.dtype | None = None):
        self.node = n
        self.array0d = array0d  # a 0-d result numpy returns as an array (shape functions), not a scalar
        # the non-native dtype numpy gives this array (a view or copy of a byte-swapped argument), else None
        self.order = order if order is not None and (array0d or n.ndim) else None
        _mutation.note_tracer(self)  # an assignment to memory it shares must reach it

    # ** what numpy users read off an array (a Python scalar has none of it) **
    @property
    def shape(self) -> tuple[int | SymInt, ...]:
        if self.node.weak:
            self.no_attribute("shape")
        s = self.node.shape
        return s if all(type(d) is int for d in s) else tuple(shapes.sym(d) for d in s)

    @property
    def dtype(self) -> np.dtype:
        if self.node.weak:
            self.no_attribute("dtype")
        return self.node.dtype.np if self.order is None else self.order

    @property
    def ndim(self) -> int:
        if self.node.weak:
            self.no_attribute("ndim")
        return self.node.ndim

    @property
    def size(self) -> int | SymInt:
        if self.node.weak:
            self.no_attribute("size")
        return shapes.sym(self.node.size)

    @property
    def T(self) -> "Tracer":
        if self.node.weak:
            self.no_attribute("T")
        from jitop.graph import numpy_api
        return numpy_api.transpose(self)

    def python_type(self) -> type:
        """bool, int or float for a tracer of a Python scalar."""
        return bool if self.node.dtype.is_bool else (int if self.node.dtype.is_int else float)

    def no_attribute(self, name: str):
        """A Python scalar's missing attribute is Python's AttributeError; one it has is not traced."""
        t = self.python_type()
        if hasattr(t, name):
            raise Unsupported(f"{t.__name__}.{name} of a Python scalar")
        raise AttributeError(f"'{t.__name__}' object has no attribute '{name}'")

    def __len__(self) -> int:
        if self.node.weak:
            raise TypeError(f"object of type '{self.python_type().__name__}' has no len()")
        if not self.node.shape:
            raise TypeError("len() of unsized object")
        return self._first_dim("len()")

    def __iter__(self):
        if self.node.weak:
            raise TypeError(f"'{self.python_type().__name__}' object is not iterable")
        if not self.node.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self._first_dim("iteration over an array (for row in x)")))

    def _first_dim(self, what: str) -> int:
        """The length of axis 0 as a Python int (a symbolic one is specialised, with the user's line)."""
        d = shapes.sym(self.node.shape[0])
        return d.specialise(what) if isinstance(d, SymInt) else d

    def __repr__(self) -> str:
        if self.node.weak:
            return f"Tracer(Python {self.python_type().__name__})"
        return f"Tracer({self.node.dtype.name}{list(self.node.shape)})"

    # ** values that do not exist while tracing **
    def __array__(self, dtype: Any = None, copy: Any = None):
        raise TracerConversionError(
            f"a traced {self.node.dtype.name}{list(self.node.shape)} {'Python scalar' if self.node.weak else 'array'} "
            "was converted to a concrete numpy array "
            "(np.asarray, a non-numpy library, or array.tolist()); jitop cannot compile that. Keep to numpy "
            "operations inside @jitop.kernel, or call the function with fallback=True (the default)")

    def __bool__(self) -> bool:
        ints = [n for n in toposort([self.node]) if n.prim == "scalar_arg"] if self.node.weak else []
        if ints and all(n.dtype.is_int or n.dtype.is_bool for n in ints):
            # `if t > 0:` on Python int arguments: they are made static on use (a size symbol, guarded, once one
            # varies); a float's truth stays numpy's (a compile per value of a float that changes every call
            # would cost more than it saves)
            self._concrete("a truth value (`if`, `while`, `and`/`or`)")
        raise Unsupported("Python control flow on a traced value (`if`, `while`, `and`/`or` on an array)",
                          "use np.where(cond, a, b) instead of if/else, or mark the argument static")

    def __str__(self) -> str:  # print(x), str(x), f"{x}": the value is only known when the kernel runs
        self._concrete("str() or print()")

    def __format__(self, spec: str) -> str:
        self._concrete("formatting (an f-string)")

    def _concrete(self, what: str):
        args = tuple(sorted({n.param("index") for n in toposort([self.node]) if n.prim == "scalar_arg"})) \
            if self.node.weak else ()
        if args:  # from Python scalar arguments: run-time values of the kernel, unknown here
            raise ScalarNeeded(f"{what} of a Python scalar argument, which jitop traces as a run-time value (unknown "
                               "while tracing)", "mark the argument static (@jitop.kernel(static_argnames=['n'])): "
                               "one compile per value, as JAX's static_argnames", args)
        raise Unsupported(f"{what} of a traced array (its value is only known when the kernel runs)")

    def __int__(self): self._concrete("int()")
    def __float__(self): self._concrete("float()")
    def __index__(self): self._concrete("use as an index")
    def item(self, *args): self._concrete(".item()")
    def tolist(self): self._concrete(".tolist()")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if self.node.weak:
            self.no_attribute(name)
        if not hasattr(np.ndarray, name):
            raise AttributeError(f"'numpy.ndarray' object has no attribute '{name}'")
        raise Unsupported(f"ndarray.{name}")

    def __setitem__(self, key, value):
        _mutation.assign(self, key, value)

    # ** numpy protocols **
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any):
        from jitop.graph import numpy_api
        return numpy_api.apply_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        from jitop.graph import numpy_api
        impl = numpy_api.FUNCTIONS.get(func)
        if impl is None:
            raise Unsupported(f"np.{func.__name__}")
        # numpy's "no value" default (np.sum(a, keepdims=np._NoValue)) means: not given
        kwargs = {k: v for k, v in kwargs.items() if v is not np._NoValue}
        return numpy_api.numpy_value(impl(*args, **kwargs))

    def __getitem__(self, key: Any) -> "Tracer":
        if self.node.weak:
            raise TypeError(f"'{self.python_type().__name__}' object is not subscriptable")
        from jitop.graph import indexing
        return indexing.getitem(self, key)


def _in_place(name: str):
    def method(self, other):
        if self.node.weak:  # a Python scalar is immutable: x += y rebinds x to x + y
            from jitop.graph import pyscalar
            return pyscalar.binary(name, self, other)
        return _mutation.in_place(self, name, other)
    return method


def _operator(name: str, uf: np.ufunc, reflected: bool):
    """An array's operator is numpy's ufunc; a Python scalar's is Python's (jitop.graph.pyscalar)."""
    def method(self, other):
        if isinstance(other, SymInt):  # a symbolic size: the Python int the kernel computes
            other = Tracer(as_node(other))
        if self.node.weak:
            from jitop.graph import pyscalar
            return pyscalar.binary(name, other, self) if reflected else pyscalar.binary(name, self, other)
        scalar = not self.array0d and not self.node.shape  # a numpy scalar, not a 0-d array
        if scalar and name in ("mul", "matmul") and isinstance(other, (list, tuple)):
            return NotImplemented  # numpy scalar * list repeats the list (or is a TypeError), like Python
        if scalar and name == "matmul" and not (isinstance(other, np.ndarray) or isinstance(other, Tracer) and
                                                 (other.array0d or other.node.shape)):
            return NotImplemented  # numpy scalars have no @ (an array operand's @ still runs)
        if name == "pow" and not reflected and not scalar and type(other) is int and other == 2:
            return np.square(self)  # numpy's array ** 2 is np.square (bool ** 2 is int8, np.power's int64)
        if name == "pow" and scalar and not reflected and type(other) is float:
            from jitop.graph import numpy_api  # a numpy scalar's ** is C's pow, also for 0.5 (not sqrt)
            return numpy_api.ufunc_call(np.power, [self.node, as_node(other)], shortcuts=False)
        return uf(other, self) if reflected else uf(self, other)
    return method


def _unary(name: str, uf: np.ufunc):
    def method(self):
        if self.node.weak:
            from jitop.graph import pyscalar
            return pyscalar.unary(name, self)
        return uf(self)
    return method


def _install_operators() -> None:
    binary = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.true_divide,
              "floordiv": np.floor_divide, "mod": np.remainder, "pow": np.power, "and": np.bitwise_and,
              "or": np.bitwise_or, "xor": np.bitwise_xor, "lshift": np.left_shift, "rshift": np.right_shift,
              "matmul": np.matmul}
    for name, uf in binary.items():
        setattr(Tracer, f"__{name}__", _operator(name, uf, False))
        setattr(Tracer, f"__r{name}__", _operator(name, uf, True))
    for name, uf in {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
                     "eq": np.equal, "ne": np.not_equal}.items():
        setattr(Tracer, f"__{name}__", _operator(name, uf, False))
    Tracer.__hash__ = None  # like numpy arrays: __eq__ is elementwise
    for name, uf in {"neg": np.negative, "pos": np.positive, "abs": np.absolute, "invert": np.invert}.items():
        setattr(Tracer, f"__{name}__", _unary(name, uf))
    for name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift",
                 "matmul"):
        setattr(Tracer, f"__i{name}__", _in_place(name))


_install_operators()


# ** tracing with symbolic dims (internal: @jitop.kernel chooses the dims in K1) **

@dataclass
class SymbolicTrace:
    """What `trace_symbolic` gives: the ShapeEnv (symbols, guards, ties, specialisations), the argument nodes and
    the function's result as it returned it (tracers, SymInts, Python values)."""

    env: ShapeEnv
    inputs: list[Node]
    result: Any


def trace_symbolic(fn: Callable[..., Any], args: Sequence[Any], dynamic: Mapping[int, Sequence[int]]) -> SymbolicTrace:
    """Run `fn` on tracers of `args` (arrays; other values are passed as they are) with the dims
    `dynamic[k]` of argument k symbolic, named `<parameter>_<dim>` (`x_0`); sizes 0 and 1 stay constants.

    >>> import numpy as np
    >>> tr = trace_symbolic(lambda x: (x.shape[0] * 2, x.shape[1], x.size), [np.zeros((5, 3))], {0: (0,)})
    >>> tr.result, tr.inputs[0].shape
    ((x_0 * 2, 3, x_0 * 3), (x_0, 3))
    """
    env = ShapeEnv(user_files={fn.__code__.co_filename})
    names = list(inspect.signature(fn).parameters)
    inputs: list[Node] = []
    values: list[Any] = []
    for k, v in enumerate(args):
        if not isinstance(v, np.ndarray):
            values.append(v)
            continue
        name = names[k] if k < len(names) else f"arg{k}"
        dims = [env.symbol(f"{name}_{d}", n) if d in dynamic.get(k, ()) else n for d, n in enumerate(v.shape)]
        inputs.append(node("arg", dims, dtypes.as_dtype(v.dtype), index=k))
        values.append(Tracer(inputs[-1], array0d=True))
    with env.active():
        result = fn(*values)
    return SymbolicTrace(env, inputs, result)

# assignments (Tracer.__setitem__, x += y), numpy's functions and the array methods (x.sum(), x.reshape(), ...)
# are defined there, on Tracer
from jitop.graph import mutation as _mutation  # noqa: E402
from jitop.graph import numpy_api as _numpy_api  # noqa: E402,F401
