"""The child-process side of `jitop.tuner.measure_gpu`: what GPU build workers and the GPU runner execute.

The same protocol as jitop.tuner._measure_worker (the CPU's), so LocalMeasurer's parent side (timeouts,
crashes, references, error codes) serves both: a build reply carries the candidate's GpuFunction as bytes
(`GpuFunction.to_bytes`: JSON header and PTX, no pickle) in "object_code"; the runner answers "reference" and
"run" requests with dicts. Building needs no GPU (PTX from llvmlite); running needs the CUDA driver.

Timing (`gpu_time`): warm-up launches, then `repeat` measurements, each `number` back-to-back launches between
two CUDA events (`number` grows until a measurement lasts min_repeat_ms); the cost is their median (one value:
a GPU's outliers, a clock ramp or another process's kernel, are far from the typical time, and a mean would
count them). Launches are queued from Python, so a kernel shorter than a launch's cost (a few microseconds)
measures as the launch rate.

A CUDA error that leaves the context unusable (an illegal address, a trap: the driver's sticky errors) is that
candidate's RUN_ERROR, and the reply asks for a fresh runner ("restart"), so the next candidate is not blamed.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

import numpy as np

from jitop.tuner._measure_worker import (_describe, _first_run, checked_outputs, init_build_worker,  # noqa: F401
                                        more_runs, ping, serve_requests)
from jitop.tuner._operands import random_array

WARMUP = 3  # launches before timing: the module is loaded and the GPU's clocks are up


# ** build workers: started with the CPU's init_build_worker and ping (imported above) **

def build(task_json: str, config_json: str | None) -> dict[str, Any]:
    """Build one candidate's PTX (config None: the template's default) into {"status", "meta", "object_code"
    (the GpuFunction's bytes), "seconds"}; a failure is {"status": "error", "msg"}. Needs no GPU."""
    start = time.perf_counter()
    try:
        meta, data = _build(task_json, config_json)
    except Exception as err:  # noqa: BLE001 - the candidate's problem: a BUILD_ERROR result
        return {"status": "error", "msg": _describe(err), "seconds": time.perf_counter() - start}
    return {"status": "ok", "meta": meta, "object_code": data, "seconds": time.perf_counter() - start}


def _build(task_json: str, config_json: str | None) -> tuple[dict, bytes]:
    from jitop.driver import build as jit_build
    from jitop.tuner import registry
    from jitop.tuner._measure_worker import _check_in_space
    from jitop.tuner.space import Config
    from jitop.tuner.task import Task

    task = Task.from_json(task_json)
    if getattr(task.target, "kind", "") != "cuda":
        raise ValueError(f"the GPU measurer measures GPU tasks; {task} is for a CPU")
    if config_json is None:
        config = registry.get(task.template).default_config(task.workload, task.target)
    else:
        config = Config.from_json(config_json)
        _check_in_space(task, config)
    s, tensors = task.build(config)
    function = jit_build(s, tensors, target=task.target)
    meta = {"gpu": True, "name": function.name, "kernels": len(function.built.kernels)}
    tolerance = getattr(task.workload, "tolerance", None)
    if tolerance is not None and tolerance(config) is not None:
        meta["tolerance"] = list(tolerance(config))  # a TF32 point: checked with TF32's tolerance
    return meta, function.to_bytes()


# ** the runner **

class _State:
    """What the runner keeps between requests: the current task's inputs on the device, and its reference."""

    def __init__(self) -> None:
        self.task_key: str | None = None
        self.inputs: list[Any] = []
        self.reference: list[np.ndarray] | None = None


def runner_main(conn: Any) -> None:
    """Entry point of the GPU runner process: open the GPU, say "ready", answer requests until EOF (or until a
    sticky CUDA error leaves the context unusable)."""
    try:
        import jitop  # noqa: F401 - same import state as a user process
        from jitop.runtime.cuda import driver
        driver.context()
    except Exception as err:  # noqa: BLE001 - e.g. no driver: the parent says so for every candidate
        conn.send({"status": "error", "msg": f"no GPU to measure on: {_describe(err)}"})
        return
    conn.send({"status": "ready", "pid": os.getpid()})
    serve_requests(conn, _State(), _reference, _run)  # until EOF, or a sticky CUDA error's "restart" reply


def _failure(err: BaseException) -> dict:
    from jitop.runtime.cuda import driver
    sticky = isinstance(err, driver.CudaError) and err.name in driver._STICKY
    return {"status": "run_error", "msg": _describe(err), **({"restart": True} if sticky else {})}


def _load(request: dict) -> Any:
    from jitop.runtime.cuda.function import GpuFunction
    function = GpuFunction.from_bytes(request["object_code"], "a candidate's build")
    function.link()  # the driver's PTX JIT, before anything is timed
    return function


def _inputs(state: _State, request: dict, function: Any) -> list[Any]:
    """The task's inputs on the device: random, the same for every candidate of a task (seeded by its key)."""
    from jitop.runtime.cuda import memory
    if state.task_key != request["task_key"]:
        rng = np.random.default_rng(int(request["task_key"][:16], 16))
        arrays = [random_array(rng, tuple(p.shape), p.dtype) for p in function.params if not p.is_output]
        state.task_key, state.reference = request["task_key"], None
        state.inputs = [memory.to_device(a) for a in arrays]
    return state.inputs


def _outputs(function: Any, poison: bool) -> list[Any]:
    """Fresh device outputs; poisoned with NaN so an element the kernel never writes shows."""
    from jitop.runtime.cuda import memory
    return [memory.to_device(np.full(tuple(p.shape), np.nan if poison else 0, p.dtype))
            for p in function.params if p.is_output]


def _reference(state: _State, request: dict) -> dict:
    """Run the default config once for this task and keep its outputs (on the host) as the reference."""
    try:
        function = _load(request)
        outs = _outputs(function, poison=False)
        function(*_inputs(state, request, function), *outs)
        state.reference = [o.get() for o in outs]
    except Exception as err:  # noqa: BLE001 - reported to the parent
        return _failure(err)
    return {"status": "ok"}


def _run(state: _State, request: dict) -> dict:
    """Check the candidate's first run against the reference, then time it with CUDA events."""
    try:
        function = _load(request)
        arrays = [*_inputs(state, request, function), *_outputs(function, poison=True)]
        _first_run(function, arrays, request.get("fault"))
        outs = [a.get() for a in arrays[len(state.inputs):]]
    except Exception as err:  # noqa: BLE001 - the launch failed: RUN_ERROR
        return _failure(err)
    tolerance = (request.get("meta") or {}).get("tolerance")
    wrong = checked_outputs(outs, request, state.reference, tuple(tolerance) if tolerance else None)
    if wrong is not None:
        return wrong
    try:
        cost = gpu_time(function.launcher(arrays), request["number"], request["repeat"], request["min_repeat_ms"])
        function.raise_if_flagged()
    except Exception as err:  # noqa: BLE001
        return _failure(err)
    return {"status": "ok", "costs": [cost]}


def gpu_time(launch: Callable[[], None], number: int = 1, repeat: int = 3, min_repeat_ms: float = 20.0,
             warmup: int = WARMUP) -> float:
    """Seconds per call of `launch` (it queues kernels, e.g. `GpuFunction.launcher(arrays)`): the median of
    `repeat` CUDA-event measurements of `number` calls each, after `warmup` calls; `number` grows until a
    measurement lasts min_repeat_ms.

    >>> gpu_time(f.launcher([a, b, c]))   # doctest: +SKIP
    0.000412
    """
    from jitop.runtime.cuda.driver import Event
    for _ in range(warmup):
        launch()
    start, end = Event(), Event()
    costs = []
    for _ in range(repeat):
        while True:
            start.record()
            for _ in range(number):
                launch()
            end.record()
            ms = Event.elapsed_ms(start, end)
            if ms >= min_repeat_ms:
                break
            number = more_runs(number, ms / 1e3, min_repeat_ms / 1e3)
        costs.append(ms / 1e3 / number)
    return statistics.median(costs)
