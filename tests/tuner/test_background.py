"""Background tuning with hot swap: the dispatcher swaps a signature's kernel atomically under concurrent calls
(every result numpy's), a lock in the cache allows one tuner per directory, and a program that opted in picks up
a tuned kernel while it runs."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import jitop
from jitop.tuner import cached
from jitop.tuner.measure import ErrorCode, MeasureResult
from jitop.tuner.records import Record
from jitop.tuner.registry import get


pytestmark = pytest.mark.usefixtures("private_cache")


def test_a_swap_under_concurrent_calls_never_gives_a_wrong_result() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((45, 70)).astype(np.float32), rng.standard_normal((70, 33)).astype(np.float32)
    want = np.maximum(a @ b, 0)
    f = jitop.kernel(lambda x, y: np.maximum(x @ y, 0))
    f(a, b)
    ((key, old),) = f.cache.items()
    (task,) = old.tasks
    space = task.config_space()
    default = get("matmul").default_config(task.workload, task.target)
    other = next(space.get(i) for i in range(7, len(space), 11) if space.get(i) != default)
    cached.save_best([Record(task, other, MeasureResult((1e-6,), ErrorCode.NO_ERROR))])  # "the tuner found it"
    stop, bad, calls = threading.Event(), [], [0]

    def hammer() -> None:
        while not stop.is_set():
            r = f(a, b)
            calls[0] += 1
            if not np.allclose(r, want, rtol=1e-4, atol=1e-4):
                bad.append(r)
    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        assert f.rebuild(old)
        before = calls[0]
        while calls[0] < before + 200:  # keep calling through the swap and after it
            pass
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not bad
    (new,) = f.cache.values()
    assert new is not old and any("tuned config" in t and other.to_json() in t for t in new.exe.templates)
    assert not f.rebuild(old)  # the old entry is gone: nothing to swap
    np.testing.assert_allclose(f(a, b), want, rtol=1e-4, atol=1e-4)


def test_one_tuner_per_cache_directory(tmp_path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    fd = os.open(cache / "tune.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a tuner is running
    try:
        r = subprocess.run([sys.executable, "-m", "jitop", "tune", "--trials", "2"], capture_output=True, text=True,
                           env={**os.environ, "JITOP_CACHE_DIR": str(cache)}, timeout=120)
    finally:
        os.close(fd)
    assert r.returncode == 1 and "another jitop tune is running" in r.stderr, r.stderr


def test_autotune_mode_is_checked() -> None:
    with pytest.raises(ValueError, match="autotune='sometimes'"):
        jitop.kernel(lambda a: a, autotune="sometimes")
    assert jitop.kernel(lambda a: a, autotune="background").autotune == "background"


@pytest.mark.slow
def test_a_program_picks_up_a_tuned_kernel_while_it_runs(tmp_path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""
        import time
        import numpy as np, jitop
        from jitop import autotune

        autotune.POLL_S, autotune.VERIFY_S = 0.1, 0.2  # look often; count calls briefly before the swap
        autotune.SLOWER = 0.0  # the swap stands (putting back a slower kernel has tests of its own)

        @jitop.kernel(autotune="background")
        def f(a, b):
            return a @ b

        if __name__ == "__main__":
            rng = np.random.default_rng(0)
            a, b = (rng.standard_normal((40, 40)).astype(np.float32) for _ in range(2))
            want, deadline, seen = a @ b, time.time() + 90, ""
            while time.time() < deadline:
                assert np.allclose(f(a, b), want, rtol=1e-4, atol=1e-4)
                seen = " ".join(list(f.cache.values())[0].exe.templates)
                if "tuned config" in seen:
                    break
                time.sleep(0.002)  # a program that does more than call f: the nice-19 build gets a core on a busy machine
            print("SWAPPED" if "tuned config" in seen else "NOT SWAPPED", seen)
    """))
    env = {**os.environ, "JITOP_CACHE_DIR": str(tmp_path / "cache"), "JITOP_AUTOTUNE_BUDGET": "8s",
           "JITOP_AUTOTUNE_MIN_SECONDS": "0.05"}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("SWAPPED"), r.stdout + r.stderr[-2000:]


def test_a_build_in_the_background_shortens_gil_turns_and_restores_them() -> None:
    import gc
    from jitop import autotune
    before = sys.getswitchinterval()
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with autotune._short_gil_turns():
            assert sys.getswitchinterval() <= 0.0002 < before and not gc.isenabled()
            raise RuntimeError("a failed build")
    assert sys.getswitchinterval() == before and gc.isenabled()


class _RecordingKernel:
    """Stands in for a kernel function: notes where and at what priority its build ran."""

    def __init__(self, error: Exception | None = None) -> None:
        self.seen: list[tuple[str, int]] = []
        self.error = error

    def built_again(self, entry: object) -> str:
        self.seen.append((threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        if self.error is not None:
            raise self.error
        return "the new kernel"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a nice value is per thread on Linux only")
def test_the_rebuild_runs_in_a_thread_of_lowest_priority_and_the_caller_keeps_its_own() -> None:
    from jitop import autotune
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    kf = _RecordingKernel()
    assert autotune._build_quietly(kf, object()) == "the new kernel"
    assert kf.seen == [("jitop-autotune-build", 19)]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine == os.getpriority(os.PRIO_PROCESS, 0)


def test_a_failed_rebuild_is_raised_in_the_watcher() -> None:
    from jitop import autotune
    kf = _RecordingKernel(error=RuntimeError("a failed build"))
    with pytest.raises(RuntimeError, match="a failed build"):
        autotune._build_quietly(kf, object())
    assert len(kf.seen) == 1


def _compiled_kernel(seed: int) -> tuple:
    """A kernel function compiled for one signature: the function, its key, its entry, its arguments."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((45, 70)).astype(np.float32), rng.standard_normal((70, 33)).astype(np.float32)
    f = jitop.kernel(lambda x, y: np.maximum(x @ y, 0))
    f(a, b)
    ((key, old),) = f.cache.items()
    return f, key, old, (a, b)


def _watch_only(monkeypatch, f) -> None:
    """The watcher looks at `f` alone, with nothing served yet (the process's own state untouched)."""
    import weakref
    from jitop import autotune
    monkeypatch.setattr(autotune, "_kernels", weakref.WeakSet([f]))
    monkeypatch.setattr(autotune, "_state", {**autotune._state, "served": {}})


def _swapped_kernel() -> tuple:
    """A kernel function, its signature key, its default-config entry and the entry a tuned record built."""
    f, key, old, (a, b) = _compiled_kernel(1)
    (task,) = old.tasks
    space = task.config_space()
    default = get("matmul").default_config(task.workload, task.target)
    other = next(space.get(i) for i in range(5, len(space), 7) if space.get(i) != default)
    cached.save_best([Record(task, other, MeasureResult((1e-6,), ErrorCode.NO_ERROR))])
    assert f.rebuild(old)
    return f, key, old, (a, b)


@pytest.mark.parametrize("after, kept", [(50.0, False), (99.0, True), (None, True)])
def test_a_swap_the_program_runs_slower_is_undone(monkeypatch, after, kept) -> None:
    from jitop import autotune
    f, key, old, (a, b) = _swapped_kernel()
    new = f.cache[key]
    assert new is not old
    monkeypatch.setattr(autotune, "_call_rate", lambda kf, k: after)
    autotune._confirm(f.dispatcher, old, new, before=100.0)  # the program called the old kernel 100 times a second
    assert (f.cache[key] is new) == kept and (f.cache[key] is old) == (not kept)
    np.testing.assert_allclose(f(a, b), np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)
    assert f(a, b).shape == (45, 33)


def test_the_call_rate_counts_the_programs_calls(monkeypatch) -> None:
    from jitop import autotune
    f, key, _, (a, b) = _swapped_kernel()
    monkeypatch.setattr(autotune, "VERIFY_S", 0.3)
    assert autotune._call_rate(f.dispatcher, f.cache[key]) is None  # nobody calls it: too few calls to tell
    stop = threading.Event()

    def program() -> None:
        while not stop.is_set():
            f(a, b)
    t = threading.Thread(target=program)
    t.start()
    try:
        rate = autotune._call_rate(f.dispatcher, f.cache[key])
    finally:
        stop.set()
        t.join()
    assert rate is not None and rate > autotune.VERIFY_MIN_CALLS / 0.3


def test_a_confirmation_never_replaces_a_kernel_it_did_not_swap_in(monkeypatch) -> None:
    from jitop import autotune
    f, key, old, (a, b) = _swapped_kernel()
    new = f.cache[key]
    f.clear_cache()  # records changed meanwhile: the program compiled the signature again
    f(a, b)
    recompiled = f.cache[key]
    monkeypatch.setattr(autotune, "_call_rate", lambda kf, k: 1.0)
    autotune._confirm(f.dispatcher, old, new, before=100.0)
    assert f.cache[key] is recompiled


def test_the_watcher_swaps_a_tuned_kernel_in_and_puts_it_back_if_the_program_slows(monkeypatch) -> None:
    from jitop import autotune
    f, key, old, (a, b) = _compiled_kernel(3)
    _watch_only(monkeypatch, f)
    rates = iter([100.0, 100.0])
    monkeypatch.setattr(autotune, "_call_rate", lambda kf, k: next(rates))
    autotune._swap_improved()  # no tuned record: nothing rebuilt
    assert f.cache[key] is old and next(rates) == 100.0
    (task,) = old.tasks
    space = task.config_space()
    default = get("matmul").default_config(task.workload, task.target)
    other = next(space.get(i) for i in range(3, len(space), 5) if space.get(i) != default)
    cached.save_best([Record(task, other, MeasureResult((1e-6,), ErrorCode.NO_ERROR))])
    swapped = []
    replace = f.dispatcher.replace
    monkeypatch.setattr(f.dispatcher, "replace", lambda o, n: swapped.append(n) or replace(o, n))
    rates = iter([100.0, 40.0])  # before the build, then after the swap: the program slowed down
    autotune._swap_improved()
    assert len(swapped) == 2 and swapped[1] is old and f.cache[key] is old  # swapped in, then put back
    assert any("tuned config" in t for t in swapped[0].exe.templates)
    np.testing.assert_allclose(f(a, b), np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)
    autotune._swap_improved()  # the same record: not taken again
    assert len(swapped) == 2


def test_a_rebuild_into_the_same_kernel_is_not_swapped() -> None:
    from jitop import autotune
    f, key, old, _ = _swapped_kernel()
    new = f.cache[key]
    assert autotune._same_code(new, f.built_again(new))  # the same record: the same code
    assert not autotune._same_code(old, new)


def test_a_tuned_record_that_is_the_default_swaps_in_the_same_code_unchecked(monkeypatch) -> None:
    from jitop import autotune
    f, key, old, _ = _compiled_kernel(4)
    (task,) = old.tasks
    default = get("matmul").default_config(task.workload, task.target)
    cached.save_best([Record(task, default, MeasureResult((1e-6,), ErrorCode.NO_ERROR))])  # the default won
    _watch_only(monkeypatch, f)
    monkeypatch.setattr(autotune, "_call_rate", lambda kf, k: 100.0)
    monkeypatch.setattr(autotune, "_confirm", lambda *a: pytest.fail("the same code needs no check"))
    autotune._swap_improved()
    new = f.cache[key]
    assert new is not old and autotune._same_code(old, new)
    assert any("tuned config" in t for t in new.exe.templates)
