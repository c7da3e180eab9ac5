"""The compile pipeline's decisions are visible: explain() names the Target, the row-fusion decision (made
from bound inference before scheduling) and each template task's config source; results stay numpy's."""
from __future__ import annotations

import numpy as np

import jitop
from kernel_checks import assert_close


def test_row_fused_softmax_says_which_stages_run_in_the_row_loop():
    @jitop.kernel
    def softmax(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    x = np.random.default_rng(0).standard_normal((37, 70)).astype(np.float32)
    text = softmax.explain(x)
    assert "row fusion: divide computes" in text and "in its row loop" in text
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    assert_close(softmax(x), e / e.sum(axis=-1, keepdims=True), rtol=1e-6, atol=1e-7)


def test_a_stage_read_along_another_axis_is_computed_once():
    """A column sum read by every row cannot live in one row: the decision says so, the answer is numpy's."""
    @jitop.kernel
    def f(x):
        s = x.sum(axis=0, keepdims=True)
        return x / s + s.T[:1]
    x = np.random.default_rng(1).random((64, 64)).astype(np.float32) + 0.5
    text = f.explain(x)
    assert "row fusion: none: bound inference says" in text
    s = x.sum(axis=0, keepdims=True)
    assert_close(f(x), x / s + s.T[:1], rtol=1e-6)


def test_explain_names_the_target_and_the_task_source():
    @jitop.kernel
    def f(a, b):
        return np.maximum(a @ b + 1, 0)
    a, b = np.ones((9, 5), np.float32), np.ones((5, 11), np.float32)
    text = f.explain(a, b)
    assert f"target: {jitop.Target.current().describe()}" in text
    assert "template matmul, default config" in text


def test_a_softmax_feeding_a_matmul_is_one_row_pass_and_its_scores_stay_on_the_tile():
    """Attention: the scores' scale + mask run on q @ k.T's register tile (epilogue), the softmax (an
    intermediate, materialized for the second matmul) computes its max, exp and sum in its own row loop."""
    rng = np.random.default_rng(5)
    q, k = (rng.standard_normal((37, 16)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((37, 200)).astype(np.float32)  # wide: the softmax is read once per panel
    mask = (1 - np.tri(37, dtype=np.float32)) * -1e10

    def attention(q, k, v, mask):
        x = q @ k.T / np.sqrt(q.shape[-1]) + mask
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True)) @ v
    f = jitop.kernel(attention)
    text = f.explain(q, k, v, mask)
    assert "row fusion: divide computes max, exp, sum in its row loop" in text
    signature = next(line for line in text.splitlines() if line.startswith("def attention("))
    # max, exp and sum live in the row loop; the scores (add) are written by q @ k.T's epilogue ("matmul":
    # stages are named in execution order)
    assert not any(f" {name}:" in signature for name in ("max", "exp", "sum", "matmul")), signature
    expected = attention(q, k, v, mask)
    out = f(q, k, v, mask)
    assert out.dtype == expected.dtype == np.float64
    # the scores are float32 dot products (K = 16), summed in another order than numpy's BLAS: each is off by
    # up to 2 K eps32 (|q| @ |k|.T) / 4. A row's softmax moves by at most twice its largest score error
    # (relative), and the float64 product with v carries that through |p| @ |v|.
    probs = expected_probs(q, k, mask)
    score_error = 2 * 16 * np.finfo(np.float32).eps * (np.abs(q) @ np.abs(k).T).astype(np.float64) / 4
    bound = (2 * score_error.max(axis=-1, keepdims=True) + 400 * np.finfo(np.float64).eps) * (probs @ np.abs(v))
    assert np.all(np.abs(out - expected) <= bound), np.max(np.abs(out - expected) / bound)


def expected_probs(q: np.ndarray, k: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The attention's softmax, in float64."""
    x = q.astype(np.float64) @ k.T.astype(np.float64) / 4 + mask
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
