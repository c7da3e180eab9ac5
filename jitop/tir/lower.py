"""Lowering a Schedule to loop IR: bound inference, loop nests, reductions, guards, buffers.

Each stage's root axes get a value in terms of its leaf loops (through split/fuse relations).
A stage computed at a consumer's loop covers only the region the consumer's inner loops read
(bound inference), held in a region-sized buffer allocated at that loop.

Extents may be symbolic (int64 expressions of the shape symbols, `(n + 7) // 8`): a loop's range is then
(0, extent - 1) with the expression kept, the symbols range over [0, SYMBOL_MAX], and a split of a symbolic
extent is guarded unless the factor provably divides it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from jitop import dtypes
from jitop.errors import LoweringError
from jitop.schedule.schedule import Schedule, Split, Stage, ceildiv
from jitop.te.expr import (Expr, Op, as_expr, binary, const, free_vars, rewrite, select, substitute, walk,
                           size_var_min)
from jitop.te.tensor import Dim, IterVar, PlaceholderOp, Tensor, tensor_loads
from jitop.tir.nodes import (Allocate, Barrier, Buffer, For, ForKind, IfThenElse, PrimFunc, Stmt, Store, ThreadReduce,
                             seq)
from jitop.tir import double_buffer
from jitop.tir.passes import partition_loops, simplify_stmt
from jitop.tir.simplify import SYMBOL_MAX, Lin, Ranges, atom_bounds, from_lin, prove, simplify, to_lin

# a region span (from integer bounds) this wide can only come from a symbolic range: use the whole dim
_SYMBOLIC_SPAN = 1 << 32


@dataclass
class StageLoops:
    """A stage's loop structure after bound inference."""

    extent: dict[IterVar, Dim] = field(default_factory=dict)        # every iter var (root and leaf)
    value: dict[IterVar, Expr] = field(default_factory=dict)        # root/inner var -> expr of leaf vars (relative)
    region_min: tuple[Expr, ...] = ()                               # per output dimension, absolute
    guards: list[Expr] = field(default_factory=list)


class Lowering:
    """State of one lower() call."""

    def __init__(self, sch: Schedule, args: Sequence[Tensor], bounds: Mapping[str, tuple[int, int]] | None = None):
        self.sch = sch
        self.args = list(args)
        self.bounds = dict(bounds or {})
        self.loops: dict[Stage, StageLoops] = {}
        self.buffers: dict[Tensor, Buffer] = {}
        self.ranges: Ranges = {}
        self.symbols = self._symbols()
        self.inlined: dict[Stage, tuple[Expr, ...]] = {}
        self._readers: dict[int, list[tuple[Stage, list[tuple[Expr, ...]]]]] | None = None  # id(op) ->

    # ** shape symbols: the variables of the arguments' symbolic dims, in argument order **
    def _symbols(self) -> tuple[Expr, ...]:
        found: dict[Expr, str] = {}
        for t in self.args:
            held = getattr(t.op, "value", None)  # te.size_param: an input whose value is a symbol
            if held is not None:
                found.setdefault(held, f"'{t.name}' value")
            for k, d in enumerate(getattr(t, "shape", ())):
                for v in (sorted(free_vars(d), key=lambda x: x.name) if isinstance(d, Expr) else ()):
                    found.setdefault(v, f"'{t.name}' dimension {k}")
        by_name: dict[str, Expr] = {}
        for v, where in found.items():
            if v.name in by_name:
                raise LoweringError(f"two distinct symbols are named '{v.name}' (the first in {found[by_name[v.name]]}, "
                                    f"the other in {where}); a kernel reads each symbol by its name: make one "
                                    f"te.var('{v.name}') and use it in every shape")
            by_name[v.name] = v
            lo, hi = self.bounds.get(v.name, (0, SYMBOL_MAX))
            self.ranges[v] = (max(size_var_min(v), lo), min(SYMBOL_MAX, hi))
        return tuple(found)

    def _check_body_vars(self, stage: Stage) -> None:
        """A variable in a body is one of the stage's axes or a shape symbol (else codegen has no value for it)."""
        own = {iv.var for iv in stage.axis + stage.reduce_axis} | set(self.symbols)
        for b in stage.body:
            stray = [v for v in free_vars(b) if v not in own]
            if stray:
                raise LoweringError(f"stage '{stage.name}' uses the variable '{stray[0].name}', which is neither one of "
                                    f"its axes nor a symbol of an argument's shape ({', '.join(v.name for v in self.symbols)}); "
                                    "a scalar parameter must be a dimension of an argument, or a one-element tensor")

    def _check_symbols(self, stage: Stage, extents: dict[IterVar, Dim]) -> None:
        for iv, n in extents.items():
            unknown = [v for v in (free_vars(n) if isinstance(n, Expr) else ()) if v not in self.ranges]
            if unknown:
                raise LoweringError(f"stage '{stage.name}': the extent {n!r} of loop '{iv.name}' uses symbol "
                                    f"'{unknown[0].name}', which no argument's shape has; pass the tensors whose "
                                    "shapes define it (a symbol is read from an input's dimension)")

    # ** root axes as functions of the leaf loops **
    def stage_loops(self, stage: Stage, root_extents: Sequence[Dim]) -> StageLoops:
        sl = StageLoops()
        roots = stage.axis + stage.reduce_axis
        for iv, n in zip(roots, list(root_extents) + [iv.extent for iv in stage.reduce_axis]):
            sl.extent[iv] = n
        for rel in stage.relations:  # creation order: parents before children
            if isinstance(rel, Split):
                sl.extent[rel.outer] = _outer_extent(rel, sl.extent[rel.parent])
                sl.extent[rel.inner] = rel.factor
            else:
                sl.extent[rel.fused] = _product(sl.extent[rel.outer], sl.extent[rel.inner])
        self._check_symbols(stage, sl.extent)
        for leaf in stage.leaf_iter_vars:
            sl.value[leaf] = leaf.var
            self.ranges[leaf.var] = (0, _last(sl.extent[leaf]))
        for rel in reversed(stage.relations):
            if isinstance(rel, Split):
                sl.value[rel.parent] = sl.value[rel.outer] * rel.factor + sl.value[rel.inner]
                if not _divides(rel.factor, sl.extent[rel.parent]):
                    sl.guards.append(sl.value[rel.parent] < sl.extent[rel.parent])
            else:
                n = sl.extent[rel.inner]
                sl.value[rel.outer] = sl.value[rel.fused] // n
                sl.value[rel.inner] = sl.value[rel.fused] % n
        return sl

    # ** inline stages are substituted into their consumers' bodies **
    def inlined_body(self, stage: Stage) -> tuple[Expr, ...]:
        if stage not in self.inlined:
            self.inlined[stage] = tuple(rewrite(b, self._inline_load) for b in stage.body)
        return self.inlined[stage]

    def _inline_load(self, n: Expr) -> Expr | None:
        if n.op is not Op.LOAD or not isinstance(n.arg, Tensor):
            return None
        producer = self.sch[n.arg]
        if producer.attach_type != "inline":
            return None
        body = self.inlined_body(producer)[n.arg.value_index]
        return substitute(body, {iv.var: i for iv, i in zip(producer.axis, n.src)})

    # ** bound inference **
    def infer(self) -> None:
        """Consumers before producers: a producer's region depends on its consumer's loops."""
        for stage in reversed(self.sch.stages):
            if stage.is_placeholder or stage.attach_type == "inline":
                continue
            if stage.attach_type == "scope":
                mins, extents = self.region(stage)
            else:
                mins, extents = tuple(const(0) for _ in stage.axis), [iv.extent for iv in stage.axis]
            if self.symbols:
                self._check_body_vars(stage)
            sl = self.stage_loops(stage, extents)
            sl.region_min = mins
            if stage.attach_type == "scope" and not self._on_chip(stage):
                sl.guards += self._domain_guards(stage, sl)
            self.loops[stage] = sl

    def _on_chip(self, stage: Stage) -> bool:
        """A GPU thread's register stage that reads only registers and shared memory: the points of its region
        outside the tensor need no guard. They read tile entries that exist (garbage where the fill skipped an
        edge), can fault nothing, and no consumer stores them; guarding each one costs a register tile its
        registers (SGEMM at 1000 x 999: 255 registers and spills, against 119)."""
        if stage.scope != "local" or not self._outer_vars(stage.attach_stage, stage.attach_ivar, threads_only=True):
            return False
        producers = [self.sch[t] for t in stage.input_tensors()]
        return all(p.scope in REGION_SCOPES and p.attach_type == "scope" for p in producers)

    def _domain_guards(self, stage: Stage, sl: StageLoops) -> list[Expr]:
        # a region can stick out of the tensor (tails of the consumer's split): skip those points
        out = []
        for iv, lo in zip(stage.axis, sl.region_min):
            absolute = simplify(lo + sl.value[iv], self.ranges)
            for cond in (absolute >= 0, absolute < iv.extent):
                if prove(simplify(cond, self.ranges), self.ranges) is not True:
                    out.append(cond)
        return out

    def absolute_axes(self, stage: Stage) -> dict[Expr, Expr]:
        """Root axis var -> absolute index in terms of loop vars (region offset included)."""
        sl = self.loops[stage]
        out = {iv.var: lo + sl.value[iv] for iv, lo in zip(stage.axis, sl.region_min)}
        out.update({iv.var: sl.value[iv] for iv in stage.reduce_axis})
        return out

    def region(self, stage: Stage) -> tuple[tuple[Expr, ...], list[int]]:
        parent, ivar = stage.attach_stage, stage.attach_ivar
        keep = self._outer_vars(parent, ivar)
        if stage.scope == "shared":  # one copy per block: it holds what every thread of the block reads
            keep -= self._outer_vars(parent, ivar, threads_only=True)
        reads = self._reads_of(stage, parent, ivar)
        # a shared tile read by register stages keeps its whole width past a tensor smaller than it: they read
        # every tile entry unguarded (`_on_chip`); its fill is guarded to the tensor
        whole_tile = stage.scope == "shared" and any(self._on_chip(c) for c, _ in self._readers_of(stage))
        mins, extents = [], []
        for d, iv in enumerate(stage.axis):
            lo, n = self._dim_region([r[d] for r in reads], keep, iv.extent, clip=not whole_tile)
            mins.append(lo)
            extents.append(n)
        return tuple(mins), extents

    def _outer_vars(self, parent: Stage, ivar: IterVar, threads_only: bool = False) -> set[Expr]:
        """Loop vars whose value is fixed where a stage attached at (parent, ivar) runs (with `threads_only`:
        those of them bound to GPU thread indices)."""
        leaves = parent.leaf_iter_vars
        keep = {iv.var for iv in leaves[:leaves.index(ivar) + 1]
                if not threads_only or parent.iter_kind.get(iv, ForKind.SERIAL).is_thread}
        if parent.attach_type == "scope":
            keep |= self._outer_vars(parent.attach_stage, parent.attach_ivar, threads_only)
        return keep

    def _reads_of(self, stage: Stage, parent: Stage, ivar: IterVar) -> list[tuple[Expr, ...]]:
        reads = []
        for consumer, indices in self._readers_of(stage):
            if not self._nested_in(consumer, parent, ivar):
                raise LoweringError(
                    f"stage '{stage.name}' is computed inside '{parent.name}' at loop '{ivar.name}', but "
                    f"'{consumer.name}' also reads it from outside that loop. Use compute_root() on '{stage.name}', "
                    f"or compute_at a loop that encloses every reader")
            axes = self.absolute_axes(consumer)
            reads += [tuple(substitute(i, axes) for i in idx) for idx in indices]
        return reads

    def _readers_of(self, stage: Stage) -> list[tuple[Stage, list[tuple[Expr, ...]]]]:
        """The stages (not inlined) that read `stage`, in schedule order, each with the indices it reads at.
        Indexed once for all stages (the schedule is final when bounds are inferred): scanning every body
        for every attached stage would be quadratic in the program's length."""
        if self._readers is None:
            self._readers = {}
            for consumer in self.sch.stages:
                if consumer.is_placeholder or consumer.attach_type == "inline":
                    continue
                by_op: dict[int, list[tuple[Expr, ...]]] = {}
                for b in self.inlined_body(consumer):
                    for n in tensor_loads(b):
                        by_op.setdefault(id(n.arg.op), []).append(n.src)
                for op, indices in by_op.items():
                    self._readers.setdefault(op, []).append((consumer, indices))
        return [(c, idx) for c, idx in self._readers.get(id(stage.op), []) if c is not stage]

    def _nested_in(self, consumer: Stage, parent: Stage, ivar: IterVar) -> bool:
        if consumer is parent:
            return True
        s = consumer
        while s.attach_type == "scope":
            if s.attach_stage is parent:
                leaves = parent.leaf_iter_vars
                return leaves.index(s.attach_ivar) >= leaves.index(ivar)
            s = s.attach_stage
        return False

    def _dim_region(self, indices: list[Expr], keep: set[Expr], dom: Dim, clip: bool = True) -> tuple[Expr, Dim]:
        """(min, extent) covering every index with the inner loops relaxed; the whole dim if unsure, or (with
        `clip`) if the indices span at least as much. A region of a symbolic dim is a constant width (its edges
        guarded) or the whole dim."""
        spans = [self._relax(i, keep) for i in indices]
        if not spans or any(s is None for s in spans):
            return const(0), dom
        sym = spans[0][0]
        if any(s[0].terms != sym.terms for s in spans):
            return const(0), dom
        lo, hi = min(s[1] for s in spans), max(s[2] for s in spans)
        if clip and hi - lo + 1 >= (dom if isinstance(dom, int) else _SYMBOLIC_SPAN):
            return const(0), dom
        return simplify(from_lin(Lin(sym.terms, lo), dtypes.INDEX), self.ranges), hi - lo + 1

    def _relax(self, index: Expr, keep: set[Expr]) -> tuple[Lin, int, int] | None:
        lin = to_lin(simplify(index, self.ranges), self.ranges)
        sym, lo, hi = {}, lin.const, lin.const
        for atom, coef in lin.terms.items():
            vs = free_vars(atom)
            if vs <= keep:
                sym[atom] = coef
                continue
            if vs & keep:
                return None  # mixes fixed and relaxed loops non-linearly
            b = atom_bounds(atom, self.ranges)
            if b is None:
                return None
            lo, hi = lo + min(coef * b[0], coef * b[1]), hi + max(coef * b[0], coef * b[1])
        return Lin(sym), lo, hi

    # ** buffers **
    def make_buffers(self) -> tuple[Buffer, ...]:
        params = []
        for k, t in enumerate(self.args):
            if not isinstance(t, Tensor):
                raise TypeError(f"lower/build args must be tensors (placeholders and outputs), got {t!r}")
            if t in self.buffers:
                raise ValueError(f"tensor '{t.name}' appears twice in the argument list (positions "
                                 f"{self.args.index(t)} and {k}); pass each tensor once")
            if t.op not in self.sch.stage_map:
                if not isinstance(t.op, PlaceholderOp):
                    raise LoweringError(f"'{t.name}' is an argument but not computed by this schedule; "
                                        "create_schedule from the outputs that use it")
                b = Buffer(t.name, t.dtype, t.shape, "param")  # an input the computation does not read
                self.buffers[t] = b
                params.append(b)
                continue
            if self.sch[t].attach_type == "inline":
                raise LoweringError(f"'{t.name}' is an argument but its stage is inlined; an argument must be "
                                    "written to memory. Remove compute_inline for it")
            b = Buffer(t.name, t.dtype, t.shape, "param")
            self.buffers[t] = b
            params.append(b)
        for stage in self.sch.stages:
            if stage.attach_type == "inline":
                continue
            for t in stage.outputs:
                if t in self.buffers:
                    continue
                if stage.is_placeholder:
                    if any(t.op is r.op for c in self.sch.stages for r in c.input_tensors()):
                        raise LoweringError(f"placeholder '{t.name}' is read but is not among the arguments; "
                                            f"add it to the args list")
                    continue
                shape = tuple(self.loops[stage].extent[iv] for iv in stage.axis)
                scope = _buffer_scope(stage)
                self.buffers[t] = Buffer(t.name, t.dtype, shape, scope)
        return tuple(params)

    # ** expressions: tensor reads -> buffer reads **
    def lower_expr(self, e: Expr, stage: Stage) -> Expr:
        e = rewrite(e, self._inline_load)
        e = substitute(e, self.absolute_axes(stage))
        return rewrite(e, self._buffer_load)

    def _buffer_load(self, n: Expr) -> Expr | None:
        if n.op is not Op.LOAD or not isinstance(n.arg, Tensor):
            return None
        buf = self.buffers[n.arg]
        producer = self.sch[n.arg]
        if buf.scope in REGION_SCOPES:
            mins = self.loops[producer].region_min
            return buf.load(tuple(i - m for i, m in zip(n.src, mins)))
        return buf.load(n.src)

    # ** statements **
    def stage_stmt(self, stage: Stage) -> Stmt:
        sl = self.loops[stage]
        leaves = stage.leaf_iter_vars
        store_idx = tuple(sl.value[iv] for iv in stage.axis)
        if not stage.reduce_axis:
            return self._nest(stage, leaves, self._stores(stage, store_idx), sl.guards, attach=True)
        if stage.op.attrs.get("scan") and _one_pass_scan(stage, leaves):
            return self._scan(stage, store_idx, leaves[:-1])
        if stage.op.attrs.get("scan") and _scans_down(stage, leaves):
            return self._column_scan(stage, store_idx, leaves)
        if stage.op.attrs.get("scatter") and _serial_pass(stage, leaves):
            return self._scatter(stage, store_idx, [iv for iv in leaves if iv.kind == "data"])
        # init the accumulator just outside the first reduction loop, then update inside all loops
        first = next(k for k, iv in enumerate(leaves) if iv.kind == "reduce")
        common, rest = leaves[:first], leaves[first:]
        if any(stage.iter_kind.get(iv, ForKind.SERIAL).is_thread for iv in rest if iv.kind == "reduce"):
            return self._cross_thread_reduction(stage, store_idx, common, rest)
        rest_vars = {iv.var for iv in rest}
        reduce_vars = {iv.var for iv in rest if iv.kind == "reduce"}
        inner_guards = [g for g in sl.guards if free_vars(g) & rest_vars]
        init_guards = [g for g in inner_guards if not free_vars(g) & reduce_vars]
        inits, updates = self._reduction(stage, store_idx)
        inner = seq(self._nest(stage, [iv for iv in rest if iv.kind == "data"], inits, init_guards),
                    self._nest(stage, rest, updates, inner_guards, attach=True))
        outer_guards = [g for g in sl.guards if not free_vars(g) & rest_vars]
        return self._nest(stage, common, inner, outer_guards, attach=True)

    def _scan(self, stage: Stage, idx: tuple[Expr, ...], data: list[IterVar]) -> Stmt:
        """A running reduction (te_rules.build_scan: out[..., j] reduces src[..., k] over k <= j) in one pass:
        per row, an accumulator takes src[..., j] at each j, in order, and is stored there. Each element is then
        numpy's running value (np.cumsum adds one element after another); the definition's quadratic reduction
        is what other schedules get."""
        t, body = stage.outputs[0], stage.body[0]
        j, k = stage.axis[-1], stage.reduce_axis[0]
        red = body.arg.reducer
        acc = Buffer(f"{t.name}.acc", t.dtype, (1,), "local")
        at = (const(0),)
        src = substitute(self.lower_expr(body.src[0], stage), {k.var: j.var})
        # a float sum starts at -0.0, the identity that keeps a leading -0.0 (numpy's first element is the first value)
        start = const(-0.0, t.dtype) if red.name == "sum" and t.dtype.is_float else red.identity(t.dtype)
        sl = self.loops[stage]
        step = seq(Store(acc, at, red.combine(acc.load(at), src)),
                   Store(self.buffers[t], self._store_index(stage, t, idx), acc.load(at)))
        inner_guards = [g for g in sl.guards if j.var in free_vars(g)]
        outer_guards = [g for g in sl.guards if j.var not in free_vars(g)]
        row = seq(Store(acc, at, start), self._nest(stage, [j], step, inner_guards, attach=True))
        return self._nest(stage, data[:-1], Allocate(acc, row), outer_guards, attach=True)

    def _column_scan(self, stage: Stage, idx: tuple[Expr, ...], leaves: list[IterVar]) -> Stmt:
        """A running reduction along an axis that is not the last (te_rules.build_scan) in one pass: each element
        is the running value of the element before it along the axis, read back from the output, combined with
        its own. The loops are the stage's data loops (the axes after the scanned one may be vectorized: each
        step then combines whole vectors of a row), in numpy's order along the axis for every column."""
        t, body = stage.outputs[0], stage.body[0]
        ax = stage.op.attrs["scan_axis"]
        j, k = stage.axis[ax], stage.reduce_axis[0]
        red = body.arg.reducer
        buf = self.buffers[t]
        src = substitute(self.lower_expr(body.src[0], stage), {k.var: j.var})
        start = const(-0.0, t.dtype) if red.name == "sum" and t.dtype.is_float else red.identity(t.dtype)
        at = self._store_index(stage, t, idx)
        before = at[:ax] + (binary(Op.MAX, at[ax] - 1, const(0, at[ax].dtype)),) + at[ax + 1:]
        running = Store(buf, at, red.combine(select(j.var == 0, start, buf.load(before)), src))
        guards = [g for g in self.loops[stage].guards if k.var not in free_vars(g)]
        return self._nest(stage, [iv for iv in leaves if iv is not k], running, guards, attach=True)

    def _scatter(self, stage: Stage, idx: tuple[Expr, ...], data: list[IterVar]) -> Stmt:
        """An unbuffered update (te_rules.build_scatter) as numpy runs it: the old array copied, then for m in
        order, values[m] combined into the row at position[m]. The op's attributes hold the three parts as
        expressions of its axes and the variable m."""
        t, body = stage.outputs[0], stage.body[0]
        m, parts = stage.op.attrs["scatter"]
        buf, k = self.buffers[t], stage.reduce_axis[0]
        copy = Store(buf, self._store_index(stage, t, idx), self.lower_expr(parts["old"], stage))
        # the pass loops over the root axes as the parts name them (the data loops are the copy's schedule)
        value, position = (rewrite(rewrite(parts[name], self._inline_load), self._buffer_load)
                           for name in ("value", "position"))
        # the positions are in range (the graph wrapped and checked them); the clamp lets the store be proved so
        row = (binary(Op.MAX, binary(Op.MIN, position, as_expr(buf.shape[0]) - 1), const(0, position.dtype)),)
        at = row + tuple(iv.var for iv in stage.axis[1:])
        update: Stmt = Store(buf, at, body.arg.reducer.combine(buf.load(at), value))
        for iv in reversed(stage.axis[1:]):
            update = For(iv.var, as_expr(iv.extent), ForKind.SERIAL, update)
        count = as_expr(self.loops[stage].extent[k]) - 1
        fill = self._nest(stage, data, copy, self.loops[stage].guards, attach=True)
        return seq(fill, For(m, count, ForKind.SERIAL, update))

    def _cross_thread_reduction(self, stage: Stage, idx: tuple[Expr, ...], common: list[IterVar],
                                rest: list[IterVar]) -> Stmt:
        """A reduction whose axis is split over GPU threads: each thread accumulates its share in a register,
        the threads combine their partial results (ThreadReduce), and the total is stored."""
        bound = [iv for iv in rest if stage.iter_kind.get(iv, ForKind.SERIAL).is_thread]
        sl = self.loops[stage]
        extent = sl.extent[bound[0]]
        kind = stage.iter_kind[bound[0]]
        problem = ("it has several outputs" if len(stage.outputs) != 1 else
                   "data loops are inside its reduction loops (reorder them outside)" if any(iv.kind != "reduce" for iv in rest) else
                   "two reduction loops are bound to threads" if len(bound) != 1 else
                   f"{extent} threads is not a power of two up to 1024" if not isinstance(extent, int) or extent & (extent - 1) or extent > 1024 else "")
        if problem:
            raise LoweringError(f"stage '{stage.name}' reduces across GPU threads (loop '{bound[0].name}'), but {problem}")
        t, body = stage.outputs[0], stage.body[0]
        red = body.arg.reducer
        acc = Buffer(f"{t.name}.acc", t.dtype, (1,), "local")
        at = (const(0),)
        src, cond = (self.lower_expr(x, stage) for x in body.src)
        update: Stmt = Store(acc, at, red.combine(acc.load(at), src))
        if not (cond.op is Op.CONST and cond.value):
            update = IfThenElse(cond, update)
        rest_vars = {iv.var for iv in rest}
        inner_guards = [g for g in sl.guards if free_vars(g) & rest_vars]
        outer_guards = [g for g in sl.guards if not free_vars(g) & rest_vars]
        inner = seq(Store(acc, at, red.identity(t.dtype)),
                    self._nest(stage, rest, update, inner_guards, attach=True),
                    ThreadReduce(acc, red, kind, extent),
                    Store(self.buffers[t], self._store_index(stage, t, idx), acc.load(at)))
        return self._nest(stage, common, Allocate(acc, inner), outer_guards, attach=True)

    def _stores(self, stage: Stage, idx: tuple[Expr, ...]) -> Stmt:
        return seq(*(Store(self.buffers[t], self._store_index(stage, t, idx), self.lower_expr(b, stage))
                     for t, b in zip(stage.outputs, stage.body)))

    def _store_index(self, stage: Stage, t: Tensor, idx: tuple[Expr, ...]) -> tuple[Expr, ...]:
        if self.buffers[t].scope in REGION_SCOPES:
            return idx  # region-sized buffer: relative index
        return tuple(m + i for m, i in zip(self.loops[stage].region_min, idx))

    def _reduction(self, stage: Stage, idx: tuple[Expr, ...]) -> tuple[Stmt, Stmt]:
        inits, updates = [], []
        for t, body in zip(stage.outputs, stage.body):
            buf, at = self.buffers[t], self._store_index(stage, t, idx)
            red = body.arg.reducer
            inits.append(Store(buf, at, red.identity(t.dtype)))
            src, cond = (self.lower_expr(s, stage) for s in body.src)
            update: Stmt = Store(buf, at, red.combine(buf.load(at), src))
            if not (cond.op is Op.CONST and cond.value):
                update = IfThenElse(cond, update)
            updates.append(update)
        return seq(*inits), seq(*updates)

    def _nest(self, stage: Stage, leaves: list[IterVar], inner: Stmt, guards: list[Expr],
              attach: bool = False) -> Stmt:
        """Loops over `leaves` around `inner`; each guard sits just inside the loop of its innermost variable."""
        depth = {iv.var: k for k, iv in enumerate(leaves)}
        levels: dict[int, list[Expr]] = {}
        for g in dict.fromkeys(guards):  # a split tail and a region edge can give the same condition
            level = max((depth[v] for v in free_vars(g) if v in depth), default=-1)
            levels.setdefault(level, []).append(g)
        body = inner
        for k in range(len(leaves) - 1, -1, -1):
            body = _guard(body, levels.get(k, []))
            iv = leaves[k]
            attached = self._attached(stage, iv) if attach else []
            extent, kind = as_expr(self.loops[stage].extent[iv]), stage.iter_kind.get(iv, ForKind.SERIAL)
            if any(st.double_buffered for st in attached):
                body = self._double_buffered(stage, iv, attached, kind, extent, body)
                continue
            if attached:
                body = self._with_attached(attached, body)
            body = For(iv.var, extent, kind, body)
        return _guard(body, levels.get(-1, []))

    def _attached(self, stage: Stage, iv: IterVar) -> list[Stage]:
        return [s for s in self.sch.stages if s.attach_type == "scope" and s.attach_stage is stage
                and s.attach_ivar is iv]

    def _double_buffered(self, stage: Stage, iv: IterVar, attached: list[Stage], kind: ForKind, extent: Expr,
                         body: Stmt) -> Stmt:
        """The loop `iv` of `stage` with its attached shared tiles double-buffered (`Stage.double_buffer`)."""
        names = [st.name for st in attached]
        if kind is not ForKind.SERIAL:
            raise LoweringError(f"double_buffer: {names} are computed at loop '{iv.name}' of '{stage.name}', which "
                                f"is {kind.value}; the tiles alternate between the iterations of a serial loop")
        if not all(st.double_buffered and st.scope == "shared" for st in attached):
            raise LoweringError(f"double_buffer: the stages computed at loop '{iv.name}' of '{stage.name}' are "
                                f"{names}; double-buffer all of them (shared-memory stages) or none")
        fills = [self.stage_stmt(st) for st in attached]
        tiles = [self.buffers[t] for st in attached for t in st.outputs]
        return double_buffer.pipeline(iv.var, extent, fills, tiles, body)

    def _with_attached(self, attached: list[Stage], body: Stmt) -> Stmt:
        fills: list[Stmt] = []
        for k, st in enumerate(attached):
            # the block's threads fill shared memory together: before a run of fills, wait until all have
            # stopped reading the last fill; after it, until all have written before anyone reads
            shared = st.scope == "shared"
            if shared and (k == 0 or attached[k - 1].scope != "shared"):
                fills.append(Barrier())
            fills.append(self.stage_stmt(st))
            if shared and (k + 1 == len(attached) or attached[k + 1].scope != "shared"):
                fills.append(Barrier())
        out = seq(*fills, body)
        for s in reversed(attached):
            for t in s.outputs:
                if self.buffers[t].scope != "param":  # an argument lives in the caller's array
                    out = Allocate(self.buffers[t], out)
        return out

    def function(self, name: str) -> PrimFunc:
        params = self.make_buffers()
        body = seq(*(self.stage_stmt(s) for s in self.sch.stages
                     if not s.is_placeholder and s.attach_type == "root"))
        for t, buf in self.buffers.items():
            if buf.scope == "global":
                body = Allocate(buf, body)
        outputs = tuple(k for k, t in enumerate(self.args) if not isinstance(t.op, PlaceholderOp))
        # te.size_param inputs: the symbol each one's value binds
        held = {t.op.value.name: k for k, t in enumerate(self.args) if getattr(t.op, "value", None) is not None}
        return PrimFunc(name, params, body, outputs, attrs={"symbol_values": held} if held else {},
                        symbols=self.symbols)


REGION_SCOPES = ("local", "shared")  # buffers that hold a region of their tensor, indexed relative to it


def _buffer_scope(stage: Stage) -> str:
    """Where a stage's buffer lives: shared memory if scheduled so, else per attach point (local) or whole."""
    if stage.scope == "shared":
        if stage.attach_type != "scope":
            raise LoweringError(f"stage '{stage.name}' is in shared memory, which exists only inside a GPU block: "
                                f"compute_at it inside the consumer's loop bound to blockIdx (or an inner one)")
        return "shared"
    return "local" if stage.attach_type == "scope" else "global"


def _one_pass_scan(stage: Stage, leaves: list[IterVar]) -> bool:
    """Whether a scan stage's last data loop and its reduction loop are as created, innermost, serial: the loops
    the one-pass lowering runs (any other schedule lowers the definition)."""
    j, k = stage.axis[-1], stage.reduce_axis[0]
    along_last = stage.op.attrs.get("scan_axis", len(stage.axis) - 1) == len(stage.axis) - 1
    return along_last and len(stage.reduce_axis) == 1 and leaves[-2:] == [j, k] and \
        all(stage.iter_kind.get(iv, ForKind.SERIAL) is ForKind.SERIAL for iv in (j, k))


def _serial_pass(stage: Stage, leaves: list[IterVar]) -> bool:
    """Whether a scatter stage can run as one ordered pass: at the root (it writes the whole output), its one
    reduction axis an unsplit serial loop (its data loops may have any schedule: they copy the old array)."""
    (k,) = stage.reduce_axis
    return stage.attach_type == "root" and k in leaves and stage.iter_kind.get(k, ForKind.SERIAL) is ForKind.SERIAL


def _scans_down(stage: Stage, leaves: list[IterVar]) -> bool:
    """Whether a scan stage along an axis that is not its last can run as one pass: at the root, its scanned
    loop and its reduction loop unsplit and serial (the other data loops may have any schedule)."""
    ax = stage.op.attrs.get("scan_axis", len(stage.axis) - 1)
    if ax == len(stage.axis) - 1 or stage.attach_type != "root" or len(stage.reduce_axis) != 1:
        return False
    j, k = stage.axis[ax], stage.reduce_axis[0]
    return j in leaves and k in leaves and \
        all(stage.iter_kind.get(iv, ForKind.SERIAL) is ForKind.SERIAL for iv in (j, k))


def _outer_extent(rel: Split, parent: Dim) -> Dim:
    # nparts of a symbolic extent keeps the schedule's outer extent (see Stage.split)
    return rel.outer.extent if isinstance(rel.factor, Expr) else ceildiv(parent, rel.factor)


def _product(a: Dim, b: Dim) -> Dim:
    return a * b


def _last(extent: Dim) -> Dim:
    """The last index of a loop: an int, or the expression extent - 1."""
    return extent - 1 if isinstance(extent, int) else simplify(extent - 1)


def _divides(factor: Dim, extent: Dim) -> bool:
    """Whether `factor` surely divides `extent` (`n * 8` by 8), so the split needs no tail guard."""
    if isinstance(factor, int) and isinstance(extent, int):
        return extent % factor == 0
    rem = simplify(as_expr(extent) % factor) if isinstance(factor, int) else None
    return rem is not None and rem.op is Op.CONST and rem.value == 0


def _guard(body: Stmt, conds: list[Expr]) -> Stmt:
    for c in conds:
        body = IfThenElse(c, body)
    return body


def lower(sch: Schedule, args: Sequence[Tensor], name: str = "main",
          bounds: Mapping[str, tuple[int, int]] | None = None) -> PrimFunc:
    """Lower a schedule to loop IR; `print()` the result to read the loops. `bounds`: symbol name -> the lowest
    and highest value its callers guarantee (checked before every call: @jitop.kernel's guards).

    >>> f = lower(s, [A, B])   # doctest: +SKIP
    >>> print(f)               # doctest: +SKIP
    """
    low = Lowering(sch, args, bounds)
    # regions of compute_at stages come from their consumers' loops
    low.infer()
    # build loop nests with guards, reductions and attached stages
    func = low.function(name)
    # fold index arithmetic and drop guards the loop ranges prove
    body = simplify_stmt(func.body, low.ranges)
    # run tail-free iterations without guards (no masks in the main vector loops)
    body = partition_loops(body, low.ranges)
    return replace(func, body=body, attrs={**func.attrs, "ranges": low.ranges})
