"""Measuring over a Dask cluster (`pip install jitop[dask]`): the measurer interface of `LocalMeasurer`, with
each worker doing what `LocalMeasurer` does on one machine.

A batch is split into one chunk per eligible worker; a worker measures its chunk with its own long-lived
`LocalMeasurer` (builds in its spawned pool, then runs one at a time, isolated, with every failure an error
record), holding a cluster-wide lock named after its host while it does: one measurement per machine at a
time, and never while another chunk builds on that machine. Eligible workers are those whose Target key
(each reports its own, `default_target()`) equals the task's: code is never measured on another machine kind.
Results stream back as chunks finish; a worker that dies mid-chunk loses that chunk, which Dask runs again on
another worker (its scheduler's own rescheduling). The search, the model and the records never know which
measurer runs.

>>> from distributed import Client, LocalCluster                      # doctest: +SKIP
>>> with DaskMeasurer(Client(LocalCluster(n_workers=2))) as m:         # doctest: +SKIP
...     results = m.measure([MeasureInput(task, cfg) for cfg in configs])
"""
from __future__ import annotations

import socket
import time
from typing import Any, Sequence

from jitop.tuner.measure import ErrorCode, LocalMeasurer, MeasureInput, MeasureOptions, MeasureResult
from jitop.tuner.space import Config
from jitop.tuner.task import Task

_local: dict[str, LocalMeasurer] = {}  # on a worker: its measurer, reused across chunks (spawning costs ~1 s)


def local_cluster(n_workers: int) -> Any:
    """A `distributed.Client` on a LocalCluster of `n_workers` single-threaded worker processes that may start
    processes of their own (the build pool and the isolated runner)."""
    import os

    import dask
    from distributed import Client, LocalCluster
    # the nanny sets OMP_NUM_THREADS=1 (and more) in *this* process's environment to pass it to its workers,
    # which would change jitop's own thread count here: no such variables, and this environment kept as it was
    saved = dict(os.environ)
    with dask.config.set({"distributed.worker.daemon": False, "distributed.nanny.pre-spawn-environ": {}}):
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


def measure_chunk(payload: list[tuple[str, str]], options: MeasureOptions) -> list[tuple]:
    """On a worker: measure (task JSON, config JSON) pairs with the worker's LocalMeasurer, under the host's lock."""
    from distributed import Lock
    inputs = [MeasureInput(Task.from_json(t), Config.from_json(c)) for t, c in payload]
    measurer = _local.get("m")
    if measurer is None or measurer.options != options:
        measurer = _local["m"] = LocalMeasurer(options)
    with Lock(f"jitop-measure-{socket.gethostname()}"):
        results = measurer.measure(inputs)
    return [(r.costs, int(r.error), r.error_msg, r.build_s, r.run_s, r.timestamp) for r in results]


def close_local_measurer() -> None:
    """On a worker: stop its LocalMeasurer's build pool and runner (spawned processes outlive their parent)."""
    measurer = _local.pop("m", None)
    if measurer is not None:
        measurer.close()


def _close_plugin() -> Any:
    """A worker plugin closing the worker's measurer when the worker closes (distributed imported lazily)."""
    from distributed import WorkerPlugin

    class CloseMeasurer(WorkerPlugin):
        name = "jitop-close-measurer"

        def teardown(self, worker: Any) -> None:
            close_local_measurer()
    return CloseMeasurer()


class DaskMeasurer:
    """Measures batches on the workers of a `distributed.Client` whose Target key equals each task's."""

    def __init__(self, client: Any, options: MeasureOptions = MeasureOptions()):
        self.client = client
        self.options = options
        client.register_plugin(_close_plugin())
        self.stats: dict[str, float] = {"build": 0.0, "measure": 0.0}  # build and run overlap across workers

    def workers_for(self, target: Any) -> list[str]:
        """Addresses of the workers whose Target key equals `target`'s (same CPU and features)."""
        keys = self.client.run(worker_target_key, target.to_json())
        return sorted(w for w, k in keys.items() if k == target.key)

    def measure(self, inputs: Sequence[MeasureInput]) -> list[MeasureResult]:
        """One result per input, in order; a task no worker can run gets RUN_ERROR results, never an exception."""
        inputs = list(inputs)
        start = time.perf_counter()
        results: list[MeasureResult | None] = [None] * len(inputs)
        futures = {}
        targets = {i.task.target.key: i.task.target for i in inputs}
        for target_key, target in targets.items():
            idx = [n for n, i in enumerate(inputs) if i.task.target.key == target_key]
            workers = self.workers_for(target)
            if not workers:
                for n in idx:
                    results[n] = _no_worker(target_key)
                continue
            for k, w in enumerate(workers):
                mine = idx[k::len(workers)]
                if mine:
                    payload = [(inputs[n].task.to_json(), inputs[n].config.to_json()) for n in mine]
                    fut = self.client.submit(measure_chunk, payload, self.options, workers=workers,
                                             allow_other_workers=False, pure=False)
                    futures[fut] = mine
        from distributed import as_completed
        for fut in as_completed(list(futures)):
            for n, row in zip(futures[fut], fut.result()):
                costs, error, msg, build_s, run_s, stamp = row
                results[n] = MeasureResult(tuple(costs), ErrorCode(error), msg, build_s, run_s, stamp)
        self.stats["measure"] += time.perf_counter() - start
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the workers' measurers (their build pools and runners); a later batch starts them again."""
        try:
            self.client.run(close_local_measurer)
        except Exception:  # noqa: BLE001 - a closed client or dead workers: nothing left to stop
            pass

    def __enter__(self) -> "DaskMeasurer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _no_worker(target_key: str) -> MeasureResult:
    return MeasureResult((float("inf"),), ErrorCode.RUN_ERROR,
                         f"no worker of the cluster reports Target {target_key}: not measured", 0.0, 0.0, time.time())
