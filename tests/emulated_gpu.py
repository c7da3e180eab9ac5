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

    def _host_memory(self, nbytes: int) -> int:
        buf = ctypes.create_string_buffer(bytes([FILL]) * (nbytes + 2 * GUARD))
        ptr = ctypes.addressof(buf) + GUARD
        self.memory[ptr], self.sizes[ptr] = buf, nbytes
        return ptr

    def cuMemFree_v2(self, ptr):
        self.sizes.pop(ptr, None)
        return super().cuMemFree_v2(ptr)

    def _guards_intact(self, kernel: str) -> bool:
        """Whether `kernel`'s launch left every guard zone as it was; a zone it wrote is named in `overruns` and
        filled again (a later launch is judged by its own writes)."""
        intact, before = bytes([FILL]) * GUARD, len(self.overruns)
        for ptr, size in self.sizes.items():
            zones = (ptr - GUARD, ptr + size)
            if any(ctypes.string_at(at, GUARD) != intact for at in zones):
                self.overruns.append((kernel, ptr, size))
                for at in zones:
                    ctypes.memset(at, FILL, GUARD)
        return len(self.overruns) == before

    def register(self, func, built) -> None:
        program = nvvm_emulator.Program(built.ll, [launch.name for launch in built.kernels])
        for name in [*program.kernels, built.error_symbol]:
            if name:
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
    """The emulated GPU in place of libcuda for one test (see sim_gpu.install), and for the tests it calls that ask
    `sim_gpu.gpu_or_simulated` for a GPU (JITOP_TEST_GPU=emulated)."""
    monkeypatch.setenv("JITOP_TEST_GPU", "emulated")
    return sim_gpu.install(monkeypatch, EmulatedGpu)
