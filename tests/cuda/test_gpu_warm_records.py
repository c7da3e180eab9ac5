"""Warm records for GPU kernels (jitop.graph.warm): a new process finds a `@jitop.kernel(target="cuda")`
function's GPU function without tracing it, as on the CPU (tests/graph/test_warm_records.py). The record names
the GPU cache's entry and holds the input plan, the result's structure, the writes, the tasks and the constants.
A new KernelFunction of the same function over the same cache directory stands for a new process. On this
machine's GPU, else on the simulated one (which runs a kernel it saw compiled: the first object compiles)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import jitop
import sim_gpu
from jitop.graph import gpu, warm

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "graph"))
from test_int_sizes import decode_step  # noqa: E402

pytestmark = pytest.mark.usefixtures("private_cache")
F4 = np.float32
SCALE = 3.0


def block(x, w):
    centred = x - x.mean(axis=-1, keepdims=True)
    return np.tanh(centred @ w) * SCALE + np.arange(w.shape[1], dtype=F4)  # (a constant the trace computed)


@pytest.fixture
def gpu_with_cache(monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    monkeypatch.delenv("JITOP_CACHE", raising=False)  # (the simulated GPU turns the cache off)


def _args(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((6, 32)).astype(F4), rng.standard_normal((32, 8)).astype(F4)


def test_a_fresh_gpu_function_object_finds_its_function_without_tracing(gpu_with_cache):
    x, w = _args()
    first = jitop.kernel(block, target="cuda", fallback=False)
    want = first(x, w)
    np.testing.assert_allclose(want, block(x, w), rtol=1e-5, atol=1e-5)
    again = jitop.kernel(block, target="cuda", fallback=False)
    np.testing.assert_array_equal(again(x, w), want)
    assert again.traces == 0 and first.traces == 1
    assert "w" in again.explain(x, w)  # explain traces a function found through its record


def test_a_changed_global_is_traced_again(gpu_with_cache, monkeypatch):
    x, w = _args()
    jitop.kernel(block, target="cuda")(x, w)
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 5.0)
    again = jitop.kernel(block, target="cuda")
    np.testing.assert_allclose(again(x, w), block(x, w), rtol=1e-5, atol=1e-5)
    assert again.traces == 1


def test_a_symbolic_int_size_s_record_serves_a_new_value(gpu_with_cache):
    rng = np.random.default_rng(2)
    cache, theirs = np.zeros((24, 16), F4), np.zeros((24, 16), F4)
    first = jitop.kernel(decode_step, target="cuda", fallback=False)
    for t in range(5):
        k, q = rng.standard_normal(16).astype(F4), rng.standard_normal(16).astype(F4)
        first(cache, k, q, t)
        decode_step(theirs, k, q, t)
    again = jitop.kernel(decode_step, target="cuda", fallback=False)
    k, q = rng.standard_normal(16).astype(F4), rng.standard_normal(16).astype(F4)
    got, want = again(cache, k, q, 9), decode_step(theirs, k, q, 9)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(cache, theirs)  # its write into the cache, from the record
    assert again.traces == 0


def test_a_record_whose_gpu_entry_is_gone_or_does_not_fit_is_not_used(gpu_with_cache, monkeypatch):
    x, w = _args()
    want = jitop.kernel(block, target="cuda")(x, w)
    saved = []
    with monkeypatch.context() as patched:
        patched.setattr(warm, "_put", lambda where, kernel, *rest: saved.append(kernel))
        patched.setattr(gpu.GPU_STORE, "get", lambda content: None)  # the GPU cache lost its entry
        again = jitop.kernel(block, target="cuda")
        np.testing.assert_array_equal(again(x, w), want)
    assert again.traces == 1
    (kernel,) = saved
    assert kernel["plan"] == [["arg", 0], ["arg", 1], ["const", 0]]  # (the arange, computed by the trace)
    plan = [("arg", 0), ("arg", 1)]
    assert gpu.stored_executable(kernel["gpu"], plan, kernel["slots"], [], []) is None  # its constant missing
    assert gpu.stored_executable(kernel["gpu"], plan + [("const", np.zeros(8, np.float64))], [0], [], []) is None
    assert gpu.stored_executable(kernel["gpu"], plan + [("const", np.zeros(8, F4))], [0], [], []) is not None
