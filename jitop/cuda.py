"""jitop on NVIDIA GPUs, in one place: device arrays (`to_device`, `empty`, `zeros`, `from_dlpack`, `.get()`;
they export `__cuda_array_interface__` and `__dlpack__`), the memory jitop keeps for reuse (`memory_info`,
`empty_cache`, `set_pool_limit`), the driver (`available`, `synchronize`, streams and events) and this machine's
GPU as a build target. Importing it needs no GPU; `available()` says whether one is usable and
`unavailable_reason()` why not.

>>> import jitop
>>> jitop.cuda.available() in (True, False)
True
>>> jitop.cuda.target().kind   # this GPU's, else an H100's (sm_90): code builds without a GPU
'cuda'
"""
from __future__ import annotations

from jitop.driver import cuda_target as target
from jitop.runtime.cuda import (CudaError, CudaUnavailableError, DeviceArray, Event, Stream, as_device_array,
                                available, device_attributes, empty, empty_cache, from_dlpack, memory_info,
                                set_pool_limit, synchronize, to_device, unavailable_reason, zeros)

__all__ = ["CudaError", "CudaUnavailableError", "DeviceArray", "Event", "Stream", "as_device_array", "available",
           "device_attributes", "empty", "empty_cache", "from_dlpack", "memory_info", "set_pool_limit", "synchronize",
           "target", "to_device", "unavailable_reason", "zeros"]
