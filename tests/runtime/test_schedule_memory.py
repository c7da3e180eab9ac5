"""Expert schedules (te + schedule primitives) built and run: every output element right and nothing written
outside the output (each output is a view of a larger buffer whose tail holds sentinels), at several sizes of
a symbolic dimension. Found by fuzzing the schedule API."""
from __future__ import annotations

import numpy as np
import pytest

import jitop
from jitop import te

SIZES = [1, 5, 8, 16, 33, 100]
SENTINEL = -7.0


def _run_guarded(f, inputs: list[np.ndarray], out_shape: tuple[int, ...], dtype) -> np.ndarray:
    """f(*inputs, out) with `out` a view of a buffer 4096 elements longer; asserts nothing past it changed."""
    size = int(np.prod(out_shape))
    big = np.full(size + 4096, SENTINEL, dtype)
    out = big[:size].reshape(out_shape)
    f(*inputs, out)
    assert (big[size:] == SENTINEL).all(), f"{int((big[size:] != SENTINEL).sum())} elements written past the output"
    return out


def _doubling(schedule) -> None:
    """B = A * 2 over a symbolic m, `schedule(s, B)` applied, run at every size with a guarded output."""
    m = te.var("m")
    A = te.placeholder((m,), "float32", name="A")
    B = te.compute((m,), lambda j: A[j] * 2.0, name="B")
    s = jitop.create_schedule(B.op)
    schedule(s, B)
    f = jitop.build(s, [A, B])
    for n in SIZES:
        a = np.random.default_rng(n).random(n).astype(np.float32)
        np.testing.assert_array_equal(_run_guarded(f, [a], (n,), np.float32), a * 2)


@pytest.mark.parametrize("factor", [3, 8, 16])
def test_vectorizing_the_outer_loop_of_a_symbolic_split_writes_only_the_output(factor: int) -> None:
    """The inner loop's tail guard depends on the vectorized variable: it stays a per-lane mask (a loop
    partition once gave every lane lane 0's trip count, writing up to factor - 1 elements past the end)."""
    _doubling(lambda s, B: s[B].vectorize(s[B].split(B.op.axis[0], factor=factor)[0]))


def test_the_same_in_two_dimensions_with_a_staged_producer() -> None:
    m = te.var("m")
    A = te.placeholder((6, m), "float64", name="A")
    T = te.compute((6, m), lambda i, j: A[i, j] + 1.0, name="T")
    B = te.compute((6, m), lambda i, j: T[i, j] * 3.0, name="B")
    s = jitop.create_schedule(B.op)
    jo, _ = s[B].split(B.op.axis[1], factor=4)
    s[B].vectorize(jo)
    s[T].compute_at(s[B], B.op.axis[0])
    f = jitop.build(s, [A, B])
    for n in SIZES:
        a = np.random.default_rng(n).random((6, n))
        np.testing.assert_allclose(_run_guarded(f, [a], (6, n), np.float64), (a + 1) * 3)


def test_unrolling_the_outer_loop_of_a_symbolic_split() -> None:
    """An unrolled loop's copies substitute its variable into inner loops' trip counts too (split(nparts=8) of a
    symbolic axis: the inner count named j.outer, and the build failed with KeyError: j.outer)."""
    _doubling(lambda s, B: s[B].unroll(s[B].split(B.op.axis[0], nparts=8)[0]))


def test_a_reduction_computed_at_an_unrolled_loop() -> None:
    n = te.var("n")
    A = te.placeholder((n, 16), "float32", name="A")
    k = te.reduce_axis((0, n), name="k")
    D = te.compute((16,), lambda j: te.sum(A[k, j], axis=k), name="D")
    E = te.compute((16,), lambda j: D[j] * 2.0, name="E")
    s = jitop.create_schedule(E.op)
    s[E].unroll(E.op.axis[0])
    s[D].split(k, factor=4)
    s[D].split(D.op.axis[0], factor=4)
    s[D].compute_at(s[E], E.op.axis[0])
    f = jitop.build(s, [A, E])
    for rows in SIZES:
        a = np.random.default_rng(rows).random((rows, 16)).astype(np.float32)
        np.testing.assert_allclose(_run_guarded(f, [a], (16,), np.float32), 2 * a.sum(0), rtol=1e-5)


def test_a_parallel_loop_after_a_buffer_allocated_in_a_loop() -> None:
    """A stage of symbolic size computed at a serial loop is malloc'd inside it; a parallel loop later in the
    function packs the pointers it uses, not that one (LLVM refused the module: 'does not dominate all uses')."""
    m = te.var("m")
    A = te.placeholder((4, m), "float64", name="A")
    T = te.compute((4, m), lambda i, j: A[i, j] * 2.0, name="T")
    B = te.compute((4, m), lambda i, j: T[i, j] + 1.0, name="B")
    C = te.compute((4, m), lambda i, j: B[i, j] + 1.0, name="C")
    s = jitop.create_schedule(C.op)
    s[T].compute_at(s[B], B.op.axis[0])
    s[C].parallel(C.op.axis[0])
    f = jitop.build(s, [A, C])
    for n in SIZES:
        a = np.random.default_rng(n).random((4, n))
        np.testing.assert_allclose(_run_guarded(f, [a], (4, n), np.float64), a * 2 + 2)


@pytest.mark.parametrize("cuts", [0, 3, None])
def test_past_the_budget_of_symbolic_cuts_guards_stay_guards(cuts, monkeypatch) -> None:
    """Nested splits of one symbolic axis under a compute_at: each symbolic cut copies a loop body, so past
    SYMBOLIC_CUTS per function the guards stay (the lowering grew exponentially: 7 s for five splits). With no
    cuts at all, or a few, or the default number, the kernel computes the same."""
    from jitop.tir import passes
    if cuts is not None:
        monkeypatch.setattr(passes, "SYMBOLIC_CUTS", cuts)
    m = te.var("m")
    A = te.placeholder((m,), "float32", name="A")
    B = te.compute((m,), lambda j: A[j] + 1.0, name="B")
    C = te.compute((m,), lambda j: B[j] * 2.0, name="C")
    s = jitop.create_schedule(C.op)
    _, ji = s[C].split(C.op.axis[0], factor=32)
    x1, x2 = s[B].split(B.op.axis[0], factor=4)
    _, x4 = s[B].split(x1, factor=3)
    s[B].split(x2, factor=32)
    s[B].split(x4, factor=3)
    s[B].compute_at(s[C], ji)
    f = jitop.build(s, [A, C])
    for n in SIZES:
        a = np.random.default_rng(n).random(n).astype(np.float32)
        np.testing.assert_array_equal(_run_guarded(f, [a], (n,), np.float32), (a + 1) * 2)
