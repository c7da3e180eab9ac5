"""The child-process side of `jitop.tuner.measure`: what build workers and the runner execute.

Kept apart from measure.py so that a spawned process has one small, clean import target. Everything that
crosses the process boundary is plain data (str, bytes, numbers, dicts, lists): a Task and a Config travel
as JSON, a built kernel as its metadata dict and object code. Replies are dicts with a "status" string that
the parent maps to an ErrorCode, so no exception object (which may not pickle) ever crosses.
"""
from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from typing import Any, Callable

import numpy as np

from jitop.tuner._operands import ColdCopies, Operands, cold_bytes, shape_at

# ---------------------------------------------------------------------------------------------------------
# build workers (a ProcessPoolExecutor of spawned processes)
# ---------------------------------------------------------------------------------------------------------


def exit_with_parent() -> None:
    """Exit when the parent process dies (a killed Dask worker, a killed `jitop tune`): a spawned process
    would otherwise live on, idle, holding its memory."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)
    threading.Thread(target=watch, daemon=True, name="jitop-exit-with-parent").start()


def init_build_worker() -> None:
    """Run once per build worker: importing jitop registers the operator templates."""
    exit_with_parent()
    import jitop  # noqa: F401 - registers the templates the tasks name


def ping() -> int:
    """A no-op task: submitting one per worker starts the pool's processes before any build is timed."""
    return os.getpid()


def build(task_json: str, config_json: str | None) -> dict[str, Any]:
    """Build one candidate (config None: the template's default) into {"status", "meta", "object_code",
    "seconds"}; any failure is {"status": "error", "msg"}: a bad candidate never kills the worker."""
    start = time.perf_counter()
    try:
        meta, object_code = _build(task_json, config_json)
    except Exception as err:  # noqa: BLE001 - the candidate's problem, reported as a BUILD_ERROR result
        return {"status": "error", "msg": _describe(err), "seconds": time.perf_counter() - start}
    return {"status": "ok", "meta": meta, "object_code": object_code, "seconds": time.perf_counter() - start}


def _build(task_json: str, config_json: str | None) -> tuple[dict, bytes]:
    from jitop.driver import build as jit_build
    from jitop.tuner import registry
    from jitop.tuner.space import Config
    from jitop.tuner.task import Task

    task = Task.from_json(task_json)
    template = registry.get(task.template)
    if config_json is None:
        config = template.default_config(task.workload, task.target)
    else:
        config = Config.from_json(config_json)
        _check_in_space(task, config)
    s, tensors = task.build(config)  # constant weights: their packed arrays are inputs (see _operands)
    module = jit_build(s, tensors, target=task.target)
    return module.meta, module.object_code


def _check_in_space(task: Any, config: Any) -> None:
    # a config outside the space may build wrong code or none: refuse it with a clear message
    try:
        task.config_space().index_of(config)
    except (KeyError, ValueError) as err:
        raise ValueError(f"config {config.to_json()} is not a point of the space of {task}: {err}") from None


def _describe(err: BaseException) -> str:
    where = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
    at = f" (at {where[0].filename}:{where[0].lineno})" if where else ""
    return f"{type(err).__name__}: {err}{at}"


# ---------------------------------------------------------------------------------------------------------
# the runner (one long-lived spawned process, fed one request at a time through a Pipe)
# ---------------------------------------------------------------------------------------------------------

# float tolerances (rtol, atol as a fraction of max |reference|): reduction orders differ between
# schedules, so the error grows with the reduction length; these stay far below a wrong answer's error
_TOLERANCE = {np.dtype(np.float16): (1e-2, 1e-2), np.dtype(np.float32): (1e-3, 1e-4),
              np.dtype(np.float64): (1e-9, 1e-12)}


class _RunnerState:
    """What the runner keeps between requests: the current task's operands and reference outputs."""

    def __init__(self) -> None:
        self.task_key: str | None = None
        self.operands: Operands | None = None
        self.reference: list[np.ndarray] | None = None
        self.flush_buffer: np.ndarray | None = None
        self.cold = ColdCopies()


def runner_main(conn: Any) -> None:
    """Entry point of the runner process: warm up, say "ready", then answer requests until EOF."""
    # no exit_with_parent here: the runner sees EOF when its parent dies, and no thread wakes up while it times
    from jitop.runtime.parallel import parallel_for_address
    import jitop  # noqa: F401 - same import state as a user process

    parallel_for_address()  # compile/load the thread pool now, not inside the first candidate's timeout
    conn.send({"status": "ready", "pid": os.getpid()})
    serve_requests(conn, _RunnerState(), _reference, _run)


def serve_requests(conn: Any, state: Any, reference: Callable[[Any, dict], dict],
                   run: Callable[[Any, dict], dict]) -> None:
    """A runner's loop: answer the parent's "reference" and "run" requests with `reference(state, request)` /
    `run(state, request)` until EOF (the parent closed the pipe or died) or an "exit" request. A reply marked
    "restart" (the GPU runner's, after a sticky CUDA error) ends the loop once it is sent: the parent starts a
    fresh runner for the next candidate."""
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request.get("op") == "exit":
            return
        reply = (reference if request["op"] == "reference" else run)(state, request)
        conn.send(reply)
        if reply.get("restart"):
            return


def _load(meta: dict, object_code: bytes) -> Any:
    from jitop.runtime.module import Module
    from jitop.runtime.parallel import MAX_THREADS, get_num_threads, set_num_threads

    module = Module(meta, object_code)
    # the schedule was built for the Target's thread count: run it with that many threads
    threads = max(1, min(module.target.threads, MAX_THREADS))
    if get_num_threads() != threads:
        set_num_threads(threads)
    return module


def _outputs(module: Any, poison: bool, sizes: dict[str, int]) -> list[np.ndarray]:
    """Fresh output arrays; poisoned (NaN, the int maximum) so an element the kernel never writes shows."""
    outs = []
    for p in module.params:
        if p.is_output:
            fill = (np.nan if p.dtype.kind == "f" else np.iinfo(p.dtype).max if p.dtype.kind in "iu" else 0)
            outs.append(np.full(shape_at(p.shape, sizes), fill if poison else 0, p.dtype))
    return outs


def _inputs(state: _RunnerState, request: dict, module: Any, sizes: dict[str, int]) -> list[np.ndarray]:
    """The candidate's input arrays (a symbolic kernel's at `sizes`, its symbols' representative sizes); a new
    task gets new operands and drops the last task's reference."""
    if state.task_key != request["task_key"] or state.operands is None:
        state.task_key, state.reference = request["task_key"], None
        state.operands = Operands.for_task(request, module, sizes)
    return state.operands.inputs(module, request)


def _reference(state: _RunnerState, request: dict) -> dict:
    """Run the default config once for this task and keep its outputs as the reference."""
    try:
        module = _load(request["meta"], request["object_code"])
        sizes = request.get("sizes", {})
        inputs = _inputs(state, request, module, sizes)
        outs = _outputs(module, poison=False, sizes=sizes)
        module(*inputs, *outs)
    except Exception as err:  # noqa: BLE001 - reported to the parent, the runner survives
        return {"status": "run_error", "msg": _describe(err)}
    state.reference = outs
    return {"status": "ok"}


def _run(state: _RunnerState, request: dict) -> dict:
    """Check the candidate's first run against the reference, then time it."""
    try:
        module = _load(request["meta"], request["object_code"])
        sizes = request.get("sizes", {})
        inputs = _inputs(state, request, module, sizes)
        outs = _outputs(module, poison=True, sizes=sizes)
        _first_run(module, [*inputs, *outs], request.get("fault"))
    except Exception as err:  # noqa: BLE001 - the kernel call raised: RUN_ERROR, the runner survives
        return {"status": "run_error", "msg": _describe(err)}
    wrong = checked_outputs(outs, request, state.reference)
    if wrong is not None:
        return wrong
    try:
        rotation = (state.cold.rotation(inputs, outs, cold_bytes(module)) if state.operands.constant_weights
                    else [[*inputs, *outs]])
        costs = _time(state, module, rotation, request)
    except Exception as err:  # noqa: BLE001
        return {"status": "run_error", "msg": _describe(err)}
    return {"status": "ok", "costs": costs}


def _first_run(module: Any, arrays: list[np.ndarray], fault: str | None) -> None:
    # TESTING ONLY: injected faults happen here, in the runner, so the isolation is really exercised
    if fault == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "hang":
        while True:
            time.sleep(3600)
    if fault == "raise":
        raise RuntimeError("injected fault: the kernel call raised")
    module(*arrays)  # the checked call (shapes, dtypes, bounds flags), also the timing's warm-up


def checked_outputs(outs: list[np.ndarray], request: dict, reference: list[np.ndarray] | None,
                    tolerance: tuple[float, float] | None = None) -> dict | None:
    """The runner's reply for a candidate whose first run's outputs differ from the default config's (a
    "wrong_answer"), when the request asks for the check; None when they match. A request's "wrong" fault
    (tests) perturbs the outputs first. `tolerance` (rtol, atol as a fraction of max|reference|) replaces the
    dtype's for float outputs (a TF32 candidate's looser one)."""
    if request.get("fault") == "wrong":
        _perturb(outs)
    if request["check"]:
        wrong = _compare(outs, reference, tolerance)
        if wrong:
            return {"status": "wrong_answer", "msg": wrong}
    return None


def _perturb(outs: list[np.ndarray]) -> None:
    for out in outs:
        if out.dtype.kind == "b":
            np.logical_not(out, out=out)
        else:
            out += np.ones((), out.dtype)


def _compare(outs: list[np.ndarray], reference: list[np.ndarray] | None,
             tolerance: tuple[float, float] | None = None) -> str:
    """'' if every output matches the reference, else what differs."""
    if reference is None:
        return "no reference output for this task (the default config was not run)"
    for k, (out, ref) in enumerate(zip(outs, reference)):
        if out.dtype.kind != "f":
            if not np.array_equal(out, ref):
                return f"output {k}: {int(np.count_nonzero(out != ref))} of {out.size} elements differ (exact)"
            continue
        rtol, frac = tolerance or _TOLERANCE.get(out.dtype, _TOLERANCE[np.dtype(np.float32)])
        atol = frac * float(np.max(np.abs(ref), initial=0.0))
        if not np.allclose(out, ref, rtol=rtol, atol=atol, equal_nan=True):
            err = np.abs(out.astype(np.float64) - ref)
            return (f"output {k}: max |difference| {np.nanmax(err, initial=0.0):.3g} exceeds the tolerance "
                    f"(rtol {rtol:g}, atol {atol:.3g}); {int(np.count_nonzero(~np.isfinite(out)))} elements not finite")
    return ""


def _time(state: _RunnerState, module: Any, rotation: list[list[np.ndarray]], request: dict) -> list[float]:
    """AutoTVM's semantics: `repeat` measurements, each the mean of `number` runs; a measurement shorter
    than min_repeat_ms is redone with more runs (estimated from it) so timer noise stays small. Run k
    takes the argument list rotation[k % len(rotation)] (cold weights: another copy each run)."""
    call, number, min_s = module.call_arrays, request["number"], request["min_repeat_ms"] / 1e3
    costs, turn = [], 0
    for _ in range(request["repeat"]):
        if request["flush_cache"]:
            _flush(state, module)
        while True:
            start = time.perf_counter()
            for _ in range(number):
                call(*rotation[turn % len(rotation)])
                turn += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_s:
                break
            number = more_runs(number, elapsed, min_s)
        costs.append(elapsed / number)
    module.raise_if_error()
    return costs


def more_runs(number: int, elapsed: float, min_s: float) -> int:
    """The run count for the next try of a measurement whose `number` runs took `elapsed` s, under `min_s`: as
    TVM, the count estimated to last min_s, and at least the golden ratio more (timer granularity).

    >>> more_runs(1, 0.001, 0.1), more_runs(10, 0.09, 0.1)
    (101, 17)
    """
    per_run = max(elapsed / number, 1e-9)
    return max(int(min_s / per_run) + 1, int(number * 1.618) + 1)


def _flush(state: _RunnerState, module: Any) -> None:
    # writing over a buffer larger than the last-level cache evicts the kernel's operands
    if state.flush_buffer is None:
        state.flush_buffer = np.zeros(cold_bytes(module) // 8, np.float64)
    state.flush_buffer += 1.0
