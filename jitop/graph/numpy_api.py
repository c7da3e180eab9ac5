"""numpy's API on Tracers: ufuncs, reductions, shape functions, creation functions.

Each function computes the result's shape and dtype exactly as numpy does (ufunc dtypes come from
numpy's own `ufunc.resolve_dtypes`, so NEP 50 promotion is numpy's) and records one graph node.
"""
from __future__ import annotations

import builtins
import math
from typing import Any, Callable, Sequence

import numpy as np

from jitop import dtypes
from jitop.graph import mutation, shapes as sh
from jitop.graph.ir import Node, node
from jitop.graph.tracer import Tracer, Unsupported, as_node, scalar_const, weak_proxy
from jitop.runtime.args import reshape_target

FUNCTIONS: dict[Callable, Callable] = {}


def implements(*funcs: Callable):
    def register(impl: Callable) -> Callable:
        for f in funcs:
            FUNCTIONS[f] = impl
        return impl
    return register


def wrap(n: Node) -> Tracer:
    return Tracer(n)


def array_kind(a: Any) -> bool:
    """Whether a 0-d value is an array (True) or a numpy scalar (False): what a shape method keeps
    (x.reshape(()), x.T, x.astype() of a numpy scalar are scalars, of a 0-d array 0-d arrays)."""
    if isinstance(a, Tracer):
        # an n-d tracer is an array; np.reshape(1.5, ()) converts a Python float to one
        return a.array0d or a.node.weak or a.node.ndim > 0
    return not isinstance(a, np.generic)


def order_of(a: Any) -> np.dtype | None:
    """The non-native dtype a view or copy of `a` keeps in numpy (None: native)."""
    if isinstance(a, Tracer):
        return a.order
    return a.dtype if isinstance(a, np.ndarray) and not a.dtype.isnative else None


def array_node(x: Any) -> Node:
    """np.asarray(x) for an array-like argument (not a ufunc operand): a Python scalar is a strong int64,
    float64 or bool (uint64, or an object array jitop does not compile, beyond int64), not a weak one."""
    if isinstance(x, Tracer):
        n = x.node
        return node("copy", n.shape, n.dtype, (n,)) if n.weak else n
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        return as_node(np.asarray(x))
    return as_node(x)


def numpy_value(r: Any) -> Any:
    """What a numpy function returns is a numpy value, never a Python scalar (np.reshape(x, ()) of a Python
    float x is an array): weak results become strong copies."""
    if isinstance(r, Tracer):
        return Tracer(node("copy", r.node.shape, r.node.dtype, (r.node,)), r.array0d) if r.node.weak else r
    if type(r) in (list, tuple):
        return type(r)(numpy_value(x) for x in r)
    return r


def _dtype(np_dtype: np.dtype) -> dtypes.DType:
    if np_dtype.name not in dtypes.DTYPES:
        raise Unsupported(f"dtype {np_dtype} (jitop supports bool, int8-64, uint8-64, float32, float64)")
    return dtypes.as_dtype(np_dtype)


def broadcast_shapes(*shapes: tuple) -> tuple:
    """numpy's broadcasting of shapes; a symbolic dim per dim: an int 1 takes the other, equal dims pass, two
    other dims are made equal (`require_eq`: a tie, or a constant pins the symbol) or numpy's error."""
    if all(type(d) is int for s in shapes for d in s):
        try:
            return tuple(np.broadcast_shapes(*shapes))
        except ValueError:
            raise _broadcast_error(shapes) from None
    ndim = builtins.max(len(s) for s in shapes)
    out = []
    for i in range(-ndim, 0):
        acc: Any = 1
        for s in shapes:
            if len(s) < -i:
                continue
            d = s[i]
            if type(d) is int and d == 1:
                continue
            if type(acc) is int and acc == 1:
                acc = d
                continue
            # two sizes, neither a constant 1: an expression that may be 1 is decided (and recorded)
            if sh.provably_same(d, acc) or sh.is_one(d):
                continue
            if sh.is_one(acc):
                acc = d
            elif not sh.require_eq(acc, d, "broadcasting"):
                raise _broadcast_error(shapes)
        out.append(sh.resolved(acc))
    return tuple(out)


def _broadcast_error(shapes: tuple) -> ValueError:
    return ValueError(f"operands could not be broadcast together with shapes {' '.join(map(sh.show, shapes))}")


# ** ufuncs **

SUPPORTED_UFUNCS = frozenset("""add subtract multiply divide true_divide floor_divide remainder mod fmod power
float_power negative positive absolute fabs sign reciprocal square sqrt cbrt exp exp2 expm1 log log2 log10 log1p
logaddexp logaddexp2 sin cos tan arcsin arccos arctan arctan2 sinh cosh tanh arcsinh arccosh arctanh hypot deg2rad
rad2deg degrees radians maximum minimum fmax fmin floor ceil trunc rint isnan isinf isfinite signbit copysign
logical_and logical_or logical_xor logical_not equal not_equal less less_equal greater greater_equal bitwise_and
bitwise_or bitwise_xor invert bitwise_not left_shift right_shift conjugate""".split())

_POWER_SHORTCUTS = {2: "square", 2.0: "square", 1: "positive", 1.0: "positive", 0.5: "sqrt", -1.0: "reciprocal"}
_REDUCE_UFUNCS = {"add": "sum", "multiply": "prod", "maximum": "max", "minimum": "min", "logical_and": "all",
                  "logical_or": "any", "fmax": "fmax", "fmin": "fmin"}


def apply_ufunc(ufunc: np.ufunc, method: str, inputs: tuple, kwargs: dict) -> Any:
    if method == "reduce" and ufunc.__name__ in _REDUCE_UFUNCS:
        axis = kwargs.pop("axis", 0)
        return reduce(inputs[0], _REDUCE_UFUNCS[ufunc.__name__], axis=axis, **kwargs)
    if method == "at":
        return mutation.ufunc_at(ufunc, *inputs, **kwargs)
    if method == "accumulate" and ufunc.__name__ in _ACCUMULATED:
        return _accumulate(ufunc, *inputs, **kwargs)
    if method != "__call__":
        raise Unsupported(f"np.{ufunc.__name__}.{method}")
    if ufunc is np.matmul:
        return matmul(*inputs, **kwargs)
    if ufunc.__name__ not in SUPPORTED_UFUNCS:
        raise Unsupported(f"np.{ufunc.__name__}")
    out = kwargs.pop("out", None)
    out = out[0] if type(out) is tuple and len(out) == 1 else out
    if out is not None and not isinstance(out, Tracer):
        raise Unsupported(f"np.{ufunc.__name__}(..., out=...) into an array the kernel does not trace",
                          "make it with np.zeros & co. in the function, or return the result")
    casting = kwargs.pop("casting", "same_kind")
    dtype = kwargs.pop("dtype", None)
    if kwargs.pop("where", True) is not True or kwargs:
        raise Unsupported(f"np.{ufunc.__name__} with arguments {sorted(kwargs) or ['where']}")
    result = ufunc_call(ufunc, [as_node(x) for x in inputs], dtype)
    return result if out is None else mutation.into(out, ufunc, inputs, result, casting)


_COMPARISONS = frozenset({"equal", "not_equal", "less", "less_equal", "greater", "greater_equal"})


def _resolve(ufunc: np.ufunc, srcs: list[Node], dtype: Any) -> tuple[tuple, tuple, list[Node]]:
    """numpy's loop dtypes (inputs, outputs) and the sources (a run-time Python int checked against the
    dtype it meets); dtype= fixes the computation's dtype, as in numpy."""
    sig = tuple(weak_proxy(s) for s in srcs) + (None,) * ufunc.nout
    if dtype is not None:
        sig = (np.dtype(dtype),) * ufunc.nin + ((None,) if ufunc.__name__ in _COMPARISONS else (np.dtype(dtype),))
    try:
        resolved = ufunc.resolve_dtypes(sig, casting="unsafe" if dtype is not None else "same_kind")
    except TypeError:
        names = ", ".join(s.dtype.name for s in srcs)
        raise TypeError(f"ufunc '{ufunc.__name__}' not supported for the input types ({names})") from None
    ins, outs = resolved[:ufunc.nin], resolved[ufunc.nin:]
    ins, srcs = _check_python_ints(ufunc, srcs, ins)
    return ins, outs, srcs


def _check_python_ints(ufunc: np.ufunc, srcs: list[Node], ins: tuple) -> tuple[tuple, list[Node]]:
    """NEP 50: a Python int that does not fit the array's integer dtype is an error (comparisons: see
    `_compare_python_int`). A constant is checked now, an argument by the call (`_bound_python_ints`), a
    Python int computed at run time (n + 1 of an argument n) by the kernel."""
    out, checked = list(ins), list(srcs)
    for k, (s, d) in enumerate(zip(srcs, ins)):
        if s.weak and s.prim == "const" and s.dtype.is_int and d.kind == "b" \
                and not -(1 << 63) <= s.param("value") < (1 << 63):
            raise python_int_overflow(s.param("value"), np.dtype("int64"))  # converted through a C long
        if not (s.weak and s.dtype.is_int and d.kind in "iu"):
            continue
        if s.prim == "scalar_arg" and d != np.int64 and ufunc.__name__ not in _COMPARISONS:
            mutation.note_python_int(s.param("index"), d.name)  # (checked by the call, used or not)
        if s.prim != "const" and ufunc.__name__ in _COMPARISONS:
            if d.itemsize < 8:
                out = [np.dtype("int64")] * len(out)  # a Python int may be out of range: compare exactly
            continue
        if s.prim == "const":
            v, info = s.param("value"), np.iinfo(d)
            if not info.min <= v <= info.max:
                raise python_int_overflow(v, d)
        elif s.prim != "scalar_arg" and d != np.int64:
            info = np.iinfo(d)
            checked[k] = fit_int(s, int(info.min), int(info.max), d)
    return tuple(out), checked


def _compare_python_int(ufunc: np.ufunc, srcs: list[Node]) -> Tracer | None:
    """numpy 2 compares an integer array with a Python int exactly, whatever its value. One beyond the
    array's dtype compares the same with every element: the result is a constant (numpy computes it, or
    raises as it does for a bool array and an int beyond int64). A Python int argument compared with a
    uint64 array: negative values are below every element, the others compare as uint64."""
    if len(srcs) != 2 or not any(s.weak and s.dtype.is_int for s in srcs):
        return None
    ins = ufunc.resolve_dtypes(tuple(weak_proxy(s) for s in srcs) + (None,))[:2]
    shape = broadcast_shapes(*(s.shape for s in srcs))
    for i, (s, d) in enumerate(zip(srcs, ins)):
        other = srcs[1 - i]
        if not (s.weak and s.dtype.is_int and d.kind in "iu") or other.weak and other.prim == "const":
            continue
        probe = [np.zeros((), other.dtype.np)] * 2
        if s.prim == "const":
            v, info = s.param("value"), np.iinfo(d)
            if info.min <= v <= info.max:
                continue
            probe[i] = v
            c = node("const", (), dtypes.bool_, value=bool(ufunc(*probe)))
            return wrap(c if shape == () else node("broadcast", shape, dtypes.bool_, (c,)))
        if s.prim != "const" and d == np.uint64:
            probe[i] = -1
            below = node("const", (), dtypes.bool_, value=bool(ufunc(*probe)))
            negative = ufunc_call(np.less, [s, scalar_const(0)]).node
            as_u64 = node("cast", (), dtypes.uint64, (s,))
            compared = ufunc_call(ufunc, [as_u64, other] if i == 0 else [other, as_u64]).node
            return wrap(node("where", shape, dtypes.bool_, (negative, below, compared)))
    return None


def python_int_overflow(value: int, d: np.dtype) -> OverflowError:
    """numpy's error for a Python int that does not fit integer dtype d (it converts through C long first)."""
    if -(1 << 63) <= value < (1 << 63) or (d.kind == "u" and 0 <= value < (1 << 64)):
        return OverflowError(f"Python integer {value} out of bounds for {d}")
    return OverflowError("Python int too large to convert to C long")


def ufunc_call(ufunc: np.ufunc, srcs: list[Node], dtype: Any = None, shortcuts: bool = True) -> Tracer:
    """ufunc(*srcs) as numpy computes it; shortcuts=False: x ** 0.5 as pow, not sqrt (numpy scalars' **
    is C's pow: 0.0 for -0.0, inf for -inf, where arrays take sqrt)."""
    if ufunc.__name__ in _COMPARISONS and dtype is None:
        exact = _compare_python_int(ufunc, srcs)
        if exact is not None:
            return exact
    ins, outs, srcs = _resolve(ufunc, srcs, dtype)
    if ufunc is np.power and srcs[1].prim == "const" and outs[0].kind in "iu" and srcs[1].param("value") < 0 \
            and sh.known_nonzero(sh.prod(broadcast_shapes(*(s.shape for s in srcs)))):  # numpy's loop never runs on no elements
        raise ValueError("Integers to negative integer powers are not allowed.")
    if ufunc is np.power and srcs[1].prim == "const" and srcs[1].param("value") in _POWER_SHORTCUTS \
            and (outs[0].kind == "f" or srcs[1].param("value") > 0) \
            and (shortcuts or _POWER_SHORTCUTS[srcs[1].param("value")] != "sqrt"):
        # numpy computes x**2 as x*x, x**0.5 as sqrt(x), ... (exactly, and much faster than pow)
        name = _POWER_SHORTCUTS[srcs[1].param("value")]
        return wrap(node("ufunc", srcs[0].shape, _dtype(outs[0]), srcs[:1], name=name,
                         in_dtypes=(_dtype(ins[0]).name,)))
    shape = broadcast_shapes(*(s.shape for s in srcs))
    in_names = tuple(_dtype(d).name for d in ins)
    # a numpy ufunc's result is a numpy value even for Python scalar operands: never weak (np.tanh(0.5) is
    # a float64, which float32 arrays promote to)
    if all(s.prim == "const" for s in srcs):  # constant folding: numpy computes it now, exactly
        with np.errstate(all="ignore"):
            value = ufunc(*(np.asarray(s.param("value"), dtype=d) for s, d in zip(srcs, ins)), dtype=outs[0])
        return wrap(node("const", (), _dtype(outs[0]), value=value.item()))
    return wrap(node("ufunc", shape, _dtype(outs[0]), srcs, name=ufunc.__name__, in_dtypes=in_names))


# ** reductions **

def _axes(axis: Any, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    out = []
    for a in items:
        a = int(a)
        if not -ndim <= a < ndim:
            raise np.exceptions.AxisError(f"axis {a} is out of bounds for array of dimension {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError("duplicate value in 'axis'")
    return tuple(sorted(out))


def _sum_dtype(dt: dtypes.DType) -> dtypes.DType:
    return _dtype(np.add.reduce(np.zeros(1, dt.np)).dtype)  # ints and bool widen like numpy


def reduce(x: Any, op: str, axis: Any = None, dtype: Any = None, keepdims: bool = False, out: Any = None,
           initial: Any = None, where: Any = True) -> Any:
    """np.sum/prod/max/min/all/any: `initial` is cast to the result's dtype (a Python int beyond it raises
    OverflowError, as numpy) and combined with the result; `where`'s False elements count as the reduction's
    identity (max and min, which have none, take `initial`)."""
    if out is not None:
        raise Unsupported(f"np.{op} with out=")
    n = as_node(x)
    # a ufunc reduction takes axis=0 or -1 (not in a tuple) on a 0-d array: there is nothing to reduce
    axes = () if n.ndim == 0 and type(axis) is int and axis in (0, -1) else _axes(axis, n.ndim)
    if op in ("sum", "prod"):
        out_dt = _dtype(np.dtype(dtype)) if dtype is not None else _sum_dtype(n.dtype)
    elif op in ("all", "any"):
        out_dt = dtypes.bool_
    else:
        out_dt = n.dtype
        name = "maximum" if op == "max" else "minimum"
        if initial is None and where is not True:
            raise ValueError(f"reduction operation '{name}' does not have an identity, so to use a where mask one "
                             "has to specify 'initial'")
        if initial is None and any(sh.known_zero(n.shape[a]) for a in axes):
            raise ValueError(f"zero-size array to reduction operation {op} which has no identity")
    first = None if initial is None else Tracer(scalar_const(_initial_value(initial, out_dt), out_dt.np))
    src = cast_node(n, out_dt) if op not in ("all", "any") else cast_node(n, dtypes.bool_)
    if where is not True:
        identity = first if op in ("max", "min") else Tracer(scalar_const(_IDENTITY[op], out_dt.np))
        src = as_node(np.where(_reduce_mask(where, n.shape), wrap(src), identity))
    if not axes:  # nothing to reduce (a 0-d array, or axis=()): the value itself
        r = wrap(src) if src is not n else wrap(node("copy", n.shape, n.dtype, (n,)))
    else:
        shape = tuple(d for i, d in enumerate(n.shape) if i not in axes)
        r = wrap(node("reduce", shape, out_dt, (src,), op=op, axes=axes))
    if first is not None:
        r = _COMBINE[op](r, first)
    return _keepdims(r, n.shape, axes, keepdims)


_IDENTITY = {"sum": 0, "prod": 1, "all": True, "any": False}
_COMBINE = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def _initial_value(initial: Any, dt: dtypes.DType) -> Any:
    """A reduction's `initial` as numpy casts it to the result's dtype `dt` (a float to an int truncates; a
    Python int beyond `dt` raises OverflowError)."""
    if isinstance(initial, Tracer) or np.ndim(initial) != 0:
        raise Unsupported("a reduction's initial= that is not a scalar constant")
    with np.errstate(over="ignore"):  # 1e40 as float32 is inf, as numpy makes it
        return np.array(initial, dtype=dt.np).item()


def _reduce_mask(where: Any, shape: tuple) -> Tracer:
    """A reduction's `where`: a boolean array that broadcasts to the reduced array's `shape`."""
    mask = as_node(where)
    if not mask.dtype.is_bool:
        raise TypeError(f"where= of a reduction must be boolean, got {mask.dtype.name} (numpy casts it to bool "
                        "only by the 'safe' rule)")
    if mask.ndim > len(shape) or broadcast_shapes(mask.shape, shape) != tuple(shape):
        raise ValueError(f"where= of shape {mask.shape} does not broadcast to the reduced array's shape {shape}")
    return wrap(mask)


def _keepdims(t: Tracer, shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> Tracer:
    if not keepdims:
        return t
    return reshape(t, tuple(1 if i in axes else d for i, d in enumerate(shape)))


def cast_node(n: Node, dt: dtypes.DType) -> Node:
    if n.prim == "const":  # folded by numpy: a Python int may be beyond int64, a NaN cast has numpy's value
        return node("const", (), dt, value=const_value(n, dt))
    return n if n.dtype is dt else node("cast", n.shape, dt, (n,))


def const_value(n: Node, dt: dtypes.DType) -> Any:
    """A constant node's value as numpy casts it (unsafely) to dt; a weak Python int is converted by numpy's
    rules for it (int64, uint64, else an object that numpy converts or refuses)."""
    v = n.param("value")
    src = np.asarray(v) if n.weak and type(v) is int else np.asarray(v, n.dtype.np)
    with np.errstate(all="ignore"):
        return src.astype(dt.np).item()


@implements(np.sum)
def sum_(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=True):
    return reduce(a, "sum", axis, dtype, keepdims, out, initial, where)


@implements(np.prod)
def prod(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=True):
    return reduce(a, "prod", axis, dtype, keepdims, out, initial, where)


@implements(np.max, np.amax)
def max_(a, axis=None, out=None, keepdims=False, initial=None, where=True):
    return reduce(a, "max", axis, None, keepdims, out, initial, where)


@implements(np.min, np.amin)
def min_(a, axis=None, out=None, keepdims=False, initial=None, where=True):
    return reduce(a, "min", axis, None, keepdims, out, initial, where)


@implements(np.all)
def all_(a, axis=None, out=None, keepdims=False, where=True):
    return reduce(a, "all", axis, None, keepdims, out, None, where)


@implements(np.any)
def any_(a, axis=None, out=None, keepdims=False, where=True):
    return reduce(a, "any", axis, None, keepdims, out, None, where)


@implements(np.mean)
def mean(a, axis=None, dtype=None, out=None, keepdims=False, where=True):
    n = as_node(a)
    axes = _axes(axis, n.ndim)
    acc = np.dtype(dtype) if dtype is not None else (np.dtype("float64") if n.dtype.kind in "biu" else n.dtype.np)
    total = reduce(a, "sum", axis, acc, keepdims, out, None, where)
    if where is not True:  # divided by the count of where's True elements, in float64, as numpy divides
        return _cast(np.true_divide(total, _masked_count(n, where, axis, keepdims)), acc)
    quotient = np.true_divide(total, size_value(_count(n, axes)))
    return quotient if dtype is None else _cast(quotient, dtype)


def _masked_count(n: Node, where: Any, axis: Any, keepdims: bool) -> Tracer:
    """The number of elements a reduction of `n` with a `where` mask takes (int64, as numpy's count)."""
    mask = np.broadcast_to(_reduce_mask(where, n.shape), n.shape)
    return reduce(mask, "sum", axis, np.int64, keepdims)


def _count(n: Node, axes: tuple[int, ...]) -> Any:
    """The number of elements reduced: a Python int, or a SymInt for a symbolic count."""
    return sh.sym(sh.prod(n.shape[i] for i in axes))


def size_value(d: Any) -> Any:
    """A size as a value in the graph: a Python int, or for a symbolic one a "dim" node (a Python int's
    promotion, NEP 50), computed by the kernel from its symbols, so a mean over a varying axis stays symbolic."""
    if type(d) is int:
        return d
    return Tracer(node("dim", (), dtypes.int64, weak=True, expr=sh.as_dim(d)))


mean_ = mean  # var's `mean` parameter hides the function


@implements(np.var)
def var(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=True, mean=None, correction=None):
    if out is not None or (mean is not None):
        raise Unsupported("np.var/np.std with out=/mean=")
    if correction is not None:
        if ddof != 0:
            raise ValueError("ddof and correction can't be provided simultaneously.")
        ddof = correction
    m = mean_(a, axis, dtype, keepdims=True, where=where)
    centered = np.subtract(a, m)
    n = as_node(a)
    sq = np.multiply(centered, centered)
    total = sum_(sq, axis, dtype, keepdims=keepdims, where=where)
    if where is not True:  # over the count of where's True elements less ddof, in float64, as numpy divides
        divisor = np.maximum(np.subtract(_masked_count(n, where, axis, keepdims), ddof), 0)
        return _cast(np.true_divide(total, divisor), as_node(total).dtype.np)
    count = _count(n, _axes(axis, n.ndim))
    if isinstance(ddof, (int, np.integer, sh.SymInt)):
        return np.true_divide(total, size_value(sh.sym_max(count - ddof, 0)))
    left = size_value(count) - ddof  # a fractional ddof (numpy's max(n - ddof, 0) in float)
    return np.true_divide(total, np.maximum(left, 0.0) if isinstance(left, Tracer) else max(left, 0.0))


@implements(np.std)
def std(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=True, mean=None, correction=None):
    return np.sqrt(var(a, axis, dtype, out, ddof, keepdims, where=where, mean=mean, correction=correction))


# ufunc.accumulate as a scan: the reduction of each (add and multiply widen small ints as np.sum does)
_ACCUMULATED = {"add": "sum", "multiply": "prod", "maximum": "max", "minimum": "min", "fmax": "fmax", "fmin": "fmin"}


def _accumulate(ufunc: np.ufunc, a: Any, axis: Any = 0, dtype: Any = None, out: Any = None) -> Tracer:
    """np.maximum.accumulate(a, axis) & co. (np.add.accumulate is np.cumsum along axis 0 by default)."""
    if np.ndim(a) == 0:
        raise TypeError("cannot accumulate on a scalar")
    if axis is None and np.ndim(a) == 1:
        axis = 0
    if axis is None or isinstance(axis, tuple):
        raise ValueError("accumulate does not allow multiple axes")
    op = _ACCUMULATED[ufunc.__name__]
    if dtype is not None or op in ("sum", "prod"):
        return _scan(a, op, axis, dtype, out)
    dt = array_node(a).dtype.np
    if dt == np.bool_:  # (a running or / and: as 0s and 1s)
        return _scan(astype(a, np.uint8), op, axis, np.uint8, out).astype(np.bool_)
    return _scan(a, op, axis, dt, out)


def _scan(a: Any, op: str, axis: Any, dtype: Any, out: Any) -> Tracer:
    """np.cumsum / np.cumprod (and ufunc.accumulate): a "scan" node along its axis, in the dtype numpy accumulates
    in (small ints and bool widen as np.sum does, unless `dtype` says)."""
    if out is not None:
        raise Unsupported(f"a running {op} with out=")
    n = as_node(a)
    if axis is None or n.ndim == 0:  # numpy takes a 0-d array as 1-d (axis 0 or -1, else its AxisError)
        if axis is not None:
            _axes(axis, 1)
        n, axis = as_node(ravel(a)), 0
    (axis,) = _axes(axis, n.ndim)
    dt = _dtype(np.dtype(dtype)) if dtype is not None else _sum_dtype(n.dtype)
    return wrap(node("scan", tuple(n.shape), dt, (cast_node(n, dt),), op=op, axis=axis))


@implements(np.cumsum)
def cumsum(a, axis=None, dtype=None, out=None):
    return _scan(a, "sum", axis, dtype, out)


@implements(np.cumprod)
def cumprod(a, axis=None, dtype=None, out=None):
    return _scan(a, "prod", axis, dtype, out)


def _argreduce(a: Any, op: str, axis: Any, keepdims: bool) -> Tracer:
    n = as_node(a)
    if n.ndim == 0:  # numpy takes a 0-d array as 1-d here: axis 0 or -1, and no dimension to keep
        _axes(axis, 1) if axis is not None else None
        return wrap(node("const", (), dtypes.int64, value=0))
    if axis is None and keepdims:
        return reshape(_argreduce(a, op, None, False), (1,) * n.ndim)
    if axis is None:
        n = reshape(wrap(n), (-1,)).node
        axis = 0
    ax = _axes(axis, n.ndim)[0]
    if sh.known_zero(n.shape[ax]):
        raise ValueError(f"attempt to get {op} of an empty sequence")
    shape = tuple(d for i, d in enumerate(n.shape) if i != ax)
    r = wrap(node("argreduce", shape, dtypes.int64, (n,), op=op, axis=ax))
    return _keepdims(r, n.shape, (ax,), keepdims)


@implements(np.argmax)
def argmax(a, axis=None, out=None, *, keepdims=False):
    return _argreduce(a, "argmax", axis, keepdims)


@implements(np.argmin)
def argmin(a, axis=None, out=None, *, keepdims=False):
    return _argreduce(a, "argmin", axis, keepdims)


# ** shapes **

@implements(np.reshape)
def reshape(a, *shape, order="C", newshape=None, copy=None):
    if order != "C":
        raise Unsupported(f"reshape with order={order!r}")
    n = as_node(a)
    if newshape is not None:
        shape = (newshape,)
    target = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    target = (sh.as_dim(target),) if isinstance(target, (int, sh.SymInt)) else tuple(sh.as_dim(d) for d in target)
    if all(type(d) is int for d in target + n.shape):
        target = reshape_target(target, n.size)
    else:
        target = _reshape_target_symbolic(target, n.shape)
    if sh.same_shape(target, n.shape):
        return Tracer(n, array0d=array_kind(a), order=order_of(a))
    return Tracer(node("reshape", target, n.dtype, (n,)), array0d=array_kind(a), order=order_of(a))


def _reshape_target_symbolic(target: tuple, source: tuple) -> tuple:
    """The target shape of a reshape with symbolic dims: -1 is `size // known`, with `size % known == 0`
    required; the element counts are made equal (a tie or a guard) or numpy's error."""
    size = sh.prod(source)
    def error() -> ValueError:
        return ValueError(f"cannot reshape array of size {size!r} into shape {sh.show(target)}")
    unknown = [k for k, d in enumerate(target) if type(d) is int and d == -1]
    if len(unknown) > 1:
        raise ValueError("can only specify one unknown dimension")
    if unknown:
        known = sh.prod(d for k, d in enumerate(target) if k != unknown[0])
        if sh.known_zero(known):
            raise error()
        num_f, den_f = list(source), []  # dims on both sides cancel: (B, T, C) -> (B, -1) is T * C
        for d in (d for k, d in enumerate(target) if k != unknown[0]):
            same = next((i for i, f in enumerate(num_f) if type(d) is not int and sh.provably_same(f, d)), None)
            if same is None:
                den_f.append(d)
            else:
                del num_f[same]
        num, den = sh.prod(num_f), sh.prod(den_f)
        num, den = sh.reduce_fraction(num, den)
        if not sh.same(sh.sym(num) % sh.sym(den), 0):
            raise error()
        # the product equals the size where the division is exact: no other record
        return tuple(sh.resolved(sh.as_dim(sh.sym(num) // sh.sym(den)) if k == unknown[0] else d)
                     for k, d in enumerate(target))
    if not sh.require_eq(sh.prod(target), size, "reshape"):
        raise error()
    return tuple(sh.resolved(d) for d in target)


@implements(np.ravel)
def ravel(a, order="C"):
    return reshape(a, (-1,), order=order)


@implements(np.transpose)
def transpose(a, axes=None):
    n = as_node(a)
    if axes is not None and len(axes) != n.ndim:
        raise ValueError("axes don't match array")
    perm = tuple(reversed(range(n.ndim))) if axes is None else tuple(_axes(x, n.ndim)[0] for x in axes)
    if sorted(perm) != list(range(n.ndim)):
        raise ValueError("repeated axis in transpose")
    if perm == tuple(range(n.ndim)):
        return Tracer(n, array0d=array_kind(a), order=order_of(a))
    return Tracer(node("transpose", tuple(n.shape[p] for p in perm), n.dtype, (n,), perm=perm), array0d=True,
                  order=order_of(a))


@implements(np.swapaxes)
def swapaxes(a, axis1, axis2):
    n = as_node(a)
    perm = list(range(n.ndim))
    i, j = _axes(axis1, n.ndim)[0], _axes(axis2, n.ndim)[0]
    perm[i], perm[j] = perm[j], perm[i]
    return transpose(a, perm)


@implements(np.moveaxis)
def moveaxis(a, source, destination):
    n = as_node(a)
    src = [_axes(s, n.ndim)[0] for s in (source if isinstance(source, (list, tuple)) else [source])]
    dst = [_axes(d, n.ndim)[0] for d in (destination if isinstance(destination, (list, tuple)) else [destination])]
    if len(src) != len(dst):
        raise ValueError("`source` and `destination` arguments must have the same number of elements")
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ValueError("repeated axis in `source` argument" if len(set(src)) != len(src)
                         else "repeated axis in `destination` argument")
    order = [i for i in range(n.ndim) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return transpose(a, order)


@implements(np.expand_dims)
def expand_dims(a, axis):
    n = as_node(a)
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    ndim = n.ndim + len(axes)
    try:
        axes = set(_axes(axes, ndim))
    except ValueError as err:
        if isinstance(err, np.exceptions.AxisError):
            raise
        raise ValueError("repeated axis") from None
    it = iter(n.shape)
    return reshape(a, tuple(1 if i in axes else next(it) for i in range(ndim)))


@implements(np.squeeze)
def squeeze(a, axis=None):
    n = as_node(a)
    if n.ndim == 0 and type(axis) is int and axis in (0, -1):
        return Tracer(n, array0d=array_kind(a), order=order_of(a))
    axes = [i for i, d in enumerate(n.shape) if sh.is_one(d)] if axis is None else list(_axes(axis, n.ndim))
    for i in axes:
        if not sh.is_one(n.shape[i]):
            raise ValueError("cannot select an axis to squeeze out which has size not equal to one")
    return reshape(a, tuple(d for i, d in enumerate(n.shape) if i not in axes))


@implements(np.broadcast_to)
def broadcast_to(a, shape, subok=False):
    n = as_node(a)
    shape = (sh.as_dim(shape),) if isinstance(shape, (int, sh.SymInt)) else tuple(sh.as_dim(d) for d in shape)
    if not sh.same_shape(broadcast_shapes(n.shape, shape), shape):
        raise ValueError(f"cannot broadcast array of shape {sh.show(n.shape)} to {sh.show(shape)}")
    shape = tuple(sh.resolved(d) for d in shape)
    return Tracer(n if sh.same_shape(n.shape, shape) else node("broadcast", shape, n.dtype, (n,)), array0d=True, order=order_of(a))


@implements(np.concatenate)
def concatenate(arrays, axis=0, out=None, dtype=None, casting="same_kind"):
    if out is not None:
        raise Unsupported("np.concatenate(..., out=...)")
    nodes = [array_node(a) for a in arrays]
    if not nodes:
        raise ValueError("need at least one array to concatenate")
    if axis is None:
        nodes = [reshape(wrap(n), (-1,)).node for n in nodes]
        axis = 0
    if any(n.ndim == 0 for n in nodes):
        raise ValueError("zero-dimensional arrays cannot be concatenated")
    ax = _axes(axis, nodes[0].ndim)[0]
    dt = _dtype(np.result_type(*(_promotion_operand(n) for n in nodes)))
    if dtype is not None:
        dt = _dtype(np.dtype(dtype))
    base = nodes[0].shape
    for n in nodes:
        if n.ndim != len(base) or any(not sh.require_eq(d, b, "concatenate")
                                      for i, (d, b) in enumerate(zip(n.shape, base)) if i != ax):
            raise ValueError("all the input array dimensions except for the concatenation axis must match exactly")
    base = tuple(sh.resolved(d) for d in base)
    shape = base[:ax] + (sh.as_dim(builtins.sum(sh.sym(n.shape[ax]) for n in nodes)),) + base[ax + 1:]
    if sh.known_zero(sh.prod(shape)):  # no element: nothing of the parts is computed
        return full_node(shape, 0, dt)
    parts = tuple(cast_node(n, dt) for n in nodes if sh.known_nonzero(n.shape[ax]))  # an empty part adds nothing
    return wrap(node("concat", shape, dt, parts, axis=ax))


@implements(np.pad)
def pad(array, pad_width, mode="constant", **kwargs):
    """numpy's padding, each axis in turn (so a corner takes the later axis's value, as in numpy): blocks of
    constants (mode='constant'), or a gather of the positions numpy's own np.pad of the axis's indices gives
    ('edge', 'reflect', 'symmetric', 'wrap'). The statistic and ramp modes run as numpy."""
    if mode in _INDEXED_PADS and kwargs.get("reflect_type", "even") == "even" and not set(kwargs) - {"reflect_type"}:
        return _indexed_pad(array, pad_width, mode)
    if mode != "constant" or set(kwargs) - {"constant_values"}:
        raise Unsupported(f"np.pad(mode={mode!r}{''.join(f', {k}=' for k in kwargs if k != 'constant_values')})",
                          f"modes 'constant' and {', '.join(map(repr, _INDEXED_PADS))} compile")
    x = wrap(array_node(array))
    widths, values = _pad_pairs(pad_width, x.node.ndim), kwargs.get("constant_values", 0)
    if isinstance(values, Tracer) and values.node.ndim == 0:  # one traced value for every side
        values = ((values, values),) * x.node.ndim
    else:  # numpy's pairs: a value, a pair, or a pair per axis
        values = np.broadcast_to(np.asarray(values), (x.node.ndim, 2))
    for axis, ((before, after), (low, high)) in enumerate(zip(widths, values)):
        if before or after:
            parts = [_pad_block(x, axis, before, low)] * bool(before) + [x] + \
                [_pad_block(x, axis, after, high)] * bool(after)
            x = concatenate(parts, axis=axis)
    return x


_INDEXED_PADS = ("edge", "reflect", "symmetric", "wrap")


def _indexed_pad(array: Any, pad_width: Any, mode: str) -> Tracer:
    """A padding that copies the array's own elements: along each axis, the positions numpy's np.pad of
    arange(n) gives (its errors too, such as an empty axis), gathered."""
    from jitop.graph.take import take  # take builds on this module
    x = wrap(array_node(array))
    for axis, (before, after) in enumerate(_pad_pairs(pad_width, x.node.ndim)):
        if before or after:
            n = x.node.shape[axis]
            if type(n) is not int:
                raise Unsupported(f"np.pad(mode={mode!r}) along a dimension that varies",
                                  "mark the argument's size static (dynamic=False)")
            x = take(x, np.pad(np.arange(n), (before, after), mode=mode), axis=axis)
    return x


def _pad_block(x: Tracer, axis: int, width: int, value: Any) -> Tracer:
    """A block of `value` of x's shape and dtype, `width` long along `axis`."""
    shape = x.node.shape
    return full_node(shape[:axis] + (width,) + shape[axis + 1:], value, x.node.dtype)


def _pad_pairs(pad_width: Any, ndim: int) -> np.ndarray:
    """np.pad's (before, after) per axis from an int, a pair or a pair per axis, checked as numpy checks it."""
    if isinstance(pad_width, Tracer) or any(isinstance(w, Tracer) for w in np.ravel(np.asarray(pad_width, object))):
        raise Unsupported("np.pad with a traced pad width", "pass the widths as Python ints (or mark them static)")
    widths = np.asarray(pad_width)
    if widths.dtype.kind not in "iu":
        raise TypeError("`pad_width` must be of integral type.")
    if (widths < 0).any():
        raise ValueError("index can't contain negative values")
    return np.broadcast_to(widths, (ndim, 2)).tolist()


@implements(np.outer)
def outer(a, b, out=None):
    if out is not None:
        raise Unsupported("np.outer(..., out=...)")
    x, y = reshape(wrap(array_node(a)), (-1,)), reshape(wrap(array_node(b)), (-1,))
    return ufunc_call(np.multiply, [expand_dims(x, 1).node, expand_dims(y, 0).node])


@implements(np.stack)
def stack(arrays, axis=0, out=None, dtype=None):
    arrays = [wrap(array_node(a)) for a in arrays]
    if not arrays:
        raise ValueError("need at least one array to stack")
    first = as_node(arrays[0]).shape
    if not all(sh.same_shape(as_node(a).shape, first) for a in arrays):
        raise ValueError("all input arrays must have the same shape")
    ndim = as_node(arrays[0]).ndim + 1
    ax = _axes(axis, ndim)[0]
    return concatenate([expand_dims(a, ax) for a in arrays], axis=ax, dtype=dtype)


@implements(np.hstack)
def hstack(tup, dtype=None, casting="same_kind"):
    arrs = [_at_least(a, 1) for a in tup]
    return concatenate(arrs, axis=0 if arrs and arrs[0].node.ndim == 1 else 1, dtype=dtype)


@implements(np.vstack)
def vstack(tup, dtype=None, casting="same_kind"):
    return concatenate([_at_least(a, 2) for a in tup], axis=0, dtype=dtype)


def _at_least(a: Any, ndim: int) -> Tracer:
    """np.atleast_1d/2d of one array-like: leading axes of length 1 (a itself if it has enough)."""
    t = Tracer(array_node(a), array0d=True, order=order_of(a))
    n = t.node
    return reshape(t, (1,) * (ndim - n.ndim) + n.shape) if n.ndim < ndim else t


@implements(np.atleast_1d)
def atleast_1d(*arys):
    out = tuple(_at_least(a, 1) for a in arys)
    return out[0] if len(out) == 1 else out


@implements(np.atleast_2d)
def atleast_2d(*arys):
    out = tuple(_at_least(a, 2) for a in arys)
    return out[0] if len(out) == 1 else out


@implements(np.split)
def split(a, indices_or_sections, axis=0):
    if isinstance(indices_or_sections, Tracer):
        indices_or_sections._concrete("np.split's indices_or_sections")
    if isinstance(indices_or_sections, sh.SymInt):  # the number of parts the function gets back: an int
        indices_or_sections = indices_or_sections.specialise("np.split's number of sections")
    n = as_node(a)
    ax = _axes(axis, n.ndim)[0]
    size = n.shape[ax]
    if isinstance(indices_or_sections, int) and type(size) is int:
        if size % indices_or_sections:
            raise ValueError("array split does not result in an equal division")
        step = size // indices_or_sections
        bounds = list(range(0, size + 1, step)) if step else [0] * (indices_or_sections + 1)
    elif isinstance(indices_or_sections, int):  # a symbolic axis: n % sections == 0 is required
        if not sh.same(sh.sym(size) % indices_or_sections, 0):
            raise ValueError("array split does not result in an equal division")
        step = sh.sym(size) // indices_or_sections
        return [Tracer(n, array0d=True, order=order_of(a))[(slice(None),) * ax + (slice(k * step, (k + 1) * step),)]
                for k in range(indices_or_sections)]
    else:  # an index beyond a symbolic axis: min/max decide at this call's size (recorded)
        bounds = [0] + [builtins.min(int(i), sh.sym(size)) for i in indices_or_sections] + [sh.sym(size)]
    parts = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        # max(lo, hi), with `hi >= lo` decided (a symbolic max would record the stricter hi > lo)
        hi = builtins.max(lo, hi) if type(lo) is int and type(hi) is int else (hi if hi >= lo else lo)
        key = (slice(None),) * ax + (slice(lo, hi),)
        parts.append(Tracer(n, array0d=True, order=order_of(a))[key])
    return parts


@implements(np.flip)
def flip(m, axis=None):
    n = as_node(m)
    axes = _axes(axis, n.ndim)
    key = tuple(slice(None, None, -1) if i in axes else slice(None) for i in range(n.ndim))
    return Tracer(n, array0d=True, order=order_of(m))[key]


@implements(np.where)
def where(condition, x=None, y=None):
    if x is None or y is None:
        raise Unsupported("np.where(condition) with one argument (data-dependent output shape)")
    c, a, b = as_node(condition), as_node(x), as_node(y)
    dt = _dtype(np.result_type(_promotion_operand(a), _promotion_operand(b)))
    shape = broadcast_shapes(c.shape, a.shape, b.shape)
    return Tracer(node("where", shape, dt, (cast_node(c, dtypes.bool_), cast_node(a, dt), cast_node(b, dt))),
                  array0d=True)


def _promotion_operand(n: Node) -> Any:
    """For np.result_type: the dtype, or for a weak Python scalar a Python value of its kind (NEP 50)."""
    if not n.weak:
        return n.dtype.np
    return False if n.dtype.is_bool else (0 if n.dtype.is_int else 0.0)


@implements(np.clip)
def clip(a, a_min=None, a_max=None, out=None, **kwargs):
    if out is not None:
        raise Unsupported("np.clip(..., out=...)")
    a_min = kwargs.pop("min", a_min)
    a_max = kwargs.pop("max", a_max)
    if kwargs:
        raise Unsupported(f"np.clip with arguments {sorted(kwargs)}")
    n = array_node(a)  # np.clip(7, ...) clips np.asarray(7): an int64 array, not a weak Python int
    a = wrap(n)
    if n.dtype.is_int:  # numpy: a Python int bound beyond the array's dtype is no bound (NEP 50)
        info = np.iinfo(n.dtype.np)
        if type(a_min) is int and a_min <= info.min:
            a_min = None
        if type(a_max) is int and a_max >= info.max:
            a_max = None
        a_min, a_max = _int_bound(a_min, n.dtype, lower=True), _int_bound(a_max, n.dtype, lower=False)
    if a_min is None and a_max is None:
        return np.positive(a)
    if a_min is None:
        return np.minimum(a, a_max)
    if a_max is None:
        return np.maximum(a, a_min)
    # numpy's three-operand clip ufunc decides the dtype of all three together
    srcs = [n, as_node(a_min), as_node(a_max)]
    ins, outs, srcs = _resolve(np._core.umath.clip, srcs, None)
    x, lo, hi = (cast_node(s, _dtype(d)) for s, d in zip(srcs, ins))
    # a tie (0.0 against -0.0) gives what numpy's loop gives, which depends on how it steps through the
    # bounds: holding both fixed, x (np.clip(np.zeros(4), -0.0, 3) is +0.0); else the bound
    # (np.clip(np.zeros(4), -np.zeros(4), 3) is -0.0). np.maximum/np.minimum give their second operand on a tie.
    shapes = [_sized(s.shape) for s in (x, lo, hi)]
    if _steps_through(shapes[1], shapes) or _steps_through(shapes[2], shapes):
        return ufunc_call(np.minimum, [ufunc_call(np.maximum, [x, lo]).node, hi])
    return ufunc_call(np.minimum, [hi, ufunc_call(np.maximum, [lo, x]).node])


def _sized(shape: tuple) -> tuple[int, ...]:
    """A shape with each symbolic dim as 2 (a symbol is never 0 or 1)."""
    return tuple(d if isinstance(d, int) else 2 for d in shape)


def _steps_through(bound: tuple[int, ...], shapes: list[tuple[int, ...]]) -> bool:
    """Whether numpy's clip loop reads a bound of this shape as a stepped operand rather than one fixed
    value (measured on numpy 2.x): it does for a bound of more than one element, and for a one-element bound
    of at least one dim when no operand is broadcast (all shapes but 0-d ones equal); a 0-d bound, or a
    one-element one broadcast with the others, is held fixed."""
    if math.prod(bound) > 1:
        return True
    arrays = [s for s in shapes if s]
    return bool(bound) and all(s == arrays[0] for s in arrays)


def _int_bound(bound: Any, dt: dtypes.DType, lower: bool) -> Any:
    """A run-time Python int bound of np.clip on an integer array, as numpy's clip treats its value: one
    beyond the dtype on the outer side is no bound (clamped here), one beyond on the inner side is numpy's
    OverflowError (checked when the kernel runs)."""
    if not (isinstance(bound, Tracer) and bound.node.weak and bound.node.dtype.is_int):
        return bound
    info, wide = np.iinfo(dt.np), np.iinfo(np.int64)
    inner = info.max if lower else info.min
    x = fit_int(bound.node, None if lower else inner, inner if lower else None, dt.np)
    outer = info.min if lower else info.max
    if wide.min < outer < wide.max:
        x = ufunc_call(np.maximum if lower else np.minimum, [x, node("const", (), dtypes.int64, value=outer)]).node
    return wrap(cast_node(x, dt))


def fit_int(n: Node, lo: int | None, hi: int | None, dt: np.dtype) -> Node:
    """A run-time Python int (an int64 node) checked, when the kernel runs, to lie in [lo, hi]: else numpy's
    OverflowError for a Python int beyond dtype dt."""
    from jitop.graph.ufuncs import fit_name
    wide = np.iinfo(np.int64)
    lo = None if lo is None or lo <= wide.min else lo
    hi = None if hi is None or hi >= wide.max else hi
    if lo is None and hi is None:
        return n
    return node("ufunc", (), dtypes.int64, (n,), name=fit_name(lo, hi, dt.name), in_dtypes=("int64",))


@implements(np.round, np.around)
def round_(a, decimals=0, out=None):
    if out is not None:
        raise Unsupported("np.round(..., out=...)")
    n = array_node(a)
    if n.dtype.is_bool and decimals != 0:
        np.round(np.zeros((), bool), decimals)  # numpy refuses (a casting error): let it raise its own
    if decimals == 0 and not n.dtype.is_int:
        return np.rint(wrap(n))
    if n.dtype.is_int and decimals >= 0:
        r = n
    elif n.dtype.is_int:  # round to tens/hundreds..., half to even, as numpy
        scale = 10 ** -decimals
        r = _cast(np.multiply(np.rint(np.true_divide(_cast(wrap(n), np.float64), scale)), scale), n.dtype.np).node
    else:
        scale = 10.0 ** decimals
        x = wrap(n)
        r = (np.true_divide(np.rint(np.multiply(x, scale)), scale) if decimals > 0 else
             np.multiply(np.rint(np.true_divide(x, 10.0 ** -decimals)), 10.0 ** -decimals)).node
    # numpy rounds into an array of a's dtype (its byte order too)
    return Tracer(r, order=order_of(a))


def _cast(a: Any, dtype: Any) -> Tracer:
    """An internal conversion (its 0-d result is a scalar, unlike the user's .astype())."""
    return wrap(cast_node(as_node(a), _dtype(np.dtype(dtype))))


def astype(a, dtype, order="K", casting="unsafe", subok=True, copy=True):
    n = as_node(a)
    dt = np.dtype(dtype)
    cast = cast_node(n, _dtype(dt))
    if cast is n and copy:  # a new array, not `a` (an assignment to one does not change the other)
        cast = mutation.fresh(n)
    return Tracer(cast, array0d=array_kind(a), order=None if dt.isnative else dt)


@implements(np.shape)
def shape_(a):
    return tuple(sh.sym(d) for d in as_node(a).shape)  # symbolic dims as SymInts, like Tracer.shape


@implements(np.ndim)
def ndim_(a):
    return as_node(a).ndim


@implements(np.size)
def size_(a, axis=None):
    n = as_node(a)
    return sh.sym(n.size if axis is None else n.shape[axis])


# ** matmul family **

@implements(np.matmul)
def matmul(a, b, out=None, dtype=None, **kwargs):
    if out is not None:
        raise Unsupported("np.matmul(..., out=...)")
    if dtype is not None:
        return matmul(_cast(a, dtype), _cast(b, dtype))
    x, y = as_node(a), as_node(b)
    _resolve(np.matmul, [x, y], None)  # numpy converts Python ints first (OverflowError beyond the dtype)
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError("matmul: Input operand does not have enough dimensions")
    dt = _dtype(np.result_type(x.dtype.np, y.dtype.np))
    x1, y1 = x.ndim == 1, y.ndim == 1
    if x1:
        x = reshape(wrap(x), (1, x.shape[0])).node
    if y1:
        y = reshape(wrap(y), (y.shape[0], 1)).node
    if not sh.require_eq(x.shape[-1], y.shape[-2], "matmul core dimension"):
        raise ValueError(f"matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc signature "
                         f"(n?,k),(k,m?)->(n?,m?) (size {y.shape[-2]!r} is different from {x.shape[-1]!r})")
    batch = broadcast_shapes(x.shape[:-2], y.shape[:-2])
    shape = batch + (x.shape[-2], y.shape[-1])
    if _rows_of_transposed(x, y):
        r = _dot_rows(cast_node(x, dt), cast_node(y.src[0], dt), dt)
    elif _is_column(y, dt):
        # A @ v: each result is the dot product of a row of A with v (a GEMV), where the template would pad
        # its one column to a vector of columns
        r = _dot_rows(cast_node(x, dt), cast_node(swapaxes(wrap(y), -1, -2).node, dt), dt)
    elif _is_transposed(y) and x.ndim == 2 == y.ndim and sh.rep_le(4 * x.shape[0], y.shape[1]):
        # x @ w.T = (w @ x.T).T: the template gathers its B operand into panels, here x.T, much the smaller
        ct = node("matmul", shape[::-1], dt, (cast_node(y.src[0], dt), cast_node(transpose(wrap(x)).node, dt)))
        r = transpose(wrap(ct))
    else:
        r = wrap(node("matmul", shape, dt, (cast_node(x, dt), cast_node(y, dt))))
    if x1:
        r = squeeze(r, -2)
    if y1:
        r = squeeze(r, -1)
    return wrap(r.node)  # 1-D @ 1-D is a scalar in numpy


SMALL_M = 4  # up to this many rows, x @ w.T is computed as dot products of rows


def _is_transposed(y: Node) -> bool:
    """y is w.T (its last two axes swapped) of a w stored row by row, like a dense layer's weights."""
    if y.prim != "transpose":
        return False
    perm = y.param("perm")
    return perm == tuple(range(len(perm) - 2)) + (len(perm) - 1, len(perm) - 2)


def _rows_of_transposed(x: Node, y: Node) -> bool:
    """x has few rows and y is w.T: C[i, j] is the dot product of two contiguous rows, so a vectorized
    row reduction reads w once, in place, where the matmul template would gather w.T into panels first."""
    return _is_transposed(y) and sh.rep_le(x.shape[-2], SMALL_M) and (x.dtype.is_float or x.dtype.is_int)


def _is_column(y: Node, dt) -> bool:
    """y has one column (a vector on the right of a matmul; a symbolic count decides at its representative size,
    as the other forms do: the row reduction is right for any count) of a float or int result."""
    return sh.rep_le(y.shape[-1], 1) and (dt.is_float or dt.is_int)


def _dot_rows(x: Node, w: Node, dt) -> Tracer:
    rows = expand_dims(wrap(x), -2)    # (..., m, 1, k)
    cols = expand_dims(wrap(w), -3)    # (..., 1, n, k)
    return reduce(ufunc_call(np.multiply, [rows.node, cols.node]), "sum", axis=-1, dtype=dt.np)


@implements(np.dot)
def dot(a, b, out=None):
    x, y = array_node(a), array_node(b)
    if x.ndim == 0 or y.ndim == 0:  # np.dot makes Python scalars arrays (strong dtypes)
        return ufunc_call(np.multiply, [x, y])
    if x.ndim <= 2 and y.ndim <= 2:
        return matmul(a, b)
    # the sum over a's last axis and b's second-to-last (its only one for a vector), as an einsum
    free_a, free_b = "abcdefghijklmnopqrstuvwxy"[:x.ndim - 1], "ABCDEFGHIJKLMNOPQRSTUVWXY"[:max(y.ndim - 2, 0)]
    last_b = "Z" if y.ndim >= 2 else ""
    return einsum(f"{free_a}z,{free_b}z{last_b}->{free_a}{free_b}{last_b}", a, b)


@implements(np.einsum)
def einsum(subscripts, *operands, **kwargs):
    from jitop.graph.einsum import einsum as impl
    r = impl(subscripts, *operands, **kwargs)
    return wrap(as_node(r)) if isinstance(r, Tracer) else r  # a full contraction is a scalar


# ** creation **

def _creation_dtype(dtype: Any, default: str = "float64") -> dtypes.DType:
    return _dtype(np.dtype(default if dtype is None else dtype))


class TracingNumpy:
    """numpy as a traced function sees it under its own name (`np.zeros(...)` in the function's code): arrays it
    creates are tracers, so the function can fill them in place (`out[i] = ...`); everything else is numpy's.
    An array of a dtype jitop does not compile is numpy's own (a constant of the trace).

    >>> TRACING_NUMPY.float32 is np.float32
    True
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    def zeros(self, shape, dtype=float, order="C", **kwargs):
        return self.full(shape, 0, dtype if dtype is not None else float, order, **kwargs)

    def ones(self, shape, dtype=None, order="C", **kwargs):
        return self.full(shape, 1, dtype if dtype is not None else float, order, **kwargs)

    def empty(self, shape, dtype=float, order="C", **kwargs):
        return self.zeros(shape, dtype, order, **kwargs)

    def arange(self, *args, dtype=None, **kwargs):
        """np.arange with a symbolic bound (a size symbol: `np.arange(n)`, `np.arange(t, t + 8)`) as a traced
        range; with int bounds it is numpy's (a constant)."""
        for a in args:
            if isinstance(a, Tracer):  # a Python int argument: made static on use (a size symbol if it varies)
                a._concrete("np.arange's bounds")
        if kwargs or not any(isinstance(a, sh.SymInt) for a in args) or not 1 <= len(args) <= 3 or \
                not all(isinstance(a, (int, sh.SymInt)) and not isinstance(a, bool) for a in args):
            return np.arange(*args, dtype=dtype, **kwargs)
        start, stop, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
        if isinstance(step, sh.SymInt) or step == 0:
            step = int(step)  # (specialised; numpy's error for 0)
            if step == 0:
                raise ZeroDivisionError("division by zero")
        length = (stop - start + step - (1 if step > 0 else -1)) // step
        length = length if length >= 0 else 0  # (decided at this call's values: recorded)
        values = wrap(node("iota", (sh.as_dim(length),), dtypes.int64, axis=0)) * step + start
        return values if dtype is None else astype(values, np.dtype(dtype))

    def full(self, shape, fill_value, dtype=None, order="C", **kwargs):
        traced = isinstance(fill_value, Tracer)
        if dtype is not None:
            dt = np.dtype(dtype)
        elif traced:
            dt = np.dtype(fill_value.python_type()) if fill_value.node.weak else fill_value.dtype
        else:
            dt = np.asarray(fill_value).dtype
        if kwargs or dt.name not in dtypes.DTYPES or not (traced or type(fill_value) in (bool, int, float)):
            return np.full(shape, fill_value, dtype, order, **kwargs)
        return full_node(shape, fill_value, _dtype(dt))


TRACING_NUMPY = TracingNumpy()


def full_node(shape: Any, value: Any, dt: dtypes.DType) -> Tracer:
    one = isinstance(shape, (int, sh.SymInt)) or isinstance(shape, Tracer) and shape.node.ndim == 0  # np.zeros(n)
    shape = (sh.as_dim(shape),) if one else tuple(sh.as_dim(d) for d in shape)
    if isinstance(value, Tracer):
        v = value.node
        if v.weak and v.dtype.is_int and dt.is_int and dt is not dtypes.int64:
            # np.copyto(..., casting="unsafe") still refuses a Python int beyond the dtype: the call checks it
            return broadcast_to(wrap(node("cast", (), dt, (v,), fit=True)), shape)
        return broadcast_to(astype(value, dt.np), shape)
    c = node("const", (), dt, value=fill_value(value, dt))
    # a new array each time (np.zeros twice is two arrays, an assignment to one leaves the other)
    if shape == ():
        return Tracer(mutation.fresh(c), array0d=True)
    return wrap(mutation.fresh(node("broadcast", shape, dt, (c,))))


def fill_value(value: Any, dt: dtypes.DType) -> Any:
    """A Python or numpy scalar as np.copyto(..., casting="unsafe") stores it in dt (numpy's errors included)."""
    if type(value) is int and dt.is_int and not np.iinfo(dt.np).min <= value <= np.iinfo(dt.np).max:
        raise python_int_overflow(value, dt.np)
    if type(value) is int and not -(1 << 63) <= value < (1 << 63) and dt.is_bool:
        raise python_int_overflow(value, np.dtype("int64"))
    with np.errstate(all="ignore"):
        return np.asarray(value).astype(dt.np).item()


def _like(a: Any, value: Any, dtype: Any, shape: Any) -> Tracer:
    """np.full_like(a, value, dtype, shape=shape): a's dtype (byte order included) unless dtype is given."""
    n = as_node(a)
    t = full_node(n.shape if shape is None else shape, value, _creation_dtype(dtype, n.dtype.name))
    order = order_of(a) if dtype is None else (None if np.dtype(dtype).isnative else np.dtype(dtype))
    return Tracer(t.node, array0d=True, order=order) if order is not None else t


@implements(np.zeros_like)
def zeros_like(a, dtype=None, order="K", subok=True, shape=None, *, device=None):
    return _like(a, 0, dtype, shape)


@implements(np.ones_like)
def ones_like(a, dtype=None, order="K", subok=True, shape=None, *, device=None):
    return _like(a, 1, dtype, shape)


@implements(np.empty_like)
def empty_like(a, dtype=None, order="K", subok=True, shape=None, *, device=None):
    return _like(a, 0, dtype, shape)


@implements(np.full_like)
def full_like(a, fill_value, dtype=None, order="K", subok=True, shape=None, *, device=None):
    return _like(a, fill_value, dtype, shape)


@implements(np.copyto)
def copyto(dst, src, casting="same_kind", where=True):
    """np.copyto into a traced array: numpy's casting rule (its error, found by numpy on empty arrays) and
    broadcasting, then an assignment (jitop.graph.mutation)."""
    if not isinstance(dst, Tracer) or where is not True:
        raise Unsupported("np.copyto into an array the kernel does not trace, or with where=")
    np.copyto(np.empty(0, dst.dtype), mutation.sample(src), casting=casting)  # numpy's error for a cast it refuses
    mutation.assign(dst, Ellipsis, src)


@implements(np.copy)
def copy(a, order="K", subok=False):
    return Tracer(mutation.fresh(as_node(a)), array0d=True, order=order_of(a))


def copy_method(a, order="C"):
    # a numpy scalar's .copy() is a scalar
    return Tracer(mutation.fresh(as_node(a)), array0d=array_kind(a), order=order_of(a))


def flatten(a, order="C"):
    return copy_method(ravel(a, order=order))


@implements(np.tril)
def tril(m, k=0):
    return _tri_mask(m, k, lower=True)


@implements(np.triu)
def triu(m, k=0):
    return _tri_mask(m, k, lower=False)


def _tri_mask(m: Any, k: int, lower: bool) -> Tracer:
    n = as_node(m)
    rows, cols = n.shape[-2], n.shape[-1]
    i = wrap(node("iota", (rows, cols), dtypes.int64, axis=0))
    j = wrap(node("iota", (rows, cols), dtypes.int64, axis=1))
    keep = np.less_equal(j, np.add(i, k)) if lower else np.greater_equal(j, np.add(i, k))
    return where(keep, m, zeros_like(m))


def _method(name: str, fn: Callable) -> None:
    def method(self, *args, **kwargs):
        if self.node.weak:  # a Python scalar has no array methods
            self.no_attribute(name)
        return fn(self, *args, **kwargs)
    method.__name__ = name
    setattr(Tracer, name, method)


def _install_methods() -> None:
    for name, fn in (("sum", sum_), ("prod", prod), ("max", max_), ("min", min_), ("all", all_), ("any", any_),
                     ("mean", mean), ("var", var), ("std", std), ("argmax", argmax), ("argmin", argmin),
                     ("cumsum", cumsum), ("cumprod", cumprod),
                     ("ravel", ravel), ("flatten", flatten), ("squeeze", squeeze), ("swapaxes", swapaxes),
                     ("clip", clip), ("round", round_), ("astype", astype), ("copy", copy_method), ("dot", dot)):
        _method(name, fn)
    _method("reshape", lambda self, *shape, order="C": reshape(self, *shape, order=order))
    _method("transpose", lambda self, *axes: transpose(self, axes[0] if len(axes) == 1 and
                                                       isinstance(axes[0], (tuple, list)) else (axes or None)))


_install_methods()

# np.take lives in its own module, registered here like the functions above
from jitop.graph import take as _take  # noqa: E402
_method("take", _take.take)
from jitop.graph import nan_reductions as _nan_reductions  # noqa: E402,F401 - np.nansum and the rest
from jitop.graph import composites as _composites  # noqa: E402 - np.select, roll, repeat, tile, linalg.norm, ...
_method("diagonal", _composites.diagonal)
_method("trace", _composites.trace)
_method("repeat", _composites.repeat)
