"""Horizontal batching (jitop/graph/batching.py): a Python loop over equal slices joined by a concatenation
(attention heads, `np.stack` of per-row products) is compiled as one batched computation, a reduction or matmul
for all the copies instead of one each; anything else stays as traced. Results are numpy's: references in
float64, tolerances from the sums' lengths (float32 eps per term)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop
from jitop.graph.batching import batch_slices
from jitop.graph.compile import rewritten
from jitop.graph.ir import toposort
from jitop.graph.prims import get as prim

EPS = float(np.finfo(np.float32).eps)


def loop_nests(results) -> int:
    """The reductions and matmuls of a graph: each its own loop nest (a kernel on the GPU)."""
    return sum(prim(n.prim).own_stage for n in toposort(results))


def heads(q, k, v, mask, n_head):
    """GPT-2's attention as picoGPT writes it: a loop over the heads' column slices, joined by hstack."""
    d = q.shape[1] // n_head
    out = []
    for i in range(n_head):
        s = q[:, i * d:(i + 1) * d] @ k[:, i * d:(i + 1) * d].T / math.sqrt(d) + mask
        e = np.exp(s - np.max(s, axis=-1, keepdims=True))
        out.append(e / np.sum(e, axis=-1, keepdims=True) @ v[:, i * d:(i + 1) * d])
    return np.hstack(out)


def _qkv(rows, length, width, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in ((rows, width), (length, width), (length, width))]


def _attention_bound(q, k, v, d) -> float:
    """A score sums d products (d eps relative to |q||k| / sqrt(d)); exp turns its error into the weight's
    relative error; the output sums len(k) weighted values (plus a few roundings of the softmax)."""
    scores = (np.abs(q.astype(np.float64)) @ np.abs(k.astype(np.float64)).T).max() / math.sqrt(d)
    return EPS * (2 * (d + 2) * scores + len(k) + 8) * np.abs(v).max()


@pytest.mark.parametrize("rows, n_head, d", [(13, 5, 7), (1, 4, 16), (3, 2, 1)])
def test_attention_heads_are_one_batched_computation(rows, n_head, d):
    q, k, v = _qkv(rows, rows, n_head * d)
    mask = ((1 - np.tri(rows, dtype=np.float32)) * -1e10).astype(np.float32)
    kf = jitop.kernel(lambda q, k, v, m: heads(q, k, v, m, n_head), fallback=False)
    tr = kf.trace([q, k, v, mask])
    assert loop_nests(rewritten(tr.results)) * n_head == loop_nests(tr.results)
    got = kf(q, k, v, mask)
    want = heads(*(a.astype(np.float64) for a in (q, k, v, mask)), n_head)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=_attention_bound(q, k, v, d))


def test_heads_over_a_growing_cache_are_batched_with_a_symbolic_length():
    n_head, d, width = 3, 5, 15
    kf = jitop.kernel(lambda q, k, v: heads(q, k, v, 0.0, n_head), dynamic={"k": (0,), "v": (0,)}, fallback=False)
    for length in (4, 9, 17, 30):
        q, k, v = _qkv(1, length, width, seed=length)
        want = heads(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), 0.0, n_head)
        np.testing.assert_allclose(kf(q, k, v), want, rtol=0, atol=_attention_bound(q, k, v, d))
    assert kf.traces == 1
    tr = kf.trace([q, k, v], dynamic={1: [0], 2: [0]})
    assert loop_nests(rewritten(tr.results)) * n_head == loop_nests(tr.results)


def rows_through(x, w, b):
    """A loop over rows (an int index per copy), stacked, and another concatenated along the last axis."""
    stacked = np.stack([np.tanh(x[i] @ w + b) for i in range(x.shape[0])])
    joined = np.concatenate([x[i].sum(axis=0, keepdims=True) * b[:1] for i in range(x.shape[0])], axis=-1)
    return stacked, joined


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_loop_over_rows_is_batched(dtype):
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype(dtype) for s in ((6, 3, 11), (11, 7), (7,)))
    kf = jitop.kernel(rows_through, fallback=False)
    tr = kf.trace([x, w, b])
    assert loop_nests(rewritten(tr.results)) == 2  # one matmul and one sum for the six rows
    got = kf(x, w, b)
    want = rows_through(*(a.astype(np.float64) for a in (x, w, b)))
    eps = np.finfo(dtype).eps
    for g, e in zip(got, want):
        assert g.dtype == dtype and g.shape == e.shape
    bound = eps * (11 + 4) * (np.abs(x.astype(np.float64)) @ np.abs(w) + np.abs(b)).max()
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=bound)
    np.testing.assert_allclose(got[1], want[1], rtol=0, atol=eps * 5 * np.abs(x).sum(axis=1).max() * abs(b[0]))


def reused_part(x):
    parts = [x[:, 2 * i:2 * i + 2].sum(axis=1) for i in range(3)]
    return np.concatenate(parts), parts[1] * 2  # a copy's node is read outside the concatenation


def gapped(x):
    return np.concatenate([x[:, 3 * i:3 * i + 2].sum(axis=1) for i in range(3)])  # slices with gaps


def different(x):
    return np.concatenate([x[:, 0:2].sum(axis=1), x[:, 2:4].max(axis=1)])


def overlapping(x):
    return np.concatenate([x[:, i:i + 2].sum(axis=1) for i in range(3)])  # a copy's read is another's


def slices_only(x):
    return np.concatenate([x[:, 2 * i:2 * i + 2] * 2 for i in range(3)], axis=1)  # free index math: one loop


@pytest.mark.parametrize("fn", [reused_part, gapped, different, overlapping, slices_only])
def test_what_is_not_copies_over_slices_stays_as_traced(fn):
    x = np.random.default_rng(2).standard_normal((5, 9)).astype(np.float32)
    kf = jitop.kernel(fn, fallback=False)
    tr = kf.trace([x])
    assert batch_slices(tr.results) == tr.results
    got, want = kf(x), fn(x.astype(np.float64))
    for g, e in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        np.testing.assert_allclose(g, e, rtol=0, atol=4 * EPS * np.abs(x).max())


@st.composite
def loops(draw):
    """A loop of `copies` over slices of x (along axis `along`, each `width` wide or one index), each copy a
    short chain with a weight every copy shares, joined along `join`."""
    copies, width = draw(st.integers(2, 5)), draw(st.integers(1, 4))
    along = draw(st.sampled_from(["cols", "rows", "index"]))
    op = draw(st.sampled_from(["sum", "max", "matmul", "softmax", "scale"]))
    join = draw(st.sampled_from(["concat0", "concat-1", "stack"]))
    other = draw(st.integers(1, 4))
    return copies, width, along, op, join, other


def _loop_program(copies, width, along, op, join):
    def part(x, w, i):
        y = {"cols": lambda: x[:, i * width:(i + 1) * width], "rows": lambda: x[i * width:(i + 1) * width],
             "index": lambda: x[i]}[along]()
        y = np.atleast_2d(y)
        if op == "sum":
            return y.sum(axis=-1, keepdims=True) + w[:1]
        if op == "max":
            return np.max(y * w[1, 1], axis=0, keepdims=True)
        if op == "matmul":
            return y @ w[:y.shape[1], :3]
        if op == "softmax":
            e = np.exp(y - y.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)
        return y * w[0, 0] - 1

    def program(x, w):
        parts = [part(x, w, i) for i in range(copies)]
        return np.stack(parts) if join == "stack" else np.concatenate(parts, axis=0 if join == "concat0" else -1)
    return program


@settings(max_examples=40, deadline=None)
@given(loops())
def test_random_loops_over_slices_match_numpy(case):
    copies, width, along, op, join, other = case
    cols = copies * width if along == "cols" else width + other
    rows = copies * width if along == "rows" else (copies if along == "index" else other)
    rng = np.random.default_rng(copies * 100 + width)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.standard_normal((max(cols, 2), 3)).astype(np.float32)
    fn = _loop_program(copies, width, along, op, join)
    want = fn(x.astype(np.float64), w.astype(np.float64))
    kf = jitop.kernel(fn, fallback=False)
    traced = kf.trace([x, w]).results
    assert loop_nests(rewritten(traced)) * (1 if op == "scale" else copies) == loop_nests(traced)
    got = kf(x, w)
    assert got.dtype == np.float32 and got.shape == want.shape
    scale = (np.abs(x).max() + 1) * (np.abs(w).max() + 1)
    np.testing.assert_allclose(got, want, rtol=0, atol=EPS * (cols + 4) * scale)


def test_explain_says_what_was_batched_and_why_not(capsys):
    q = np.random.default_rng(3).standard_normal((3, 20)).astype(np.float32)
    text = jitop.kernel(lambda q, k, v: heads(q, k, v, 0.0, 4)).explain(q, q, q)
    assert "slice batching: concat[3, 20]:float32 of 4 copies: batched" in text
    text = jitop.kernel(reused_part).explain(np.ones((4, 9), np.float32))
    assert "of 3 copies: a copy's intermediate is read outside the concatenation" in text
    text = jitop.kernel(lambda q, k: heads(q, k, k, 0.0, 4), target="cuda -arch=sm_90").explain(q, q)
    assert "slice batching: concat[3, 20]:float32 of 4 copies: batched" in text


ODD_LOOPS = {
    "0-d parts": lambda x: np.stack([x[i].sum() for i in range(x.shape[0])]),
    "argmax": lambda x: np.stack([np.argmax(x[:, 2 * i:2 * i + 2], axis=1) for i in range(3)], axis=1),
    "rows of one": lambda x: np.concatenate([(x[i:i + 1] * 3).max(axis=1) for i in range(x.shape[0])]),
    "int and slice reads": lambda x: np.stack([x[:, i] @ x[:, i:i + 1] for i in range(2)], axis=1),
    "where": lambda x: np.hstack([np.where(x[:, 3 * i:3 * i + 3] > 0, x[:, 3 * i:3 * i + 3], 0)
                                  .sum(axis=1, keepdims=True) for i in range(2)]),
}


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64])
@pytest.mark.parametrize("name", list(ODD_LOOPS))
def test_loops_of_other_primitives_and_dtypes(name, dtype):
    fn = ODD_LOOPS[name]
    x = (np.random.default_rng(4).standard_normal((4, 6)) * 5).astype(dtype)
    kf = jitop.kernel(fn, fallback=False)
    assert loop_nests(rewritten(kf.trace([x]).results)) == 1
    got, want = kf(x), fn(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = 0 if dtype == np.int32 else 8 * np.finfo(dtype).eps * (np.abs(x).max() + 1) ** 2
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)


def pico_mha(x, n_head):
    """picoGPT's multi-head attention: np.split into q, k, v, then each into heads, hstack of the heads."""
    qkv_heads = [np.split(t, n_head, axis=-1) for t in np.split(x, 3, axis=-1)]
    mask = (1 - np.tri(x.shape[0], dtype=x.dtype)) * -1e10
    return np.hstack([heads(q, k, v, mask, 1) for q, k, v in zip(*qkv_heads)])


def test_picogpt_heads_split_by_n_head_are_batched():
    x = np.random.default_rng(5).standard_normal((7, 3 * 4 * 6)).astype(np.float32)
    kf = jitop.kernel(pico_mha, fallback=False)
    q, k, v = np.split(x, 3, axis=-1)
    want = pico_mha(x.astype(np.float64), 4)
    np.testing.assert_allclose(kf(x, 4), want, rtol=0, atol=_attention_bound(q, k, v, 6))
    tr = kf.trace([x, 4])  # n_head, used as a size, was made static by the call
    assert loop_nests(rewritten(tr.results)) * 4 == loop_nests(tr.results)
