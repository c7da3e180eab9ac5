"""Kernels of a GPU graph function merged where one launch can do the work of two.

A small model's decode step is bound by the host's launches (each one Python call and a driver call), not by
the GPU's work, and a traced graph makes a kernel per materialized stage. Three merges are always safe:

- two **single-block** kernels of one block shape, one after the other: the block runs the first, waits at a
  barrier (which also makes the first's global writes visible to the whole block), then runs the second; so the
  second may read what the first wrote (a layer norm's centred row, then its variance);
- two kernels launching the same blocks along one block index, where each block touches only its own slice
  (first index: the block's) of every buffer one writes and the other touches (a softmax's per-row statistics,
  then its rows): each block runs the first body, a barrier, then the second;
- two kernels of one launch shape that share no buffer either writes (two concatenations of a decode step's
  caches): the later one moves up past the kernels between them that share no such buffer with it, and one
  launch runs both bodies, each block its own part of each. Only kernels without shared memory or barriers
  merge this way: their blocks stay as light as they were.

Graph lowering applies it (`jitop.lower` of a schedule written by hand keeps its kernels as written).
"""
from __future__ import annotations

from jitop.codegen.kernel import top_level_nests
from jitop.codegen.nvptx import launch_dims
from jitop.target import CudaTarget
from jitop.te.expr import Expr, Op
from jitop.tir.nodes import Allocate, Barrier, Buffer, For, PrimFunc, Seq, Stmt, Store, ThreadReduce, seq, walk_stmts
from jitop.tir.passes import substitute_stmt
from jitop.tir.storage import loads_of, touched

REDUCE_SCRATCH = 1024  # bytes of shared memory a kernel's cross-warp reductions may add to its allocations


def merge_kernels(func: PrimFunc, target: CudaTarget, notes: list[str] | None = None) -> PrimFunc:
    """`func` with its kernels merged where one launch can run two (see the module's docstring); `notes`, if
    given, receives a line per merge."""
    allocations, body = [], func.body
    while isinstance(body, Allocate) and body.buffer.scope == "global":
        allocations.append(body)
        body = body.body
    ranges = func.attrs.get("ranges", {})
    kernels: list[Stmt] = []
    footprints = _Footprints()
    for nest in top_level_nests(body):
        if isinstance(nest, Seq) and not nest.stmts:
            continue
        if not (_after_single_block(kernels, nest, ranges, target, notes)
                or _after_same_rows(kernels, nest, ranges, target, footprints, notes)
                or _beside_independent(kernels, nest, ranges, footprints, notes)):
            kernels.append(nest)
    merged: Stmt = Seq(tuple(kernels))  # not seq(): a kernel that is a sequence stays one
    for a in reversed(allocations):
        merged = Allocate(a.buffer, merged)
    return PrimFunc(func.name, func.params, merged, func.outputs, func.attrs, func.symbols)


class _Footprints:
    """Each kernel's buffers touched and written, worked out once per kernel (a candidate is checked against
    every earlier kernel)."""

    def __init__(self):
        self._known: dict[int, tuple[Stmt, set, set]] = {}  # id -> (the kernel, kept alive; touched; written)

    def of(self, nest: Stmt) -> tuple[set, set]:
        if id(nest) not in self._known:
            self._known[id(nest)] = (nest, touched(nest), _written(nest))
        _, all_touched, written = self._known[id(nest)]
        return all_touched, written


def _after_single_block(kernels: list[Stmt], nest: Stmt, ranges: dict, target: CudaTarget,
                        notes: list[str] | None) -> bool:
    """Append `nest` to the last kernel, after a barrier, if both are one block of the same shape."""
    if not kernels:
        return False
    last = kernels[-1]
    dims = _launch(nest, ranges)
    if not (_one_block(dims) and _same(dims, _launch(last, ranges)) and _fits(last, nest, target)):
        return False
    kernels[-1] = Seq((last, Barrier(), nest))
    if notes is not None:
        notes.append(f"kernels merged: {_first_store(nest)} runs in {_first_store(last)}'s single block, after it")
    return True


def _after_same_rows(kernels: list[Stmt], nest: Stmt, ranges: dict, target: CudaTarget,
                     footprints: _Footprints, notes: list[str] | None) -> bool:
    """Append `nest`'s block body to the last kernel's, after a barrier, where both launch the same blocks along
    one block index and each block touches only its own slice of what the two share (a softmax's statistics
    per row, then its rows: block r writes and reads row r alone)."""
    if not kernels or not isinstance(nest, For) or not nest.kind.is_gpu_index or nest.kind.is_thread:
        return False
    last, dims = kernels[-1], _launch(nest, ranges)
    if not (isinstance(last, For) and last.kind is nest.kind and last.extent is nest.extent and len(dims) > 0
            and sum(not k.is_thread for k in dims) == 1 and _same(dims, _launch(last, ranges))
            and _fits(last, nest, target)):
        return False
    (last_touched, last_writes), (nest_touched, nest_writes) = footprints.of(last), footprints.of(nest)
    shared = (last_writes & nest_touched) | (nest_writes & last_touched)
    if not all(_sliced(last, last.var, buf) and _sliced(nest, nest.var, buf) for buf in shared):
        return False
    body = substitute_stmt(nest.body, {nest.var: last.var})
    kernels[-1] = For(last.var, last.extent, last.kind, seq(last.body, Barrier(), body))
    if notes is not None:
        notes.append(f"kernels merged: {_first_store(nest)} runs after {_first_store(last)} in the same blocks "
                     "(each block its own rows)")
    return True


def _sliced(nest: Stmt, block: Expr, buf: Buffer) -> bool:
    """Whether every access of `nest` to `buf` has the block index `block` itself as its first index (so a
    block touches only its own slice of it)."""
    return all(index and index[0] is block for index in _accesses(nest, buf))


def _accesses(nest: Stmt, buf: Buffer) -> list[tuple[Expr, ...]]:
    """The index tuples of every store to and load of `buf` in `nest` (loads in indices, conditions and loop
    extents included)."""
    found = []
    for s in walk_stmts(nest):
        if isinstance(s, Store) and s.buffer is buf:
            found.append(s.indices)
        found += [e.src for e in loads_of(s) if e.arg is buf]
    return found


def _beside_independent(kernels: list[Stmt], nest: Stmt, ranges: dict, footprints: _Footprints,
                        notes: list[str] | None) -> bool:
    """Put `nest`'s body in the latest earlier kernel of its launch shape that it can join: no buffer written by
    one is touched by the other, nor by a kernel between them."""
    if not _light(nest) or not isinstance(nest, For) or not nest.kind.is_gpu_index or nest.kind.is_thread:
        return False
    dims = _launch(nest, ranges)
    mine, writes = footprints.of(nest)
    for k in range(len(kernels) - 1, -1, -1):
        other = kernels[k]
        other_touched, other_writes = footprints.of(other)
        if writes & other_touched or other_writes & mine:
            return False
        if isinstance(other, For) and other.kind is nest.kind and other.extent is nest.extent and _light(other) \
                and _same(_launch(other, ranges), dims):
            body = substitute_stmt(nest.body, {nest.var: other.var})
            kernels[k] = For(other.var, other.extent, other.kind, seq(other.body, body))
            if notes is not None:
                notes.append(f"kernels merged: {_first_store(nest)} runs beside {_first_store(other)} in one launch")
            return True
    return False


def _launch(nest: Stmt, ranges: dict) -> dict:
    """The kernel's launch extents, without the indices of extent 1 (a loop of one block or thread is none)."""
    return {kind: e for kind, e in launch_dims(nest, ranges).items() if not (e.op is Op.CONST and int(e.value) == 1)}


def _one_block(dims: dict) -> bool:
    return all(kind.is_thread for kind in dims)


def _same(a: dict, b: dict) -> bool:
    """Whether two launch shapes are the same (expressions are interned: equal iff identical)."""
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)


def _light(nest: Stmt) -> bool:
    """No barrier, no shared memory, no block-wide reduction: a kernel whose blocks merge freely."""
    return not any(isinstance(s, (Barrier, ThreadReduce)) or isinstance(s, Allocate) and s.buffer.scope == "shared"
                   for s in walk_stmts(nest))


def _fits(a: Stmt, b: Stmt, target: CudaTarget) -> bool:
    """Whether the shared memory of both kernels fits one block (not if a size is symbolic)."""
    total = 0
    for s in (*walk_stmts(a), *walk_stmts(b)):
        if isinstance(s, ThreadReduce):
            total += REDUCE_SCRATCH
        elif isinstance(s, Allocate) and s.buffer.scope == "shared":
            size = s.buffer.size
            if not isinstance(size, int):
                return False
            total += max(size, 1) * s.buffer.dtype.itemsize
    return total <= target.shared_per_block


def _written(nest: Stmt) -> set:
    """The buffers in GPU memory (parameters and workspaces) the kernel stores to."""
    return {s.buffer for s in walk_stmts(nest) if isinstance(s, Store) and s.buffer.scope in ("param", "global")}


def _first_store(nest: Stmt) -> str:
    return next((b.name for b in _written(nest)), "a kernel")
