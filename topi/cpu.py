"""What default configurations are derived from: vector width, cache sizes and thread count of this CPU.

Read once from /proc and /sys (Linux); elsewhere, conservative values. Templates take a CPU, so a test
can ask for the default of another machine.

>>> cpu = host()
>>> cpu.lanes(4) in (4, 8, 16)
True
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from jitop import config


@dataclass(frozen=True)
class CPU:
    """The facts a default config needs."""

    vector_bytes: int = 64        # 64 with AVX-512, 32 with AVX2, 16 otherwise
    vector_registers: int = 32    # zmm0-31 with AVX-512, 16 ymm otherwise
    l1_bytes: int = 32 << 10
    l2_bytes: int = 1 << 20
    threads: int = 1

    def lanes(self, itemsize: int) -> int:
        """Elements of this size in one vector register."""
        return max(1, self.vector_bytes // itemsize)


def _flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cache_bytes(level: int, default: int) -> int:
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            path = os.path.join(base, entry)
            if not entry.startswith("index"):
                continue
            with open(os.path.join(path, "level")) as f:
                if int(f.read()) != level:
                    continue
            with open(os.path.join(path, "type")) as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(os.path.join(path, "size")) as f:
                text = f.read().strip()
            scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
            return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return default


@functools.cache
def host() -> CPU:
    """The machine we run on (thread count from JITOP_NUM_THREADS / OMP_NUM_THREADS / cores)."""
    flags = _flags()
    wide = "avx512f" in flags
    return CPU(vector_bytes=64 if wide else 32 if "avx2" in flags else 16, vector_registers=32 if wide else 16,
               l1_bytes=_cache_bytes(1, 32 << 10), l2_bytes=_cache_bytes(2, 1 << 20), threads=config.num_threads())
