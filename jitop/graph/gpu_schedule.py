"""The GPU schedule of a traced graph's stages (jitop/graph/gpu.py builds the stages): one kernel per stage
computed to memory, by kind, and one kernel per *row group*.

- injective: every axis fused, split over blocks of THREADS threads (consecutive threads, consecutive elements);
- reduction: one block per output element (or row), its last reduce axis split over the block's threads, which
  combine their partial results (a cross-thread reduction: warp shuffles, then shared memory across warps);
- matmul without a template: MATMUL_TILE x MATMUL_TILE outputs per block, one per thread, shared tiles of A and
  B (the operand views inlined into their fill), the batch on blockIdx.z; of at most FEW_ROWS rows, a block per
  FEW_ROWS_COLS columns of a row, the reduction split over threadIdx.y and combined across it;
- row group (a layer norm, a softmax: an injective head and the row-shaped stages only it reads, found by the
  CPU's rule `schedule_rules.row_candidates`): one block per row of the head, every member computed at the row
  by the block's threads. A row-long member (x - mean) is kept in shared memory; a reduction of the row is a
  cross-thread reduction whose result every thread holds; a per-row scalar (mean = sum / n) is computed by each
  thread in registers. The row is read from memory once per pass and written once, in one launch instead of
  one per stage. Where the row-long members would not fit in shared memory, or the row length is symbolic (a
  softmax over a growing key/value cache), they are computed again where they are read (inlined: a pass over
  the row's inputs each, from the caches); still one launch. A group whose member bound inference says is
  needed along more than one row is scheduled stage by stage.
"""
from __future__ import annotations

from typing import Sequence

from jitop import te
from jitop.graph.schedule_rules import one_row
from jitop.graph.to_te import Stages
from jitop.schedule.schedule import Schedule, Stage, create_schedule
from jitop.target import CudaTarget
from jitop.te.tensor import Tensor, read_along
from jitop.tir.lower import Lowering

BX, TX = te.thread_axis("blockIdx.x"), te.thread_axis("threadIdx.x")
BZ, TY, BY = te.thread_axis("blockIdx.z"), te.thread_axis("threadIdx.y"), te.thread_axis("blockIdx.y")
THREADS = 256          # threads per block of an injective stage
REDUCE_THREADS = 256   # most threads sharing one reduction (or one row of a row group)
MATMUL_TILE = 16       # a matmul block computes MATMUL_TILE x MATMUL_TILE outputs (without the SGEMM template)
MATMUL_OPERAND = "gpu.matmul.operand"  # the tag of such a matmul's operand views (inlined into its shared tiles)
REDUCE_SCRATCH = 1024  # shared bytes a block keeps for its cross-thread reductions' partials
FEW_ROWS = 4           # a matmul of at most this many rows (without the GEMV template): schedule_few_rows
FEW_ROWS_COLS = 32     # its columns per block (a warp: one 128-byte row segment of B per load)


def schedule_graph(st: Stages, tensors: list[Tensor], epilogues: dict[Tensor, Tensor],
                   candidates: dict[Tensor, list[Tensor]], args: Sequence[Tensor], target: CudaTarget,
                   notes: list[str] | None = None) -> Schedule:
    """The schedule of the graph's stages `st` whose results are `tensors`: each template with its epilogue
    (template tensor -> the stage written from its register tile), each row group of `candidates` (head ->
    members) that fits (the row inputs that several of its stages read staged in shared memory where they fit
    too), every other stage by its kind. `args`: the function's placeholders (bound inference of the groups);
    `notes`, if given, receives a line per row group saying what was decided."""
    stageable = {t for t, kind in st.kind.items() if kind != "view"} | set(args)  # never an inlined view
    shared = {h for h, members in candidates.items() if _shared_rows(h, members, target)}
    candidates = {h: members if h in shared else _inlinable(h, members) for h, members in candidates.items()}
    # head -> its inputs to stage in shared memory: each group with them, else without, else stage by stage
    plans: dict[Tensor, list[Tensor]] = {}
    for head, members in candidates.items():
        staged = _fitting(head, members, _row_inputs(head, members, stageable), target)
        if staged is not None:
            plans[head] = staged
    for _ in range(2 * len(plans) + 1):
        s, copies = _schedule(st, tensors, epilogues, {h: candidates[h] for h in plans}, plans, shared, target)
        at_rows = [t for h in plans for t in (*candidates[h], *copies[h]) if s[t].attach_type != "inline"]
        failed = _needed_along_rows(s, args, at_rows)
        if not failed:
            _note_groups(notes, candidates, plans, copies, shared)
            return s
        for head in [h for h in plans if set(candidates[h]) & failed or set(copies.get(h, ())) & failed]:
            if plans[head]:
                plans[head] = []  # without its staged inputs first
            else:
                del plans[head]
    _note_groups(notes, candidates, {}, {})
    return _schedule(st, tensors, epilogues, {}, {}, set(), target)[0]


def _note_groups(notes: list[str] | None, candidates: dict[Tensor, list[Tensor]], plans: dict[Tensor, list],
                 copies: dict[Tensor, list[Tensor]], shared: set[Tensor] = frozenset()) -> None:
    for head, members in candidates.items() if notes is not None else ():
        names = ", ".join(m.op.name for m in members)
        if head in plans:
            staged = [c.op.name for c in copies.get(head, [])]
            notes.append(f"row group: {head.op.name} computes {names} in its block per row"
                         + (f", reading {', '.join(staged)} from shared memory" if staged else "")
                         + ("" if head in shared else ", its row-long members computed again where read (its rows "
                            "do not fit in shared memory, or their length is symbolic)"))
        else:
            notes.append(f"no row group for {head.op.name} ({names}): a member is read along several rows; stage "
                         "by stage")


def _schedule(st: Stages, tensors: list[Tensor], epilogues: dict[Tensor, Tensor],
              groups: dict[Tensor, list[Tensor]], staged: dict[Tensor, list[Tensor]], shared: set[Tensor],
              target: CudaTarget) -> tuple[Schedule, dict[Tensor, list[Tensor]]]:
    """The schedule, and each group head's shared copies of its staged inputs (`shared`: the heads whose
    row-long members are kept in shared memory; the others' are inlined)."""
    s = create_schedule([t.op for t in tensors])
    members = {m for ms in groups.values() for m in ms}
    copies = {}
    for t, kind in st.kind.items():
        if t in st.templates:
            st.templates[t](s, epilogues.get(t))  # its template's schedule, with its config
        elif kind == "view" and t not in tensors:
            s[t].compute_inline()
        elif t in groups:
            copies[t] = schedule_row_group(s[t], [s[m] for m in groups[t]], staged.get(t, []), t in shared)
        elif t.op in s.stage_map and t not in epilogues.values() and t not in members:
            schedule_stage(s[t], kind, target)
    return s, copies


def _row_length(head: Tensor) -> int | None:
    last = head.shape[-1]
    return last if isinstance(last, int) else None


def _row_inputs(head: Tensor, members: list[Tensor], stageable: set[Tensor]) -> list[Tensor]:
    """The row-long tensors that two or more of the group's stages read (a layer norm's input: its mean and its
    centred values): staged in shared memory, they are read from global memory once per row. Nothing for a
    symbolic row length (its size is not known when the kernel's shared memory is laid out)."""
    if _row_length(head) is None:
        return []
    reads: dict[Tensor, int] = {}
    for t in [head, *members]:
        for x in dict.fromkeys(t.op.input_tensors):
            reads[x] = reads.get(x, 0) + 1
    return [x for x, n in reads.items() if n >= 2 and x in stageable and x not in members and _row_long(x, head)
            and x.shape[-1] == head.shape[-1]]


def _fitting(head: Tensor, members: list[Tensor], staged: list[Tensor],
             target: CudaTarget) -> list[Tensor] | None:
    """`staged` if the rows of the row-long members and of the staged inputs fit in a block's shared memory,
    [] if only the members' do or they are inlined (`_shared_rows`), None for no group (empty rows)."""
    n = _row_length(head)
    if not members or n == 0:
        return None
    if not _shared_rows(head, members, target):
        return []
    rows = _shared_bytes(n, head, members)
    return staged if rows + sum(n * x.dtype.itemsize for x in staged) <= target.shared_per_block else []


def _shared_rows(head: Tensor, members: list[Tensor], target: CudaTarget) -> bool:
    """Whether the group keeps its row-long members in shared memory: a constant row length whose rows of them
    all fit (else they are inlined)."""
    n = _row_length(head)
    return n is not None and _shared_bytes(n, head, members) <= target.shared_per_block


def _shared_bytes(n: int, head: Tensor, members: list[Tensor]) -> int:
    """The shared memory a group's block needs for rows of `n`: its row-long members' rows and the scratch of
    its cross-thread reductions."""
    return sum(n * m.dtype.itemsize for m in members if _row_long(m, head)) + REDUCE_SCRATCH


def _inlinable(head: Tensor, members: list[Tensor]) -> list[Tensor]:
    """The members of a group whose row-long members are inlined: all but the row-long reductions (an
    attention's scores, q k^T), which cannot be; they are computed to memory before the group's kernel."""
    return [m for m in members if not (m.op.reduce_axis and _row_long(m, head))]


def _row_long(member: Tensor, head: Tensor) -> bool:
    """A member with a row of its own (not one value per row, shaped as the head's leading dims or with a last
    dim of 1): kept in shared memory, or inlined."""
    last = member.shape[-1] if member.shape else 1
    return len(member.shape) == len(head.shape) and not (isinstance(last, int) and last == 1)


def _group_width(head: Tensor, members: list[Tensor]) -> int | None:
    """The longest loop a row group's threads share: the head's row, a row-long member's, a member's last
    reduce axis (a variance's group whose head is one value per row still sums a whole row); None if symbolic."""
    widths = [head.shape[-1] if head.shape else 1]
    for m in members:
        if m.op.reduce_axis:
            widths.append(m.op.reduce_axis[-1].extent)
        elif _row_long(m, head):
            widths.append(m.shape[-1])
    return None if any(not isinstance(w, int) for w in widths) else max(widths)


def row_threads(n: int) -> int:
    """The threads of a row group's block for rows of `n` elements: a power of two from a warp (32) to
    REDUCE_THREADS.

    >>> row_threads(768), row_threads(128), row_threads(5), row_threads(4096)
    (256, 128, 32, 256)
    """
    return min(REDUCE_THREADS, max(32, _pow2_at_least(n)))


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def schedule_row_group(head: Stage, members: list[Stage], staged: Sequence[Tensor] = (),
                       in_shared: bool = True) -> list[Tensor]:
    """One block per row of `head` (its leading axes fused on blockIdx.x, the row split over threadIdx.x), each
    of `members` computed at the row: row-long ones in shared memory, their row split over the same threads
    (or, not `in_shared`, inlined where they are read); a reduction's last reduce axis over the threads (every
    thread then holds the row's result); a value per row in each thread's registers. Each tensor of `staged`
    is copied to shared memory at the row, once, and the group's stages read the copy (the copies are
    returned)."""
    s = head.schedule
    group = [head, *members]
    copies = [s.cache_read(x, "shared", [st.op for st in group if x in st.input_tensors()]) for x in staged]
    *lead, last = head.op.axis
    width = _group_width(head.op.outputs[0], [m.op.outputs[0] for m in members])
    threads = REDUCE_THREADS if width is None else row_threads(width)
    row = head.fuse(*lead) if len(lead) > 1 else lead[0]
    _, thread = head.split(last, factor=threads)
    head.bind(row, BX)
    head.bind(thread, TX)
    for c in copies:
        copy = s[c]
        copy.compute_at(head, row)
        _, inner = copy.split(copy.op.axis[-1], factor=threads)
        copy.bind(inner, TX)
    for m in members:
        row_long = _row_long(m.op.outputs[0], head.op.outputs[0])
        if row_long and not in_shared:
            m.compute_inline()
            continue
        m.compute_at(head, row)
        if row_long:
            m.set_scope("shared")  # written by every thread of the block, read by others
            _, inner = m.split(m.op.axis[-1], factor=threads)
        elif m.op.reduce_axis:
            _, inner = m.split(m.op.reduce_axis[-1], factor=threads)
        else:
            continue  # one value per row: each thread computes it
        m.bind(inner, TX)
    return copies


def _needed_along_rows(s: Schedule, args: Sequence[Tensor], at_rows: list[Tensor]) -> set[Tensor]:
    """The stages of `at_rows` (groups' members, staged copies) that bound inference says are read along more
    than one of their rows (a transpose, two rows at once): computing them at the row would take too little."""
    if not at_rows:
        return set()
    low = Lowering(s, list(args))
    low.infer()
    return {t for t in at_rows if not one_row([low.loops[s[t]].extent[iv] for iv in s[t].op.axis])}


# ** one stage per kernel **

def schedule_stage(stage: Stage, kind: str, target: CudaTarget) -> None:
    """The GPU schedule of one materialized stage, by its kind."""
    if kind == "matmul":
        return schedule_matmul(stage, target)
    if kind == "reduce" and stage.op.reduce_axis:
        return schedule_reduce(stage)
    schedule_elementwise(stage)


def schedule_elementwise(stage: Stage) -> None:
    """All data axes fused and split over blocks of THREADS threads (a reduction inside runs per thread)."""
    axes = list(stage.op.axis)
    if not axes:
        return  # a 0-d result: one thread
    fused = stage.fuse(*axes) if len(axes) > 1 else axes[0]
    block, thread = stage.split(fused, factor=THREADS)
    stage.bind(block, BX)
    stage.bind(thread, TX)


def schedule_reduce(stage: Stage) -> None:
    """One block per output element; the last reduce axis split over the block's threads (a power of two)."""
    axes = list(stage.op.axis)
    last = stage.op.reduce_axis[-1]
    width = last.extent if isinstance(last.extent, int) else REDUCE_THREADS
    empty = any(isinstance(r.extent, int) and r.extent == 0 for r in stage.op.reduce_axis)  # nothing to sum
    threads = 1 if empty else min(REDUCE_THREADS, _pow2_at_least(width))
    outer, inner = stage.split(last, factor=threads)
    if axes:
        fused = stage.fuse(*axes) if len(axes) > 1 else axes[0]
        stage.bind(fused, BX)
    stage.bind(inner, TX)


def schedule_matmul(stage: Stage, target: CudaTarget) -> None:
    """Tiles of MATMUL_TILE x MATMUL_TILE outputs per block, one per thread; the batch fused on blockIdx.z. A
    product of at most FEW_ROWS rows: `schedule_few_rows`."""
    rows = stage.op.axis[-2].extent
    if isinstance(rows, int) and rows <= FEW_ROWS:
        return schedule_few_rows(stage, target)
    s, t = stage.schedule, stage.outputs[0]
    axes = list(stage.op.axis)
    (k,) = stage.op.reduce_axis
    reads = list(dict.fromkeys(x for x in stage.input_tensors()))
    shared = [s.cache_read(x, "shared", [t]) for x in reads]
    for x in reads:
        if x.op.tag == MATMUL_OPERAND:
            s[x].compute_inline()  # the tile's fill computes the operand
    bi, ti = stage.split(axes[-2], factor=MATMUL_TILE)
    bj, tj = stage.split(axes[-1], factor=MATMUL_TILE)
    ko, ki = stage.split(k, factor=MATMUL_TILE)
    batch = axes[:-2]
    if batch:
        fused = stage.fuse(*batch) if len(batch) > 1 else batch[0]
        stage.reorder(fused, bi, bj, ti, tj, ko, ki)
        stage.bind(fused, BZ)
    else:
        stage.reorder(bi, bj, ti, tj, ko, ki)
    for iv, tag in ((bi, BY), (bj, BX), (ti, TY), (tj, TX)):
        stage.bind(iv, tag)
    for x in shared:
        copy = s[x]
        copy.compute_at(stage, ko)
        *lead, rows, cols = copy.op.axis
        copy.bind(rows, TY)
        copy.bind(cols, TX)


def schedule_few_rows(stage: Stage, target: CudaTarget) -> None:
    """A matmul of few rows (a decode step's attention weights times the value cache, per head; a float64
    one's dense layers): a 16-row tile would leave all but a row of its threads idle. A block takes FEW_ROWS_COLS
    columns of one row of one batch (the batch and row axes fused on blockIdx.y), its threadIdx.y threads split
    the reduction (each sums every ks-th k), and the partial sums meet in a cross-thread reduction. The block's
    row of A is computed once into shared memory where k is constant and the target holds the row (else where
    read: each of its elements once per column); B's view is computed where read (once per row)."""
    s = stage.schedule
    (k,) = stage.op.reduce_axis
    depth = k.extent
    views = [x for x in stage.input_tensors() if x.op.tag == MATMUL_OPERAND]
    a_view = next(iter(read_along(stage.op, k)), None)
    fits = a_view is not None and isinstance(depth, int) and target.holds_row(depth * a_view.dtype.itemsize)
    row = s.cache_read(a_view, "shared", [stage.outputs[0]]) if fits else None
    for x in views:
        s[x].compute_inline()
    *lead, j = stage.op.axis
    n = j.extent
    cols = min(FEW_ROWS_COLS, _pow2_at_least(n)) if isinstance(n, int) else FEW_ROWS_COLS
    ks = THREADS // cols
    if isinstance(depth, int):
        ks = min(ks, _pow2_at_least(max(depth, 1)))
    rows = stage.fuse(*lead) if len(lead) > 1 else lead[0]
    bx, tx = stage.split(j, factor=cols)
    ko, kt = stage.split(k, factor=ks)
    stage.reorder(rows, bx, tx, ko, kt)
    stage.bind(rows, BY)
    stage.bind(bx, BX)
    stage.bind(tx, TX)
    stage.bind(kt, TY)
    if row is not None:  # all the block's threads fill the row, one element each per pass
        copy = s[row]
        copy.compute_at(stage, bx)
        row_k = copy.op.axis[-1]
        _, flat = copy.split(row_k, factor=cols * ks)
        ty, tx = copy.split(flat, factor=cols)
        copy.bind(ty, TY)
        copy.bind(tx, TX)
