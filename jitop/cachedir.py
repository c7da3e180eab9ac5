"""The process's persistent cache store, for the current JITOP_CACHE / JITOP_CACHE_DIR / JITOP_CACHE_SIZE.

Kernels (jitop.graph.kernel_cache), the runtime's own object code, tuned records and the workload log
(jitop.tuner) all live in this one store, each under its own key prefix.

>>> st = store()
>>> st.get("no such key") is None
True
"""
from __future__ import annotations

import threading
import warnings
from typing import Any

from jitop import config
from jitop.cache import keys
from jitop.cache.store import DEFAULT_SIZE_LIMIT, DiskStore, NullStore

KERNEL, INFO = "kernel/", "kernel-info/"
SCHEMA_MARK = "meta/kernel-schema"
_KEYED_BY_SCHEMA = (KERNEL, INFO, "pool/", "fastcall/")  # prefixes whose keys include keys.SCHEMA_VERSION
NULL = NullStore()
_stores: dict[tuple, Any] = {}
_lock = threading.Lock()


def store() -> DiskStore | NullStore:
    """The store for the current environment (a NullStore when JITOP_CACHE=0). A malformed JITOP_CACHE or
    JITOP_CACHE_SIZE is reported once and its default used: the cache never makes a call fail."""
    try:
        enabled = config.cache_enabled()
    except ValueError as err:
        _warn_once(err, "the cache stays on")
        enabled = True
    if not enabled:
        return NULL
    try:
        size = config.cache_size()
    except ValueError as err:
        _warn_once(err, "using the default size limit")
        size = DEFAULT_SIZE_LIMIT
    where = (config.cache_dir(), size)
    found = _stores.get(where)
    if found is None:
        with _lock:
            found = _stores.get(where)
            if found is None:
                found = _stores[where] = DiskStore(*where)
                _drop_other_schemas(found)
    return found


def close_all() -> None:
    """Close every store's database connections (each reopens at its next use): before forking a child that
    writes to the cache. An SQLite connection open across a fork makes the child's own connections share its
    lock state, and their writes can be lost."""
    for st in list(_stores.values()):
        st.close()


_warned: set[str] = set()


def _warn_once(err: Exception, consequence: str) -> None:
    if str(err) not in _warned:
        _warned.add(str(err))
        try:
            warnings.warn(f"jitop cache: {err}; {consequence}", RuntimeWarning, stacklevel=3)
        except Exception:  # noqa: BLE001 - -W error must not turn this into a failed call
            pass


def _drop_other_schemas(st: DiskStore) -> None:
    """Entries keyed under an older key schema can never be hit again: remove them when a newer jitop first
    opens the store (tinygrad's versioned table, without the stale table). An older jitop leaves a newer one's
    entries alone (two installed versions sharing the directory do not wipe each other)."""
    mark, ours = st.get(SCHEMA_MARK), keys.SCHEMA_VERSION
    try:
        theirs = int(mark) if mark is not None else None
    except ValueError:
        theirs = -1
    if theirs == ours or not st.usable or (theirs is not None and theirs > ours):
        return
    if theirs is not None:
        for prefix in _KEYED_BY_SCHEMA:
            st.clear(prefix)
    st.put(SCHEMA_MARK, str(ours).encode())
