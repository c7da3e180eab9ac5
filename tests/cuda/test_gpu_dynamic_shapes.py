"""`@jitop.kernel(target="cuda")` with symbolic shapes: a dim that varied is traced as a symbol and one GPU
function serves every later size (its grid, its outputs and workspaces sized at the call), numpy or device
arrays alike. Results are numpy's at every size; on this machine's GPU, else on the simulated one."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import jitop
import sim_gpu
from jitop.graph.gpu import compile_graph_gpu
from jitop.runtime.cuda import memory

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "graph"))
from test_dynamic_shapes import chain, layer_norm, softmax  # noqa: E402

F4 = np.float32
EPS32 = np.finfo(F4).eps
SIZES = [2, 3, 7, 33, 64, 257]


def mlp(x, w):
    return np.maximum(x @ w, 0)


def close(got, want, terms: int) -> None:
    got = np.asarray(got)
    assert got.dtype == want.dtype and got.shape == want.shape
    bound = 8 * max(terms, 1) * EPS32
    np.testing.assert_allclose(got, want, rtol=bound, atol=bound)


def arguments(fn, n: int, shape, rng):
    s = tuple(n if d is None else d for d in shape)
    xs = [rng.standard_normal(s).astype(F4)]
    if fn is chain:
        xs.append(rng.standard_normal(s).astype(F4))
    elif fn is layer_norm:
        xs += [rng.standard_normal(s[-1]).astype(F4), rng.standard_normal(s[-1]).astype(F4)]
    elif fn is mlp:
        xs.append(rng.standard_normal((s[-1], 9)).astype(F4))
    return xs, s


@pytest.mark.parametrize("fn, shape", [(chain, (None,)), (softmax, (None, 33)), (softmax, (5, None)),
                                       (layer_norm, (None, 64)), (mlp, (None, 20)), (mlp, (6, None))],
                         ids=["chain", "softmax-rows", "softmax-row-length", "layer-norm-rows", "mlp-rows", "mlp-k"])
def test_a_dim_that_varies_becomes_symbolic_and_later_sizes_trace_nothing(fn, shape, monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    k = jitop.kernel(fn, target="cuda", fallback=False)
    rng = np.random.default_rng(1)
    for n in SIZES:
        xs, s = arguments(fn, n, shape, rng)
        close(k(*xs), fn(*xs), s[-1])
    buckets = 2 if fn is mlp and shape[0] is None else 1  # a symbolic matmul row count: up to 16, and more
    assert k.traces == 1 + buckets, k.policy.refused()  # the first size, then the symbolic traces
    assert not k.policy.refused()
    symbolic = [ov for ov in k.dispatcher.overloads() if ov.accepts is not None]
    assert len(symbolic) >= 1 and all(ov.exe.function.symbols for ov in symbolic)


@pytest.mark.parametrize("n", [0, 1])
def test_sizes_0_and_1_are_kernels_of_their_own_beside_the_symbolic_one(n, monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    k = jitop.kernel(chain, target="cuda", dynamic=True, fallback=False)
    rng = np.random.default_rng(2)
    for size in (5, n, 9):
        a, b = rng.standard_normal(size).astype(F4), rng.standard_normal(size).astype(F4)
        close(k(a, b), chain(a, b), 4)
    assert k.traces == 2


def test_device_arrays_of_a_new_size_are_served_by_the_symbolic_function(monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    k = jitop.kernel(softmax, target="cuda", dynamic=True, fallback=False)
    rng = np.random.default_rng(3)
    for n in (4, 11, 29):
        x = rng.standard_normal((n, 40)).astype(F4)
        got = k(memory.to_device(x))
        assert isinstance(got, memory.DeviceArray) and got.shape == (n, 40)
        close(got.get(), softmax(x), 40)
    assert k.traces == 1


def test_numpy_and_device_arguments_mixed_are_served_and_each_size_is_checked_once(monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    k = jitop.kernel(mlp, target="cuda", dynamic=True, fallback=False)
    rng = np.random.default_rng(4)
    w = rng.standard_normal((20, 9)).astype(F4)
    dw = memory.to_device(w)
    for n in (3, 17):  # traced with the row count symbolic: up to 16 rows, and more
        k(rng.standard_normal((n, 20)).astype(F4), w)
    asked = []
    for ov in k.dispatcher.overloads():
        if ov.accepts is not None:
            monkeypatch.setattr(ov, "accepts", lambda leaves, was=ov.accepts: asked.append(leaves[0].shape)
                                or was(leaves))
    for n in (40, 5, 40, 5, 40, 18):
        x = rng.standard_normal((n, 20)).astype(F4)
        got = k(x, dw)  # a host array beside a device array: the result stays on the device
        assert isinstance(got, memory.DeviceArray)
        close(got.get(), mlp(x, w), 20)
    assert sorted(set(asked)) == [(5, 20), (18, 20), (40, 20)] and len(asked) <= 2 * 3  # once per size and overload
    assert k.traces == 2


def test_a_cnn_of_a_varying_batch_is_one_gpu_function(monkeypatch):
    """A ResNet stem and block at batches 2, 3 and 5: one symbolic function (the convolutions implicit GEMMs of a
    symbolic batch, the padded max pool symbolic too), equal to the CPU's float64 result within the sums' bounds."""
    sim_gpu.gpu_or_simulated(monkeypatch)
    rng = np.random.default_rng(9)
    w1, w2 = rng.standard_normal((8, 3, 3, 3)).astype(F4), rng.standard_normal((8, 8, 3, 3)).astype(F4)

    def cnn(x):
        h = jitop.max_pool2d(np.maximum(jitop.conv2d(x, w1, stride=2, padding=1), 0), 3, stride=2, padding=1)
        return jitop.global_avg_pool2d(np.maximum(jitop.conv2d(h, w2, padding=1) + h, 0))
    k = jitop.kernel(cnn, target="cuda", fallback=False)
    for n in (2, 3, 5):
        x = rng.standard_normal((n, 3, 12, 10)).astype(F4)
        want = cnn(x.astype(np.float64)).astype(F4)  # jitop's CPU kernels in float64
        close(k(x), want, 8 * 9 * 27)  # the second conv's 72 terms of values summing the first's 27
    assert k.traces == 2 and not k.policy.static and not k.policy.refused()


def test_a_decode_loop_with_a_growing_kv_cache_compiles_twice(monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    import bench_shapes as bs
    monkeypatch.setattr(bs, "C", 32)
    monkeypatch.setattr(bs, "HEADS", 2)
    rng = np.random.default_rng(5)
    layers, embed = bs.decode_weights(rng)
    pre = jitop.kernel(bs.prefill, target="cuda", fallback=False)
    step = jitop.kernel(bs.decode_step, target="cuda", fallback=False)
    want, _ = bs.generate(bs.prefill, bs.decode_step, layers, embed, list(range(8)), 8)
    got, _ = bs.generate(pre, step, layers, embed, list(range(8)), 8)
    assert got == want
    assert step.traces == 2 and step.dispatcher.compiles <= 2  # it compiled for every cache length


def test_tied_dims_are_checked_and_a_mismatch_raises_numpys_error(monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    k = jitop.kernel(lambda a, b: a * b + 1, target="cuda", dynamic=True)
    for n in (4, 9, 30):
        a, b = np.arange(n, dtype=F4), np.full(n, 2, F4)
        np.testing.assert_array_equal(k(a, b), a * b + 1)
    assert k.traces == 1
    (ov,) = k.dispatcher.overloads()
    assert [p.shape for p in ov.exe.function.params[:2]] == [("a_0",), ("a_0",)]  # b_0 := a_0
    with pytest.raises(ValueError, match="broadcast"):
        k(np.ones(4, F4), np.ones(5, F4))


def test_a_branch_on_a_size_is_a_guard_with_a_function_per_side(monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)

    def f(x):
        if x.shape[0] > 10:
            return x * 2
        return x - 1
    k = jitop.kernel(f, target="cuda", dynamic=True)
    for n in (4, 20, 5, 30, 10, 11):
        x = np.arange(n, dtype=F4)
        np.testing.assert_array_equal(k(x), f(x))
    assert k.traces == 2
    guards = sorted(g for ov in k.dispatcher.overloads() for g, _ in ov.exe.guards if g != "x_0 >= 2")
    assert guards == ["-x_0 + 10 >= 0", "x_0 - 11 >= 0"]


def test_accepts_checks_ranks_dtypes_ties_and_guards():
    k = jitop.kernel(lambda a, b: (a + b).sum(axis=-1), target="cuda -arch=sm_90")
    x = np.ones((5, 7), F4)
    tr = k.trace([x, x], None, {0: [0, 1], 1: [0, 1]})
    exe = compile_graph_gpu("f", tr.inputs, tr.names, tr.plan, tr.results, k.gpu, tr.shape_guards)
    assert exe.symbolic
    fits = lambda *xs: exe.accepts(list(xs))  # noqa: E731
    assert fits(np.ones((3, 9), F4), np.ones((3, 9), F4))
    assert not fits(np.ones((3, 9), F4), np.ones((3, 8), F4))      # b's dims are tied to a's
    assert not fits(np.ones((3, 9), F4), np.ones((3, 9), np.float64))
    assert not fits(np.ones(9, F4), np.ones(9, F4))                # rank
    assert not fits(np.ones((1, 9), F4), np.ones((1, 9), F4))      # a symbol is at least 2 (guard)


def test_a_symbolic_function_is_compiled_once_then_read_from_the_disk_cache(monkeypatch):
    import jitop.graph.gpu as gpu
    compiled = []
    real = gpu.compile_gpu_func
    monkeypatch.setattr(gpu, "compile_gpu_func", lambda func, target: compiled.append(1) or real(func, target))

    def shifted(x):  # a function no other test compiles: its first compile is a miss
        return np.abs(x - x.mean(-1, keepdims=True)) * 1.25

    k = jitop.kernel(shifted, target="cuda -arch=sm_90")
    tr = k.trace([np.ones((3, 77), F4)], None, {0: [0]})
    a, b = (compile_graph_gpu("shifted", tr.inputs, tr.names, tr.plan, tr.results, k.gpu, tr.shape_guards)
            for _ in range(2))
    assert len(compiled) == 1 and b.function.built == a.function.built
    assert b.symbolic and b.accepts([np.ones((50, 77), F4)]) and not b.accepts([np.ones((50, 76), F4)])


def test_explain_shows_the_symbols_and_the_grid_they_size(monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    k = jitop.kernel(softmax, target="cuda")
    for n in (3, 4):
        k(np.ones((n, 40), F4))
    text = k.explain(np.ones((7, 40), F4))
    assert "in-memory cache hit" in text  # size 7: the symbolic function
    assert "x_0 = x dim 0 (traced at 4): x dim 0: 3 at one call, 4 at another" in text
    assert "grid ('x_0', 1, 1)" in text


def test_captured_weights_and_a_symbolic_batch_use_the_sgemm_template(monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    rng = np.random.default_rng(8)
    w, b = rng.standard_normal((20, 33)).astype(F4), rng.standard_normal(33).astype(F4)

    def dense(x):
        return np.maximum(x @ w + b, 0)
    k = jitop.kernel(dense, target="cuda", fallback=False)
    for n in (20, 21, 40, 300, 3, 17, 5):  # two row buckets: up to 16 rows and more
        x = rng.standard_normal((n, 20)).astype(F4)
        close(k(x), dense(x), 21)
    assert k.traces == 3, k.traces  # it traced every new size (its captured weights made it guarded)
    text = k.explain(rng.standard_normal((50, 20)).astype(F4))
    assert "template cuda.matmul" in text and "maximum is computed from cuda.matmul's register tile" in text
    assert "grid (1, '(x_0 + 63) // 64', 1)" in text  # the SGEMM with symbolic rows, not the 16x16 schedule
    w = rng.standard_normal((20, 33)).astype(F4)  # rebound: traced again with it
    for n in (50, 51):
        x = rng.standard_normal((n, 20)).astype(F4)
        close(k(x), dense(x), 21)


@pytest.mark.parametrize("varying", [0, 1], ids=["batch", "tokens"])
def test_a_dense_layer_of_a_varying_batch_or_length_is_one_sgemm_with_its_epilogue(varying, monkeypatch):
    """[batch, tokens, k] @ [k, n] + bias, activation: the SGEMM of the stacked rows, symbolic, with the
    elementwise tail written from its register tile (a symbolic batch was refused: traced per shape)."""
    sim_gpu.gpu_or_simulated(monkeypatch)
    rng = np.random.default_rng(9)
    w, b = rng.standard_normal((20, 33)).astype(F4), rng.standard_normal(33).astype(F4)

    def dense(x):
        return np.maximum(x @ w + b, 0) * 2
    k = jitop.kernel(dense, target="cuda", fallback=False)
    for n in (20, 21, 40, 23):
        shape = (n, 7, 20) if varying == 0 else (3, n, 20)
        x = rng.standard_normal(shape).astype(F4)
        close(k(x), dense(x), 21)
    assert k.traces == 2 and not k.policy.refused(), k.policy.refused()
    text = k.explain(rng.standard_normal((50, 7, 20) if varying == 0 else (3, 50, 20)).astype(F4))
    assert "in-memory cache hit" in text and "multiply is computed from cuda.matmul's register tile" in text


def append_and_score(cache, row, q):
    """A decode step's cache update and attention scores: the cache one row longer, each of 4 heads' scores."""
    cache = np.vstack([cache, row])
    heads = [q[:, h * 16:(h + 1) * 16] @ cache[:, h * 16:(h + 1) * 16].T for h in range(4)]
    return cache, np.stack(heads)


@pytest.mark.usefixtures("private_cache")
def test_a_growing_cache_s_kernels_carry_no_run_time_checks(monkeypatch):
    """Every access of the symbolic-length kernels is proved in bounds (the concatenation's rows f // 64 past the
    cache, the heads g // (n + 1) and rows g % (n + 1) of the scores): no run-time check, so a call does not read
    an error flag back from the GPU (a synchronization per call). Results equal numpy's at several lengths."""
    rng = np.random.default_rng(12)
    kf = jitop.kernel(append_and_score, target="cuda -arch=sm_90", dynamic={"cache": (0,)}, fallback=False)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((7, 64), (1, 64), (1, 64))]
    tr = kf.trace(args, dynamic={0: [0]})
    function = compile_graph_gpu(kf.__name__, tr.inputs, tr.names, tr.plan, tr.results, kf.gpu).function
    assert function.built.checked == () and not function.built.error_symbol
    sim_gpu.gpu_or_simulated(monkeypatch)
    run = jitop.kernel(append_and_score, target="cuda", dynamic={"cache": (0,)}, fallback=False)
    for n in (7, 2, 12):
        args = [rng.standard_normal(s).astype(np.float32) for s in ((n, 64), (1, 64), (1, 64))]
        (cache, scores), (want_cache, want_scores) = run(*args), append_and_score(*args)
        np.testing.assert_array_equal(np.asarray(cache), want_cache)
        close(np.asarray(scores), want_scores, 16)
    assert run.traces == 1
