"""jitop.codegen.vecmath against numpy: max ulp error per function, special values, SIMD code.

Each (dtype, lanes) pair compiles one module holding a loop kernel per function,
`void k_<name>(ptr in0, ptr in1, ptr out, i64 n)`, that applies the function to n/L vectors.
The reference is numpy in a wider type (float64 for float32, long double for float64); the
error is |got - ref| / ulp(ref) with ulp taken in the tested dtype, so 0.5 is correctly
rounded. A wrong NaN, infinity or sign of zero counts as an infinite error, and every input
set ends with the special values (every pair of them for two-argument functions).

The accuracy kernels are built for `Target.current()` (this machine, or JITOP_CPU), with the AVX-512
paths (vscalef) where that Target has AVX-512: CI's `JITOP_CPU=haswell` run measures the AVX2 code.

`python tests/codegen/test_vecmath.py` prints the measured table.
"""
from __future__ import annotations

import ctypes
import functools
import re

import numpy as np
import pytest
from llvmlite import ir

from jitop.codegen.loader import load_object
from jitop.codegen.target import compile_ir, target_machine
from jitop.target import Target
from targets import runnable_targets
from jitop.codegen.vecmath import MATH_FUNCTIONS, emit_math

BINARY = {"pow", "fmod", "atan2", "hypot", "copysign"}

# Documented max ulp error per function, (float32, float64): the measured max (these inputs
# and larger offline sweeps) rounded up a little. The error is against the exact result, so
# 0.5 means correctly rounded; against numpy's result rounded to the dtype it is at most 0.5
# more. float64 pow and erf are the C library's, applied per lane; float32 tan of
# |x| > 2**44 is libm tanf's (1.4 ulp).
MAX_ULP = {
    "exp": (1.0, 1.0), "exp2": (0.85, 0.9), "expm1": (0.9, 0.85), "log": (0.8, 0.8),
    "log2": (0.9, 0.95), "log10": (0.95, 0.85), "log1p": (0.85, 0.8), "pow": (0.51, 0.55),
    "sin": (0.57, 0.8), "cos": (0.57, 0.8), "tan": (1.4, 1.1), "asin": (0.65, 0.62),
    "acos": (0.62, 0.6), "atan": (0.65, 0.62), "atan2": (0.77, 0.77), "sinh": (1.6, 1.65),
    "cosh": (1.4, 1.45), "tanh": (1.3, 1.3), "erf": (1.3, 0.0), "sigmoid": (1.5, 1.45),
    "cbrt": (0.51, 0.75), "hypot": (0.96, 0.96), "rsqrt": (1.5, 1.5),  # rsqrt: 1/sqrt(x), two roundings
    "sqrt": (0.5, 0.5), "fabs": (0, 0), "floor": (0, 0), "ceil": (0, 0), "trunc": (0, 0),
    "rint": (0, 0), "fmod": (0, 0), "copysign": (0, 0),
}
CASES = [(np.float32, 1), (np.float32, 16), (np.float64, 1), (np.float64, 8)]
ACCURACY_TARGET = Target.current()
AVX512 = Target.from_string("llvm -mcpu=skylake-avx512")
N = 1 << 16  # inputs per generator: ~170k per function with the rest


# ---------------------------------------------------------------------------------------
# building and running the kernels


def _kernel_ir(dtype, lanes: int, names, target: Target = ACCURACY_TARGET) -> str:
    elt = ir.FloatType() if dtype == np.float32 else ir.DoubleType()
    ty = ir.VectorType(elt, lanes) if lanes > 1 else elt
    align = np.dtype(dtype).itemsize
    mod = ir.Module(name=f"vecmath_test_{np.dtype(dtype).name}_{lanes}")
    ptr, i64 = ir.PointerType(), ir.IntType(64)
    for name in names:
        fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [ptr, ptr, ptr, i64]), f"k_{name}")
        in0, in1, out, n = fn.args
        entry, loop, done = fn.append_basic_block("entry"), fn.append_basic_block("loop"), fn.append_basic_block("done")
        b = ir.IRBuilder(entry)
        nv = b.udiv(n, ir.Constant(i64, lanes))
        b.cbranch(b.icmp_unsigned(">", nv, ir.Constant(i64, 0)), loop, done)
        b.position_at_end(loop)
        i = b.phi(i64)
        i.add_incoming(ir.Constant(i64, 0), entry)
        ins = [in0, in1] if name in BINARY else [in0]
        # indexed by element: a vector type's stride is its power-of-two alignment (256 bytes for 48 floats)
        at = b.mul(i, ir.Constant(i64, lanes))
        args = [b.load(b.gep(p, [at], source_etype=elt), typ=ty, align=align) for p in ins]
        b.store(emit_math(b, name, args, avx512=target.isa == "avx512"), b.gep(out, [at], source_etype=elt),
                align=align)
        nxt = b.add(i, ir.Constant(i64, 1))
        i.add_incoming(nxt, loop)
        b.cbranch(b.icmp_unsigned("<", nxt, nv), loop, done)
        b.position_at_end(done)
        b.ret_void()
    return str(mod)


@functools.cache
def _kernels(dtype, lanes: int, names: tuple[str, ...] = tuple(sorted(MATH_FUNCTIONS))) -> dict:
    _, obj = compile_ir(_kernel_ir(dtype, lanes, names), ACCURACY_TARGET)
    addrs = load_object(obj, [f"k_{n}" for n in names])
    proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    return {n: proto(addrs[f"k_{n}"]) for n in names}


def _run(name: str, dtype, lanes: int, x, y, names: tuple[str, ...] = tuple(sorted(MATH_FUNCTIONS))):
    n = len(x)
    pad = -n % lanes
    x = np.ascontiguousarray(np.concatenate([x, np.ones(pad, dtype)]))
    y = np.ascontiguousarray(np.concatenate([y, np.ones(pad, dtype)]))
    out = np.empty_like(x)
    _kernels(dtype, lanes, names)[name](x.ctypes.data, y.ctypes.data, out.ctypes.data, len(x))
    return out[:n]


# ---------------------------------------------------------------------------------------
# inputs and references


def _specials(dtype) -> np.ndarray:
    fi = np.finfo(dtype)
    v = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 0.25,
         fi.tiny, -fi.tiny, fi.smallest_subnormal, -fi.smallest_subnormal, fi.tiny / 3, fi.max, -fi.max,
         fi.eps, 1 + fi.eps, 1 - fi.epsneg, -1 + fi.epsneg, 10.0, -10.0, 100.0, 1e5, -1e5, 1e30, -1e30]
    return np.array(v, dtype)


def _domain(name: str, f64: bool):
    """(lo, hi) of the function's interesting uniform range."""
    r32 = {"exp": (-104, 89), "exp2": (-151, 129), "expm1": (-25, 89), "sinh": (-90, 90), "cosh": (-90, 90),
           "sigmoid": (-110, 110), "tanh": (-12, 12), "erf": (-5, 5), "asin": (-1.1, 1.1), "acos": (-1.1, 1.1),
           "log1p": (-1, 3), "sin": (-1e4, 1e4), "cos": (-1e4, 1e4), "tan": (-1e4, 1e4)}
    r64 = {"exp": (-746, 710), "exp2": (-1076, 1025), "expm1": (-40, 710), "sinh": (-711, 711), "cosh": (-711, 711),
           "sigmoid": (-750, 750), "tanh": (-25, 25)}
    return (r64.get(name) if f64 else None) or r32.get(name) or (-100, 100)


@functools.cache
def _inputs(name: str, dtype) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(sum(map(ord, name)))
    f64 = dtype == np.float64
    ity = np.int64 if f64 else np.int32

    def bits(n):  # every finite float, log-uniform magnitudes, both signs
        v = rng.integers(np.iinfo(ity).min, np.iinfo(ity).max, n, dtype=ity, endpoint=True).view(dtype)
        return np.where(np.isfinite(v), v, dtype(1.5))

    def logu(n, lo, hi):
        v = np.exp(rng.uniform(np.log(lo), np.log(hi), n)) * rng.choice([-1.0, 1.0], n)
        return v.astype(dtype)

    lo, hi = _domain(name, f64)
    parts = [rng.uniform(lo, hi, N).astype(dtype), logu(N // 2, 1e-30, 1.0), bits(N // 2)]
    if name in ("sin", "cos", "tan"):
        parts += [rng.uniform(-10, 10, N // 2).astype(dtype), logu(N // 4, 1e4, 2.0 ** 44)]
    if name in ("floor", "ceil", "trunc", "rint", "fmod"):
        parts.append((rng.integers(-50, 50, N // 4) / 2).astype(dtype))  # halves: round-half-even
    x = np.concatenate(parts)
    y = bits(len(x)) if name != "pow" else rng.uniform(-30, 30, len(x)).astype(dtype)
    if name == "pow":  # bases in [0, 4) and spread out; negative bases with integer exponents
        x = np.abs(x)
        x[: N // 2] = rng.uniform(0, 4, N // 2).astype(dtype)
        y[N // 4: N // 2] = np.round(y[N // 4: N // 2])
        x[N // 4: N // 2] *= -1
    if name in ("atan2", "hypot"):
        y = np.concatenate([rng.uniform(-100, 100, N), logu(len(x) - N, 1e-30, 1e30)]).astype(dtype)
    if name == "fmod":
        y = np.concatenate([rng.uniform(-10, 10, N), bits(len(x))[: len(x) - N]]).astype(dtype)
    s = _specials(dtype)
    if name in BINARY:  # every pair of special values
        sx, sy = np.meshgrid(s, s)
        x, y = np.concatenate([x, sx.ravel()]), np.concatenate([y[: len(x)], sy.ravel()])
    else:
        x, y = np.concatenate([x, s]), np.concatenate([y[: len(x)], np.ones(len(s), dtype)])
    return x.astype(dtype), y.astype(dtype)


def _erf(v):
    try:
        from scipy.special import erf
        return erf(v.astype(np.float64)).astype(v.dtype)
    except ImportError:  # pragma: no cover
        import math
        return np.vectorize(math.erf, otypes=[np.float64])(v).astype(v.dtype)


REFERENCE = {
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2, "log10": np.log10,
    "log1p": np.log1p, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "pow": np.power, "fabs": np.fabs,
    "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "rint": np.rint, "fmod": np.fmod, "sin": np.sin,
    "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "atan2": np.arctan2,
    "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "erf": _erf, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "cbrt": np.cbrt, "hypot": np.hypot, "copysign": np.copysign,
}


@functools.cache
def _reference(name: str, dtype) -> np.ndarray:
    """numpy in the wider type (float64 for float32, long double for float64), not rounded."""
    x, y = _inputs(name, dtype)
    wide = np.float64 if dtype == np.float32 else np.longdouble
    if name == "erf" and dtype == np.float64:  # no long-double erf anywhere: C library erf (< 1 ulp)
        import math
        return np.vectorize(math.erf, otypes=[np.float64])(x)
    with np.errstate(all="ignore"):
        args = [x.astype(wide)] + ([y.astype(wide)] if name in BINARY else [])
        return REFERENCE[name](*args)


def _ulp_errors(got: np.ndarray, wide: np.ndarray) -> np.ndarray:
    """|got - ref| / ulp(ref) per element, ref the exact (wide) result and ulp taken in got's
    dtype at ref rounded to it; inf where NaN-ness, an infinity or the sign of a zero differs."""
    with np.errstate(all="ignore"):
        ref = wide.astype(got.dtype)
        sp = np.spacing(np.abs(ref))
        sp = np.where(np.isinf(sp), np.spacing(np.nextafter(np.abs(ref), 0)), sp)
        err = np.abs(got.astype(wide.dtype) - wide) / sp.astype(wide.dtype)
    err = err.astype(np.float64)
    err = np.where(np.isnan(ref) & np.isnan(got), 0.0, err)
    err = np.where(np.isnan(ref) != np.isnan(got), np.inf, err)
    err = np.where(np.isinf(ref) | np.isinf(got), np.where(got == ref, 0.0, np.inf), err)
    return np.where((ref == 0) & (got == 0) & (np.signbit(ref) != np.signbit(got)), np.inf, err)


def _measure(name: str, dtype, lanes: int, names: tuple[str, ...] = tuple(sorted(MATH_FUNCTIONS))):
    """(max ulp error, (x, y, got, numpy) at the worst input)."""
    x, y = _inputs(name, dtype)
    got = _run(name, dtype, lanes, x, y, names)
    wide = _reference(name, dtype)
    err = _ulp_errors(got, wide)
    worst = int(np.argmax(err))
    return float(err[worst]), (x[worst], y[worst], got[worst], wide[worst].astype(dtype))


# ---------------------------------------------------------------------------------------
# tests


@pytest.mark.parametrize("dtype,lanes", CASES, ids=lambda v: getattr(v, "__name__", str(v)))
@pytest.mark.parametrize("name", sorted(MATH_FUNCTIONS))
def test_max_ulp(name, dtype, lanes):
    bound = MAX_ULP[name][dtype == np.float64]
    worst, (x, y, got, ref) = _measure(name, dtype, lanes)
    assert worst <= bound, (f"{name}[{np.dtype(dtype).name} x{lanes}] error {worst} ulp > {bound}: "
                            f"x={x!r} y={y!r} got={got!r} numpy={ref!r}")


SOME = ("exp", "log1p", "tanh", "sin", "pow", "cbrt", "atan2")


# 48 / 24 lanes: three AVX-512 registers, which vscalef's per-register parts must join back to one vector
@pytest.mark.parametrize("dtype,lanes", [(np.float32, 4), (np.float32, 32), (np.float32, 48), (np.float64, 2),
                                         (np.float64, 16), (np.float64, 24)],
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_other_vector_widths(dtype, lanes):
    for name in SOME:
        worst, at = _measure(name, dtype, lanes, SOME)
        assert worst <= MAX_ULP[name][dtype == np.float64], (name, worst, at)


def test_table_covers_every_function():
    assert set(MAX_ULP) == MATH_FUNCTIONS
    # the key float32 functions stay within 4 ulp
    for name in ("exp", "log", "tanh", "sigmoid", "erf", "sin", "cos", "pow", "exp2", "log2", "expm1", "log1p"):
        assert MAX_ULP[name][0] <= 4


@pytest.mark.parametrize("target", runnable_targets())
def test_vector_code_has_no_scalar_libm_calls(target):
    """exp/tanh/log on <16 x float> inline to SIMD: no expf/tanhf/logf calls, the target's widest registers."""
    src = _kernel_ir(np.float32, 16, ["exp", "tanh", "log"], target)
    mod, _ = compile_ir(src, target)
    text = str(mod)
    for fn in ("expf", "tanhf", "logf", "exp", "tanh", "log"):
        assert f"@{fn}(" not in text, fn
    callees = re.findall(r'\bcall [^@\n]*@"?([\w.]+)"?\(', text)
    assert callees and all(c.startswith("llvm.") for c in callees), callees  # only intrinsics remain
    asm = target_machine(target).emit_assembly(mod)
    widest = {64: "zmm", 32: "ymm", 16: "xmm"}[target.vector_bytes]
    assert re.search(rf"\b{widest}\d", asm)
    assert target.vector_bytes == 64 or "zmm" not in asm  # never an instruction the target lacks


@pytest.mark.parametrize("dtype,lanes", [(np.float32, 48), (np.float32, 80), (np.float32, 112), (np.float64, 40)],
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_avx512_code_builds_for_any_register_count(dtype, lanes):
    """Built (not run, so an AVX2 machine checks it too) for an AVX-512 Target: every function on vectors of
    3, 5 or 7 registers returns its argument's type (vscalef's parts once came back 16 lanes short)."""
    _, obj = compile_ir(_kernel_ir(dtype, lanes, tuple(sorted(MATH_FUNCTIONS)), AVX512), AVX512)
    assert obj


def test_functions_are_defined_once_per_module():
    mod = ir.Module()
    ty = ir.VectorType(ir.FloatType(), 8)
    fn = ir.Function(mod, ir.FunctionType(ty, [ty]), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    v = emit_math(b, "exp", [emit_math(b, "exp", [fn.args[0]])])
    b.ret(v)
    defined = [g for g in mod.globals.values() if g.name.startswith("jitop.math.")]
    assert [g.name for g in defined] == ["jitop.math.exp.v8f32"]
    assert defined[0].linkage == "internal" and "alwaysinline" in defined[0].attributes


def test_bad_arguments_say_what_is_wrong():
    mod = ir.Module()
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [ir.FloatType(), ir.IntType(32)]), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    with pytest.raises(ValueError, match="unknown math function 'expp'"):
        emit_math(b, "expp", [fn.args[0]])
    with pytest.raises(TypeError, match="takes 2 argument"):
        emit_math(b, "pow", [fn.args[0]])
    with pytest.raises(TypeError, match="float/double"):
        emit_math(b, "exp", [fn.args[1]])


if __name__ == "__main__":  # print the measured table
    import sys
    for name in sys.argv[1:] or sorted(MATH_FUNCTIONS):
        row, notes = [], []
        for dtype, lanes in CASES:
            worst, at = _measure(name, dtype, lanes)
            row.append(f"{worst:8.3f}")
            if worst > MAX_ULP[name][dtype == np.float64]:
                notes.append(f"{np.dtype(dtype).name}x{lanes}: x,y,got,ref={at}")
        print(f"{name:9s}", *row, *notes)
