"""An ONNX model as one compiled jitop kernel.

`Program` runs the graph's nodes through the operator table (jitop.onnx.ops) on whatever it is given: on
tracers inside `@jitop.kernel` that is the trace, so the whole model becomes one jitop graph (fused, tasks
picked or tuned, cached on disk like any traced function). `Model` is what `jitop.onnx.load` returns: the
interface (names, dtypes, shapes) and the calls (`model(x)`, `model(data=x)`, `model.run(names, feeds)`).
"""
from __future__ import annotations

import hashlib
import inspect
import keyword
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jitop.errors import FallbackError
from jitop.graph.ir import adopt, adopted
from jitop.graph.tracer import Tracer
from jitop.kernel import KernelFunction, kernel
from jitop.onnx.ops import OPS, Op, OnnxError
from jitop.onnx.proto import Dim, Graph, ValueInfo
from jitop.runtime.cuda.memory import declared_shape_dtype, is_device_array


class Program:
    """The graph's nodes in order, run on values: numpy arrays (known while tracing) or traced arrays."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.input_names = [v.name for v in graph.inputs]
        self.output_names = [v.name for v in graph.outputs]
        # outputs that do not depend on the inputs (a Constant, the Shape of a fixed-shape input): a traced run
        # returns None in their place, and they are kept here (output index -> value) to be filled in
        self.constants: dict[int, np.ndarray] = {}
        # the weights are the program's own (never written): a trace takes them as constants without a copy
        self.weights = [c for c in map(adopt, graph.initializers.values()) if c is not None]

    def __call__(self, *inputs: Any) -> tuple:
        with adopted(self.weights):
            return self._run(inputs)

    def _run(self, inputs: tuple) -> tuple:
        env: dict[str, Any] = dict(self.graph.initializers)
        env.update(zip(self.input_names, inputs))
        opset = self.graph.opset
        for n in self.graph.nodes:
            args = [env[i] if i else None for i in n.inputs]
            while args and args[-1] is None:  # trailing optional inputs left out
                args.pop()
            node = Op(n.op_type, n.name, n.attrs, opset, len(n.outputs))
            try:
                result = OPS[n.op_type].convert(node, *args)
            except (OnnxError, NotImplementedError):
                raise
            except (TypeError, ValueError, IndexError) as err:
                raise node.error(f"{type(err).__name__}: {err}") from err
            results = result if isinstance(result, tuple) else (result,)
            for name, value in zip(n.outputs, results):
                if name:
                    env[name] = value
        outputs = [env[o] for o in self.output_names]
        if not inputs or any(isinstance(v, Tracer) for v in inputs):  # (a model without inputs: traced too)
            for k, v in enumerate(outputs):
                if not isinstance(v, Tracer):
                    self.constants[k] = _constant_output(self.output_names[k], v)
                    outputs[k] = None
        return tuple(outputs)

    def fill(self, results: tuple) -> tuple:
        """A traced run's results with its constant outputs filled in."""
        return tuple(self.constants[k] if r is None else r for k, r in enumerate(results))


def _called(kernel_fn: KernelFunction, values: Sequence[Any]) -> tuple:
    """The kernel's results. A converter's OnnxError is raised as itself: the kernel wraps an error of the trace
    that the function run as numpy does not raise (a Reshape to a shape computed from the data converts on numpy
    arrays, not on traced ones) in a FallbackError, as jitop's failure rather than the model's."""
    try:
        return kernel_fn(*values)
    except FallbackError as err:
        cause = err.__cause__
        while cause is not None and not isinstance(cause, OnnxError):
            cause = cause.__cause__
        if cause is None:
            raise
        raise cause from None


def _constant_output(name: str, value: Any) -> np.ndarray:
    a = np.asarray(value)
    if a.dtype == object:
        raise OnnxError(f"model output {name!r} is a symbolic shape; pin the input shapes (shapes=) to return it")
    return a


def parameter_names(inputs: Sequence[ValueInfo]) -> list[str]:
    """Python identifiers for the model's inputs (an ONNX name such as 'input.1' becomes 'input_1')."""
    names: list[str] = []
    for k, v in enumerate(inputs):
        name = re.sub(r"\W", "_", v.name) or f"input{k}"
        if name[0].isdigit() or keyword.iskeyword(name):
            name = f"_{name}"
        while name in names:
            name += "_"
        names.append(name)
    return names


def compiled_kernel(graph: Graph, shapes: Sequence[tuple[Dim, ...] | None],
                    target: str | None = None) -> tuple[KernelFunction, Program]:
    """The model as a @jitop.kernel (and the Program it traces): one positional parameter per input; the dims
    that are not numbers in `shapes` (symbols, unknown) are traced as symbols from the first call (on a GPU,
    a convolution with a symbolic image size is traced at the call's sizes instead: its template takes a
    symbolic batch only)."""
    program = Program(graph)
    params = parameter_names(graph.inputs)

    def run(*inputs: Any) -> tuple:
        return program(*inputs)

    run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params])
    run.__name__ = re.sub(r"\W", "_", graph.name) or "model"
    run.__qualname__ = f"{run.__name__}_{_digest(graph)}"
    run.__module__ = "jitop.onnx"
    dynamic = {p: tuple(k for k, d in enumerate(s) if not isinstance(d, int))
               for p, s in zip(params, shapes) if s is not None}
    dynamic = {p: d for p, d in dynamic.items() if d}
    return kernel(run, fallback=False, dynamic=dynamic or False, target=target), program


def _digest(graph: Graph) -> str:
    """A short name for the model's structure (the function's identity in the cache's per-function records)."""
    h = hashlib.sha256()
    for n in graph.nodes:
        h.update(f"{n.op_type}|{n.inputs}|{n.outputs}|{sorted(n.attrs.items(), key=str)!r}\n".encode())
    return h.hexdigest()[:12]


class Model:
    """A loaded ONNX model: call it with numpy arrays, get numpy arrays (jitop.onnx.load makes one).

    `inputs` / `outputs`: name, numpy dtype and shape of each (a dim is an int, a symbol's name, or None).
    `model(x)`, `model(data=x)`: one output is an array, several a tuple; `model.run(output_names, feeds)` is
    onnxruntime's InferenceSession.run (a list). `kernel`: the @jitop.kernel it runs (explain, profile, tuning
    tasks); None for a model loaded from a compiled .jitop file. `target`: None (this CPU) or the GPU target it
    was loaded for.
    """

    def __init__(self, inputs: list[ValueInfo], outputs: list[ValueInfo], runner: Callable[[list], tuple],
                 kernel_fn: KernelFunction | None = None, name: str = "model", executables: Sequence[Any] = (),
                 constants: Mapping[int, np.ndarray] | None = None):
        self.inputs, self.outputs, self.name = inputs, outputs, name
        self.kernel = kernel_fn
        self._executables = list(executables)  # a model loaded from a .jitop file runs these
        self._constants = constants if constants is not None else {}  # outputs that depend on no input
        self._runner = runner

    @staticmethod
    def from_graph(graph: Graph, target: str | None = None) -> "Model":
        """The Model running `graph` as one @jitop.kernel (on `target`: None, this CPU, or "cuda")."""
        kernel_fn, program = compiled_kernel(graph, [v.shape for v in graph.inputs], target)
        return Model(graph.inputs, graph.outputs, lambda values: program.fill(_called(kernel_fn, values)), kernel_fn,
                     graph.name, constants=program.constants)

    @property
    def target(self) -> Any:
        """The GPU Target the model runs on (a jitop.target.CudaTarget), or None: this CPU."""
        return None if self.kernel is None else self.kernel.gpu

    def __repr__(self) -> str:
        ins = ", ".join(v.describe() for v in self.inputs)
        outs = ", ".join(v.describe() for v in self.outputs)
        where = "" if self.target is None else f" on {self.target.arch}"
        return f"<jitop.onnx.Model {self.name!r} ({ins}) -> ({outs}){where}>"

    def __call__(self, *args: Any, **feeds: Any) -> Any:
        results = self._runner(self.arguments(args, feeds))
        return results[0] if len(results) == 1 else results

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """onnxruntime's signature: the named outputs (None: all) for the inputs in `feeds`."""
        results = self._runner(self.arguments((), dict(feeds)))
        names = [o.name for o in self.outputs]
        if output_names is None:
            return list(results)
        unknown = [n for n in output_names if n not in names]
        if unknown:
            raise ValueError(f"run: unknown output name(s) {unknown}; the model's outputs are {names}")
        return [results[names.index(n)] for n in output_names]

    def compile(self, shapes: Mapping[str, Sequence[int]] | None = None) -> "Model":
        """Compile for these input shapes now (default: the declared ones, a symbolic dim at 1) by running the
        model once on zeros; returns the model."""
        shapes = dict(shapes or {})
        zeros = {}
        for v in self.inputs:
            dims = shapes.get(v.name) or tuple(d if isinstance(d, int) else 1 for d in (v.shape or ()))
            zeros[v.name] = np.zeros(tuple(int(d) for d in dims), v.dtype)
        self(**zeros)
        return self

    def executables(self) -> list[Any]:
        """The compiled code that serves calls now (jitop.runtime.Executable, one per signature compiled)."""
        if self.kernel is None:
            return list(self._executables)
        return [ov.exe for ov in self.kernel.dispatcher.overloads() if ov.exe is not None]

    def save(self, path: str) -> None:
        """Write the executables compiled so far, with the weights, to one file `jitop.onnx.load` reads back
        without the onnx package (jitop.onnx.compiled)."""
        from jitop.onnx import compiled
        if self.target is not None:
            raise NotImplementedError(f"{self.name}: a model loaded for the GPU ({self.target.arch}) cannot be "
                                      "saved to a .jitop file yet (that file holds CPU code); its kernels are in "
                                      "jitop's disk cache, so a new process loads them without compiling")
        data = compiled.dumps(self.name, self.inputs, self.outputs, self.executables(), self._constants)
        with open(path, "wb") as f:
            f.write(data)

    def arguments(self, args: Sequence[Any], feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """The inputs in the model's order, checked: every input given once, with its dtype, rank and fixed dims."""
        names = [v.name for v in self.inputs]
        if len(args) > len(names):
            raise TypeError(f"{self.name}: takes {len(names)} input(s) ({', '.join(names)}), got {len(args)}")
        given = dict(zip(names, args))
        for name, value in feeds.items():
            if name not in names:
                raise TypeError(f"{self.name}: unknown input {name!r}; the inputs are {names}")
            if name in given:
                raise TypeError(f"{self.name}: input {name!r} given twice")
            given[name] = value
        missing = [n for n in names if n not in given]
        if missing:
            raise TypeError(f"{self.name}: missing input(s) {missing}")
        gpu = self.target is not None
        return [_checked_on_device(v, given[v.name]) if gpu and is_device_array(given[v.name])
                else _checked(v, given[v.name]) for v in self.inputs]


def _checked_on_device(info: ValueInfo, value: Any) -> Any:
    """A device array given to a GPU model (jitop's, torch's, CuPy's: __cuda_array_interface__), checked as
    `_checked` checks a host array; used in place."""
    shape, dtype = declared_shape_dtype(value)
    _check_dtype_and_shape(info, dtype, shape)
    return value


def _check_dtype_and_shape(info: ValueInfo, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    if dtype != info.dtype:
        raise TypeError(f"input {info.name!r}: expected dtype {info.dtype}, got {dtype} (convert it with "
                        f".astype(np.{info.dtype.name}))")
    if info.shape is not None:
        ok = len(shape) == len(info.shape) and all(not isinstance(d, int) or d == s for d, s in zip(info.shape, shape))
        if not ok:
            want = "(" + ", ".join(str(d) if d is not None else "?" for d in info.shape) + ")"
            raise ValueError(f"input {info.name!r}: expected shape {want}, got {shape}")


def _checked(info: ValueInfo, value: Any) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        if not isinstance(value, (np.generic, int, float, bool, list, tuple)):
            raise TypeError(f"input {info.name!r}: expected a numpy array of {info.dtype}, got "
                            f"{type(value).__name__}")
        value = np.asarray(value, info.dtype)
    _check_dtype_and_shape(info, value.dtype, value.shape)
    return value if value.flags.c_contiguous else np.ascontiguousarray(value)  # (ascontiguousarray makes 0-d 1-d)
