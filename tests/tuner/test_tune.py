"""jitop.tune end to end on real builds and measurements: tasks with weights, records on disk, a report,
faults injected into candidates become error records, results after tuning stay numpy's."""
from __future__ import annotations

import io
import contextlib

import numpy as np
import pytest

import jitop
from jitop.tuner import records as rec_io
from jitop.tuner.measure import ErrorCode, MeasureOptions
from jitop.tuner.task import pick


pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture
def mlp():
    f = jitop.kernel(lambda x, w1, w2: np.maximum(x @ w1, 0) @ w2)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((24, 40), (40, 40), (40, 40))]
    return f, args


def test_extract_tasks_counts_each_workload(mlp) -> None:
    f, args = mlp
    tasks = jitop.tuner.extract_tasks(f, *args)
    assert [(t.task.template, t.task.workload.m, t.task.workload.n, t.count) for t in tasks] == [("matmul", 24, 40, 2)]
    plain = jitop.tuner.extract_tasks(lambda a, b: jitop.matmul(a, b), args[0], args[1])
    assert plain[0].task == tasks[0].task and plain[0].count == 1


@pytest.mark.slow
def test_tune_writes_records_reports_and_applies(mlp, tmp_path) -> None:
    f, args = mlp
    path = tmp_path / "tune.jsonl"
    (weighted,) = jitop.tuner.extract_tasks(f, *args)
    space = weighted.task.config_space()
    faults = ((space.get(0).to_json(), "segfault"), (space.get(1).to_json(), "hang"),
              (space.get(2).to_json(), "wrong"))
    opts = MeasureOptions(repeat=2, min_repeat_ms=2, timeout_s=1.5, faults=faults)  # the hang costs the timeout
    err = io.StringIO()
    with contextlib.redirect_stderr(err):  # the default, then the space in order: the 3 faults and 2 good ones
        report = jitop.tune(f, *args, trials=6, tuner="grid", records=path, options=opts)
    recs = rec_io.load(path)
    assert len(recs) == 6 and report.tasks[0].trials == 6
    by_config = {r.config: r.result.error for r in recs}
    assert by_config[space.get(0)] == ErrorCode.CRASH
    assert by_config[space.get(1)] == ErrorCode.TIMEOUT
    assert by_config[space.get(2)] == ErrorCode.WRONG_ANSWER
    assert sum(r.result.ok for r in recs) == 3
    best = rec_io.best(recs)[weighted.task.key]
    assert report.tasks[0].best_gflops == pytest.approx(best.gflops) and best.gflops >= report.tasks[0].default_gflops
    assert "trials" in err.getvalue() and "matmul 24x40x40" in str(report)
    try:  # apply=True: this process now compiles with the best config
        assert pick(weighted.task).source == "tuned" and pick(weighted.task).config == best.config
        x, w1, w2 = args
        np.testing.assert_allclose(f(*args), np.maximum(x @ w1, 0) @ w2, rtol=1e-5, atol=1e-5)
    finally:
        report.applied.remove()
    # without the applied records, the persistent cache still serves the best one (any later process too)
    assert pick(weighted.task).source == "tuned" and pick(weighted.task).config == best.config
    jitop.tuner.cached.tuned_store().clear()
    jitop.tuner.cached.forget()
    assert pick(weighted.task).source == "default"


@pytest.mark.slow
def test_tune_resumes_from_its_records(mlp, tmp_path) -> None:
    f, args = mlp
    path = tmp_path / "tune.jsonl"
    opts = MeasureOptions(repeat=1, min_repeat_ms=1)
    jitop.tune(f, *args, trials=6, tuner="random", records=path, options=opts, progress=False, apply=False)
    jitop.tune(f, *args, trials=6, tuner="random", records=path, options=opts, progress=False, apply=False, seed=1)
    recs = rec_io.load(path)
    searched = [r.config for r in recs]
    default = searched[0]
    assert len(recs) == 12 and len(set(searched) - {default}) == 10  # the second run never repeated a config


def test_tune_refuses_a_function_without_tasks() -> None:
    with pytest.raises(ValueError, match="no tunable operator"):
        jitop.tune(jitop.kernel(lambda a: a + 1), np.ones(4), trials=2)
