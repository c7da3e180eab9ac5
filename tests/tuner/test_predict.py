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
    """Measured-looking records whose speed grows with the register tile's width (a learnable rule); the
    default config first, as `jitop.tune` measures it."""
    space = task.config_space()
    rng = np.random.default_rng(len(task.key))
    out = []
    default = get(task.template).default_config(task.workload, task.target)
    picks = [space.index_of(default)] + [int(i) for i in rng.choice(len(space), size=min(count, len(space)),
                                                                     replace=False)]
    for i in dict.fromkeys(picks):
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


def conv_task(c: int, oc: int, hw: int, k: int) -> Task:
    wl = get("conv2d").workload_type(n=1, c=c, h=hw, w=hw, oc=oc, kh=k, kw=k, pads=(k // 2,) * 4)
    return Task("conv2d", wl, default_target())


def conv_records(task: Task, count: int = 24) -> list[Record]:
    """Records that rank every config by its index (any learnable order will do; the default among them)."""
    space = task.config_space()
    step = max(1, len(space) // count)
    default = space.index_of(get(task.template).default_config(task.workload, task.target))
    return [Record(task, space.get(i), MeasureResult((1e-3 * (1 + i / len(space)),), ErrorCode.NO_ERROR))
            for i in dict.fromkeys([default, *range(0, len(space), step)][:count])]


def test_a_model_never_ranks_a_workload_of_a_kind_it_was_not_trained_on() -> None:
    store = cached.tuned_store().store
    for task in (conv_task(32, 32, 14, 3), conv_task(64, 32, 7, 3)):
        predict.save_training(store, conv_records(task))
        cached.save_best(conv_records(task))
    assert predict.train(store, "conv2d", default_target().key) == 2
    pointwise = conv_task(48, 64, 14, 1)  # a 1x1 convolution: no 1x1 was trained or tuned
    assert pick(pointwise).source == "default"  # neither predicted nor transferred from a 3x3
    assert pick(conv_task(48, 64, 14, 3)).source == "predicted"  # a 3x3 one is ranked
    predict.save_training(store, conv_records(conv_task(16, 16, 7, 1)))
    assert predict.train(store, "conv2d", default_target().key) == 2  # one 1x1 workload: no 1x1 model yet
    assert pick(conv_task(40, 64, 14, 1)).source == "default"
    predict.save_training(store, conv_records(conv_task(24, 32, 14, 1)))
    assert predict.train(store, "conv2d", default_target().key) == 4
    assert pick(conv_task(40, 64, 14, 1)).source == "predicted"  # now a model has seen two 1x1 workloads


def test_each_kind_has_its_own_model_trained_on_that_kind_only(monkeypatch) -> None:
    from jitop.tuner.model import CostModel
    store = cached.tuned_store().store
    for task in (conv_task(32, 32, 14, 3), conv_task(64, 32, 7, 3), conv_task(16, 16, 7, 1),
                 conv_task(24, 32, 14, 1)):
        predict.save_training(store, conv_records(task))
    kinds_per_fit = []
    fit_all = CostModel.fit_all

    def spy(self, records, *args, **kwargs):
        kinds_per_fit.append({get("conv2d").kind(r.task.workload) for r in records})
        return fit_all(self, records, *args, **kwargs)
    monkeypatch.setattr(CostModel, "fit_all", spy)
    assert predict.train(store, "conv2d", default_target().key) == 4
    assert kinds_per_fit and all(len(kinds) == 1 for kinds in kinds_per_fit)  # held-out fits included
    assert {k for kinds in kinds_per_fit for k in kinds} == {get("conv2d").kind(conv_task(8, 8, 7, k).workload)
                                                               for k in (1, 3)}
    assert len(list(store.keys(f"model/{default_target().key}/conv2d/"))) == 2


def test_a_stored_prediction_of_another_model_is_not_served() -> None:
    import json
    store = cached.tuned_store().store
    for task in (conv_task(32, 32, 14, 3), conv_task(64, 32, 7, 3)):
        predict.save_training(store, conv_records(task))
    predict.train(store, "conv2d", default_target().key)
    task = conv_task(48, 64, 14, 3)
    fresh = predict.predicted_choice(task, store)
    assert fresh is not None and fresh.source == "predicted"
    key = f"predicted/{task.target.key}/conv2d/{task.key}"
    other = task.config_space().get(0)
    assert other != fresh.config
    stale = {**json.loads(store.get(key)), "config": other.as_dict(), "model": "0" * 16}  # another model's pick
    store.put(key, json.dumps(stale).encode())
    assert predict.predicted_choice(task, store).config == fresh.config  # ranked again by the current model


def test_a_model_whose_held_out_picks_are_slower_than_the_defaults_is_not_used() -> None:
    store = cached.tuned_store().store
    tasks = [matmul_task(64, 64, 64), matmul_task(128, 96, 64), matmul_task(96, 64, 128)]
    learnable = [r for t in tasks for r in synthetic_records(t)]
    (gain,) = predict.held_out_gains(learnable).values()  # one kind: float32 matmuls
    assert gain >= 1.0
    # the same configs, but the default is the fastest of each task and the rest are in random order
    rng = np.random.default_rng(0)
    noise = [Record(r.task, r.config, MeasureResult((1e-3 if r.config == get("matmul").default_config(
        r.task.workload, r.task.target) else 2e-3 + rng.random() * 1e-3,), ErrorCode.NO_ERROR)) for r in learnable]
    assert max(predict.held_out_gains(noise).values()) < 1.0
    predict.save_training(store, noise)
    assert predict.train(store, "matmul", default_target().key) == 0  # no model: pick falls back
    assert pick(matmul_task(96, 80, 72)).source == "default"


def test_a_stored_prediction_is_not_served_once_its_model_no_longer_predicts_for_the_kind() -> None:
    import json
    store = cached.tuned_store().store
    task = conv_task(48, 64, 14, 1)
    space = task.config_space()
    stale = {"config": space.get(0).as_dict(), "note": "an older model's pick"}
    store.put(f"predicted/{task.target.key}/conv2d/{task.key}", json.dumps(stale).encode())
    assert predict.predicted_choice(task, store) is None  # no model knows 1x1 convolutions now
    assert pick(task).source == "default"


def test_a_model_another_process_retrained_is_used_not_the_one_in_memory() -> None:
    import hashlib
    import json
    from jitop.tuner.model import CostModel
    store = cached.tuned_store().store
    tasks = (conv_task(32, 32, 14, 3), conv_task(64, 32, 7, 3))
    for task in tasks:
        predict.save_training(store, conv_records(task))
    predict.train(store, "conv2d", default_target().key)
    new = conv_task(48, 64, 14, 3)
    assert predict.predicted_choice(new, store) is not None  # the first model is now in this process's memory
    # another process retrains on records that rank the configs the other way round, and drops predictions
    flipped = [Record(r.task, r.config, MeasureResult((3e-3 - r.result.cost,), ErrorCode.NO_ERROR))
               for t in tasks for r in conv_records(t)]
    model = CostModel(flipped[0].task)
    model.fit_all(flipped)
    raw = model.to_bytes()
    kind = get("conv2d").kind(new.workload)
    store.put(predict._model_key(new.target.key, "conv2d", kind), raw)
    digest = hashlib.sha256(raw).hexdigest()[:16]
    store.put(f"model-kinds/{new.target.key}/conv2d", json.dumps({kind: digest}).encode())
    store.delete(f"predicted/{new.target.key}/conv2d/{new.key}")
    choice = predict.predicted_choice(new, store)
    mine = CostModel(new)
    mine._booster = model._booster
    candidates = predict._candidates(new)
    assert choice.config == candidates[int(mine.predict(candidates).argmax())]
    assert json.loads(store.get(f"predicted/{new.target.key}/conv2d/{new.key}"))["model"] == digest
