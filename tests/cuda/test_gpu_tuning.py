"""Tuning on the GPU (issue 25, item 4): the spaces of the "cuda.matmul" / "cuda.conv2d" templates, their PTX,
records keyed by the GPU Target, the GPU measurer and `jitop.tune` for a GPU.

Without a GPU: every point of the spaces is launchable (threads, shared memory, registers), a deterministic
sample of points (and each default) builds PTX that ptxas accepts for sm_90 (skipped without ptxas unless
JITOP_REQUIRE_PTXAS=1), records of sm_90 never serve sm_80 or a CPU, tuning with no driver stops with an
error naming it, and the whole measuring path (build workers, the isolated runner, faults, a sticky CUDA
error, timing with events) runs on a fake GPU (tests/cuda/fake_gpu.py) whose kernels are numpy's GEMM.
With a GPU (benchmarks/gpu_check.sh): a short real tuning, and the tuned kernel's result equals numpy's."""
from __future__ import annotations

import math
import os
import random

import numpy as np
import pytest

import jitop
from jitop import te
from jitop.codegen.nvptx import check_ptx, ptxas_path
from jitop.runtime.cuda import driver
from jitop.target import CudaTarget, Target
from jitop.topi import cuda
from jitop.topi.cuda_space import gemm_space, registers_estimate, to_cfg, to_config
from jitop.topi.cuda_templates import CudaConv2dWorkload, CudaMatmulWorkload, tuned_cfg
from jitop.tuner import cached, registry
from jitop.tuner.measure import ErrorCode, MeasureInput, MeasureOptions, MeasureResult
from jitop.tuner.measure_gpu import GpuMeasurer
from jitop.tuner.records import Record
from jitop.tuner.task import Task, pick
from jitop.tuner.tuning import WeightedTask, on_gpu

import fake_gpu
import gpu_sim

SM90, SM80 = Target.from_string("cuda -arch=sm_90"), Target.from_string("cuda -arch=sm_80")
SMALL_GPU = CudaTarget(arch="sm_80", sm_count=8, max_threads_per_block=256, shared_per_block=16 << 10,
                       registers_per_block=16384)
requires_gpu = pytest.mark.skipif(not driver.available(), reason=f"no usable NVIDIA GPU: {driver.unavailable_reason()}")
MATMULS = [CudaMatmulWorkload(100, 70, 33), CudaMatmulWorkload(1, 1000, 77), CudaMatmulWorkload(4096, 4096, 4096)]
CONVS = [CudaConv2dWorkload(2, 16, 14, 14, 32, 3, 3, padding=(1, 1)),
         CudaConv2dWorkload(1, 8, 9, 7, 12, 1, 1, stride=(2, 2)),
         CudaConv2dWorkload(8, 512, 7, 7, 512, 3, 3, padding=(1, 1))]


def _task(wl, target=SM90) -> Task:
    return Task("cuda.matmul" if isinstance(wl, CudaMatmulWorkload) else "cuda.conv2d", wl, target)


def _sample(task: Task, count: int) -> list:
    """The default and `count` other points, deterministically spread (seeded by the task)."""
    space = task.config_space()
    default = registry.get(task.template).default_config(task.workload, task.target)
    rng = random.Random(task.key)
    picked = [default] + [space.get(i) for i in rng.sample(range(len(space)), min(count, len(space)))]
    return list(dict.fromkeys(picked))


def _ptxas(ptx: str) -> str | None:
    if ptxas_path() is None:
        if os.environ.get("JITOP_REQUIRE_PTXAS") == "1":
            pytest.fail("JITOP_REQUIRE_PTXAS=1 but ptxas is not installed (pip install nvidia-cuda-nvcc)")
        return None
    return check_ptx(ptx, "sm_90")


def _record(task: Task, config, seconds: float = 1e-4) -> Record:
    return Record(task, config, MeasureResult((seconds,), ErrorCode.NO_ERROR))


def _non_default(task: Task):
    """A sampled point other than the default, the quickest to build of them (fewest unrolled products per
    K step: a bk = 32 step of 8 x 8 tiles takes seconds to lower)."""
    default = registry.get(task.template).default_config(task.workload, task.target)
    work = lambda c: to_cfg(c)["bk"] * to_cfg(c)["tm"] * to_cfg(c)["tn"]  # noqa: E731
    return min((c for c in _sample(task, 8) if c != default), key=work)


# ** the spaces **

@pytest.mark.parametrize("target", [SM90, SM80, SMALL_GPU], ids=["sm_90", "sm_80", "small"])
@pytest.mark.parametrize("wl", MATMULS + CONVS, ids=lambda wl: wl.describe().replace(" ", "_"))
def test_every_point_of_the_space_is_a_launchable_block(wl, target) -> None:
    task = _task(wl, target)
    space = task.config_space()
    assert len(space) > 20
    default = registry.get(task.template).default_config(wl, target)
    space.index_of(default)  # the default is a point (raises otherwise)
    assert to_cfg(default)["stages"] == 1  # double buffering is a knob, never measured as a default yet
    max_bk = max(space.knobs[1].candidates)
    for config in space:
        cfg = to_cfg(config)
        cuda._check_matmul_config(cfg, target)  # the template's own validation
        bm, bn, bk, tm, tn = (cfg[x] for x in cuda.MATMUL_KEYS)
        threads = (bm // tm) * (bn // tn)
        assert 32 <= threads <= target.max_threads_per_block <= 1024
        assert (bm + bn) * max_bk * 4 * cfg["stages"] <= target.shared_per_block
        staged = -(-(bm + bn) * max_bk // threads) if cfg["stages"] == 2 else 0
        assert threads * registers_estimate(tm, tn, staged) <= target.registers_per_block
        assert 4 <= tm * tn <= 64
        assert to_config(cfg) == config


def test_the_space_prunes_tiles_larger_than_the_problem_and_keeps_the_default() -> None:
    small = gemm_space(8, 8, 8, SM90)
    assert max(t[0] for t in small.knobs[0].candidates) == 64 and max(small.knobs[1].candidates) == 8
    default = {"bm": 16, "bn": 16, "bk": 32, "tm": 2, "tn": 2}
    assert to_config(default) in list(gemm_space(8, 8, 8, SM90, default))
    with pytest.raises(ValueError, match="not a launchable point"):
        gemm_space(64, 64, 64, SM90, {"bm": 16, "bn": 16, "bk": 8, "tm": 4, "tn": 4})  # 16 threads


def test_gpu_templates_refuse_a_cpu_target_and_an_epilogue_of_another_shape() -> None:
    with pytest.raises(TypeError, match="builds for a GPU"):
        Task("cuda.matmul", MATMULS[0], Target.host()).config_space()
    A, B = te.placeholder((64, 32), name="A"), te.placeholder((32, 48), name="B")
    C = cuda.matmul(A, B)
    wrong = te.compute((48, 64), lambda j, i: C[i, j] * 2.0, name="wrong")
    with pytest.raises(ValueError, match="an epilogue is computed from the register tile, element by element"):
        cuda.schedule_matmul_stage(jitop.create_schedule([C.op, wrong.op]), C, epilogue=wrong)


def test_workloads_round_trip_and_come_from_cpu_tasks() -> None:
    for wl in MATMULS + CONVS:
        task = _task(wl)
        assert Task.from_json(task.to_json()) == task and task.flops == 2 * math.prod(wl.gemm)
    x, w = np.ones((2, 8, 12, 12), np.float32), np.ones((16, 8, 3, 3), np.float32)
    tasks = jitop.tuner.extract_tasks(lambda x, w: jitop.conv2d(x, w, padding=1, stride=2), x, w)
    (gpu,) = on_gpu(tasks, "cuda -arch=sm_80")
    assert gpu.task.target == SM80 and gpu.task.workload == CudaConv2dWorkload(2, 8, 12, 12, 16, 3, 3, (2, 2), (1, 1))
    with pytest.warns(RuntimeWarning, match="no GPU template for their workload"):
        a = np.ones((3, 8, 8), np.float32)
        assert on_gpu(jitop.tuner.extract_tasks(lambda a, b: jitop.matmul(a, b), a, a), SM90) == []
    with pytest.raises(ValueError, match="takes a GPU target"):
        on_gpu(tasks, "llvm")


def conv_block(x, w1, w2, fc):
    """Two convolutions (the CPU compiles them channels-last), a global average pool, a classifier."""
    y = np.maximum(jitop.conv2d(np.maximum(jitop.conv2d(x, w1, padding=1), 0), w2, stride=2, padding=1), 0)
    return y.mean(axis=(2, 3)) @ fc


def test_tuned_gpu_tasks_are_the_tasks_the_gpu_graph_picks() -> None:
    """A program's tasks as jitop.tune(target="cuda") tunes them (its CPU tasks on the GPU: NHWC convolutions of
    the CPU's layout step as the NCHW ones the GPU graph keeps) are the GPU graph's own, so their records
    apply to it."""
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((2, 16, 12, 12), (32, 16, 3, 3), (32, 32, 3, 3),
                                                                  (32, 10))]
    cpu = jitop.tuner.extract_tasks(conv_block, *args)
    assert {t.task.workload.layout for t in cpu if t.task.template == "conv2d"} == {"NHWC"}
    tuned = {w.task for w in on_gpu(cpu, SM90)}
    graph = set(gpu_sim.lower_traced(jitop.kernel(conv_block, target=SM90), *args).tasks)
    assert tuned == graph and len(graph) == 3


# ** PTX for a sample of every space, checked by ptxas **

@pytest.mark.parametrize("wl", [MATMULS[0], CONVS[0], CONVS[1]], ids=lambda wl: wl.describe().replace(" ", "_"))
def test_sampled_points_build_ptx_that_ptxas_accepts(wl) -> None:
    task = _task(wl)
    count = 12 if isinstance(wl, CudaMatmulWorkload) else 6
    for config in _sample(task, count):
        cfg = to_cfg(config)
        s, args = task.build(config)
        f = jitop.build(s, args, target=SM90)
        (kernel,) = f.built.kernels
        threads = (cfg["bn"] // cfg["tn"]) * (cfg["bm"] // cfg["tm"])
        # a tensor-core point: the same threads as warps (lanes along x); else the threads' grid of tiles
        want = (32, threads // 32) if cfg.get("tc") else (cfg["bn"] // cfg["tn"], cfg["bm"] // cfg["tm"])
        assert kernel.block[:2] == want, cfg
        assert 0 < kernel.shared_bytes <= (cfg["bm"] + cfg["bn"]) * cfg["bk"] * 4 * cfg["stages"], cfg
        report = _ptxas(f.get_source("ptx"))
        assert report is None or "Used" in report, cfg


# ** records keyed by the GPU Target **

def _matmul_block(wl: CudaMatmulWorkload, target, cfg: dict | None = None) -> tuple[int, ...]:
    """(block x, block y, shared bytes) of schedule_matmul's kernel for `wl` on `target` (cfg None: its choice)."""
    A, B = te.placeholder((wl.m, wl.k), name="A"), te.placeholder((wl.k, wl.n), name="B")
    C = cuda.matmul(A, B)
    f = jitop.build(cuda.schedule_matmul(C, cfg, target=target), [A, B, C], target=target)
    return f.built.kernels[0].block[:2] + (f.built.kernels[0].shared_bytes,)


def _conv_block(wl: CudaConv2dWorkload, target, cfg: dict | None = None) -> tuple[int, ...]:
    X, W = te.placeholder((wl.n, wl.c, wl.h, wl.w), name="X"), te.placeholder((wl.k, wl.c, wl.r, wl.s), name="W")
    Y = cuda.conv2d_nchw(X, W, wl.stride, wl.padding, wl.dilation)
    f = jitop.build(cuda.schedule_conv2d(Y, cfg, target=target), [X, W, Y], target=target)
    return f.built.kernels[0].block[:2] + (f.built.kernels[0].shared_bytes,)


def _cfg_block(cfg: dict) -> tuple[int, ...]:
    return cfg["bn"] // cfg["tn"], cfg["bm"] // cfg["tm"], (cfg["bm"] + cfg["bn"]) * cfg["bk"] * 4


@pytest.mark.usefixtures("private_cache")
def test_records_of_sm90_serve_sm90_only() -> None:
    wl = MATMULS[0]
    task = _task(wl)
    tuned = _non_default(task)
    default90 = _matmul_block(wl, SM90, cuda.default_matmul_config(wl.m, wl.n, wl.k, SM90))
    default80 = _matmul_block(wl, SM80, cuda.default_matmul_config(wl.m, wl.n, wl.k, SM80))
    assert _matmul_block(wl, SM90, to_cfg(tuned)) != default90
    assert _matmul_block(wl, SM90) == default90
    with jitop.apply_records([_record(task, tuned)]) as applied:
        assert tuned_cfg("cuda.matmul", wl, SM90) == to_cfg(tuned)
        assert _matmul_block(wl, SM90) == _matmul_block(wl, SM90, to_cfg(tuned))  # schedule_matmul(C) uses it
        assert tuned_cfg("cuda.matmul", wl, SM80) is None                         # another architecture: no
        assert _matmul_block(wl, SM80) == default80
        cpu = Task("matmul", registry.get("matmul").workload_type(m=wl.m, n=wl.n, k=wl.k), Target.host())
        assert pick(cpu).source == "default"                                      # nor a CPU
        assert "served 1" in applied.summary()
    assert _matmul_block(wl, SM90) == default90
    # the same through the persistent cache: sm_90 gets its record (and transfers it), sm_80 nothing
    assert cached.save_best([_record(task, tuned)]) == 1
    assert pick(task).source == "tuned" and pick(task).config == tuned
    assert pick(_task(MATMULS[2])).source == "transferred"
    assert pick(_task(wl, SM80)).source == "default" and pick(_task(MATMULS[2], SM80)).source == "default"
    assert pick(cpu).source == "default"


@pytest.mark.usefixtures("private_cache")
def test_schedule_conv2d_uses_the_tuned_record_of_its_target() -> None:
    wl = CONVS[0]
    task = _task(wl)
    tuned = _non_default(task)
    default90 = _conv_block(wl, SM90, cuda.default_conv2d_config(*wl.gemm, SM90))
    assert _conv_block(wl, SM90, to_cfg(tuned)) != default90
    with jitop.apply_records([_record(task, tuned)]):
        assert _conv_block(wl, SM90) == _conv_block(wl, SM90, to_cfg(tuned))
        assert _conv_block(wl, SM80) == _conv_block(wl, SM80, cuda.default_conv2d_config(*wl.gemm, SM80))
    assert _conv_block(wl, SM90) == default90


# ** no driver: a clear error, and the PTX still builds **

@pytest.fixture
def no_driver(monkeypatch):
    """This machine as one without the NVIDIA driver (what it is, unless it has a GPU)."""
    if driver.available():
        reason = "libcuda.so.1 not found: no NVIDIA driver on this machine (simulated)"
        monkeypatch.setattr(driver, "unavailable_reason", lambda: reason)


@pytest.mark.usefixtures("no_driver", "private_cache")
def test_tuning_without_a_driver_names_it_and_the_candidates_still_build(tmp_path) -> None:
    task = _task(MATMULS[0])
    with pytest.raises(driver.CudaUnavailableError, match=r"cuda.matmul 100x70x33.*libcuda.so.1 not found"):
        jitop.tune([WeightedTask(task, 1)], trials=4, records=tmp_path / "r.jsonl", progress=False)
    assert not (tmp_path / "r.jsonl").exists()
    a = np.ones((64, 64), np.float32)
    with pytest.raises(driver.CudaUnavailableError, match="NVIDIA driver"):
        jitop.tune(lambda a, b: jitop.matmul(a, b), a, a, trials=4, records=None, target="cuda", progress=False)
    with pytest.raises(driver.CudaUnavailableError):
        GpuMeasurer()
    configs = _sample(task, 3)
    with GpuMeasurer(MeasureOptions(build_workers=1), require_gpu=False) as m:
        built = m.build([MeasureInput(task, c) for c in configs])
        with pytest.raises(driver.CudaUnavailableError):
            m.measure([MeasureInput(task, configs[0])])
    assert [type(b).__name__ for b in built] == ["GpuFunction"] * len(configs)
    assert all(".target sm_90" in b.get_source("ptx") for b in built)


@pytest.mark.usefixtures("no_driver", "private_cache")
def test_cli_tune_target_cuda_without_a_driver_exits_1_naming_it(tmp_path, monkeypatch, capsys) -> None:
    from jitop.cli import main
    prog = tmp_path / "prog.py"
    prog.write_text("import numpy as np, jitop\na = np.ones((64, 64), np.float32)\njitop.matmul(a, a)\n")
    assert main(["tune", "--script", str(prog), "--target", "cuda", "--trials", "2", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "jitop tune: tuning 1 GPU task(s) (cuda.matmul 64x64x64 float32)" in err and "libcuda.so.1" in err
    monkeypatch.setenv("JITOP_CACHE_DIR", str(tmp_path / "other"))  # this process holds the first one's lock
    assert main(["tune", "--target", "llvm", "--trials", "2"]) == 2
    assert "only 'cuda'" in capsys.readouterr().err


# ** the measuring path on a fake GPU (build workers, the isolated runner, events) **

class FakeGpuMeasurer(GpuMeasurer):
    """GpuMeasurer with the fake GPU's runner (tests/cuda/fake_gpu.py) and no driver check."""

    worker_module = fake_gpu

    @staticmethod
    def _require_gpu() -> None:
        pass


FAKE_WL = CudaMatmulWorkload(64, 48, 40)


def _fake_env(monkeypatch, sticky: tuple[int, int] | None = None) -> None:
    sizes = [FAKE_WL.m, FAKE_WL.n, FAKE_WL.k, *(sticky or ())]
    monkeypatch.setenv(fake_gpu.ENV, ",".join(map(str, sizes)))


@pytest.mark.slow
def test_gpu_measurer_isolates_faults_and_a_sticky_cuda_error(monkeypatch) -> None:
    task = _task(FAKE_WL)
    default = registry.get(task.template).default_config(FAKE_WL, SM90)
    configs = [c for c in _sample(task, 40) if c != default]
    blocks = [_cfg_block(to_cfg(c))[:2] for c in configs]
    sticky = next(c for c, b in zip(configs, blocks) if blocks.count(b) == 1 and b != _cfg_block(to_cfg(default))[:2])
    ok = [c for c, b in zip(configs, blocks) if b != _cfg_block(to_cfg(sticky))[:2]][:6]
    _fake_env(monkeypatch, _cfg_block(to_cfg(sticky))[:2])
    faults = dict(zip(("segfault", "hang", "raise", "wrong"), ok[2:6]))
    options = MeasureOptions(repeat=3, min_repeat_ms=1.0, timeout_s=5.0, build_workers=2,
                             faults=tuple((c.to_json(), kind) for kind, c in faults.items()))
    order = [ok[0], faults["segfault"], faults["hang"], sticky, ok[1], faults["raise"], faults["wrong"], default]
    with FakeGpuMeasurer(options) as m:
        results = m.measure([MeasureInput(task, c) for c in order])
    codes = [r.error for r in results]
    assert codes == [ErrorCode.NO_ERROR, ErrorCode.CRASH, ErrorCode.TIMEOUT, ErrorCode.RUN_ERROR,
                     ErrorCode.NO_ERROR, ErrorCode.RUN_ERROR, ErrorCode.WRONG_ANSWER, ErrorCode.NO_ERROR], \
        [(r.error, r.error_msg) for r in results]
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in results[3].error_msg
    for r, c in zip((results[0], results[4], results[7]), (ok[0], ok[1], default)):
        bx, by, _ = _cfg_block(to_cfg(c))
        # one cost, the median of the event timings: the fake's microseconds per launch for this block shape
        assert len(r.costs) == 1 and r.cost == pytest.approx(fake_gpu.LAUNCH_US * (1 + 256 / (bx * by)) * 1e-6)


@pytest.mark.slow
@pytest.mark.usefixtures("private_cache")
def test_tune_a_gpu_task_end_to_end_on_the_fake_gpu(monkeypatch, tmp_path) -> None:
    from jitop.tuner import measure_gpu
    _fake_env(monkeypatch)
    monkeypatch.setattr(measure_gpu, "GpuMeasurer", FakeGpuMeasurer)
    monkeypatch.setattr(measure_gpu, "check_gpu_tasks", lambda tasks: None)
    task = _task(FAKE_WL)
    path = tmp_path / "gpu.jsonl"
    options = MeasureOptions(repeat=3, min_repeat_ms=1.0, timeout_s=10.0, build_workers=2)
    report = jitop.tune([WeightedTask(task, 1)], trials=12, records=path, tuner="xgb", options=options,
                        progress=False, apply=False, cache=True)
    (row,) = report.tasks
    assert row.trials == 12 and row.best_gflops >= row.default_gflops > 0
    assert "cuda.matmul 64x48x40 float32 on sm_90" in str(report)
    records = jitop.tuner.records.load(path)
    assert len(records) == 12 and all(r.task == task and r.result.ok for r in records)
    best = min(records, key=lambda r: r.result.cost)
    assert pick(task).source == "tuned" and pick(task).config == best.config   # saved in the cache
    assert tuned_cfg("cuda.matmul", FAKE_WL, SM80) is None


# ** on a GPU **

@requires_gpu
@pytest.mark.usefixtures("private_cache")
def test_tune_on_the_gpu_and_the_tuned_kernel_equals_numpy(tmp_path) -> None:
    from jitop.driver import cuda_target
    here = cuda_target()
    wl = CudaMatmulWorkload(300, 260, 200)
    task = Task("cuda.matmul", wl, here)
    report = jitop.tune([WeightedTask(task, 1)], trials=16, records=tmp_path / "gpu.jsonl", progress=False,
                        apply=False, cache=True)
    (row,) = report.tasks
    assert row.best_gflops >= row.default_gflops > 0, str(report)
    choice = pick(task)
    assert choice.source == "tuned"
    A, B = te.placeholder((wl.m, wl.k), name="A"), te.placeholder((wl.k, wl.n), name="B")
    C = cuda.matmul(A, B)
    f = jitop.build(cuda.schedule_matmul(C, target=here), [A, B, C], target=here)
    built = f.built.kernels[0].block[:2] + (f.built.kernels[0].shared_bytes,)
    assert built == _matmul_block(wl, here, to_cfg(choice.config))
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((wl.m, wl.k)).astype(np.float32), rng.standard_normal((wl.k, wl.n)).astype(np.float32)
    np.testing.assert_allclose(f(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4 * wl.k ** 0.5)


@requires_gpu
def test_gpu_measurer_on_the_gpu_reports_faults_as_results() -> None:
    from jitop.driver import cuda_target
    task = Task("cuda.matmul", CudaMatmulWorkload(256, 256, 256), cuda_target())
    configs = _sample(task, 4)
    options = MeasureOptions(repeat=3, min_repeat_ms=2.0, timeout_s=10.0,
                             faults=((configs[1].to_json(), "raise"), (configs[2].to_json(), "wrong")))
    with GpuMeasurer(options) as m:
        results = m.measure([MeasureInput(task, c) for c in configs[:4]])
    assert [r.error for r in results] == [ErrorCode.NO_ERROR, ErrorCode.RUN_ERROR, ErrorCode.WRONG_ANSWER,
                                          ErrorCode.NO_ERROR], [(r.error, r.error_msg) for r in results]
    assert all(0 < r.cost < 1e-2 for r in (results[0], results[3]))
