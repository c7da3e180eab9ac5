"""The intermediates' arena (jitop.tir.storage): buffers live at the same time never share a byte, dead ones'
bytes are reused, every offset is aligned, and traced programs compute numpy's result with it."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop
from jitop.dtypes import as_dtype
from jitop.schedule.schedule import ForKind
from jitop.te.expr import const, var
from jitop.tir.nodes import Buffer, For, IfThenElse, Seq, Store
from jitop.tir.storage import ALIGN, in_place, lifetimes, place

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


# ** outputs written over their input in place **

def _elementwise(out: Buffer, value) -> For:
    return For(I, const(16), ForKind.SERIAL, Store(out, (I,), value))


def _fill(buf: Buffer) -> For:
    return _elementwise(buf, const(0.0, "float32"))


I = var("i")
ONE = const(1.0, "float32")


def _in_place(nest) -> dict:
    r, o = _buffers([16, 16])
    body = Seq((_fill(r), nest(r, o)))
    return in_place(body, [r, o], lifetimes(body, [r, o]))


def test_an_output_that_reads_its_input_only_at_its_own_elements_takes_its_bytes() -> None:
    assert len(_in_place(lambda r, o: _elementwise(o, r.load((I,)) + ONE))) == 1


@pytest.mark.parametrize("nest", [
    lambda r, o: _elementwise(o, r.load((15 - I,)) + ONE),                      # another element
    lambda r, o: Seq((_elementwise(o, r.load((I,))), _elementwise(o, o.load((I,)) + r.load((0 * I,))))),
    lambda r, o: Seq((_fill(o), _elementwise(o, o.load((I,)) + r.load((I,))))),  # o written before r is read
    lambda r, o: Seq((_elementwise(o, r.load((I,))), _elementwise(r, ONE))),     # r stored to
    lambda r, o: IfThenElse(r.load((const(0),)) > ONE, _elementwise(o, r.load((I,)))),  # r read in a guard
], ids=["other-element", "read-again", "written-first", "input-written", "read-in-a-guard"])
def test_an_output_that_could_overwrite_an_unread_element_keeps_its_own_bytes(nest) -> None:
    assert _in_place(nest) == {}


def test_an_input_of_another_shape_is_not_overwritten() -> None:
    """r[i, j] and o[i, j] of shapes (4, 4) and (2, 8): as many bytes, but the same indices are other bytes."""
    r, o = Buffer("r", F32, (4, 4), "param"), Buffer("o", F32, (2, 8), "param")
    i, j = var("i"), var("j")
    fill = For(i, const(16), ForKind.SERIAL, Store(r, (i // 4, i % 4), ONE))
    nest = For(i, const(2), ForKind.SERIAL, For(j, const(4), ForKind.SERIAL, Store(o, (i, j), r.load((i, j)))))
    body = Seq((fill, nest))
    assert in_place(body, [r, o], lifetimes(body, [r, o])) == {}


def test_an_input_read_by_a_later_nest_is_not_overwritten() -> None:
    """o may not take r's bytes (p reads r later); p, the last reader of both at its own elements, may."""
    r, o, p = _buffers([16, 16, 16])
    body = Seq((_fill(r), _elementwise(o, r.load((I,)) + ONE), _elementwise(p, r.load((I,)) + o.load((I,)))))
    taken = in_place(body, [r, o, p], lifetimes(body, [r, o, p]))
    assert o not in taken and taken[p] in (r, o)


def test_a_chain_written_in_place_shares_one_offset_and_nothing_else_overlaps_it() -> None:
    """a -> b -> c each in place over the previous, d live beside all of them."""
    a, b, c, d = _buffers([16, 16, 16, 16])
    spans = {a: (0, 1), b: (1, 2), c: (2, 3), d: (0, 3)}
    arena = place([a, b, c, d], spans, {b: a, c: b})
    assert arena.offsets[a] == arena.offsets[b] == arena.offsets[c] != arena.offsets[d]
    assert arena.size == 2 * ALIGN


W0, WA, WB = (np.random.default_rng(k).standard_normal(s).astype(np.float32) * 0.1
              for k, s in ((1, (64, 64, 1, 1)), (2, (16, 64, 1, 1)), (3, (64, 16, 3, 3))))


def _bottleneck(x):
    r = np.maximum(jitop.conv2d(x, W0), 0)                  # the block's input, an intermediate
    h = np.maximum(jitop.conv2d(r, WA), 0)
    y = np.maximum(jitop.conv2d(h, WB, padding=1) + r, 0)   # r read only here, at y's own elements
    return jitop.conv2d(y, W0)


def _conv64(x: np.ndarray, w: np.ndarray, pad: int = 0) -> np.ndarray:
    """The float64 convolution of x and w (OIHW)."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    h, wd = xp.shape[2] - w.shape[2] + 1, xp.shape[3] - w.shape[3] + 1
    out = np.zeros((x.shape[0], w.shape[0], h, wd))
    for i in range(w.shape[2]):
        for j in range(w.shape[3]):
            out += np.einsum("nchw,kc->nkhw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j].astype(np.float64))
    return out


def _bottleneck64(x: np.ndarray, magnitude: bool) -> np.ndarray:
    """_bottleneck in float64; with `magnitude`, on |x| and |W| without the ReLUs (each value then bounds the
    sum of |products| behind the same output, through every layer)."""
    relu = (lambda v: v) if magnitude else (lambda v: np.maximum(v, 0))
    w0, wa, wb = (np.abs(w) if magnitude else w for w in (W0, WA, WB))
    x = np.abs(x) if magnitude else x
    r = relu(_conv64(x, w0))
    y = relu(_conv64(relu(_conv64(r, wa)), wb, 1) + r)
    return _conv64(y, w0)


def test_a_residual_block_writes_its_output_over_its_input_and_computes_numpys_result(private_cache) -> None:
    """The block's output takes its input's bytes (explain's storage line says so), and the result is numpy's:
    within (sum of the layers' reduction lengths + adds) eps of the magnitudes behind each output (first order
    forward error bound of the float32 sums)."""
    x = np.random.default_rng(0).standard_normal((2, 64, 11, 13)).astype(np.float32)
    f = jitop.kernel(_bottleneck)
    got = f(x)
    (exe,) = [ov.exe for ov in f.dispatcher.overloads()]
    assert "1 written over their input in place" in exe.decisions[0]
    x64 = x.astype(np.float64)
    depth = 64 + 64 + 16 * 9 + 64 + 2
    bound = depth * np.finfo(np.float32).eps * _bottleneck64(x64, True)
    assert np.all(np.abs(got - _bottleneck64(x64, False)) <= bound)


def test_an_input_the_convolution_also_reads_is_not_overwritten(private_cache) -> None:
    """y = relu(conv(r) + r): the 1x1 convolution reads all of r's channels of a pixel for each output panel, so
    its output must not take r's bytes."""
    def block(x):
        r = np.maximum(jitop.conv2d(x, W0), 0)
        return jitop.conv2d(np.maximum(jitop.conv2d(r, W0) + r, 0), W0)
    x = np.random.default_rng(1).standard_normal((2, 64, 9, 9)).astype(np.float32)
    f = jitop.kernel(block)
    got = f(x)
    (exe,) = [ov.exe for ov in f.dispatcher.overloads()]
    assert "in place" not in exe.decisions[0]
    x64, w64 = x.astype(np.float64), W0.astype(np.float64)
    r = np.maximum(_conv64(x64, w64), 0)
    want = _conv64(np.maximum(_conv64(r, w64) + r, 0), w64)
    mag = _conv64(_conv64(_conv64(np.abs(x64), np.abs(w64)), np.abs(w64)) + _conv64(np.abs(x64), np.abs(w64)),
                  np.abs(w64))
    assert np.all(np.abs(got - want) <= (3 * 64 + 2) * np.finfo(np.float32).eps * mag)
