"""An ONNX model as plain Python data (the only module that imports the `onnx` package).

`read(model)` takes a path, the file's bytes or a `onnx.ModelProto` and returns a `Graph`: nodes with their
attributes as Python values, initializers as numpy arrays, the inputs and outputs with numpy dtypes and
shapes (a symbolic dim is its name, an unknown one None), and the default domain's opset. Everything after
this step (the operator table, the tracer, the compiled-model file) works on these objects alone.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Dim = int | str | None


@dataclass(frozen=True)
class ValueInfo:
    """A graph input or output: its name, numpy dtype and shape (a dim is an int, a symbol's name or None)."""

    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...] | None

    def describe(self) -> str:
        dims = "?" if self.shape is None else ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"


@dataclass
class Node:
    """One operator application: `outputs = op_type(inputs; attrs)`. An omitted optional input is ''."""

    op_type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""


@dataclass
class Graph:
    """A whole model: nodes in execution order, constants, the interface and the opset it was written for."""

    name: str
    nodes: list[Node]
    initializers: dict[str, np.ndarray]
    inputs: list[ValueInfo]
    outputs: list[ValueInfo]
    opset: int


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as e:  # pragma: no cover - the extra is installed where tests run
        raise ImportError("reading an .onnx model needs the onnx package: pip install 'jitop[onnx]' "
                          "(a compiled .jitop file loads without it)") from e
    return onnx


def read(model: Any) -> Graph:
    """The Graph of a model given as a path, the bytes of a .onnx file, or an onnx.ModelProto."""
    onnx = _onnx()
    if isinstance(model, (str, os.PathLike)):
        proto = onnx.load(os.fspath(model))
    elif isinstance(model, (bytes, bytearray, memoryview)):
        proto = onnx.ModelProto()  # parsed in place: onnx.load_from_string would take a bytes copy
        if proto.ParseFromString(model) not in (None, len(model)):
            raise ValueError("jitop.onnx.load: the model's bytes hold more than one ONNX model")
    elif isinstance(model, onnx.ModelProto):
        proto = model
    else:
        raise TypeError(f"jitop.onnx.load: model must be a path, the bytes of an .onnx file or an "
                        f"onnx.ModelProto, got {type(model).__name__}")
    return _graph(onnx, proto)


def _graph(onnx: Any, proto: Any) -> Graph:
    g = proto.graph
    numpy_helper = onnx.numpy_helper
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=1)
    nodes = [Node(n.op_type, n.name or f"{n.op_type}_{k}", list(n.input), list(n.output),
                  {a.name: _attribute(onnx, a) for a in n.attribute}, n.domain) for k, n in enumerate(g.node)]
    inputs = [_value_info(onnx, v) for v in g.input if v.name not in inits]
    outputs = [_value_info(onnx, v) for v in g.output]
    return Graph(g.name or "model", nodes, inits, inputs, outputs, opset)


def _attribute(onnx: Any, a: Any) -> Any:
    """An attribute's Python value; a tensor attribute becomes a numpy array, a string a str."""
    value = onnx.helper.get_attribute_value(a)
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    if isinstance(value, onnx.GraphProto):
        return value  # a subgraph (If/Loop/Scan): kept for the error that names the op
    return value


def _value_info(onnx: Any, v: Any) -> ValueInfo:
    t = v.type.tensor_type
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)) if t.elem_type else np.dtype("float32")
    if not t.HasField("shape"):
        return ValueInfo(v.name, dtype, None)
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)
    return ValueInfo(v.name, dtype, dims)
