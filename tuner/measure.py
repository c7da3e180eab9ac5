"""Measuring candidates safely (AutoTVM's builder + runner): build in parallel worker processes, run one at
a time in an isolated worker process with a timeout; a candidate that crashes, hangs, raises or answers
wrongly becomes a result with an error code and infinite cost, and the tuner goes on.

Design (`LocalMeasurer.measure`, one batch at a time):

1. Build. LLVM is the slow part of a trial, so every candidate of the batch (plus, once per task, the
   template's default config, whose output is the reference) is built in a pool of spawned worker
   processes (never forked: jitop runs a native thread pool). A Task and a Config cross as JSON; a kernel
   comes back as its metadata dict and object code (`Module(meta, object_code)` rebuilds it). At most one
   build per worker is in flight, so each build's timeout starts when it does; a build past
   `build_timeout_s` kills the pool (a running build cannot be cancelled) and the others are resubmitted.
   Builds that were in flight when a worker died are retried alone, so the one that kills a worker is
   named. The pool lives across batches (spawning costs about a second).
2. Run. Only after every build of the batch is done (a build never shares the cores with a timed run),
   candidates run one at a time in one long-lived runner process (`_measure_worker.runner_main`). Inputs are
   random but deterministic per task (seeded from `task.key`); the runner computes the reference output
   once per task with the default config. A candidate's first run is checked against it (a wrong answer
   is an error, not a time), then timed with AutoTVM's number / repeat / min_repeat_ms. The parent waits
   `timeout_s` for each answer: a runner that does not answer is killed (TIMEOUT), one that died is
   reported with its signal (CRASH); either way a fresh runner serves the next candidate.

Programs that measure must guard their entry point with `if __name__ == "__main__":`, as any program that
spawns processes: a spawned worker imports the main module.

>>> with LocalMeasurer(MeasureOptions(repeat=3)) as measurer:           # doctest: +SKIP
...     results = measurer.measure([MeasureInput(task, cfg) for cfg in configs])
>>> [r.cost for r in results]                                          # doctest: +SKIP
[0.00041, inf, 0.00038]
"""
from __future__ import annotations

import enum
import math
import multiprocessing
import os
import signal
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from jitop.tuner import _measure_worker as worker
from jitop.tuner.space import Config
from jitop.tuner.task import Task


class ErrorCode(enum.IntEnum):
    """Why a measurement has no time (0: it has one)."""

    NO_ERROR = 0
    BUILD_ERROR = 1
    BUILD_TIMEOUT = 2
    RUN_ERROR = 3      # the kernel call raised
    CRASH = 4          # the worker process died (segfault, abort, killed)
    TIMEOUT = 5
    WRONG_ANSWER = 6   # first run's output differs from the default config's


@dataclass(frozen=True)
class MeasureInput:
    """One candidate: a task and a config of its space."""

    task: Task
    config: Config


@dataclass(frozen=True)
class MeasureResult:
    """Seconds per run (one per repeat; (inf,) on error), the error code and where the time went."""

    costs: tuple[float, ...]
    error: ErrorCode
    error_msg: str = ""
    build_s: float = 0.0
    run_s: float = 0.0
    timestamp: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error == ErrorCode.NO_ERROR and all(math.isfinite(c) and c > 0 for c in self.costs)

    @property
    def cost(self) -> float:
        """Mean seconds per run; inf for a failed candidate."""
        return sum(self.costs) / len(self.costs) if self.ok else math.inf


_FAULT_KINDS = ("segfault", "hang", "raise", "wrong")
_START_TIMEOUT_S = 120.0      # a spawned process imports numpy, llvmlite and jitop: generous, not a candidate's
_RUNNER_MAX_CANDIDATES = 2000  # every candidate's code stays linked in the runner: recycle it now and then
_BUILDS_PER_WORKER = 256       # likewise in build workers (a built Module is loaded): restart between batches


@dataclass(frozen=True)
class MeasureOptions:
    """How candidates are measured (AutoTVM's meanings).

    number: runs averaged into one measurement; repeat: measurements per candidate (one cost each);
    min_repeat_ms: a measurement shorter than this is redone with a larger `number`; timeout_s: per
    candidate run, check included; build_timeout_s: per build; build_workers: build processes (default:
    os.cpu_count()); flush_cache: evict the caches before each measurement; check: compare the first run's
    output with the default config's. faults is for TESTING ONLY: (config.to_json(), kind) pairs making that
    config's run misbehave in the runner, kind one of "segfault", "hang", "raise", "wrong".

    >>> MeasureOptions(repeat=5).number
    1
    """

    number: int = 1
    repeat: int = 3
    min_repeat_ms: float = 20.0
    timeout_s: float = 10.0
    build_timeout_s: float = 120.0
    build_workers: int | None = None
    flush_cache: bool = False
    check: bool = True
    faults: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for name in ("number", "repeat"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"MeasureOptions.{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.min_repeat_ms < 0 or self.timeout_s <= 0 or self.build_timeout_s <= 0:
            raise ValueError("MeasureOptions: min_repeat_ms must be >= 0 and the timeouts > 0, got "
                             f"{self.min_repeat_ms}, {self.timeout_s}, {self.build_timeout_s}")
        if self.build_workers is not None and self.build_workers < 1:
            raise ValueError(f"MeasureOptions.build_workers must be >= 1 or None, got {self.build_workers}")
        for config_json, kind in self.faults:
            Config.from_json(config_json)  # raises on text that is no config
            if kind not in _FAULT_KINDS:
                raise ValueError(f"MeasureOptions.faults: kind {kind!r} is not one of {_FAULT_KINDS}")

    def fault_for(self, config: Config) -> str | None:
        """The injected fault of `config` (TESTING ONLY), None for a normal candidate."""
        return next((kind for text, kind in self.faults if Config.from_json(text) == config), None)


@dataclass
class _Built:
    """A build's outcome in the parent: the kernel as plain data, or why there is none."""

    error: ErrorCode
    msg: str = ""
    meta: dict | None = None
    object_code: bytes = b""
    seconds: float = 0.0

    @staticmethod
    def from_reply(reply: dict) -> "_Built":
        if reply["status"] != "ok":
            return _Built(ErrorCode.BUILD_ERROR, reply["msg"], seconds=reply["seconds"])
        return _Built(ErrorCode.NO_ERROR, "", reply["meta"], reply["object_code"], reply["seconds"])


def _failed(code: ErrorCode, msg: str, build_s: float = 0.0, run_s: float = 0.0) -> MeasureResult:
    return MeasureResult((math.inf,), code, msg, build_s, run_s, time.time())


class LocalMeasurer:
    """Builds candidates in parallel worker processes and runs them one at a time, isolated, on this machine.

    `stats` holds the cumulative wall seconds spent building ("build") and measuring ("measure").

    >>> with LocalMeasurer(MeasureOptions(timeout_s=5)) as m:                  # doctest: +SKIP
    ...     [r.ok for r in m.measure([MeasureInput(task, task_default_config)])]
    [True]
    """

    # what the child processes run: build(task_json, config_json), init_build_worker(), ping(), runner_main(conn)
    # (jitop.tuner.measure_gpu's measurer swaps in the GPU's)
    worker_module: Any = worker

    def __init__(self, options: MeasureOptions = MeasureOptions()):
        self.options = options
        self.stats: dict[str, float] = {"build": 0.0, "measure": 0.0}
        self._ctx = multiprocessing.get_context("spawn")  # never fork: jitop's thread pool would be copied
        self._builder = _BuildPool(self._ctx, options.build_workers or os.cpu_count() or 1, self.worker_module)
        self._runner: _Runner | None = None
        self._defaults: dict[str, _Built] = {}   # task key -> the default config's build (the reference)

    def measure(self, inputs: Sequence[MeasureInput],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """Build and run each candidate; one result per input, in the same order. A candidate's failure is
        its result (an error code and infinite cost), never an exception. `on_result(index, result)` is called
        as each result is known (the tuner appends it to the records file at once)."""
        inputs = list(inputs)
        if not inputs:
            return []
        start = time.perf_counter()
        self._start_runner()  # its start-up overlaps the builds; it runs nothing until they are done
        built, failed_defaults = self._build_batch(inputs)
        middle = time.perf_counter()
        self.stats["build"] += middle - start
        results = self._run_batch(inputs, built, failed_defaults, on_result)
        self.stats["measure"] += time.perf_counter() - middle
        return results

    def run_prebuilt(self, inp: MeasureInput, own: "_Built", reference: "_Built | None") -> MeasureResult:
        """Run one candidate built elsewhere (`own`), checked against `reference` (the task's default config's
        build; None without `options.check`): the Dask measurer's workers measure builds from other workers."""
        if own.error != ErrorCode.NO_ERROR:
            return _failed(own.error, own.msg, own.seconds)
        if self.options.check:
            if reference is None or reference.error != ErrorCode.NO_ERROR:
                why = reference.msg if reference is not None else "it was not built"
                return _failed(reference.error if reference is not None else ErrorCode.BUILD_ERROR,
                               f"the default config (the reference output) did not build: {why}", own.seconds)
            self._defaults[inp.task.key] = reference
        start = time.perf_counter()
        result = self._run_one(inp, own, {})
        self.stats["measure"] += time.perf_counter() - start
        return result

    def close(self) -> None:
        """Stop the runner and the build workers (the measurer starts new ones if used again)."""
        self._drop_runner()
        self._builder.close()

    def __enter__(self) -> "LocalMeasurer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- building ------------------------------------------------------------------------------------------

    def _build_batch(self, inputs: list[MeasureInput]) -> tuple[dict[tuple[str, str], _Built], dict[str, _Built]]:
        """(task key, config JSON) -> build, for every candidate, and task key -> failed default build.
        Successful default builds (the references) go into self._defaults; identical candidates build once."""
        jobs: dict[tuple[str, str | None], tuple[str, str | None]] = {}
        for inp in inputs:
            jobs.setdefault((inp.task.key, inp.config.to_json()), (inp.task.to_json(), inp.config.to_json()))
            if self.options.check and inp.task.key not in self._defaults:
                jobs.setdefault((inp.task.key, None), (inp.task.to_json(), None))
        outcomes = dict(zip(jobs, self._builder.run(list(jobs.values()), self.options.build_timeout_s)))
        failed_defaults = {}
        for (key, config_json), outcome in outcomes.items():
            if config_json is None and outcome.error == ErrorCode.NO_ERROR:
                self._defaults[key] = outcome  # only successes are kept: a failure is retried next batch
            elif config_json is None:
                failed_defaults[key] = outcome
        return {k: v for k, v in outcomes.items() if k[1] is not None}, failed_defaults

    # -- running -------------------------------------------------------------------------------------------

    def _run_batch(self, inputs: list[MeasureInput], built: dict[tuple[str, str], _Built],
                   failed_defaults: dict[str, _Built],
                   on_result: Callable[[int, MeasureResult], None] | None) -> list[MeasureResult]:
        results: list[MeasureResult | None] = [None] * len(inputs)
        ref_failures: dict[str, MeasureResult] = {}
        # one task after another: the runner keeps one task's inputs and reference at a time
        first_seen = {key: n for n, key in reversed(list(enumerate(i.task.key for i in inputs)))}
        for n in sorted(range(len(inputs)), key=lambda n: first_seen[inputs[n].task.key]):
            inp = inputs[n]
            own = built[(inp.task.key, inp.config.to_json())]
            if own.error != ErrorCode.NO_ERROR:
                results[n] = _failed(own.error, own.msg, own.seconds)
            elif self.options.check and inp.task.key not in self._defaults:
                ref = failed_defaults[inp.task.key]  # without a reference, a wrong answer would count
                results[n] = _failed(ref.error, f"the default config (the reference output) did not build: {ref.msg}",
                                     own.seconds)
            else:
                results[n] = self._run_one(inp, own, ref_failures)
            if on_result is not None:
                on_result(n, results[n])  # type: ignore[arg-type]
        return results  # type: ignore[return-value]

    def _run_one(self, inp: MeasureInput, own: _Built, ref_failures: dict[str, MeasureResult]) -> MeasureResult:
        key = inp.task.key
        if key in ref_failures:  # do not pay a crash or a timeout per candidate for a broken reference
            failed = ref_failures[key]
            return _failed(failed.error, failed.error_msg, own.seconds)
        runner, trouble = self._ready_runner()
        if runner is None:
            return _failed(ErrorCode.CRASH, trouble, own.seconds)
        if self.options.check and runner.reference_key != key:
            failure = self._send_reference(runner, inp.task)
            if failure is not None:
                ref_failures[key] = failure
                return _failed(failure.error, failure.error_msg, own.seconds)
        start = time.perf_counter()
        reply, code, msg = runner.call(self._run_request(inp, own), self.options.timeout_s)
        run_s = time.perf_counter() - start
        if reply is None or reply.get("restart"):  # restart: the runner's state is broken (a GPU's sticky error)
            self._drop_runner()
        if reply is None:
            return _failed(code, msg, own.seconds, run_s)
        return _from_reply(reply, own.seconds, run_s)

    def _run_request(self, inp: MeasureInput, own: _Built) -> dict:
        o = self.options
        return {"op": "run", "task_key": inp.task.key, "sizes": inp.task.sizes, "meta": own.meta,
                "object_code": own.object_code, **_operands_request(inp.task, inp.config.to_json()),
                "number": o.number, "repeat": o.repeat, "min_repeat_ms": o.min_repeat_ms,
                "flush_cache": o.flush_cache, "check": o.check, "fault": o.fault_for(inp.config)}

    def _send_reference(self, runner: "_Runner", task: Task) -> MeasureResult | None:
        """Have the runner compute the task's reference output; the failure as a result if it cannot."""
        key = task.key
        ref = self._defaults[key]
        request = {"op": "reference", "task_key": key, "sizes": task.sizes, "meta": ref.meta,
                   "object_code": ref.object_code, **_operands_request(task, None)}
        reply, code, msg = runner.call(request, self.options.timeout_s)
        if reply is None:
            self._drop_runner()
            return _failed(code, f"the default config (the reference output) failed: {msg}")
        if reply["status"] != "ok":
            if reply.get("restart"):
                self._drop_runner()
            return _failed(ErrorCode.RUN_ERROR, f"the default config (the reference output) failed: {reply['msg']}")
        runner.reference_key = key
        return None

    def _start_runner(self) -> None:
        if self._runner is not None and (not self._runner.alive() or self._runner.count >= _RUNNER_MAX_CANDIDATES):
            self._drop_runner()
        if self._runner is None:
            self._runner = _Runner(self._ctx, self.worker_module.runner_main)

    def _ready_runner(self) -> tuple["_Runner | None", str]:
        """A runner that said it is ready (started if needed), or None and why not."""
        self._start_runner()
        runner = self._runner
        trouble = runner.wait_ready(_START_TIMEOUT_S)
        if trouble:
            self._drop_runner()
            return None, trouble
        return runner, ""

    def _drop_runner(self) -> None:
        if self._runner is not None:
            self._runner.stop()
            self._runner = None


def _operands_request(task: Task, config_json: str | None) -> dict:
    """What the runner needs to make a candidate's inputs: for constant weights, the task and the config (None:
    the default) to pack them for (see jitop.tuner._operands); nothing otherwise."""
    return {"task": task.to_json(), "config": config_json} if task.constant_weights else {}


def _from_reply(reply: dict, build_s: float, run_s: float) -> MeasureResult:
    status = reply["status"]
    if status == "ok":
        return MeasureResult(tuple(reply["costs"]), ErrorCode.NO_ERROR, "", build_s, run_s, time.time())
    code = ErrorCode.WRONG_ANSWER if status == "wrong_answer" else ErrorCode.RUN_ERROR
    return _failed(code, reply["msg"], build_s, run_s)


class _Runner:
    """The parent's handle on the runner process: send a request, wait for its answer or kill it."""

    def __init__(self, ctx: Any, main: Callable[[Any], None] = worker.runner_main):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=main, args=(child,), daemon=True, name="jitop-measure-runner")
        self.process.start()
        child.close()  # only the child holds its end now, so its death reads as EOF here
        self.ready = False
        self.reference_key: str | None = None  # the task whose reference output the runner holds
        self.count = 0

    def alive(self) -> bool:
        return self.process.is_alive()

    def wait_ready(self, timeout: float) -> str:
        """'' once the runner has started, else why it did not."""
        if self.ready:
            return ""
        reply, _, msg = self.call(None, timeout)
        if reply is None or reply.get("status") != "ready":
            return f"the runner process did not start: {msg or reply}"
        self.ready = True
        return ""

    def call(self, request: dict | None, timeout: float) -> tuple[dict | None, ErrorCode, str]:
        """Send `request` (None: only wait) and return (reply, NO_ERROR, ''), or (None, TIMEOUT|CRASH, why)."""
        try:
            if request is not None:
                self.count += 1
                self.conn.send(request)
            if not self.conn.poll(timeout):
                self.stop()
                return None, ErrorCode.TIMEOUT, f"no answer within {timeout:g} s (killed)"
            return self.conn.recv(), ErrorCode.NO_ERROR, ""
        except (EOFError, OSError):
            return None, ErrorCode.CRASH, f"the runner process died ({self._death()})"

    def _death(self) -> str:
        self.process.join(5.0)  # the pipe closes as the process exits: its exit code follows at once
        code = self.process.exitcode
        if code is None:
            self.stop()
            return "its pipe closed"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def stop(self) -> None:
        """Kill the runner (SIGKILL: it may be hung in native code) and reap it."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10.0)
        self.conn.close()


class _BuildPool:
    """A lazily started, reused pool of spawned build workers with a timeout per build."""

    def __init__(self, ctx: Any, workers: int, module: Any = worker):
        self._ctx, self.workers, self._module = ctx, workers, module  # module: what the workers run (see LocalMeasurer)
        self._pool: ProcessPoolExecutor | None = None
        self._builds = 0   # builds since the pool started

    def run(self, jobs: list[tuple[str, str | None]], timeout: float) -> list[_Built]:
        """Build every (task JSON, config JSON or None for the default); outcomes in the same order."""
        if self._builds > _BUILDS_PER_WORKER * self.workers:
            self.close()  # between batches, so no build's time includes a restart
        run = _BuildRun(jobs, timeout)
        self._builds += len(jobs)
        while not run.finished():
            self._submit_ready(run)
            self._collect(run)
        return run.outcomes  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the workers (they are idle between batches) and wait for them to exit."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._builds = None, 0

    def _get(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=self._ctx,
                                             initializer=self._module.init_build_worker)
            # start every worker now, so no build's timeout includes a process start-up
            wait([self._pool.submit(self._module.ping) for _ in range(self.workers)], timeout=_START_TIMEOUT_S)
        return self._pool

    def _submit_ready(self, run: "_BuildRun") -> None:
        # one build per worker at most, so a build starts when it is submitted and its deadline is its own;
        # a suspect (in flight when a worker died) runs alone, so a second death names it
        while run.pending or run.suspects:
            if run.suspects:
                if run.inflight:
                    return
                index, alone = run.suspects.popleft(), True
            elif len(run.inflight) < self.workers:
                index, alone = run.pending.popleft(), False
            else:
                return
            future = self._submit(run.jobs[index])
            if future is None:
                run.outcomes[index] = _Built(ErrorCode.BUILD_ERROR, "the build worker processes could not be started")
                continue
            run.inflight[future] = (index, time.monotonic() + run.timeout, alone)
            if alone:
                return

    def _submit(self, job: tuple[str, str | None]) -> Future | None:
        # a worker may have died while idle (the pool then refuses work): start a fresh pool, a few times
        for _ in range(3):
            try:
                return self._get().submit(self._module.build, *job)
            except BrokenProcessPool:
                self._kill()
        return None

    def _collect(self, run: "_BuildRun") -> None:
        if not run.inflight:
            return
        next_deadline = min(deadline for _, deadline, _ in run.inflight.values())
        done, _ = wait(run.inflight, timeout=max(0.0, next_deadline - time.monotonic()), return_when=FIRST_COMPLETED)
        broken = False
        for future in done:
            index, _, alone = run.inflight.pop(future)
            try:
                run.outcomes[index] = _Built.from_reply(future.result())
            except BrokenProcessPool:
                broken = True
                run.worker_died(index, alone)
            except Exception as err:  # noqa: BLE001 - e.g. a reply that does not pickle: still the candidate's
                run.outcomes[index] = _Built(ErrorCode.BUILD_ERROR, f"{type(err).__name__}: {err}")
        overdue = [f for f, (_, deadline, _) in run.inflight.items() if deadline <= time.monotonic()]
        for future in overdue:
            index, _, _ = run.inflight.pop(future)
            run.outcomes[index] = _Built(ErrorCode.BUILD_TIMEOUT, f"the build took longer than {run.timeout:g} s "
                                         "(its worker was killed)", seconds=run.timeout)
        if overdue or broken:
            self._kill()  # a running build cannot be cancelled: kill the pool; the others go again
            run.requeue_inflight(suspect=broken)

    def _kill(self) -> None:
        pool, self._pool, self._builds = self._pool, None, 0
        if pool is None:
            return
        processes = list(getattr(pool, "_processes", {}).values())
        for p in processes:
            if p.is_alive():
                p.kill()
        pool.shutdown(wait=True, cancel_futures=True)
        for p in processes:
            p.join(10.0)


@dataclass
class _BuildRun:
    """Book-keeping of one batch's builds."""

    jobs: list[tuple[str, str | None]]
    timeout: float
    outcomes: list[_Built | None] = field(default_factory=list)
    pending: deque = field(default_factory=deque)
    suspects: deque = field(default_factory=deque)
    inflight: dict[Future, tuple[int, float, bool]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.outcomes = [None] * len(self.jobs)
        self.pending = deque(range(len(self.jobs)))

    def finished(self) -> bool:
        return not (self.pending or self.suspects or self.inflight)

    def worker_died(self, index: int, alone: bool) -> None:
        if alone:  # it ran by itself and its worker died: this build killed it
            self.outcomes[index] = _Built(ErrorCode.BUILD_ERROR, "the build worker process died building this "
                                          "config (a crash in LLVM or the code generator, or out of memory)")
        else:
            self.suspects.append(index)

    def requeue_inflight(self, suspect: bool) -> None:
        """Builds cut short by killing the pool run again: alone if the pool broke under them (one of
        them may have broken it), as usual if another build timed out."""
        for index, _, alone in self.inflight.values():
            if suspect:
                self.worker_died(index, alone)
            else:
                self.pending.appendleft(index)
        self.inflight.clear()
