"""Search strategies and the task scheduler on synthetic costs (no LLVM): each finds the exhaustive best of
a small space, never proposes a point twice, and the scheduler spends a shared budget where it pays."""
from __future__ import annotations

import numpy as np
import pytest

import jitop
from jitop.tuner.measure import MeasureInput
from jitop.tuner.registry import get
from jitop.tuner.scheduler import TaskScheduler, parse_budget
from jitop.tuner.search import STRATEGIES, make_search
from jitop.tuner.task import Task
from tuning_fakes import SyntheticMeasurer, exhaustive_best, synthetic_cost

HASWELL = jitop.Target.from_string("haswell")


def _task(m: int = 16, n: int = 16, k: int = 16) -> Task:
    return Task("matmul", get("matmul").workload_type(m=m, n=n, k=k), HASWELL)


def _run(search, task: Task, trials: int, batch: int = 16, stop_at: float = 0.0) -> list[float]:
    """Best cost after each trial (ending early once the best is at most `stop_at`)."""
    measurer, curve = SyntheticMeasurer(), []
    while len(curve) < trials and search.has_next() and search.best_cost > stop_at:
        configs = search.next_batch(min(batch, trials - len(curve)))
        inputs = [MeasureInput(task, c) for c in configs]
        search.update(inputs, measurer.measure(inputs))
        curve += [search.best_cost] * len(configs)
    return curve


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "xgb" else n
                                  for n in sorted(STRATEGIES)])
def test_every_strategy_finds_the_exhaustive_best_and_never_repeats(name: str) -> None:
    """The whole space, one point at a time: 192 points are 12 batches, enough for xgb to fit, plan, go on
    from a plan to random picks and refit, and to drain the space to its last points."""
    task = _task(8, 8, 8)
    search = make_search(name, task, seed=1)
    seen = []
    orig = search.next_batch

    def spy(n: int):
        out = orig(n)
        seen.extend(out)
        return out

    search.next_batch = spy
    curve = _run(search, task, len(task.config_space()))
    assert len(seen) == len(set(seen)) == len(task.config_space())
    assert curve[-1] == pytest.approx(exhaustive_best(task))
    assert not search.has_next() and search.next_batch(4) == []


@pytest.mark.slow
def test_model_guided_search_beats_random_on_a_learnable_space() -> None:
    """Median over 3 seeds of trials to reach the exhaustive best of a 576-point space: xgb needs fewer than
    random (each search runs until it has the best, at most the whole space; over seeds 0-6 xgb took 32-48
    trials, random 64-528, median 448)."""
    task = _task()
    target = exhaustive_best(task) * 1.0000001

    def trials_to_best(name: str, seed: int) -> int:
        curve = _run(make_search(name, task, seed=seed), task, len(task.config_space()), stop_at=target)
        return next((k + 1 for k, c in enumerate(curve) if c <= target), 10**9)

    xgb = sorted(trials_to_best("xgb", s) for s in range(3))[1]
    rnd = sorted(trials_to_best("random", s) for s in range(3))[1]
    assert xgb < rnd, (xgb, rnd)


def test_early_stopping_counts_trials_since_the_best() -> None:
    task = _task()
    search = make_search("grid", task)
    _run(search, task, 64)
    assert search.stalled(64 - search._best_at) and not search.stalled(64 - search._best_at + 1)


def test_scheduler_gives_the_heavier_task_more_trials(tmp_path) -> None:
    light, heavy = _task(16, 16, 16), _task(48, 96, 64)
    sched = TaskScheduler([light, heavy], [1, 20], SyntheticMeasurer(), tuner="random", trials=320, batch_size=16,
                          records_path=str(tmp_path / "r.jsonl"), early_stopping=None)
    states = sched.run()
    assert sched.trials == 320
    assert states[1].trials > 2 * states[0].trials, [s.trials for s in states]
    weights = sched.weights()
    assert weights[1] > weights[0] and sum(weights) == pytest.approx(1.0)
    from jitop.tuner import records as rec_io
    assert len(rec_io.load(tmp_path / "r.jsonl")) == 320


def test_scheduler_measures_every_default_first_and_respects_a_time_budget() -> None:
    tasks = [_task(16, 16, 16), _task(48, 96, 64)]
    measurer = SyntheticMeasurer()
    TaskScheduler(tasks, [1, 1], measurer, tuner="random", budget=0.0).run()
    defaults = [get("matmul").default_config(t.workload, t.target) for t in tasks]
    assert [(i.task, i.config) for i in measurer.measured] == list(zip(tasks, defaults))


def test_failed_candidates_are_never_best() -> None:
    task = _task()
    best_config = min(task.config_space(), key=lambda c: synthetic_cost(task, c))
    measurer = SyntheticMeasurer(failing=[best_config.to_json()])
    sched = TaskScheduler([task], [1], measurer, tuner="grid", trials=len(task.config_space()) + 1,
                          early_stopping=None)
    state = sched.run()[0]
    assert state.search.best_config != best_config
    assert state.best_cost > exhaustive_best(task)


def test_budget_strings() -> None:
    assert parse_budget("10m") == 600 and parse_budget(5) == 5.0 and parse_budget("2h") == 7200
    with pytest.raises(ValueError, match="budget"):
        parse_budget("ten minutes")
    with pytest.raises(ValueError, match="tuner='annealing'"):
        make_search("annealing", _task())
    with pytest.raises(ValueError, match="give a budget"):
        TaskScheduler([_task()], [1], SyntheticMeasurer())


@pytest.mark.slow
def test_scheduler_gives_each_model_the_other_workloads_records() -> None:
    """Transfer: a model-guided task learns from the records of the other task of its template."""
    a, b = _task(8, 8, 8), _task(4, 16, 16)  # 192 points each: little to featurise
    # batches of a plan's size: defaults, a warm-up batch each, one more batch each (the first then has the
    # other's warm-up records) in 2 + 4 x 64 trials
    sched = TaskScheduler([a, b], [1, 1], SyntheticMeasurer(), tuner="xgb", trials=2 + 4 * 64, batch_size=64,
                          early_stopping=None)
    states = sched.run()
    assert all(s.transfer_seen >= 64 for s in states), [s.transfer_seen for s in states]
    from jitop.tuner.scheduler import _spread
    recs = states[0].search.records + states[1].search.records
    picked = _spread(recs, 40)
    assert len(picked) == 40 and {r.task for r in picked} == {a, b}


def test_a_plan_featurises_at_most_its_budget_of_new_configs() -> None:
    """Simulated annealing scores only `new_points` configs it has not featurised before (lowering is slow),
    also after earlier plans used up budget on configs featurised since."""
    from jitop.tuner import features as F
    from jitop.tuner.search import ModelGuidedSearch
    task = _task(48, 96, 64)
    F._CACHES.pop((task.key, task.constant_weights), None)
    search = ModelGuidedSearch(task, seed=0, new_points=20)
    measurer = SyntheticMeasurer()
    for _ in range(3):
        configs = search.next_batch(16)
        inputs = [MeasureInput(task, c) for c in configs]
        before = len(F._cache(task).rows)
        search.update(inputs, measurer.measure(inputs))  # refits on these records, then plans
        assert len(F._cache(task).rows) - before <= 16 + 20
    assert search.model.fitted and search._plan


class _InterruptedMeasurer(SyntheticMeasurer):
    """Gives `before` results of its second batch, then is interrupted (Ctrl-C in the middle of a batch)."""

    def __init__(self, before: int):
        super().__init__()
        self.before, self.batches = before, 0

    def measure(self, inputs, on_result=None):  # noqa: ANN001 - SyntheticMeasurer's signature
        self.batches += 1
        if self.batches < 2:
            return super().measure(inputs, on_result)
        for n, inp in enumerate(inputs[:self.before]):
            on_result(n, super().measure([inp])[0])
        raise KeyboardInterrupt


def test_an_interrupted_batch_keeps_every_finished_trial_on_disk(tmp_path) -> None:
    from jitop.tuner import records as rec_io
    path = tmp_path / "tune.jsonl"
    sched = TaskScheduler([_task()], [1], _InterruptedMeasurer(before=5), tuner="random", trials=40, batch_size=8,
                          records_path=str(path))
    with pytest.raises(KeyboardInterrupt):
        sched.run()
    recs = rec_io.load(path)
    assert len(recs) == 1 + 5  # the default's batch, then the five results that arrived before the interrupt
    assert len({r.config for r in recs}) == 6
