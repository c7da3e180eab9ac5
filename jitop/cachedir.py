"""The process's persistent cache store, for the current JITOP_CACHE / JITOP_CACHE_DIR / JITOP_CACHE_SIZE.

Kernels (jitop.graph.kernel_cache), the runtime's own object code, tuned records and the workload log
(jitop.tuner) all live in this one store, each under its own key prefix.

>>> st = store()
>>> st.get("no such key") is None
True
"""
from __future__ import annotations

import threading
from typing import Any

from jitop import config
from jitop.cache import keys
from jitop.cache.store import DiskStore, NullStore

KERNEL, INFO = "kernel/", "kernel-info/"
SCHEMA_MARK = "meta/kernel-schema"
_KEYED_BY_SCHEMA = (KERNEL, INFO, "pool/", "fastcall/")  # prefixes whose keys include keys.SCHEMA_VERSION
NULL = NullStore()
_stores: dict[tuple, Any] = {}
_lock = threading.Lock()


def store() -> DiskStore | NullStore:
    """The store for the current environment (a NullStore when JITOP_CACHE=0)."""
    if not config.cache_enabled():
        return NULL
    where = (config.cache_dir(), config.cache_size())
    found = _stores.get(where)
    if found is None:
        with _lock:
            found = _stores.get(where)
            if found is None:
                found = _stores[where] = DiskStore(*where)
                _drop_other_schemas(found)
    return found


def _drop_other_schemas(st: DiskStore) -> None:
    """Entries keyed under another key schema can never be hit again: remove them when a store is first
    opened by a jitop with a different schema (tinygrad's versioned table, without the stale table)."""
    mark, ours = st.get(SCHEMA_MARK), str(keys.SCHEMA_VERSION).encode()
    if mark == ours or not st.usable:
        return
    if mark is not None:
        for prefix in _KEYED_BY_SCHEMA:
            st.clear(prefix)
    st.put(SCHEMA_MARK, ours)
