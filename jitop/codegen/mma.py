"""Warp-level tensor-core tiles (PTX `mma.sync`, TF32 and BF16) for the NVPTX back end: the fragment maps, the loop
nest a schedule marks for them, and the operands of one mma computed from that nest.

A schedule (topi.cuda_mma) writes a warp's m16n8 tile as plain per-lane scalar code: each lane owns the 4
accumulators of the C fragment (`c_coords`) and, for k in 0..K-1, adds A[row, k] * B[k, col] to each, the reduction
combined with a mode's marker call (`acc = cuda.mma_acc.tf32(acc, a * b)`, MODES). That nest is `For k (K = one of
the mode's ks) { For f (4) { acc[.., f] = marker(acc[.., f], A[..] * B[..]) } }`; `match_nest` finds it and
`operands` rewrites it into the one warp-wide mma: the scalar code's reads evaluated at the lanes and fragment
elements that the PTX ISA's layouts give each register (a lane's A element (m, k) is what the lane that owns C's
row m reads at step k). The operands were rounded to the mode's type before (the marker's operand rounding call in
the shared tiles' fill), so the scalar nest and the mma compute the same products.

The maps follow the PTX ISA's "Matrix Fragments for mma.m16n8k8" (.tf32; m16n8k4 is its first half) and "for
mma.m16n8k16 with floating point type" (.bf16, 2 elements per .b32 register, the lower index in the low half;
m16n8k8 .bf16 is its first half), cross-read with CUTLASS's cute MMA_Traits<SM80_16x8x8_F32TF32TF32F32_TN> and
<SM80_16x8x16_F32BF16BF16F32_TN>. With g = lane >> 2, t = lane % 4, p elements per register (1 tf32, 2 bf16) and
element i = p r + h (register r, half h): A (16 x k, row): a_i = (g + 8 (r & 1), p t + h + 4 p (r >> 1));
B (k x 8, col): b_i = (p t + h + 4 p r, g); C/D (16 x 8, f32): c_i = (g + 8 (i >> 1), 2 t + (i & 1)).
No GPU ever checked them here: `emulate_mma` (numpy) assembles fragments per lane and tests/cuda/test_mma.py checks
D = A @ B + C through them, which only proves the maps consistent with each other and with the scalar nest.

>>> c_coords(5, 2), c_owner(9, 3)
((9, 2), (5, 3))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from jitop.te.expr import Expr, Op, const, substitute
from jitop.tir.nodes import Buffer, For, Store

MMA_TF32 = "cuda.mma_acc.tf32"  # the reduction's combine that marks a nest as one m16n8k{8,4} TF32 mma
TF32_ROUND = "cuda.tf32_round"   # float32 -> the nearest TF32 value (cvt.rna.tf32.f32), still a float32
MMA_BF16 = "cuda.mma_acc.bf16"  # ... as one m16n8k{16,8} BF16 mma (f32 accumulators)
BF16_ROUND = "cuda.bf16_round"   # float32 -> the nearest bfloat16 value (cvt.rn.bf16x2.f32), still a float32
MMA_M, MMA_N = 16, 8
WARP = 32
C_ELEMS = 4                      # accumulators per lane of one m16n8 tile


@dataclass(frozen=True)
class Mode:
    """The facts of one tensor-core operand type (a row of MODES)."""

    name: str             # the PTX type of A and B
    marker: str           # the reduction's combine that marks its nest
    rounding: str         # its operand rounding call: float32 -> a float32 holding the nearest operand value
    ks: tuple[int, ...]   # the K of its m16n8kK shapes, largest first (each smaller one is the first half)
    pack: int             # operand elements per .b32 register (bf16x2: 2, the lower index in the low half)


MODES = {"tf32": Mode("tf32", MMA_TF32, TF32_ROUND, (8, 4), 1),
         "bf16": Mode("bf16", MMA_BF16, BF16_ROUND, (16, 8), 2)}
BY_MARKER = {m.marker: m for m in MODES.values()}
ROUNDINGS = {m.rounding: m for m in MODES.values()}


# ** fragment maps: (lane, element) -> (row, column) of the tile; ints or index Exprs alike **

def a_coords(lane: Any, i: int, mode: str = "tf32") -> tuple[Any, Any]:
    """Row and column of A element `a_i` of `lane` (16 x k tile, row-major).

    >>> a_coords(9, 5, "bf16"), a_coords(9, 3)
    ((2, 11), (10, 5))
    """
    p = MODES[mode].pack
    r, h = divmod(i, p)
    return lane // 4 + 8 * (r & 1), p * (lane % 4) + h + 4 * p * (r >> 1)


def b_coords(lane: Any, i: int, mode: str = "tf32") -> tuple[Any, Any]:
    """Row (k) and column of B element `b_i` of `lane` (k x 8 tile, column-major)."""
    p = MODES[mode].pack
    r, h = divmod(i, p)
    return p * (lane % 4) + h + 4 * p * r, lane // 4


def c_coords(lane: Any, i: int) -> tuple[Any, Any]:
    """Row and column of accumulator `c_i` / `d_i` of `lane` (16 x 8 tile)."""
    return lane // 4 + 8 * (i >> 1), 2 * (lane % 4) + (i & 1)


def c_owner(row: Any, col: Any) -> tuple[Any, Any]:
    """(lane, i) whose accumulator c_i is C[row, col]: the inverse of `c_coords`."""
    return (row % 8) * 4 + col // 2, (row // 8) * 2 + col % 2


def fragment_sizes(k: int, mode: str = "tf32") -> tuple[int, int]:
    """Elements per lane of A and B for m16n8k`k` (16 k / 32 and 8 k / 32; registers: these / the mode's pack):
    (4, 2) for TF32 k = 8, (8, 4) for BF16 k = 16."""
    if k not in MODES[mode].ks:
        raise ValueError(f"{mode.upper()} mma has k in {MODES[mode].ks}, not {k}")
    return k // 2, k // 4


def intrinsic(k: int, mode: str = "tf32") -> str:
    """The LLVM NVPTX intrinsic of m16n8k`k` (f32 accumulators, A row-major, B column-major).

    >>> intrinsic(16, "bf16")
    'llvm.nvvm.mma.m16n8k16.row.col.bf16'
    """
    fragment_sizes(k, mode)
    return f"llvm.nvvm.mma.m16n8k{k}.row.col.{mode}"


# ** numpy emulation: the only numerical check of the maps without a GPU **

def to_tf32(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 (10 mantissa bits), to nearest with ties away from zero (cvt.rna).

    >>> float(to_tf32(np.float32(1.0 + 2 ** -11))), float(to_tf32(np.float32(1.0 + 2 ** -12)))
    (1.0009765625, 1.0)
    """
    bits = np.asarray(x, np.float32).view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    rounded = np.where(finite, (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000), bits)
    return rounded.astype(np.uint32).view(np.float32)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (7 mantissa bits), to nearest with ties to even (cvt.rn), as float32.

    >>> [float(to_bf16(np.float32(v))) for v in (1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20)]
    [1.0, 1.015625, 1.0078125]
    """
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return np.where(nan, bits | 0x00400000, rounded).astype(np.uint32).view(np.float32)


def round_operand(x: np.ndarray, mode: str = "tf32") -> np.ndarray:
    """float32 values rounded as the mode's operand rounding call does (`to_tf32`, `to_bf16`)."""
    return to_bf16(x) if mode == "bf16" else to_tf32(x)


def warp_fragments(a: np.ndarray, b: np.ndarray, c: np.ndarray,
                   mode: str = "tf32") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each lane's elements for tiles a (16 x k), b (k x 8), c (16 x 8): arrays [32, k/2], [32, k/4], [32, 4]."""
    na, nb = fragment_sizes(a.shape[1], mode)
    fa = np.array([[a[a_coords(ln, i, mode)] for i in range(na)] for ln in range(WARP)], a.dtype)
    fb = np.array([[b[b_coords(ln, i, mode)] for i in range(nb)] for ln in range(WARP)], b.dtype)
    fc = np.array([[c[c_coords(ln, i)] for i in range(C_ELEMS)] for ln in range(WARP)], c.dtype)
    return fa, fb, fc


def emulate_mma(fa: np.ndarray, fb: np.ndarray, fc: np.ndarray, mode: str = "tf32") -> np.ndarray:
    """What one mma.sync returns to each lane ([32, 4] d registers) for the lanes' elements: the tiles rebuilt
    from the fragments (every element must be held by exactly one lane), D = A @ B + C, handed back by `c_coords`.
    Products in float64 of the given (already rounded) values: the hardware's summation order is not modelled."""
    k = fa.shape[1] * 2
    fragment_sizes(k, mode)
    a, b, c = (np.full(shape, np.nan) for shape in ((MMA_M, k), (k, MMA_N), (MMA_M, MMA_N)))
    maps = (lambda ln, i: a_coords(ln, i, mode), lambda ln, i: b_coords(ln, i, mode), c_coords)
    for tile, frag, coords in zip((a, b, c), (fa, fb, fc), maps):
        for ln in range(WARP):
            for i in range(frag.shape[1]):
                at = coords(ln, i)
                if not np.isnan(tile[at]):
                    raise AssertionError(f"element {at} of a fragment is held twice (lane {ln}, register {i})")
                tile[at] = frag[ln, i]
    if np.isnan(a).any() or np.isnan(b).any() or np.isnan(c).any():
        raise AssertionError("a tile element is held by no lane")
    d = a @ b + c
    return np.array([[d[c_coords(ln, i)] for i in range(C_ELEMS)] for ln in range(WARP)])


# ** the marked nest, and the operands of its mma **

@dataclass(frozen=True)
class MmaNest:
    """A scalar nest `For k { For f (4) { acc[idx(f)] = marker(acc[idx(f)], a * b) } }` (see the module) of the
    mode named `mode`."""

    k: int
    k_var: Expr
    f_var: Expr
    acc: Buffer
    acc_index: tuple[Expr, ...]
    a: Expr
    b: Expr
    mode: str = "tf32"


def is_marked(loop: For) -> bool:
    """Whether some store under `loop` combines with a mode's marker (so the loop must be an mma nest)."""
    from jitop.tir.nodes import walk_stmts
    return any(isinstance(s, Store) and s.value.op is Op.CALL and s.value.arg in BY_MARKER for s in walk_stmts(loop))


def match_nest(loop: For) -> MmaNest | None:
    """The mma nest rooted at `loop` (its k loop), or None when `loop` is not one."""
    inner = loop.body
    if loop.extent.op is not Op.CONST or not isinstance(inner, For) or inner.extent != const(C_ELEMS) \
            or not isinstance(inner.body, Store):
        return None
    store = inner.body
    v = store.value
    if v.op is not Op.CALL or v.arg not in BY_MARKER or len(v.src) != 2 or v.src[1].op is not Op.MUL:
        return None
    mode = BY_MARKER[v.arg]
    acc = v.src[0]
    if int(loop.extent.value) not in mode.ks or acc.op is not Op.LOAD or acc.arg is not store.buffer \
            or tuple(acc.src) != tuple(store.indices):
        return None
    a, b = v.src[1].src
    if a.op is not Op.LOAD or b.op is not Op.LOAD:
        return None
    return MmaNest(int(loop.extent.value), loop.var, inner.var, store.buffer, tuple(store.indices), a, b, mode.name)


def operands(nest: MmaNest, lane: Expr) -> tuple[list[Expr], list[Expr], list[tuple[Expr, ...]]]:
    """The mma of `nest` for the lane whose index is `lane` (threadIdx.x of a 32-wide block): the loads of its A
    and B elements (one per register for TF32; for BF16 elements 2j and 2j + 1 make register j) and the
    accumulator indices of its c_0..c_3. Each A element a_i = (m, k) is the scalar code's A read at step k by the
    lane and f owning C[m, 0]; each b_i = (k, n) its B read by the owner of C[0, n] (the schedule's A reads depend
    on the C row only, its B reads on the C column only)."""
    na, nb = fragment_sizes(nest.k, nest.mode)

    def at(e: Expr, k: Any, owner: tuple[Any, Any]) -> Expr:
        return substitute(e, {nest.k_var: _expr(k), lane: _expr(owner[0]), nest.f_var: _expr(owner[1])})

    a_elems, b_elems = [], []
    for i in range(na):
        m, k = a_coords(lane, i, nest.mode)
        a_elems.append(at(nest.a, k, c_owner(m, 0)))
    for i in range(nb):
        k, n = b_coords(lane, i, nest.mode)
        b_elems.append(at(nest.b, k, c_owner(0, n)))
    accs = [tuple(substitute(x, {nest.f_var: const(i)}) for x in nest.acc_index) for i in range(C_ELEMS)]
    return a_elems, b_elems, accs


def _expr(x: Any) -> Expr:
    return x if isinstance(x, Expr) else const(int(x))


__all__ = ["MMA_TF32", "TF32_ROUND", "MMA_BF16", "BF16_ROUND", "Mode", "MODES", "a_coords", "b_coords", "c_coords",
           "c_owner", "fragment_sizes", "intrinsic", "to_tf32", "to_bf16", "round_operand", "warp_fragments",
           "emulate_mma", "MmaNest", "is_marked", "match_nest", "operands"]
