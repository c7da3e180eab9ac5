"""The task scheduler: one budget (trials or wall-clock) shared by all tasks of a program, spent where the
program gains most (Ansor's gradient rule).

First round: every task's default config is measured, so each task's weight is its measured share of the
program's time (calls per program run x latency). Then each task gets one batch (warm-up), and from then on
the next batch goes to the task whose weighted latency is expected to fall fastest: a mix of the recent
improvement rate (backward) and an optimistic guess that its latency could shrink by best/trials over the
next trials (forward), times its weight. A task whose search stalled (early stopping) or whose space is
exhausted gets no more trials.

>>> parse_budget("10m"), parse_budget("90s"), parse_budget("1.5h")
(600.0, 90.0, 5400.0)
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from jitop.tuner import records as rec_io
from jitop.tuner.measure import MeasureInput, MeasureResult
from jitop.tuner.records import Record
from jitop.tuner.registry import get as get_template
from jitop.tuner.search import ModelGuidedSearch, SearchStrategy, make_search
from jitop.tuner.task import Task

BACKWARD_WINDOW = 3   # batches over which the recent improvement rate is taken
ALPHA = 0.2           # Ansor's mix of backward and forward gradient
TRANSFER_MAX = 256    # transfer records given to a model (featurising one costs a lowering, ~3 ms)


def parse_budget(budget: str | float | int) -> float:
    """Seconds from "90s", "10m", "1.5h" or a number of seconds."""
    if isinstance(budget, (int, float)) and not isinstance(budget, bool):
        return float(budget)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", str(budget))
    if not m:
        raise ValueError(f"budget={budget!r}: expected seconds or a duration like '90s', '10m', '1.5h'")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


@dataclass
class TaskState:
    """One task's search and bookkeeping in the scheduler."""

    task: Task
    count: float                       # how often one program run executes it
    search: SearchStrategy
    default_cost: float = math.inf
    history: list[float] = field(default_factory=list)   # best cost after each batch
    seconds: float = 0.0
    done: bool = False
    transfer_seen: int = 0     # transfer records the search was last given

    @property
    def best_cost(self) -> float:
        return min(self.search.best_cost, self.default_cost)

    @property
    def trials(self) -> int:
        return self.search.trials


class TaskScheduler:
    """Tunes `tasks` (with their per-run `counts`) within one budget; `run()` returns the task states."""

    def __init__(self, tasks: Sequence[Task], counts: Sequence[float], measurer, tuner: str = "xgb",
                 trials: int | None = None, budget: str | float | None = None, batch_size: int = 16,
                 early_stopping: int | None = 400, records_path: str | None = None, seed: int = 0,
                 transfer: Sequence[Record] = (), on_batch: Callable[["TaskScheduler", TaskState], None] | None = None):
        if trials is None and budget is None:
            raise ValueError("give a budget: trials=N and/or budget='10m'")
        self.states = [TaskState(t, c, make_search(tuner, t, seed=seed + k)) for k, (t, c) in enumerate(zip(tasks, counts))]
        self.measurer, self.batch_size, self.early_stopping = measurer, batch_size, early_stopping
        self.max_trials = trials
        self.deadline = time.perf_counter() + parse_budget(budget) if budget is not None else math.inf
        self.records_path, self.on_batch = records_path, on_batch
        self.transfer = list(transfer)
        self.trials = 0

    # ** budget **
    def _left(self) -> int:
        if time.perf_counter() >= self.deadline:
            return 0
        return self.batch_size if self.max_trials is None else max(0, self.max_trials - self.trials)

    def run(self) -> list[TaskState]:
        """Measure defaults, one warm-up batch per task, then batches by the gradient rule until the budget
        or every task's search is done."""
        self._measure_defaults()
        for state in self.states:
            if self._left():
                self._batch(state)
        while self._left() and (state := self._choose()) is not None:
            self._batch(state)
        return self.states

    def _measure_defaults(self) -> None:
        inputs = [MeasureInput(s.task, get_template(s.task.template).default_config(s.task.workload, s.task.target))
                  for s in self.states]
        results = self._measure(inputs)
        for state, inp, res in zip(self.states, inputs, results):
            state.default_cost = res.cost
            state.search.update([inp], [res])
            state.history.append(state.best_cost)

    def _refresh_transfer(self, state: TaskState) -> None:
        """A model-guided task with few records of its own learns from those of other workloads of its
        template and Target (the records file's and this run's), refreshed as they grow."""
        search = state.search
        if not isinstance(search, ModelGuidedSearch) or len(search.records) >= 2 * search.plan_size:
            return
        same = [r for r in self.transfer + self._session_records(state)
                if r.task.template == state.task.template and r.task.target.key == state.task.target.key]
        if len(same) < state.transfer_seen + search.plan_size:
            return
        state.transfer_seen = len(same)
        search.set_transfer(_spread(same, TRANSFER_MAX))

    def _session_records(self, state: TaskState) -> list[Record]:
        return [r for s in self.states if s is not state for r in s.search.records]

    def _batch(self, state: TaskState) -> None:
        start = time.perf_counter()
        self._refresh_transfer(state)
        configs = state.search.next_batch(min(self.batch_size, self._left()))
        if configs:
            inputs = [MeasureInput(state.task, c) for c in configs]
            state.search.update(inputs, self._measure(inputs))
        state.history.append(state.best_cost)
        state.seconds += time.perf_counter() - start
        stalled = self.early_stopping is not None and state.search.stalled(self.early_stopping)
        state.done = not configs or not state.search.has_next() or stalled
        if self.on_batch is not None:
            self.on_batch(self, state)

    def _measure(self, inputs: list[MeasureInput]) -> list[MeasureResult]:
        path = self.records_path
        # each record lands on disk as its result arrives: an interrupted run resumes from every finished trial
        keep = (lambda n, r: rec_io.append(path, [Record(inputs[n].task, inputs[n].config, r)])) if path else None
        results = self.measurer.measure(inputs, on_result=keep)
        self.trials += len(inputs)
        return results

    # ** Ansor's gradient rule **
    def _choose(self) -> TaskState | None:
        live = [s for s in self.states if not s.done]
        return min(live, key=self.gradient) if live else None

    def gradient(self, state: TaskState) -> float:
        """d(weighted program time)/d(trials) expected from giving `state` more trials (negative: a gain)."""
        best = state.best_cost
        if not math.isfinite(best):
            return -math.inf if state.trials < self.batch_size * 2 else 0.0  # nothing ran yet: explore a little
        h = state.history
        window = min(BACKWARD_WINDOW, len(h) - 1)
        backward = (h[-1] - h[-1 - window]) / (window * self.batch_size) if window > 0 else 0.0
        forward = -best / max(state.trials, 1)
        return state.count * (ALPHA * backward + (1 - ALPHA) * forward)

    def weights(self) -> list[float]:
        """Each task's measured share of the program's time with its default config."""
        times = [s.count * s.default_cost for s in self.states]
        total = sum(t for t in times if math.isfinite(t)) or 1.0
        return [t / total if math.isfinite(t) else 0.0 for t in times]


def _spread(records: Sequence[Record], limit: int) -> list[Record]:
    """At most `limit` records, the same share from each task, evenly spread over each task's range of
    throughput (a ranking model learns from the good and the bad alike)."""
    by_task: dict[str, list[Record]] = {}
    for r in records:
        by_task.setdefault(r.task.key, []).append(r)
    share = max(1, limit // max(1, len(by_task)))
    out = []
    for recs in by_task.values():
        recs = sorted(recs, key=lambda r: r.gflops)
        step = max(1, len(recs) / share)
        out += [recs[int(k * step)] for k in range(min(share, len(recs)))]
    return out
