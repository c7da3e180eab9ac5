"""The CUDA driver API through ctypes: find libcuda, turn its error codes into exceptions, and wrap the calls jitop
makes (device attributes, the primary context, memory, PTX linking, modules, kernel launches, events, streams).

Every call looks the library up through `lib()`, so tests give a fake library (monkeypatch `driver.lib`) and check
the error paths on machines without a GPU. Nothing here imports CUDA Python or CuPy.
"""
from __future__ import annotations

import ctypes
import functools
import operator
import struct
import threading
import weakref
from ctypes import byref, c_char_p, c_float, c_int, c_int32, c_size_t, c_uint, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Any, Callable, Sequence

_LIBRARY_NAMES = ("libcuda.so.1", "libcuda.so")
_P, _I, _U, _SZ, _DP = c_void_p, c_int, c_uint, c_size_t, c_uint64  # handle/pointer, int, unsigned, size_t, CUdeviceptr
# argument types of each entry point (cuda.h); every one returns a CUresult (int)
_SIGNATURES: dict[str, tuple[Any, ...]] = {
    "cuInit": (_U,), "cuDriverGetVersion": (_P,), "cuDeviceGetCount": (_P,), "cuDeviceGet": (_P, _I),
    "cuDeviceGetName": (_P, _I, _I), "cuDeviceGetAttribute": (_P, _I, _I), "cuDeviceTotalMem_v2": (_P, _I),
    "cuDevicePrimaryCtxRetain": (_P, _I), "cuCtxSetCurrent": (_P,), "cuCtxSynchronize": (),
    "cuGetErrorName": (_I, _P), "cuGetErrorString": (_I, _P),
    "cuMemAlloc_v2": (_P, _SZ), "cuMemFree_v2": (_DP,), "cuMemGetInfo_v2": (_P, _P),
    "cuMemcpyHtoD_v2": (_DP, _P, _SZ), "cuMemcpyDtoH_v2": (_P, _DP, _SZ), "cuMemcpyDtoD_v2": (_DP, _DP, _SZ),
    "cuMemsetD8_v2": (_DP, ctypes.c_ubyte, _SZ), "cuMemsetD16_v2": (_DP, ctypes.c_ushort, _SZ),
    "cuMemsetD32_v2": (_DP, _U, _SZ),
    "cuLinkCreate_v2": (_U, _P, _P, _P), "cuLinkAddData_v2": (_P, _I, _P, _SZ, c_char_p, _U, _P, _P),
    "cuLinkComplete": (_P, _P, _P), "cuLinkDestroy": (_P,),
    "cuModuleLoadDataEx": (_P, _P, _U, _P, _P), "cuModuleUnload": (_P,), "cuModuleGetFunction": (_P, _P, c_char_p),
    "cuModuleGetGlobal_v2": (_P, _P, _P, c_char_p), "cuFuncSetAttribute": (_P, _I, _I),
    "cuEventCreate": (_P, _U), "cuEventRecord": (_P, _P), "cuEventSynchronize": (_P,),
    "cuEventElapsedTime": (_P, _P, _P), "cuEventElapsedTime_v2": (_P, _P, _P), "cuEventDestroy_v2": (_P,),
    "cuStreamCreate": (_P, _U), "cuStreamSynchronize": (_P,), "cuStreamDestroy_v2": (_P,),
}
# cuLaunchKernel(CUfunction, gridX, gridY, gridZ, blockX, blockY, blockZ, unsigned sharedBytes, CUstream,
# void** params, void** extra) is left unprototyped: converting 11 arguments through argtypes costs about 1.2 us
# of a launch's 8, so Function.launch passes ctypes pointers and small ints that need no conversion.
# CUdevice_attribute numbers (cuda.h)
_ATTRIBUTES = {"max_threads_per_block": 1, "block_x": 2, "block_y": 3, "block_z": 4, "grid_x": 5, "grid_y": 6,
               "grid_z": 7, "shared_per_block": 8, "warp_size": 10, "registers_per_block": 12, "clock_khz": 13,
               "sm_count": 16, "l2_bytes": 38, "cc_major": 75, "cc_minor": 76, "shared_per_block_optin": 97}
CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 3, 4
CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 5, 6
CU_JIT_TARGET = 9
CU_JIT_INPUT_PTX = 1
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_ACCELERATED_TARGET_BASE = 0x10000  # CU_TARGET_COMPUTE_90A = 0x10000 + 90
_LOG_BYTES = 16 << 10
# errors after which the context is unusable: every later call in this process fails too
_STICKY = {"CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
           "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC",
           "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT", "CUDA_ERROR_LAUNCH_TIMEOUT"}

# per process: the primary context, device attributes by ordinal, whether cuInit ran (tests swap in a fresh dict)
_cache: dict[Any, Any] = {}
_lock = threading.Lock()
_thread = threading.local()  # the Context made current on this thread


class CudaUnavailableError(RuntimeError):
    """No usable NVIDIA driver or GPU on this machine (the message says why)."""


class CudaError(RuntimeError):
    """A CUDA driver call failed: `.call` (the driver function), `.code` (its CUresult) and `.name`
    (e.g. "CUDA_ERROR_OUT_OF_MEMORY"); the message adds the driver's description and a hint."""

    def __init__(self, call: str, code: int, name: str, text: str = "", hint: str = ""):
        self.call, self.code, self.name, self.text, self.hint = call, code, name, text, hint
        message = f"{call} failed with {name} ({code})" + (f": {text}" if text else "")
        super().__init__(message + (f". {hint}" if hint else ""))

    def __reduce__(self) -> tuple[Any, ...]:
        # the isolated tuning runner sends exceptions between processes; the default would pass only the message
        return CudaError, (self.call, self.code, self.name, self.text, self.hint)


@functools.cache
def _find_library() -> tuple[Any, str]:
    errors = []
    for name in _LIBRARY_NAMES:
        try:
            cdll = ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
            continue
        for fn, argtypes in _SIGNATURES.items():
            if hasattr(cdll, fn):  # a newer entry point (cuEventElapsedTime_v2) may be absent from older drivers
                getattr(cdll, fn).argtypes, getattr(cdll, fn).restype = argtypes, c_int
        return cdll, ""
    return None, f"libcuda.so.1 not found: no NVIDIA driver on this machine ({'; '.join(errors)})"


def load_library() -> Any:
    """libcuda (libcuda.so.1, else libcuda.so), loaded once per process with every entry point's argument types set;
    CudaUnavailableError where there is none."""
    cdll, reason = _find_library()
    if cdll is None:
        raise CudaUnavailableError(reason)
    return cdll


def lib() -> Any:
    """The driver library every call goes through (the one seam tests replace with a fake)."""
    return load_library()


@functools.cache
def _probe() -> str:
    try:
        cdll, reason = _find_library()
        if cdll is None:
            return reason
        rc = cdll.cuInit(0)
        if rc:
            return f"cuInit failed with {_error_name(rc, cdll)}: the NVIDIA driver is installed but unusable"
        count = c_int(0)
        rc = cdll.cuDeviceGetCount(byref(count))
        if rc or count.value < 1:
            return "the NVIDIA driver sees no CUDA device"
        return ""
    except Exception as e:  # available() must never raise, whatever the library does
        return f"probing the CUDA driver failed: {e!r}"


def available() -> bool:
    """True when libcuda loads, cuInit succeeds and there is at least one GPU; never raises."""
    return _probe() == ""


def unavailable_reason() -> str:
    """Why `available()` is False ("" when it is True)."""
    return _probe()


# ** errors **
def _error_name(code: int, cdll: Any = None) -> str:
    text = c_char_p()
    try:
        rc = (cdll or lib()).cuGetErrorName(code, byref(text))
    except Exception:
        rc = 1
    return text.value.decode() if rc == 0 and text.value else f"CUDA error {code}"


def _error_text(code: int) -> str:
    text = c_char_p()
    try:
        rc = lib().cuGetErrorString(code, byref(text))
    except Exception:
        rc = 1
    return text.value.decode() if rc == 0 and text.value else ""


def _hint(name: str, asked_bytes: int | None) -> str:
    if name == "CUDA_ERROR_OUT_OF_MEMORY":
        asked = f"asked for {asked_bytes} bytes" if asked_bytes is not None else "out of GPU memory"
        try:
            free, total = mem_get_info()
            return f"{asked}; {free} of {total} bytes are free on the GPU"
        except Exception:
            return asked
    if name in _STICKY:
        return ("a kernel faulted (an out-of-bounds access or a trap); the GPU context is now unusable and every "
                "later CUDA call in this process will fail: restart the process")
    if name == "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES":
        return "the block needs more registers or shared memory than one SM has: launch fewer threads per block"
    return ""


def error(call: str, code: int, hint: str = "", asked_bytes: int | None = None) -> CudaError:
    """The CudaError for `call` returning `code`: the driver's name and description, what the error usually means
    (out of memory: the bytes asked and free; a faulted kernel: the process's context is lost) and `hint`."""
    name = _error_name(code)
    return CudaError(call, code, name, _error_text(code), ". ".join(filter(None, (_hint(name, asked_bytes), hint))))


def check(call: str, result: int, hint: str = "", asked_bytes: int | None = None) -> None:
    """Raise CudaError unless the driver call `call` returned CUDA_SUCCESS (0)."""
    if result:
        raise error(call, result, hint, asked_bytes)


def _call(name: str, *args: Any, hint: str = "") -> None:
    check(name, getattr(lib(), name)(*args), hint)


def _release(fn: Callable[[Any], int], handle: Any) -> None:
    """A finalizer: free a driver object, silently (the context may be gone already)."""
    try:
        fn(handle)
    except Exception:
        pass


def _finalize(owner: object, fn: Callable[[Any], int], handle: Any) -> weakref.finalize:
    f = weakref.finalize(owner, _release, fn, handle)
    f.atexit = False  # the driver tears down every allocation at exit; calling it then can fail
    return f


# ** device, context **
def _init() -> None:
    if "init" not in _cache:
        _call("cuInit", 0)
        _cache["init"] = True


def driver_version() -> int:
    """The CUDA version the driver supports, as 1000 * major + 10 * minor (13000 for CUDA 13.0)."""
    version = c_int(0)
    _call("cuDriverGetVersion", byref(version))
    return version.value


def device_count() -> int:
    """How many CUDA GPUs the driver sees."""
    _init()
    count = c_int(0)
    _call("cuDeviceGetCount", byref(count))
    return count.value


def _device(ordinal: int) -> int:
    count = device_count()
    if not 0 <= ordinal < count:
        raise ValueError(f"GPU ordinal {ordinal} does not exist: this machine has {count} GPU(s)")
    dev = c_int(0)
    _call("cuDeviceGet", byref(dev), ordinal)
    return dev.value


def _attribute(dev: int, key: str) -> int:
    value = c_int(0)
    _call("cuDeviceGetAttribute", byref(value), _ATTRIBUTES[key], dev)
    return value.value


def _read_attributes(ordinal: int) -> dict[str, Any]:
    dev = _device(ordinal)
    a = {k: _attribute(dev, k) for k in _ATTRIBUTES if k != "clock_khz"}
    try:
        clock = _attribute(dev, "clock_khz")
    except CudaError:  # deprecated in recent drivers; only descriptive
        clock = 0
    name = ctypes.create_string_buffer(256)
    _call("cuDeviceGetName", name, 256, dev)
    total = c_size_t(0)
    _call("cuDeviceTotalMem_v2", byref(total), dev)
    cc = (a["cc_major"], a["cc_minor"])
    return {"name": name.value.decode(errors="replace"), "compute_capability": cc, "arch": f"sm_{cc[0]}{cc[1]}",
            "sm_count": a["sm_count"], "max_threads_per_block": a["max_threads_per_block"],
            "max_block_dim": (a["block_x"], a["block_y"], a["block_z"]),
            "max_grid_dim": (a["grid_x"], a["grid_y"], a["grid_z"]), "shared_per_block": a["shared_per_block"],
            "shared_per_block_optin": a["shared_per_block_optin"], "registers_per_block": a["registers_per_block"],
            "warp_size": a["warp_size"], "l2_bytes": a["l2_bytes"], "clock_khz": clock, "total_memory": total.value}


def device_attributes(ordinal: int = 0) -> dict[str, Any]:
    """GPU `ordinal`'s name, compute capability, arch ("sm_90"), SM count, block/grid/shared-memory/register limits,
    warp size, L2 bytes, clock (kHz) and total memory (bytes); read once per process."""
    key = ("attributes", ordinal)
    if key not in _cache:
        _cache[key] = _read_attributes(ordinal)
    return dict(_cache[key])


@dataclass(frozen=True)
class Context:
    """The primary context of a GPU (shared with the CUDA runtime, so torch and CuPy use the same one)."""

    handle: int
    device: int

    def synchronize(self) -> None:
        """Wait for all work queued in this context."""
        synchronize()


def _retain_primary() -> Context:
    dev = _device(0)
    handle = c_void_p()
    _call("cuDevicePrimaryCtxRetain", byref(handle), dev)
    return Context(handle.value or 0, dev)  # retained for the process's lifetime, never released


def context() -> Context:
    """GPU 0's primary context, retained once per process and made current on the calling thread (once per
    thread: a thread's first driver call needs a current context)."""
    ctx = _cache.get("context")
    if ctx is None:
        with _lock:
            ctx = _cache.get("context") or _cache.setdefault("context", _retain_primary())
    if getattr(_thread, "context", None) is not ctx:
        _call("cuCtxSetCurrent", c_void_p(ctx.handle))
        _thread.context = ctx
    return ctx


def synchronize() -> None:
    """Wait for every kernel and copy queued on the GPU (cuCtxSynchronize); raises the error of a faulted kernel."""
    context()
    _call("cuCtxSynchronize")


# ** memory (DeviceArray in memory.py is the public face) **
def mem_alloc(nbytes: int) -> int:
    """A device allocation of `nbytes` > 0 bytes; its address. Free it with mem_free (memory.py does)."""
    if nbytes <= 0:
        raise ValueError(f"mem_alloc needs a positive byte count, got {nbytes} (zero-size arrays need no memory)")
    context()
    ptr = c_uint64(0)
    check("cuMemAlloc_v2", lib().cuMemAlloc_v2(byref(ptr), nbytes), asked_bytes=nbytes)
    return ptr.value


def mem_free_function() -> Callable[[int], int]:
    """cuMemFree_v2 of the library in use now (finalizers keep it, so a fake library frees its own fakes)."""
    return lib().cuMemFree_v2


def mem_get_info() -> tuple[int, int]:
    """(free, total) bytes of GPU memory."""
    context()
    free, total = c_size_t(0), c_size_t(0)
    _call("cuMemGetInfo_v2", byref(free), byref(total))
    return free.value, total.value


def copy_htod(dst: int, src_host: int, nbytes: int) -> None:
    """Copy `nbytes` from host address `src_host` to device address `dst` (synchronous for pageable memory)."""
    context()
    _call("cuMemcpyHtoD_v2", dst, src_host, nbytes)


def copy_dtoh(dst_host: int, src: int, nbytes: int) -> None:
    """Copy `nbytes` from device address `src` to host address `dst_host`, after the work queued before it."""
    context()
    _call("cuMemcpyDtoH_v2", dst_host, src, nbytes)


def copy_dtod(dst: int, src: int, nbytes: int) -> None:
    """Copy `nbytes` between device addresses (queued on the default stream)."""
    context()
    _call("cuMemcpyDtoD_v2", dst, src, nbytes)


def memset_d8(dst: int, value: int, nbytes: int) -> None:
    """Set `nbytes` bytes at device address `dst` to `value` (0..255)."""
    context()
    _call("cuMemsetD8_v2", dst, value, nbytes)


_MEMSETS = {1: "cuMemsetD8_v2", 2: "cuMemsetD16_v2", 4: "cuMemsetD32_v2"}


def memset(dst: int, word: int, width: int, count: int) -> None:
    """Set `count` words of `width` bytes (1, 2 or 4; `dst` a multiple of it) at device address `dst` to the
    unsigned `word` (queued on the default stream)."""
    context()
    _call(_MEMSETS[width], dst, word, count)


# ** PTX -> cubin, modules **
class _JitLog:
    """Info and error log buffers handed to the PTX JIT through its option arrays (so failures can show the log)."""

    def __init__(self, extra: Sequence[tuple[int, int]] = ()):
        self.info, self.error = ctypes.create_string_buffer(_LOG_BYTES), ctypes.create_string_buffer(_LOG_BYTES)
        options = [(CU_JIT_INFO_LOG_BUFFER, ctypes.addressof(self.info)),
                   (CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, _LOG_BYTES),
                   (CU_JIT_ERROR_LOG_BUFFER, ctypes.addressof(self.error)),
                   (CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, _LOG_BYTES), *extra]
        self.count = len(options)
        self.keys = (c_int * self.count)(*(k for k, _ in options))
        self.values = (c_void_p * self.count)(*(v for _, v in options))  # integers travel cast to void*

    def raise_for(self, call: str, code: int) -> None:
        log = "\n".join(b.value.decode(errors="replace").strip() for b in (self.error, self.info) if b.value)
        raise error(call, code, hint=f"the PTX JIT log says:\n{log}" if log else "the PTX JIT left no log")


def _jit_target(arch: str) -> int:
    """CUjit_target of "sm_90" (90) or "sm_90a" (0x10000 + 90)."""
    digits = arch[3:].rstrip("a")
    if not arch.startswith("sm_") or not digits.isdigit() or len(arch) - 3 - len(digits) > 1:
        raise ValueError(f"arch must name a compute capability such as 'sm_90' or 'sm_90a', got {arch!r}")
    return int(digits) + (_ACCELERATED_TARGET_BASE if arch.endswith("a") else 0)


def link_ptx(ptx: str, arch: str | None = None) -> bytes:
    """Compile PTX text to a cubin for this GPU (or for `arch`, e.g. "sm_90") with the driver's JIT linker; the
    cubin loads without the JIT (Module.load), so a cache keeps it. CudaError with the JIT log on failure."""
    if not isinstance(ptx, str) or not ptx.strip() or "\0" in ptx:
        raise ValueError("link_ptx needs the PTX program as a non-empty str without NUL characters")
    log = _JitLog([(CU_JIT_TARGET, _jit_target(arch))] if arch else [])
    context()
    state = c_void_p()
    _call("cuLinkCreate_v2", log.count, log.keys, log.values, byref(state))
    try:
        text = ctypes.create_string_buffer(ptx.encode())  # NUL-terminated, as the JIT reads PTX
        rc = lib().cuLinkAddData_v2(state, CU_JIT_INPUT_PTX, text, len(text), b"jitop.ptx", 0, None, None)
        if rc:
            log.raise_for("cuLinkAddData_v2", rc)
        cubin, size = c_void_p(), c_size_t(0)
        rc = lib().cuLinkComplete(state, byref(cubin), byref(size))
        if rc:
            log.raise_for("cuLinkComplete", rc)
        return ctypes.string_at(cubin.value, size.value)  # owned by the link state: copy before cuLinkDestroy
    finally:
        lib().cuLinkDestroy(state)


_BINARY_MAGICS = (b"\x7fELF", b"\x50\xed\x55\xba")  # a cubin (ELF) or a fatbin; anything else is PTX text


class Module:
    """A loaded GPU module (a cubin or PTX); unloaded when no longer referenced (its Functions keep it)."""

    def __init__(self, handle: int, unload: Callable[[Any], int] | None = None):
        self.handle = handle
        self._finalizer = _finalize(self, unload, c_void_p(handle)) if unload else None

    @classmethod
    def load(cls, image: bytes) -> "Module":
        """Load a cubin (link_ptx's output), a fatbin or PTX text (bytes; a NUL terminator is added if missing)."""
        if isinstance(image, str):
            image = image.encode()
        if not isinstance(image, (bytes, bytearray)) or not image:
            raise TypeError(f"Module.load needs the cubin or PTX as non-empty bytes, got {type(image).__name__}")
        image = bytes(image)
        if image[:4] not in _BINARY_MAGICS and not image.endswith(b"\0"):
            image += b"\0"
        context()
        log, handle = _JitLog(), c_void_p()
        rc = lib().cuModuleLoadDataEx(byref(handle), image, log.count, log.keys, log.values)
        if rc:
            log.raise_for("cuModuleLoadDataEx", rc)
        return cls(handle.value or 0, lib().cuModuleUnload)

    def function(self, name: str) -> "Function":
        """The kernel (a PTX .entry) called `name`."""
        handle = c_void_p()
        _call("cuModuleGetFunction", byref(handle), c_void_p(self.handle), name.encode(),
              hint=f"is there a kernel (.entry) named {name!r} in the module?")
        return Function(handle.value or 0, name, module=self)

    def global_address(self, name: str) -> tuple[int, int]:
        """The device address and size in bytes of the module-scope variable `name`."""
        ptr, size = c_uint64(0), c_size_t(0)
        _call("cuModuleGetGlobal_v2", byref(ptr), byref(size), c_void_p(self.handle), name.encode(),
              hint=f"is there a .global variable named {name!r} in the module?")
        return ptr.value, size.value

    def _i32_address(self, name: str) -> int:
        ptr, size = self.global_address(name)
        if size < 4:
            raise ValueError(f"module variable {name!r} has {size} bytes, too few for an int32")
        return ptr

    def read_global_i32(self, name: str) -> int:
        """The int32 module variable `name` (after the work queued before this call)."""
        value = c_int32(0)
        copy_dtoh(ctypes.addressof(value), self._i32_address(name), 4)
        return value.value

    def write_global_i32(self, name: str, value: int) -> None:
        """Set the int32 module variable `name`."""
        v = c_int32(value)
        copy_htod(self._i32_address(name), ctypes.addressof(v), 4)


# ** launching **
@dataclass(frozen=True)
class LaunchLimits:
    """What one launch may ask of the GPU; `check` refuses a launch over them with a ValueError naming the limit."""

    max_threads_per_block: int = 1024
    max_block_dim: tuple[int, int, int] = (1024, 1024, 64)
    max_grid_dim: tuple[int, int, int] = (2 ** 31 - 1, 65535, 65535)
    shared_per_block: int = 48 << 10
    shared_per_block_optin: int = 227 << 10

    @staticmethod
    def from_attributes(attrs: dict[str, Any]) -> "LaunchLimits":
        """The limits of a GPU from device_attributes()."""
        return LaunchLimits(attrs["max_threads_per_block"], tuple(attrs["max_block_dim"]), tuple(attrs["max_grid_dim"]),
                            attrs["shared_per_block"], attrs["shared_per_block_optin"])

    def check(self, grid: Sequence[int], block: Sequence[int], shared_bytes: int = 0,
              dynamic_limit: int | None = None, grid_hint: str = "") -> None:
        """ValueError unless the launch fits this GPU (`dynamic_limit`: the kernel's opted-in shared memory;
        `grid_hint`: what the message of a grid over the limits advises)."""
        if len(grid) != 3 or len(block) != 3:
            raise ValueError(f"grid and block must be 3 integers (x, y, z) each, got grid={grid!r}, block={block!r}")
        (gx, gy, gz), (bx, by, bz) = grid, block
        (mgx, mgy, mgz), (mbx, mby, mbz) = self.max_grid_dim, self.max_block_dim
        limit = self.shared_per_block if dynamic_limit is None else dynamic_limit
        # one chained comparison on the launch path; the slow walk below only names what failed
        if (0 < bx <= mbx and 0 < by <= mby and 0 < bz <= mbz and bx * by * bz <= self.max_threads_per_block
                and 0 < gx <= mgx and 0 < gy <= mgy and 0 < gz <= mgz and 0 <= shared_bytes <= limit):
            return
        self._diagnose(grid, block, shared_bytes, limit, grid_hint)

    def _diagnose(self, grid: Sequence[int], block: Sequence[int], shared_bytes: int, limit: int,
                  grid_hint: str) -> None:
        for what, dims in (("grid", grid), ("block", block)):
            for axis, n in zip("xyz", dims):
                if operator.index(n) < 1:
                    raise ValueError(f"{what} dimension {axis} is {n}: every grid and block dimension must be >= 1 "
                                     "(skip the launch when there is nothing to do)")
        threads = block[0] * block[1] * block[2]
        if threads > self.max_threads_per_block:
            raise ValueError(f"block of {threads} threads ({'x'.join(map(str, block))}) exceeds this GPU's "
                             f"{self.max_threads_per_block} threads per block")
        for what, dims, limits in (("grid", grid, self.max_grid_dim), ("block", block, self.max_block_dim)):
            for axis, n, most in zip("xyz", dims, limits):
                if n > most:
                    advice = f"; {grid_hint}" if what == "grid" and grid_hint else ""
                    raise ValueError(f"{what} dimension {axis} of {n} exceeds this GPU's limit of {most}{advice}")
        self._check_shared(shared_bytes, limit)

    def _check_shared(self, shared_bytes: int, limit: int) -> None:
        if shared_bytes < 0:
            raise ValueError(f"shared_bytes must be >= 0, got {shared_bytes}")
        if shared_bytes > self.shared_per_block_optin:
            raise ValueError(f"{shared_bytes} bytes of dynamic shared memory exceed this GPU's "
                             f"{self.shared_per_block_optin} bytes per block")
        if shared_bytes > limit:
            raise ValueError(f"{shared_bytes} bytes of dynamic shared memory exceed the {limit} this kernel may use; "
                             f"call set_max_dynamic_shared({shared_bytes}) on it first")


# each kernel parameter travels in an 8-byte slot of one buffer: its struct format (i32/f32 padded to 8 bytes)
_ARG_FORMATS = {"ptr": "Q", "i64": "q", "i32": "i4x", "f32": "f4x", "f64": "d"}


class _Packer:
    """Packs arguments of one signature: a struct format, the pointer positions, and per thread one value buffer
    with its `void**` array made once (the driver copies the values during cuLaunchKernel, so reuse is safe)."""

    def __init__(self, arg_types: tuple[str, ...]):
        unknown = [(k, t) for k, t in enumerate(arg_types) if t not in _ARG_FORMATS]
        if unknown:
            raise ValueError(f"kernel argument {unknown[0][0]}: unknown type {unknown[0][1]!r}; expected one of "
                             f"{', '.join(_ARG_FORMATS)}")
        self.struct = struct.Struct("=" + "".join(_ARG_FORMATS[t] for t in arg_types))
        self.pointers = [k for k, t in enumerate(arg_types) if t == "ptr"]
        self.n, self.local = len(arg_types), threading.local()

    def buffers(self) -> tuple[Any, Any]:
        found = getattr(self.local, "buffers", None)
        if found is None:
            values = (c_uint64 * self.n)()
            base = ctypes.addressof(values)
            found = self.local.buffers = values, (c_void_p * self.n)(*range(base, base + 8 * self.n, 8))
        return found

    def pack(self, values: Sequence[Any], args: Sequence[Any], arg_types: Sequence[str]) -> tuple[Any, Any]:
        """(kernelParams, the value buffer) holding `values` (ints and floats; pointers as addresses); a
        TypeError or ValueError naming the first of the caller's `args` that does not fit its type."""
        buffer, params = self.buffers()
        try:
            self.struct.pack_into(buffer, 0, *values)
        except (TypeError, struct.error):
            raise _bad_argument(args, arg_types) from None
        return params, buffer


_PACKERS: dict[tuple[str, ...], _Packer] = {}


def device_pointer(obj: Any) -> int:
    """The device address of a kernel pointer argument: an int, a DeviceArray (.ptr) or a
    __cuda_array_interface__ exporter (CuPy, torch, numba)."""
    ptr = getattr(obj, "ptr", None)
    if isinstance(ptr, int):
        return ptr
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0] or 0)
    try:
        return operator.index(obj)
    except TypeError:
        raise TypeError("a kernel pointer argument must be a device address (int), a DeviceArray or an object with "
                        f"__cuda_array_interface__, got {type(obj).__name__}") from None


def _bad_argument(args: Sequence[Any], arg_types: Sequence[str]) -> Exception:
    """The error naming the first argument that cannot be passed as its type."""
    for k, (a, t) in enumerate(zip(args, arg_types)):
        try:
            value = device_pointer(a) if t == "ptr" else operator.index(a) if t[0] == "i" else a
            if t[0] == "f" and not hasattr(a, "__float__"):
                raise TypeError(f"needs a number, got {type(a).__name__}")
            struct.pack("=" + _ARG_FORMATS[t], value)
        except TypeError as e:
            return TypeError(f"kernel argument {k} ({t}): {e}")
        except struct.error as e:
            return ValueError(f"kernel argument {k} ({t}): {a!r} does not fit ({e})")
    return TypeError("kernel arguments do not match their types")


def pack_params(args: Sequence[Any], arg_types: Sequence[str]) -> tuple[Any, Any]:
    """cuLaunchKernel's `void**` kernelParams, pointing at one C value per argument ("ptr" as a 64-bit device
    address, "i64", "i32", "f32", "f64"), and the buffer holding the values. Both are this thread's scratch for
    this signature: valid until the next pack_params of the same types on the same thread."""
    if len(args) != len(arg_types):
        raise ValueError(f"{len(args)} kernel arguments but {len(arg_types)} argument types")
    key = tuple(arg_types)
    packer = _PACKERS.get(key) or _PACKERS.setdefault(key, _Packer(key))
    values = list(args)
    try:
        for k in packer.pointers:
            if type(values[k]) is not int:
                values[k] = device_pointer(values[k])
    except TypeError:
        raise _bad_argument(args, arg_types) from None
    return packer.pack(values, args, arg_types)


def _stream_handle(stream: Any) -> c_void_p | None:
    """None (the legacy default stream) or the CUstream as a pointer: a jitop Stream or a handle from elsewhere."""
    if stream is None:
        return None
    if isinstance(stream, Stream):
        return stream.handle_arg
    if isinstance(stream, int):
        return c_void_p(stream)  # e.g. torch.cuda.current_stream().cuda_stream
    raise TypeError(f"stream must be None, a jitop Stream or a CUstream handle (int), got {type(stream).__name__}")


class Function:
    """A kernel of a loaded Module; `launch` runs it."""

    def __init__(self, handle: int, name: str, module: Module | None = None, limits: LaunchLimits | None = None):
        self.handle, self.name, self.module = handle, name, module  # the module stays loaded while this lives
        self._handle_arg = c_void_p(handle)
        self.limits = limits or LaunchLimits.from_attributes(device_attributes())
        self.dynamic_shared = self.limits.shared_per_block

    def __repr__(self) -> str:
        return f"<CUDA kernel {self.name}>"

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Let launches of this kernel ask for up to `nbytes` of dynamic shared memory (over 48 KiB needs this)."""
        if not 0 <= nbytes <= self.limits.shared_per_block_optin:
            raise ValueError(f"set_max_dynamic_shared({nbytes}): this GPU allows 0 to "
                             f"{self.limits.shared_per_block_optin} bytes of shared memory per block")
        _call("cuFuncSetAttribute", c_void_p(self.handle), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
        self.dynamic_shared = nbytes

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int], args: Sequence[Any],
               arg_types: Sequence[str], shared_bytes: int = 0, stream: Any = None) -> None:
        """Queue the kernel on `stream` (None: the default stream). `args` are ints, floats, DeviceArrays or
        __cuda_array_interface__ objects; `arg_types` says how each is passed ("ptr", "i64", "i32", "f32", "f64")."""
        self.limits.check(grid, block, shared_bytes, self.dynamic_shared)
        params, _keep = pack_params(args, arg_types)
        context()
        dims = (*grid, *block, shared_bytes)
        try:
            rc = lib().cuLaunchKernel(self._handle_arg, *dims, _stream_handle(stream), params, None)
        except ctypes.ArgumentError:  # numpy integers: the unprototyped call takes Python ints only (nothing ran)
            rc = lib().cuLaunchKernel(self._handle_arg, *map(operator.index, dims), _stream_handle(stream), params,
                                      None)
        if rc:
            raise error("cuLaunchKernel", rc, f"launching {self.name} with grid {tuple(grid)}, block {tuple(block)}, "
                                              f"{shared_bytes} bytes of dynamic shared memory, {len(args)} arguments")

    def prepared(self, grid: Sequence[int], block: Sequence[int], arg_types: Sequence[str],
                 shared_bytes: int = 0, grid_hint: str = "") -> Callable[[Sequence[int]], None]:
        """`launch` with the grid, block and argument types checked once: a function that queues the kernel on
        the default stream with arguments given as ints (device addresses, integers) or floats. For a caller
        that launches the same configuration on many arrays (a GPU function's call plan). `grid_hint` is added
        to the error of a grid over the GPU's limits."""
        self.limits.check(grid, block, shared_bytes, self.dynamic_shared, grid_hint)
        dims = tuple(map(operator.index, (*grid, *block, shared_bytes)))
        types = tuple(arg_types)
        packer = _PACKERS.get(types) or _PACKERS.setdefault(types, _Packer(types))
        handle = self._handle_arg

        def queue(args: Sequence[int]) -> None:
            context()  # cheap once current; a thread's first launch makes the context current
            params, _ = packer.pack(args, args, types)
            rc = lib().cuLaunchKernel(handle, *dims, None, params, None)
            if rc:
                raise error("cuLaunchKernel", rc, f"launching {self.name} with grid {tuple(grid)}, block "
                                                  f"{tuple(block)}, {len(args)} arguments")
        return queue


# ** timing and ordering **
class Event:
    """A CUDA event: record it on a stream, then wait for it or time the work between two."""

    def __init__(self, timing: bool = True):
        context()
        handle = c_void_p()
        _call("cuEventCreate", byref(handle), 0 if timing else 2)  # CU_EVENT_DEFAULT / CU_EVENT_DISABLE_TIMING
        self.handle = handle.value or 0
        self._finalizer = _finalize(self, lib().cuEventDestroy_v2, c_void_p(self.handle))

    @classmethod
    def create(cls, timing: bool = True) -> "Event":
        """A new event (timing=False makes a cheaper one that cannot be timed)."""
        return cls(timing)

    def record(self, stream: Any = None) -> "Event":
        """Mark this point of `stream`'s queue (None: the default stream)."""
        _call("cuEventRecord", c_void_p(self.handle), _stream_handle(stream))
        return self

    def synchronize(self) -> None:
        """Wait until the work before the recorded point has run."""
        _call("cuEventSynchronize", c_void_p(self.handle))

    @staticmethod
    def elapsed_ms(start: "Event", end: "Event") -> float:
        """Milliseconds of GPU time between two recorded events (waits for `end` first)."""
        end.synchronize()
        ms = c_float(0.0)
        name = "cuEventElapsedTime" if hasattr(lib(), "cuEventElapsedTime") else "cuEventElapsedTime_v2"
        _call(name, byref(ms), c_void_p(start.handle), c_void_p(end.handle))
        return ms.value


class Stream:
    """A CUDA stream: a queue of kernels and copies that run in order."""

    def __init__(self, non_blocking: bool = False):
        context()
        handle = c_void_p()
        _call("cuStreamCreate", byref(handle), 1 if non_blocking else 0)  # CU_STREAM_NON_BLOCKING = 1
        self.handle = handle.value or 0
        self.handle_arg = c_void_p(self.handle)
        self._finalizer = _finalize(self, lib().cuStreamDestroy_v2, c_void_p(self.handle))

    @classmethod
    def create(cls, non_blocking: bool = False) -> "Stream":
        """A new stream (non_blocking: it does not wait for the default stream)."""
        return cls(non_blocking)

    def synchronize(self) -> None:
        """Wait until everything queued on this stream has run."""
        _call("cuStreamSynchronize", c_void_p(self.handle))


def stream_synchronize(handle: int) -> None:
    """Wait for a CUstream given by its handle (another library's stream, e.g. from __cuda_array_interface__)."""
    context()
    _call("cuStreamSynchronize", c_void_p(handle))
