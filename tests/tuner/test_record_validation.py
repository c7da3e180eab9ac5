"""One record's checks (issue 22, finding 4): costs, workload sizes and a speed bounded by the Target's peak are
checked whenever a record is read (`Record.from_json`, `cached.valid_record`); a record's origin round-trips;
the tuned store keeps a measurement made here over an imported claim."""
from __future__ import annotations

import dataclasses

import json
import math
import warnings

import pytest

from jitop.cache.tuned import TunedStore
from jitop.cachedir import store
from jitop.driver import default_target
from jitop.tuner import cached, peak
from jitop.tuner import records as rec_io
from jitop.tuner.measure import ErrorCode, MeasureResult
from jitop.tuner.records import IMPORTED, InvalidRecord, Origin, Record
from jitop.tuner.registry import get
from jitop.tuner.task import Task

pytestmark = pytest.mark.usefixtures("private_cache")


def task(m: int = 64) -> Task:
    return Task("matmul", get("matmul").workload_type(m=m, n=64, k=64), default_target())


def record(t: Task, seconds: float, origin: Origin = Origin()) -> Record:
    return Record(t, get("matmul").default_config(t.workload, t.target),
                  MeasureResult((seconds,), ErrorCode.NO_ERROR, timestamp=1.7e9), origin=origin)


def test_an_imported_origin_round_trips_and_a_measured_line_is_unchanged() -> None:
    mine = record(task(), 1e-5)
    assert "origin" not in json.loads(mine.to_json())  # lines of the tuner look as they always did
    theirs = record(task(), 1e-5, Origin(IMPORTED, "/x/claims.jsonl", 1.7e9))
    back = Record.from_json(theirs.to_json())
    assert back == theirs and back.origin.imported and not mine.origin.imported
    assert "imported from /x/claims.jsonl on " in back.origin.describe()
    assert back.origin.describe().endswith("not measured here")


@pytest.mark.parametrize("costs, expected", [
    ([], "non-empty"), ([math.nan], "finite positive"), ([-1.0], "finite positive"), ([0.0], "finite positive"),
    ([None], "finite positive"), ("1e-5", "expected a list"),
])
def test_bad_costs_of_a_successful_record_name_the_field(costs: object, expected: str) -> None:
    data = json.loads(record(task(), 1e-5).to_json())
    data["costs"] = costs
    with pytest.raises(InvalidRecord, match=expected) as err:
        Record.from_json(json.dumps(data))
    assert '"costs"' in str(err.value)


def test_a_failed_trial_keeps_its_infinite_cost() -> None:
    failed = Record(task(), record(task(), 1.0).config, MeasureResult((math.inf,), ErrorCode.RUN_ERROR, "boom"))
    assert Record.from_json(failed.to_json()).result.cost == math.inf


def test_load_skips_invalid_lines_with_one_warning(tmp_path) -> None:
    good = record(task(), 1e-5).to_json()
    data = json.loads(good)
    data["costs"] = []
    (tmp_path / "r.jsonl").write_text(good + "\n" + json.dumps(data) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(rec_io.load(tmp_path / "r.jsonl")) == 1
    assert any("invalid" in str(w.message) for w in caught)


def test_the_speed_bound_is_the_theoretical_one_without_a_stored_peak_and_twice_the_peak_with_one() -> None:
    """For an imported claim; a measurement made here is held only to the theoretical bound (a peak measured
    under load must not throw real records away)."""
    t = task()
    assert cached.gflops_bound(t.target) == rec_io.theoretical_gflops(t.target)
    fast = record(t, t.flops / (50 * t.target.threads * 1e9))  # 50 GFLOP/s per thread
    cached.valid_record(fast.to_json())  # plausible without a peak
    p = peak.Peak(target_key=t.target.key, target=t.target.describe(), isa=t.target.isa, lanes=4, accumulators=8,
                  threads=t.target.threads, gflops_1=10.0, gflops_all=10.0 * t.target.threads, measured_at=1.0)
    store().put(peak.key(t.target), p.to_json().encode())
    peak.forget()
    cached.forget()
    try:
        assert cached.gflops_bound(t.target) == pytest.approx(2 * 10.0 * t.target.threads)
        claim = dataclasses.replace(fast, origin=Origin(IMPORTED, "r.jsonl", 1.0))
        with pytest.raises(InvalidRecord, match="expected at most"):
            cached.valid_record(claim.to_json())  # 5x the measured peak
        assert cached.valid_record(fast.to_json()).gflops == pytest.approx(fast.gflops)  # measured here: kept
    finally:
        peak.forget()


def test_the_store_keeps_a_measurement_made_here_over_an_imported_claim() -> None:
    ts, t = TunedStore(store()), task()
    put = lambda seconds, imported: ts.put(t.target.key, "matmul", t.key, f"r{seconds}", seconds,  # noqa: E731
                                           imported=imported)
    assert put(1e-5, imported=True) and ts.origin(t.target.key, "matmul", t.key) == "imported"
    assert not put(2e-5, imported=True)       # an imported one replaces only a slower imported one
    assert put(9e-5, imported=False)          # a measurement replaces any claim
    assert not put(1e-6, imported=True)       # a claim never replaces a measurement
    assert not put(9e-5, imported=False) and put(8e-5, imported=False)
    assert ts.get(t.target.key, "matmul", t.key) == "r8e-05"
