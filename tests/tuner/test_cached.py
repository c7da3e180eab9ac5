"""Tuned configs in the persistent cache: `pick` serves a task's own record ("tuned"), else a config transferred
from the nearest tuned workload of the template, projected onto the new space ("transferred"), else the default;
the cache keeps the fastest record per task."""
from __future__ import annotations

import json

import numpy as np
import pytest

import jitop
from jitop.driver import default_target
from jitop.tuner import cached
from jitop.tuner.measure import ErrorCode, MeasureResult
from jitop.tuner.records import Record
from jitop.tuner.registry import get
from jitop.tuner.space import Config
from jitop.tuner.task import Task, pick


pytestmark = pytest.mark.usefixtures("private_cache")


def matmul_task(m: int, n: int, k: int) -> Task:
    return Task("matmul", get("matmul").workload_type(m=m, n=n, k=k, dtype="float32"), default_target())


def non_default(task: Task, offset: int = 7) -> Config:
    space, default = task.config_space(), get(task.template).default_config(task.workload, task.target)
    return next(c for c in (space.get((space.index_of(default) + offset * j) % len(space)) for j in range(1, 50))
                if c != default)


def record(task: Task, config: Config, seconds: float) -> Record:
    return Record(task, config, MeasureResult((seconds,), ErrorCode.NO_ERROR))


def test_a_saved_record_is_picked_as_tuned_and_the_faster_one_stays() -> None:
    task = matmul_task(64, 64, 64)
    fast, slow = non_default(task, 3), non_default(task, 11)
    assert cached.save_best([record(task, fast, 1e-5)]) == 1
    assert cached.save_best([record(task, slow, 2e-5)]) == 0  # slower than the stored one: kept out
    choice = pick(task)
    assert choice.source == "tuned" and choice.config == fast and "from the cache" in choice.note


def test_an_untuned_workload_gets_the_nearest_tuned_config_projected_onto_its_space() -> None:
    near, far, new = matmul_task(96, 64, 64), matmul_task(1024, 1024, 1024), matmul_task(100, 64, 64)
    near_cfg = non_default(near, 5)
    cached.save_best([record(near, near_cfg, 1e-5), record(far, non_default(far, 9), 1e-3)])
    choice = pick(new)
    assert choice.source == "transferred" and "from tuned matmul" in choice.note
    assert "matmul 96x64x64" in choice.note  # the nearest one, not 1024^3
    new.config_space().index_of(choice.config)  # a valid point of the new space (raises otherwise)
    kept = [k for k, v in choice.config.values if near_cfg.as_dict()[k] == v]
    assert kept, "no knob of the nearest record survived the projection"


def test_transfer_needs_the_same_template_and_target() -> None:
    other = Task("matmul", get("matmul").workload_type(m=64, n=64, k=64, dtype="float32"),
                 jitop.Target.from_string("haswell"))
    assert other.target.key != jitop.Target.current().key or jitop.config.cpu_override()
    cached.save_best([record(other, non_default(other), 1e-5)])
    host = matmul_task(64, 64, 64)
    if host.target.key != other.target.key:
        assert pick(host).source == "default"


def conv_task(c: int, oc: int, groups: int) -> Task:
    return Task("conv2d", get("conv2d").workload_type(1, c, 28, 28, oc, 3, 3, pads=(1, 1, 1, 1), groups=groups),
                default_target())


def test_a_depthwise_convolution_takes_configs_only_from_depthwise_ones() -> None:
    """Depthwise is a kind of its own: a tuned dense 3x3 conv's config (say algorithm "direct") is not
    projected onto a depthwise conv, whose default reads the input in place; a tuned depthwise one is."""
    dense, depthwise, new = conv_task(64, 64, 1), conv_task(48, 48, 48), conv_task(64, 64, 64)
    cached.save_best([record(dense, non_default(dense), 1e-5)])
    assert pick(new).source == "default"
    cached.save_best([record(depthwise, non_default(depthwise), 1e-5)])
    choice = pick(new)
    assert choice.source == "transferred" and "48x28x28" in choice.note, choice.note


def test_project_keeps_valid_knobs_and_moves_splits_to_the_nearest_candidate() -> None:
    task = matmul_task(64, 64, 64)
    space, default = task.config_space(), get("matmul").default_config(task.workload, task.target)
    split = next(k for k in space.knobs if k.kind == "split")
    wanted = split.candidates[-1]
    odd = Config(tuple(sorted({**default.as_dict(), split.name: tuple(x + 1 for x in wanted)}.items())))
    projected = cached.project(odd, space, default)
    space.index_of(projected)
    assert projected[split.name] in split.candidates
    assert all(projected[k.name] == default[k.name] for k in space.knobs if k.name != split.name)
    assert cached.project(default, space, default) == default


def test_distance_orders_workloads_by_shape_and_separates_dtypes() -> None:
    a, b, c = matmul_task(64, 64, 64), matmul_task(80, 64, 64), matmul_task(1024, 64, 64)
    f64 = Task("matmul", get("matmul").workload_type(m=64, n=64, k=64, dtype="float64"), a.target)
    assert cached.distance(a, a) == 0 < cached.distance(a, b) < cached.distance(a, c) < cached.distance(a, f64)


def test_a_kernel_compiles_with_the_cached_config_and_stays_numpy_correct() -> None:
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((37, 61)).astype(np.float32), rng.standard_normal((61, 29)).astype(np.float32)
    f = jitop.kernel(lambda a, b: np.maximum(a @ b, 0))
    (weighted,) = jitop.tuner.extract_tasks(f, x, w)
    cfg = non_default(weighted.task, 13)
    cached.save_best([record(weighted.task, cfg, 1e-6)])
    np.testing.assert_allclose(f(x, w), np.maximum(x @ w, 0), rtol=1e-4, atol=1e-4)
    (entry,) = f.cache.values()
    assert any("tuned config" in t and cfg.to_json() in t for t in entry.exe.templates)


def test_an_unusable_stored_record_never_blocks_a_real_one() -> None:
    task = matmul_task(64, 64, 64)
    bogus = Config(tuple(sorted({**non_default(task).as_dict(), "tile_m": "x"}.items())))
    stored = record(task, bogus, 1e-9).to_json()  # from another jitop: its config is not in our space
    cached.tuned_store().store.update(cached.tuned_store().key(task.target.key, "matmul", task.key),
                                      lambda old: json.dumps({"cost": 1e-9, "record": stored}).encode())
    assert pick(task).source == "default"
    good = non_default(task, 3)
    assert cached.save_best([record(task, good, 1e-4)]) == 1
    assert pick(task).config == good and pick(task).source == "tuned"
