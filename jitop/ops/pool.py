"""2-D pooling with torch.nn.functional's semantics (NCHW or NHWC), written as numpy and compiled.

A window reduction is the elementwise max (or sum) of kernel_size strided slices of the padded input:
all of them inline into one loop nest over the output, so pooling is one pass over memory. Large windows that
tile the input (stride = kernel) are a reduction over the window's axes of a reshape instead.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from jitop.kernel import kernel
from jitop.ops import checks


def _out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's output size: windows must start inside the input or the left padding."""
    span = size + 2 * p - d * (k - 1) - 1
    n = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (n - 1) * s >= size + p:
        n -= 1
    return max(n, 0)


def _pad(x: Any, axis: int, before: int, after: int, value: Any) -> Any:
    if before == 0 and after == 0:
        return x
    parts = []
    for width in (before, None, after):
        if width is None:
            parts.append(x)
        elif width > 0:
            shape = list(x.shape)
            shape[axis] = width
            parts.append(np.full_like(x, value, shape=tuple(shape)))  # shape= keeps a symbolic batch
    return np.concatenate(parts, axis=axis)


def _windows(x: Any, hw: tuple[int, int], geometry: tuple, value: Any) -> list[Any]:
    """The strided slices of the padded input, one per window offset that reads some of the input (an offset
    whose slice is all padding adds nothing to a max or a sum: a window far wider than the input unrolls only
    the offsets that meet it)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (oh, ow) = geometry
    h_ax, w_ax = hw
    # pad enough on the far side for every window start, even ceil_mode ones past the edge
    far_h = max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - x.shape[h_ax] - ph)
    far_w = max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - x.shape[w_ax] - pw)
    xp = _pad(_pad(x, h_ax, ph, far_h, value), w_ax, pw, far_w, value)
    rows = _meeting(kh, dh, sh, oh, ph, x.shape[h_ax]) or [0]
    cols = _meeting(kw, dw, sw, ow, pw, x.shape[w_ax]) or [0]
    out = []
    for i in rows:
        for j in cols:
            index = [slice(None)] * x.ndim
            index[h_ax] = slice(i * dh, i * dh + (oh - 1) * sh + 1, sh)
            index[w_ax] = slice(j * dw, j * dw + (ow - 1) * sw + 1, sw)
            out.append(xp[tuple(index)])
    return out


def _meeting(k: int, d: int, s: int, n: int, p: int, size: int) -> list[int]:
    """The window offsets along an axis whose positions (offset * d + out * s, out < n, in the padded axis) read
    some of the input, which starts at p and is `size` long."""
    if k <= size:  # (a window no wider than the input: every offset, no arithmetic)
        return list(range(k))
    starts = np.arange(n) * s - p  # each window's first position in the input's coordinates
    lo = np.clip(-(starts // d), 0, k)  # the first offset at or past the input's start, per window
    hi = np.clip(-((starts - size) // d), 0, k)  # past the last one inside it
    return sorted(set().union(*(range(a, b) for a, b in zip(lo.tolist(), hi.tolist()))))


def _lowest(dtype: np.dtype) -> Any:
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


# windows of more elements than this that tile the input (stride = kernel, no padding or dilation) are reduced
# as blocks of a reshape: a loop per window, not an unrolled slice per element (a 56x56 window took seconds)
BLOCK_WINDOW = 64


def _tiling(geometry: tuple) -> bool:
    (kh, kw), stride, (ph, pw), dilation, _ = geometry
    return kh * kw > BLOCK_WINDOW and stride == (kh, kw) and ph == pw == 0 and dilation == (1, 1)


def _blocks(x: Any, hw: tuple[int, int], geometry: tuple) -> tuple[Any, tuple[int, int]]:
    """The input cut into its windows (floor mode: the rows and columns past the last whole one dropped) as
    two axes each, and the window's axes."""
    (kh, kw), _, _, _, (oh, ow) = geometry
    index = [slice(None)] * x.ndim
    index[hw[0]], index[hw[1]] = slice(0, oh * kh), slice(0, ow * kw)
    x = x[tuple(index)]
    n, a, b, c = x.shape
    if hw == (2, 3):
        return x.reshape(n, a, oh, kh, ow, kw), (3, 5)
    return x.reshape(n, oh, kh, ow, kw, c), (2, 4)


@kernel(static_argnames=("hw", "geometry"), warn_recompiles=False)
def _max_pool(x, hw, geometry):
    if _tiling(geometry):
        blocks, axes = _blocks(x, hw, geometry)
        return blocks.max(axis=axes)
    windows = _windows(x, hw, geometry, _lowest(np.dtype(x.dtype)))
    out = windows[0]
    for w in windows[1:]:
        out = np.maximum(out, w)
    return out


@kernel(static_argnames=("hw", "geometry", "count_include_pad"), warn_recompiles=False)
def _avg_pool(x, hw, geometry, count_include_pad):
    if _tiling(geometry):
        blocks, axes = _blocks(x, hw, geometry)
        return blocks.mean(axis=axes)
    windows = _windows(x, hw, geometry, 0)
    out = windows[0]
    for w in windows[1:]:
        out = out + w
    return out / _divisor(x, hw, geometry, count_include_pad)  # a constant of the compiled kernel


def _geometry(x: Any, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool, layout: str,
              op: str) -> tuple[tuple[int, int], tuple]:
    checks.layout(layout, op)
    checks.ndim(x, "x", op, (4,), f" ({layout})")
    k = checks.pair(kernel_size, "kernel_size", op, minimum=1)
    s = checks.pair(k if stride is None else stride, "stride", op, minimum=1)
    p = checks.pair(padding, "padding", op)
    d = checks.pair(dilation, "dilation", op, minimum=1)
    if p[0] * 2 > k[0] or p[1] * 2 > k[1]:
        raise ValueError(f"{op}: padding {p} must be at most half of kernel_size {k}")
    hw = (2, 3) if layout == "NCHW" else (1, 2)
    out = tuple(_out_size(x.shape[a], k[i], s[i], p[i], d[i], ceil_mode) for i, a in enumerate(hw))
    if min(out) <= 0:
        raise ValueError(f"{op}: the input's spatial size {tuple(x.shape[a] for a in hw)} is too small for "
                         f"kernel_size {k} with padding {p} and dilation {d}")
    return hw, (k, s, p, d, out)


def max_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, layout: str = "NCHW") -> Any:
    """The maximum over each kernel_size window (padding counts as -inf; NaN propagates).

    >>> x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    >>> jitop.max_pool2d(x, 2)[0, 0].tolist()
    [[5.0, 7.0], [13.0, 15.0]]
    """
    x = checks.array(x, "x", "max_pool2d")
    checks.numeric(x, "x", "max_pool2d")
    ceil_mode = checks.flag(ceil_mode, "ceil_mode", "max_pool2d")
    hw, geometry = _geometry(x, kernel_size, stride, padding, dilation, ceil_mode, layout, "max_pool2d")
    return _max_pool(x, hw, geometry)


def _divisor(x: Any, hw: tuple[int, int], geometry: tuple, count_include_pad: bool) -> np.ndarray:
    """torch's divisor per output position: the window clipped to the padded input (count_include_pad),
    or to the input itself."""
    (kh, kw), (sh, sw), (ph, pw), _, (oh, ow) = geometry
    sizes = []
    for n, k, s, p, size in ((oh, kh, sh, ph, x.shape[hw[0]]), (ow, kw, sw, pw, x.shape[hw[1]])):
        start = np.arange(n) * s - p
        end = np.minimum(start + k, size + p)
        if not count_include_pad:
            start, end = np.maximum(start, 0), np.minimum(end, size)
        sizes.append(end - start)
    div = np.outer(sizes[0], sizes[1]).astype(x.dtype)
    return div[:, :, None] if hw == (1, 2) else div


def avg_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, layout: str = "NCHW") -> Any:
    """The mean over each kernel_size window; with count_include_pad the zero padding counts.

    >>> jitop.avg_pool2d(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4), 2)[0, 0].tolist()
    [[2.5, 4.5], [10.5, 12.5]]
    """
    x = checks.array(x, "x", "avg_pool2d")
    checks.floating(x, "x", "avg_pool2d")
    ceil_mode = checks.flag(ceil_mode, "ceil_mode", "avg_pool2d")
    hw, geometry = _geometry(x, kernel_size, stride, padding, 1, ceil_mode, layout, "avg_pool2d")
    return _avg_pool(x, hw, geometry, checks.flag(count_include_pad, "count_include_pad", "avg_pool2d"))


@kernel(static_argnames=("axes",), warn_recompiles=False)
def _global_avg(x, axes):
    return np.mean(x, axis=axes, keepdims=True)


def global_avg_pool2d(x: Any, layout: str = "NCHW") -> Any:
    """The mean over the spatial dimensions, kept as size 1: (N, C, 1, 1) for NCHW, (N, 1, 1, C) for NHWC.

    >>> jitop.global_avg_pool2d(np.ones((2, 3, 5, 5), np.float32)).shape
    (2, 3, 1, 1)
    """
    x = checks.array(x, "x", "global_avg_pool2d")
    checks.floating(x, "x", "global_avg_pool2d")
    checks.layout(layout, "global_avg_pool2d")
    checks.ndim(x, "x", "global_avg_pool2d", (4,), f" ({layout})")
    return _global_avg(x, (2, 3) if layout == "NCHW" else (1, 2))
