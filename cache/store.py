"""Byte stores for the persistent cache. The cache can never make a call fail: any error is a miss.

`DiskStore` keeps entries in one directory through diskcache (SQLite + files; every write is one
transaction, so it is atomic and many processes may share the directory). Every value is framed with a
magic, a format version and its sha256, checked on each read: a corrupt, truncated or foreign entry is a
miss and is removed. A directory that is not the user's own, or that group/others may write, is refused
with one warning (native code from it is never loaded): the store then remembers nothing, like
`NullStore`. Least-recently-used entries are evicted beyond the size limit.

Reads take a lighter path when the directory's database exists already (a warm process): one sqlite3
connection reads diskcache's table and value files directly, without importing diskcache and running its
set-up (which writes every setting on each open: ~5 ms of a warm process's first kernel), and refreshes the
entries' LRU times later and to within LRU_RESOLUTION (see `_Reader`). Anything it does not recognise (another
eviction policy, a value not stored as raw bytes or a bytes file, any error) goes to diskcache; every write
goes to diskcache. Checksums are checked on either path.

>>> store = DiskStore("/tmp/jitop-cache")     # doctest: +SKIP
>>> store.put("key", b"object code")          # doctest: +SKIP
>>> store.get("key")                          # doctest: +SKIP
b'object code'
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import random
import stat
import struct
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Iterator, Protocol

MAGIC = b"JTCE"
FORMAT_VERSION = 1
_FRAME = struct.Struct("<4sH32s")  # magic, format version, sha256 of the payload
DEFAULT_SIZE_LIMIT = 2 << 30       # 2 GiB
KEPT = ("meta/", "tuned/", "workload/")  # never evicted: store metadata, tuned records, the workload log
_OPEN_ATTEMPTS = 20                # opening races ("database is locked" when many processes create it at once)


class Store(Protocol):
    def get(self, key: str) -> bytes | None: ...
    def put(self, key: str, value: bytes) -> None: ...


class NullStore:
    """Remembers nothing (caching disabled): every read misses, every write is dropped, lists are empty."""

    directory = None
    refused: str | None = None
    usable = False

    def get(self, key: str) -> bytes | None:
        return None

    def put(self, key: str, value: bytes) -> None:
        pass

    def delete(self, key: str) -> None:
        pass

    def keys(self, prefix: str = "") -> list[str]:
        return []

    def items(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        return iter(())

    def update(self, key: str, change: Callable[[bytes | None], bytes | None]) -> None:
        pass

    def clear(self, prefix: str = "") -> int:
        return 0

    def volume(self) -> int:
        return 0


def frame(payload: bytes) -> bytes:
    """A value as stored: header (magic, version, sha256) + payload."""
    return _FRAME.pack(MAGIC, FORMAT_VERSION, hashlib.sha256(payload).digest()) + payload


def unframe(data: Any) -> bytes | None:
    """The payload of a stored value, or None unless its header and checksum are right."""
    if not isinstance(data, (bytes, bytearray)) or len(data) < _FRAME.size:
        return None
    magic, version, digest = _FRAME.unpack_from(data)
    payload = bytes(data[_FRAME.size:])
    if magic != MAGIC or version != FORMAT_VERSION or hashlib.sha256(payload).digest() != digest:
        return None
    return payload


def refusal(directory: str) -> str | None:
    """Why `directory` must not be used as a cache (not the user's own, or writable by group/others), or None.
    A directory that does not exist yet is fine (it is created private)."""
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"cannot be inspected ({err.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    writers = [who for who, bit in (("its group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit]
    if writers:
        return f"is writable by {' and '.join(writers)} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def make_private(directory: str) -> None:
    """Close a directory of ours to group and others (mode 700): what diskcache creates inside it follows the
    umask (possibly group-writable), so only a private top directory keeps others from replacing entries."""
    mode = stat.S_IMODE(os.stat(directory).st_mode)
    if mode & 0o077:
        os.chmod(directory, mode & 0o700)


_FULL = object()  # _Reader.get: not something the light path reads, ask diskcache
_DBNAME = "cache.db"  # diskcache.core.DBNAME
_MODE_RAW, _MODE_BINARY = 1, 2  # diskcache.core.MODE_RAW / MODE_BINARY: bytes in the row / in a value file
LRU_RESOLUTION = 600.0  # seconds: a read refreshes an entry's LRU time only if it is older than this
_PENDING_MAX = 256      # refreshed LRU times kept before they are written (else at exit or close)


class _Reader:
    """Reads values diskcache stored (diskcache 5's table: key, raw, expire_time, access_time, mode, filename,
    value) through one sqlite3 connection. Made only for a database diskcache set up with the
    least-recently-used policy and without statistics (what DiskStore always asks for); anything else raises,
    and the store uses diskcache.

    diskcache's `get` writes each read entry's access time (the LRU order) at once: a process's first write
    costs 1-3 ms (SQLite starts a new write-ahead log), on the first kernel's path. Here an access time is
    refreshed only when it is older than LRU_RESOLUTION (the order eviction sees is exact to that), and the
    refresh is written later: at exit, on close, before an eviction, or once _PENDING_MAX are waiting. A
    refresh lost (the process killed, the database busy) only makes an entry look older to eviction."""

    _SELECT = ("SELECT mode, filename, value, access_time FROM Cache WHERE key = ? AND raw = 1"
               " AND (expire_time IS NULL OR expire_time > ?)")

    def __init__(self, directory: str):
        import sqlite3  # ~1 ms; diskcache imports it too
        self.directory = directory
        path = os.path.join(directory, _DBNAME)
        if not os.path.isfile(path):
            raise FileNotFoundError(path)  # a new directory: diskcache creates the database
        self._lock = threading.Lock()  # one connection for every thread, one statement at a time
        self._pid = os.getpid()
        self._pending: dict[str, float] = {}  # key -> access time to write
        self._con = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            settings = dict(self._con.execute("SELECT key, value FROM Settings").fetchall())
            if settings.get("eviction_policy") != "least-recently-used" or settings.get("statistics", 0):
                raise ValueError("the database is set up for another eviction policy or counts statistics")
            self._con.execute(f"PRAGMA synchronous = {int(settings.get('sqlite_synchronous', 1))}")
        except BaseException:
            self._con.close()
            raise
        atexit.register(_flush_at_exit, weakref.ref(self))

    def get(self, key: str) -> Any:
        """The stored (framed) value, None if there is none, or _FULL (diskcache must read it)."""
        with self._lock:
            rows = self._con.execute(self._SELECT, (key, time.time())).fetchall()
        if not rows:
            return None
        ((mode, filename, value, accessed),) = rows
        if mode == _MODE_RAW and isinstance(value, (bytes, bytearray)):
            data = bytes(value)
        elif mode == _MODE_BINARY and isinstance(filename, str):
            try:
                with open(os.path.join(self.directory, filename), "rb") as fh:
                    data = fh.read()
            except OSError:  # removed since the row was read (evicted, replaced): a miss, as in diskcache
                return None
        else:
            return _FULL
        now = time.time()
        if not isinstance(accessed, (int, float)) or now - accessed > LRU_RESOLUTION:
            self._pending[key] = now
            if len(self._pending) >= _PENDING_MAX:
                self.flush()
        return data

    def keys(self, prefix: str) -> list[str]:
        """Every text key starting with `prefix`, in diskcache's order (ascending)."""
        with self._lock:
            rows = self._con.execute("SELECT key FROM Cache WHERE raw = 1 AND typeof(key) = 'text'"
                                     " AND substr(key, 1, ?) = ? ORDER BY key ASC",
                                     (len(prefix), prefix)).fetchall()
        return [k for (k,) in rows if k.startswith(prefix)]

    def flush(self) -> None:
        """Write the refreshed access times (a short wait for the lock; given up, they are dropped)."""
        if self._pid != os.getpid() or not self._pending:  # a forked child never uses its parent's connection
            return
        with self._lock:
            pending, self._pending = list(self._pending.items()), {}
            try:
                self._con.execute("PRAGMA busy_timeout = 250")
                self._con.execute("BEGIN IMMEDIATE")
                try:
                    self._con.executemany("UPDATE Cache SET access_time = ? WHERE key = ? AND raw = 1",
                                          [(t, k) for k, t in pending])
                    self._con.execute("COMMIT")
                except BaseException:
                    self._con.execute("ROLLBACK")
                    raise
            except Exception:  # noqa: BLE001 - read-only, busy, closed: LRU times only
                pass
            finally:
                with contextlib.suppress(Exception):
                    self._con.execute("PRAGMA busy_timeout = 30000")

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._con.close()


_inherited: list[_Reader] = []  # readers a forked child got from its parent (closing one could touch its locks)


def _flush_at_exit(ref: "weakref.ref[_Reader]") -> None:
    reader = ref()
    if reader is not None:
        with contextlib.suppress(Exception):
            reader.flush()


class DiskStore:
    """A diskcache-backed store shared by many processes; checked values, LRU eviction beyond `size_limit`."""

    def __init__(self, directory: str, size_limit: int = DEFAULT_SIZE_LIMIT):
        self.directory = directory
        self.size_limit = size_limit
        self.refused: str | None = None
        self.stats = {"hits": 0, "misses": 0, "corrupt": 0, "writes": 0, "errors": 0}
        self._cache: Any = None
        self._reader: _Reader | None = None
        self._reader_failed = False
        self._pid = os.getpid()
        self._failed = False
        self._warned = False
        self._lock = threading.Lock()

    # ** opening **
    def _forked(self) -> None:
        if self._pid != os.getpid():  # a forked child: SQLite connections must not cross fork, open anew
            if self._reader is not None:  # the parent's connection: never used, nor closed, here
                _inherited.append(self._reader)
            self._cache, self._reader, self._reader_failed, self._pid = None, None, False, os.getpid()

    def _light(self) -> _Reader | None:
        """The light read path (see the module's docstring), or None: the directory has no database yet, is
        refused (diskcache's opening then warns), or the database is not one the light path reads."""
        self._forked()
        if self._reader is not None or self._reader_failed:
            return self._reader
        with self._lock:
            if self._reader is None and not self._reader_failed:
                try:
                    if refusal(self.directory) is not None:
                        raise PermissionError(self.directory)
                    make_private(self.directory)
                    self._reader = _Reader(self.directory)
                except Exception:  # noqa: BLE001 - diskcache opens it (and warns if it cannot)
                    self._reader_failed = True
        return self._reader

    def _drop_reader(self, reader: _Reader) -> None:
        with self._lock:
            if self._reader is reader:
                self._reader, self._reader_failed = None, True
        with contextlib.suppress(Exception):
            reader.close()

    def _open(self) -> Any:
        self._forked()
        if self._cache is not None or self._failed:
            return self._cache
        with self._lock:
            if self._cache is None and not self._failed:
                try:
                    self._cache = self._open_checked()
                except Exception as err:  # noqa: BLE001 - read-only, unreadable, locked: run from memory
                    self._failed = True
                    self._warn("opening", err)
        return self._cache

    def _open_checked(self) -> Any:
        why = refusal(self.directory)
        if why is None and not os.path.isdir(self.directory):
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            why = refusal(self.directory)  # an existing parent's umask does not matter; the dir itself does
        if why is not None:
            self.refused = why
            raise PermissionError(f"the directory {why}; its native code is never loaded")
        make_private(self.directory)
        import diskcache  # imported on first use: it costs ~20 ms
        for attempt in range(_OPEN_ATTEMPTS):
            try:
                # every value a file (disk_min_file_size=0): deleting one then frees its bytes, which the
                # eviction below counts on (rows inside the SQLite file do not shrink it); diskcache's own
                # culling is off (cull_limit=0): it removes 16 entries at a time, the one just written too
                return diskcache.Cache(self.directory, size_limit=self.size_limit, timeout=30,
                                       eviction_policy="least-recently-used", cull_limit=0, disk_min_file_size=0)
            except Exception as err:  # sqlite3.OperationalError: database is locked (a concurrent creator)
                if "locked" not in str(err) or attempt == _OPEN_ATTEMPTS - 1:
                    raise
                time.sleep(0.01 * (1 + attempt) * random.random())
        raise AssertionError("unreachable")

    def _warn(self, what: str, err: Exception) -> None:
        self.stats["errors"] += 1
        if not self._warned:
            self._warned = True
            try:
                warnings.warn(f"jitop cache at {self.directory}: {what} failed ({err}); continuing without it",
                              RuntimeWarning, stacklevel=4)
            except Exception:  # noqa: BLE001 - warnings turned into errors (-W error) must not fail the call
                pass

    @property
    def usable(self) -> bool:
        """Whether the directory could be opened (False after a refusal or an error on opening)."""
        return self._light() is not None or self._open() is not None

    # ** entries **
    def get(self, key: str) -> bytes | None:
        """The payload stored under `key`, or None (missing, corrupt: removed, or any error)."""
        raw, reader = _FULL, self._light()
        if reader is not None:
            try:
                raw = reader.get(key)
            except Exception:  # noqa: BLE001 - locked past the timeout, an unknown table: diskcache decides
                self._drop_reader(reader)
                raw = _FULL
        if raw is _FULL:
            cache = self._open()
            if cache is None:
                return None
            try:
                raw = cache.get(key)
            except Exception as err:  # noqa: BLE001 - a corrupt database or a vanished file: a miss
                self._warn("reading", err)
                return None
        if raw is None:
            self.stats["misses"] += 1
            return None
        payload = unframe(raw)
        if payload is None:
            self.stats["corrupt"] += 1
            self.delete(key)
            return None
        self.stats["hits"] += 1
        return payload

    def put(self, key: str, value: bytes) -> None:
        """Store `value` under `key` (one atomic write; errors are skipped with one warning)."""
        cache = self._open()
        if cache is None:
            return
        try:
            cache.set(key, frame(value))
            self.stats["writes"] += 1
            if cache.volume() > self.size_limit:
                self._evict(cache, keep=key)
        except Exception as err:  # noqa: BLE001 - full disk, read-only directory: skip
            self._warn("writing", err)

    def _evict(self, cache: Any, keep: str) -> None:
        """Remove least-recently-used entries until the cache is under its size limit again; never `keep` (the
        entry just written) nor entries under a KEPT prefix (small, and costly or impossible to rebuild)."""
        if self._reader is not None:  # the access times this process's reads refreshed count too
            self._reader.flush()
        excess = cache.volume() - self.size_limit
        rows = cache._sql("SELECT key, size FROM Cache ORDER BY access_time LIMIT 1000").fetchall()
        for key, size in rows:
            if excess <= 0:
                break
            if key == keep or not isinstance(key, str) or key.startswith(KEPT):
                continue
            if cache.delete(key):
                excess -= size or 0
                self.stats["evicted"] = self.stats.get("evicted", 0) + 1

    def delete(self, key: str) -> None:
        """Remove one entry (nothing if it is missing or the store is unusable)."""
        cache = self._open()
        if cache is not None:
            with contextlib.suppress(Exception):
                cache.delete(key)

    def update(self, key: str, change: Callable[[bytes | None], bytes | None]) -> None:
        """Read-modify-write under the store's lock across processes: `change(old payload or None)` returns the
        new payload (None: leave it)."""
        cache = self._open()
        if cache is None:
            return
        try:
            with cache.transact():
                new = change(unframe(cache.get(key)))
                if new is not None:
                    cache.set(key, frame(new))
                    self.stats["writes"] += 1
        except Exception as err:  # noqa: BLE001
            self._warn("updating", err)

    def keys(self, prefix: str = "") -> list[str]:
        """Every key starting with `prefix`."""
        reader = self._light()
        if reader is not None:
            try:
                return reader.keys(prefix)
            except Exception:  # noqa: BLE001 - diskcache lists them
                self._drop_reader(reader)
        cache = self._open()
        if cache is None:
            return []
        try:
            return [k for k in cache.iterkeys() if isinstance(k, str) and k.startswith(prefix)]
        except Exception as err:  # noqa: BLE001
            self._warn("listing", err)
            return []

    def items(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        """(key, payload) of every valid entry whose key starts with `prefix`."""
        for key in self.keys(prefix):
            value = self.get(key)
            if value is not None:
                yield key, value

    def clear(self, prefix: str = "") -> int:
        """Remove every entry whose key starts with `prefix` (everything by default); how many were removed."""
        keys = self.keys(prefix)
        for key in keys:
            self.delete(key)
        return len(keys)

    def volume(self) -> int:
        """Bytes the cache occupies on disk (database and files)."""
        cache = self._open()
        try:
            return int(cache.volume()) if cache is not None else 0
        except Exception:  # noqa: BLE001
            return 0

    def close(self) -> None:
        """Close the database (reopened on the next use)."""
        with self._lock:
            if self._cache is not None:
                with contextlib.suppress(Exception):
                    self._cache.close()
            reader, self._cache, self._reader, self._reader_failed = self._reader, None, None, False
        if reader is not None:
            with contextlib.suppress(Exception):
                reader.close()
