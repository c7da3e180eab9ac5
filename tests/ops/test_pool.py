"""jitop.max_pool2d / avg_pool2d / global_avg_pool2d against window-by-window numpy loops (torch's semantics)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop
from op_checks import assert_close, no_fallback, rand  # noqa: F401 - no_fallback is autouse

rng = np.random.default_rng(11)


# ---- the reference: one window at a time ----

def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def window_starts(size, k, s, p, d, ceil_mode):
    """torch's windows along one axis: their first index in input coordinates (negative in the left padding).

    A window fits if it ends inside input + padding. ceil_mode keeps one more window that hangs over the end
    by less than a stride, but only if it starts inside the input or the left padding."""
    starts, start = [], -p
    while True:
        overhang = start + d * (k - 1) - (size - 1 + p)  # elements past the end of the padded input
        if overhang > 0 and not (ceil_mode and overhang < s and start < size):
            return starts
        starts.append(start)
        start += s


def ref_pool2d(x, kind, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               count_include_pad=True, layout="NCHW"):
    k, p, d = _pair(kernel_size), _pair(padding), _pair(dilation)
    s = k if stride is None else _pair(stride)
    if layout == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    n, c, h, w = x.shape
    hs = window_starts(h, k[0], s[0], p[0], d[0], ceil_mode)
    ws = window_starts(w, k[1], s[1], p[1], d[1], ceil_mode)
    out = np.zeros((n, c, len(hs), len(ws)), x.dtype)
    for oi, h0 in enumerate(hs):
        for oj, w0 in enumerate(ws):
            values, in_padded, in_input = [], 0, 0
            for a in range(k[0]):
                for b in range(k[1]):
                    i, j = h0 + a * d[0], w0 + b * d[1]
                    if 0 <= i < h and 0 <= j < w:
                        values.append(x[:, :, i, j].astype(np.float64))
                        in_input += 1
                    elif -p[0] <= i < h + p[0] and -p[1] <= j < w + p[1] and kind == "max":
                        values.append(np.full((n, c), -np.inf))  # max pooling pads with -inf
                    if -p[0] <= i < h + p[0] and -p[1] <= j < w + p[1]:
                        in_padded += 1  # ceil_mode's overhang past the padding does not count
            if kind == "max":
                out[:, :, oi, oj] = np.max(values, axis=0)  # np.max propagates NaN, as torch
            else:
                out[:, :, oi, oj] = np.sum(values, axis=0) / (in_padded if count_include_pad else in_input)
    return out.transpose(0, 2, 3, 1) if layout == "NHWC" else out


def ref_global_avg(x, layout="NCHW"):
    hw = (2, 3) if layout == "NCHW" else (1, 2)
    out_shape = list(x.shape)
    out_shape[hw[0]] = out_shape[hw[1]] = 1
    out = np.zeros(out_shape, x.dtype)
    for i in range(x.shape[hw[0]]):
        for j in range(x.shape[hw[1]]):
            index = [slice(None)] * 4
            index[hw[0]], index[hw[1]] = slice(i, i + 1), slice(j, j + 1)
            out += x[tuple(index)].astype(np.float64) / (x.shape[hw[0]] * x.shape[hw[1]])
    return out


def test_reference_window_rule():
    # the reference's window counts are torch's documented output sizes
    # floor((H + 2p - d(k-1) - 1) / s) + 1 ...
    assert len(window_starts(7, 3, 2, 1, 1, False)) == 4
    assert len(window_starts(6, 3, 2, 0, 1, False)) == 2
    # ... and with ceil_mode one more window if it starts inside the input or the left padding
    assert len(window_starts(6, 3, 2, 0, 1, True)) == 3
    assert len(window_starts(5, 2, 2, 1, 1, True)) == 3  # 4th would start in the right padding: dropped
    assert len(window_starts(4, 2, 3, 0, 1, True)) == 2


# (input H, W), kernel_size, stride, padding, dilation, ceil_mode
CONFIGS = [
    ((8, 8), 2, None, 0, 1, False),            # the plain 2x2/2 pooling
    ((7, 9), 3, 2, 1, 1, False),               # the ResNet stem pooling, odd sizes
    ((7, 9), 3, 2, 1, 1, True),
    ((6, 6), 3, 2, 0, 1, True),                # ceil_mode adds a window hanging over the end
    ((5, 5), 2, 2, 1, 1, True),                # ceil_mode: a window starting in the right padding is dropped
    ((4, 11), (2, 3), (3, 2), (1, 0), 1, True),  # pairs, stride > kernel (gaps)
    ((5, 4), (1, 3), (2, 1), (0, 1), 1, False),
    ((9, 10), 3, 1, 1, 2, False),              # dilation
    ((9, 10), (2, 3), (2, 3), (1, 1), (3, 2), True),
    ((5, 3), (5, 3), None, 0, 1, False),       # one window: the whole input
    ((1, 1), 1, 1, 0, 1, False),
    ((3, 8), 1, 2, 0, 1, True),                # kernel 1: a strided subsample
    ((1, 4), (2, 1), (2, 1), (1, 0), (3, 1), True),  # a ceil_mode window of padding only: -inf, as torch
]


def _ids(cfg):
    return "-".join(str(v).replace(" ", "") for v in cfg)


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_max_pool2d(cfg, layout):
    (h, w), k, s, p, d, ceil = cfg
    shape = (2, 3, h, w) if layout == "NCHW" else (2, h, w, 3)
    x = rand(rng, shape, np.float32)
    got = jitop.max_pool2d(x, k, s, p, d, ceil, layout=layout)
    assert_close(got, ref_pool2d(x, "max", k, s, p, d, ceil, layout=layout))


@pytest.mark.parametrize("cfg", [c for c in CONFIGS if c[4] == 1], ids=_ids)
@pytest.mark.parametrize("count_include_pad", [True, False], ids=["include_pad", "exclude_pad"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_avg_pool2d(cfg, count_include_pad, layout):
    (h, w), k, s, p, _, ceil = cfg
    shape = (2, 3, h, w) if layout == "NCHW" else (2, h, w, 3)
    x = rand(rng, shape, np.float32)
    got = jitop.avg_pool2d(x, k, s, p, ceil, count_include_pad, layout=layout)
    assert_close(got, ref_pool2d(x, "avg", k, s, p, 1, ceil, count_include_pad, layout=layout), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, k, s, p, layout", [
    ((1, 3, 8, 8), 2 ** 20, 1, 2 ** 19, "NCHW"),   # a window a million wide: only the offsets that meet the input
    ((1, 2, 9, 7), 12, 1, 6, "NCHW"),
    ((1, 3, 56, 56), 56, None, 0, "NCHW"),         # windows that tile the input: a reduction of its blocks
    ((2, 28, 29, 3), 14, None, 0, "NHWC"),
    ((1, 2, 60, 61), 9, 9, 0, "NCHW"),
])
@pytest.mark.parametrize("op", ["max", "avg"])
def test_large_windows(shape, k, s, p, layout, op):
    x = rand(rng, shape, np.float32)
    if k > 1000:  # every window covers all of the input (the reference would visit each of its 2^40 offsets)
        if op == "max":
            got = jitop.max_pool2d(x, k, s, p, layout=layout)
            assert_close(got, np.broadcast_to(x.max(axis=(2, 3), keepdims=True), got.shape).copy())
        return
    got = (jitop.max_pool2d if op == "max" else jitop.avg_pool2d)(x, k, s, p, layout=layout)
    assert_close(got, ref_pool2d(x, op, k, s, p, 1, False, layout=layout), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs, name", [({"ceil_mode": "yes"}, "ceil_mode"), ({"ceil_mode": None}, "ceil_mode"),
                                          ({"count_include_pad": None}, "count_include_pad")])
def test_flags_must_be_bools(kwargs, name):
    with pytest.raises(TypeError, match=f"'{name}' must be True or False"):
        jitop.avg_pool2d(np.ones((1, 1, 4, 4), np.float32), 2, **kwargs)


def test_avg_pool2d_divisor_at_the_edges():
    # ones in, so each output is (input elements in the window) / divisor: the divisor rule made visible
    x = np.ones((1, 1, 5, 5), np.float64)
    incl = jitop.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=True)
    excl = jitop.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)
    assert_close(excl, np.ones((1, 1, 3, 3)))  # only input elements count
    # a corner window holds 2x2 input elements out of 3x3 padded ones
    assert incl[0, 0, 0, 0] == 4 / 9 and incl[0, 0, 1, 1] == 1.0 and incl[0, 0, 2, 2] == 4 / 9
    assert_close(incl, ref_pool2d(x, "avg", 3, 2, 1, 1, True, True), rtol=1e-15)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64, np.uint8, np.int8], ids=lambda d: np.dtype(d).name)
def test_max_pool2d_dtypes(dtype):
    # integers pad with their lowest value, which must not win against negative inputs
    x = rand(rng, (2, 3, 7, 6), dtype) - (0 if np.dtype(dtype).kind == "u" else 60)
    got = jitop.max_pool2d(x, 3, 2, 1, ceil_mode=True)
    assert_close(got, ref_pool2d(x, "max", 3, 2, 1, 1, True))


def test_avg_pool2d_float64():
    x = rand(rng, (1, 2, 7, 7), np.float64)
    assert_close(jitop.avg_pool2d(x, (3, 2), (2, 1), 1, count_include_pad=False),
                 ref_pool2d(x, "avg", (3, 2), (2, 1), 1, 1, False, False), rtol=1e-13)


def test_max_pool2d_nan_and_inf():
    x = rand(rng, (1, 2, 6, 6), np.float32)
    x[0, 0, 0, 0] = np.nan          # in output window (0, 0) only
    x[0, 0, 5, 5] = np.inf
    x[0, 1] = -np.inf                # a channel of -inf: padding (also -inf) does not turn it into anything else
    got = jitop.max_pool2d(x, 2, 2, 1)
    assert np.isnan(got[0, 0, 0, 0]) and np.isnan(got).sum() == 1  # NaN propagates, and only there
    assert got[0, 0, 3, 3] == np.inf
    assert (got[0, 1] == -np.inf).all()
    assert_close(got, ref_pool2d(x, "max", 2, 2, 1))


def test_avg_pool2d_nan_propagates():
    x = rand(rng, (1, 1, 4, 4), np.float32)
    x[0, 0, 1, 1] = np.nan
    got = jitop.avg_pool2d(x, 2, 1)
    assert np.isnan(got[0, 0, :2, :2]).all() and not np.isnan(got[0, 0, 2:, :]).any()
    with np.errstate(invalid="ignore"):
        assert_close(got, ref_pool2d(x, "avg", 2, 1), rtol=1e-5, atol=1e-6)


def test_pool_noncontiguous_and_empty_batch():
    base = rand(rng, (2, 6, 8, 10), np.float32)
    x = base[:, ::2, ::-1, 1::2]  # strided, reversed
    assert_close(jitop.max_pool2d(x, 2), ref_pool2d(x, "max", 2))
    assert_close(jitop.avg_pool2d(x, 3, 1, 1), ref_pool2d(x, "avg", 3, 1, 1), rtol=1e-5, atol=1e-6)
    nhwc = base.transpose(0, 2, 3, 1)  # an NHWC view of NCHW memory
    assert_close(jitop.max_pool2d(nhwc, 3, 2, layout="NHWC"), ref_pool2d(nhwc, "max", 3, 2, layout="NHWC"))
    empty = np.zeros((0, 3, 4, 4), np.float32)
    assert_close(jitop.max_pool2d(empty, 2), np.zeros((0, 3, 2, 2), np.float32))
    assert_close(jitop.avg_pool2d(empty, 2), np.zeros((0, 3, 2, 2), np.float32))


# ---- global_avg_pool2d ----

@pytest.mark.parametrize("shape,layout", [((2, 3, 5, 7), "NCHW"), ((2, 5, 7, 3), "NHWC"), ((1, 1, 1, 1), "NCHW"),
                                          ((3, 16, 2, 1), "NCHW"), ((1, 4, 4, 33), "NHWC")], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_global_avg_pool2d(shape, layout, dtype):
    x = rand(rng, shape, dtype) + 1
    got = jitop.global_avg_pool2d(x, layout=layout)
    tol = dict(rtol=2e-6, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-13)
    assert_close(got, ref_global_avg(x, layout), **tol)
    # and the same as avg_pool2d over the whole input
    hw = shape[2:] if layout == "NCHW" else shape[1:3]
    assert_close(got, jitop.avg_pool2d(x, hw, layout=layout), **tol)


# ---- argument errors ----

X = np.ones((1, 2, 6, 6), np.float32)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(kernel_size=2.0), TypeError, r"'kernel_size' must be an int or a pair of ints, got 2.0"),
    (dict(kernel_size="2"), TypeError, r"'kernel_size' must be an int or a pair of ints"),
    (dict(kernel_size=(2,)), TypeError, r"'kernel_size' must be an int or a pair of ints, got \(2,\)"),
    (dict(kernel_size=(2, 2, 2)), TypeError, r"'kernel_size'"),
    (dict(kernel_size=True), TypeError, r"'kernel_size'"),
    (dict(kernel_size=(2, 2.5)), TypeError, r"'kernel_size'"),
    (dict(kernel_size=None), TypeError, r"'kernel_size'"),
    (dict(kernel_size=0), ValueError, r"'kernel_size' must be >= 1, got 0"),
    (dict(kernel_size=2, stride=0), ValueError, r"'stride' must be >= 1, got 0"),
    (dict(kernel_size=2, stride=1.5), TypeError, r"'stride' must be an int or a pair of ints"),
    (dict(kernel_size=2, stride=(1, 0)), ValueError, r"'stride' must be >= 1"),
    (dict(kernel_size=2, padding=-1), ValueError, r"'padding' must be >= 0, got -1"),
    (dict(kernel_size=2, padding="same"), TypeError, r"'padding' must be an int or a pair of ints"),
    (dict(kernel_size=3, padding=2), ValueError, r"padding \(2, 2\) must be at most half of kernel_size \(3, 3\)"),
    (dict(kernel_size=(4, 2), padding=(2, 2)), ValueError, r"padding \(2, 2\) must be at most half"),
    (dict(kernel_size=7), ValueError, r"spatial size \(6, 6\) is too small for kernel_size \(7, 7\)"),
    (dict(kernel_size=2, layout="nchw"), ValueError, r"layout must be 'NCHW' or 'NHWC', got 'nchw'"),
])
@pytest.mark.parametrize("op", [jitop.max_pool2d, jitop.avg_pool2d], ids=["max", "avg"])
def test_pool_bad_arguments(op, kwargs, exc, match):
    with pytest.raises(exc, match=rf"{op.__name__}: .*{match}"):
        op(X, **kwargs)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(kernel_size=2, dilation=0), ValueError, r"max_pool2d: 'dilation' must be >= 1, got 0"),
    (dict(kernel_size=2, dilation=(2, 1.0)), TypeError, r"'dilation' must be an int or a pair of ints"),
    (dict(kernel_size=3, dilation=3), ValueError, r"too small for kernel_size \(3, 3\) with padding \(0, 0\) and "
                                                 r"dilation \(3, 3\)"),
])
def test_max_pool2d_bad_dilation(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        jitop.max_pool2d(X, **kwargs)


def test_pool_bad_inputs():
    for op in (jitop.max_pool2d, jitop.avg_pool2d):
        name = op.__name__
        with pytest.raises(ValueError, match=rf"{name}: argument 'x' must have 4 dimensions \(NCHW\), got shape"):
            op(np.ones((2, 6, 6), np.float32), 2)
        with pytest.raises(ValueError, match=rf"{name}: argument 'x' must have 4 dimensions \(NHWC\)"):
            op(np.ones((1, 1, 2, 6, 6), np.float32), 2, layout="NHWC")
        with pytest.raises(TypeError, match=rf"{name}: argument 'x' must be .*got bool"):
            op(np.ones((1, 1, 4, 4), np.bool_), 2)
    with pytest.raises(TypeError, match=r"avg_pool2d: argument 'x' must be a floating-point array.*int32"):
        jitop.avg_pool2d(np.ones((1, 1, 4, 4), np.int32), 2)
    with pytest.raises(ValueError, match=r"global_avg_pool2d: argument 'x' must have 4 dimensions"):
        jitop.global_avg_pool2d(np.ones((2, 6, 6), np.float32))
    with pytest.raises(TypeError, match=r"global_avg_pool2d: argument 'x' must be a floating-point array"):
        jitop.global_avg_pool2d(np.ones((1, 2, 6, 6), np.int64))
    with pytest.raises(ValueError, match=r"global_avg_pool2d: layout must be 'NCHW' or 'NHWC'"):
        jitop.global_avg_pool2d(X, layout="HWCN")


# ---- inside @jitop.kernel ----

def test_pooling_traces_through_kernel():
    @jitop.kernel
    def head(x):
        y = jitop.max_pool2d(jitop.relu(x), 3, 2, 1, ceil_mode=True)
        return jitop.avg_pool2d(y, 2, 1, count_include_pad=False), jitop.global_avg_pool2d(y)

    x = rand(rng, (2, 4, 9, 9), np.float32)
    a, g = head(x)
    y = ref_pool2d(np.where(x < 0, np.float32(0), x), "max", 3, 2, 1, 1, True)
    assert_close(a, ref_pool2d(y, "avg", 2, 1, 0, 1, False, False), rtol=1e-5, atol=1e-6)
    assert_close(g, ref_global_avg(y), rtol=2e-6, atol=1e-6)
    assert isinstance(jitop.explain(head, x), str)


# ---- properties ----

@st.composite
def pool_cases(draw, dilated):
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    p = (draw(st.integers(0, k[0] // 2)), draw(st.integers(0, k[1] // 2)))
    d = (draw(st.integers(1, 3)), draw(st.integers(1, 3))) if dilated else (1, 1)
    return (h, w), k, s, p, d, draw(st.booleans()), draw(st.sampled_from(["NCHW", "NHWC"]))


def _pool_property(kind, case, count_include_pad=True):
    (h, w), k, s, p, d, ceil, layout = case
    x = rand(rng, (1, 2, h, w) if layout == "NCHW" else (1, h, w, 2), np.float32)
    expected = ref_pool2d(x, kind, k, s, p, d, ceil, count_include_pad, layout=layout)
    if 0 in expected.shape:  # no window fits
        with pytest.raises(ValueError, match="too small"):
            _call(kind, x, k, s, p, d, ceil, count_include_pad, layout)
        return
    got = _call(kind, x, k, s, p, d, ceil, count_include_pad, layout)
    assert_close(got, expected, rtol=1e-5, atol=1e-6)


def _call(kind, x, k, s, p, d, ceil, count_include_pad, layout):
    if kind == "max":
        return jitop.max_pool2d(x, k, s, p, d, ceil, layout=layout)
    return jitop.avg_pool2d(x, k, s, p, ceil, count_include_pad, layout=layout)


@settings(max_examples=25, deadline=None)
@given(pool_cases(dilated=True))
def test_max_pool2d_property(case):
    _pool_property("max", case)


@settings(max_examples=25, deadline=None)
@given(pool_cases(dilated=False), st.booleans())
def test_avg_pool2d_property(case, count_include_pad):
    _pool_property("avg", case, count_include_pad)
