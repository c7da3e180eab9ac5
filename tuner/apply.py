"""`apply_records`: tuned configs from a records file become `pick`'s answer (source "tuned").

Installed on creation (global) and removed when used as a context manager exits or on `remove()`.
Kernels compiled before are recompiled on their next call (the dispatcher drops its compiled entries
whenever the schedule sources change). A task without a record keeps the template's default, with no
warning per call: `summary()` says how many tasks of the records matched.

>>> with apply_records("tune.jsonl"):   # doctest: +SKIP
...     f(a, b)                         # built with the best tuned config of each task
"""
from __future__ import annotations

import os
from typing import Iterable

from jitop.tuner import records as rec_io
from jitop.tuner.records import Record
from jitop.tuner.task import Choice, Task, add_source, remove_source


class apply_records:  # noqa: N801 - used like a function, as TVM's ApplyHistoryBest and numpy's errstate
    """Serve the best record per task from `records` (a JSON-lines path or Record objects)."""

    def __init__(self, records: str | os.PathLike | Iterable[Record]):
        loaded = rec_io.load(records) if isinstance(records, (str, os.PathLike)) else list(records)
        self.best = rec_io.best(loaded)
        self.served: set[str] = set()
        self.missed: set[str] = set()
        add_source(self.source, first=True)

    def source(self, task: Task) -> Choice | None:
        """`pick`'s question: the tuned config of `task`, or None (then the default answers)."""
        rec = self.best.get(task.key)
        if rec is None:
            self.missed.add(task.key)
            return None
        self.served.add(task.key)
        return Choice(rec.config, "tuned", f"{rec.gflops:.1f} GFLOP/s measured {_when(rec.result.timestamp)}")

    def remove(self) -> None:
        """Stop serving these records."""
        remove_source(self.source)

    def summary(self) -> str:
        """One line: tuned tasks served and untuned tasks that used their default."""
        return (f"tuned records: {len(self.best)} tasks; served {len(self.served)}, "
                f"{len(self.missed)} untuned task(s) used the template default")

    def __enter__(self) -> "apply_records":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _when(timestamp: float) -> str:
    import time
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp)) if timestamp else "(no time)"
