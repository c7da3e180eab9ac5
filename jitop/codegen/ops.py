"""Emit one scalar operation with numpy's semantics; every function works on scalars and vectors alike.

Integer division and shifts are guarded so they never hit LLVM's undefined cases (numpy gives 0 for
x // 0 and wraps INT_MIN // -1); float -> int casts follow x86 (out of range gives INT_MIN), as numpy does.
"""
from __future__ import annotations

import struct
from typing import Any, Callable, Sequence

import numpy as np
from llvmlite import ir

from jitop.dtypes import DType, bool_
from jitop.te.expr import Op

# Reduction updates (acc + a*b) may fuse into FMA, as every BLAS does; elementwise arithmetic keeps
# numpy's separate roundings, so a*b+c gives numpy's answer bit for bit.
CONTRACT = ("contract",)


def llvm_type(dt: DType) -> ir.Type:
    """Register type of a dtype (bool is i1 in registers)."""
    if dt.is_float:
        return ir.FloatType() if dt.bits == 32 else ir.DoubleType()
    return ir.IntType(dt.bits)


def memory_type(dt: DType) -> ir.Type:
    """In-memory type (bool is one byte, as numpy stores it)."""
    return ir.IntType(8) if dt.is_bool else llvm_type(dt)


def lanes_of(v: ir.Value) -> int | None:
    return v.type.count if isinstance(v.type, ir.VectorType) else None


_VECTORS: dict[tuple, ir.Constant] = {}  # (element type, its values' bits) -> the one constant of them
_MAX_VECTORS = 8192


def vector_constant(ty: ir.Type, values: Sequence[Any]) -> ir.Constant:
    """A vector constant of element type `ty`: one object per distinct constant in the process. llvmlite prints
    a constant's text once per object, and a 16-lane constant made at each use (a splat, a lane index, a
    shuffle mask) took ~0.1 ms to print, thousands of times per model. Floats are told apart by their bits (0.0
    and -0.0 are two constants; so are NaNs of other payloads)."""
    key = (str(ty), tuple(int(v) if isinstance(v, (int, np.integer)) else struct.pack("<d", float(v))
                          for v in values))
    c = _VECTORS.get(key)
    if c is None:
        if len(_VECTORS) >= _MAX_VECTORS:
            _VECTORS.clear()
        c = _VECTORS[key] = ir.Constant(ir.VectorType(ty, len(values)), list(values))
    return c


def splat_constant(ty: ir.Type, value: Any, lanes: int | None) -> ir.Constant:
    """`value` as a constant of the scalar type `ty`, broadcast to `lanes` lanes (None: the scalar)."""
    return ir.Constant(ty, value) if lanes is None else vector_constant(ty, [value] * lanes)


def splat(b: ir.IRBuilder, v: ir.Value, lanes: int | None) -> ir.Value:
    """Broadcast a scalar to `lanes` lanes (no-op for scalars or values already vectors)."""
    if lanes is None or isinstance(v.type, ir.VectorType):
        return v
    if isinstance(v, ir.Constant):
        return splat_constant(v.type, v.constant, lanes)
    vt = ir.VectorType(v.type, lanes)
    one = b.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(ir.IntType(32), 0))
    return b.shuffle_vector(one, ir.Constant(vt, ir.Undefined), splat_constant(ir.IntType(32), 0, lanes))


def constant(dt: DType, value, lanes: int | None = None) -> ir.Value:
    return splat_constant(llvm_type(dt), float(value) if dt.is_float else int(value), lanes)


def _like(dt: DType, value, like: ir.Value) -> ir.Value:
    return constant(dt, value, lanes_of(like))


def _mangle(t: ir.Type) -> str:
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_mangle(t.element)}"
    if isinstance(t, ir.PointerType):
        return "p0"
    return {ir.FloatType: "f32", ir.DoubleType: "f64"}.get(type(t)) or f"i{t.width}"


def declare_intrinsic(module: ir.Module, name: str, overloads: list[ir.Type], fnty: ir.FunctionType) -> ir.Function:
    """Declare an overloaded LLVM intrinsic, mangling vector types too (llvmlite's helper does not)."""
    full = ".".join([name] + [_mangle(t) for t in overloads])
    fn = module.globals.get(full)
    return fn if fn is not None else ir.Function(module, fnty, full)


def _intrinsic(b: ir.IRBuilder, name: str, args: list[ir.Value], ret: ir.Type | None = None) -> ir.Value:
    ty = args[0].type
    return b.call(declare_intrinsic(b.module, name, [ty], ir.FunctionType(ret or ty, [a.type for a in args])), args)


# ** integer division with numpy's answers for the undefined cases **

def _safe_divisor(b: ir.IRBuilder, dt: DType, x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:
    """y with 0 (and, signed, -1 when x could be INT_MIN) replaced by 1; plus the 'y == 0' mask."""
    zero = b.icmp_unsigned("==", y, _like(dt, 0, y))
    bad = zero
    if dt.is_signed:
        bad = b.or_(zero, b.icmp_signed("==", y, _like(dt, -1, y)))
    return b.select(bad, _like(dt, 1, y), y), zero


def _int_divmod(b: ir.IRBuilder, dt: DType, x: ir.Value, y: ir.Value, floor: bool) -> tuple[ir.Value, ir.Value]:
    ys, zero = _safe_divisor(b, dt, x, y)
    if not dt.is_signed:
        q, r = b.udiv(x, ys), b.urem(x, ys)
    else:
        q, r = b.sdiv(x, ys), b.srem(x, ys)
        minus1 = b.icmp_signed("==", y, _like(dt, -1, y))
        q = b.select(minus1, b.sub(_like(dt, 0, x), x), q)  # x // -1 == -x, wrapping like numpy
        r = b.select(minus1, _like(dt, 0, x), r)
        if floor:
            adjust = b.and_(b.icmp_signed("!=", r, _like(dt, 0, r)),
                            b.icmp_signed("!=", b.icmp_signed("<", r, _like(dt, 0, r)),
                                          b.icmp_signed("<", y, _like(dt, 0, y))))
            q = b.select(adjust, b.sub(q, _like(dt, 1, q)), q)
            r = b.select(adjust, b.add(r, y), r)
    return b.select(zero, _like(dt, 0, q), q), b.select(zero, _like(dt, 0, r), r)


def _float_floor_divmod(b: ir.IRBuilder, dt: DType, x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:
    """numpy's npy_divmod: floor division and Python-style modulo for floats."""
    zero = _like(dt, 0.0, x)
    mod = b.frem(x, y)
    div = b.fdiv(b.fsub(x, mod), y)
    fix = b.and_(b.fcmp_unordered("!=", mod, zero),
                 b.icmp_unsigned("!=", b.fcmp_ordered("<", y, zero), b.fcmp_ordered("<", mod, zero)))
    mod = b.select(fix, b.fadd(mod, y), mod)
    div = b.select(fix, b.fsub(div, _like(dt, 1.0, div)), div)
    mod = b.select(b.fcmp_ordered("==", mod, zero), _intrinsic(b, "llvm.copysign", [zero, y]), mod)
    fl = _intrinsic(b, "llvm.floor", [div])
    fl = b.select(b.fcmp_ordered(">", b.fsub(div, fl), _like(dt, 0.5, div)), b.fadd(fl, _like(dt, 1.0, fl)), fl)
    quotient = b.fdiv(x, y)
    fl = b.select(b.fcmp_ordered("==", div, zero), _intrinsic(b, "llvm.copysign", [zero, quotient]), fl)
    ydead = b.fcmp_ordered("==", y, zero)
    return b.select(ydead, quotient, fl), mod


def _shift(b: ir.IRBuilder, dt: DType, x: ir.Value, y: ir.Value, left: bool) -> ir.Value:
    # numpy: shifting by >= the bit width gives 0 (or -1 for negative values shifted right)
    too_far = b.icmp_unsigned(">=", y, _like(dt, dt.bits, y))
    ys = b.select(too_far, _like(dt, 0, y), y)
    if left:
        return b.select(too_far, _like(dt, 0, x), b.shl(x, ys))
    if dt.is_signed:
        fill = b.select(b.icmp_signed("<", x, _like(dt, 0, x)), _like(dt, -1, x), _like(dt, 0, x))
        return b.select(too_far, fill, b.ashr(x, ys))
    return b.select(too_far, _like(dt, 0, x), b.lshr(x, ys))


def _minmax(b: ir.IRBuilder, dt: DType, x: ir.Value, y: ir.Value, is_min: bool) -> ir.Value:
    if dt.is_float:  # numpy's (a > b || isnan(a)) ? a : b (ties give b): x86's maxps plus a NaN blend
        pick_x = b.or_(b.fcmp_ordered("<" if is_min else ">", x, y), b.fcmp_unordered("uno", x, x))
        return b.select(pick_x, x, y)
    if dt.is_signed:
        return b.select(b.icmp_signed("<" if is_min else ">", x, y), x, y)
    return b.select(b.icmp_unsigned("<" if is_min else ">", x, y), x, y)


_CMP = {Op.EQ: "==", Op.NE: "!=", Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">="}


def compare(b: ir.IRBuilder, op: Op, dt: DType, x: ir.Value, y: ir.Value) -> ir.Value:
    sym = _CMP[op]
    if dt.is_float:  # NaN compares unequal to everything, as in numpy
        return b.fcmp_unordered(sym, x, y) if op is Op.NE else b.fcmp_ordered(sym, x, y)
    if dt.is_signed:
        return b.icmp_signed(sym, x, y)
    return b.icmp_unsigned(sym, x, y)


def binary(b: ir.IRBuilder, op: Op, dt: DType, x: ir.Value, y: ir.Value, contract: bool = False) -> ir.Value:
    """x op y for operands of dtype `dt` (comparisons return i1); `contract` allows FMA fusion."""
    if op in _CMP:
        return compare(b, op, dt, x, y)
    if dt.is_float:
        return _float_binary(b, op, dt, x, y, CONTRACT if contract else ())
    return _int_binary(b, op, dt, x, y)


def _float_binary(b: ir.IRBuilder, op: Op, dt: DType, x: ir.Value, y: ir.Value, flags: tuple) -> ir.Value:
    simple: dict[Op, Callable] = {Op.ADD: b.fadd, Op.SUB: b.fsub, Op.MUL: b.fmul}
    if op in simple:
        return simple[op](x, y, flags=flags)
    if op is Op.DIV:
        return b.fdiv(x, y)
    if op in (Op.MIN, Op.MAX):
        return _minmax(b, dt, x, y, op is Op.MIN)
    if op in (Op.FLOORDIV, Op.FLOORMOD):
        q, r = _float_floor_divmod(b, dt, x, y)
        return q if op is Op.FLOORDIV else r
    if op is Op.TRUNCMOD:
        return b.frem(x, y)
    if op is Op.TRUNCDIV:
        return _intrinsic(b, "llvm.trunc", [b.fdiv(x, y)])
    raise TypeError(f"operator {op.name} is not defined for {dt}")


def _int_binary(b: ir.IRBuilder, op: Op, dt: DType, x: ir.Value, y: ir.Value) -> ir.Value:
    simple: dict[Op, Callable] = {Op.ADD: b.add, Op.SUB: b.sub, Op.MUL: b.mul, Op.AND: b.and_, Op.OR: b.or_,
                                  Op.XOR: b.xor}
    if op in simple:
        return simple[op](x, y)
    if op in (Op.MIN, Op.MAX):
        return _minmax(b, dt, x, y, op is Op.MIN)
    if op in (Op.FLOORDIV, Op.FLOORMOD, Op.TRUNCDIV, Op.TRUNCMOD):
        q, r = _int_divmod(b, dt, x, y, floor=op in (Op.FLOORDIV, Op.FLOORMOD))
        return q if op in (Op.FLOORDIV, Op.TRUNCDIV) else r
    if op in (Op.SHL, Op.SHR):
        return _shift(b, dt, x, y, op is Op.SHL)
    raise TypeError(f"operator {op.name} is not defined for {dt}")


def unary(b: ir.IRBuilder, op: Op, dt: DType, x: ir.Value) -> ir.Value:
    if op is Op.NEG:
        return b.fneg(x) if dt.is_float else b.sub(_like(dt, 0, x), x)
    if op in (Op.NOT, Op.INVERT):
        return b.not_(x)
    raise TypeError(f"unary {op.name} is not defined for {dt}")


# ** casts **

def cast(b: ir.IRBuilder, src: DType, dst: DType, x: ir.Value) -> ir.Value:
    """numpy's astype for one value (x86 behaviour for out-of-range float -> int)."""
    lanes = lanes_of(x)
    ty = llvm_type(dst) if lanes is None else ir.VectorType(llvm_type(dst), lanes)
    if dst.is_bool:
        return b.fcmp_unordered("!=", x, _like(src, 0.0, x)) if src.is_float else b.icmp_unsigned("!=", x, _like(src, 0, x))
    if src.is_bool:
        return b.uitofp(x, ty) if dst.is_float else b.zext(x, ty)
    if src.is_float and dst.is_float:
        return b.fpext(x, ty) if dst.bits > src.bits else b.fptrunc(x, ty)
    if dst.is_float:
        return b.sitofp(x, ty) if src.is_signed else b.uitofp(x, ty)
    if src.is_float:
        return _float_to_int(b, src, dst, x, lanes)
    if dst.bits == src.bits:
        return x
    if dst.bits < src.bits:
        return b.trunc(x, ty)
    return b.sext(x, ty) if src.is_signed else b.zext(x, ty)


def _float_to_int(b: ir.IRBuilder, src: DType, dst: DType, x: ir.Value, lanes: int | None) -> ir.Value:
    # x86's cvtt* give the "integer indefinite" INT_MIN for NaN and out-of-range values; numpy inherits it
    via_bits = 64 if (dst.bits == 64 or (dst.bits == 32 and not dst.is_signed)) else 32
    wide = ir.IntType(via_bits) if lanes is None else ir.VectorType(ir.IntType(via_bits), lanes)
    if dst.bits == 64 and not dst.is_signed:
        limit = 2.0 ** 64
        ok = b.and_(b.fcmp_ordered(">", x, _like(src, -1.0, x)), b.fcmp_ordered("<", x, _like(src, limit, x)))
        safe = b.select(ok, x, _like(src, 0.0, x))
        return b.select(ok, b.fptoui(safe, wide), _like(dst, -(1 << 63), x))
    lo, hi = -(2.0 ** (via_bits - 1)), 2.0 ** (via_bits - 1)
    ok = b.and_(b.fcmp_ordered(">=", x, _like(src, lo, x)), b.fcmp_ordered("<", x, _like(src, hi, x)))
    safe = b.select(ok, x, _like(src, 0.0, x))
    indefinite = splat_constant(ir.IntType(via_bits), -(1 << (via_bits - 1)), lanes)
    val = b.select(ok, b.fptosi(safe, wide), indefinite)
    out_ty = llvm_type(dst) if lanes is None else ir.VectorType(llvm_type(dst), lanes)
    return val if dst.bits == via_bits else b.trunc(val, out_ty)


def to_memory(b: ir.IRBuilder, dt: DType, v: ir.Value) -> ir.Value:
    """Register value -> value to store (bool widens to a byte)."""
    if not dt.is_bool:
        return v
    lanes = lanes_of(v)
    return b.zext(v, ir.IntType(8) if lanes is None else ir.VectorType(ir.IntType(8), lanes))


def from_memory(b: ir.IRBuilder, dt: DType, v: ir.Value) -> ir.Value:
    """Loaded value -> register value (any non-zero byte is True)."""
    if not dt.is_bool:
        return v
    return b.icmp_unsigned("!=", v, splat_constant(ir.IntType(8), 0, lanes_of(v)))


def select(b: ir.IRBuilder, cond: ir.Value, x: ir.Value, y: ir.Value) -> ir.Value:
    lanes = lanes_of(cond) or lanes_of(x) or lanes_of(y)
    return b.select(splat(b, cond, lanes), splat(b, x, lanes), splat(b, y, lanes))


def classify(b: ir.IRBuilder, name: str, dt: DType, x: ir.Value) -> ir.Value:
    """isnan / isinf / isfinite."""
    if name == "isnan":
        return b.fcmp_unordered("uno", x, x)
    ax = _intrinsic(b, "llvm.fabs", [x])
    inf = _like(dt, np.inf, x)
    return b.fcmp_ordered("==", ax, inf) if name == "isinf" else b.fcmp_ordered("<", ax, inf)
