"""Matmul: compute with B packed into zero-padded panels, and a register-tiled schedule template.

C[..., i, j] = sum_k A[..., i, k] * B[..., k, j]. B is repacked as packedB[.., j // bn, k, j % bn] so the
micro-kernel streams one contiguous panel; the C tile (mr rows x bn columns) lives in vector registers
(cache_write + unroll + vectorize), as in OpenBLAS/BLIS kernels. Panels beyond N are zero, so any M, N,
K is correct; tails are guarded.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from jitop import te
from jitop.schedule.schedule import Schedule
from jitop.te.expr import Expr

Reader = Callable[[tuple[Expr, ...], Expr, Expr], Expr]  # (batch index, row, col) -> value


@dataclass(frozen=True)
class MatmulConfig:
    """Knobs of the template: register tile rows (mr), panel width (bn, a multiple of the vector width),
    k unroll, and whether the panel loop is outermost (keeps a B panel in L2)."""

    mr: int = 6
    bn: int = 64
    k_unroll: int = 4
    panel_outer: bool = True


def default_config(m: int, n: int, k: int, itemsize: int) -> MatmulConfig:
    """A fast configuration from the shape and the vector width (64-byte registers)."""
    lanes = 64 // itemsize
    bn = min(4 * lanes, lanes * math.ceil(n / lanes)) or lanes
    mr = max(1, min(6 if bn >= 4 * lanes else 8, m))
    # panel-outer order parallelises over B panels: worth it only when there are enough of them
    return MatmulConfig(mr=mr, bn=bn, k_unroll=max(1, min(4, k)), panel_outer=math.ceil(n / bn) >= 8)


def matmul(a: Reader, b: Reader, batch: tuple[int, ...], m: int, n: int, k: int, dtype, cfg: MatmulConfig,
           name: str = "matmul", b_batch: tuple[int, ...] | None = None,
           b_index: Callable[[tuple[Expr, ...]], tuple[Expr, ...]] | None = None) -> tuple[te.Tensor, te.Tensor]:
    """(C, packedB) for C = A @ B, reading A and B through `a(batch_idx, i, k)` / `b(batch_idx, k, j)`.

    B may have fewer batch dimensions than C (`b_batch`, with `b_index` mapping C's batch index to B's):
    it is packed once per B matrix, not once per C matrix.
    """
    bn, panels = cfg.bn, math.ceil(n / cfg.bn)
    b_batch = batch if b_batch is None else b_batch
    b_index = b_index or (lambda bi: bi)

    def pack(*idx: Expr) -> Expr:
        bi, x, y, z = idx[:-3], idx[-3], idx[-2], idx[-1]
        col = x * bn + z
        return te.if_then_else(col < n, b(bi, y, col), te.const(0, dtype)) if n % bn else b(bi, y, col)
    packed = te.compute(b_batch + (panels, k, bn), pack, name=f"{name}_packedB")
    r = te.reduce_axis((0, k), "k")

    def body(*idx: Expr) -> Expr:
        bi, i, j = idx[:-2], idx[-2], idx[-1]
        return te.sum(a(bi, i, r.var) * packed[b_index(bi) + (j // bn, r.var, j % bn)], axis=r)
    return te.compute(batch + (m, n), body, name=name), packed


def schedule(s: Schedule, c: te.Tensor, packed: te.Tensor, cfg: MatmulConfig,
             epilogue: te.Tensor | None = None) -> None:
    """Register-tiled schedule: C tile in registers, packing and the outer loop parallel.

    With `epilogue` (an elementwise consumer of C of the same shape, e.g. bias + activation), the
    epilogue is computed straight from the register tile: C never goes to memory.
    """
    cache = s.cache_write(c, "local")
    if epilogue is not None:
        s[c].compute_inline()
    stage = s[epilogue if epilogue is not None else c]
    *batch, i, j = stage.op.axis
    io, jo, ii, ji = stage.tile(i, j, cfg.mr, cfg.bn)
    if cfg.panel_outer:
        stage.reorder(*batch, jo, io, ii, ji)
    stage.vectorize(ji)
    s[cache].compute_at(stage, io if cfg.panel_outer else jo)
    cs = s[cache]
    *_, xc, yc = cs.op.axis
    (kk,) = cs.op.reduce_axis
    ko, ki = cs.split(kk, factor=cfg.k_unroll)
    cs.reorder(ko, ki, xc, yc)
    cs.unroll(ki)
    cs.unroll(xc)
    cs.vectorize(yc)
    outer = jo if cfg.panel_outer else io
    stage.parallel(stage.fuse(*batch, outer) if batch else outer)
    ps = s[packed]
    *pb, px, _, pz = ps.op.axis
    ps.vectorize(pz)
    ps.parallel(ps.fuse(*pb, px) if pb else px)
