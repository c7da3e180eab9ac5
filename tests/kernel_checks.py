"""Shared assertions of the conformance tests: results must be numpy's in kind, dtype, shape and values."""
from __future__ import annotations

import functools

import numpy as np

import jitop


def assert_like(got, expected) -> None:
    """Same container kind (array vs numpy scalar), dtype and shape as the numpy reference."""
    assert isinstance(got, np.ndarray) == isinstance(expected, np.ndarray), (type(got), type(expected))
    if not isinstance(expected, np.ndarray):
        assert isinstance(got, np.generic), type(got)
    g, e = np.asarray(got), np.asarray(expected)
    assert g.dtype == e.dtype, (g.dtype, e.dtype)
    assert g.shape == e.shape, (g.shape, e.shape)


def assert_close(got, expected, rtol: float = 0.0, atol: float = 0.0) -> None:
    """assert_like, then values within rtol/atol (exact when both are 0); NaN matches NaN, inf matches inf."""
    assert_like(got, expected)
    g, e = np.asarray(got), np.asarray(expected)
    if rtol == 0 and atol == 0:
        np.testing.assert_array_equal(g, e, strict=True)
    else:
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, equal_nan=True, strict=True)


def assert_same(got, expected, rtol: float | None = None) -> None:
    """Same container kind (array vs numpy scalar), dtype, shape and values (NaN == NaN); `rtol` applies to
    float results only, everything else is exact."""
    exact = rtol is None or np.asarray(expected).dtype.kind != "f"
    assert_close(got, expected, rtol=0.0 if exact else rtol)


_BATCHES: dict[tuple, dict | None] = {}


def batched(tag: str, fns: dict, call, *arrays: np.ndarray) -> dict | None:
    """{name: fn(*arrays)} from ONE kernel: one compile instead of one per function, while the tests stay
    one per function. `call(kernel, *arrays)` runs it under the test module's warning rules. None if that
    kernel raised or fell back: each test then compiles its function alone."""
    key = (tag, call) + tuple((a.dtype.str, a.shape) for a in arrays)
    if key not in _BATCHES:
        if len(arrays) == 1:
            def many(a):
                return {n: fn(a) for n, fn in fns.items()}
        else:
            def many(a, b):
                return {n: fn(a, b) for n, fn in fns.items()}
        try:
            _BATCHES[key] = call(jitop.kernel(many), *arrays)
        except Exception:
            _BATCHES[key] = None
    return _BATCHES[key]


def conv2d_reference(x: np.ndarray, w: np.ndarray, wl) -> np.ndarray:
    """float64 NCHW/NHWC convolution of a concrete conv2d workload (jitop.topi.conv2d.Conv2dWorkload): per
    output channel and kernel tap, a strided window of the padded input."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    if wl.layout == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    top, bottom, left, right = wl.pads
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    (sh, sw), (dh, dw) = wl.stride, wl.dilation
    out = np.zeros((wl.n, wl.oc, wl.oh, wl.ow))
    for o in range(wl.oc):
        g = o // wl.ocg
        for r in range(wl.kh):
            for s in range(wl.kw):
                win = xp[:, g * wl.icg:(g + 1) * wl.icg, r * dh::sh, s * dw::sw][:, :, :wl.oh, :wl.ow]
                out[:, o] += np.einsum("nchw,c->nhw", win, w[o, :, r, s])
    return out.transpose(0, 2, 3, 1) if wl.layout == "NHWC" else out


@functools.cache
def tvm_add_example() -> "jitop.Module":
    """TVM's first example through te -> lower -> build: C = A + B over te.var n, split by 8, vectorized,
    parallel (built once per test process)."""
    from jitop import te
    n = te.var("n")
    A, B = te.placeholder((n,), name="A"), te.placeholder((n,), name="B")
    C = te.compute(A.shape, lambda i: A[i] + B[i], name="C")
    s = jitop.create_schedule(C.op)
    xo, xi = s[C].split(C.op.axis[0], factor=8)
    s[C].vectorize(xi)
    s[C].parallel(xo)
    return jitop.build(s, [A, B, C])
