"""Scalar expressions: one hash-consed node type for every operation (tinygrad's UOp style).

Building the same expression twice returns the same object, so structural equality is
identity and common subexpressions are shared for free. Python operators build nodes with
numpy's type promotion (Python scalars are weak, NEP 50).
"""
from __future__ import annotations

import enum
import hashlib
import itertools
import math
import struct
import weakref
from typing import Any, Callable, Iterable

import numpy as np

from jitop import dtypes
from jitop.dtypes import DType


class Op(enum.Enum):
    # ** leaves **
    CONST = enum.auto()     # arg: Python value
    VAR = enum.auto()       # arg: (name, uid)
    # ** memory **
    LOAD = enum.auto()      # arg: Tensor or Buffer, src: indices
    # ** unary **
    NEG = enum.auto()
    NOT = enum.auto()       # logical not (bool)
    INVERT = enum.auto()    # bitwise not (ints)
    CAST = enum.auto()      # to self.dtype
    # ** binary arithmetic **
    ADD = enum.auto(); SUB = enum.auto(); MUL = enum.auto()
    DIV = enum.auto()       # float division
    FLOORDIV = enum.auto(); FLOORMOD = enum.auto()   # Python/numpy // and %
    TRUNCDIV = enum.auto(); TRUNCMOD = enum.auto()   # C / and %
    MIN = enum.auto(); MAX = enum.auto()             # NaN-propagating, as np.minimum
    # ** bitwise / logical **
    AND = enum.auto(); OR = enum.auto(); XOR = enum.auto(); SHL = enum.auto(); SHR = enum.auto()
    # ** comparisons (result bool) **
    EQ = enum.auto(); NE = enum.auto(); LT = enum.auto(); LE = enum.auto(); GT = enum.auto(); GE = enum.auto()
    # ** other **
    SELECT = enum.auto()    # src: (cond, true_value, false_value)
    CALL = enum.auto()      # arg: intrinsic name, src: arguments
    REDUCE = enum.auto()    # arg: ReduceArg, src: (source, condition)


COMPARISONS = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE})
BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.FLOORDIV, Op.FLOORMOD, Op.TRUNCDIV, Op.TRUNCMOD,
                    Op.MIN, Op.MAX, Op.AND, Op.OR, Op.XOR, Op.SHL, Op.SHR}) | COMPARISONS
UNARY = frozenset({Op.NEG, Op.NOT, Op.INVERT, Op.CAST})

_uids = itertools.count()


class SymbolicTruthError(TypeError):
    """The truth value of a symbolic expression is asked for (a Python `if` on it): unknown until the kernel
    runs. A TypeError, as before it had a class of its own; a failed symbolic trace can be told by it."""


def _arg_key(arg: Any) -> Any:
    # 0.0 == -0.0 and 1 == 1.0 == True: key floats by their bits so distinct constants never merge
    if isinstance(arg, float):
        return ("f", struct.pack("<d", arg))
    if isinstance(arg, bool):
        return ("b", arg)
    return arg


class Expr:
    """A node of a scalar expression. Do not construct directly: use the helpers below.

    >>> from jitop import te
    >>> i = te.var("i")
    >>> (i * 2 + 1).dtype
    int64
    """

    __slots__ = ("op", "dtype", "src", "arg", "_hash", "_key", "__weakref__")
    _intern: "weakref.WeakValueDictionary[tuple, Expr]" = weakref.WeakValueDictionary()
    op: Op
    dtype: DType
    src: tuple["Expr", ...]
    arg: Any

    def __new__(cls, op: Op, dtype: DType, src: tuple["Expr", ...] = (), arg: Any = None) -> "Expr":
        key = (op, dtype, src, _arg_key(arg))
        found = cls._intern.get(key)
        if found is not None:
            return found
        node = object.__new__(cls)
        for name, value in (("op", op), ("dtype", dtype), ("src", src), ("arg", arg)):
            object.__setattr__(node, name, value)
        object.__setattr__(node, "_hash", hash(key))
        object.__setattr__(node, "_key", None)
        cls._intern[key] = node
        return node

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Expr nodes are immutable")

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        raise TypeError("Expr nodes are not picklable; use .key for a stable hash")

    @property
    def key(self) -> str:
        """Stable content hash (sha256 hex) of the expression; variables hash by name and dtype."""
        if self._key is None:
            h = hashlib.sha256(f"{self.op.name}|{self.dtype.name}|{_stable_arg(self)}|".encode())
            for s in self.src:
                h.update(s.key.encode())
            object.__setattr__(self, "_key", h.hexdigest())
        return self._key

    @property
    def name(self) -> str:
        assert self.op is Op.VAR, "only variables have a name"
        return self.arg[0]

    @property
    def value(self) -> Any:
        assert self.op is Op.CONST, "only constants have a value"
        return self.arg

    def __repr__(self) -> str:
        from jitop.te.printer import expr_str
        return expr_str(self)

    def __bool__(self) -> bool:
        # Interned nodes are equal iff identical. A dict lookup compares two keys with equal hashes
        # (a hash collision, e.g. the constants -1 and -2): that must answer, not raise. A folded
        # constant's truth is known. Any other truth test is a mistake.
        if self.op is Op.CONST:
            return bool(self.value)
        if self.op in (Op.EQ, Op.NE) and (self.src[0] is self.src[1] or hash(self.src[0]) == hash(self.src[1])):
            same = self.src[0] is self.src[1]
            return same if self.op is Op.EQ else not same
        raise SymbolicTruthError(
            f"the truth value of the symbolic expression {self!r} is unknown until the kernel runs; "
            "use te.if_then_else(cond, a, b) or te.select instead of Python `if`/`and`/`or`")

    # ** arithmetic operators build nodes **
    def __add__(self, o): return binary(Op.ADD, self, o)
    def __radd__(self, o): return binary(Op.ADD, o, self)
    def __sub__(self, o): return binary(Op.SUB, self, o)
    def __rsub__(self, o): return binary(Op.SUB, o, self)
    def __mul__(self, o): return binary(Op.MUL, self, o)
    def __rmul__(self, o): return binary(Op.MUL, o, self)
    def __truediv__(self, o): return binary(Op.DIV, self, o)
    def __rtruediv__(self, o): return binary(Op.DIV, o, self)
    def __floordiv__(self, o): return binary(Op.FLOORDIV, self, o)
    def __rfloordiv__(self, o): return binary(Op.FLOORDIV, o, self)
    def __mod__(self, o): return binary(Op.FLOORMOD, self, o)
    def __rmod__(self, o): return binary(Op.FLOORMOD, o, self)
    def __and__(self, o): return binary(Op.AND, self, o)
    def __rand__(self, o): return binary(Op.AND, o, self)
    def __or__(self, o): return binary(Op.OR, self, o)
    def __ror__(self, o): return binary(Op.OR, o, self)
    def __xor__(self, o): return binary(Op.XOR, self, o)
    def __rxor__(self, o): return binary(Op.XOR, o, self)
    def __lshift__(self, o): return binary(Op.SHL, self, o)
    def __rlshift__(self, o): return binary(Op.SHL, o, self)
    def __rshift__(self, o): return binary(Op.SHR, self, o)
    def __rrshift__(self, o): return binary(Op.SHR, o, self)
    def __lt__(self, o): return binary(Op.LT, self, o)
    def __le__(self, o): return binary(Op.LE, self, o)
    def __gt__(self, o): return binary(Op.GT, self, o)
    def __ge__(self, o): return binary(Op.GE, self, o)
    def __eq__(self, o): return binary(Op.EQ, self, o)  # type: ignore[override]
    def __ne__(self, o): return binary(Op.NE, self, o)  # type: ignore[override]
    def __neg__(self): return unary(Op.NEG, self)
    def __pos__(self): return self
    def __invert__(self): return unary(Op.NOT if self.dtype.is_bool else Op.INVERT, self)
    def __abs__(self): return call("abs", self)

    def astype(self, dtype: Any) -> "Expr":
        """Cast to `dtype` (numpy's astype semantics)."""
        return cast(self, dtype)


def _stable_arg(e: Expr) -> str:
    if e.op is Op.VAR:
        return e.arg[0]
    if e.op is Op.LOAD:
        return e.arg.key if hasattr(e.arg, "key") else f"{e.arg.name}|{e.arg.shape}|{e.arg.dtype}"
    if e.op is Op.REDUCE:
        return e.arg.key
    return repr(e.arg)


# ** constructors **

def const(value: Any, dtype: Any = None) -> Expr:
    """A constant; without `dtype` it takes the dtype numpy gives the scalar on its own."""
    dt = dtypes.scalar_dtype(value) if dtype is None else dtypes.as_dtype(dtype)
    return Expr(Op.CONST, dt, (), _canonical_value(value, dt))


def _canonical_value(value: Any, dt: DType) -> Any:
    if dt.is_bool:
        return bool(value)
    if dt.is_int:
        v = int(value) & ((1 << dt.bits) - 1)  # wraps like numpy's fixed-width integers
        return v - (1 << dt.bits) if dt.is_signed and v >= 1 << (dt.bits - 1) else v
    return float(np.array(value, dtype=dt.np))


def var(name: str, dtype: Any = "int64") -> Expr:
    """A fresh scalar variable (distinct from every other, even one with the same name).

    As a dimension of a placeholder or compute shape it is a symbol: one kernel serves every size,
    read from the arrays' shapes when it runs.

    >>> from jitop import te
    >>> n = te.var("n")
    >>> A = te.placeholder((n, 3), name="A")
    >>> A.shape, n * 2
    ((n, 3), n * 2)
    """
    return Expr(Op.VAR, dtypes.as_dtype(dtype), (), (name, next(_uids)))


def size_var(name: str, dtype: Any = "int64", min_value: int = 0) -> Expr:
    """A fresh variable known to be non-negative, as TVM's te.size_var (every shape symbol is one);
    `min_value`: a larger lower bound the kernel's callers guarantee (@jitop.kernel's symbols are >= 2 and
    checked before every call), which lowering may rely on.

    >>> from jitop import te
    >>> n = te.size_var("n")
    >>> te.compute((n,), lambda i: i * 2, name="B").shape, size_var_min(n), size_var_min(te.size_var("m", min_value=2))
    ((n,), 0, 2)
    """
    if min_value < 0:
        raise ValueError(f"size_var {name!r}: min_value must be >= 0, got {min_value}")
    extra = (min_value,) if min_value else ()
    return Expr(Op.VAR, dtypes.as_dtype(dtype), (), (name, next(_uids), "size", *extra))


def size_var_min(e: Expr) -> int:
    """The lower bound of a size_var (0 unless made with a larger min_value); 0 for any other variable."""
    return e.arg[3] if is_size_var(e) and len(e.arg) > 3 else 0


def is_size_var(e: Expr) -> bool:
    """True for a variable made by size_var (non-negative by definition)."""
    return e.op is Op.VAR and len(e.arg) > 2 and e.arg[2] == "size"


def as_expr(x: Any) -> Expr:
    """Wrap Python/numpy scalars as constants; pass expressions through."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, (bool, int, float, np.generic)):
        return const(x)
    if hasattr(x, "as_expr"):
        return x.as_expr()
    raise TypeError(f"cannot use {type(x).__name__} {x!r} in a tensor expression; expected a number or an expression")


def _weak(x: Any) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, np.generic)


def promote_operands(a: Any, b: Any) -> tuple[Expr, Expr]:
    """Both operands as Exprs of the common numpy result dtype (Python scalars are weak)."""
    if _weak(a) and _weak(b):
        a, b = const(a), const(b)
    if _weak(a) or _weak(b):
        strong = as_expr(b if _weak(a) else a)
        scalar = a if _weak(a) else b
        dt = dtypes.promote_scalar(strong.dtype, scalar)
        weak = const(_check_fits(scalar, dt), dt)
        return (weak, cast(strong, dt)) if _weak(a) else (cast(strong, dt), weak)
    a, b = as_expr(a), as_expr(b)
    dt = dtypes.promote(a.dtype, b.dtype)
    return cast(a, dt), cast(b, dt)


def _check_fits(value: Any, dt: DType) -> Any:
    # numpy 2 refuses a Python int that does not fit the array's integer dtype
    if dt.is_int and isinstance(value, int) and not isinstance(value, bool):
        info = np.iinfo(dt.np)
        if not info.min <= value <= info.max:
            raise OverflowError(f"Python integer {value} out of bounds for {dt}")
    return value


_BITWISE = frozenset({Op.AND, Op.OR, Op.XOR, Op.SHL, Op.SHR})
_BOOL_AS_INT8 = frozenset({Op.FLOORDIV, Op.FLOORMOD, Op.TRUNCDIV, Op.TRUNCMOD, Op.SHL, Op.SHR})


def binary(op: Op, a: Any, b: Any) -> Expr:
    """Build `a op b` with numpy's promotion; comparisons give bool, `/` on integers gives float64."""
    x, y = _comparable(a, b) if op in COMPARISONS or op is Op.DIV else promote_operands(a, b)
    if op is Op.DIV and not x.dtype.is_float:
        x, y = cast(x, dtypes.float64), cast(y, dtypes.float64)
    if op in _BITWISE and x.dtype.is_float:
        raise TypeError(f"bitwise operator '{op.name.lower()}' is not defined for {x.dtype} operands "
                        "(numpy raises the same); cast to an integer dtype first")
    if x.dtype.is_bool:
        op, x, y = _bool_arithmetic(op, x, y)
    out = dtypes.bool_ if op in COMPARISONS else x.dtype
    return _fold(Expr(op, out, (x, y)))


def _bool_arithmetic(op: Op, x: Expr, y: Expr) -> tuple[Op, Expr, Expr]:
    # numpy: True + True is True (logical or), * is and, - is an error, // % << >> compute in int8
    if op is Op.SUB:
        raise TypeError("numpy boolean subtract, the `-` operator, is not supported; use ^ or logical_xor")
    if op in _BOOL_AS_INT8:
        return op, cast(x, dtypes.int8), cast(y, dtypes.int8)
    return {Op.ADD: Op.OR, Op.MUL: Op.AND}.get(op, op), x, y


def _comparable(a: Any, b: Any) -> tuple[Expr, Expr]:
    """Operands of a comparison or true division: numpy 2 accepts Python ints outside the array's range."""
    try:
        return promote_operands(a, b)
    except OverflowError:
        strong, weak = (a, b) if _weak(b) else (b, a)
        dt = dtypes.int64 if -(1 << 63) <= weak < (1 << 63) else dtypes.float64
        x, y = cast(as_expr(strong), dt), const(weak, dt)
        return (x, y) if strong is a else (y, x)


def unary(op: Op, a: Any) -> Expr:
    x = as_expr(a)
    return _fold(Expr(op, x.dtype, (x,)))


def cast(x: Any, dtype: Any) -> Expr:
    """Convert `x` to `dtype` with numpy's casting semantics."""
    e, dt = as_expr(x), dtypes.as_dtype(dtype)
    if e.dtype is dt:
        return e
    if e.op is Op.CONST:
        return const(np.array(e.value, dtype=e.dtype.np).astype(dt.np)[()], dt)
    return Expr(Op.CAST, dt, (e,))


def select(cond: Any, a: Any, b: Any) -> Expr:
    """`a` where `cond` else `b`, elementwise (both sides are evaluated; see if_then_else)."""
    c = cast(as_expr(cond), dtypes.bool_)
    x, y = promote_operands(a, b)
    if c.op is Op.CONST:
        return x if c.value else y
    return Expr(Op.SELECT, x.dtype, (c, x, y))


def call(name: str, *args: Any, dtype: Any = None) -> Expr:
    """An intrinsic call node; `dtype` defaults to the first argument's dtype."""
    xs = tuple(as_expr(a) for a in args)
    return Expr(Op.CALL, dtypes.as_dtype(dtype) if dtype is not None else xs[0].dtype, xs, name)


# ** constant folding at construction keeps printed IR and index math free of noise **

_FOLD: dict[Op, Callable[[Any, Any], Any]] = {
    Op.ADD: lambda a, b: a + b, Op.SUB: lambda a, b: a - b, Op.MUL: lambda a, b: a * b,
    Op.MIN: min, Op.MAX: max,  # NaN operands are never folded (see below)
    Op.EQ: lambda a, b: a == b, Op.NE: lambda a, b: a != b, Op.LT: lambda a, b: a < b,
    Op.LE: lambda a, b: a <= b, Op.GT: lambda a, b: a > b, Op.GE: lambda a, b: a >= b,
    Op.AND: lambda a, b: a & b, Op.OR: lambda a, b: a | b, Op.XOR: lambda a, b: a ^ b,
}


def _fold(e: Expr) -> Expr:
    if not all(s.op is Op.CONST for s in e.src):
        return _fold_identity(e)
    vals = [s.value for s in e.src]
    if e.op in _FOLD and not any(isinstance(v, float) and math.isnan(v) for v in vals):
        return const(_FOLD[e.op](*vals), e.dtype)
    if e.op is Op.DIV and vals[1] != 0:
        return const(np.divide(*(np.array(v, e.dtype.np) for v in vals))[()], e.dtype)
    if e.op is Op.NEG and e.dtype.is_int:
        return const(-vals[0], e.dtype)
    if e.op in (Op.FLOORDIV, Op.FLOORMOD) and e.dtype.is_int and vals[1] != 0:
        return const(vals[0] // vals[1] if e.op is Op.FLOORDIV else vals[0] % vals[1], e.dtype)
    return e


def _fold_identity(e: Expr) -> Expr:
    # x*1 -> x, x+0 -> x, x*0 -> 0 (integers only: 0*inf is nan for floats)
    if e.op not in (Op.ADD, Op.SUB, Op.MUL, Op.FLOORDIV) or not e.dtype.is_int:
        return e
    a, b = e.src
    if e.op is Op.ADD and a.op is Op.CONST and a.value == 0:
        return b
    if e.op in (Op.ADD, Op.SUB) and b.op is Op.CONST and b.value == 0:
        return a
    if e.op is Op.MUL:
        for x, y in ((a, b), (b, a)):
            if x.op is Op.CONST and x.value == 1:
                return y
            if x.op is Op.CONST and x.value == 0:
                return x
    if e.op is Op.FLOORDIV and b.op is Op.CONST and b.value == 1:
        return a
    return e


# ** traversal **

def walk(e: Expr) -> Iterable[Expr]:
    """Every distinct node of `e`, children before parents."""
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        node, done = stack.pop()
        if done:
            yield node
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((s, False) for s in reversed(node.src))


def free_vars(e: Expr) -> set[Expr]:
    """The VAR nodes `e` depends on."""
    return {n for n in walk(e) if n.op is Op.VAR}


def rewrite(e: Expr, fn: Callable[[Expr], Expr | None], memo: dict[Expr, Expr] | None = None) -> Expr:
    """Rebuild `e` bottom-up; `fn(node)` returns a replacement or None to keep the (rebuilt) node."""
    memo = {} if memo is None else memo
    for node in walk(e):
        if node in memo:
            continue
        src = tuple(memo[s] for s in node.src)
        new = node if all(x is y for x, y in zip(src, node.src)) else rebuild(node, src)
        out = fn(new)
        memo[node] = new if out is None else out
    return memo[e]


def rebuild(node: Expr, src: tuple[Expr, ...]) -> Expr:
    """`node` with new children, re-folding constants."""
    if node.op in BINARY or node.op in (Op.NEG,):
        return _fold(Expr(node.op, node.dtype, src, node.arg))
    if node.op is Op.CAST:
        return cast(src[0], node.dtype)
    if node.op is Op.SELECT and src[0].op is Op.CONST:
        return src[1] if src[0].value else src[2]
    return Expr(node.op, node.dtype, src, node.arg)


def substitute(e: Expr, mapping: dict[Expr, Expr], memo: dict[Expr, Expr] | None = None) -> Expr:
    """Replace variables (or any nodes) by expressions; `memo` (node -> its replacement) may be shared by calls
    with one mapping, so a subexpression several expressions share is rebuilt once."""
    if not mapping:
        return e
    return rewrite(e, mapping.get, memo)
