"""apply_records: tuned configs reach `pick` (source "tuned"), the compiled kernel uses them, results stay
numpy's; untuned tasks keep the default with one summary line in explain."""
from __future__ import annotations

import io
import contextlib
import math

import numpy as np

import jitop
from jitop.tuner import records as rec_io
from jitop.tuner.measure import ErrorCode, MeasureResult
from jitop.tuner.records import Record
from jitop.tuner.registry import get
from jitop.tuner.task import Task, pick


def _explain(f, *args) -> str:
    with contextlib.redirect_stdout(io.StringIO()):
        return jitop.explain(f, *args)


def _tuned_config(task: Task):
    """A valid config of the task's space that is not its default."""
    default = get(task.template).default_config(task.workload, task.target)
    space = task.config_space()
    return next(space.get(i) for i in range(len(space) - 1, -1, -1) if space.get(i) != default)


def test_apply_records_changes_the_config_and_keeps_numpy_results(tmp_path) -> None:
    a = np.random.default_rng(0).standard_normal((37, 53)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((53, 29)).astype(np.float32)
    f = jitop.kernel(lambda x, y: x @ y)
    (task,) = f.tuning_tasks(a, b)
    tuned = _tuned_config(task)
    before = f(a, b)
    assert "default config" in _explain(f, a, b) and "1 of 1 untuned" in _explain(f, a, b)
    path = tmp_path / "t.jsonl"
    rec_io.append(path, [Record(task, tuned, MeasureResult((1e-6,), ErrorCode.NO_ERROR, timestamp=1.7e9)),
                         Record(task, get("matmul").default_config(task.workload, task.target),
                                MeasureResult((math.inf,), ErrorCode.TIMEOUT))])
    with jitop.apply_records(str(path)) as applied:
        assert pick(task).source == "tuned" and pick(task).config == tuned
        text = _explain(f, a, b)  # compiled before: recompiled with the tuned config
        assert f"tuned config {tuned.to_json()}" in text and "untuned" not in text
        np.testing.assert_allclose(f(a, b), a @ b, rtol=2e-5, atol=2e-5)
        assert "served 1" in applied.summary()
    assert pick(task).source == "default"
    assert "default config" in _explain(f, a, b)
    np.testing.assert_array_equal(f(a, b), before)


def test_an_untuned_task_uses_its_default_without_a_warning(tmp_path, recwarn) -> None:
    a = np.ones((8, 8), np.float32)
    f = jitop.kernel(lambda x: x @ x)
    other = Task("matmul", get("matmul").workload_type(m=64, n=64, k=64), jitop.Target.current())
    path = tmp_path / "t.jsonl"
    rec_io.append(path, [Record(other, _tuned_config(other), MeasureResult((1e-6,), ErrorCode.NO_ERROR))])
    with jitop.apply_records(path) as applied:
        for _ in range(3):
            np.testing.assert_array_equal(f(a), a @ a)
        assert "1 untuned" in applied.summary()
    assert not [w for w in recwarn if "jitop" in str(w.message)]


def test_global_apply_until_removed(tmp_path) -> None:
    task = Task("matmul", get("matmul").workload_type(m=20, n=20, k=20), jitop.Target.current())
    tuned = _tuned_config(task)
    applied = jitop.apply_records([Record(task, tuned, MeasureResult((1e-6,), ErrorCode.NO_ERROR))])
    try:
        assert pick(task).config == tuned
    finally:
        applied.remove()
    assert pick(task).source == "default"
