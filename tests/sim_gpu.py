"""A fake GPU that runs the kernels: test_driver's FakeDriver (host memory as device memory) whose kernel launch
executes the launched kernel's loop nest on the GPU simulator (tests/gpu_sim.py), on the buffers its launch
arguments point at. So the whole GPU path runs on a machine without one, from a traced function or an ONNX model
to the numpy result: tracing, lowering, PTX emission (the kernels that share code, each launch's arguments),
the runtime's copies, workspaces and launches.

`install(monkeypatch)` puts it in place of libcuda and records every GPU function built from then on
(jitop.build, traced functions; the persistent cache is switched off, so each is built: the fake needs its loop
IR).
"""
from __future__ import annotations

import ctypes
import itertools
import os
import threading

import numpy as np

import gpu_sim
import jitop.driver
from jitop.codegen.nvptx import _peel_workspaces, kernel_nests
from jitop.runtime.cuda import driver, memory
from fake_driver import FakeDriver


class SimGpu(FakeDriver):
    """FakeDriver whose launches run the kernel (by its name) on the simulator."""

    def __init__(self):
        super().__init__()
        self.kernels: dict[str, tuple] = {}   # kernel name -> (nest, parameter buffers, symbols, ranges)
        self.handles = itertools.count(0x1000)
        self.names: dict[int, str] = {}
        self.launched: list[str] = []

    def register(self, func, built) -> None:
        """The kernels of a compiled function: each name's nest (its first launch: the kernel emitted for it)."""
        buffers = list(func.params) + _peel_workspaces(func.body)[1]
        for nest, launch in zip(kernel_nests(func), built.kernels):
            params = buffers if launch.args is None else [buffers[a] for a in launch.args]
            self.kernels.setdefault(launch.name, (nest, params, func.symbols, func.attrs.get("ranges", {})))

    def cuModuleGetFunction(self, out, module, name):
        out._obj.value = next(self.handles)
        self.names[out._obj.value] = name.decode()
        return 0

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        name = self.names[getattr(f, "value", f)]
        nest, buffers, symbols, ranges = self.kernels[name]
        values = [ctypes.c_uint64.from_address(params[k]).value for k in range(len(buffers) + len(symbols))]
        env = {v: np.int64(ctypes.c_int64(x).value) for v, x in zip(symbols, values[len(buffers):])}
        mem = {b: _view(ptr, b, env) for b, ptr in zip(buffers, values)}
        with np.errstate(all="ignore"):
            gpu_sim._launch(nest, mem, env, ranges, gpu_sim.MAX_LANES)
        self.launched.append(name)
        return 0


def _view(ptr: int, buf, env: dict) -> np.ndarray:
    """The flat array of `buf`'s elements at host address `ptr`."""
    size = int(np.prod(gpu_sim._dims(buf, env), dtype=np.int64))
    if size == 0:
        return np.empty(0, buf.dtype.np)
    raw = (ctypes.c_char * (size * buf.dtype.np.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=buf.dtype.np)


def install(monkeypatch, kind: type[SimGpu] = SimGpu) -> SimGpu:
    """The simulated GPU (or another `kind` of fake that runs kernels: tests/emulated_gpu.py) in place of libcuda
    for one test (fresh driver state and memory pool, no persistent cache), recording each GPU function compiled
    for it; everything is put back afterwards."""
    gpu = kind()
    monkeypatch.setattr(driver, "lib", lambda: gpu)
    monkeypatch.setattr(driver, "_cache", {})
    monkeypatch.setattr(driver, "_thread", threading.local())
    monkeypatch.setattr(memory, "POOL", memory.BlockPool())
    monkeypatch.setenv("JITOP_CACHE", "0")
    build_ptx = jitop.driver.build_ptx

    def build_and_register(func, symbol, target, *jobs):
        built = build_ptx(func, symbol, target, *jobs)
        gpu.register(func, built)
        return built
    monkeypatch.setattr(jitop.driver, "build_ptx", build_and_register)
    return gpu


def gpu_or_simulated(monkeypatch) -> SimGpu | None:
    """For a test that runs GPU code: None where this machine has a GPU (the code runs on it), else the
    simulated GPU installed for the test; with JITOP_TEST_GPU=emulated, the emulated one (tests/emulated_gpu.py:
    the emitted LLVM IR run on this CPU, slower)."""
    if driver.available():
        return None
    if os.environ.get("JITOP_TEST_GPU") == "emulated":
        import emulated_gpu
        return emulated_gpu.install(monkeypatch)
    return install(monkeypatch)
