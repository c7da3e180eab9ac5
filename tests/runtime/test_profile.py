"""jitop.profile: a profiling build times each top-level loop nest; the results stay numpy's."""
from __future__ import annotations

import numpy as np
import pytest

import jitop
from jitop.graph.compile import compile_graph
from jitop.runtime.profile import profile_executable
from kernel_checks import assert_close


def _softmax_then_matmul(x, w):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ w


X = np.random.default_rng(3).standard_normal((64, 50)).astype(np.float32)
W = np.random.default_rng(4).standard_normal((50, 200)).astype(np.float32)


def test_profile_names_every_loop_nest_and_shares_add_up():
    p = jitop.profile(jitop.kernel(_softmax_then_matmul), X, W, repeat=3)
    assert p.name == "_softmax_then_matmul" and p.ms_per_call > 0
    assert len(p.nests) >= 2  # the softmax's nests and the matmul's
    assert abs(sum(t.share for t in p.nests) - 1) < 1e-9
    assert [t.ms for t in p.nests] == sorted((t.ms for t in p.nests), reverse=True)
    assert any("float32[64, 200]" in t.writes for t in p.nests)  # the result's nest says what it writes
    assert "loop nests by time" in p.top(2)


def test_a_profiling_build_computes_numpys_result():
    f = jitop.kernel(_softmax_then_matmul)
    tr = f.trace([X, W])
    exe = compile_graph("f", tr.inputs, tr.names, tr.plan, tr.results, profile=True)
    assert exe.module.profile_counters is not None
    assert_close(exe.call([X, W])[0], _softmax_then_matmul(X, W), rtol=1e-5, atol=1e-6)
    before = list(exe.module.profile_counters)
    exe.call([X, W])
    assert sum(exe.module.profile_counters) > sum(before)  # the counters advance with every call


def test_an_ordinary_build_has_no_counters_and_cannot_be_profiled():
    f = jitop.kernel(_softmax_then_matmul)
    tr = f.trace([X, W])
    exe = compile_graph("f", tr.inputs, tr.names, tr.plan, tr.results)
    assert exe.module.profile_counters is None
    with pytest.raises(ValueError, match="not a profiling build"):
        profile_executable(exe, [X, W])
