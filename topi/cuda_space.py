"""The tuning space of the GPU GEMM schedules (topi.cuda's SGEMM `schedule_matmul` and the implicit-GEMM
`schedule_conv2d`, which share one loop nest and one config: bm, bn, bk, tm, tn).

A point has three knobs: "tile" = (bm, bn, tm, tn), the block's tile of the output and each thread's register
tile, "bk", the K step of the shared tiles, and "stages", 1 or 2 copies of them (2: double-buffered,
`Stage.double_buffer`; only 1 where the default tile does not fit twice). The four tile sizes are one knob
because they bound one another (threads per block, registers); bk and stages only meet them in the shared
memory, which `gemm_space` makes fit for every bk and stages. So EVERY point of the space, any tile with any bk
and stages, is a schedule the template builds and a block the Target can launch:

- bm % tm == bn % tn == 0, bn % 4 == 0 and bk % 4 == 0 (`topi.cuda._check_matmul_config`, which every point
  passes);
- WARP <= (bm / tm) (bn / tn) <= max_threads_per_block (at least one warp per block);
- (bm + bn) * max(bk) * 4 * max(stages) bytes <= shared_per_block: the shared tiles of A and B fit at every bk;
- tm * tn <= MAX_ACCUMULATORS, and threads x `registers_estimate` <= registers_per_block (with the registers
  that stage the next tiles at stages = 2), so the block launches (a kernel that needs more registers than a
  block has fails at launch, it does not spill);
- pruned as hopeless, not invalid: register tiles of fewer than 4 accumulators or more than 4x longer than
  wide, and tiles much larger than the problem (bm <= max(64, rows rounded up to a power of two); bn, bk
  alike); the template's default config is always a point.

>>> from jitop.target import Target
>>> space = gemm_space(1024, 1024, 1024, Target.from_string("cuda -arch=sm_90"))
>>> space
ConfigSpace(... points: tile[...], bk[4], stages[2])
>>> to_cfg(space.get(0))["bk"]
4
"""
from __future__ import annotations

from typing import Any

from jitop.target import CudaTarget
from jitop.topi.cuda import MATMUL_KEYS, STAGES, _check_matmul_config, _pow2_at_least
from jitop.topi.cuda_mma import MODES
from jitop.tuner.space import Config, ConfigSpace

BLOCK_TILES = (16, 32, 64, 128, 256)   # bm, bn: a block's tile of the output
THREAD_TILES = (1, 2, 4, 8, 16)        # tm, tn: a thread's register tile
K_STEPS = (4, 8, 16, 32)               # bk: the K step of the shared tiles
WARP = 32
MAX_ACCUMULATORS = 64                  # tm x tn: 8 x 8 runs at about 127 registers; more spills
MIN_ACCUMULATORS = 4                   # tm x tn below this: pruned (little reuse of the shared tiles)
FLOAT_BYTES = 4                        # the GEMM templates' shared tiles hold float32


def registers_estimate(tm: int, tn: int, staged: int = 0) -> int:
    """Registers a thread of a tm x tn register tile needs, a little over what ptxas allocates (the tm x tn
    accumulators, the A and B fragments twice over for the loads in flight, addressing, and `staged` values of
    the next shared tiles in flight at stages = 2): 8 x 8 -> 136 (ptxas: 127; 117 with 16 staged), 4 x 4 -> 72
    (44)."""
    return tm * tn + 2 * (tm + tn) + 40 + staged


def launch_problems(cfg: dict[str, int], target: CudaTarget, max_bk: int | None = None) -> list[str]:
    """Why a GEMM config is not in the tuning space on `target` beyond `_check_matmul_config`'s checks ([]: it
    may be). `max_bk`: the shared tiles must fit at this K step too (the space's largest)."""
    bm, bn, bk, tm, tn = (int(cfg[x]) for x in MATMUL_KEYS)
    problems = []
    threads = (bm // tm) * (bn // tn)
    stages = cfg.get("stages", 1)
    top_bk = max(bk, max_bk or 0)
    staged = -(-(bm + bn) * top_bk // threads) if stages == 2 else 0
    if threads < WARP:
        problems.append(f"{threads} threads per block, less than a warp ({WARP})")
    if tm * tn > MAX_ACCUMULATORS:
        problems.append(f"a {tm} x {tn} register tile holds more than {MAX_ACCUMULATORS} accumulators (it spills)")
    registers = threads * registers_estimate(tm, tn, staged)
    if registers > target.registers_per_block:
        problems.append(f"{threads} threads x about {registers_estimate(tm, tn, staged)} registers exceed the "
                        f"{target.registers_per_block} registers of a block (it would not launch)")
    shared = (bm + bn) * top_bk * FLOAT_BYTES * stages
    if shared > target.shared_per_block:
        problems.append(f"the shared tiles take {shared} bytes at bk={top_bk} and stages={stages}, more than the "
                        f"{target.shared_per_block} of a block")
    return problems


def valid_point(cfg: dict[str, int], target: CudaTarget, max_bk: int | None = None) -> bool:
    """Whether `cfg` passes `_check_matmul_config` and `launch_problems` on `target`."""
    try:
        _check_matmul_config(cfg, target)
    except ValueError:
        return False
    return not launch_problems(cfg, target, max_bk)


def _thread_tiles() -> list[tuple[int, int]]:
    # pruned, not invalid: fewer than 4 accumulators reuse too little of each shared-memory load, and a tile
    # more than 4x longer than wide loads many fragments for few products
    return [(tm, tn) for tm in THREAD_TILES for tn in THREAD_TILES
            if tm * tn >= MIN_ACCUMULATORS and max(tm, tn) <= 4 * min(tm, tn)]


def gemm_space(rows: int, cols: int, red: int, target: CudaTarget,
               default: dict[str, int] | None = None, tensor_cores: str = "") -> ConfigSpace:
    """The space of a GEMM of `rows` x `cols` outputs reduced over `red` (a matmul's M, N, K; a convolution's
    K, N*P*Q, C*R*S) on `target`: see the module docstring. `default` (a cfg dict that `valid_point` accepts,
    e.g. from `launchable_default`) is always a point: the K steps are those its tile fits in shared memory.
    `tensor_cores` (a mode, "tf32" or "bf16", of a float32 matmul on sm_80+: topi.cuda_mma.tc_available) adds the
    knob "tc" = [0, mode]: every tile also runs as mma.sync warp tiles (the same threads and accumulators per
    thread; TF32 at any bk: m16n8k8, or m16n8k4 at bk = 4; BF16 at bk >= 8, the only K steps of its space:
    m16n8k16, or m16n8k8 at bk = 8), so every (tile, bk, tc) is a point (a default of bk = 4, which topi's
    defaults never have, would stay one, refused by topi.cuda_mma.tc_problems with tc = "bf16")."""
    min_bk = MODES[tensor_cores].ks[-1] if tensor_cores else 0
    bks = [bk for bk in K_STEPS if min_bk <= bk <= max(8, _pow2_at_least(red))]
    if default is not None:
        if not valid_point(default, target):
            raise ValueError(f"the default GEMM config {default} is not a launchable point on {target.arch}: "
                             + "; ".join(launch_problems(default, target)))
        fits = (int(default["bm"]) + int(default["bn"])) * FLOAT_BYTES
        bks = sorted({*(bk for bk in bks if fits * bk * max(STAGES) <= target.shared_per_block), int(default["bk"])})
    top_bk = max(bks)
    double = default is None or valid_point({**default, "bk": top_bk, "stages": max(STAGES)}, target)
    stages = list(STAGES) if double else [1]
    tiles = [(bm, bn, tm, tn) for bm in BLOCK_TILES if bm <= max(64, _pow2_at_least(rows))
             for bn in BLOCK_TILES if bn <= max(64, _pow2_at_least(cols))
             for tm, tn in _thread_tiles()
             if valid_point({"bm": bm, "bn": bn, "bk": top_bk, "tm": tm, "tn": tn, "stages": max(stages)}, target)]
    if default is not None and _tile(default) not in tiles:
        tiles.append(_tile(default))
    space = ConfigSpace()
    space.define_knob("tile", sorted(tiles))
    space.define_knob("bk", bks)
    space.define_knob("stages", stages)
    if tensor_cores:
        space.define_knob("tc", [0, tensor_cores])
    return space


def launchable_default(cfg: dict[str, int], target: CudaTarget) -> dict[str, int]:
    """`cfg` (a template's default tiles) if `target` can launch it, else the largest launchable block tile no
    larger than it (most outputs, then the squarest, then most threads; its bk, or the largest that fits):
    topi.cuda's defaults are sized for an H100 and may not fit a smaller GPU.

    >>> small = CudaTarget(arch="sm_80", registers_per_block=16384, shared_per_block=16 << 10)
    >>> launchable_default({"bm": 128, "bn": 128, "bk": 16, "tm": 8, "tn": 8}, small)
    {'bm': 64, 'bn': 64, 'bk': 16, 'tm': 4, 'tn': 8}
    """
    if valid_point(cfg, target):
        return dict(cfg)
    best = None
    for bm in (b for b in BLOCK_TILES if b <= cfg["bm"]):
        for bn in (b for b in BLOCK_TILES if b <= cfg["bn"]):
            for tm, tn in _thread_tiles():
                for bk in sorted((k for k in K_STEPS if k <= cfg["bk"]), reverse=True):
                    point = {"bm": bm, "bn": bn, "bk": bk, "tm": tm, "tn": tn}
                    if valid_point(point, target):
                        rank = (bm * bn, min(bm, bn), (bm // tm) * (bn // tn), bk)
                        if best is None or rank > best[0]:
                            best = (rank, point)
                        break
    if best is None:
        raise ValueError(f"no GEMM tile of at most {cfg['bm']} x {cfg['bn']} can launch on {target.describe()}")
    return best[1]


def _tile(cfg: dict[str, int]) -> tuple[int, int, int, int]:
    return tuple(int(cfg[x]) for x in ("bm", "bn", "tm", "tn"))  # type: ignore[return-value]


def to_cfg(config: Config) -> dict[str, Any]:
    """A point of `gemm_space` as the cfg dict `schedule_matmul` / `schedule_conv2d` take (with "stages" and "tc"
    where the point has them).

    >>> to_cfg(Config.of(tile=(128, 64, 8, 4), bk=16, stages=2))
    {'bm': 128, 'bn': 64, 'bk': 16, 'tm': 8, 'tn': 4, 'stages': 2}
    >>> to_cfg(Config.of(tile=(128, 64, 8, 4), bk=16, stages=1, tc="tf32"))["tc"]
    'tf32'
    """
    bm, bn, tm, tn = config["tile"]
    cfg: dict[str, Any] = {"bm": int(bm), "bn": int(bn), "bk": int(config["bk"]), "tm": int(tm), "tn": int(tn)}
    knobs = config.as_dict()
    if "stages" in knobs:
        cfg["stages"] = int(knobs["stages"])
    if "tc" in knobs:
        cfg["tc"] = knobs["tc"]
    return cfg


def to_config(cfg: dict[str, Any], tensor_cores: bool = False) -> Config:
    """A cfg dict (keys MATMUL_KEYS, stages and tc) as a point of `gemm_space` (the inverse of `to_cfg`); stages
    is 1 when the cfg has none; a cfg with a "tc" key, or any with `tensor_cores` (a space with the "tc" knob: tc
    = 0 when the cfg has none), sets tc.

    >>> to_config({'bm': 128, 'bn': 64, 'bk': 16, 'tm': 8, 'tn': 4}) == Config.of(tile=(128, 64, 8, 4), bk=16,
    ...                                                                           stages=1)
    True
    """
    knobs: dict[str, Any] = {"tile": _tile(cfg), "bk": int(cfg["bk"]), "stages": int(cfg.get("stages", 1))}
    if tensor_cores or "tc" in cfg:
        knobs["tc"] = cfg.get("tc", 0)
    return Config.of(**knobs)


__all__ = ["gemm_space", "launchable_default", "to_cfg", "to_config", "launch_problems", "valid_point",
           "registers_estimate"]
