"""Background tuning with hot swap: `@jitop.kernel(autotune="background")` or JITOP_AUTOTUNE=background.

A watcher thread (one per process, started by the first such kernel) looks every POLL_S seconds at the
kernels that opted in. A tuning task whose measured time so far (calls x one timed call) passes
JITOP_AUTOTUNE_MIN_SECONDS (0.5) and that has no tuned record is tuned by `jitop tune --tasks KEY --budget B`
(JITOP_AUTOTUNE_BUDGET, 2m) in a low-priority (`nice`) subprocess; the program keeps running on its current
kernel. The tuner saves each improvement in the cache as it is measured (its candidates' outputs checked
against the default config's); the watcher sees the record, builds the new kernel in a thread of the lowest
CPU priority (Linux), then swaps it into the dispatcher in one step: the next call runs it, calls in flight
finish on the old one, no call waits for the build. The program then confirms the swap: if it calls the new
kernel at a lower rate than the old one (counted VERIFY_S before the build and after the swap), the old kernel
is put back. One tuning process per cache directory at a time (a lock file in the cache, taken by `jitop tune`).

>>> mode(None) in ("off", "background")
True
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Iterator

from jitop import config

POLL_S = 0.5
VERIFY_S = 2.0          # a swap's check: the program's calls of the signature counted this long before and after
VERIFY_MIN_CALLS = 20   # fewer calls in a window cannot tell two kernels apart: the swap stands
SLOWER = 0.95           # called at under 95 % of the old kernel's rate: the old kernel is put back
_BUILD_SWITCH_INTERVAL_S = 0.0002
_kernels: "weakref.WeakSet[Any]" = weakref.WeakSet()
_state: dict[str, Any] = {"thread": None, "proc": None, "task": None, "tried": set(), "served": {}}
_lock = threading.Lock()


def mode(requested: str | None) -> str:
    """A kernel's autotune mode: its own argument (ValueError if unknown), else JITOP_AUTOTUNE (warned about and
    ignored if unknown), else "off"."""
    if requested is not None:
        if requested not in ("off", "background"):
            raise ValueError(f"autotune={requested!r}: expected 'off' or 'background'")
        return requested
    env = config.autotune()
    if env and env not in ("off", "background"):
        warnings.warn(f"ignoring JITOP_AUTOTUNE={env!r}: expected 'off' or 'background'", RuntimeWarning, stacklevel=3)
        return "off"
    return env or "off"


def watch(kernel: Any) -> None:
    """Follow this kernel function (called when it compiles a signature); starts the watcher thread once."""
    _kernels.add(kernel)
    with _lock:
        if _state["thread"] is None:
            t = threading.Thread(target=_loop, name="jitop-autotune", daemon=True)
            _state["thread"] = t
            t.start()


def _loop() -> None:
    while True:
        time.sleep(POLL_S)
        try:
            _step()
        except Exception:  # noqa: BLE001 - background tuning never disturbs the program
            pass


def _step() -> None:
    """One look: swap in kernels whose tasks got better records; start a tuner if none runs and one is due."""
    _swap_improved()
    proc = _state["proc"]
    if proc is not None and proc.poll() is None:
        return
    _state["proc"] = None
    task = _due_task()
    if task is not None:
        _start_tuner(task)


def _due_task() -> Any:
    """The heaviest untuned task of the watched kernels past JITOP_AUTOTUNE_MIN_SECONDS, or None."""
    spent: dict[str, list] = {}
    for kf in list(_kernels):
        for ov in kf.dispatcher.overloads():
            if not ov.seconds:
                continue
            for task in ov.tasks:
                spent.setdefault(task.key, [task, 0.0])[1] += ov.served * ov.seconds / max(1, len(ov.tasks))
    least = config.autotune_min_seconds()
    due = [(s, t) for t, s in spent.values() if s >= least and t.key not in _state["tried"] and not _tuned(t)]
    return max(due, key=lambda d: d[0])[1] if due else None


def _tuned(task: Any) -> bool:
    from jitop.tuner.cached import tuned_store
    return tuned_store().get(task.target.key, task.template, task.key) is not None


def _start_tuner(task: Any) -> None:
    """`jitop tune` on this one task in a nice'd subprocess (its workload is flushed to the log first)."""
    from jitop import workloads
    workloads.flush()
    _state["tried"].add(task.key)
    cmd = [sys.executable, "-m", "jitop", "tune", "--tasks", task.key, "--budget", config.autotune_budget(), "--no-progress"]
    log = open(os.devnull, "w")
    env = {**os.environ, "JITOP_AUTOTUNE": "off"}  # the tuner itself never starts another tuner
    _state["proc"] = subprocess.Popen(cmd, stdout=log, stderr=log, env=env,
                                      preexec_fn=_low_priority if os.name == "posix" else None)
    _state["task"] = task


def _low_priority() -> None:
    os.nice(10)


@contextlib.contextmanager
def _short_gil_turns() -> Iterator[None]:
    """While this thread builds (Python lowering holds the GIL), hand the GIL back to the program's threads
    every 0.2 ms instead of every 5 ms, and keep the cyclic garbage collector off (a full collection triggered
    by the lowering's many objects runs with the GIL held): a call of the program would otherwise stall (the
    slowest call near a swap: 17-32 ms before, 5-8 ms with both, one run each). Both restored after."""
    import gc
    before = sys.getswitchinterval()
    collecting = gc.isenabled()
    sys.setswitchinterval(min(before, _BUILD_SWITCH_INTERVAL_S))
    gc.disable()
    try:
        yield
    finally:
        sys.setswitchinterval(before)
        if collecting:
            gc.enable()


def _swap_improved() -> None:
    """Rebuild, off the call path, every watched signature whose task has a better tuned record than the
    config it was built with; then swap it in."""
    from jitop.tuner.cached import tuned_store
    ts = tuned_store()
    for kf in list(_kernels):
        d = kf.dispatcher
        for ov in d.overloads():
            if not ov.tasks or not d.serves(ov):
                continue
            stamp = tuple(ts.get(t.target.key, t.template, t.key) for t in ov.tasks)
            if any(stamp) and _state["served"].get((id(d), ov.key)) != stamp:
                _state["served"][(id(d), ov.key)] = stamp
                if config.cache_enabled():
                    _swap(kf, ov)


def _swap(kf: Any, ov: Any) -> None:
    """Build `ov`'s signature again (a better record arrived) and swap it in, checked by the program's rate."""
    d = kf.dispatcher
    before = _call_rate(d, ov)
    new = _build_quietly(kf, ov)
    if not _same_code(ov, new):
        if d.replace(ov, new):  # the swap, at the program's priority
            _confirm(d, ov, new, before)
    elif new.exe.templates != ov.exe.templates:  # the tuner kept the default: same code,
        d.replace(ov, new)                       # but `explain` says where it came from


def _call_rate(d: Any, ov: Any) -> float | None:
    """The program's calls per second of overload `ov` of dispatcher `d` over the next VERIFY_S seconds (this
    thread sleeps meanwhile), or None: too few calls to tell, or it stopped serving meanwhile."""
    if not d.serves(ov):
        return None
    first, start = ov.served, time.perf_counter()
    time.sleep(VERIFY_S)
    if not d.serves(ov):
        return None
    calls = ov.served - first
    return calls / (time.perf_counter() - start) if calls >= VERIFY_MIN_CALLS else None


def _confirm(d: Any, old: Any, new: Any, before: float | None) -> None:
    """The program confirms a swap: if it called the new kernel at under SLOWER x its rate with the old one,
    the old kernel is put back. The tuner measured its candidates while the program kept the cores busy; such
    measurements can mislead (a batch-4 conv ran 1.62 -> 1.87 ms per call after a swap, unconfirmed). The
    record stays in the cache; this process does not take it again (a later record gets its own check)."""
    if before is None or not d.serves(new):
        return
    after = _call_rate(d, new)
    if after is not None and after < SLOWER * before:
        d.replace(new, old)


def _same_code(old: Any, new: Any) -> bool:
    """Whether two builds of a signature are the same kernel (the same disk-cache key): nothing to swap."""
    return old.lookup is not None and new.lookup is not None and old.lookup.key == new.lookup.key


def _build_quietly(kf: Any, entry: Any) -> Any:
    """`kf.built_again(entry)` in a thread of its own at the lowest CPU priority, with short GIL turns; waits
    for it and returns the new kernel (the watcher swaps it in, at the program's priority: the swap holds
    the function's lock). At the program's priority the build takes a core from the kernel's worker threads:
    the slowest call of a conv2d loop during a build took 10-11 ms (1.6-2.0 ms outside builds); at nice 19,
    5-9 ms, the 99th percentile no slower than outside builds (bench_swap.py)."""
    built: list[Any] = []
    failed: list[BaseException] = []

    def build() -> None:
        _lowest_priority()
        try:
            with _short_gil_turns():
                built.append(kf.built_again(entry))
        except Exception as e:  # noqa: BLE001 - raised again in the watcher, which ignores it
            failed.append(e)
    t = threading.Thread(target=build, name="jitop-autotune-build", daemon=True)
    t.start()
    t.join()
    if failed:
        raise failed[0]
    return built[0]


def _lowest_priority() -> None:
    """This thread only at nice 19 (Linux: a nice value is per thread; elsewhere nothing changes, because
    setpriority there would lower the whole program)."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:
            pass
