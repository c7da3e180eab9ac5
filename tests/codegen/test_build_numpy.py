"""Build kernels and compare them with numpy: every dtype, odd shapes, edge values, every schedule primitive.

Kernels are built once per module (functools.cache) and shared between the tests that read them.
"""
from __future__ import annotations

import functools
import operator
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import jitop
from jitop import te
from kernel_checks import GemmTutorial

REPO = Path(__file__).resolve().parents[2]
INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOATS = ["float32", "float64"]
DTYPES = ["bool"] + INTS + FLOATS


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def rand(dtype: str, shape, seed: int = 0, nonzero: bool = False) -> np.ndarray:
    """Random values covering the dtype's range (floats: normal * 10, with a few exact integers)."""
    g = rng(seed)
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if dtype == "bool":
        return g.random(shape) < 0.5
    if dtype in FLOATS:
        a = (g.standard_normal(shape) * 10).astype(dtype)
        if a.size:
            a.flat[::7] = np.round(a.flat[::7])
    else:
        info = np.iinfo(dtype)
        lo, hi = max(info.min, -1000), min(info.max, 1000)
        a = g.integers(lo, hi, shape, dtype=dtype, endpoint=True)
        if a.size > 4:  # and some extremes
            a.flat[1], a.flat[3] = info.min, info.max
    if nonzero:
        a = np.where(a == 0, np.ones((), dtype), a)
    return np.ascontiguousarray(a)


def np_quiet(fn, *args):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return fn(*args)


def assert_same(out: np.ndarray, ref: np.ndarray, rtol: float | None = None, what: str = "") -> None:
    ref = np.asarray(ref)
    assert out.dtype == ref.dtype, f"{what}: dtype {out.dtype} != numpy's {ref.dtype}"
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
    if rtol is None:
        ok = np.array_equal(out, ref, equal_nan=out.dtype.kind == "f")
        if not ok:
            bad = np.argwhere(~((out == ref) | (np.isnan(out) & np.isnan(ref)) if out.dtype.kind == "f"
                                else out == ref))[:5]
            pytest.fail(f"{what}: mismatch at {bad.tolist()}: got {[out[tuple(b)] for b in bad]}, "
                        f"numpy {[ref[tuple(b)] for b in bad]}")
    else:
        np.testing.assert_allclose(out, ref, rtol=rtol, atol=rtol, equal_nan=True, err_msg=what)


def vectorize_last(s, T, factor: int = 16):
    """Split T's innermost axis by `factor` and vectorize the inner part (a tail when it does not divide)."""
    outer, inner = s[T].split(T.op.axis[-1], factor=factor)
    s[T].vectorize(inner)
    return outer, inner


# ---------------------------------------------------------------------------------------------
# elementwise operators, every dtype
# ---------------------------------------------------------------------------------------------

EW_SHAPE = (37, 53)


def _ops_for(dtype: str) -> dict[str, tuple]:
    """name -> (te function, numpy function, arity) of the binary/unary operators numpy defines for dtype."""
    ops = {
        "add": (operator.add, np.add), "mul": (operator.mul, np.multiply),
        "truediv": (operator.truediv, np.true_divide),
        "max": (te.max, np.maximum), "min": (te.min, np.minimum),
        "lt": (operator.lt, np.less), "le": (operator.le, np.less_equal), "gt": (operator.gt, np.greater),
        "ge": (operator.ge, np.greater_equal), "eq": (operator.eq, np.equal), "ne": (operator.ne, np.not_equal),
        "select": (lambda a, b: te.if_then_else(a < b, b, a), lambda a, b: np.where(a < b, b, a)),
    }
    if dtype != "bool":
        ops["sub"] = (operator.sub, np.subtract)
        ops["floordiv"] = (operator.floordiv, np.floor_divide)
        ops["mod"] = (operator.mod, np.remainder)
        ops["neg"] = (lambda a, b: -a, lambda a, b: np.negative(a))
        ops["abs"] = (lambda a, b: te.abs(a), lambda a, b: np.abs(a))
    if dtype not in FLOATS:
        ops["and"] = (operator.and_, np.bitwise_and)
        ops["or"] = (operator.or_, np.bitwise_or)
        ops["xor"] = (operator.xor, np.bitwise_xor)
        ops["invert"] = (lambda a, b: ~a, lambda a, b: np.invert(a))
    if dtype in INTS:
        ops["shl"] = (lambda a, b: a << (b & 7), lambda a, b: a << (b & 7))
        ops["shr"] = (lambda a, b: a >> (b & 7), lambda a, b: a >> (b & 7))
    if dtype in FLOATS:
        ops["exp"] = (lambda a, b: te.exp(a * 0.1), lambda a, b: np.exp(a * a.dtype.type(0.1)))
        ops["tanh"] = (lambda a, b: te.tanh(a), lambda a, b: np.tanh(a))
        ops["sqrt_abs"] = (lambda a, b: te.sqrt(te.abs(a)), lambda a, b: np.sqrt(np.abs(a)))
        ops["floor"] = (lambda a, b: te.floor(a), lambda a, b: np.floor(a))
        ops["rint"] = (lambda a, b: te.round(a), lambda a, b: np.round(a))
        ops["isnan"] = (lambda a, b: te.isnan(a / b), lambda a, b: np.isnan(a / b))
    return ops


@functools.cache
def elementwise_kernel(dtype: str, vectorized: bool):
    ops = _ops_for(dtype)
    A = te.placeholder(EW_SHAPE, dtype, "A")
    B = te.placeholder(EW_SHAPE, dtype, "B")
    outs = te.compute(EW_SHAPE, lambda i, j: tuple(f(A[i, j], B[i, j]) for f, _ in ops.values()), name="ew")
    s = jitop.create_schedule(outs[0].op)
    if vectorized:
        vectorize_last(s, outs[0], 16)
    f = jitop.build(s, [A, B, *outs])
    a, b = rand(dtype, EW_SHAPE, 1), rand(dtype, EW_SHAPE, 2)
    if dtype in INTS:
        b.flat[::5] = 0         # division by zero gives 0 in numpy
    if dtype in FLOATS:
        b.flat[::11] = 0.0      # inf/nan from division
        a.flat[::13] = np.nan
    results = f(a, b)
    return list(ops), a, b, results


def _ew_cases():
    for dt in DTYPES:
        for name in _ops_for(dt):
            yield pytest.param(dt, name, id=f"{dt}-{name}")


@pytest.mark.parametrize("vectorized", [False, True], ids=["scalar", "vec16"])
@pytest.mark.parametrize("dtype,name", list(_ew_cases()))
def test_elementwise_every_dtype(dtype, name, vectorized):
    names, a, b, results = elementwise_kernel(dtype, vectorized)
    _, np_fn = _ops_for(dtype)[name]
    ref = np_quiet(np_fn, a, b)
    out = results[names.index(name)]
    rtol = 2e-6 if dtype == "float32" and name in ("exp", "tanh") else (1e-14 if name in ("exp", "tanh") else None)
    assert_same(out, ref, rtol=rtol, what=f"{dtype} {name}")


ODD_SHAPES = [(1,), (7,), (13,), (1009,), (37, 53), (1, 1), (3, 1)]


@functools.cache
def shapes_kernel(dtype: str):
    """One function with an output per shape: a*b - a for numbers, a ^ b for bool; last axis vectorized."""
    ins, outs = [], []
    for k, shape in enumerate(ODD_SHAPES):
        A = te.placeholder(shape, dtype, f"A{k}")
        B = te.placeholder(shape, dtype, f"B{k}")
        if dtype == "bool":
            C = te.compute(shape, lambda *i: (A[i] ^ B[i]) | ~A[i], name=f"C{k}")
        else:
            C = te.compute(shape, lambda *i: te.if_then_else(A[i] < B[i], A[i] * B[i] - A[i], B[i]), name=f"C{k}")
        ins += [A, B]
        outs.append(C)
    s = jitop.create_schedule([C.op for C in outs])
    for C in outs:
        vectorize_last(s, C, 16)
    return jitop.build(s, ins + outs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_odd_shapes_every_dtype(dtype):
    f = shapes_kernel(dtype)
    arrays = []
    for k, shape in enumerate(ODD_SHAPES):
        arrays += [rand(dtype, shape, 3 * k), rand(dtype, shape, 3 * k + 1)]
    outs = f(*arrays)
    assert len(outs) == len(ODD_SHAPES)
    for k, (shape, out) in enumerate(zip(ODD_SHAPES, outs)):
        a, b = arrays[2 * k], arrays[2 * k + 1]
        ref = (a ^ b) | ~a if dtype == "bool" else np_quiet(lambda: np.where(a < b, a * b - a, b))
        # elementwise float arithmetic rounds like numpy (no FMA contraction outside reductions): exact
        assert_same(out, ref, what=f"{dtype} shape {shape}")


@pytest.mark.parametrize("dtype", ["bool", "int32", "uint8", "float32", "float64"])
@pytest.mark.parametrize("shape", [(0,), (0, 5), (5, 0)], ids=str)
def test_empty_shapes(dtype, shape):
    A = te.placeholder(shape, dtype, "A")
    B = te.compute(shape, lambda *i: A[i] | A[i] if dtype == "bool" else A[i] + A[i], name="B")
    s = jitop.create_schedule(B.op)
    vectorize_last(s, B, 8)
    f = jitop.build(s, [A, B])
    a = np.zeros(shape, dtype)
    out = f(a)
    assert out.shape == shape and out.dtype == np.dtype(dtype)


# ---------------------------------------------------------------------------------------------
# integer edge cases
# ---------------------------------------------------------------------------------------------

def _int_edge_inputs(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    info = np.iinfo(dtype)
    if info.min < 0:
        a = [7, -7, 7, -7, 0, 5, -5, info.min, info.min, info.max, 3, -3, info.min, -1, 6, -6, 1]
        b = [2, 2, -2, -2, 3, 0, 0, -1, 1, -1, 0, 1, info.min, info.min, -4, 4, -1]
    else:
        a = [7, 0, 5, info.max, 3, 1, info.max, 9, info.max, 0, 6, 2, 1, 1, 5, 8, 4]
        b = [2, 3, 0, 1, 0, info.max, 2, 7, info.max, 0, 4, 3, 9, 5, 5, 1, 0]
    return np.array(a, dtype), np.array(b, dtype)


def _shift_inputs(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    info = np.iinfo(dtype)
    bits = info.bits
    sh = [0, 1, 3, bits - 1, bits, bits + 1, min(100, info.max), min(2 * bits, info.max), bits - 2,
          min(255, info.max), 2, 7, 0, bits, 1, bits - 1, min(64, info.max)]
    vals = [1, -1, 5, -5, info.min, info.max, 3, -128, -1, 12, -3, info.min, info.max, -7, info.min, 1, -1] \
        if info.min < 0 else [1, 5, info.max, 3, 7, 2, 9, 1, info.max, 12, 3, info.max, 6, 7, 8, 1, 255]
    wrap = lambda v: np.array([z % 2 ** bits for z in v], dtype=np.uint64).astype(dtype)
    return wrap(vals), wrap(sh)


@functools.cache
def int_edge_kernel(dtype: str):
    n = len(_int_edge_inputs(dtype)[0])
    A = te.placeholder((n,), dtype, "A")
    B = te.placeholder((n,), dtype, "B")
    X = te.placeholder((n,), dtype, "X")
    S = te.placeholder((n,), dtype, "S")

    def body(i):
        return (A[i] // B[i], A[i] % B[i], te.truncdiv(A[i], B[i]), te.truncmod(A[i], B[i]), te.fmod(A[i], B[i]),
                X[i] << S[i], X[i] >> S[i], -A[i], te.abs(A[i]), A[i] * B[i], A[i] - B[i])
    scalar = te.compute((n,), body, name="scalar")
    vector = te.compute((n,), body, name="vector")
    s = jitop.create_schedule([scalar[0].op, vector[0].op])
    vectorize_last(s, vector[0], 8)   # 17 = 2 * 8 + a tail of 1
    return jitop.build(s, [A, B, X, S, *scalar, *vector])


def _trunc_divmod(a: np.ndarray, b: np.ndarray):
    """C's / and % (toward zero) in exact Python integers, wrapped to the dtype; x / 0 and x % 0 give 0."""
    bits = a.dtype.itemsize * 8
    q, r = [], []
    for x, y in zip(a.tolist(), b.tolist()):
        if y == 0:
            q.append(0), r.append(0)
            continue
        t = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
        q.append(t), r.append(x - t * y)
    wrap = lambda v: np.array([z % 2 ** bits for z in v], dtype=np.uint64).astype(a.dtype)
    return wrap(q), wrap(r)


@pytest.mark.parametrize("dtype", INTS)
def test_integer_division_shifts_and_wraparound(dtype):
    f = int_edge_kernel(dtype)
    a, b = _int_edge_inputs(dtype)
    x, sh = _shift_inputs(dtype)
    outs = f(a, b, x, sh)
    n = len(outs) // 2
    tq, tr = _trunc_divmod(a, b)
    refs = [np_quiet(np.floor_divide, a, b), np_quiet(np.remainder, a, b), tq, tr, np_quiet(np.fmod, a, b),
            np_quiet(np.left_shift, x, sh), np_quiet(np.right_shift, x, sh), np_quiet(np.negative, a),
            np_quiet(np.abs, a), np_quiet(np.multiply, a, b), np_quiet(np.subtract, a, b)]
    names = ["floordiv", "mod", "truncdiv", "truncmod", "fmod", "shl", "shr", "neg", "abs", "mul", "sub"]
    for label, res in (("scalar", outs[:n]), ("vector", outs[n:])):
        for name, out, ref in zip(names, res, refs):
            assert_same(out, ref, what=f"{dtype} {name} ({label}) a={a.tolist()} b={b.tolist()}")


def test_int_min_floordiv_minus_one_wraps():
    # the case that traps in C (SIGFPE) must give numpy's wrapped answer
    for dtype in ["int8", "int16", "int32", "int64"]:
        a, b = _int_edge_inputs(dtype)
        out = int_edge_kernel(dtype)(a, b, *_shift_inputs(dtype))[0]
        k = 7
        assert a[k] == np.iinfo(dtype).min and b[k] == -1
        assert out[k] == np.iinfo(dtype).min


@functools.cache
def cast_kernel(src: str):
    n = 24
    A = te.placeholder((n,), src, "A")
    dsts = INTS + FLOATS + ["bool"]
    outs = te.compute((n,), lambda i: tuple(te.cast(A[i], d) for d in dsts), name="cast")
    s = jitop.create_schedule(outs[0].op)
    vectorize_last(s, outs[0], 16)
    return dsts, jitop.build(s, [A, *outs])


def _in_range_values(src: str) -> np.ndarray:
    # values every integer dtype can hold after truncation toward zero: [0, 127] plus fractions
    vals = [0.0, -0.0, 0.25, 0.75, 1.0, 1.5, 2.5, 99.99, 127.0, 126.6, 42.0, 3.0, 0.5, 7.9, 64.0, 100.25,
            13.0, 1e-20, 5.5, 9.0, 120.9, 33.3, 2.0, 11.0]
    return np.array(vals, src)


@pytest.mark.parametrize("src", FLOATS)
def test_float_to_int_casts_in_range(src):
    dsts, f = cast_kernel(src)
    a = _in_range_values(src)
    for dst, out in zip(dsts, f(a)):
        assert_same(out, a.astype(dst), what=f"{src} -> {dst}")
    neg = -_in_range_values(src)
    for dst, out in zip(dsts, f(neg)):
        if dst in ("int8", "int16", "int32", "int64") or dst in FLOATS or dst == "bool":
            assert_same(out, neg.astype(dst), what=f"{src} -> {dst} (negative)")


@pytest.mark.parametrize("src", INTS + ["bool"])
def test_int_to_other_casts(src):
    n = 24
    A = te.placeholder((n,), src, "A")
    dsts = INTS + FLOATS + ["bool"]
    outs = te.compute((n,), lambda i: tuple(te.cast(A[i], d) for d in dsts), name="cast")
    s = jitop.create_schedule(outs[0].op)
    vectorize_last(s, outs[0], 8)
    f = jitop.build(s, [A, *outs])
    if src == "bool":
        a = rand("bool", n, 5)
    else:
        info = np.iinfo(src)
        a = rand(src, n, 5)
        a[:4] = [info.min, info.max, 0, info.max // 3]
    for dst, out in zip(dsts, f(a)):
        assert_same(out, a.astype(dst), what=f"{src} -> {dst}")


# ---------------------------------------------------------------------------------------------
# floats: NaN, inf, signed zeros
# ---------------------------------------------------------------------------------------------

NAN_A = [np.nan, 1.0, np.nan, -np.inf, np.inf, 0.0, -0.0, 2.0, np.nan, 3.0, -1.0, np.inf, -np.inf]
NAN_B = [1.0, np.nan, np.nan, np.inf, np.nan, -0.0, 0.0, -2.0, -np.inf, 3.0, np.nan, np.inf, -np.inf]


@functools.cache
def nan_kernel(dtype: str, vectorized: bool):
    n = len(NAN_A)
    A = te.placeholder((n,), dtype, "A")
    B = te.placeholder((n,), dtype, "B")
    outs = te.compute((n,), lambda i: (te.max(A[i], B[i]), te.min(A[i], B[i]), A[i] < B[i], A[i] <= B[i],
                                       A[i] > B[i], A[i] >= B[i], A[i] == B[i], A[i] != B[i],
                                       te.isnan(A[i]), te.isinf(A[i]), te.isfinite(A[i]), A[i] // B[i],
                                       A[i] % B[i], te.fmod(A[i], B[i]), te.cast(A[i], "bool"),
                                       te.sign(A[i]), te.copysign(A[i], B[i])), name="nan")
    s = jitop.create_schedule(outs[0].op)
    if vectorized:
        vectorize_last(s, outs[0], 8)
    return jitop.build(s, [A, B, *outs])


@pytest.mark.parametrize("vectorized", [False, True], ids=["scalar", "vec8"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_nan_inf_through_minmax_and_comparisons(dtype, vectorized):
    a, b = np.array(NAN_A, dtype), np.array(NAN_B, dtype)
    outs = nan_kernel(dtype, vectorized)(a, b)
    refs = [np.maximum(a, b), np.minimum(a, b), a < b, a <= b, a > b, a >= b, a == b, a != b, np.isnan(a),
            np.isinf(a), np.isfinite(a), np_quiet(np.floor_divide, a, b), np_quiet(np.remainder, a, b),
            np_quiet(np.fmod, a, b), a.astype(bool), np.sign(a), np.copysign(a, b)]
    names = ["max", "min", "lt", "le", "gt", "ge", "eq", "ne", "isnan", "isinf", "isfinite", "floordiv", "mod",
             "fmod", "bool", "sign", "copysign"]
    for name, out, ref in zip(names, outs, refs):
        assert_same(out, ref, what=f"{dtype} {name}")
        if name in ("mod", "copysign"):  # signed zeros too (max/min of +-0 is unspecified in numpy)
            assert np.array_equal(np.signbit(out), np.signbit(ref)), f"{dtype} {name} sign of zero"


def test_max_min_reductions_propagate_nan_like_numpy():
    A = te.placeholder((5, 9), "float32", "A")
    k = te.reduce_axis((0, 9), "k")
    mx = te.compute((5,), lambda i: te.max(A[i, k], axis=k), name="mx")
    mn = te.compute((5,), lambda i: te.min(A[i, k], axis=k), name="mn")
    s = jitop.create_schedule([mx.op, mn.op])
    f = jitop.build(s, [A, mx, mn])
    a = rand("float32", (5, 9), 4)
    a[1, 3] = np.nan
    a[3, 0] = np.nan
    a[4, 8] = np.nan
    a[2, :] = -np.inf
    omx, omn = f(a)
    assert_same(omx, a.max(axis=1), what="max")
    assert_same(omn, a.min(axis=1), what="min")


# ---------------------------------------------------------------------------------------------
# schedule primitives against numpy
# ---------------------------------------------------------------------------------------------

def _stencil(n: int, m: int, dtype: str = "float32"):
    """B = A * 2 + 1 elementwise, C = B[i, j] + B[i, j + 1] (reads a neighbour)."""
    A = te.placeholder((n, m + 1), dtype, "A")
    B = te.compute((n, m + 1), lambda i, j: A[i, j] * 2.0 + 1.0, name="B")
    C = te.compute((n, m), lambda i, j: B[i, j] + B[i, j + 1] * 0.5, name="C")
    return A, B, C


def _stencil_ref(a: np.ndarray) -> np.ndarray:
    b = a * np.float32(2.0) + np.float32(1.0)
    return b[:, :-1] + b[:, 1:] * np.float32(0.5)


SCHEDULES = {}


def schedule(fn):
    SCHEDULES[fn.__name__] = fn
    return fn


@schedule
def default(s, A, B, C):
    pass


@schedule
def split_factor(s, A, B, C):
    s[C].split(C.op.axis[0], factor=4)
    s[C].split(C.op.axis[1], factor=6)


@schedule
def split_nparts(s, A, B, C):
    s[C].split(C.op.axis[0], nparts=3)
    s[C].split(C.op.axis[1], nparts=4)
    s[B].split(B.op.axis[1], nparts=5)


@schedule
def split_twice(s, A, B, C):
    o, i = s[C].split(C.op.axis[1], factor=8)
    oo, oi = s[C].split(o, factor=3)
    ii, ij = s[C].split(i, nparts=3)


@schedule
def tile(s, A, B, C):
    s[C].tile(C.op.axis[0], C.op.axis[1], 4, 8)


@schedule
def fuse_then_split(s, A, B, C):
    f = s[C].fuse(*C.op.axis)
    o, i = s[C].split(f, factor=16)
    s[C].vectorize(i)


@schedule
def reorder(s, A, B, C):
    s[C].reorder(C.op.axis[1], C.op.axis[0])
    o, i = s[B].split(B.op.axis[0], factor=3)
    s[B].reorder(i, B.op.axis[1], o)


@schedule
def vectorize_outer_axis(s, A, B, C):
    o, i = s[C].split(C.op.axis[0], factor=4)
    s[C].reorder(o, C.op.axis[1], i)
    s[C].vectorize(i)  # stride-m accesses: gathers


@schedule
def vectorize_not_innermost(s, A, B, C):
    o, i = s[C].split(C.op.axis[0], factor=4)
    s[C].reorder(o, i, C.op.axis[1])
    s[C].vectorize(i)  # a serial loop inside the vector loop


@schedule
def parallel(s, A, B, C):
    s[C].parallel(C.op.axis[0])
    s[B].parallel(B.op.axis[0])


@schedule
def parallel_fused_vectorized(s, A, B, C):
    xo, yo, xi, yi = s[C].tile(C.op.axis[0], C.op.axis[1], 4, 8)
    f = s[C].fuse(xo, yo)
    s[C].parallel(f)
    s[C].vectorize(yi)


@schedule
def unroll(s, A, B, C):
    o, i = s[C].split(C.op.axis[1], factor=4)
    s[C].unroll(i)
    s[B].unroll(B.op.axis[0])


@schedule
def compute_at_outer(s, A, B, C):
    s[B].compute_at(s[C], C.op.axis[0])


@schedule
def compute_at_split(s, A, B, C):
    xo, yo, xi, yi = s[C].tile(C.op.axis[0], C.op.axis[1], 4, 8)
    s[B].compute_at(s[C], yo)
    s[C].vectorize(yi)


@schedule
def compute_at_parallel(s, A, B, C):
    xo, xi = s[C].split(C.op.axis[0], factor=3)
    s[C].parallel(xo)
    s[B].compute_at(s[C], xi)
    o, i = s[B].split(s[B].op.axis[1], factor=8)
    s[B].vectorize(i)


@schedule
def compute_inline(s, A, B, C):
    s[B].compute_inline()
    vectorize_last(s, C, 8)


@schedule
def compute_root_after_compute_at(s, A, B, C):
    s[B].compute_at(s[C], C.op.axis[0])
    s[B].compute_root()


@schedule
def cache_read(s, A, B, C):
    AA = s.cache_read(A, "local", [B])
    s[AA].compute_at(s[B], B.op.axis[0])


@schedule
def cache_write_elementwise(s, A, B, C):
    CL = s.cache_write(C, "local")
    xo, xi = s[C].split(C.op.axis[1], factor=8)
    s[CL].compute_at(s[C], xo)


STENCIL_SHAPES = [(1, 1), (7, 13), (13, 29)]


@pytest.mark.parametrize("shape", STENCIL_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedule_primitives_match_numpy(name, shape, monkeypatch):
    monkeypatch.setenv("JITOP_PARALLEL_MIN_WORK", "1")  # really launch threads on these small loops
    A, B, C = _stencil(*shape)
    s = jitop.create_schedule(C.op)
    SCHEDULES[name](s, A, B, C)
    f = jitop.build(s, [A, C])
    a = rand("float32", A.shape, 7)
    assert_same(f(a), _stencil_ref(a), what=f"{name} {shape}\n{jitop.lower(s, [A, C])}")


@pytest.mark.parametrize("extent", [1, 7, 16, 17, 100])
def test_vectorize_with_tails(extent):
    A = te.placeholder((3, extent), "float64", "A")
    I = te.placeholder((3, extent), "int32", "I")
    whole = te.compute((3, extent), lambda i, j: A[i, j] * 3.0 - I[i, j], name="whole")
    split = te.compute((3, extent), lambda i, j: A[i, j] * 3.0 - I[i, j], name="split")
    trans = te.compute((extent, 3), lambda j, i: A[i, j] + te.cast(I[i, j] > 0, "float64"), name="trans")
    s = jitop.create_schedule([whole.op, split.op, trans.op])
    s[whole].vectorize(whole.op.axis[1])              # the whole axis as lanes (> 64 is strip-mined)
    vectorize_last(s, split, 16)                      # split by 16: a masked tail
    s[trans].reorder(trans.op.axis[1], trans.op.axis[0])
    s[trans].vectorize(trans.op.axis[0])              # strided store: a scatter
    f = jitop.build(s, [A, I, whole, split, trans])
    a, ii = rand("float64", (3, extent), 1), rand("int32", (3, extent), 2)
    ow, os_, ot = f(a, ii)
    ref = a * 3.0 - ii
    assert_same(ow, ref, what="whole axis vectorized")   # no FMA contraction: bit-exact
    assert_same(os_, ref, what="split + vectorized")
    assert_same(ot, (a + (ii > 0)).T.copy(), what="transposed vectorized store")


def test_vectorize_reduce_axis_and_uniform_store_fall_back_correctly():
    A = te.placeholder((5, 19), "float32", "A")
    k = te.reduce_axis((0, 19), "k")
    R = te.compute((5,), lambda i: te.sum(A[i, k], axis=k), name="R")
    s = jitop.create_schedule(R.op)
    s[R].vectorize(k)  # every lane would write R[i]: must not race lanes
    f = jitop.build(s, [A, R])
    a = rand("float32", (5, 19), 3)
    assert_same(f(a), a.sum(axis=1), rtol=1e-5)


def test_unroll_beyond_limit_and_with_guards():
    A = te.placeholder((300,), "int64", "A")
    B = te.compute((300,), lambda i: A[i] * 3 + 1, name="B")
    s = jitop.create_schedule(B.op)
    o, i = s[B].split(B.op.axis[0], factor=7)
    s[B].unroll(i)
    s[B].unroll(o)  # 43 iterations, each unrolled again
    C = te.compute((300,), lambda i: A[i] - 2, name="C")
    s2 = jitop.create_schedule(C.op)
    s2[C].unroll(C.op.axis[0])  # above the unroll limit: stays a loop
    a = rand("int64", 300, 9)
    assert_same(jitop.build(s, [A, B])(a), a * 3 + 1)
    assert_same(jitop.build(s2, [A, C])(a), a - 2)


def test_parallel_with_big_local_buffer_and_reduction(monkeypatch):
    monkeypatch.setenv("JITOP_PARALLEL_MIN_WORK", "1")
    n, m = 6, 20000  # a 80 KB region per iteration: heap-allocated inside the parallel body
    A = te.placeholder((n, m), "float32", "A")
    B = te.compute((n, m), lambda i, j: A[i, j] * A[i, j], name="B")
    k = te.reduce_axis((0, m), "k")
    C = te.compute((n,), lambda i: te.sum(B[i, k], axis=k), name="C")
    s = jitop.create_schedule(C.op)
    s[C].parallel(C.op.axis[0])
    s[B].compute_at(s[C], C.op.axis[0])
    f = jitop.build(s, [A, C])
    a = rand("float32", (n, m), 2) * np.float32(0.01)
    assert_same(f(a), (a.astype(np.float64) ** 2).sum(axis=1).astype(np.float32), rtol=1e-4)


def test_nested_parallel_loops(monkeypatch):
    monkeypatch.setenv("JITOP_PARALLEL_MIN_WORK", "1")
    A = te.placeholder((9, 11), "int32", "A")
    B = te.compute((9, 11), lambda i, j: A[i, j] * 2 + i - j, name="B")
    s = jitop.create_schedule(B.op)
    s[B].parallel(B.op.axis[0])
    s[B].parallel(B.op.axis[1])
    a = rand("int32", (9, 11), 1)
    i, j = np.meshgrid(np.arange(9), np.arange(11), indexing="ij")
    assert_same(jitop.build(s, [A, B])(a), a * 2 + i - j)  # int32 with int64 loop indices: int64


def test_compute_inline_chain_and_multiple_consumers():
    A = te.placeholder((31,), "float64", "A")
    B = te.compute((31,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((31,), lambda i: B[i] * B[i], name="C")
    D = te.compute((31,), lambda i: C[i] - B[(i + 1) % 31], name="D")
    s = jitop.create_schedule(D.op)
    s[B].compute_inline()
    s[C].compute_inline()
    vectorize_last(s, D, 8)
    a = rand("float64", 31, 1)
    b = a + 1
    assert_same(jitop.build(s, [A, D])(a), b * b - np.roll(b, -1))


def test_compute_at_reduction_producer():
    A = te.placeholder((13, 17), "float32", "A")
    k = te.reduce_axis((0, 17), "k")
    S = te.compute((13,), lambda i: te.sum(A[i, k], axis=k), name="S")
    N = te.compute((13, 17), lambda i, j: A[i, j] / S[i], name="N")
    s = jitop.create_schedule(N.op)
    s[S].compute_at(s[N], N.op.axis[0])
    vectorize_last(s, N, 8)
    a = np.abs(rand("float32", (13, 17), 2)) + 1
    assert_same(jitop.build(s, [A, N])(a), a / a.sum(axis=1, keepdims=True), rtol=1e-5)


def test_multiple_outputs_of_one_schedule_with_shared_producer():
    A = te.placeholder((23,), "float32", "A")
    B = te.compute((23,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((23,), lambda i: B[i] + 1.0, name="C")
    D = te.compute((23,), lambda i: B[i] - 1.0, name="D")
    s = jitop.create_schedule([C.op, D.op])
    f = jitop.build(s, [A, C, D])
    a = rand("float32", 23, 1)
    c, d = f(a)
    assert_same(c, a * 2 + 1)
    assert_same(d, a * 2 - 1)


# ---------------------------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------------------------

@functools.cache
def reduction_kernel(dtype: str, n: int, m: int, split: bool):
    A = te.placeholder((n, m), dtype, "A")
    outs = []
    for name, red in (("sum", te.sum), ("max", te.max), ("min", te.min), ("prod", te.prod)):
        k = te.reduce_axis((0, m), "k")
        outs.append(te.compute((n,), lambda i: red(A[i, k], axis=k), name=name))
    s = jitop.create_schedule([o.op for o in outs])
    if split:
        for o in outs:
            ko, ki = s[o].split(o.op.reduce_axis[0], factor=4)
            s[o].reorder(ko, o.op.axis[0], ki)
    return jitop.build(s, [A, *outs])


@pytest.mark.parametrize("split", [False, True], ids=["plain", "split_reordered"])
@pytest.mark.parametrize("dtype", ["int8", "int32", "uint16", "int64", "float32", "float64"])
def test_sum_max_min_prod(dtype, split):
    n, m = 7, 13
    f = reduction_kernel(dtype, n, m, split)
    a = rand(dtype, (n, m), 5)
    if dtype in FLOATS:
        a = a / np.array(10, dtype)   # keep prod finite
    else:
        a = (a % 5).astype(dtype)     # products in range... numpy wraps anyway
    refs = [a.sum(axis=1, dtype=dtype), a.max(axis=1), a.min(axis=1), np_quiet(np.prod, a, 1, dtype)]
    rtol = {"float32": 1e-5, "float64": 1e-12}.get(dtype)
    for name, out, ref in zip(["sum", "max", "min", "prod"], f(a), refs):
        assert_same(out, ref, rtol=rtol, what=f"{dtype} {name}")


def test_reduction_over_empty_axis_gives_identity():
    A = te.placeholder((4, 0), "float32", "A")
    k = te.reduce_axis((0, 0), "k")
    S = te.compute((4,), lambda i: te.sum(A[i, k], axis=k), name="S")
    k2 = te.reduce_axis((0, 0), "k2")
    P = te.compute((4,), lambda i: te.prod(A[i, k2], axis=k2), name="P")
    s = jitop.create_schedule([S.op, P.op])
    sv, pv = jitop.build(s, [A, S, P])(np.zeros((4, 0), np.float32))
    assert_same(sv, np.zeros(4, np.float32))
    assert_same(pv, np.ones(4, np.float32))


def test_comm_reducers():
    n, m = 9, 21
    A = te.placeholder((n, m), "float32", "A")
    I = te.placeholder((n, m), "uint32", "I")
    absmax = te.comm_reducer(lambda x, y: te.max(te.abs(x), te.abs(y)), lambda t: te.const(0, t), name="absmax")
    bitor = te.comm_reducer(lambda x, y: x | y, lambda t: te.const(0, t), name="bitor")
    sumsq = te.comm_reducer(lambda x, y: x + y, lambda t: te.const(0, t), name="mysum")
    k1, k2, k3 = te.reduce_axis((0, m), "k1"), te.reduce_axis((0, m), "k2"), te.reduce_axis((0, m), "k3")
    R1 = te.compute((n,), lambda i: absmax(A[i, k1], axis=k1), name="R1")
    R2 = te.compute((n,), lambda i: bitor(I[i, k2], axis=k2), name="R2")
    R3 = te.compute((n,), lambda i: sumsq(A[i, k3] * A[i, k3], axis=k3), name="R3")
    s = jitop.create_schedule([R1.op, R2.op, R3.op])
    ko, ki = s[R3].split(k3, factor=5)
    f = jitop.build(s, [A, I, R1, R2, R3])
    a, ii = rand("float32", (n, m), 1), rand("uint32", (n, m), 2)
    r1, r2, r3 = f(a, ii)
    assert_same(r1, np.abs(a).max(axis=1))
    assert_same(r2, np.bitwise_or.reduce(ii, axis=1))
    assert_same(r3, (a * a).sum(axis=1), rtol=1e-5)


def test_reductions_with_where():
    n = 11
    A = te.placeholder((n, n), "float64", "A")
    k = te.reduce_axis((0, n), "k")
    L = te.compute((n,), lambda i: te.sum(A[i, k], axis=k, where=k <= i), name="L")
    k2 = te.reduce_axis((0, n), "k2")
    M = te.compute((n,), lambda i: te.max(A[i, k2], axis=k2, where=A[i, k2] < 0.0), name="M")
    s = jitop.create_schedule([L.op, M.op])
    ko, ki = s[L].split(k, factor=4)
    s[L].vectorize(L.op.axis[0])
    f = jitop.build(s, [A, L, M])
    a = rand("float64", (n, n), 8)
    lo, mo = f(a)
    assert_same(lo, np.tril(a).sum(axis=1), rtol=1e-12)
    assert_same(mo, np.where(a < 0, a, -np.inf).max(axis=1))


def test_reduction_over_two_axes():
    A = te.placeholder((5, 6, 7), "float64", "A")
    j, k = te.reduce_axis((0, 6), "j"), te.reduce_axis((0, 7), "k")
    S = te.compute((5,), lambda i: te.sum(A[i, j, k] * 2.0, axis=[j, k]), name="S")
    s = jitop.create_schedule(S.op)
    s[S].reorder(k, S.op.axis[0], j)
    a = rand("float64", (5, 6, 7), 1)
    assert_same(jitop.build(s, [A, S])(a), (a * 2).sum(axis=(1, 2)), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# multi-output compute
# ---------------------------------------------------------------------------------------------

def test_multi_output_compute_tuple():
    A = te.placeholder((17, 9), "float32", "A")
    P, Q, R = te.compute((17, 9), lambda i, j: (A[i, j] + 1.0, A[i, j] * A[i, j], A[i, j] > 0.0), name="PQR")
    assert P.op is Q.op is R.op and R.dtype.name == "bool"
    s = jitop.create_schedule(P.op)
    vectorize_last(s, P, 4)
    f = jitop.build(s, [A, P, Q, R])
    a = rand("float32", (17, 9), 2)
    p, q, r = f(a)
    assert_same(p, a + 1)
    assert_same(q, a * a)
    assert_same(r, a > 0)


def test_multi_output_consumed_by_another_stage():
    A = te.placeholder((12,), "int32", "A")
    lo, hi = te.compute((12,), lambda i: (A[i] & 0xFF, A[i] >> 8), name="split")
    C = te.compute((12,), lambda i: lo[i] * 1000 + hi[i], name="C")
    s = jitop.create_schedule(C.op)
    s[lo.op].compute_at(s[C], C.op.axis[0])
    a = rand("int32", 12, 3)
    assert_same(jitop.build(s, [A, C])(a), ((a & 0xFF) * 1000 + (a >> 8)).astype(np.int32))


def test_multi_output_reduction():
    A = te.placeholder((6, 10), "float32", "A")
    k = te.reduce_axis((0, 10), "k")
    S, M = te.compute((6,), lambda i: (te.sum(A[i, k], axis=k), te.max(A[i, k], axis=k)), name="SM")
    s = jitop.create_schedule(S.op)
    f = jitop.build(s, [A, S, M])
    a = rand("float32", (6, 10), 4)
    so, mo = f(a)
    assert_same(so, a.sum(axis=1), rtol=1e-5)
    assert_same(mo, a.max(axis=1))


# ---------------------------------------------------------------------------------------------
# if_then_else guards reads: padding must not read out of bounds
# ---------------------------------------------------------------------------------------------

def test_padding_if_then_else_values():
    n = 37
    A = te.placeholder((n,), "float32", "A")
    L = te.compute((n,), lambda i: te.if_then_else(i >= 1, A[i - 1], 0.0), name="L")
    R = te.compute((n,), lambda i: te.if_then_else(i < n - 1, A[i + 1], 0.0), name="R")
    s = jitop.create_schedule([L.op, R.op])
    vectorize_last(s, R, 16)
    a = rand("float32", n, 1)
    lo, ro = jitop.build(s, [A, L, R])(a)
    assert_same(lo, np.concatenate([[0.0], a[:-1]]).astype(np.float32))
    assert_same(ro, np.concatenate([a[1:], [0.0]]).astype(np.float32))


GUARD_SCRIPT = r"""
import ctypes, mmap, sys
import numpy as np
sys.path.insert(0, REPO)
import jitop
from jitop import te

PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

def guarded(nbytes, at_end):
    # an array touching a PROT_NONE page on one side: any out-of-bounds read faults
    pages = (nbytes + PAGE - 1) // PAGE
    mm = mmap.mmap(-1, (pages + 2) * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    assert libc.mprotect(base, PAGE, 0) == 0
    assert libc.mprotect(base + (pages + 1) * PAGE, PAGE, 0) == 0
    offset = (pages + 1) * PAGE - nbytes if at_end else PAGE
    return mm, offset

def check(name, s, args, arrays, ref):
    f = jitop.build(s, args)
    for at_end in (False, True):
        a = arrays[0]
        mm, off = guarded(a.nbytes, at_end)
        g = np.frombuffer(mm, a.dtype, a.size, off).reshape(a.shape)
        g[...] = a
        out = f(g, *arrays[1:])
        assert np.array_equal(out, ref), (name, out, ref)
        del g
    print("ok", name, flush=True)

n = 1024 + 7   # float32: ends exactly at a page boundary when at_end
A = te.placeholder((n,), "float32", "A")
a = np.arange(n, dtype=np.float32) + 1
L = te.compute((n,), lambda i: te.if_then_else(i >= 1, A[i - 1], 0.0), name="L")
R = te.compute((n,), lambda i: te.if_then_else(i < n - 1, A[i + 1], 0.0), name="R")
refL = np.concatenate([[0], a[:-1]]).astype(np.float32)
refR = np.concatenate([a[1:], [0]]).astype(np.float32)
for label, vec in (("scalar", False), ("vector", True)):
    s = jitop.create_schedule(L.op)
    if vec:
        o, i = s[L].split(L.op.axis[0], factor=16); s[L].vectorize(i)
    check("left " + label, s, [A, L], [a], refL)
    s = jitop.create_schedule(R.op)
    if vec:
        o, i = s[R].split(R.op.axis[0], factor=16); s[R].vectorize(i)
    check("right " + label, s, [A, R], [a], refR)

# 2-D zero padding (conv2d style), padded stage inlined into the consumer and vectorized
H, W = 13, 29
X = te.placeholder((H, W), "float64", "X")
P = te.compute((H + 2, W + 2), lambda i, j: te.if_then_else(
    te.logical_and(te.logical_and(i >= 1, i < H + 1), te.logical_and(j >= 1, j < W + 1)), X[i - 1, j - 1], 0.0),
    name="P")
Y = te.compute((H, W), lambda i, j: P[i, j] + P[i + 2, j + 2] + P[i + 1, j + 1], name="Y")
x = np.arange(H * W, dtype=np.float64).reshape(H, W) + 1
p = np.pad(x, 1)
refY = p[:-2, :-2] + p[2:, 2:] + p[1:-1, 1:-1]
for label in ("inline", "compute_at"):
    s = jitop.create_schedule(Y.op)
    if label == "inline":
        s[P].compute_inline()
    else:
        s[P].compute_at(s[Y], Y.op.axis[0])
    o, i = s[Y].split(Y.op.axis[1], factor=8); s[Y].vectorize(i)
    check("pad2d " + label, s, [X, Y], [x], refY)
"""


def test_if_then_else_padding_never_reads_out_of_bounds():
    """Inputs placed against PROT_NONE pages: a read outside the array segfaults the (sub)process."""
    script = GUARD_SCRIPT.replace("sys.path.insert(0, REPO)", f"sys.path.insert(0, {str(REPO)!r})")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr[-3000:]}"
    assert res.stdout.count("ok ") == 6, res.stdout


# ---------------------------------------------------------------------------------------------
# GEMM, as in TVM's "How to optimize GEMM on CPU" tutorial, at small odd sizes
# ---------------------------------------------------------------------------------------------

M, K, N = 67, 45, 33
TUTORIAL = GemmTutorial(bn=8)
GEMMS = [(TUTORIAL.default, False), (TUTORIAL.blocking, False), (TUTORIAL.vectorize, False),
         (TUTORIAL.loop_permutation, False), (TUTORIAL.array_packing, True), (TUTORIAL.write_cache_local, True),
         (TUTORIAL.write_cache, True), (TUTORIAL.parallel, True), (TUTORIAL.write_cache_local, False),
         (TUTORIAL.cache_read_packing, False)]


@pytest.mark.parametrize("sched,packed", GEMMS, ids=[f"{f.__name__}{'-packed' if p else ''}" for f, p in GEMMS])
def test_gemm_tutorial_schedules(sched, packed, monkeypatch):
    monkeypatch.setenv("JITOP_PARALLEL_MIN_WORK", "1")
    A, B, C, P = TUTORIAL.compute(M, N, K, packed)
    s = jitop.create_schedule(C.op)
    sched(s, A, B, C, P)
    f = jitop.build(s, [A, B, C])
    a, b = rand("float32", (M, K), 1) / 10, rand("float32", (K, N), 2) / 10
    c = np.zeros((M, N), np.float32)
    f(a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)
    # a second call on the same output must not accumulate into it
    f(a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)


def test_unused_input_argument():
    A = te.placeholder((4,), "float32", "A")
    U = te.placeholder((4,), "float32", "U")
    B = te.compute((4,), lambda i: A[i] * 2.0, name="B")
    s = jitop.create_schedule(B.op)
    f = jitop.build(s, [A, U, B])
    a = np.arange(4, dtype=np.float32)
    assert_same(f(a, np.zeros(4, np.float32)), a * 2)


def test_compute_at_stage_passed_as_output_argument():
    A = te.placeholder((6,), "float32", "A")
    B = te.compute((6,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((6,), lambda i: B[i] * 2.0, name="C")
    s = jitop.create_schedule(C.op)
    s[B].compute_at(s[C], C.op.axis[0])
    f = jitop.build(s, [A, B, C])
    a = np.arange(6, dtype=np.float32)
    b, c = np.full(6, -7.0, np.float32), np.zeros(6, np.float32)
    f(a, b, c)
    assert_same(c, (a + 1) * 2)
    assert_same(b, a + 1)


def test_intermediate_stage_passed_as_output_argument():
    A = te.placeholder((6,), "float32", "A")
    B = te.compute((6,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((6,), lambda i: B[i] * 2.0, name="C")
    s = jitop.create_schedule(C.op)
    a = np.arange(6, dtype=np.float32)
    b, c = jitop.build(s, [A, B, C])(a)
    assert_same(b, a + 1)
    assert_same(c, (a + 1) * 2)


def test_duplicate_arguments_are_rejected():
    A = te.placeholder((4,), "float32", "A")
    B = te.compute((4,), lambda i: A[i] * 2.0, name="B")
    s = jitop.create_schedule(B.op)
    with pytest.raises((ValueError, TypeError), match="'B'"):
        jitop.build(s, [A, B, B])
    with pytest.raises((ValueError, TypeError), match="'A'"):
        jitop.build(s, [A, A, B])


# ---------------------------------------------------------------------------------------------
# operator pipelines: softmax and a padded conv2d
# ---------------------------------------------------------------------------------------------

def _softmax(n: int, m: int):
    X = te.placeholder((n, m), "float32", "X")
    k1, k2 = te.reduce_axis((0, m), "k1"), te.reduce_axis((0, m), "k2")
    MX = te.compute((n,), lambda i: te.max(X[i, k1], axis=k1), name="MX")
    E = te.compute((n, m), lambda i, j: te.exp(X[i, j] - MX[i]), name="E")
    S = te.compute((n,), lambda i: te.sum(E[i, k2], axis=k2), name="S")
    Y = te.compute((n, m), lambda i, j: E[i, j] / S[i], name="Y")
    return X, MX, E, S, Y


@pytest.mark.parametrize("fused", [False, True])
def test_softmax_pipeline(fused, monkeypatch):
    monkeypatch.setenv("JITOP_PARALLEL_MIN_WORK", "1")
    X, MX, E, S, Y = _softmax(7, 19)
    s = jitop.create_schedule(Y.op)
    if fused:
        for T in (MX, E, S):
            s[T].compute_at(s[Y], Y.op.axis[0])
        s[Y].parallel(Y.op.axis[0])
        vectorize_last(s, Y, 8)
        o, i = s[E].split(s[E].op.axis[1], factor=8)
        s[E].vectorize(i)
    x = rand("float32", (7, 19), 3) / 4
    e = np.exp(x - x.max(axis=1, keepdims=True))
    assert_same(jitop.build(s, [X, Y])(x), e / e.sum(axis=1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("variant", ["default", "inline_pad_vectorized", "pad_at_row_cache_write"])
def test_conv2d_with_zero_padding(variant, monkeypatch):
    monkeypatch.setenv("JITOP_PARALLEL_MIN_WORK", "1")
    N, C, H, W, K, R = 1, 3, 9, 11, 4, 3
    I = te.placeholder((N, C, H, W), "float32", "I")
    Wt = te.placeholder((K, C, R, R), "float32", "W")
    inside = lambda h, w: te.logical_and(te.logical_and(h >= 1, h < H + 1), te.logical_and(w >= 1, w < W + 1))
    P = te.compute((N, C, H + 2, W + 2), lambda n, c, h, w: te.if_then_else(inside(h, w), I[n, c, h - 1, w - 1], 0.0),
                   name="P")
    rc, ry, rx = te.reduce_axis((0, C), "rc"), te.reduce_axis((0, R), "ry"), te.reduce_axis((0, R), "rx")
    O = te.compute((N, K, H, W), lambda n, k, h, w: te.sum(P[n, rc, h + ry, w + rx] * Wt[k, rc, ry, rx],
                                                           axis=[rc, ry, rx]), name="O")
    s = jitop.create_schedule(O.op)
    n_, k_, h_, w_ = O.op.axis
    if variant == "inline_pad_vectorized":
        s[P].compute_inline()
        wo, wi = s[O].split(w_, factor=4)
        s[O].reorder(n_, k_, h_, wo, rc, ry, rx, wi)
        s[O].unroll(rx)
        s[O].vectorize(wi)
    elif variant == "pad_at_row_cache_write":
        OL = s.cache_write(O, "local")
        n_, k_, h_, w_ = O.op.axis
        ho, hi = s[O].split(h_, factor=4)
        s[OL].compute_at(s[O], ho)
        s[P].compute_at(s[O], ho)
        s[O].parallel(k_)
    i, wt = rand("float32", (N, C, H, W), 1) / 10, rand("float32", (K, C, R, R), 2) / 10
    p = np.pad(i, ((0, 0), (0, 0), (1, 1), (1, 1))).astype(np.float64)
    windows = np.lib.stride_tricks.sliding_window_view(p, (R, R), axis=(2, 3))  # N, C, H, W, R, R
    ref = np.einsum("nchwyx,kcyx->nkhw", windows, wt.astype(np.float64)).astype(np.float32)
    assert_same(jitop.build(s, [I, Wt, O])(i, wt), ref, rtol=1e-5)
