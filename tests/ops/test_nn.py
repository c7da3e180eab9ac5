"""jitop.softmax / log_softmax / layer_norm / batch_norm / relu / gelu / sigmoid against plain numpy references
(torch.nn.functional's semantics)."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop
from op_checks import assert_close, no_fallback, rand  # noqa: F401 - no_fallback is autouse

rng = np.random.default_rng(7)

F32 = dict(rtol=1e-5, atol=1e-6)     # elementwise float32
F32_RED = dict(rtol=2e-5, atol=2e-6)  # float32 through a reduction
F64 = dict(rtol=1e-12, atol=1e-14)
TOL = {np.dtype(np.float32): F32, np.dtype(np.float64): F64}
TOL_RED = {np.dtype(np.float32): F32_RED, np.dtype(np.float64): F64}
FLOATS = [np.float32, np.float64]


# ---- references: float64 arithmetic, cast to the input's dtype ----

def ref_softmax(x, axis=-1):
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


def ref_log_softmax(x, axis=-1):
    x64 = x.astype(np.float64)
    shifted = x64 - x64.max(axis=axis, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))).astype(x.dtype)


def ref_layer_norm(x, n_dims, weight=None, bias=None, eps=1e-5):
    axes = tuple(range(x.ndim - n_dims, x.ndim))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=axes, keepdims=True)  # biased, as torch
    y = (x64 - mean) / np.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y.astype(np.result_type(x, *[p for p in (weight, bias) if p is not None]))


def ref_batch_norm(x, mean, var, weight=None, bias=None, eps=1e-5, axis=1):
    shape = [1] * x.ndim
    shape[axis] = -1
    y = (x.astype(np.float64) - mean.reshape(shape)) / np.sqrt(var.reshape(shape).astype(np.float64) + eps)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y.astype(np.result_type(x, mean, var, *[p for p in (weight, bias) if p is not None]))


def ref_gelu(x):
    """x * Phi(x) with the exact erf, element by element in Python floats."""
    return np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x.astype(np.float64).ravel()],
                    dtype=x.dtype).reshape(x.shape)


def ref_gelu_tanh(x):
    """torch's approximate='tanh': 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    v = x.astype(np.float64)
    return (0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))).astype(x.dtype)


def ref_sigmoid(x):
    with np.errstate(over="ignore"):
        return (1 / (1 + np.exp(-x.astype(np.float64)))).astype(x.dtype)


# ---- softmax / log_softmax ----

SOFTMAX_CASES = [((7,), -1), ((3, 17), -1), ((3, 17), 0), ((3, 17), 1), ((2, 5, 4), 1), ((2, 5, 4), -3),
                 ((2, 5, 4), 2), ((1, 1), 0), ((4, 1), 1), ((2, 3, 1, 33), -1)]


@pytest.mark.parametrize("shape,axis", SOFTMAX_CASES, ids=str)
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op,ref", [(jitop.softmax, ref_softmax), (jitop.log_softmax, ref_log_softmax)],
                         ids=["softmax", "log_softmax"])
def test_softmax(op, ref, shape, axis, dtype):
    x = rand(rng, shape, dtype, scale=3.0)
    assert_close(op(x, axis=axis), ref(x, axis), **TOL_RED[np.dtype(dtype)])


def test_softmax_default_axis_is_last_and_rows_sum_to_one():
    x = rand(rng, (5, 9), np.float32)
    y = jitop.softmax(x)
    assert_close(y, ref_softmax(x, -1), **F32_RED)
    np.testing.assert_allclose(y.astype(np.float64).sum(axis=-1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("op,ref", [(jitop.softmax, ref_softmax), (jitop.log_softmax, ref_log_softmax)],
                         ids=["softmax", "log_softmax"])
def test_softmax_large_inputs_do_not_overflow(op, ref):
    x = np.array([[1000.0, 1001.0, 999.0, -1000.0], [-1e38, 1e38, 0.0, 1.0], [88.0, 89.0, 90.0, 91.0]], np.float32)
    y = op(x)
    assert np.isfinite(y).all()
    assert_close(y, ref(x), **F32_RED)
    # shifting a row does not change softmax: the same as the row minus its max
    assert_close(y[0], op(x[0] - 1001.0), **F32_RED)


def test_softmax_minus_inf_entries():
    x = np.array([[-np.inf, 0.0, 1.0, -np.inf], [-np.inf, -np.inf, 5.0, -np.inf]], np.float32)
    y = jitop.softmax(x)
    assert (y[x == -np.inf] == 0).all()  # exp(-inf) is an exact 0
    assert_close(y, ref_softmax(x), **F32_RED)
    np.testing.assert_array_equal(y[1], [0, 0, 1, 0])
    ly = jitop.log_softmax(x)
    assert (ly[x == -np.inf] == -np.inf).all()
    assert_close(ly, ref_log_softmax(x), **F32_RED)


@pytest.mark.parametrize("op", [jitop.softmax, jitop.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_nan_and_all_minus_inf_rows_are_nan(op):
    # torch: a row that is all -inf, or holds a NaN or +inf, is all NaN; other rows are unaffected
    x = np.array([[-np.inf, -np.inf, -np.inf], [np.nan, 0.0, 1.0], [np.inf, 0.0, 1.0], [0.0, 1.0, 2.0]], np.float32)
    with np.errstate(invalid="ignore"):
        y = op(x)
        expected = (ref_softmax if op is jitop.softmax else ref_log_softmax)(x)
    assert np.isnan(y[:3]).all()
    assert_close(y, expected, **F32_RED)


@pytest.mark.parametrize("op", [jitop.softmax, jitop.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_0d_and_empty(op):
    # a 0-d array is a row of one (axis 0 or -1, as torch); an empty row gives an empty result
    for axis in (0, -1):
        y = op(np.array(2.5, np.float32), axis=axis)
        assert_close(y, np.array(1.0 if op is jitop.softmax else 0.0, np.float32))
    for shape, axis in (((3, 0), -1), ((3, 0), 0), ((0, 4), -1), ((0, 4), 0)):
        assert_close(op(np.zeros(shape, np.float64), axis=axis), np.zeros(shape, np.float64))


def test_softmax_accepts_lists():
    assert_close(jitop.softmax([1.0, 2.0, 3.0]), ref_softmax(np.array([1.0, 2.0, 3.0])), **F64)


@pytest.mark.parametrize("op", [jitop.softmax, jitop.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_bad_arguments(op):
    name = op.__name__
    x = np.ones((2, 3), np.float32)
    for axis in (2, -3):
        with pytest.raises(ValueError, match=rf"{name}: axis {axis} is out of range for an array of 2 dimensions"):
            op(x, axis=axis)
    with pytest.raises(ValueError, match=r"axis 1 is out of range for an array of 0 dimensions"):
        op(np.array(1.0), axis=1)
    for axis in (1.0, None, "1", (0, 1)):
        with pytest.raises(TypeError, match=rf"{name}: axis must be an int"):
            op(x, axis=axis)
    for bad in (np.ones((2, 3), np.int32), np.ones(3, np.bool_), np.ones(3, np.int64)):
        with pytest.raises(TypeError, match=rf"{name}: argument 'x' must be a floating-point array.*got {bad.dtype}"):
            op(bad)


# ---- layer_norm ----

@pytest.mark.parametrize("shape,normalized_shape", [
    ((4, 7), 7), ((4, 7), (7,)), ((2, 3, 4, 5), (4, 5)), ((2, 3, 4, 5), [3, 4, 5]), ((2, 3, 4, 5), (2, 3, 4, 5)),
    ((6,), 6), ((3, 1), 1), ((1, 31), (31,)), ((0, 8), 8),
], ids=str)
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_layer_norm(shape, normalized_shape, dtype):
    x = rand(rng, shape, dtype, scale=4.0) + 2
    n = 1 if isinstance(normalized_shape, int) else len(normalized_shape)
    assert_close(jitop.layer_norm(x, normalized_shape), ref_layer_norm(x, n), **TOL_RED[np.dtype(dtype)])


@pytest.mark.parametrize("weight,bias", [(True, True), (True, False), (False, True)])
def test_layer_norm_affine(weight, bias):
    x = rand(rng, (3, 5, 6), np.float32)
    w = rand(rng, (5, 6), np.float32) if weight else None
    b = rand(rng, (5, 6), np.float32) if bias else None
    assert_close(jitop.layer_norm(x, (5, 6), w, b), ref_layer_norm(x, 2, w, b), **F32_RED)


def test_layer_norm_eps_is_a_run_time_value():
    x = rand(rng, (4, 8), np.float32)
    for eps in (1e-5, 0.5, 3.0):  # same shapes: one compiled kernel, the new eps must be used
        assert_close(jitop.layer_norm(x, 8, eps=eps), ref_layer_norm(x, 1, eps=eps), **F32_RED)


def test_layer_norm_constant_rows_give_zeros_not_nan():
    x = np.full((3, 16), 7.25, np.float32)
    assert_close(jitop.layer_norm(x, 16), np.zeros((3, 16), np.float32))


def test_layer_norm_params_promote_like_numpy():
    x, w = rand(rng, (2, 6), np.float32), rand(rng, (6,), np.float64)
    y = jitop.layer_norm(x, 6, w)
    assert y.dtype == np.float64
    assert_close(y, ref_layer_norm(x, 1, w), **F32_RED)


@pytest.mark.parametrize("normalized_shape,exc,match", [
    ((5, 4), ValueError, r"normalized_shape \(5, 4\) must be the trailing dimensions of x.*\(2, 3, 4, 5\)"),
    (4, ValueError, r"normalized_shape \(4,\) must be the trailing"),
    ((), ValueError, r"normalized_shape \(\) must be the trailing"),
    ((1, 2, 3, 4, 5), ValueError, r"normalized_shape \(1, 2, 3, 4, 5\)"),
    (5.0, TypeError, r"normalized_shape must be an int or a sequence of ints, got 5.0"),
    ("5", TypeError, r"normalized_shape must be an int or a sequence of ints"),
    ((4.0, 5), TypeError, r"normalized_shape"),
    (None, TypeError, r"normalized_shape"),
    # the weight given where torch's signature wants the shape: named by dtype and shape, with the signature
    (np.ones(5, np.float32), TypeError, r"got a float32 array of shape \(5,\) \(the weight comes third: "
                                        r"layer_norm\(x, normalized_shape, weight, bias\)"),
])
def test_layer_norm_bad_normalized_shape(normalized_shape, exc, match):
    with pytest.raises(exc, match=match):
        jitop.layer_norm(np.ones((2, 3, 4, 5), np.float32), normalized_shape)


def test_layer_norm_bad_params_and_dtype():
    x = np.ones((2, 3, 4, 5), np.float32)
    with pytest.raises(ValueError, match=r"layer_norm: 'weight' must have shape \(4, 5\), got \(5,\)"):
        jitop.layer_norm(x, (4, 5), np.ones(5, np.float32))
    with pytest.raises(ValueError, match=r"layer_norm: 'bias' must have shape \(5,\), got \(1, 5\)"):
        jitop.layer_norm(x, 5, None, np.ones((1, 5), np.float32))
    with pytest.raises(TypeError, match=r"layer_norm: argument 'x' must be a floating-point array.*int32"):
        jitop.layer_norm(np.ones((2, 5), np.int32), 5)
    with pytest.raises(TypeError, match=r"layer_norm: argument 'weight' must be an integer or floating.*complex"):
        jitop.layer_norm(x, 5, np.ones(5, complex))
    for eps in ("a", None, np.ones(1), 1j, True):
        with pytest.raises(TypeError, match=r"layer_norm: 'eps' must be a real number"):
            jitop.layer_norm(x, 5, eps=eps)


# ---- batch_norm ----

@pytest.mark.parametrize("shape,axis", [((2, 3, 5, 4), 1), ((2, 5, 4, 3), -1), ((2, 5, 4, 3), 3), ((6, 3), 1),
                                        ((2, 3, 7), 1), ((1, 1, 1, 1), 1), ((3, 2, 5), 0)], ids=str)
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_batch_norm(shape, axis, affine, dtype):
    c = shape[axis]
    x = rand(rng, shape, dtype, scale=3.0)
    mean, var = rand(rng, (c,), dtype), (rng.random(c) + 0.1).astype(dtype)
    w, b = (rand(rng, (c,), dtype), rand(rng, (c,), dtype)) if affine else (None, None)
    got = jitop.batch_norm(x, mean, var, w, b, axis=axis)
    assert_close(got, ref_batch_norm(x, mean, var, w, b, axis=axis % len(shape)), **TOL[np.dtype(dtype)])


def test_batch_norm_eps_and_one_of_weight_bias():
    x = rand(rng, (2, 4, 3, 3), np.float32)
    mean, var = rand(rng, (4,), np.float32), (rng.random(4) * 0.01).astype(np.float32)
    w = rand(rng, (4,), np.float32)
    for eps in (1e-5, 0.1, 0.0):
        assert_close(jitop.batch_norm(x, mean, var, w, eps=eps), ref_batch_norm(x, mean, var, w, eps=eps), **F32)
    assert_close(jitop.batch_norm(x, mean, var, bias=w), ref_batch_norm(x, mean, var, bias=w), **F32)


def test_batch_norm_bad_arguments():
    x = np.ones((2, 3, 4, 4), np.float32)
    m3, v3 = np.zeros(3, np.float32), np.ones(3, np.float32)
    with pytest.raises(ValueError, match=r"batch_norm: 'running_mean' must have shape \(3,\), got \(4,\)"):
        jitop.batch_norm(x, np.zeros(4, np.float32), v3)
    with pytest.raises(ValueError, match=r"'running_var' must have shape \(4,\), got \(3,\)"):
        jitop.batch_norm(x, np.zeros(4, np.float32), v3, axis=-1)
    with pytest.raises(ValueError, match=r"running_mean and running_var are required"):
        jitop.batch_norm(x, None, v3)
    with pytest.raises(ValueError, match=r"'weight' must have shape \(3,\), got \(3, 1, 1\)"):
        jitop.batch_norm(x, m3, v3, np.ones((3, 1, 1), np.float32))
    with pytest.raises(ValueError, match=r"'bias' must have shape \(3,\)"):
        jitop.batch_norm(x, m3, v3, None, np.ones(2, np.float32))
    with pytest.raises(ValueError, match=r"batch_norm: 'x' must have at least 2 dimensions.*\(3,\)"):
        jitop.batch_norm(np.ones(3, np.float32), m3, v3)
    with pytest.raises(ValueError, match=r"batch_norm: axis 4 is out of range"):
        jitop.batch_norm(x, m3, v3, axis=4)
    with pytest.raises(TypeError, match=r"batch_norm: axis must be an int"):
        jitop.batch_norm(x, m3, v3, axis="C")
    with pytest.raises(TypeError, match=r"batch_norm: argument 'x' must be a floating-point array"):
        jitop.batch_norm(np.ones((2, 3), np.int64), m3, v3)
    with pytest.raises(TypeError, match=r"batch_norm: argument 'running_mean' must be an integer or floating"):
        jitop.batch_norm(x, np.array(list("abc")), v3)
    with pytest.raises(TypeError, match=r"batch_norm: argument 'running_var' must be an integer or floating"):
        jitop.batch_norm(x, m3, np.ones(3, object))
    with pytest.raises(TypeError, match=r"batch_norm: 'eps' must be a real number, got None"):
        jitop.batch_norm(x, m3, v3, eps=None)


# ---- relu / gelu / sigmoid ----

SPECIALS = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, -1e-30, 1e-30, -1e30, 1e30, 3.5, -3.5])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8],
                         ids=lambda d: np.dtype(d).name)
def test_relu(dtype):
    x = rand(rng, (5, 37), dtype, scale=10.0)
    if np.dtype(dtype).kind == "f":
        x.flat[:len(SPECIALS)] = SPECIALS
    expected = np.where(x < 0, np.zeros((), dtype), x)  # NaN < 0 is False: NaN stays
    assert_close(jitop.relu(x), expected)
    if np.dtype(dtype).kind == "f":
        assert np.isnan(jitop.relu(x).flat[0])  # NaN propagates


def test_relu_shapes_scalars_and_lists():
    for shape in [(1,), (0, 3), (2, 1, 3, 1), (129,)]:
        x = rand(rng, shape, np.float32)
        assert_close(jitop.relu(x), np.where(x < 0, np.float32(0), x))
    # elementwise ops follow numpy's ufuncs: a 0-d array or numpy scalar in, a numpy scalar out
    assert_close(jitop.relu(np.array(-2.0, np.float32)), np.float32(0.0))
    assert_close(jitop.relu(np.float32(-2.0)), np.float32(0.0))  # numpy scalar in, numpy scalar out
    assert_close(jitop.relu([-1.0, 2.0]), np.array([0.0, 2.0]))


GELU_X = np.concatenate([np.linspace(-9, 9, 721), [-30.0, 30.0, 1e-30, -1e-30, 0.0]])


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("approximate,ref", [("none", ref_gelu), ("tanh", ref_gelu_tanh)])
def test_gelu(approximate, ref, dtype):
    x = GELU_X.astype(dtype).reshape(2, -1, 3)
    got = jitop.gelu(x) if approximate == "none" else jitop.gelu(x, approximate=approximate)
    tol = F32 if dtype == np.float32 else dict(rtol=1e-12, atol=1e-15)
    assert_close(got, ref(x), **tol)


def test_gelu_nan_propagates_and_exact_differs_from_tanh():
    x = np.array([np.nan, 1.0], np.float32)
    for approximate in ("none", "tanh"):
        y = jitop.gelu(x, approximate=approximate)
        assert np.isnan(y[0]) and np.isfinite(y[1])
    # the two formulas differ (by ~1e-4 near |x| = 2): the exact one is really erf's
    x = np.array([2.0], np.float64)
    assert abs(jitop.gelu(x)[0] - jitop.gelu(x, approximate="tanh")[0]) > 1e-5
    assert_close(jitop.gelu(x), ref_gelu(x), **F64)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_sigmoid(dtype):
    x = np.concatenate([np.linspace(-40, 40, 801), [-1e4, 1e4, np.inf, -np.inf, np.nan, 0.0]]).astype(dtype)
    y = jitop.sigmoid(x)
    # atol: float32's exp(-x) overflows for x < -88 and the result is 0 instead of a tiny denormal
    assert_close(y, ref_sigmoid(x), rtol=1e-5 if dtype == np.float32 else 1e-13,
                 atol=np.finfo(dtype).tiny)
    np.testing.assert_array_equal(y[-6:-1], [0.0, 1.0, 1.0, 0.0, np.nan])


@pytest.mark.parametrize("op", [jitop.gelu, jitop.sigmoid], ids=["gelu", "sigmoid"])
def test_gelu_sigmoid_shapes(op):
    ref = ref_gelu if op is jitop.gelu else ref_sigmoid
    for shape in [(0,), (1, 1), (3, 0, 2), (5, 7, 3)]:
        x = rand(rng, shape, np.float32)
        assert_close(op(x), ref(x), **F32)
    x = np.array(0.75, np.float32)
    assert_close(op(x), ref(x)[()], **F32)  # a 0-d array in, a numpy scalar out, as numpy's ufuncs


@pytest.mark.parametrize("op", [jitop.gelu, jitop.sigmoid, jitop.relu], ids=["gelu", "sigmoid", "relu"])
def test_elementwise_bad_dtypes(op):
    bad = [np.ones(3, np.bool_)] + ([np.ones(3, np.int32), np.ones(3, np.uint8)] if op is not jitop.relu else [])
    for x in bad:
        with pytest.raises(TypeError, match=rf"{op.__name__}: argument 'x' must be .*got {x.dtype}"):
            op(x)
    with pytest.raises(TypeError, match=rf"{op.__name__}: argument 'x'"):
        op(np.array(["a", "b"]))


def test_gelu_bad_approximate():
    for approximate in ("exact", None, "Tanh", True):
        with pytest.raises(ValueError, match=r"gelu: approximate must be 'none' or 'tanh'"):
            jitop.gelu(np.ones(3, np.float32), approximate=approximate)


@pytest.mark.parametrize("op", [jitop.softmax, jitop.gelu, jitop.sigmoid, jitop.relu, lambda x: jitop.layer_norm(x, 8)])
def test_uncompiled_dtypes_are_a_clear_error(op):
    # float16 is not a jitop dtype: a TypeError that names the argument and the fix, not a silent fallback
    with pytest.raises(TypeError, match=r"argument 'x' has dtype float16.*x\.astype\(np\.float32\)"):
        op(rand(rng, (3, 8), np.float16))


def test_float16_matmul_is_numpys():
    a, b = rand(rng, (3, 8), np.float16), rand(rng, (8, 5), np.float16)
    got = jitop.matmul(a, b)
    assert got.dtype == np.float16
    assert_close(got, np.matmul(a, b))


# ---- inside @jitop.kernel ----

def test_nn_ops_trace_through_kernel():
    @jitop.kernel
    def block(x, w, b, mean, var):
        h = jitop.layer_norm(x, x.shape[-1:], w, b)
        h = jitop.gelu(h) + jitop.gelu(h, approximate="tanh") + jitop.sigmoid(h)
        return jitop.softmax(h, axis=0), jitop.log_softmax(h), jitop.batch_norm(x, mean, var, axis=-1)

    x = rand(rng, (6, 10), np.float32)
    w, b, mean = (rand(rng, (10,), np.float32) for _ in range(3))
    var = (rng.random(10) + 0.5).astype(np.float32)
    s, ls, bn = block(x, w, b, mean, var)
    h = ref_layer_norm(x, 1, w, b).astype(np.float64)
    h = ref_gelu(h) + ref_gelu_tanh(h) + ref_sigmoid(h)
    assert_close(s, ref_softmax(h, 0).astype(np.float32), **F32_RED)
    assert_close(ls, ref_log_softmax(h).astype(np.float32), rtol=1e-4, atol=1e-5)
    assert_close(bn, ref_batch_norm(x, mean, var, axis=1), **F32)
    assert isinstance(jitop.explain(block, x, w, b, mean, var), str)


def test_traced_gelu_uses_erf():
    # inside a kernel erf is a graph node (not math.erf): check it against the exact formula too
    @jitop.kernel
    def f(x):
        return jitop.gelu(x * 1)

    x = GELU_X.astype(np.float32)
    assert_close(f(x), ref_gelu(x), **F32)


def test_argument_errors_inside_kernel_are_raised():
    @jitop.kernel(fallback=False)
    def f(x):
        return jitop.softmax(x, axis=2)

    with pytest.raises(ValueError, match=r"softmax: axis 2 is out of range"):
        f(np.ones((2, 3), np.float32))


# ---- properties ----

@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), data=st.data())
def test_softmax_property(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    x = rand(rng, tuple(shape), np.float32, scale=5.0)
    y = jitop.softmax(x, axis=axis)
    assert_close(y, ref_softmax(x, axis), **F32_RED)
    np.testing.assert_allclose(y.astype(np.float64).sum(axis=axis), 1.0, rtol=1e-5)
    assert_close(jitop.log_softmax(x, axis=axis), ref_log_softmax(x, axis), rtol=1e-4, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), data=st.data())
def test_layer_norm_property(shape, data):
    n = data.draw(st.integers(1, len(shape)), label="normalized dims")
    affine = data.draw(st.booleans(), label="affine")
    x = rand(rng, tuple(shape), np.float32, scale=2.0) + 1
    norm = tuple(shape[-n:])
    w, b = (rand(rng, norm, np.float32), rand(rng, norm, np.float32)) if affine else (None, None)
    y = jitop.layer_norm(x, norm, w, b)
    # looser than elementwise: float32's x - mean cancels when a short row's values are close
    assert_close(y, ref_layer_norm(x, n, w, b), rtol=1e-4, atol=1e-4)
