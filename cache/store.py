"""Byte stores for the persistent cache. The cache can never make a call fail: any error is a miss.

`DiskStore` keeps entries in one directory through diskcache (SQLite + files; every write is one
transaction, so it is atomic and many processes may share the directory). Every value is framed with a
magic, a format version, a digest of the key it was stored under and the sha256 of the payload, all checked
on each read: a corrupt, truncated or foreign entry, or one moved under another key, is a miss and is
removed. The directory is opened once and checked through its descriptor (cache/directory.py): one that is
not the user's own, or that group/others may write, is refused with one warning (native code from it is
never loaded), and the store then remembers nothing, like `NullStore`. Least-recently-used entries are
evicted beyond the size limit.

Reads never go through diskcache: one sqlite3 connection reads diskcache's table and value files directly
(`_Reader`). It accepts the two ways jitop stores bytes (raw bytes in the row, or a regular value file inside
the directory) and nothing else: a pickled row (which diskcache would unpickle, running whatever it holds), a
FIFO or a device in place of a value file, a file name pointing outside the directory are corrupt entries,
removed. It also spares a warm process diskcache's import and set-up (~5 ms of its first kernel), and refreshes
the entries' LRU times later and to within LRU_RESOLUTION. Every write goes to diskcache.

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
import re
import stat
import struct
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Iterator, Protocol

from jitop.cache.directory import CacheDirectory, Refused

MAGIC = b"JTCE"
FORMAT_VERSION = 2
_FRAME = struct.Struct("<4sH32s32s")  # magic, format version, sha256 of the key, sha256 of the payload
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


def frame(key: str | bytes, payload: bytes) -> bytes:
    """A value as stored under `key`: header (magic, version, sha256 of the key and of the payload) + payload."""
    return _FRAME.pack(MAGIC, FORMAT_VERSION, _digest(key), hashlib.sha256(payload).digest()) + payload


def unframe(key: str | bytes, data: Any) -> bytes | None:
    """The payload of a value stored under `key`, or None unless its header, key and checksum are right."""
    if not isinstance(data, (bytes, bytearray)) or len(data) < _FRAME.size:
        return None
    magic, version, key_digest, digest = _FRAME.unpack_from(data)
    payload = bytes(data[_FRAME.size:])
    if (magic != MAGIC or version != FORMAT_VERSION or key_digest != _digest(key)
            or hashlib.sha256(payload).digest() != digest):
        return None
    return payload


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else bytes(key)).digest()


_CORRUPT = object()  # _Reader.get: a row jitop did not write (another mode, not a regular file): remove it
_DBNAME = "cache.db"  # diskcache.core.DBNAME
_MODE_RAW, _MODE_BINARY = 1, 2  # diskcache.core.MODE_RAW / MODE_BINARY: bytes in the row / in a value file
_VALUE_FILE = re.compile(r"[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]+\.val")  # diskcache's names, inside the directory
_SELECT = ("SELECT mode, filename, value, access_time FROM Cache WHERE key = ? AND raw = 1"
           " AND (expire_time IS NULL OR expire_time > ?)")
_VALUE_DIR = re.compile(r"[0-9a-f]{2}")
_OWN_FILES = (_DBNAME, _DBNAME + "-wal", _DBNAME + "-shm", _DBNAME + "-journal", "tune.lock")
_NONBLOCK = getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
LRU_RESOLUTION = 600.0  # seconds: a read refreshes an entry's LRU time only if it is older than this
_PENDING_MAX = 256      # refreshed LRU times kept before they are written (else at exit or close)


def _row_bytes(row: tuple, where: CacheDirectory, size_limit: int) -> Any:
    """The framed value of a row (mode, filename, value, ...): bytes, None if its value file vanished since the
    row was read (evicted, replaced: a miss, as in diskcache), or _CORRUPT for anything jitop does not write."""
    mode, filename, value = row[:3]
    if mode == _MODE_RAW and isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if mode == _MODE_BINARY and isinstance(filename, str) and _VALUE_FILE.fullmatch(filename):
        return _read_value_file(where, filename, size_limit)
    return _CORRUPT


def _read_value_file(where: CacheDirectory, filename: str, size_limit: int) -> Any:
    """A value file's bytes, opened without blocking (a FIFO never hangs the open) relative to the checked
    directory; anything but a regular file of at most `size_limit` bytes is _CORRUPT."""
    try:
        if os.open in os.supports_dir_fd and where.fd is not None:
            fd = os.open(filename, os.O_RDONLY | _NONBLOCK, dir_fd=where.fd)
        else:
            fd = os.open(os.path.join(where.open(), filename), os.O_RDONLY | _NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError:
        return _CORRUPT
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > size_limit:
            return _CORRUPT
        with open(fd, "rb", closefd=False) as fh:
            return fh.read()  # to its end (value files are written once, never grown)
    finally:
        os.close(fd)


def _own_files(path: str, shown: str) -> list[str]:
    """Every file of a cache directory (relative paths), which must all be jitop's or diskcache's: the database
    and its journals, tune.lock, and value files two hex-named levels down; ValueError names any other."""
    def stranger(*parts: str) -> ValueError:
        return ValueError(f"{os.path.join(shown, *parts)!r} is not a jitop cache file")
    found = [name for name in os.listdir(path) if name in _OWN_FILES]
    for sub in sorted(set(os.listdir(path)) - set(found)):
        if not _VALUE_DIR.fullmatch(sub) or not os.path.isdir(os.path.join(path, sub)):
            raise stranger(sub)
        for name in os.listdir(os.path.join(path, sub)):
            files = os.listdir(os.path.join(path, sub, name)) if _VALUE_DIR.fullmatch(name) else [None]
            if any(f is None or not f.endswith(".val") for f in files):
                raise stranger(sub, name)
            found += [os.path.join(sub, name, f) for f in files]
    return found


class _Reader:
    """Reads values diskcache stored (diskcache 5's table: key, raw, expire_time, access_time, mode, filename,
    value) through one sqlite3 connection: only text keys (`raw = 1`: a pickled key is never matched) and only
    the two modes jitop writes (see _row_bytes).

    diskcache's `get` writes each read entry's access time (the LRU order) at once: a process's first write
    costs 1-3 ms (SQLite starts a new write-ahead log), on the first kernel's path. Here an access time is
    refreshed only when it is older than LRU_RESOLUTION (the order eviction sees is exact to that), and the
    refresh is written later: at exit, on close, before an eviction, or once _PENDING_MAX are waiting. A
    refresh lost (the process killed, the database busy) only makes an entry look older to eviction."""

    def __init__(self, where: CacheDirectory, size_limit: int):
        import sqlite3  # ~1 ms; diskcache imports it too
        self.where, self.size_limit = where, size_limit
        path = os.path.join(where.open(), _DBNAME)
        if not os.path.isfile(path):
            raise FileNotFoundError(path)  # a new directory: the first write creates the database
        self._lock = threading.Lock()  # one connection for every thread, one statement at a time
        self._pid = os.getpid()
        self._pending: dict[str, float] = {}  # key -> access time to write
        self._con = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            settings = dict(self._con.execute("SELECT key, value FROM Settings").fetchall())
            self._con.execute(f"PRAGMA synchronous = {int(settings.get('sqlite_synchronous', 1))}")
        except BaseException:
            self._con.close()
            raise
        atexit.register(_flush_at_exit, weakref.ref(self))

    def get(self, key: str) -> Any:
        """The stored (framed) value, None if there is none, or _CORRUPT."""
        with self._lock:
            rows = self._con.execute(_SELECT, (key, time.time())).fetchall()
        if not rows:
            return None
        data = _row_bytes(rows[0], self.where, self.size_limit)
        accessed, now = rows[0][3], time.time()
        if isinstance(data, bytes) and (not isinstance(accessed, (int, float)) or now - accessed > LRU_RESOLUTION):
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


_RESET_HINT = "`jitop cache clear` resets it"


class DiskStore:
    """A diskcache-backed store shared by many processes; checked values, LRU eviction beyond `size_limit`."""

    def __init__(self, directory: str, size_limit: int = DEFAULT_SIZE_LIMIT):
        self.directory = directory
        self.size_limit = size_limit
        self.refused: str | None = None
        self.stats = {"hits": 0, "misses": 0, "corrupt": 0, "writes": 0, "errors": 0}
        self._where = CacheDirectory(directory)
        weakref.finalize(self, self._where.close).atexit = False  # exit handlers may still write to it
        self._cache: Any = None
        self._reader: _Reader | None = None
        self._reader_failed = False
        self._pid = os.getpid()
        self._failed: Exception | None = None
        self._warned = False
        self._lock = threading.Lock()

    # ** opening **
    @property
    def path(self) -> str | None:
        """Where to reach the checked directory (through its descriptor), or None if it is refused or unusable.
        Files jitop keeps beside the store (tune.lock) are opened inside it."""
        try:
            return self._where.open()
        except OSError as err:
            if isinstance(err, Refused):
                self.refused = str(err)
            return None

    def _forked(self) -> None:
        if self._pid != os.getpid():  # a forked child: SQLite connections must not cross fork, open anew
            if self._reader is not None:  # the parent's connection: never used, nor closed, here
                _inherited.append(self._reader)
            self._cache, self._reader, self._reader_failed, self._pid = None, None, False, os.getpid()

    def _light(self) -> _Reader | None:
        """The reader, or None: the directory has no database yet (nothing to read), or it is refused or
        unreadable (`_open` then says why, once)."""
        self._forked()
        if self._reader is not None or self._reader_failed:
            return self._reader
        if not self._new_reader() and self._open() is not None:
            # a database another process was still creating ("no such table"): diskcache's opening has set up
            # (or waited for) its schema, so one more try reads it; refused or not a database: _open warned
            self._new_reader()
        return self._reader

    def _new_reader(self) -> bool:
        """Open the reader unless one is open or failed; False if opening failed (True: open, or no database
        yet, which a first write creates)."""
        with self._lock:
            if self._reader is not None or self._reader_failed:
                return self._reader is not None
            try:
                self._reader = _Reader(self._where, self.size_limit)
            except FileNotFoundError:
                return True
            except Exception:  # noqa: BLE001 - refused, being created, not a database
                self._reader_failed = self._cache is not None or self._failed is not None
                return False
            return True

    def _open(self) -> Any:
        """diskcache's Cache over the checked directory (for writes), or None with one warning."""
        self._forked()
        if self._cache is not None or self._failed:
            return self._cache
        with self._lock:
            if self._cache is None and not self._failed:
                try:
                    self._cache = self._open_checked()
                except Refused as err:
                    self.refused, self._failed = str(err), err
                    self._warn("opening", PermissionError(f"the directory {err}; its native code is never loaded"))
                except Exception as err:  # noqa: BLE001 - read-only, unreadable, not a database: run from memory
                    self._failed = err
                    self._warn("opening", err, hint=_RESET_HINT)
        return self._cache

    def _open_checked(self) -> Any:
        path = self._where.open()
        import diskcache  # imported on first use: it costs ~20 ms
        for attempt in range(_OPEN_ATTEMPTS):
            try:
                # every value a file (disk_min_file_size=0): deleting one then frees its bytes, which the
                # eviction below counts on (rows inside the SQLite file do not shrink it); diskcache's own
                # culling is off (cull_limit=0): it removes 16 entries at a time, the one just written too
                return diskcache.Cache(path, size_limit=self.size_limit, timeout=30,
                                       eviction_policy="least-recently-used", cull_limit=0, disk_min_file_size=0)
            except Exception as err:  # sqlite3.OperationalError: database is locked (a concurrent creator)
                if "locked" not in str(err) or attempt == _OPEN_ATTEMPTS - 1:
                    raise
                time.sleep(0.01 * (1 + attempt) * random.random())
        raise AssertionError("unreachable")

    def _warn(self, what: str, err: Exception, hint: str = "") -> None:
        self.stats["errors"] += 1
        if not self._warned:
            self._warned = True
            try:
                warnings.warn(f"jitop cache at {self.directory}: {what} failed ({err}); continuing without it"
                              f"{'; ' + hint if hint else ''}", RuntimeWarning, stacklevel=4)
            except Exception:  # noqa: BLE001 - warnings turned into errors (-W error) must not fail the call
                pass

    @property
    def usable(self) -> bool:
        """Whether the directory could be opened (False after a refusal or an error on opening)."""
        return self._light() is not None or self._open() is not None

    @property
    def failure(self) -> str | None:
        """Why the store could not be opened (refused, or the error), or None."""
        return self.refused or (str(self._failed) if self._failed else None)

    # ** entries **
    def get(self, key: str) -> bytes | None:
        """The payload stored under `key`, or None (missing, corrupt: removed, or any error)."""
        reader = self._light()
        if reader is None:
            return None
        try:
            raw = reader.get(key)
        except Exception as err:  # noqa: BLE001 - locked past the timeout, being created, damaged: a miss
            raw = self._read_again(reader, key, err)
        payload = unframe(key, raw) if raw is not None else None
        if payload is None:
            self.stats["misses" if raw is None else "corrupt"] += 1
            if raw is not None:
                self.delete(key)
            return None
        self.stats["hits"] += 1
        return payload

    def _read_again(self, reader: _Reader, key: str, err: Exception) -> Any:
        """A read that failed: once more after diskcache's opening (another process may have been creating the
        database's tables), else a miss with one warning."""
        if self._open() is not None:
            try:
                return reader.get(key)
            except Exception as again:  # noqa: BLE001
                err = again
        self._warn("reading", err, hint=_RESET_HINT)
        return None

    def put(self, key: str, value: bytes) -> None:
        """Store `value` under `key` (one atomic write; errors are skipped with one warning)."""
        cache = self._open()
        if cache is None:
            return
        try:
            cache.set(key, frame(key, value))
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
        new payload (None: leave it). The old value is read as `get` reads it (never unpickled)."""
        cache = self._open()
        if cache is None:
            return
        try:
            with cache.transact():
                rows = cache._sql(_SELECT, (key, time.time())).fetchall()
                raw = _row_bytes(rows[0], self._where, self.size_limit) if rows else None
                new = change(unframe(key, raw) if isinstance(raw, bytes) else None)
                if new is not None:
                    cache.set(key, frame(key, new))
                    self.stats["writes"] += 1
        except Exception as err:  # noqa: BLE001
            self._warn("updating", err)

    def keys(self, prefix: str = "") -> list[str]:
        """Every key starting with `prefix`."""
        reader = self._light()
        if reader is None:
            return []
        try:
            return reader.keys(prefix)
        except Exception as err:  # noqa: BLE001
            self._warn("listing", err, hint=_RESET_HINT)
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

    def reset(self) -> int:
        """Empty a directory whose database cannot be opened (malformed, not a database): remove the database
        and every value file; how many files were removed. Only a directory that holds nothing but what jitop
        and diskcache write is touched (ValueError naming the first stranger otherwise), never a refused one."""
        self.close()
        path = self._where.open()
        doomed = _own_files(path, shown=self.directory)
        for name in doomed:
            os.remove(os.path.join(path, name))
        self._failed, self._warned, self._reader_failed = None, False, False
        return len(doomed)

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
