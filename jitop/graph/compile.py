"""The compile pipeline: a traced graph -> an Executable (object code for a Target + the plan for calling it).

One straight line of small named steps (fuse, tasks, pick, to_te, row fusion, schedule, lower, codegen,
plan), each visible to `explain` and replaceable; the tuner and the cache plug in at `pick` and around it.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from jitop import dtypes, te
from jitop.codegen.collector import deferring_full_collections
from jitop.driver import compile_func, default_target, printed_dim
from jitop.graph import schedule_rules
from jitop.graph.batching import batch_slices
from jitop.graph.fusion import groups as fusion_groups
from jitop.graph.fusion import fuse_operands, materialize
from jitop.graph.ir import ConstData, Node, node, toposort
from jitop.graph.layout import channels_last
from jitop.graph.tasks import binding as task_binding
from jitop.graph.tasks import extract_tasks
from jitop.graph.to_te import ToTE
from jitop.runtime.executable import Executable, Plan
from jitop.schedule.schedule import Schedule
from jitop.target import Target
from jitop.te.tensor import Tensor
from jitop.tir.lower import lower
from jitop.tir.padding import fold_padding, padding
from jitop.tir.storage import plan_arena, storage
from jitop.tuner import registry
from jitop.tuner.task import Choice, Task, pick


@dataclass
class Prepared:
    """The pipeline up to `pick`: what the cache key is made of (the graph, the tasks and their choices)."""

    name: str
    inputs: list[Node]
    input_names: list[str]
    input_plan: list[tuple[str, Any]]
    outputs: list[Node]                       # one node per returned array
    unique: list[Node]                        # the outputs without repeats: the kernel's output buffers
    why: dict[Node, str]                      # the nodes that get a loop nest of their own, and why
    choices: dict[Node, tuple[Task, Choice]]  # each templated node's task and the config picked for it
    target: Target
    guards: list[str] = field(default_factory=list)  # relations the shape symbols must satisfy ("x_0 >= 5")
    # templated node -> its constant weights as its template packs them (made once here, not on each call)
    packed: dict[Node, list[np.ndarray]] = field(default_factory=dict)
    rewrites: list[str] = field(default_factory=list)  # what the graph rewrites decided (`rewritten`'s notes)
    bounds: dict[str, tuple[int, int]] = field(default_factory=dict)  # symbol -> the range its guards leave it


def compile_graph(name: str, inputs: list[Node], input_names: list[str], input_plan: list[tuple[str, Any]],
                  results: list[Node], target: Target | None = None, profile: bool = False,
                  guards: Sequence[str] = (), reps: dict | None = None,
                  bounds: dict[str, tuple[int, int]] | None = None) -> Executable:
    """Compile the graph computing `results` from `inputs` for `target` (default: `default_target()`);
    `profile`: a build that counts the time spent in each loop nest (see jitop.runtime.profile); `guards`:
    the relations its shape symbols must satisfy (see `prepare`)."""
    return build(prepare(name, inputs, input_names, input_plan, results, target, guards, reps, bounds), profile)


def prepare(name: str, inputs: list[Node], input_names: list[str], input_plan: list[tuple[str, Any]],
            results: list[Node], target: Target | None = None, guards: Sequence[str] = (),
            reps: dict | None = None, bounds: dict[str, tuple[int, int]] | None = None) -> Prepared:
    """The first, cheap steps of the pipeline: fusion decisions, tasks and the config `pick` chooses for each.
    `guards`: what the trace relied on about its shape symbols (printed relations), checked on every call, and
    `bounds` the range they leave each symbol (lowering proves accesses with them); `reps`: the size each
    symbolic matmul row count's config is decided at (tasks.row_buckets)."""
    target = target or default_target()
    # every returned array is its own buffer, even if two results are the same expression (after `rewritten`)
    rewrites: list[str] = []
    outputs = distinct_outputs(rewritten(results, rewrites))
    unique = list(dict.fromkeys(outputs))
    # fuse: which nodes get their own loop nest, and why (TVM's operator classes)
    why = materialize(unique, padded_tails=True)
    # tasks: each matmul/conv2d as (template, workload, target), the unit a config is chosen and tuned for
    tasks = extract_tasks(why, target, reps)
    # pick: a config per task (tuned record if a source has one, else the template's default for the Target)
    choices = pick_all(tasks)
    # prepack: a template's copy of constant weights (packed panels) is made now, once
    packed = prepack_all(choices, target)
    return Prepared(name, inputs, input_names, input_plan, outputs, unique, why, choices, target, list(guards),
                    packed, rewrites, dict(bounds or {}))


@deferring_full_collections
def build(prep: Prepared, profile: bool = False) -> Executable:
    """The rest of the pipeline, from tensor expressions to loaded object code and the call plan."""
    target, why, unique, choices = prep.target, prep.why, prep.unique, prep.choices
    # operands: a producer the template would re-evaluate per panel is computed once unless free to recompute
    operand_decisions = fuse_operands(why, operand_reads(choices, target))
    # to_te: tensor expressions; injective producers inline as index math, templates build with their config
    graph = to_te(prep)
    st = graph.lowering.st
    # dead stages: a value that folded away in its reader (an int `x.sum() * 0` is 0) is computed by no one
    why = schedule_rules.drop_unread(st, graph.outputs, why)
    # epilogues: elementwise outputs computed on a matmul/conv register tile (bias, residual, activation)
    index = schedule_rules.GraphIndex(unique)  # readers and order, shared by the two rules below
    epilogues = schedule_rules.template_epilogues(st, unique, why, index)
    # row fusion: from bound inference on a probe, before anything is scheduled
    rows, row_decision = schedule_rules.row_groups(st, unique, why, target, epilogues, index)
    # schedule: template epilogues on the register tile, row-fused outputs, every other stage by its kind
    sch = schedule_rules.apply(st, unique, target, epilogues, rows)
    # lower: root intermediates become scratch arguments, recycled across calls instead of malloc'd
    scratch = scratch_tensors(sch, graph.outputs)
    func = lower(sch, graph.placeholders + graph.outputs + scratch, name=prep.name, bounds=prep.bounds)
    # padding: a convolution's padded copy of an intermediate becomes where that intermediate is written
    func = fold_padding(func, len(scratch), target.lanes(4))
    n_scratch = len(func.params) - len(graph.placeholders) - len(graph.outputs)
    # storage: the intermediates share one arena, a dead one's bytes reused (the activations stay in cache)
    func = plan_arena(func, n_scratch)
    scratch_bufs = func.params[len(graph.placeholders) + len(graph.outputs):]
    if profile:
        func.attrs["profile"] = True
    # codegen: LLVM object code for the Target (loaded only if this machine can run it)
    module = compile_func(func, target)
    # plan: how a call's arguments become the kernel's arrays and its outputs the function's results
    buffers = [(_printed(n.shape), n.dtype.np) for n in unique] + [(_printed(b.shape), b.dtype.np) for b in scratch_bufs]
    plan = Plan(graph.input_plan, buffers, [unique.index(o) for o in prep.outputs], n_scratch=len(scratch_bufs),
                guards=list(prep.guards))
    return Executable(module, plan, groups=fusion_groups(unique, why), func=func,
                      templates=list(st.chosen.values()),
                      decisions=[f"storage: {storage(func)}", f"padding: {padding(func)}"]
                      + [f"operand fusion: {d}" for d in operand_decisions] + [f"row fusion: {row_decision}"]
                      + [f"slice batching: {d}" for d in prep.rewrites])


def _printed(shape: tuple) -> tuple[int | str, ...]:
    return tuple(printed_dim(d) for d in shape)


def constant_nodes(unique: list[Node]) -> list[Node]:
    """The graph's array constants, in the order they become kernel arguments after the inputs."""
    return [n for n in toposort(unique) if n.prim == "array_const"]


def constant_array(n: Node) -> np.ndarray:
    """An array constant's data as the kernel reads it (a captured array: its own memory, read in place)."""
    data = n.param("data")
    return data.array if isinstance(data, ConstData) else np.frombuffer(data, n.dtype.np).reshape(n.shape)


def kernel_constants(prep: Prepared) -> list[np.ndarray]:
    """The arrays a call passes after its arguments: the constants the kernel reads, then the prepacked
    weights."""
    return [constant_array(n) for n in read_constants(prep)] + [a for arrays in prep.packed.values() for a in arrays]


def read_constants(prep: Prepared) -> list[Node]:
    """The graph's array constants the kernel reads, in argument order: a weight read only through its
    prepacked copies is left out (the kernel and a saved executable carry it once, packed)."""
    packed_only = {n.src[1] for n in prep.packed}
    for n in toposort(prep.unique):
        for k, s in enumerate(n.src):
            if s in packed_only and not (k == 1 and n in prep.packed):
                packed_only.discard(s)
    return [n for n in constant_nodes(prep.unique) if n not in packed_only]


PARALLEL_PACK_BYTES = 8 << 20  # below this, starting threads costs more than packing on one core


def prepack_all(choices: dict[Node, tuple[Task, Choice]], target: Target) -> dict[Node, list[np.ndarray]]:
    """Each templated node whose weights (second operand) are a constant array (not a captured array, which
    the kernel reads as it is at each call) -> the arrays its template packs them into."""
    # task_of flags exactly these: constant weights of a template that prepacks
    jobs = {n: (task, choice) for n, (task, choice) in choices.items() if task.constant_weights}

    def pack(n: Node) -> list[np.ndarray]:
        task, choice = jobs[n]
        return registry.get(task.template).prepack(task.workload, choice.config, target, constant_array(n.src[1]))
    # numpy's copies release the GIL: a model's weights (ResNet-50: 98 MB, 0.2 s on one core) pack on every core,
    # on a warm load too
    workers = _pack_workers([constant_array(n.src[1]).nbytes for n in jobs], target)
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            packed = dict(zip(jobs, pool.map(pack, jobs)))
    else:
        packed = {n: pack(n) for n in jobs}
    return {n: arrays for n, arrays in packed.items() if arrays}


def _pack_workers(sizes: list[int], target: Target) -> int:
    """Threads to pack weights of these sizes (bytes) on: one below PARALLEL_PACK_BYTES in all."""
    if sum(sizes) < PARALLEL_PACK_BYTES:
        return 1
    return min(len(sizes), os.cpu_count() or 1, max(1, target.threads))


def graph_tasks(results: list[Node], target: Target | None = None) -> list[Task]:
    """The tasks (matmul/conv2d workloads) compiling `results` would pick configs for, in graph order, one
    per templated node (a task used twice is listed twice: it runs twice per call)."""
    unique = list(dict.fromkeys(distinct_outputs(rewritten(results))))
    return list(extract_tasks(materialize(unique, padded_tails=True), target or default_target()).values())


def rewritten(results: list[Node], notes: list[str] | None = None) -> list[Node]:
    """The traced graph as the CPU compiles it: a loop over slices joined by a concatenation batched
    (jitop.graph.batching; `notes`, if given, receives its decisions), NCHW convolutions channels-last
    (jitop.graph.layout)."""
    return channels_last(batch_slices(results, notes))


def distinct_outputs(results: list[Node]) -> list[Node]:
    """One node per returned array: inputs and constants get a copy, a repeated result a second copy."""
    seen: set[Node] = set()
    outputs = []
    for k, r in enumerate(results):
        if r.prim in ("arg", "scalar_arg", "array_const", "const"):
            r = node("copy", r.shape, r.dtype, (r,))
        if r in seen:
            r = node("copy", r.shape, r.dtype, (r,), slot=k)
        seen.add(r)
        outputs.append(r)
    return outputs


def flops_at(prep: Prepared, env: Any) -> int:
    """The templates' flops at the sizes the trace of `env` (a jitop.graph.shapes.ShapeEnv) had: a symbolic
    task's own `flops` are at its representative sizes."""
    return sum(int(task.concrete({name: env.hint(e) for name, e in task_binding(n).items()}).flops)
               for n, (task, _) in prep.choices.items())


def pick_all(tasks: dict[Node, Task]) -> dict[Node, tuple[Task, Choice]]:
    """Each task with the Choice `pick` made for it."""
    return {n: (task, pick(task)) for n, task in tasks.items()}


def operand_reads(choices: dict[Node, tuple[Task, Choice]], target: Target) -> dict[Node, tuple[int, ...]]:
    """Each templated node -> how many times its template, with the chosen config, reads each operand element."""
    return {n: registry.get(task.template).operand_reads(task.workload, choice.config, target)
            for n, (task, choice) in choices.items()}


@dataclass
class TEGraph:
    """The tensor expressions of a graph: argument placeholders (inputs, then constants) and outputs."""

    lowering: ToTE
    placeholders: list[Tensor]
    outputs: list[Tensor]
    input_plan: list[tuple[str, Any]]


def to_te(prep: Prepared) -> TEGraph:
    """Placeholders for the arguments, then the constants in `kernel_constants`' order (those the kernel reads,
    the prepacked weights); tensors for the outputs."""
    lowering = ToTE(prep.why, prep.target, prep.choices)
    placeholders = [lowering.placeholder(n, nm) for n, nm in zip(prep.inputs, prep.input_names)]
    for n in read_constants(prep):
        placeholders.append(lowering.placeholder(n, f"const{len(placeholders)}"))
    for n, arrays in prep.packed.items():
        lowering.packed[n] = [te.placeholder(a.shape, dtypes.as_dtype(a.dtype), f"packed{len(placeholders) + k}")
                              for k, a in enumerate(arrays)]
        placeholders.extend(lowering.packed[n])
    input_plan = prep.input_plan + [("const", c) for c in kernel_constants(prep)]  # passed from the plan
    # producers first: each stage's inputs already have their tensors, so building one never recurses into
    # the stages before it (a deep program would exhaust Python's stack)
    for n in toposort(prep.unique, skip=lambda n: n in lowering.st.placeholders):
        if n in prep.why:
            lowering.tensor(n)
    outputs = [lowering.tensor(n) for n in prep.unique]
    return TEGraph(lowering, placeholders, outputs, input_plan)


def scratch_tensors(sch: Schedule, outputs: list[Tensor]) -> list[Tensor]:
    """Root stages that are not outputs: intermediates that need a buffer of their own."""
    out_ops = {o.op for o in outputs}
    return [t for st in sch.stages if not st.is_placeholder and st.attach_type == "root" and st.op not in out_ops
            for t in st.outputs]
