"""The intermediates' arena (jitop.tir.storage): buffers live at the same time never share a byte, dead ones'
bytes are reused, every offset is aligned, and traced programs compute numpy's result with it."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

import jitop
from jitop.dtypes import as_dtype
from jitop.tir.nodes import Buffer
from jitop.tir.storage import ALIGN, lifetimes, place

F32 = as_dtype("float32")


def _buffers(sizes: list[int]) -> list[Buffer]:
    return [Buffer(f"b{k}", F32, (n,), "param") for k, n in enumerate(sizes)]


def _assert_disjoint_while_live(bufs: list[Buffer], spans: dict, arena) -> None:
    for k, a in enumerate(bufs):
        assert arena.offsets[a] % ALIGN == 0
        assert arena.offsets[a] + 4 * a.shape[0] <= arena.size
        for b in bufs[k + 1:]:
            live_together = spans[a][0] <= spans[b][1] and spans[b][0] <= spans[a][1]
            apart = (arena.offsets[a] + 4 * a.shape[0] <= arena.offsets[b]
                     or arena.offsets[b] + 4 * b.shape[0] <= arena.offsets[a])
            assert apart or not live_together, (a, b, spans[a], spans[b], arena)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 12), st.integers(0, 4)), min_size=1, max_size=24))
def test_buffers_live_together_never_overlap(specs) -> None:
    bufs = _buffers([n for n, _, _ in specs])
    spans = {b: (start, start + length) for b, (_, start, length) in zip(bufs, specs)}
    arena = place(bufs, spans)
    _assert_disjoint_while_live(bufs, spans, arena)
    # never more than one buffer each, and at least the largest set of buffers live at one nest
    assert arena.size <= sum(-(-4 * b.shape[0] // ALIGN) * ALIGN for b in bufs)
    for nest in range(17):
        live = sum(4 * b.shape[0] for b in bufs if spans[b][0] <= nest <= spans[b][1])
        assert arena.size >= live


def test_a_chain_reuses_the_bytes_of_dead_buffers() -> None:
    """a -> b -> c -> d, each read only by the next: two buffers' worth of bytes serve all four."""
    bufs = _buffers([1000] * 4)
    spans = {b: (k, k + 1) for k, b in enumerate(bufs)}
    arena = place(bufs, spans)
    assert arena.size == 2 * 4032  # 4000 bytes rounded up to whole cache lines
    assert arena.offsets[bufs[0]] == arena.offsets[bufs[2]] and arena.offsets[bufs[1]] == arena.offsets[bufs[3]]


def _chain(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    # a matmul's operand is read once per panel: each tanh(...) is an intermediate of its own
    for _ in range(4):
        x = np.tanh(x @ w)
    return x @ w


def _bound(x: np.ndarray, w: np.ndarray) -> float:
    """float32 error of the chain: per matmul, k terms of eps each (tanh is 1-Lipschitz), carried through
    the next products by |w|'s norm."""
    k, eps, scale = w.shape[0], float(np.finfo(np.float32).eps), float(np.abs(w).sum(axis=0).max())
    err, size = 0.0, float(np.abs(x).sum(axis=1).max())
    for _ in range(5):
        err = err * scale + 2 * k * eps * size * scale
        size = 1.0 * w.shape[0]
    return err


def _scratch_params(kernel, *args) -> list:
    (overload,) = [ov for ov in kernel.dispatcher.overloads() if ov.exe is not None]
    exe = overload.exe
    params = exe.module.params
    return params[len(params) - exe.plan.n_scratch:]


def test_a_traced_chain_computes_numpys_result_in_an_arena() -> None:
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((37, 53)).astype(np.float32), (rng.standard_normal((53, 53)) / 8).astype(np.float32)
    f = jitop.kernel(_chain)
    got = f(x, w)
    want = _chain(x.astype(np.float64), w.astype(np.float64))
    assert np.max(np.abs(got - want)) <= _bound(x, w)
    scratch = _scratch_params(f, x, w)
    assert len(scratch) == 1 and scratch[0].dtype == np.uint8  # one arena instead of one buffer each
    exe = next(ov for ov in f.dispatcher.overloads() if ov.exe is not None).exe
    func, arena = exe.func, exe.func.attrs["arena"]
    assert f"storage: {len(arena.offsets)} intermediates share one arena" in exe.decisions[0]  # explain says so
    assert len(arena.offsets) >= 3
    total = sum(b.size * b.dtype.itemsize for b in arena.offsets)
    assert arena.size < total  # some bytes serve two intermediates
    spans = lifetimes(func.body, list(arena.offsets))
    _assert_disjoint_after_rounding(arena, spans)
    np.testing.assert_array_equal(f(x, w), got)  # the second call reuses the arena: the same answer


def _assert_disjoint_after_rounding(arena, spans) -> None:
    bufs = list(arena.offsets)
    for k, a in enumerate(bufs):
        for b in bufs[k + 1:]:
            if spans[a][0] <= spans[b][1] and spans[b][0] <= spans[a][1]:
                end_a = arena.offsets[a] + a.size * a.dtype.itemsize
                end_b = arena.offsets[b] + b.size * b.dtype.itemsize
                assert end_a <= arena.offsets[b] or end_b <= arena.offsets[a]


def test_symbolic_intermediates_keep_their_own_buffers() -> None:
    f = jitop.kernel(_chain, dynamic=True)
    w = (np.random.default_rng(1).standard_normal((11, 11)) / 4).astype(np.float32)
    for rows in (5, 9, 30):
        x = np.random.default_rng(rows).standard_normal((rows, 11)).astype(np.float32)
        assert np.max(np.abs(f(x, w) - _chain(x.astype(np.float64), w.astype(np.float64)))) <= _bound(x, w)
