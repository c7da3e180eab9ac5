"""Kernels built beside the program: `@jitop.kernel(compile="background")`, or JITOP_COMPILE=background.

A call whose signature has no kernel in memory, in a warm record or in the disk cache runs as plain numpy at
once (the function itself runs: its results are numpy's), while a forked child process traces and compiles that
signature into the disk cache with its warm record (jitop.graph.warm). A later call of the signature, once the
child is done, loads the kernel from there without tracing or compiling (a function that cannot have a warm
record is traced, and its kernel found in the disk cache). A program's first calls are never
slower than numpy; its kernels are ready for the rest of the run and for the next process: what a cold cache
costs moves off the call path (as a JIT's interpreter tier runs code while its compiler works).

One child at a time per process (a build forks helpers of its own: jitop.codegen.forked): a signature that
misses while a child builds another runs as numpy and waits in a queue. A child that fails,
crashes or runs past BUILD_TIMEOUT_S of CPU time (at nice 19 beside a busy program, wall time says little)
leaves its signature to be built the usual way at its next call, in the
program's process (with the usual warning if it runs as numpy): a child never decides what a call computes.
Forking needs a process without other Python threads (jitop.codegen.children.may_fork); where it cannot fork,
the call compiles as it would without this mode.

A child still building when the program exits finishes into the disk cache on its own, and the builds still
queued then are made by one more child, after the exit (the next run finds their kernels); `wait()` waits for
them instead (tests, benchmarks, a program that wants its kernels built before it ends).

>>> status("a record no child built") is None
True
>>> wait(timeout=0)
True
"""
from __future__ import annotations

import atexit
import functools
import os
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

from jitop import cachedir
from jitop.codegen import children
from jitop.runtime import fastcall

__all__ = ["BUILD_TIMEOUT_S", "defer", "pending", "status", "wait"]

BUILD_TIMEOUT_S = 300.0  # a child using more CPU time is stopped; its signature is built at its next call
HANG_FACTOR = 4          # ... and one taking this many times as long in wall time (a hang uses no CPU)
_POLL_S = 0.005
_MAX_FINISHED = 4096     # records remembered as built beside (or failed); forgotten all at once past this


@dataclass
class _Build:
    records: tuple[str, ...]        # where the kernel it builds will be found (its warm records' keys)
    owner: Hashable                 # what it builds for: a function's argument structure
    build: Callable[[], object]
    child: children.Child | None = None
    started: float = 0.0


_lock = threading.Lock()
_running: _Build | None = None
_queued: dict[Hashable, _Build] = {}  # the builds waiting for the child, by owner
_finished: dict[str, bool] = {}  # record -> whether its child exited cleanly
_at_exit_registered = False
_forked = False  # this process is a child: whatever it builds (a kernel its trace calls), it builds itself


def _after_fork() -> None:
    """In a forked child: no builds of the parent's, a lock of its own (the parent may have held it)."""
    global _lock, _running, _forked
    _lock, _running, _forked = threading.Lock(), None, True
    _queued.clear()


os.register_at_fork(after_in_child=_after_fork)


def defer(records: Sequence[str], owner: Hashable, build: Callable[[], object]) -> bool:
    """Whether a call whose kernel would be found at one of `records` (its warm records' keys) runs as numpy now:
    a child builds it (now, or after the builds before it). `owner`: what the build is for (a function's
    argument structure): a later call of the same owner takes its place in the queue (its shape decisions are
    the newer). False: build it here (its child is done and its kernel was not found, or no child can start)."""
    with _lock:
        _reap()
        if any(r in _finished for r in records):
            return False
        if _running is not None and any(r in _running.records for r in records):
            return True
        if _forked or not children.may_fork():
            return False
        _queued.pop(owner, None)
        _queued[owner] = _Build(tuple(records), owner, build)
        _register_at_exit()
        _start_next()
        return True


def pending(owner: Hashable) -> bool:
    """Whether a child builds, or will build, a kernel for `owner` (a call of it runs as numpy without looking
    for its kernel: it is built by then, or it waits for the running build)."""
    with _lock:
        _reap()
        return owner in _queued or _running is not None and _running.owner == owner


def status(record: str) -> str | None:
    """"running", "queued", "built" (its child exited cleanly), "failed", or None (no child built `record`)."""
    with _lock:
        _reap()
        if _running is not None and record in _running.records:
            return "running"
        if any(record in b.records for b in _queued.values()):
            return "queued"
        done = _finished.get(record)
        return None if done is None else "built" if done else "failed"


def wait(timeout: float | None = None) -> bool:
    """Wait until no child builds and none is queued (at most `timeout` seconds); whether that is so."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with _lock:
            _reap()
            if _running is None and not _queued:
                return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def _start_next() -> None:
    """Fork a child for the oldest queued build if none runs. Under _lock."""
    global _running
    while _running is None and _queued:
        b = _queued.pop(next(iter(_queued)))
        cachedir.close_all()  # (the child writes to the cache)
        b.child, b.started = children.fork(functools.partial(_in_child, [b.build])), time.monotonic()
        if b.child is None:
            _finish(b, False)
        else:
            _running = b


def _reap() -> None:
    """The running child's outcome, if it has exited (or is stopped past BUILD_TIMEOUT_S), and the next build
    started. Under _lock."""
    global _running
    if _running is None:
        return
    code = children.poll(_running.child)
    if code is None and _overrun(_running):
        code = children.stop(_running.child)
    if code is None:
        return
    _finish(_running, code == 0)
    _running = None
    _start_next()


def _overrun(b: _Build) -> bool:
    """Whether a running child has used more than BUILD_TIMEOUT_S of CPU (its own and its reaped helpers'), or
    taken HANG_FACTOR times that in wall time (where its CPU time cannot be read, BUILD_TIMEOUT_S of wall time)."""
    wall = time.monotonic() - b.started
    if wall <= BUILD_TIMEOUT_S:
        return False
    cpu = _cpu_seconds(b.child.pid)
    return wall > HANG_FACTOR * BUILD_TIMEOUT_S if cpu is not None and cpu <= BUILD_TIMEOUT_S else True


def _cpu_seconds(pid: int) -> float | None:
    """User and system time of a process and its reaped children (Linux's /proc), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _finish(b: _Build, ok: bool) -> None:
    if len(_finished) >= _MAX_FINISHED:
        _finished.clear()
    _finished.update((r, ok) for r in b.records)


def _register_at_exit() -> None:
    global _at_exit_registered
    if not _at_exit_registered:
        atexit.register(_build_queued_after_exit)
        _at_exit_registered = True


def _build_queued_after_exit() -> None:
    """At the program's exit: the builds still queued, one after another in one child that outlives it (the
    next run finds their kernels); the running child finishes on its own."""
    with _lock:
        builds = [b.build for b in _queued.values()]
        _queued.clear()
    if builds and children.may_fork():
        cachedir.close_all()
        children.fork(functools.partial(_in_child, builds))


def _in_child(builds: Sequence[Callable[[], object]]) -> bytes:
    """A child's work: the builds (into the disk cache and warm records), at a lower priority than the program
    it was forked from; its warnings are the parent's to give, if a signature is built there."""
    warnings.simplefilter("ignore")
    try:
        os.nice(19)
    except OSError:
        pass
    failed = 0
    for build in builds:
        try:
            build()
        except Exception:  # noqa: BLE001 - that signature is built at its next call, in the program
            failed += 1
    fastcall.available()  # the native entry's object code too, if no process has stored it yet
    if failed:
        raise RuntimeError(f"{failed} of {len(builds)} builds failed")
    return b""
