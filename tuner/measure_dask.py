"""Measuring over a Dask cluster (`pip install jitop[dask]`): the measurer interface of `LocalMeasurer`, with
the builds spread over every worker and each measurement on a worker of the task's own Target.

A batch runs in two phases, as `LocalMeasurer`'s does:

1. Build. Every candidate (and once per task the template's default config, whose output is the reference)
   is one Dask task, run on any worker: LLVM compiles for the Target the task names, whatever the worker's
   CPU. A worker builds in its own spawned build process (one per worker thread), so a build that crashes or
   passes `build_timeout_s` is that candidate's BUILD_ERROR / BUILD_TIMEOUT and the worker lives on. The
   client waits for every build of the batch: no measurement runs while the batch builds.
2. Run. Each candidate is one Dask task restricted to the workers whose Target key (each worker computes its
   own, with the task's build options) equals the task's: code is never measured on another machine kind. A
   worker runs it in its isolated runner process (timeouts, crashes and wrong answers are error records)
   while holding a cluster-wide lock named after its host: one measurement per machine at a time. The built
   code moves from the building worker to the measuring one without passing through the client.

Results stream back as they finish (`on_result`). A worker that dies mid-trial loses that trial only: Dask
computes its lost builds again, and a run whose workers are all gone is submitted again to the workers
eligible now (a restarted worker has a new address). The search, the model and the records never know which
measurer runs.

>>> from distributed import Client, LocalCluster                      # doctest: +SKIP
>>> with DaskMeasurer(Client(LocalCluster(n_workers=2))) as m:         # doctest: +SKIP
...     results = m.measure([MeasureInput(task, cfg) for cfg in configs])
"""
from __future__ import annotations

import asyncio
import multiprocessing
import socket
import threading
import time
from collections import Counter
from typing import Any, Callable, Sequence

from jitop.tuner.measure import (ErrorCode, LocalMeasurer, MeasureInput, MeasureOptions, MeasureResult, _Built,
                                 _BuildPool)
from jitop.tuner.space import Config
from jitop.tuner.task import Task

_POLL_S = 2.0             # how often the client checks that a pending run still has a worker to run on
_NO_WORKER_GRACE_S = 60.0  # how long a run waits for an eligible worker to come back (a nanny restarts one)

# on a worker: its runner (one per worker; the host lock serialises its use) and one build process per thread
_worker_state: dict[str, Any] = {"measurer": None, "pools": []}
_thread_pool = threading.local()


def local_cluster(n_workers: int) -> Any:
    """A `distributed.Client` on a LocalCluster of `n_workers` single-threaded worker processes."""
    import os

    import dask
    from distributed import Client, LocalCluster
    # the nanny sets OMP_NUM_THREADS=1 (and more) in *this* process's environment to pass it to its workers,
    # which would change jitop's own thread count here: no such variables, and this environment kept as it was
    saved = dict(os.environ)
    with dask.config.set({"distributed.nanny.pre-spawn-environ": {}}):
        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None)
    os.environ.clear()
    os.environ.update(saved)
    return Client(cluster)


def worker_target_key(build_options_of: str) -> str:
    """The key of this machine's Target (the host, or its JITOP_CPU) with the build options (threads, opt level,
    parallel threshold) of the Target given as JSON: equal to that Target's key iff code built for it runs here
    as it was built (called on each worker; a worker's own thread settings do not matter)."""
    from jitop.target import Target
    wanted = Target.from_json(build_options_of)
    return Target.current().replace(threads=wanted.threads, opt_level=wanted.opt_level,
                                    parallel_min_work=wanted.parallel_min_work).key


def _allow_child_processes() -> None:
    # Dask starts workers as daemonic processes, and multiprocessing refuses children to those; the measuring
    # processes started here are stopped by the worker plugin and exit with the worker if it is killed
    multiprocessing.current_process()._config["daemon"] = False  # type: ignore[attr-defined]


def build_on_worker(task_json: str, config_json: str | None, timeout_s: float) -> _Built:
    """On a worker: build one candidate (None: the default config) in this thread's own build process."""
    _allow_child_processes()
    pool = getattr(_thread_pool, "pool", None)
    if pool is None:
        pool = _thread_pool.pool = _BuildPool(multiprocessing.get_context("spawn"), 1)
        _worker_state["pools"].append(pool)
    return pool.run([(task_json, config_json)], timeout_s)[0]


def run_on_worker(task_json: str, config_json: str, target_key: str, own: _Built, reference: _Built | None,
                  options: MeasureOptions) -> tuple | None:
    """On a worker: run one built candidate under the host's lock; None if this worker's Target is not
    `target_key` (its environment changed since it was chosen): the client then picks another worker."""
    from distributed import get_worker
    task = Task.from_json(task_json)
    if worker_target_key(task.target.to_json()) != target_key:
        return None
    with _host_lock():
        r = _worker_measurer(options).run_prebuilt(MeasureInput(task, Config.from_json(config_json)), own, reference)
    return (r.costs, int(r.error), r.error_msg, r.build_s, r.run_s, r.timestamp, get_worker().address)


def _host_lock() -> Any:
    """This thread's handle on the host's measuring lock, made once (each handle keeps a lease-refreshing timer
    on the worker's event loop for good: one per trial piled up)."""
    lock = getattr(_thread_pool, "lock", None)
    if lock is None:
        from distributed import Lock
        lock = _thread_pool.lock = Lock(f"jitop-measure-{socket.gethostname()}")
    return lock


def _worker_measurer(options: MeasureOptions) -> LocalMeasurer:
    """This worker's runner, kept across runs (starting one costs about a second); new if the options change.
    Its build pool is never started here: builds go through `build_on_worker`."""
    _allow_child_processes()
    measurer = _worker_state["measurer"]
    if measurer is None or measurer.options != options:
        if measurer is not None:
            measurer.close()
        measurer = _worker_state["measurer"] = LocalMeasurer(options)
    return measurer


def close_worker_state() -> None:
    """On a worker: stop its runner and build processes (they would otherwise idle until the worker exits)."""
    measurer, _worker_state["measurer"] = _worker_state["measurer"], None
    if measurer is not None:
        measurer.close()
    for pool in _worker_state["pools"]:
        pool.close()


def _close_plugin() -> Any:
    """A worker plugin stopping the worker's measuring processes when the worker closes."""
    from distributed import WorkerPlugin

    class CloseMeasurer(WorkerPlugin):
        name = "jitop-close-measurer"

        def teardown(self, worker: Any) -> None:
            close_worker_state()
    return CloseMeasurer()


class DaskMeasurer:
    """Builds a batch on every worker of a `distributed.Client`, then measures each candidate on a worker whose
    Target key equals its task's, one measurement per host at a time.

    `stats`: wall seconds of the build and run phases; `runs_on`: candidates each worker ran (by address).
    """

    def __init__(self, client: Any, options: MeasureOptions = MeasureOptions()):
        self.client = client
        self.options = options
        client.register_plugin(_close_plugin())
        self.stats: dict[str, float] = {"build": 0.0, "measure": 0.0}
        self.runs_on: Counter[str] = Counter()
        self._references: dict[str, Any] = {}  # task key -> future of its default config's build (kept)
        self._served: set[str] = set()  # Target keys some worker has reported: one of them may come back

    def workers_for(self, target: Any) -> list[str]:
        """Addresses of the workers whose Target key equals `target`'s (same CPU and features)."""
        keys = self.client.run(worker_target_key, target.to_json(), on_error="ignore")  # a dying worker: none
        found = sorted(w for w, k in keys.items() if k == target.key)
        if found:
            self._served.add(target.key)
        return found

    def measure(self, inputs: Sequence[MeasureInput],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """One result per input, in order; a task no worker can run gets RUN_ERROR results, never an exception.
        `on_result(index, result)` is called as each result arrives."""
        inputs = list(inputs)
        if inputs and not self._has_workers():
            results = [_error("the Dask cluster has no workers: not measured") for _ in inputs]
            for n, r in enumerate(results if on_result is not None else []):
                on_result(n, r)
            return results
        start = time.perf_counter()
        builds = self._build(inputs)
        middle = time.perf_counter()
        self.stats["build"] += middle - start
        results = _Runs(self, inputs, builds, on_result).collect()
        self.stats["measure"] += time.perf_counter() - middle
        return results

    def _has_workers(self) -> bool:
        """Whether the cluster has a worker, waiting `_NO_WORKER_GRACE_S` for one (a cluster starting up)."""
        if self.client.nthreads():
            return True
        try:
            self.client.wait_for_workers(1, timeout=_NO_WORKER_GRACE_S)
        except (TimeoutError, asyncio.TimeoutError):
            return False
        return True

    def _build(self, inputs: list[MeasureInput]) -> dict[str, Any]:
        """Submit every build (identical candidates once; each task's reference once per measurer) and wait for
        them all: config JSON + task key -> future."""
        from distributed import wait
        builds: dict[str, Any] = {}
        timeout = self.options.build_timeout_s
        # a reference whose build errored or was cancelled (its worker lost, the connection dropped) is built again
        self._references = {k: f for k, f in self._references.items() if f.status not in ("error", "cancelled")}
        for inp in inputs:
            key = inp.task.key + inp.config.to_json()
            if key not in builds:
                builds[key] = self.client.submit(build_on_worker, inp.task.to_json(), inp.config.to_json(), timeout,
                                                 pure=False)
            if self.options.check and inp.task.key not in self._references:
                self._references[inp.task.key] = self.client.submit(build_on_worker, inp.task.to_json(), None,
                                                                    timeout, pure=False)
        wait(list(builds.values()) + list(self._references.values()))
        return builds

    def close(self) -> None:
        """Stop the workers' measuring processes (a later batch starts them again)."""
        self._references.clear()
        try:
            self.client.run(close_worker_state)
        except Exception:  # noqa: BLE001 - a closed client or dead workers: nothing left to stop
            pass

    def __enter__(self) -> "DaskMeasurer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Runs:
    """One batch's run phase: submit each candidate to its eligible workers, collect, resubmit the stranded."""

    def __init__(self, measurer: DaskMeasurer, inputs: list[MeasureInput], builds: dict[str, Any],
                 on_result: Callable[[int, MeasureResult], None] | None):
        self.m, self.inputs, self.builds, self.on_result = measurer, inputs, builds, on_result
        self.results: list[MeasureResult | None] = [None] * len(inputs)
        self.pending: dict[Any, tuple[int, list[str]]] = {}  # future -> (input index, workers it may run on)
        self.unplaced: dict[int, float] = {}  # input index -> since when no eligible worker is alive
        self.eligible: dict[str, list[str]] = {}  # target key -> worker addresses (asked once per round)

    def collect(self) -> list[MeasureResult]:
        from distributed import wait
        self._submit(range(len(self.inputs)))
        while self.pending or self.unplaced:
            done: set = set()
            if self.pending:
                try:
                    done, _ = wait(list(self.pending), timeout=_POLL_S, return_when="FIRST_COMPLETED")
                except (TimeoutError, asyncio.TimeoutError):  # distributed's wait raises when none finished in time
                    # (asyncio's own class before Python 3.11)
                    pass
            else:
                time.sleep(_POLL_S)
            for future in done:
                self._take(future)
            self._resubmit_stranded()
        return self.results  # type: ignore[return-value]

    def _submit(self, indices: Sequence[int]) -> None:
        self.eligible = {}
        for n in indices:
            inp = self.inputs[n]
            workers = self._workers(inp.task.target)
            if not workers:
                self._no_worker(n)
                continue
            self.unplaced.pop(n, None)
            future = self.m.client.submit(
                run_on_worker, inp.task.to_json(), inp.config.to_json(), inp.task.target.key,
                self.builds[inp.task.key + inp.config.to_json()], self.m._references.get(inp.task.key),
                self.m.options, workers=workers, allow_other_workers=False, pure=False)
            self.pending[future] = (n, workers)

    def _workers(self, target: Any) -> list[str]:
        if target.key not in self.eligible:
            self.eligible[target.key] = self.m.workers_for(target)
        return self.eligible[target.key]

    def _no_worker(self, n: int) -> None:
        """No eligible worker now: an error record at once if this measurer never saw one for the Target, else
        after waiting `_NO_WORKER_GRACE_S` for one to come back (a nanny restarts a dead worker)."""
        since = self.unplaced.setdefault(n, time.monotonic())
        served = self.inputs[n].task.target.key in self.m._served
        if not served or time.monotonic() - since >= _NO_WORKER_GRACE_S:
            self.unplaced.pop(n)
            key = self.inputs[n].task.target.key
            self._finish(n, _error(f"no worker of the cluster reports Target {key}: not measured"))

    def _take(self, future: Any) -> None:
        n, _ = self.pending.pop(future)
        try:
            row = future.result()
        except Exception as err:  # noqa: BLE001 - e.g. KilledWorker: the run killed worker after worker
            self._finish(n, _error(f"{type(err).__name__}: {err}"))
            return
        if row is None:  # the worker's Target changed since it was chosen: choose again
            self._submit([n])
            return
        costs, error, msg, build_s, run_s, stamp, address = row
        self.m.runs_on[address] += 1
        self._finish(n, MeasureResult(tuple(costs), ErrorCode(error), msg, build_s, run_s, stamp))

    def _finish(self, n: int, result: MeasureResult) -> None:
        self.results[n] = result
        if self.on_result is not None:
            self.on_result(n, result)

    def _resubmit_stranded(self) -> None:
        """Runs whose every allowed worker is gone (a nanny restarts a dead one under a new address) and runs
        that found no worker go again to the workers eligible now."""
        alive = set(self.m.client.nthreads())  # every worker (scheduler_info lists only 5 on some versions)
        stranded = [f for f, (_, workers) in self.pending.items() if not f.done() and not set(workers) & alive]
        again = [self.pending.pop(f)[0] for f in stranded] + list(self.unplaced)
        for future in stranded:
            future.cancel()
        if again:
            self._submit(again)


def _error(msg: str) -> MeasureResult:
    return MeasureResult((float("inf"),), ErrorCode.RUN_ERROR, msg, 0.0, 0.0, time.time())
