"""jitop.matmul, dense, batch_matmul: np.matmul's semantics on the register-tiled topi template.

Each is a @jitop.kernel over the numpy expression, so it is compiled once per (shapes, dtypes), and
inside another @jitop.kernel it traces through (bias and activation after it fuse into its kernel). Called
directly they keep a kernel per shape (dynamic=False): a matmul whose K varies loses its K chunking, and one
whose every dim varies its fully unrolled small-size code (4x slower at 13x8x8); inside a decorated function
the function's own policy decides (a symbolic row count there is as fast as a specialised one).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from jitop.dtypes import DTYPES
from jitop.graph.tracer import Tracer, Unsupported
from jitop.kernel import kernel
from jitop.ops import checks

_COMPILED_KINDS = "iuf"  # bool and complex matmul run as numpy's


@kernel(dynamic=False)
def _matmul(a, b):
    return np.matmul(a, b)


@kernel(dynamic=False)
def _dense(x, weight):
    return np.matmul(x, weight.T)


@kernel(dynamic=False)
def _dense_bias(x, weight, bias):
    return np.matmul(x, weight.T) + bias


def _check_core(a: Any, b: Any, op: str) -> tuple[int, ...]:
    """np.matmul's shape rule; returns the result shape."""
    for x, name in ((a, "a"), (b, "b")):
        if x.ndim == 0:
            raise ValueError(f"{op}: argument '{name}' must have at least 1 dimension, got shapes {tuple(a.shape)} "
                             f"and {tuple(b.shape)} (use '*' to multiply by a scalar)")
    ka, kb = a.shape[-1], b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        raise ValueError(f"{op}: the last dimension of 'a' ({ka}) must equal the "
                         f"{'first' if b.ndim == 1 else 'second-to-last'} dimension of 'b' ({kb}); "
                         f"shapes {tuple(a.shape)} and {tuple(b.shape)}")
    batch_a = a.shape[:-2] if a.ndim > 1 else ()
    batch_b = b.shape[:-2] if b.ndim > 1 else ()
    try:
        batch = np.broadcast_shapes(batch_a, batch_b)
    except ValueError:
        raise ValueError(f"{op}: batch dimensions {batch_a} of 'a' and {batch_b} of 'b' do not broadcast") from None
    return batch + ((a.shape[-2],) if a.ndim > 1 else ()) + ((b.shape[-1],) if b.ndim > 1 else ())


_NATIVE = frozenset(d for d in checks.NATIVE if d.kind in _COMPILED_KINDS)  # dtype.name would cost µs


def _compiled(*arrays: Any) -> bool:
    """Dtypes jitop compiles (bool, complex, float16, longdouble run as numpy's matmul)."""
    return all(np.dtype(x.dtype).kind in _COMPILED_KINDS and np.dtype(x.dtype).name in DTYPES for x in arrays)


def matmul(a: Any, b: Any, out: np.ndarray | None = None) -> Any:
    """np.matmul, compiled: 1-D operands promoted, batch dimensions broadcast, result dtype numpy's.

    >>> a = np.arange(6, dtype=np.float32).reshape(2, 3)
    >>> jitop.matmul(a, np.ones((3, 2), np.float32)).tolist()
    [[3.0, 3.0], [12.0, 12.0]]

    out: an array of the result's shape to write into (numpy's 'same_kind' casting); returned.
    bool and complex operands run as numpy's matmul.
    """
    if (out is None and type(a) is np.ndarray and type(b) is np.ndarray and a.ndim == 2 == b.ndim
            and a.shape[1] == b.shape[0] and a.dtype in _NATIVE and b.dtype in _NATIVE):
        return _matmul(a, b)  # the common case, checked in a few attribute reads: its native entry serves it
    a, b = checks.array(a, "a", "matmul"), checks.array(b, "b", "matmul")
    shape = _check_core(a, b, "matmul")
    if out is not None and (isinstance(a, Tracer) or isinstance(b, Tracer)):
        raise Unsupported("jitop.matmul(..., out=...) inside @jitop.kernel", "return the result instead")
    if out is not None:
        _check_out(out, shape, np.result_type(a.dtype, b.dtype))
    r = _matmul(a, b) if _compiled(a, b) else np.matmul(a, b)
    if out is None:
        return r
    np.copyto(out, r, casting="same_kind")
    return out


def _check_out(out: Any, shape: tuple[int, ...], dtype: np.dtype) -> None:
    if not isinstance(out, np.ndarray):
        raise TypeError(f"matmul: 'out' must be a numpy array, got {type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"matmul: 'out' has shape {out.shape}, the result has shape {shape}")
    if not np.can_cast(dtype, out.dtype, "same_kind"):
        raise TypeError(f"matmul: cannot write the {dtype} result into 'out' of dtype {out.dtype} "
                        f"(numpy's 'same_kind' casting)")
    if not out.flags.writeable:
        raise ValueError("matmul: 'out' is read-only")


def dense(x: Any, weight: Any, bias: Any = None) -> Any:
    """A fully connected layer, x @ weight.T (+ bias): x (..., in), weight (out, in), bias (out,).

    Same as torch.nn.functional.linear and TVM's dense.

    >>> x = np.ones((2, 3), np.float32); w = np.ones((4, 3), np.float32)
    >>> jitop.dense(x, w, np.arange(4, dtype=np.float32))[0].tolist()
    [3.0, 4.0, 5.0, 6.0]
    """
    x, weight = checks.array(x, "x", "dense"), checks.array(weight, "weight", "dense")
    checks.ndim(weight, "weight", "dense", (2,), " (out_features, in_features)")
    if x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"dense: the last dimension of 'x' {tuple(x.shape)} must equal in_features = "
                         f"weight.shape[1] = {weight.shape[1]}")
    if bias is None:
        return _dense(x, weight) if _compiled(x, weight) else np.matmul(x, weight.T)
    bias = checks.array(bias, "bias", "dense")
    if bias.shape != (weight.shape[0],):
        raise ValueError(f"dense: 'bias' must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    if not _compiled(x, weight, bias):
        return np.matmul(x, weight.T) + bias
    return _dense_bias(x, weight, bias)


def batch_matmul(a: Any, b: Any) -> Any:
    """A batch of matrix products: a (batch, m, k) @ b (batch, k, n) -> (batch, m, n); a batch of 1
    broadcasts (TVM's batch_matmul with transpose_b=False).

    >>> jitop.batch_matmul(np.ones((2, 1, 3)), np.ones((1, 3, 5))).shape
    (2, 1, 5)
    """
    a, b = checks.array(a, "a", "batch_matmul"), checks.array(b, "b", "batch_matmul")
    checks.ndim(a, "a", "batch_matmul", (3,), " (batch, m, k)")
    checks.ndim(b, "b", "batch_matmul", (3,), " (batch, k, n)")
    _check_core(a, b, "batch_matmul")
    return _matmul(a, b) if _compiled(a, b) else np.matmul(a, b)
