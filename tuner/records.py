"""Tuning records: versioned JSON lines, append-only, safe against a killed tuner.

One line per measured candidate: schema version, target key, task key and task (template, workload,
Target), config, costs, error code, timestamps and the jitop version; a record `jitop cache import` read
also carries its origin ("imported": from which file, when), never "measured here". `load` reads a file back
and skips, with one summary warning, lines it cannot trust: a partial last line (a killed tuner), another
schema version, another Target, a workload or config another jitop wrote, and invalid ones (`check`: a
successful record's costs must be finite positive seconds, a workload's sizes bounded). `best` picks the
fastest per task.

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

import dataclasses
import functools
import json
import math
import os
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

from jitop.target import CudaTarget, Target
from jitop.tuner.measure import ErrorCode, MeasureResult
from jitop.tuner.space import Config
from jitop.tuner.task import Task

SCHEMA_VERSION = 1

# Bounds on a record's workload (`check_workload`): a record is read by listing, features, transfer and
# prediction in every program, so its sizes must be ones those can compute with.
MAX_DIM = 2**31 - 1      # every integer field of a workload (an int32 index)
MAX_RANK = 32            # entries of a tuple field (batch dims; numpy allows 64 in all)
MAX_FLOPS = 2**60        # flops of one run (about 3 hours at 100 TFLOP/s)
MAX_ELEMENTS = 2**62     # the product of every integer field: bounds every operand's element count

MEASURED, IMPORTED = "measured", "imported"


@dataclass(frozen=True)
class Origin:
    """Where a record comes from: "measured" by this jitop's tuner, or "imported" by `jitop cache import`
    (a claim, not measured here) from `where` at `when` (seconds since the epoch)."""

    kind: str = MEASURED
    where: str = ""
    when: float = 0.0

    @property
    def imported(self) -> bool:
        """Whether the record is a claim read from a file rather than a measurement made here."""
        return self.kind != MEASURED

    def describe(self) -> str:
        """"measured here", or "imported from FILE on DATE, not measured here"."""
        if not self.imported:
            return "measured here"
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.when)) if self.when else "?"
        return f"imported from {self.where or '?'} on {when}, not measured here"


class InvalidRecord(ValueError):
    """A record line that is readable but cannot be trusted (its costs, its workload's sizes, its speed)."""


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
    origin: Origin = Origin()

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
        if self.origin.imported:  # a measured record's line is as it always was
            data["origin"] = {"kind": self.origin.kind, "where": self.origin.where, "when": self.origin.when}
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(line: str) -> "Record":
        """A Record from one line; ValueError/KeyError/TypeError for a line this jitop cannot read,
        InvalidRecord (a ValueError) for one it must not trust (see `check`)."""
        d = json.loads(line)
        if not isinstance(d, dict):
            raise InvalidRecord(f"expected a JSON object, got {type(d).__name__}")
        if d.get("schema") != SCHEMA_VERSION:
            raise SchemaMismatch(d.get("schema"))
        task = Task.from_json(json.dumps(d["task"]))
        check_workload(task)  # before anything computes with the workload (its key, its space)
        if task.key != d["task_key"]:
            raise ValueError(f"task key {d['task_key']} does not match its task (computed {task.key})")
        config = Config.from_json(json.dumps(d["config"]))
        result = MeasureResult(_costs(d["costs"]), ErrorCode(int(d["error"])), str(d.get("error_msg", "")),
                               float(d.get("build_s", 0.0)), float(d.get("run_s", 0.0)), float(d["timestamp"]))
        check_costs(result)
        return Record(task, config, result, str(d["version"]), _origin(d.get("origin")))


def _costs(raw: object) -> tuple[float, ...]:
    """The "costs" field as floats (null: inf, as `to_json` writes a failed run)."""
    if not isinstance(raw, list):
        raise InvalidRecord(f'"costs": expected a list of seconds, got {type(raw).__name__}')
    return tuple(math.inf if c is None else float(c) for c in raw)


def _origin(raw: object) -> Origin:
    """The "origin" field (absent: measured)."""
    if raw is None:
        return Origin()
    if not isinstance(raw, dict):
        raise InvalidRecord(f'"origin": expected an object, got {type(raw).__name__}')
    return Origin(str(raw.get("kind", IMPORTED)), str(raw.get("where", ""))[:500], float(raw.get("when", 0.0)))


def check(rec: Record) -> None:
    """Raise InvalidRecord unless a record can be trusted as data (`from_json` checks every line it reads):
    its costs (`check_costs`) and its workload's sizes (`check_workload`). Whether its speed is plausible on
    its Target is `check_speed`'s question."""
    check_costs(rec.result)
    check_workload(rec.task)


def check_costs(result: MeasureResult) -> None:
    """Raise InvalidRecord unless a successful result (error code 0) has a non-empty list of finite, positive
    costs (anything else used to count silently as a failed trial, or to divide by zero)."""
    if result.error != ErrorCode.NO_ERROR:
        return  # a failed trial: its costs are (inf,) and nothing uses them
    if not result.costs:
        raise InvalidRecord('"costs": expected a non-empty list of seconds for a successful record (error 0), '
                            'got []')
    bad = [c for c in result.costs if not (math.isfinite(c) and c > 0)]
    if bad:
        raise InvalidRecord(f'"costs": expected finite positive seconds for a successful record (error 0), '
                            f'got {bad[0]!r}')


def check_workload(task: Task) -> None:
    """Raise InvalidRecord unless every integer of the workload is in [0, MAX_DIM], every tuple has at most
    MAX_RANK entries, the flops are in [1, MAX_FLOPS] and the product of its integers is at most
    MAX_ELEMENTS (so no listing, feature or transfer computation on it can blow up)."""
    volume = 1
    for name, value in _workload_items(task):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise InvalidRecord(f'workload field "{name}": expected an integer or a string, got {value!r}'[:300])
        if isinstance(value, int):
            if not 0 <= value <= MAX_DIM:
                raise InvalidRecord(f'workload field "{name}": expected an integer in [0, {MAX_DIM}], got {value}')
            volume *= max(value, 1)
            if volume > MAX_ELEMENTS:
                raise InvalidRecord(f"workload: expected the product of its sizes to be at most 2**62 "
                                    f"(no array can be larger), got more at field \"{name}\"")
    try:
        flops = task.flops
    except Exception as err:  # noqa: BLE001 - e.g. batch shapes that do not broadcast
        raise InvalidRecord(f"workload: its flops cannot be computed ({type(err).__name__}: {err})"[:300]) from None
    if not 1 <= flops <= MAX_FLOPS:
        raise InvalidRecord(f"workload: expected flops in [1, 2**60], got {flops}")


def _workload_items(task: Task) -> Iterator[tuple[str, object]]:
    """(field name, value) for every scalar of the workload; a tuple's entries are "name[i]"."""
    for f in dataclasses.fields(task.workload):  # a workload is a frozen dataclass (jitop.tuner.registry)
        name, value = f.name, getattr(task.workload, f.name)
        if isinstance(value, (tuple, list)):
            if len(value) > MAX_RANK:
                raise InvalidRecord(f'workload field "{name}": expected at most {MAX_RANK} entries, got {len(value)}')
            yield from ((f"{name}[{k}]", v) for k, v in enumerate(value))
        else:
            yield name, value


def check_speed(rec: Record, max_gflops: float) -> None:
    """Raise InvalidRecord if a successful record claims more than `max_gflops` (a bound from its Target's
    peak, see jitop.tuner.cached.gflops_bound): no kernel runs faster than the machine's FMA units."""
    if rec.result.ok and rec.gflops > max_gflops:
        t = rec.task.target
        where = t.arch if getattr(t, "kind", "") == "cuda" else f"{t.cpu}, {t.threads} threads"
        raise InvalidRecord(f'"costs": a mean of {rec.result.cost:.3g} s per run is {rec.gflops:.3g} GFLOP/s; '
                            f"expected at most {max_gflops:.3g} GFLOP/s, the bound from its Target's peak ({where})")


def theoretical_gflops(target: Target | CudaTarget) -> float:
    """A generous upper bound of a Target's FP32 GFLOP/s, for when no peak was measured: float32 vector lanes x
    FMA units (at least 2, at most 4) x 2 flops per FMA x 6 GHz (above any CPU's turbo clock) x threads.
    Every factor is at or above what a real CPU reaches, so no honest measurement is above it; the Target's
    own fields are capped too (a record's Target is data: 256-byte vectors, SVE's widest, and 4096 threads).
    A GPU's (a CudaTarget): its SMs (at most 1024) x 4096 flops per clock (more than any SM's tensor cores
    do in TF32) x 3 GHz."""
    if getattr(target, "kind", "") == "cuda":
        return min(max(target.sm_count, 1), 1024) * 4096 * 3.0
    lanes = min(max(target.vector_bytes, 16), 256) // 4
    units = min(max(target.fma_units, 2), 4)
    return lanes * units * 2 * 6.0 * min(max(target.threads, 1), 4096)


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


def load(path: str | os.PathLike, target: Target | CudaTarget | None = None) -> list[Record]:
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
        except InvalidRecord:
            skipped["invalid (bad costs or workload sizes)"] += 1
            continue
        except Exception:  # noqa: BLE001 - any line this jitop cannot read is skipped, never a crash
            skipped["unreadable"] += 1
            continue
        if target is not None and rec.task.target.key != target.key:
            skipped[f"for another Target than {getattr(target, 'cpu', None) or target.arch}"] += 1
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
