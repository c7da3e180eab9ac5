"""The tests' shared assertion helpers live beside this file (tests/kernel_checks.py); pytest puts this
directory on sys.path for every test module, in tests/graph and tests/ops alike.

Isolation from the machine's state:
- the persistent cache (JITOP_CACHE_DIR, where the thread pool keeps its object code) is a fresh temporary
  directory for the session, set here at import time, before collection imports jitop in the test
  modules, and removed at the end; child processes the tests start inherit it;
- after every test, the thread count, the JITOP_* / OMP_NUM_THREADS environment variables and the schedule
  sources (applied tuning records) are put back
  as they were before it.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

SESSION_CACHE_DIR = tempfile.mkdtemp(prefix="jitop-test-cache-")
os.environ["JITOP_CACHE_DIR"] = SESSION_CACHE_DIR


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    os.environ["JITOP_CACHE"] = "0"  # what runs at exit (the workload log's flush) must not write to it now
    shutil.rmtree(SESSION_CACHE_DIR, ignore_errors=True)


GPU_TEST_FILES = ("test_cuda_schedules.py", "test_onnx_gpu.py")  # GPU tests outside tests/cuda


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `all_targets` every test that takes a Target parameter (tests/targets.py: the host and haswell):
    it already builds for each target this machine runs, so CI's second run under JITOP_CPU=haswell skips it.
    Mark `gpu_code` the GPU tests (tests/cuda, GPU_TEST_FILES): their code is PTX, whatever the CPU, so that
    run skips them too."""
    from jitop.target import Target
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if any(isinstance(value, Target) for value in params.values()):
            item.add_marker(pytest.mark.all_targets)
        path = item.path
        if path.parent.name == "cuda" or path.name in GPU_TEST_FILES:
            item.add_marker(pytest.mark.gpu_code)


def _jitop_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("JITOP_") or k == "OMP_NUM_THREADS"}


@pytest.fixture(autouse=True)
def restore_global_state():
    """Undo what a test changed in the thread count and in the JITOP_* / OMP_NUM_THREADS variables."""
    env = _jitop_environ()
    # jitop may not be imported yet (the layering test never imports it); then there is nothing to save
    parallel = sys.modules.get("jitop.runtime.parallel")
    threads = parallel.get_num_threads() if parallel is not None else None
    task_module = sys.modules.get("jitop.tuner.task")
    sources = list(task_module._SOURCES) if task_module is not None else []
    yield
    task_module = sys.modules.get("jitop.tuner.task")
    if task_module is not None and task_module._SOURCES != sources:
        # a test left schedule sources (applied records) behind: remove them, and fail that test
        for source in [s for s in task_module._SOURCES if s not in sources]:
            task_module.remove_source(source)
        pytest.fail("the test left a schedule source installed (jitop.apply_records without remove())")
    for name in set(_jitop_environ()) - set(env):
        del os.environ[name]
    os.environ.update(env)
    parallel = sys.modules.get("jitop.runtime.parallel")
    if parallel is not None:
        # first imported during the test: back to the default it computed on import (from the restored env)
        wanted = threads if threads is not None else parallel._default_num_threads()
        if parallel.get_num_threads() != wanted:
            parallel.set_num_threads(wanted)


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A persistent cache of the test's own (for tests that tune or store records): JITOP_CACHE_DIR points into
    tmp_path and what the tuner's cache source read from another directory is forgotten, before and after."""
    from jitop.tuner import cached
    monkeypatch.setenv("JITOP_CACHE_DIR", str(tmp_path / "cache"))
    cached.forget()
    yield tmp_path / "cache"
    cached.forget()
