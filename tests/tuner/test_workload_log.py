"""The workload log: calls of every tuning task a program dispatched (native entry and slow path alike),
written in batches, merged across processes; JITOP_VERIFY=1; the cache's environment knobs."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import jitop
from jitop import config, workloads
from jitop.graph import kernel_cache
from jitop.verify import compare


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    workloads.flush()  # counts of earlier tests go to the session's log, not this test's
    monkeypatch.setenv("JITOP_CACHE_DIR", str(tmp_path / "cache"))
    yield


def mlp_args(m: int = 24) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(1)
    return tuple(rng.standard_normal(s).astype(np.float32) for s in ((m, 40), (40, 40), (40, 40)))


def test_calls_are_counted_per_task_and_flushed_once() -> None:
    f = jitop.kernel(lambda x, w1, w2: np.maximum(x @ w1, 0) @ w2)
    args = mlp_args()
    for _ in range(7):  # the first calls take the slow path, the rest the native entry: all count
        f(*args)
    ran = workloads.flush()
    assert [(w.task.template, w.calls) for w in ran] == [("matmul", 14)]  # 2 matmuls of one workload per call
    assert ran[0].seconds > 0 and ran[0].functions == [f.qualified_name]
    (logged,) = workloads.logged()
    assert logged.calls == 14 and logged.task == ran[0].task
    f(*args)
    workloads.flush()
    assert workloads.logged()[0].calls == 16  # only the new calls are added


def test_counts_survive_a_recompile_and_reach_the_log() -> None:
    f = jitop.kernel(lambda x, w: x @ w)
    x, w, _ = mlp_args(16)
    f(x, w)
    f(x, w)
    f.clear_cache()  # e.g. tuned records arrived: the signature's counts must not be lost
    f(x, w)
    workloads.flush()
    assert workloads.logged()[0].calls == 3


def test_counts_of_a_collected_kernel_function_reach_the_log() -> None:
    def run() -> None:
        g = jitop.kernel(lambda x, w: x @ w)  # local: collected when run() returns
        x, w, _ = mlp_args(12)
        for _ in range(9):
            g(x, w)
    run()
    import gc
    gc.collect()
    (logged,) = workloads.flush()
    assert logged.calls == 9 and logged.functions and "<lambda>" in logged.functions[0]


def test_a_forked_child_does_not_log_its_parent_calls_again() -> None:
    f = jitop.kernel(lambda x, w: x @ w)
    x, w, _ = mlp_args(10)
    for _ in range(6):
        f(x, w)
    pid = os.fork()
    if pid == 0:  # the child exits through atexit (its flush must not log the parent's 6 calls)
        try:
            f(x, w)
            workloads.flush()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    workloads.flush()
    assert workloads.logged()[0].calls == 7  # 6 in the parent + 1 in the child


def test_processes_add_to_one_log(tmp_path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, jitop
        @jitop.kernel
        def f(a, b):
            return a @ b
        a = np.ones((8, 12), np.float32); b = np.ones((12, 4), np.float32)
        for _ in range(5):
            f(a, b)
    """))
    env = {**os.environ, "JITOP_CACHE_DIR": str(tmp_path / "cache")}
    for _ in range(2):
        subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=120)
    (logged,) = workloads.logged()
    assert logged.calls == 10 and logged.functions == ["__main__.f"]
    assert workloads.clear() == 1 and workloads.logged() == []


def test_nothing_is_logged_with_the_cache_off(monkeypatch) -> None:
    monkeypatch.setenv("JITOP_CACHE", "0")
    f = jitop.kernel(lambda x, w: x @ w)
    x, w, _ = mlp_args(8)
    f(x, w)
    workloads.flush()
    monkeypatch.setenv("JITOP_CACHE", "1")
    assert workloads.logged() == []


def test_verify_marks_agreeing_kernels_and_drops_disagreeing_ones(monkeypatch) -> None:
    monkeypatch.setenv("JITOP_VERIFY", "1")
    x, w, _ = mlp_args(8)
    f = jitop.kernel(lambda a, b: np.tanh(a @ b))
    np.testing.assert_allclose(f(x, w), np.tanh(x @ w), rtol=1e-5, atol=1e-6)
    (info,) = [i for _, i in kernel_cache.stored_keys(kernel_cache.store())]
    assert info["verified"] == "numpy"
    # a kernel whose result disagrees with numpy is never used nor kept: forced here by a wrong comparison
    monkeypatch.setattr("jitop.verify.compare", lambda ours, ref: "result[0]: max difference 1")
    g = jitop.kernel(lambda a, b: np.exp(a @ b))
    with pytest.warns(RuntimeWarning, match="disagrees with numpy"):
        out = g(x, w)
    np.testing.assert_array_equal(out, np.exp(x @ w))  # numpy's own result
    assert len(kernel_cache.stored_keys(kernel_cache.store())) == 1  # g's entry was removed


def test_compare_checks_structure_dtype_nan_and_tolerance() -> None:
    a = np.float32([1, 2, np.nan])
    assert compare(a, a.copy()) is None
    assert "NaN" in compare(np.float32([1, 2, 3]), a)
    assert "float64" in compare(a.astype(np.float64), a)
    assert compare(np.float32([1, 2 + 1e-6, np.nan]), a) is None  # within float32 tolerance
    assert "differ" in compare(np.int32([1, 2]), np.int32([1, 3]))
    assert compare((a, 1), (a, 1)) is None and "tuple" in compare([a], (a,))


def test_cache_size_parses_units_and_rejects_garbage(monkeypatch) -> None:
    for raw, expect in (("1024", 1024), ("500MB", 500 << 20), ("2G", 2 << 30), ("1.5 kb", 1536)):
        monkeypatch.setenv("JITOP_CACHE_SIZE", raw)
        assert config.cache_size() == expect
    monkeypatch.setenv("JITOP_CACHE_SIZE", "lots")
    with pytest.raises(ValueError, match="JITOP_CACHE_SIZE"):
        config.cache_size()
    monkeypatch.setenv("JITOP_CACHE_DIR", "~/somewhere")
    assert config.cache_dir() == os.path.expanduser("~/somewhere")
