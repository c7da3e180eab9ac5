"""Every JITOP_* environment knob, read in one place."""
from __future__ import annotations

import os
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
    """Directory of the persistent cache (JITOP_CACHE_DIR, default ~/.cache/jitop)."""
    default = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "jitop")
    return os.environ.get("JITOP_CACHE_DIR") or default


def cache_enabled() -> bool:
    """JITOP_CACHE=0 disables the persistent cache."""
    return _env_int("JITOP_CACHE", 1) != 0
