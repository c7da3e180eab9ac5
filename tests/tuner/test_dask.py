"""The Dask measurer (jitop.tuner.measure_dask) on a LocalCluster of 2 worker processes: records arrive in the
usual format, a worker whose Target differs measures nothing, and a worker killed while it measures loses
no record (its trials run again on the worker its nanny restarts). Each test that kills a worker waits for its
restart, so one scenario checks all that a kill shows."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import jitop
from jitop.tuner import records as rec_io
from jitop.tuner.measure import ErrorCode, MeasureInput, MeasureOptions
from jitop.tuner.measure_dask import DaskMeasurer, local_cluster

pytestmark = pytest.mark.usefixtures("private_cache")
OPTIONS = MeasureOptions(repeat=2, min_repeat_ms=2)


@pytest.fixture(scope="module")
def client():
    import dask
    import distributed  # noqa: F401 - its config defaults first
    # a killed worker may die holding the host's measuring lock: Dask frees it when its lease times out (30 s
    # by default, checked every 10 s); the workers inherit this config, the scheduler runs here
    with dask.config.set({"distributed.scheduler.locks.lease-timeout": "3s",
                          "distributed.scheduler.locks.lease-validation-interval": "0.5s"}):
        c = local_cluster(2)
    yield c
    c.close()
    c.cluster.close()


_set_cpu = lambda name: (os.environ.__setitem__("JITOP_CPU", name) if name  # noqa: E731 - a lambda travels to
                         else os.environ.pop("JITOP_CPU", None))       # the workers by value


def matmul_task():
    f = jitop.kernel(lambda a, b: a @ b)
    a, b = np.ones((48, 40), np.float32), np.ones((40, 40), np.float32)
    (w,) = jitop.tuner.extract_tasks(f, a, b)
    return f, (a, b), w.task


@pytest.mark.slow
def test_tune_on_the_cluster_writes_the_usual_records(client, tmp_path) -> None:
    f, args, task = matmul_task()
    path = tmp_path / "tune.jsonl"
    report = jitop.tune(f, *args, trials=4, tuner="random", records=path, progress=False, apply=False,
                        options=OPTIONS, cluster=client)
    recs = rec_io.load(path)
    assert len(recs) == 4 and all(r.task.key == task.key for r in recs)
    assert sum(r.result.ok for r in recs) == 4 and report.tasks[0].best_gflops > 0


def test_no_worker_for_the_target_is_an_error_record_not_an_exception(client) -> None:
    _, _, task = matmul_task()
    foreign = jitop.tuner.task.Task(task.template, task.workload, jitop.Target.from_string("haswell"))
    if foreign.target.key == task.target.key:
        pytest.skip("this machine is haswell")
    client.run(_set_cpu, "znver4")
    try:
        (r,) = DaskMeasurer(client, OPTIONS).measure([MeasureInput(foreign, foreign.config_space().get(0))])
    finally:
        client.run(_set_cpu, None)
    assert r.error == ErrorCode.RUN_ERROR and "no worker" in r.error_msg


@pytest.mark.slow
def test_a_worker_with_another_target_measures_nothing_and_a_killed_one_loses_no_record(client, monkeypatch) -> None:
    """One scenario, one kill (each kill costs a worker restart): one worker is made a haswell, so only the other
    is eligible to run the task's candidates; it dies after the batch's first result, holding half the batch's
    builds. Every trial still gets a good record, none ran on the haswell worker, and the rest ran on the worker
    its nanny restarted (a new address). On a haswell machine the two workers cannot differ: both are eligible,
    and the survivor or the restarted one runs the rest."""
    from jitop.tuner import measure_dask
    monkeypatch.setattr(measure_dask, "_POLL_S", 0.1)  # look for the restarted worker often
    _, _, task = matmul_task()
    differ = task.target.key != jitop.Target.from_string("haswell").replace(threads=task.target.threads).key
    workers = sorted(client.scheduler_info()["workers"])
    other, eligible = workers
    if differ:
        client.run(_set_cpu, "haswell", workers=[other])
    try:
        m = DaskMeasurer(client, OPTIONS)
        assert m.workers_for(task.target) == ([eligible] if differ else workers)
        inputs = [MeasureInput(task, task.config_space().get(i)) for i in range(8)]
        pid = client.run(os.getpid, workers=[eligible])[eligible]
        killed = []

        def kill_after_the_first_result(n, result) -> None:  # the other runs wait for the dead worker
            if not killed:
                killed.append(n)
                os.kill(pid, signal.SIGKILL)
        results = m.measure(inputs, on_result=kill_after_the_first_result)
        assert killed and len(results) == 8 and all(r.ok for r in results)
        assert sum(m.runs_on.values()) == 8
        if differ:
            assert other not in m.runs_on  # never on the haswell worker
            assert set(m.runs_on) - {eligible}  # the rest ran on the restarted worker (a new address)
    finally:
        if differ:
            client.run(_set_cpu, None, workers=[other])
        client.wait_for_workers(2, timeout=120)
    assert len(DaskMeasurer(client, OPTIONS).workers_for(task.target)) == 2  # both eligible again


def test_a_cluster_without_workers_gives_error_records_not_a_hang(monkeypatch) -> None:
    from distributed import Client, LocalCluster
    from jitop.tuner import measure_dask
    monkeypatch.setattr(measure_dask, "_NO_WORKER_GRACE_S", 1.0)
    _, _, task = matmul_task()
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster, Client(cluster) as c:
        seen = []
        (r,) = DaskMeasurer(c, OPTIONS).measure([MeasureInput(task, task.config_space().get(0))],
                                                on_result=lambda n, res: seen.append(n))
    assert r.error == ErrorCode.RUN_ERROR and "no workers" in r.error_msg and seen == [0]
