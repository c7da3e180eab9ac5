"""Search strategies over one task's config space (AutoTVM's tuners): `next_batch(n)` proposes configs not
measured before, `update(inputs, results)` reports their measurements.

- `RandomSearch`: uniform over the unvisited points;
- `GridSearch`: the points in index order;
- `ModelGuidedSearch`: a cost model (XGBoost over lowered-loop features, `jitop.tuner.model`) refitted as
  records arrive; simulated annealing with parallel chains over its predictions plans the next points, a few
  random picks per batch keep it exploring (AutoTVM's XGBTuner).

Every strategy never proposes a point twice and tracks the best so far; `stalled(n)` says the best has not
improved for `n` trials (early stopping).

>>> import jitop
>>> from jitop.tuner.task import Task
>>> from jitop.tuner.registry import get
>>> wl = get("matmul").workload_type(m=16, n=16, k=16)
>>> search = RandomSearch(Task("matmul", wl, jitop.Target.from_string("haswell")), seed=0)
>>> batch = search.next_batch(4)
>>> len(batch), len(set(batch))
(4, 4)
"""
from __future__ import annotations

import heapq
import math
import time
from typing import Sequence

import numpy as np

from jitop.tuner.measure import MeasureInput, MeasureResult
from jitop.tuner.records import Record
from jitop.tuner.space import Config
from jitop.tuner.task import Task


class SearchStrategy:
    """What every strategy shares: the space, the visited points, the best so far, the history."""

    def __init__(self, task: Task, seed: int = 0):
        self.task = task
        self.space = task.config_space()
        self.rng = np.random.default_rng(seed)
        self.visited: set[int] = set()
        self.records: list[Record] = []
        self.best_cost = math.inf
        self.best_config: Config | None = None
        self._best_at = 0  # trials done when the best was measured
        self.seconds = {"model": 0.0, "search": 0.0}

    @property
    def trials(self) -> int:
        """Configs measured so far (each has its record)."""
        return len(self.records)

    def has_next(self) -> bool:
        """Whether any point of the space is left unmeasured."""
        return len(self.visited) < len(self.space)

    def stalled(self, trials: int) -> bool:
        """The best has not improved in the last `trials` trials."""
        return self.trials - self._best_at >= trials

    def next_batch(self, n: int) -> list[Config]:
        """Up to `n` configs never proposed before."""
        start = time.perf_counter()
        indices = self._propose(min(n, len(self.space) - len(self.visited)))
        self.visited.update(indices)
        self.seconds["search"] += time.perf_counter() - start
        return [self.space.get(i) for i in indices]

    def mark_visited(self, configs: Sequence[Config]) -> None:
        """Configs measured elsewhere (the default, earlier records): never proposed again."""
        self.visited.update(self.space.index_of(c) for c in configs)

    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        """Take in measurements of this task's configs."""
        for inp, res in zip(inputs, results):
            self.visited.add(self.space.index_of(inp.config))
            self.records.append(Record(self.task, inp.config, res))
            if res.ok and res.cost < self.best_cost:
                self.best_cost, self.best_config, self._best_at = res.cost, inp.config, self.trials

    def _propose(self, n: int) -> list[int]:
        raise NotImplementedError

    def _random_unvisited(self, n: int, exclude: set[int] = frozenset()) -> list[int]:
        size, taken = len(self.space), self.visited | exclude
        if n <= 0 or len(taken) >= size:
            return []
        if len(taken) < size // 2:  # mostly free: rejection sampling, no list of the whole space
            out: list[int] = []
            while len(out) < n and len(taken) + len(out) < size:
                i = int(self.rng.integers(size))
                if i not in taken and i not in out:
                    out.append(i)
            return out
        free = np.array([i for i in range(size) if i not in taken], dtype=np.int64)
        return [int(i) for i in self.rng.choice(free, size=min(n, len(free)), replace=False)]


class RandomSearch(SearchStrategy):
    """Uniformly random unvisited points."""

    def _propose(self, n: int) -> list[int]:
        return self._random_unvisited(n)


class GridSearch(SearchStrategy):
    """The space in index order (the first knob varies fastest)."""

    def __init__(self, task: Task, seed: int = 0):
        super().__init__(task, seed)
        self._next = 0

    def _propose(self, n: int) -> list[int]:
        out = []
        while len(out) < n and self._next < len(self.space):
            if self._next not in self.visited:
                out.append(self._next)
            self._next += 1
        return out


class ModelGuidedSearch(SearchStrategy):
    """Plans `plan_size` points at a time: the unvisited points a cost model ranks best, found by simulated
    annealing with `n_chains` parallel chains over its predictions; `epsilon` of each batch is random. The
    model is refitted on this task's records (and transfer records of the same template) whenever
    `plan_size` new ones arrived, or after every batch while it has fewer than `plan_size`."""

    def __init__(self, task: Task, seed: int = 0, plan_size: int = 64, n_chains: int = 64, sa_steps: int = 120,
                 epsilon: float = 0.05, new_points: int = 256, transfer: Sequence[Record] = ()):
        super().__init__(task, seed)
        from jitop.tuner.model import CostModel
        self.model = CostModel(task, seed=seed, plan_size=plan_size)
        self.plan_size, self.n_chains, self.sa_steps, self.epsilon = plan_size, n_chains, sa_steps, epsilon
        self.new_points = new_points  # configs featurised per plan at most (lowering is ~3 ms a config)
        self._plan: list[int] = []
        self._fitted_on = 0
        self._radix = [len(k) for k in self.space.knobs]
        if transfer:
            self.set_transfer(transfer)

    def set_transfer(self, records: Sequence[Record]) -> None:
        """Records of other workloads of this template and Target: the model starts from them."""
        start = time.perf_counter()
        self.model.set_transfer([r for r in records if r.task.key != self.task.key])
        self.seconds["model"] += time.perf_counter() - start
        self._refit()

    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        super().update(inputs, results)
        new = len(self.records) - self._fitted_on
        if new >= self.plan_size or (len(self.records) < 2 * self.plan_size and new > 0):
            self._refit()

    def _refit(self) -> None:
        start = time.perf_counter()
        self.model.fit(self.records)
        self._fitted_on = len(self.records)
        self.seconds["model"] += time.perf_counter() - start
        self._plan = self._anneal() if self.model.fitted else []

    def _propose(self, n: int) -> list[int]:
        n_random = max(1, round(n * self.epsilon)) if self._plan else n
        out: list[int] = []
        while self._plan and len(out) < n - n_random:
            i = self._plan.pop(0)
            if i not in self.visited and i not in out:
                out.append(i)
        return out + self._random_unvisited(n - len(out), set(out))

    # ** simulated annealing over the model's predictions **
    def _anneal(self) -> list[int]:
        """The `plan_size` unvisited points of highest predicted score that the chains met."""
        start = time.perf_counter()
        scores: dict[int, float] = {}
        self._budget = self.new_points
        points = self._start_points()
        current = self._scores(points, scores)
        top: list[tuple[float, int]] = []
        for step in range(self.sa_steps):
            temperature = 1.0 - step / self.sa_steps
            proposals = self._mutate(points)
            new = self._scores(proposals, scores)
            accept = self._accept(current, new, temperature)
            points[accept], current[accept] = proposals[accept], new[accept]
            for i in set(self._index(proposals).tolist()):
                if i not in self.visited:
                    _push(top, (scores[i], i), self.plan_size)
        self.seconds["search"] += time.perf_counter() - start
        return [i for _, i in sorted(top, reverse=True)]

    def _start_points(self) -> np.ndarray:
        """Chains start at the best measured points and at random ones (AutoTVM keeps chains across plans)."""
        measured = sorted((r for r in self.records if r.result.ok), key=lambda r: r.result.cost)
        starts = [self.space.knob_vector(r.config) for r in measured[: self.n_chains // 2]]
        while len(starts) < self.n_chains:
            starts.append([int(self.rng.integers(k)) for k in self._radix])
        return np.array(starts, dtype=np.int64)

    def _mutate(self, points: np.ndarray) -> np.ndarray:
        """Each chain moves one knob to another of its candidates."""
        out = points.copy()
        knob = self.rng.integers(len(self._radix), size=len(points))
        radix = np.array(self._radix)[knob]
        shift = self.rng.integers(1, np.maximum(radix, 2))
        out[np.arange(len(points)), knob] = (points[np.arange(len(points)), knob] + shift) % np.maximum(radix, 1)
        return out

    def _accept(self, current: np.ndarray, new: np.ndarray, temperature: float) -> np.ndarray:
        scored = current[np.isfinite(current)]  # -inf: a point beyond the plan's featurising budget
        spread = max(float(np.ptp(scored)) if scored.size else 0.0, 1e-9)  # scores have no unit: their spread
        to_scored, from_scored = np.isfinite(new), np.isfinite(current)
        gain = np.where(to_scored, np.inf, -np.inf)  # never move onto an unscored point, always leave one
        both = to_scored & from_scored
        gain[both] = (new[both] - current[both]) / spread
        prob = np.exp(np.minimum(gain, 0) / max(temperature, 1e-3))
        return self.rng.random(len(new)) < prob

    def _index(self, points: np.ndarray) -> np.ndarray:
        scale = np.cumprod([1] + self._radix[:-1])
        return points @ scale

    def _scores(self, points: np.ndarray, cache: dict[int, float]) -> np.ndarray:
        """Predicted scores of points (each point predicted once per plan). Points already featurised are
        always scored; at most the plan's remaining budget of new ones is, the others score -inf (never
        accepted)."""
        idx = self._index(points).tolist()
        unknown = sorted({i for i in idx if i not in cache})
        if unknown:
            from jitop.tuner.features import is_memoised
            fresh = [i for i in unknown if not is_memoised(self.task, self.space.get(i))]
            over = set(fresh[max(self._budget, 0):])
            self._budget -= len(fresh) - len(over)
            for i in over:
                cache[i] = -math.inf
            unknown = [i for i in unknown if i not in over]
        if unknown:
            for i, s in zip(unknown, self.model.predict([self.space.get(i) for i in unknown])):
                cache[i] = float(s)
        return np.array([cache[i] for i in idx])


def _push(heap: list[tuple[float, int]], item: tuple[float, int], size: int) -> None:
    if any(i == item[1] for _, i in heap):
        return
    if len(heap) < size:
        heapq.heappush(heap, item)
    elif item > heap[0]:
        heapq.heapreplace(heap, item)


STRATEGIES = {"random": RandomSearch, "grid": GridSearch, "xgb": ModelGuidedSearch}


def make_search(name: str, task: Task, seed: int = 0) -> SearchStrategy:
    """The strategy called `name` ("xgb", "random" or "grid") for `task`.

    >>> import jitop
    >>> from jitop.tuner.registry import get
    >>> wl = get("matmul").workload_type(m=16, n=16, k=16)
    >>> type(make_search("grid", Task("matmul", wl, jitop.Target.from_string("haswell")))).__name__
    'GridSearch'
    """
    try:
        return STRATEGIES[name](task, seed=seed)
    except KeyError:
        raise ValueError(f"tuner={name!r} is not a search strategy; choose one of {sorted(STRATEGIES)}") from None
