"""GPU schedules for NVIDIA GPUs (TVM's topi.cuda style): plain functions that take the output tensors of a
computation and return a Schedule whose loops are bound to blockIdx/threadIdx, ready for
`jitop.build(s, args, target="cuda")`.

- `schedule_injective(outs)`: elementwise / broadcast outputs, every injective producer inlined, the output's
  axes fused and spread over blocks of `threads` threads (with `per_thread` elements per thread for large
  sizes: contiguous, so they load and store as one vector, when the size allows it; else strided, so each
  step of every warp touches consecutive addresses).
- `matmul(A, B)` + `schedule_matmul(C, cfg)`: the classic SGEMM. A block computes a `bm` x `bn` tile of C, each
  of its (bm/tm) x (bn/tn) threads a `tm` x `tn` register tile (cache_write "local", unrolled); the K loop runs
  in steps of `bk` with A and B tiles staged in shared memory (all threads fetch them together, with vector
  loads) and each k step's A column / B row fragments copied to registers. `matmul` reads A through a transposed
  view that the schedule inlines into A's shared tile, so the tile is stored k-major and a thread's `tm` values
  of A at one k are contiguous (vector loads from shared memory, as for B). `schedule_matmul_stage(s, C, cfg)`
  applies the same to a matmul inside a larger schedule (a traced graph's, through the "cuda.matmul" template).
- `conv2d_nchw(X, W, stride, padding, dilation)` + `schedule_conv2d(Y, cfg)`: a convolution as an implicit GEMM
  (rows = output channels, columns = N*P*Q output pixels, reduction = C*R*S) on the SGEMM's loop nest: the filters
  read as a [C*R*S, K] view, the input through an im2col view inlined into its shared tile (padding: taps outside
  the image read 0), the register tiles written straight into Y [N, K, P, Q].
- `softmax(X)`, `layer_norm(X, gamma, beta, eps)` + `schedule_row_reduce(Y)`: row-wise operators over the last
  axis of a 2-D input: one block per row (or a few short rows per block along threadIdx.y), the row split over
  threadIdx.x, each row reduction (max, sum, mean, variance) a cross-thread reduction (warp shuffles) computed
  at the row, the row itself staged once in shared memory when it fits, so the input is read from global
  memory once.

Every schedule is correct for any size (tails are guarded by the lowering); the tiles are chosen for an H100.
This module only schedules: it imports te and schedule, never the compiler (examples use `jitop.lower` /
`jitop.build` to show the result).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from jitop import te
from jitop.errors import ScheduleError
from jitop.schedule.schedule import Schedule, Stage, create_schedule
from jitop.target import CudaTarget
from jitop.te.tensor import ComputeOp, IterVar, PlaceholderOp, Tensor
from jitop.topi.arguments import pair

BLOCK_X, BLOCK_Y = te.thread_axis("blockIdx.x"), te.thread_axis("blockIdx.y")
THREAD_X, THREAD_Y = te.thread_axis("threadIdx.x"), te.thread_axis("threadIdx.y")

TRANSPOSED_A = "cuda.matmul.transposed_a"  # the tag of matmul's transposed view of A (inlined by the schedule)
DEFAULT_TARGET = CudaTarget()              # an H100 (sm_90): SM count and shared memory limits


# ** helpers **

def _as_tensors(outs: Tensor | Sequence[Tensor]) -> list[Tensor]:
    items = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    for t in items:
        if not isinstance(t, Tensor) or not isinstance(t.op, ComputeOp):
            raise TypeError(f"a GPU schedule takes the computed output tensors (te.compute results), got {t!r}")
    return items


def _const_size(shape: Sequence[Any]) -> int | None:
    """The number of elements of `shape`, or None when a dimension is symbolic."""
    if not all(isinstance(d, int) for d in shape):
        return None
    return math.prod(shape)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _compute_stages(s: Schedule) -> list[Stage]:
    return [st for st in s.stages if not st.is_placeholder]


def _is_output(s: Schedule, stage: Stage) -> bool:
    return any(op is stage.op for op in s.outputs)


def inline_injective(s: Schedule) -> list[Stage]:
    """Inline every injective (elementwise, broadcast, transpose) stage that is not an output; the stages left
    at root that are not outputs (reductions) are returned, in producer-first order.

    >>> A = te.placeholder((8, 8), name="A")
    >>> B = te.compute((8, 8), lambda i, j: A[j, i] * 2.0, name="B")
    >>> C = te.compute((8, 8), lambda i, j: B[i, j] + 1.0, name="C")
    >>> s = jitop.create_schedule(C)
    >>> inline_injective(s), s[B].attach_type
    ([], 'inline')
    """
    left = []
    for st in _compute_stages(s):
        if _is_output(s, st) or st.attach_type != "root" or st.scope != "global":
            continue
        if st.reduce_axis:
            left.append(st)
        else:
            st.compute_inline()
    return left


def _fuse_all(stage: Stage, axes: Sequence[IterVar]) -> IterVar:
    return stage.fuse(*axes) if len(axes) > 1 else axes[0]


# ** injective **

def _bind_flat(stage: Stage, threads: int, per_thread: int, total: int | None) -> None:
    """Fuse the stage's data axes and spread them over blocks of `threads` threads, `per_thread` each."""
    axes = list(stage.op.axis)
    if not axes:
        return  # a 0-d output: one thread computes it
    fused = _fuse_all(stage, axes)
    if total is not None:
        threads = min(threads, max(32, -(-total // 32) * 32))  # a tiny output needs no block of 256
        if total < threads * per_thread * 4:
            per_thread = 1
    if per_thread <= 1:
        bx, tx = stage.split(fused, factor=threads)
    elif total is not None and total % per_thread == 0:
        # contiguous per thread: thread t owns [per_thread*t, per_thread*t + per_thread), one vector access; a warp
        # covers 32 x per_thread consecutive elements, so each of its vector loads is still fully coalesced
        bx, rest = stage.split(fused, factor=threads * per_thread)
        tx, v = stage.split(rest, factor=per_thread)
        stage.vectorize(v)
    else:
        # strided: the per-thread loop is outside threadIdx.x (unrolled), each of its steps a coalesced warp access
        bx, rest = stage.split(fused, factor=threads * per_thread)
        p, tx = stage.split(rest, factor=threads)
        stage.unroll(p)
    stage.bind(bx, BLOCK_X)
    stage.bind(tx, THREAD_X)


def schedule_injective(outs: Tensor | Sequence[Tensor], threads: int = 256, per_thread: int | None = None,
                       target: CudaTarget | None = None) -> Schedule:
    """A GPU schedule for elementwise / broadcast outputs: injective producers inlined, each output's axes fused
    and split over blocks of `threads` threads (blockIdx.x, threadIdx.x).

    `per_thread` elements per thread (default: 4 for outputs of at least threads x 4 x SMs x 4 elements, else 1):
    when the size is a multiple of it a thread's elements are contiguous and move as one vector load/store,
    otherwise they are `threads` apart (an unrolled loop around threadIdx.x), so every warp access is coalesced
    either way. Producers that cannot be inlined (reductions) become kernels of their own, one thread per output
    element; give them a schedule of their own (schedule_row_reduce) when they matter.

    >>> A = te.placeholder((1000, 37), name="A")
    >>> b = te.placeholder((37,), name="b")
    >>> E = te.compute((1000, 37), lambda i, j: te.exp(A[i, j]), name="E")
    >>> C = te.compute((1000, 37), lambda i, j: E[i, j] * b[j] + 1.0, name="C")
    >>> s = schedule_injective(C)
    >>> text = str(jitop.lower(s, [A, b, C]))
    >>> "in blockIdx.x(145)" in text and "in threadIdx.x(256)" in text and "E[" not in text
    True
    >>> f = jitop.build(s, [A, b, C], target="cuda -arch=sm_90")
    >>> f.built.kernels[0].grid, f.built.kernels[0].block
    ((145, 1, 1), (256, 1, 1))
    """
    if threads < 1 or threads > 1024:
        raise ValueError(f"schedule_injective: threads={threads}; a block has 1 to 1024 threads")
    target = target or DEFAULT_TARGET
    tensors = _as_tensors(outs)
    s = create_schedule([t.op for t in tensors])
    left = inline_injective(s)
    for st in left:  # reductions feeding the outputs: one thread per output element
        _bind_flat(st, threads, 1, _const_size([iv.extent for iv in st.op.axis]))
    for t in tensors:
        total = _const_size(t.shape)
        pt = per_thread
        if pt is None:
            pt = 4 if total is not None and total >= threads * 4 * target.sm_count * 4 else 1
        _bind_flat(s[t], threads, max(1, pt), total)
    return s


# ** matmul (SGEMM) **

def matmul(A: Tensor, B: Tensor, name: str = "matmul", tc: int | str = 0) -> Tensor:
    """C[i, j] = sum_k A[i, k] * B[k, j] for 2-D A (M x K) and B (K x N) of one float dtype.

    A is read through a transposed view (A.T[k, i], tagged TRANSPOSED_A) that schedule_matmul inlines into the
    shared-memory tile of A; any other schedule can inline it too (`s[C.op.input_tensors[0]].compute_inline()`).
    tc="tf32" or "bf16" computes it on tensor cores instead (float32 of constant sizes; TF32 or BF16 numerics, see
    topi.cuda_mma): the compute of schedule_matmul's tensor-core configs.

    >>> A, B = te.placeholder((64, 32), name="A"), te.placeholder((32, 48), name="B")
    >>> C = matmul(A, B)
    >>> C.shape, C.dtype.name
    ((64, 48), 'float32')
    """
    if len(A.shape) != 2 or len(B.shape) != 2:
        raise ValueError(f"matmul takes 2-D A and B, got shapes {A.shape} and {B.shape}")
    (m, k), (k2, n) = A.shape, B.shape
    if not (k is k2 or (isinstance(k, int) and isinstance(k2, int) and k == k2)):
        raise ValueError(f"matmul: A is {A.shape} and B is {B.shape}; A's columns must equal B's rows")
    if A.dtype is not B.dtype or not A.dtype.is_float:
        raise TypeError(f"matmul takes A and B of one float dtype, got {A.dtype.name} and {B.dtype.name}")
    if tc:
        from jitop.topi import cuda_mma  # it imports this module
        if tc not in cuda_mma.MODES:
            raise ValueError(f"matmul: tc={tc!r}; the tensor-core modes are {list(cuda_mma.TC_MODES)}")
        return cuda_mma.matmul_tc(A, B, name, tc)
    at = te.compute((k, m), lambda kk, i: A[i, kk], name=f"{A.name}.T", tag=TRANSPOSED_A)
    r = te.reduce_axis((0, k), "k")
    return te.compute((m, n), lambda i, j: te.sum(at[r, i] * B[r, j], axis=r), name=name, tag="matmul")


MATMUL_KEYS = ("bm", "bn", "bk", "tm", "tn")
# the "stages" key: 1 (one shared tile of A and of B, two barriers per K step) or 2 (double-buffered:
# Stage.double_buffer, the next K step's loads in flight during this one's arithmetic, one barrier)
STAGES = (1, 2)
SYMBOLIC_BATCH = 8  # the batch a convolution of a symbolic batch takes its default tiles at


def default_matmul_config(m: Any, n: Any, k: Any, target: CudaTarget | None = None) -> dict[str, int]:
    """The default SGEMM tiles for an M x N x K product: 128 x 128 blocks of 8 x 8 thread tiles (256 threads,
    about 127 registers) and bk = 16, with smaller blocks (128 x 64, then 64 x 64 with bk = 8) while the grid
    would leave SMs without a block. Symbolic sizes count as 4096. (On an H100, 2026-11-26: 128x128x16 ran
    39.7 TFLOP/s at 4096 and 38.2 at 2048, against 36.2 and 35.4 for the earlier 128x128x8 and 128x64x8
    defaults; at 1024, 64x64x8 is the default measured.)

    >>> default_matmul_config(4096, 4096, 4096)
    {'bm': 128, 'bn': 128, 'bk': 16, 'tm': 8, 'tn': 8}
    >>> default_matmul_config(1024, 1024, 1024)
    {'bm': 64, 'bn': 64, 'bk': 8, 'tm': 8, 'tn': 8}
    """
    target = target or DEFAULT_TARGET
    mm = m if isinstance(m, int) else 4096
    nn = n if isinstance(n, int) else 4096
    bm, bn = 128, 128
    while -(-mm // bm) * -(-nn // bn) < target.sm_count and bm > 64:
        if bn >= bm and bn > 64:
            bn //= 2
        else:
            bm //= 2
    return {"bm": bm, "bn": bn, "bk": 16 if bm == 128 else 8, "tm": 8, "tn": 8}


def _check_matmul_config(cfg: dict[str, Any], target: CudaTarget) -> tuple[int, int, int, int, int]:
    unknown = set(cfg) - set(MATMUL_KEYS) - {"tc", "stages"}
    if unknown:
        raise ValueError(f"schedule_matmul: unknown config keys {sorted(unknown)}; the keys are {list(MATMUL_KEYS)}, "
                         "stages (shared tile copies) and tc (tensor cores)")
    bm, bn, bk, tm, tn = (int(cfg[x]) for x in MATMUL_KEYS)
    stages = cfg.get("stages", 1)
    problems = [] if stages in STAGES else [f"stages={stages!r}; expected one of {STAGES}"]
    if bm % tm or bn % tn:
        problems.append(f"bm={bm} and bn={bn} must be multiples of tm={tm} and tn={tn}")
    if bk % 4 or bn % 4:
        problems.append(f"bk={bk} and bn={bn} must be multiples of 4 (the shared tiles are fetched as 4-vectors)")
    threads = (bm // max(tm, 1)) * (bn // max(tn, 1))
    if not 1 <= threads <= target.max_threads_per_block:
        problems.append(f"(bm/tm) x (bn/tn) = {threads} threads per block, but a block has 1 to "
                        f"{target.max_threads_per_block}")
    shared = (bm + bn) * bk * 4 * (stages if stages in STAGES else 1)
    if shared > target.shared_per_block:
        problems.append(f"the shared tiles take {shared} bytes, more than the {target.shared_per_block} of a block")
    if tm * tn > 128:
        problems.append(f"a {tm} x {tn} register tile does not fit in a thread's registers")
    if cfg.get("tc", 0):
        from jitop.topi.cuda_mma import tc_problems  # it imports this module
        problems += tc_problems(cfg, target)
    if problems:
        raise ValueError(f"schedule_matmul config {cfg}: " + "; ".join(problems))
    return bm, bn, bk, tm, tn


def _cooperative_fetch(s: Schedule, stage: Stage, rows: IterVar, cols: IterVar, ty_extent: int, tx_extent: int,
                       vec: int) -> None:
    """All threads of the (ty_extent x tx_extent) block copy a shared tile together: `cols` is the axis contiguous in
    global memory; it is split into `vec`-vectors, the vectors are numbered row-major and dealt out to the threads
    (consecutive threads take consecutive vectors: coalesced loads)."""
    stage.reorder(rows, cols)
    co, v = stage.split(cols, factor=vec)
    fused = stage.fuse(rows, co)
    rest, t = stage.split(fused, factor=ty_extent * tx_extent)
    ty, tx = stage.split(t, factor=tx_extent)
    stage.reorder(rest, ty, tx, v)
    stage.bind(ty, THREAD_Y)
    stage.bind(tx, THREAD_X)
    stage.unroll(rest)
    stage.vectorize(v)


def schedule_matmul(C: Tensor, cfg: dict[str, int] | None = None, target: CudaTarget | None = None) -> Schedule:
    """The SGEMM schedule of a matmul C (made by `matmul`, or any `te.sum(A[i, k] * B[k, j])` over 2-D inputs).

    cfg keys (without a cfg: the tuned config of this float32 workload on `target` where one was tuned or
    applied, `topi.cuda_templates.tuned_cfg`; else, and for keys a cfg leaves out, `default_matmul_config`):
    bm, bn (the block's tile of C, blockIdx.y/x), tm, tn (each thread's register tile; (bm/tm) x (bn/tn)
    threads along threadIdx.y/x), bk (the K step of the shared tiles), stages (1; 2 double-buffers the shared
    tiles: the next K step's loads are in flight during this one's arithmetic), tc (0; "tf32" / "bf16" for a C made by
    `matmul(A, B, tc="tf32")` / tc="bf16", which runs the same block tiles and threads as warps of mma.sync tiles:
    topi.cuda_mma; its tuned configs are those of the workload of that precision). The compute decides the engine.
    A block loads a bk x bm tile of A and a bk x bn tile of B into shared memory, every thread fetching 4-vectors
    of them, then each of the bk steps copies the thread's tm values of A and tn values of B to registers and
    does tm x tn multiply-adds into its accumulators. Sizes that are not multiples of the tiles are guarded.

    >>> A, B = te.placeholder((1000, 77), name="A"), te.placeholder((77, 999), name="B")
    >>> C = matmul(A, B)
    >>> s = schedule_matmul(C, {"bm": 64, "bn": 64, "bk": 8, "tm": 4, "tn": 4})
    >>> text = str(jitop.lower(s, [A, B, C]))
    >>> "A.T.shared = allocate(float32[8, 64], 'shared')" in text, "< 1000" in text, "< 999" in text
    (True, True, True)
    >>> f = jitop.build(s, [A, B, C], target="cuda -arch=sm_90")
    >>> f.built.kernels[0].grid, f.built.kernels[0].block, f.built.kernels[0].shared_bytes
    ((16, 16, 1), (16, 16, 1), 4096)
    """
    (C,) = _as_tensors(C)
    s = create_schedule(C)
    schedule_matmul_stage(s, C, cfg, target)
    inline_injective(s)  # A's and B's injective producers are computed in the shared tiles' fill
    return s


def matmul_config(m: Any, n: Any, k: Any, dtype: str = "float32", target: CudaTarget | None = None,
                  cfg: dict[str, int] | None = None, precision: str = "float32") -> dict[str, int]:
    """The full config schedule_matmul uses for an M x N x K product: `cfg`'s keys (without a cfg: the tuned
    config of a float32 workload of constant sizes on `target`, `topi.cuda_templates.tuned_cfg`, where one
    answers; `precision` "tf32" / "bf16": of the workload allowing that tensor-core mode) over
    `default_matmul_config`.

    >>> matmul_config(1024, 1024, 1024, cfg={"bk": 16})
    {'bm': 64, 'bn': 64, 'bk': 16, 'tm': 8, 'tn': 8}
    """
    target = target or DEFAULT_TARGET
    if cfg is None and dtype == "float32" and all(isinstance(d, int) for d in (m, n, k)):
        from jitop.topi.cuda_templates import CudaMatmulWorkload, tuned_cfg  # it imports this module
        cfg = tuned_cfg("cuda.matmul", CudaMatmulWorkload(m, n, k, precision), target)
    return {**default_matmul_config(m, n, k, target), **(cfg or {})}


def schedule_matmul_stage(s: Schedule, C: Tensor, cfg: dict[str, int] | None = None,
                          target: CudaTarget | None = None, epilogue: Tensor | None = None) -> None:
    """schedule_matmul's SGEMM applied to the matmul C inside an existing schedule `s`, which may hold other
    stages (a traced graph's): C's register tiles, shared tiles and K loop, `matmul`'s transposed view of A
    inlined. Nothing else is inlined: the caller inlines the producers of A and B that the shared tiles' fill
    should compute (`s[X].compute_inline()`), as schedule_matmul inlines every injective one. `epilogue`: an
    elementwise stage of C's shape that reads C at its own index (bias, activation), computed from the register
    tile and written instead of C (C is inlined into it).

    >>> A, B = te.placeholder((100, 30), name="A"), te.placeholder((30, 50), name="B")
    >>> C = matmul(A, B)
    >>> D = te.compute((100, 50), lambda i, j: C[i, j] + 1.0, name="D")
    >>> s = jitop.create_schedule([C.op, D.op])
    >>> schedule_matmul_stage(s, C, {"bm": 32, "bn": 32, "bk": 8, "tm": 4, "tn": 4})
    >>> [st.name for st in s.stages if st.scope == "shared"]
    ['A.T.shared', 'B.shared']
    """
    op = C.op
    target = target or DEFAULT_TARGET
    m, n = C.shape
    from jitop.topi import cuda_mma  # it imports this module
    if cuda_mma.is_matmul_tc(C):
        mode = cuda_mma.tc_mode(C)
        full = {**matmul_config(m, n, C.op.attrs["k"], "float32", target, cfg, precision=mode), "tc": mode}
        cuda_mma.schedule_matmul_tc_stage(s, C, _check_matmul_config(full, target), full.get("stages", 1))
        return
    if cfg is not None and cfg.get("tc", 0):
        raise ValueError(f"schedule_matmul: cfg {cfg} asks for tensor cores (tc={cfg['tc']!r}), but '{op.name}' "
                         f"is a float32 matmul; make it with topi.cuda.matmul(A, B, tc={cfg['tc']!r})")
    if len(op.axis) != 2 or len(op.reduce_axis) != 1 or len(op.input_tensors) != 2:
        raise ValueError(f"schedule_matmul: '{op.name}' is not a 2-D matmul C[i, j] = sum_k A[i, k] * B[k, j]")
    full = matmul_config(m, n, op.reduce_axis[0].extent, C.dtype.name, target, cfg)
    tiles = _check_matmul_config({**full, "tc": 0}, target)
    a_in, b_in = op.input_tensors
    transposed = isinstance(a_in.op, ComputeOp) and a_in.op.tag == TRANSPOSED_A
    CL = s.cache_write(C, "local")
    AA = s.cache_read(a_in, "shared", [CL])
    BB = s.cache_read(b_in, "shared", [CL])
    if transposed:
        s[a_in].compute_inline()  # A.T's shared tile reads A itself: [bk, bm], k-major
    out = _written_stage(s, C, epilogue, stacked=True)
    *rows, j = out.op.axis
    i = out.fuse(*rows) if len(rows) > 1 else rows[0]  # an epilogue of C's rows stacked: [batch..., m, n]
    _schedule_gemm(s, out, i, j, CL, AA, BB, transposed, tiles, b_vec=4, out_vec=True, stages=full.get("stages", 1))


def _same_dims(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two shapes are the same: equal ints, symbolic dims of one expression, in order ((2, n) and (2, n)
    are; (2 * n,) and (n * 2,) may not be, which only costs a schedule choice).

    >>> n = te.size_var("n")
    >>> _same_dims((2, n * 3), (2, n * 3)), _same_dims((2, n), (2, 5)), _same_dims((4,), (4, 1))
    (True, False, False)
    """
    def same(x: Any, y: Any) -> bool:
        if isinstance(x, int) or isinstance(y, int):
            return isinstance(x, int) and isinstance(y, int) and x == y
        return x is y or x.key == y.key  # one expression built twice: the same content hash
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def _written_stage(s: Schedule, result: Tensor, epilogue: Tensor | None, stacked: bool = False) -> Stage:
    """The stage that writes a GEMM's register tile: its result's, or an elementwise epilogue's of the same
    shape with the result inlined into it. With `stacked`, the epilogue may also have the shape of a 2-D
    result's rows unstacked ([batch..., m, n] for [batch * m, n]: a batched A's rows times B), reading the
    result at its own flat row; its leading axes are then fused into the GEMM's row axis."""
    if epilogue is None:
        return s[result]
    shape, want = tuple(epilogue.shape), tuple(result.shape)
    unstacked = stacked and len(shape) > 2 and _same_dims((math.prod(shape[:-1]), shape[-1]), want)
    if not _same_dims(shape, want) and not unstacked:
        raise ValueError(f"epilogue '{epilogue.op.name}' has shape {epilogue.shape}, not {result.op.name}'s "
                         f"{result.shape}: an epilogue is computed from the register tile, element by element")
    s[result].compute_inline()
    return s[epilogue]



def _schedule_gemm(s: Schedule, out: Stage, i: IterVar, j: IterVar, CL: Tensor, AA: Tensor, BB: Tensor,
                   a_k_major: bool, tiles: tuple[int, int, int, int, int], b_vec: int, out_vec: bool,
                   stages: int = 1) -> None:
    """The SGEMM loop nest shared by schedule_matmul and schedule_conv2d. `out` is the stage that writes the
    result from the registers, its GEMM row axis `i` and column axis `j` (data axes or fused ones); `CL` the
    local cache of the reduction (`s.cache_write`), `AA` / `BB` its shared copies of A ([bk, bm] when `a_k_major`,
    else [bm, bk]) and B ([bk, bn]). B's tile is fetched in `b_vec`-vectors of its columns; `out_vec` vectorizes
    each thread's row of tn results (when consecutive columns are consecutive in memory); `stages` = 2
    double-buffers the shared tiles."""
    bm, bn, bk, tm, tn = tiles
    nty, ntx = bm // tm, bn // tn
    AL = s.cache_read(AA, "local", [CL])
    BL = s.cache_read(BB, "local", [CL])

    # the output: blocks of bm x bn, threads of tm x tn, each thread writing its tile from registers
    by, yi = out.split(i, factor=bm)
    bx, xi = out.split(j, factor=bn)
    ty, yi = out.split(yi, factor=tm)
    tx, xi = out.split(xi, factor=tn)
    out.reorder(by, bx, ty, tx, yi, xi)
    out.bind(by, BLOCK_Y)
    out.bind(bx, BLOCK_X)
    out.bind(ty, THREAD_Y)
    out.bind(tx, THREAD_X)
    out.unroll(yi)
    if out_vec:
        out.vectorize(xi)
    else:
        out.unroll(xi)

    # the accumulators: tm x tn registers per thread, the K loop in bk steps
    s[CL].compute_at(out, tx)
    yc, xc = s[CL].op.axis
    (kc,) = s[CL].op.reduce_axis
    ko, ki = s[CL].split(kc, factor=bk)
    s[CL].reorder(ko, ki, yc, xc)
    s[CL].unroll(ki)
    s[CL].unroll(yc)
    s[CL].unroll(xc)

    # shared tiles, fetched by all threads at each K step
    s[AA].compute_at(s[CL], ko)
    s[BB].compute_at(s[CL], ko)
    a0, a1 = s[AA].op.axis
    if a_k_major:       # AA[k, i] = A[i, k]: k is contiguous in global memory
        _cooperative_fetch(s, s[AA], a1, a0, nty, ntx, 4 if bk % 4 == 0 else 1)
    else:               # AA[i, k]
        _cooperative_fetch(s, s[AA], a0, a1, nty, ntx, 4 if bk % 4 == 0 else 1)
    b0, b1 = s[BB].op.axis
    _cooperative_fetch(s, s[BB], b0, b1, nty, ntx, b_vec)
    if stages == 2:
        s[AA].double_buffer()
        s[BB].double_buffer()

    # register fragments of each k step
    s[AL].compute_at(s[CL], ki)
    s[BL].compute_at(s[CL], ki)
    for X in (AL, BL):
        for ax in s[X].op.axis:
            s[X].unroll(ax)


# ** conv2d (implicit GEMM) **

IM2COL = "cuda.conv2d.im2col"          # the tag of conv2d_nchw's im2col view of X (inlined into its shared tile)
CONV_GEMM = "cuda.conv2d.gemm"         # the tag of conv2d_nchw's GEMM stage (K x N*P*Q, reduced over C*R*S)


def conv2d_nchw(X: Tensor, W: Tensor, stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                dilation: int | Sequence[int] = 1, name: str = "conv2d") -> Tensor:
    """A 2-D convolution (cross-correlation, as torch's conv2d) of X [N, C, H, W] with filters W [K, C, R, S]:
    Y [N, K, P, Q] with P = (H + 2 pad - dil (R - 1) - 1) // stride + 1 (Q alike), groups = 1, no bias.

    It is written as an implicit GEMM for `schedule_conv2d`: a stage (tag CONV_GEMM) of shape [K, N*P*Q] reducing
    over C*R*S, G[k, npq] = sum_crs W.T[crs, k] * X.col[crs, npq], where W.T (tag TRANSPOSED_A) is W read as a
    [C*R*S, K] matrix and X.col (tag IM2COL) is the im2col view of X, the padding a guarded select (taps outside
    the image read 0); both views are meant to be inlined, never stored. Y[n, k, p, q] = G[k, (n P + p) Q + q].

    >>> X, W = te.placeholder((1, 3, 32, 32), name="X"), te.placeholder((16, 3, 3, 3), name="W")
    >>> Y = conv2d_nchw(X, W, stride=2, padding=1)
    >>> Y.shape, Y.op.input_tensors[0].shape, Y.op.input_tensors[0].op.tag
    ((1, 16, 16, 16), (16, 256), 'cuda.conv2d.gemm')
    """
    if len(X.shape) != 4 or len(W.shape) != 4:
        raise ValueError(f"conv2d_nchw takes X [N, C, H, W] and W [K, C, R, S], got shapes {X.shape} and {W.shape}")
    if not all(isinstance(d, int) for d in (*X.shape[1:], *W.shape)):
        raise ValueError("conv2d_nchw: the shapes of X and W must be constant (X's batch may be symbolic)")
    if X.dtype is not W.dtype or not X.dtype.is_float:
        raise TypeError(f"conv2d_nchw takes X and W of one float dtype, got {X.dtype.name} and {W.dtype.name}")
    n, c, h, w = X.shape
    k, c2, r, s = W.shape
    if c2 != c:
        raise ValueError(f"conv2d_nchw: X has {c} channels but W {W.shape} expects {c2} (groups=1 only)")
    sh, sw = pair(stride, "stride", "conv2d_nchw", minimum=1)
    ph, pw = pair(padding, "padding", "conv2d_nchw")
    dh, dw = pair(dilation, "dilation", "conv2d_nchw", minimum=1)
    p = (h + 2 * ph - dh * (r - 1) - 1) // sh + 1
    q = (w + 2 * pw - dw * (s - 1) - 1) // sw + 1
    if p < 1 or q < 1:
        raise ValueError(f"conv2d_nchw: a {r}x{s} filter (dilation {dilation}) does not fit the padded "
                         f"{h}x{w} image")
    rs, pq, crs, npq = r * s, p * q, c * r * s, n * p * q
    dt = X.dtype

    wt = te.compute((crs, k), lambda t, kk: W[kk, t // rs, t // s % r, t % s], name=f"{W.name}.T", tag=TRANSPOSED_A)

    def col(t: Any, j: Any) -> Any:
        cc, rr, ss = t // rs, t // s % r, t % s
        nn, pp, qq = j // pq, j // q % p, j % q
        hh, ww = pp * sh + rr * dh - ph, qq * sw + ss * dw - pw
        if ph == 0 and pw == 0:  # every tap is inside the image
            return X[nn, cc, hh, ww]
        inside = (hh >= 0) & (hh < h) & (ww >= 0) & (ww < w)
        return te.if_then_else(inside, X[nn, cc, hh, ww], te.const(0.0, dt))

    xcol = te.compute((crs, npq), col, name=f"{X.name}.col", tag=IM2COL)
    red = te.reduce_axis((0, crs), "crs")
    g = te.compute((k, npq), lambda kk, j: te.sum(wt[red, kk] * xcol[red, j], axis=red), name=f"{name}.gemm",
                   tag=CONV_GEMM)
    workload = dict(n=n, c=c, h=h, w=w, k=k, r=r, s=s, stride=(sh, sw), padding=(ph, pw), dilation=(dh, dw))
    return te.compute((n, k, p, q), lambda nn, kk, pp, qq: g[kk, nn * pq + pp * q + qq], name=name,
                      tag="conv2d_nchw", attrs={"workload": workload})


def default_conv2d_config(k: int, npq: int, crs: int, target: CudaTarget | None = None) -> dict[str, int]:
    """The default implicit-GEMM tiles for K output channels, N*P*Q pixels and a C*R*S reduction: the largest of
    128x128 / 128x64 / 64x128 (8x8 per thread), 64x64, 32x64, 32x32 (4x4 per thread) whose grid has a block for
    every SM (else the smallest), skipping row tiles of more than K (rounded up to a power of two); bk = 16
    (8 below 64x64 tiles, and while C*R*S < 16).

    >>> default_conv2d_config(64, 8 * 56 * 56, 576)
    {'bm': 64, 'bn': 128, 'bk': 16, 'tm': 8, 'tn': 8}
    >>> default_conv2d_config(256, 32 * 56 * 56, 64)
    {'bm': 128, 'bn': 128, 'bk': 16, 'tm': 8, 'tn': 8}
    >>> default_conv2d_config(512, 8 * 7 * 7, 4608)
    {'bm': 32, 'bn': 32, 'bk': 8, 'tm': 4, 'tn': 4}
    """
    target = target or DEFAULT_TARGET
    candidates = [(128, 128, 8, 8), (128, 64, 8, 8), (64, 128, 8, 8), (64, 64, 4, 4), (32, 64, 4, 4),
                  (32, 32, 4, 4)]
    rows_max = max(32, _pow2_at_least(k))
    fitting = [cd for cd in candidates if cd[0] <= rows_max]
    pick = fitting[-1]
    for cd in fitting:
        if -(-k // cd[0]) * -(-npq // cd[1]) >= target.sm_count:
            pick = cd
            break
    bm, bn, tm, tn = pick
    bk = 16 if bm * bn >= 64 * 64 and crs >= 16 else 8
    return {"bm": bm, "bn": bn, "bk": bk, "tm": tm, "tn": tn}


def schedule_conv2d(Y: Tensor, cfg: dict[str, int] | None = None, target: CudaTarget | None = None) -> Schedule:
    """The implicit-GEMM schedule of a `conv2d_nchw` output: schedule_matmul's SGEMM with GEMM rows = the K
    output channels (blockIdx.y), columns = the N*P*Q output pixels (blockIdx.x) and reduction = C*R*S.

    cfg keys as schedule_matmul's (without a cfg: the tuned config of this float32 convolution on `target`, as
    for schedule_matmul; else `default_conv2d_config`). Each K step stages a bk x bm tile of the
    filters (W.T inlined: contiguous along C*R*S, 4-vector fetches) and a bk x bn tile of the im2col matrix
    (X.col inlined into the fill: every thread computes its taps' (n, c, h, w), out-of-image taps read 0; scalar
    fetches, consecutive threads taking consecutive output pixels) in shared memory; each thread accumulates a
    tm x tn register tile and writes it straight into Y [N, K, P, Q] (the column index split into n, p, q).

    >>> X, W = te.placeholder((2, 64, 14, 14), name="X"), te.placeholder((128, 64, 3, 3), name="W")
    >>> Y = conv2d_nchw(X, W, padding=1)
    >>> s = schedule_conv2d(Y, {"bm": 64, "bn": 64, "bk": 16, "tm": 4, "tn": 4})
    >>> text = str(jitop.lower(s, [X, W, Y]))
    >>> "X.col.shared = allocate(float32[16, 64], 'shared')" in text
    True
    >>> "W.T.shared = allocate(float32[16, 64], 'shared')" in text
    True
    >>> f = jitop.build(s, [X, W, Y], target="cuda -arch=sm_90")
    >>> f.built.kernels[0].grid, f.built.kernels[0].block, f.built.kernels[0].shared_bytes
    ((7, 2, 1), (16, 16, 1), 8192)
    """
    (Y,) = _as_tensors(Y)
    s = create_schedule(Y)
    schedule_conv2d_stage(s, Y, cfg, target)
    inline_injective(s)
    return s


def schedule_conv2d_stage(s: Schedule, Y: Tensor, cfg: dict[str, int] | None = None,
                          target: CudaTarget | None = None, epilogue: Tensor | None = None) -> None:
    """schedule_conv2d's implicit GEMM applied to the conv2d_nchw output Y inside an existing schedule `s`,
    which may hold other stages (a traced graph's): Y's register tiles, shared tiles and K loop, with the GEMM
    stage, W.T and X.col inlined. Nothing else is inlined: the caller inlines the producers of X and W that the
    shared tiles' fill should compute, as schedule_conv2d inlines every injective one. `epilogue`: an
    elementwise stage of Y's shape reading Y at its own index (bias, ReLU, a residual), written instead of Y.

    >>> X, W = te.placeholder((1, 8, 9, 9), name="X"), te.placeholder((16, 8, 3, 3), name="W")
    >>> Y = conv2d_nchw(X, W, padding=1)
    >>> Z = te.compute(Y.shape, lambda *i: Y[i] * 2.0, name="Z")
    >>> s = jitop.create_schedule([Y.op, Z.op])
    >>> schedule_conv2d_stage(s, Y, {"bm": 16, "bn": 32, "bk": 8, "tm": 2, "tn": 4})
    >>> [st.name for st in s.stages if st.scope == "shared"]
    ['W.T.shared', 'X.col.shared']
    """
    if Y.op.tag != "conv2d_nchw" or len(Y.op.input_tensors) != 1:
        raise ValueError(f"schedule_conv2d: '{Y.op.name}' is not a conv2d_nchw output")
    (g,) = Y.op.input_tensors
    gop = g.op
    if not isinstance(gop, ComputeOp) or gop.tag != CONV_GEMM or len(gop.input_tensors) != 2:
        raise ValueError(f"schedule_conv2d: '{Y.op.name}' does not read a conv2d_nchw GEMM stage")
    target = target or DEFAULT_TARGET
    k = g.shape[0]
    crs = gop.reduce_axis[0].extent
    batch = Y.shape[0] if isinstance(Y.shape[0], int) else SYMBOLIC_BATCH  # a symbolic one's tiles: at this batch
    if cfg is None and Y.dtype.name == "float32" and "workload" in Y.op.attrs:
        from jitop.topi.cuda_templates import CudaConv2dWorkload, tuned_cfg  # it imports this module
        cfg = tuned_cfg("cuda.conv2d", CudaConv2dWorkload(**{**Y.op.attrs["workload"], "n": batch}), target)
    cfg = {**default_conv2d_config(k, batch * math.prod(Y.shape[2:]), crs, target), **(cfg or {})}
    if cfg.get("tc", 0):
        raise ValueError(f"schedule_conv2d: tc={cfg['tc']!r}; the implicit GEMM has no tensor-core schedule (tc=0)")
    tiles = _check_matmul_config(cfg, target)

    wt, xcol = gop.input_tensors
    CL = s.cache_write(g, "local")        # g becomes a copy of the accumulators, inlined into Y below
    AA = s.cache_read(wt, "shared", [CL])
    BB = s.cache_read(xcol, "shared", [CL])
    s[wt].compute_inline()                # W.T's tile reads W: [bk, bm], k-major
    s[xcol].compute_inline()              # the im2col tile reads X (zero padding computed in the fill)
    s[g].compute_inline()                 # Y reads the accumulators directly
    out = _written_stage(s, Y, epilogue)
    nn, kk, pp, qq = out.op.axis
    out.reorder(kk, nn, pp, qq)
    cols = out.fuse(nn, pp, qq)           # the GEMM column: (n P + p) Q + q
    _schedule_gemm(s, out, kk, cols, CL, AA, BB, True, tiles, b_vec=1, out_vec=False, stages=cfg.get("stages", 1))


# ** row-wise operators: softmax, layer norm **

def _check_rows(X: Tensor, what: str) -> None:
    if len(X.shape) != 2:
        raise ValueError(f"{what} works over the last axis of a 2-D input, got shape {X.shape}")
    if not X.dtype.is_float:
        raise TypeError(f"{what} takes a float input, got {X.dtype.name}")


def softmax(X: Tensor, name: str = "softmax") -> Tensor:
    """softmax over the last axis of a 2-D X: exp(X - max) / sum(exp(X - max)), row by row.

    >>> X = te.placeholder((4, 10), name="X")
    >>> Y = softmax(X)
    >>> Y.shape, [t.op.name for t in Y.op.input_tensors]
    ((4, 10), ['softmax.exp', 'softmax.sum'])
    """
    _check_rows(X, "softmax")
    m, n = X.shape
    k1 = te.reduce_axis((0, n), "k")
    mx = te.compute((m,), lambda i: te.max(X[i, k1], axis=k1), name=f"{name}.max")
    e = te.compute((m, n), lambda i, j: te.exp(X[i, j] - mx[i]), name=f"{name}.exp")
    k2 = te.reduce_axis((0, n), "k")
    total = te.compute((m,), lambda i: te.sum(e[i, k2], axis=k2), name=f"{name}.sum")
    return te.compute((m, n), lambda i, j: e[i, j] / total[i], name=name, tag="softmax")


def layer_norm(X: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5, name: str = "layer_norm") -> Tensor:
    """Layer normalisation over the last axis of a 2-D X: (X - mean) / sqrt(var + eps) * gamma + beta, with the
    mean and the (biased) variance of each row; gamma and beta have X's row length. Two passes over the row
    (mean, then the centred variance), as numpy computes it.

    >>> X, g, b = te.placeholder((4, 10), name="X"), te.placeholder((10,), name="g"), te.placeholder((10,), name="b")
    >>> layer_norm(X, g, b).shape
    (4, 10)
    """
    _check_rows(X, "layer_norm")
    m, n = X.shape
    if len(gamma.shape) != 1 or len(beta.shape) != 1:
        raise ValueError(f"layer_norm: gamma and beta are 1-D (the row length {n}), got {gamma.shape}, {beta.shape}")
    dt = X.dtype
    inv_n = 1.0 / n if isinstance(n, int) else None
    scale = (lambda v: v * te.const(inv_n, dt)) if inv_n is not None else (lambda v: v / te.cast(n, dt))
    k1 = te.reduce_axis((0, n), "k")
    total = te.compute((m,), lambda i: te.sum(X[i, k1], axis=k1), name=f"{name}.sum")
    mean = te.compute((m,), lambda i: scale(total[i]), name=f"{name}.mean")
    k2 = te.reduce_axis((0, n), "k")
    sq = te.compute((m,), lambda i: te.sum((X[i, k2] - mean[i]) * (X[i, k2] - mean[i]), axis=k2),
                    name=f"{name}.sqdev")
    rstd = te.compute((m,), lambda i: te.rsqrt(scale(sq[i]) + te.const(eps, dt)), name=f"{name}.rstd")
    return te.compute((m, n), lambda i, j: (X[i, j] - mean[i]) * rstd[i] * gamma[j] + beta[j], name=name,
                      tag="layer_norm")


def default_row_threads(n: Any, vec: int = 4) -> int:
    """Threads along a row of n elements: a power of two giving each thread about 4 vectors of `vec`, from 32
    (a warp) to 512 (symbolic n: 256).

    >>> default_row_threads(4096), default_row_threads(1000), default_row_threads(17), default_row_threads(1 << 20)
    (256, 64, 32, 512)
    """
    if not isinstance(n, int):
        return 256
    return min(512, max(32, _pow2_at_least(-(-n // (4 * vec)))))


def schedule_row_reduce(outs: Tensor | Sequence[Tensor], threads: int | None = None, rows: int | None = None,
                        vec: int | None = None, cache_row: bool | None = None,
                        target: CudaTarget | None = None) -> Schedule:
    """The GPU schedule of row-wise operators over the last axis of 2-D inputs (softmax, layer_norm, or any output
    Y[i, j] built from row reductions R[i] of its inputs and injective steps).

    A block takes `rows` rows (threadIdx.y; default: 1, more for rows shorter than 256 threads' worth), its
    `threads` threads (threadIdx.x, a power of two; default `default_row_threads`) stride over a row with `vec`
    contiguous elements each (default 4 when the row length is a multiple of 4, else 1). Every row reduction is
    computed at the row: each thread accumulates its share, then the threads combine theirs (warp shuffles, and
    shared memory across warps), so every thread holds the row's result for the next stage. Injective steps
    are inlined. With `cache_row` (default: when the block's rows fit in shared memory) the 2-D inputs of the
    reductions are copied to shared memory once per block, so global memory is read once and written once.

    >>> X = te.placeholder((1000, 4096), name="X")
    >>> Y = softmax(X)
    >>> text = str(jitop.lower(schedule_row_reduce(Y), [X, Y]))
    >>> "in blockIdx.x(1000)" in text, "thread_reduce(max" in text, "thread_reduce(sum" in text
    (True, True, True)
    >>> "X.shared = allocate(float32[1, 4096], 'shared')" in text
    True
    >>> f = jitop.build(schedule_row_reduce(Y), [X, Y], target="cuda -arch=sm_90")
    >>> f.built.kernels[0].grid, f.built.kernels[0].block
    ((1000, 1, 1), (256, 1, 1))
    """
    target = target or DEFAULT_TARGET
    tensors = _as_tensors(outs)
    shapes = {tuple(map(_shape_key, t.shape)) for t in tensors}
    if len(shapes) != 1 or len(tensors[0].shape) != 2:
        raise ValueError("schedule_row_reduce: the outputs must be 2-D and of one shape (rows x row length)")
    m, n = tensors[0].shape
    if vec is None:
        vec = 4 if isinstance(n, int) and n % 4 == 0 else 1
    if threads is None:
        threads = default_row_threads(n, vec)
    if threads & (threads - 1) or not 1 <= threads <= 1024:
        raise ValueError(f"schedule_row_reduce: threads={threads}; the threads of a cross-thread reduction are a "
                         "power of two up to 1024")
    if rows is None:
        rows = 1
        if isinstance(n, int):
            while threads * rows < 256 and rows * n < 16384 and (not isinstance(m, int) or rows * 2 <= m):
                rows *= 2
    if rows < 1 or threads * rows > target.max_threads_per_block:
        raise ValueError(f"schedule_row_reduce: {threads} threads x {rows} rows is not a block (at most "
                         f"{target.max_threads_per_block} threads)")

    s = create_schedule([t.op for t in tensors])
    reductions = [st for st in _compute_stages(s) if st.reduce_axis and not _is_output(s, st)]
    for st in reductions:
        if len(st.op.axis) != 1 or len(st.op.reduce_axis) != 1:
            raise ScheduleError(f"schedule_row_reduce: '{st.name}' is not a reduction of a row (R[i] over one axis)")

    # the row inputs, staged in shared memory: what the reductions read (2-D inputs of the rows' shape)
    row_inputs: list[Tensor] = []
    for st in _compute_stages(s):
        for t in st.input_tensors():
            if isinstance(t.op, PlaceholderOp) and len(t.shape) == 2 and t not in row_inputs \
                    and tuple(map(_shape_key, t.shape)) == tuple(map(_shape_key, (m, n))):
                row_inputs.append(t)
    fits = isinstance(n, int) and rows * n * sum(t.dtype.itemsize for t in row_inputs) \
        + 2 * 1024 <= target.shared_per_block
    if cache_row is None:
        cache_row = fits and bool(reductions)
    if cache_row and not fits:
        raise ValueError(f"schedule_row_reduce: {rows} row(s) of {n} elements of {[t.name for t in row_inputs]} do "
                         f"not fit in {target.shared_per_block} bytes of shared memory; cache_row=False")
    shared = []
    if cache_row:
        for t in row_inputs:
            readers = [st.op for st in _compute_stages(s) if t in st.input_tensors()]
            shared.append(s.cache_read(t, "shared", readers))
    inline_injective(s)

    # the output(s): a block per `rows` rows, the row split into [outer, threadIdx.x, vec]
    for t in tensors:
        st = s[t]
        i, j = st.op.axis
        bi, ri = st.split(i, factor=rows)
        jo, jt, jv = _row_split(st, j, threads, vec)
        st.reorder(bi, ri, jo, jt, jv)
        st.bind(bi, BLOCK_X)
        st.bind(ri, THREAD_Y)
        st.bind(jt, THREAD_X)
        _unroll_if_small(st, jo, n, threads * vec)
        if vec > 1:
            st.vectorize(jv)
    main = s[tensors[0]]
    bi_main, ri_main = main.leaf_iter_vars[0], main.leaf_iter_vars[1]

    # the row inputs in shared memory: filled by the whole block at the block loop (a barrier on each side)
    for X in shared:
        st = s[X]
        st.compute_at(main, bi_main)
        a0, a1 = st.op.axis
        co, v = st.split(a1, factor=vec)
        if rows > 1:
            st.bind(a0, THREAD_Y)
        rest, t = st.split(co, factor=threads)
        st.bind(t, THREAD_X)
        if vec > 1:
            st.vectorize(v)

    # each reduction at the row (threadIdx.y): a cross-thread reduction over threadIdx.x. The row loop is a
    # different loop from the shared fill's (the block loop): a stage attached beside a shared fill would read
    # it before the barrier that ends the fill
    for st in reductions:
        st.compute_at(main, ri_main)
        (kr,) = st.op.reduce_axis
        ko, kt, kv = _row_split(st, kr, threads, vec)
        st.bind(kt, THREAD_X)
        if vec > 1:
            st.unroll(kv)
    return s


def _shape_key(d: Any) -> Any:
    return d if isinstance(d, int) else id(d)


def _row_split(stage: Stage, axis: IterVar, threads: int, vec: int) -> tuple[IterVar, IterVar, IterVar]:
    """axis -> (outer, thread, vec): thread t takes `vec` contiguous elements, the block `threads x vec` per step."""
    outer, inner = stage.split(axis, factor=threads * vec)
    t, v = stage.split(inner, factor=vec)
    return outer, t, v


def _unroll_if_small(stage: Stage, iv: IterVar, n: Any, step: int) -> None:
    if isinstance(n, int) and -(-n // step) <= 8:
        stage.unroll(iv)


__all__ = ["schedule_injective", "matmul", "schedule_matmul", "schedule_matmul_stage", "matmul_config",
           "default_matmul_config", "softmax", "layer_norm", "schedule_row_reduce", "default_row_threads",
           "inline_injective", "MATMUL_KEYS", "TRANSPOSED_A", "conv2d_nchw", "schedule_conv2d", "default_conv2d_config",
           "IM2COL", "CONV_GEMM"]
