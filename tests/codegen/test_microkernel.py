"""cache_write + unroll + vectorize of a register tile keeps the accumulators in vector registers."""
from __future__ import annotations

import numpy as np
import pytest

import jitop
from jitop import te


def _register_tile_gemm(m: int, n: int, k: int, mr: int = 4, nr: int = 32):
    A = te.placeholder((m, k), "float32", "A")
    B = te.placeholder((k, n), "float32", "B")
    r = te.reduce_axis((0, k), "k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    s = jitop.create_schedule(C.op)
    CC = s.cache_write(C, "local")
    xo, yo, xi, yi = s[C].tile(C.op.axis[0], C.op.axis[1], mr, nr)
    s[CC].compute_at(s[C], yo)
    xc, yc = s[CC].op.axis
    ko, ki = s[CC].split(r, factor=4)
    s[CC].reorder(ko, ki, xc, yc)
    s[CC].unroll(ki)
    s[CC].unroll(xc)
    s[CC].vectorize(yc)
    return jitop.build(s, [A, B, C])


@pytest.fixture(scope="module")
def kernel():
    return _register_tile_gemm(64, 64, 64)


def test_accumulators_are_promoted_out_of_memory(kernel) -> None:
    ll = kernel.get_source("ll")
    main = ll[ll.index("define void @jitop_main"):]
    main = main[:main.index("\n}\n")]
    assert "alloca" not in main, "the C.local register tile should have been promoted to SSA values"
    assert "<32 x float>" in main or "<16 x float>" in main


def test_inner_loop_is_fma_on_zmm(kernel) -> None:
    flags = open("/proc/cpuinfo").read()
    if " avx512f" not in flags:
        pytest.skip("this CPU has no AVX-512 (zmm registers)")
    asm = kernel.get_source("asm")
    fmas = [line for line in asm.splitlines() if "vfmadd" in line]
    assert fmas and all("zmm" in line for line in fmas)
    # accumulators never spill: no FMA reads or writes the stack
    assert not any("rsp" in line for line in fmas)


@pytest.mark.parametrize("shape", [(64, 64, 64), (13, 70, 9), (1, 32, 1)])
def test_register_tile_matches_numpy(shape) -> None:
    m, n, k = shape
    f = _register_tile_gemm(m, n, k)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    np.testing.assert_allclose(f(a, b), a @ b, rtol=1e-4, atol=1e-4)
