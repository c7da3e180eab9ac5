"""Fusion never recomputes costly work: a producer fused into a matmul operand or a broadcasting consumer is
re-evaluated once per read, so only what is free to recompute is fused; the rest is computed once.

Decisions are checked on the compiled graph (which group computes which node, and why), results against numpy.
"""
from __future__ import annotations

import numpy as np

import jitop
from jitop.graph.compile import compile_graph
from kernel_checks import assert_close


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _compiled(fn, *args):
    """The Executable for fn(*args) and the traced function (for results)."""
    f = jitop.kernel(fn)
    tr = f.trace(list(args))
    return compile_graph("f", tr.inputs, tr.names, tr.plan, tr.results), f


def _group_with(exe, prim: str, name: str | None = None):
    """The fusion group whose root or members compute a node with this primitive (and ufunc name)."""
    def match(n):
        return n.prim == prim and (name is None or n.param("name") == name)
    hits = [g for g in exe.groups if match(g.root) or any(match(m) for m in g.members)]
    assert len(hits) == 1, [(g.root, g.reason) for g in hits]
    return hits[0]


RNG = np.random.default_rng(7)


def test_costly_producer_of_a_matmul_operand_is_computed_once():
    """GELU feeding the second matmul's A operand (read once per column panel) gets its own stage."""
    h = RNG.standard_normal((37, 50)).astype(np.float32)
    w1 = RNG.standard_normal((50, 131)).astype(np.float32) * 0.1
    w2 = RNG.standard_normal((131, 97)).astype(np.float32) * 0.1

    def mlp(h, w1, w2):
        return _gelu(h @ w1) @ w2
    exe, f = _compiled(mlp, h, w1, w2)
    tanh = _group_with(exe, "ufunc", "tanh")
    assert tanh.root.prim == "ufunc" and "operand 0 of a matmul" in tanh.reason
    matmuls = [g for g in exe.groups if g.root.prim == "matmul"]
    assert all(m.prim != "ufunc" for g in matmuls for m in g.members)  # nothing costly inside a matmul
    assert any("computed once, materialized" in d for d in exe.decisions)
    expected = mlp(h, w1, w2)
    out = f(h, w1, w2)
    assert out.dtype == expected.dtype == np.float64
    assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_a_free_producer_stays_fused_into_the_operand():
    """A transposed, cast operand is index math and a convert: fused, not materialized, however often read."""
    a = RNG.standard_normal((40, 29)).astype(np.float32)
    b = RNG.standard_normal((40, 70)).astype(np.float64)

    def f(a, b):
        return a.T.astype(np.float64) @ b
    exe, k = _compiled(f, a, b)
    mm = _group_with(exe, "matmul")
    assert {m.prim for m in mm.members} >= {"transpose", "cast"}
    assert any("inlined (free to recompute)" in d for d in exe.decisions)
    assert_close(k(a, b), f(a, b), rtol=1e-12, atol=1e-12)


def test_a_packed_operand_computes_its_producer_while_packing():
    """B is packed into panels once, so exp(B) runs inside the packing loop, not as a separate pass."""
    a = RNG.standard_normal((64, 33)).astype(np.float32)
    b = RNG.standard_normal((33, 45)).astype(np.float32)

    def f(a, b):
        return a @ np.exp(b)
    exe, k = _compiled(f, a, b)
    mm = _group_with(exe, "matmul")
    assert any(m.prim == "ufunc" and m.param("name") == "exp" for m in mm.members)
    assert any("matmul operand 1" in d and "read once" in d for d in exe.decisions)
    assert_close(k(a, b), f(a, b), rtol=1e-5, atol=1e-5)


def test_a_broadcast_costly_producer_is_computed_once():
    """exp(x)[:, None] read by every column of the product is materialized; a cheap one is not."""
    x = RNG.standard_normal(50).astype(np.float32)
    y = RNG.standard_normal((50, 301)).astype(np.float32)

    def costly(x, y):
        return np.exp(x)[:, None] * y

    def cheap(x, y):
        return (x + 1)[:, None] * y
    exe, k = _compiled(costly, x, y)
    exp = _group_with(exe, "ufunc", "exp")
    assert "broadcast: each element is read 301 times" in exp.reason
    assert_close(k(x, y), costly(x, y), rtol=1e-6)
    exe, k = _compiled(cheap, x, y)
    assert len(exe.groups) == 1  # x + 1 is inlined into the product
    assert_close(k(x, y), cheap(x, y), rtol=1e-6)


def test_explain_says_what_was_fused_into_each_operand():
    a = RNG.standard_normal((30, 20)).astype(np.float32)
    b = RNG.standard_normal((20, 40)).astype(np.float32)

    @jitop.kernel
    def f(a, b):
        return np.tanh(a) @ b
    text = f.explain(a, b)
    assert "operand fusion: matmul operand 0 (ufunc[30, 20]" in text
    assert_close(f(a, b), np.tanh(a) @ b, rtol=1e-5, atol=1e-6)


def test_an_activation_feeding_the_next_matmul_runs_on_the_first_ones_register_tile():
    """relu(a @ w1 + b1) is materialized for the second matmul, computed as the first one's epilogue."""
    a = RNG.standard_normal((33, 24)).astype(np.float32)
    w1 = RNG.standard_normal((24, 80)).astype(np.float32)
    b1 = RNG.standard_normal(80).astype(np.float32)
    w2 = RNG.standard_normal((80, 300)).astype(np.float32)

    def f(a, w1, b1, w2):
        return np.exp(np.maximum(a @ w1 + b1, 0) * 0.01) @ w2
    exe, k = _compiled(f, a, w1, b1, w2)
    act = _group_with(exe, "ufunc", "exp")
    assert "operand 0 of a matmul" in act.reason
    # the first matmul's result goes to memory only as the activation: no buffer of its own
    first = next(g.root for g in exe.groups if g.root.prim == "matmul" and g.root.shape == (33, 80))
    assert first in act.root.src[0].src or any(first in m.src for m in act.members)
    arena = exe.func.attrs.get("arena")  # intermediates planned into the arena are not parameters
    buffers = [p.name for p in exe.func.params] + [b.name for b in (arena.offsets if arena else ())]
    # stages are named in execution order: the first matmul's are "matmul", "matmul_cols", ..., the second's "matmul_1..."
    first = [n for n in buffers if n.split("_")[0] == "matmul" and not n.startswith("matmul_1")]
    assert buffers.count("exp") == 1 and not any("packed" not in n for n in first), buffers
    assert_close(k(a, w1, b1, w2), f(a, w1, b1, w2), rtol=1e-5, atol=1e-5)


def test_a_concatenation_of_many_parts_is_not_recomputed_per_panel():
    """hstack of 5 parts is a chain of 4 selects per element: materialized before a wide matmul."""
    parts = [RNG.standard_normal((20, 8)).astype(np.float32) for _ in range(5)]
    w = RNG.standard_normal((40, 300)).astype(np.float32)

    def f(p0, p1, p2, p3, p4, w):
        return np.hstack([p0, p1, p2, p3, p4]) @ w
    exe, k = _compiled(f, *parts, w)
    assert "operand 0 of a matmul" in _group_with(exe, "concat").reason
    assert_close(k(*parts, w), f(*parts, w), rtol=1e-5, atol=1e-5)


def test_a_cheap_producer_read_many_times_runs_once_on_the_previous_matmuls_tile():
    """relu(h @ w1 + b1) @ w2 with a wide w2: two cheap ops per element, but read once per panel of w2's
    columns: materialized, and computed as the first matmul's epilogue (no extra pass)."""
    h = RNG.standard_normal((30, 40)).astype(np.float32)
    w1, b1 = RNG.standard_normal((40, 50)).astype(np.float32), RNG.standard_normal(50).astype(np.float32)
    w2 = RNG.standard_normal((50, 700)).astype(np.float32)

    def mlp(h, w1, b1, w2):
        return np.maximum(h @ w1 + b1, 0) @ w2
    exe, k = _compiled(mlp, h, w1, b1, w2)
    relu = _group_with(exe, "ufunc", "maximum")
    assert "operand 0 of a matmul" in relu.reason
    assert_close(k(h, w1, b1, w2), mlp(h, w1, b1, w2), rtol=1e-5, atol=1e-4)


def _matmul_tolerance(a: np.ndarray, b: np.ndarray) -> float:
    """A @ b in float32 (a: [..., K]): K * eps * max|a| * max|b| bounds the rounding of a sum of K products."""
    return a.shape[-1] * np.finfo(np.float32).eps * np.abs(a).max() * np.abs(b).max()


def test_a_large_operand_read_transposed_many_times_is_copied_once():
    """a.T as A, read once per column panel: in place, each pass would read a column of a (one cache line per
    element); above TRANSPOSED_INLINE_BYTES it is copied once (a tiled transpose) and the passes read rows."""
    a = RNG.standard_normal((600, 500)).astype(np.float32)  # 1.2 MB
    b = RNG.standard_normal((600, 200)).astype(np.float32)

    def f(a, b):
        return a.T @ b
    exe, k = _compiled(f, a, b)
    copy = _group_with(exe, "transpose")
    assert copy.root.prim == "transpose" and "transposed" in copy.reason
    assert any("copied once, materialized (read transposed)" in d for d in exe.decisions)
    got, want = k(a, b), a.T.astype(np.float64) @ b
    assert got.dtype == np.float32 and np.abs(got - want).max() <= _matmul_tolerance(a.T, b)


def test_a_transposed_operand_read_once_or_keeping_its_last_axis_stays_fused():
    """B read once (packed: the packing reads it transposed once), or a transpose that keeps the last axis
    last (rows stay rows): fused, whatever the size."""
    a = RNG.standard_normal((300, 600)).astype(np.float32)
    bt = RNG.standard_normal((500, 600)).astype(np.float32)  # 1.2 MB
    exe, k = _compiled(lambda a, bt: a @ bt.T, a, bt)
    assert not any("read transposed" in d for d in exe.decisions)
    assert _group_with(exe, "matmul").root.prim == "matmul"
    assert np.abs(k(a, bt) - a.astype(np.float64) @ bt.T).max() <= _matmul_tolerance(a, bt.T)

    x = RNG.standard_normal((40, 8, 1000)).astype(np.float32)  # 1.3 MB, batched over its middle axis
    w = RNG.standard_normal((1000, 70)).astype(np.float32)
    exe, k = _compiled(lambda x, w: x.transpose(1, 0, 2) @ w, x, w)
    assert not any("read transposed" in d for d in exe.decisions)
    want = x.transpose(1, 0, 2).astype(np.float64) @ w
    assert np.abs(k(x, w) - want).max() <= _matmul_tolerance(x[0], w)
