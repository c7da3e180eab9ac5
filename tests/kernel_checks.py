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


class GemmTutorial:
    """TVM's "How to optimize GEMM on CPU" at block size `bn`: the computation (sizes ints or te vars; packed: B
    in zero-padded panels of bn columns) and each step's schedule, as methods (s, A, B, C, P). Shared by the
    constant-size tests (tests/codegen/test_build_numpy.py) and the symbolic ones (tests/topi)."""

    def __init__(self, bn: int):
        self.bn = bn

    def compute(self, m, n, k, packed: bool = False) -> tuple:
        from jitop import te
        from jitop.schedule.schedule import ceildiv
        bn = self.bn
        A = te.placeholder((m, k), "float32", "A")
        B = te.placeholder((k, n), "float32", "B")
        r = te.reduce_axis((0, k), "k")
        if not packed:
            return A, B, te.compute((m, n), lambda x, y: te.sum(A[x, r] * B[r, y], axis=r), name="C"), None
        # n need not be a multiple of bn: the last panel is zero-padded
        P = te.compute((ceildiv(n, bn), k, bn), lambda x, y, z: te.if_then_else(x * bn + z < n, B[y, x * bn + z], 0.0),
                       name="packedB")
        return A, B, te.compute((m, n), lambda x, y: te.sum(A[x, r] * P[y // bn, r, y % bn], axis=r), name="C"), P

    def default(self, s, A, B, C, P) -> None:
        pass

    def blocking(self, s, A, B, C, P, order: str = "ki, xi") -> tuple:
        xo, yo, xi, yi = s[C].tile(C.op.axis[0], C.op.axis[1], self.bn, self.bn)
        ko, ki = s[C].split(C.op.reduce_axis[0], factor=4)
        s[C].reorder(xo, yo, ko, *((ki, xi) if order == "ki, xi" else (xi, ki)), yi)
        return xo, yo, ko, xi, ki, yi

    def vectorize(self, s, A, B, C, P) -> None:
        s[C].vectorize(self.blocking(s, A, B, C, P)[-1])

    def loop_permutation(self, s, A, B, C, P) -> None:
        s[C].vectorize(self.blocking(s, A, B, C, P, order="xi, ki")[-1])

    def array_packing(self, s, A, B, C, P) -> None:
        self.loop_permutation(s, A, B, C, P)
        self._packing(s, P)

    def write_cache(self, s, A, B, C, P, scope: str = "global"):
        """C's block accumulated in a cache (`scope`), written back per block; returns C's outer row loop."""
        CC = s.cache_write(C, scope)
        xo, yo, xi, yi = s[C].tile(C.op.axis[0], C.op.axis[1], self.bn, self.bn)
        s[CC].compute_at(s[C], yo)
        xc, yc = s[CC].op.axis
        (k,) = s[CC].op.reduce_axis
        ko, ki = s[CC].split(k, factor=4)
        s[CC].reorder(ko, xc, ki, yc)
        s[CC].unroll(ki)
        s[CC].vectorize(yc)
        if P is not None:
            self._packing(s, P)
        return xo

    def write_cache_local(self, s, A, B, C, P) -> None:
        self.write_cache(s, A, B, C, P, "local")

    def parallel(self, s, A, B, C, P) -> None:
        s[C].parallel(self.write_cache(s, A, B, C, P, "global"))

    def cache_read_packing(self, s, A, B, C, P) -> None:
        """A's rows packed into a local copy at each block of C."""
        AA = s.cache_read(A, "local", [C])
        xo, yo, xi, yi = s[C].tile(C.op.axis[0], C.op.axis[1], self.bn, self.bn)
        s[AA].compute_at(s[C], xo)
        s[C].vectorize(yi)

    @staticmethod
    def _packing(s, P) -> None:
        x, y, z = s[P].op.axis
        s[P].vectorize(z)
        s[P].parallel(x)
