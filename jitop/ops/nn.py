"""Neural-network functions with torch.nn.functional's semantics, written as numpy and compiled.

Each is a @jitop.kernel: row reductions (softmax, layer_norm) become one fused pass per row, and inside
another @jitop.kernel they trace through and fuse with their neighbours.

>>> x = np.array([[1.0, 2.0, 3.0]], np.float32)
>>> bool(np.allclose(jitop.softmax(x).sum(), 1.0))
True
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from jitop.graph.ir import node
from jitop.graph.numpy_api import reduce
from jitop.graph.tracer import Tracer
from jitop.kernel import kernel
from jitop.ops import checks


def _axis(axis: int, ndim: int, op: str) -> int:
    """axis normalised to 0..ndim-1; a 0-d array takes axis 0 or -1, as in torch."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{op}: axis must be an int, got {checks.shown(axis)}")
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ValueError(f"{op}: axis {axis!r} is out of range for an array of {ndim} dimensions")
    return int(axis) % max(ndim, 1)


def _row_op(kernel_fn: Any, x: Any, axis: int) -> Any:
    """softmax/log_softmax along axis: a 0-d x is a row of one, an empty row has nothing to normalise
    (np.max over it has no identity)."""
    if x.ndim == 0:
        return kernel_fn(x.reshape(1), 0).reshape(())
    if x.shape[axis] == 0:
        return np.zeros_like(x)
    return kernel_fn(x, axis)


def _shift(x: Any, axis: int) -> Any:
    """The row maximum subtracted for stability. Traced, it is a max with unspecified NaN handling (one
    instruction per vector instead of three): a NaN in the row makes exp(x - m) and so the whole row
    NaN whatever m is, as with np.max."""
    if not isinstance(x, Tracer):
        return np.max(x, axis=axis, keepdims=True)
    return reduce(x, "shift_max", axis=axis, keepdims=True)


@kernel(static_argnames=("axis",), warn_recompiles=False)
def _softmax(x, axis):
    e = np.exp(x - _shift(x, axis))
    # one division per row, then a multiply per element (as torch does): within 1 ulp of e / sum
    return e * (1 / np.sum(e, axis=axis, keepdims=True))


@kernel(static_argnames=("axis",), warn_recompiles=False)
def _log_softmax(x, axis):
    shifted = x - _shift(x, axis)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def softmax(x: Any, axis: int = -1) -> Any:
    """exp(x) / sum(exp(x)) along `axis`, computed as exp(x - max) so large inputs do not overflow.

    >>> jitop.softmax(np.zeros((2, 4), np.float32))[0].tolist()
    [0.25, 0.25, 0.25, 0.25]
    """
    x = checks.array(x, "x", "softmax")
    checks.floating(x, "x", "softmax")
    return _row_op(_softmax, x, _axis(axis, x.ndim, "softmax"))


def log_softmax(x: Any, axis: int = -1) -> Any:
    """log(softmax(x)) along `axis`, computed as (x - max) - log(sum(exp(x - max))).

    >>> float(jitop.log_softmax(np.zeros(4, np.float32))[0]) == float(np.log(np.float32(0.25)))
    True
    """
    x = checks.array(x, "x", "log_softmax")
    checks.floating(x, "x", "log_softmax")
    return _row_op(_log_softmax, x, _axis(axis, x.ndim, "log_softmax"))


@kernel(static_argnames=("axes",), warn_recompiles=False)
def _layer_norm(x, weight, bias, eps, axes):
    mean = np.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    y = centered / np.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def layer_norm(x: Any, normalized_shape: int | Sequence[int], weight: Any = None, bias: Any = None,
               eps: float = 1e-5) -> Any:
    """Normalise over the trailing `normalized_shape` dimensions (biased variance), then scale and shift.

    >>> y = jitop.layer_norm(np.arange(8, dtype=np.float32).reshape(2, 4), 4)
    >>> bool(abs(float(y.mean())) < 1e-6)
    True
    """
    x = checks.array(x, "x", "layer_norm")
    checks.floating(x, "x", "layer_norm")
    shape = _int_shape(normalized_shape)
    if not shape or len(shape) > x.ndim or tuple(x.shape[x.ndim - len(shape):]) != shape:
        raise ValueError(f"layer_norm: normalized_shape {shape} must be the trailing dimensions of x, "
                         f"whose shape is {tuple(x.shape)}")
    params = [_param(p, name, shape, x, "layer_norm") for p, name in ((weight, "weight"), (bias, "bias"))]
    eps = checks.real(eps, "eps", "layer_norm")
    return _layer_norm(x, *params, eps, tuple(range(x.ndim - len(shape), x.ndim)))


def _int_shape(normalized_shape: Any) -> tuple[int, ...]:
    """An int or a sequence of ints (torch's normalized_shape) as a tuple."""
    shape = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else normalized_shape
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in shape):
        hint = (" (the weight comes third: layer_norm(x, normalized_shape, weight, bias), as torch's)"
                if isinstance(normalized_shape, (np.ndarray, Tracer)) else "")
        raise TypeError(f"layer_norm: normalized_shape must be an int or a sequence of ints, "
                        f"got {checks.shown(normalized_shape)}{hint}")
    return tuple(int(n) for n in shape)


def _param(p: Any, name: str, shape: tuple[int, ...], x: Any, op: str) -> Any:
    if p is None:
        return None
    p = checks.array(p, name, op)
    checks.numeric(p, name, op)  # (mixed float dtypes promote as numpy's)
    if tuple(p.shape) != shape:
        raise ValueError(f"{op}: '{name}' must have shape {shape}, got {tuple(p.shape)}")
    return p


@kernel(static_argnames=("axis",), warn_recompiles=False)
def _batch_norm(x, mean, var, weight, bias, eps, axis):
    shape = (-1,) + (1,) * (x.ndim - axis - 1)
    scale = 1.0 / np.sqrt(var.reshape(shape) + eps)
    y = (x - mean.reshape(shape)) * scale
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def batch_norm(x: Any, running_mean: Any, running_var: Any, weight: Any = None, bias: Any = None,
               eps: float = 1e-5, axis: int = 1) -> Any:
    """Inference batch norm: (x - mean) / sqrt(var + eps) * weight + bias, per channel on `axis`
    (1 for NCHW, -1 for NHWC).

    >>> x = np.ones((1, 2, 3, 3), np.float32)
    >>> float(jitop.batch_norm(x, np.ones(2, np.float32), np.ones(2, np.float32), eps=0.0)[0, 0, 0, 0])
    0.0
    """
    x = checks.array(x, "x", "batch_norm")
    checks.floating(x, "x", "batch_norm")
    if x.ndim < 2:
        raise ValueError(f"batch_norm: 'x' must have at least 2 dimensions (batch, channels, ...), "
                         f"got shape {tuple(x.shape)}")
    ax = _axis(axis, x.ndim, "batch_norm")
    shape = (x.shape[ax],)
    mean, var = (_param(p, name, shape, x, "batch_norm")
                 for p, name in ((running_mean, "running_mean"), (running_var, "running_var")))
    if mean is None or var is None:
        raise ValueError("batch_norm: running_mean and running_var are required (inference mode)")
    params = [_param(p, name, shape, x, "batch_norm") for p, name in ((weight, "weight"), (bias, "bias"))]
    return _batch_norm(x, mean, var, *params, checks.real(eps, "eps", "batch_norm"), ax)


@kernel
def _relu(x):
    return np.maximum(x, 0)


@kernel
def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def relu(x: Any) -> Any:
    """max(x, 0), NaN propagated; dtype kept.

    >>> jitop.relu(np.array([-1.0, 2.0], np.float32)).tolist()
    [0.0, 2.0]
    """
    x = checks.array(x, "x", "relu")
    checks.numeric(x, "x", "relu")
    return _relu(x)


def sigmoid(x: Any) -> Any:
    """1 / (1 + exp(-x)).

    >>> jitop.sigmoid(np.zeros(1, np.float32)).tolist()
    [0.5]
    """
    x = checks.array(x, "x", "sigmoid")
    checks.floating(x, "x", "sigmoid")
    return _sigmoid(x)


def erf(x: Any) -> Any:
    """erf, elementwise: a graph node when traced (numpy has no erf ufunc), math.erf otherwise.

    >>> erf(np.zeros(2, np.float32)).tolist()
    [0.0, 0.0]
    """
    if isinstance(x, Tracer):
        n = x.node
        return Tracer(node("ufunc", n.shape, n.dtype, (n,), name="erf", in_dtypes=(n.dtype.name,)))
    return np.vectorize(math.erf, otypes=[x.dtype])(x)


@kernel(static_argnames=("approximate",), warn_recompiles=False)
def _gelu(x, approximate):
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))
        return 0.5 * x * (1 + np.tanh(inner))
    return 0.5 * x * (1 + erf(x * (1 / math.sqrt(2.0))))


def gelu(x: Any, approximate: str = "none") -> Any:
    """x * Phi(x), Phi the standard normal CDF (exact, with erf), or torch's tanh approximation.

    >>> jitop.gelu(np.zeros(1, np.float32)).tolist()
    [0.0]
    """
    x = checks.array(x, "x", "gelu")
    checks.floating(x, "x", "gelu")
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _gelu(x, approximate)
