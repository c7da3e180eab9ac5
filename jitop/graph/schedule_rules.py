"""Default schedules for traced graphs: one rule per kind of stage, tried in order.

- injective: leading axes fused and parallel, the last axis split into SIMD lanes;
- row fusion: reductions (and shared intermediates) that an output reads row by row are computed
  inside the output's row loop, so a softmax or layer norm is one pass over memory per row;
- reductions: a row reduction keeps one partial per lane (vectorized), others vectorize a data axis;
- matmul, conv2d: their topi template (a register tile of the output in vector registers), with an
  elementwise epilogue (bias, residual, activation) computed from the tile.
"""
from __future__ import annotations

import heapq
import itertools
import math
from typing import Any, Callable

from jitop.graph import prims
from jitop.graph.ir import Node, consumers, toposort
from jitop.graph.shapes import at_most, provably_same, rep, same_dims
from jitop.graph.to_te import Stages
from jitop.schedule.schedule import Schedule, Stage, create_schedule
from jitop.target import Target
from jitop.te.expr import Expr, Op, binary
from jitop.te.tensor import IterVar, Tensor, tensor_loads
from jitop.tir.simplify import prove
from jitop.tir.lower import Lowering

# The most stages one output computes inside its row loop. Each member nests one more buffer allocation in
# the loop IR, and the passes over it (lowering, codegen) recurse over that nesting, so it must stay bounded
# whatever the program's length. A softmax or layer norm needs 2-6; a longer group (an elementwise chain
# cut by fusion's depth bound) keeps its last members in the row loop and computes the rest once, each
# stage a row loop of its own.
MAX_ROW_MEMBERS = 32


def _lead_and_lanes(stage: Stage, lanes: int) -> tuple[IterVar | None, IterVar | None]:
    """Fuse all data axes but the last (the 'rows'), split the last into vector lanes."""
    axes = list(stage.op.axis)
    if not axes:
        return None, None
    last = axes[-1]
    outer, inner = stage.split(last, factor=max(1, at_most(lanes, last.extent)))
    stage.vectorize(inner)
    if len(axes) == 1:
        return outer, inner
    rows = stage.fuse(*axes[:-1])
    return rows, inner


def _transposed_axis(stage: Stage) -> int | None:
    """The output axis (not the last) that indexes the innermost dimension of a tensor the stage reads while
    the output's last axis indexes one of its outer dimensions: a transpose (NHWC to NCHW), None if none."""
    axes = stage.op.axis
    if len(axes) < 2:
        return None
    position = {a.var: k for k, a in enumerate(axes)}
    for load in (n for b in stage.op.body for n in tensor_loads(b) if n.src):
        *outer, inner = load.src
        k = position.get(inner)
        if k is not None and k < len(axes) - 1 and any(i is axes[-1].var for i in outer):
            return k
    return None


def _transpose_tiles(stage: Stage, lanes: int, k: int) -> IterVar:
    """Tiles of `lanes` x `lanes` elements: the output's last axis in vector lanes inside a block of `lanes`
    values of axis `k`, so each cache line of the input is read whole while it is in cache (row by row, a
    large transpose read one element per line: 5.3 ms for a 56x56x256 NHWC to NCHW copy, 0.29 ms tiled).
    Symbolic extents too: the tails are guarded at run time."""
    axes = list(stage.op.axis)
    ko, ki = stage.split(axes[k], factor=lanes)
    lo, li = stage.split(axes[-1], factor=lanes)
    lead = [*axes[:k], *axes[k + 1:-1], ko]  # blocks of one input row next to each other: read in order
    stage.reorder(*lead, lo, ki, li)
    stage.vectorize(li)
    return stage.fuse(*lead)


def schedule_injective(s: Schedule, t: Tensor, target: Target) -> IterVar | None:
    stage = s[t]
    lanes = target.lanes(t.dtype.itemsize)
    k = _transposed_axis(stage) if stage.attach_type == "root" else None
    if k is not None and rep(stage.op.axis[k].extent) >= lanes and rep(stage.op.axis[-1].extent) >= lanes:
        rows = _transpose_tiles(stage, lanes, k)
        stage.parallel(rows)
        return rows
    rows, _ = _lead_and_lanes(stage, lanes)
    if rows is not None and stage.attach_type == "root":
        leaves = stage.leaf_iter_vars
        # few rows: parallelise across rows x chunks; not with a symbolic chunk count, whose fused index
        # (row = f // chunks) the bounds prover cannot follow: each access would be checked at run time
        if rep(rows.extent) < 2 * target.threads and len(stage.op.axis) > 1 and _constant(leaves[1].extent):
            rows = stage.fuse(leaves[0], leaves[1])
        stage.parallel(rows)
    return rows


def schedule_partial(s: Schedule, p: Tensor, consumer: Tensor) -> None:
    """A per-lane partial of a row reduction: lanes innermost and vectorized, computed per output element
    inside its consumer (the next combine step), so the partials live in registers."""
    stage = s[p]
    lane = stage.op.axis[-1]
    stage.reorder(*stage.op.reduce_axis, lane)
    stage.vectorize(lane)
    cons = s[consumer]
    outer = list(itertools.takewhile(lambda iv: iv.kind == "data", cons.leaf_iter_vars))
    if outer:  # the consumer's loops over output elements, before its own reduction
        stage.compute_at(cons, outer[-1])


def schedule_reduce(s: Schedule, t: Tensor, target: Target, vectorize_last: bool = False, tail: int = 1) -> None:
    """Data loops outside the reduction; with `vectorize_last`, the last data axis (contiguous in the
    source; the last `tail` ones fused into one where they are one run of memory in it) is split into lanes
    inside the reduction loops."""
    stage = s[t]
    data = list(stage.op.axis)
    if not data:
        return
    if vectorize_last and tail > 1:
        data = data[:-tail] + [stage.fuse(*data[-tail:])]
    if vectorize_last:
        outer, lanes = stage.split(data[-1], factor=_outer_reduce_lanes(data, target.lanes(t.dtype.itemsize),
                                                                         target.threads))
        stage.reorder(*data[:-1], outer, *stage.op.reduce_axis, lanes)
        stage.vectorize(lanes)
        data = data[:-1] + [outer]
    if stage.attach_type == "root":
        stage.parallel(stage.fuse(*data))


def schedule_scan(s: Schedule, t: Tensor, target: Target) -> None:
    """A running reduction along an axis, its scan loop and its reduction left as they are (the one-pass
    lowering needs them unsplit). Along the last axis: the rows in parallel. Along another: the axes after it
    fused into columns, split into vector lanes inside the scan loop (each step reads and writes whole vectors
    of a row), the axes before it, or else the blocks of columns, in parallel."""
    stage = s[t]
    if stage.attach_type != "root":
        return
    axes = list(stage.op.axis)
    ax = stage.op.attrs.get("scan_axis", len(axes) - 1)
    before, scanned, after = axes[:ax], axes[ax], axes[ax + 1:]
    if not after:
        if before:
            stage.parallel(stage.fuse(*before) if len(before) > 1 else before[0])
        return
    columns = stage.fuse(*after) if len(after) > 1 else after[0]
    blocks, lanes = stage.split(columns, factor=max(1, at_most(target.lanes(t.dtype.itemsize), columns.extent)))
    stage.vectorize(lanes)
    rows = (stage.fuse(*before) if len(before) > 1 else before[0]) if before else None
    stage.reorder(*([rows] if rows is not None else []), blocks, scanned, lanes, *stage.op.reduce_axis)
    stage.parallel(rows if rows is not None else blocks)


def schedule_scatter(s: Schedule, t: Tensor) -> None:
    """An assignment through index arrays or an unbuffered update (np.add.at): the copy of the old array in
    parallel over its first axis; the ordered pass over the values stays serial (jitop.tir.lower)."""
    stage = s[t]
    if stage.attach_type == "root":
        stage.parallel(stage.op.axis[0])


def schedule_row_blocks(s: Schedule, t: Tensor, target: Target) -> None:
    """te_rules._row_blocks' partials: blocks of rows in parallel, each block's rows in order, each row
    vectorized along its (last) axis."""
    stage = s[t]
    block, *data = stage.op.axis
    outer, lanes = stage.split(data[-1], factor=at_most(target.lanes(t.dtype.itemsize), data[-1].extent))
    stage.reorder(block, *stage.op.reduce_axis, *data[:-1], outer, lanes)
    stage.vectorize(lanes)
    stage.parallel(block)


OUTER_REDUCE_VECTORS = (4, 2)  # vectors of output columns one reduction over leading axes keeps in registers


def _outer_reduce_lanes(data: list[IterVar], lanes: int, threads: int) -> int:
    """The output columns a reduction over leading axes (sum(axis=0)) carries in vector lanes: up to 4 vectors
    of whole lanes, while the parallel loop keeps two iterations per thread. Each step then reads 256 contiguous
    bytes of a row, not 64, and keeps 4 independent accumulator chains: sum(axis=0) of 2048x2048 float32 ran
    2.3x faster (1.14 -> 0.49 ms; numpy 0.70)."""
    last, rows = rep(data[-1].extent), math.prod(rep(a.extent) for a in data[:-1])
    for vectors in OUTER_REDUCE_VECTORS:
        width = vectors * lanes
        if last >= width and rows * -(-last // width) >= 2 * threads:
            return width
    return max(1, at_most(lanes, data[-1].extent))


def _constant(extent: Any) -> bool:
    return not isinstance(extent, Expr) or extent.op is Op.CONST


def _one_row(extent: Any) -> bool:
    e = extent.value if isinstance(extent, Expr) and extent.op is Op.CONST else extent
    return e <= 1 if isinstance(e, int) else prove(binary(Op.LE, e, 1), {}) is True


def one_row(extents: list[Any]) -> bool:
    """Whether a row-group member's region at its head's row loop (bound inference's `extents`, one per axis)
    is at most one row: every leading axis one (a symbolic extent counts as more unless proved otherwise), and
    a 1-D member one element."""
    lead = extents[:-1] if len(extents) > 1 else extents
    return all(_one_row(e) for e in lead)


class GraphIndex:
    """A graph's topological order, readers and positions, computed once per compile (jitop/graph/compile.py):
    the rules below ask about every template and row-group head, so re-walking the whole graph each time would
    be quadratic."""

    def __init__(self, outputs: list[Node]):
        self.order = toposort(outputs)
        self.users = consumers(self.order)
        self.position = {n: k for k, n in enumerate(self.order)}


def row_group(out: Node, materialized: dict[Node, str], outputs: list[Node], graph: GraphIndex) -> list[Node]:
    """Materialized nodes that only `out` reads (directly, through inlined nodes or through each other), that
    out can compute one output row at a time."""
    if out.ndim < 2 or prims.get(out.prim).own_stage:
        return []
    lead = out.shape[:-1]

    def row_shaped(n: Node) -> bool:
        if not prims.get(n.prim).row_fusable or n in outputs:
            return False
        return same_dims(n.shape, lead) or (n.ndim == out.ndim and same_dims(n.shape[:-1], lead)
                                             and any(provably_same(n.shape[-1], d) for d in (1, out.shape[-1])))

    def candidate(n: Node) -> bool:
        return n not in materialized or row_shaped(n)
    region = _only_read_by(out, candidate, graph)
    members = sorted((n for n in region if n in materialized), key=graph.position.__getitem__)
    # the last ones: their readers (out or later members) stay in the group
    return members[-MAX_ROW_MEMBERS:]


def _only_read_by(out: Node, candidate: Callable[[Node], bool], graph: GraphIndex) -> set[Node]:
    """The candidate nodes above `out` whose every reader is `out` or another of them.

    Walked upstream from out, consumers before producers (a heap on topological position, so a node is
    judged after all its readers that can qualify); the walk stops at nodes that do not qualify, so it
    visits only the region and its border, not the whole graph above it."""
    region: set[Node] = set()
    seen: set[Node] = set()
    heap = [(-graph.position[s], id(s), s) for s in set(out.src)]
    heapq.heapify(heap)
    while heap:
        _, _, n = heapq.heappop(heap)
        if n in seen:
            continue
        seen.add(n)
        if prims.get(n.prim).is_input or not candidate(n) or not all(u is out or u in region for u in graph.users[n]):
            continue
        region.add(n)
        for s in n.src:
            if s not in seen:
                heapq.heappush(heap, (-graph.position[s], id(s), s))
    return region


def epilogue_of(m: Node, outputs: list[Node], materialized: dict[Node, str], graph: GraphIndex) -> Node | None:
    """The output or materialized intermediate that applies only same-shape elementwise operations to
    matmul `m` (bias, activation): it reads m at its own index, so it can run on m's register tile."""
    if m in outputs:  # the matmul itself is returned: it must be written out
        return None
    # the inlined nodes reading m and the materialized nodes where they end: m's epilogue is the one end
    between, ends, stack = set(), set(), list(graph.users[m])
    while stack:
        u = stack.pop()
        if u in materialized:
            ends.add(u)
        elif u not in between:
            between.add(u)
            stack.extend(graph.users[u])
    if len(ends) != 1:
        return None
    (out,) = ends
    if all(prims.get(n.prim).elementwise and same_dims(n.shape, m.shape) for n in between | ends):
        return out
    return None


def template_epilogues(st: Stages, outputs: list[Node], materialized: dict[Node, str],
                       graph: GraphIndex) -> dict[Node, Tensor]:
    """Output (or materialized elementwise intermediate, such as an activation feeding the next matmul) ->
    the template stage it is the epilogue of (computed on that template's register tile).
    One template per epilogue: a second (conv(x, w1) + conv(x, w2)) writes its result to memory."""
    epilogues: dict[Node, Tensor] = {}
    outputs = list(dict.fromkeys(outputs))
    for m, t in st.tensors.items():
        t = st.views.get(t, t)
        if t in st.templates and (out := epilogue_of(m, outputs, materialized, graph)) and out not in epilogues:
            epilogues[out] = t
    return epilogues


def drop_unread(st: Stages, outputs: list[Tensor], materialized: dict[Node, str]) -> dict[Node, str]:
    """`materialized` without the nodes whose stages no output reads, which leave `st` too. A node's value can
    fold away in its reader's expression (an int `x.sum() * 0` is 0, `np.isnan` of ints False): its stage is
    then part of no schedule, and nothing computes it."""
    read = create_schedule([t.op for t in outputs]).stage_map
    dropped = {n for n, t in st.tensors.items() if t.op not in read and st.views.get(t, t).op not in read}
    for n in dropped:
        del st.tensors[n]
    return {n: reason for n, reason in materialized.items() if n not in dropped}


def row_groups(st: Stages, outputs: list[Node], materialized: dict[Node, str], target: Target,
               epilogues: dict[Node, Tensor], graph: GraphIndex) -> tuple[dict[Node, list[Node]], str]:
    """Output -> the materialized nodes computed inside its row loop (see `row_group`), decided before
    scheduling: a probe schedule with only the row attachments is bound-inferred, and if any member would
    need more than one row per output row (it is read along another axis), nothing is row-fused, since
    computing it inside the row loop would redo it every row. All or none: a member may read another's
    row buffer. Outputs in `epilogues` are scheduled by their template instead. Returns the groups and a
    sentence saying what was decided, for explain()."""
    groups = row_candidates(st, outputs, materialized, epilogues, graph)
    if not groups:
        return {}, "no output reads a reduction or shared intermediate row by row"
    probe = create_schedule([st.tensors[n].op for n in dict.fromkeys(outputs)])
    attached = _attach_rows(probe, st, groups, target)
    for n, t in st.tensors.items():  # reductions' partials go inside their reduction, as in `apply`
        if n not in outputs and n not in groups and t not in st.templates:
            _schedule_stage(probe, st, t, target)
    low = Lowering(probe, list(st.placeholders.values()))  # the arguments define the shape symbols
    low.infer()
    for stage in attached:
        extents = [low.loops[stage].extent[iv] for iv in stage.op.axis]
        if not one_row(extents):
            return {}, (f"none: bound inference says '{stage.op.name}' would need {extents} per output row "
                        "(it is read along another axis), so every member is computed once instead")
    fused = "; ".join(f"{st.tensors[n].name} computes {', '.join(st.tensors[m].name for m in ms)} in its row loop"
                      for n, ms in groups.items())
    return groups, f"{fused} (bound inference: one row each)"


def row_candidates(st: Stages, outputs: list[Node], materialized: dict[Node, str],
                   epilogues: dict[Node, Tensor], graph: GraphIndex) -> dict[Node, list[Node]]:
    """Candidate row groups (before any check that each member is needed one row at a time): each injective
    output, or materialized injective intermediate (a softmax feeding a matmul), with the row-shaped stages only
    it reads; consumers first, each stage in one group."""
    heads = [n for n in graph.order if n in materialized and st.kind.get(st.tensors.get(n)) == "injective"
             and n not in epilogues]
    groups: dict[Node, list[Node]] = {}
    taken: set[Node] = set()
    for n in reversed(heads):
        if n in taken:
            continue
        # an epilogue runs on its matmul's register tile: never one row at a time
        members = [m for m in row_group(n, materialized, outputs, graph)
                   if m not in taken and m not in groups and m not in epilogues]
        if members:
            groups[n] = members
            taken.update(members)
    return dict(reversed(list(groups.items())))


def _attach_rows(s: Schedule, st: Stages, groups: dict[Node, list[Node]], target: Target) -> list[Stage]:
    """Schedule each grouped output's rows and compute its members inside them; the attached stages."""
    attached: dict[Tensor, Stage] = {}
    for n, members in groups.items():
        t = st.tensors[n]
        rows = schedule_injective(s, t, target)
        for m in members:
            mt = st.tensors[m]
            if rows is not None and mt not in attached:
                for stage in (mt, st.row_blocks.get(mt)):  # (a reduction's row blocks go where it goes)
                    if stage is not None:
                        s[stage].compute_at(s[t], rows)
                        attached[stage] = s[stage]
    return list(attached.values())


def apply(st: Stages, outputs: list[Node], target: Target, epilogues: dict[Node, Tensor],
          groups: dict[Node, list[Node]]) -> Schedule:
    """The schedule of every stage: template `epilogues` first, row-fused outputs (`groups`), the rest by kind."""
    out_tensors = [st.tensors[n] for n in dict.fromkeys(outputs)]
    s = create_schedule([t.op for t in out_tensors])
    # matmul/conv epilogues (bias, activation) run on the register tile
    for out, t in epilogues.items():
        st.templates[t](s, st.tensors[out])
    _attach_rows(s, st, groups, target)
    for n in dict.fromkeys(outputs):
        t = st.tensors[n]
        if n not in epilogues and n not in groups and st.kind.get(t) == "injective":
            schedule_injective(s, t, target)
    for n, t in st.tensors.items():
        if n in epilogues or n in groups or (n in outputs and st.kind.get(t) == "injective") \
                or t in epilogues.values():
            continue
        _schedule_stage(s, st, t, target)
    for t in st.helpers:
        if t.op in s.stage_map:
            _schedule_stage(s, st, t, target)
    return s


def _schedule_stage(s: Schedule, st: Stages, t: Tensor, target: Target) -> None:
    kind = st.kind.get(t)
    if kind == "injective":
        schedule_injective(s, t, target)
    elif kind == "reduce_rows":
        schedule_row_blocks(s, t, target)
    elif kind == "scan":
        schedule_scan(s, t, target)
    elif kind == "scatter":
        schedule_scatter(s, t)
    elif kind in ("reduce", "reduce_outer"):
        schedule_reduce(s, t, target, vectorize_last=kind == "reduce_outer", tail=st.contiguous_tail.get(t, 1))
        consumer = t
        for p in st.partials.get(t, []):
            schedule_partial(s, p, consumer)
            consumer = p
    elif t in st.templates:
        st.templates[t](s)
