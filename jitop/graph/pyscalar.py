"""Python's own operators on Python scalars while tracing.

A Python bool/int/float argument is traced as a run-time value (a weak node: NEP 50 promotes it like a
Python scalar). Between two Python scalars, an operator is Python's, not numpy's: True + True is 2, 1 / 2
is 0.5, 7 // 0 raises ZeroDivisionError, [1, 2] * n repeats a list, 1.5 & 1 is a TypeError. This module
gives those meanings (the result is again a Python scalar: a weak node the kernel returns as a Python
object), a run-time check where Python raises on a value (division by zero, a negative shift count), a
run-time check where Python's int would outgrow int64 (that call then runs as numpy), and Unsupported
(plain numpy) where the value decides even the result's type (int ** a run-time int).
A numpy function applied to a Python scalar (np.tanh(x)) is numpy's: a strong numpy scalar.
"""
from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from jitop import dtypes
from jitop.graph.ir import Node, node
from jitop.graph.tracer import Tracer, Unsupported, as_node

# operator name -> numpy ufunc used when an array is involved (numpy's meaning)
NUMPY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.true_divide,
         "floordiv": np.floor_divide, "mod": np.remainder, "pow": np.power, "and": np.bitwise_and,
         "or": np.bitwise_or, "xor": np.bitwise_xor, "lshift": np.left_shift, "rshift": np.right_shift,
         "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
         "ne": np.not_equal, "matmul": np.matmul}
PYTHON = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
          "floordiv": operator.floordiv, "mod": operator.mod, "pow": operator.pow, "and": operator.and_,
          "or": operator.or_, "xor": operator.xor, "lshift": operator.lshift, "rshift": operator.rshift,
          "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge, "eq": operator.eq,
          "ne": operator.ne, "matmul": operator.matmul}
_COMPARE = {"lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal", "eq": "equal",
            "ne": "not_equal"}


def is_python_scalar(x: Any) -> bool:
    """A Python bool/int/float, or a tracer of one."""
    if isinstance(x, Tracer):
        return x.node.weak
    return isinstance(x, (bool, int, float)) and not isinstance(x, np.generic)


def python_type(n: Node) -> type:
    return bool if n.dtype.is_bool else (int if n.dtype.is_int else float)


def binary(op: str, x: Any, y: Any) -> Any:
    """x <op> y as Python evaluates it, where x or y is a tracer (Tracer's operator methods call this)."""
    for v in (x, y):
        if isinstance(v, complex) and not isinstance(v, np.generic):
            raise Unsupported("complex numbers")
    if not (is_python_scalar(x) and is_python_scalar(y)):
        if any(isinstance(v, Tracer) and not v.node.weak or isinstance(v, (np.ndarray, np.generic)) for v in (x, y)):
            return NUMPY[op](x, y)  # an array or numpy scalar takes part: numpy's operator
        return NotImplemented      # a list, tuple, None, ...: Python asks the other operand, then raises
    nx, ny = as_node(x), as_node(y)
    if nx.prim == "const" and ny.prim == "const":  # two known Python values: Python computes it
        return PYTHON[op](_value(nx), _value(ny))
    kinds = {python_type(nx), python_type(ny)}
    real = float in kinds
    wide = dtypes.float64 if real else dtypes.int64
    if not real:
        for n in (nx, ny):
            if n.prim == "const" and not -(1 << 63) <= n.param("value") < (1 << 63):
                raise Unsupported("Python int arithmetic beyond 64 bits")
    if op in ("add", "sub", "mul"):  # an int result beyond 64 bits raises (Python's would be a bigger int)
        return _py(NUMPY[op].__name__ if real else f"py_{NUMPY[op].__name__}_int", (nx, ny), wide, wide)
    # a known non-zero divisor needs no check (Python's ZeroDivisionError)
    nonzero = ny.prim == "const" and _value(ny) != 0 and (real or _value(ny) != -1)
    if op == "truediv":
        name = "true_divide" if nonzero else ("py_divide" if real else "py_divide_int")
        return _py(name, (nx, ny), dtypes.float64, dtypes.float64)
    if op in ("floordiv", "mod"):
        name = "py_floor_divide" if op == "floordiv" else "py_remainder"
        if nonzero:
            name = "floor_divide" if op == "floordiv" else "remainder"
        elif not real:
            name += "_int"
        return _py(name, (nx, ny), wide, wide)
    if op in _COMPARE:
        return _py(_COMPARE[op], (nx, ny), wide, dtypes.bool_)
    if op in ("and", "or", "xor"):
        if real:
            return NotImplemented
        dt = dtypes.bool_ if kinds == {bool} else dtypes.int64
        return _py(NUMPY[op].__name__, (nx, ny), dt, dt)
    if op in ("lshift", "rshift"):
        if real:
            return NotImplemented
        return _py("py_" + op, (nx, ny), dtypes.int64, dtypes.int64)
    if op == "pow":
        return _power(nx, ny)
    return NotImplemented  # matmul


def unary(op: str, x: Tracer) -> Any:
    """-x, +x, abs(x), ~x of a Python scalar tracer, as Python computes them (a bool counts as an int)."""
    n = x.node
    t = python_type(n)
    if n.prim == "const":
        return {"neg": operator.neg, "pos": operator.pos, "abs": abs, "invert": operator.invert}[op](_value(n))
    if op == "invert" and t is float:
        raise TypeError("bad operand type for unary ~: 'float'")
    dt = dtypes.float64 if t is float else dtypes.int64
    name = {"neg": "negative", "pos": "positive", "abs": "absolute", "invert": "invert"}[op]
    if t is not float and op in ("neg", "abs"):
        name = f"py_{name}_int"  # -(-2**63) is beyond int64
    return _py(name, (n,), dt, dt)


def _value(n: Node) -> Any:
    return python_type(n)(n.param("value"))


def _py(name: str, srcs: tuple[Node, ...], loop: dtypes.DType, out: dtypes.DType) -> Tracer:
    return Tracer(node("ufunc", (), out, srcs, weak=True, name=name, in_dtypes=(loop.name,) * len(srcs)))


def _power(base: Node, exp: Node) -> Tracer:
    """x ** e for Python scalars with a known exponent (Python's result type depends on e's value and
    sign, and a negative base to a fractional power is complex): an int result for int ** non-negative
    int, else a float (with Python's ZeroDivisionError for 0.0 ** negative and OverflowError)."""
    if exp.prim != "const":
        raise Unsupported("x ** y between Python scalars with a run-time exponent (Python's result type "
                          "depends on its value)", "mark the exponent static, or use np.power")
    e = _value(exp)
    if python_type(base) is not float and type(e) is not float and e >= 0:
        if e > (1 << 62):
            raise Unsupported("Python int ** a huge exponent")
        return _py("py_power_int", (base, node("const", (), dtypes.int64, value=int(e))), dtypes.int64, dtypes.int64)
    if not (math.isfinite(e) and float(e).is_integer()):
        raise Unsupported("x ** y between Python scalars with a fractional exponent (complex for x < 0)")
    return _py("py_float_power", (base, node("const", (), dtypes.float64, value=float(e))), dtypes.float64,
               dtypes.float64)
