"""Arrays in GPU memory: `DeviceArray` (owning its allocation, or a zero-copy view of another library's array, or
of another DeviceArray's contiguous part), host <-> device and device copies, and the interop protocols
(__cuda_array_interface__ both ways, DLPack both ways).
"""
from __future__ import annotations

import ctypes
import math
import sys
import threading
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from jitop import config
from jitop.runtime.cuda import driver, views

_LEGACY_STREAM, _PER_THREAD_STREAM = 1, 2  # __cuda_array_interface__ v3 / DLPack stream numbers


def _is_c_contiguous(shape: tuple[int, ...], strides: Sequence[int] | None, itemsize: int) -> bool:
    """numpy's rule: strides of extent-1 axes do not matter, and an empty array is contiguous."""
    if strides is None or 0 in shape:
        return True
    expected = views.c_strides(shape, itemsize)
    return all(n == 1 or s == e for n, s, e in zip(shape, strides, expected))


class DeviceArray:
    """An n-dimensional, C-contiguous array in GPU memory.

    It owns its allocation (`empty`, `to_device`; freed when the array is collected) or is a view of memory that
    `owner` keeps alive (`as_device_array` of a torch or CuPy array, `from_dlpack`).

    >>> d = to_device(np.arange(6, dtype=np.float32).reshape(2, 3))   # doctest: +SKIP
    >>> d.get().sum()                                                 # doctest: +SKIP
    15.0
    """

    def __init__(self, shape: Sequence[int], dtype: Any, ptr: int, owner: Any = None):
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        if any(n < 0 for n in self.shape) or self.dtype.hasobject:
            raise ValueError(f"a device array needs a shape of sizes >= 0 and a numeric dtype, got "
                             f"{self.shape} {self.dtype}")
        self.size = math.prod(self.shape)
        self.nbytes = self.size * self.dtype.itemsize
        self.ptr = int(ptr)
        self.owner = owner

    @classmethod
    def allocate(cls, shape: Sequence[int], dtype: Any) -> "DeviceArray":
        """A new array whose memory it owns (uninitialized; no allocation at all when it is empty). Its memory
        comes from, and returns to, the pool of freed blocks (`POOL`)."""
        arr = cls(shape, dtype, 0)
        return arr._pooled() if arr.nbytes else arr

    @classmethod
    def allocate_exact(cls, shape: tuple[int, ...], dtype: np.dtype, size: int, block: int = 0) -> "DeviceArray":
        """`allocate` of a shape and dtype already checked (a call plan's outputs: ints >= 0, a numeric numpy
        dtype, `size` elements), without checking them again on every call; `block`, if given, is the pool's
        size class of its bytes (`BlockPool.rounded`)."""
        arr = cls.__new__(cls)
        arr.shape, arr.dtype, arr.size, arr.ptr, arr.owner = shape, dtype, size, 0, None
        arr.nbytes = size * dtype.itemsize
        return arr._pooled(block) if arr.nbytes else arr

    def _pooled(self, block: int = 0) -> "DeviceArray":
        """Memory from the pool: a block of size class `block`, or of this array's bytes rounded."""
        self.ptr, size = POOL.take_class(block or POOL.rounded(self.nbytes))
        self.owner = _PooledBlock(POOL, driver.lib(), self.ptr, size)
        return self

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        """Byte strides (always C order)."""
        return views.c_strides(self.shape, self.dtype.itemsize)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d device array")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype.name}, device='cuda')"

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        # an implicit copy hidden in np.asarray would be a silent, slow transfer
        raise TypeError("a DeviceArray lives in GPU memory: call .get() for a numpy copy")

    def get(self, out: np.ndarray | None = None) -> np.ndarray:
        """A C-contiguous numpy copy (after the GPU work queued on the default stream before this call); `out`, a
        writeable C-contiguous numpy array of this shape and dtype, receives it instead of a new array (as CuPy's
        `get(out=)`: a loop copying each step's result back allocates nothing)."""
        if out is None:
            out = np.empty(self.shape, self.dtype)
        elif not (type(out) is np.ndarray and out.shape == self.shape and out.dtype == self.dtype
                  and out.flags.c_contiguous and out.flags.writeable):
            raise ValueError(f"get(out=...): out must be a writeable C-contiguous numpy array of shape {self.shape} "
                             f"and dtype {self.dtype.name}, got {_described(out)}")
        if self.nbytes:
            driver.copy_dtoh(out.ctypes.data, self.ptr, self.nbytes)
        return out

    def copy_from_host(self, arr: Any) -> None:
        """Overwrite this array with a host array of the same shape and dtype."""
        a = np.asarray(arr)
        if a.shape != self.shape or a.dtype != self.dtype:
            raise ValueError(f"copy_from_host: expected an array of shape {self.shape} and dtype {self.dtype.name}, "
                             f"got shape {a.shape} and dtype {a.dtype.name}")
        if self.nbytes:
            a = np.ascontiguousarray(a)
            driver.copy_htod(self.ptr, a.ctypes.data, self.nbytes)

    # ** views and copies on the device **
    def __getitem__(self, index: Any) -> "DeviceArray":
        """A view of `self[index]` for a basic index (ints, slices, `...`, None) whose elements are one
        C-contiguous block (`a[3]`, `a[2:5]`, `a[1, :4]`): it shares this array's memory and keeps it alive; a
        0-d view for a single element. TypeError for any other selection (`a[:, 1]`, `a[::2]`, arrays as
        indices): a device array has no strides.

        >>> cache = jitop.cuda.zeros((1024, 768), np.float32)   # doctest: +SKIP
        >>> cache[:17].shape, cache[16].shape                     # doctest: +SKIP
        ((17, 768), (768,))
        """
        offset, shape = views.contiguous_region(self.shape, self.dtype.itemsize, index)
        return DeviceArray(shape, self.dtype, self.ptr + offset, owner=self)

    def __setitem__(self, index: Any, value: Any) -> None:
        """Write `value` into `self[index]` (a view `__getitem__` allows): a device array of the view's dtype and
        shape (leading size-1 dims aside) is copied on the GPU; anything else is made on the host as numpy's
        `view[...] = value` makes it (casts, broadcasting, numpy's errors), then copied in."""
        view = self[index]
        source = as_device_array(value)
        if source is None and np.ndim(value) == 0:
            view.fill(value)
            return
        if source is None:
            host = np.empty(view.shape, view.dtype)
            host[...] = value
            view.copy_from_host(host)
            return
        if source.dtype != view.dtype or _unpadded(source.shape) != _unpadded(view.shape):
            raise ValueError(f"cannot copy a device array of shape {source.shape} and dtype {source.dtype.name} "
                             f"into a view of shape {view.shape} and dtype {view.dtype.name}: the GPU copies "
                             "bytes as they are (no broadcasting or casting); give a numpy value instead")
        view._copy_from_device(source)

    def reshape(self, *shape: Any) -> "DeviceArray":
        """A view of the same memory with another shape (C order; one dimension may be -1), as numpy's reshape
        of a C-contiguous array.

        >>> jitop.cuda.zeros(12, np.float32).reshape(3, -1).shape   # doctest: +SKIP
        (3, 4)
        """
        return DeviceArray(views.reshaped(self.shape, shape), self.dtype, self.ptr, owner=self)

    def ravel(self) -> "DeviceArray":
        """A 1-d view of the same memory."""
        return self.reshape(-1)

    def copy(self) -> "DeviceArray":
        """A new array (its own memory) holding a copy of this one, copied on the GPU."""
        return DeviceArray.allocate(self.shape, self.dtype)._copy_from_device(self)

    def _copy_from_device(self, source: "DeviceArray") -> "DeviceArray":
        """Copy `source`'s bytes (as many as this array has) over this array's; returns self. Overlapping memory
        (`a[1:] = a[:-1]`) goes through a temporary: a device-to-device copy's regions may not overlap."""
        if not self.nbytes:
            return self
        if source.ptr < self.ptr + self.nbytes and self.ptr < source.ptr + self.nbytes:
            if source.ptr == self.ptr:
                return self
            source = source.copy()
        driver.copy_dtod(self.ptr, source.ptr, self.nbytes)
        return self

    def fill(self, value: Any) -> "DeviceArray":
        """Set every element to the scalar `value` (cast as numpy's `a.fill(value)` casts it, with its errors);
        returns self. A value whose bytes repeat a 1, 2 or 4-byte word (0, -1, any float32, 0.0 as float64) is
        set by the GPU's memset, others through a host array copied in."""
        scalar = np.empty((), self.dtype)
        scalar[()] = value
        word = _repeated_word(scalar.tobytes())
        if not self.nbytes:
            return self
        if word is None or self.ptr % len(word):
            self.copy_from_host(np.broadcast_to(scalar, self.shape))
        else:
            driver.memset(self.ptr, int.from_bytes(word, sys.byteorder), len(word), self.nbytes // len(word))
        return self

    def fill_zeros(self) -> "DeviceArray":
        """Set every byte to zero; returns self."""
        if self.nbytes:
            driver.memset_d8(self.ptr, 0, self.nbytes)
        return self

    def __dlpack_device__(self) -> tuple[int, int]:
        """(2, 0): DLPack's CUDA device type, GPU 0."""
        return (_KDL_CUDA, 0)

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """A DLPack capsule of this array, zero copy (`torch.from_dlpack`, `jax.dlpack.from_dlpack`,
        `cupy.from_dlpack` read it in place; the capsule keeps the array alive). `stream`: the consumer's (None
        or 1: the legacy default stream, which jitop's work is queued on; 2 or a handle: the GPU is synchronised
        first). A DLPack 0.x capsule ("dltensor"), which consumers asking for `max_version` (1, x) also read."""
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"__dlpack__: this array lives on DLPack device (2, 0), not {tuple(dl_device)}")
        if copy:
            raise BufferError("__dlpack__(copy=True): a DeviceArray is exported in place only")
        if stream not in (None, _LEGACY_STREAM):
            driver.synchronize()
        return export_dlpack(self)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3 of Numba's protocol: CuPy, torch and numba read this array in place. Its data is written by
        work on the legacy default stream, so consumers on other streams are told to wait for that one."""
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "strides": None,
                "version": 3, "stream": _LEGACY_STREAM}


class _PooledBlock:
    """The block of an array that owns its memory: back to the pool it came from when the array, its only
    holder, is collected (cheaper per array than a weakref.finalize; never at interpreter exit)."""

    __slots__ = ("pool", "lib", "ptr", "size")

    def __init__(self, pool: "BlockPool", lib: Any, ptr: int, size: int):
        self.pool, self.lib, self.ptr, self.size = pool, lib, ptr, size

    def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # bound when the class is made: an array kept in a module's global is collected at exit after that
        # module's globals (`sys` here) were set to None
        if not _finalizing():
            self.pool.give(self.lib, self.ptr, self.size)


class BlockPool:
    """Freed device blocks kept for reuse, by size class, up to `limit` bytes in all (the blocks given back longest
    ago are freed first once it is full). cuMemAlloc costs microseconds and cuMemFree waits for the whole device,
    so an array's memory comes back here when it is collected and the next array of its class takes it. Reuse is
    safe in stream order: jitop's work runs on the legacy default stream, after whatever the block's last owner
    queued. A block is kept per driver library, so a test's stand-in library never hands its blocks to the real one.

    Classes are multiples of GRANULE bytes below 4 KiB and eight per doubling above it (at most 1/8 wasted), so an
    array that grows a little per call (a decode loop's key/value cache, one row longer per token) takes the block
    its predecessor of the same class gave back instead of allocating every call.

    >>> [BlockPool.rounded(n) for n in (1, 513, 4096, 4097, 3 << 20)]
    [512, 1024, 4096, 4608, 3145728]
    """

    GRANULE = 512

    def __init__(self, limit: int = 1 << 30):
        self.limit, self.held = limit, 0
        self.in_use = 0  # bytes of the blocks live arrays hold (taken, not given back)
        # both ordered oldest first: a class's blocks (the newest is taken) and all blocks (the oldest are freed)
        self.blocks: dict[tuple[int, int], dict[int, None]] = {}  # (library id, size) -> addresses
        self.given: dict[tuple[int, int, int], None] = {}  # (library id, size, address)
        self.libraries: dict[int, Any] = {}  # id -> library, kept alive so its id is never reused
        # reentrant: a garbage collection inside a locked region may collect an array, whose block comes back here
        self.lock = threading.RLock()

    @staticmethod
    def rounded(nbytes: int) -> int:
        step = max(BlockPool.GRANULE, 1 << max(nbytes.bit_length() - 4, 0))
        return -(-nbytes // step) * step

    def take_class(self, size: int) -> tuple[int, int]:
        """(address, size) of a block of size class `size` (a size `rounded`: a call plan rounds its outputs'
        once): a pooled one, else a new allocation (after giving the pool's blocks back to the driver if it is
        out of memory)."""
        lib = driver.lib()
        with self.lock:
            free = self.blocks.get((id(lib), size))
            if free:
                ptr, _ = free.popitem()
                del self.given[id(lib), size, ptr]
                self.held -= size
                self.in_use += size
                return ptr, size
        try:
            ptr = driver.mem_alloc(size)
        except driver.CudaError as err:
            if err.name != "CUDA_ERROR_OUT_OF_MEMORY" or not self.held:
                raise
            self.drain()
            ptr = driver.mem_alloc(size)
        with self.lock:
            self.in_use += size
        return ptr, size

    def give(self, lib: Any, ptr: int, size: int) -> None:
        """A collected array's block: kept, after freeing the blocks given back longest ago if the pool would hold
        more than its limit; freed itself if it is larger than the limit."""
        if size > self.limit:
            with self.lock:
                self.in_use -= size
            driver._release(lib.cuMemFree_v2, ptr)
            return
        with self.lock:
            self.in_use -= size
            over = self.held + size - self.limit
            evicted = self._evict(over) if over > 0 else None
            self.libraries.setdefault(id(lib), lib)
            self.blocks.setdefault((id(lib), size), {})[ptr] = None
            self.given[id(lib), size, ptr] = None
            self.held += size
        if evicted:
            self._free(evicted)

    def _evict(self, nbytes: int) -> list[tuple[int, int, int]]:
        """Take at least `nbytes` of the oldest blocks out of the pool (under the lock); the caller frees them."""
        evicted = []
        while nbytes > 0:
            key = next(iter(self.given))
            del self.given[key]
            lib_id, size, ptr = key
            del self.blocks[lib_id, size][ptr]
            self.held -= size
            nbytes -= size
            evicted.append(key)
        return evicted

    def _free(self, blocks: list[tuple[int, int, int]]) -> None:
        for lib_id, _, ptr in blocks:
            driver._release(self.libraries[lib_id].cuMemFree_v2, ptr)

    def drain(self) -> None:
        """Free every pooled block."""
        with self.lock:
            blocks, self.blocks, self.given, self.held = list(self.given), {}, {}, 0
        self._free(blocks)

    def set_limit(self, nbytes: int) -> None:
        """Keep at most `nbytes` of freed blocks from now on (the blocks given back longest ago are freed now if
        more are held)."""
        if not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"the pool's limit must be a number of bytes >= 0, got {nbytes!r}")
        with self.lock:
            self.limit = nbytes
            evicted = self._evict(self.held - nbytes) if self.held > nbytes else None
        if evicted:
            self._free(evicted)


POOL = BlockPool(config.cuda_pool_limit())


def empty_cache() -> None:
    """Give every freed block jitop keeps for reuse back to the driver (as `torch.cuda.empty_cache()`): for
    another library on the same GPU that runs out of memory. Arrays alive keep theirs."""
    POOL.drain()


def memory_info() -> dict[str, int]:
    """jitop's GPU memory in bytes: "in_use" (the blocks of live device arrays jitop allocated), "pooled" (freed
    blocks kept for reuse: `empty_cache()` frees them) and "pool_limit" (the most it keeps:
    JITOP_CUDA_POOL_LIMIT, `set_pool_limit`). Sizes are of blocks (an array's bytes rounded up to its size
    class).

    >>> sorted(jitop.cuda.memory_info())
    ['in_use', 'pool_limit', 'pooled']
    """
    with POOL.lock:
        return {"in_use": POOL.in_use, "pooled": POOL.held, "pool_limit": POOL.limit}


def set_pool_limit(nbytes: int) -> None:
    """Keep at most `nbytes` of freed GPU memory for reuse (0: free every block when its array goes)."""
    POOL.set_limit(nbytes)


def empty(shape: Sequence[int] | int, dtype: Any) -> DeviceArray:
    """An uninitialized device array."""
    return DeviceArray.allocate((shape,) if isinstance(shape, int) else shape, dtype)


def zeros(shape: Sequence[int] | int, dtype: Any) -> DeviceArray:
    """A device array of zeros."""
    return empty(shape, dtype).fill_zeros()


def _repeated_word(data: bytes) -> bytes | None:
    """The shortest 1, 2 or 4-byte word that `data` repeats, or None."""
    for width in (1, 2, 4):
        if len(data) % width == 0 and data == data[:width] * (len(data) // width):
            return data[:width]
    return None


def _described(a: Any) -> str:
    if not isinstance(a, np.ndarray):
        return type(a).__name__
    layout = "C-contiguous" if a.flags.c_contiguous else "not C-contiguous"
    return f"shape {a.shape}, dtype {a.dtype.name}, {layout}{'' if a.flags.writeable else ', read-only'}"


def _unpadded(shape: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` without its leading size-1 dims (numpy assigns (1, n) into (n,) and back)."""
    k = 0
    while k < len(shape) and shape[k] == 1:
        k += 1
    return shape[k:]


def to_device(arr: Any, dtype: Any = None) -> DeviceArray:
    """A device copy of a host array (converted to `dtype` first if given)."""
    a = np.asarray(arr, dtype=dtype, order="C")
    if a.dtype.hasobject:
        raise TypeError(f"to_device needs a numeric array, got dtype {a.dtype}")
    d = DeviceArray.allocate(a.shape, a.dtype)
    d.copy_from_host(a)
    return d


def is_device_array(obj: Any) -> bool:
    """Whether `obj` is an array in GPU memory: jitop's, or anything with __cuda_array_interface__ (torch CUDA
    tensors, CuPy, numba); numpy arrays are not.

    >>> is_device_array(np.zeros(3)), is_device_array(type("T", (), {"__cuda_array_interface__": {}})())
    (False, True)
    """
    return type(obj) is DeviceArray or not isinstance(obj, np.ndarray) and hasattr(obj, "__cuda_array_interface__")


def declared_shape_dtype(obj: Any) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype a device array declares in its __cuda_array_interface__ (nothing is read)."""
    cai = obj.__cuda_array_interface__
    return tuple(int(d) for d in cai["shape"]), np.dtype(cai["typestr"])


def as_device_array(obj: Any) -> DeviceArray | None:
    """A DeviceArray for `obj` without copying: itself if it is one, a view if it has __cuda_array_interface__
    (torch CUDA tensors, CuPy, numba); None for anything else (numpy arrays included)."""
    if isinstance(obj, DeviceArray):
        return obj
    if isinstance(obj, np.ndarray):
        return None
    cai = getattr(obj, "__cuda_array_interface__", None)
    return None if cai is None else _from_interface(obj, cai)


def _from_interface(obj: Any, cai: dict[str, Any]) -> DeviceArray:
    what = f"the __cuda_array_interface__ of {type(obj).__name__}"
    if cai.get("mask") is not None:
        raise ValueError(f"{what} has a mask; masked arrays are not supported")
    shape, dtype = declared_shape_dtype(obj)
    if not _is_c_contiguous(shape, cai.get("strides"), dtype.itemsize):
        raise ValueError(f"{what} has strides {tuple(cai['strides'])} (shape {shape}, {dtype.itemsize}-byte items); "
                         f"GPU kernels need C-contiguous data (strides {views.c_strides(shape, dtype.itemsize)}): "
                         "pass a contiguous copy (.contiguous() in torch, cupy.ascontiguousarray)")
    stream = cai.get("stream")
    if stream == 0:
        raise ValueError(f"{what} names stream 0, which the protocol forbids (ambiguous)")
    if isinstance(stream, int) and stream > _PER_THREAD_STREAM:
        driver.stream_synchronize(stream)  # the producer's own stream: its writes must land before ours read
    return DeviceArray(shape, dtype, cai["data"][0] or 0, owner=obj)


# ** DLPack **
class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)  # PYFUNCTYPE: called with the GIL held, as numpy's needs


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_KDL_CUDA, _KDL_CUDA_MANAGED = 2, 13
_DL_CODES = {0: "i", 1: "u", 2: "f", 6: "b"}  # kDLInt, kDLUInt, kDLFloat, kDLBool
_capsule_api = ctypes.pythonapi
_capsule_api.PyCapsule_IsValid.restype, _capsule_api.PyCapsule_IsValid.argtypes = ctypes.c_int, [ctypes.py_object,
                                                                                                 ctypes.c_char_p]
_capsule_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_capsule_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_api.PyCapsule_SetName.restype, _capsule_api.PyCapsule_SetName.argtypes = ctypes.c_int, [ctypes.py_object,
                                                                                                 ctypes.c_char_p]


def read_dlpack_capsule(capsule: Any) -> tuple[int, tuple[int, int], tuple[int, ...], np.dtype, tuple[int, ...] | None]:
    """(data address, (device type, device id), shape, dtype, byte strides or None) of an unconsumed DLPack
    capsule, which stays unconsumed."""
    if not _capsule_api.PyCapsule_IsValid(capsule, b"dltensor"):
        raise ValueError("not an unconsumed DLPack capsule (named 'dltensor'); was it used already?")
    t = _DLManagedTensor.from_address(_capsule_api.PyCapsule_GetPointer(capsule, b"dltensor")).dl_tensor
    if t.code not in _DL_CODES or t.lanes != 1:
        raise ValueError(f"DLPack dtype (code {t.code}, {t.bits} bits, {t.lanes} lanes) has no numpy equivalent here")
    dtype = np.dtype(f"{_DL_CODES[t.code]}{t.bits // 8}") if t.code != 6 else np.dtype(bool)
    shape = tuple(t.shape[k] for k in range(t.ndim))
    strides = tuple(t.strides[k] * dtype.itemsize for k in range(t.ndim)) if t.strides else None  # elements -> bytes
    return (t.data or 0) + t.byte_offset, (t.device_type, t.device_id), shape, dtype, strides


_DL_CODE_OF = {"i": 0, "u": 1, "f": 2, "b": 6}
_capsule_api.PyCapsule_New.restype = ctypes.py_object
_capsule_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
# called on the capsule's raw pointer while it is destroyed (a py_object there would resurrect it)
_capsule_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_exported: dict[int, tuple[Any, ...]] = {}  # DLManagedTensor address -> what it needs alive until its deleter


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _release_export(address: int) -> None:
    """The deleter of an exported DLManagedTensor: its consumer is done (any thread; ctypes takes the GIL)."""
    _exported.pop(address, None)


@ctypes.PYFUNCTYPE(None, ctypes.c_void_p)
def _drop_unconsumed(capsule: int) -> None:
    """The capsule's destructor: a capsule no consumer took ("dltensor" still) releases its tensor itself."""
    if _capsule_valid_raw(capsule, b"dltensor"):
        _release_export(_capsule_pointer_raw(capsule, b"dltensor"))


def export_dlpack(arr: DeviceArray) -> Any:
    """A DLPack capsule ("dltensor") of `arr`'s memory, C-contiguous (strides NULL)."""
    if arr.dtype.kind not in _DL_CODE_OF or arr.dtype.byteorder == ">":
        raise BufferError(f"__dlpack__: dtype {arr.dtype} has no DLPack code here (ints, uints, floats, bool)")
    shape = (ctypes.c_int64 * max(arr.ndim, 1))(*arr.shape)
    managed = _DLManagedTensor()
    t = managed.dl_tensor
    t.data, t.device_type, t.device_id, t.ndim = arr.ptr or None, _KDL_CUDA, 0, arr.ndim
    t.code, t.bits, t.lanes = _DL_CODE_OF[arr.dtype.kind], arr.dtype.itemsize * 8, 1
    t.shape, t.strides, t.byte_offset = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)), None, 0
    managed.deleter = ctypes.cast(_release_export, ctypes.c_void_p)
    address = ctypes.addressof(managed)
    _exported[address] = (managed, shape, arr)
    return _capsule_api.PyCapsule_New(address, b"dltensor", ctypes.cast(_drop_unconsumed, ctypes.c_void_p))


def from_dlpack(obj: Any) -> DeviceArray:
    """A zero-copy DeviceArray of a CUDA array that speaks DLPack (`__dlpack__`, or a legacy capsule)."""
    if hasattr(obj, "__dlpack__"):
        device = tuple(obj.__dlpack_device__()) if hasattr(obj, "__dlpack_device__") else None
        if device is not None and device[0] not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
            raise ValueError(f"from_dlpack: {type(obj).__name__} lives on DLPack device {device}, not a CUDA GPU "
                             "(device type 2); use to_device for host arrays")
        capsule = obj.__dlpack__(stream=_LEGACY_STREAM)  # the producer orders its writes before our stream's work
    else:
        capsule = obj
    ptr, device, shape, dtype, strides = read_dlpack_capsule(capsule)
    if device[0] not in (_KDL_CUDA, _KDL_CUDA_MANAGED) or device[1] != 0:
        raise ValueError(f"from_dlpack: the array lives on DLPack device {device}; jitop uses CUDA GPU 0 (2, 0)")
    if not _is_c_contiguous(shape, strides, dtype.itemsize):
        raise ValueError(f"from_dlpack: strides {strides} (shape {shape}) are not C-contiguous; pass a contiguous copy")
    return _consume(capsule, DeviceArray(shape, dtype, ptr, owner=obj))


def _consume(capsule: Any, view: DeviceArray) -> DeviceArray:
    """Take over the capsule as DLPack says: rename it, then call its deleter when the view dies."""
    address = _capsule_api.PyCapsule_GetPointer(capsule, b"dltensor")
    _capsule_api.PyCapsule_SetName(capsule, b"used_dltensor")
    deleter = _DLManagedTensor.from_address(address).deleter
    if deleter:
        weakref.finalize(view, _DELETER(deleter), address)
    return view
