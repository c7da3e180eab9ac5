"""Intrinsic calls (te.exp, te.isnan, ...) -> LLVM IR, vectorized through jitop.codegen.vecmath."""
from __future__ import annotations

from llvmlite import ir

from jitop.codegen import ops
from jitop.dtypes import DType

# map straight onto LLVM intrinsics, which exist for vectors too
_LLVM = {"sqrt": "llvm.sqrt", "fabs": "llvm.fabs", "floor": "llvm.floor", "ceil": "llvm.ceil",
         "trunc": "llvm.trunc", "rint": "llvm.roundeven", "copysign": "llvm.copysign"}


def emit_call(b: ir.IRBuilder, name: str, dtype: DType, args: list[ir.Value], avx512: bool = False) -> ir.Value:
    """Emit intrinsic `name` on arguments of dtype `dtype` (scalars or vectors); `avx512`: the Target has
    AVX-512F, so the math library may use its instructions (default: it may not)."""
    if name in ("isnan", "isinf", "isfinite"):
        return ops.classify(b, name, dtype, args[0])
    if name in _LLVM:
        ty = args[0].type
        fn = ops.declare_intrinsic(b.module, _LLVM[name], [ty], ir.FunctionType(ty, [a.type for a in args]))
        return b.call(fn, args)
    if name == "ipow":
        return _int_power(b, dtype, args[0], args[1])
    if name == "fmod":
        return b.frem(args[0], args[1])
    if name == "rsqrt":
        one = ops.constant(dtype, 1.0, ops.lanes_of(args[0]))
        return b.fdiv(one, emit_call(b, "sqrt", dtype, args))
    try:
        from jitop.codegen import vecmath
    except ImportError:  # pragma: no cover - vecmath is part of the package
        vecmath = None
    if vecmath is not None and name in vecmath.MATH_FUNCTIONS:
        return vecmath.emit_math(b, name, args, avx512=avx512)
    return _per_lane_libm(b, name, dtype, args)


# the C library's math functions (double; float ones end in f) the per-lane fallback calls
LIBM = frozenset({"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos",
                  "atan", "sinh", "cosh", "tanh", "erf", "cbrt", "pow", "atan2", "hypot"})


def _per_lane_libm(b: ir.IRBuilder, name: str, dtype: DType, args: list[ir.Value]) -> ir.Value:
    """Fallback: call the C library's scalar function on each lane."""
    if name == "sigmoid":
        x = args[0]
        one = ops.constant(dtype, 1.0, ops.lanes_of(x))
        return b.fdiv(one, b.fadd(one, _per_lane_libm(b, "exp", dtype, [b.fneg(x)])))
    if name not in LIBM:
        raise NotImplementedError(f"intrinsic '{name}' has no code generator for {dtype}")
    scalar = ops.llvm_type(dtype)
    symbol = name if dtype.bits == 64 else name + "f"
    fn = b.module.globals.get(symbol) or ir.Function(b.module, ir.FunctionType(scalar, [scalar] * len(args)), symbol)
    lanes = ops.lanes_of(args[0])
    if lanes is None:
        return b.call(fn, args)
    out = ir.Constant(args[0].type, ir.Undefined)
    for k in range(lanes):
        i = ir.Constant(ir.IntType(32), k)
        out = b.insert_element(out, b.call(fn, [b.extract_element(a, i) for a in args]), i)
    return out


def _int_power(b: ir.IRBuilder, dtype: DType, x: ir.Value, y: ir.Value) -> ir.Value:
    """x ** y for integers by binary exponentiation over y's bits, branch-free (wraps like numpy;
    numpy rejects negative exponents at run time, here they use the exponent's bit pattern)."""
    lanes = ops.lanes_of(x)
    one, zero = ops.constant(dtype, 1, lanes), ops.constant(dtype, 0, lanes)
    result, base = one, x
    for bit in range(dtype.bits):
        take = b.icmp_unsigned("!=", b.and_(y, ops.constant(dtype, 1 << bit if bit < dtype.bits - 1 else
                                                         (-(1 << bit) if dtype.is_signed else 1 << bit), lanes)), zero)
        result = b.select(take, b.mul(result, base), result)
        base = b.mul(base, base)
    return result
