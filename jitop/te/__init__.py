"""Tensor expressions: describe a computation elementwise, TVM style.

>>> from jitop import te
>>> A = te.placeholder((1024,), "float32", name="A")
>>> B = te.compute((1024,), lambda i: te.exp(A[i]) * 2.0, name="B")
"""
from jitop.te.expr import Expr, Op, cast, const, size_var, var
from jitop.te.intrin import (abs, acos, asin, atan, atan2, cbrt, ceil, copysign, cos, cosh, erf, exp, exp2, expm1,
                             floor, floordiv, floormod, fmod, hypot, if_then_else, isfinite, isinf, isnan, log, log1p,
                             log2, log10, logical_and, logical_not, logical_or, pow, rint, round, rsqrt, sigmoid,
                             sign, sin, sinh, sqrt, tan, tanh, trunc, truncdiv, truncmod)
from jitop.te.expr import select
from jitop.te.tensor import (ComputeOp, IterVar, Operation, PlaceholderOp, Reducer, Tensor, broadcast_index,
                             comm_reducer, compute, max, min, placeholder, prod, reduce_axis, size_param, sum,
                             ThreadAxis, thread_axis)

__all__ = [n for n in dir() if not n.startswith("_")]
