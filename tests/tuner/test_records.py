"""Tuning records: JSON-lines round trip, append-only safety against a killed writer, skipped lines."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

import jitop
from jitop.tuner import records as rec_io
from jitop.tuner.measure import ErrorCode, MeasureResult
from jitop.tuner.records import Record
from jitop.tuner.registry import get
from jitop.tuner.task import Task

HASWELL = jitop.Target.from_string("haswell")


def _task(m: int = 16, target: jitop.Target = HASWELL) -> Task:
    return Task("matmul", get("matmul").workload_type(m=m, n=24, k=8), target)


def _record(task: Task, index: int, cost: float = 1e-5, error: ErrorCode = ErrorCode.NO_ERROR) -> Record:
    space = task.config_space()
    costs = (cost, cost * 1.1) if error == ErrorCode.NO_ERROR else (math.inf,)
    return Record(task, space.get(index % len(space)), MeasureResult(costs, error, "boom" if error else "",
                                                                      0.2, 0.05, 1.7e9 + index))


def test_round_trip_keeps_every_field(tmp_path) -> None:
    task = _task()
    recs = [_record(task, 3), _record(task, 5, error=ErrorCode.TIMEOUT)]
    rec_io.append(tmp_path / "t.jsonl", recs)
    back = rec_io.load(tmp_path / "t.jsonl")
    assert back == recs
    assert back[1].result.cost == math.inf and back[1].gflops == 0.0
    line = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert {"schema", "target_key", "task_key", "task", "config", "costs", "error", "timestamp", "version"} <= set(line)
    assert line["schema"] == rec_io.SCHEMA_VERSION and line["target_key"] == HASWELL.key


def test_best_is_the_fastest_successful_record_per_task() -> None:
    a, b = _task(16), _task(32)
    recs = [_record(a, 1, 3e-5), _record(a, 2, 1e-5), _record(a, 4, 1e-7, ErrorCode.WRONG_ANSWER), _record(b, 7, 2e-5)]
    best = rec_io.best(recs)
    assert best[a.key] is recs[1] and best[b.key] is recs[3]


def test_partial_last_line_is_ignored_and_the_next_append_is_intact(tmp_path) -> None:
    path, task = tmp_path / "t.jsonl", _task()
    rec_io.append(path, [_record(task, k) for k in range(3)])
    with open(path, "a") as f:
        f.write(_record(task, 9).to_json()[:57])  # a tuner killed in the middle of a line
    with pytest.warns(RuntimeWarning, match="skipped 1 record lines"):
        assert len(rec_io.load(path)) == 3
    rec_io.append(path, [_record(task, 4)])
    with pytest.warns(RuntimeWarning, match="1 unreadable"):
        loaded = rec_io.load(path)
    assert [r.config for r in loaded] == [_record(task, k).config for k in (0, 1, 2, 4)]


def test_other_schema_and_target_are_skipped_with_one_summary_warning(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    ours, theirs = _task(), _task(target=jitop.Target.from_string("llvm -mcpu=x86-64"))
    rec_io.append(path, [_record(ours, 1), _record(theirs, 1)])
    old = json.loads(_record(ours, 2).to_json())
    old["schema"] = 0
    with open(path, "a") as f:
        f.write(json.dumps(old) + "\n" + "{not json\n" + json.dumps({"schema": 1, "task": {"template": "nope"}}) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = rec_io.load(path, target=HASWELL)
    assert [r.task for r in loaded] == [ours]
    assert len(caught) == 1, [str(w.message) for w in caught]
    msg = str(caught[0].message)
    assert "4 record lines" in msg and "another schema version" in msg and "another Target" in msg


def test_a_killed_tuner_loses_no_complete_record(tmp_path) -> None:
    """A writer appending batch after batch is SIGKILLed: every complete line loads, in order."""
    path = tmp_path / "t.jsonl"
    script = textwrap.dedent(f"""
        import itertools, jitop
        from jitop.tuner import records as rec_io
        from jitop.tuner.measure import ErrorCode, MeasureResult
        from jitop.tuner.records import Record
        from jitop.tuner.registry import get
        from jitop.tuner.task import Task
        task = Task("matmul", get("matmul").workload_type(m=16, n=24, k=8), jitop.Target.from_string("haswell"))
        space = task.config_space()
        print("ready", flush=True)
        for i in itertools.count():
            rec_io.append({str(path)!r}, [Record(task, space.get((i * 4 + j) % len(space)),
                                                  MeasureResult((1e-5 + i,), ErrorCode.NO_ERROR)) for j in range(4)])
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.time() + 60
    while (not path.exists() or path.stat().st_size < 20000) and time.time() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = rec_io.load(path)
    lines = [ln for ln in path.read_text().split("\n") if ln.strip()]
    assert len(loaded) >= len(lines) - 1 and len(loaded) >= 12
    assert [r.result.costs[0] for r in loaded] == sorted(r.result.costs[0] for r in loaded)


def test_missing_file_is_no_records(tmp_path) -> None:
    assert rec_io.load(tmp_path / "none.jsonl") == []
