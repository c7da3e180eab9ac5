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
from jitop.te.tensor import read_tensors
from jitop.topi.cpu import CPU, host
from jitop.tuner.space import Config, ConfigSpace

Reader = Callable[[tuple[Expr, ...], Expr, Expr], Expr]  # (batch index, row, col) -> value


@dataclass(frozen=True)
class MatmulConfig:
    """Typed view of a point of `config_space`: register tile rows (mr), panel width (bn, a multiple of
    the vector width), k unroll, and whether the panel loop is outermost (keeps a B panel in L2 and
    parallelises over panels) or the row-block loop is (parallel over row blocks)."""

    mr: int = 6
    bn: int = 64
    k_unroll: int = 4
    panel_outer: bool = True

    @staticmethod
    def from_config(cfg: Config) -> "MatmulConfig":
        return MatmulConfig(mr=cfg["tile_m"][-1], bn=cfg["tile_n"][-1], k_unroll=cfg["tile_k"][-1],
                            panel_outer=cfg["order"] == "panel_outer")

    def to_config(self, m: int, n: int, k: int) -> Config:
        return Config.of(tile_m=(math.ceil(m / self.mr), self.mr), tile_n=(math.ceil(n / self.bn), self.bn),
                         tile_k=(math.ceil(k / self.k_unroll), self.k_unroll),
                         order="panel_outer" if self.panel_outer else "row_outer")


def config_space(m: int, n: int, k: int, itemsize: int, cpu: CPU | None = None) -> ConfigSpace:
    """Every schedule the template can build for C[m, n] = A[m, k] @ B[k, n] (all are correct)."""
    lanes = (cpu or host()).lanes(itemsize)
    space = ConfigSpace()
    # the register tile: mr rows x bn columns of C, at most 32 vector registers with A and B operands
    space.define_split("tile_m", m, candidates=[(math.ceil(m / r), r) for r in range(1, min(max(m, 1), 12) + 1)])
    space.define_split("tile_n", n, candidates=[(math.ceil(n / (v * lanes)), v * lanes) for v in (1, 2, 3, 4)
                                               if v == 1 or (v - 1) * lanes < n])
    space.define_split("tile_k", k, candidates=[(math.ceil(k / u), u) for u in (1, 2, 4, 8) if u == 1 or u <= k])
    space.define_knob("order", ["panel_outer", "row_outer"])
    return space


def default_config(m: int, n: int, k: int, itemsize: int, cpu: CPU | None = None) -> MatmulConfig:
    """A fast point of the space from the shape and the CPU: the widest register tile that fits the
    vector registers (4 vectors x 6 rows = 24 accumulators with AVX-512), k unrolled by 4, and the panel
    loop outermost when there are enough panels to keep every thread busy."""
    cpu = cpu or host()
    lanes = cpu.lanes(itemsize)
    vectors = min(4 if cpu.vector_registers >= 32 else 2, math.ceil(n / lanes)) or 1
    bn = vectors * lanes
    mr = max(1, min(6 if vectors >= 4 else 8, m, (cpu.vector_registers - vectors - 2) // vectors))
    panels = math.ceil(n / bn)
    return MatmulConfig(mr=mr, bn=bn, k_unroll=4 if k >= 4 else 2 if k >= 2 else 1, panel_outer=panels >= 4 * cpu.threads)


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
    if n % bn == 0:
        return te.compute(batch + (m, n), body, name=name), packed
    # computed as wide as the panels, so the last panel's register tile is whole too (no masked lanes,
    # no odd-width vectors); C is the first n columns of it
    full = te.compute(batch + (m, panels * bn), body, name=f"{name}{FULL}")
    return te.compute(batch + (m, n), lambda *idx: full[idx], name=name), packed


FULL = "_full"


def _core(c: te.Tensor) -> te.Tensor:
    """The panel-wide product behind C (C itself when n is a multiple of the panel width)."""
    inner = read_tensors([c.op.body[0]]) if hasattr(c.op, "body") else []
    return inner[0] if len(inner) == 1 and inner[0].name == c.name + FULL else c


def schedule(s: Schedule, c: te.Tensor, packed: te.Tensor, cfg: MatmulConfig,
             epilogue: te.Tensor | None = None) -> None:
    """Register-tiled schedule: C tile in registers, packing and the outer loop parallel.

    With `epilogue` (an elementwise consumer of C of the same shape, e.g. bias + activation), the
    epilogue is computed straight from the register tile: C never goes to memory. The epilogue may view
    C's last axis as several (a convolution's output rows x columns): they are fused back into one.
    """
    core = _core(c)
    cache = s.cache_write(core, "local")
    if core is not c:
        s[core].compute_inline()
    if epilogue is not None:
        s[c].compute_inline()
    stage = s[epilogue if epilogue is not None else c]
    axes = list(stage.op.axis)
    if len(axes) > c.ndim:
        axes = axes[:c.ndim - 1] + [stage.fuse(*axes[c.ndim - 1:])]
    *batch, i, j = axes
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
    *pb, px, pk, pz = ps.op.axis
    ps.vectorize(pz)
    outer = ps.fuse(*pb, px) if pb else px
    if outer.extent < 2 * host().threads:  # few panels: parallel over k as well
        outer = ps.fuse(outer, pk)
    ps.parallel(outer)
