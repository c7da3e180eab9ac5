"""The test session leaves the machine's state alone (tests/conftest.py): the persistent cache is a
temporary directory, and the thread count and JITOP_* variables a test changes are restored after it.

The restore checks are pairs of tests: pytest runs a file's tests in order, so the first of a pair
changes the state and the second, run after the fixture's teardown, sees it restored. Run alone (-k),
the second one skips."""
from __future__ import annotations

import os
import pathlib
import tempfile

import pytest

import conftest
import jitop
from jitop import config
from jitop.runtime import parallel

_seen: dict[str, object] = {}


def _home_caches() -> list[pathlib.Path]:
    """Where jitop's cache would go without JITOP_CACHE_DIR (XDG_CACHE_HOME or ~/.cache), resolved."""
    homes = [pathlib.Path("~/.cache/jitop").expanduser()]
    if os.environ.get("XDG_CACHE_HOME"):
        homes.append(pathlib.Path(os.environ["XDG_CACHE_HOME"]) / "jitop")
    return [h.resolve() for h in homes]


def test_cache_dir_is_a_temporary_directory() -> None:
    used = pathlib.Path(config.cache_dir()).resolve()
    assert used == pathlib.Path(conftest.SESSION_CACHE_DIR).resolve()
    assert pathlib.Path(tempfile.gettempdir()).resolve() in used.parents
    for home in _home_caches():
        assert used != home and home not in used.parents, f"tests use the user's cache {home}"


def test_thread_pool_stores_its_object_code_in_the_session_cache() -> None:
    if not config.cache_enabled():
        pytest.skip("JITOP_CACHE=0: the pool stores nothing")
    A = jitop.te.placeholder((1 << 16,), "float32", name="A")
    B = jitop.te.compute(A.shape, lambda i: A[i] + 1.0, name="B")
    s = jitop.create_schedule(B.op)
    s[B].parallel(B.op.axis[0])
    import numpy as np
    a = np.arange(1 << 16, dtype=np.float32)
    np.testing.assert_array_equal(jitop.build(s, [A, B])(a), a + 1)   # builds the pool (once per process)
    assert any(pathlib.Path(conftest.SESSION_CACHE_DIR).rglob("*")), "the pool's object code went elsewhere"


def test_restore_1_change_threads_and_environment() -> None:
    _seen["threads"] = parallel.get_num_threads()
    _seen["env"] = {k: os.environ.get(k) for k in ("JITOP_NUM_THREADS", "OMP_NUM_THREADS", "JITOP_CACHE_DIR")}
    parallel.set_num_threads(1 if parallel.get_num_threads() != 1 else 2)
    # changed without monkeypatch: the autouse fixture must undo it
    os.environ["JITOP_NUM_THREADS"] = "3"
    os.environ["OMP_NUM_THREADS"] = "5"
    os.environ["JITOP_TEST_ISOLATION_NEW"] = "1"
    os.environ["JITOP_CACHE_DIR"] = "/nonexistent/elsewhere"


def test_restore_2_threads_and_environment_are_back() -> None:
    if not _seen:
        pytest.skip("runs after test_restore_1_change_threads_and_environment")
    assert parallel.get_num_threads() == _seen["threads"]
    assert {k: os.environ.get(k) for k in _seen["env"]} == _seen["env"]
    assert "JITOP_TEST_ISOLATION_NEW" not in os.environ
    assert config.cache_dir() == conftest.SESSION_CACHE_DIR


def test_restore_3_removed_variable() -> None:
    _seen["cache_dir_before_removal"] = os.environ.get("JITOP_CACHE_DIR")
    del os.environ["JITOP_CACHE_DIR"]


def test_restore_4_removed_variable_is_back() -> None:
    if "cache_dir_before_removal" not in _seen:
        pytest.skip("runs after test_restore_3_removed_variable")
    assert os.environ.get("JITOP_CACHE_DIR") == _seen["cache_dir_before_removal"] == conftest.SESSION_CACHE_DIR
