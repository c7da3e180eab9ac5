"""NVIDIA's libdevice: the C math functions GPU code calls where jitop's own vector math has none (float64 pow and
erf, the libm fallbacks of jitop.codegen.math), as LLVM bitcode linked into a GPU module before optimisation.

libdevice ships with the CUDA toolkit and in pip wheels (`nvidia-nvvm`, which `jitop[cuda-test]` installs
through `nvidia-cuda-nvcc`; triton, which torch installs, carries a copy). `path()` finds it: JITOP_LIBDEVICE,
then those wheels, then CUDA_HOME / CUDA_PATH and /usr/local/cuda. Without it, GPU code that needs such a call
fails to build with an error naming the call (jitop.codegen.nvptx), never at run time.

>>> wrapper_name("pow"), wrapper_name("erff"), wrapper_name("frexp") is None
('__nv_pow', '__nv_erff', True)
"""
from __future__ import annotations

import functools
import glob
import os
import sys

from jitop.codegen.math import LIBM

# the C library's functions jitop.codegen.math may call, which libdevice defines as __nv_<symbol>
SYMBOLS = LIBM | frozenset(f"{name}f" for name in LIBM)
FILE = "libdevice.10.bc"


def wrapper_name(symbol: str) -> str | None:
    """libdevice's name for the C function `symbol` (None if libdevice has no such function here)."""
    return f"__nv_{symbol}" if symbol in SYMBOLS else None


def _candidates() -> list[str]:
    env = os.environ.get("JITOP_LIBDEVICE")
    if env:
        return [env]
    roots = [p for p in sys.path if os.path.isdir(p)]
    patterns = [os.path.join(r, "nvidia", "*", "nvvm", "libdevice", FILE) for r in roots]
    patterns += [os.path.join(r, "nvidia", "*", "*", "nvvm", "libdevice", FILE) for r in roots]
    patterns += [os.path.join(r, "triton", "backends", "nvidia", "lib", FILE) for r in roots]
    homes = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")] + ["/usr/local/cuda"]
    patterns += [os.path.join(h, "nvvm", "libdevice", FILE) for h in homes if h]
    return [p for pattern in patterns for p in sorted(glob.glob(pattern))]


@functools.cache
def path() -> str | None:
    """The libdevice bitcode file this process links (see the module), or None where there is none."""
    return next((p for p in _candidates() if os.path.isfile(p)), None)


@functools.cache
def bitcode() -> bytes | None:
    """libdevice's bytes (read once), or None where there is none."""
    found = path()
    if found is None:
        return None
    with open(found, "rb") as f:
        data = f.read()
    return data if data[:4] in (b"BC\xc0\xde", b"\xde\xc0\x17\x0b") else None  # raw or wrapped LLVM bitcode
