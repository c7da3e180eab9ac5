"""A deep kernel's parts built in forked children (jitop.codegen.forked): the same results as a build in one
process, run-time errors from a child's parts with their own messages, and a serial fallback whenever a child
fails or forking is unsafe."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import failing_children
import jitop
import jitop.codegen.children as children
import jitop.codegen.forked as forked
from jitop.codegen.instances import find_shared
from jitop.codegen.kernel import kernel_parts, top_level_nests
from jitop.graph.compile import build, prepare

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="forked builds need os.fork")

DEPTH = 12  # three top-level nests per layer: 37 in all, three parts of the kernel


def program(x, w, rows, cols):
    """Takes at both ends of a deep chain of matmuls: the first in the kernel's first part, the last in its last."""
    x = np.take(x, rows, axis=0)
    for _ in range(DEPTH):
        x = np.tanh(x @ w) + x
    return np.take(x, cols, axis=1)


@pytest.fixture(scope="module")
def args() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((37, 29)).astype(np.float32)
    w = (rng.standard_normal((29, 29)) * 0.2).astype(np.float32)
    return [x, w, np.arange(36, -1, -1), np.array([3, 0, 28, -1])]


def compiled(args: list[np.ndarray], jobs: int, monkeypatch: pytest.MonkeyPatch):
    """The Executable of `program`, built (never read from a cache) with JITOP_COMPILE_JOBS=jobs."""
    monkeypatch.setenv("JITOP_COMPILE_JOBS", str(jobs))
    tr = jitop.kernel(program, fallback=False).trace(args, None, None)
    return build(prepare("deep", tr.inputs, tr.names, tr.plan, tr.results, reps=tr.reps))


def counts() -> tuple[int, int]:
    return forked.stats["forked"], forked.stats["fallbacks"]


def last_part_in_a_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent builds every part but the last; one child builds the last (the second take's checks)."""
    def shares(func, jobs):
        n = len(kernel_parts(len(top_level_nests(func.body))))
        return [frozenset(range(n - 1)), frozenset({n - 1})]
    monkeypatch.setattr(forked, "_shares", shares)


def test_forked_build_matches_numpy_and_a_serial_build(args, monkeypatch) -> None:
    serial = compiled(args, 1, monkeypatch)
    assert len(kernel_parts(len(top_level_nests(serial.func.body)))) >= 3  # 3 on AVX-512, 4 on AVX2
    forks, fallbacks = counts()
    two, three = compiled(args, 2, monkeypatch), compiled(args, 3, monkeypatch)
    assert counts() == (forks + 2, fallbacks)
    want = program(*args)
    got = serial(*args)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(two(*args)[0], got)
    np.testing.assert_array_equal(three(*args)[0], got)
    # the children's parts are linked in and internal again: the object exports what a serial one does
    for exe in (two, three):
        assert ".part" not in "".join(line for line in str(exe.module._ll).splitlines() if line.startswith("define")
                                      and "internal" not in line)


def test_errors_from_a_childs_part_raise_their_own_message(args, monkeypatch) -> None:
    last_part_in_a_child(monkeypatch)
    forks, fallbacks = counts()
    exe = compiled(args, 2, monkeypatch)
    assert counts() == (forks + 1, fallbacks)
    x, w, rows, cols = args
    np.testing.assert_array_equal(exe(*args)[0], compiled(args, 1, monkeypatch)(*args)[0])
    with pytest.raises(IndexError, match="axis 1 with size 29"):   # the child's take
        exe(x, w, rows, np.array([0, 29, 1, 2]))
    with pytest.raises(IndexError, match="axis 0 with size 37"):   # the parent's take
        exe(x, w, np.full(37, -38), cols)
    exe(*args)  # the flag was reset: a good call runs again
    checked = exe.module.meta["checked_accesses"]
    assert any("size 29" in c for c in checked) and any("size 37" in c for c in checked)


def _garbage(*_):
    return b"\x05\x00\x00\x00\x00\x00\x00\x00[1, 2garbage"


@pytest.mark.parametrize("work", [failing_children.raises, failing_children.exits, _garbage, failing_children.hangs],
                         ids=["raises", "exits", "malformed", "hangs"])
def test_a_failed_child_falls_back_to_the_parent(args, monkeypatch, work) -> None:
    last_part_in_a_child(monkeypatch)
    monkeypatch.setattr(forked, "_child_work", work)
    monkeypatch.setattr(children, "REPLY_TIMEOUT_S", 0.5)  # the hanging child: killed after 4x the parent's time
    forks, fallbacks = counts()
    exe = compiled(args, 2, monkeypatch)
    assert counts() == (forks + 1, fallbacks + 1)
    np.testing.assert_allclose(exe(*args)[0], program(*args), rtol=1e-5, atol=1e-5)
    with pytest.raises(IndexError, match="axis 1 with size 29"):
        exe(args[0], args[1], args[2], np.array([0, -30, 1, 2]))


def test_no_fork_beside_another_python_thread(args, monkeypatch) -> None:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        forks = counts()[0]
        exe = compiled(args, 2, monkeypatch)
        assert counts()[0] == forks
    finally:
        stop.set()
        other.join()
    np.testing.assert_allclose(exe(*args)[0], program(*args), rtol=1e-5, atol=1e-5)


def test_shares_balance_the_parts_by_size(args, monkeypatch) -> None:
    func = compiled(args, 1, monkeypatch).func
    nests = top_level_nests(func.body)
    parts = kernel_parts(len(nests))
    shared = find_shared(nests, func.attrs["ranges"], frozenset(func.symbols))
    sizes = [forked._size(nest) for nest in nests]
    shares = forked._shares(func, 2)
    assert len(shares) == 2 and all(shares)
    assert sorted(p for s in shares for p in s) == list(range(len(parts)))
    # a group of identical nests costs once per process: the first instance generates its function
    loads = [forked._cost([k for p in sorted(s) for k in parts[p]], sizes, shared, set()) for s in shares]
    assert max(loads) - min(loads) <= max(forked._cost(ks, sizes, shared, set()) for ks in parts)
    assert forked._shares(func, 1) == []
    assert all(forked._shares(func, 8))
