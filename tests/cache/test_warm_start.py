"""What a warm process skips, and what it must still catch: reads take the light path (no diskcache import, the
LRU time still refreshed, anything unusual handed to diskcache), and jitop's source digest is reused from the
store only while every source file's stamp is unchanged (an edit that keeps size and mtime is still seen).

Every test uses its own cache directory under tmp_path (never the user's cache)."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time

import diskcache
import pytest

from jitop.cache import store as store_mod
from jitop.cache.store import DiskStore, frame
from jitop.graph import kernel_cache


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JITOP_CACHE_DIR", str(tmp_path / "cache"))


def access_time(directory: str, key: str) -> float:
    con = sqlite3.connect(os.path.join(directory, "cache.db"))
    try:
        return con.execute("SELECT access_time FROM Cache WHERE key = ?", (key,)).fetchone()[0]
    finally:
        con.close()


# ** the light read path **
def set_access_time(directory: str, key: str, when: float) -> None:
    con = sqlite3.connect(os.path.join(directory, "cache.db"))
    try:
        with con:
            con.execute("UPDATE Cache SET access_time = ? WHERE key = ?", (when, key))
    finally:
        con.close()


def test_a_warm_store_reads_without_diskcache_and_refreshes_lru(tmp_path):
    d = str(tmp_path / "warm")
    first = DiskStore(d)
    first.put("kernel/old", b"object code")
    first.put("kernel/recent", b"other")
    first.close()
    long_ago = time.time() - 2 * store_mod.LRU_RESOLUTION
    set_access_time(d, "kernel/old", long_ago)
    recent = access_time(d, "kernel/recent")
    script = textwrap.dedent(f"""
        import json, sys
        from jitop.cache.store import DiskStore
        st = DiskStore({d!r})
        got = [st.get("kernel/old"), st.get("kernel/recent"), st.get("missing")]
        print(json.dumps({{"got": [g.decode() if g else g for g in got], "diskcache": "diskcache" in sys.modules,
                          "light": st._reader is not None, "hits": st.stats["hits"]}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"got": ["object code", "other", None], "diskcache": False, "light": True, "hits": 2}
    assert access_time(d, "kernel/old") > long_ago + store_mod.LRU_RESOLUTION  # written at exit: eviction sees it
    assert access_time(d, "kernel/recent") == recent  # fresh enough: no write


def test_refreshed_access_times_are_written_before_an_eviction(tmp_path):
    d = str(tmp_path / "evict")
    st = DiskStore(d)
    for k in range(3):
        st.put(f"kernel/{k}", bytes(60_000))
    limit = st.volume() + 30_000  # room for these three, not for a fourth
    st.close()
    for k in range(3):
        set_access_time(d, f"kernel/{k}", time.time() - 3600 + k)  # kernel/0 the least recently used
    again = DiskStore(d, size_limit=limit)
    assert again.get("kernel/0") is not None  # read now: no longer the least recently used
    again.put("kernel/new", bytes(60_000))  # over the limit: the least recently used goes
    assert again.get("kernel/0") is not None and again.get("kernel/1") is None


def test_light_reads_match_diskcache_for_rows_files_and_foreign_values(tmp_path):
    d = str(tmp_path / "mixed")
    st = DiskStore(d)
    st.put("kernel/file", b"in a file")
    cache = st._open()
    cache.set("kernel/row", frame("kernel/row", b"in the row"))  # a small value kept in the database row (MODE_RAW)
    cache._sql("UPDATE Cache SET mode = 1, filename = NULL, value = ? WHERE key = ?",
               (frame("kernel/row", b"in the row"), "kernel/row"))
    cache.set("kernel/pickled", {"not": "bytes"})  # pickled: never unpickled, a corrupt entry
    st.close()
    again = DiskStore(d)
    assert again.get("kernel/file") == b"in a file"
    assert again.get("kernel/row") == b"in the row"
    assert again._cache is None  # both read without opening diskcache
    assert again.get("kernel/pickled") is None and again.stats["corrupt"] == 1  # not framed bytes: removed
    assert "kernel/pickled" not in again.keys()


def test_a_damaged_or_vanished_value_file_is_a_miss_on_the_light_path(tmp_path):
    d = str(tmp_path / "damaged")
    st = DiskStore(d)
    st.put("kernel/x", b"good")
    st.put("kernel/y", b"gone")
    files = dict(st._open()._sql("SELECT key, filename FROM Cache").fetchall())
    st.close()
    with open(os.path.join(d, files["kernel/x"]), "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        fh.write(b"!")
    os.remove(os.path.join(d, files["kernel/y"]))
    again = DiskStore(d)
    assert again.get("kernel/x") is None and again.stats["corrupt"] == 1 and "kernel/x" not in again.keys()
    assert again.get("kernel/y") is None


def test_another_eviction_policy_is_still_read_by_the_reader(tmp_path):
    d = str(tmp_path / "policy")
    st = DiskStore(d)
    st.put("kernel/x", b"value")
    st.close()
    diskcache.Cache(d, eviction_policy="least-recently-stored").close()
    again = DiskStore(d)
    assert again.get("kernel/x") == b"value"
    assert again._reader is not None and again._cache is None


def test_a_refused_directory_is_never_read_by_the_light_path(tmp_path):
    d = tmp_path / "shared"
    st = DiskStore(str(d))
    st.put("kernel/x", b"value")
    st.close()
    os.chmod(d, 0o777)
    try:
        again = DiskStore(str(d))
        with pytest.warns(RuntimeWarning, match="writable"):
            assert again.get("kernel/x") is None
        assert again._reader is None and again.refused
    finally:
        os.chmod(d, 0o700)


def test_a_reader_error_is_a_miss_with_one_warning(tmp_path, monkeypatch):
    d = str(tmp_path / "err")
    st = DiskStore(d)
    st.put("kernel/x", b"value")
    st.close()
    again = DiskStore(d)
    assert again.get("kernel/x") == b"value" and again._reader is not None

    def broken(self, key):
        raise sqlite3.OperationalError("database is locked")
    monkeypatch.setattr(store_mod._Reader, "get", broken)
    with pytest.warns(RuntimeWarning, match="locked"):
        assert again.get("kernel/x") is None  # tried again once, never read through diskcache (which unpickles)
    assert again.get("kernel/x") is None


def test_a_forked_child_reads_on_its_own_connection(tmp_path):
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    d = str(tmp_path / "fork")
    st = DiskStore(d)
    st.put("kernel/x", b"value")
    st.close()
    again = DiskStore(d)
    assert again.get("kernel/x") == b"value"
    parent_reader = again._reader
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a new reader, the right value
        ok = again.get("kernel/x") == b"value" and again._reader is not None and again._reader is not parent_reader
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.waitpid(pid, 0)
    assert got == b"1"
    assert again.get("kernel/x") == b"value" and again._reader is parent_reader


# ** jitop's source digest **
@pytest.fixture
def fake_sources(tmp_path, monkeypatch):
    """A package standing in for jitop's sources (jitop's own files are never edited by a test); every file
    counts as settled (changed long enough ago to keep a digest) unless a test says otherwise."""
    root = tmp_path / "src"
    pkg = root / "fakejitop"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "mod.py").write_text("def f():\n    return 'abc'\n")
    monkeypatch.setattr(kernel_cache, "_SETTLED_NS", -10 ** 18)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(kernel_cache, "_PACKAGES", ("fakejitop",))
    monkeypatch.setattr(kernel_cache, "_code_version", None)
    hashed = []
    real = kernel_cache._source_digest
    monkeypatch.setattr(kernel_cache, "_source_digest", lambda files: hashed.append(1) or real(files))
    return pkg, hashed


def fresh_version() -> str:
    """code_version as a new process computes it."""
    kernel_cache._code_version = None
    return kernel_cache.code_version()


def test_the_source_digest_is_reused_while_no_file_changed(fake_sources, monkeypatch):
    pkg, hashed = fake_sources
    v1 = fresh_version()
    assert len(hashed) == 1
    assert fresh_version() == v1 and len(hashed) == 1  # from the store
    # an edit keeping the size and restoring the mtime: the ctime still changes
    mod = pkg / "sub" / "mod.py"
    st = mod.stat()
    time.sleep(0.01)
    mod.write_text("def f():\n    return 'abd'\n")
    os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert mod.stat().st_size == st.st_size and mod.stat().st_mtime_ns == st.st_mtime_ns
    v2 = fresh_version()
    assert v2 != v1 and len(hashed) == 2
    (pkg / "new.py").write_text("")  # a new file
    v3 = fresh_version()
    assert v3 not in (v1, v2) and len(hashed) == 3
    assert fresh_version() == v3 and len(hashed) == 3


def test_the_digest_equals_a_full_hash_of_the_sources(fake_sources):
    import hashlib
    pkg, _ = fake_sources
    h = hashlib.sha256()
    for rel in ("__init__.py", "sub/__init__.py", "sub/mod.py"):
        h.update(rel.encode())
        h.update((pkg / rel).read_bytes())
    assert fresh_version().endswith("+" + h.hexdigest()[:12])


def test_a_digest_of_files_changed_just_now_is_not_kept(fake_sources, monkeypatch):
    pkg, hashed = fake_sources
    monkeypatch.setattr(kernel_cache, "_SETTLED_NS", 5_000_000_000)  # the real rule: written just now
    v1 = fresh_version()
    assert fresh_version() == v1 and len(hashed) == 2


def test_a_damaged_or_foreign_memo_is_computed_again(fake_sources, monkeypatch):
    pkg, hashed = fake_sources
    v1 = fresh_version()
    st = kernel_cache.store()
    (key,) = st.keys(kernel_cache.CODE_DIGEST)
    memo = json.loads(st.get(key))
    st.put(key, json.dumps({"stamp": memo["stamp"], "digest": "0" * 63 + "g"}).encode())
    assert fresh_version() == v1 and len(hashed) == 2
    st.put(key, b"not json")
    assert fresh_version() == v1 and len(hashed) == 3
    assert fresh_version() == v1 and len(hashed) == 3  # rewritten: reused again


def test_without_a_cache_the_digest_is_computed(fake_sources, monkeypatch):
    pkg, hashed = fake_sources
    monkeypatch.setenv("JITOP_CACHE", "0")
    v1 = fresh_version()
    assert fresh_version() == v1 and len(hashed) == 2


def test_keys_on_the_light_path_match_diskcache(tmp_path):
    d = str(tmp_path / "keys")
    st = DiskStore(d)
    for k in ("tuned/b/2", "tuned/a/1", "tuned/ä/3", "tune", "kernel/x", "tuned%/_x"):
        st.put(k, b"v")
    st._open().set(b"tuned/bytes", frame(b"tuned/bytes", b"v"))  # not a text key: never listed
    expected = {p: sorted(k for k in st._open().iterkeys() if isinstance(k, str) and k.startswith(p))
                for p in ("tuned/", "tune", "", "tuned%", "nothing")}
    st.close()
    again = DiskStore(d)
    for prefix, keys in expected.items():
        assert sorted(again.keys(prefix)) == keys, prefix
    assert again._cache is None and "tuned/ä/3" in again.keys("tuned/")
    assert dict(again.items("tuned/a")) == {"tuned/a/1": b"v"}
