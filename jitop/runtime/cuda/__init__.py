"""jitop's NVIDIA GPU runtime: the CUDA driver API through ctypes (`driver`) and device arrays (`memory`).

Importing it needs no GPU; `available()` says whether one is usable, and `unavailable_reason()` why not.
"""
from jitop.runtime.cuda.driver import (CudaError, CudaUnavailableError, Context, Event, Function, LaunchLimits,
                                       Module, Stream, available, context, device_attributes, link_ptx,
                                       synchronize, unavailable_reason)
from jitop.runtime.cuda.memory import (DeviceArray, as_device_array, empty, empty_cache, from_dlpack, memory_info,
                                       set_pool_limit, to_device, zeros)

__all__ = ["CudaError", "CudaUnavailableError", "Context", "DeviceArray", "Event", "Function", "LaunchLimits",
           "Module", "Stream", "as_device_array", "available", "context", "device_attributes", "empty",
           "empty_cache", "from_dlpack", "link_ptx", "memory_info", "set_pool_limit", "synchronize", "to_device",
           "unavailable_reason", "zeros"]
