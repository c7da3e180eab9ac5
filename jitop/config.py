"""Every JITOP_* environment knob, read in one place."""
from __future__ import annotations

import os
import re
import sys
import warnings


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw) if raw.strip() else default
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be an integer") from None


def num_threads() -> int:
    """Threads for parallel loops: JITOP_NUM_THREADS, else OMP_NUM_THREADS (its first level), else all cores."""
    for name in ("JITOP_NUM_THREADS", "OMP_NUM_THREADS"):
        raw = os.environ.get(name, "").strip()
        if not raw:
            continue
        try:
            n = int(raw.split(",")[0])
        except ValueError:
            n = 0
        if n >= 1:
            return n
        warnings.warn(f"ignoring {name}={raw!r}: expected a positive integer", RuntimeWarning, stacklevel=2)
    return os.cpu_count() or 1


def opt_level() -> int:
    """LLVM optimisation level for generated kernels (JITOP_OPT_LEVEL, default 3)."""
    return _env_int("JITOP_OPT_LEVEL", 3)


def compile_jobs() -> int:
    """Processes that compile one large kernel's parts, or a large GPU function's kernels (JITOP_COMPILE_JOBS;
    default: the CPUs this process may run on, at most 4); 1 compiles in this process only (jitop.codegen.forked,
    jitop.codegen.ptx_shares)."""
    raw = os.environ.get("JITOP_COMPILE_JOBS", "").strip()
    if raw:
        if raw.isdigit() and int(raw) >= 1:
            return int(raw)
        warnings.warn(f"ignoring JITOP_COMPILE_JOBS={raw!r}: expected a positive integer", RuntimeWarning, stacklevel=2)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(cpus, 4)


def cpu_override() -> str:
    """JITOP_CPU: build for this CPU instead of the host ("haswell", "x86-64-v3" or "llvm -mcpu=... -mattr=...")."""
    return os.environ.get("JITOP_CPU", "").strip()


def full_tracebacks() -> bool:
    """Show jitop's internal frames in errors (JITOP_FULL_TRACEBACKS=1)."""
    return _env_int("JITOP_FULL_TRACEBACKS", 0) != 0


def parallel_min_work() -> int:
    """Below this many scalar loop iterations a parallel loop runs on one thread (JITOP_PARALLEL_MIN_WORK)."""
    return _env_int("JITOP_PARALLEL_MIN_WORK", 1 << 15)


def cache_dir() -> str:
    """Directory of the persistent cache: JITOP_CACHE_DIR, else the platform's user cache directory
    ($XDG_CACHE_HOME or ~/.cache on Linux, ~/Library/Caches on macOS, %LOCALAPPDATA% on Windows) + /jitop."""
    explicit = os.environ.get("JITOP_CACHE_DIR", "").strip()
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    if sys.platform == "darwin":
        base = os.path.expanduser("~/Library/Caches")
    elif os.name == "nt":
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~/AppData/Local")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "jitop")


def cache_enabled() -> bool:
    """JITOP_CACHE=0 disables the persistent cache (everything is compiled in memory, nothing is read or written)."""
    return _env_int("JITOP_CACHE", 1) != 0


_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
               "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def cache_size() -> int:
    """Size limit of the persistent cache in bytes (JITOP_CACHE_SIZE: bytes, or "500MB", "2G"; default 2 GiB);
    least-recently-used entries are evicted beyond it."""
    return _env_size("JITOP_CACHE_SIZE", 2 << 30)


def cuda_pool_limit() -> int:
    """Bytes of freed GPU memory jitop keeps for reuse (JITOP_CUDA_POOL_LIMIT: bytes, or "500MB", "2G"; default
    1 GiB; 0 frees every block when its array goes). A bad value is ignored with a warning: it is read when
    jitop's GPU runtime is imported, which must not fail."""
    try:
        return _env_size("JITOP_CUDA_POOL_LIMIT", 1 << 30)
    except ValueError as e:
        warnings.warn(f"ignoring it: {e}", RuntimeWarning, stacklevel=2)
        return 1 << 30


def _env_size(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", raw)
    if m is None or m.group(2) not in _SIZE_UNITS:
        raise ValueError(f"environment variable {name}={raw!r} must be a size such as 500MB, 2G or a number of "
                         "bytes")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


def verify() -> bool:
    """JITOP_VERIFY=1: check every newly compiled kernel against numpy before its first use."""
    return _env_int("JITOP_VERIFY", 0) != 0


def warm_records() -> bool:
    """JITOP_WARM_RECORDS=0: a warm process traces every function again, as before records (jitop.graph.warm)."""
    return _env_int("JITOP_WARM_RECORDS", 1) != 0


def compile_mode() -> str:
    """JITOP_COMPILE: "background" builds every @jitop.kernel's new kernels in a child process while their calls
    run as numpy (jitop.build_beside); "now" (default) compiles at the call."""
    return os.environ.get("JITOP_COMPILE", "").strip() or "now"


def autotune() -> str:
    """JITOP_AUTOTUNE: "background" tunes every @jitop.kernel's heavy workloads while the program runs ("" if unset)."""
    return os.environ.get("JITOP_AUTOTUNE", "").strip()


def autotune_budget() -> str:
    """Budget of one background tuning run (JITOP_AUTOTUNE_BUDGET, e.g. "90s", "2m"; default 2m)."""
    return os.environ.get("JITOP_AUTOTUNE_BUDGET", "").strip() or "2m"


def autotune_min_seconds() -> float:
    """A workload is tuned in the background once its calls took this long in all (JITOP_AUTOTUNE_MIN_SECONDS,
    default 0.5)."""
    raw = os.environ.get("JITOP_AUTOTUNE_MIN_SECONDS", "").strip()
    try:
        return float(raw) if raw else 0.5
    except ValueError:
        raise ValueError(f"environment variable JITOP_AUTOTUNE_MIN_SECONDS={raw!r} must be a number") from None
