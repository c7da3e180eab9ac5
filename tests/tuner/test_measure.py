"""The measurer: candidates build in worker processes and run isolated; a candidate that crashes, hangs,
raises, answers wrongly or does not build is a result with an error code and infinite cost, and the
measurer goes on with a fresh worker. Small workloads keep the spawned processes' work short."""
from __future__ import annotations

import math
import multiprocessing
import time

import pytest

import jitop
from jitop.tuner import registry
from jitop.tuner.measure import ErrorCode, LocalMeasurer, MeasureInput, MeasureOptions, MeasureResult
from jitop.tuner.space import Config
from jitop.tuner.task import Task

REPEAT = 3


def _matmul_task() -> Task:
    wl = registry.get("matmul").workload_type(m=32, n=32, k=32, dtype="float32")
    return Task("matmul", wl, jitop.Target.current())


def _conv_task() -> Task:
    wl = registry.get("conv2d").workload_type(n=1, c=8, h=10, w=10, oc=16, kh=3, kw=3)
    return Task("conv2d", wl, jitop.Target.current())


def _configs(task: Task, count: int, skip: int = 0) -> list[Config]:
    """`count` distinct points of the task's space, spread over it (not the first few only)."""
    space = task.config_space()
    step = max(1, len(space) // (count + skip + 1))
    return [space.get((k + skip) * step) for k in range(count)]


# faults (TESTING ONLY) are keyed by config: these four configs misbehave in the runner
FAULTY = dict(zip(("segfault", "hang", "raise", "wrong"), _configs(_matmul_task(), 4, skip=10)))


@pytest.fixture(scope="module")
def measurer():
    options = MeasureOptions(repeat=REPEAT, min_repeat_ms=2.0, timeout_s=2.0, build_workers=2,
                             faults=tuple((cfg.to_json(), kind) for kind, cfg in FAULTY.items()))
    with LocalMeasurer(options) as m:
        yield m


def _assert_ok(result: MeasureResult) -> None:
    assert result.ok, (result.error, result.error_msg)
    assert len(result.costs) == REPEAT
    assert all(math.isfinite(c) and c > 0 for c in result.costs)
    assert result.build_s > 0 and result.run_s > 0
    assert abs(result.timestamp - time.time()) < 600


def _assert_failed(result: MeasureResult, code: ErrorCode) -> None:
    assert result.error == code, (result.error, result.error_msg)
    assert not result.ok and result.cost == math.inf and result.costs == (math.inf,)
    assert result.error_msg


def test_good_candidates_measure_in_input_order(measurer: LocalMeasurer) -> None:
    mm, conv = _matmul_task(), _conv_task()
    m_cfgs, c_cfgs = _configs(mm, 3), _configs(conv, 2)
    bad = Config.of(**{**m_cfgs[0].as_dict(), "tile_m": (1, 999)})   # a value no knob offers
    inputs = [MeasureInput(mm, m_cfgs[0]), MeasureInput(conv, c_cfgs[0]), MeasureInput(mm, m_cfgs[1]),
              MeasureInput(mm, bad), MeasureInput(conv, c_cfgs[1]), MeasureInput(mm, m_cfgs[2])]
    results = measurer.measure(inputs)
    assert len(results) == len(inputs)
    for k in (0, 1, 2, 4, 5):
        _assert_ok(results[k])
    _assert_failed(results[3], ErrorCode.BUILD_ERROR)   # the failure sits where its input did
    assert "not a point of the space" in results[3].error_msg
    assert measurer.stats["build"] > 0 and measurer.stats["measure"] > 0


def test_faults_become_results_and_the_next_candidate_still_runs(measurer: LocalMeasurer) -> None:
    task = _matmul_task()
    good = _configs(task, 5)
    order = ["segfault", "hang", "raise", "wrong"]
    inputs = [MeasureInput(task, good[0])]
    for k, kind in enumerate(order):
        inputs += [MeasureInput(task, FAULTY[kind]), MeasureInput(task, good[k + 1])]
    results = measurer.measure(inputs)
    expected = {"segfault": ErrorCode.CRASH, "hang": ErrorCode.TIMEOUT, "raise": ErrorCode.RUN_ERROR,
                "wrong": ErrorCode.WRONG_ANSWER}
    _assert_ok(results[0])
    for k, kind in enumerate(order):
        _assert_failed(results[1 + 2 * k], expected[kind])
        _assert_ok(results[2 + 2 * k])   # the worker was replaced (or survived): the tuner goes on
    assert "SIGSEGV" in results[1].error_msg
    assert results[3].run_s >= 2.0        # waited for the timeout, no longer than needed plus start-up
    assert "injected fault" in results[5].error_msg


def test_build_errors_leave_the_other_candidates_alone(measurer: LocalMeasurer) -> None:
    task = _matmul_task()
    nope = Task("no_such_template", task.workload, task.target)   # its build (and its default's) raises
    good = _configs(task, 2)
    inputs = [MeasureInput(task, good[0]), MeasureInput(task, Config.of(bogus=1)),
              MeasureInput(nope, good[0]), MeasureInput(task, good[1])]
    results = measurer.measure(inputs)
    _assert_ok(results[0])
    _assert_ok(results[3])
    _assert_failed(results[1], ErrorCode.BUILD_ERROR)
    _assert_failed(results[2], ErrorCode.BUILD_ERROR)
    assert "no_such_template" in results[2].error_msg


def test_a_build_past_its_timeout_is_a_build_timeout() -> None:
    task = _matmul_task()
    with LocalMeasurer(MeasureOptions(build_timeout_s=1e-3, build_workers=2)) as m:
        results = m.measure([MeasureInput(task, cfg) for cfg in _configs(task, 2)])
    for r in results:
        _assert_failed(r, ErrorCode.BUILD_TIMEOUT)


def test_measure_twice_reuses_the_workers_and_close_stops_them() -> None:
    task = _matmul_task()
    before = {p.pid for p in multiprocessing.active_children()}
    m = LocalMeasurer(MeasureOptions(repeat=REPEAT, min_repeat_ms=1.0, build_workers=1))
    first = m.measure([MeasureInput(task, _configs(task, 1)[0])])
    ours = {p.pid for p in multiprocessing.active_children()} - before
    second = m.measure([MeasureInput(task, cfg) for cfg in _configs(task, 2, skip=1)])
    assert ours and ours <= {p.pid for p in multiprocessing.active_children()}   # the same processes served
    for r in [*first, *second]:
        _assert_ok(r)
    m.close()
    assert not ours & {p.pid for p in multiprocessing.active_children()}
    assert m.measure([]) == []


def test_unchecked_measurement_needs_no_reference() -> None:
    task = _matmul_task()
    with LocalMeasurer(MeasureOptions(repeat=1, min_repeat_ms=0.0, check=False, build_workers=1)) as m:
        [result] = m.measure([MeasureInput(task, _configs(task, 1)[0])])
    assert result.ok and len(result.costs) == 1


@pytest.mark.parametrize("bad", [dict(number=0), dict(repeat=0), dict(timeout_s=0), dict(min_repeat_ms=-1),
                                 dict(build_workers=0), dict(faults=(("{}", "explode"),))])
def test_options_are_checked(bad: dict) -> None:
    with pytest.raises(ValueError):
        MeasureOptions(**bad)


def test_faults_match_configs_whatever_the_key_order() -> None:
    cfg = Config.of(a=1, b=(2, 3))
    options = MeasureOptions(faults=(('{"b": [2, 3], "a": 1}', "hang"),))
    assert options.fault_for(cfg) == "hang" and options.fault_for(Config.of(a=2, b=(2, 3))) is None
