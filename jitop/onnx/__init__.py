"""ONNX models through jitop: `load` a model, call it with numpy arrays (the tvmc / onnxruntime flow).

The graph becomes one jitop graph (traced through the operator table, jitop.onnx.ops): fused, scheduled from
the tuning records, compiled on its first call and cached on disk like any @jitop.kernel. Reading a .onnx file
needs the `onnx` package (`pip install 'jitop[onnx]'`); a model compiled to a .jitop file does not.

>>> import numpy as np, jitop.onnx
>>> from onnx import helper, TensorProto
>>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
>>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
>>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
>>> model = jitop.onnx.load(helper.make_model(g))
>>> model(np.array([[-1.0, 0.0, 2.0, -3.0]], np.float32)).tolist()
[[0.0, 0.0, 2.0, 0.0]]
"""
from __future__ import annotations

import mmap
import os
from typing import Any, Mapping, Sequence

from jitop.errors import UnsupportedOperatorError
from jitop.onnx import compiled
from jitop.onnx.model import Model
from jitop.onnx.ops import OPS, OnnxError
from jitop.onnx.proto import Dim, Graph, ValueInfo, read
from jitop.onnx.rewrite import check, fold_batch_norm

__all__ = ["load", "Model", "OnnxError", "UnsupportedOperatorError", "ValueInfo", "supported_ops"]


def load(model: Any, shapes: Mapping[str, Sequence[int]] | None = None, target: str | None = None) -> Model:
    """A callable Model from an ONNX model (a path, the file's bytes or an onnx.ModelProto), or from a model
    compiled to a .jitop file (`Model.save`, `jitop compile`; needs no onnx package).

    shapes: input name -> its shape, pinning symbolic dims (`{"data": (1, 3, 224, 224)}`); a dim left
    symbolic serves every size with one kernel (jitop's symbolic shapes). target: None runs the model on this
    CPU; "cuda" on this machine's NVIDIA GPU (`@jitop.kernel(target="cuda")`: numpy inputs are copied to the GPU
    and the outputs back, the weights stay there; a kernel per input shape; "cuda -arch=sm_90" builds PTX
    without a GPU). Raises UnsupportedOperatorError naming every operator type the model uses that jitop lacks,
    OnnxError for an unsupported attribute.
    """
    data = _file_bytes(model)
    if data is not None and compiled.is_compiled(data):
        if shapes:
            raise ValueError("shapes= applies to an .onnx model; a compiled .jitop model has its shapes already")
        if target is not None:
            raise ValueError(f"target={target!r} applies to an .onnx model; a compiled .jitop model runs on the "
                             "CPU it was compiled for")
        name, inputs, outputs, exes, constants = compiled.loads(data)
        return Model(inputs, outputs, compiled.runner(exes, inputs, constants), None, name, exes, constants)
    graph = read(model if data is None else data)
    check(graph)
    fold_batch_norm(graph)
    graph.inputs = _pinned(graph, dict(shapes or {}))
    return Model.from_graph(graph, target)


def _file_bytes(model: Any) -> bytes | memoryview | None:
    """The bytes of a model given as a path (mapped, not read: protobuf parses the mapping, and a .jitop
    file's weights are read from it once) or bytes (None for a ModelProto)."""
    if isinstance(model, (str, os.PathLike)):
        with open(model, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return b""
            return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model)
    return None


def supported_ops() -> list[str]:
    """The ONNX operator types jitop converts (default domain).

    >>> "Conv" in supported_ops()
    True
    """
    return sorted(OPS)


def _pinned(graph: Graph, shapes: dict[str, Sequence[int]]) -> list[ValueInfo]:
    names = [v.name for v in graph.inputs]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise ValueError(f"shapes= names {unknown}, which are not inputs of the model (its inputs: {names})")
    out = []
    for v in graph.inputs:
        if v.name not in shapes:
            out.append(v)
            continue
        pin = tuple(int(d) for d in shapes[v.name])
        if v.shape is not None and (len(pin) != len(v.shape) or
                                    any(isinstance(d, int) and d != p for d, p in zip(v.shape, pin))):
            raise ValueError(f"shapes[{v.name!r}] = {pin} does not fit the model's input {v.describe()}")
        out.append(ValueInfo(v.name, v.dtype, pin))
    return out
