"""The tensor-core (`mma.sync`, TF32 or BF16) variant of topi.cuda's GEMM: the `tc` knob of its config.

Both modes take and return float32 and change numerics: A and B are rounded to the mode's type and the products
summed in float32 on the tensor cores. TF32 keeps 10 mantissa bits (round to nearest, ties away): a result
differs from float32's by about 1e-3 relative x sqrt(K) of the products' scale (`tf32_tolerance`). BF16 keeps 7
(round to nearest even; unit roundoff 2^-8, 8x TF32's): `bf16_tolerance`. Neither is ever a default: a user asks
for one (`matmul(A, B, tc="bf16")` with a cfg of tc="bf16"), or the tuner picks it from a space that offers it
(a workload of that precision, sm_80 and newer, float32) and checks it against the float32 reference with that
tolerance.

The compute (`matmul_tc`) is written in the warp's terms so that jitop's TE/TIR carry it unchanged:
  A.T[k, i], B.p[k, j]  the operands rounded to the mode's type (a float32 holding the rounded value: the
                        mode's rounding call), zero past M, N and K (K padded to the mode's largest mma k:
                        8 for TF32, 16 for BF16);
  frag[ti, tj, lane, f] the float32 sum over k of A.T[k, 16 ti + row(lane, f)] * B.p[k, 8 tj + col(lane, f)],
                        (row, col) = jitop.codegen.mma.c_coords(lane, f): the C fragment each lane holds of the
                        16 x 8 tile (ti, tj), its reduction combined with the mode's marker call (MMA_TF32);
  C[i, j]               = frag[i // 16, j // 8, owner lane, owner f] (c_owner).
`schedule_matmul_tc_stage` gives a block bm x bn of C, (bm / wm) x (bn / wn) warps along threadIdx.y, the
lanes along threadIdx.x, each warp's wm x wn tile in registers (frag at the lane loop), A.T and B.p tiles of bk
rows staged in shared memory (float32: the rounding happens in their fill); the innermost (k, f) loops of frag
are the nest that codegen.nvptx emits as one mma.sync: the largest of the mode's k dividing bk (TF32: m16n8k8,
m16n8k4 at bk = 4; BF16: m16n8k16, m16n8k8 at bk = 8, each register a bf16x2 pair packed from two rounded
values). Every other loop and access is the scalar TE/TIR of any schedule, which is how the per-lane semantics
stays checkable without a GPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from jitop import te
from jitop.schedule.schedule import Schedule, Stage
from jitop.target import CudaTarget
from jitop.te.expr import call
from jitop.te.tensor import ComputeOp, Tensor
from jitop.topi import cuda

TF32, BF16 = "tf32", "bf16"
TC_MODES = (0, TF32, BF16)    # the `tc` knob: 0 = float32 FMA (exact float32 semantics), "tf32" / "bf16" = mma.sync
TC_FRAGMENTS = "cuda.matmul.tc_fragments"  # the tag of matmul_tc's per-lane accumulator stage
TC_OPERAND = "cuda.matmul.tc_operand"      # the tag of its rounded operand views (inlined into the shared fill)
MMA_TF32 = "cuda.mma_acc.tf32"  # must equal jitop.codegen.mma.MMA_TF32 (topi may not import codegen; tested)
TF32_ROUND = "cuda.tf32_round"  # must equal jitop.codegen.mma.TF32_ROUND
MMA_BF16 = "cuda.mma_acc.bf16"  # must equal jitop.codegen.mma.MMA_BF16
BF16_ROUND = "cuda.bf16_round"  # must equal jitop.codegen.mma.BF16_ROUND
MMA_M, MMA_N, WARP = 16, 8, 32
MIN_SM = 80                   # TF32 and BF16 mma.sync: Ampere and newer


def sm_version(target: CudaTarget) -> int:
    """The compute capability of `target` as a number: sm_90 -> 90, sm_90a -> 90."""
    digits = "".join(ch for ch in target.arch.removeprefix("sm_") if ch.isdigit())
    return int(digits or 0)


def tc_available(target: CudaTarget, dtype: str = "float32") -> bool:
    """Whether tensor-core (TF32, BF16) tiles may be offered for a `dtype` GEMM on `target` (sm_80+, float32).

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


def bf16_tolerance(k: int) -> tuple[float, float]:
    """(rtol, atol as a fraction of max|reference|) for comparing a K-term BF16 GEMM with float32's: bfloat16 has
    8 significand bits, so each rounded operand is off by up to 2^-8 relative (round to nearest even) and each
    product by about 2^-7, 8x TF32's (unit roundoff 2^-11); the float32 sum adds little. `tf32_tolerance` scaled
    by 8: rtol 8e-3, atol ~ 2e-3 x sqrt(K) x max|output|, at least 1.6e-2 x max|output|.

    >>> bf16_tolerance(1024)
    (0.008, 0.064)
    """
    return 8e-3, max(1.6e-2, 2e-3 * math.sqrt(k))


@dataclass(frozen=True)
class TcMode:
    """What topi needs of a tensor-core mode (jitop.codegen.mma.MODES has the same names and ks; tested)."""

    marker: str                 # the reduction's combine that marks the mma nest
    rounding: str               # the operand rounding call (in the shared tiles' fill)
    ks: tuple[int, ...]         # its mma k, largest first: K is padded to ks[0], bk must be a multiple of ks[-1]
    tolerance: Callable[[int], tuple[float, float]]  # the tuner's check against float32, for a K


MODES = {TF32: TcMode(MMA_TF32, TF32_ROUND, (8, 4), tf32_tolerance),
         BF16: TcMode(MMA_BF16, BF16_ROUND, (16, 8), bf16_tolerance)}
_MMA_SUMS = {name: te.comm_reducer(lambda acc, x, marker=mode.marker: call(marker, acc, x), lambda dt: 0.0,
                                   name=f"mma_{name}_sum") for name, mode in MODES.items()}


def tc_tolerance(mode: str, k: int) -> tuple[float, float]:
    """The tuner's (rtol, atol fraction) for a K-term GEMM on tensor-core `mode`.

    >>> tc_tolerance("tf32", 1024) == tf32_tolerance(1024), tc_tolerance("bf16", 64)
    (True, (0.008, 0.016))
    """
    return MODES[mode].tolerance(k)


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
    """Why a cfg with tc="tf32" or "bf16" cannot build on `target` ([] when it can), beyond topi.cuda's tile
    checks."""
    problems = []
    mode = cfg.get("tc", 0)
    if mode not in TC_MODES:
        problems.append(f"tc={mode!r}; the modes are {list(TC_MODES)}")
    elif mode:
        if sm_version(target) < MIN_SM:
            problems.append(f"tc={mode!r} needs tensor cores with {mode.upper()} (sm_{MIN_SM}+), {target.arch} has "
                            "none")
        if int(cfg["bk"]) % MODES[mode].ks[-1]:
            problems.append(f"tc={mode!r} needs bk a multiple of {MODES[mode].ks[-1]} (its smallest mma k), not "
                            f"{cfg['bk']}")
        try:
            warp_tile(int(cfg["bm"]), int(cfg["bn"]), int(cfg["tm"]), int(cfg["tn"]))
        except ValueError as err:
            problems.append(str(err))
    return problems


# ** compute **

def _rounded_view(shape: tuple[int, int], read: Any, inside: Any, name: str, rounding: str) -> Tensor:
    """The operand rounded by the call `rounding` where `inside` holds (True: everywhere), 0 elsewhere (the
    padding)."""
    def value(x: Any, y: Any) -> Any:
        cond = inside(x, y)
        v = read(x, y) if cond is True else te.if_then_else(cond, read(x, y), te.const(0.0, "float32"))
        return call(rounding, v)
    return te.compute(shape, value, name=name, tag=TC_OPERAND)


def _below(i: Any, n: int, padded: int) -> Any:
    return True if n == padded else i < n


def _both(a: Any, b: Any) -> Any:
    return b if a is True else a if b is True else a & b


def matmul_tc(A: Tensor, B: Tensor, name: str = "matmul", mode: str = TF32) -> Tensor:
    """C = A @ B (float32 A [M, K], B [K, N] of constant sizes) computed through tensor-core tiles of `mode`
    ("tf32", "bf16"): see the module docstring for its stages. Schedule it with `topi.cuda.schedule_matmul(C, cfg)`
    (cfg["tc"] = mode).

    >>> A, B = te.placeholder((100, 30), name="A"), te.placeholder((30, 50), name="B")
    >>> C = matmul_tc(A, B)
    >>> C.shape, C.op.input_tensors[0].shape, C.op.input_tensors[0].op.tag
    ((100, 50), (7, 7, 32, 4), 'cuda.matmul.tc_fragments')
    >>> C16 = matmul_tc(A, B, mode="bf16")   # K padded to 32, a multiple of m16n8k16's k
    >>> tc_mode(C16), C16.op.input_tensors[0].op.reduce_axis[0].extent
    ('bf16', 32)
    """
    (m, k), (k2, n) = A.shape, B.shape
    if not all(isinstance(d, int) for d in (m, k, k2, n)) or k != k2:
        raise ValueError(f"matmul_tc takes A [M, K] and B [K, N] of constant sizes, got {A.shape} and {B.shape}")
    if A.dtype.name != "float32" or B.dtype.name != "float32":
        raise TypeError(f"matmul_tc ({mode.upper()} tensor cores) takes float32 A and B, got {A.dtype.name}, "
                        f"{B.dtype.name}")
    spec = MODES[mode]
    mt, nt, kp = -(-m // MMA_M), -(-n // MMA_N), -(-k // spec.ks[0]) * spec.ks[0]
    at = _rounded_view((kp, mt * MMA_M), lambda kk, i: A[i, kk],
                       lambda kk, i: _both(_below(kk, k, kp), _below(i, m, mt * MMA_M)), f"{A.name}.T", spec.rounding)
    bp = _rounded_view((kp, nt * MMA_N), lambda kk, j: B[kk, j],
                       lambda kk, j: _both(_below(kk, k, kp), _below(j, n, nt * MMA_N)), f"{B.name}.p", spec.rounding)
    r = te.reduce_axis((0, kp), "k")

    def lane_sum(ti: Any, tj: Any, lane: Any, f: Any) -> Any:
        row = lane // 4 + 8 * (f // 2)   # jitop.codegen.mma.c_coords(lane, f)
        col = 2 * (lane % 4) + f % 2
        return _MMA_SUMS[mode](at[r, ti * MMA_M + row] * bp[r, tj * MMA_N + col], axis=r)

    frag = te.compute((mt, nt, WARP, 4), lane_sum, name=f"{name}.frag", tag=TC_FRAGMENTS)
    # C[i, j] is c_{f} of lane `owner` in tile (i // 16, j // 8): codegen.mma.c_owner(i % 16, j % 8)
    return te.compute((m, n), lambda i, j: frag[i // MMA_M, j // MMA_N, i % 8 * 4 + j % 8 // 2,
                                                i % MMA_M // 8 * 2 + j % 2], name=name, tag="matmul",
                      attrs={"k": k, "tc": mode})


def is_matmul_tc(C: Tensor) -> bool:
    """Whether C was made by `matmul_tc` (its input is the per-lane fragment stage)."""
    ins = C.op.input_tensors if isinstance(C.op, ComputeOp) else []
    return len(ins) == 1 and isinstance(ins[0].op, ComputeOp) and ins[0].op.tag == TC_FRAGMENTS


def tc_mode(C: Tensor) -> str:
    """The tensor-core mode ("tf32", "bf16") of a C made by `matmul_tc`."""
    return C.op.attrs["tc"]


# ** schedule **

def schedule_matmul_tc_stage(s: Schedule, C: Tensor, tiles: tuple[int, int, int, int, int], stages: int = 1) -> None:
    """The tensor-core schedule of a `matmul_tc` output C inside `s`, for checked tiles (bm, bn, bk, tm, tn):
    blocks of bm x bn (blockIdx.y/x), warps of `warp_tile` (threadIdx.y), lanes (threadIdx.x), shared tiles of
    bk rows (`stages` = 2: double-buffered, as topi.cuda's SGEMM). The operand views are inlined into the shared
    fill (as are their producers, if the caller inlines them)."""
    bm, bn, bk, tm, tn = tiles
    wm, wn = warp_tile(bm, bn, tm, tn)
    mma_k = next(k for k in MODES[tc_mode(C)].ks if bk % k == 0)  # tc_problems: bk is a multiple of the last
    warps = (bm // wm) * (bn // wn)
    frag = C.op.input_tensors[0]
    at, bp = frag.op.input_tensors
    AS = s.cache_read(at, "shared", [frag])
    BS = s.cache_read(bp, "shared", [frag])
    s[at].compute_inline()
    s[bp].compute_inline()
    lane = _schedule_output(s[C], bm, bn, wm, wn)
    ko = _schedule_fragments(s[frag], s[C], lane, mma_k, bk)
    for X, k_major in ((AS, True), (BS, False)):
        s[X].compute_at(s[frag], ko)
        k_axis, other = s[X].op.axis
        if k_major:   # A.T[k, i] reads A[i, k]: k is contiguous in global memory
            cuda._cooperative_fetch(s, s[X], other, k_axis, warps, WARP, 4 if bk % 4 == 0 else 1)
        else:
            cuda._cooperative_fetch(s, s[X], k_axis, other, warps, WARP, 4 if bn % 4 == 0 else 1)
        if stages == 2:
            s[X].double_buffer()


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


__all__ = ["matmul_tc", "schedule_matmul_tc_stage", "is_matmul_tc", "tc_mode", "warp_tile", "tc_available",
           "tc_problems", "tf32_tolerance", "bf16_tolerance", "tc_tolerance", "TcMode", "MODES", "TF32", "BF16",
           "TC_MODES"]
