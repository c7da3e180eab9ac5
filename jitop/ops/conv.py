"""jitop.conv2d: torch.nn.functional.conv2d's semantics, NCHW or NHWC, on the topi direct template.

Traced (inside @jitop.kernel) it is one graph node, so a following bias, residual add or activation runs
on the template's register tile; called directly it is compiled once per (shapes, dtypes, geometry).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from jitop.graph.ir import node
from jitop.graph.numpy_api import cast_node, _dtype
from jitop.graph.tracer import Tracer, as_node
from jitop.kernel import kernel
from jitop.ops import checks

OP = "conv2d"


def _pads(padding: Any, kernel: tuple[int, int], dilation: tuple[int, int], stride: tuple[int, int]
          ) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) from an int, a pair, four ints (top, bottom, left, right), 'valid' or
    'same' (extra padding at the end)."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding != "same":
            raise ValueError(f"{OP}: padding must be an int, a pair, 'same' or 'valid', got {padding!r}")
        if stride != (1, 1):
            raise ValueError(f"{OP}: padding='same' needs stride 1 (as in torch), got stride {stride}")
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return (total[0] // 2, total[0] - total[0] // 2, total[1] // 2, total[1] - total[1] // 2)
    if isinstance(padding, (tuple, list)) and len(padding) == 4:
        top, bottom = checks.pair(padding[:2], "padding", OP)
        left, right = checks.pair(padding[2:], "padding", OP)
        return (top, bottom, left, right)
    ph, pw = checks.pair(padding, "padding", OP)
    return (ph, ph, pw, pw)


def _reference(x: np.ndarray, w: np.ndarray, geometry: tuple) -> np.ndarray:
    """numpy's conv (im2col per group + matmul): what runs if the compiled path falls back."""
    stride, pads, dilation, groups, layout = geometry
    if layout == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    n, c, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[1]), (pads[2], pads[3])))
    oh = (h + pads[0] + pads[1] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pads[2] + pads[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    dt = np.result_type(x.dtype, w.dtype)
    cols = np.empty((n, c, kh, kw, oh, ow), dt)
    for r in range(kh):
        for s in range(kw):
            y0, x0 = r * dilation[0], s * dilation[1]
            cols[:, :, r, s] = xp[:, :, y0:y0 + stride[0] * (oh - 1) + 1:stride[0], x0:x0 + stride[1] * (ow - 1) + 1:stride[1]]
    ocg = oc // groups
    out = np.concatenate([np.einsum("ncrsyx,ocrs->noyx", cols[:, g * icg:(g + 1) * icg], w[g * ocg:(g + 1) * ocg])
                          for g in range(groups)], axis=1).astype(dt, copy=False)
    return out.transpose(0, 2, 3, 1) if layout == "NHWC" else out


def _conv_node(x: Any, w: Any, geometry: tuple) -> Any:
    if not isinstance(x, Tracer) and not isinstance(w, Tracer):
        return _reference(np.asarray(x), np.asarray(w), geometry)
    stride, pads, dilation, groups, layout = geometry
    xn, wn = as_node(x), as_node(w)
    dt = _dtype(np.result_type(xn.dtype.np, wn.dtype.np))
    n = xn.shape[0]
    h, wd = (xn.shape[2], xn.shape[3]) if layout == "NCHW" else (xn.shape[1], xn.shape[2])
    oc, _, kh, kw = wn.shape
    oh = (h + pads[0] + pads[1] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pads[2] + pads[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    shape = (n, oc, oh, ow) if layout == "NCHW" else (n, oh, ow, oc)
    return Tracer(node("conv2d", shape, dt, (cast_node(xn, dt), cast_node(wn, dt)), stride=stride, pads=pads,
                       dilation=dilation, groups=groups, layout=layout))


# a kernel per shape (see jitop/ops/linalg.py) and per layer geometry: a network's many are not a recompile storm
@kernel(static_argnames=("geometry",), dynamic=False, warn_recompiles=False)
def _conv(x, w, geometry):
    return _conv_node(x, w, geometry)


@kernel(static_argnames=("geometry",), dynamic=False, warn_recompiles=False)
def _conv_bias(x, w, bias, geometry):
    y = _conv_node(x, w, geometry)
    return y + (bias.reshape(-1, 1, 1) if geometry[-1] == "NCHW" else bias)


def conv2d(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1, layout: str = "NCHW") -> Any:
    """2-D convolution (cross-correlation, as in torch.nn.functional.conv2d).

    input (N, C, H, W) for layout="NCHW" or (N, H, W, C) for "NHWC"; weight (OC, C // groups, KH, KW);
    bias (OC,). stride, dilation: int or pair; padding: int, pair, (top, bottom, left, right), "same" (stride 1)
    or "valid".
    Result (N, OC, OH, OW) or (N, OH, OW, OC), dtype numpy's promotion of input and weight.

    >>> x = np.ones((1, 1, 4, 4), np.float32); w = np.ones((2, 1, 3, 3), np.float32)
    >>> jitop.conv2d(x, w, padding=1)[0, 0, 0].tolist()
    [4.0, 6.0, 6.0, 4.0]
    """
    x, w = checks.array(input, "input", OP), checks.array(weight, "weight", OP)
    geometry = _geometry(x, w, stride, padding, dilation, groups, layout)
    if bias is None:
        return _conv(x, w, geometry)
    bias = checks.array(bias, "bias", OP)
    checks.numeric(bias, "bias", OP)
    if tuple(bias.shape) != (w.shape[0],):
        raise ValueError(f"{OP}: 'bias' must have shape ({w.shape[0]},) (one per output channel), "
                         f"got {tuple(bias.shape)}")
    return _conv_bias(x, w, bias, geometry)


def _geometry(x: Any, w: Any, stride: Any, padding: Any, dilation: Any, groups: Any, layout: str) -> tuple:
    checks.layout(layout, OP)
    checks.ndim(x, "input", OP, (4,), f" ({'N, C, H, W' if layout == 'NCHW' else 'N, H, W, C'})")
    checks.ndim(w, "weight", OP, (4,), " (OC, C // groups, KH, KW)")
    checks.numeric(x, "input", OP)
    checks.numeric(w, "weight", OP)
    if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"{OP}: groups must be a positive int, got {groups!r}")
    c = x.shape[1] if layout == "NCHW" else x.shape[3]
    oc, icg, kh, kw = w.shape
    if c % groups or oc % groups:
        raise ValueError(f"{OP}: groups={groups} must divide the input channels ({c}) and the output "
                         f"channels ({oc})")
    if icg != c // groups:
        raise ValueError(f"{OP}: weight {tuple(w.shape)} expects {icg * groups} input channels "
                         f"(weight.shape[1] * groups), but input {tuple(x.shape)} has {c} ({layout})")
    if min(kh, kw, oc) == 0:
        raise ValueError(f"{OP}: weight {tuple(w.shape)} has an empty dimension")
    s = checks.pair(stride, "stride", OP, minimum=1)
    d = checks.pair(dilation, "dilation", OP, minimum=1)
    pads = _pads(padding, (kh, kw), d, s)
    h, wd = (x.shape[2], x.shape[3]) if layout == "NCHW" else (x.shape[1], x.shape[2])
    if h + pads[0] + pads[1] < d[0] * (kh - 1) + 1 or wd + pads[2] + pads[3] < d[1] * (kw - 1) + 1:
        raise ValueError(f"{OP}: the padded input ({h + pads[0] + pads[1]} x {wd + pads[2] + pads[3]}) is smaller "
                         f"than the dilated kernel ({d[0] * (kh - 1) + 1} x {d[1] * (kw - 1) + 1})")
    return (s, pads, d, int(groups), layout)
