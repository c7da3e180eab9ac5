"""Byte stores for compiled artefacts. The cache can never make a call fail: any error is a miss.

>>> store = DiskStore("/tmp/jitop-cache")     # doctest: +SKIP
>>> store.put("key", b"object code")          # doctest: +SKIP
>>> store.get("key")                          # doctest: +SKIP
b'object code'
"""
from __future__ import annotations

import warnings
from typing import Protocol


class Store(Protocol):
    def get(self, key: str) -> bytes | None: ...
    def put(self, key: str, value: bytes) -> None: ...


class NullStore:
    """Remembers nothing (caching disabled)."""

    def get(self, key: str) -> bytes | None:
        return None

    def put(self, key: str, value: bytes) -> None:
        pass


class DiskStore:
    """A diskcache-backed store shared safely by many processes; writes are atomic (SQLite)."""

    def __init__(self, directory: str):
        self.directory = directory
        self._cache = None
        self._warned = False

    def _open(self):
        if self._cache is None:
            import diskcache  # imported on first use: it costs ~20 ms
            self._cache = diskcache.Cache(self.directory)
        return self._cache

    def _warn(self, what: str, err: Exception) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"jitop cache at {self.directory}: {what} failed ({err!r}); continuing without it",
                          RuntimeWarning, stacklevel=3)

    def get(self, key: str) -> bytes | None:
        try:
            value = self._open().get(key)
        except Exception as err:  # corrupt, unreadable, locked: a miss
            self._warn("read", err)
            return None
        return value if isinstance(value, bytes) else None

    def put(self, key: str, value: bytes) -> None:
        try:
            self._open().set(key, value)
        except Exception as err:  # full disk, read-only directory: skip
            self._warn("write", err)
