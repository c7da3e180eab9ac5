"""What the cache keeps and never does: tuned records and the workload log survive eviction, an older jitop
leaves a newer one's kernels alone, a malformed knob never fails a call, every argument's shape is in the key."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import jitop
from jitop import cachedir
from jitop.cache import keys
from jitop.cache.store import DiskStore, frame
from jitop.graph import kernel_cache


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JITOP_CACHE_DIR", str(tmp_path / "cache"))


def test_eviction_never_removes_tuned_records_or_the_workload_log(tmp_path) -> None:
    st = DiskStore(str(tmp_path / "small"), size_limit=300_000)
    st.put("tuned/t/matmul/abc", b"record")
    st.put("workload/t/abc", b"counts")
    for k in range(12):
        st.put(f"kernel/{k}", bytes(60_000))
    assert st.get("tuned/t/matmul/abc") == b"record" and st.get("workload/t/abc") == b"counts"
    assert st.get("kernel/11") is not None and st.get("kernel/0") is None  # the newest kept, the oldest evicted
    assert st.volume() <= 300_000 + 60_000 + 2 * 4096


def test_an_older_jitop_leaves_a_newer_schema_alone(monkeypatch) -> None:
    st = DiskStore(os.environ["JITOP_CACHE_DIR"])
    st.put(cachedir.SCHEMA_MARK, str(keys.SCHEMA_VERSION + 1).encode())
    st.put("kernel/from-a-newer-jitop", b"blob")
    cachedir._drop_other_schemas(st)  # this (older) jitop opens the directory
    assert st.get("kernel/from-a-newer-jitop") == b"blob"
    st.put(cachedir.SCHEMA_MARK, str(keys.SCHEMA_VERSION - 1).encode())
    cachedir._drop_other_schemas(st)  # an older one's kernels can never hit again: removed
    assert st.get("kernel/from-a-newer-jitop") is None
    assert st.get(cachedir.SCHEMA_MARK) == str(keys.SCHEMA_VERSION).encode()


def test_a_malformed_cache_knob_warns_once_and_never_fails_a_call(monkeypatch) -> None:
    monkeypatch.setenv("JITOP_CACHE_SIZE", "2e9")
    monkeypatch.setattr(cachedir, "_warned", set())
    f = jitop.kernel(lambda a: np.tanh(a) + 1, fallback=False)
    a = np.linspace(-1, 1, 50, dtype=np.float32)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        np.testing.assert_allclose(f(a), np.tanh(a) + 1, rtol=1e-6)
        f(a[:7])
    assert sum("JITOP_CACHE_SIZE" in str(w.message) for w in seen) == 1
    assert cachedir.store().size_limit == 2 << 30  # the default
    assert [e.lookup.status for e in f.cache.values()] == ["miss", "miss"]


def test_every_argument_shape_is_in_the_key_even_unused_ones() -> None:
    x = np.ones(8, np.float32)
    digests = []
    for n in (4, 5):
        f = jitop.kernel(lambda a, unused: a * 2)
        f(x, np.ones(n, np.float32))
        (entry,) = f.cache.values()
        digests.append(entry.lookup.key.digest)
        assert entry.lookup.status == "miss"
    assert digests[0] != digests[1]


def test_damaged_value_files_are_misses(tmp_path) -> None:
    st = DiskStore(str(tmp_path / "d"))
    st.put("kernel/x", b"good")
    assert st.get("kernel/x") == b"good"
    st._open().set("kernel/x", frame("kernel/x", b"good")[:-1] + b"!")  # a flipped byte under a valid-looking header
    assert st.get("kernel/x") is None and st.stats["corrupt"] == 1 and "kernel/x" not in st.keys()
