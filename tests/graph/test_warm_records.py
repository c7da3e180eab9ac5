"""A warm process finds a function's kernel without tracing it (jitop.graph.warm): a record kept beside the disk
cache, keyed by the function's fingerprint (its code and what it reaches by name) and the call's key. A new
KernelFunction of the same function over the same cache directory stands for a new process here; one test runs
real processes."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import jitop
from jitop.cachedir import store
from jitop.graph import warm
from test_hypothesis_programs import check_program, programs
from tuning_fakes import tuned_source

pytestmark = pytest.mark.usefixtures("private_cache")

SCALE = 3.0


def layer_norm(x, eps=1e-5):
    return (x - x.mean(axis=-1, keepdims=True)) / np.sqrt(x.var(axis=-1, keepdims=True) + eps)


def block(x, w):
    return np.tanh(layer_norm(x) @ w) * SCALE


def step(cache, k, q, t):
    cache[t] = k
    s = cache @ q
    return np.exp(s - s.max()) @ cache


def _args(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((6, 32)).astype(np.float32), rng.standard_normal((32, 8)).astype(np.float32)


def test_a_fresh_function_object_finds_its_kernel_without_tracing():
    x, w = _args()
    first = jitop.kernel(block)
    want = first(x, w)
    again = jitop.kernel(block)
    np.testing.assert_array_equal(again(x, w), want)
    assert again.traces == 0 and first.traces == 1
    np.testing.assert_array_equal(again(x, w), want)  # (the native entry now)


def test_a_changed_helper_or_global_is_traced_again():
    x, w = _args()
    jitop.kernel(block)(x, w)
    global SCALE
    old = SCALE
    try:
        SCALE = 5.0  # a global a called function reads: a new fingerprint
        changed = jitop.kernel(block)
        np.testing.assert_allclose(changed(x, w), np.tanh(layer_norm(x) @ w) * 5.0, rtol=1e-5, atol=1e-5)
        assert changed.traces == 1
    finally:
        SCALE = old
    defaults = layer_norm.__defaults__
    try:
        layer_norm.__defaults__ = (0.5,)  # a helper's default
        changed = jitop.kernel(block)
        np.testing.assert_allclose(changed(x, w), block(x, w), rtol=1e-5, atol=1e-5)
        assert changed.traces == 1
    finally:
        layer_norm.__defaults__ = defaults


def test_a_symbolic_kernel_serves_other_sizes_from_its_record():
    x, w = _args()
    first = jitop.kernel(block)
    for rows in (6, 7, 9):
        first(np.resize(x, (rows, 32)), w)
    again = jitop.kernel(block)
    y = np.resize(x, (13, 32))
    np.testing.assert_allclose(again(y, w), block(y, w), rtol=1e-5, atol=1e-5)
    assert again.traces == 0


def test_writes_into_arguments_come_from_the_record():
    rng = np.random.default_rng(1)
    cache = rng.standard_normal((16, 8)).astype(np.float32)
    k, q = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    jitop.kernel(step)(cache.copy(), k, q, 3)
    again = jitop.kernel(step)
    mine, theirs = cache.copy(), cache.copy()
    np.testing.assert_allclose(again(mine, k, q, 5), step(theirs, k, q, 5), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(mine, theirs)
    assert again.traces == 0


def test_a_call_with_a_dict_of_weights_comes_from_the_record():
    x, w = _args()
    params = {"w": w, "scale": 2.0, "shift": np.float32(3)}
    f = lambda x, p: np.tanh(x @ p["w"]) * p["scale"] + p["shift"]  # noqa: E731
    want = jitop.kernel(f)(x, params)
    again = jitop.kernel(f)
    np.testing.assert_array_equal(again(x, params), want)
    assert again.traces == 0


def test_a_captured_array_is_traced_in_every_process():
    table = np.arange(8.0)
    f = lambda x: x + table  # noqa: E731 - read in place, guarded: no record
    jitop.kernel(f)(np.ones(8))
    table[:] = 2.0
    again = jitop.kernel(f)
    np.testing.assert_array_equal(again(np.ones(8)), np.ones(8) + 2.0)
    assert again.traces == 1


def test_a_new_tuned_config_is_not_served_from_an_older_record():
    x, w = _args()
    jitop.kernel(block)(x, w)
    with tuned_source() as chosen:
        again = jitop.kernel(block)
        got = again(x, w)
    assert again.traces == 1 and chosen
    np.testing.assert_allclose(got, block(x, w), rtol=1e-5, atol=1e-5)


def test_a_damaged_record_is_ignored_and_explain_traces_a_recorded_kernel():
    x, w = _args()
    jitop.kernel(block)(x, w)
    st = store()
    for key in [k for k in st.keys() if k.startswith("warm/")]:
        st.put(key, b'{"schema": 1, "kernel": 7}')
    damaged = jitop.kernel(block)
    np.testing.assert_allclose(damaged(x, w), block(x, w), rtol=1e-5, atol=1e-5)
    assert damaged.traces == 1
    again = jitop.kernel(block)
    again(x, w)
    assert again.traces == 0
    assert "fusion groups" in again.explain(x, w) and again.traces == 1


def test_records_can_be_turned_off(monkeypatch):
    x, w = _args()
    jitop.kernel(block)(x, w)
    monkeypatch.setenv("JITOP_WARM_RECORDS", "0")
    again = jitop.kernel(block)
    again(x, w)
    assert again.traces == 1


def test_fingerprints_follow_what_a_function_reaches():
    def make(eps, scale):
        def norm(x):
            return x / eps
        return lambda x: norm(x) * scale
    assert warm.fingerprint(make(1.0, 2.0)) == warm.fingerprint(make(1.0, 2.0))
    assert warm.fingerprint(make(1.0, 2.0)) != warm.fingerprint(make(1.5, 2.0))  # a closure of a helper
    assert warm.fingerprint(make(1.0, 2.0)) != warm.fingerprint(make(1.0, -2.0))
    assert warm.fingerprint(lambda x: x * np.float32(2)) != warm.fingerprint(lambda x: x * np.float32(3))
    holder = type("Config", (), {"eps": 1.0})()
    assert warm.fingerprint(lambda x: x * holder.eps) is None  # an object: traced in every process


def test_a_new_process_does_not_trace(tmp_path):
    """Two processes over one cache directory: the second finds the kernel through the record."""
    module = tmp_path / "model.py"
    module.write_text(textwrap.dedent("""
        import numpy as np
        import jitop

        @jitop.kernel
        def f(x, w):
            return np.maximum(x @ w, 0.0) + x.sum()

        x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
        print(float(f(x, x.T).sum()), f.traces)
    """))
    env = {**os.environ, "JITOP_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": os.pathsep.join(sys.path)}
    runs = [subprocess.run([sys.executable, str(module)], env=env, capture_output=True, text=True, timeout=600)
            for _ in range(2)]
    outs = [r.stdout.split() for r in runs]
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    assert outs[0][0] == outs[1][0] and outs[0][1] == "1" and outs[1][1] == "0"


@pytest.mark.parametrize("pytree", [False, True])
def test_a_recorded_kernel_is_built_again_from_a_fresh_trace(pytree):
    """A background rebuild (a tuned record arrived) of a kernel a record named traces with stand-in arguments."""
    x, w = _args()
    f = (lambda x, p: block(x, p["w"])) if pytree else block
    args = (x, {"w": w}) if pytree else (x, w)
    want = jitop.kernel(f)(*args)
    again = jitop.kernel(f)
    again(*args)
    (ov,) = again.cache.values()
    assert ov.trace.recorded
    new = again.built_again(ov)
    assert not new.trace.recorded and again.traces == 1
    values = again._bind(args, {})[0]
    np.testing.assert_allclose(new.call(values), want, rtol=1e-6, atol=1e-6)


@settings(max_examples=15, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
    HealthCheck.function_scoped_fixture])
@given(programs())
def test_random_programs_from_their_records_match_numpy(prog):
    """test_hypothesis_programs' random programs, each compiled once and then run by a fresh function object
    that finds the kernel through its warm record (not traced), against numpy."""
    def from_record(fn):
        def run(*args):
            jitop.kernel(fn, fallback=False)(*[a.copy() for a in args])
            fresh = jitop.kernel(fn, fallback=False)
            out = fresh(*args)
            assert fresh.traces == 0
            return out
        return run
    check_program(prog, from_record)
