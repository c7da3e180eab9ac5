"""export_library links a self-contained shared library (kernel + thread pool when parallel)."""
from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

import jitop
from jitop import te


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no system linker")
@pytest.mark.parametrize("parallel", [False, True])
def test_exported_library_runs_without_jitop_runtime(tmp_path, parallel) -> None:
    n = 50_000
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: te.exp(A[i]) * 2.0, name="B")
    s = jitop.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=16)
    s[B].vectorize(xi)
    if parallel:
        s[B].parallel(xo)
    f = jitop.build(s, [A, B])
    assert f.meta["uses_parallel"] == parallel
    path = tmp_path / "kernel.so"
    f.export_library(path)
    fn = getattr(ctypes.CDLL(str(path)), f.meta["symbol"])
    fn.argtypes = [ctypes.c_void_p] * 2
    a = np.linspace(-3, 3, n, dtype=np.float32)
    out = np.empty_like(a)
    fn(a.ctypes.data, out.ctypes.data)
    np.testing.assert_array_equal(out, f(a))
    np.testing.assert_allclose(out, np.exp(a) * 2, rtol=1e-6)
