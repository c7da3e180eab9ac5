"""A large GPU function's kernels generated in forked children (jitop.codegen.ptx_shares): the build launches and
checks as the one-process build does (kernels, launches, checked accesses, error codes), its PTX is what this
process would build from the same runs, a child that fails in any way leaves its kernels to the parent, no child
is forked beside another Python thread, and a traced function built so runs on the simulated GPU to numpy's
results."""
from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

import failing_children
import jitop
import jitop.codegen.children as children
import jitop.codegen.ptx_shares as ptx_shares
import sim_gpu
from jitop import te
from jitop.codegen import nvptx
from jitop.codegen.nvptx import build_ptx, check_ptx, ptxas_path
from jitop.target import Target

SM90 = Target.from_string("cuda -arch=sm_90")
BX, TX = te.thread_axis("blockIdx.x"), te.thread_axis("threadIdx.x")


def _function():
    """Six stages, four kernels: gathers (each read checked at run time) in kernels 0 and 3, kernel 0 launched
    again on other buffers, kernel 1 twice, kernel 2 once."""
    A1, A2 = te.placeholder((50,), name="A1"), te.placeholder((50,), name="A2")
    I1, I2 = te.placeholder((100,), "int64", name="I1"), te.placeholder((100,), "int64", name="I2")
    stages = [te.compute((100,), lambda i: A1[I1[i]] * 2.0, name="T1"),
              te.compute((50,), lambda i: te.exp(A1[i]) * 2.0, name="E1"),
              te.compute((100,), lambda i: A2[I2[i]] * 2.0, name="T2"),
              te.compute((300,), lambda i: A1[i % 50] + 1.0, name="C"),
              te.compute((100,), lambda i: A2[I1[i]] + A1[I2[i]], name="G"),
              te.compute((50,), lambda i: te.exp(A2[i]) * 2.0, name="E2")]
    s = jitop.create_schedule([t.op for t in stages])
    for t in stages:
        bx, tx = s[t].split(t.op.axis[0], factor=64)
        s[t].bind(bx, BX)
        s[t].bind(tx, TX)
    return jitop.lower(s, [A1, A2, I1, I2, *stages])


@pytest.fixture
def forking(monkeypatch):
    """Every function large enough to fork for."""
    monkeypatch.setattr(ptx_shares, "MIN_FORK_SIZE", 0)


def _same_launches_and_checks(split, serial) -> None:
    assert split.kernels == serial.kernels and split.workspaces == serial.workspaces
    assert split.checked == serial.checked and split.error_symbol == serial.error_symbol


def _entries(ptx: str) -> list[str]:
    return [line for line in ptx.splitlines() if line.startswith(".visible .entry")]


def _error_stores(ptx: str) -> list[str]:
    """The PTX's stores of error codes to the flag (the codes immediate: the runs' bases are folded in)."""
    return sorted(line.strip() for line in ptx.splitlines() if "st.global" in line and "_error]" in line)


@pytest.mark.parametrize("jobs", [2, 3, 4])
def test_a_split_build_launches_and_checks_as_the_serial_build(forking, jobs):
    """Each run's module is optimised apart, so the PTX is LLVM's code for the same kernels, not byte for byte
    the one-module build's; the kernels, their launches, the checked accesses and their error codes are."""
    func = _function()
    plan = nvptx.plan_kernels(func)
    assert plan.n_kernels == 4 and plan.kernel_of == [0, 1, 0, 2, 3, 1]
    forks = ptx_shares.stats["forked"]
    split = ptx_shares.build_ptx(func, "f", SM90, jobs)
    assert ptx_shares.stats["forked"] == forks + 1
    serial = build_ptx(func, "f", SM90)
    _same_launches_and_checks(split, serial)
    assert _entries(split.ptx) == _entries(serial.ptx)
    # the error codes of later runs count on from the earlier runs' entries
    assert [c.split("[")[0] for c in split.checked] == ["read of A1", "read of A2", "read of A1"]
    assert _error_stores(split.ptx) == _error_stores(serial.ptx) == [f"st.global.b32 \t[f_error], {k};"
                                                                      for k in (1, 2, 3)]
    if ptxas_path() is not None or os.environ.get("JITOP_REQUIRE_PTXAS") == "1":
        check_ptx(split.ptx, "sm_90")


def _built_here(func, jobs, monkeypatch):
    """The split build with every run emitted and optimised in this process (as for failed children)."""
    with monkeypatch.context() as m:
        m.setattr(children, "fork", lambda work: None)
        return ptx_shares.build_ptx(func, "f", SM90, jobs)


def test_the_children_s_modules_are_the_ones_this_process_would_build(forking, monkeypatch):
    func = _function()
    forked, here = ptx_shares.build_ptx(func, "f", SM90, 3), _built_here(func, 3, monkeypatch)
    assert forked.ptx == here.ptx and forked.ll == here.ll
    _same_launches_and_checks(forked, here)


def test_runs_are_contiguous_cover_every_kernel_and_are_balanced(forking):
    plan = nvptx.plan_kernels(_function())
    sizes = [ptx_shares.KERNEL_COST + children.emitted_size(plan.nests[i], nvptx.MAX_UNROLL, ptx_shares.UNROLLED)
             for i in plan.firsts]
    for jobs in range(2, 7):
        runs = ptx_shares._runs(plan, jobs)
        assert [u for run in runs for u in run] == list(range(plan.n_kernels))
        assert all(runs) and 2 <= len(runs) <= jobs
        # a run ends with the kernel that takes it past its share of the whole
        assert max(sum(sizes[u] for u in run) for run in runs) <= sum(sizes) / min(jobs, len(sizes)) + max(sizes)


def test_a_small_function_is_built_in_this_process():
    forks = ptx_shares.stats["forked"]
    ptx_shares.build_ptx(_function(), "f", SM90, 4)  # far below MIN_FORK_SIZE
    assert ptx_shares.stats["forked"] == forks


def _garbage(*_):
    return b'{"kernels": [1, 2'


def _reply(share, bitcode: bytes) -> bytes:
    header = json.dumps(share.to_json()).encode()
    return ptx_shares._LENGTH.pack(len(header)) + header + bitcode


def _unparsable(plan, symbol, target, run, j):
    return _reply(nvptx.emit_share(plan, run, symbol, target, ptx_shares._base(symbol, j)), b"BC\xc0\xde broken")


def _other_kernels(plan, symbol, target, run, j):
    share, module = ptx_shares._optimised(plan, symbol, target, [0], j)
    return _reply(share, module.as_bitcode())


@pytest.mark.parametrize("work", [failing_children.raises, failing_children.exits, _garbage, _unparsable,
                                  _other_kernels, failing_children.hangs],
                         ids=["raises", "exits", "malformed", "unparsable", "other-kernels", "hangs"])
def test_a_failed_child_leaves_its_kernels_to_the_parent(forking, monkeypatch, work):
    monkeypatch.setattr(ptx_shares, "_child_work", work)
    monkeypatch.setattr(children, "REPLY_TIMEOUT_S", 0.5)  # the hanging child: killed after 4x the parent's time
    func = _function()
    forks, fallbacks = ptx_shares.stats["forked"], ptx_shares.stats["fallbacks"]
    split = ptx_shares.build_ptx(func, "f", SM90, 2)
    assert (ptx_shares.stats["forked"], ptx_shares.stats["fallbacks"]) == (forks + 1, fallbacks + 1)
    here = _built_here(func, 2, monkeypatch)
    assert split.ptx == here.ptx
    _same_launches_and_checks(split, here)


def test_no_fork_beside_another_python_thread(forking):
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        forks = ptx_shares.stats["forked"]
        ptx_shares.build_ptx(_function(), "f", SM90, 2)
        assert ptx_shares.stats["forked"] == forks
    finally:
        stop.set()
        other.join()


def _layers(x, w1, w2, idx):
    h = np.maximum(x @ w1, 0)
    e = np.exp(h - h.max(axis=-1, keepdims=True))
    y = (e / e.sum(axis=-1, keepdims=True)) @ w2
    return y[idx] * 2.0


def test_a_traced_function_built_by_several_processes_runs_to_numpy_s_results(forking, monkeypatch):
    gpu = sim_gpu.gpu_or_simulated(monkeypatch)
    monkeypatch.setenv("JITOP_COMPILE_JOBS", "3")
    monkeypatch.setenv("JITOP_CACHE", "0")
    rng = np.random.default_rng(3)
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((7, 24), (24, 40), (40, 13)))
    idx = np.array([6, 0, 3, 3, -1])
    forks = ptx_shares.stats["forked"]
    got = jitop.kernel(_layers, target="cuda")(x, w1, w2, idx)
    assert ptx_shares.stats["forked"] == forks + 1
    want = _layers(*(a.astype(np.float64) for a in (x, w1, w2)), idx)
    assert got.dtype == np.float32 and got.shape == want.shape
    # a 24-term dot product, exp of an O(1) argument, a 40-term sum and a 40-term dot product of O(1) terms
    np.testing.assert_allclose(got, want, rtol=0, atol=2 * 64 * 40 * np.finfo(np.float32).eps)
    with pytest.raises(IndexError):
        jitop.kernel(_layers, target="cuda")(x, w1, w2, np.array([7]))
    assert gpu is None or gpu.launched
