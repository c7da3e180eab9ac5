"""The tuner's cost model (AutoTVM's XGBTuner): gradient-boosted trees with a pairwise ranking loss over
`features.features` (the lowered loop IR of a config plus its knobs), predicting which configs of a task
run fastest. The search refits it every `plan_size` measurements and measures the best predicted configs.

Targets are throughputs normalised per task (gflops / the task's best gflops; a failed record is 0, the
worst), one ranking group per task, so records of other workloads of the same template (transfer) train
the same model: their features are computed with their own task and are comparable (logs and ratios).
Transfer groups weigh w = max(0, 1 - n_own / (2 * plan_size)): they lead while the task has few records
of its own and are dropped once it has 2 * plan_size (the model then ranks by the task's own data only).

>>> model = CostModel(task)               # doctest: +SKIP
>>> model.set_transfer(other_records)     # doctest: +SKIP
>>> model.fit(records)                    # doctest: +SKIP
>>> scores = model.predict(configs)       # doctest: +SKIP
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jitop.tuner.features import features
from jitop.tuner.records import Record
from jitop.tuner.space import Config
from jitop.tuner.task import Task

MIN_OWN = 8          # own records needed to rank without transfer (fewer: the search samples randomly)
MIN_TRANSFER = 16    # transfer records needed to rank with few own records
ROUNDS = 150
# pairs drawn uniformly within a task (AutoTVM's all-pairs rank loss), not XGBoost's default "topk" pairs:
# on 513 measured configs of a 1024^3 matmul, topk's held-out Spearman fell from 0.64 to 0.54 as the training
# records grew from 64 to 128, uniform pairs' rose from 0.69 to 0.75.
# One thread: the training sets are a few hundred rows, and the model runs beside busy cores (measuring
# workers, the program under background tuning), where OpenMP threads spin-waiting for each other made
# 100 trials of model-guided search take 92 s instead of 25 s (two searches at once on 2 cores)
XGB_THREADS = 1
PARAMS = {"max_depth": 3, "eta": 0.3, "gamma": 1e-4, "min_child_weight": 1, "subsample": 1.0,
          "lambda": 1.0, "alpha": 0.0, "objective": "rank:pairwise", "lambdarank_pair_method": "mean",
          "lambdarank_num_pair_per_sample": 8, "tree_method": "hist", "nthread": XGB_THREADS}


class CostModel:
    """Ranks configs of one task by predicted throughput; see the module docstring.

    >>> import jitop
    >>> from jitop.tuner.registry import get
    >>> task = Task("matmul", get("matmul").workload_type(m=8, n=8, k=8), jitop.Target.from_string("haswell"))
    >>> CostModel(task).fitted
    False
    """

    def __init__(self, task: Task, seed: int = 0, plan_size: int = 64):
        self.task = task
        self.seed = seed
        self.plan_size = plan_size
        self._transfer: list[tuple[np.ndarray, np.ndarray]] = []   # per other task: (features, targets)
        self._transfer_count = 0
        self._booster: Any = None

    @property
    def fitted(self) -> bool:
        """Whether `predict` ranks (False: too few records; the search should sample randomly)."""
        return self._booster is not None

    def transfer_weight(self, n_own: int) -> float:
        """Weight of each transfer group when the task has `n_own` records of its own."""
        return transfer_weight(n_own, self.plan_size)

    def set_transfer(self, records: Sequence[Record]) -> None:
        """Records of other workloads of the same template and Target (this task's own are ignored)."""
        by_task: dict[str, list[Record]] = {}
        for r in records:
            if r.task.template != self.task.template or r.task.target.key != self.task.target.key:
                raise ValueError(f"transfer record of {r.task} is not of template '{self.task.template}' on "
                                 f"this task's Target")
            if r.task.key != self.task.key:
                by_task.setdefault(r.task.key, []).append(r)
        self._transfer = [g for g in (_group(recs) for recs in by_task.values()) if g is not None]
        self._transfer_count = sum(len(y) for _, y in self._transfer)

    def fit(self, records: Sequence[Record]) -> None:
        """(Re)train on this task's records (failed ones rank last) plus the weighted transfer groups."""
        own = [r for r in records if r.task.key == self.task.key]
        w = self.transfer_weight(len(own)) if self._transfer_count >= MIN_TRANSFER else 0.0
        groups: list[tuple[np.ndarray, np.ndarray, float]] = []
        mine = _group(own) if len(own) >= 2 else None
        if mine is not None:
            groups.append((*mine, 1.0))
        if w > 0:
            groups += [(x, y, w) for x, y in self._transfer]
        if (len(own) < MIN_OWN or mine is None) and w == 0:
            self._booster = None  # not enough to rank: the search samples at random
            return
        self._booster = _train(groups, self.seed)

    def fit_all(self, records: Sequence[Record]) -> None:
        """Train on records of any tasks of the template (one ranking group per task, equal weights): a model
        for workloads none of them is (jitop.tuner.predict)."""
        by_task: dict[str, list[Record]] = {}
        for r in records:
            by_task.setdefault(r.task.key, []).append(r)
        groups = [(*g, 1.0) for g in (_group(recs) for recs in by_task.values()) if g is not None]
        self._booster = _train(groups, self.seed) if groups else None

    def to_bytes(self) -> bytes:
        """The fitted booster as XGBoost's own JSON (no pickle); `load` reads it back for any task of the
        template on the same Target (features are comparable across workloads)."""
        if self._booster is None:
            raise RuntimeError("CostModel.to_bytes before a successful fit")
        return bytes(self._booster.save_raw("json"))

    @staticmethod
    def load(task: Task, raw: bytes) -> "CostModel":
        """A fitted model for `task` from `to_bytes` output (ValueError if XGBoost cannot read it)."""
        import xgboost as xgb
        model = CostModel(task)
        booster = xgb.Booster()
        try:
            booster.load_model(bytearray(raw))
        except xgb.core.XGBoostError as err:
            raise ValueError(f"not an XGBoost model: {err}") from None
        booster.set_param({"nthread": XGB_THREADS})
        model._booster = booster
        return model

    def predict(self, configs: Sequence[Config]) -> np.ndarray:
        """Scores of `configs` (higher = predicted faster); only their order is meaningful."""
        if self._booster is None:
            raise RuntimeError("CostModel.predict before a successful fit: it needs at least "
                               f"{MIN_OWN} records of the task or transfer records (check .fitted)")
        import xgboost as xgb  # lazily: importing jitop stays fast
        x = features(self.task, configs)
        return self._booster.predict(xgb.DMatrix(x, nthread=XGB_THREADS)).astype(np.float64)


def transfer_weight(n_own: int, plan_size: int) -> float:
    """max(0, 1 - n_own / (2 * plan_size)): transfer leads at first and is gone after two plans.

    >>> [transfer_weight(n, 64) for n in (0, 64, 128, 500)]
    [1.0, 0.5, 0.0, 0.0]
    """
    return max(0.0, 1.0 - n_own / (2.0 * plan_size))


def _group(records: Sequence[Record]) -> tuple[np.ndarray, np.ndarray] | None:
    """One task's (features, normalised throughput targets); None if none of them ran."""
    if not records:
        return None
    task = records[0].task
    gflops = np.array([r.gflops for r in records], dtype=np.float64)
    if gflops.max() <= 0:
        return None
    return features(task, [r.config for r in records]), gflops / gflops.max()


def _train(groups: list[tuple[np.ndarray, np.ndarray, float]], seed: int) -> Any:
    import xgboost as xgb
    x = np.concatenate([g[0] for g in groups])
    y = np.concatenate([g[1] for g in groups])
    dm = xgb.DMatrix(x, label=y, nthread=XGB_THREADS)
    dm.set_group([len(g[1]) for g in groups])
    dm.set_weight(np.array([g[2] for g in groups], dtype=np.float32))  # ranking weights are per group
    return xgb.train({**PARAMS, "seed": seed}, dm, num_boost_round=ROUNDS)
