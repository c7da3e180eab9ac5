"""The graph primitives and their compile rules, one table entry each (as a JAX primitive carries its rules).

An entry says how fusion treats the primitive (its TVM operator class, whether it is free to recompute,
whether it rereads a smaller source, what one element costs), how it lowers to tensor expressions (an
injective primitive's expression emitter, or the stage builder of one with a loop nest of its own) and, for
a primitive an operator template computes, its workload fields, and how it computes many copies of itself at
once (its batch rule, jitop.graph.batch_rules). jitop.graph's fusion, tasks, to_te, schedule_rules and batching
ask this table; none keeps a list of primitive names of its own. Adding a primitive is one
entry in PRIMS (tests/graph/test_prims.py checks that every primitive the front ends build has one).

>>> get("transpose").kind is Kind.INJECTIVE, get("transpose").free, get("matmul").symbolic_fields
(True, True, ('m', 'n', 'k'))
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable

from jitop.graph import batch_rules as batching
from jitop.graph import te_rules as rules
from jitop.graph.ir import Node


class Kind(enum.Enum):
    """TVM's operator classes (fusion's rules are written in them), plus the graph's inputs."""

    INPUT = "input"              # an argument or a constant array: read from memory, never computed
    INJECTIVE = "injective"      # elementwise, broadcast, layout, index: inlined into its consumers
    REDUCTION = "reduction"      # its own loop nest; injective producers fuse into its input
    COMPLEX = "complex-out-fusable"  # a template (matmul, conv2d): injective consumers run on its tiles
    OPAQUE = "opaque"            # its own loop nest, fusing nothing (no primitive is one yet)


EXPENSIVE_COST = 10  # a division or transcendental, in cheap-op units
EXPENSIVE_UFUNCS = frozenset("""exp exp2 expm1 log log2 log10 log1p logaddexp logaddexp2 sin cos tan arcsin arccos
arctan arctan2 sinh cosh tanh arcsinh arccosh arctanh power float_power sqrt cbrt hypot divide true_divide
floor_divide remainder mod fmod""".split())


def _one(n: Node) -> int:
    return 1


def _ufunc_cost(n: Node) -> int:
    return EXPENSIVE_COST if n.param("name") in EXPENSIVE_UFUNCS else 1


def _expensive(n: Node) -> int:
    return EXPENSIVE_COST


def _concat_cost(n: Node) -> int:
    return max(1, len(n.src) - 1)  # a chain of selects, one per part after the first


def _concat_levels(n: Node) -> int:
    return max(1, (len(n.src) - 1).bit_length())  # te_rules.emit_concat's balanced tree of selects


def _matmul_fields(n: Node) -> dict[str, Any]:
    a, b = n.src
    return dict(m=a.shape[-2], n=b.shape[-1], k=a.shape[-1], dtype=n.dtype.name, a_batch=a.shape[:-2],
                b_batch=b.shape[:-2])


def _matmul_rows(n: Node) -> Any:
    return n.src[0].shape[-2] if n.src[0].ndim >= 2 else None


def _conv2d_fields(n: Node) -> dict[str, Any]:
    x, w = n.src
    nchw = n.param("layout") == "NCHW"
    nb, c, h, wd = x.shape if nchw else (x.shape[0], x.shape[3], x.shape[1], x.shape[2])
    return dict(n=nb, c=c, h=h, w=wd, oc=w.shape[0], kh=w.shape[2], kw=w.shape[3], stride=n.param("stride"),
                pads=n.param("pads"), dilation=n.param("dilation"), groups=n.param("groups"),
                layout=n.param("layout"), dtype=n.dtype.name)


@dataclass(frozen=True)
class Prim:
    """One graph primitive's compile rules (see the module docstring); `problems` says which combinations
    are consistent."""

    kind: Kind
    # layout, index or cast: no arithmetic per element, so a consumer that rereads it recomputes it for free
    free: bool = False
    # a value known without reading an array (a constant, a size): inlined wherever it is used and a stage
    # of its own only when it is returned
    constant: bool = False
    # reads a smaller source once per output element (take: its indices, once per element of the rows they
    # pick), so fusion computes a costly source once instead
    broadcasts: bool = False
    # same-shape elementwise arithmetic: may run on a template's register tile as its epilogue
    elementwise: bool = False
    # materialized, it can be computed inside a consumer's row loop one row at a time (argreduce's helper
    # stage and a template's tiles cannot)
    row_fusable: bool = True
    cost: Callable[[Node], int] = _one       # one element's own cost in cheap-op units (fusion.op_cost)
    levels: Callable[[Node], int] = _one     # how deep its own expression nests (fusion.bound_depth)
    emit: Callable[..., Any] | None = None   # injective: (lowerer, node, index) -> its value there
    build: Callable[..., Any] | None = None  # own loop nest: (lowerer, node) -> its te tensor
    # a template's workload fields from the node (the template has the primitive's name in the registry)
    workload: Callable[[Node], dict[str, Any]] | None = None
    symbolic_fields: tuple[str, ...] = ()    # the workload fields the template accepts symbolic
    rows: Callable[[Node], Any] | None = None  # the dim whose size bucket picks its config (tasks.ROW_BUCKETS)
    # copies of it computed at once: (node, [(source, batched)]) -> the batched node, or None (batch_rules)
    batch: Callable[..., Node | None] | None = None

    @property
    def is_input(self) -> bool:
        """A kernel argument: read from memory, never computed or inlined."""
        return self.kind is Kind.INPUT

    @property
    def own_stage(self) -> bool:
        """Always materialized: it gets a loop nest of its own (reductions and templates)."""
        return self.kind in (Kind.REDUCTION, Kind.COMPLEX, Kind.OPAQUE)


_INJECTIVE = Kind.INJECTIVE
PRIMS: dict[str, Prim] = {
    # ** inputs: kernel arguments **
    "arg": Prim(Kind.INPUT),
    "scalar_arg": Prim(Kind.INPUT),
    "array_const": Prim(Kind.INPUT),
    # ** injective: values and layout (free to recompute) **
    "const": Prim(_INJECTIVE, free=True, constant=True, emit=rules.emit_const),
    "dim": Prim(_INJECTIVE, free=True, constant=True, emit=rules.emit_dim),
    "iota": Prim(_INJECTIVE, free=True, emit=rules.emit_iota),
    "copy": Prim(_INJECTIVE, free=True, emit=rules.emit_copy, batch=batching.batch_broadcasting),
    "cast": Prim(_INJECTIVE, free=True, elementwise=True, emit=rules.emit_cast, batch=batching.batch_broadcasting),
    "broadcast": Prim(_INJECTIVE, free=True, broadcasts=True, emit=rules.emit_broadcast,
                      batch=batching.batch_broadcast),
    "reshape": Prim(_INJECTIVE, free=True, emit=rules.emit_reshape, batch=batching.batch_reshape),
    "transpose": Prim(_INJECTIVE, free=True, emit=rules.emit_transpose, batch=batching.batch_transpose),
    "index": Prim(_INJECTIVE, free=True, emit=rules.emit_index, batch=batching.batch_index),
    # an assignment a[i] = v (jitop.graph.mutation): it reads its value and its positions once per element
    "update": Prim(_INJECTIVE, broadcasts=True, emit=rules.emit_update),
    # traced indices (an assignment's scalar one, an index array's elements), wrapped and checked: costly enough
    # to be computed once, not per element
    "position": Prim(_INJECTIVE, cost=_expensive, emit=rules.emit_position),
    # ** injective: arithmetic and selection **
    "ufunc": Prim(_INJECTIVE, broadcasts=True, elementwise=True, cost=_ufunc_cost, emit=rules.emit_ufunc,
                  batch=batching.batch_broadcasting),
    "where": Prim(_INJECTIVE, broadcasts=True, elementwise=True, emit=rules.emit_where,
                  batch=batching.batch_broadcasting),
    "take": Prim(_INJECTIVE, broadcasts=True, emit=rules.emit_take, batch=batching.batch_take),
    "concat": Prim(_INJECTIVE, cost=_concat_cost, levels=_concat_levels, emit=rules.emit_concat,
                   batch=batching.batch_concat),
    # ** reductions **
    "reduce": Prim(Kind.REDUCTION, build=rules.build_reduce, batch=batching.batch_reduce),
    "argreduce": Prim(Kind.REDUCTION, row_fusable=False, build=rules.build_argreduce,
                      batch=batching.batch_argreduce),
    # np.cumsum / np.cumprod along the last axis: a running reduction, computed in one ordered pass
    "scan": Prim(Kind.REDUCTION, row_fusable=False, build=rules.build_scan),
    # a[idx] = v, np.add.at & co.: each value stored at (combined into) its position, in order
    "scatter": Prim(Kind.REDUCTION, row_fusable=False, build=rules.build_scatter),
    # ** complex-out-fusable: operator templates **
    "matmul": Prim(Kind.COMPLEX, row_fusable=False, build=rules.build_matmul, workload=_matmul_fields,
                   symbolic_fields=("m", "n", "k"), rows=_matmul_rows, batch=batching.batch_matmul),
    "conv2d": Prim(Kind.COMPLEX, row_fusable=False, build=rules.build_conv2d, workload=_conv2d_fields,
                   symbolic_fields=("n", "h", "w")),
}


def get(name: str) -> Prim:
    """The rules of primitive `name`; a LookupError naming it if the table has no entry."""
    try:
        return PRIMS[name]
    except KeyError:
        raise LookupError(f"graph primitive {name!r} has no entry in jitop.graph.prims.PRIMS: add one with its "
                          "operator class and its lowering (an emitter or a stage builder)") from None


def problems(p: Prim) -> list[str]:
    """What is inconsistent about an entry (empty if nothing): each operator class has its lowering rule and
    only the fields that class uses.

    >>> problems(Prim(Kind.INJECTIVE))
    ['an injective primitive needs an expression emitter (emit)']
    """
    out = []
    injective, template = p.kind is Kind.INJECTIVE, p.kind is Kind.COMPLEX
    if injective and p.emit is None:
        out.append("an injective primitive needs an expression emitter (emit)")
    if not injective and p.emit is not None:
        out.append(f"only injective primitives are inlined as expressions; a {p.kind.value} one has emit")
    if p.own_stage and p.build is None:
        out.append(f"a {p.kind.value} primitive needs a stage builder (build)")
    if not p.own_stage and p.build is not None:
        out.append(f"a {p.kind.value} primitive has no stage of its own; build is for reductions and templates")
    if template != (p.workload is not None):
        out.append("a template (complex-out-fusable) primitive, and only one, has workload fields (workload)")
    if template and not p.symbolic_fields:
        out.append("a template primitive names the workload fields it accepts symbolic (symbolic_fields)")
    if not template and (p.symbolic_fields or p.rows is not None):
        out.append("symbolic_fields and rows are for template primitives")
    flags = [f for f in ("free", "constant", "broadcasts", "elementwise") if getattr(p, f)]
    if flags and not injective:
        out.append(f"{', '.join(flags)}: only injective primitives are inlined, so only they may say so")
    if p.constant and not p.free:
        out.append("a constant is free to recompute (free=True)")
    if p.is_input and p.batch is not None:
        out.append("an input has no sources to batch (batch is for computed primitives)")
    if template and p.row_fusable:
        out.append("a template computes tiles, not rows (row_fusable=False)")
    return out
