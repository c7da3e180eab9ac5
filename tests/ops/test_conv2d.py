"""jitop.conv2d against a naive numpy convolution: geometry, groups, layouts, odd sizes, dtypes, errors, fusion.

The reference below is written to be obviously right, not fast: zero-pad with np.pad, then for every output
channel and every kernel offset (r, s) add the strided window of its group's input channels times that
weight tap, in float64. Each distinct shape compiles a kernel (~0.1 s), so the grids are kept small.
"""
from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jitop

RNG = np.random.default_rng(20261121)


@pytest.fixture(autouse=True)
def _compiled_only():
    """A JitopFallbackWarning is a failure: a conv that ran as plain numpy would agree with the reference
    without testing the compiled template."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", jitop.JitopFallbackWarning)
        yield


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _pads(padding, kernel, dilation):
    """(top, bottom, left, right) as torch defines them; 'same' puts the odd extra row/column at the end."""
    if padding == "valid":
        return 0, 0, 0, 0
    if padding == "same":
        th, tw = dilation[0] * (kernel[0] - 1), dilation[1] * (kernel[1] - 1)
        return th // 2, th - th // 2, tw // 2, tw - tw // 2
    ph, pw = _pair(padding)
    return ph, ph, pw, pw


def naive_conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, layout="NCHW"):
    """float64 result in `layout`: explicit loops over output channels and kernel taps."""
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    if layout == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    n, c, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    assert icg * groups == c and oc % groups == 0
    top, bottom, left, right = _pads(padding, (kh, kw), (dh, dw))
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    oh = (h + top + bottom - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + left + right - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, oc, oh, ow), np.float64)
    ocg = oc // groups
    for o in range(oc):
        g = o // ocg
        for r in range(kh):
            for s in range(kw):
                y0, x0 = r * dh, s * dw
                window = xp[:, g * icg:(g + 1) * icg, y0:y0 + sh * (oh - 1) + 1:sh, x0:x0 + sw * (ow - 1) + 1:sw]
                assert window.shape[2:] == (oh, ow)
                for i in range(icg):
                    out[:, o] += window[:, i] * w[o, i, r, s]
        if bias is not None:
            out[:, o] += float(bias[o])
    return out.transpose(0, 2, 3, 1) if layout == "NHWC" else out


def _data(shape, dtype):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(-4, 5, shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def _inputs(n, c, h, w, oc, kh, kw, groups=1, layout="NCHW", dtype=np.float32, wdtype=None, bias=False):
    xshape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    x = _data(xshape, dtype)
    wt = _data((oc, c // groups, kh, kw), wdtype or dtype)
    b = _data((oc,), wdtype or dtype) if bias else None
    return x, wt, b


def check(x, w, b=None, **kw):
    """jitop.conv2d(x, w, b, **kw) has numpy's result dtype, the reference's shape and values within a
    rounding bound relative to the magnitude of the summed terms (exact for integers)."""
    got = jitop.conv2d(x, w, b, **kw)
    operands = (x, w) if b is None else (x, w, b)
    want_dtype = np.result_type(*operands)
    assert isinstance(got, np.ndarray)
    assert got.dtype == want_dtype, (got.dtype, want_dtype)
    ref = naive_conv2d(x, w, b, **kw)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if want_dtype.kind in "iu":
        np.testing.assert_array_equal(got, ref.astype(want_dtype))
        return got
    # |rounding error| <= (terms) * eps * sum|terms|; 32 eps covers the sums here with room, and is
    # ~4e-6 relative for float32 (a wrong tap or a missing channel is off by O(1) of the magnitude)
    magnitude = naive_conv2d(np.abs(x), np.abs(w), None if b is None else np.abs(b), **kw)
    tol = 32 * np.finfo(want_dtype).eps
    err = np.abs(got.astype(np.float64) - ref)
    bad = err > tol * magnitude + np.finfo(want_dtype).tiny
    assert not bad.any(), (f"{bad.sum()} of {bad.size} wrong; worst at {np.unravel_index(np.argmax(err), err.shape)}: "
                           f"err {err.max():.3g} vs magnitude {magnitude.max():.3g}")
    return got


# ** geometry: stride x padding x dilation x layout **

STRIDES = [1, 2, (2, 1)]
PADDINGS = [0, 1, (1, 2), "same", "valid"]


# padding='same' needs stride 1 (other strides are tested as an error below)
GEOMETRIES = [(s, p) for s in STRIDES for p in PADDINGS if p != "same" or s == 1]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("stride,padding", GEOMETRIES, ids=str)
def test_stride_padding_dilation(stride, padding, dilation, layout):
    # batch 2, C=3, OC=5 (not a multiple of the vector width), prime 7x11 image, non-square 3x2 kernel
    x, w, _ = _inputs(2, 3, 7, 11, 5, 3, 2, layout=layout)
    check(x, w, stride=stride, padding=padding, dilation=dilation, layout=layout)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dilation", [1, (2, 1)], ids=str)
@pytest.mark.parametrize("kernel", [(2, 2), (4, 3), (1, 4)], ids=str)
def test_same_padding_with_even_kernels_pads_more_at_the_end(kernel, dilation, layout):
    x, w, _ = _inputs(1, 2, 6, 9, 3, *kernel, layout=layout)
    got = check(x, w, padding="same", dilation=dilation, layout=layout)
    assert got.shape == ((1, 3, 6, 9) if layout == "NCHW" else (1, 6, 9, 3))


def test_same_padding_even_kernel_is_not_symmetric():
    """The reference's own sanity check: with a 2x2 kernel of ones, 'same' sums the pixel, its right,
    lower and lower-right neighbours (torch's asymmetric padding), not its upper-left ones."""
    x = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    w = np.ones((1, 1, 2, 2), np.float32)
    got = jitop.conv2d(x, w, padding="same")
    img = x[0, 0]
    want = img + np.pad(img, ((0, 0), (0, 1)))[:, 1:] + np.pad(img, ((0, 1), (0, 0)))[1:] \
        + np.pad(img, ((0, 1), (0, 1)))[1:, 1:]
    np.testing.assert_array_equal(got[0, 0], want)


# ** groups **

GROUPS = {  # name: (C, OC, groups)
    "dense": (4, 6, 1),
    "two_groups": (4, 6, 2),
    "depthwise": (6, 6, 6),
    "depthwise_multiplier2": (5, 10, 5),
    "groups_3_wide": (6, 21, 3),  # 7 output channels per group, 21 > one float32 vector
}


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("kind", list(GROUPS))
def test_groups(kind, stride, layout):
    c, oc, groups = GROUPS[kind]
    x, w, b = _inputs(2, c, 7, 8, oc, 3, 3, groups=groups, layout=layout, bias=stride == 1)
    check(x, w, b, stride=stride, padding=1, groups=groups, layout=layout)


def test_depthwise_with_dilation_and_asymmetric_padding():
    x, w, _ = _inputs(1, 8, 9, 10, 16, 3, 3, groups=8, layout="NHWC", dtype=np.float64)
    check(x, w, padding=(2, 1), dilation=(2, 1), stride=(1, 2), groups=8, layout="NHWC")


# ** odd sizes **

ODD = {  # name: (n, c, h, w, oc, kh, kw, kwargs)
    "1x1_image_pad1": (2, 3, 1, 1, 5, 3, 3, dict(padding=1)),
    "1x1_image_1x1_kernel": (1, 3, 1, 1, 4, 1, 1, {}),
    "1x1_kernel_stride2": (1, 7, 5, 9, 20, 1, 1, dict(stride=2)),
    "primes_oc20": (1, 3, 7, 11, 20, 3, 3, dict(padding=1)),
    "one_input_channel": (3, 1, 11, 7, 17, 5, 3, dict(padding=(2, 1))),
    "oc33_three_panels": (1, 3, 5, 13, 33, 3, 3, dict(padding=1)),
    "wide_row_oc1": (1, 2, 2, 37, 1, 1, 3, dict(padding="same")),
    "kernel_equals_padded_input": (1, 2, 3, 4, 5, 5, 6, dict(padding=1)),
    "tall_column": (1, 2, 19, 1, 3, 4, 1, dict(padding="valid")),
}


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", list(ODD))
def test_odd_sizes(case, layout):
    n, c, h, wd, oc, kh, kw, kwargs = ODD[case]
    x, w, _ = _inputs(n, c, h, wd, oc, kh, kw, layout=layout)
    check(x, w, layout=layout, **kwargs)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_empty_batch_and_no_input_channels(layout):
    # batch 0: an empty result of the right shape
    x, w, b = _inputs(0, 3, 5, 5, 4, 3, 3, layout=layout, bias=True)
    check(x, w, b, padding=1, layout=layout)
    # no input channels (C = 0): the sum is empty, so the result is the bias
    x, w, b = _inputs(2, 0, 4, 5, 4, 3, 3, layout=layout, bias=True)
    got = check(x, w, b, layout=layout)
    assert (got == (b.reshape(-1, 1, 1) if layout == "NCHW" else b)).all()


# ** bias and dtypes **

@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bias(dtype, layout):
    x, w, b = _inputs(2, 4, 6, 5, 20, 3, 3, layout=layout, dtype=dtype, bias=True)
    with_bias = check(x, w, b, padding=1, layout=layout)
    without = check(x, w, padding=1, layout=layout)
    np.testing.assert_allclose(with_bias - without, np.broadcast_to(b.reshape(-1, 1, 1) if layout == "NCHW" else b,
                                                                    with_bias.shape), rtol=1e-5, atol=1e-5)


DTYPES = [  # (input, weight): the result dtype must be np.result_type of the two
    (np.float32, np.float32), (np.float64, np.float64), (np.int32, np.int32), (np.int64, np.int64),
    (np.float32, np.float64), (np.float64, np.float32), (np.int32, np.float32), (np.int16, np.int32),
]


@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: f"{np.dtype(d[0])}-{np.dtype(d[1])}")
def test_dtypes(dtypes):
    xd, wd = dtypes
    x, w, _ = _inputs(2, 3, 6, 7, 5, 3, 3, dtype=xd, wdtype=wd)
    got = check(x, w, padding=1, stride=(1, 2))
    assert got.dtype == np.result_type(xd, wd)


def test_mixed_precision_is_computed_in_float64():
    """float32 input with a float64 weight: the result is float64 and as accurate as float64 (the input
    is widened, the weight is not rounded to float32)."""
    x = _data((1, 3, 6, 6), np.float32)
    w = _data((4, 3, 3, 3), np.float64) * (1 + 1e-12)
    got = jitop.conv2d(x, w, padding=1)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, naive_conv2d(x, w, padding=1), rtol=1e-12, atol=1e-12)


def test_array_likes_and_non_contiguous_views():
    x = _data((1, 6, 5, 4), np.float32).transpose(0, 3, 1, 2)  # NCHW view of NHWC memory
    w = _data((6, 4, 2, 2), np.float32)[::2]                     # every other output channel
    assert not x.flags.c_contiguous and not w.flags.c_contiguous
    check(x, w, padding=1)
    got = jitop.conv2d(np.ones((1, 1, 3, 3)).tolist(), np.ones((1, 1, 2, 2)).tolist())
    np.testing.assert_array_equal(got, np.full((1, 1, 2, 2), 4.0))


# ** bad arguments: the right exception, and the message names the argument **

X = np.ones((1, 4, 6, 6), np.float32)
W = np.ones((6, 4, 3, 3), np.float32)

ERRORS = {  # name: (call, exception, regex the message must match)
    "channel_mismatch": (lambda: jitop.conv2d(X, np.ones((6, 3, 3, 3), np.float32)), ValueError,
                         r"weight.*3 input channels.*input.*has 4"),
    "channel_mismatch_nhwc": (lambda: jitop.conv2d(X, W, layout="NHWC"), ValueError,
                              r"weight.*input.*has 6 \(NHWC\)"),
    "groups_not_dividing_channels": (lambda: jitop.conv2d(X, np.ones((6, 1, 3, 3), np.float32), groups=3),
                                     ValueError, r"groups=3 must divide the input channels \(4\)"),
    "groups_not_dividing_out_channels": (lambda: jitop.conv2d(X, np.ones((5, 2, 3, 3), np.float32), groups=2),
                                         ValueError, r"groups=2 must divide.*output channels \(5\)"),
    "groups_zero": (lambda: jitop.conv2d(X, W, groups=0), ValueError, r"groups must be a positive int"),
    "input_rank_3": (lambda: jitop.conv2d(X[0], W), ValueError, r"'input' must have 4 dimensions"),
    "input_rank_5": (lambda: jitop.conv2d(X[None], W), ValueError, r"'input' must have 4 dimensions"),
    "weight_rank_3": (lambda: jitop.conv2d(X, W[0]), ValueError, r"'weight' must have 4 dimensions"),
    "bias_wrong_length": (lambda: jitop.conv2d(X, W, np.ones(5, np.float32)), ValueError,
                          r"'bias' must have shape \(6,\)"),
    "bias_wrong_rank": (lambda: jitop.conv2d(X, W, np.ones((6, 1), np.float32)), ValueError,
                        r"'bias' must have shape \(6,\)"),
    "complex_bias": (lambda: jitop.conv2d(X, W, np.ones(6, complex)), TypeError,
                     r"'bias' must be an integer or floating"),
    "bool_bias": (lambda: jitop.conv2d(X, W, np.ones(6, bool)), TypeError, r"'bias' must be an integer or floating"),
    "string_bias": (lambda: jitop.conv2d(X, W, "abcdef"), TypeError, r"'bias' must be an integer or floating"),
    "same_with_stride_2": (lambda: jitop.conv2d(X, W, stride=2, padding="same"), ValueError,
                           r"padding='same' needs stride 1"),
    "unknown_padding_string": (lambda: jitop.conv2d(X, W, padding="full"), ValueError, r"padding.*'full'"),
    "bad_layout": (lambda: jitop.conv2d(X, W, layout="nchw"), ValueError, r"layout must be 'NCHW' or 'NHWC'"),
    "kernel_larger_than_padded_input": (lambda: jitop.conv2d(X, np.ones((6, 4, 7, 7), np.float32), padding=0),
                                        ValueError, r"padded input \(6 x 6\) is smaller than the dilated kernel"),
    "dilated_kernel_too_large": (lambda: jitop.conv2d(X, W, dilation=(1, 3)), ValueError,
                                 r"padded input.*smaller than the dilated kernel \(3 x 7\)"),
    "negative_padding": (lambda: jitop.conv2d(X, W, padding=-1), ValueError, r"'padding' must be >= 0"),
    "negative_padding_pair": (lambda: jitop.conv2d(X, W, padding=(1, -1)), ValueError, r"'padding' must be >= 0"),
    "stride_zero": (lambda: jitop.conv2d(X, W, stride=0), ValueError, r"'stride' must be >= 1"),
    "stride_pair_zero": (lambda: jitop.conv2d(X, W, stride=(1, 0)), ValueError, r"'stride' must be >= 1"),
    "dilation_zero": (lambda: jitop.conv2d(X, W, dilation=0), ValueError, r"'dilation' must be >= 1"),
    "stride_triple": (lambda: jitop.conv2d(X, W, stride=(1, 1, 1)), TypeError, r"'stride' must be an int or a pair"),
    "stride_float": (lambda: jitop.conv2d(X, W, stride=1.5), TypeError, r"'stride' must be an int or a pair"),
    "bool_input": (lambda: jitop.conv2d(X.astype(bool), W), TypeError, r"'input' must be an integer or floating"),
    "complex_weight": (lambda: jitop.conv2d(X, W.astype(complex)), TypeError,
                       r"'weight' must be an integer or floating"),
    "no_output_channels": (lambda: jitop.conv2d(X, np.ones((0, 4, 3, 3), np.float32)), ValueError,
                           r"weight \(0, 4, 3, 3\) has an empty dimension"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_arguments(case):
    call, exc, pattern = ERRORS[case]
    with pytest.raises(exc, match=pattern) as info:
        call()
    assert str(info.value).startswith("conv2d:"), str(info.value)


def test_bad_arguments_inside_a_kernel_raise_the_same_error():
    @jitop.kernel
    def f(x, w):
        return jitop.conv2d(x, w, padding=1) * 2

    with pytest.raises(ValueError, match=r"weight.*3 input channels.*has 4"):
        f(X, np.ones((2, 3, 3, 3), np.float32))


# ** inside @jitop.kernel: the epilogue runs on the conv's register tile **

@jitop.kernel
def conv_bias_residual_relu(x, w, b):
    return np.maximum(jitop.conv2d(x, w, padding=1) + b.reshape(-1, 1, 1) + x, 0)


@jitop.kernel
def conv_bias_residual_relu_nhwc(x, w, b):
    return np.maximum(jitop.conv2d(x, w, padding=1, layout="NHWC") + b + x, 0)


def _top_level_loops(ir: str) -> list[str]:
    """The loop IR's top-level statements (indent 4), each with its body."""
    blocks: list[list[str]] = []
    for line in ir.splitlines():
        if re.match(r"    \S", line):
            blocks.append([line])
        elif line.startswith("        ") and blocks:
            blocks[-1].append(line)
    return ["\n".join(b) for b in blocks]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_fused_epilogue_matches_and_is_one_loop_nest(layout):
    c = 20  # channels in == out (residual); 20 is not a multiple of the vector width
    x, w, b = _inputs(2, c, 7, 9, c, 3, 3, layout=layout, bias=True)
    fn = conv_bias_residual_relu if layout == "NCHW" else conv_bias_residual_relu_nhwc
    got = fn(x, w, b)
    ref = naive_conv2d(x, w, b, padding=1, layout=layout) + x
    ref = np.maximum(ref, 0)
    assert got.dtype == np.float32 and got.shape == ref.shape
    magnitude = naive_conv2d(np.abs(x), np.abs(w), np.abs(b), padding=1, layout=layout) + np.abs(x)
    assert (np.abs(got - ref) <= 32 * np.finfo(np.float32).eps * magnitude).all()
    assert (got == 0).any() and (got > 0).any()  # the relu is exercised

    text = jitop.explain(fn, x, w, b)
    ir = text[text.index("loop IR"):]
    blocks = _top_level_loops(ir)
    # the register tile: a local cache of the conv stage, accumulated over the kernel taps
    tiles = set(re.findall(r"(conv2d\w*\.local) = allocate\(", ir))
    assert len(tiles) == 1, tiles
    (tile,) = tiles
    # the output (named after the last ufunc, np.maximum) is stored in exactly one loop nest, and that nest
    # allocates the tile, accumulates into it and reads it in the stored expression
    stores = [blk for blk in blocks if re.search(r"^\s+maximum\[.*\] = ", blk, re.M)]
    assert len(stores) == 1, ir
    (nest,) = stores
    # NCHW takes gemm (20 output channels do not fill the direct register tile): this tiny product stays serial
    gemm = '"algorithm": "gemm"' in text
    assert gemm == (layout == "NCHW")
    assert nest.lstrip().startswith("for ") and ("parallel(" in nest.splitlines()[0] or gemm)
    assert f"{tile} = allocate(" in nest
    assert re.search(rf"{re.escape(tile)}\[[^\]]*\] = {re.escape(tile)}\[", nest)  # accumulation
    store_lines = [ln for ln in nest.splitlines() if re.match(r"\s+maximum\[", ln)]
    assert store_lines and all(f"{tile}[" in ln and "max(" in ln and "b[" in ln for ln in store_lines)
    # the conv's result never goes to memory: no buffer of the output's shape besides the result itself
    signature = ir.splitlines()[1]
    assert not re.search(r"\bconv2d(_nhwc)?:", signature), signature
    assert not re.search(r"^\s+conv2d(_nhwc)?\[", ir, re.M)


# ** property test over geometry **

@st.composite
def geometries(draw):
    layout = draw(st.sampled_from(["NCHW", "NHWC"]))
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    icg = draw(st.integers(1, 3))
    ocg = draw(st.integers(1, 5))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    choices = ["valid", (0, 0), (1, 0), (2, 1), (0, 3)] + (["same"] if stride == (1, 1) else [])
    padding = draw(st.sampled_from(choices))
    top, bottom, left, right = _pads(padding, (kh, kw), dilation)
    h = draw(st.integers(max(1, dilation[0] * (kh - 1) + 1 - top - bottom), 9))
    w = draw(st.integers(max(1, dilation[1] * (kw - 1) + 1 - left - right), 9))
    n = draw(st.integers(1, 2))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    bias = draw(st.booleans())
    return (n, icg * groups, h, w, ocg * groups, kh, kw, groups, layout, dtype, bias), \
        dict(stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)


@settings(max_examples=20, deadline=None)
@given(geometries())
def test_random_geometry(case):
    (n, c, h, w, oc, kh, kw, groups, layout, dtype, bias), kwargs = case
    x, wt, b = _inputs(n, c, h, w, oc, kh, kw, groups=groups, layout=layout, dtype=dtype, bias=bias)
    check(x, wt, b, **kwargs)


# ** two templates feeding one output: one gets the epilogue, the other writes its result first **

@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_two_convolutions_into_one_output_compile(layout):
    # a ResNet projection shortcut: relu(conv(h, w2) + conv(x, wp)); used to fall back to numpy
    x, w1, _ = _inputs(1, 4, 9, 9, 6, 3, 3, layout=layout)
    wp = _data((6, 4, 1, 1), np.float32)
    f = jitop.kernel(lambda x, w1, wp: np.maximum(jitop.conv2d(x, w1, padding=1, layout=layout)
                                                  + jitop.conv2d(x, wp, layout=layout), 0), fallback=False)
    ref = np.maximum(naive_conv2d(x, w1, padding=1, layout=layout) + naive_conv2d(x, wp, layout=layout), 0)
    np.testing.assert_allclose(f(x, w1, wp), ref, rtol=1e-5, atol=1e-5)


def test_two_matmuls_into_one_output_compile():
    a, b, c = _data((5, 6), np.float32), _data((6, 7), np.float32), _data((6, 7), np.float32)
    f = jitop.kernel(lambda a, b, c: a @ b + a @ c, fallback=False)
    np.testing.assert_allclose(f(a, b, c), a.astype(np.float64) @ b + a.astype(np.float64) @ c, rtol=1e-5, atol=1e-5)
