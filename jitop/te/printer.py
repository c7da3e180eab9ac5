"""Readable text for scalar expressions (Python-like, minimal parentheses)."""
from __future__ import annotations

import numpy as np

from jitop.te.expr import Expr, Op

# Python's precedences, so the text parses back the way it was built
_INFIX = {Op.ADD: ("+", 5), Op.SUB: ("-", 5), Op.MUL: ("*", 6), Op.DIV: ("/", 6), Op.FLOORDIV: ("//", 6),
          Op.FLOORMOD: ("%", 6), Op.AND: ("&", 3), Op.OR: ("|", 1), Op.XOR: ("^", 2), Op.SHL: ("<<", 4),
          Op.SHR: (">>", 4), Op.EQ: ("==", 0), Op.NE: ("!=", 0), Op.LT: ("<", 0), Op.LE: ("<=", 0),
          Op.GT: (">", 0), Op.GE: (">=", 0)}
_CALLS = {Op.MIN: "min", Op.MAX: "max", Op.TRUNCDIV: "truncdiv", Op.TRUNCMOD: "truncmod", Op.SELECT: "select"}


def _const(e: Expr) -> str:
    v = e.value
    if e.dtype.is_float:
        text = repr(float(v)) if e.dtype.bits == 64 else repr(float(v)) if not np.isfinite(v) else str(np.float32(v))
        return text if e.dtype.bits == 64 else f"{text}f"
    return repr(v)


def expr_str(e: Expr, prec: int = -1) -> str:
    """An expression as Python-like text with only the parentheses precedence needs."""
    if e.op is Op.CONST:
        return _const(e)
    if e.op is Op.VAR:
        return e.name
    if e.op is Op.LOAD:
        return f"{e.arg.name}[{', '.join(expr_str(i) for i in e.src)}]"
    if e.op in _INFIX:
        sym, p = _INFIX[e.op]
        a, b = e.src
        left = p + 1 if p == 0 else p  # comparisons do not chain
        text = f"{expr_str(a, left)} {sym} {expr_str(b, p + 1)}"
        return f"({text})" if p < prec else text
    if e.op is Op.NEG:
        return f"-{expr_str(e.src[0], 7)}"
    if e.op in (Op.NOT, Op.INVERT):
        return f"~{expr_str(e.src[0], 7)}"
    if e.op is Op.CAST:
        return f"{e.dtype.name}({expr_str(e.src[0])})"
    if e.op is Op.REDUCE:
        src, cond = e.src
        axes = ", ".join(a.name for a in e.arg.axes)
        where = "" if cond.op is Op.CONST and cond.value else f", where={expr_str(cond)}"
        return f"{e.arg.reducer.name}({expr_str(src)}, axis=[{axes}]{where})"
    name = _CALLS.get(e.op) or e.arg
    return f"{name}({', '.join(expr_str(s) for s in e.src)})"
