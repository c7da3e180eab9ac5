"""The workload log: every tuning task programs dispatched, with calls and time, merged across processes.

Entries live under "workload/<target key>/<task key>" as JSON: the task (its own JSON, opaque here),
total calls, total seconds (calls x the measured time of one call, split over the kernel's tasks), the
functions that ran it, and when it was first and last seen. Adding is a read-modify-write transaction, so
concurrent processes never lose each other's counts.

>>> from jitop.cache.store import NullStore
>>> WorkloadLog(NullStore()).entries()
[]
"""
from __future__ import annotations

import json
import time
from typing import Any

PREFIX = "workload/"
MAX_FUNCTIONS = 16  # names kept per workload (for the report)


class WorkloadLog:
    """Counts per task in a store (see the module docstring)."""

    def __init__(self, store: Any):
        self.store = store

    def add(self, target_key: str, task_key: str, task_json: str, calls: int, seconds: float,
            functions: list[str]) -> None:
        """Add `calls` and `seconds` of one task (creating its entry on first sight)."""
        now = time.time()

        def change(old: bytes | None) -> bytes:
            entry = _parse(old) or {"task": task_json, "calls": 0, "seconds": 0.0, "functions": [],
                                    "first_seen": now}
            entry["calls"] += int(calls)
            entry["seconds"] += float(seconds)
            entry["functions"] = list(dict.fromkeys([*entry["functions"], *functions]))[:MAX_FUNCTIONS]
            entry["last_seen"] = now
            return json.dumps(entry, sort_keys=True).encode()
        self.store.update(f"{PREFIX}{target_key}/{task_key}", change)

    def entries(self, target_key: str | None = None) -> list[dict]:
        """Every logged workload (of one Target, if given), heaviest (most seconds) first; each a dict with
        "key", "task" (JSON text), "calls", "seconds", "functions", "first_seen", "last_seen"."""
        prefix = PREFIX + (f"{target_key}/" if target_key else "")
        found = []
        for key, payload in self.store.items(prefix):
            entry = _parse(payload)
            if entry is not None:
                found.append({**entry, "key": key[len(PREFIX):]})
        return sorted(found, key=lambda e: -e["seconds"])

    def clear(self) -> int:
        """Forget every logged workload; how many entries were removed."""
        return self.store.clear(PREFIX)


def _parse(payload: bytes | None) -> dict | None:
    if payload is None:
        return None
    try:
        entry = json.loads(payload)
        if not (isinstance(entry, dict) and isinstance(entry.get("task"), str) and isinstance(entry.get("calls"), int)
                and isinstance(entry.get("seconds"), (int, float)) and isinstance(entry.get("functions"), list)):
            return None
        return entry
    except ValueError:
        return None
