"""The ONNX operators jitop runs: one table, one entry per operator (`OPS`), each a converter next to its rules.

A converter takes the node (`Op`: its attributes, opset and name, for errors) and the node's input values and
returns its output value(s). A value is a numpy array when it is known while tracing (an initializer, a
Constant, a shape, or anything computed only from those: evaluated right there, so constant subgraphs fold
at load) and a traced array otherwise; converters are written with numpy functions, so the same code does
both. A shape read from a symbolic dim is a numpy object array of `SymInt`s: shape arithmetic
(Shape -> Gather -> Concat -> Reshape) stays symbolic.

Adding an operator is one `@op(...)` function here; `attrs=` lists the attributes it understands (any other
is refused by name at load).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from jitop.errors import JitopError
from jitop.graph.numpy_api import array_node, full_node, wrap
from jitop.graph.shapes import SymInt
from jitop.graph.tracer import Tracer
from jitop.ops.conv import conv2d
from jitop.ops.nn import erf
from jitop.ops.pool import avg_pool2d, max_pool2d
from jitop import dtypes


class OnnxError(JitopError, ValueError):
    """A node of the model cannot be converted as written (names the node, the operator and what is wrong)."""


@dataclass(frozen=True)
class OpDef:
    """An operator's converter and the attributes it understands."""

    name: str
    convert: Callable[..., Any]
    attrs: frozenset[str]


OPS: dict[str, OpDef] = {}


def op(*names: str, attrs: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Register `convert` as the converter of the operators `names`."""
    def register(convert: Callable) -> Callable:
        def kept(n: "Op", *args: Any) -> Any:
            return _kept(convert(n, *args))
        for name in names:
            OPS[name] = OpDef(name, kept, frozenset(attrs))
        return convert
    return register


def _kept(r: Any) -> Any:
    """A converter's result, a bare SymInt or int (numpy's element of a 0-d object result: Gather of a shape, a
    product of sizes) made a 0-d object array, which the next converter can compute with as a shape value."""
    if isinstance(r, tuple):
        return tuple(_kept(v) for v in r)
    if isinstance(r, (SymInt, int)) and not isinstance(r, bool):
        a = np.empty((), object)
        a[()] = r
        return a
    return r


class Op:
    """The node being converted, as its converter sees it."""

    def __init__(self, op_type: str, name: str, attrs: dict[str, Any], opset: int, n_outputs: int):
        self.op_type, self.name, self.attrs, self.opset, self.n_outputs = op_type, name, attrs, opset, n_outputs

    def attr(self, name: str, default: Any = None) -> Any:
        """The attribute's value, else `default` (a float default as the float32 it is in the spec, as a given
        FLOAT attribute reads: HardSigmoid's alpha=0.2 is 0.2000000029802, in a float64 model too)."""
        if name in self.attrs:
            return self.attrs[name]
        return float(np.float32(default)) if isinstance(default, float) else default

    def error(self, message: str) -> OnnxError:
        return OnnxError(f"ONNX node '{self.name}' ({self.op_type}): {message}")

    def unsupported(self, attribute: str, value: Any, expected: str) -> OnnxError:
        return self.error(f"attribute {attribute}={value!r} is not supported (expected {expected})")

    def known(self, value: Any, what: str) -> np.ndarray:
        """An input that must be known while tracing (a shape, axes, pads): its numpy value."""
        if isinstance(value, Tracer):
            raise self.error(f"input '{what}' must be a constant or computed from shapes, not from the data")
        return np.asarray(value)

    def ints(self, value: Any, what: str) -> list[Any]:
        """A known 1-D integer input as Python ints (a symbolic size stays a SymInt)."""
        return [v if isinstance(v, SymInt) else int(v) for v in self.known(value, what).reshape(-1)]


def is_known(*values: Any) -> bool:
    return not any(isinstance(v, Tracer) for v in values)


def _shape(x: Any) -> tuple:
    return tuple(np.shape(x))


# ---- elementwise ---------------------------------------------------------------------------------------------

def _unary(fn: Callable[[Any], Any]) -> Callable:
    return lambda n, x: fn(x)


def _softplus(x: Any) -> Any:
    """log(1 + exp(x)) in x's dtype without overflow (exp(89) is inf in float32) or underflow (1 + exp(-30) is 1)."""
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


for _name, _fn in {"Relu": lambda x: np.maximum(x, 0), "Neg": np.negative, "Abs": np.abs, "Exp": np.exp,
                   "Log": np.log, "Sqrt": np.sqrt, "Tanh": np.tanh, "Sin": np.sin, "Cos": np.cos,
                   "Floor": np.floor, "Ceil": np.ceil, "Sign": np.sign, "Not": np.logical_not,
                   "Reciprocal": lambda x: np.reciprocal(x) if np.issubdtype(x.dtype, np.floating) else 1 // x,
                   "Sigmoid": lambda x: 1 / (1 + np.exp(-x)), "Erf": erf,
                   "Softplus": _softplus}.items():
    op(_name)(_unary(_fn))


@op("Identity")
def identity(n: Op, x: Any) -> Any:
    return x


@op("Dropout", attrs=("seed", "ratio"))
def dropout(n: Op, x: Any, ratio: Any = None, training_mode: Any = None) -> Any:
    if training_mode is not None and bool(n.known(training_mode, "training_mode")):
        raise n.error("training_mode=True is not supported (inference only)")
    return x if n.n_outputs < 2 else (x, np.ones(_shape(x), bool))


@op("LeakyRelu", attrs=("alpha",))
def leaky_relu(n: Op, x: Any) -> Any:
    return np.where(x < 0, x * n.attr("alpha", 0.01), x)


@op("PRelu")
def prelu(n: Op, x: Any, slope: Any) -> Any:
    return np.where(x < 0, x * slope, x)


@op("Elu", attrs=("alpha",))
def elu(n: Op, x: Any) -> Any:
    return np.where(x < 0, (np.exp(x) - 1) * n.attr("alpha", 1.0), x)


@op("HardSigmoid", attrs=("alpha", "beta"))
def hard_sigmoid(n: Op, x: Any) -> Any:
    return np.clip(x * n.attr("alpha", 0.2) + n.attr("beta", 0.5), 0, 1)


@op("HardSwish")
def hard_swish(n: Op, x: Any) -> Any:
    return x * np.clip(x * float(np.float32(1 / 6)) + 0.5, 0, 1)  # the spec's alpha: the FLOAT attribute 1/6


@op("Gelu", attrs=("approximate",))
def gelu(n: Op, x: Any) -> Any:
    if n.attr("approximate", "none") == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * (x * x * x))))
    return 0.5 * x * (1 + erf(x * (1 / math.sqrt(2))))


@op("Clip", attrs=("min", "max"))
def clip(n: Op, x: Any, lo: Any = None, hi: Any = None) -> Any:
    if n.opset < 11:
        lo, hi = n.attr("min"), n.attr("max")
    if lo is not None:
        x = np.maximum(x, _like(lo, x))
    if hi is not None:
        x = np.minimum(x, _like(hi, x))
    return x


def _like(bound: Any, x: Any) -> Any:
    """A scalar bound as x's dtype (a numpy value, so NEP 50 promotion keeps x's dtype)."""
    return np.asarray(bound).astype(x.dtype).reshape(()) if is_known(bound) else bound


def _binary(fn: Callable[[Any, Any], Any]) -> Callable:
    return lambda n, a, b: fn(a, b)


for _name, _fn in {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Equal": np.equal, "Less": np.less,
                   "Greater": np.greater, "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal,
                   "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}.items():
    op(_name)(_binary(_fn))


@op("Div")
def div(n: Op, a: Any, b: Any) -> Any:
    if a.dtype == object or np.issubdtype(a.dtype, np.integer):  # ONNX: truncates toward zero
        q = a // b
        return q + ((a % b != 0) & ((a < 0) != (b < 0))) if a.dtype != object else q
    return np.divide(a, b)


@op("Mod", attrs=("fmod",))
def mod(n: Op, a: Any, b: Any) -> Any:
    return np.fmod(a, b) if n.attr("fmod", 0) else np.mod(a, b)


@op("Pow")
def power(n: Op, x: Any, y: Any) -> Any:
    if is_known(y) and np.ndim(y) == 0:
        e = float(y)
        if e == 2.0:
            return x * x
        if e == 0.5 and np.issubdtype(x.dtype, np.floating):
            return _square_root(x)
        y = np.asarray(y).astype(x.dtype) if np.issubdtype(x.dtype, np.floating) else y
    if x.dtype.kind in "iu" and y.dtype.kind in "iu" and not (is_known(y) and np.all(y >= 0)):
        r = _int_power(x, y)
    else:
        r = np.power(x, y)
    return r.astype(x.dtype) if r.dtype != x.dtype else r  # ONNX: the base's type


def _square_root(x: Any) -> Any:
    """x ** 0.5 as sqrt, with pow's edge cases where sqrt's differ: pow(-inf, 0.5) = inf, pow(-0.0, 0.5) = +0.0."""
    return np.where((x < 0) & (x > -np.inf), np.nan, np.sqrt(np.abs(x)))


def _int_power(x: Any, y: Any) -> Any:
    """x ** y for integers, a negative exponent giving x ** y truncated toward zero, as onnxruntime (numpy refuses
    it): 1 for base 1, 1 or -1 for base -1 (even or odd exponent), 0 otherwise (for base 0, a division by zero,
    too)."""
    negative = y < 0
    tiny = np.where(np.abs(x) == 1, np.where(y % 2 == 0, 1, x), 0)
    return np.where(negative, tiny, np.power(x, np.where(negative, 0, y)))


@op("Where")
def where(n: Op, c: Any, x: Any, y: Any) -> Any:
    return np.where(c, x, y)


def _variadic(fn: Callable[[Any, Any], Any], mean: bool = False) -> Callable:
    def convert(n: Op, *xs: Any) -> Any:
        r = xs[0]
        for x in xs[1:]:
            r = fn(r, x)
        return r / len(xs) if mean else r
    return convert


op("Sum")(_variadic(np.add))
op("Max")(_variadic(np.maximum))
op("Min")(_variadic(np.minimum))
op("Mean")(_variadic(np.add, mean=True))


@op("Cast", attrs=("to", "saturate", "round_mode"))
def cast(n: Op, x: Any) -> Any:
    dt = _onnx_dtype(n, n.attr("to"))
    if is_known(x) and x.dtype == object and np.issubdtype(dt, np.integer):
        return x  # a symbolic shape stays one
    return x.astype(dt)


@op("CastLike", attrs=("saturate", "round_mode"))
def cast_like(n: Op, x: Any, like: Any) -> Any:
    return x.astype(like.dtype)


_TENSOR_TYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
                 10: "float16", 11: "float64", 12: "uint32", 13: "uint64"}


def _onnx_dtype(n: Op, code: Any) -> np.dtype:
    if code not in _TENSOR_TYPES:
        raise n.unsupported("to", code, "one of the numeric or bool TensorProto types "
                            f"{sorted(_TENSOR_TYPES)}")
    return np.dtype(_TENSOR_TYPES[code])


# ---- constants and shapes ------------------------------------------------------------------------------------

@op("Constant", attrs=("value", "value_float", "value_floats", "value_int", "value_ints"))
def constant(n: Op) -> Any:
    a = n.attrs
    if "value" in a:
        return np.asarray(a["value"])
    if "value_float" in a:
        return np.array(a["value_float"], np.float32)
    if "value_floats" in a:
        return np.array(a["value_floats"], np.float32)
    if "value_int" in a:
        return np.array(a["value_int"], np.int64)
    if "value_ints" in a:
        return np.array(a["value_ints"], np.int64)
    raise n.error("has none of value, value_float(s), value_int(s) (strings and sparse tensors are not supported)")


@op("Shape", attrs=("start", "end"))
def shape(n: Op, x: Any) -> Any:
    dims = _shape(x)[slice(n.attr("start", 0), n.attr("end"))]
    if all(isinstance(d, int) for d in dims):
        return np.array(dims, np.int64)
    return np.array(list(dims), object)


@op("Size")
def size(n: Op, x: Any) -> Any:
    s = math.prod(_shape(x))
    return np.array(s, np.int64) if isinstance(s, int) else np.array(s, object)


@op("ConstantOfShape", attrs=("value",))
def constant_of_shape(n: Op, dims: Any) -> Any:
    value = np.asarray(n.attr("value", np.zeros(1, np.float32)))
    shape_ = tuple(n.ints(dims, "input"))
    if all(isinstance(d, int) for d in shape_):
        return np.full(shape_, value.reshape(-1)[0], value.dtype)
    return full_node(shape_, value.reshape(-1)[0].item(), dtypes.as_dtype(value.dtype))


@op("Range")
def range_(n: Op, start: Any, limit: Any, delta: Any) -> Any:
    s, l, d = (n.known(v, w) for v, w in ((start, "start"), (limit, "limit"), (delta, "delta")))
    if s.dtype == object or l.dtype == object or d.dtype == object:
        raise n.error("a range over a symbolic size is not supported")
    return np.arange(s, l, d, dtype=s.dtype)


@op("Reshape", attrs=("allowzero",))
def reshape(n: Op, x: Any, target: Any) -> Any:
    dims = n.ints(target, "shape")
    if not n.attr("allowzero", 0):
        dims = [_shape(x)[k] if isinstance(d, int) and d == 0 else d for k, d in enumerate(dims)]
    return np.reshape(x, tuple(dims))


@op("Flatten", attrs=("axis",))
def flatten(n: Op, x: Any) -> Any:
    s = _shape(x)
    axis = n.attr("axis", 1) + (len(s) if n.attr("axis", 1) < 0 else 0)  # in [-rank, rank]: -1 is rank - 1
    return np.reshape(x, (math.prod(s[:axis]), math.prod(s[axis:])))


@op("Transpose", attrs=("perm",))
def transpose(n: Op, x: Any) -> Any:
    perm = n.attr("perm")
    return np.transpose(x, None if perm is None else tuple(perm))


def _axes(n: Op, axes_input: Any, since: int) -> list[int] | None:
    """The axes of an op that took them as an attribute before opset `since` and as an input from it."""
    if n.opset < since or "axes" in n.attrs:
        axes = n.attr("axes")
        return None if axes is None else list(axes)
    return None if axes_input is None else n.ints(axes_input, "axes")


@op("Squeeze", attrs=("axes",))
def squeeze(n: Op, x: Any, axes: Any = None) -> Any:
    ax = _axes(n, axes, 13)
    return np.squeeze(x, axis=None if ax is None else tuple(ax))


@op("Unsqueeze", attrs=("axes",))
def unsqueeze(n: Op, x: Any, axes: Any = None) -> Any:
    ax = _axes(n, axes, 13)
    if ax is None:
        raise n.error("needs axes")
    rank = len(_shape(x)) + len(ax)
    for a in sorted(a % rank for a in ax):
        x = np.expand_dims(x, a)
    return x


@op("Concat", attrs=("axis",))
def concat(n: Op, *xs: Any) -> Any:
    xs = [x for x in xs if x is not None]
    if all(is_known(x) for x in xs) and any(x.dtype == object for x in xs):
        return np.concatenate([x.astype(object) for x in xs], axis=n.attr("axis"))
    return np.concatenate(xs, axis=n.attr("axis"))


@op("Split", attrs=("axis", "split", "num_outputs"))
def split(n: Op, x: Any, sizes: Any = None) -> Any:
    axis = n.attr("axis", 0)
    dim = _shape(x)[axis]
    if n.opset < 13 and "split" in n.attrs:
        sizes = list(n.attr("split"))
    elif sizes is not None:
        sizes = n.ints(sizes, "split")
    else:
        parts = n.attr("num_outputs", n.n_outputs)
        chunk = -(-dim // parts)
        sizes = [min(chunk, dim - k * chunk) for k in range(parts)]
    return tuple(np.split(x, list(np.cumsum(sizes)[:-1]), axis=axis))


@op("Slice", attrs=("starts", "ends", "axes"))
def slice_(n: Op, x: Any, starts: Any = None, ends: Any = None, axes: Any = None, steps: Any = None) -> Any:
    if n.opset < 10:
        st, en, ax, sp = list(n.attr("starts")), list(n.attr("ends")), n.attr("axes"), None
    else:
        st, en = n.ints(starts, "starts"), n.ints(ends, "ends")
        ax = None if axes is None else n.ints(axes, "axes")
        sp = None if steps is None else n.ints(steps, "steps")
    rank = len(_shape(x))
    ax = list(range(len(st))) if ax is None else [a % rank for a in ax]
    sp = [1] * len(st) if sp is None else sp
    key = [slice(None)] * rank
    for a, s, e, k in zip(ax, st, en, sp):
        key[a] = _slice_bounds(s, e, k, _shape(x)[a])
    return x[tuple(key)]


def _slice_bounds(start: Any, end: Any, step: Any, dim: Any) -> slice:
    """Slice's bounds on an axis of size `dim` as a Python slice. The spec adds dim to a negative start or end,
    then clamps start to [0, dim] and end to [0, dim] for a positive step, to [0, dim - 1] and [-1, dim - 1] for
    a negative one; Python's slice differs there (a start below -dim with a negative step takes nothing)."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return slice(_clamp(start, 0, dim), _clamp(end, 0, dim), step)
    end = _clamp(end, -1, dim - 1)
    return slice(_clamp(start, 0, dim - 1), None if end < 0 else end, step)  # (end -1: through index 0)


def _clamp(v: Any, lo: Any, hi: Any) -> Any:
    return lo if v < lo else hi if v > hi else v


@op("Gather", attrs=("axis",))
def gather(n: Op, x: Any, idx: Any) -> Any:
    axis = n.attr("axis", 0)
    if is_known(idx) and np.ndim(idx) == 0 and not is_known(x):
        key = [slice(None)] * len(_shape(x))
        key[axis] = int(idx)
        return x[tuple(key)]
    if is_known(x) and not is_known(idx):  # np.take dispatches on its array only: trace a constant table
        x = wrap(array_node(x))
    return np.take(x, idx, axis=axis)


@op("Expand")
def expand(n: Op, x: Any, target: Any) -> Any:
    dims = tuple(n.ints(target, "shape"))
    if all(isinstance(d, int) for d in (*dims, *_shape(x))):
        return np.broadcast_to(x, np.broadcast_shapes(_shape(x), dims))
    x = wrap(array_node(x)) if is_known(x) else x  # numpy would fix a symbolic size (np.broadcast_to of a constant)
    return np.broadcast_to(x, _broadcast(x, dims))


def _broadcast(x: Any, dims: tuple) -> tuple:
    s = _shape(x)
    s, dims = (1,) * (len(dims) - len(s)) + s, (1,) * (len(s) - len(dims)) + dims
    return tuple(b if isinstance(a, int) and a == 1 else a for a, b in zip(s, dims))


@op("Tile")
def tile(n: Op, x: Any, repeats: Any) -> Any:
    reps = n.ints(repeats, "repeats")
    s = _shape(x)
    spread = np.reshape(x, tuple(v for d in s for v in (1, d)))
    tiled = np.broadcast_to(spread, tuple(v for r, d in zip(reps, s) for v in (r, d)))
    return np.reshape(tiled, tuple(r * d for r, d in zip(reps, s)))


# ---- reductions and normalisations -----------------------------------------------------------------------------

def _extreme(fn: Callable, top: bool) -> Callable:
    """np.max (top=False) or np.min (top=True) starting from what the spec gives over no elements, the dtype's
    lowest (highest) value: numpy's max over a 0-size axis raises."""
    def reduce(x: Any, **kwargs: Any) -> Any:
        if x.dtype.kind in "fiub":  # (not a shape's object array)
            kwargs["initial"] = _lowest(x.dtype, top)
        return fn(x, **kwargs)
    return reduce


def _lowest(dtype: np.dtype, top: bool = False) -> Any:
    """The lowest value of `dtype` (-inf for floats), or its highest with top=True."""
    if dtype.kind == "f":
        return np.inf if top else -np.inf
    if dtype.kind == "b":
        return top
    return np.iinfo(dtype).max if top else np.iinfo(dtype).min


_REDUCE = {"ReduceSum": (np.sum, 13), "ReduceMean": (np.mean, 18), "ReduceMax": (_extreme(np.max, False), 18),
           "ReduceMin": (_extreme(np.min, True), 18), "ReduceProd": (np.prod, 18),
           "ReduceSumSquare": (lambda x, **k: np.sum(x * x, **k), 18),
           "ReduceL2": (lambda x, **k: np.sqrt(np.sum(x * x, **k)), 18),
           "ReduceL1": (lambda x, **k: np.sum(np.abs(x), **k), 18)}


def _reduce(fn: Callable, since: int) -> Callable:
    def convert(n: Op, x: Any, axes: Any = None) -> Any:
        ax = _axes(n, axes, since)
        if not ax:  # noop_with_empty_axes: over no axes (numpy's axis=()); ReduceL2 still gives sqrt(x * x)
            ax = [] if n.attr("noop_with_empty_axes", 0) else None
        r = fn(x, axis=None if ax is None else tuple(ax), keepdims=bool(n.attr("keepdims", 1)))
        return r if r.dtype == x.dtype else r.astype(x.dtype)  # ONNX: the input's type (an int mean truncates)
    return convert


for _name, (_fn, _since) in _REDUCE.items():
    op(_name, attrs=("axes", "keepdims", "noop_with_empty_axes"))(_reduce(_fn, _since))


@op("ArgMax", "ArgMin", attrs=("axis", "keepdims", "select_last_index"))
def arg_reduce(n: Op, x: Any) -> Any:
    if n.attr("select_last_index", 0):
        raise n.unsupported("select_last_index", 1, "0 (the first index, as numpy)")
    fn = np.argmax if n.op_type == "ArgMax" else np.argmin
    return fn(x, axis=n.attr("axis", 0), keepdims=bool(n.attr("keepdims", 1))).astype(np.int64)


def _softmax_axis(n: Op, x: Any) -> int:
    return n.attr("axis", 1 if n.opset < 13 else -1) % max(len(_shape(x)), 1)


def _softmax(x: Any, axis: int, log: bool) -> Any:
    shifted = x - np.max(x, axis=axis, keepdims=True, initial=-np.inf)  # (a 0-size axis: an empty result)
    e = np.exp(shifted)
    s = np.sum(e, axis=axis, keepdims=True)
    return shifted - np.log(s) if log else e / s


def _softmax_converter(log: bool) -> Callable:
    def convert(n: Op, x: Any) -> Any:
        axis = _softmax_axis(n, x)
        if n.opset >= 13:
            return _softmax(x, axis, log)
        s = _shape(x)  # before opset 13: the input is taken as 2-D, [prod(s[:axis]), prod(s[axis:])]
        flat = np.reshape(x, (math.prod(s[:axis]), math.prod(s[axis:])))
        return np.reshape(_softmax(flat, 1, log), s)
    return convert


op("Softmax", attrs=("axis",))(_softmax_converter(log=False))
op("LogSoftmax", attrs=("axis",))(_softmax_converter(log=True))


@op("LRN", attrs=("alpha", "beta", "bias", "size"))
def lrn(n: Op, x: Any) -> Any:
    """Local response normalization across channels: x / (bias + alpha / size * sum of x^2 over a window of
    `size` channels around each)^beta, the window cut at the edges."""
    size = n.attr("size")
    shape = _shape(x)
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = x * x
    zeros = np.zeros_like(sq[:, :1])
    padded = np.concatenate([zeros] * before + [sq] + [zeros] * after, axis=1)
    total = padded[:, :shape[1]]
    for k in range(1, size):
        total = total + padded[:, k:k + shape[1]]
    alpha, beta, bias = n.attr("alpha", 0.0001), n.attr("beta", 0.75), n.attr("bias", 1.0)
    return x / np.power(total * (alpha / size) + bias, np.asarray(beta, x.dtype))


@op("LayerNormalization", attrs=("axis", "epsilon", "stash_type"))
def layer_norm(n: Op, x: Any, scale: Any, bias: Any = None) -> Any:
    """The spec's two stages: the standardisation in stash_type (x cast to it; the Mean and InvStdDev outputs of
    that type, float32), then the scale and bias in x's type. A float64 x is standardised in float64, as
    onnxruntime does, where the spec would round it to float32 first."""
    rank = len(_shape(x))
    axes = tuple(range(n.attr("axis", -1) % rank, rank))
    if n.attr("stash_type", 1) != 1:
        raise n.unsupported("stash_type", n.attr("stash_type"), "1 (float32; bfloat16 is not supported)")
    stash = np.dtype(np.float32)
    wide = np.promote_types(x.dtype, stash)
    xs = _cast(x, wide)
    mean = np.mean(xs, axis=axes, keepdims=True)
    centred = xs - mean
    var = np.mean(centred * centred, axis=axes, keepdims=True)
    inv = 1 / np.sqrt(var + np.asarray(n.attr("epsilon", 1e-5), wide))
    normalized = centred * inv
    y = _cast(normalized, x.dtype) * scale
    y = y if bias is None else y + bias
    if n.n_outputs == 1:
        return y
    return (y, _cast(mean, stash), _cast(inv, stash))[:n.n_outputs]


def _cast(x: Any, dtype: np.dtype) -> Any:
    return x if x.dtype == dtype else x.astype(dtype)


@op("BatchNormalization", attrs=("epsilon", "momentum", "training_mode", "spatial"))
def batch_norm(n: Op, x: Any, scale: Any, bias: Any, mean: Any, var: Any) -> Any:
    if n.attr("training_mode", 0):
        raise n.unsupported("training_mode", 1, "0 (inference)")
    if n.n_outputs > 1:
        raise n.error("the training outputs (running mean/var) are not supported (inference only)")
    k, shift = batch_norm_affine(scale, bias, mean, var, n.attr("epsilon", 1e-5), x.dtype)
    bshape = (-1,) + (1,) * (len(_shape(x)) - 2)
    return x * np.reshape(k, bshape) + np.reshape(shift, bshape)


def batch_norm_affine(scale: Any, bias: Any, mean: Any, var: Any, eps: float, dtype: np.dtype) -> tuple[Any, Any]:
    """BatchNormalization as y = x * k + shift, per channel (computed in float64 when the statistics are known)."""
    if is_known(scale, bias, mean, var):
        k = np.asarray(scale, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
        return k.astype(dtype), (np.asarray(bias, np.float64) - np.asarray(mean, np.float64) * k).astype(dtype)
    k = scale / np.sqrt(var + np.asarray(eps, dtype))
    return k, bias - mean * k


# ---- matmul, conv, pooling -------------------------------------------------------------------------------------

@op("MatMul")
def matmul(n: Op, a: Any, b: Any) -> Any:
    return np.matmul(a, b)


@op("Gemm", attrs=("alpha", "beta", "transA", "transB"))
def gemm(n: Op, a: Any, b: Any, c: Any = None) -> Any:
    a = np.transpose(a) if n.attr("transA", 0) else a
    b = np.transpose(b) if n.attr("transB", 0) else b
    y = np.matmul(a, b)
    alpha, beta = n.attr("alpha", 1.0), n.attr("beta", 1.0)
    if alpha != 1.0:
        y = y * np.asarray(alpha, y.dtype)
    if c is not None and beta != 0.0:
        y = y + (c if beta == 1.0 else c * np.asarray(beta, y.dtype))
    return y


def _spatial(n: Op, x: Any, kernel: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """strides, dilations and pads (top, bottom, left, right) of a 2-D conv/pool node, auto_pad resolved."""
    if len(_shape(x)) != 4 or len(kernel) != 2:
        raise n.unsupported("kernel_shape", list(kernel), "a 2-D window over an (N, C, H, W) input")
    strides = tuple(n.attr("strides", (1, 1)))
    dil = tuple(n.attr("dilations", (1, 1)))
    auto = n.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        p = tuple(n.attr("pads", (0, 0, 0, 0)))
        return strides, dil, (p[0], p[2], p[1], p[3])
    if auto == "VALID":
        return strides, dil, (0, 0, 0, 0)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise n.unsupported("auto_pad", auto, "NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    pads = []
    for size, k, s, d in zip(_shape(x)[2:], kernel, strides, dil):
        if not isinstance(size, int):
            raise n.error(f"auto_pad={auto} over a symbolic spatial size is not supported")
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, big = total // 2, total - total // 2
        pads += [small, big] if auto == "SAME_UPPER" else [big, small]
    return strides, dil, tuple(pads)


@op("Conv", attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"))
def conv(n: Op, x: Any, w: Any, b: Any = None) -> Any:
    strides, dil, pads = _spatial(n, x, tuple(n.attr("kernel_shape", _shape(w)[2:])))
    return conv2d(x, w, b, stride=strides, padding=pads, dilation=dil, groups=n.attr("group", 1))


def _pool_geometry(n: Op, x: Any) -> tuple:
    """kernel, strides, dilations, pads and `sizes`: None where jitop's pooling takes the pads as they are
    (symmetric, at most half the window: torch's rule), else ONNX's output size, for pads applied here."""
    kernel = tuple(n.attr("kernel_shape"))
    strides, dil, (t, b, l, r) = _spatial(n, x, kernel)
    if t == b and l == r and 2 * t <= kernel[0] and 2 * l <= kernel[1]:
        return kernel, strides, dil, (t, l), None
    sizes = []
    for size, k, s, d, p0, p1 in zip(_shape(x)[2:], kernel, strides, dil, (t, l), (b, r)):
        if not isinstance(size, int):
            raise n.error("pads that are asymmetric or over half the window need a fixed spatial size")
        span = size + p0 + p1 - (k - 1) * d - 1
        out = (-(-span // s) if n.attr("ceil_mode", 0) else span // s) + 1
        sizes.append(out - 1 if n.attr("ceil_mode", 0) and (out - 1) * s >= size + p0 else out)
    return kernel, strides, dil, (t, b, l, r), tuple(sizes)


def _pad_hw(x: Any, pads: tuple[int, ...], fill: Any) -> Any:
    """x with (top, bottom, left, right) rows and columns of `fill` around its last two axes."""
    for axis, before, after in ((2, pads[0], pads[1]), (3, pads[2], pads[3])):
        edge = np.full_like(x[(slice(None),) * axis + (slice(0, 1),)], fill)
        x = np.concatenate([edge] * before + [x] + [edge] * after, axis=axis)
    return x


def _inside_share(x: Any, kernel: tuple, strides: tuple, pads: tuple, sizes: tuple) -> np.ndarray:
    """Per output position: (window clipped to the padded input) / (window clipped to the input)."""
    share = []
    for size, k, s, p0, p1, out in zip(_shape(x)[2:], kernel, strides, pads[::2], pads[1::2], sizes):
        start = np.arange(out) * s - p0
        share.append((np.minimum(start + k, size + p1) - start) /
                     (np.minimum(start + k, size) - np.maximum(start, 0)))
    return np.outer(*share).astype(x.dtype)


@op("MaxPool", attrs=("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"))
def max_pool(n: Op, x: Any) -> Any:
    if n.n_outputs > 1:
        raise n.error("the Indices output is not supported")
    kernel, strides, dil, pads, sizes = _pool_geometry(n, x)
    if sizes is None:
        return max_pool2d(x, kernel, strides, pads, dil, ceil_mode=bool(n.attr("ceil_mode", 0)))
    lowest = _lowest(x.dtype)
    y = max_pool2d(_pad_hw(x, pads, lowest), kernel, strides, 0, dil, ceil_mode=bool(n.attr("ceil_mode", 0)))
    return y[:, :, :sizes[0], :sizes[1]]


@op("AveragePool", attrs=("auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads",
                          "strides"))
def average_pool(n: Op, x: Any) -> Any:
    kernel, strides, dil, pads, sizes = _pool_geometry(n, x)
    if dil != (1, 1):
        raise n.unsupported("dilations", list(dil), "(1, 1)")
    ceil, include = bool(n.attr("ceil_mode", 0)), bool(n.attr("count_include_pad", 0))
    if sizes is None:
        return avg_pool2d(x, kernel, strides, pads, ceil_mode=ceil, count_include_pad=include)
    y = avg_pool2d(_pad_hw(x, pads, 0), kernel, strides, 0, ceil_mode=ceil, count_include_pad=True)
    y = y[:, :, :sizes[0], :sizes[1]]  # the padding counted; without count_include_pad, rescale to the inside
    return y if include else y * _inside_share(x, kernel, strides, pads, sizes)


@op("GlobalAveragePool")
def global_average_pool(n: Op, x: Any) -> Any:
    return np.mean(x, axis=tuple(range(2, len(_shape(x)))), keepdims=True)


@op("GlobalMaxPool")
def global_max_pool(n: Op, x: Any) -> Any:
    return np.max(x, axis=tuple(range(2, len(_shape(x)))), keepdims=True)
