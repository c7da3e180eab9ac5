"""A traced graph -> one compiled Module plus the plan for calling it (inputs, constants, outputs)."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

import jitop
from jitop.graph import schedule_rules
from jitop.graph.fusion import Group, groups, materialize
from jitop.graph.ir import Node, node, toposort
from jitop.graph.to_te import ToTE
from jitop.runtime.module import Module


@dataclass
class Plan:
    """How a call's arguments become the kernel's arrays."""

    inputs: list[tuple[str, Any]]            # ("arg", position) | ("scalar", (position, dtype)) | ("const", array)
    outputs: list[tuple[tuple[int, ...], np.dtype]]
    result_slots: list[int]                  # flat function result k -> output array index
    n_scratch: int = 0                       # trailing output buffers that are only intermediates


@dataclass
class Executable:
    """A compiled traced function: call with the argument values of the original function."""

    module: Module
    plan: Plan
    groups: list[Group] = field(default_factory=list)
    func: Any = None  # the lowered loop IR, for explain()
    templates: list[str] = field(default_factory=list)  # operator templates and their configs, for explain()

    def __post_init__(self) -> None:
        self.run = _specialised_runner(self.plan, self.module)


def _specialised_runner(plan: Plan, module: Module) -> Callable[[Sequence[Any]], list[np.ndarray]]:
    """run(args) -> outputs, generated as straight-line Python for this plan (the per-call hot path)."""
    n_real = len(plan.outputs) - plan.n_scratch
    env: dict[str, Any] = {"call": module.call_arrays, "check": module.raise_if_error,
                           "contiguous": np.ascontiguousarray, "asarray": np.asarray}
    lines = ["def run(args):"]
    names = []
    for k, (kind, what) in enumerate(plan.inputs):
        name = f"i{k}"
        names.append(name)
        if kind == "arg":
            lines += [f"    {name} = args[{what}]", f"    f = {name}.flags",
                      f"    if not (f.c_contiguous and f.aligned): {name} = contiguous({name})"]
        elif kind == "arg_swapped":
            env[f"dt{k}"] = what[1]
            lines.append(f"    {name} = contiguous(args[{what[0]}], dt{k})")
        elif kind == "scalar":
            env[f"dt{k}"] = what[1]
            lines.append(f"    {name} = asarray(args[{what[0]}], dt{k})")
        else:
            env[f"c{k}"] = what
            lines.append(f"    {name} = c{k}")
    for k, (shape, dt) in enumerate(plan.outputs):
        env[f"alloc{k}"] = _allocator(shape, dt, scratch=k >= n_real)
        lines.append(f"    o{k} = alloc{k}()")
        names.append(f"o{k}")
    lines.append(f"    call({', '.join(names)})")
    if module.checked:
        lines.append("    check()")
    lines.append(f"    return [{', '.join(f'o{k}' for k in plan.result_slots)}]")
    exec("\n".join(lines), env)  # noqa: S102 - generated from the plan above, no user input
    return env["run"]


REUSE_BYTES = 1 << 20  # outputs this big are recycled once the caller has dropped them


def _allocator(shape: tuple[int, ...], dt: np.dtype, scratch: bool = False) -> Callable[[], np.ndarray]:
    """A fresh output array. A big one reuses the previous call's result if nothing references it any more:
    its pages are already mapped, which saves the page faults that otherwise dominate memory-bound kernels.
    Scratch buffers (intermediates) are always recycled that way."""
    if math.prod(shape) * dt.itemsize < REUSE_BYTES and not scratch:
        return lambda: np.empty(shape, dt)
    spare: list[np.ndarray] = []

    def alloc() -> np.ndarray:
        try:
            a = spare.pop()  # atomic: two threads never get the same array
        except IndexError:
            a = None
        if a is None or sys.getrefcount(a) > 2:  # someone still holds it (the local and the call's argument)
            a = np.empty(shape, dt)
        spare.append(a)
        return a
    return alloc




def _fresh(r: Node) -> Node:
    # an output that is an input or a constant still gets its own array, written by the kernel
    return node("copy", r.shape, r.dtype, (r,)) if r.prim in ("arg", "scalar_arg", "array_const", "const") else r


def compile_graph(name: str, inputs: list[Node], input_names: list[str], input_plan: list[tuple[str, Any]],
                  results: list[Node]) -> Executable:
    """Fuse, lower to te, schedule and build the graph computing `results` from `inputs`."""
    # every returned array is its own buffer, even if two results are the same expression
    seen: set[Node] = set()
    outputs = []
    for k, r in enumerate(results):
        r = _fresh(r)
        if r in seen:
            r = node("copy", r.shape, r.dtype, (r,), slot=k)
        seen.add(r)
        outputs.append(r)
    unique = list(dict.fromkeys(outputs))
    why = materialize(unique)
    lowering = ToTE(why)
    placeholders = [lowering.placeholder(n, nm) for n, nm in zip(inputs, input_names)]
    for n in toposort(unique):
        if n.prim == "array_const" and n not in lowering.st.placeholders:
            placeholders.append(lowering.placeholder(n, f"const{len(placeholders)}"))
            input_plan = input_plan + [("const", np.frombuffer(n.param("data"), n.dtype.np).reshape(n.shape))]
    out_tensors = [lowering.tensor(n) for n in unique]
    sch = schedule_rules.apply(lowering.st, unique, why)
    schedule_rules.undo_wide_row_fusion(sch, placeholders + out_tensors)
    # root intermediates become scratch arguments: recycled across calls instead of malloc'd per call
    scratch = [t for st in sch.stages if not st.is_placeholder and st.attach_type == "root"
               and st.op not in {o.op for o in out_tensors} for t in st.outputs]
    func = jitop.lower(sch, placeholders + out_tensors + scratch, name=name)
    from jitop.driver import compile_func
    from jitop.target import Target
    module = compile_func(func, Target.current())
    buffers = [(n.shape, n.dtype.np) for n in unique] + [(t.shape, t.dtype.np) for t in scratch]
    plan = Plan(input_plan, buffers, [unique.index(o) for o in outputs], n_scratch=len(scratch))
    return Executable(module, plan, groups(unique, why), func, list(lowering.st.chosen.values()))
