"""Intrinsic functions of tensor expressions (numpy's semantics: integer inputs of float math become float64)."""
from __future__ import annotations

from typing import Any

from jitop import dtypes
from jitop.te.expr import Expr, Op, promote_operands, as_expr, binary, call, cast, const, select

# float -> float math the code generator implements (jitop.codegen.vecmath)
FLOAT_UNARY = ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan",
               "asin", "acos", "atan", "sinh", "cosh", "tanh", "erf", "sigmoid", "cbrt")
FLOAT_BINARY = ("pow", "atan2", "hypot", "copysign")
ROUNDING = ("floor", "ceil", "trunc", "rint")


def _float(x: Any) -> Expr:
    e = as_expr(x)
    return e if e.dtype.is_float else cast(e, dtypes.float64)


def _unary(name: str):
    def f(x: Any) -> Expr:
        return call(name, _float(x))
    f.__name__ = name
    f.__doc__ = (f"Elementwise {name}(x), computed in x's float dtype (integers become float64).\n\n"
                 f">>> {name}(te.var('x', 'float32'))\n{name}(x)\n")
    return f


def _binary(name: str):
    def f(x: Any, y: Any) -> Expr:
        a, b = promote_operands(x, y)
        dt = a.dtype if a.dtype.is_float else dtypes.float64
        return call(name, cast(a, dt), cast(b, dt))
    f.__name__ = name
    f.__doc__ = f"Elementwise {name}(x, y) with numpy's promotion (integers become float64)."
    return f


exp, exp2, expm1, log, log2, log10, log1p, sqrt, rsqrt, sin, cos, tan, asin, acos, atan, sinh, cosh, tanh, erf, \
    sigmoid, cbrt = (_unary(n) for n in FLOAT_UNARY)
pow, atan2, hypot, copysign = (_binary(n) for n in FLOAT_BINARY)  # noqa: A001


def _rounding(name: str):
    def f(x: Any) -> Expr:
        e = as_expr(x)
        return e if not e.dtype.is_float else call(name, e)  # integers are already whole
    f.__name__ = name
    return f


floor, ceil, trunc, rint = (_rounding(n) for n in ROUNDING)
round = rint  # noqa: A001 - numpy's round: half to even


def abs(x: Any) -> Expr:  # noqa: A001
    """|x|; for integers the most negative value wraps, as in numpy."""
    e = as_expr(x)
    if e.dtype.is_bool or (e.dtype.is_int and not e.dtype.is_signed):
        return e
    return call("fabs", e) if e.dtype.is_float else select(e < 0, -e, e)


def sign(x: Any) -> Expr:
    """-1, 0 or 1 in x's dtype; NaN stays NaN."""
    e = as_expr(x)
    zero = const(0, e.dtype)
    rest = select(e < 0, const(-1, e.dtype) if e.dtype.is_signed else zero, zero)
    if e.dtype.is_float:
        rest = select(e != e, e, rest)  # NaN stays NaN; -0.0 gives +0.0 as in numpy
    return select(e > 0, const(1, e.dtype), rest)


def fmod(x: Any, y: Any) -> Expr:
    """C's fmod: the remainder has the dividend's sign; integer fmod by zero is 0 as in numpy."""
    a, b = promote_operands(x, y)
    return call("fmod", a, b) if a.dtype.is_float else binary(Op.TRUNCMOD, a, b)


def _classify(name: str, int_value: bool):
    def f(x: Any) -> Expr:
        e = as_expr(x)
        return const(int_value) if not e.dtype.is_float else call(name, e, dtype=dtypes.bool_)
    f.__name__ = name
    return f


isnan, isinf, isfinite = _classify("isnan", False), _classify("isinf", False), _classify("isfinite", True)


def if_then_else(cond: Any, then_value: Any, else_value: Any) -> Expr:
    """`then_value` if `cond` else `else_value`; only the chosen side's loads happen, so it can guard reads.

    >>> A = placeholder((8,), "float32", "A")  # doctest: +SKIP
    >>> if_then_else(i > 0, A[i - 1], 0.0)     # doctest: +SKIP
    """
    return select(cond, then_value, else_value)


def floordiv(a: Any, b: Any) -> Expr:
    """a // b rounding toward -inf (Python's and numpy's //)."""
    return binary(Op.FLOORDIV, a, b)


def floormod(a: Any, b: Any) -> Expr:
    """a % b with the divisor's sign (Python's and numpy's %)."""
    return binary(Op.FLOORMOD, a, b)


def truncdiv(a: Any, b: Any) -> Expr:
    """a / b rounding toward zero (C's integer division)."""
    return binary(Op.TRUNCDIV, a, b)


def truncmod(a: Any, b: Any) -> Expr:
    """C's a % b: the remainder has the dividend's sign."""
    return binary(Op.TRUNCMOD, a, b)


def logical_and(a: Any, b: Any) -> Expr:
    return binary(Op.AND, cast(as_expr(a), dtypes.bool_), cast(as_expr(b), dtypes.bool_))


def logical_or(a: Any, b: Any) -> Expr:
    return binary(Op.OR, cast(as_expr(a), dtypes.bool_), cast(as_expr(b), dtypes.bool_))


def logical_not(a: Any) -> Expr:
    return ~cast(as_expr(a), dtypes.bool_)
