"""A measurer without LLVM for tuner tests: each config's cost is a fixed function of its knob positions with
one best point, so a search can be checked against the exhaustive answer in milliseconds."""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator, Sequence

import numpy as np

from jitop.tuner.measure import ErrorCode, MeasureInput, MeasureResult
from jitop.tuner.task import Choice, Task, add_source, remove_source


def synthetic_cost(task: Task, config) -> float:
    """Seconds for `config`: a bowl around a task-dependent point of the knob grid, with an interaction."""
    space = task.config_space()
    v = np.array(space.knob_vector(config), dtype=float)
    radix = np.array([max(len(k) - 1, 1) for k in space.knobs], dtype=float)
    rng = np.random.default_rng(int(task.key[:8], 16))
    centre = np.round(rng.random(len(v)) * radix)
    d = (v - centre) / radix
    return 1e-4 * (1.0 + float(d @ d) + 0.5 * abs(d[0] * d[-1]) + 0.1 * math.sin(3 * float(v.sum())) ** 2)


class SyntheticMeasurer:
    """measure(inputs) -> results with `synthetic_cost`; `failing` configs (JSON) give an error."""

    def __init__(self, failing: Sequence[str] = ()):
        self.failing = set(failing)
        self.measured: list[MeasureInput] = []
        self.stats = {"build": 0.0, "measure": 0.0}

    def measure(self, inputs: Sequence[MeasureInput],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        self.measured += inputs
        results = [MeasureResult((math.inf,), ErrorCode.RUN_ERROR, "injected") if i.config.to_json() in self.failing
                   else MeasureResult((synthetic_cost(i.task, i.config),), ErrorCode.NO_ERROR) for i in inputs]
        for n, r in enumerate(results if on_result is not None else []):
            on_result(n, r)
        return results

    def __enter__(self) -> "SyntheticMeasurer":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def exhaustive_best(task: Task) -> float:
    return min(synthetic_cost(task, c) for c in task.config_space())


@contextlib.contextmanager
def tuned_source() -> Iterator[dict]:
    """A tuning source answering every task with the config a third into its space ("tuned"), while the block
    runs; yields a dict whose "config" is the last config it gave."""
    chosen: dict = {}

    def tuned(task: Task) -> Choice:
        space = task.config_space()
        chosen["config"] = space.get(len(space) // 3)
        return Choice(chosen["config"], "tuned")
    add_source(tuned)
    try:
        yield chosen
    finally:
        remove_source(tuned)
