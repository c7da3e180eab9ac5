"""jitop: a numpy-compatible JIT compiler for tensor operators, on llvmlite.

>>> import numpy as np, jitop
>>> from jitop import te
>>> A = te.placeholder((1000,), "float32", name="A")
>>> B = te.compute((1000,), lambda i: te.exp(A[i]) + 1.0, name="B")
>>> s = jitop.create_schedule(B.op)
>>> xo, xi = s[B].split(B.op.axis[0], factor=16)
>>> s[B].vectorize(xi)
>>> f = jitop.build(s, [A, B])
>>> a = np.ones(1000, np.float32)
>>> bool(np.allclose(f(a), np.exp(a) + 1))
True
"""
from jitop import config as _config
from jitop import te
from jitop import topi as _topi  # noqa: F401 - registers the operator templates (matmul, conv2d)
from jitop.errors import JitopError, TargetMismatchError
from jitop.runtime import fastcall as _fastcall
from jitop.runtime import parallel as _parallel
from jitop.target import Target
from jitop.driver import build, lower
from jitop import cuda  # device arrays, the driver, this GPU's target
from jitop.errors import FallbackError, JitopFallbackWarning, JitopRecompileWarning
from jitop.graph import kernel_cache as _kernel_cache
from jitop.kernel import explain, kernel, profile
from jitop.ops import (avg_pool2d, batch_matmul, batch_norm, conv2d, dense, gelu, global_avg_pool2d, layer_norm, log_softmax,
                       matmul, max_pool2d, relu, sigmoid, softmax)
from jitop.runtime.module import Module, load_module
from jitop.schedule.schedule import Schedule, Stage, create_schedule
from jitop.tuner.apply import apply_records
from jitop.tuner.task import add_source as _add_schedule_source
from jitop.tuner.tuning import tune

__version__ = "0.1.0"

# the thread pool and the native call entry keep their object code in the persistent cache (read where
# JITOP_CACHE_DIR points when each is first needed)
_parallel.use_object_store(lambda: _kernel_cache.ComponentStore("pool"))
_fastcall.use_object_store(lambda: _kernel_cache.ComponentStore("fastcall"))


def _cached_schedule(task):  # noqa: ANN001, ANN202 - pick's source; the tuner's modules load on first use
    """Tuned (or transferred) configs from the persistent cache (jitop.tuner.cached)."""
    from jitop.tuner.cached import cache_source
    return cache_source(task)


_add_schedule_source(_cached_schedule)
__all__ = ["te", "cuda", "build", "lower", "create_schedule", "load_module", "Module", "Schedule", "Stage", "kernel",
           "explain", "profile", "FallbackError", "JitopError", "TargetMismatchError", "Target", "JitopFallbackWarning", "JitopRecompileWarning", "__version__",
           "tune", "apply_records",
           # operator library (jitop.ops on jitop.topi templates)
           "matmul", "dense", "batch_matmul", "softmax", "log_softmax", "layer_norm", "batch_norm", "relu", "gelu",
           "sigmoid", "max_pool2d", "avg_pool2d", "global_avg_pool2d", "conv2d"]
