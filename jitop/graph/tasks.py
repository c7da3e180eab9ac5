"""Tasks of a traced graph: each matmul/conv2d node as (template, workload, target), found through the
template registry (the graph never imports jitop.topi by name)."""
from __future__ import annotations

from typing import Any

from jitop.graph.ir import Node
from jitop.target import Target
from jitop.tuner import registry
from jitop.tuner.task import Task


def _matmul(n: Node) -> dict[str, Any]:
    a, b = n.src
    return dict(m=a.shape[-2], n=b.shape[-1], k=a.shape[-1], dtype=n.dtype.name, a_batch=a.shape[:-2],
                b_batch=b.shape[:-2])


def _conv2d(n: Node) -> dict[str, Any]:
    x, w = n.src
    nchw = n.param("layout") == "NCHW"
    nb, c, h, wd = x.shape if nchw else (x.shape[0], x.shape[3], x.shape[1], x.shape[2])
    return dict(n=nb, c=c, h=h, w=wd, oc=w.shape[0], kh=w.shape[2], kw=w.shape[3], stride=n.param("stride"),
                pads=n.param("pads"), dilation=n.param("dilation"), groups=n.param("groups"),
                layout=n.param("layout"), dtype=n.dtype.name)


WORKLOADS = {"matmul": _matmul, "conv2d": _conv2d}  # node primitive -> template name and workload fields


def task_of(n: Node, target: Target) -> Task | None:
    """The task computing node `n` with an operator template, or None for nodes without one."""
    fields = WORKLOADS.get(n.prim)
    if fields is None:
        return None
    template = registry.get(n.prim)
    return Task(n.prim, template.workload_type(**fields(n)), target)


def extract_tasks(materialized: dict[Node, str], target: Target) -> dict[Node, Task]:
    """Every templated node of the graph with its task, in graph order."""
    return {n: task for n in materialized if (task := task_of(n, target)) is not None}
