"""The tensor-core (TF32 `mma.sync`) variant of topi.cuda's GEMM: the `tc` knob of its config.

TF32 changes numerics: A and B are rounded to 10 mantissa bits (round to nearest, ties away) and the products
summed in float32, so a result differs from float32's by about 1e-3 relative x sqrt(K) of the products' scale
(`tf32_tolerance`). It is never a default: a user asks for it (`matmul(A, B, tc="tf32")` with a cfg of
tc="tf32"), or the tuner picks it from a space that offers it (sm_80 and newer, float32) and checks it against
the float32 reference with that tolerance.

The compute (`matmul_tc`) is written in the warp's terms so that jitop's TE/TIR carry it unchanged:
  A.T[k, i], B.p[k, j]  the operands rounded to TF32, zero past M, N and K (K padded to a multiple of 8);
  frag[ti, tj, lane, f] the float32 sum over k of A.T[k, 16 ti + row(lane, f)] * B.p[k, 8 tj + col(lane, f)],
                        (row, col) = jitop.codegen.mma.c_coords(lane, f): the C fragment each lane holds of the
                        16 x 8 tile (ti, tj), its reduction combined with the marker call MMA_TF32;
  C[i, j]               = frag[i // 16, j // 8, owner lane, owner f] (c_owner).
`schedule_matmul_tc_stage` gives a block bm x bn of C, (bm / wm) x (bn / wn) warps along threadIdx.y, the
lanes along threadIdx.x, each warp's wm x wn tile in registers (frag at the lane loop), A.T and B.p tiles of bk
rows staged in shared memory; the innermost (k, f) loops of frag are the nest that codegen.nvptx emits as one
mma.sync (k = 8, or 4 when bk = 4). Every other loop and access is the scalar TE/TIR of any schedule, which is
how the per-lane semantics stays checkable without a GPU.
"""
from __future__ import annotations

import math
from typing import Any

from jitop import te
from jitop.schedule.schedule import Schedule, Stage
from jitop.target import CudaTarget
from jitop.te.expr import call
from jitop.te.tensor import ComputeOp, Tensor
from jitop.topi import cuda

TF32 = "tf32"
TC_MODES = (0, TF32)          # the `tc` knob: 0 = float32 FMA (exact float32 semantics), "tf32" = mma.sync
TC_FRAGMENTS = "cuda.matmul.tc_fragments"  # the tag of matmul_tc's per-lane accumulator stage
TC_OPERAND = "cuda.matmul.tc_operand"      # the tag of its TF32 operand views (inlined into the shared fill)
MMA_TF32 = "cuda.mma_acc.tf32"  # must equal jitop.codegen.mma.MMA_TF32 (topi may not import codegen; tested)
TF32_ROUND = "cuda.tf32_round"  # must equal jitop.codegen.mma.TF32_ROUND
MMA_M, MMA_N, MMA_K, WARP = 16, 8, 8, 32
MIN_SM = 80                   # TF32 mma.sync: Ampere and newer

_MMA_SUM = te.comm_reducer(lambda acc, x: call(MMA_TF32, acc, x), lambda dt: 0.0, name="mma_tf32_sum")


def sm_version(target: CudaTarget) -> int:
    """The compute capability of `target` as a number: sm_90 -> 90, sm_90a -> 90."""
    digits = "".join(ch for ch in target.arch.removeprefix("sm_") if ch.isdigit())
    return int(digits or 0)


def tc_available(target: CudaTarget, dtype: str = "float32") -> bool:
    """Whether tensor-core TF32 tiles may be offered for a `dtype` GEMM on `target` (sm_80+, float32).

    >>> from jitop.target import Target
    >>> tc_available(Target.from_string("cuda -arch=sm_90")), tc_available(Target.from_string("cuda -arch=sm_75"))
    (True, False)
    """
    return dtype == "float32" and sm_version(target) >= MIN_SM


def tf32_tolerance(k: int) -> tuple[float, float]:
    """(rtol, atol as a fraction of max|reference|) for comparing a K-term TF32 GEMM with float32's: each term is
    off by ~2^-11 relative, K such errors grow as sqrt(K), so atol ~ 1e-3 x sqrt(K) x a typical |output|
    (max|output| / 4), at least 2e-3 x max|output|.

    >>> tf32_tolerance(1024)
    (0.001, 0.008)
    """
    return 1e-3, max(2e-3, 2.5e-4 * math.sqrt(k))


def warp_tile(bm: int, bn: int, tm: int, tn: int) -> tuple[int, int]:
    """The warp tile (wm, wn) of a tc config's block tile: each warp holds what its 32 threads would in the float32
    layout (32 x tm x tn outputs, so the same threads and accumulators per thread), as square as the block allows
    with wm a multiple of 16 dividing bm and wn a multiple of 8 dividing bn.

    >>> warp_tile(128, 128, 8, 8), warp_tile(64, 32, 4, 4)
    ((64, 32), (32, 16))
    """
    outputs = WARP * tm * tn
    best = None
    for wm in (w for w in range(MMA_M, bm + 1, MMA_M) if bm % w == 0 and outputs % w == 0):
        wn = outputs // wm
        if wn % MMA_N == 0 and bn % wn == 0:
            rank = (abs(math.log2(wm / wn)), -wm)
            if best is None or rank < best[0]:
                best = (rank, (wm, wn))
    if best is None:
        raise ValueError(f"no warp tile of {outputs} outputs (32 x tm={tm} x tn={tn}) tiles a {bm} x {bn} block "
                         f"with {MMA_M} x {MMA_N} mma tiles; use bm >= 16, bn >= 8 and tm x tn >= 4")
    return best[1]


def tc_problems(cfg: dict[str, Any], target: CudaTarget) -> list[str]:
    """Why a cfg with tc="tf32" cannot build on `target` ([] when it can), beyond topi.cuda's tile checks."""
    problems = []
    if cfg.get("tc", 0) not in TC_MODES:
        problems.append(f"tc={cfg['tc']!r}; the modes are {list(TC_MODES)}")
    elif cfg.get("tc", 0) == TF32:
        if sm_version(target) < MIN_SM:
            problems.append(f"tc='tf32' needs tensor cores with TF32 (sm_{MIN_SM}+), {target.arch} has none")
        try:
            warp_tile(int(cfg["bm"]), int(cfg["bn"]), int(cfg["tm"]), int(cfg["tn"]))
        except ValueError as err:
            problems.append(str(err))
    return problems


# ** compute **

def _rounded_view(shape: tuple[int, int], read: Any, inside: Any, name: str) -> Tensor:
    """The operand rounded to TF32 where `inside` holds (True: everywhere), 0 elsewhere (the padding)."""
    def value(x: Any, y: Any) -> Any:
        cond = inside(x, y)
        v = read(x, y) if cond is True else te.if_then_else(cond, read(x, y), te.const(0.0, "float32"))
        return call(TF32_ROUND, v)
    return te.compute(shape, value, name=name, tag=TC_OPERAND)


def _below(i: Any, n: int, padded: int) -> Any:
    return True if n == padded else i < n


def _both(a: Any, b: Any) -> Any:
    return b if a is True else a if b is True else a & b


def matmul_tc(A: Tensor, B: Tensor, name: str = "matmul") -> Tensor:
    """C = A @ B (float32 A [M, K], B [K, N] of constant sizes) computed through TF32 tensor-core tiles: see the
    module docstring for its stages. Schedule it with `topi.cuda.schedule_matmul(C, cfg)`, cfg["tc"] = "tf32".

    >>> A, B = te.placeholder((100, 30), name="A"), te.placeholder((30, 50), name="B")
    >>> C = matmul_tc(A, B)
    >>> C.shape, C.op.input_tensors[0].shape, C.op.input_tensors[0].op.tag
    ((100, 50), (7, 7, 32, 4), 'cuda.matmul.tc_fragments')
    """
    (m, k), (k2, n) = A.shape, B.shape
    if not all(isinstance(d, int) for d in (m, k, k2, n)) or k != k2:
        raise ValueError(f"matmul_tc takes A [M, K] and B [K, N] of constant sizes, got {A.shape} and {B.shape}")
    if A.dtype.name != "float32" or B.dtype.name != "float32":
        raise TypeError(f"matmul_tc (TF32 tensor cores) takes float32 A and B, got {A.dtype.name}, {B.dtype.name}")
    mt, nt, kp = -(-m // MMA_M), -(-n // MMA_N), -(-k // MMA_K) * MMA_K
    at = _rounded_view((kp, mt * MMA_M), lambda kk, i: A[i, kk],
                       lambda kk, i: _both(_below(kk, k, kp), _below(i, m, mt * MMA_M)), f"{A.name}.T")
    bp = _rounded_view((kp, nt * MMA_N), lambda kk, j: B[kk, j],
                       lambda kk, j: _both(_below(kk, k, kp), _below(j, n, nt * MMA_N)), f"{B.name}.p")
    r = te.reduce_axis((0, kp), "k")

    def lane_sum(ti: Any, tj: Any, lane: Any, f: Any) -> Any:
        row = lane // 4 + 8 * (f // 2)   # jitop.codegen.mma.c_coords(lane, f)
        col = 2 * (lane % 4) + f % 2
        return _MMA_SUM(at[r, ti * MMA_M + row] * bp[r, tj * MMA_N + col], axis=r)

    frag = te.compute((mt, nt, WARP, 4), lane_sum, name=f"{name}.frag", tag=TC_FRAGMENTS)
    # C[i, j] is c_{f} of lane `owner` in tile (i // 16, j // 8): codegen.mma.c_owner(i % 16, j % 8)
    return te.compute((m, n), lambda i, j: frag[i // MMA_M, j // MMA_N, i % 8 * 4 + j % 8 // 2,
                                                i % MMA_M // 8 * 2 + j % 2], name=name, tag="matmul",
                      attrs={"k": k})


def is_matmul_tc(C: Tensor) -> bool:
    """Whether C was made by `matmul_tc` (its input is the per-lane fragment stage)."""
    ins = C.op.input_tensors if isinstance(C.op, ComputeOp) else []
    return len(ins) == 1 and isinstance(ins[0].op, ComputeOp) and ins[0].op.tag == TC_FRAGMENTS


# ** schedule **

def schedule_matmul_tc_stage(s: Schedule, C: Tensor, tiles: tuple[int, int, int, int, int]) -> None:
    """The tensor-core schedule of a `matmul_tc` output C inside `s`, for checked tiles (bm, bn, bk, tm, tn):
    blocks of bm x bn (blockIdx.y/x), warps of `warp_tile` (threadIdx.y), lanes (threadIdx.x), shared tiles of
    bk rows. The operand views are inlined into the shared fill (as are their producers, if the caller inlines
    them)."""
    bm, bn, bk, tm, tn = tiles
    wm, wn = warp_tile(bm, bn, tm, tn)
    warps = (bm // wm) * (bn // wn)
    frag = C.op.input_tensors[0]
    at, bp = frag.op.input_tensors
    AS = s.cache_read(at, "shared", [frag])
    BS = s.cache_read(bp, "shared", [frag])
    s[at].compute_inline()
    s[bp].compute_inline()
    lane = _schedule_output(s[C], bm, bn, wm, wn)
    ko = _schedule_fragments(s[frag], s[C], lane, 8 if bk % 8 == 0 else 4, bk)
    for X, k_major in ((AS, True), (BS, False)):
        s[X].compute_at(s[frag], ko)
        k_axis, other = s[X].op.axis
        if k_major:   # A.T[k, i] reads A[i, k]: k is contiguous in global memory
            cuda._cooperative_fetch(s, s[X], other, k_axis, warps, WARP, 4 if bk % 4 == 0 else 1)
        else:
            cuda._cooperative_fetch(s, s[X], k_axis, other, warps, WARP, 4 if bn % 4 == 0 else 1)


def _schedule_output(out: Stage, bm: int, bn: int, wm: int, wn: int) -> Any:
    """C's loops: i = bm by + wm wy + 16 mi + 8 h + g, j = bn bx + wn wx + 8 ni + 2 t + c; warps (wy, wx) on
    threadIdx.y, lanes (g, t) on threadIdx.x, each lane storing its mi x ni x 2 x 2 accumulators. Returns the
    lane loop."""
    i, j = out.op.axis
    by, i = out.split(i, factor=bm)
    wy, i = out.split(i, factor=wm)
    mi, i = out.split(i, factor=MMA_M)
    h, g = out.split(i, factor=8)
    bx, j = out.split(j, factor=bn)
    wx, j = out.split(j, factor=wn)
    ni, j = out.split(j, factor=MMA_N)
    t, c = out.split(j, factor=2)
    out.reorder(by, bx, wy, wx, g, t, mi, ni, h, c)
    warp, lane = out.fuse(wy, wx), out.fuse(g, t)
    out.bind(by, cuda.BLOCK_Y)
    out.bind(bx, cuda.BLOCK_X)
    out.bind(warp, cuda.THREAD_Y)
    out.bind(lane, cuda.THREAD_X)
    for x in (mi, ni, h, c):
        out.unroll(x)
    return lane


def _schedule_fragments(frag: Stage, out: Stage, lane: Any, mma_k: int, bk: int) -> Any:
    """The accumulators at the lane loop; K in steps of bk (the shared tiles), then of the mma's k. The (k, f)
    loops innermost are the mma nest; the lane axis (one point here) sits inside the K loop, so the shared tiles'
    region, relaxed over all lanes, is the block's. Returns the K loop of the shared fills."""
    frag.compute_at(out, lane)
    ti, tj, ln, f = frag.op.axis
    (kr,) = frag.op.reduce_axis
    kt, kk = frag.split(kr, factor=mma_k)
    ko, ks = frag.split(kt, factor=bk // mma_k)
    frag.reorder(ko, ks, ln, ti, tj, kk, f)
    for x in (ks, ti, tj, kk, f):
        frag.unroll(x)
    return ko


__all__ = ["matmul_tc", "schedule_matmul_tc_stage", "is_matmul_tc", "warp_tile", "tc_available", "tc_problems",
           "tf32_tolerance", "TF32", "TC_MODES"]
