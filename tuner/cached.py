"""Tuned configs from the persistent cache: `pick` uses them with no code change.

A task gets, in order: its own tuned record (source "tuned"; "imported tuned" for a record `jitop cache
import` read: a claim, not measured here, labelled so in explain and in the kernel's verification); else the
cost model's best prediction over its space, if a model was trained for its template on this Target (source
"predicted", jitop.tuner.predict); else the config of the nearest tuned workload of the same template on the
same Target, projected onto the new workload's space (source "transferred": each knob keeps its value if the
new space has it, a split takes the nearest candidate in log scale, any other knob falls back to the new
workload's default); else nothing, and the template's default answers.
`jitop.tune` saves the best record of every task here; a record measured here always replaces an imported
one, an imported one never replaces a measured one (cache.tuned.TunedStore.put).

Every record read from the cache is checked again (`valid_record`): a bad one (planted, or written by an older
jitop that did not check) is skipped, never a crash in listing, transfer or prediction.

>>> import jitop
>>> from jitop.tuner.registry import get
>>> wl = get("matmul").workload_type(m=8, n=8, k=8)
>>> space = get("matmul").config_space(wl, jitop.Target.from_string("haswell"))
>>> default = get("matmul").default_config(wl, jitop.Target.from_string("haswell"))
>>> project(default, space, default) == default
True
"""
from __future__ import annotations

import math
import threading
from typing import Any, Iterable

from jitop.cache.tuned import TunedStore
from jitop.cachedir import store
from jitop.tuner import registry
from jitop.target import Target
from jitop.tuner.records import InvalidRecord, Record, best, check, check_speed, theoretical_gflops
from jitop.tuner.report import describe_task
from jitop.tuner.space import Config, ConfigSpace
from jitop.tuner.task import Choice, Task

_by_group: dict[tuple, list[Record]] = {}  # (store directory, target key, template) -> records, read once
_bounds: dict[tuple, float] = {}  # (store directory, target key) -> gflops_bound
_lock = threading.Lock()
IMPORTED_SOURCE = "imported tuned"  # Choice.source of a config from an imported record
PEAK_MARGIN = 2.0  # a record may claim up to this many times the measured peak (1 thread's figure x threads)


def tuned_store() -> TunedStore:
    """The tuned records of the current cache directory."""
    return TunedStore(store())


def cache_source(task: Task) -> Choice | None:
    """`pick`'s question to the cache: this task's tuned config, else one transferred from its nearest tuned
    neighbour, else None."""
    ts = tuned_store()
    own = ts.get(task.target.key, task.template, task.key)
    if own is not None:
        rec = _parse(own)
        if rec is not None and rec.task.key == task.key:
            return own_choice(rec)
    from jitop.tuner.predict import predicted_choice
    return predicted_choice(task, ts.store) or transferred(task, _group(ts, task))


def own_choice(rec: Record) -> Choice:
    """The Choice a task's own stored record makes: "tuned" if measured here, else "imported tuned", with
    its origin in the note."""
    if rec.origin.imported:
        return Choice(rec.config, IMPORTED_SOURCE, f"{rec.gflops:.1f} GFLOP/s claimed by a record "
                      f"{rec.origin.describe()}; jitop tune measures it")
    return Choice(rec.config, "tuned", f"{rec.gflops:.1f} GFLOP/s, from the cache")


def transferred(task: Task, records: Iterable[Record]) -> Choice | None:
    """The nearest tuned workload of the same kind (`Template.kind_fields`)'s config, projected onto `task`'s
    space (None without such a neighbour)."""
    ranked = nearest_of_kind(task, records)
    if not ranked:
        return None
    template = registry.get(task.template)
    space = task.config_space()
    default = template.default_config(task.workload, task.target)
    near = ranked[0]
    config = project(near.config, space, default)
    kept = sum(near.config.as_dict().get(k) == v for k, v in config.values)
    what = "imported (not measured here)" if near.origin.imported else "tuned"
    return Choice(config, "transferred", f"from {what} {describe_task(near.task)} ({near.gflops:.1f} GFLOP/s there; "
                  f"{kept} of {len(config.values)} knobs kept, the rest projected)")


def nearest_of_kind(task: Task, records: Iterable[Record]) -> list[Record]:
    """The records of other workloads of `task`'s kind, the nearest workload's first (see `distance`)."""
    return sorted((r for r in records if r.task.key != task.key and r.task.kind == task.kind),
                  key=lambda r: distance(task, r.task))


def distance(a: Task, b: Task) -> float:
    """How far apart two workloads of one template are: the sum over numeric fields of |log ratio|, plus a
    large step for each other field that differs (dtype, layout)."""
    wa, wb = _fields(a.workload), _fields(b.workload)
    d = 0.0
    for name in set(wa) | set(wb):
        x, y = wa.get(name), wb.get(name)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
            d += abs(math.log((abs(x) + 1) / (abs(y) + 1)))
        elif x != y:
            d += 100.0
    return d


def project(config: Config, space: ConfigSpace, default: Config) -> Config:
    """`config` as a point of `space`: each knob's value if it is a candidate, a split's nearest candidate
    (log scale), else the default's value."""
    given = config.as_dict()
    values = []
    for knob in space.knobs:
        v = given.get(knob.name)
        if v not in knob.candidates:
            v = _nearest_split(v, knob.candidates) if knob.kind == "split" else None
            if v is None:
                v = default[knob.name]
        values.append((knob.name, v))
    return Config(tuple(sorted(values)))


def _nearest_split(value: Any, candidates: tuple) -> Any:
    if not isinstance(value, tuple) or not all(isinstance(c, tuple) and len(c) == len(value) for c in candidates):
        return None
    # the inner factors are the tiles that matter; the outermost factor follows from the extent
    return min(candidates, key=lambda c: sum(abs(math.log(max(x, 1) / max(y, 1))) for x, y in zip(c[1:], value[1:])))


def save_best(records: Iterable[Record]) -> int:
    """Store the fastest successful record of each task in the cache (kept only if faster than the stored
    one, or if the stored one was imported: a measurement made here replaces a claim); how many were stored.
    A record that fails `valid_record`'s checks (an implausible speed) is never stored."""
    ts = tuned_store()
    stored = 0
    for rec in best([r for r in records if usable(r) and trusted(r)]).values():
        if rec.result.ok and ts.put(rec.task.target.key, rec.task.template, rec.task.key, rec.to_json(),
                                    rec.result.cost, usable_json, imported=rec.origin.imported):
            stored += 1
    with _lock:
        _by_group.clear()
    return stored


def usable(rec: Record) -> bool:
    """Whether a record's config is a point of its task's space in this jitop (an old records file may hold
    configs of an older template)."""
    try:
        rec.task.config_space().index_of(rec.config)
    except Exception:  # noqa: BLE001
        return False
    return True


def trusted(rec: Record) -> bool:
    """Whether a record passes the checks `valid_record` makes of a stored one beyond its config: costs,
    workload sizes (records.check) and speed (`gflops_bound`)."""
    try:
        check(rec)
        check_speed(rec, gflops_bound(rec.task.target, rec.origin.imported))
    except InvalidRecord:
        return False
    return True


def _group(ts: TunedStore, task: Task) -> list[Record]:
    where = (getattr(ts.store, "directory", None), task.target.key, task.template)
    found = _by_group.get(where)
    if found is None:
        found = [r for r in (_parse(t) for t in ts.records(task.target.key, task.template)) if r is not None]
        with _lock:
            _by_group[where] = found
    return found


def forget() -> None:
    """Drop what was read from the cache: records and trained models (after an import or a clear, in tests)."""
    from jitop.tuner import predict
    with _lock:
        _by_group.clear()
        _bounds.clear()
    predict._models.clear()


def _parse(text: str) -> Record | None:
    """A stored record this jitop can use: readable, and its config a point of its task's space."""
    try:
        return valid_record(text)
    except Exception:  # noqa: BLE001 - another jitop's template or workload: not usable here
        return None


def usable_json(text: str) -> bool:
    """Whether a stored record line is one this jitop can use (see valid_record)."""
    return _parse(text) is not None


def valid_record(text: str) -> Record:
    """A record line checked all the way, on import and whenever the cache is read: schema, task (a template
    this jitop has), workload sizes, task key, costs (records.check), a config that is a point of the task's
    space, and a speed its Target can reach (`gflops_bound`). Raises (ValueError, LookupError, ...) otherwise;
    records.InvalidRecord names the field and what was expected."""
    rec = Record.from_json(text)
    rec.task.config_space().index_of(rec.config)
    check_speed(rec, gflops_bound(rec.task.target, rec.origin.imported))
    return rec


def gflops_bound(target: Target, imported: bool = True) -> float:
    """The most GFLOP/s a record of `target` may claim: records.theoretical_gflops, which no honest measurement
    exceeds; an imported record (a claim) also at most PEAK_MARGIN x the FP32 peak stored for the Target (one
    thread's figure x its threads; the margin covers a peak measured on a busy machine). A measurement made here
    is not held to the stored peak: a peak measured under load must never make a real record be thrown away."""
    from jitop.tuner.peak import stored_peak
    bound = theoretical_gflops(target)
    if not imported:
        return bound
    where = (getattr(store(), "directory", None), target.key)
    found = _bounds.get(where)
    if found is None:
        found = bound
        peak = stored_peak(target.key)
        if peak is not None and peak.gflops_1 and peak.gflops_1 > 0:
            found = min(bound, PEAK_MARGIN * peak.gflops_1 * max(target.threads, 1))
        with _lock:
            _bounds[where] = found
    return found


def _fields(workload: Any) -> dict[str, Any]:
    import json
    return json.loads(registry.workload_to_json(workload))
