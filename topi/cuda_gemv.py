"""The GPU schedule of a product of a few rows (GEMV): C[m, n] = A[m, k] @ B[k, n] with m <= GEMV_ROWS, a decode
step's dense layers (one token's row times the weights).

The SGEMM's block tiles are 64 rows high at the least: for one row, 63 of every 64 rows of work are padding,
and its few column blocks leave most SMs idle while B streams through them. A GEMV is a read of B, once: here
a block takes `cols` columns of one row (blockIdx.x, blockIdx.y = the row) and splits the reduction over `ks`
threads, each summing every ks-th k (unrolled by `unroll`); the ks partial sums meet in a cross-thread
reduction. The block first computes its row of A into shared memory, all its threads together (where the row
takes at most half of it: `stages_row`), so a costly view of A (a GELU between two dense layers) is evaluated
once per block of columns, not once per column. `lanes` says which of the two is threadIdx.x, the consecutive
lanes of a warp: "n" (columns, the default: a warp reads a row segment of B, contiguous when B is [k, n]) or
"k" (a warp reads along k, the
partial sums meet by warp shuffles: the better order where B's k is contiguous, a transposed view the tuner
finds). (`x @ W.T` of a few rows never gets here: the tracer computes it as dot products of rows, which read
W's rows in place.)

>>> import jitop
>>> A, B = te.placeholder((1, 768), name="A"), te.placeholder((768, 2304), name="B")
>>> C = gemv(A, B)
>>> f = jitop.build(schedule_gemv(C, {"cols": 32, "ks": 8, "lanes": "n", "unroll": 4}), [A, B, C],
...                 target="cuda -arch=sm_90")
>>> f.built.kernels[0].grid, f.built.kernels[0].block
((72, 1, 1), (32, 8, 1))
"""
from __future__ import annotations

from typing import Any

from jitop import te
from jitop.schedule.schedule import Schedule, create_schedule
from jitop.target import CudaTarget
from jitop.te.tensor import Tensor, read_along
from jitop.topi.cuda import DEFAULT_TARGET, _cooperative_fetch, _pow2_at_least, _written_stage, inline_injective
from jitop.tuner.space import ConfigSpace

GEMV_ROWS = 4            # products of at most this many rows (A's rows, a batch's stacked) take this schedule
GEMV_KEYS = ("cols", "ks", "lanes", "unroll")
LANES = ("n", "k")
COLS = (1, 2, 4, 8, 16, 32, 64, 128)
UNROLLS = (1, 2, 4, 8)
WARP = 32
_AXES = {"x": te.thread_axis("threadIdx.x"), "y": te.thread_axis("threadIdx.y")}
BLOCK_X, BLOCK_Y = te.thread_axis("blockIdx.x"), te.thread_axis("blockIdx.y")


def gemv(A: Tensor, B: Tensor, name: str = "gemv") -> Tensor:
    """C[i, j] = sum_k A[i, k] * B[k, j] of 2-D A and B (A of few rows)."""
    (m, k), n = A.shape, B.shape[1]
    r = te.reduce_axis((0, k), "k")
    return te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name=name, tag="matmul")


def default_gemv_config(m: int, n: int, k: int, target: CudaTarget | None = None) -> dict[str, Any]:
    """256 threads a block, columns along threadIdx.x: a warp of columns (128 bytes of a row of B per load),
    halved down to 8 (a 32-byte sector) while the grid has fewer than two blocks per SM, the rest of the
    threads along k; never more threads along k than k (rounded up to a power of two). Unrolled by 4.

    >>> default_gemv_config(1, 50257, 768), default_gemv_config(1, 768, 768)
    ({'cols': 32, 'ks': 8, 'lanes': 'n', 'unroll': 4}, {'cols': 8, 'ks': 32, 'lanes': 'n', 'unroll': 4})
    """
    target = target or DEFAULT_TARGET
    cols, ks = 32, 8
    while cols > 8 and m * -(-n // cols) < 2 * target.sm_count:
        cols, ks = cols // 2, ks * 2
    return {"cols": cols, "ks": min(ks, _pow2_at_least(max(k, 1))), "lanes": "n", "unroll": 4}


def gemv_problems(cfg: dict[str, Any], target: CudaTarget) -> list[str]:
    """Why `cfg` is not a GEMV config `target` launches ([]: it is)."""
    unknown = set(cfg) - set(GEMV_KEYS)
    if unknown:
        return [f"unknown config keys {sorted(unknown)}; the keys are {list(GEMV_KEYS)}"]
    cols, ks, unroll = (int(cfg[x]) for x in ("cols", "ks", "unroll"))
    problems = [] if cfg["lanes"] in LANES else [f"lanes={cfg['lanes']!r}; expected one of {LANES}"]
    if ks < 1 or ks & (ks - 1):
        problems.append(f"ks={ks} threads along k: a cross-thread reduction takes a power of two")
    if not 1 <= cols * ks <= target.max_threads_per_block:
        problems.append(f"cols x ks = {cols * ks} threads per block, but a block has 1 to "
                        f"{target.max_threads_per_block}")
    if unroll < 1:
        problems.append(f"unroll={unroll}; expected 1 or more")
    return problems


def gemv_space(m: int, n: int, k: int, target: CudaTarget, default: dict[str, Any]) -> ConfigSpace:
    """Every launchable point: cols x ks threads of at least a warp, no more columns than n nor threads along k
    than k (powers of two, rounded up), both lane orders, unroll 1 to 8; `default` is always a point."""
    blocks = [(c, s) for c in COLS if c <= max(8, _pow2_at_least(n))
              for s in (1 << e for e in range(11)) if s <= max(1, _pow2_at_least(k))
              and WARP <= c * s <= min(1024, target.max_threads_per_block)]
    if (default["cols"], default["ks"]) not in blocks:
        blocks.append((default["cols"], default["ks"]))
    space = ConfigSpace()
    space.define_knob("block", sorted(blocks))
    space.define_knob("lanes", list(LANES))
    space.define_knob("unroll", list(UNROLLS))
    return space


def schedule_gemv(C: Tensor, cfg: dict[str, Any] | None = None, target: CudaTarget | None = None) -> Schedule:
    """The GEMV schedule of C (made by `gemv`, or any `te.sum(A[i, k] * B[k, j])` of 2-D inputs) with `cfg`
    (keys GEMV_KEYS; missing ones from `default_gemv_config`); injective producers of A and B inlined."""
    s = create_schedule(C)
    schedule_gemv_stage(s, C, cfg, target)
    inline_injective(s)
    return s


def schedule_gemv_stage(s: Schedule, C: Tensor, cfg: dict[str, Any] | None = None,
                        target: CudaTarget | None = None, epilogue: Tensor | None = None) -> None:
    """The GEMV schedule of the product C inside `s`: each thread accumulates its share of k in a register, the
    block's ks threads of a column combine theirs, and the result (or an elementwise `epilogue` of C's shape, or
    of its rows unstacked: topi.cuda._written_stage) is written; the producers of A and B are the caller's to
    inline."""
    target = target or DEFAULT_TARGET
    m, n = C.shape
    (red,) = C.op.reduce_axis
    full = {**default_gemv_config(m, n, red.extent, target), **(cfg or {})}
    problems = gemv_problems(full, target)
    if problems:
        raise ValueError(f"schedule_gemv config {full}: " + "; ".join(problems))
    cols, ks, unroll = (int(full[x]) for x in ("cols", "ks", "unroll"))
    col_axis, k_axis = (_AXES["x"], _AXES["y"]) if full["lanes"] == "n" else (_AXES["y"], _AXES["x"])
    CL = s.cache_write(C, "local")
    a_in = next(iter(read_along(C.op, red)), None)
    stage_a = a_in is not None and stages_row(red.extent, a_in.dtype.itemsize, target)
    AS = s.cache_read(a_in, "shared", [CL]) if stage_a else None
    out = _written_stage(s, C, epilogue, stacked=True)
    *rows, j = out.op.axis
    i = out.fuse(*rows) if len(rows) > 1 else rows[0]
    bx, tx = out.split(j, factor=cols)
    out.reorder(i, bx, tx)
    out.bind(i, BLOCK_Y)
    out.bind(bx, BLOCK_X)
    out.bind(tx, col_axis)
    acc = s[CL]
    acc.compute_at(out, tx)
    (kc,) = acc.op.reduce_axis
    ko, kt = acc.split(kc, factor=ks)
    if unroll > 1:
        _, ku = acc.split(ko, factor=unroll)
        acc.unroll(ku)
    acc.bind(kt, k_axis)
    if AS is not None:  # the block's row of A, computed once by all its threads (a barrier before it is read)
        s[AS].compute_at(out, bx)
        row, kk = s[AS].op.axis
        x_threads, y_threads = (cols, ks) if full["lanes"] == "n" else (ks, cols)
        _cooperative_fetch(s, s[AS], row, kk, y_threads, x_threads, 4 if red.extent % 4 == 0 else 1)


def stages_row(k: int, itemsize: int, target: CudaTarget) -> bool:
    """Whether a block keeps its row of A (k elements) in shared memory: `target.holds_row` (at most half of a
    block's shared memory: more would cap the blocks an SM holds, and a GEMV needs many in flight to stream B).

    Without it, every thread computes the A elements its k's need, so each element of A's view (a GELU between
    two dense layers: a tanh, a pow) is evaluated once per column of C; with it, once per block of columns.

    >>> stages_row(3072, 4, DEFAULT_TARGET), stages_row(16384, 4, DEFAULT_TARGET)
    (True, False)
    """
    return isinstance(k, int) and target.holds_row(k * itemsize)


def _block(config: Any) -> tuple[int, int]:
    return tuple(config["block"])  # type: ignore[return-value]


def to_gemv_cfg(config: Any) -> dict[str, Any]:
    """A point of `gemv_space` as the cfg dict `schedule_gemv` takes."""
    cols, ks = _block(config)
    return {"cols": int(cols), "ks": int(ks), "lanes": config["lanes"], "unroll": int(config["unroll"])}


__all__ = ["gemv", "schedule_gemv", "schedule_gemv_stage", "default_gemv_config", "gemv_space", "gemv_problems",
           "to_gemv_cfg", "stages_row", "GEMV_ROWS"]
