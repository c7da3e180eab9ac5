"""A boolean-mask read (`x[x > 0]`) that the kernel goes on to reduce: `x[m].sum()`, `np.mean(losses[valid])`,
`(x[m] - 1).max()`.

numpy's `x[m]` has one element per True of the mask, a length only the data knows, which no kernel result can
have. Its reductions do not depend on that length: they are reductions of `x` over the mask (`where=m`), which
compile. So a mask read is a `Masked`: the array it reads and the mask (its leading dimensions, as numpy's
mask), on which elementwise arithmetic with scalars (and with arrays of the trailing dimensions, for a mask of
leading ones) applies to every element, and a reduction over the masked elements (all of them, or axis 0) is the
array's reduction with `where=`. A maximum or minimum of no element is numpy's ValueError, raised by the kernel.
Anything that needs the elements themselves (returning them, their length, indexing them) is not supported: the
function then runs as numpy, with the warning.
"""
from __future__ import annotations

import traceback
from typing import Any, Callable

import numpy as np

from jitop.graph.ir import node
from jitop.graph.tracer import Tracer, Unsupported, as_node

_WHY = "a boolean-mask read used as an array (its length depends on the data)"
_HINT = "reduce it in the kernel (x[m].sum(), np.mean(x[m])) or keep the shape with np.where(m, x, 0)"


def read(t: Tracer, mask: Any) -> "Masked":
    """t[mask] for a boolean mask of t's leading dimensions (numpy's IndexError for one that does not fit, as an
    assignment through it checks it)."""
    from jitop.graph.mutation import boolean_mask
    from jitop.graph.numpy_api import reshape
    m, n = boolean_mask(mask, t.node), t.node
    trailing = n.ndim - m.ndim
    wide = mask if not trailing else reshape(mask, tuple(m.shape) + (1,) * trailing)
    return Masked(t, Tracer(as_node(wide)), m.ndim, traceback.extract_stack())


class Masked:
    """The elements of `values` where `mask` (broadcast over its trailing dimensions) holds, as numpy's 1-D (or,
    for a mask of `masked` leading dimensions, (count, *trailing)) array of them."""

    def __init__(self, values: Tracer, mask: Tracer, masked: int, stack: list | None = None):
        self.values, self.mask, self.masked = values, mask, masked
        self.stack = stack or []  # where the read was made: a use found later (returning it) names that line

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def ndim(self) -> int:
        return 1 + self.values.node.ndim - self.masked

    # ** elementwise: applied to every element, the mask kept **
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if method != "__call__" or kwargs or ufunc.nout != 1:
            raise Unsupported(f"np.{ufunc.__name__}.{method} of {_WHY}", _HINT)
        return Masked(ufunc(*(self._operand(x) for x in inputs)), self.mask, self.masked, self.stack)

    def _operand(self, x: Any) -> Any:
        if isinstance(x, Masked):
            if x.mask.node is not self.mask.node:
                raise Unsupported(f"{_WHY}, combined with a read through another mask", _HINT)
            return x.values
        trailing = self.values.node.ndim - self.masked
        if np.ndim(x) > trailing:  # it would broadcast against the elements' count
            raise Unsupported(f"{_WHY}, combined with an array of {np.ndim(x)} dimensions", _HINT)
        return x

    def astype(self, dtype: Any, *args: Any, **kwargs: Any) -> "Masked":
        return Masked(self.values.astype(dtype, *args, **kwargs), self.mask, self.masked, self.stack)

    # ** reductions: of the array, over the mask **
    def _axes(self, axis: Any) -> tuple[int, ...]:
        if axis is None or (self.ndim == 1 and axis in (0, -1, (0,), (-1,))):
            return tuple(range(self.values.node.ndim)) if axis is None else tuple(range(self.masked))
        if axis in (0, (0,), -self.ndim, (-self.ndim,)):
            return tuple(range(self.masked))
        raise Unsupported(f"a reduction of {_WHY} along axis {axis}", "reduce along axis 0 or all of them")

    def _reduce(self, fn: Callable, axis: Any, keepdims: bool, **kwargs: Any) -> Any:
        if keepdims:
            raise Unsupported(f"keepdims=True in a reduction of {_WHY}")
        if kwargs.get("out") is not None or kwargs.pop("where", True) is not True:
            raise Unsupported(f"out= or where= in a reduction of {_WHY}")
        kwargs.pop("out", None)
        return fn(self.values, axis=self._axes(axis), where=self.mask, **kwargs)

    def sum(self, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False, **kw: Any) -> Any:
        from jitop.graph.numpy_api import sum_
        return self._reduce(sum_, axis, keepdims, dtype=dtype, out=out, **kw)

    def prod(self, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False, **kw: Any) -> Any:
        from jitop.graph.numpy_api import prod
        return self._reduce(prod, axis, keepdims, dtype=dtype, out=out, **kw)

    def mean(self, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False, **kw: Any) -> Any:
        from jitop.graph.numpy_api import mean
        return self._reduce(mean, axis, keepdims, dtype=dtype, out=out, **kw)

    def var(self, axis: Any = None, dtype: Any = None, out: Any = None, ddof: Any = 0, keepdims: bool = False,
            **kw: Any) -> Any:
        from jitop.graph.numpy_api import var
        return self._reduce(var, axis, keepdims, dtype=dtype, out=out, ddof=ddof, **kw)

    def std(self, axis: Any = None, dtype: Any = None, out: Any = None, ddof: Any = 0, keepdims: bool = False,
            **kw: Any) -> Any:
        return np.sqrt(self.var(axis, dtype, out, ddof, keepdims, **kw))

    def any(self, axis: Any = None, out: Any = None, keepdims: bool = False, **kw: Any) -> Any:
        from jitop.graph.numpy_api import any_
        return self._reduce(any_, axis, keepdims, out=out, **kw)

    def all(self, axis: Any = None, out: Any = None, keepdims: bool = False, **kw: Any) -> Any:
        from jitop.graph.numpy_api import all_
        return self._reduce(all_, axis, keepdims, out=out, **kw)

    def max(self, axis: Any = None, out: Any = None, keepdims: bool = False, initial: Any = None, **kw: Any) -> Any:
        return self._extreme("max", axis, out, keepdims, initial, **kw)

    def min(self, axis: Any = None, out: Any = None, keepdims: bool = False, initial: Any = None, **kw: Any) -> Any:
        return self._extreme("min", axis, out, keepdims, initial, **kw)

    def _extreme(self, op: str, axis: Any, out: Any, keepdims: bool, initial: Any, **kw: Any) -> Any:
        """max/min over the masked elements; without `initial`, numpy's ValueError where there are none (the
        kernel checks the count)."""
        from jitop.graph.numpy_api import max_, min_, sum_
        fn = max_ if op == "max" else min_
        if initial is not None:
            return self._reduce(fn, axis, keepdims, out=out, initial=initial, **kw)
        dt = self.values.dtype
        start = (-np.inf if op == "max" else np.inf) if dt.kind == "f" else \
            (np.iinfo(dt).min if op == "max" else np.iinfo(dt).max) if dt.kind in "iu" else op == "min"
        r = self._reduce(fn, axis, keepdims, out=out, initial=start, **kw)
        count = sum_(self.mask, axis=self._axes(axis)[:self.masked] if axis is not None else None)
        name = "maximum" if op == "max" else "minimum"
        r_node, c_node = as_node(r), as_node(count)
        return Tracer(node("ufunc", r_node.shape, r_node.dtype, (r_node, c_node), name=f"py_nonempty_{name}",
                           in_dtypes=(r_node.dtype.name, c_node.dtype.name)))

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        method = _FUNCTIONS.get(func)
        if method is None or not args or args[0] is not self:
            raise Unsupported(f"np.{func.__name__} of {_WHY}", _HINT)
        kwargs = {k: v for k, v in kwargs.items() if v is not np._NoValue}
        return getattr(self, method)(*args[1:], **kwargs)

    # ** what needs the elements themselves **
    def _unsupported(self, *args: Any, **kwargs: Any) -> Any:
        err = Unsupported(_WHY, _HINT)
        err.stack = self.stack  # (jitop.kernel names the user's line of the read)
        raise err

    __array__ = __len__ = __iter__ = __getitem__ = __setitem__ = __bool__ = __index__ = __float__ = __int__ = \
        _unsupported

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in ("shape", "size", "T", "flat"):
            raise Unsupported(f"{name} of {_WHY}", _HINT)
        raise Unsupported(f"ndarray.{name} of {_WHY}", _HINT)


_FUNCTIONS = {np.sum: "sum", np.prod: "prod", np.mean: "mean", np.var: "var", np.std: "std", np.any: "any",
              np.all: "all", np.max: "max", np.amax: "max", np.min: "min", np.amin: "min"}


def _binary(uf: np.ufunc, reflected: bool) -> Callable:
    def method(self: Masked, other: Any) -> Any:
        return uf(other, self) if reflected else uf(self, other)
    return method


for _name, _uf in {"add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.true_divide,
                   "floordiv": np.floor_divide, "mod": np.remainder, "pow": np.power, "and": np.bitwise_and,
                   "or": np.bitwise_or, "xor": np.bitwise_xor, "lt": np.less, "le": np.less_equal,
                   "gt": np.greater, "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal}.items():
    setattr(Masked, f"__{_name}__", _binary(_uf, False))
    if _name not in ("lt", "le", "gt", "ge", "eq", "ne"):
        setattr(Masked, f"__r{_name}__", _binary(_uf, True))
Masked.__neg__ = lambda self: np.negative(self)
Masked.__abs__ = lambda self: np.absolute(self)
Masked.__invert__ = lambda self: np.invert(self)
