"""A stand-in for libcuda (tests/cuda/test_driver.py's fake, the fake GPUs of tests/cuda/fake_gpu.py and
tests/sim_gpu.py): its entry points answer as the driver would, its "device memory" is host memory."""
from __future__ import annotations

import ctypes

from jitop.runtime.cuda import driver

ERRORS = {2: ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory"), 218: ("CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation "
          "failed"), 500: ("CUDA_ERROR_NOT_FOUND", "named symbol not found"),
          700: ("CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered")}
ATTRIBUTES = {1: 1024, 2: 1024, 3: 1024, 4: 64, 5: 2 ** 31 - 1, 6: 65535, 7: 65535, 8: 48 << 10, 10: 32, 12: 65536,
              13: 1980000, 16: 132, 38: 50 << 20, 75: 9, 76: 0, 97: 227 << 10}


class FakeDriver:
    """A stand-in libcuda: entry points return `fail.get(name, 0)`, outputs are written through byref's `_obj`,
    and allocations are host buffers, so copies really move bytes."""

    def __init__(self):
        self.fail: dict[str, int] = {}
        self.calls: list[tuple] = []
        self.memory: dict[int, ctypes.Array] = {}
        self.freed: list[int] = []
        self.jit_log = b""

    def __getattr__(self, name):
        if not name.startswith("cu"):
            raise AttributeError(name)
        return lambda *args: self._record(name, args)

    def _record(self, name, args):
        self.calls.append((name, args))
        return self.fail.get(name, 0)

    def names(self):
        return [c[0] for c in self.calls]

    def cuGetErrorName(self, code, out):
        out._obj.value = ERRORS[code][0].encode() if code in ERRORS else None
        return 0 if code in ERRORS else 1

    def cuGetErrorString(self, code, out):
        out._obj.value = ERRORS[code][1].encode() if code in ERRORS else None
        return 0 if code in ERRORS else 1

    def cuModuleGetGlobal_v2(self, ptr, size, module, name):
        """Every module global (a kernel module's out-of-bounds flag): one shared int32, 0 unless written."""
        self.flag = getattr(self, "flag", None) or ctypes.create_string_buffer(4)
        ptr._obj.value, size._obj.value = ctypes.addressof(self.flag), 4
        return 0

    def cuDeviceGetCount(self, out):
        out._obj.value = 1
        return 0

    def cuDeviceGetAttribute(self, out, attribute, dev):
        out._obj.value = ATTRIBUTES[attribute]
        return 0

    def cuDeviceGetName(self, buf, size, dev):
        ctypes.memmove(buf, b"Fake H100\0", 10)
        return 0

    def cuDeviceTotalMem_v2(self, out, dev):
        out._obj.value = 80 << 30
        return 0

    def cuDevicePrimaryCtxRetain(self, out, dev):
        out._obj.value = 0xC0
        return self._record("cuDevicePrimaryCtxRetain", (dev,))

    def cuMemGetInfo_v2(self, free, total):
        free._obj.value, total._obj.value = 1 << 30, 80 << 30
        return 0

    def cuMemAlloc_v2(self, out, nbytes):
        if self._record("cuMemAlloc_v2", (nbytes,)):
            return self.fail["cuMemAlloc_v2"]
        out._obj.value = self._host_memory(nbytes)
        return 0

    def _host_memory(self, nbytes: int) -> int:
        """The address of `nbytes` of new host memory standing for device memory (kept in `memory`)."""
        buf = ctypes.create_string_buffer(nbytes)
        self.memory[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def cuMemFree_v2(self, ptr):
        self.freed.append(ptr)
        self.memory.pop(ptr)
        return 0

    def cuMemcpyHtoD_v2(self, dst, src, nbytes):
        ctypes.memmove(dst, src, nbytes)
        return self._record("cuMemcpyHtoD_v2", (dst, src, nbytes))

    cuMemcpyDtoH_v2 = cuMemcpyHtoD_v2

    def cuMemcpyDtoD_v2(self, dst, src, nbytes):
        """A device-to-device copy; regions that overlap are refused (CUDA leaves such a copy undefined)."""
        if src < dst + nbytes and dst < src + nbytes:
            return self._record("cuMemcpyDtoD_v2", (dst, src, nbytes)) or 1  # CUDA_ERROR_INVALID_VALUE
        ctypes.memmove(dst, src, nbytes)
        return self._record("cuMemcpyDtoD_v2", (dst, src, nbytes))

    def cuMemsetD8_v2(self, dst, value, nbytes):
        ctypes.memset(dst, value, nbytes)
        return self._record("cuMemsetD8_v2", (dst, value, nbytes))

    def cuMemsetD16_v2(self, dst, value, count):
        return self._memset_words("cuMemsetD16_v2", dst, value, count, 2)

    def cuMemsetD32_v2(self, dst, value, count):
        return self._memset_words("cuMemsetD32_v2", dst, value, count, 4)

    def _memset_words(self, name, dst, value, count, width):
        if dst % width:
            return self._record(name, (dst, value, count)) or 1  # CUDA_ERROR_INVALID_VALUE: a misaligned address
        data = value.to_bytes(width, "little") * count
        ctypes.memmove(dst, data, len(data))
        return self._record(name, (dst, value, count))

    def cuLinkCreate_v2(self, count, keys, values, state):
        self.link_options = {keys[k]: values[k] for k in range(count)}
        state._obj.value = 0x11
        return self._record("cuLinkCreate_v2", (count,))

    def cuLinkAddData_v2(self, state, kind, data, size, name, n, keys, values):
        ctypes.memmove(self.link_options[driver.CU_JIT_ERROR_LOG_BUFFER], self.jit_log, len(self.jit_log))
        self.ptx = ctypes.string_at(data, size)
        return self._record("cuLinkAddData_v2", (state, kind, size))

    def cuLinkComplete(self, state, cubin, size):
        self.cubin = ctypes.create_string_buffer(b"\x7fELF fake cubin", 15)
        cubin._obj.value, size._obj.value = ctypes.addressof(self.cubin), 15
        return self._record("cuLinkComplete", ())

    def cuModuleLoadDataEx(self, out, image, count, keys, values):
        out._obj.value = 0x44
        return self._record("cuModuleLoadDataEx", (image,))

    def cuModuleGetFunction(self, out, module, name):
        out._obj.value = 0x55
        return self._record("cuModuleGetFunction", (name,))

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        if not all(type(x) is int for x in (gx, gy, gz, bx, by, bz, shared)):
            raise ctypes.ArgumentError("unprototyped: only Python ints convert")  # as the real, unprototyped one
        stream = getattr(stream, "value", stream)
        # the C values live only during the call, as for the real driver, which copies them at launch
        values = [ctypes.c_uint64.from_address(params[k]).value for k in range(len(params))]
        self.launched = (gx, gy, gz, bx, by, bz, shared, stream, values)
        return self._record("cuLaunchKernel", ())
