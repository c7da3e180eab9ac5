"""cache_write + unroll + vectorize of a register tile keeps the accumulators in vector registers."""
from __future__ import annotations

import numpy as np
import pytest

import jitop
from jitop import te
from targets import HOST, runnable_targets


def _register_tile_gemm(m: int, n: int, k: int, target=HOST, mr: int = 4):
    """A 4-row register tile two vectors of the target wide (8 accumulators: fits AVX2's 16 registers)."""
    nr = 2 * target.lanes(4)
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
    return jitop.build(s, [A, B, C], target=target)


@pytest.fixture(scope="module", params=runnable_targets())
def kernel(request):
    return _register_tile_gemm(64, 64, 64, request.param)


def test_accumulators_are_promoted_out_of_memory(kernel) -> None:
    ll = kernel.get_source("ll")
    main = ll[ll.index("define void @jitop_main"):]
    main = main[:main.index("\n}\n")]
    assert "alloca" not in main, "the C.local register tile should have been promoted to SSA values"
    assert any(f"<{n} x float>" in main for n in (8, 16, 32))


def test_inner_loop_is_fma_on_the_widest_registers(kernel) -> None:
    """FMAs on the target's widest registers (zmm with AVX-512, ymm with AVX2), read from its assembly."""
    widest = {64: "zmm", 32: "ymm"}[kernel.target.vector_bytes]
    asm = kernel.get_source("asm")
    fmas = [line for line in asm.splitlines() if "vfmadd" in line]
    assert fmas and all(widest in line for line in fmas)
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
