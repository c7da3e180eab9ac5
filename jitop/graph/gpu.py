"""Traced graphs on an NVIDIA GPU: the same fusion decisions as on a CPU, one kernel per stage that is computed
to memory or per row group (`@jitop.kernel(target="cuda")`); jitop/graph/gpu_schedule.py schedules them:

- injective stages and reductions: a grid of threads, a block per output of a reduction;
- row groups (a layer norm, a softmax): a block per row computes the group's reductions and row-long
  intermediates (in shared memory) and the head's row, in one launch;
- float32 matmul of constant sizes, B unbatched (a batched A's rows stacked: [batch * m, k] @ [k, n], written
  in the node's shape from the register tiles or read through a view): the "cuda.matmul" template (topi.cuda's
  SGEMM: bm x bn block tiles, tm x tn register tiles per thread, bk-deep shared tiles of A and B fetched by all
  threads, guarded tails), with the config `pick` chooses for its task on the GPU Target: a record applied with
  jitop.apply_records or tuned into the cache (`jitop.tune(target="cuda")`), else the template's default.
  Producers fused into an operand (a transpose, a cast, a scale) are computed in the shared tiles' fill, its
  elementwise tail (bias, activation, residual: the CPU's epilogue rule) from the register tile, written in its
  place;
- a float32 matmul of constant sizes and at most GEMV_ROWS rows (a decode step's dense layers): the "cuda.gemv"
  template (topi.cuda_gemv: a block per few columns of a row, the reduction split over its threads and combined
  across them; no 64-row tile of padding), its operands read where the reduction reads them;
- other matmuls (B batched, other dtypes, an empty size): shared-memory tiles of views of A and B (whatever
  reshape or transpose produces them is computed in the fill), 16 x 16 outputs per block, one per thread, the
  batch on blockIdx.z;
- NCHW float32 conv2d with groups 1 and symmetric padding: the "cuda.conv2d" template (topi.cuda's implicit
  GEMM: output channels x pixels in block tiles, the im2col tile computed in the shared fill), its config picked
  as the SGEMM's; other convolutions (grouped, depthwise, NHWC, other dtypes) and other stages: one thread per
  output element.

Intermediates are workspaces the GPU function allocates on the device; numpy arguments are copied in and the
results copied back. Compiled kernels go to the persistent cache (kind "gpu": the graph's key, the configs of
its templated stages, the GPU target's, the LLVM version, jitop's code version), with the cubin where the
compiling machine has the GPU.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

import numpy as np

from jitop import te
from jitop.codegen.collector import deferring_full_collections
from jitop.codegen.target import llvm_version
from jitop.codegen.merge_kernels import merge_kernels
from jitop.driver import compile_gpu_func
from jitop.graph import prims
from jitop.graph.batching import batch_slices
from jitop.graph.capture import LiveArray
from jitop.graph.compile import Prepared, constant_array, distinct_outputs
from jitop.graph.kernel_cache import ComponentStore, graph_key
from jitop.graph.gpu_schedule import MATMUL_OPERAND, schedule_graph
from jitop.graph.schedule_rules import GraphIndex, row_candidates, template_epilogues
from jitop.graph.fusion import materialize
from jitop.graph.ir import Node, toposort
from jitop.graph.shapes import DEFAULT_REP
from jitop.graph.to_te import ToTE
from jitop.runtime.args import fits_constant_dims
from jitop.runtime.cuda.function import GpuFunction
from jitop.runtime.cuda.memory import DeviceArray, is_device_array
from jitop.runtime.executable import check_python_int, compile_guard, rebuilder
from jitop.target import CudaTarget
from jitop.te.tensor import Tensor
from jitop.tir.lower import lower
from jitop.tir.nodes import PrimFunc
from jitop.tuner import registry
from jitop.tuner.task import Choice, Task, pick

# arguments a call plan reads as they are: arrays (their shapes) and a size's value (an int)
_PLAIN_TYPES = (np.ndarray, DeviceArray, int)

# a graph primitive (or CPU template) -> its GPU templates, found through the registry, in order of preference:
# the first whose workload type takes the sizes computes it (a product of few rows is a GEMV: `gpu_workload`)
GPU_TEMPLATES = {"matmul": ("cuda.gemv", "cuda.matmul"), "conv2d": ("cuda.conv2d",)}


class GpuToTE(ToTE):
    """Tensor expressions for the GPU: plain reductions (threads split them, not SIMD partials); a matmul with a
    GPU task in `choices` is its GPU template's stages, any other a plain compute (no CPU template)."""

    vector_partials = False

    def binding(self, n: Node) -> Any:
        return None  # the GPU templates' workloads hold sizes (a symbolic row count: built_workload)

    def built_workload(self, n: Node, task: Task) -> Any:
        """A matmul whose row count is symbolic, or a convolution whose batch is, is built with it (its task holds
        a representative size)."""
        if n.prim == "conv2d":
            batch = n.src[0].shape[0]
            return task.workload if isinstance(batch, int) else replace(task.workload, n=batch)
        rows = _gemm_rows(n) if n.prim == "matmul" else None
        return task.workload if rows is None or isinstance(rows, int) else replace(task.workload, m=rows)

    def template(self, n: Node, readers: tuple) -> Tensor:
        if n in self.choices and n.prim == "matmul" and n.src[0].ndim > 2:
            return self._stacked_rows(n, readers)
        if n in self.choices:
            return super().template(n, readers)
        if n.prim == "conv2d":
            return self._direct_conv2d(n, readers)
        if n.prim != "matmul":
            raise NotImplementedError(f"'{n.prim}' has no GPU schedule yet; run this function on the CPU")
        name, dt = self.fresh_name("matmul"), n.dtype.name
        # the operands as the matmul sees them ([batch..., rows, cols], cast): their shared tiles are tiles of
        # these views, whatever reshape or transpose the readers compute (inlined into the tiles' fill)
        a, b = (te.compute(x.shape, lambda *i, read=read: read(i[:-2], i[-2], i[-1]).astype(dt), name=f"{name}.{v}",
                           tag=MATMUL_OPERAND) for x, read, v in zip(n.src, readers, "AB"))
        k = te.reduce_axis((0, a.shape[-1]), "k")

        def body(*i: Any) -> Any:
            batch = i[:-2]
            x = a[_broadcast(batch, a.shape[:-2]) + (i[-2], k)]
            return te.sum(x * b[_broadcast(batch, b.shape[:-2]) + (k, i[-1])], axis=k)
        t = te.compute(n.shape, body, name=name)
        self.st.kind[t] = "matmul"
        return t

    def _stacked_rows(self, n: Node, readers: tuple) -> Tensor:
        """A batched A times an unbatched B as the SGEMM of A's rows stacked ([batch..., m, k] read as
        [batch * m, k]), and a view of its [batch * m, n] result in the node's shape (kind "view": inlined into
        its readers, computed by a kernel of its own only where it is a result)."""
        read_a, read_b = readers
        batch, m = n.src[0].shape[:-2], n.src[0].shape[-2]

        def stacked(_: tuple, i: Any, r: Any) -> Any:
            return read_a(_unravel(i // m, batch), i % m, r)
        out = super().template(n, (stacked, read_b))
        view = te.compute(n.shape, lambda *i: out[_ravel(i[:-2], batch) * m + i[-2], i[-1]],
                          name=self.fresh_name("rows"))
        self.st.kind[view] = "view"
        self.st.views[view] = out  # an epilogue of the node is computed from the SGEMM's register tile
        return view

    def _direct_conv2d(self, n: Node, readers: tuple) -> Tensor:
        """A convolution the implicit GEMM does not take (grouped, depthwise, NHWC, asymmetric padding, another
        dtype): each output element sums its window (one thread per element); taps outside the image read 0."""
        read_x, read_w = readers
        x, w = n.src
        nchw = n.param("layout") == "NCHW"
        h, width = x.shape[2:] if nchw else x.shape[1:3]
        per_group, kh, kw = w.shape[1:]
        out_per_group = w.shape[0] // n.param("groups")
        (sh, sw), (dh, dw) = n.param("stride"), n.param("dilation")
        top, _, left, _ = n.param("pads")
        rc, rr, rs = (te.reduce_axis((0, e), name) for e, name in ((per_group, "rc"), (kh, "rr"), (kw, "rs")))
        dt = n.dtype.name

        def body(*i: Any) -> Any:
            b, o, y, xx = i if nchw else (i[0], i[3], i[1], i[2])
            hh, ww = y * sh + rr * dh - top, xx * sw + rs * dw - left
            tap = read_x(b, o // out_per_group * per_group + rc, hh, ww).astype(dt)
            if any(n.param("pads")):
                inside = (hh >= 0) & (hh < h) & (ww >= 0) & (ww < width)
                tap = te.if_then_else(inside, tap, te.const(0, dt))
            return te.sum(tap * read_w(o, rc, rr, rs).astype(dt), axis=[rc, rr, rs])
        t = te.compute(n.shape, body, name=self.fresh_name("conv2d"))
        self.st.kind[t] = "direct"
        return t


def _unravel(flat: Any, dims: tuple) -> tuple:
    """The index into an array of shape `dims` of its C-order flat position `flat`."""
    index = []
    for d in reversed(dims[1:]):
        index.append(flat % d)
        flat = flat // d
    return (flat, *reversed(index))


def _ravel(index: tuple, dims: tuple) -> Any:
    """The C-order flat position of `index` in an array of shape `dims`."""
    flat = index[0]
    for i, d in zip(index[1:], dims[1:]):
        flat = flat * d + i
    return flat


def _broadcast(batch: tuple, shape: tuple) -> tuple:
    """The index into an operand's batch dims (right-aligned, size-1 dims broadcast) for the output's."""
    own = batch[len(batch) - len(shape):] if shape else ()
    return tuple(0 if isinstance(d, int) and d == 1 else i for i, d in zip(own, shape))  # a symbol is never 1


class GpuExecutable:
    """A traced function compiled for a GPU: `call(values)` takes the traced function's argument values.
    `guards`: relations of a symbolic function's symbols that every call's shapes must satisfy (`accepts`)."""

    def __init__(self, function: Any, inputs: list[tuple[str, Any]], result_slots: list[int],
                 guards: Sequence[str] = (), stored_as: str | None = None,
                 choices: Sequence[tuple[Task, Choice]] = ()):
        self.function, self.inputs, self.result_slots = function, inputs, result_slots
        # its GPU cache entry's content key (None: not stored) and its templated stages' tasks and configs: what
        # a warm record names (jitop.graph.warm)
        self.stored_as, self.choices = stored_as, list(choices)
        self.guards = [(g, compile_guard(g)) for g in guards]
        self._rebuild: Any = None  # the result tree's builder, compiled once (`rebuilder`)
        self._constants: dict[int, tuple[Any, Any]] = {}  # input -> (its device copy, the host bytes copied)
        # the argument each input is, when every input is one as it is (no constants, casts or scalars other than
        # a size's value, which the GPU function takes as the int it is)
        plain = all(kind == "arg" or kind == "scalar" and k in function.sizes and len(what) == 2
                    for k, (kind, what) in enumerate(inputs))
        self._plain = [what if kind == "arg" else what[0] for kind, what in inputs] if plain else None
        self._direct = False  # whether a call is the GPU function's call on the arguments as they are (set_result)

    @property
    def symbolic(self) -> bool:
        """Whether one compiled function serves many shapes (symbolic dims, or guards on them)."""
        return bool(self.function.symbols or self.guards)

    def accepts(self, values: Sequence[Any]) -> bool:
        """Whether `values` (numpy or device arrays, or stand-ins of their shapes) fit the compiled signature:
        ranks, dtypes, constant and tied dims, guards. What a dispatcher asks before it serves a new size with
        this function."""
        if self._plain is not None and all(type(values[k]) in _PLAIN_TYPES for k in self._plain):
            return self._accepts_arrays([values[k] for k in self._plain])
        shaped = []
        for (kind, what), p in zip(self.inputs, self.function.params):
            value = what if kind in ("const", "live") else values[what if kind == "arg" else what[0]]
            shape = tuple(np.shape(value)) if kind != "arg" else getattr(value, "shape", None)
            if shape is None or not fits_constant_dims(p.shape, tuple(shape)):
                return False
            if kind == "arg" and np.dtype(value.dtype) != p.dtype:
                return False
            shaped.append(np.asarray(value) if kind == "scalar" else SimpleNamespace(shape=shape))  # (a size's value)
        try:
            env = dict(zip((s.name for s in self.function.symbols), self.function.binder.bind(shaped)))
        except ValueError:  # a tied dim disagrees, or a size beyond its symbol's type
            return False
        return all(holds(env) for _, holds in self.guards)

    def _accepts_arrays(self, arrays: list) -> bool:
        """`accepts` for a function called on its arguments as they are, numpy or jitop device arrays: checked as
        the call checks them (which then finds them checked), and the guards hold at the symbols' values."""
        try:
            values = self.function.symbol_values(arrays)
        except (TypeError, ValueError, AttributeError):  # a dtype, rank or dim that does not fit, a size too large
            return False
        env = dict(zip((s.name for s in self.function.symbols), values))
        return all(holds(env) for _, holds in self.guards)

    def set_result(self, tree: Any) -> None:
        self._rebuild = rebuilder(tree, len(self.result_slots)) if tree is not None else None
        fn, n_outs = self.function, len(self.result_slots)
        passes_through = ["out", 0, False] if n_outs == 1 else ["tuple", [["out", k, False] for k in range(n_outs)]]
        self._direct = (self._plain == list(range(fn.n_inputs)) and len(fn.params) - fn.n_inputs == n_outs
                        and self.result_slots == list(range(n_outs)) and tree == passes_through)

    def call(self, values: Sequence[Any]) -> Any:
        if self._direct and len(values) == len(self._plain):
            # the function's own results: host arrays for host arguments, device arrays for device arguments
            return self.function(*values)
        if self._plain is not None:
            arrays = [values[k] for k in self._plain]
        else:
            arrays = [self._argument(k, kind, what, values) for k, (kind, what) in enumerate(self.inputs)]
        outs = self.function(*arrays)
        outs = outs if isinstance(outs, tuple) else (outs,)
        if not any(map(is_device_array, values)):
            # host arrays in, host arrays out (the constants, kept on the GPU, would make them device arrays)
            outs = tuple(o.get() if isinstance(o, DeviceArray) else o for o in outs)
        flat = [outs[k] for k in self.result_slots]
        return self._rebuild(flat) if self._rebuild is not None else (flat[0] if len(flat) == 1 else flat)

    def _argument(self, k: int, kind: str, what: Any, values: Sequence[Any]) -> Any:
        if kind == "arg":
            return values[what]
        if kind == "arg_swapped":
            pos, dtype = what
            return np.asarray(values[pos]).astype(dtype)
        if kind == "scalar":
            if len(what) > 2:  # a Python int must fit every integer dtype it meets, as numpy checks
                check_python_int(values[what[0]], what[2])
            return np.asarray(values[what[0]], dtype=what[1])
        held = self._constants.get(k)
        if kind == "live":  # a captured array, read as it is now (as numpy and the CPU kernels do)
            if held is None or not same_bytes(what, held[1]):
                self._constants[k] = held = (_upload(what), what.copy())  # the copy: to see a later change
            return held[0]
        if held is None:  # a constant of jitop's own (nothing writes it) goes to the device once
            self._constants[k] = held = (_upload(what), None)
        return held[0]


def _upload(array: np.ndarray) -> DeviceArray:
    from jitop.runtime.cuda import memory
    return memory.to_device(np.asarray(array, order="C"))  # asarray: ascontiguousarray makes a 0-d array 1-d


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays of one dtype and shape hold the same bits (a NaN equals itself, -0.0 differs from 0.0):
    one pass over each, as unsigned integers of the dtype's size.

    >>> same_bytes(np.array([np.nan, 1.0]), np.array([np.nan, 1.0])), same_bytes(np.zeros(2), -np.zeros(2))
    (True, False)
    """
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(a.dtype.itemsize)
    if bits is None:
        return a.tobytes() == b.tobytes()
    return bool(np.array_equal(a.view(bits), b.view(bits)))


@deferring_full_collections
def compile_graph_gpu(name: str, inputs: list[Node], input_names: list[str], input_plan: list[tuple[str, Any]],
                      results: list[Node], target: CudaTarget, guards: Sequence[str] = (),
                      reps: Mapping[Any, int] | None = None,
                      bounds: Mapping[str, tuple[int, int]] | None = None) -> GpuExecutable:
    """The graph computing `results` as a GPU function (see the module's docstring): from the persistent cache
    when a process compiled it before (its PTX and, where it was linked on a GPU, its cubin), else compiled,
    linked for this machine's GPU if it has one, and stored. `guards`: a symbolic graph's relations between
    its symbols, which the calls it serves must satisfy (GpuExecutable.accepts), and `bounds` the range they
    leave each symbol (lowering proves accesses in bounds with them); `reps`: the size each symbolic matmul row
    count's config is decided at (tasks.row_buckets)."""
    outputs, unique, consts, choices = _graph_parts(results, target, reps)
    # a captured array (live: its owner may change it in place) is compared with what was uploaded on each call
    plan = input_plan + [("live" if isinstance(n.param("data"), LiveArray) else "const", constant_array(n))
                         for n in consts]
    slots = [unique.index(o) for o in outputs]
    bounds = dict(bounds or {})
    content = _cache_content(name, inputs, input_names, input_plan, outputs, unique, choices, target, guards,
                             bounds)
    stored = stored_executable(content, plan, slots, guards, choices.values()) if content is not None else None
    if stored is not None:
        return stored
    function = compile_gpu_func(lower_graph(name, inputs, input_names, unique, consts, choices, target,
                                            bounds=bounds), target)
    if content is not None:
        _link_if_possible(function)
        GPU_STORE.put(content, function.to_bytes())
    return GpuExecutable(function, plan, slots, guards, content, choices.values())


GPU_STORE = ComponentStore("gpu")


def stored_executable(content: str, plan: list[tuple[str, Any]], slots: list[int], guards: Sequence[str],
                      choices: Any) -> GpuExecutable | None:
    """The GPU function stored under `content`, called through `plan` (checked against its parameters: a plan
    that does not fit is None), or None where none is stored; an entry that does not load is removed."""
    blob = GPU_STORE.get(content)
    if blob is None:
        return None
    try:
        function = GpuFunction.from_bytes(blob, "a cached GPU kernel")
    except ValueError:
        GPU_STORE.delete(content)  # damaged or foreign: compile it again
        return None
    n_outputs = len(function.params) - function.n_inputs
    if len(plan) != function.n_inputs or not all(0 <= k < n_outputs for k in slots) or not all(
            _fits(kind, what, p) for (kind, what), p in zip(plan, function.params)):
        return None
    return GpuExecutable(function, plan, list(slots), guards, content, choices)


def _fits(kind: str, what: Any, param: Any) -> bool:
    """Whether a plan entry can feed `param`: a constant of its dtype and shape, a value converted to its
    dtype (an argument as it is is checked on each call)."""
    if kind in ("const", "live"):
        return what.dtype == param.dtype and fits_constant_dims(param.shape, what.shape)
    if kind in ("arg_swapped", "scalar"):
        return np.dtype(what[1]) == param.dtype
    return kind == "arg"


def _graph_parts(results: list[Node], target: CudaTarget, reps: Mapping[Any, int] | None = None,
                 notes: list[str] | None = None) -> tuple[list[Node], list[Node], list[Node], dict]:
    """A traced graph as the GPU compiles it (a loop over slices batched: one kernel per stage, not one per slice;
    `notes`, if given, receives batching's decisions): its results (one node each), its distinct results, its
    array constants and its templated nodes' (task, config)."""
    outputs = distinct_outputs(batch_slices(results, notes))
    unique = list(dict.fromkeys(outputs))
    return outputs, unique, read_constants_of(unique), gpu_choices(unique, target, reps)


def lower_trace(name: str, inputs: list[Node], input_names: list[str], results: list[Node],
                target: CudaTarget, notes: list[str] | None = None, reps: Mapping[Any, int] | None = None,
                bounds: Mapping[str, tuple[int, int]] | None = None
                ) -> tuple[PrimFunc, dict[Node, tuple[Task, Choice]]]:
    """The GPU loop IR of a traced graph exactly as compile_graph_gpu lowers it (parameters: the inputs, the
    array constants, the distinct results), and the task and config of each templated node: for explain() and
    for tests that run the loop IR."""
    batch_notes: list[str] = []
    _, unique, consts, choices = _graph_parts(results, target, reps, batch_notes)
    if notes is not None:
        notes += [f"slice batching: {d}" for d in batch_notes]
    return lower_graph(name, inputs, input_names, unique, consts, choices, target, notes, bounds), choices


def explain_gpu(name: str, exe: GpuExecutable, trace: Any, cached: bool, target: CudaTarget,
                shapes: list[str] | None = None) -> str:
    """explain()'s text for a traced function compiled for the GPU (the loop IR lowered again for display);
    `shapes`: the symbols block (explain.shape_lines)."""
    from jitop.graph.explain import describe_gpu
    from jitop.graph.to_te import choice_line
    notes: list[str] = []
    func, choices = lower_trace(name, trace.inputs, trace.names, trace.results, target, notes, trace.reps,
                                trace.bounds)
    templates = [choice_line(f"{task.template} #{k}", task, choice, target)
                 for k, (task, choice) in enumerate(choices.values())]
    return describe_gpu(name, trace, cached, target, templates, notes, exe.function.built.kernels, func, shapes)


def _cache_content(name: str, inputs: list[Node], input_names: list[str], input_plan: list[tuple[str, Any]],
                   outputs: list[Node], unique: list[Node], choices: dict[Node, tuple[Task, Choice]],
                   target: CudaTarget, guards: Sequence[str], bounds: dict[str, tuple[int, int]]) -> str | None:
    """The cache's content key of a GPU kernel: the traced graph's key (with a symbolic graph's guards and the
    bounds lowering relied on), the configs its templated stages are built with (another record applied is
    another kernel) and the GPU target's (None when the graph has no stable key)."""
    prep = Prepared(name, inputs, input_names, input_plan, outputs, unique, {}, choices, target, list(guards),
                    bounds=bounds)
    graph = graph_key(prep)
    configs = json.dumps([[task.key, choice.config.as_dict()] for task, choice in choices.values()])
    return None if graph is None else f"{graph}|{configs}|{target.key}|{llvm_version()}"


def gpu_task(n: Node, target: CudaTarget, reps: Mapping[Any, int] | None = None) -> Task | None:
    """The GPU template's task of a matmul or conv2d node: the first of its GPU_TEMPLATES whose workload type
    takes the node's sizes ("cuda.gemv": a float32 matmul of constant sizes and at most GEMV_ROWS rows;
    "cuda.matmul": 2-D float32 of constant, non-zero sizes; "cuda.conv2d": NCHW float32, groups 1, symmetric
    padding: `from_cpu` of the node's CPU workload); None for any other node.

    A matmul whose rows (or A's batch) are symbolic and its n and k constant is the SGEMM's task at a
    representative row count (`reps`: tasks.row_buckets', else DEFAULT_REP), built with the symbolic one
    (GpuToTE.built_workload). A conv2d of a symbolic batch is the task at its template's `symbolic_batch`, built
    with the symbolic one; one with a symbolic image size raises NotImplementedError: the GPU function is then
    traced with constant sizes (the direct convolution, the one that takes symbolic sizes, is far slower than
    the implicit GEMM)."""
    names = GPU_TEMPLATES.get(n.prim, ())
    if not names:
        return None
    fields = prims.get(n.prim).workload(n)
    found = gpu_workload(n.prim, SimpleNamespace(**fields))
    if found is not None:
        return Task(*found, target)
    name = names[-1]  # the general template, at representative sizes
    workload_type = registry.get(name).workload_type
    if n.prim == "matmul" and not isinstance(_gemm_rows(n), int):
        rep = (reps or {}).get(fields["m"], DEFAULT_REP) if not isinstance(fields["m"], int) else fields["m"]
        batch = [d if isinstance(d, int) else DEFAULT_REP for d in fields["a_batch"]]
        fields = {**fields, "m": rep, "a_batch": tuple(batch)}
    elif n.prim == "conv2d" and not all(isinstance(d, int) for d in (*n.src[0].shape, *n.src[1].shape)):
        if not all(isinstance(d, int) for d in (*n.src[0].shape[1:], *n.src[1].shape)):
            raise NotImplementedError("a convolution with a symbolic image size or channel count has no GPU "
                                      "template (the implicit GEMM takes a symbolic batch only): traced with "
                                      "constant sizes")
        fields = {**fields, "n": workload_type.symbolic_batch}
    else:
        return None
    workload = workload_type.from_cpu(SimpleNamespace(**fields))
    return None if workload is None else Task(name, workload, target)


def gpu_workload(kind: str, cpu_workload: Any) -> tuple[str, Any] | None:
    """The first of GPU_TEMPLATES[kind] whose workload type takes `cpu_workload` (a CPU workload, or its fields
    as attributes), and the GPU workload it makes of it; None where none does."""
    for name in GPU_TEMPLATES.get(kind, ()):
        workload = registry.get(name).workload_type.from_cpu(cpu_workload)
        if workload is not None:
            return name, workload
    return None


def _gemm_rows(n: Node) -> Any:
    """A matmul's GEMM rows: A's rows times its batch (an int, or a symbolic expression)."""
    return math.prod(n.src[0].shape[:-1]) if n.src[0].ndim >= 2 else 1


def gpu_choices(unique: list[Node], target: CudaTarget,
                reps: Mapping[Any, int] | None = None) -> dict[Node, tuple[Task, Choice]]:
    """Each node computed by a GPU template, with its task and the config `pick` chooses for it (a record applied
    or tuned into the cache for this GPU Target, else the template's default); `reps`: see gpu_task."""
    tasks = {n: gpu_task(n, target, reps) for n in toposort(unique)}
    return {n: (task, pick(task)) for n, task in tasks.items() if task is not None}


def _link_if_possible(function: GpuFunction) -> None:
    """Link the PTX for this machine's GPU now, so the stored entry carries the cubin (a warm process then skips
    the driver's PTX JIT too); without a GPU, the entry holds the PTX alone."""
    from jitop.runtime.cuda import driver
    if driver.available():
        function.link()


def lower_graph(name: str, inputs: list[Node], input_names: list[str], unique: list[Node], consts: list[Node],
                choices: dict[Node, tuple[Task, Choice]], target: CudaTarget,
                notes: list[str] | None = None, bounds: Mapping[str, tuple[int, int]] | None = None) -> PrimFunc:
    """The GPU loop IR of the graph computing `unique`: parameters are the inputs, then the constants `consts`,
    then the results; every stage scheduled by its kind (`schedule_stage`) or its template. `notes`, if given,
    receives a line per decision explain() shows (epilogues, row groups); `bounds`: the symbols' ranges their
    guards leave (accesses proved in bounds with them are not checked at run time)."""
    why = materialize(unique)
    lowering = GpuToTE(why, target, choices)
    placeholders = [lowering.placeholder(n, nm) for n, nm in zip(inputs, input_names)]
    placeholders += [lowering.placeholder(n, f"const{len(placeholders) + k}") for k, n in enumerate(consts)]
    for n in toposort(unique, skip=lambda n: n in lowering.st.placeholders):
        if n in why:
            lowering.tensor(n)
    tensors = [lowering.tensor(n) for n in unique]
    st, index = lowering.st, GraphIndex(unique)
    # a template's elementwise tail (bias, activation, residual) is computed from its register tile
    found = template_epilogues(st, unique, why, index)
    epilogues = {t: st.tensors[out] for out, t in found.items()}
    for view, t in st.views.items():
        if view in tensors and t not in epilogues:
            epilogues[t] = view  # a result in the node's shape: the SGEMM's stacked rows written from registers
    rows = {st.tensors[head]: [st.tensors[m] for m in members]
            for head, members in row_candidates(st, unique, why, found, index).items()}
    s = schedule_graph(st, tensors, epilogues, rows, placeholders, target, notes)
    if notes is not None:
        notes[:0] = [f"{e.op.name} is computed from {t.op.name}'s register tile (its epilogue)"
                     for t, e in epilogues.items()]
    return merge_kernels(lower(s, placeholders + tensors, name=name, bounds=bounds), target, notes)


def read_constants_of(unique: list[Node]) -> list[Node]:
    """The graph's array constants, in argument order (nothing is prepacked on the GPU)."""
    return [n for n in toposort(unique) if n.prim == "array_const"]
