"""A fake GPU for testing the GPU measurer on machines without one (tests/cuda/test_gpu_tuning.py).

`FakeGemmGpu` is test_driver's FakeDriver (host memory as device memory) whose kernel launch computes the GEMM
C = A @ B of the arguments' device pointers with numpy, whatever the kernel, and whose CUDA events report
LAUNCH_US microseconds per launch scaled by the block's shape (so configs have different, deterministic costs).
A launch with the block shape named in STICKY_BLOCK fails with CUDA_ERROR_ILLEGAL_ADDRESS (a sticky error).

This module is also a measurer's `worker_module`: `runner_main` installs the fake in the spawned runner (sizes
and the sticky block from the JITOP_TEST_FAKE_GPU variable, "m,n,k[,bx,by]"), then runs the GPU runner; the
build functions are the real ones (PTX needs no GPU).
"""
from __future__ import annotations

import ctypes
import itertools
import os
import threading

import numpy as np

from jitop.runtime.cuda import driver, memory
from jitop.tuner import _gpu_worker
from jitop.tuner._gpu_worker import build, init_build_worker, ping  # noqa: F401 - the worker module's functions
from fake_driver import FakeDriver

ENV = "JITOP_TEST_FAKE_GPU"
LAUNCH_US = 50.0


class FakeGemmGpu(FakeDriver):
    """FakeDriver whose launches compute C[m, n] = A[m, k] @ B[k, n] and whose events time them."""

    def __init__(self, m: int, n: int, k: int, sticky_block: tuple[int, int] | None = None):
        super().__init__()
        self.m, self.n, self.k, self.sticky_block = m, n, k, sticky_block
        self.launches, self.elapsed_us = 0, 0.0
        self.handles = itertools.count(0x1000)
        self.recorded: dict[int, float] = {}

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        if self.sticky_block == (bx, by):
            return 700
        a, b, c = (ctypes.c_uint64.from_address(params[k]).value for k in range(3))
        view = lambda ptr, r, s: np.ctypeslib.as_array((ctypes.c_float * (r * s)).from_address(ptr)).reshape(r, s)
        view(c, self.m, self.n)[...] = view(a, self.m, self.k) @ view(b, self.k, self.n)
        self.launches += 1
        self.elapsed_us += LAUNCH_US * (1.0 + 256.0 / (bx * by))
        return self._record("cuLaunchKernel", ())

    def cuEventCreate(self, out, flags):
        out._obj.value = next(self.handles)
        return 0

    def cuEventRecord(self, event, stream):
        self.recorded[event.value] = self.elapsed_us
        return 0

    def cuEventElapsedTime(self, ms, start, end):
        ms._obj.value = (self.recorded[end.value] - self.recorded[start.value]) / 1e3
        return 0


def install(fake: FakeDriver) -> None:
    """Put `fake` in place of libcuda in this process (fresh per-process driver state)."""
    driver.lib = lambda: fake
    driver._cache = {}
    driver._thread = threading.local()
    memory.POOL = memory.BlockPool()


def from_env() -> FakeGemmGpu:
    """The fake GPU JITOP_TEST_FAKE_GPU describes ("m,n,k" or "m,n,k,bx,by")."""
    sizes = [int(x) for x in os.environ[ENV].split(",")]
    return FakeGemmGpu(*sizes[:3], tuple(sizes[3:5]) if len(sizes) == 5 else None)


def runner_main(conn) -> None:
    """The GPU runner on the fake GPU."""
    install(from_env())
    _gpu_worker.runner_main(conn)
