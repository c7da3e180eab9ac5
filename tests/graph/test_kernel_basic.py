"""Smoke tests of @jitop.kernel: fused results equal numpy's, the cache is used, fallback warns."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import jitop


@jitop.kernel
def chain(a, b, c):
    return np.tanh(a * b + c) * 0.5 + np.exp(-a * a)


@jitop.kernel
def softmax(x):
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


@jitop.kernel
def layernorm(x, g, b):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


@pytest.mark.parametrize("n", [1, 7, 1009])
def test_chain_matches_numpy(n: int) -> None:
    rng = np.random.default_rng(n)
    a, b, c = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    got = chain(a, b, c)
    assert got.dtype == np.float32 and got.shape == (n,)
    np.testing.assert_allclose(got, chain.fn(a, b, c), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(3, 5), (64, 100), (2, 3, 129)])
def test_softmax_and_layernorm_match_numpy(shape) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    g, b = rng.random(shape[-1]).astype(np.float32), rng.random(shape[-1]).astype(np.float32)
    np.testing.assert_allclose(softmax(x), softmax.fn(x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(layernorm(x, g, b), layernorm.fn(x, g, b), rtol=1e-4, atol=1e-5)


def test_second_call_hits_the_cache_and_new_scalar_does_not_recompile() -> None:
    @jitop.kernel
    def scale(a, s):
        return a * s
    a = np.arange(10, dtype=np.float32)
    np.testing.assert_array_equal(scale(a, 2.0), a * 2.0)
    np.testing.assert_array_equal(scale(a, 3.5), a * 3.5)
    assert scale(a, 3.5).dtype == np.float32  # a Python float stays weak (NEP 50)
    assert (scale.misses, scale.hits) == (1, 2)


def test_unsupported_construct_falls_back_with_one_warning() -> None:
    @jitop.kernel
    def masked(a):
        return a[a > 0]
    a = np.array([-1.0, 2.0, 3.0])
    with pytest.warns(jitop.JitopFallbackWarning, match="boolean-mask"):
        np.testing.assert_array_equal(masked(a), a[a > 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        masked(a)  # no second warning


def test_fallback_false_raises() -> None:
    @jitop.kernel(fallback=False)
    def branchy(a):
        return a if a.sum() > 0 else -a
    with pytest.raises(jitop.FallbackError, match="control flow"):
        branchy(np.ones(3))


@pytest.mark.parametrize("shape", [(200, 300, 100), (1, 5, 1), (67, 45, 33), (130, 64, 520)])
def test_matmul_epilogue_is_fused_and_correct(shape) -> None:
    @jitop.kernel
    def dense_relu(x, w, b):
        return np.maximum(x @ w + b, 0)
    m, k, n = shape
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    np.testing.assert_allclose(dense_relu(x, w, b), dense_relu.fn(x, w, b), rtol=1e-4, atol=1e-4)
    ir = str(next(iter(dense_relu.cache.values())).exe.func)
    assert "matmul:" not in ir.split(":\n")[0], "the matmul result should not be a separate buffer"


def test_batched_matmul_broadcasts_like_numpy() -> None:
    @jitop.kernel
    def bmm(a, b):
        return a @ b
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 1, 5, 7)), rng.standard_normal((4, 7, 2))
    np.testing.assert_allclose(bmm(a, b), a @ b, rtol=1e-12)


def test_signed_zero_constants_stay_distinct():
    # -0.0 == 0.0, but x * -0.0 is -0.0: the graph must not merge the two constants
    @jitop.kernel
    def f(x):
        return x * 0.0, x * -0.0, np.maximum(x - x, -0.0)

    x = np.ones(3, np.float32)
    for got, want in zip(f(x), (x * 0.0, x * -0.0, np.maximum(x - x, -0.0))):
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
