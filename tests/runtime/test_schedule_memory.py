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


@pytest.mark.parametrize("factor", [3, 8, 16])
def test_vectorizing_the_outer_loop_of_a_symbolic_split_writes_only_the_output(factor: int) -> None:
    """The inner loop's tail guard depends on the vectorized variable: it stays a per-lane mask (a loop
    partition once gave every lane lane 0's trip count, writing up to factor - 1 elements past the end)."""
    m = te.var("m")
    A = te.placeholder((m,), "float32", name="A")
    B = te.compute((m,), lambda j: A[j] * 2.0, name="B")
    s = jitop.create_schedule(B.op)
    jo, _ = s[B].split(B.op.axis[0], factor=factor)
    s[B].vectorize(jo)
    f = jitop.build(s, [A, B])
    for n in SIZES:
        a = np.random.default_rng(n).random(n).astype(np.float32)
        np.testing.assert_array_equal(_run_guarded(f, [a], (n,), np.float32), a * 2)


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
