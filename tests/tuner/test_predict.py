"""Predicted configs: a cost model trained on the cache's records of tuned workloads ranks a new workload's
space and `pick` takes its best (source "predicted") without measuring; the choice is stored and reused."""
from __future__ import annotations

import numpy as np
import pytest

import jitop
from jitop.driver import default_target
from jitop.tuner import cached, predict
from jitop.tuner.measure import ErrorCode, MeasureResult
from jitop.tuner.records import Record
from jitop.tuner.registry import get
from jitop.tuner.task import Task, pick


pytestmark = pytest.mark.usefixtures("private_cache")


def matmul_task(m: int, n: int, k: int) -> Task:
    return Task("matmul", get("matmul").workload_type(m=m, n=n, k=k, dtype="float32"), default_target())


def synthetic_records(task: Task, count: int = 40) -> list[Record]:
    """Measured-looking records whose speed grows with the register tile's width (a learnable rule)."""
    space = task.config_space()
    rng = np.random.default_rng(len(task.key))
    out = []
    for i in rng.choice(len(space), size=min(count, len(space)), replace=False):
        cfg = space.get(int(i))
        width = np.prod(cfg["tile_n"][1:]) * np.prod(cfg["tile_m"][1:])
        out.append(Record(task, cfg, MeasureResult((1e-3 / width,), ErrorCode.NO_ERROR)))
    return out


def test_a_never_tuned_workload_gets_the_models_best_prediction(monkeypatch) -> None:
    store = cached.tuned_store().store
    for shape in ((64, 64, 64), (128, 96, 64)):
        t = matmul_task(*shape)
        predict.save_training(store, synthetic_records(t))
    assert predict.train(store, "matmul", default_target().key) == 2
    new = matmul_task(96, 80, 72)
    choice = pick(new)
    assert choice.source == "predicted" and "cost model" in choice.note
    new.config_space().index_of(choice.config)
    cands = predict._candidates(new)
    width = lambda c: np.prod(c["tile_n"][1:]) * np.prod(c["tile_m"][1:])  # noqa: E731
    assert width(choice.config) >= np.median([width(c) for c in cands])  # it learned the rule
    # stored: a later pick reuses it without the model
    monkeypatch.setattr(predict, "_model", lambda *a: pytest.fail("ranked again"))
    assert pick(new) == choice


def test_no_model_without_records_of_two_workloads() -> None:
    store = cached.tuned_store().store
    predict.save_training(store, synthetic_records(matmul_task(64, 64, 64)))
    assert predict.train(store, "matmul", default_target().key) == 0
    assert pick(matmul_task(96, 80, 72)).source == "default"


def test_a_predicted_config_compiles_and_is_numpy_correct() -> None:
    store = cached.tuned_store().store
    for shape in ((64, 64, 64), (128, 96, 64)):
        predict.save_training(store, synthetic_records(matmul_task(*shape)))
    predict.train(store, "matmul", default_target().key)
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((53, 71)).astype(np.float32), rng.standard_normal((71, 37)).astype(np.float32)
    f = jitop.kernel(lambda x, y: x @ y)
    np.testing.assert_allclose(f(a, b), a @ b, rtol=1e-4, atol=1e-4)
    (entry,) = f.cache.values()
    assert any("predicted config" in t for t in entry.exe.templates)
