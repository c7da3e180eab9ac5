"""The dispatcher (jitop/dispatch.py): signature -> overload, hit and miss counts, replace, clear, the native entry,
and the call log the workload log drains, across fork and after the function is collected. (Not test_dispatch.py:
tests/graph has one, and pytest needs unique basenames.)"""
from __future__ import annotations

import gc
import json
import os
import pathlib
import sys
from dataclasses import dataclass

import numpy as np
import pytest

import jitop
from jitop import dispatch
from jitop.dispatch import FALLBACK, Dispatcher, Overload
from jitop.runtime import fastcall

pytestmark = pytest.mark.usefixtures("private_cache")


@dataclass(frozen=True)
class FakeTask:
    key: str
    flops: int = 100


def overload(result: object = 1, tasks: tuple = (), native: bool = True) -> Overload:
    return Overload(lambda values: result, tasks=tasks, native=native)


@pytest.fixture(autouse=True)
def drained():
    dispatch.drain_all()  # counts of earlier tests are not this test's
    yield


def mine(counts: list, name: str) -> list[tuple[str, int]]:
    return sorted((c.task.key, c.calls) for c in counts if c.function == name)


def call(d: Dispatcher, key: object, times: int = 1) -> None:
    """What a front end does for a call: lookup, else get; count; the first call is timed."""
    for _ in range(times):
        ov = d.lookup(key) or d.get(key, lambda: overload(tasks=(FakeTask(str(key)),)))
        ov.calls += 1
        d.first_call(ov, (), rerun=lambda: None) if ov.seconds is None else ov.call(())


# ** hits and misses **
def test_lookup_counts_hits_and_get_builds_once() -> None:
    d = Dispatcher("t.f")
    built = []
    assert d.lookup("k") is None and (d.hits, d.misses) == (0, 0)
    ov = d.get("k", lambda: built.append(1) or overload())
    assert d.get("k", lambda: pytest.fail("built twice")) is ov and built == [1]
    assert d.lookup("k") is ov and d.lookup("k") is ov
    assert (d.hits, d.misses, d.compiles) == (2, 1, 1) and ov.key == "k"
    assert d.get("fb", lambda: FALLBACK) is FALLBACK and d.lookup("fb") is FALLBACK
    assert d.overloads() == [ov] and dict(d.signatures()) == {"k": ov, "fb": FALLBACK}
    d.get("once", overload, memo=False)  # e.g. a key by identity: built, never kept
    assert "once" not in d.signatures() and d.misses == 3


def test_a_kernel_function_counts_native_and_python_calls_and_disk_hits() -> None:
    add = lambda a, b: a + b  # noqa: E731
    f = jitop.kernel(add)
    a = np.ones(10, np.float32)
    for _ in range(6):
        f(a, a)
    (ov,) = f.dispatcher.overloads()
    assert (f.misses, f.hits, f.dispatcher.compiles) == (1, 5, 1) and ov.served == 6
    assert f.dispatcher.native() == [ov] and f.dispatcher.entry(a, a) is not fastcall.MISS
    g = jitop.kernel(add)  # the same trace: found on disk, not compiled
    g(a, a)
    assert (g.misses, g.dispatcher.compiles) == (1, 0)


# ** replace and clear **
def test_replace_swaps_only_what_serves_and_puts_back() -> None:
    d = Dispatcher("t.swap")
    old = d.get("k", lambda: overload("old"))
    new = overload("new")
    assert d.replace(old, new) and d.lookup("k").call(()) == "new" and new.key == "k"
    assert not d.replace(old, overload("again"))  # old no longer serves: nothing to swap
    assert d.replace(new, old) and d.lookup("k") is old and d.serves(old) and not d.serves(new)


def test_replace_takes_the_old_kernel_out_of_the_native_entry() -> None:
    f = jitop.kernel(lambda a: a * 2)
    a = np.arange(5, dtype=np.float32)
    f(a)
    f(a)
    (old,) = f.dispatcher.native()
    new = f.built_again(old)
    assert f.dispatcher.replace(old, new)
    assert f.dispatcher.native() == [] and f.dispatcher.entry(a) is fastcall.MISS
    np.testing.assert_array_equal(f(a), a * 2)  # the new kernel's first call, on the Python path
    f(a)
    assert f.dispatcher.native() == [new] and old.served == 2 and new.served == 2


def test_clear_forgets_every_signature_and_keeps_their_counts() -> None:
    d = Dispatcher("t.clear")
    call(d, "x", 3)
    d.clear()
    assert d.lookup("x") is None and d.overloads() == []
    assert mine(dispatch.drain_all(), "t.clear") == [("x", 3)]
    call(d, "x")
    assert d.misses == 2 and mine(dispatch.drain_all(), "t.clear") == [("x", 1)]


# ** the call log **
def test_drain_gives_new_calls_once_with_time_split_by_flops() -> None:
    d = Dispatcher("t.drain")
    ov = d.get("k", lambda: overload(tasks=(FakeTask("a", 300), FakeTask("b", 100))))
    ov.calls += 4
    ov.seconds = 1.0
    counts = d.drain()
    assert [(c.task.key, c.calls, c.seconds) for c in counts] == [("a", 4, 3.0), ("b", 4, 1.0)]
    assert d.drain() == []
    ov.calls += 1
    assert [c.calls for c in d.drain()] == [1, 1]


def test_the_counts_of_a_replaced_overload_are_drained_once() -> None:
    d = Dispatcher("t.replaced")
    call(d, "k", 5)
    old = d.lookup("k")
    d.replace(old, overload(tasks=old.tasks))
    call(d, "k", 2)
    assert mine(dispatch.drain_all(), "t.replaced") == [("k", 2), ("k", 5)]  # the old overload's, and the new one's


def test_the_counts_of_a_collected_function_are_drained() -> None:
    def run() -> None:
        d = Dispatcher("t.collected")
        call(d, "k", 7)
    run()
    gc.collect()
    assert mine(dispatch.drain_all(), "t.collected") == [("k", 7)]
    assert "t.collected" not in [d.name for d in dispatch.dispatchers()]


def test_a_forked_child_drains_only_its_own_calls(tmp_path: pathlib.Path) -> None:
    d = Dispatcher("t.fork")
    call(d, "k", 6)
    gone = Dispatcher("t.fork.retired")
    call(gone, "r", 2)
    gone.clear()  # retired, not drained yet: the parent's
    out = tmp_path / "child.json"
    pid = os.fork()
    if pid == 0:
        try:
            call(d, "k")
            counts = dispatch.drain_all()
            out.write_text(json.dumps([mine(counts, "t.fork"), mine(counts, "t.fork.retired")]))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert json.loads(out.read_text()) == [[["k", 1]], []]
    counts = dispatch.drain_all()
    assert mine(counts, "t.fork") == [("k", 6)] and mine(counts, "t.fork.retired") == [("r", 2)]


def test_first_call_is_timed_and_told_to_hooks() -> None:
    d = Dispatcher("t.first")
    seen = []
    with dispatch.on_first_call(lambda disp, ov, rerun: seen.append((disp.name, ov.key, rerun()))):
        call(d, "k", 3)
    call(d, "j")
    assert seen == [("t.first", "k", None)] and d.lookup("k").seconds is not None


# ** the native entry **
def test_a_full_native_entry_takes_a_newcomer_after_promote_after_slow_calls() -> None:
    f = jitop.kernel(lambda a, b: a + b, dynamic=False)  # a kernel per shape
    arrays = [np.arange(n, dtype=np.float32) for n in range(1, dispatch.MAX_FAST_SIGNATURES + 2)]
    for a in arrays:
        f(a, a)
    native = f.dispatcher.native()
    assert len(native) == dispatch.MAX_FAST_SIGNATURES  # a new signature joins at once, the oldest goes
    out = f.dispatcher.lookup(((arrays[0].dtype, arrays[0].shape),) * 2)
    assert out not in native
    for _ in range(dispatch.PROMOTE_AFTER - 1):  # no new entry on every call of a signature taking turns
        np.testing.assert_array_equal(f(arrays[0], arrays[0]), arrays[0] * 2)
    assert f.dispatcher.native() == native
    f(arrays[0], arrays[0])
    assert f.dispatcher.native()[0] is out and len(f.dispatcher.native()) == dispatch.MAX_FAST_SIGNATURES


def test_an_overload_without_a_native_spec_stays_on_the_python_path() -> None:
    d = Dispatcher("t.python")
    ov = d.get("k", lambda: overload(native=False))
    d.promote(ov, lambda: pytest.fail("asked for a spec"))
    assert d.native() == [] and d.entry() is fastcall.MISS


def test_dispatch_imports_only_the_runtime() -> None:
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from test_layering import ROOT, imports
    path = ROOT / "jitop" / "dispatch.py"
    found = {i.module for i in imports(path, "jitop.dispatch") if i.module.startswith("jitop")}
    assert found == {"jitop.runtime.fastcall"}, found


# ** symbolic overloads: a key of arrays accepted once is remembered until the symbolic overloads change **
def symbolic(asked: list, accepts=lambda leaves: True, result: object = "s") -> Overload:
    def counted(leaves):
        asked.append(leaves)
        return accepts(leaves)
    return Overload(lambda values: result, accepts=counted)


def test_a_key_accepted_by_shape_is_asked_once_and_forgotten_when_the_overloads_change() -> None:
    d, asked = Dispatcher("t.sym"), []
    ov = d.get("k1", lambda: symbolic(asked), struct="S")
    assert d.lookup("k2", ["x2"], "S", by_shape=True) is ov and d.lookup("k2", ["x2"], "S", by_shape=True) is ov
    assert asked == [["x2"]]  # the second call did not ask
    assert d.lookup("k3", ["x3"], "S") is ov and d.lookup("k3", ["x3"], "S") is ov
    assert asked == [["x2"], ["x3"], ["x3"]]  # not by shape (a Python int's value may matter): asked each time
    d.retire(ov)  # what a re-trace of a rebound global does before it swaps the executable
    d.lookup("k2", ["x2"], "S", by_shape=True)
    assert asked[-1] == ["x2"] and len(asked) == 4
    newer, asked2 = symbolic([], result="n"), []
    assert d.replace(ov, newer)
    assert d.lookup("k2", ["x2"], "S", by_shape=True) is newer  # not the replaced one it remembered
    d.clear()
    assert d.lookup("k2", ["x2"], "S", by_shape=True) is None


def test_a_newer_symbolic_overload_clears_what_was_remembered() -> None:
    d, asked = Dispatcher("t.sym2"), []
    first = d.get("k1", lambda: symbolic(asked, accepts=lambda leaves: leaves != ["big"]), struct="S")
    assert d.lookup("k2", ["x"], "S", by_shape=True) is first
    second = d.get("k9", lambda: symbolic([], result="second"), struct="S", leaves=["big"])
    assert d.lookup("k2", ["x"], "S", by_shape=True) is second  # the newest that accepts, as before remembering
    assert d.lookup("k8", ["big"], "S", by_shape=True) is second
