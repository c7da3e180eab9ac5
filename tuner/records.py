"""Tuning records: versioned JSON lines, append-only, safe against a killed tuner.

One line per measured candidate: schema version, target key, task key and task (template, workload,
Target), config, costs, error code, timestamps and the jitop version. `load` reads a file back and skips,
with one summary warning, lines it cannot trust: a partial last line (a killed tuner), another schema
version, another Target, a workload or config another jitop wrote. `best` picks the fastest per task.

>>> import io, jitop
>>> from jitop.tuner.task import Task
>>> from jitop.tuner.registry import get
>>> from jitop.tuner.measure import ErrorCode, MeasureResult
>>> wl = get("matmul").workload_type(m=8, n=8, k=8)
>>> task = Task("matmul", wl, jitop.Target.from_string("haswell"))
>>> rec = Record(task, get("matmul").default_config(wl, task.target), MeasureResult((1e-6,), ErrorCode.NO_ERROR))
>>> Record.from_json(rec.to_json()) == rec
True
>>> round(rec.gflops, 3)
1.024
"""
from __future__ import annotations

import functools
import json
import math
import os
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

from jitop.target import Target
from jitop.tuner.measure import ErrorCode, MeasureResult
from jitop.tuner.space import Config
from jitop.tuner.task import Task

SCHEMA_VERSION = 1


@functools.lru_cache(maxsize=1)  # package metadata is read from disk: once per process, not per record
def jitop_version() -> str:
    """The installed jitop's version (records say which jitop measured them)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("jitop")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class Record:
    """One measured candidate of one task."""

    task: Task
    config: Config
    result: MeasureResult
    version: str = field(default_factory=jitop_version)

    @property
    def gflops(self) -> float:
        """Throughput of this config (0.0 for a failed candidate)."""
        return self.task.flops / self.result.cost / 1e9 if self.result.ok else 0.0

    def to_json(self) -> str:
        r = self.result
        data = {"schema": SCHEMA_VERSION, "target_key": self.task.target.key, "task_key": self.task.key,
                "task": json.loads(self.task.to_json()), "config": self.config.as_dict(),
                "costs": [c if math.isfinite(c) else None for c in r.costs], "error": int(r.error),
                "error_msg": r.error_msg[:500], "build_s": r.build_s, "run_s": r.run_s,
                "timestamp": r.timestamp, "version": self.version}
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(line: str) -> "Record":
        """A Record from one line; ValueError/KeyError/TypeError for a line this jitop cannot read."""
        d = json.loads(line)
        if d.get("schema") != SCHEMA_VERSION:
            raise SchemaMismatch(d.get("schema"))
        task = Task.from_json(json.dumps(d["task"]))
        if task.key != d["task_key"]:
            raise ValueError(f"task key {d['task_key']} does not match its task (computed {task.key})")
        config = Config.from_json(json.dumps(d["config"]))
        costs = tuple(math.inf if c is None else float(c) for c in d["costs"])
        result = MeasureResult(costs, ErrorCode(int(d["error"])), str(d.get("error_msg", "")),
                               float(d.get("build_s", 0.0)), float(d.get("run_s", 0.0)), float(d["timestamp"]))
        return Record(task, config, result, str(d["version"]))


class SchemaMismatch(ValueError):
    """A record line of another schema version."""


def append(path: str | os.PathLike, records: Iterable[Record]) -> None:
    """Append records to a JSON-lines file, each line written whole and flushed to disk (a tuner killed
    mid-write leaves at most one partial last line, which `load` ignores).

    >>> append("tune.jsonl", [rec])   # doctest: +SKIP
    """
    lines = "".join(r.to_json() + "\n" for r in records)
    if not lines:
        return
    fd = os.open(os.fspath(path), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        if os.lseek(fd, 0, os.SEEK_END) > 0 and not _ends_with_newline(fd):
            lines = "\n" + lines  # a killed writer's partial line stays alone on its own line
        os.write(fd, lines.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _ends_with_newline(fd: int) -> bool:
    return os.pread(fd, 1, os.lseek(fd, 0, os.SEEK_END) - 1) == b"\n"


def load(path: str | os.PathLike, target: Target | None = None) -> list[Record]:
    """Every readable record of a file (of `target` only, if given). Lines of another schema version or
    Target, and unreadable ones (a partial last line, a workload another jitop wrote), are skipped with one
    summary warning; a missing file is an empty list.

    >>> records = load("tune.jsonl")   # doctest: +SKIP
    """
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    records, skipped = [], Counter()
    for line in _lines(text):
        try:
            rec = Record.from_json(line)
        except SchemaMismatch:
            skipped["of another schema version"] += 1
            continue
        except Exception:  # noqa: BLE001 - any line this jitop cannot read is skipped, never a crash
            skipped["unreadable"] += 1
            continue
        if target is not None and rec.task.target.key != target.key:
            skipped[f"for another Target than {target.cpu}"] += 1
            continue
        records.append(rec)
    if skipped:
        what = ", ".join(f"{n} {why}" for why, n in skipped.items())
        warnings.warn(f"jitop: {os.fspath(path)}: skipped {sum(skipped.values())} record lines ({what})",
                      RuntimeWarning, stacklevel=2)
    return records


def _lines(text: str) -> Iterator[str]:
    for line in text.split("\n"):
        if line.strip():
            yield line


def best(records: Sequence[Record]) -> dict[str, Record]:
    """The fastest successful record per task key.

    >>> best(load("tune.jsonl"))   # doctest: +SKIP
    {'3f2a...': Record(...)}
    """
    out: dict[str, Record] = {}
    for rec in records:
        if rec.result.ok and (rec.task.key not in out or rec.result.cost < out[rec.task.key].result.cost):
            out[rec.task.key] = rec
    return out
