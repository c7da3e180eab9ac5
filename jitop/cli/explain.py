"""`jitop explain prog.py [-- args]`: run a program, then report per decorated function and signature what
jitop did: fused kernels, template choices and where they came from, the disk cache's answer and why, and
each kernel's time against the Target's peak and memory bandwidth (a roofline position).

The time is the median of several calls with the arguments of the signature's first call, after a warm-up
call (not the first call, with its page faults and cold caches); the peak and the bandwidth are measured on
this machine once per Target and kept in the cache (jitop.tuner.peak: FMA chains and a multi-threaded STREAM
triad built by jitop)."""
from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any, Callable

import numpy as np

from jitop.cli.common import CommandError, run_script
from jitop.runtime.args import compile_dim

MIN_CALLS, MAX_CALLS, TIMING_SECONDS = 5, 100, 0.3  # per signature: at least 5 calls, more while under 0.3 s


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `jitop explain`."""
    p = sub.add_parser("explain", help="run a program (or an ONNX model) and report what jitop compiled, cached "
                                       "and how fast it ran",
                       usage="jitop explain [-h] SCRIPT [-- SCRIPT_ARGS ...] | MODEL.onnx [--shape NAME=D0,D1,...] "
                             "[--full] [--no-profile]",
                       description="Run SCRIPT once (as `python SCRIPT SCRIPT_ARGS` would), then report per "
                                   "@jitop.kernel function and signature: kernels, configs and their source, the "
                                   "cache's answer, and each kernel's median time against the FP32 peak and the "
                                   "memory bandwidth measured on this machine.",
                       epilog="The script's own arguments go after --: jitop explain prog.py -- --epochs 3. "
                              "For a model (.onnx, .jitop): its operators, fused kernel, tasks and their schedule "
                              "sources, time against the peak, and time per loop nest.")
    p.add_argument("script", metavar="SCRIPT", help="the Python program to run, or an ONNX model (.onnx, .jitop)")
    from jitop.cli.models import add_shape_option
    add_shape_option(p)
    p.add_argument("--full", action="store_true", help="a model: the whole explain text (traced graph, loop IR)")
    p.add_argument("--no-profile", action="store_true", help="a model: no per-loop-nest profile (a second build)")
    p.set_defaults(run=run, script_args=[], takes_script_args=True)


def run(args: argparse.Namespace) -> int:
    """Run the program, then describe every compiled signature of every @jitop.kernel function (a model:
    jitop.cli.models.explain_command)."""
    from jitop.cli import models
    if models.is_model_path(args.script):
        return models.explain_command(args)
    if args.shape or args.full or args.no_profile:
        raise CommandError("--shape, --full and --no-profile apply to a model (jitop explain model.onnx), not to "
                           f"a script; the script's own arguments go after --: jitop explain {args.script} -- ...")
    from jitop import dispatch, workloads
    first = _FirstCalls()
    with dispatch.on_first_call(first.record):
        run_script(args.script, list(args.script_args), usage="jitop explain prog.py")
    kernels = sorted((d for d in dispatch.dispatchers() if d.signatures()), key=lambda d: d.name)
    if not kernels:
        print(f"{args.script} ran no @jitop.kernel function (nothing was compiled)")
        return 0
    workloads.flush()  # the script's calls go to the workload log; the timing calls below do not
    entries = [ov for d in kernels for ov in d.overloads()]
    calls = {id(ov): ov.served for ov in entries}
    # a GPU kernel is not timed: a wall-clock loop of its launches measures the queue, not the GPU
    times = {id(ov): None if _on_gpu(ov) else first.median_seconds(ov) for ov in entries}
    for d in kernels:
        d.drain()  # marks the timing calls as logged: they were explain's, not the program's
    target, peak, bandwidth = roofline(entries, times)
    for d in kernels:
        for key, entry in list(d.signatures().items()):
            print(_describe(d.name, key, entry, calls.get(id(entry), 0), times.get(id(entry)), peak, bandwidth, target))
    return 0


def roofline(entries: list, times: dict) -> tuple[Any, float | None, float | None]:
    """Print the Target and the roofline (peak and bandwidth measured on this machine, measured again if one of
    the timed `entries` beats them); returns (target, peak GFLOP/s per thread count, bandwidth GB/s)."""
    from jitop.driver import default_target
    from jitop.tuner.peak import machine_peak, triad_array_bytes
    target = default_target()
    fastest = max((_gflops(e, times.get(id(e))) for e in entries), default=0.0)
    streaming = max((_nbytes(e) / times[id(e)][0] / 1e9 for e in entries  # as much data as the triad moves
                     if times.get(id(e)) and (_nbytes(e) or 0) >= 3 * triad_array_bytes(target)), default=0.0)
    try:  # a kernel beating the stored peak or bandwidth makes them be measured again
        measured = machine_peak(target, at_least=fastest or None, at_least_gbs=streaming or None)
    except Exception as err:  # noqa: BLE001 - the report goes on without the roofline
        print(f"roofline: not measured ({type(err).__name__}: {err})\n")
        measured = None
    peak = measured.per_thread(target.threads) if measured else None
    bandwidth = measured.bandwidth_gbs if measured else None
    print(f"target: {target.describe()}")
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(measured.measured_at)) if measured else ""
    print("roofline: " + (f"peak {peak:.{0 if peak >= 10 else 2}f} GFLOP/s (measured on this machine {when}: "
                          f"{measured.accumulators} chains of <{measured.lanes} x float> {measured.op} on "
                          f"{measured.threads} threads)"
                          if peak else f"peak unknown ({measured.note if measured else 'not measured'})")
          + (f", {measured.describe_bandwidth()}" if bandwidth else ", memory bandwidth unknown") + "\n")
    return target, peak, bandwidth


class _FirstCalls:
    """While the script runs: how to call each overload again with its first call's arguments (the call that
    compiled it or found it in the cache), to time the signature afterwards."""

    def __init__(self) -> None:
        self.calls: dict[int, tuple[Any, Callable[[], Any]]] = {}  # id(overload) -> (overload, rerun)

    def record(self, dispatcher: Any, ov: Any, rerun: Callable[[], Any]) -> None:
        """jitop.dispatch.on_first_call's hook."""
        self.calls.setdefault(id(ov), (ov, rerun))

    def median_seconds(self, entry: Any) -> tuple[float, int] | None:
        """(median seconds of one call, calls timed) with the first call's arguments, after a warm-up call;
        None if the signature's arguments were not seen or a call raises."""
        found = self.calls.get(id(entry))
        if found is None or found[0] is not entry:
            return None
        rerun = found[1]
        try:
            rerun()  # warm-up: caches, pages and the native entry
            times: list[float] = []
            stop = time.perf_counter() + TIMING_SECONDS
            while len(times) < MIN_CALLS or (len(times) < MAX_CALLS and time.perf_counter() < stop):
                t0 = time.perf_counter()
                rerun()
                times.append(time.perf_counter() - t0)
        except Exception:  # noqa: BLE001 - e.g. the script changed a captured global: no median, say so
            return None
        return statistics.median(times), len(times)


def _describe(name: str, key: tuple, entry, calls: int, timed: tuple[float, int] | None, peak: float | None,
              bandwidth: float | None, target: Any) -> str:
    from jitop.dispatch import FALLBACK
    head = f"{name}({_signature(key)})"
    if entry is FALLBACK:
        return f"{head}\n  runs as plain numpy (an unsupported construct; see the warning)\n"
    exe = entry.exe
    if _on_gpu(entry):
        return _describe_gpu(head, entry, calls)
    lines = [head, f"  {len(exe.groups)} loop nest(s) in one kernel; "
                   f"calls: {calls}"]
    if getattr(entry, "accepts", None) is not None:  # one kernel for every size its guards allow
        lines.append(f"  symbolic shapes: {_traced_at(entry, 'timed')}; checks {'; '.join(exe.plan.guards)}")
    lines += [f"  {t}" for t in exe.templates]
    lookup = entry.lookup
    if lookup is not None:
        lines.append("  cache: " + lookup.describe().splitlines()[0])
    lines.append("  " + _speed(entry, timed, peak, bandwidth, target))
    return "\n".join(lines) + "\n"


def _on_gpu(entry: Any) -> bool:
    """Whether a signature runs on the GPU (a jitop.graph.gpu.GpuExecutable)."""
    return entry is not None and hasattr(getattr(entry, "exe", None), "function")


def _describe_gpu(head: str, entry: Any, calls: int) -> str:
    """A GPU kernel's entry: its launches and symbols (it is not timed)."""
    exe = entry.exe
    kernels = exe.function.built.kernels
    lines = [head, f"  {len(kernels)} launch(es) of {len({k.name for k in kernels})} GPU kernel(s) for "
                   f"{exe.function.target.arch}; calls: {calls}"]
    if entry.accepts is not None:
        lines.append(f"  symbolic shapes: {_traced_at(entry, 'traced')}; checks {'; '.join(g for g, _ in exe.guards)}")
    lines.append("  time: not measured for GPU kernels here (CUDA events: jitop.cuda.Event; "
                 "benchmarks/bench_gpu.py)")
    return "\n".join(lines) + "\n"


def _traced_at(entry: Any, verb: str) -> str:
    """Where a symbolic signature's sizes come from: its trace's call, or a warm record (no trace, no sizes)."""
    if entry.trace.recorded:
        return "found through a warm record (not traced in this process)"
    return f"{verb} at " + ", ".join(f"{k} = {v}" for k, v in entry.trace.sizes.items())


def _signature(key: tuple) -> str:
    parts = []
    for part in key:
        if len(part) == 2 and isinstance(part[0], np.dtype):
            parts.append(f"{part[0].name}{list(part[1])}")
        else:
            parts.append(str(part[-1]) if part else "?")
    return ", ".join(parts)


def _ms(seconds: float) -> str:
    """Milliseconds with 4 significant digits below 1 ms (a 5 us kernel is 0.005012, not 0.005)."""
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms >= 1 else f"{ms:.4g}"


def _nbytes(entry: Any) -> int | None:
    """Bytes of a signature's arguments and results (what one call must read and write at least); None for a
    symbolic one found through a warm record (its traced sizes are unknown)."""
    plan = entry.exe.plan
    sizes = getattr(entry.trace, "sizes", {})  # a symbolic kernel's dims at its first call

    def count(shape: tuple) -> int:
        return math.prod(d if isinstance(d, int) else compile_dim(d)(sizes) for d in shape)
    real = plan.outputs[:len(plan.outputs) - plan.n_scratch]  # scratch buffers stay in cache, mostly
    try:
        nbytes = sum(count(s) * np.dtype(d).itemsize for s, d in real)
        return nbytes + sum(count(p.shape) * p.dtype.itemsize for p in entry.exe.module.params if not p.is_output)
    except KeyError:
        return None


def _gflops(entry: Any, timed: tuple[float, int] | None) -> float:
    """GFLOP/s of a signature's median time (0 without one or without flops)."""
    if timed is None or getattr(entry, "tasks", None) is None:
        return 0.0
    return _flops(entry) / timed[0] / 1e9


def _flops(entry: Any) -> int:
    """Flops of one call at the sizes explain times it (a symbolic kernel: its first call's; 0 for one found
    through a warm record, whose traced sizes are unknown)."""
    if entry.trace.recorded and getattr(entry, "accepts", None) is not None:
        return 0
    at_call = getattr(entry.trace, "flops", None)
    return at_call if at_call is not None else sum(task.flops for task in entry.tasks)


def _speed(entry, timed: tuple[float, int] | None, peak: float | None, bandwidth: float | None, target: Any) -> str:
    if timed is not None:
        t, calls = timed
        text = f"time {_ms(t)} ms (median of {calls} calls)"
    elif entry.seconds is not None and entry.seconds > 0:
        t = entry.seconds
        text = f"time {_ms(t)} ms (its first call only: its arguments could not be called again)"
    else:
        return "time: not measured"
    flops = _flops(entry)
    nbytes = _nbytes(entry)
    if flops:
        gf = flops / t / 1e9
        text += f", {gf:.1f} GFLOP/s" + (f" = {100 * gf / peak:.0f}% of peak" if peak else "")
    if nbytes is None:
        return text
    gb = nbytes / t / 1e9
    text += f", {gb:.1f} GB/s of arguments and results"
    if bandwidth:
        from jitop.tuner.peak import triad_array_bytes
        text += f" = {100 * gb / bandwidth:.0f}% of memory bandwidth"
        l2 = target.l2_bytes * max(target.threads, 1)
        if nbytes <= l2:
            text += " (they fit in the L2 caches: more than 100% is possible)"
        elif nbytes < 3 * triad_array_bytes(target):
            text += " (less than the triad moves: partly served by the L3, more than 100% is possible)"
    return text
