"""`jitop.tune`: tune the tasks a function runs, within one budget, and report what it gained.

>>> report = jitop.tune(f, a, b, budget="2m", records="tune.jsonl")   # doctest: +SKIP
>>> print(report)                                                      # doctest: +SKIP
>>> with jitop.apply_records("tune.jsonl"):                             # doctest: +SKIP
...     f(a, b)
"""
from __future__ import annotations

import os
import time
import warnings
from collections import Counter
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

from jitop.target import CudaTarget
from jitop.tuner import records as rec_io
from jitop.tuner.apply import apply_records
from jitop.tuner.cached import save_best, tuned_store
from jitop.tuner.predict import save_training, train
from jitop.tuner.records import Record
from jitop.tuner.report import Progress, TaskReport, TuneReport, measured_peak_gflops
from jitop.tuner.scheduler import TaskScheduler, TaskState
from jitop.tuner.task import Task

if TYPE_CHECKING:
    from jitop.tuner.measure import MeasureOptions


DEFAULT_BUDGET = "10m"


@dataclass(frozen=True)
class WeightedTask:
    """A task and how many times one call of the function runs it."""

    task: Task
    count: int


def extract_tasks(fn: Callable, *example_args: Any) -> list[WeightedTask]:
    """The tuning tasks of `fn(*example_args)`: each distinct matmul/conv2d workload with how often a call
    runs it. `fn` is a `@jitop.kernel` function or any function of jitop ops (traced as one).

    >>> import numpy as np, jitop
    >>> f = jitop.kernel(lambda a, b: np.maximum(a @ b, 0) @ b)
    >>> a = np.ones((32, 32), np.float32)
    >>> [(t.task.template, t.count) for t in extract_tasks(f, a, a)]
    [('matmul', 2)]
    """
    tasks_of = getattr(fn, "tuning_tasks", None)
    if tasks_of is None:
        from jitop.kernel import kernel  # a plain function of jitop ops: trace it as one kernel
        tasks_of = kernel(fn).tuning_tasks
    counts = Counter(tasks_of(*example_args))
    return [WeightedTask(task, n) for task, n in counts.items()]


def tune(fn: Callable | Sequence[WeightedTask], *example_args: Any, budget: str | float | None = None,
         trials: int | None = None, records: str | os.PathLike | None = "tune.jsonl", tuner: str = "xgb",
         seed: int = 0, batch_size: int = 16, early_stopping: int | None = 400,
         options: MeasureOptions | None = None, progress: bool = True, apply: bool = True,
         peak_gflops: float | None = None, cache: bool = True, cluster: Any = None,
         target: str | CudaTarget | None = None) -> TuneReport:
    """Tune the tasks `fn(*example_args)` runs (or a list of `WeightedTask`), sharing one budget: `budget`
    wall-clock ("10m", "90s", seconds; 10 minutes if neither is given) and/or `trials`, whichever ends
    first. Every measurement is appended
    to `records` (JSON lines; earlier records of the same file seed the search). `tuner`: "xgb" (model-
    guided), "random" or "grid". `apply`: later compiles in this process use the best configs found.
    `cache`: save the best record of each task in the persistent cache (JITOP_CACHE_DIR), where every later
    process's `pick` finds it with no code change. `cluster`: a `distributed.Client` to measure on its workers
    (jitop.tuner.measure_dask) instead of this machine. `target`: "cuda" (this machine's GPU) or a CudaTarget
    tunes the GPU templates ("cuda.matmul", "cuda.gemv", "cuda.conv2d") of the tasks instead, measured on this GPU
    (jitop.tuner.measure_gpu; CudaUnavailableError without a driver); topi.cuda's schedule_matmul /
    schedule_conv2d then use the configs found. Returns a TuneReport (print it for the table).

    >>> report = jitop.tune(f, a, b, trials=200)                  # doctest: +SKIP
    >>> report = jitop.tune(f, a, b, budget="60s", target="cuda")  # doctest: +SKIP
    """
    weighted = list(fn) if isinstance(fn, (list, tuple)) else extract_tasks(fn, *example_args)
    if target is not None:
        weighted = on_gpu(weighted, target)
    if not weighted:
        raise ValueError("tune: the function runs no tunable operator (matmul, conv2d) for these arguments")
    gpu = _check_gpu(weighted, cluster)
    if trials is None and budget is None:
        budget = DEFAULT_BUDGET
    path = os.fspath(records) if records is not None else None
    earlier = rec_io.load(path) if path is not None else []
    show = Progress(enabled=progress)
    from jitop.tuner.measure import LocalMeasurer, MeasureOptions  # worker processes: only when tuning
    start = time.perf_counter()
    if gpu:
        from jitop.tuner.measure_gpu import GPU_OPTIONS, GpuMeasurer
        chosen: Any = GpuMeasurer(options or GPU_OPTIONS)
    elif cluster is not None:
        from jitop.tuner.measure_dask import DaskMeasurer
        chosen = DaskMeasurer(cluster, options or MeasureOptions())
    else:
        chosen = LocalMeasurer(options or MeasureOptions())
    with chosen as measurer:
        sched = TaskScheduler([w.task for w in weighted], [w.count for w in weighted], measurer, tuner=tuner,
                              trials=trials, budget=budget, batch_size=batch_size, early_stopping=early_stopping,
                              records_path=path, seed=seed, transfer=earlier,
                              on_batch=lambda s, st: _after_batch(show, s, st, cache))
        _resume(sched, earlier)
        try:
            states = sched.run()
        finally:  # an interrupted run keeps what it found (the records file has every trial already)
            if cache:
                save_best([r for s in sched.states for r in s.search.records] + earlier)
                save_training(tuned_store().store, [r for s in sched.states for r in s.search.records])
                _train_models(sched.states)
        split = {"build": measurer.stats.get("build", 0.0), "measure": measurer.stats.get("measure", 0.0),
                 **_search_seconds(states)}
    show.close()
    report = _report(states, time.perf_counter() - start, split)
    # % of peak: of the peak measured on this machine (once per Target, kept in the cache), measured again if a
    # tuned kernel beats it (it was measured while other processes used the CPU)
    fastest = max((r.best_gflops for r in report.tasks), default=0.0)
    report.peak_gflops = peak_gflops or (None if gpu else measured_peak_gflops(weighted[0].task.target,
                                                                            at_least=fastest))
    if apply:
        report.applied = apply_records([r for s in states for r in s.search.records] + earlier)
    return report


def on_gpu(weighted: Sequence[WeightedTask], target: str | CudaTarget) -> list[WeightedTask]:
    """The GPU tasks of `weighted` for `target` ("cuda": this machine's GPU, "cuda -arch=sm_80", a CudaTarget):
    each task's template "X" becomes the GPU template the GPU graph computes it with (the first of
    jitop.graph.gpu.GPU_TEMPLATES["X"] whose workload type's `from_cpu` takes it: a product of few rows is a
    "cuda.gemv", else a "cuda.matmul"; an NHWC convolution as the NCHW one the GPU graph computes: `_as_on_gpu`);
    a task no GPU template takes (B batched, grouped, symbolic, not float32) is left out with one warning, a GPU task
    keeps its template and gets `target`.

    >>> import jitop
    >>> from jitop.tuner.registry import get
    >>> tasks = [WeightedTask(Task("matmul", get("matmul").workload_type(m=m, n=64, k=64), jitop.Target.host()), 2)
    ...          for m in (64, 1)]
    >>> [w.task.template for w in on_gpu(tasks, "cuda")]
    ['cuda.matmul', 'cuda.gemv']
    """
    from jitop.driver import resolve_target
    from jitop.graph.gpu import gpu_workload
    gpu = resolve_target(target) if isinstance(target, str) else target
    if not isinstance(gpu, CudaTarget):
        raise ValueError(f"tune(target={target!r}): target= takes a GPU target ('cuda', 'cuda -arch=sm_90'); "
                         "CPU tasks are tuned for the Target they were compiled for")
    out, left = [], []
    for w in weighted:
        if w.task.template.startswith("cuda."):
            out.append(WeightedTask(Task(w.task.template, w.task.workload, gpu), w.count))
            continue
        found = gpu_workload(w.task.template, _as_on_gpu(w.task.workload))
        if found is None:
            left.append(str(w.task))
        else:
            out.append(WeightedTask(Task(*found, gpu), w.count))
    if left:
        warnings.warn(f"jitop.tune: {len(left)} task(s) have no GPU template for their workload and are not tuned "
                      f"for {gpu.arch}: {'; '.join(left[:3])}", RuntimeWarning, stacklevel=3)
    return out


def _as_on_gpu(workload: Any) -> Any:
    """A CPU workload as the GPU graph computes it: a CPU compile moves NCHW convolutions to NHWC
    (jitop.graph.layout), the GPU graph keeps them NCHW, so an NHWC convolution task is tuned as NCHW."""
    if getattr(workload, "layout", None) == "NHWC":
        return replace(workload, layout="NCHW")
    return workload


def _check_gpu(weighted: Sequence[WeightedTask], cluster: Any) -> bool:
    """Whether these are GPU tasks (then checked measurable here: jitop.tuner.measure_gpu.check_gpu_tasks)."""
    from jitop.tuner.measure_gpu import check_gpu_tasks, is_gpu_task
    gpu = [w.task for w in weighted if is_gpu_task(w.task)]
    if not gpu:
        return False
    if len(gpu) != len(weighted):
        raise ValueError("tune: GPU and CPU tasks in one call; tune them in separate calls")
    if cluster is not None:
        raise ValueError("tune: GPU tasks are measured on this machine's GPU; cluster= is for CPU tasks")
    check_gpu_tasks(gpu)
    return True


def _resume(sched: TaskScheduler, earlier: list[Record]) -> None:
    """Records of these very tasks from an earlier run: their configs are not measured again."""
    for state in sched.states:
        own = [r for r in earlier if r.task.key == state.task.key]
        state.search.mark_visited([r.config for r in own])


def _train_models(states: list[TaskState]) -> None:
    """The cost models (one per kind of workload) of each template and Target tuned here, on every record the
    cache keeps: `pick` predicts configs for workloads that were never tuned (jitop.tuner.predict)."""
    for template, target_key in {(s.task.template, s.task.target.key) for s in states}:
        try:
            train(tuned_store().store, template, target_key)
        except Exception:  # noqa: BLE001 - a model is a bonus; tuning results are already saved
            pass


def _after_batch(show: Progress, sched: TaskScheduler, state: TaskState, cache: bool) -> None:
    """Progress, and the task's best so far into the cache: a program tuning in the background (and any
    process started meanwhile) picks each improvement up as soon as it is measured."""
    _show(show, sched, state)
    if cache:
        save_best(state.search.records)


def _show(show: Progress, sched: TaskScheduler, state: TaskState) -> None:
    show.batch(state.task, state.trials, sched.trials, _gflops(state.task, state.best_cost),
               _gflops(state.task, state.default_cost))


def _gflops(task: Task, cost: float) -> float:
    return task.flops / cost / 1e9 if 0 < cost < float("inf") else 0.0


def _search_seconds(states: list[TaskState]) -> dict[str, float]:
    return {k: sum(s.search.seconds[k] for s in states) for k in ("model", "search")}


def _report(states: list[TaskState], seconds: float, split: dict) -> TuneReport:
    rows = [TaskReport(s.task, s.count, _gflops(s.task, s.default_cost), _gflops(s.task, s.best_cost), s.trials,
                       s.seconds, s.search.best_config.to_json() if s.search.best_config else "") for s in states]
    return TuneReport(rows, seconds, None, split)
