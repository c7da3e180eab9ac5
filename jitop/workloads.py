"""The workload log at run time: which tuning tasks (matmul/conv2d workloads) programs ran, how often, and
where their time went, so `jitop tune` with no arguments tunes what actually ran.

Counting costs the call path nothing new: the dispatcher (jitop.dispatch) already counts calls per overload,
on the slow path and in the native entry. The counts are turned into per-task records and written to the
cache in batches: at exit, and when a new signature compiles at least a minute after the last write.

>>> isinstance(logged(), list)
True
"""
from __future__ import annotations

import atexit
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

from jitop.cache.workloads import WorkloadLog
from jitop.cachedir import store
from jitop.dispatch import drain_all
from jitop.tuner.task import Task

FLUSH_EVERY_S = 60.0
_last_flush = time.monotonic()
_lock = threading.Lock()


@dataclass
class LoggedWorkload:
    """One task as the log knows it: total calls and seconds over every logged run."""

    task: Task
    calls: int
    seconds: float
    functions: list[str]


def flush() -> list[LoggedWorkload]:
    """Write the calls counted since the last flush to the cache's workload log; returns them. Never raises
    (the log must not make a program fail) and opens nothing when there is nothing to write."""
    global _last_flush
    try:
        with _lock:
            _last_flush = time.monotonic()
            merged, names = _collect()
            if merged:
                _write(merged, names)
    except Exception:  # noqa: BLE001
        return []
    return [LoggedWorkload(task, calls, seconds, sorted(names[key])) for key, (task, calls, seconds) in merged.items()]


def _collect() -> tuple[dict[str, list], dict[str, set[str]]]:
    """The calls every dispatcher counted since the last flush (also of dropped and collected overloads), merged
    per task."""
    names: dict[str, set[str]] = defaultdict(set)
    merged: dict[str, list] = {}
    for count in drain_all():
        names[count.task.key].add(count.function)
        m = merged.setdefault(count.task.key, [count.task, 0, 0.0])
        m[1] += count.calls
        m[2] += count.seconds
    return merged, names


def _write(merged: dict[str, list], names: dict[str, set[str]]) -> None:
    log = WorkloadLog(store())
    for key, (task, calls, seconds) in merged.items():
        log.add(task.target.key, key, task.to_json(), calls, seconds, sorted(names[key]))


def maybe_flush() -> None:
    """Flush if the last write is more than FLUSH_EVERY_S old (called when a signature compiles)."""
    if time.monotonic() - _last_flush > FLUSH_EVERY_S:
        flush()


def logged(target_key: str | None = None) -> list[LoggedWorkload]:
    """The logged workloads (of one Target, if given), heaviest first; unreadable entries are skipped."""
    out = []
    for e in WorkloadLog(store()).entries(target_key):
        try:
            task = Task.from_json(e["task"])
        except (ValueError, KeyError, TypeError):
            continue
        out.append(LoggedWorkload(task, e["calls"], e["seconds"], list(e["functions"])))
    return out


def clear() -> int:
    """Forget the log; how many workloads were removed."""
    return WorkloadLog(store()).clear()


atexit.register(flush)
