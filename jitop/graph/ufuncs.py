"""numpy ufuncs as tensor expressions. Operands arrive already cast to the loop dtypes numpy chose."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from jitop import te
from jitop.codegen.kernel import RAISE_IF
from jitop.te.expr import Expr, Op, binary, call, const


def _zero(x: Expr) -> Expr:
    return const(0, x.dtype)


def _one(x: Expr) -> Expr:
    return const(1, x.dtype)


def _power(x: Expr, y: Expr) -> Expr:
    # integer power is one intrinsic (binary exponentiation in the code generator): as an expression
    # tree, repeated squaring would share subterms exponentially often
    return te.pow(x, y) if x.dtype.is_float else call("ipow", x, y)


def _reciprocal(x: Expr) -> Expr:
    if x.dtype.is_float:
        return _one(x) / x
    if not x.dtype.is_signed:
        return te.select(x == _one(x), _one(x), _zero(x))
    # numpy: C's 1 / x (truncating), and the most negative value for 1 / 0
    lowest = const(int(np.iinfo(x.dtype.np).min), x.dtype)
    return te.select(x == _zero(x), lowest, binary(Op.TRUNCDIV, _one(x), x))


def _logaddexp(x: Expr, y: Expr) -> Expr:
    big = te.max(x, y)
    both_inf = (x == y) & te.isinf(x)
    return te.select(both_inf, x, big + te.log1p(te.exp(-te.abs(x - y))))


def _logaddexp2(x: Expr, y: Expr) -> Expr:
    big = te.max(x, y)
    both_inf = (x == y) & te.isinf(x)
    return te.select(both_inf, x, big + te.log1p(te.exp2(-te.abs(x - y))) * (1.0 / math.log(2.0)))


def _fmax(x: Expr, y: Expr) -> Expr:
    if not x.dtype.is_float:
        return te.max(x, y)
    return te.select(te.isnan(x), y, te.select(te.isnan(y), x, te.max(x, y)))


def _fmin(x: Expr, y: Expr) -> Expr:
    if not x.dtype.is_float:
        return te.min(x, y)
    return te.select(te.isnan(x), y, te.select(te.isnan(y), x, te.min(x, y)))


def _signbit(x: Expr) -> Expr:
    if not x.dtype.is_float:
        return x < _zero(x) if x.dtype.is_signed else const(False)
    return te.copysign(_one(x), x) < _zero(x)


def _abs(x: Expr) -> Expr:
    return te.abs(x)


def _float_only(fn: Callable[[Expr], Expr]) -> Callable[[Expr], Expr]:
    return lambda x: fn(x) if x.dtype.is_float else fn(te.cast(x, "float64"))


def _arcsinh(x: Expr) -> Expr:
    ax = te.abs(x)
    big = ax > 1e8
    small = te.log1p(ax + ax * ax / (1.0 + te.sqrt(1.0 + ax * ax)))
    return te.copysign(te.select(big, te.log(ax) + math.log(2.0), small), x)


def _arccosh(x: Expr) -> Expr:
    # 1 <= x <= 2: from t = x - 1 (exact there), as x*x - 1 cancels near 1 (glibc's acosh does the same)
    t = x - 1.0
    near_one = te.log1p(t + te.sqrt(2.0 * t + t * t))
    value = te.select(x > 1e8, te.log(x) + math.log(2.0),
                      te.select(x > 2.0, te.log(x + te.sqrt(x * x - 1.0)), near_one))
    return te.select(x < 1.0, te.const(float("nan"), x.dtype), value)  # NaN below the domain, like numpy


def _arctanh(x: Expr) -> Expr:
    # from |x|: 1 - |x| is exact for |x| >= 0.5, where 1 - x of a negative x near -1 was not (numpy's
    # arctanh(-0.99999994) is -8.66; 2x / (1 - x) rounded near -1 gave -8.32); the sign restored last
    a = te.abs(x)
    t = a + a
    small = te.log1p(t + t * a / (1.0 - a))
    value = 0.5 * te.select(a < 0.5, small, te.log1p(t / (1.0 - a)))
    return te.copysign(value, x)


def raise_if(value: Expr, bad: Expr, error: str) -> Expr:
    """`value`; the kernel's call raises `error` ("<Type>: <message>", a ValueError, OverflowError or
    ZeroDivisionError) if `bad` holds for an element it computes."""
    return call(RAISE_IF + error, value, bad, dtype=value.dtype)


# ** Python's operators on two Python scalars (jitop.graph.pyscalar): Python raises where numpy does not **

def _py_zero_division(op: Callable[[Expr, Expr], Expr], message: str) -> Callable[[Expr, Expr], Expr]:
    return lambda x, y: raise_if(op(x, y), y == _zero(y), "ZeroDivisionError: " + message)


def _py_shift(left: bool) -> Callable[[Expr, Expr], Expr]:
    def shift(x: Expr, y: Expr) -> Expr:
        return raise_if(x << y if left else x >> y, y < _zero(y), "ValueError: negative shift count")
    return shift


# the kernel's error for a Python int result beyond int64; jitop.kernel then runs that call as numpy
INT_BEYOND_64 = "Python int result beyond 64 bits (jitop computes a Python int argument's arithmetic in int64)"
_INT_BEYOND = "OverflowError: " + INT_BEYOND_64


def _py_int(op: str) -> Callable[..., Expr]:
    """Python int arithmetic in int64 that raises where Python's result would need more than 64 bits."""
    def add(x: Expr, y: Expr) -> Expr:
        r = x + y
        return raise_if(r, ((x ^ r) & (y ^ r)) < _zero(r), _INT_BEYOND)

    def sub(x: Expr, y: Expr) -> Expr:
        r = x - y
        return raise_if(r, ((x ^ y) & (x ^ r)) < _zero(r), _INT_BEYOND)

    def mul(x: Expr, y: Expr) -> Expr:
        r = x * y
        lowest = const(-(1 << 63), x.dtype)
        minus_one = const(-1, x.dtype)
        safe = te.select((x == _zero(x)) | (x == minus_one), _one(x), x)  # no division by 0, no MIN / -1
        bad = ((x == minus_one) & (y == lowest)) | ((x != _zero(x)) & (x != minus_one) & (binary(Op.TRUNCDIV, r, safe) != y))
        return raise_if(r, bad, _INT_BEYOND)

    def neg(x: Expr) -> Expr:
        return raise_if(-x, x == const(-(1 << 63), x.dtype), _INT_BEYOND)

    def absolute(x: Expr) -> Expr:
        return raise_if(te.abs(x), x == const(-(1 << 63), x.dtype), _INT_BEYOND)

    def power(x: Expr, y: Expr) -> Expr:
        big = te.abs(te.pow(te.cast(x, "float64"), te.cast(y, "float64"))) >= float(1 << 63)
        return raise_if(call("ipow", x, y), big, _INT_BEYOND)

    def lshift(x: Expr, y: Expr) -> Expr:
        r = raise_if(x << y, y < _zero(y), "ValueError: negative shift count")
        bits = const(63, y.dtype)
        return raise_if(r, (x != _zero(x)) & ((y >= bits) | ((r >> y) != x)), _INT_BEYOND)
    return {"add": add, "subtract": sub, "multiply": mul, "negative": neg, "absolute": absolute, "power": power,
            "lshift": lshift}[op]


def _py_float_power(x: Expr, y: Expr) -> Expr:
    r = x * x if y.op is Op.CONST and y.value == 2 else te.pow(x, y)
    r = raise_if(r, (x == _zero(x)) & (y < _zero(y)), "ZeroDivisionError: 0.0 cannot be raised to a negative power")
    return raise_if(r, te.isinf(r) & te.isfinite(x), "OverflowError: (34, 'Numerical result out of range')")


def _py_fit(name: str) -> Callable[[Expr], Expr]:
    """"py_fit:<lo>:<hi>:<dtype>": a Python int (int64) that must lie in [lo, hi] (either may be empty),
    else numpy's OverflowError for a Python int beyond an array's dtype."""
    _, lo, hi, dt = name.split(":")

    def fit(x: Expr) -> Expr:
        bad = None
        for bound, outside in ((lo, lambda b: x < const(int(b), x.dtype)), (hi, lambda b: x > const(int(b), x.dtype))):
            if bound:
                bad = outside(bound) if bad is None else bad | outside(bound)
        return x if bad is None else raise_if(x, bad, f"OverflowError: Python integer out of bounds for {dt}")
    return fit


def _weights_sum(x: Expr) -> Expr:
    """np.average's sum of a slice's weights, which must not be zero."""
    return raise_if(x, x == _zero(x), "ZeroDivisionError: Weights sum to zero, can't be normalized")


def _nonempty(name: str) -> Callable[[Expr, Expr], Expr]:
    """A maximum or minimum over `count` elements (a boolean-mask read's): numpy has none of no element."""
    return lambda x, count: raise_if(x, count == _zero(count), "ValueError: zero-size array to reduction operation "
                                     f"{name} which has no identity")


class _Table(dict):
    """The ufunc table; parameterised entries ("py_fit:...") are made on first use."""

    def __missing__(self, name: str) -> Callable[..., Expr]:
        if not name.startswith("py_fit:"):
            raise KeyError(name)
        self[name] = fn = _py_fit(name)
        return fn


def fit_name(lo: int | None, hi: int | None, dtype: str) -> str:
    return f"py_fit:{'' if lo is None else lo}:{'' if hi is None else hi}:{dtype}"


UFUNCS: dict[str, Callable[..., Expr]] = _Table({
    "py_weights_sum": _weights_sum,
    "py_nonempty_maximum": _nonempty("maximum"), "py_nonempty_minimum": _nonempty("minimum"),
    "add": lambda x, y: x + y, "subtract": lambda x, y: x - y, "multiply": lambda x, y: x * y,
    "divide": lambda x, y: x / y, "true_divide": lambda x, y: x / y,
    "floor_divide": lambda x, y: binary(Op.FLOORDIV, x, y), "remainder": lambda x, y: binary(Op.FLOORMOD, x, y),
    "mod": lambda x, y: binary(Op.FLOORMOD, x, y), "fmod": te.fmod, "power": _power, "float_power": _power,
    "negative": lambda x: -x, "positive": lambda x: x, "absolute": _abs, "fabs": _abs, "sign": te.sign,
    "reciprocal": _reciprocal, "square": lambda x: x * x, "sqrt": te.sqrt, "cbrt": te.cbrt,
    "exp": te.exp, "exp2": te.exp2, "expm1": te.expm1, "log": te.log, "log2": te.log2, "log10": te.log10,
    "log1p": te.log1p, "logaddexp": _logaddexp, "logaddexp2": _logaddexp2,
    "sin": te.sin, "cos": te.cos, "tan": te.tan, "arcsin": te.asin, "arccos": te.acos, "arctan": te.atan,
    "arctan2": te.atan2, "sinh": te.sinh, "cosh": te.cosh, "tanh": te.tanh, "arcsinh": _arcsinh,
    "arccosh": _arccosh, "arctanh": _arctanh, "hypot": te.hypot,
    "deg2rad": lambda x: x * (math.pi / 180.0), "radians": lambda x: x * (math.pi / 180.0),
    "rad2deg": lambda x: x * (180.0 / math.pi), "degrees": lambda x: x * (180.0 / math.pi),
    "maximum": te.max, "minimum": te.min, "fmax": _fmax, "fmin": _fmin,
    "floor": te.floor, "ceil": te.ceil, "trunc": te.trunc, "rint": te.rint, "conjugate": lambda x: x,
    "isnan": te.isnan, "isinf": te.isinf, "isfinite": te.isfinite, "signbit": _signbit, "copysign": te.copysign,
    "logical_and": te.logical_and, "logical_or": te.logical_or, "logical_not": te.logical_not,
    "logical_xor": lambda x, y: te.cast(x, "bool") ^ te.cast(y, "bool"),
    "equal": lambda x, y: x == y, "not_equal": lambda x, y: x != y, "less": lambda x, y: x < y,
    "less_equal": lambda x, y: x <= y, "greater": lambda x, y: x > y, "greater_equal": lambda x, y: x >= y,
    "bitwise_and": lambda x, y: x & y, "bitwise_or": lambda x, y: x | y, "bitwise_xor": lambda x, y: x ^ y,
    "invert": lambda x: ~x, "bitwise_not": lambda x: ~x,
    "left_shift": lambda x, y: x << y, "right_shift": lambda x, y: x >> y,
    # not a numpy ufunc: reached through jitop.gelu (numpy has no erf)
    "erf": te.erf,
    "py_divide": _py_zero_division(lambda x, y: x / y, "float division by zero"),
    "py_divide_int": _py_zero_division(lambda x, y: x / y, "division by zero"),
    "py_floor_divide": _py_zero_division(lambda x, y: binary(Op.FLOORDIV, x, y), "float floor division by zero"),
    "py_floor_divide_int": _py_zero_division(lambda x, y: raise_if(
        binary(Op.FLOORDIV, x, y), (x == const(-(1 << 63), x.dtype)) & (y == const(-1, y.dtype)), _INT_BEYOND),
        "integer division or modulo by zero"),
    "py_remainder": _py_zero_division(lambda x, y: binary(Op.FLOORMOD, x, y), "float modulo"),
    "py_remainder_int": _py_zero_division(lambda x, y: binary(Op.FLOORMOD, x, y), "integer modulo by zero"),
    "py_lshift": _py_int("lshift"), "py_rshift": _py_shift(False), "py_float_power": _py_float_power,
    "py_add_int": _py_int("add"), "py_subtract_int": _py_int("subtract"), "py_multiply_int": _py_int("multiply"),
    "py_negative_int": _py_int("negative"), "py_absolute_int": _py_int("absolute"), "py_power_int": _py_int("power"),
})
