"""Tasks of a traced graph: each matmul/conv2d node as (template, workload, target), found through the
template registry (the graph never imports jitop.topi by name); a primitive's workload fields and the fields
its template accepts symbolic are in its jitop.graph.prims entry.

A symbolic dim in a workload field is named by its place, not by the trace's symbol: "s0~256" for the first
distinct symbolic field, "s1~256" for the next (name~representative size), so the task, its tuning records and
its cache key do not depend on what the program called its arguments; `binding(n)` maps the names back to the
node's dim expressions for the template's `compute`."""
from __future__ import annotations

from typing import Any, Callable, Mapping

from jitop.graph import prims
from jitop.graph.ir import ConstData, Node, toposort
from jitop.graph.shapes import DEFAULT_REP
from jitop.te.expr import Expr
from jitop.target import Target
from jitop.tuner import registry
from jitop.tuner.task import Task


# size buckets of a matmul's symbolic row count: (largest size of the bucket, the size its config is decided
# at). Below 17 rows a different config wins (no packed B panels, one row block: 1.7x at 7 rows); a kernel
# holds one bucket (a guard), and a call in another bucket gets that bucket's kernel.
ROW_BUCKETS: tuple[tuple[int | None, int], ...] = ((16, 8), (None, DEFAULT_REP))


def row_buckets(results: list[Node], hint: Callable[[Expr], int]) -> tuple[dict[Expr, int], list[tuple[Expr, str]]]:
    """For each matmul whose row count is symbolic: the representative size of the bucket the traced call's
    size (`hint`) falls in, and the relations that keep a kernel to that bucket ((m, "m <= 16"), ...)."""
    reps: dict[Expr, int] = {}
    guards: list[tuple[Expr, str]] = []
    for n in toposort(results):
        rows = prims.get(n.prim).rows
        m = rows(n) if rows is not None else None
        if not isinstance(m, Expr) or m in reps:
            continue
        size, low = hint(m), 2
        for high, rep in ROW_BUCKETS:
            if high is None or size <= high:
                reps[m] = rep
                guards += [(m, f">= {low}")] if low > 2 else []
                guards += [(m, f"<= {high}")] if high is not None else []
                break
            low = high + 1
    return reps, guards


def _named(n: Node, reps: Mapping[Expr, int] | None = None) -> tuple[dict[str, Any], dict[str, Expr]]:
    """The node's workload fields with each symbolic dim named in field order ("s0~256": the size its config
    is decided at, DEFAULT_REP unless `reps` gives its bucket's), and the names' binding to the dims; a
    symbolic dim the template cannot take raises NotImplementedError."""
    p = prims.get(n.prim)
    if p.workload is None:
        raise LookupError(f"graph primitive {n.prim!r} has no operator template (no workload in its prims entry)")
    fields = p.workload(n)
    allowed = p.symbolic_fields
    names: dict[Expr, str] = {}
    for f, v in fields.items():
        dims = v if isinstance(v, tuple) else (v,)
        if any(isinstance(d, Expr) for d in dims) and f not in allowed:
            raise NotImplementedError(f"{n.prim} with a symbolic {f} ({v!r}): only {', '.join(allowed)} may vary")
        if isinstance(v, Expr):
            fields[f] = names.setdefault(v, f"s{len(names)}~{(reps or {}).get(v, DEFAULT_REP)}")
    return fields, {name.partition("~")[0]: e for e, name in names.items()}


def binding(n: Node) -> dict[str, Expr]:
    """The symbolic workload fields' names ("s0") -> the node's dim expressions (empty for a constant one)."""
    return _named(n)[1]


def task_of(n: Node, target: Target, reps: Mapping[Expr, int] | None = None) -> Task | None:
    """The task computing node `n` with an operator template, or None for nodes without one."""
    if prims.get(n.prim).workload is None:
        return None
    template = registry.get(n.prim)
    return Task(n.prim, template.workload_type(**_named(n, reps)[0]), target,
                constant_weights=template.prepack is not None and constant_weights(n))


def constant_weights(n: Node) -> bool:
    """The node's second operand is an array constant the graph owns (prepacked once): a captured array is
    not, the kernel reads it as it is at each call."""
    w = n.src[1]
    return w.prim == "array_const" and isinstance(w.param("data"), ConstData)


def extract_tasks(materialized: dict[Node, str], target: Target, reps: Mapping[Expr, int] | None = None) -> dict[Node, Task]:
    """Every templated node of the graph with its task, in graph order (`reps`: row_buckets')."""
    return {n: task for n in materialized if (task := task_of(n, target, reps)) is not None}
