"""The best tuning record per (task, Target) in the persistent cache, as JSON text.

Entries live under "tuned/<target key>/<template>/<task key>", so the records of one template on one
Target (the candidates for transfer to a new workload) are one prefix. A record replaces the stored one
only if it is faster (one read-modify-write transaction: concurrent tuners never lose the better one), with
one exception: an entry knows whether its record was measured here or imported (`jitop cache import`: a
claim), and a measured record always replaces an imported one while an imported one never replaces a
measured one. An entry of an older jitop, without that mark, counts as measured.
This module stores JSON; what a record means is the tuner's business (jitop.tuner.records).

>>> from jitop.cache.store import NullStore
>>> TunedStore(NullStore()).get("cpu-key", "matmul", "abc") is None
True
"""
from __future__ import annotations

import json
from typing import Any, Callable

PREFIX = "tuned/"
MEASURED, IMPORTED = "measured", "imported"


class TunedStore:
    """Best record (JSON text with a "cost" to compare) per task key, grouped by Target key and template."""

    def __init__(self, store: Any):
        self.store = store

    @staticmethod
    def key(target_key: str, template: str, task_key: str) -> str:
        """The store key of one task's record."""
        return f"{PREFIX}{target_key}/{template}/{task_key}"

    def get(self, target_key: str, template: str, task_key: str) -> str | None:
        """The stored record of one task, or None."""
        payload = self.store.get(self.key(target_key, template, task_key))
        try:
            return json.loads(payload)["record"] if payload is not None else None
        except (ValueError, KeyError, TypeError):
            return None

    def put(self, target_key: str, template: str, task_key: str, record_json: str, cost: float,
            usable: Callable[[str], bool] = lambda text: True, imported: bool = False) -> bool:
        """Store `record_json` unless a usable record that wins over it is stored: one at least as fast and as
        trusted, or a measured one where `imported` (`usable(stored record JSON)`: a record the reader could not
        use, from another jitop or planted, never blocks a real one); whether stored."""
        stored = []

        def change(old: bytes | None) -> bytes | None:
            if old is not None and _wins(old, cost, imported) and usable(_record(old)):
                return None
            stored.append(True)
            return json.dumps({"cost": cost, "record": record_json,
                               "origin": IMPORTED if imported else MEASURED}).encode()
        self.store.update(self.key(target_key, template, task_key), change)
        return bool(stored)

    def origin(self, target_key: str, template: str, task_key: str) -> str | None:
        """"measured" or "imported" for the stored entry of one task, None if there is none."""
        payload = self.store.get(self.key(target_key, template, task_key))
        return None if payload is None else _origin(payload)

    def records(self, target_key: str | None = None, template: str | None = None) -> list[str]:
        """Every stored record (of one Target and template, if given), as JSON text."""
        prefix = PREFIX + (f"{target_key}/" if target_key else "") + (f"{template}/" if target_key and template else "")
        out = []
        for key, payload in self.store.items(prefix):
            if template and not target_key and f"/{template}/" not in key:
                continue
            try:
                out.append(json.loads(payload)["record"])
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def clear(self) -> int:
        """Remove every stored record; how many."""
        return self.store.clear(PREFIX)


def _wins(old: bytes, cost: float, imported: bool) -> bool:
    """Whether the stored entry `old` stays against a new record of `cost`: a measured one against an
    imported one always, an imported one against a measured one never, else if at least as fast."""
    old_imported = _origin(old) == IMPORTED
    if old_imported != imported:
        return not old_imported
    return _cost(old) <= cost


def _origin(payload: bytes) -> str:
    try:
        return IMPORTED if json.loads(payload).get("origin") == IMPORTED else MEASURED
    except (ValueError, AttributeError):
        return MEASURED


def _record(payload: bytes) -> str:
    try:
        return str(json.loads(payload)["record"])
    except (ValueError, KeyError, TypeError):
        return ""


def _cost(payload: bytes) -> float:
    try:
        return float(json.loads(payload)["cost"])
    except (ValueError, KeyError, TypeError):
        return float("inf")  # an unreadable entry never blocks a real record
