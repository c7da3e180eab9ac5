"""`jitop cache import` treats a record as a claim (issue 22, finding 4): a line with bad costs, an
implausible speed or a huge workload is rejected with its line number while later lines are still imported;
an imported record is labelled "imported, not measured here" (explain, `cache list`, the kernel's verified
label) and never replaces a measurement made here; a bad record already in the cache (planted, or written
by an older jitop) is skipped by `cache list`, transfer and prediction.

The command runs in this process (`jitop.cli.main`) against the test's own cache directory."""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

import jitop
from jitop.cli import main
from jitop.driver import default_target
from jitop.tuner import cached, predict
from jitop.tuner.measure import ErrorCode, MeasureResult
from jitop.tuner.records import Record
from jitop.tuner.registry import get
from jitop.tuner.space import Config
from jitop.tuner.task import Task, pick

pytestmark = pytest.mark.usefixtures("private_cache")


def matmul_task(m: int, n: int, k: int, a_batch: tuple[int, ...] = ()) -> Task:
    return Task("matmul", get("matmul").workload_type(m=m, n=n, k=k, dtype="float32", a_batch=a_batch),
                default_target())


def config_of(task: Task, offset: int) -> Config:
    """A config of the task's space other than the default (offset picks which)."""
    space, default = task.config_space(), get(task.template).default_config(task.workload, task.target)
    return next(c for c in (space.get((space.index_of(default) + offset * j) % len(space)) for j in range(1, 50))
                if c != default)


def record(task: Task, config: Config, seconds: float) -> Record:
    return Record(task, config, MeasureResult((seconds,), ErrorCode.NO_ERROR, timestamp=1.7e9))


def line(task: Task, config: Config, seconds: float = 1e-5, **changes: object) -> str:
    """A record line, with some of its JSON fields replaced."""
    data = json.loads(record(task, config, seconds).to_json())
    data.update(changes)
    return json.dumps(data)


def cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out = capsys.readouterr()
    return status, out.out, out.err


def import_lines(tmp_path: Path, capsys: pytest.CaptureFixture, *lines: str) -> tuple[int, str, str, str]:
    path = tmp_path / "claims.jsonl"
    path.write_text("".join(text + "\n" for text in lines))
    return (*cli(capsys, "cache", "import", str(path)), str(path))


BAD_COSTS = {
    "absurdly-fast": [1e-300], "empty": [], "nan": [math.nan], "inf": [math.inf], "negative": [-1e-5],
    "zero": [0.0], "null": [None], "one-of-two-nan": [1e-5, math.nan], "not-a-list": "fast",
}


@pytest.mark.parametrize("costs", BAD_COSTS.values(), ids=BAD_COSTS.keys())
def test_a_line_with_bad_costs_is_rejected_by_number_and_later_lines_are_imported(
        tmp_path: Path, capsys: pytest.CaptureFixture, costs: object) -> None:
    first, bad, last = matmul_task(64, 64, 64), matmul_task(96, 64, 64), matmul_task(128, 64, 64)
    status, out, err, path = import_lines(tmp_path, capsys, line(first, config_of(first, 3)),
                                          line(bad, config_of(bad, 5), costs=costs),
                                          line(last, config_of(last, 7)))
    assert status == 1, err
    assert f"{path}:2: skipped" in err and '"costs"' in err, err
    assert f"{path}:1:" not in err and f"{path}:3:" not in err, err
    assert "ZeroDivisionError" not in err and "Traceback" not in err, err
    assert "imported 2 of 3 records (1 invalid" in out, out
    assert pick(first).config == config_of(first, 3) and pick(last).config == config_of(last, 7)
    assert pick(bad).source != "imported tuned"


def test_an_absurd_claim_for_a_slow_config_does_not_replace_the_real_measurement(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    task = matmul_task(64, 64, 64)
    fast, slow = config_of(task, 3), config_of(task, 11)
    assert cached.save_best([record(task, fast, 2e-5)]) == 1  # measured here
    status, out, err, path = import_lines(tmp_path, capsys, line(task, slow, 1e-300))
    assert status == 1 and f"{path}:1: skipped" in err and "GFLOP/s" in err, err
    assert "expected at most" in err and "e+296" in err, err
    choice = pick(task)
    assert choice.source == "tuned" and choice.config == fast
    assert "e+29" not in choice.note  # no absurd speed anywhere


WIDE = {
    "2^20 batch dims": dict(a_batch=(1,) * (1 << 20)),
    "2^40 batch": dict(a_batch=(1 << 40,)),
    "2^31 rows": dict(m=1 << 31),
    "negative rows": dict(m=-4),
    "no flops": dict(m=0),
    "2^71 flops": dict(a_batch=(1 << 20, 1 << 20), m=1024, n=1024, k=1024),
}


@pytest.mark.parametrize("sizes", WIDE.values(), ids=WIDE.keys())
def test_a_record_of_a_huge_or_broken_workload_is_rejected(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                          sizes: dict) -> None:
    good = matmul_task(64, 64, 64)
    fields = {"m": 64, "n": 64, "k": 64, "a_batch": (), **sizes}
    huge = Task("matmul", get("matmul").workload_type(dtype="float32", **fields), default_target())
    status, out, err, path = import_lines(tmp_path, capsys, line(huge, config_of(good, 3)),
                                          line(good, config_of(good, 3)))
    assert status == 1 and f"{path}:1: skipped" in err and "workload" in err, err
    assert f"{path}:2:" not in err and "Traceback" not in err, err
    assert "imported 1 of 2 records (1 invalid" in out, out
    listed = cli(capsys, "cache", "list", "--kind", "tuned")
    assert listed[0] == 0 and "tuned (1):" in listed[1], listed


def test_an_imported_record_never_replaces_a_measurement_made_here(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    task = matmul_task(64, 64, 64)
    mine, theirs = config_of(task, 3), config_of(task, 11)
    assert cached.save_best([record(task, mine, 4e-5)]) == 1
    status, out, err, _ = import_lines(tmp_path, capsys, line(task, theirs, 1e-5))  # claims 4x faster
    assert status == 0, err
    assert "imported 0 of 1 records" in out and "1 for tasks measured here" in out, out
    choice = pick(task)
    assert choice.source == "tuned" and choice.config == mine


def test_a_measurement_made_here_replaces_an_imported_record_even_if_slower(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    task = matmul_task(64, 64, 64)
    mine, theirs = config_of(task, 3), config_of(task, 11)
    assert import_lines(tmp_path, capsys, line(task, theirs, 1e-5))[0] == 0
    assert pick(task).source == "imported tuned"
    assert cached.save_best([record(task, mine, 4e-5)]) == 1
    choice = pick(task)
    assert choice.source == "tuned" and choice.config == mine


def test_an_imported_record_replaces_only_a_slower_imported_one(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    task = matmul_task(64, 64, 64)
    a, b, c = config_of(task, 3), config_of(task, 7), config_of(task, 11)
    assert import_lines(tmp_path, capsys, line(task, a, 2e-5))[0] == 0
    status, out, _, _ = import_lines(tmp_path, capsys, line(task, b, 1e-5), line(task, c, 3e-5))
    assert status == 0 and "imported 1 of 2 records" in out and "1 no faster" in out, out
    assert pick(task).config == b


def test_an_imported_config_is_labelled_in_list_explain_and_the_kernels_verified_label(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    task = matmul_task(64, 64, 64)
    theirs = config_of(task, 3)
    status, _, err, path = import_lines(tmp_path, capsys, line(task, theirs, 1e-5))
    assert status == 0, err
    choice = pick(task)
    assert choice.source == "imported tuned" and choice.config == theirs
    assert "imported from" in choice.note and "claims.jsonl" in choice.note and "not measured here" in choice.note

    listed = cli(capsys, "cache", "list", "--kind", "tuned")[1]
    assert "imported, not measured here (claims.jsonl" in listed, listed

    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2))
    f = jitop.kernel(lambda a, b: a @ b)
    np.testing.assert_allclose(f(x, y), x @ y, rtol=1e-4, atol=1e-4)
    text = f.explain(x, y)
    assert "imported tuned config" in text and "imported, not measured here" in text, text
    capsys.readouterr()
    kernels = cli(capsys, "cache", "list", "--kind", "kernels")[1]
    assert "imported config, not checked here" in kernels, kernels
    assert "output-checked" not in kernels, kernels


def plant(task: Task, text: str, cost: float = 1e-5) -> None:
    """Put a record line in the cache as an older jitop (no checks, no origin mark) or a planter would."""
    ts = cached.tuned_store()
    key = ts.key(task.target.key, task.template, task.key)
    ts.store.put(key, json.dumps({"cost": cost, "record": text}).encode())


def bad_lines() -> list[tuple[Task, str]]:
    wide, absurd, empty = matmul_task(64, 64, 64, a_batch=(1,) * (1 << 20)), matmul_task(80, 64, 64), \
        matmul_task(88, 64, 64)
    return [(wide, line(wide, config_of(absurd, 3))), (absurd, line(absurd, config_of(absurd, 3), 1e-300)),
            (empty, line(empty, config_of(empty, 3), costs=[]))]


def test_bad_records_in_the_cache_are_skipped_by_list_and_transfer(capsys: pytest.CaptureFixture) -> None:
    good = matmul_task(96, 64, 64)
    assert cached.save_best([record(good, config_of(good, 5), 2e-5)]) == 1
    for task, text in bad_lines():
        plant(task, text)
    cached.forget()
    status, out, err = cli(capsys, "cache", "list")
    assert status == 0 and "Traceback" not in err, err
    assert "tuned (1):" in out and "matmul 96x64x64" in out, out
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "schedule source _cached_schedule failed" would raise here
        choice = pick(matmul_task(100, 64, 64))
    assert choice.source == "transferred" and "96x64x64" in choice.note
    for task, _ in bad_lines()[1:]:  # their own tasks: as if nothing were stored
        assert pick(task).source != "tuned"
    exported = cli(capsys, "cache", "export", "-")
    assert exported[0] == 0 and len(exported[1].splitlines()) == 1, exported


def test_a_measured_record_replaces_a_bad_one_in_the_cache() -> None:
    task = matmul_task(80, 64, 64)
    plant(task, line(task, config_of(task, 3), 1e-300), cost=1e-300)
    assert cached.save_best([record(task, config_of(task, 7), 3e-5)]) == 1
    assert pick(task).config == config_of(task, 7)


def synthetic(task: Task, count: int = 40) -> list[Record]:
    """Measured-looking records whose speed grows with the register tile (as tests/tuner/test_predict.py),
    at most about 50 GFLOP/s (plausible on any Target, so only the planted lines are rejected)."""
    space = task.config_space()
    rng = np.random.default_rng(len(task.key))
    default = get(task.template).default_config(task.workload, task.target)
    picks = [space.index_of(default)] + [int(i) for i in rng.choice(len(space), size=count, replace=False)]
    out = []
    for i in dict.fromkeys(picks):
        cfg = space.get(i)
        width = np.prod(cfg["tile_n"][1:]) * np.prod(cfg["tile_m"][1:])
        out.append(record(task, cfg, task.flops / ((2 + width / 16) * 1e9)))
    return out


def test_bad_records_in_the_training_set_are_skipped_by_prediction() -> None:
    store = cached.tuned_store().store
    for shape in ((64, 64, 64), (128, 96, 64)):
        predict.save_training(store, synthetic(matmul_task(*shape)))
    for task, text in bad_lines():
        store.put(f"records/{task.target.key}/{task.template}/{task.key}", text.encode())
    assert predict.train(store, "matmul", default_target().key) == 2  # the two good tasks only
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pick(matmul_task(96, 80, 72)).source == "predicted"
