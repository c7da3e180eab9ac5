"""`jitop explain prog.py [args]`: run a program, then report per decorated function and signature what
jitop did: fused kernels, template choices and where they came from, the disk cache's answer and why, and
each kernel's time against the Target's peak and memory bandwidth (a roofline position)."""
from __future__ import annotations

import argparse
import time

import numpy as np

from jitop.cli.common import run_script


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `jitop explain`."""
    p = sub.add_parser("explain", help="run a program and report what jitop compiled, cached and how fast it ran")
    p.add_argument("script", help="the Python program to run")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the program, then describe every compiled signature of every @jitop.kernel function."""
    from jitop.kernel import _ALL_KERNELS
    run_script(args.script, list(args.script_args), usage="jitop explain prog.py")
    kernels = sorted((k for k in list(_ALL_KERNELS) if k.cache), key=lambda k: k.qualified_name)
    if not kernels:
        print(f"{args.script} ran no @jitop.kernel function (nothing was compiled)")
        return 0
    from jitop.driver import default_target
    from jitop.tuner.report import nominal_peak_gflops
    target = default_target()
    peak, bandwidth = nominal_peak_gflops(target), _bandwidth_gbs()
    print(f"target: {target.describe()}")
    print(f"roofline: peak {f'{peak:.0f} GFLOP/s (nominal)' if peak else 'unknown (FMA units of this CPU not known)'}"
          f", memory bandwidth {bandwidth:.1f} GB/s (measured now, numpy copy)\n")
    for kf in kernels:
        for key, entry in list(kf.cache.items()):
            print(_describe(kf, key, entry, peak, bandwidth))
    return 0


def _describe(kf, key: tuple, entry, peak: float | None, bandwidth: float) -> str:
    from jitop.kernel import _FALLBACK, signature_calls
    head = f"{kf.qualified_name}({_signature(key)})"
    if entry is _FALLBACK:
        return f"{head}\n  runs as plain numpy (an unsupported construct; see the warning)\n"
    exe = entry.exe
    lines = [head, f"  {len(exe.groups)} loop nest(s) in one kernel; "
                   f"calls: {signature_calls(entry, kf._fast_specs.get(key))}"]
    lines += [f"  {t}" for t in exe.templates]
    lookup = entry.lookup
    if lookup is not None:
        lines.append("  cache: " + lookup.describe().splitlines()[0])
    lines.append("  " + _speed(entry, peak, bandwidth))
    return "\n".join(lines) + "\n"


def _signature(key: tuple) -> str:
    parts = []
    for part in key:
        if len(part) == 2 and isinstance(part[0], np.dtype):
            parts.append(f"{part[0].name}{list(part[1])}")
        else:
            parts.append(str(part[-1]) if part else "?")
    return ", ".join(parts)


def _speed(entry, peak: float | None, bandwidth: float) -> str:
    if entry.seconds is None or entry.seconds <= 0:
        return "time: not measured"
    t = entry.seconds
    flops = sum(task.flops for task in entry.tasks)
    plan = entry.exe.plan
    real = plan.outputs[:len(plan.outputs) - plan.n_scratch]  # scratch buffers stay in cache, mostly
    nbytes = sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in real)
    nbytes += sum(int(np.prod(p.shape)) * p.dtype.itemsize for p in entry.exe.module.params if not p.is_output)
    text = f"time {t * 1e3:.3f} ms (one measured call)"
    if flops:
        gf = flops / t / 1e9
        text += f", {gf:.1f} GFLOP/s" + (f" = {100 * gf / peak:.0f}% of peak" if peak else "")
    gb = nbytes / t / 1e9
    text += f", {gb:.1f} GB/s of arguments and results = {100 * gb / bandwidth:.0f}% of memory bandwidth"
    return text


def _bandwidth_gbs() -> float:
    """Memory bandwidth as numpy's copy of 64 MiB sees it (read + write), best of 3."""
    src = np.ones(1 << 24, np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9
