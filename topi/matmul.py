"""Matmul: compute with B packed into zero-padded panels, and a register-tiled schedule template.

C[..., i, j] = sum_k A[..., i, k] * B[..., k, j]. B is repacked as packedB[.., j // bn, k, j % bn] so the
micro-kernel streams one contiguous panel; the C tile (mr rows x bn columns) lives in vector registers
(cache_write + unroll + vectorize), as in OpenBLAS/BLIS kernels. Panels beyond N are zero, so any M, N,
K is correct; tails are guarded.

M, N and K may be symbolic (issue 23): a workload field is then a string "name~rep" (a symbol and the
representative size that heuristics decide at, e.g. "s0~256"; equal strings are one symbol), and `compute`
takes a binding of the names to te symbols. Every config of a symbolic space is valid at every size: the
tiles are fixed and the tails are split off by the schedule. With a symbolic K there are no K chunks.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from jitop import te
from jitop.dtypes import as_dtype
from jitop.schedule.schedule import Schedule, create_schedule
from jitop.target import Target
from jitop.te.expr import Expr, const, free_vars, substitute
from jitop.te.tensor import PlaceholderOp
from jitop.tuner import registry
from jitop.tuner.space import Config, ConfigSpace

Reader = Callable[[tuple[Expr, ...], Expr, Expr], Expr]  # (batch index, row, col) -> value
Size = int | str | Expr  # a dimension: a constant, a symbol "name~rep" (a workload field) or a te expression

REP = 256  # the representative size of a symbol that names none (issue 23's DEFAULT_REP)


def is_sym(v: Size) -> bool:
    """True for a symbolic size (a "name~rep" string or a te expression)."""
    return not isinstance(v, int)


def rep(v: Size) -> int:
    """The size a heuristic decides at: an int itself, the number after '~' of a "name~rep" string (REP without
    one), an expression with every symbol at REP.

    >>> rep(7), rep("s0~64"), rep("s1"), rep(te.var("n") + 1)
    (7, 64, 256, 257)
    """
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        return int(v.partition("~")[2] or REP)
    value = substitute(v, {s: const(REP) for s in free_vars(v)})
    return int(value.value)


def field_symbols(wl: Any, fields: tuple[str, ...]) -> tuple[str, ...]:
    """The names of the symbols ("name~rep") among a workload's `fields`, in field order, each once."""
    names = [d.partition("~")[0] for d in (getattr(wl, f) for f in fields) if isinstance(d, str)]
    return tuple(dict.fromkeys(names))


def bind_fields(wl: Any, fields: tuple[str, ...], binding: dict[str, Expr] | None, template: str) -> Any:
    """The workload with its symbolic ("name~rep") `fields` replaced by `binding[name]`; a ValueError naming
    the `template` and the unbound names if the binding lacks one."""
    names = field_symbols(wl, fields)
    missing = [n for n in names if binding is None or n not in binding]
    if missing:
        raise ValueError(f"{template} workload {wl} is symbolic: give a binding of {missing} to te symbols "
                         "(compute(..., binding={name: te.size_var(name)}))")
    if not names:
        return wl
    return dataclasses.replace(wl, **{f: binding[d.partition("~")[0]] for f in fields
                                      for d in [getattr(wl, f)] if isinstance(d, str)})


def symbols(wl: "MatmulWorkload") -> tuple[str, ...]:
    """The names of the workload's symbols, in field order (m, n, k), each once."""
    return field_symbols(wl, ("m", "n", "k"))


def bound(wl: "MatmulWorkload", binding: dict[str, Expr] | None) -> "MatmulWorkload":
    """The workload with its symbolic ("name~rep") fields replaced by `binding[name]`."""
    return bind_fields(wl, ("m", "n", "k"), binding, "matmul")


@dataclass(frozen=True)
class MatmulWorkload:
    """C[batch..., m, n] = A[a_batch..., m, k] @ B[b_batch..., k, n]; the batch dims broadcast as in numpy."""

    m: Size
    n: Size
    k: Size
    dtype: str = "float32"
    a_batch: tuple[int, ...] = ()
    b_batch: tuple[int, ...] = ()

    @property
    def batch(self) -> tuple[int, ...]:
        return tuple(np.broadcast_shapes(self.a_batch, self.b_batch))

    @property
    def itemsize(self) -> int:
        return as_dtype(self.dtype).itemsize

    @property
    def flops(self) -> int:
        return 2 * math.prod(self.batch) * rep(self.m) * rep(self.n) * rep(self.k)


@dataclass(frozen=True)
class MatmulConfig:
    """Typed view of a point of `config_space`: register tile rows (mr), panel width (bn, a multiple of
    the vector width), k unroll, and whether the panel loop is outermost (keeps a B panel in L2 and
    parallelises over panels) or the row-block loop is (parallel over row blocks)."""

    mr: int = 6
    bn: int = 64
    k_unroll: int = 4
    panel_outer: bool = True
    k_chunk: int = 0  # K rows per chunk (0: all of K in one)
    pack_b: bool = True  # copy B into contiguous panels first (pays off when several row blocks reread them)
    pack_per_panel: bool = False  # with panel_outer: pack each panel inside the parallel loop, just before
    #                               its row blocks use it (it stays in L2; no pass over all of B first)

    @staticmethod
    def from_config(cfg: Config) -> "MatmulConfig":
        return MatmulConfig(mr=cfg["tile_m"][-1], bn=cfg["tile_n"][-1], k_unroll=cfg["tile_k"][-1],
                            panel_outer=cfg["order"] == "panel_outer", k_chunk=cfg["k_chunk"],
                            pack_b=cfg["pack_b"] != "none", pack_per_panel=cfg["pack_b"] == "panel")

    def to_config(self, m: Size, n: Size, k: Size) -> Config:
        return Config.of(tile_m=_split(m, self.mr), tile_n=_split(n, self.bn), tile_k=_split(k, self.k_unroll),
                         order="panel_outer" if self.panel_outer else "row_outer", k_chunk=self.k_chunk,
                         pack_b="none" if not self.pack_b else "panel" if self.pack_per_panel else "root")


def _split(extent: Size, inner: int) -> tuple[int, int]:
    """A split's (outer, inner) factors; the outer of a symbolic extent is -1 ("ceil at run time", as TVM)."""
    return (-1 if is_sym(extent) else math.ceil(extent / inner), inner)


def _fits(extent: Size, size: int) -> bool:
    """`size <= extent` for a constant extent; every size fits a symbolic one (its tail is split off)."""
    return is_sym(extent) or size <= extent


def config_space(wl: MatmulWorkload, target: Target) -> ConfigSpace:
    """Every schedule the template can build for the workload (all are correct; with symbolic sizes, at
    every size)."""
    m, n, k, lanes = wl.m, wl.n, wl.k, target.lanes(wl.itemsize)
    space = ConfigSpace()
    # the register tile: mr rows x bn columns of C, at most 32 vector registers with A and B operands
    space.define_split("tile_m", m, candidates=[_split(m, r) for r in range(1, 13) if r == 1 or _fits(m, r)])
    space.define_split("tile_n", n, candidates=[_split(n, v * lanes) for v in _vector_counts(m)
                                               if v == 1 or _fits(n, (v - 1) * lanes + 1)])
    space.define_split("tile_k", k, candidates=[_split(k, u) for u in (1, 2, 4, 8) if u == 1 or _fits(k, u)])
    space.define_knob("order", ["panel_outer", "row_outer"])
    # K chunks (0: none): a chunk's B panel (chunk x bn) should stay in L2 while row blocks stream past;
    # none for a symbolic K (the chunks are a Python loop over K)
    space.define_knob("k_chunk", [0] + [c for c in (256, 512, 1024, 2048) if not is_sym(k) and c < k])
    space.define_knob("pack_b", ["root", "panel", "none"])
    return space


def _vector_counts(m: Size) -> tuple[int, ...]:
    """Register-tile widths in vectors; a single row (a vector-matrix product) streams B best in wide rows
    (a symbolic m is never 1: sizes 0 and 1 stay constants)."""
    return (1, 2, 3, 4, 8, 16) if isinstance(m, int) and m == 1 else (1, 2, 3, 4)


GEMV_CHUNK = 256  # K rows per chunk of a one-row product's default config (see default_config)
GEMV_CHUNK_BYTES = 512 << 10  # ... for a B whose chunks hold at least this much
GEMV_SPLIT_BYTES = 1 << 20  # a one-row product's B split into a panel per thread from this size (default_tile)


def default_config(wl: MatmulWorkload, target: Target) -> Config:
    """A fast point of the space from the shape and the Target (see `default_tile`), decided at the
    representative size of a symbolic dim (at least 2: a symbol is never 1)."""
    m, n, k = (max(2, rep(d)) if is_sym(d) else d for d in (wl.m, wl.n, wl.k))
    tile = default_tile(m, n, k, wl.itemsize, target)
    if wl.m == 1 and not is_sym(wl.k) and k > GEMV_CHUNK and k * n * wl.itemsize > 2 * target.l2_bytes and \
            GEMV_CHUNK * n * wl.itemsize >= GEMV_CHUNK_BYTES:
        # one row against a B beyond the L2 caches (a decode step's weights): B streamed in K chunks of 256
        # rows, k unrolled by 2, measured 1.2-1.7x faster here (768x2304..3072 and 3072x768 float32, 2 threads;
        # neutral or slower for a B that fits in cache). Not for a narrow B (attention's weights times a
        # 128-wide value cache): its chunks are too little work per parallel launch (1.4x slower, 8192 x 128)
        tile = dataclasses.replace(tile, k_chunk=GEMV_CHUNK, k_unroll=2)
    return tile.to_config(wl.m, wl.n, wl.k)


def default_tile(m: int, n: int, k: int, itemsize: int, target: Target) -> MatmulConfig:
    """The widest register tile that fits the Target's vector registers with its operands (AVX-512, 32
    registers: 6 rows x 4 vectors = 24 accumulators; AVX2, 16: 6 x 2 = 12), k unrolled by 4, and the panel
    loop outermost when there are enough panels to keep every thread busy."""
    lanes = target.lanes(itemsize)
    # a single row streams B in wide rows: up to half the registers as accumulators
    widest = min(16, target.vector_registers // 2) if m == 1 else 4 if target.vector_registers >= 32 else 2
    # powers of two only: LLVM splits a 3-register vector badly (a 48-lane tile runs 10x slower)
    vectors = max(v for v in _vector_counts(m) if v <= widest and v & (v - 1) == 0 and (v == 1 or (v - 1) * lanes < n))
    if m == 1 and k * n * itemsize >= GEMV_SPLIT_BYTES:
        # a single row is parallel over panels only: a panel per thread where 2 vectors or more still make one
        # (16 lanes, 2 threads: a 128-wide B as two 64-wide panels, 1.2-1.6x faster than one 128-wide panel;
        # a 64-wide as two 32-wide, 1.07x); a smaller B is read faster than a parallel launch costs
        split = [v for v in (16, 8, 4, 2) if v <= vectors and math.ceil(n / (v * lanes)) >= target.threads]
        vectors = split[0] if split else vectors
    bn = vectors * lanes
    mr = max(1, min(6 if vectors >= 4 else 8, m, (target.vector_registers - vectors - 2) // vectors))
    panels = math.ceil(n / bn)
    row_blocks = math.ceil(m / mr)
    # few row blocks: parallel over panels; B read in place (packing would copy it for at most two reads)
    panel_outer = panels >= 4 * target.threads or row_blocks < 2 * target.threads
    pack_b = row_blocks > 2
    # each panel packed inside the parallel loop right before its row blocks use it: it is still in L2
    # then, which measured better than K chunks sized to L2 (k_chunk, left to tuning)
    return MatmulConfig(mr=mr, bn=bn, k_unroll=4 if k >= 4 else 2 if k >= 2 else 1, panel_outer=panel_outer,
                        pack_b=pack_b, pack_per_panel=pack_b and panel_outer)


@dataclass(frozen=True)
class Part:
    """One K chunk: its product `core` (panel-wide when n is not a multiple of bn), its packed B, and
    `acc`, the result through this chunk (previous acc + core; core's first n columns for the first)."""

    core: te.Tensor
    packed: te.Tensor | None
    acc: te.Tensor


@dataclass(frozen=True)
class MatmulTensors:
    """C = A @ B as stages: `out` (the last part's acc) and the parts, one per K chunk."""

    out: te.Tensor
    parts: tuple[Part, ...]


def compute(wl: MatmulWorkload, config: Config, target: Target, readers: tuple[Reader, Reader],
            name: str = "matmul", binding: dict[str, Expr] | None = None,
            packed: Sequence[te.Tensor] = ()) -> MatmulTensors:
    """The template's stages. readers = (read_a(a_batch_idx, i, r), read_b(b_batch_idx, r, j)), each given
    its own operand's batch index. A symbolic workload needs `binding` ({name: te symbol}); m, n, k may also
    be te expressions themselves. packed: B's panels as `prepack` made them (kernel inputs), one per K chunk."""
    read_a, read_b = readers
    wl = bound(wl, binding)
    batch = wl.batch
    return matmul(lambda bi, i, r: read_a(te.broadcast_index(wl.a_batch, batch, bi), i, r), read_b, batch, wl.m, wl.n,
                  wl.k, wl.dtype, MatmulConfig.from_config(config), name=name, b_batch=wl.b_batch,
                  b_index=lambda bi: te.broadcast_index(wl.b_batch, batch, bi), prepacked=packed)


def prepack(wl: MatmulWorkload, config: Config, target: Target, b: np.ndarray) -> list[np.ndarray]:
    """B's packed panels, b_batch + [panels, k chunk, bn] (zero past n) per K chunk, from a constant B
    ([] when B is read in place or a size is symbolic)."""
    cfg = MatmulConfig.from_config(config)
    if not cfg.pack_b or is_sym(wl.n) or is_sym(wl.k):
        return []
    bn = cfg.bn
    panels = math.ceil(wl.n / bn)
    padded = np.zeros(b.shape[:-1] + (panels * bn,), b.dtype)
    padded[..., :wl.n] = b
    lead = b.ndim - 2
    out = []
    for k0, width in _chunks(wl.k, cfg):
        part = padded[..., k0:k0 + width, :].reshape(b.shape[:-2] + (width, panels, bn))
        out.append(np.ascontiguousarray(np.moveaxis(part, lead + 1, lead)))
    return out


def _chunks(k: Size, cfg: MatmulConfig) -> list[tuple[Any, Any]]:
    """(first row, rows) of B per K chunk: chunks whose panels fit in L2 (cfg.k_chunk); a symbolic k is one."""
    if is_sym(k):
        return [(0, k)]
    chunk = cfg.k_chunk if 0 < cfg.k_chunk < k else max(k, 1)
    return [(k0, min(chunk, k - k0)) for k0 in range(0, max(k, 1), chunk)]


def schedule(s: Schedule, t: MatmulTensors, wl: MatmulWorkload, config: Config, target: Target,
             epilogue: te.Tensor | None = None) -> None:
    """Apply `config` to the stages from `compute` (see `schedule_tile`)."""
    schedule_tile(s, t, MatmulConfig.from_config(config), target, epilogue)


def operand_reads(wl: MatmulWorkload, config: Config, target: Target) -> tuple[int, int]:
    """How many times the schedule evaluates each element of A and of B: A is streamed once per panel of
    C's columns (and per C matrix it is broadcast to); B once if packed, else once per row block.

    >>> wl = MatmulWorkload(128, 2304, 768)
    >>> operand_reads(wl, MatmulConfig(mr=6, bn=64).to_config(128, 2304, 768), Target.from_string("haswell"))
    (36, 1)
    """
    cfg = MatmulConfig.from_config(config)
    batch = math.prod(wl.batch)
    a = math.ceil(rep(wl.n) / cfg.bn) * batch // max(1, math.prod(wl.a_batch))
    b = 1 if cfg.pack_b else math.ceil(rep(wl.m) / cfg.mr) * batch // max(1, math.prod(wl.b_batch))
    return max(a, 1), max(b, 1)


def build(wl: MatmulWorkload, config: Config, target: Target,
          prepacked: bool = False) -> tuple[Schedule, list[te.Tensor]]:
    """Standalone: placeholders A, B and the scheduled product C (a symbolic workload gets one te.size_var per
    symbol, named as in the workload: one kernel for every size). prepacked: B's panels as `prepack` makes
    them take B's place among the inputs (as a graph with a constant B runs it), where the config packs B."""
    binding = {name: te.size_var(name) for name in symbols(wl)}
    bwl = bound(wl, binding)
    A = te.placeholder(wl.a_batch + (bwl.m, bwl.k), wl.dtype, name="A")
    B = te.placeholder(wl.b_batch + (bwl.k, bwl.n), wl.dtype, name="B")
    packed = packed_inputs(prepack, wl, config, target, B.shape) if prepacked else []
    t = compute(bwl, config, target, (lambda bi, i, r: A[bi + (i, r)], lambda bi, r, j: B[bi + (r, j)]), packed=packed)
    s = create_schedule(t.out.op)
    schedule(s, t, wl, config, target)
    return s, [A, *(packed or [B]), t.out]


def packed_inputs(prepack_fn: Callable, wl: Any, config: Config, target: Target, shape: tuple) -> list[te.Tensor]:
    """Placeholders shaped as `prepack_fn` packs a constant operand of `shape` for this config ([] where the
    config reads that operand in place, or its shape is symbolic: nothing is prepacked then)."""
    if not all(isinstance(d, int) for d in shape):
        return []
    arrays = prepack_fn(wl, config, target, np.zeros(shape, as_dtype(wl.dtype).np))
    return [te.placeholder(a.shape, wl.dtype, name=f"packed{k}") for k, a in enumerate(arrays)]


def matmul(a: Reader, b: Reader, batch: tuple[int, ...], m: Size, n: Size, k: Size, dtype, cfg: MatmulConfig,
           name: str = "matmul", b_batch: tuple[int, ...] | None = None,
           b_index: Callable[[tuple[Expr, ...]], tuple[Expr, ...]] | None = None,
           prepacked: Sequence[te.Tensor] = ()) -> MatmulTensors:
    """C = A @ B, reading A and B through `a(batch_idx, i, k)` / `b(batch_idx, k, j)`.

    B is packed in zero-padded panels of bn columns. B may have fewer batch dimensions than C (`b_batch`,
    with `b_index` mapping C's batch index to B's): it is packed once per B matrix, not once per C matrix.
    With cfg.k_chunk < k, K is cut into chunks whose B panels fit in L2; each chunk's product is added
    to the previous ones in its register tile's epilogue. m, n and k may be te expressions of symbols; a
    symbolic k is one chunk.
    """
    b_batch = batch if b_batch is None else b_batch
    b_index = b_index or (lambda bi: bi)
    chunks = _chunks(k, cfg)
    parts: list[Part] = []
    for t, (k0, width) in enumerate(chunks):
        suffix = f"_k{t}" if len(chunks) > 1 else ""
        core, packed = _chunk(a, b, batch, b_batch, b_index, m, n, k0, width, dtype, cfg, f"{name}{suffix}",
                              prepacked[t] if prepacked else None)
        if not parts:
            acc = core if _same(core.shape[-1], n) else \
                te.compute(batch + (m, n), lambda *idx, core=core: core[idx], name=f"{name}{suffix}_cols")
        else:
            prev = parts[-1].acc
            acc = te.compute(batch + (m, n), lambda *idx, prev=prev, core=core: prev[idx] + core[idx],
                             name=f"{name}{suffix}_acc")
        parts.append(Part(core, packed, acc))
    return MatmulTensors(parts[-1].acc, tuple(parts))


def _same(a: Size, b: Size) -> bool:
    """Two dimensions are equal (interned expressions: the same object)."""
    return a == b if isinstance(a, int) and isinstance(b, int) else a is b


def _chunk(a: Reader, b: Reader, batch: tuple[int, ...], b_batch: tuple[int, ...], b_index: Callable, m: Size,
           n: Size, k0: int, k: Size, dtype, cfg: MatmulConfig, name: str,
           prepacked: te.Tensor | None = None) -> tuple[te.Tensor, te.Tensor]:
    """(product over rows k0 .. k0 + k of B, its packed panels or None; `prepacked`: those panels as an input)."""
    bn = cfg.bn
    panels = (n + (bn - 1)) // bn if is_sym(n) else math.ceil(n / bn)
    ragged = is_sym(n) or n % bn  # the last panel may be partly beyond n (always possible for a symbolic n)
    if not cfg.pack_b:  # the register tile reads rows of B in place; the last panel's lanes are masked
        r = te.reduce_axis((0, k), "k")
        return te.compute(batch + (m, n), lambda *idx: te.sum(
            a(idx[:-2], idx[-2], r.var + k0) * b(b_index(idx[:-2]), r.var + k0, idx[-1]), axis=r), name=name), None

    def pack(*idx: Expr) -> Expr:
        bi, x, y, z = idx[:-3], idx[-3], idx[-2], idx[-1]
        col = x * bn + z
        return te.if_then_else(col < n, b(bi, y + k0, col), te.const(0, dtype)) if ragged else b(bi, y + k0, col)
    packed = prepacked if prepacked is not None else te.compute(b_batch + (panels, k, bn), pack, name=f"{name}_packedB")
    r = te.reduce_axis((0, k), "k")

    def body(*idx: Expr) -> Expr:
        bi, i, j = idx[:-2], idx[-2], idx[-1]
        return te.sum(a(bi, i, r.var + k0) * packed[b_index(bi) + (j // bn, r.var, j % bn)], axis=r)
    # as wide as the panels, so the last panel's register tile is whole too (no masked lanes, no odd-width
    # vectors); the first n columns are used
    return te.compute(batch + (m, panels * bn), body, name=f"{name}_full" if ragged else name), packed


def schedule_tile(s: Schedule, t: MatmulTensors, cfg: MatmulConfig, target: Target,
                  epilogue: te.Tensor | None = None, view_rows: bool = False) -> None:
    """Register-tiled schedule: each chunk's C tile in registers, packing and the outer loop parallel.

    With `epilogue` (an elementwise consumer of C of the same shape, e.g. bias + activation), the
    epilogue is computed straight from the register tile: C never goes to memory. The epilogue may view
    C's last axis as several (an NCHW convolution's output rows x columns), or with `view_rows` C's rows
    (an NHWC convolution's pixels): they are fused back into one.
    """
    flops = _flops(t)
    serial = flops is not None and flops < SERIAL_FLOPS  # a symbolic product: the kernel decides at run time
    for k, part in enumerate(t.parts):
        last = k == len(t.parts) - 1
        cache = s.cache_write(part.core, "local")
        dest = epilogue if last and epilogue is not None else part.acc
        if part.acc is not part.core and dest is not part.acc:
            s[part.acc].compute_inline()
        if part.core is not dest:
            s[part.core].compute_inline()
        outer = _tile(s, s[dest], s[cache], t.out.ndim, cfg, target.threads, serial, view_rows)
        if part.packed is None or isinstance(part.packed.op, PlaceholderOp):  # in place, or prepacked
            continue
        if serial:
            s[part.packed].vectorize(s[part.packed].op.axis[-1])
            continue
        if cfg.pack_per_panel and cfg.panel_outer and outer is not None:
            s[part.packed].compute_at(s[dest], outer)
            s[part.packed].vectorize(s[part.packed].op.axis[-1])
        else:
            _schedule_pack(s, part.packed, target.threads)


SERIAL_FLOPS = 1 << 20  # below this a product runs on one thread: waking another costs more than it saves


def _flops(t: MatmulTensors) -> int | None:
    """The product's flops; None when they depend on a symbol."""
    dims = (*t.out.shape, *(p.core.op.reduce_axis[0].extent for p in t.parts))
    if any(is_sym(d) for d in dims):
        return None
    k = sum(p.core.op.reduce_axis[0].extent for p in t.parts)
    return 2 * math.prod(t.out.shape) * k


def _tile(s: Schedule, stage, cs, ndim: int, cfg: MatmulConfig, threads: int, serial: bool = False,
          view_rows: bool = False):
    """Tile `stage` around the register tile `cs`; returns the parallel loop if it holds one panel per
    iteration (where a panel can be packed), else None. A stage with more axes than C views C's last axis
    as several (or with `view_rows` its rows): they are fused back into one."""
    axes = list(stage.op.axis)
    extra = len(axes) - ndim
    if extra > 0 and view_rows:
        axes = axes[:ndim - 2] + [stage.fuse(*axes[ndim - 2:ndim - 1 + extra])] + axes[-1:]
    elif extra > 0:
        axes = axes[:ndim - 1] + [stage.fuse(*axes[ndim - 1:])]
    *batch, i, j = axes
    io, jo, ii, ji = stage.tile(i, j, cfg.mr, cfg.bn)
    if cfg.panel_outer:
        stage.reorder(*batch, jo, io, ii, ji)
    stage.vectorize(ji)
    cs.compute_at(stage, io if cfg.panel_outer else jo)
    *_, xc, yc = cs.op.axis
    (kk,) = cs.op.reduce_axis
    ko, ki = cs.split(kk, factor=cfg.k_unroll)
    cs.reorder(ko, ki, xc, yc)
    cs.unroll(ki)
    cs.unroll(xc)
    cs.vectorize(yc)
    outer = jo if cfg.panel_outer else io
    if serial:
        return None
    extent, tile = (j.extent, cfg.bn) if cfg.panel_outer else (i.extent, cfg.mr)
    if batch and (is_sym(extent) or extent % tile) and rep(math.prod(b.extent for b in batch)) >= 2 * threads:
        # a tail tile in a loop fused with the batch would test its guards at run time in the hot loop;
        # kept apart, its tail is split off (loop partitioning) and the batch alone is parallel
        stage.parallel(stage.fuse(*batch) if len(batch) > 1 else batch[0])
        return None
    if batch and is_sym(outer.extent):
        # fused with the batch, a symbolic extent would be divided by to index (checked at run time): the
        # outer loop alone is parallel, inside the batch
        stage.parallel(outer)
        return outer
    outer = stage.fuse(*batch, outer) if batch else outer
    stage.parallel(outer)
    return outer


def _schedule_pack(s: Schedule, packed: te.Tensor, threads: int) -> None:
    ps = s[packed]
    *pb, px, pk, pz = ps.op.axis
    ps.vectorize(pz)
    if pb and is_sym(px.extent):
        # fused with the batch, a symbolic panel count would be divided by to index (checked at run time):
        # the panels alone are parallel, outermost
        ps.reorder(px, *pb, pk, pz)
        ps.parallel(px)
        return
    outer = ps.fuse(*pb, px) if pb else px
    if rep(outer.extent) < 2 * threads:  # few panels: parallel over k as well (decided at rep if symbolic)
        if is_sym(pk.extent):
            # a loop fused with a symbolic k would divide by k to index (checked at run time): k alone is
            # parallel then, outside the panels, with the batch (if any) inside
            ps.reorder(pk, *pb, px, pz)
            ps.parallel(pk)
            return
        outer = ps.fuse(outer, pk)
    ps.parallel(outer)


TEMPLATE = registry.register(registry.Template("matmul", MatmulWorkload, config_space, default_config, compute,
                                               schedule, build, operand_reads, kind_fields=("dtype",),
                                               prepack=prepack))
