"""The operator library's user-facing functions (numpy in, numpy out); templates live in jitop.topi."""
from jitop.ops.linalg import batch_matmul, dense, matmul
from jitop.ops.nn import batch_norm, gelu, layer_norm, log_softmax, relu, sigmoid, softmax

__all__ = ["matmul", "dense", "batch_matmul", "softmax", "log_softmax", "layer_norm", "batch_norm", "relu",
           "gelu", "sigmoid"]
from jitop.ops.pool import avg_pool2d, global_avg_pool2d, max_pool2d  # noqa: E402

__all__ += ["max_pool2d", "avg_pool2d", "global_avg_pool2d"]
from jitop.ops.conv import conv2d  # noqa: E402

__all__ += ["conv2d"]
