"""@jitop.kernel(compile="background") (jitop.build_beside): a new signature runs as numpy while a child process
builds its kernel into the disk cache; later calls load it from there, never tracing in this process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import jitop
from jitop import build_beside
from jitop.codegen import children
from jitop.dispatch import Overload
from jitop.errors import JitopFallbackWarning

F4 = np.float32
TIMEOUT_S = 300  # children run at nice 19: beside a busy test worker on 2 slow cores they can take a while

pytestmark = pytest.mark.skipif(not children.may_fork(), reason="building beside forks: this process has threads")


def _chain(a, b):
    return np.tanh(a * b) + np.exp(-a)


def _expected(a, b):
    return np.tanh(a * b) + np.exp(-a)


def _close(got, want, dtype=F4) -> None:
    # a few float32 operations per element: elementwise, no accumulation
    np.testing.assert_allclose(got, want, rtol=8 * np.finfo(dtype).eps, atol=8 * np.finfo(dtype).eps)


@pytest.fixture
def beside(private_cache):
    yield private_cache
    assert build_beside.wait(TIMEOUT_S), "a child still builds after the test"


def test_a_new_signature_runs_as_numpy_then_loads_the_kernel_the_child_built(beside):
    f = jitop.kernel(_chain, compile="background")
    a = np.linspace(-1, 1, 1001, dtype=F4)
    first = f(a, a)
    np.testing.assert_array_equal(first, _expected(a, a))  # numpy ran: its exact result
    assert f.traces == 0 and len(f.cache) == 0  # nothing traced or kept in this process
    assert build_beside.wait(TIMEOUT_S)
    second = f(a, a)
    _close(second, _expected(a, a))
    assert f.traces == 0, "the kernel was loaded from the child's warm record, not traced here"
    assert [type(ov) for ov in f.cache.values()] == [Overload]
    assert f(a, a) is not None and f.hits >= 1


def test_varying_sizes_are_served_by_the_symbolic_kernel_built_beside(beside):
    f = jitop.kernel(_chain, compile="background")
    sizes = [7, 11, 13, 2, 31, 64, 5]
    for n in sizes:  # while the child builds: every call is numpy's
        a = np.arange(n, dtype=F4) / n
        np.testing.assert_array_equal(f(a, a), _expected(a, a))
    assert build_beside.wait(TIMEOUT_S)
    for n in [*sizes, 97, 3]:
        a = np.arange(n, dtype=F4) / n
        _close(f(a, a), _expected(a, a))
    assert f.traces == 0
    served = {id(ov) for ov in f.cache.values()}
    assert len(served) <= 2, "a static kernel for the first size at most, and one symbolic kernel for the rest"


W = np.linspace(-1, 1, 16 * 16, dtype=F4).reshape(16, 16)


def test_a_function_without_warm_records_is_traced_here_and_its_kernel_loaded(beside):
    from jitop.codegen.target import compile_count

    def project(x):
        return np.tanh(x @ W)  # reads a global array: no fingerprint, so no warm record

    f = jitop.kernel(project, compile="background")
    x = np.linspace(0, 1, 5 * 16, dtype=F4).reshape(5, 16)
    np.testing.assert_array_equal(f(x), np.tanh(x @ W))
    assert f.traces == 0
    assert build_beside.wait(TIMEOUT_S)
    before = compile_count()
    got = f(x)
    assert f.traces == 1 and compile_count() == before, "traced here, its kernel loaded from the disk cache"
    bound = 16 * 4 * np.finfo(F4).eps  # a 16-term dot product of values <= 1, then tanh
    np.testing.assert_allclose(got, np.tanh(x @ W), rtol=bound, atol=bound)


def test_a_second_function_waits_its_turn_and_is_built_after(beside):
    f = jitop.kernel(_chain, compile="background")
    g = jitop.kernel(lambda a: np.sqrt(a) * 2, compile="background")
    a = np.linspace(0, 4, 100, dtype=F4)
    f(a, a)
    np.testing.assert_array_equal(g(a), np.sqrt(a) * 2)
    statuses = {build_beside.status(r) for r in _records(g, a)}
    assert statuses & {"queued", "running", "built"}, statuses
    assert build_beside.wait(TIMEOUT_S)
    _close(g(a), np.sqrt(a) * 2)
    _close(f(a, a), _expected(a, a))
    assert f.traces == g.traces == 0


def _records(f, *args):
    values, key, tree = f._bind(args, {})
    return f._warm_records(key, tree, {}) or ()


def test_a_signature_whose_child_fails_is_built_here_with_the_usual_warning(beside):
    def weird(a):
        return np.array([float(x) for x in a.tolist()], dtype=F4) + a  # a Python loop over values: no kernel

    f = jitop.kernel(weird, compile="background")
    a = np.arange(5, dtype=F4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the numpy call while the child builds warns of nothing
        np.testing.assert_array_equal(f(a), a + a)
    assert build_beside.wait(TIMEOUT_S)
    with pytest.warns(JitopFallbackWarning):
        np.testing.assert_array_equal(f(a), a + a)


def test_a_child_builds_what_its_trace_needs_itself_even_forked_under_the_lock(beside):
    """A child is forked while the parent holds the queue's lock; a kernel its trace calls (with arrays, not
    tracers) asks whether to build beside: it must get "no, build it here" at once, not wait for the lock."""
    with build_beside._lock:
        child = children.fork(lambda: b"" if build_beside.defer(["r"], "owner", lambda: None) is False else 1 / 0)
    assert child is not None
    deadline = time.monotonic() + 20
    while (code := children.poll(child)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if code is None:
        children.stop(child)
    assert code == 0


def test_fallback_false_raises_at_the_first_call_after_the_child_failed(beside):
    def weird(a):
        return np.array([float(x) for x in a.tolist()], dtype=F4) + a

    f = jitop.kernel(weird, compile="background", fallback=False)
    a = np.arange(3, dtype=F4)
    np.testing.assert_array_equal(f(a), a + a)  # while its child builds: numpy, as every such call
    assert build_beside.wait(TIMEOUT_S)
    with pytest.raises(jitop.FallbackError):
        f(a)


def test_compile_now_is_the_default_and_a_bad_mode_is_a_clear_error(beside, monkeypatch):
    f = jitop.kernel(_chain)
    a = np.ones(4, F4)
    f(a, a)
    assert f.traces == 1 and f.compile_mode == "now"
    with pytest.raises(ValueError, match="compile='soon'.*'now' or 'background'"):
        jitop.kernel(_chain, compile="soon")
    monkeypatch.setenv("JITOP_COMPILE", "background")
    assert jitop.kernel(_chain).compile_mode == "background"
    monkeypatch.setenv("JITOP_COMPILE", "later")
    with pytest.raises(ValueError, match="JITOP_COMPILE='later'"):
        jitop.kernel(_chain)


def test_without_a_disk_cache_the_call_compiles_here(beside, monkeypatch):
    monkeypatch.setenv("JITOP_CACHE", "0")
    f = jitop.kernel(_chain, compile="background")
    a = np.ones(6, F4)
    _close(f(a, a), _expected(a, a))
    assert f.traces == 1 and len(f.cache) == 1


def test_explain_compiles_here(beside):
    f = jitop.kernel(_chain, compile="background")
    a = np.ones(9, F4)
    text = f.explain(a, a)
    assert "tanh" in text and f.traces == 1
    assert build_beside.wait(0)


def test_a_program_that_exits_leaves_its_queued_kernels_built_for_the_next_run(beside):
    program = textwrap.dedent("""
        import json, sys
        import numpy as np
        import jitop
        from jitop import build_beside
        from jitop.codegen.target import compile_count
        from jitop.runtime import fastcall

        mode = sys.argv[1]
        if mode == "probe":  # finds the kernels the children left, without building (or storing) anything itself
            fastcall.ENABLED = False
            build_beside.defer = lambda records, structure, build: True  # (as if a child built each one missing)

        @jitop.kernel(compile="now" if mode == "now" else "background")
        def f(a, b):
            return np.tanh(a * b) + np.exp(-a)

        @jitop.kernel(compile="now" if mode == "now" else "background")
        def g(a):
            return np.sqrt(a) * 2

        a = np.linspace(0, 1, 50, dtype=np.float32)
        for _ in range(1 if mode == "probe" else 20):  # (served natively after a call: the entry's code is needed)
            f(a, a), g(a)
        print(json.dumps({"traces": [f.traces, g.traces], "compiles": compile_count(),
                          "loaded": [len(f.cache), len(g.cache)]}))
    """)
    path = beside.parent / "program.py"
    path.write_text(program)

    def run(mode: str) -> dict:
        out = subprocess.run([sys.executable, str(path), mode], capture_output=True, text=True, timeout=TIMEOUT_S,
                             env={**os.environ, "JITOP_CACHE_DIR": str(beside)})
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    # it exits while f builds and g waits
    assert run("background") == {"traces": [0, 0], "compiles": 0, "loaded": [0, 0]}
    deadline = time.monotonic() + TIMEOUT_S
    while run("probe")["loaded"] != [1, 1]:  # until the children it left have finished
        assert time.monotonic() < deadline, "the kernels of the exited program were not built"
        time.sleep(1.0)  # (a probe costs a process start: leave the cores to the children)
    # a plain run then traces and compiles nothing: the children stored the native entry's code too
    assert run("now") == {"traces": [0, 0], "compiles": 0, "loaded": [1, 1]}


def test_poll_reports_a_childs_exit_code():
    child = children.fork(lambda: b"")
    assert child is not None
    deadline = time.monotonic() + TIMEOUT_S
    code = None
    while code is None and time.monotonic() < deadline:
        code = children.poll(child)
        time.sleep(0.01)
    assert code == 0
    failing = children.fork(lambda: 1 / 0)
    while (code := children.poll(failing)) is None:
        time.sleep(0.01)
    assert code == 1


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="a child's CPU time is read from /proc")
def test_a_child_is_stopped_for_the_cpu_time_it_uses_not_for_waiting(beside, monkeypatch):
    monkeypatch.setattr(build_beside, "BUILD_TIMEOUT_S", 0.5)
    monkeypatch.setattr(build_beside, "HANG_FACTOR", 60)  # (a build that hangs: stopped after 30 s)
    assert build_beside.defer(["slow but idle"], "idle", lambda: time.sleep(2.5))
    assert build_beside.wait(TIMEOUT_S)
    assert build_beside.status("slow but idle") == "built"  # 2.5 s of wall time, little CPU: not stopped
    assert build_beside.defer(["busy"], "busy", lambda: _spin(20))
    t0 = time.monotonic()
    assert build_beside.wait(TIMEOUT_S)
    assert build_beside.status("busy") == "failed" and time.monotonic() - t0 < 15
