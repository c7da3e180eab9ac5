"""Dense NCHW convolutions compile channels-last (jitop.graph.layout): same results as numpy, the transposes
pushed through the elementwise work between convolutions until they cancel, ragged channel counts left NCHW."""
from __future__ import annotations

import re

import numpy as np
import pytest

import jitop
from jitop.graph.ir import node
from jitop.graph.layout import channels_last
from jitop.dtypes import as_dtype

EPS = np.finfo(np.float32).eps
rng = np.random.default_rng(7)


def conv_ref(x: np.ndarray, w: np.ndarray, stride: int = 1, pad: int = 0, depthwise: bool = False) -> np.ndarray:
    """float64 NCHW cross-correlation, one einsum per kernel tap (depthwise: channel c reads input channel c)."""
    x = np.pad(np.asarray(x, np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oc, _, kh, kw = w.shape
    oh, ow = (x.shape[2] - kh) // stride + 1, (x.shape[3] - kw) // stride + 1
    out = np.zeros((x.shape[0], oc, oh, ow))
    for r in range(kh):
        for s in range(kw):
            window = x[:, :, r:r + stride * (oh - 1) + 1:stride, s:s + stride * (ow - 1) + 1:stride]
            tap = np.asarray(w[:, :, r, s], np.float64)
            out += window * tap[None, :, 0, None, None] if depthwise else np.einsum("nchw,oc->nohw", window, tap)
    return out


def weights(oc: int, c: int, k: int) -> np.ndarray:
    return (rng.standard_normal((oc, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)


W1, W2, W3 = weights(16, 16, 3), weights(32, 16, 1), weights(32, 16, 1)
B1, B2 = rng.standard_normal(16).astype(np.float32), rng.standard_normal(32).astype(np.float32)


@jitop.kernel
def bottleneck(x):
    y = np.maximum(jitop.conv2d(x, W1, B1, padding=1) + x, 0)  # residual with the NCHW input itself
    z = jitop.conv2d(y, W2, None, stride=2) + jitop.conv2d(x, W3, B2, stride=2)  # 1x1 pixel-row gemms
    out = np.maximum(z, 0.0)
    return out, out.mean(axis=(2, 3))


def bottleneck_ref(x):
    """(result, bound on its float32 error): each conv a dot product over C*K*K terms, bounded by
    terms * eps * (the same computation on absolute values)."""
    a = lambda v: np.abs(np.asarray(v, np.float64))
    y = np.maximum(conv_ref(x, W1, pad=1) + B1[:, None, None] + x, 0)
    y_mag = conv_ref(a(x), a(W1), pad=1) + a(B1)[:, None, None] + a(x)
    z = conv_ref(y, W2, stride=2) + conv_ref(x, W3, stride=2) + B2[:, None, None]
    mag = conv_ref(y_mag, a(W2), stride=2) + conv_ref(a(x), a(W3), stride=2) + a(B2)[:, None, None]
    out = np.maximum(z, 0)
    return out, (16 * 9 + 16 + 8) * EPS * mag


@pytest.mark.parametrize("shape", [(2, 16, 9, 11), (1, 16, 1, 1), (3, 16, 7, 2)])
def test_a_bottleneck_block_matches_numpy(shape):
    x = rng.standard_normal(shape).astype(np.float32)
    out, pooled = bottleneck(x)
    ref, bound = bottleneck_ref(x)
    assert out.dtype == np.float32 and out.shape == ref.shape and pooled.shape == ref.shape[:2]
    assert (np.abs(out - ref) <= bound + 1e-30).all()
    assert (out == 0).any() and (out > 0).any()  # the relu is exercised
    mean_bound = bound.mean(axis=(2, 3)) + EPS * ref.shape[2] * ref.shape[3] * np.abs(ref).mean(axis=(2, 3))
    assert (np.abs(pooled - ref.mean(axis=(2, 3))) <= mean_bound + 1e-30).all()


def _compiled_graph(text: str) -> list[str]:
    start = text.index("compiled graph")
    return text[start:text.index("\n\n", start)].splitlines()[1:]


def test_the_convolutions_run_channels_last_with_transposes_only_at_the_edges():
    x = rng.standard_normal((2, 16, 9, 11)).astype(np.float32)
    lines = _compiled_graph(jitop.explain(bottleneck, x))
    convs = [ln for ln in lines if "= conv2d(" in ln]
    assert len(convs) == 3 and all("layout=NHWC" in ln for ln in convs)
    # what each line computes: %k = prim(...)
    prim = {m.group(1): m.group(2) for ln in lines if (m := re.match(r"\s+(%\d+) = (\w+)\(", ln))}
    computed_transposes = [ln for ln in lines if re.search(r"= transpose\((%\d+)", ln)
                           and prim.get(re.search(r"= transpose\((%\d+)", ln).group(1)) in ("conv2d", "ufunc")]
    # one transpose of a computed value back to NCHW: the returned block output (which the mean also reads);
    # none between the convolutions
    assert len(computed_transposes) == 1, lines


def test_ragged_output_channels_stay_nchw():
    w = weights(20, 16, 3)

    @jitop.kernel
    def f(x):
        return np.maximum(jitop.conv2d(x, w, padding=1), 0)
    x = rng.standard_normal((1, 16, 6, 5)).astype(np.float32)
    text = jitop.explain(f, x)
    assert "compiled graph" not in text and "layout=NHWC" not in text
    ref = np.maximum(conv_ref(x, w, pad=1), 0)
    assert np.abs(f(x) - ref).max() <= 16 * 9 * EPS * conv_ref(np.abs(x), np.abs(w), pad=1).max()


def test_a_graph_without_convolutions_is_returned_as_it_is():
    f32 = as_dtype("float32")
    a = node("arg", (4, 3), f32, index=0)
    b = node("ufunc", (4, 3), f32, (a, a), name="add", in_dtypes=("float32", "float32"))
    results = [b]
    assert channels_last(results) is results


DW = (rng.standard_normal((32, 1, 3, 3)) / 3).astype(np.float32)
EXPAND = weights(32, 16, 1)


@jitop.kernel
def pooled_mobile_block(x):
    """a conv stem and max pooling, then a MobileNet block: 1x1 expansion, 3x3 depthwise (stride 2), relu6."""
    p = jitop.max_pool2d(np.maximum(jitop.conv2d(x, W1, B1, padding=1), 0), 3, stride=1, padding=1)
    e = np.maximum(jitop.conv2d(p, EXPAND), 0)
    return np.clip(jitop.conv2d(e, DW, None, stride=2, padding=1, groups=32), 0, 6)


def _max_pool_ref(x):
    xp = np.pad(np.asarray(x, np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    h, w = x.shape[2:]
    return np.max([xp[:, :, r:r + h, s:s + w] for r in range(3) for s in range(3)], axis=0)


@pytest.mark.parametrize("shape", [(1, 16, 9, 7), (2, 16, 2, 5)])
def test_pooling_and_depthwise_run_channels_last_and_match_numpy(shape):
    x = rng.standard_normal(shape).astype(np.float32)
    stem = np.maximum(conv_ref(x, W1, pad=1) + B1[:, None, None], 0)
    stem_mag = conv_ref(np.abs(x), np.abs(W1), pad=1) + np.abs(B1)[:, None, None]
    p, p_mag = _max_pool_ref(stem), _max_pool_ref(stem_mag)
    e = np.maximum(conv_ref(p, EXPAND), 0)
    e_mag = conv_ref(p_mag, np.abs(EXPAND))
    ref = np.clip(conv_ref(e, DW, 2, 1, depthwise=True), 0, 6)
    bound = (16 * 9 + 16 + 9 + 2) * EPS * conv_ref(e_mag, np.abs(DW), 2, 1, depthwise=True)
    got = pooled_mobile_block(x)
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert (np.abs(got - ref) <= bound + 1e-30).all()
    text = jitop.explain(pooled_mobile_block, x)
    lines = _compiled_graph(text)
    assert sum("layout=NHWC" in ln for ln in lines) == 3
    # the pooling's windows and padding are channels-last too: the only transposes of arrays are of the input,
    # of constants (bias, padding) and of the result
    transposed = [re.search(r"= transpose\(([%\w]+)", ln).group(1) for ln in lines if "= transpose(" in ln]
    computed = [t for t in transposed if t != "x" and not re.search(rf"^\s+{t} = (array_const|reshape)", text, re.M)]
    assert len(computed) <= 1, lines


def _max_pool_s2_ref(x):
    """3x3 max pooling, stride 2, padding 1 (ResNet's stem), in float64."""
    xp = np.pad(np.asarray(x, np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    oh, ow = (x.shape[2] - 1) // 2 + 1, (x.shape[3] - 1) // 2 + 1
    return np.max([xp[:, :, r:r + 2 * oh - 1:2, s:s + 2 * ow - 1:2] for r in range(3) for s in range(3)], axis=0)


@pytest.mark.parametrize("shape", [(1, 16, 11, 9), (2, 16, 4, 1)])
def test_a_strided_pooling_reads_the_convolutions_activation_computed_once_on_its_tile(shape):
    """ResNet's stem: the pooling's overlapping windows would re-evaluate the bias and ReLU per read; they are
    the convolution's epilogue instead (the ReLU is materialized, the pooling maxes finished values)."""
    @jitop.kernel
    def stem(x):
        return jitop.max_pool2d(np.maximum(jitop.conv2d(x, W1, B1, padding=1), 0), 3, stride=2, padding=1)
    x = rng.standard_normal(shape).astype(np.float32)
    ref = _max_pool_s2_ref(np.maximum(conv_ref(x, W1, pad=1) + B1[:, None, None], 0))
    mag = _max_pool_s2_ref(conv_ref(np.abs(x), np.abs(W1), pad=1) + np.abs(B1)[:, None, None])
    got = stem(x)
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert (np.abs(got - ref) <= (16 * 9 + 2) * EPS * mag + 1e-30).all()
    text = jitop.explain(stem, x)
    tails = [ln for ln in text.splitlines() if "elementwise tail of a conv2d" in ln]
    assert len(tails) == 1 and "maximum" not in tails[0].split("inlines")[0], tails


def test_a_convolutions_activation_read_once_stays_inlined_into_its_reader():
    """A stride-2 slice of the ReLU reads each element at most once: nothing is materialized for it."""
    @jitop.kernel
    def f(x):
        return np.maximum(jitop.conv2d(x, W1, B1, padding=1), 0)[:, :, ::2, ::2] * 2
    x = rng.standard_normal((1, 16, 7, 6)).astype(np.float32)
    ref = np.maximum(conv_ref(x, W1, pad=1) + B1[:, None, None], 0)[:, :, ::2, ::2] * 2
    np.testing.assert_allclose(f(x), ref, rtol=1e-5, atol=1e-5)
    assert "elementwise tail" not in jitop.explain(f, x)


def test_a_global_pooling_reduces_channels_last_and_a_batch_reduction_does_not():
    w = weights(32, 16, 3)

    @jitop.kernel
    def f(x):
        y = np.maximum(jitop.conv2d(np.maximum(jitop.conv2d(x, W1, padding=1), 0), w, padding=1), 0)
        return y.mean(axis=(2, 3)), y.max(axis=0)
    x = rng.standard_normal((3, 16, 5, 6)).astype(np.float32)
    ref = np.maximum(conv_ref(np.maximum(conv_ref(x, W1, pad=1), 0), w, pad=1), 0)
    mag = conv_ref(conv_ref(np.abs(x), np.abs(W1), pad=1), np.abs(w), pad=1)
    pooled, top = f(x)
    bound = (2 * 16 * 9 + 30) * EPS
    assert (np.abs(pooled - ref.mean(axis=(2, 3))) <= bound * mag.mean(axis=(2, 3))).all()
    assert (np.abs(top - ref.max(axis=0)) <= bound * mag.max(axis=0)).all()
    lines = _compiled_graph(jitop.explain(f, x))
    reductions = [ln for ln in lines if "= reduce(" in ln]
    # over H, W of the channels-last value: its axes 1, 2; over N it reads the logical (transposed) value
    assert any("axes=(1, 2)" in ln for ln in reductions), lines
    assert any("axes=(0,)" in ln and "= reduce(%" in ln for ln in reductions), lines


def test_a_lone_convolution_stays_nchw():
    """Converted alone, it would pay a transpose on each side (a depthwise one ran 3x slower so)."""
    @jitop.kernel
    def f(x):
        return np.clip(jitop.conv2d(x, DW, None, padding=1, groups=32), 0, 6)
    x = rng.standard_normal((1, 32, 6, 5)).astype(np.float32)
    assert "compiled graph" not in jitop.explain(f, x)
    ref = np.clip(conv_ref(x, DW, 1, 1, depthwise=True), 0, 6)
    assert (np.abs(f(x) - ref) <= 9 * EPS * conv_ref(np.abs(x), np.abs(DW), 1, 1, depthwise=True)).all()
