"""`jitop.tuner.plot(records, path)`: best-so-far GFLOP/s against trials and against seconds, one line per
task and tuner (matplotlib, an optional extra: `pip install jitop[plot]`)."""
from __future__ import annotations

import os
from collections import defaultdict
from typing import Sequence

from jitop.tuner import records as rec_io
from jitop.tuner.records import Record
from jitop.tuner.report import describe_task


def best_so_far(records: Sequence[Record]) -> list[tuple[int, float, float]]:
    """(trial, seconds since the first record, best GFLOP/s so far) per record, in measurement order.

    >>> best_so_far([])
    []
    """
    out, best = [], 0.0
    ordered = sorted(records, key=lambda r: r.result.timestamp)
    t0 = ordered[0].result.timestamp if ordered else 0.0
    for k, rec in enumerate(ordered):
        best = max(best, rec.gflops)
        out.append((k + 1, rec.result.timestamp - t0, best))
    return out


def plot(records: str | os.PathLike | Sequence[Record], path: str | os.PathLike,
         labels: dict[str, str] | None = None) -> None:
    """Draw each task's best-so-far curve (left: against trials, right: against seconds) into `path`.
    `records`: a records file or Records; `labels` maps a task key to a curve's name (default: the task,
    plus the file name when several files are compared by calling this on concatenated records).

    >>> jitop.tuner.plot("tune.jsonl", "tune.png")   # doctest: +SKIP
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("jitop.tuner.plot needs matplotlib: pip install 'jitop[plot]'") from None
    recs = rec_io.load(records) if isinstance(records, (str, os.PathLike)) else list(records)
    by_task: dict[str, list[Record]] = defaultdict(list)
    for rec in recs:
        by_task[rec.task.key].append(rec)
    fig, (by_trial, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key, task_recs in by_task.items():
        curve = best_so_far(task_recs)
        name = (labels or {}).get(key, describe_task(task_recs[0].task))
        by_trial.plot([c[0] for c in curve], [c[2] for c in curve], label=name)
        by_time.plot([c[1] for c in curve], [c[2] for c in curve], label=name)
    by_trial.set(xlabel="trials", ylabel="best GFLOP/s so far")
    by_time.set(xlabel="seconds", ylabel="best GFLOP/s so far")
    by_trial.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(os.fspath(path))
    plt.close(fig)
