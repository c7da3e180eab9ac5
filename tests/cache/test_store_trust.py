"""What the byte store refuses to trust (issue 22): a value moved under another key, a pickled row or key
(never unpickled), a FIFO or a path outside the directory in place of a value file (never opened blocking),
a directory flipped by a symlink between check and use (what was checked is what is read), a database that
cannot be opened (said how to reset, and `jitop cache clear` resets it), a dangling symlink (said so)."""
from __future__ import annotations

import os
import threading
import warnings

import diskcache
import numpy as np
import pytest

import jitop
from jitop.cache.store import DiskStore
from jitop.cli import main as cli_main


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JITOP_CACHE_DIR", str(tmp_path / "cache"))


def _files(directory: str) -> dict[str, str]:
    with diskcache.Cache(directory) as c:
        return dict(c._sql("SELECT key, filename FROM Cache WHERE filename IS NOT NULL").fetchall())


class Payload:
    """Unpickling it creates `marker`: proof that a pickle ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_a_value_file_moved_under_another_key_is_a_miss_and_removed(tmp_path):
    d = str(tmp_path / "s")
    st = DiskStore(d)
    st.put("kernel/big", b"B" * 5000)
    st.put("kernel/small", b"s" * 10)
    files = _files(d)
    with open(os.path.join(d, files["kernel/big"]), "rb") as src:
        moved = src.read()
    with open(os.path.join(d, files["kernel/small"]), "wb") as dst:
        dst.write(moved)  # a well-formed frame with the right checksum, written for another key
    again = DiskStore(d)
    assert again.get("kernel/small") is None and again.stats["corrupt"] == 1
    assert "kernel/small" not in again.keys() and again.get("kernel/big") == b"B" * 5000


@pytest.mark.parametrize("where", ["value", "key"])
def test_a_planted_pickle_never_runs(tmp_path, where):
    d = str(tmp_path / "s")
    marker = str(tmp_path / "payload-ran")
    st = DiskStore(d)
    st.put("kernel/x", b"good")
    st.close()
    with diskcache.Cache(d) as c:  # diskcache pickles what is not bytes: mode 4 rows, raw = 0 keys
        if where == "value":
            c.set("kernel/x", Payload(marker))
        else:
            c.set(Payload(marker), b"value")
    again = DiskStore(d)
    again.get("kernel/x")
    again.keys()
    list(again.items())
    again.update("kernel/x", lambda old: b"new")
    again.clear("tuned/")
    assert not os.path.exists(marker)
    assert again.get("kernel/x") == b"new"  # the planted row was replaced by a jitop value


def test_a_planted_pickle_in_a_kernel_entry_is_a_miss_with_the_right_answer(tmp_path):
    def add(a, b):
        return a + b

    a, b = np.arange(5, dtype=np.float32), np.ones(5, dtype=np.float32)
    k = jitop.kernel(add, fallback=False)
    k(a, b)
    (entry,) = k.cache.values()
    marker = str(tmp_path / "payload-ran")
    with diskcache.Cache(str(tmp_path / "cache")) as c:
        c.set("kernel/" + entry.lookup.key.digest, Payload(marker))
    k2 = jitop.kernel(add, fallback=False)
    np.testing.assert_array_equal(k2(a, b), a + b)
    (entry2,) = k2.cache.values()
    assert entry2.lookup.status == "miss" and not os.path.exists(marker)


@pytest.mark.parametrize("stranger", ["fifo", "outside", "directory"])
def test_a_value_file_that_is_no_regular_file_inside_is_corrupt_and_never_blocks(tmp_path, stranger):
    d = str(tmp_path / "s")
    st = DiskStore(d)
    st.put("kernel/x", b"value")
    path = os.path.join(d, _files(d)["kernel/x"])
    os.remove(path)
    if stranger == "fifo":
        os.mkfifo(path)  # an open() for reading would wait for a writer forever
    elif stranger == "directory":
        os.mkdir(path)
    else:
        outside = tmp_path / "elsewhere.val"
        outside.write_bytes(b"not yours")
        with diskcache.Cache(d) as c:
            c._sql("UPDATE Cache SET filename = ? WHERE key = 'kernel/x'", ("../../elsewhere.val",))
    got: list = []
    reader = threading.Thread(target=lambda: got.append(DiskStore(d).get("kernel/x")), daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert not reader.is_alive(), "reading the entry blocked"
    assert got == [None]
    assert DiskStore(d).keys() == []


@pytest.mark.parametrize("foreign", ["mode", "owner"])
def test_a_flipping_symlink_never_serves_the_refused_directory(tmp_path, foreign):
    """JITOP_CACHE_DIR a symlink flipped between the user's private cache and a refused one (group-writable,
    or another user's): 200 opens while it flips; none returns the refused directory's value."""
    if foreign == "owner" and os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    mine, theirs, link = str(tmp_path / "mine"), str(tmp_path / "theirs"), str(tmp_path / "link")
    DiskStore(mine).put("kernel/f", b"a + b")
    other = DiskStore(theirs)
    other.put("kernel/f", b"a - b")
    other.close()
    if foreign == "mode":
        os.chmod(theirs, 0o777)
    else:
        for root, dirs, files in os.walk(theirs):
            for name in [root, *(os.path.join(root, f) for f in dirs + files)]:
                os.chown(name, 12345, 12345)
    os.symlink(mine, link)
    stop = threading.Event()

    def flip() -> None:
        k = 0
        while not stop.is_set():
            tmp = f"{link}.{k % 2}"
            os.symlink(theirs if k % 2 else mine, tmp)
            os.replace(tmp, link)
            k += 1
    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    seen = set()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for _ in range(200):
                st = DiskStore(link)
                seen.add(st.get("kernel/f"))
                st.close()
    finally:
        stop.set()
        flipper.join()
    assert b"a - b" not in seen
    assert seen <= {b"a + b", None}


def test_a_malformed_database_says_how_to_reset_and_clear_resets_it(tmp_path, capsys):
    d = tmp_path / "cache"
    DiskStore(str(d)).put("kernel/x", b"value")
    for name in os.listdir(d):
        if name.startswith("cache.db-"):
            os.remove(d / name)
    (d / "cache.db").write_bytes(b"this is not a database" * 100)
    with pytest.warns(RuntimeWarning, match="jitop cache clear"):
        assert DiskStore(str(d)).get("kernel/x") is None
    from jitop import cachedir
    cachedir._stores.clear()
    with pytest.warns(RuntimeWarning, match="jitop cache clear"):
        assert cli_main(["cache", "clear"]) == 0
    assert "reset" in capsys.readouterr().out
    cachedir._stores.clear()
    st = DiskStore(str(d))
    st.put("kernel/y", b"again")
    assert st.get("kernel/y") == b"again" and st.get("kernel/x") is None


def test_clear_never_resets_a_directory_holding_other_files(tmp_path, capsys):
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    (d / "cache.db").write_bytes(b"not a database" * 100)
    (d / "thesis.tex").write_text("precious")
    from jitop import cachedir
    cachedir._stores.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert cli_main(["cache", "clear"]) == 1
    assert "thesis.tex" in capsys.readouterr().err
    assert (d / "thesis.tex").read_text() == "precious" and (d / "cache.db").exists()
    cachedir._stores.clear()


def test_a_dangling_symlink_is_named_as_such(tmp_path):
    link = tmp_path / "link"
    os.symlink(tmp_path / "nowhere", link)
    st = DiskStore(str(link))
    with pytest.warns(RuntimeWarning, match="symbolic link to .*nowhere.*does not exist"):
        assert st.get("kernel/x") is None
    st.put("kernel/x", b"v")
    assert not st.usable and "symbolic link" in st.refused and "Errno" not in st.refused


def test_a_database_still_being_created_is_read_once_its_tables_exist(tmp_path):
    """Another process created cache.db but not yet its tables when this one first reads: no warning, a miss,
    and the entry written meanwhile is read on the next call (the reader is not given up)."""
    import sqlite3
    d = tmp_path / "fresh"
    d.mkdir(mode=0o700)
    sqlite3.connect(str(d / "cache.db")).close()  # an empty database: no Settings, no Cache table yet
    st = DiskStore(str(d))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert st.get("kernel/x") is None
    DiskStore(str(d)).put("kernel/x", b"value")
    assert st.get("kernel/x") == b"value"
