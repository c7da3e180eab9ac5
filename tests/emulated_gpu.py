"""A fake GPU that runs the kernels' LLVM IR on this CPU (tests/nvvm_emulator.py): test_driver's FakeDriver (host
memory as device memory) whose launches run the code the NVPTX back end received, one OS thread per GPU thread.
Where tests/sim_gpu.py checks the loop IR's semantics, this checks what the emitter made of it, through the same
runtime: copies, workspaces, the launches' arguments and the error flag the runtime reads after them.

`install(monkeypatch)` puts it in place of libcuda for one test and compiles every GPU function built from then
on for this CPU as well.
"""
from __future__ import annotations

import ctypes

import nvvm_emulator
import sim_gpu


GUARD = 256                # bytes before and after each allocation, filled with FILL
FILL = 0xA5
ILLEGAL_ADDRESS = 700      # CUDA_ERROR_ILLEGAL_ADDRESS


class EmulatedGpu(sim_gpu.SimGpu):
    """SimGpu whose launches run the kernel's emitted LLVM IR, and whose module globals (a function's error flag)
    are that code's. Each allocation lies between two guard zones; a launch that writes into one fails as a GPU
    fails an illegal address (CUDA_ERROR_ILLEGAL_ADDRESS, `overruns` names the kernel and the allocation)."""

    def __init__(self):
        super().__init__()
        self.programs: dict[str, nvvm_emulator.Program] = {}  # kernel or global name -> the program defining it
        self.sizes: dict[int, int] = {}  # device address -> bytes asked for
        self.overruns: list[tuple[str, int, int]] = []  # (kernel, allocation, its size)

    def cuMemAlloc_v2(self, out, nbytes):
        if self._record("cuMemAlloc_v2", (nbytes,)):
            return self.fail["cuMemAlloc_v2"]
        buf = ctypes.create_string_buffer(bytes([FILL]) * (nbytes + 2 * GUARD))
        out._obj.value = ctypes.addressof(buf) + GUARD
        self.memory[out._obj.value], self.sizes[out._obj.value] = buf, nbytes
        return 0

    def cuMemFree_v2(self, ptr):
        self.sizes.pop(ptr, None)
        return super().cuMemFree_v2(ptr)

    def _guards_intact(self, kernel: str) -> bool:
        intact = bytes([FILL]) * GUARD
        for ptr, size in self.sizes.items():
            if ctypes.string_at(ptr - GUARD, GUARD) != intact or ctypes.string_at(ptr + size, GUARD) != intact:
                self.overruns.append((kernel, ptr, size))
        return not self.overruns

    def register(self, func, built) -> None:
        program = nvvm_emulator.Program(built.ll, [launch.name for launch in built.kernels])
        for name in [*program.kernels, built.error_symbol]:
            self.programs[name] = program

    def cuModuleGetGlobal_v2(self, ptr, size, module, name):
        name = name.decode()
        ptr._obj.value, size._obj.value = self.programs[name].global_address(name), 4
        return 0

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        name = self.names[getattr(f, "value", f)]
        self.programs[name].launch(name, (gx, gy, gz), (bx, by, bz), ctypes.cast(params, ctypes.c_void_p).value)
        self.launched.append(name)
        return 0 if self._guards_intact(name) else ILLEGAL_ADDRESS


def install(monkeypatch) -> EmulatedGpu:
    """The emulated GPU in place of libcuda for one test (see sim_gpu.install)."""
    return sim_gpu.install(monkeypatch, EmulatedGpu)
