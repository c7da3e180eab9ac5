"""Shared helpers for the benchmarks: timing, machine description, numpy under both OpenBLAS settings."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import timeit
from typing import Callable

import numpy as np


def best_of(fn: Callable[[], object], repeat: int = 7, number: int = 1) -> float:
    """Best wall time of one call (seconds), after one warm-up call."""
    fn()
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import llvmlite.binding as llvm
    from jitop import config
    return (f"{cpu} ({llvm.get_host_cpu_name()}), {os.cpu_count()} cores, jitop threads={config.num_threads()}, "
            f"Python {platform.python_version()}, numpy {np.__version__}, "
            f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")


_NUMPY_MATMUL = """
import json, sys, timeit, numpy as np
n, m, k, repeat = map(int, sys.argv[1:5])
a = np.random.rand(n, k).astype(np.float32); b = np.random.rand(k, m).astype(np.float32)
a @ b
t = min(timeit.repeat(lambda: a @ b, number=1, repeat=repeat))
print(json.dumps(t))
"""


def numpy_matmul_seconds(n: int, m: int, k: int, coretype: str | None, repeat: int = 7) -> float:
    """np.matmul time in a fresh process with OPENBLAS_CORETYPE set to `coretype` (None: unset)."""
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    out = subprocess.run([sys.executable, "-c", _NUMPY_MATMUL, str(n), str(m), str(k), str(repeat)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def table(headers: list[str], rows: list[list[object]]) -> str:
    """A markdown table."""
    def fmt(x: object) -> str:
        return f"{x:.1f}" if isinstance(x, float) else str(x)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)
