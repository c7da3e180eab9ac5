"""numpy ufuncs as tensor expressions. Operands arrive already cast to the loop dtypes numpy chose."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from jitop import te
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
    value = te.select(x > 1e8, te.log(x) + math.log(2.0), te.log(x + te.sqrt(x * x - 1.0)))
    return te.select(x < 1.0, te.const(float("nan"), x.dtype), value)  # NaN below the domain, like numpy


def _arctanh(x: Expr) -> Expr:
    return 0.5 * te.log1p(2.0 * x / (1.0 - x))


UFUNCS: dict[str, Callable[..., Expr]] = {
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
}
