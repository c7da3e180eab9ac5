"""Measuring GPU candidates: tasks of a `cuda` Target (the "cuda.matmul" / "cuda.conv2d" templates), built to PTX
in worker processes and timed on this machine's GPU with CUDA events in one isolated runner process.

`GpuMeasurer` is LocalMeasurer (jitop.tuner.measure) with the GPU's child processes (jitop.tuner._gpu_worker):
the same build pool (timeouts, a crashing build named), the same runner handling (a candidate that hangs is
killed after `timeout_s`, one that crashes the runner is a CRASH result, a CUDA error a RUN_ERROR; a fresh
runner serves the next candidate) and the same check of a candidate's first run against the default config's
output before its time counts. Each cost is the median of `repeat` event-timed measurements.

Building needs no GPU: `GpuMeasurer(require_gpu=False).build(inputs)` makes every candidate's PTX anywhere.
Measuring needs the CUDA driver and the very GPU of the tasks' Target (`check_gpu_tasks`); where either is
missing, tuning stops before it starts with an error that says which.

>>> with GpuMeasurer() as measurer:                                   # doctest: +SKIP
...     results = measurer.measure([MeasureInput(task, cfg) for cfg in configs])
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from jitop.errors import TargetMismatchError
from jitop.tuner import _gpu_worker
from jitop.tuner.measure import ErrorCode, LocalMeasurer, MeasureInput, MeasureOptions, MeasureResult, _failed
from jitop.tuner.task import Task

# GPU kernels are short and their timings steady: more, shorter measurements (the median of 5)
GPU_OPTIONS = MeasureOptions(repeat=5, min_repeat_ms=10.0)


def is_gpu_task(task: Task) -> bool:
    """Whether `task` is for a GPU (its Target is a CudaTarget)."""
    return getattr(task.target, "kind", "") == "cuda"


def gpu_unavailable_reason() -> str:
    """Why GPU tasks cannot be measured here ("" when they can): no NVIDIA driver, or no usable GPU."""
    from jitop.runtime.cuda import driver
    return driver.unavailable_reason()


def check_gpu_tasks(tasks: Iterable[Task]) -> None:
    """Raise, before any tuning starts, unless this machine can measure these GPU tasks: CudaUnavailableError
    naming the missing driver or GPU, TargetMismatchError when its GPU is not the tasks' Target (a record is
    only measured on the Target it is keyed by)."""
    from jitop.driver import cuda_target
    from jitop.runtime.cuda.driver import CudaUnavailableError
    tasks = list(tasks)
    reason = gpu_unavailable_reason()
    if reason:
        raise CudaUnavailableError(
            f"tuning {len(tasks)} GPU task(s) ({_names(tasks)}) measures them on an NVIDIA GPU, but {reason}. Tune on "
            "a machine with the CUDA driver (libcuda.so.1) and a GPU; the candidates' PTX builds anywhere "
            "(jitop.tuner.measure_gpu.GpuMeasurer(require_gpu=False).build)")
    here = cuda_target()
    foreign = [t for t in tasks if t.target.key != here.key]
    if foreign:
        raise TargetMismatchError(
            f"{len(foreign)} GPU task(s) ({_names(foreign)}) are for {foreign[0].target.describe()}, but this GPU "
            f"is {here.describe()}: records are measured only on the GPU they are keyed by. Make the tasks with "
            "target='cuda' (jitop.driver.cuda_target(), this GPU)")


def _names(tasks: Sequence[Task]) -> str:
    shown = [t.workload.describe() if hasattr(t.workload, "describe") else str(t) for t in tasks[:3]]
    return "; ".join(shown) + (f"; and {len(tasks) - 3} more" if len(tasks) > 3 else "")


class GpuMeasurer(LocalMeasurer):
    """Builds GPU candidates in worker processes and times them, isolated, on this machine's GPU (see the module
    docstring). `require_gpu=False` makes one that only builds (`build`) where there is no driver.

    >>> with GpuMeasurer(require_gpu=False) as m:                       # doctest: +SKIP
    ...     functions = m.build([MeasureInput(task, cfg) for cfg in configs])
    """

    worker_module = _gpu_worker

    def __init__(self, options: MeasureOptions = GPU_OPTIONS, require_gpu: bool = True):
        if require_gpu:
            self._require_gpu()
        super().__init__(options)

    @staticmethod
    def _require_gpu() -> None:
        from jitop.runtime.cuda.driver import CudaUnavailableError
        reason = gpu_unavailable_reason()
        if reason:
            raise CudaUnavailableError(f"the GPU measurer times candidates on an NVIDIA GPU, but {reason}")

    def measure(self, inputs: Sequence[MeasureInput],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """Build and time each GPU candidate (see LocalMeasurer.measure); CudaUnavailableError without a GPU."""
        self._require_gpu()
        return super().measure(inputs, on_result)

    def build(self, inputs: Sequence[MeasureInput]) -> list[Any]:
        """Build every candidate's PTX in the worker processes (no GPU needed): per input, its GpuFunction, or
        a failed MeasureResult (BUILD_ERROR, BUILD_TIMEOUT) saying why there is none."""
        from jitop.runtime.cuda.function import GpuFunction
        jobs = [(inp.task.to_json(), inp.config.to_json()) for inp in inputs]
        out: list[Any] = []
        for built in self._builder.run(jobs, self.options.build_timeout_s):
            if built.error != ErrorCode.NO_ERROR:
                out.append(_failed(built.error, built.msg, built.seconds))
            else:
                out.append(GpuFunction.from_bytes(built.object_code, "a candidate's build"))
        return out


__all__ = ["GpuMeasurer", "GPU_OPTIONS", "check_gpu_tasks", "is_gpu_task", "gpu_unavailable_reason"]
