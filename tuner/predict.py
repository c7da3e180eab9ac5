"""Predicted configs for workloads that were never tuned: `pick`'s source "predicted".

After `jitop.tune`, every measured record is kept in the cache ("records/<target>/<template>/<task>", the
latest RECORDS_PER_TASK per task) and one cost model per template and Target is trained on all of them (one
ranking group per task, as the tuner's transfer learning does) and stored as XGBoost JSON ("model/<target>/
<template>", no pickle). A task with no tuned record then gets the model's best of CANDIDATES configs of its
own space (the default, the configs of the nearest tuned workloads projected onto this space, and a
deterministic sample), without measuring anything; the choice is stored ("predicted/...") so later processes
do not rank again. Background tuning confirms or replaces it.

>>> from jitop.cache.store import NullStore
>>> predicted_choice(None, NullStore()) is None
True
"""
from __future__ import annotations

import json
import math
import random
from typing import Any, Iterable

from jitop.tuner import registry
from jitop.tuner.records import Record
from jitop.tuner.space import Config
from jitop.tuner.task import Choice, Task

RECORDS_PER_TASK = 1000
CANDIDATES = 48
MIN_TASKS = 2          # tasks whose records trained the model (one task's ranking says little about another's)
_models: dict[tuple, Any] = {}  # (store directory, target key, template) -> CostModel or None


def save_training(store: Any, records: Iterable[Record]) -> None:
    """Append measured records to their task's training set in the cache (the latest RECORDS_PER_TASK)."""
    by_task: dict[str, list[Record]] = {}
    for r in records:
        by_task.setdefault(r.task.key, []).append(r)
    for recs in by_task.values():
        t = recs[0].task
        lines = [r.to_json() for r in recs]

        def change(old: bytes | None, lines: list[str] = lines) -> bytes:
            kept = old.decode().splitlines() if old else []
            merged = list(dict.fromkeys(kept + lines))[-RECORDS_PER_TASK:]
            return "\n".join(merged).encode()
        store.update(f"records/{t.target.key}/{t.template}/{t.key}", change)


def train(store: Any, template: str, target_key: str) -> int:
    """(Re)train the template's model on every stored record of that Target and store it; returns how many
    tasks it learned from (0: too few, nothing stored)."""
    from jitop.tuner.cached import _parse
    from jitop.tuner.model import CostModel
    groups: list[Record] = []
    tasks = 0
    for _, payload in store.items(f"records/{target_key}/{template}/"):
        recs = [r for r in (_parse(line) for line in payload.decode().splitlines()) if r is not None]
        if recs and max(r.gflops for r in recs) > 0:
            groups += recs
            tasks += 1
    if tasks < MIN_TASKS:
        return 0
    # the kinds of workload on which the model, trained without the workload, picked configs at least as fast
    # as the defaults: it predicts for those only
    kinds = sorted(kind for kind, gain in held_out_gains(groups).items() if gain >= 1.0)
    for old in store.keys(f"predicted/{target_key}/{template}/"):  # made by the model this one replaces
        store.delete(old)
    model = CostModel(groups[0].task)
    model.fit_all(groups)
    if not model.fitted or not kinds:
        store.delete(f"model/{target_key}/{template}")
        _models.clear()
        return 0
    store.put(f"model-kinds/{target_key}/{template}", json.dumps(kinds).encode())
    store.put(f"model/{target_key}/{template}", model.to_bytes())
    _models.clear()
    return tasks


def held_out_gains(records: list[Record]) -> dict[str, float]:
    """How a model of these records would do on a workload it never saw, per kind of workload (the string
    `Template.kind` gives): for each task, a model trained on the other tasks picks among the task's measured
    configs; the geomean over the kind's tasks of (the default's measured seconds / the pick's). Below 1, the
    model's predictions for that kind are slower than the defaults (its features do not carry over) and it
    does not predict for it. Tasks without a measured default do not count."""
    from jitop.tuner.model import CostModel
    by_task: dict[str, list[Record]] = {}
    for r in records:
        if r.result.ok:
            by_task.setdefault(r.task.key, []).append(r)
    logs: dict[str, list[float]] = {}
    for key, own in by_task.items():
        task = own[0].task
        default = registry.get(task.template).default_config(task.workload, task.target)
        base = [r.result.cost for r in own if r.config == default]
        others = [r for k, recs in by_task.items() if k != key for r in recs]
        model = CostModel(others[0].task) if others else None
        if not base or model is None:
            continue
        model.fit_all(others)
        if not model.fitted:
            continue
        mine = CostModel(task)
        mine._booster = model._booster
        pick = own[int(mine.predict([r.config for r in own]).argmax())]
        kind = registry.get(task.template).kind(task.workload)
        logs.setdefault(kind, []).append(math.log(min(base) / pick.result.cost))
    return {kind: math.exp(sum(v) / len(v)) for kind, v in logs.items()}


def predicted_choice(task: Task | None, store: Any) -> Choice | None:
    """The stored or freshly ranked prediction for `task`, or None (no model for its template and Target)."""
    if task is None or not _trained_on_kind(store, task):  # also: a prediction of an older model is not served
        return None
    key = f"predicted/{task.target.key}/{task.template}/{task.key}"
    stored = store.get(key)
    if stored is not None:
        try:
            data = json.loads(stored)
            return Choice(Config.from_json(json.dumps(data["config"])), "predicted", data["note"])
        except (ValueError, KeyError, TypeError):
            pass
    model = _model(store, task)
    if model is None:
        return None
    candidates = _candidates(task)
    scores = model.predict(candidates)
    best = candidates[int(scores.argmax())]
    default = registry.get(task.template).default_config(task.workload, task.target)
    note = (f"the cost model's best of {len(candidates)} configs of this workload's space (trained on the "
            f"tuned workloads of {task.template} on this Target; not measured)"
            + ("; it is the default" if best == default else ""))
    store.put(key, json.dumps({"config": best.as_dict(), "note": note}).encode())
    return Choice(best, "predicted", note)


def _trained_on_kind(store: Any, task: Task) -> bool:
    """Whether the model saw workloads of `task`'s kind (Template.kind_fields) and, on them held out, beat
    the defaults: trees do not extrapolate, so a model trained on 3x3 convolutions ranks a 1x1 convolution's
    space by chance (measured: 0.5-0.7x its default). A model stored without its kinds predicts for none."""
    raw = store.get(f"model-kinds/{task.target.key}/{task.template}")
    try:
        kinds = json.loads(raw) if raw is not None else []
    except ValueError:
        return False
    return registry.get(task.template).kind(task.workload) in kinds


def _model(store: Any, task: Task) -> Any:
    where = (getattr(store, "directory", None), task.target.key, task.template)
    if where not in _models:
        raw = store.get(f"model/{task.target.key}/{task.template}")
        _models[where] = None
        if raw is not None:
            from jitop.tuner.model import CostModel  # ~6 ms (features, xgboost glue): only with a model
            try:
                _models[where] = CostModel.load(task, raw)
            except ValueError:
                pass
    model = _models[where]
    if model is None:
        return None
    from jitop.tuner.model import CostModel
    mine = CostModel(task)
    mine._booster = model._booster  # the same trees; features are computed for this task
    return mine


def _candidates(task: Task) -> list[Config]:
    """The default, the nearest tuned configs projected onto this space, and a deterministic sample."""
    from jitop.tuner.cached import _group, distance, project, tuned_store
    space = task.config_space()
    default = registry.get(task.template).default_config(task.workload, task.target)
    picks = [default]
    near = sorted(_group(tuned_store(), task), key=lambda r: distance(task, r.task))[:8]
    picks += [project(r.config, space, default) for r in near]
    rng = random.Random(task.key)
    picks += [space.get(rng.randrange(len(space))) for _ in range(CANDIDATES * 2)]
    return list(dict.fromkeys(picks))[:CANDIDATES]
