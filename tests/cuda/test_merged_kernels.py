"""Kernels merged where one launch can do two (jitop/codegen/merge_kernels.py): a single-block kernel after
another of its block shape runs in it after a barrier; an independent kernel of the same launch shape runs beside
another. Checked on this machine's GPU, or on the simulated one (which reports races: a merge without its
barrier fails there), against numpy; the launches counted at the (simulated) driver."""
from __future__ import annotations

import numpy as np
import pytest

import gpu_sim
import jitop
import sim_gpu
from jitop.codegen.merge_kernels import merge_kernels
from jitop.codegen.nvptx import kernel_nests
from jitop.target import Target

SM90 = Target.from_string("cuda -arch=sm_90")


def layer_norm(x, g, b):
    mu = x.mean(axis=-1, keepdims=True)
    d = x - mu
    var = (d * d).mean(axis=-1, keepdims=True)
    return d / np.sqrt(var + 1e-5) * g + b


def grow_caches(x, g, b, w, k_cache, v_cache):
    """A decode step's first half: a layer norm of one row, a projection, both caches one row longer."""
    h = layer_norm(x, g, b) @ w
    k, v = np.split(h, 2, axis=-1)
    return np.vstack([k_cache, k]), np.vstack([v_cache, v])


def _inputs(rng, c=96, rows=5):
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    return [f32(1, c), 1 + 0.1 * f32(c), 0.1 * f32(c), 0.1 * f32(c, 2 * c), f32(rows, c), f32(rows, c)]


def test_a_one_row_layer_norm_and_two_cache_concatenations_take_fewer_launches(monkeypatch):
    """Without merging: the mean and centred row, then the variance (two single-block kernels); the projection;
    the two concatenations: five launches. Merged: three, and the results are numpy's."""
    gpu = sim_gpu.gpu_or_simulated(monkeypatch)
    args = _inputs(np.random.default_rng(5))
    got = jitop.kernel(grow_caches, target="cuda", fallback=False)(*args)
    for g, want in zip(got, grow_caches(*args)):
        # the new row: a layer norm (sums of 96) then a product of 96 terms, in float32
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=200 * np.finfo(np.float32).eps)
    if gpu is not None:
        assert len(gpu.launched) == 3


def test_merging_keeps_the_kernels_results_and_takes_out_launches(monkeypatch):
    sim_gpu.install(monkeypatch)
    args = _inputs(np.random.default_rng(6))
    kf = jitop.kernel(grow_caches, target="cuda", fallback=False)
    traced = gpu_sim.lower_traced(kf, *args)
    unmerged = _unmerged(kf, args)
    assert len(kernel_nests(unmerged)) == len(kernel_nests(traced.func)) + 2
    outs = [np.empty_like(o) for o in traced.outputs]
    gpu_sim.run(unmerged, *traced.arrays, *outs)
    gpu_sim.run(traced.func, *traced.arrays, *traced.outputs)
    for a, b in zip(outs, traced.outputs):
        np.testing.assert_array_equal(a, b)  # the same arithmetic in the same order


def _unmerged(kf, args):
    """The function `lower_traced` gives, lowered without the merge."""
    import jitop.graph.gpu as graph_gpu
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(graph_gpu, "merge_kernels", lambda func, target, notes=None: func)
        return gpu_sim.lower_traced(kf, *args).func
    finally:
        mp.undo()


def test_a_kernel_reading_another_s_result_is_not_moved_before_it():
    """Two light kernels of one launch shape where the second reads the first's result (across blocks): they
    stay two launches."""
    from jitop import te
    n = 1000
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((n,), lambda i: B[(i + 500) % n] + 1.0, name="C")
    s = jitop.create_schedule(C.op)
    for T in (B, C):
        bx, tx = s[T].split(T.op.axis[0], factor=128)
        s[T].bind(bx, te.thread_axis("blockIdx.x"))
        s[T].bind(tx, te.thread_axis("threadIdx.x"))
    func = jitop.lower(s, [A, B, C])
    assert len(kernel_nests(merge_kernels(func, SM90))) == 2
    D = te.compute((n,), lambda i: A[i] + 1.0, name="D")  # independent of B: merged
    s = jitop.create_schedule([B.op, D.op])
    for T in (B, D):
        bx, tx = s[T].split(T.op.axis[0], factor=128)
        s[T].bind(bx, te.thread_axis("blockIdx.x"))
        s[T].bind(tx, te.thread_axis("threadIdx.x"))
    func = jitop.lower(s, [A, B, D])
    merged = merge_kernels(func, SM90)
    assert len(kernel_nests(merged)) == 1
    a = np.arange(n, dtype=np.float32)
    b, d = np.empty_like(a), np.empty_like(a)
    gpu_sim.run(merged, a, b, d)
    np.testing.assert_array_equal(b, a * 2)
    np.testing.assert_array_equal(d, a + 1)


def test_a_single_block_kernel_reading_what_another_thread_wrote_runs_after_a_barrier():
    """Two kernels of one block each, the second reading the first's result mirrored (another thread's element):
    merged into one launch whose barrier orders them (the simulator reports the race without it)."""
    from jitop import te
    n = 128
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((n,), lambda i: B[n - 1 - i] + 1.0, name="C")
    s = jitop.create_schedule(C.op)
    for T in (B, C):
        s[T].bind(T.op.axis[0], te.thread_axis("threadIdx.x"))
    merged = merge_kernels(jitop.lower(s, [A, B, C]), SM90)
    assert len(kernel_nests(merged)) == 1
    a = np.arange(n, dtype=np.float32)
    b, c = np.empty_like(a), np.empty_like(a)
    gpu_sim.run(merged, a, b, c)
    np.testing.assert_array_equal(c, a[::-1] * 2 + 1)


def _rows(m, n, read_row):
    """B = 2 A, then C[i, j] = B[read_row(i), n - 1 - j] + 1: a block per row, a thread per column, each kernel."""
    from jitop import te
    A = te.placeholder((m, n), name="A")
    B = te.compute((m, n), lambda i, j: A[i, j] * 2.0, name="B")
    C = te.compute((m, n), lambda i, j: B[read_row(i), n - 1 - j] + 1.0, name="C")
    s = jitop.create_schedule(C.op)
    for T in (B, C):
        s[T].bind(T.op.axis[0], te.thread_axis("blockIdx.x"))
        s[T].bind(T.op.axis[1], te.thread_axis("threadIdx.x"))
    return jitop.lower(s, [A, B, C])


def test_kernels_whose_blocks_touch_only_their_own_rows_run_in_one_launch():
    """Each block reads its own row of B, mirrored (another thread's element): one launch, a barrier between
    the two bodies (the simulator reports the race without it). A kernel reading the next row (another block's)
    stays a launch of its own."""
    m, n = 5, 64
    merged = merge_kernels(_rows(m, n, lambda i: i), SM90)
    assert len(kernel_nests(merged)) == 1
    a = np.arange(m * n, dtype=np.float32).reshape(m, n)
    b, c = np.empty_like(a), np.empty_like(a)
    gpu_sim.run(merged, a, b, c)
    np.testing.assert_array_equal(c, a[:, ::-1] * 2 + 1)
    assert len(kernel_nests(merge_kernels(_rows(m, n, lambda i: (i + 1) % m), SM90))) == 2
