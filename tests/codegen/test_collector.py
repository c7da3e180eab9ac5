"""Full garbage collections wait while jitop compiles (jitop.codegen.collector): the oldest generation's
threshold is raised for the build and put back when the last build running ends, whatever happens."""
from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import jitop
from jitop import te
from jitop.codegen import collector
from jitop.graph import compile as graph_compile


@pytest.fixture(autouse=True)
def default_thresholds():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def test_a_build_defers_full_collections_and_puts_the_thresholds_back(monkeypatch):
    seen = []
    real = graph_compile.lower
    monkeypatch.setattr(graph_compile, "lower", lambda *a, **k: seen.append(gc.get_threshold()) or real(*a, **k))
    f = jitop.kernel(lambda x: np.tanh(x) * 2)
    x = np.arange(5.0)
    np.testing.assert_allclose(f(x), np.tanh(x) * 2)
    assert seen and seen[0][2] == collector.DEFERRED_THRESHOLD and seen[0][:2] == (700, 10)
    assert gc.get_threshold() == (700, 10, 10)


def test_a_failing_build_puts_the_thresholds_back():
    A = te.placeholder((4,), name="A")
    B = te.compute((4,), lambda i: A[i] + 1.0, name="B")
    with pytest.raises(Exception):
        jitop.build(jitop.create_schedule(B.op), [A, B], target="no-such-target")
    assert gc.get_threshold() == (700, 10, 10)


def test_overlapping_builds_in_threads_share_one_deferral():
    """The second block ends first: the thresholds stay deferred until the first ends too."""
    inside, release = threading.Event(), threading.Event()

    def first():
        with collector.full_collections_deferred():
            inside.set()
            release.wait(10)
    t = threading.Thread(target=first)
    t.start()
    inside.wait(10)
    with collector.full_collections_deferred():
        assert gc.get_threshold()[2] == collector.DEFERRED_THRESHOLD
    assert gc.get_threshold()[2] == collector.DEFERRED_THRESHOLD  # the first still runs
    release.set()
    t.join()
    assert gc.get_threshold() == (700, 10, 10)


def test_a_higher_threshold_of_the_program_s_own_is_kept():
    gc.set_threshold(700, 10, 5000)
    with collector.full_collections_deferred():
        assert gc.get_threshold() == (700, 10, 5000)
    assert gc.get_threshold() == (700, 10, 5000)
