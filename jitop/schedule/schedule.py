"""Schedules: one Stage per operation, and TVM's primitives that reshape its loop nest.

>>> from jitop import te
>>> import jitop
>>> A = te.placeholder((1000,), "float32", "A")
>>> B = te.compute((1000,), lambda i: A[i] * 2.0, name="B")
>>> s = jitop.create_schedule(B.op)
>>> xo, xi = s[B].split(B.op.axis[0], factor=16)
>>> s[B].vectorize(xi)
"""
from __future__ import annotations

import enum
import operator
from dataclasses import dataclass
from typing import Any, Sequence

from jitop.errors import ScheduleError, axis_already_transformed, axis_not_in_stage
from jitop.te.expr import Expr, Op, binary, rewrite, substitute
from jitop.te.tensor import (ComputeOp, Dim, IterVar, Operation, PlaceholderOp, Tensor, ThreadAxis, compute,
                             read_tensors)


def ceildiv(a: Dim, b: Dim) -> Dim:
    """ceil(a / b) for a >= 0, b >= 1: an int for ints, `(n + 7) // 8` for a symbolic extent.

    >>> from jitop import te
    >>> ceildiv(10, 4), ceildiv(te.var("n"), 8)
    (3, (n + 7) // 8)
    """
    if isinstance(a, int) and isinstance(b, int):
        return -(-a // b)
    return (a + (b - 1)) // b


class ForKind(enum.Enum):
    """How a loop runs (the value is how the loop-IR printer shows it)."""

    SERIAL = "range"
    PARALLEL = "parallel"
    VECTORIZED = "vectorized"
    UNROLLED = "unrolled"
    # bound to a GPU index (Stage.bind): the loop is the grid's or the block's dimension, one iteration per thread
    BLOCK_X = "blockIdx.x"
    BLOCK_Y = "blockIdx.y"
    BLOCK_Z = "blockIdx.z"
    THREAD_X = "threadIdx.x"
    THREAD_Y = "threadIdx.y"
    THREAD_Z = "threadIdx.z"

    @property
    def is_gpu_index(self) -> bool:
        """Whether the loop is bound to a block or thread index (it runs across GPU threads, not in a loop)."""
        return self.value.startswith(("blockIdx", "threadIdx"))

    @property
    def is_thread(self) -> bool:
        """Whether the loop is bound to a thread index within a block (threadIdx.*)."""
        return self.value.startswith("threadIdx")


@dataclass(frozen=True)
class Split:
    parent: IterVar
    outer: IterVar
    inner: IterVar
    factor: Dim  # the inner extent (symbolic only for nparts= of a symbolic extent)


@dataclass(frozen=True)
class Fuse:
    outer: IterVar
    inner: IterVar
    fused: IterVar


class Stage:
    """How one operation is computed: its loop nest (leaf_iter_vars), annotations and attach point."""

    def __init__(self, op: Operation, schedule: "Schedule"):
        self.op, self.schedule = op, schedule
        self.is_placeholder = isinstance(op, PlaceholderOp)
        self.axis: tuple[IterVar, ...] = () if self.is_placeholder else op.axis
        self.reduce_axis: tuple[IterVar, ...] = () if self.is_placeholder else op.reduce_axis
        self.body: tuple[Expr, ...] = () if self.is_placeholder else op.body
        self.leaf_iter_vars: list[IterVar] = list(self.axis + self.reduce_axis)
        self.relations: list[Split | Fuse] = []
        self.iter_kind: dict[IterVar, ForKind] = {}
        self.attach_type = "root"  # root | inline | scope
        self.attach_stage: Stage | None = None
        self.attach_ivar: IterVar | None = None
        self.scope = "global"
        self.double_buffered = False
        self._transformed: dict[IterVar, tuple[str, list[str]]] = {}

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        return self.op.outputs

    def input_tensors(self) -> list[Tensor]:
        return read_tensors(self.body)

    def __repr__(self) -> str:
        return f"Stage({self.name}, loops=[{', '.join(iv.name for iv in self.leaf_iter_vars)}])"

    # ** checks that make misuse a clear error **
    def _check_compute(self, primitive: str) -> None:
        if self.is_placeholder:
            raise ScheduleError(f"{primitive}: '{self.name}' is a placeholder (an input); it has no loops to schedule")

    def _leaf(self, iv: IterVar, primitive: str) -> int:
        self._check_compute(primitive)
        if not isinstance(iv, IterVar):
            raise TypeError(f"{primitive} on stage '{self.name}' expects an IterVar (s[T].op.axis[k]), got {iv!r}")
        for k, leaf in enumerate(self.leaf_iter_vars):
            if leaf is iv:
                return k
        if iv in self._transformed:
            how, into = self._transformed[iv]
            raise axis_already_transformed(self.name, iv.name, how, into)
        raise axis_not_in_stage(self.name, iv.name, [v.name for v in self.leaf_iter_vars])

    def _check_no_attachment(self, iv: IterVar, primitive: str) -> None:
        """A loop another stage is computed at (compute_at) keeps its identity: reshaping it would leave that
        stage attached to a loop that no longer exists."""
        for other in self._attached(iv):
            raise ScheduleError(f"{primitive} of '{iv.name}' in stage '{self.name}': stage '{other.name}' is "
                                f"computed at that loop (compute_at); {primitive} it first, then compute "
                                f"'{other.name}' at one of the new loops")

    def _attached(self, iv: IterVar | None = None) -> list["Stage"]:
        """The stages computed at this stage's loops (at loop `iv` only, if given)."""
        return [o for o in self.schedule.stage_map.values()
                if o.attach_stage is self and (iv is None or o.attach_ivar is iv)]

    # ** loop-shaping primitives **
    def split(self, parent: IterVar, factor: int | None = None, nparts: int | None = None) -> tuple[IterVar, IterVar]:
        """Split `parent` into (outer, inner) with inner extent `factor` (or `nparts` outer iterations).

        Extents need not divide: the lowered loops guard the tail. A symbolic extent `n` split by 8 gives
        an outer extent `(n + 7) // 8`.
        """
        pos = self._leaf(parent, "split")
        self._check_no_attachment(parent, "split")
        factor, nparts = (_as_int(v) for v in (factor, nparts))  # (numpy ints too, as TVM takes them)
        if (factor is None) == (nparts is None):
            raise ScheduleError(f"split of '{parent.name}' in stage '{self.name}': give exactly one of factor= or nparts=")
        n = factor if factor is not None else nparts
        if not isinstance(n, int) or n < 1:
            raise ScheduleError(f"split of '{parent.name}' in stage '{self.name}': factor/nparts must be a positive int, got {n!r}")
        inner_ext = factor if factor is not None else _at_least_one(ceildiv(parent.extent, nparts))
        # nparts of a symbolic extent: exactly nparts outer iterations (those past the end are guarded away)
        outer_ext = nparts if nparts is not None and isinstance(inner_ext, Expr) else ceildiv(parent.extent, inner_ext)
        outer = IterVar(f"{parent.name}.outer", outer_ext, parent.kind)
        inner = IterVar(f"{parent.name}.inner", inner_ext, parent.kind)
        self.relations.append(Split(parent, outer, inner, inner_ext))
        self.leaf_iter_vars[pos:pos + 1] = [outer, inner]
        self._transformed[parent] = ("split", [outer.name, inner.name])
        return outer, inner

    def tile(self, x_parent: IterVar, y_parent: IterVar, x_factor: int, y_factor: int
             ) -> tuple[IterVar, IterVar, IterVar, IterVar]:
        """Split two axes and order the loops (x.outer, y.outer, x.inner, y.inner)."""
        xo, xi = self.split(x_parent, x_factor)
        yo, yi = self.split(y_parent, y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    def fuse(self, *ivars: IterVar) -> IterVar:
        """Fuse adjacent loops (outermost first) into one loop over their product."""
        if not ivars:
            raise ScheduleError(f"fuse on stage '{self.name}' needs at least one axis")
        fused = ivars[0]
        for nxt in ivars[1:]:
            fused = self._fuse2(fused, nxt)
        return fused

    def _fuse2(self, outer: IterVar, inner: IterVar) -> IterVar:
        po, pi = self._leaf(outer, "fuse"), self._leaf(inner, "fuse")
        for iv in (outer, inner):
            self._check_no_attachment(iv, "fuse")
        if pi != po + 1:
            order = ", ".join(v.name for v in self.leaf_iter_vars)
            raise ScheduleError(f"fuse in stage '{self.name}': '{outer.name}' and '{inner.name}' are not adjacent "
                                f"(loop order is {order}); reorder them next to each other first, outer first")
        if outer.kind != inner.kind:
            raise ScheduleError(f"fuse in stage '{self.name}': cannot fuse data axis with reduce axis "
                                f"('{outer.name}' is {outer.kind}, '{inner.name}' is {inner.kind})")
        fused = IterVar(f"{outer.name}.{inner.name}.fused", outer.extent * inner.extent, outer.kind)
        self.relations.append(Fuse(outer, inner, fused))
        self.leaf_iter_vars[po:pi + 1] = [fused]
        for v in (outer, inner):
            self._transformed[v] = ("fused", [fused.name])
        return fused

    def reorder(self, *ivars: IterVar) -> None:
        """Put the given loops, in this order, into the positions they occupy now."""
        positions = sorted(self._leaf(v, "reorder") for v in ivars)
        if len(set(map(id, ivars))) != len(ivars):
            raise ScheduleError(f"reorder in stage '{self.name}': an axis is listed twice")
        for pos, v in zip(positions, ivars):
            self.leaf_iter_vars[pos] = v

    def _annotate(self, iv: IterVar, kind: ForKind, primitive: str) -> None:
        self._leaf(iv, primitive)
        if kind is ForKind.PARALLEL and iv.kind == "reduce":
            raise ScheduleError(f"parallel on stage '{self.name}': '{iv.name}' is a reduction axis; threads would race "
                                "on the same output. Parallelise a data axis (s[T].op.axis) instead")
        self.iter_kind[iv] = kind

    def vectorize(self, iv: IterVar) -> None:
        """Run loop `iv` as SIMD lanes (its extent is the vector width)."""
        self._annotate(iv, ForKind.VECTORIZED, "vectorize")

    def parallel(self, iv: IterVar) -> None:
        """Run loop `iv`'s iterations on all threads."""
        self._annotate(iv, ForKind.PARALLEL, "parallel")

    def bind(self, iv: IterVar, thread: ThreadAxis) -> None:
        """Run loop `iv` across GPU blocks or threads: `s[C].bind(bx, te.thread_axis("blockIdx.x"))`. The loop's
        extent becomes that grid or block dimension (a kernel built for target="cuda").

        >>> from jitop import te
        >>> A = te.placeholder((1024,), name="A")
        >>> B = te.compute((1024,), lambda i: A[i] + 1.0, name="B")
        >>> s = create_schedule(B)
        >>> bx, tx = s[B].split(B.op.axis[0], factor=128)
        >>> s[B].bind(bx, te.thread_axis("blockIdx.x")); s[B].bind(tx, te.thread_axis("threadIdx.x"))
        """
        if not isinstance(thread, ThreadAxis):
            raise TypeError(f"bind on stage '{self.name}': the second argument is te.thread_axis(\"threadIdx.x\") "
                            f"or alike, got {thread!r}")
        kind = ForKind(thread.tag)
        if iv.kind == "reduce" and not kind.is_thread:
            raise ScheduleError(f"bind on stage '{self.name}': '{iv.name}' is a reduction axis; only threadIdx.* can "
                                "share a reduction (blocks cannot combine their partial results)")
        taken = [v.name for v, k in self.iter_kind.items() if k is kind and v is not iv]
        if taken:
            raise ScheduleError(f"bind on stage '{self.name}': {thread.tag} is already bound to loop '{taken[0]}'; "
                                f"fuse the two loops first (s[T].fuse) and bind the fused loop once")
        self._annotate(iv, kind, "bind")

    def unroll(self, iv: IterVar) -> None:
        """Fully unroll loop `iv` (its extent must be a small constant)."""
        self._annotate(iv, ForKind.UNROLLED, "unroll")

    def double_buffer(self) -> None:
        """Keep two copies of this shared-memory stage (attached with compute_at to a serial loop): while the
        threads compute on one, the next iteration's copy is loaded into registers and stored into the other,
        with one barrier per iteration instead of two. The loads' latency then hides behind the arithmetic.

        >>> from jitop import te
        >>> A = te.placeholder((64, 64), name="A")
        >>> k = te.reduce_axis((0, 64), name="k")
        >>> B = te.compute((64,), lambda i: te.sum(A[i, k], axis=k), name="B")
        >>> s = create_schedule(B)
        >>> AS = s.cache_read(A, "shared", [B])
        >>> ko, ki = s[B].split(s[B].op.reduce_axis[0], factor=16)
        >>> s[AS].compute_at(s[B], ko)
        >>> s[AS].double_buffer()
        """
        self._check_compute("double_buffer")
        if self.scope != "shared":
            raise ScheduleError(f"double_buffer: '{self.name}' is in {self.scope!r} memory; only a shared-memory "
                                "stage (s.cache_read(T, \"shared\", ...)) is double-buffered")
        self.double_buffered = True

    def set_scope(self, scope: str) -> None:
        """Keep this stage's buffer in `scope`: "shared" (one copy per GPU block, which its threads fill
        together: for a stage computed at a loop bound to blockIdx and read by other threads), or "local" /
        "global": the default (a stage computed at a loop holds its region per attach point, others the whole
        tensor).

        >>> from jitop import te
        >>> A = te.placeholder((8, 256), name="A")
        >>> B = te.compute((8, 256), lambda i, j: A[i, j] * 2.0, name="B")
        >>> C = te.compute((8, 256), lambda i, j: B[i, 255 - j], name="C")
        >>> s = create_schedule(C)
        >>> s[B].set_scope("shared")
        >>> s[B].scope
        'shared'
        """
        self._check_compute("set_scope")
        if scope not in ("global", "shared", "local"):
            raise ScheduleError(f"set_scope: '{self.name}' got scope {scope!r}; expected 'global', 'shared' or "
                                "'local'")
        self.scope = scope

    # ** where the stage is computed **
    def compute_at(self, parent: "Stage", ivar: IterVar) -> None:
        """Compute this stage inside `parent`'s loop `ivar`, only over the region that loop needs."""
        self._check_compute("compute_at")
        if not isinstance(parent, Stage):
            raise TypeError(f"compute_at of '{self.name}': the first argument is a stage, s[T], got {parent!r}")
        parent._leaf(ivar, "compute_at")
        if parent is self:
            raise ScheduleError(f"compute_at: '{self.name}' cannot be computed inside one of its own loops; attach it "
                                f"to a stage that reads it: s[{self.name}].compute_at(s[consumer], consumer_axis)")
        if self._is_ancestor_of(parent):
            raise ScheduleError(f"compute_at: '{self.name}' cannot be computed inside '{parent.name}', "
                                f"which is itself computed inside '{self.name}'")
        self.attach_type, self.attach_stage, self.attach_ivar = "scope", parent, ivar

    def _is_ancestor_of(self, stage: "Stage") -> bool:
        s = stage
        while s.attach_type == "scope":
            s = s.attach_stage
            if s is self:
                return True
        return False

    def compute_inline(self) -> None:
        """Substitute this stage's expression into its consumers (no buffer, no loops of its own)."""
        self._check_compute("compute_inline")
        if self.reduce_axis:
            raise ScheduleError(f"compute_inline: '{self.name}' is a reduction; only elementwise stages can be inlined. "
                                f"Use compute_at to place it inside its consumer instead")
        if any(op is self.op for op in self.schedule.outputs):
            raise ScheduleError(f"compute_inline: '{self.name}' is an output of the schedule; it must be written to memory")
        attached = [o.name for o in self._attached()]
        if attached:
            raise ScheduleError(f"compute_inline: stage(s) {', '.join(map(repr, attached))} are computed at loops of "
                                f"'{self.name}' (compute_at), which inlining removes; attach them elsewhere first")
        self.attach_type, self.attach_stage, self.attach_ivar = "inline", None, None

    def compute_root(self) -> None:
        """Undo compute_at/compute_inline: compute the whole tensor before its consumers."""
        self._check_compute("compute_root")
        self.attach_type, self.attach_stage, self.attach_ivar = "root", None, None


def _at_least_one(n: Dim) -> Dim:
    # nparts of an empty extent: the inner loop keeps one iteration (its body is guarded away)
    return (n or 1) if isinstance(n, int) else binary(Op.MAX, n, 1)


def _as_ops(ops: Any) -> list[Operation]:
    items = ops if isinstance(ops, (list, tuple)) else [ops]
    out = []
    for x in items:
        op = x.op if isinstance(x, Tensor) else x
        if not isinstance(op, Operation):
            raise TypeError(f"create_schedule expects operations or tensors (B.op or B), got {x!r}")
        out.append(op)
    return out


class Schedule:
    """The stages of a computation in producer-before-consumer order; `s[T]` is T's stage."""

    def __init__(self, outputs: list[Operation]):
        self.outputs = outputs
        self.stages: list[Stage] = []
        self.stage_map: dict[Operation, Stage] = {}
        for op in self._post_order(outputs):
            self._add_stage(op, len(self.stages))

    @staticmethod
    def _post_order(outputs: list[Operation]) -> list[Operation]:
        order: list[Operation] = []
        seen: set[int] = set()

        def visit(op: Operation) -> None:
            if id(op) in seen:
                return
            seen.add(id(op))
            for t in op.input_tensors:
                visit(t.op)
            order.append(op)
        for op in outputs:
            visit(op)
        return order

    def _add_stage(self, op: Operation, position: int) -> Stage:
        stage = Stage(op, self)
        self.stages.insert(position, stage)
        self.stage_map[op] = stage
        return stage

    def __getitem__(self, x: Tensor | Operation) -> Stage:
        op = x.op if isinstance(x, Tensor) else x
        if op not in self.stage_map:
            raise KeyError(f"'{getattr(op, 'name', op)}' is not part of this schedule; create_schedule reaches only "
                           f"the outputs' inputs")
        return self.stage_map[op]

    def cache_write(self, tensor: Tensor | Sequence[Tensor], scope: str = "local") -> Tensor | tuple[Tensor, ...]:
        """Compute `tensor` into a cache stage first; the original stage then copies the cache out.

        Call it before splitting the stage. Usually followed by compute_at of the cache stage.
        """
        first = tensor[0] if isinstance(tensor, (list, tuple)) else tensor
        stage = self[first]
        stage._check_compute("cache_write")
        if stage.relations:
            raise ScheduleError(f"cache_write of '{stage.name}' must come before its stage is split or fused; "
                                "create the cache first, then schedule both stages")
        axes = tuple(IterVar(iv.name, iv.extent) for iv in stage.axis)
        sub = {old.var: new.var for old, new in zip(stage.axis, axes)}
        cache_op = ComputeOp(f"{stage.name}.{scope}", axes, stage.reduce_axis,
                             tuple(substitute(b, sub) for b in stage.body))
        cache = self._add_stage(cache_op, self.stages.index(stage))
        cache.scope = scope
        idx = tuple(iv.var for iv in stage.axis)
        stage.body = tuple(t[idx] for t in cache_op.outputs)
        stage.reduce_axis = ()
        stage.leaf_iter_vars = list(stage.axis)
        return cache_op.outputs[0] if cache_op.num_outputs == 1 else cache_op.outputs

    def cache_read(self, tensor: Tensor, scope: str, readers: Sequence[Tensor | Operation]) -> Tensor:
        """Copy `tensor` into a new stage that `readers` read instead (e.g. to pack or localise it)."""
        producer = self[tensor]
        copy = compute(tensor.shape, lambda *i: tensor[i], name=f"{tensor.name}.{scope}")
        stage = self._add_stage(copy.op, self.stages.index(producer) + 1)
        stage.scope = scope
        for r in readers:
            rs = self[r]
            rs.body = tuple(rewrite(b, lambda n: copy[n.src] if n.op is Op.LOAD and n.arg is tensor else None)
                            for b in rs.body)
        return copy


def create_schedule(ops: Operation | Tensor | Sequence[Operation | Tensor]) -> Schedule:
    """A default schedule (every stage at root, loops in axis order) for the given outputs.

    >>> s = create_schedule(B.op)  # doctest: +SKIP
    """
    return Schedule(_as_ops(ops))


def _as_int(v: object) -> object:
    """A split's factor as a Python int where it is an integer of any kind (np.int64(4)); else as given."""
    if v is None or isinstance(v, (bool, Expr)):
        return v
    try:
        return operator.index(v)
    except TypeError:
        return v
