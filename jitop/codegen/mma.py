"""Warp-level tensor-core tiles (PTX `mma.sync`, TF32) for the NVPTX back end: the fragment maps, the loop nest a
schedule marks for them, and the operands of one mma computed from that nest.

A schedule (topi.cuda_mma) writes a warp's m16n8 tile as plain per-lane scalar code: each lane owns the 4
accumulators of the C fragment (`c_coords`) and, for k in 0..K-1, adds A[row, k] * B[k, col] to each, the reduction
combined with the marker call MMA_TF32 (`acc = cuda.mma_acc.tf32(acc, a * b)`). That nest is `For k (K = 8 or 4) {
For f (4) { acc[.., f] = MMA_TF32(acc[.., f], A[..] * B[..]) } }`; `match_nest` finds it and `operands` rewrites
it into the one warp-wide mma: the scalar code's reads evaluated at the lanes and fragment elements that the PTX
ISA's layouts give each register (a lane's A element (m, k) is what the lane that owns C's row m reads at step k).

The maps follow the PTX ISA's "Matrix Fragments for mma.m16n8k8" (.tf32; m16n8k4 is its first half), cross-read
with CUTLASS's cute MMA_Traits<SM80_16x8x8_F32TF32TF32F32_TN>. With g = lane >> 2, t = lane % 4:
A (16 x k, row): a_i = (g + 8 (i & 1), t + 4 (i >> 1)); B (k x 8, col): b_i = (t + 4 i, g);
C/D (16 x 8): c_i = (g + 8 (i >> 1), 2 t + (i & 1)).
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
MMA_M, MMA_N = 16, 8
MMA_KS = (8, 4)                  # the K of the TF32 shapes: m16n8k8, m16n8k4
WARP = 32
C_ELEMS = 4                      # accumulators per lane of one m16n8 tile


# ** fragment maps: (lane, element) -> (row, column) of the tile; ints or index Exprs alike **

def a_coords(lane: Any, i: int) -> tuple[Any, Any]:
    """Row and column of A element `a_i` of `lane` (16 x k tile, row-major)."""
    return lane // 4 + 8 * (i & 1), lane % 4 + 4 * (i >> 1)


def b_coords(lane: Any, i: int) -> tuple[Any, Any]:
    """Row (k) and column of B element `b_i` of `lane` (k x 8 tile, column-major)."""
    return lane % 4 + 4 * i, lane // 4


def c_coords(lane: Any, i: int) -> tuple[Any, Any]:
    """Row and column of accumulator `c_i` / `d_i` of `lane` (16 x 8 tile)."""
    return lane // 4 + 8 * (i >> 1), 2 * (lane % 4) + (i & 1)


def c_owner(row: Any, col: Any) -> tuple[Any, Any]:
    """(lane, i) whose accumulator c_i is C[row, col]: the inverse of `c_coords`."""
    return (row % 8) * 4 + col // 2, (row // 8) * 2 + col % 2


def fragment_sizes(k: int) -> tuple[int, int]:
    """Registers per lane of A and B for m16n8k`k` TF32: (4, 2) for k = 8, (2, 1) for k = 4."""
    if k not in MMA_KS:
        raise ValueError(f"TF32 mma has k = 8 or 4, not {k}")
    return k // 2, k // 4


def intrinsic(k: int) -> str:
    """The LLVM NVPTX intrinsic of m16n8k`k` TF32 (f32 accumulators, A row-major, B column-major)."""
    fragment_sizes(k)
    return f"llvm.nvvm.mma.m16n8k{k}.row.col.tf32"


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


def warp_fragments(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each lane's registers for tiles a (16 x k), b (k x 8), c (16 x 8): arrays [32, k/2], [32, k/4], [32, 4]."""
    na, nb = fragment_sizes(a.shape[1])
    fa = np.array([[a[a_coords(ln, i)] for i in range(na)] for ln in range(WARP)], a.dtype)
    fb = np.array([[b[b_coords(ln, i)] for i in range(nb)] for ln in range(WARP)], b.dtype)
    fc = np.array([[c[c_coords(ln, i)] for i in range(C_ELEMS)] for ln in range(WARP)], c.dtype)
    return fa, fb, fc


def emulate_mma(fa: np.ndarray, fb: np.ndarray, fc: np.ndarray) -> np.ndarray:
    """What one mma.sync returns to each lane ([32, 4] d registers) for the lanes' registers: the tiles rebuilt
    from the fragments (every element must be held by exactly one lane), D = A @ B + C, handed back by `c_coords`.
    Products in float64 of the given (already TF32) values: the hardware's summation order is not modelled."""
    k = fa.shape[1] * 2
    a, b, c = (np.full(shape, np.nan) for shape in ((MMA_M, k), (k, MMA_N), (MMA_M, MMA_N)))
    for tile, frag, coords in ((a, fa, a_coords), (b, fb, b_coords), (c, fc, c_coords)):
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
    """A scalar nest `For k { For f (4) { acc[idx(f)] = MMA_TF32(acc[idx(f)], a * b) } }` (see the module)."""

    k: int
    k_var: Expr
    f_var: Expr
    acc: Buffer
    acc_index: tuple[Expr, ...]
    a: Expr
    b: Expr


def is_marked(loop: For) -> bool:
    """Whether some store under `loop` combines with MMA_TF32 (so the loop must be an mma nest)."""
    from jitop.tir.nodes import walk_stmts
    return any(isinstance(s, Store) and s.value.op is Op.CALL and s.value.arg == MMA_TF32 for s in walk_stmts(loop))


def match_nest(loop: For) -> MmaNest | None:
    """The mma nest rooted at `loop` (its k loop), or None when `loop` is not one."""
    inner = loop.body
    if loop.extent.op is not Op.CONST or int(loop.extent.value) not in MMA_KS or not isinstance(inner, For) \
            or inner.extent != const(C_ELEMS) or not isinstance(inner.body, Store):
        return None
    store = inner.body
    v = store.value
    if v.op is not Op.CALL or v.arg != MMA_TF32 or len(v.src) != 2 or v.src[1].op is not Op.MUL:
        return None
    acc = v.src[0]
    if acc.op is not Op.LOAD or acc.arg is not store.buffer or tuple(acc.src) != tuple(store.indices):
        return None
    a, b = v.src[1].src
    if a.op is not Op.LOAD or b.op is not Op.LOAD:
        return None
    return MmaNest(int(loop.extent.value), loop.var, inner.var, store.buffer, tuple(store.indices), a, b)


def operands(nest: MmaNest, lane: Expr) -> tuple[list[Expr], list[Expr], list[tuple[Expr, ...]]]:
    """The mma of `nest` for the lane whose index is `lane` (threadIdx.x of a 32-wide block): the loads of its A
    and B registers and the accumulator indices of its c_0..c_3. Each A register a_i = (m, k) is the scalar
    code's A read at step k by the lane and f owning C[m, 0]; each b_i = (k, n) its B read by the owner of
    C[0, n] (the schedule's A reads depend on the C row only, its B reads on the C column only)."""
    na, nb = fragment_sizes(nest.k)

    def at(e: Expr, k: Any, owner: tuple[Any, Any]) -> Expr:
        return substitute(e, {nest.k_var: _expr(k), lane: _expr(owner[0]), nest.f_var: _expr(owner[1])})

    a_regs, b_regs = [], []
    for i in range(na):
        m, k = a_coords(lane, i)
        a_regs.append(at(nest.a, k, c_owner(m, 0)))
    for i in range(nb):
        k, n = b_coords(lane, i)
        b_regs.append(at(nest.b, k, c_owner(0, n)))
    accs = [tuple(substitute(x, {nest.f_var: const(i)}) for x in nest.acc_index) for i in range(C_ELEMS)]
    return a_regs, b_regs, accs


def _expr(x: Any) -> Expr:
    return x if isinstance(x, Expr) else const(int(x))


__all__ = ["MMA_TF32", "TF32_ROUND", "a_coords", "b_coords", "c_coords", "c_owner", "fragment_sizes", "intrinsic",
           "to_tf32", "warp_fragments", "emulate_mma", "MmaNest", "is_marked", "match_nest", "operands"]
