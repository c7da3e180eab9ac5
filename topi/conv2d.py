"""2-D convolution: padded channels-last input, packed weights, and a register-tiled direct schedule.

out[n, oc, oh, ow] = sum_{r, s, i} P[n, oh*sh + r*dh, ow*sw + s*dw, g*ICg + i] * W[oc // bn, r, s, i, oc % bn]

P is the input, zero-padded and channels-last (one pass over the input); W holds the weights of bn
output channels contiguously per (r, s, i) (zero beyond OC). The register tile is mr output columns x bn
output channels: per reduction step, mr scalars of P are broadcast and multiplied with bn/lanes vectors
of W into mr x bn/lanes accumulators that never leave vector registers, as in TVM's x86 NCHW[x]c
schedule. The output is written in the requested layout (NCHW: channel lanes are scattered; NHWC:
contiguous), so there is no layout pass afterwards, and an epilogue (bias, residual, activation) is
computed straight from the tile.

The batch and the spatial size (n, h, w) may be symbolic (issue 23): a workload field is then a string
"name~rep" (a symbol and the representative size heuristics decide at; equal strings are one symbol), and
`compute` takes a binding of the names to te symbols; the output size is the expression
(h + pads - d*(k-1) - 1) // s + 1. Channels and kernel sizes stay constants. Every config of a symbolic
space is valid at every size: the register tile is fixed and the row tail is split off by the schedule.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from jitop import te
from jitop.dtypes import as_dtype
from jitop.schedule.schedule import Schedule, create_schedule
from jitop.target import Target
from jitop.te.expr import Expr, free_vars
from jitop.te.tensor import PlaceholderOp
from jitop.tir.simplify import SYMBOL_MAX, prove, simplify
from jitop.topi import matmul as topi_matmul
from jitop.topi.matmul import Size, bind_fields, field_symbols, is_sym, rep
from jitop.tuner import registry
from jitop.tuner.space import Config, ConfigSpace

Reader = Callable[[Expr, Expr, Expr, Expr], Expr]
MAX_MR = 16  # widest register tile along the output row
GEMM_MR = 12  # the gemm algorithm's register tile rows are output channels: up to 12 whatever the width
MAX_DEPTHWISE_VECTORS = 4  # the depthwise algorithm's register tile: up to 4 vectors of one output row
# the NHWC depthwise tile's output pixels: each is kh*kw unrolled taps per vector of channels, so 14 pixels
# (the dense tile's width) made MobileNet-V2's first call 2x slower to compile, for no speed (memory bound)
NHWC_DEPTHWISE_PIXELS = 4
IN_KERNEL_READS = 4  # how many reads an operand read in place by the micro-kernel counts as, at least


@dataclass(frozen=True)
class Conv2dWorkload:
    """The static description of one convolution (what a config is chosen for)."""

    n: Size  # a constant, a symbol "name~rep" or (bound, see `bound`) a te expression
    c: int
    h: Size
    w: Size
    oc: int
    kh: int
    kw: int
    stride: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, bottom, left, right
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    layout: str = "NCHW"
    dtype: str = "float32"

    @property
    def itemsize(self) -> int:
        return as_dtype(self.dtype).itemsize

    @property
    def icg(self) -> int:
        return self.c // self.groups

    @property
    def ocg(self) -> int:
        return self.oc // self.groups

    @property
    def depthwise(self) -> bool:
        """Each output channel reads one input channel: a kind of its own (a tuned config transfers only
        between depthwise convolutions, or only between the others)."""
        return self.groups > 1 and self.icg == 1

    @property
    def oh(self) -> Size:
        """The output height: an int, or a te expression of a bound workload (a "name~rep" h has none)."""
        return _simplified((_dim(self.h, "h") + self.pads[0] + self.pads[1] - self.dilation[0] * (self.kh - 1) - 1)
                           // self.stride[0] + 1)

    @property
    def ow(self) -> Size:
        return _simplified((_dim(self.w, "w") + self.pads[2] + self.pads[3] - self.dilation[1] * (self.kw - 1) - 1)
                           // self.stride[1] + 1)

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.oc, self.oh, self.ow) if self.layout == "NCHW" else (self.n, self.oh, self.ow, self.oc)

    @property
    def flops(self) -> int:
        """At the representative size of a symbolic dim."""
        wl = at_rep(self)
        return 2 * wl.n * wl.oc * wl.oh * wl.ow * wl.icg * wl.kh * wl.kw


def _dim(d: Size, field: str) -> int | Expr:
    if isinstance(d, str):
        raise TypeError(f"conv2d workload field {field}={d!r} is a symbol: bind it first (bound(wl, binding)), "
                        "or decide at at_rep(wl)")
    return d


def _symbols_range(e: Expr) -> dict[Expr, tuple[int, int]]:
    return {v: (0, SYMBOL_MAX) for v in free_vars(e)}


def _simplified(d: int | Expr) -> int | Expr:
    """A symbolic size in canonical form (equal sizes are one interned expression); an int itself."""
    return d if isinstance(d, int) else simplify(d, _symbols_range(d))


def symbols(wl: Conv2dWorkload) -> tuple[str, ...]:
    """The names of the workload's symbols, in field order (n, h, w), each once."""
    return field_symbols(wl, ("n", "h", "w"))


def bound(wl: Conv2dWorkload, binding: dict[str, Expr] | None) -> Conv2dWorkload:
    """The workload with its symbolic ("name~rep") fields replaced by `binding[name]`."""
    return bind_fields(wl, ("n", "h", "w"), binding, "conv2d")


def at_rep(wl: Conv2dWorkload) -> Conv2dWorkload:
    """The workload at the representative sizes of its symbols (at least 2: a symbol is never 0 or 1), what
    heuristics decide at; a concrete workload itself."""
    fields = {f: max(2, rep(d)) for f in ("n", "h", "w") for d in [getattr(wl, f)] if is_sym(d)}
    return dataclasses.replace(wl, **fields) if fields else wl


def _maybe(cond: bool | Expr) -> bool:
    """`cond` may hold: itself for constant sizes; with symbols, unless proven false at every size."""
    if not isinstance(cond, Expr):
        return bool(cond)
    return prove(cond, _symbols_range(cond)) is not False


@dataclass(frozen=True)
class Conv2dConfig:
    """Typed view of a point of `config_space`."""

    mr: int = 7                 # output columns in the register tile
    bn: int = 64                # output channels in the register tile (a multiple of the vector width)
    ic_unroll: int = 4          # input channels per unrolled reduction step
    oc_outer: bool = True       # channel panels outside output rows (a weight panel stays in cache)
    pack_per_panel: bool = False  # pack each weight panel inside the parallel loop, not all up front
    algorithm: str = "direct"   # "gemm": weights as A of a matmul with the im2col'd input as packed B;
    #                             "depthwise": one input channel per output channel, vectors along the row
    channels_outer: bool = False  # reduction order: input-channel blocks outside the kernel taps

    @staticmethod
    def from_config(cfg: Config) -> "Conv2dConfig":
        return Conv2dConfig(mr=cfg["tile_ow"][-1], bn=cfg["tile_oc"][-1], ic_unroll=cfg["tile_ic"][-1],
                            oc_outer=cfg["order"] == "oc_outer", pack_per_panel=cfg["pack"] == "panel",
                            algorithm=cfg["algorithm"], channels_outer=cfg["reduction"] == "channels_outer")

    def to_config(self, wl: Conv2dWorkload) -> Config:
        # the outer factor of a symbolic width is -1 ("ceil at run time", as TVM)
        ow = -1 if is_sym(wl.w) else math.ceil(wl.ow / self.mr)
        return Config.of(tile_ow=(ow, self.mr), tile_oc=(math.ceil(wl.oc / self.bn), self.bn),
                         tile_ic=(wl.icg // self.ic_unroll, self.ic_unroll),
                         order="oc_outer" if self.oc_outer else "rows_outer",
                         pack="panel" if self.pack_per_panel else "root", algorithm=self.algorithm,
                         reduction="channels_outer" if self.channels_outer else "taps_outer")


def config_space(wl: Conv2dWorkload, target: Target) -> ConfigSpace:
    """Every schedule the template can build for this workload (all are correct).

    With algorithm "gemm" the knobs describe the matmul instead: tile_ow's inner factor is its register
    tile's rows (output channels), tile_oc's its columns (output pixels), tile_ic's the k unroll; order
    "rows_outer" puts the pixel panels outermost (matmul's panel_outer), pack "panel" packs each panel
    inside the parallel loop. The reduction knob has no effect there.

    With a symbolic width, tile_ow is (-1, r) for r up to MAX_MR (depthwise: MAX_DEPTHWISE_VECTORS vectors):
    valid at every width (the tail is split off)."""
    lanes = target.lanes(wl.itemsize)
    space = ConfigSpace()
    if is_sym(wl.w):
        widest = max(MAX_MR, MAX_DEPTHWISE_VECTORS * lanes if row_vectors(wl) else 0)
        space.define_split("tile_ow", wl.w, candidates=[(-1, r) for r in range(1, widest + 1)])
    else:
        rows = max(min(wl.ow, MAX_MR), GEMM_MR if gemm_applies(wl) else 0,
                   min(wl.ow, MAX_DEPTHWISE_VECTORS * lanes) if row_vectors(wl) else 0)
        space.define_split("tile_ow", wl.ow, candidates=[(math.ceil(wl.ow / r), r) for r in range(1, rows + 1)])
    space.define_split("tile_oc", wl.oc, candidates=[(math.ceil(wl.oc / (v * lanes)), v * lanes) for v in (1, 2, 3, 4)
                                                    if v == 1 or (v - 1) * lanes < wl.oc])
    space.define_split("tile_ic", wl.icg, candidates=[(wl.icg // u, u) for u in range(1, max(1, min(wl.icg, 8)) + 1)
                                                     if wl.icg % u == 0])  # icg == 0 (no input channels): (0, 1)
    space.define_knob("order", ["oc_outer", "rows_outer"])
    space.define_knob("pack", ["root", "panel"])
    space.define_knob("reduction", ["taps_outer", "channels_outer"])
    space.define_knob("algorithm", ["direct"] + ["gemm"] * gemm_applies(wl) + ["depthwise"] * depthwise_applies(wl))
    return space


def gemm_applies(wl: Conv2dWorkload) -> bool:
    """The gemm formulation, one group: in NCHW, OIHW weights are the matmul's rows and the im2col'd input its
    columns (NCHW output rows); in NHWC, for an unpadded 1x1 convolution, the input pixels (channels-last rows)
    are the rows and the transposed weights the columns (NHWC output rows): a plain matmul, no im2col."""
    return wl.groups == 1 and (wl.layout == "NCHW" or pixel_rows(wl))


def pixel_rows(wl: Conv2dWorkload) -> bool:
    """An NHWC pointwise convolution without padding: out[n, pixel, :] = in[n, strided pixel, :] @ W.T."""
    return wl.layout == "NHWC" and wl.kh == wl.kw == 1 and not any(wl.pads)


def depthwise_applies(wl: Conv2dWorkload) -> bool:
    """Each output channel reads one input channel (MobileNet's 3x3 convolutions): in NCHW the rows of a
    channel plane are the vectors; in NHWC, with one output channel per input channel, the channels are."""
    return wl.depthwise and (wl.layout == "NCHW" or wl.ocg == 1)


def row_vectors(wl: Conv2dWorkload) -> bool:
    """The depthwise algorithm vectorizes along output rows (NCHW): its tile may be several vectors wide."""
    return depthwise_applies(wl) and wl.layout == "NCHW"


def default_config(wl: Conv2dWorkload, target: Target) -> Config:
    """A fast point of the space for the Target (see `default_tile`; "gemm" takes the matmul template's
    default register tile for (OC, OH*OW, C*KH*KW), clamped to the space). Decided at the representative
    size of a symbolic dim (`at_rep`)."""
    symbolic, wl = wl, at_rep(wl)
    cfg = default_tile(wl, target)
    if cfg.algorithm == "gemm":
        mm = topi_matmul.default_tile(*_gemm_shape(wl), wl.itemsize, target)
        space = config_space(symbolic, target)
        lanes = target.lanes(wl.itemsize)
        whole = [lanes, 2 * lanes, 4 * lanes]  # 1, 2 or 4 vectors: a 3-vector tile of 40 channels ran at 0.1x
        cfg = dataclasses.replace(cfg, mr=_nearest(space, "tile_ow", mm.mr),
                                  bn=_nearest(space, "tile_oc", mm.bn, among=whole),
                                  ic_unroll=_nearest(space, "tile_ic", mm.k_unroll), oc_outer=not mm.panel_outer,
                                  pack_per_panel=mm.pack_per_panel)
    return cfg.to_config(symbolic)


def _nearest(space: ConfigSpace, knob: str, value: int, among: list[int] | None = None) -> int:
    """The candidate inner factor of a split knob closest to `value` (not above it when possible), of those
    in `among` if any of them is a candidate."""
    inner = [c[-1] for c in next(k for k in space.knobs if k.name == knob).candidates]
    if among and any(f in among for f in inner):
        inner = [f for f in inner if f in among]
    below = [f for f in inner if f <= value]
    return max(below) if below else min(inner)


def default_tile(wl: Conv2dWorkload, target: Target) -> Conv2dConfig:
    """A fast point of the space from the workload and the CPU.

    The register tile (mr columns x v vectors of channels) must fit the vector registers with its operands
    (mr*v accumulators + v weight vectors + 1 broadcast: spilling one costs a third of the speed), load
    few operands per FMA (mr*v / (mr + v) >= 1.5 keeps the FMA pipes the bottleneck), and waste little on
    the output width and channels. With groups, v*lanes divides the channels of a group, so the broadcast
    input channel is the same across the tile. A symbolic workload is decided at `at_rep(wl)`.
    """
    wl = at_rep(wl)
    lanes = target.lanes(wl.itemsize)
    per_group = wl.oc if wl.groups == 1 or wl.icg == 1 and wl.ocg == 1 else wl.ocg
    grouped = wl.groups > 1 and per_group != wl.oc
    # powers of two only: LLVM splits a 3-register vector badly (a 3-vector NHWC tile ran at a third of the
    # speed of a 2-vector one on AVX2)
    choices = [(mr, v) for v in (1, 2, 4) for mr in range(1, min(wl.ow, MAX_MR) + 1)
               if _fits_registers(mr, v, target) and (v - 1) * lanes < per_group
               and (not grouped or per_group % (v * lanes) == 0 or v == 1)]

    def score(choice: tuple[int, int]) -> tuple[float, int]:
        mr, v = choice
        used = wl.ow / (math.ceil(wl.ow / mr) * mr) * wl.oc / (math.ceil(wl.oc / (v * lanes)) * v * lanes)
        reuse = min(mr * v / (mr + v), 1.5) / 1.5
        return used * reuse * mr / (mr + 1.5), mr * v
    mr, vectors = max(choices, key=score)
    bn = vectors * lanes
    if depthwise_applies(wl):
        # memory bound: read the input once, in place, instead of copying it padded and channels-last first
        # (MobileNet-V2's 3x3 depthwise layers ran 2-4x faster so, AVX-512); NHWC: mr pixels x bn channels
        width = _depthwise_width(wl.ow, lanes) if row_vectors(wl) else min(mr, NHWC_DEPTHWISE_PIXELS)
        return Conv2dConfig(mr=width, bn=bn, ic_unroll=1, algorithm="depthwise")
    unroll = max(u for u in range(1, max(1, min(wl.icg, 4)) + 1) if wl.icg % u == 0)
    panels = math.ceil(wl.oc / bn)
    # gemm packs the im2col'd input (K x OH*OW) instead of the weights (OC x K): worth it when OC >> OH*OW, and
    # for every 1x1 convolution, a plain matmul there (ResNet-50 / MobileNet 1x1 shapes ran 1.1-2.5x faster as
    # gemm than direct on AVX-512 and 1.2-1.9x on AVX2)
    pointwise = wl.kh == 1 and wl.kw == 1
    # and when the register tile's channels do not divide the output channels: direct's partial last tile
    # ran at 20-99 GFLOP/s where gemm (vectors along the output pixels) ran 1.5-8x faster (AVX-512)
    ragged = wl.oc % bn != 0
    # (an NHWC pointwise convolution is a plain matmul: 1.3-1.8x faster than direct at ResNet-50's 1x1 shapes)
    algorithm = "gemm" if gemm_applies(wl) and (pointwise or ragged or wl.oc > 2 * wl.oh * wl.ow) else "direct"
    return Conv2dConfig(mr=mr, bn=bn, ic_unroll=unroll, oc_outer=True,
                        pack_per_panel=panels >= 4 * target.threads and wl.n == 1, algorithm=algorithm)


def _depthwise_width(ow: int, lanes: int) -> int:
    """The depthwise tile's output columns: the whole row when it is at most MAX_DEPTHWISE_VECTORS vectors,
    else a width in whole vectors (up to that many) that is cheapest counting each tile as its lanes and one
    vector more for its overhead (a 112-wide row: 2 tiles of 64, which ran 1.5x faster than 7 of 16)."""
    if ow <= MAX_DEPTHWISE_VECTORS * lanes:
        return ow
    widths = range(lanes, MAX_DEPTHWISE_VECTORS * lanes + 1, lanes)
    return min(widths, key=lambda w: (math.ceil(ow / w) * (w + lanes), -w))


def _inside_input(wl: Conv2dWorkload, y: Expr, x: Expr) -> list[Expr]:
    """The conditions that input row y and column x (unpadded coordinates) are inside the input, only those
    some output reaches past (a side without padding that the kernel never overruns needs none)."""
    (sh, sw), (dh, dw), (top, _, left, _) = wl.stride, wl.dilation, wl.pads
    y_end, x_end = (wl.oh - 1) * sh + (wl.kh - 1) * dh - top, (wl.ow - 1) * sw + (wl.kw - 1) * dw - left
    return [c for c, needed in ((y >= 0, top > 0), (y < wl.h, y_end >= wl.h), (x >= 0, left > 0),
                                (x < wl.w, x_end >= wl.w)) if _maybe(needed)]


def _where_all(conditions: list[Expr], value: Expr, zero: Expr) -> Expr:
    """value where every condition holds (read only there: padding never touches memory), else zero."""
    if not conditions:
        return value
    cond = conditions[0]
    for extra in conditions[1:]:
        cond = cond & extra
    return te.if_then_else(cond, value, zero)


def compute(wl: Conv2dWorkload, config: Config, target: Target, readers: tuple[Reader, Reader],
            name: str = "conv2d", binding: dict[str, Expr] | None = None,
            packed: Sequence[te.Tensor] = ()) -> "ConvTensors | GemmConv":
    """The template's stages. readers = (read_input(n, c, y, x), read_weight(oc, ic, r, s)) give values at
    logical NCHW / OIHW coordinates, whatever the memory layout. A symbolic workload needs `binding`
    ({name: te symbol}); n, h, w may also be te expressions themselves. packed: the weights as `prepack`
    made them, an input of the kernel (then they are not packed on each call)."""
    return conv2d(*readers, bound(wl, binding), wl.dtype, Conv2dConfig.from_config(config), target, name, packed)


def prepack(wl: Conv2dWorkload, config: Config, target: Target, weight: np.ndarray) -> list[np.ndarray]:
    """The direct algorithm's packed weights, [panels, kh, kw, icg, bn] (zero past oc), from constant OIHW
    weights; for gemm with pixel rows, the transposed weights as the matmul packs its B; for NHWC depthwise,
    [kh, kw, oc] (a tap's channels contiguous); [] for the NCHW gemm and depthwise, which read them in place."""
    cfg = Conv2dConfig.from_config(config)
    if cfg.algorithm == "depthwise" and wl.layout == "NHWC":
        return [np.ascontiguousarray(weight.reshape(wl.oc, wl.kh, wl.kw).transpose(1, 2, 0))]
    if cfg.algorithm == "gemm" and pixel_rows(wl):
        mm = _gemm_tile(wl, cfg, target)
        m, n, k = _gemm_shape(at_rep(wl))
        return topi_matmul.prepack(topi_matmul.MatmulWorkload(m, n, k, wl.dtype), mm.to_config(m, n, k), target,
                                   weight.reshape(wl.oc, wl.c).T)
    if cfg.algorithm in ("gemm", "depthwise"):
        return []
    bn, panels = cfg.bn, math.ceil(wl.oc / cfg.bn)
    w = np.zeros((panels * bn,) + weight.shape[1:], weight.dtype)
    w[:wl.oc] = weight
    return [np.ascontiguousarray(w.reshape(panels, bn, wl.icg, wl.kh, wl.kw).transpose(0, 3, 4, 2, 1))]


def schedule(s: Schedule, t: "ConvTensors | GemmConv", wl: Conv2dWorkload, config: Config, target: Target,
             epilogue: te.Tensor | None = None) -> None:
    """Apply `config` to the stages from `compute` (see `schedule_direct`)."""
    if isinstance(t, DepthwiseConv):
        schedule_depthwise(s, t, wl, Conv2dConfig.from_config(config), target, epilogue)
    elif isinstance(t, GemmConv):
        if epilogue is not None:
            s[t.out].compute_inline()
        topi_matmul.schedule_tile(s, t.mm, t.cfg, target, epilogue=epilogue if epilogue is not None else t.out,
                                  view_rows=pixel_rows(wl))
    else:
        schedule_direct(s, t, wl, Conv2dConfig.from_config(config), target, epilogue)


def build(wl: Conv2dWorkload, config: Config, target: Target,
          prepacked: bool = False) -> tuple[Schedule, list[te.Tensor]]:
    """Standalone: placeholders X (in the workload's layout), W (OIHW) and the scheduled output (a symbolic
    workload gets one te.size_var per symbol, named as in the workload: one kernel for every size).
    prepacked: W's packed arrays as `prepack` makes them take W's place among the inputs (as a graph with
    constant weights runs it), where the config packs W."""
    nchw = wl.layout == "NCHW"
    bwl = bound(wl, {name: te.size_var(name) for name in symbols(wl)})
    X = te.placeholder((bwl.n, wl.c, bwl.h, bwl.w) if nchw else (bwl.n, bwl.h, bwl.w, wl.c), wl.dtype, name="X")
    W = te.placeholder((wl.oc, wl.icg, wl.kh, wl.kw), wl.dtype, name="W")
    read_x = (lambda b, ch, y, x: X[b, ch, y, x]) if nchw else (lambda b, ch, y, x: X[b, y, x, ch])
    packed = topi_matmul.packed_inputs(prepack, wl, config, target, W.shape) if prepacked else []
    t = compute(bwl, config, target, (read_x, lambda o, i, r, s_: W[o, i, r, s_]), packed=packed)
    s = create_schedule(t.out.op)
    schedule(s, t, wl, config, target)
    return s, [X, *(packed or [W]), t.out]


def conv2d(read_input: Reader, read_weight: Reader, wl: Conv2dWorkload, dtype, cfg: Conv2dConfig, target: Target,
           name: str = "conv2d", prepacked: Sequence[te.Tensor] = ()) -> "ConvTensors | GemmConv":
    """The convolution's stages for a typed config (`prepacked`: the packed weights as inputs, as `prepack`
    made them)."""
    if cfg.algorithm == "gemm":
        if pixel_rows(wl):
            return _conv2d_pixel_rows(read_input, read_weight, wl, dtype, cfg, target, name, prepacked)
        return _conv2d_gemm(read_input, read_weight, wl, dtype, cfg, target, name)
    if cfg.algorithm == "depthwise":
        return _conv2d_depthwise(read_input, read_weight, wl, dtype, name, prepacked[0] if prepacked else None)
    prepacked = prepacked[0] if prepacked else None
    (sh, sw), (dh, dw), (top, _, left, _) = wl.stride, wl.dilation, wl.pads
    hp, wp = (_simplified((wl.oh - 1) * sh + (wl.kh - 1) * dh + 1),
              _simplified((wl.ow - 1) * sw + (wl.kw - 1) * dw + 1))
    if is_sym(wp) and sw > 1:
        # sw - 1 more (zero) columns: the register tiles' reads, ((ow // mr) * mr - 1) * sw + taps, are then
        # proven in bounds (ow // mr * mr <= ow; the exact width needs the parity of ow // mr * mr * sw)
        wp = _simplified(wl.ow * sw + (wl.kw - 1) * dw)
    # constant sizes: padded by all of `pads`, even rows a stride leaves unread, so that the copies of equal
    # inputs have equal shapes (the storage planner can then write one over another, jitop.tir.storage.in_place)
    # (at least the rows the taps reach: (oh - 1) * sh + (kh - 1) * dh + 1 <= h + top + bottom)
    if isinstance(wl.h, int):
        hp = wl.h + top + wl.pads[1]
    if isinstance(wl.w, int):
        wp = wl.w + left + wl.pads[3]
    zero = te.const(0, dtype)

    def pad(n: Expr, row: Expr, col: Expr, ch: Expr) -> Expr:
        yy, xx = row - top, col - left
        inside = []
        if top:
            inside.append(yy >= 0)
        if _maybe(top + wl.h < hp):
            inside.append(yy < wl.h)
        if left:
            inside.append(xx >= 0)
        if _maybe(left + wl.w < wp):
            inside.append(xx < wl.w)
        return _where_all(inside, read_input(n, ch, yy, xx), zero)
    planar = planar_padding(wl, target)
    if planar:
        padded = te.compute((wl.n, hp, wl.c, wp), lambda n, row, ch, col: pad(n, row, col, ch), name=f"{name}_padded")
    else:
        # channels past wl.c (zeros) only space the pixels out: the tile never reads them
        pitch = channel_pitch(wl)
        padded = te.compute((wl.n, hp, wp, pitch),
                            lambda n, row, col, ch: pad(n, row, col, ch) if pitch == wl.c else
                            te.if_then_else(ch < wl.c, pad(n, row, col, ch), zero), name=f"{name}_padded")

    bn, panels = cfg.bn, math.ceil(wl.oc / cfg.bn)

    def pack(o: Expr, r: Expr, s: Expr, i: Expr, lane: Expr) -> Expr:
        oc = o * bn + lane
        value = read_weight(oc, i, r, s)
        return te.if_then_else(oc < wl.oc, value, zero) if wl.oc % bn else value
    packed = prepacked if prepacked is not None else \
        te.compute((panels, wl.kh, wl.kw, wl.icg, bn), pack, name=f"{name}_packedW")

    r = te.reduce_axis((0, wl.kh), "r")
    s = te.reduce_axis((0, wl.kw), "s")
    i = te.reduce_axis((0, wl.icg), "i")

    def value(n: Expr, y: Expr, x: Expr, oc: Expr) -> Expr:
        channel = (oc // wl.ocg) * wl.icg + i.var if wl.groups > 1 else i.var
        row, col = y * sh + r.var * dh, x * sw + s.var * dw
        p = padded[n, row, channel, col] if planar else padded[n, row, col, channel]
        return te.sum(p * packed[oc // bn, r.var, s.var, i.var, oc % bn], axis=[r, s, i])
    # computed channels-last, so the register tile (a cache of this stage) has channels innermost
    core = te.compute((wl.n, wl.oh, wl.ow, wl.oc), value, name=name if wl.layout == "NHWC" else f"{name}_nhwc")
    out = core if wl.layout == "NHWC" else \
        te.compute(wl.out_shape, lambda n, oc, y, x: core[n, y, x, oc], name=name)
    return ConvTensors(out, core, padded, packed)


@dataclass(frozen=True)
class ConvTensors:
    """The stages of one convolution: `out` in the requested layout (the same tensor as `core`, the
    channels-last result, for NHWC), the padded input and the packed weights."""

    out: te.Tensor
    core: te.Tensor
    padded: te.Tensor
    packed: te.Tensor


def schedule_direct(s: Schedule, t: "ConvTensors", wl: Conv2dWorkload, cfg: Conv2dConfig, target: Target,
                    epilogue: te.Tensor | None = None) -> None:
    """The register-tiled direct schedule; with `epilogue` (an elementwise consumer of `out` of the same
    shape) the epilogue is computed from the tile and `out` never goes to memory."""
    out, padded, packed = t.out, t.padded, t.packed
    cache = s.cache_write(t.core, "local")
    if t.core is not out:
        s[t.core].compute_inline()
    if epilogue is not None:
        s[out].compute_inline()
    stage = s[epilogue if epilogue is not None else out]
    if wl.layout == "NCHW":
        n, oc, oh, ow = stage.op.axis
    else:
        n, oh, ow, oc = stage.op.axis
    oco, oci = stage.split(oc, factor=cfg.bn)
    owo, owi = stage.split(ow, factor=cfg.mr)
    tile_rows = _tile_rows(wl, cfg, target)
    ohi = None
    if tile_rows > 1:
        oh, ohi = stage.split(oh, factor=tile_rows)
    rows = (n, oco, oh) if cfg.oc_outer else (n, oh, oco)
    if ohi is not None:
        stage.reorder(*rows, owo, ohi, owi, oci)
        stage.vectorize(oci)
    elif wl.layout == "NCHW":
        # channel lanes scatter to channel planes: one register (16 planes) at a time along the row,
        # not all bn planes per column, keeps the lines being written few
        ocv, ocl = stage.split(oci, factor=target.lanes(wl.itemsize))
        stage.reorder(*rows, owo, ocv, owi, ocl)
        stage.vectorize(ocl)
    else:
        stage.reorder(*rows, owo, owi, oci)
        stage.vectorize(oci)
    s[cache].compute_at(stage, owo)
    _schedule_tile(s[cache], wl, cfg, tile_rows)
    prepacked = isinstance(packed.op, PlaceholderOp)  # an input of the kernel: nothing to schedule
    pack_in_panel = cfg.pack_per_panel and cfg.oc_outer
    # with two-row tiles the row pairs stay a serial loop, split into whole pairs and the tail: fused into the
    # parallel loop, the tail's guard would sit inside the tile's reduction (a batch of 8 ran 1.4x slower so)
    outer = _parallel_loop(stage, (n, oco) if pack_in_panel or tile_rows > 1 else rows, target.threads)
    if pack_in_panel and not prepacked:
        s[packed].compute_at(stage, outer)
        _schedule_pack(s, packed, parallel=False)
    elif not prepacked:
        _schedule_pack(s, packed, parallel=True)
    stage.parallel(outer)
    ps = s[padded]
    pn, py, *_, inner = ps.op.axis  # inner: the channels, or the columns of planar padding
    lanes = target.lanes(wl.itemsize)
    _, lanes = ps.split(inner, factor=lanes if planar_padding(wl, target) else max(1, min(wl.c, lanes)))
    ps.vectorize(lanes)
    ps.parallel(_parallel_loop(ps, (pn, py), target.threads))


ALIAS_BYTES = 2048  # pixels this many bytes apart (or a multiple) share an L1 set every 4 KiB at stride 2
CACHE_LINE = 64


def channel_pitch(wl: Conv2dWorkload) -> int:
    """Channels per pixel of the direct algorithm's padded copy: wl.c, or one cache line more when a pixel is a
    multiple of ALIAS_BYTES. The register tile broadcasts one input channel from each of its pixels per step;
    at 512 float32 channels (2 KiB) its 14 pixels (two 7-wide rows, stride 2) all map to one L1 set (L1s index
    sets by the address modulo 4 KiB), more lines than the set's ways: ResNet-50's 7x7 3x3 layers ran 10-15 %
    slower so on a Zen 5 (the stride-2 one 0.79 ms against 0.6 for the others)."""
    row_bytes = wl.c * wl.itemsize
    return wl.c + CACHE_LINE // wl.itemsize if row_bytes % ALIAS_BYTES == 0 else wl.c


def planar_padding(wl: Conv2dWorkload, target: Target) -> bool:
    """The direct algorithm's padded copy is (n, row, channel, column) when the input has fewer channels than
    a vector (an image's 3 colours): the copy then reads and writes whole vectors along each channel's rows
    instead of 3-lane vectors gathered across the planes, and the tile's broadcasts read either layout alike
    (ResNet's stem on AVX-512: the 224x224 image's copy 0.07 -> 0.035 ms)."""
    return not is_sym(wl.c) and wl.c < target.lanes(wl.itemsize) and wl.groups == 1


def _parallel_loop(stage, axes: tuple, threads: int) -> object:
    """The loop to run in parallel over `axes` (outer first, consecutive): all of them fused when their
    extents are constants (as before symbols). A symbolic axis is never fused: the fused index would be
    divided to index (checked at run time, and the register tile's region would not be a point). Then the
    constant axes after the last symbolic one are fused if they give each thread two iterations, else the
    last symbolic axis alone is parallel (the constant ones run inside it); the axes before stay outside."""
    last = max((k for k, a in enumerate(axes) if is_sym(a.extent)), default=None)
    if last is None:
        return stage.fuse(*axes)
    inner = axes[last + 1:]
    if inner and math.prod(a.extent for a in inner) >= 2 * threads:
        return stage.fuse(*inner) if len(inner) > 1 else inner[0]
    return axes[last]


@dataclass(frozen=True)
class GemmConv:
    """The stages of a convolution computed as a matmul: c[n, oc, p] = W[oc, :] . im2col[n, :, p]
    (packed in panels of p, like matmul's B), `out` its (N, OC, OH, OW) view."""

    out: te.Tensor
    mm: topi_matmul.MatmulTensors
    cfg: topi_matmul.MatmulConfig


def _conv2d_gemm(read_input: Reader, read_weight: Reader, wl: Conv2dWorkload, dtype, conv: Conv2dConfig,
                 target: Target, name: str) -> GemmConv:
    (sh, sw), (dh, dw), (top, _, left, _) = wl.stride, wl.dilation, wl.pads
    area, taps = wl.oh * wl.ow, wl.kh * wl.kw  # area: an expression with symbols
    k = wl.c * taps
    zero = te.const(0, dtype)

    def tap(kk: Expr) -> tuple[Expr, Expr, Expr]:  # k in OIHW order: (input channel, kernel row, column)
        return kk // taps, (kk // wl.kw) % wl.kh, kk % wl.kw

    def weight(bi: tuple, oc: Expr, kk: Expr) -> Expr:
        return read_weight(oc, *tap(kk))  # flattens back to oc * K + kk: a contiguous row of A

    cfg = _gemm_tile(wl, conv, target)
    # C is as wide as its panels, so every register tile is whole (no masked lanes); `out` drops the pad
    # (a symbolic area is matmul's symbolic n: its last panel is zero-padded there)
    width = area if is_sym(area) else math.ceil(area / cfg.bn) * cfg.bn

    def column(bi: tuple, kk: Expr, p: Expr) -> Expr:
        i, r, s_ = tap(kk)
        y, x = (p // wl.ow) * sh + r * dh - top, (p % wl.ow) * sw + s_ * dw - left
        inside = ([p < area] if _maybe(width > area) else []) + _inside_input(wl, y, x)
        return _where_all(inside, read_input(bi[0], i, y, x), zero)
    mm = topi_matmul.matmul(weight, column, (wl.n,), wl.oc, width, k, dtype, cfg, name=f"{name}_gemm")
    out = te.compute(wl.out_shape, lambda n, oc, y, x: mm.out[n, oc, y * wl.ow + x], name=name)
    return GemmConv(out, mm, cfg)


def _conv2d_pixel_rows(read_input: Reader, read_weight: Reader, wl: Conv2dWorkload, dtype, conv: Conv2dConfig,
                       target: Target, name: str, prepacked: Sequence[te.Tensor]) -> GemmConv:
    """An unpadded NHWC 1x1 convolution as C[n, p, oc] = X[n, pixel p (strided), :] @ W[oc, :].T: the input's
    channels-last pixels are A's rows, read in place; the weights are B, packed once (not per image)."""
    (sh, sw), area = wl.stride, wl.oh * wl.ow

    def pixel(bi: tuple, p: Expr, ch: Expr) -> Expr:
        return read_input(bi[0], ch, (p // wl.ow) * sh, (p % wl.ow) * sw)

    def weight(bi: tuple, ch: Expr, oc: Expr) -> Expr:
        return read_weight(oc, ch, 0, 0)
    cfg = _gemm_tile(wl, conv, target)
    mm = topi_matmul.matmul(pixel, weight, (wl.n,), area, wl.oc, wl.c, dtype, cfg, name=f"{name}_gemm", b_batch=(),
                            b_index=lambda bi: (), prepacked=prepacked)
    out = te.compute(wl.out_shape, lambda n, y, x, oc: mm.out[n, y * wl.ow + x, oc], name=name)
    return GemmConv(out, mm, cfg)


def _gemm_shape(wl: Conv2dWorkload) -> tuple[Size, Size, Size]:
    """(rows, columns, reduction) of the gemm algorithm's matmul: (OC, pixels, C*KH*KW) in NCHW, (pixels, OC,
    C) for an NHWC pointwise convolution."""
    if pixel_rows(wl):
        return wl.oh * wl.ow, wl.oc, wl.c
    return wl.oc, wl.oh * wl.ow, wl.c * wl.kh * wl.kw


@dataclass(frozen=True)
class DepthwiseConv:
    """The stages of a depthwise convolution: `out` (in the workload's layout), read straight from the input,
    and in NHWC the weights as [kh, kw, oc] (`packed`, a stage or the prepacked input; None in NCHW)."""

    out: te.Tensor
    packed: te.Tensor | None = None


def _conv2d_depthwise(read_input: Reader, read_weight: Reader, wl: Conv2dWorkload, dtype, name: str,
                      prepacked: te.Tensor | None = None) -> DepthwiseConv:
    """out[n, oc, y, x] = sum_{r, s} in[n, oc // ocg, y*sh + r*dh - top, x*sw + s*dw - left] * w[oc, 0, r, s],
    a read outside the input being zero (the condition is evaluated per lane: no padded copy)."""
    (sh, sw), (dh, dw), (top, _, left, _) = wl.stride, wl.dilation, wl.pads
    zero = te.const(0, dtype)
    r = te.reduce_axis((0, wl.kh), "r")
    s = te.reduce_axis((0, wl.kw), "s")
    packed = None
    if wl.layout == "NHWC":  # a tap's weights for a vector of channels: one contiguous load
        packed = prepacked if prepacked is not None else te.compute(
            (wl.kh, wl.kw, wl.oc), lambda y, x, oc: read_weight(oc, 0, y, x), name=f"{name}_packedW")

    def value(n: Expr, oc: Expr, y: Expr, x: Expr) -> Expr:
        yy, xx = y * sh + r.var * dh - top, x * sw + s.var * dw - left
        channel = oc if wl.ocg == 1 else oc // wl.ocg
        p = _where_all(_inside_input(wl, yy, xx), read_input(n, channel, yy, xx), zero)
        weight = read_weight(oc, 0, r.var, s.var) if packed is None else packed[r.var, s.var, oc]
        return te.sum(p * weight, axis=[r, s])
    if wl.layout == "NHWC":
        return DepthwiseConv(te.compute(wl.out_shape, lambda n, y, x, oc: value(n, oc, y, x), name=name), packed)
    return DepthwiseConv(te.compute(wl.out_shape, value, name=name))


def schedule_depthwise(s: Schedule, t: DepthwiseConv, wl: Conv2dWorkload, cfg: Conv2dConfig, target: Target,
                       epilogue: te.Tensor | None = None) -> None:
    """A register tile of cfg.mr output columns of one channel's row, in vectors along the row, summed over
    the unrolled kernel taps; rows of every channel in parallel. With `epilogue` (an elementwise consumer of
    `out` of the same shape) it is computed from the tile."""
    lanes = target.lanes(wl.itemsize)
    cache = s.cache_write(t.out, "local")
    if epilogue is not None:
        s[t.out].compute_inline()
    stage = s[epilogue if epilogue is not None else t.out]
    if wl.layout == "NHWC":
        _schedule_depthwise_nhwc(s, stage, s[cache], t.packed, cfg, lanes, target.threads)
        return
    n, oc, oh, ow = stage.op.axis
    owo, owi = stage.split(ow, factor=cfg.mr)
    stage.vectorize(owi)  # at most MAX_DEPTHWISE_VECTORS vectors wide: one vector instruction per register
    s[cache].compute_at(stage, owo)
    cs = s[cache]
    x = cs.op.axis[3]
    r, s_ = cs.op.reduce_axis
    xv, xl = cs.split(x, factor=min(lanes, cfg.mr))
    cs.reorder(r, s_, xv, xl)
    if wl.kh * wl.kw * math.ceil(cfg.mr / lanes) <= 64:  # 3x3 taps x 4 vectors: 36 FMAs in a row
        cs.unroll(r)
    cs.unroll(s_)
    cs.unroll(xv)
    cs.vectorize(xl)
    stage.parallel(_parallel_loop(stage, (n, oc, oh), target.threads))


def _schedule_depthwise_nhwc(s: Schedule, stage, cs, packed: te.Tensor, cfg: Conv2dConfig, lanes: int,
                             threads: int) -> None:
    """NHWC: a register tile of cfg.mr output pixels of a row x cfg.bn channels (vectors), summed over the
    unrolled taps: a tap's weight vectors serve the tile's pixels; output rows in parallel."""
    n, oh, ow, oc = stage.op.axis
    owo, owi = stage.split(ow, factor=cfg.mr)
    oco, oci = stage.split(oc, factor=cfg.bn)
    stage.reorder(n, oh, owo, oco, owi, oci)
    stage.vectorize(oci)
    cs.compute_at(stage, oco)
    _, _, x, c = cs.op.axis
    r, s_ = cs.op.reduce_axis
    cv, cl = cs.split(c, factor=min(lanes, cfg.bn))
    cs.reorder(r, s_, x, cv, cl)
    cs.unroll(r)
    cs.unroll(s_)
    cs.unroll(x)
    cs.unroll(cv)
    cs.vectorize(cl)
    stage.parallel(_parallel_loop(stage, (n, oh), threads))
    if not isinstance(packed.op, PlaceholderOp):  # packed on each call: kh*kw*oc values, vectorized
        s[packed].vectorize(s[packed].op.axis[-1])


def _gemm_tile(wl: Conv2dWorkload, conv: Conv2dConfig, target: Target) -> topi_matmul.MatmulConfig:
    """The matmul config of the gemm algorithm: the register tile from the conv2d config's tile knobs, the
    loop order and packing as matmul's default for (OC, OH*OW, C*KH*KW) (at the representative size)."""
    wl = at_rep(wl)
    base = topi_matmul.default_tile(*_gemm_shape(wl), wl.itemsize, target)
    panel_outer = not conv.oc_outer
    return dataclasses.replace(base, mr=conv.mr, bn=conv.bn, k_unroll=conv.ic_unroll, panel_outer=panel_outer,
                               pack_per_panel=base.pack_b and panel_outer and conv.pack_per_panel)


def operand_reads(wl: Conv2dWorkload, config: Config, target: Target) -> tuple[int, int]:
    """How many times the schedule evaluates each element of the input and of the weights. Direct: the
    input once (into the padded copy), the weights once per batch image when packed per panel, else
    once. Gemm: each input element once per kernel tap (im2col), times the row blocks if not packed; the
    weights (matmul's A) once per pixel panel and image; NHWC 1x1 (pixel rows): the input once per panel of
    output channels (at least IN_KERNEL_READS), the weights once. Depthwise: each input element once per tap
    that reaches it from each of its output channels, a weight once per register tile (NHWC: once, packed).

    >>> wl = Conv2dWorkload(1, 64, 56, 56, 64, 3, 3, (1, 1), (1, 1, 1, 1))
    >>> operand_reads(wl, default_config(wl, Target.from_string("haswell")), Target.from_string("haswell"))
    (1, 1)
    """
    conv = Conv2dConfig.from_config(config)
    wl = at_rep(wl)
    if conv.algorithm == "depthwise":
        taps = math.ceil(wl.kh * wl.kw * wl.ocg / (wl.stride[0] * wl.stride[1]))
        return taps, 1 if wl.layout == "NHWC" else wl.n * wl.oh * math.ceil(wl.ow / conv.mr)
    if conv.algorithm != "gemm":
        return 1, wl.n if conv.pack_per_panel and conv.oc_outer else 1
    cfg = _gemm_tile(wl, conv, target)
    if pixel_rows(wl):  # the input is A (once per panel of output channels), the weights B (packed once)
        # A's scalars feed the register tile straight from memory: a producer's arithmetic evaluated there costs
        # as much as rereading the element several times (a bias + relu fused there ran the 1x1 convs of
        # ResNet's first stage 2.4x slower than computing it once, on the previous convolution's tile)
        reads = max(math.ceil(wl.oc / cfg.bn), IN_KERNEL_READS)
        return reads, 1 if cfg.pack_b else wl.n * math.ceil(wl.oh * wl.ow / cfg.mr)
    row_blocks = 1 if cfg.pack_b else math.ceil(wl.oc / cfg.mr)
    return wl.kh * wl.kw * row_blocks, wl.n * math.ceil(wl.oh * wl.ow / cfg.bn)


def _tile_rows(wl: Conv2dWorkload, cfg: Conv2dConfig, target: Target) -> int:
    """Output rows in the direct register tile: 2 where one tile is a whole NHWC output row and two rows'
    accumulators still fit the registers with their operands. Each weight vector then feeds twice the FMAs:
    at 7x7 (ResNet's last stage, batch 1) the weights, not the FMAs, bound the convolution."""
    vectors = cfg.bn // target.lanes(wl.itemsize)
    whole_row = not is_sym(wl.w) and not is_sym(wl.h) and cfg.mr == wl.ow and wl.oh >= 2
    fits = _fits_registers(2 * cfg.mr, vectors, target)
    return 2 if wl.layout == "NHWC" and cfg.oc_outer and whole_row and fits else 1


def _fits_registers(pixels: int, vectors: int, target: Target) -> bool:
    """A register tile of `pixels` x `vectors` accumulators fits the vector registers with its operands (the
    weight vectors and one broadcast input): spilling one costs a third of the speed."""
    return pixels * vectors + vectors + 1 <= target.vector_registers


def _schedule_tile(cs, wl: Conv2dWorkload, cfg: Conv2dConfig, tile_rows: int = 1) -> None:
    _, oy, ow, oc = cs.op.axis
    r, s_, i = cs.op.reduce_axis
    io, ii = cs.split(i, factor=cfg.ic_unroll)
    pixels = (oy, ow) if tile_rows > 1 else (ow,)
    if cfg.channels_outer:  # each input-channel block visits every kernel tap
        cs.reorder(io, r, s_, ii, *pixels, oc)
    else:
        cs.reorder(r, s_, io, ii, *pixels, oc)
    cs.unroll(ii)
    for axis in pixels:
        cs.unroll(axis)
    cs.vectorize(oc)


def _schedule_pack(s: Schedule, packed: te.Tensor, parallel: bool) -> None:
    ws = s[packed]
    o, r, s_, i, lane = ws.op.axis
    # read the OIHW weights in memory order: the lanes' (r, s) rows share cache lines across steps
    ws.reorder(o, i, r, s_, lane)
    ws.vectorize(lane)
    if parallel:
        ws.parallel(ws.fuse(o, i))


TEMPLATE = registry.register(registry.Template("conv2d", Conv2dWorkload, config_space, default_config, compute,
                                               schedule, build, operand_reads,
                                               kind_fields=("kh", "kw", "layout", "dtype", "depthwise"),
                                               prepack=prepack))
