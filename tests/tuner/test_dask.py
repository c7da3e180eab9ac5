"""The Dask measurer (jitop.tuner.measure_dask) on a LocalCluster of 2 worker processes: records arrive in the
usual format, a worker whose Target differs measures nothing, and a worker killed while it measures loses
no record (Dask runs its trial again elsewhere)."""
from __future__ import annotations

import os
import signal
import threading
import time

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


def test_tune_on_the_cluster_writes_the_usual_records(client, tmp_path) -> None:
    f, args, task = matmul_task()
    path = tmp_path / "tune.jsonl"
    report = jitop.tune(f, *args, trials=8, tuner="random", records=path, progress=False, apply=False,
                        options=OPTIONS, cluster=client)
    recs = rec_io.load(path)
    assert len(recs) == 8 and all(r.task.key == task.key for r in recs)
    assert sum(r.result.ok for r in recs) == 8 and report.tasks[0].best_gflops > 0


def test_a_worker_with_another_target_measures_nothing(client) -> None:
    _, _, task = matmul_task()
    workers = sorted(client.scheduler_info()["workers"])
    client.run(_set_cpu, "haswell", workers=[workers[0]])
    try:
        m = DaskMeasurer(client, OPTIONS)
        if task.target.key == jitop.Target.from_string("haswell").replace(threads=task.target.threads).key:
            pytest.skip("this machine's Target is haswell's: the two workers cannot differ")
        assert m.workers_for(task.target) == [workers[1]]
        space = task.config_space()
        results = m.measure([MeasureInput(task, space.get(i)) for i in range(4)])
        assert all(r.ok for r in results)
        assert m.runs_on == {workers[1]: 4}  # every run on the worker of the task's Target
    finally:
        client.run(_set_cpu, None, workers=[workers[0]])
    assert DaskMeasurer(client, OPTIONS).workers_for(task.target) == workers


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


def test_a_killed_worker_loses_no_record(client) -> None:
    _, _, task = matmul_task()
    space = task.config_space()
    inputs = [MeasureInput(task, space.get(i)) for i in range(12)]
    m = DaskMeasurer(client, OPTIONS)
    out: list = []
    t = threading.Thread(target=lambda: out.append(m.measure(inputs)))
    t.start()
    victim = sorted(client.scheduler_info()["workers"])[0]
    pid = client.run(os.getpid, workers=[victim])[victim]
    time.sleep(1.0)  # its chunk is building or running (a build takes longer)
    os.kill(pid, signal.SIGKILL)
    t.join(timeout=300)
    (results,) = out
    assert len(results) == 12 and all(r.ok for r in results)
    assert sum(m.runs_on.values()) == 12
    client.wait_for_workers(2, timeout=120)


def test_runs_go_to_the_restarted_worker_when_the_only_eligible_one_dies(client) -> None:
    _, _, task = matmul_task()
    if task.target.key == jitop.Target.from_string("haswell").replace(threads=task.target.threads).key:
        pytest.skip("this machine's Target is haswell's: the two workers cannot differ")
    workers = sorted(client.scheduler_info()["workers"])
    other, eligible = workers
    client.run(_set_cpu, "haswell", workers=[other])
    try:
        m = DaskMeasurer(client, OPTIONS)
        inputs = [MeasureInput(task, task.config_space().get(i)) for i in range(8)]
        pid = client.run(os.getpid, workers=[eligible])[eligible]
        killed = []

        def kill_after_the_first_result(n, result) -> None:  # the other runs wait for the dead worker
            if not killed:
                killed.append(n)
                os.kill(pid, signal.SIGKILL)
        results = m.measure(inputs, on_result=kill_after_the_first_result)
        assert killed and all(r.ok for r in results)
        assert other not in m.runs_on and sum(m.runs_on.values()) == 8  # never on the haswell worker
        assert set(m.runs_on) - {eligible}  # the rest ran on the worker its nanny restarted (a new address)
    finally:
        client.run(_set_cpu, None, workers=[other])
        client.wait_for_workers(2, timeout=120)


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
