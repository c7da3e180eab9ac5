"""Row groups on the GPU (jitop/graph/gpu_schedule.py): a layer norm or a softmax traced with
`@jitop.kernel(target="cuda")` is one kernel, a block per row computing the row's reductions and row-long
intermediates (shared memory; inlined where rows are too long for it or of a symbolic length) and the result's
row. A member read along more than one row makes its group stage by stage instead. Results equal numpy's on this machine's GPU,
or on the simulated one (tests/sim_gpu.py); tolerances: a row of n float32 values summed in any order."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop
import sim_gpu
from jitop.codegen.nvptx import check_ptx, ptxas_path
from jitop.graph.gpu_schedule import row_threads

SM90 = "cuda -arch=sm_90"
EPS = {np.float32: np.finfo(np.float32).eps, np.float64: np.finfo(np.float64).eps}


def layer_norm(x, g, b):
    mu = x.mean(axis=-1, keepdims=True)
    d = x - mu
    var = (d * d).mean(axis=-1, keepdims=True)
    return d / np.sqrt(var + 1e-5) * g + b


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def reversed_rows(x):
    """Each row reads its own sum and the mirrored row's: two rows of the sums per output row."""
    s = x.sum(axis=-1)
    return x * (s + s[::-1])[:, None]


def _args(fn, shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    if fn is layer_norm:
        return x, rng.standard_normal(shape[-1]).astype(dtype), rng.standard_normal(shape[-1]).astype(dtype)
    return (x,)


def _kernels(fn, args):
    from jitop.graph.gpu import compile_graph_gpu
    kf = jitop.kernel(fn, target=SM90)
    tr = kf.trace(list(args))
    return compile_graph_gpu(kf.__name__, tr.inputs, tr.names, tr.plan, tr.results, kf.gpu).function.built


def _check(fn, args, got) -> None:
    """Within a few ulps per element of a row's sum: n eps of the row's scale."""
    want = fn(*[a.astype(np.float64) for a in args])
    x = args[0]
    n = x.shape[-1]
    eps = EPS[x.dtype.type]
    scale = 1 + np.abs(want).max() + (np.abs(args[1]).max() * np.abs(x).max() if fn is layer_norm else 0)
    assert got.shape == want.shape and got.dtype == x.dtype
    np.testing.assert_allclose(got, want, rtol=0, atol=8 * (n + 8) * eps * scale)


@pytest.mark.usefixtures("private_cache")
@pytest.mark.parametrize("fn", [layer_norm, softmax])
@pytest.mark.parametrize("shape", [(9, 129), (2, 3, 768), (1, 1), (5, 1), (4, 2049)], ids=str)
def test_a_row_operator_is_one_kernel_equal_to_numpy(fn, shape, monkeypatch) -> None:
    args = _args(fn, shape)
    built = _kernels(fn, args)
    if shape[-1] > 1:  # (rows of one element index the row's values by a flat index: stage by stage)
        (kernel,) = built.kernels
        rows = int(np.prod(shape[:-1]))
        assert kernel.grid == (rows, 1, 1) and kernel.block == (row_threads(shape[-1]), 1, 1)
    if ptxas_path() is not None or os.environ.get("JITOP_REQUIRE_PTXAS") == "1":
        check_ptx(built.ptx, "sm_90")
    sim_gpu.gpu_or_simulated(monkeypatch)
    _check(fn, args, np.asarray(jitop.kernel(fn, target="cuda")(*args)))


@pytest.mark.usefixtures("private_cache")
@pytest.mark.parametrize("fn", [layer_norm, softmax])
def test_float64_rows(fn, monkeypatch) -> None:
    sim_gpu.gpu_or_simulated(monkeypatch)
    args = _args(fn, (6, 301), np.float64, seed=2)
    _check(fn, args, np.asarray(jitop.kernel(fn, target="cuda")(*args)))


@pytest.mark.usefixtures("private_cache")
def test_a_member_read_along_other_rows_is_computed_stage_by_stage(monkeypatch) -> None:
    args = _args(reversed_rows, (7, 50), seed=3)
    assert len(_kernels(reversed_rows, args).kernels) == 2  # the sums, then the product
    sim_gpu.gpu_or_simulated(monkeypatch)
    got = np.asarray(jitop.kernel(reversed_rows, target="cuda")(*args))
    x = args[0].astype(np.float64)
    want = reversed_rows(x)
    np.testing.assert_allclose(got, want, rtol=0, atol=4 * 50 * EPS[np.float32] * (np.abs(x).sum(-1).max() ** 2 + 1))


@pytest.mark.usefixtures("private_cache")
def test_rows_too_long_for_shared_memory_are_one_kernel_computing_members_again(monkeypatch) -> None:
    """Two row-long members (x - mu and its square's input) of 16k float32 need 128 KiB: more than a block's
    48 KiB of static shared memory. They are inlined: computed again where read, nothing in shared memory."""
    args = _args(layer_norm, (2, 1 << 14), seed=4)
    (kernel,) = _kernels(layer_norm, args).kernels
    assert kernel.grid == (2, 1, 1) and kernel.block == (256, 1, 1)
    assert ".shared = allocate(float32[1, " not in _loop_ir(layer_norm, args)
    sim_gpu.gpu_or_simulated(monkeypatch)
    _check(layer_norm, args, np.asarray(jitop.kernel(layer_norm, target="cuda")(*args)))


def masked_softmax(x, bias):
    """A decode step's attention weights: scores plus a bias row, softmax over a row whose length grows."""
    s = x + bias
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.usefixtures("private_cache")
@pytest.mark.parametrize("fn", [layer_norm, softmax, masked_softmax])
def test_a_symbolic_row_length_is_one_kernel_for_every_length(fn, monkeypatch) -> None:
    """The row length a symbol (a softmax over a growing cache): one block per row of REDUCE_THREADS threads,
    the row-long members inlined; the kernel serves every length, 1 and lengths past the threads included."""
    kf = jitop.kernel(fn, target=SM90, dynamic=True)
    lengths = (1, 2, 31, 256, 257, 600)
    arg_sets = [_args(fn, (3, n), seed=n) if fn is not masked_softmax
                else _args(softmax, (3, n), seed=n) + (np.random.default_rng(n).standard_normal(n).astype("f4"),)
                for n in lengths]
    tr = kf.trace(list(arg_sets[2]), dynamic={k: range(a.ndim) for k, a in enumerate(arg_sets[2])})
    from jitop.graph.gpu import compile_graph_gpu
    built = compile_graph_gpu(kf.__name__, tr.inputs, tr.names, tr.plan, tr.results, kf.gpu).function.built
    (kernel,) = built.kernels
    assert not isinstance(kernel.grid[0], int) and kernel.block == (256, 1, 1)  # a block per row, rows symbolic
    if ptxas_path() is not None or os.environ.get("JITOP_REQUIRE_PTXAS") == "1":
        check_ptx(built.ptx, "sm_90")
    sim_gpu.gpu_or_simulated(monkeypatch)
    run = jitop.kernel(fn, target="cuda", dynamic=True, fallback=False)
    for args in arg_sets:
        if fn is masked_softmax:
            x, bias = args
            want = masked_softmax(x.astype(np.float64), bias.astype(np.float64))
            got = np.asarray(run(*args))
            np.testing.assert_allclose(got, want, rtol=0, atol=8 * (x.shape[-1] + 8) * EPS[np.float32])
        else:
            _check(fn, args, np.asarray(run(*args)))
    assert run.traces == 2  # a length of 1 is a kernel of its own, every other length the symbolic one


@pytest.mark.usefixtures("private_cache")
@settings(max_examples=12, deadline=None)
@given(lead=st.lists(st.integers(1, 4), min_size=1, max_size=2), n=st.integers(1, 700),
       which=st.sampled_from(["layer_norm", "softmax"]))
def test_row_groups_equal_numpy_on_any_shape(lead, n, which) -> None:
    fn = {"layer_norm": layer_norm, "softmax": softmax}[which]
    args = _args(fn, (*lead, n), seed=n)
    with pytest.MonkeyPatch.context() as mp:
        sim_gpu.gpu_or_simulated(mp)
        _check(fn, args, np.asarray(jitop.kernel(fn, target="cuda", fallback=False)(*args)))


def attention_weights(q, k):
    s = q @ k.T * 0.125
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _over_a_growing_cache(monkeypatch, fn, launches: tuple[int, int], lengths, bound) -> None:
    """fn(q, k)'s kernels for sm_90 with the cache length k.shape[0] constant, then symbolic (`launches`), and
    its results on this machine's GPU (or the simulated one) at each of `lengths`, one trace for them all,
    within bound(n, k) of numpy's in float64."""
    rng = np.random.default_rng(8)
    q, k = rng.standard_normal((2, 64)).astype(np.float32), rng.standard_normal((20, 64)).astype(np.float32)
    from jitop.graph.gpu import compile_graph_gpu
    for dynamic, count in zip((None, {1: [0]}), launches):
        kf = jitop.kernel(fn, target=SM90)
        tr = kf.trace([q, k], dynamic=dynamic)
        built = compile_graph_gpu(kf.__name__, tr.inputs, tr.names, tr.plan, tr.results, kf.gpu).function.built
        assert len(built.kernels) == count
    sim_gpu.gpu_or_simulated(monkeypatch)
    run = jitop.kernel(fn, target="cuda", dynamic=True, fallback=False)
    for n in lengths:
        k = rng.standard_normal((n, 64)).astype(np.float32)
        want = fn(q.astype(np.float64), k.astype(np.float64))
        np.testing.assert_allclose(np.asarray(run(q, k)), want, rtol=0, atol=bound(n, k))
    assert run.traces == 1


@pytest.mark.usefixtures("private_cache")
def test_attention_over_a_growing_cache_is_its_scores_then_one_row_kernel(monkeypatch) -> None:
    """The scores q k^T are a row-long reduction, which cannot be inlined: with the cache length symbolic they
    are computed to memory first, and the softmax over them is one kernel (with a constant length, the scores
    are computed at the row too: one kernel in all)."""
    _over_a_growing_cache(monkeypatch, attention_weights, (1, 2), (3, 20, 300),
                          lambda n, k: 8 * (n + 64) * EPS[np.float32] * 8)


def heads_of_attention(q, k):
    """4 heads of 16 columns each, a Python loop over column slices (picoGPT's attention; k serves as v)."""
    return np.hstack([attention_weights(q[:, 16 * i:16 * (i + 1)], k[:, 16 * i:16 * (i + 1)])
                      @ k[:, 16 * i:16 * (i + 1)] for i in range(4)])


@pytest.mark.usefixtures("private_cache")
def test_heads_in_a_python_loop_launch_the_kernels_of_one_head(monkeypatch) -> None:
    """jitop.graph.batching computes the loop's copies at once: one head's kernels (3, or 4 with the cache length
    symbolic) and the product's copy into hstack's layout, not four times as many (13 and 17 as a loop); over a
    growing cache too; the results are numpy's."""
    _over_a_growing_cache(monkeypatch, heads_of_attention, (4, 5), (3, 20, 70),
                          lambda n, k: 8 * (n + 16) * EPS[np.float32] * 8 * np.abs(k).max())


def _loop_ir(fn, args) -> str:
    import gpu_sim
    return str(gpu_sim.lower_traced(jitop.kernel(fn, target=SM90), *args).func)


def mirrored_minus_max(x):
    """x is read at its own row (the max) and at the mirrored row: staged, one row would not do."""
    return x[::-1] - x.max(axis=-1, keepdims=True)


@pytest.mark.usefixtures("private_cache")
def test_an_input_several_stages_read_is_staged_in_shared_memory_once(monkeypatch) -> None:
    args = _args(layer_norm, (6, 500), seed=5)
    text = _loop_ir(layer_norm, args)
    assert "x.shared = allocate(float32[1, 500], 'shared')" in text  # read by the sum and by x - mean
    # x is read by the copy alone (its 256 threads' first pass and the tail): the group reads the copy
    assert [line.split(" = ")[1][:2] for line in text.splitlines() if " x[" in line] == ["x[", "x["]
    sim_gpu.gpu_or_simulated(monkeypatch)
    _check(layer_norm, args, np.asarray(jitop.kernel(layer_norm, target="cuda")(*args)))


@pytest.mark.usefixtures("private_cache")
def test_staging_is_dropped_where_it_does_not_fit_or_would_need_other_rows(monkeypatch) -> None:
    """Rows of 8000 float32: exp (32 KB) fits in 48 KB, exp and a copy of x (64 KB) do not. A group that reads
    the mirrored row of its input keeps its members at the row but reads the input from global memory."""
    wide = _args(softmax, (3, 8000), seed=6)
    mirrored = _args(mirrored_minus_max, (7, 40), seed=7)
    for fn, args in ((softmax, wide), (mirrored_minus_max, mirrored)):
        assert len(_kernels(fn, args).kernels) == 1
        assert ".shared = allocate(float32[1, " not in _loop_ir(fn, args).replace("exp.shared", "")
    sim_gpu.gpu_or_simulated(monkeypatch)
    _check(softmax, wide, np.asarray(jitop.kernel(softmax, target="cuda")(*wide)))
    got = np.asarray(jitop.kernel(mirrored_minus_max, target="cuda")(*mirrored))
    np.testing.assert_array_equal(got, mirrored_minus_max(*mirrored))


REDUCE = [lambda v: v.sum(axis=-1, keepdims=True), lambda v: v.max(axis=-1, keepdims=True),
          lambda v: v.mean(axis=-1, keepdims=True), lambda v: np.abs(v).min(axis=-1, keepdims=True)]
UNARY = [np.tanh, np.abs, lambda v: np.maximum(v, 0.5), lambda v: v * 0.5]


@st.composite
def row_programs(draw):
    """A random chain over x [lead..., n] and a row vector w [n]: elementwise steps, and steps that combine the
    value with a reduction of its rows (keepdims): row groups of any shape of members."""
    steps = draw(st.lists(st.tuples(st.sampled_from(["unary", "row", "vector"]), st.integers(0, 3)),
                          min_size=1, max_size=5))
    lead = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=2)))
    return steps, lead, draw(st.integers(2, 300))


def _program(steps):
    def f(x, w):
        v = x
        for kind, k in steps:
            if kind == "unary":
                v = UNARY[k](v)
            elif kind == "row":
                v = v - REDUCE[k](v) if k % 2 else v * (1.0 / (1.0 + np.abs(REDUCE[k](v))))
            else:
                v = v * w + x
        return v
    return f


@pytest.mark.usefixtures("private_cache")
@settings(max_examples=15, deadline=None)
@given(program=row_programs(), symbolic=st.booleans())
def test_random_row_programs_equal_numpy(program, symbolic) -> None:
    """`symbolic`: every dim traced as a symbol (the row-long members inlined, a block of 256 threads)."""
    steps, lead, n = program
    fn = _program(steps)
    rng = np.random.default_rng(n)
    x, w = rng.standard_normal((*lead, n)).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    with pytest.MonkeyPatch.context() as mp:
        sim_gpu.gpu_or_simulated(mp)
        got = np.asarray(jitop.kernel(fn, target="cuda", dynamic=symbolic or None, fallback=False)(x, w))
    want = fn(x.astype(np.float64), w.astype(np.float64))
    # each step: a row sum of n terms at most, so n eps per step of the values' scale
    scale = 1 + np.abs(want).max() + np.abs(x).sum(axis=-1).max() * (1 + np.abs(w).max()) ** len(steps)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=4 * len(steps) * (n + 8) * EPS[np.float32] * scale)
