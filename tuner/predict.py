"""Predicted configs for workloads that were never tuned: `pick`'s source "predicted".

After `jitop.tune`, every measured record is kept in the cache ("records/<target>/<template>/<task>", the
latest RECORDS_PER_TASK per task) and one cost model per template, Target and kind of workload
(`Template.kind`: a conv's kernel size, layout, dtype) is trained on them (one ranking group per task, as the
tuner's transfer learning does) and stored as XGBoost JSON ("model/<target>/<template>/<kind digest>", no
pickle) if, trained without one of the kind's workloads, it picked configs at least as fast as the defaults
there. A task with no tuned record then gets its kind's model's best of CANDIDATES configs of its own space
(the default, the configs of the nearest tuned workloads of its kind projected onto this space, and a
deterministic sample), without measuring anything; the choice is stored ("predicted/...", with the digest of
the model that made it) so later processes do not rank again. Background tuning confirms or replaces it.

>>> from jitop.cache.store import NullStore
>>> predicted_choice(None, NullStore()) is None
True
"""
from __future__ import annotations

import hashlib
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
_models: dict[tuple, Any] = {}  # (store directory, target key, template, kind, digest) -> CostModel or None


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
    """(Re)train the template's models on every stored record of that Target, one per kind of workload
    (`Template.kind`), and store those whose held-out picks beat the defaults; returns how many tasks the
    stored models learned from (0: none stored). Earlier models and their predictions are dropped."""
    from jitop.tuner.cached import _parse
    from jitop.tuner.model import CostModel
    by_kind: dict[str, list[Record]] = {}
    tasks: dict[str, int] = {}
    for _, payload in store.items(f"records/{target_key}/{template}/"):
        recs = [r for r in (_parse(line) for line in payload.decode().splitlines()) if r is not None]
        if recs and max(r.gflops for r in recs) > 0:
            kind = recs[0].task.kind
            by_kind.setdefault(kind, []).extend(recs)
            tasks[kind] = tasks.get(kind, 0) + 1
    _drop_models(store, template, target_key)
    digests: dict[str, str] = {}
    for kind, recs in sorted(by_kind.items()):
        # a kind's model predicts only if, trained without a workload of the kind, it picked configs at least
        # as fast as the defaults on it
        if tasks[kind] < MIN_TASKS or held_out_gains(recs).get(kind, 0.0) < 1.0:
            continue
        model = CostModel(recs[0].task)
        model.fit_all(recs)
        if model.fitted:
            raw = model.to_bytes()
            store.put(_model_key(target_key, template, kind), raw)
            digests[kind] = hashlib.sha256(raw).hexdigest()[:16]
    if digests:
        store.put(f"model-kinds/{target_key}/{template}", json.dumps(digests).encode())
    _models.clear()
    return sum(tasks[kind] for kind in digests)


def _drop_models(store: Any, template: str, target_key: str) -> None:
    """Forget the template's models on this Target and every prediction they made (also the single, kind-blind
    model of older versions)."""
    store.delete(f"model-kinds/{target_key}/{template}")  # first: a reader never finds a kind without its model
    for old in [*store.keys(f"model/{target_key}/{template}/"), *store.keys(f"predicted/{target_key}/{template}/")]:
        store.delete(old)
    store.delete(f"model/{target_key}/{template}")


def _model_key(target_key: str, template: str, kind: str) -> str:
    return f"model/{target_key}/{template}/{hashlib.sha256(kind.encode()).hexdigest()[:16]}"


def held_out_gains(records: list[Record]) -> dict[str, float]:
    """How a kind's model would do on a workload it never saw, per kind of workload (the string
    `Template.kind` gives): for each task, a model trained on the other tasks of its kind picks among the
    task's measured configs; the geomean over the kind's tasks of (the default's measured seconds / the
    pick's). Below 1, the model's predictions for that kind are slower than the defaults (its features do not
    carry over between the kind's workloads) and it does not predict for it. Tasks without a measured default,
    and kinds of one task, do not count."""
    from jitop.tuner.model import CostModel
    by_task: dict[str, list[Record]] = {}
    for r in records:
        if r.result.ok:
            by_task.setdefault(r.task.key, []).append(r)
    kind_of = {key: own[0].task.kind for key, own in by_task.items()}
    logs: dict[str, list[float]] = {}
    for key, own in by_task.items():
        task = own[0].task
        default = registry.get(task.template).default_config(task.workload, task.target)
        base = [r.result.cost for r in own if r.config == default]
        others = [r for k, recs in by_task.items() if k != key and kind_of[k] == kind_of[key] for r in recs]
        if not base or not others:
            continue
        model = CostModel(others[0].task)
        model.fit_all(others)
        if not model.fitted:
            continue
        mine = CostModel(task)
        mine._booster = model._booster
        pick = own[int(mine.predict([r.config for r in own]).argmax())]
        logs.setdefault(kind_of[key], []).append(math.log(min(base) / pick.result.cost))
    return {kind: math.exp(sum(v) / len(v)) for kind, v in logs.items()}


def predicted_choice(task: Task | None, store: Any) -> Choice | None:
    """The stored or freshly ranked prediction for `task`, or None (no model for its kind, template and Target)."""
    digest = _kind_model(store, task) if task is not None else None
    if task is None or digest is None:
        return None
    key = f"predicted/{task.target.key}/{task.template}/{task.key}"
    stored = store.get(key)
    if stored is not None:
        try:
            data = json.loads(stored)
            if data.get("model") == digest:  # made by the model that predicts for this kind now
                return Choice(Config.from_json(json.dumps(data["config"])), "predicted", data["note"])
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
    model = _model(store, task, digest)
    if model is None:
        return None
    candidates = _candidates(task)
    scores = model.predict(candidates)
    best = candidates[int(scores.argmax())]
    default = registry.get(task.template).default_config(task.workload, task.target)
    note = (f"the cost model's best of {len(candidates)} configs of this workload's space (trained on the "
            f"tuned workloads of its kind, {task.template} on this Target; not measured)"
            + ("; it is the default" if best == default else ""))
    store.put(key, json.dumps({"config": best.as_dict(), "note": note, "model": digest}).encode())
    return Choice(best, "predicted", note)


def _kind_model(store: Any, task: Task) -> str | None:
    """The digest of the model that predicts for `task`'s kind, or None. Trees do not extrapolate: a model
    trained on 3x3 convolutions ranked a 1x1 convolution's space by chance (measured: 0.5-0.7x its default), and
    one trained on every kind let the 3x3 records outvote the 1x1 ones (a 0.5x pick on a 1x1 convolution whose
    kind's own model picked the default)."""
    raw = store.get(f"model-kinds/{task.target.key}/{task.template}")
    try:
        digests = json.loads(raw) if raw is not None else {}
    except ValueError:
        return None
    found = digests.get(task.kind) if isinstance(digests, dict) else None
    return found if isinstance(found, str) else None


def _model(store: Any, task: Task, digest: str) -> Any:
    """The kind's model whose bytes have this digest (another process may have retrained it since), or None."""
    where = (getattr(store, "directory", None), task.target.key, task.template, task.kind, digest)
    if where not in _models:
        raw = store.get(_model_key(task.target.key, task.template, task.kind))
        _models[where] = None
        if raw is not None and hashlib.sha256(raw).hexdigest()[:16] == digest:
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
    """The default, the nearest tuned configs of the same kind projected onto this space, and a
    deterministic sample."""
    from jitop.tuner.cached import _group, nearest_of_kind, project, tuned_store
    space = task.config_space()
    default = registry.get(task.template).default_config(task.workload, task.target)
    picks = [default]
    picks += [project(r.config, space, default) for r in nearest_of_kind(task, _group(tuned_store(), task))[:8]]
    rng = random.Random(task.key)
    picks += [space.get(rng.randrange(len(space))) for _ in range(CANDIDATES * 2)]
    return list(dict.fromkeys(picks))[:CANDIDATES]
