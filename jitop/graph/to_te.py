"""Graph -> tensor expressions: one te stage per materialized node, injective nodes inlined as index math.

Each primitive's emitter or stage builder is in its jitop.graph.prims entry (written in te_rules)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from jitop import te
from jitop.graph import prims, tasks
from jitop.graph.ir import Node
from jitop.graph.te_rules import Index
from jitop.target import Target
from jitop.te.expr import Expr
from jitop.tuner import registry
from jitop.tuner.task import Choice, Task


@dataclass
class Stages:
    """The te tensors of a lowered graph and what the scheduler needs to know about them."""

    placeholders: dict[Node, te.Tensor] = field(default_factory=dict)
    tensors: dict[Node, te.Tensor] = field(default_factory=dict)      # materialized node -> its tensor
    partials: dict[te.Tensor, list[te.Tensor]] = field(default_factory=dict)  # reduction -> its partial stages,
    #                                                                              consumer first
    kind: dict[te.Tensor, str] = field(default_factory=dict)          # "injective" | "reduce" | "matmul" | ...
    # complex-out-fusable stage (matmul, conv2d) -> its template's schedule(s, epilogue or None)
    templates: dict[te.Tensor, Callable] = field(default_factory=dict)
    chosen: dict[te.Tensor, str] = field(default_factory=dict)  # template stage -> its config, for explain()
    # a node's tensor that is a reshaped view of a template stage's result (the GPU's stacked-row SGEMM) -> that
    # stage: the node's epilogue is the template's
    views: dict[te.Tensor, te.Tensor] = field(default_factory=dict)
    # reductions a rule builds beside its node's tensor (argmax's maximum), scheduled like a node's reduction
    helpers: list[te.Tensor] = field(default_factory=list)
    # a reduction over the first axis -> its partials over blocks of rows (te_rules._row_blocks), computed where
    # the reduction is
    row_blocks: dict[te.Tensor, te.Tensor] = field(default_factory=dict)
    # a reduction over leading axes -> how many of its last data axes are one contiguous run in its source (more
    # than one: they are vectorized as one axis, not the last alone with a tail)
    contiguous_tail: dict[te.Tensor, int] = field(default_factory=dict)


class ToTE:
    """Builds te tensors for the materialized nodes of a graph; templated nodes (matmul, conv2d) with the
    config picked for their task."""

    vector_partials = True  # a row reduction keeps one partial per SIMD lane (te_rules.build_reduce)

    def __init__(self, materialized: dict[Node, str], target: Target, choices: dict[Node, tuple[Task, Choice]]):
        self.materialized, self.target, self.choices = materialized, target, choices
        self.st = Stages()
        self.names: dict[str, int] = {}
        self.packed: dict[Node, list[te.Tensor]] = {}  # templated node -> its prepacked weights (inputs)

    def lanes(self, n: Node) -> int:
        """Lanes of one vector register of the Target for n's dtype."""
        return self.target.lanes(n.dtype.itemsize)

    def fresh_name(self, base: str) -> str:
        """`base`, numbered from its second use: stage names stay unique and readable."""
        k = self.names.get(base, 0)
        self.names[base] = k + 1
        return f"{base}_{k}" if k else base

    def placeholder(self, n: Node, name: str) -> te.Tensor:
        held = n.param("holds") if n.prim == "scalar_arg" else None  # a Python int argument used as a size
        t = te.size_param(held) if held is not None else te.placeholder(n.shape, n.dtype, name)
        self.st.placeholders[n] = t
        return t

    # ** values at an index **
    def at(self, n: Node, idx: Index) -> Expr:
        """n's value at `idx`: a load from its buffer if it has one, else its expression inlined."""
        if n in self.st.placeholders:
            return self.st.placeholders[n][idx]
        if n in self.materialized:
            return self.tensor(n)[idx]
        return _emitter(n)(self, n, idx)

    def tensor(self, n: Node) -> te.Tensor:
        """The te tensor of materialized node n: its primitive's stage builder, or an injective stage."""
        if n not in self.st.tensors:
            build = prims.get(n.prim).build
            self.st.tensors[n] = build(self, n) if build is not None else self._injective(n)
        return self.st.tensors[n]

    def _injective(self, n: Node) -> te.Tensor:
        name = self.fresh_name(n.param("name") if n.prim == "ufunc" else n.prim)
        emit = _emitter(n)
        t = te.compute(n.shape, lambda *i: emit(self, n, i), name=name)
        self.st.kind[t] = "injective"
        return t

    def template(self, n: Node, readers: tuple) -> te.Tensor:
        """The node's template computes it with the config picked for its task; its operands are read
        through `readers` (the producers inlined into them)."""
        task, choice = self.choices[n]
        template = registry.get(task.template)
        built = self.built_workload(n, task)
        stages = template.compute(built, choice.config, self.target, readers,
                                  name=self.fresh_name(task.template), binding=self.binding(n),
                                  packed=self.packed.get(n, ()))
        out = stages.out
        self.st.kind[out] = task.template
        size = len(template.config_space(task.workload, self.target))
        self.st.chosen[out] = choice_line(out.name, task, choice, self.target, size)
        self.st.templates[out] = lambda s, epilogue=None: template.schedule(s, stages, built, choice.config,
                                                                            self.target, epilogue)
        return out

    def binding(self, n: Node) -> Any:
        """A symbolic workload's names -> the dims they stand for (tasks.binding), or None."""
        return tasks.binding(n) or None

    def built_workload(self, n: Node, task: Any) -> Any:
        """The workload the template's stages are built for: the task's (the GPU's may build a symbolic size
        that its task holds at a representative one)."""
        return task.workload


def choice_line(label: str, task: Any, choice: Any, target: Any, size: int | None = None) -> str:
    """One line for explain(): a templated stage's task, the config picked for it and where it came from."""
    if size is None:
        size = len(registry.get(task.template).config_space(task.workload, target))
    return (f"{label}: template {task.template}, {choice.source} config {choice.config.to_json()} "
            f"(one of {size} in its space; task {task.key}" + (f"; {choice.note})" if choice.note else ")"))


def _emitter(n: Node) -> Callable[..., Expr]:
    """The expression emitter of n's primitive; an error naming it if it has none (it is not injective)."""
    emit = prims.get(n.prim).emit
    if emit is None:
        raise LookupError(f"graph primitive {n.prim!r} ({prims.get(n.prim).kind.value}) has no expression "
                          f"emitter, so {n!r} cannot be inlined into its consumer")
    return emit
