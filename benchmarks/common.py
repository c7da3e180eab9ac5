"""Shared helpers for the benchmarks: timing, machine description, numpy under both OpenBLAS settings
(matmul and an im2col conv2d), markdown tables."""
from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from typing import Any, Callable, Iterator, Sequence

import numpy as np


def best_of(fn: Callable[[], object], repeat: int = 7, number: int = 1) -> float:
    """Best wall time of one call (seconds), after one warm-up call."""
    fn()
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def versions(*packages: str) -> str:
    """'name version' of each package, or 'name not installed'."""
    parts = []
    for name in packages:
        try:
            parts.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{name} not installed")
    return ", ".join(parts)


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown CPU" elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def lscpu_model() -> str:
    """The CPU's model name as lscpu prints it (else cpu_name())."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration, subprocess.SubprocessError):
        return cpu_name()


def interleaved_times(calls: dict[str, Callable[[], Any]], repeat: int, rounds: int = 5,
                      settle_s: float = 0.05) -> dict[str, tuple[float, float]]:
    """{name: (median, best) seconds} of `repeat` single calls of each, taken in `rounds` rounds that visit
    every implementation in turn (each block after one warm-up call): a machine whose speed drifts (a
    shared VM) biases no implementation, as timing one after the other would. Before each block the process
    sleeps `settle_s`, so the previous implementation's spinning worker threads have gone idle (onnxruntime's
    spin after a run and would take cores from the next block's first calls)."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    per_round = max(1, math.ceil(repeat / rounds))
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            for name, call in calls.items():
                time.sleep(settle_s)
                call()
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    call()
                    samples[name].append(time.perf_counter() - t0)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: (statistics.median(ts), min(ts)) for name, ts in samples.items()}


def median_time(call: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """(median, best) seconds of `repeat` single calls after one warm-up call, the garbage collector off."""
    call()
    times = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
    finally:
        if gc_was_enabled:
            gc.enable()
    return statistics.median(times), min(times)


def machine() -> str:
    """The CPU, the jitop Target the benchmarks build for (Target.current(): the host, or JITOP_CPU) with the
    FP32 peak measured at the start of this run (peak.py), and the library settings."""
    cpu = cpu_name()
    from jitop import Target
    from peak import peak
    override = os.environ.get("JITOP_CPU")
    chosen = f"JITOP_CPU={override}" if override else "host"
    return (f"{cpu}, {os.cpu_count()} cores; Target ({chosen}): {Target.current().describe()}; {peak().describe()}; "
            f"Python {platform.python_version()}, numpy {np.__version__}, "
            f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")


def peak_gflops(threads: int | None = None) -> float | None:
    """The FP32 peak measured in this run for `threads` threads (default: the Target's), None if not measured."""
    from jitop import Target
    from peak import peak
    return peak().per_thread(threads or Target.current().threads)


def pct_of_peak(gflops: object, peak: float | None) -> str:
    """'87%' of `peak`, or 'n/a'."""
    return f"{gflops / peak * 100:.0f}%" if isinstance(gflops, float) and peak else "n/a"


def best_time(fn: Callable[[], object], repeat: int = 7, min_total: float = 0.5, max_calls: int = 20000) -> float:
    """Best wall time of one call (seconds), after one warm-up call: the minimum over single calls, at least
    `repeat` of them and, for short calls, as many as fit in `min_total` seconds (at most `max_calls`); the
    garbage collector is off meanwhile, as in timeit. Single calls over a stretch of time rather than a few
    batches: on a shared machine the minimum then finds calls nothing interrupted, and a library whose worker
    threads take a while to come up to speed (torch's first ~10 small calls take ~15 ms each here) is timed
    once they have."""
    fn()
    best, calls = math.inf, 0
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        end = time.perf_counter() + min_total
        while calls < max_calls and (calls < repeat or time.perf_counter() < end):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
            calls += 1
    finally:
        if gc_was_enabled:
            gc.enable()
    return best


def run_with_coretype(code: str, args: Sequence[object], coretype: str | None) -> Any:
    """Run `code` in a fresh Python with OPENBLAS_CORETYPE set to `coretype` (None: unset) and return the JSON
    it prints. `args` arrive as sys.argv[1:]; the benchmarks directory is on sys.path (`from common import ...`)."""
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    prelude = f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
    out = subprocess.run([sys.executable, "-c", prelude + code, *map(str, args)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


# numpy is measured under both OpenBLAS settings: (column label, OPENBLAS_CORETYPE; None: unset)
CORETYPES = (("Haswell", "Haswell"), ("unset", None))

_OPENBLAS_CORE = """
import ctypes, glob, json, os, numpy as np
name = "unknown"
libs = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
for path in glob.glob(os.path.join(libs, "*openblas*")):
    lib = ctypes.CDLL(path)
    for sym in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                "openblas_get_corename"):
        f = getattr(lib, sym, None)
        if f is not None:
            f.restype = ctypes.c_char_p
            name = f().decode()
            break
print(json.dumps(name))
"""

_cores: dict[str | None, str] = {}


def openblas_core(coretype: str | None) -> str:
    """The kernel set OpenBLAS (numpy's) picks with OPENBLAS_CORETYPE=`coretype` (None: unset, what it detects),
    e.g. 'Haswell' or 'SkylakeX'; 'unknown' where it cannot be asked."""
    if coretype not in _cores:
        try:
            _cores[coretype] = run_with_coretype(_OPENBLAS_CORE, [], coretype)
        except Exception:  # no bundled OpenBLAS (numpy on another BLAS): say so, the timing still runs
            _cores[coretype] = "unknown"
    return _cores[coretype]


def numpy_label(coretype: str | None, short: bool = False) -> str:
    """Label of numpy under an OpenBLAS setting, naming the kernels OpenBLAS detects when it is unset:
    'numpy (OPENBLAS_CORETYPE unset: SkylakeX)', short 'numpy (unset: SkylakeX)'."""
    setting = f"={coretype}" if coretype else f" unset: {openblas_core(None)}"
    return f"numpy ({setting.lstrip('= ')})" if short else f"numpy (OPENBLAS_CORETYPE{setting})"


_NUMPY_MATMUL = """
import json, sys, numpy as np
from common import best_time
n, m, k, repeat = map(int, sys.argv[1:5])
a = np.random.rand(n, k).astype(np.float32); b = np.random.rand(k, m).astype(np.float32)
print(json.dumps(best_time(lambda: a @ b, repeat)))
"""


def numpy_matmul_seconds(n: int, m: int, k: int, coretype: str | None, repeat: int = 7) -> float:
    """np.matmul time of (n, k) @ (k, m) float32 in a fresh process with OPENBLAS_CORETYPE set to `coretype`
    (None: unset)."""
    return run_with_coretype(_NUMPY_MATMUL, [n, m, k, repeat], coretype)


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, (int, np.integer)) else (int(v[0]), int(v[1]))


class Im2colConv2d:
    """conv2d as numpy users write it: im2col into a buffer allocated once, then one sgemm.

    torch.nn.functional.conv2d's semantics for NCHW input, (OC, IC, KH, KW) weight, groups=1, no bias.
    A call copies the input into a zero-bordered buffer (when padded), copies the KH*KW shifted (strided)
    windows into the (N, IC*KH*KW, OH*OW) column matrix, and multiplies (OC, IC*KH*KW) @ columns.
    """

    def __init__(self, x_shape: Sequence[int], w_shape: Sequence[int], stride: int | Sequence[int] = 1,
                 padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, dtype: Any = np.float32):
        n, c, h, w = x_shape
        oc, ic, kh, kw = w_shape
        if ic != c:
            raise ValueError(f"Im2colConv2d: input has {c} channels, weight expects {ic} (groups=1 only)")
        (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
        oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        self.out_shape = (n, oc, oh, ow)
        self.padded = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype) if ph or pw else None  # borders stay 0
        self.cols = np.empty((n, c, kh, kw, oh, ow), dtype)
        self.inner = (slice(None), slice(None), slice(ph, ph + h), slice(pw, pw + w))
        self.windows = [(i, j, (slice(None), slice(None), slice(i * dh, i * dh + sh * (oh - 1) + 1, sh),
                                slice(j * dw, j * dw + sw * (ow - 1) + 1, sw)))
                        for i in range(kh) for j in range(kw)]

    def __call__(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        n, oc, oh, ow = self.out_shape
        src = x
        if self.padded is not None:
            self.padded[self.inner] = x
            src = self.padded
        cols = self.cols
        for i, j, window in self.windows:
            cols[:, :, i, j] = src[window]
        w2 = weight.reshape(oc, -1)
        if n == 1:
            return np.matmul(w2, cols.reshape(-1, oh * ow)).reshape(self.out_shape)
        return np.matmul(w2, cols.reshape(n, -1, oh * ow)).reshape(self.out_shape)


_NUMPY_CONV2D = """
import json, sys, numpy as np
from common import Im2colConv2d, best_time
n, c, h, w, oc, kh, kw, sh, sw, ph, pw, repeat = map(int, sys.argv[1:13])
x = np.random.rand(n, c, h, w).astype(np.float32); wt = np.random.rand(oc, c, kh, kw).astype(np.float32)
conv = Im2colConv2d(x.shape, wt.shape, (sh, sw), (ph, pw))
print(json.dumps(best_time(lambda: conv(x, wt), repeat)))
"""


def numpy_conv2d_seconds(x_shape: Sequence[int], w_shape: Sequence[int], stride: int | Sequence[int],
                         padding: int | Sequence[int], coretype: str | None, repeat: int = 7) -> float:
    """Im2colConv2d time (float32, NCHW) in a fresh process with OPENBLAS_CORETYPE set to `coretype` (None: unset)."""
    return run_with_coretype(_NUMPY_CONV2D, [*x_shape, w_shape[0], *w_shape[2:], *_pair(stride), *_pair(padding),
                                             repeat], coretype)


def busy_cores(seconds: float = 0.5) -> float | None:
    """Cores kept busy by other processes: /proc/stat sampled while this process sleeps `seconds` (None off Linux).
    Unlike the load average it does not remember a benchmark that ran just before."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
        return sum(ticks[:8]), ticks[3] + ticks[4]  # (total, idle + iowait); guest time is inside user
    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 == total0:
        return 0.0
    return (1 - (idle1 - idle0) / (total1 - total0)) * (os.cpu_count() or 1)


def table(headers: list[str], rows: list[list[object]]) -> str:
    """A markdown table."""
    def fmt(x: object) -> str:
        return f"{x:.1f}" if isinstance(x, float) else str(x)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


@contextlib.contextmanager
def bench_process(name: str) -> Iterator[None]:
    """A benchmark's process: 2 threads for jitop and OpenBLAS unless set, and a temporary JITOP_CACHE_DIR of its
    own (the workload log's flush at exit is turned off, so it never writes to the removed directory)."""
    os.environ.setdefault("JITOP_NUM_THREADS", "2")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
    with tempfile.TemporaryDirectory(prefix=f"jitop-bench-{name}-") as cache:
        os.environ["JITOP_CACHE_DIR"] = cache
        try:
            yield
        finally:
            os.environ["JITOP_CACHE"] = "0"
