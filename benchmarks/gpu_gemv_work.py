"""The work a GPU kernel of a few-row product issues, counted from its launch shape and schedule: no GPU needed,
no time measured. For GPT-2 small's decode step (one token's row times each weight matrix, and each head's
attention weights times its value cache), the kernels jitop builds for sm_90 now (topi.cuda_gemv, the graph's
few-row schedule) and before (the SGEMM's default tiles, the graph's 16 x 16 tiles):

- blocks and threads launched, and how many of a block's threads compute (the grid must cover the GPU's 132 SMs several times over to stream B at full
  bandwidth);
- multiply-adds issued in all (the SGEMM computes its whole 64-row tile, 63 rows of padding for one row);
- multiply-adds one thread does in sequence (the kernel's critical path: a thread's chain of dependent adds);
- how many times the kernels evaluate a GELU between two dense layers (GPT-2's MLP: [1, 768] @ [768, 3072], GELU,
  @ [3072, 768]), counted by running them on the simulated GPU (tests/gpu_sim.py: a tanh per active thread).

    python benchmarks/gpu_gemv_work.py
"""
from __future__ import annotations

import math
import os
import sys
from collections import Counter

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jitop  # noqa: E402
from jitop import te  # noqa: E402
from jitop.graph.gpu_schedule import FEW_ROWS_COLS, MATMUL_TILE, THREADS  # noqa: E402
from jitop.target import Target  # noqa: E402
from jitop.topi import cuda, cuda_gemv  # noqa: E402

SM90 = Target.from_string("cuda -arch=sm_90")
C = 768
DENSE = [(C, 3 * C, "qkv"), (C, C, "attention out"), (C, 4 * C, "mlp up"), (4 * C, C, "mlp down"),
         (C, 50257, "a vocabulary-wide [k, n] weight")]
HEADS, HEAD_DIM, CACHE = 12, 64, 1024


def _launch(s, args) -> tuple[tuple, tuple]:
    (kernel,) = jitop.build(s, args, target="cuda -arch=sm_90").built.kernels
    return kernel.grid, kernel.block


def _row(what: str, grid: tuple, block: tuple, per_thread: int, useful: int, active: int | None = None
         ) -> list[str]:
    """`active`: the threads of a block that compute (the others are guarded off), all of them by default."""
    blocks, threads = math.prod(grid), math.prod(block)
    issued = blocks * (active or threads) * per_thread
    return [what, f"{blocks:,}", f"{active or threads} of {threads}", f"{issued / 1e6:,.1f} M",
            f"{issued / useful:.1f}x", f"{per_thread:,}"]


def dense_rows() -> list[list[str]]:
    rows = []
    for k, n, name in DENSE:
        A, B = te.placeholder((1, k), name="A"), te.placeholder((k, n), name="B")
        G = cuda_gemv.gemv(A, B)
        cfg = cuda_gemv.default_gemv_config(1, n, k, SM90)
        grid, block = _launch(cuda_gemv.schedule_gemv(G, cfg, SM90), [A, B, G])
        label = f"1x{k} @ {k}x{n} ({name})"
        rows.append(_row(f"{label}: GEMV {cfg['cols']}x{cfg['ks']}", grid, block, -(-k // cfg["ks"]), k * n))
        M = cuda.matmul(A, B)
        tiles = cuda.default_matmul_config(1, n, k, SM90)
        grid, block = _launch(cuda.schedule_matmul(M, tiles, SM90), [A, B, M])
        per_thread = tiles["tm"] * tiles["tn"] * -(-k // tiles["bk"]) * tiles["bk"]
        rows.append(_row(f"{label}: before, SGEMM {tiles['bm']}x{tiles['bn']}", grid, block, per_thread, k * n))
    return rows


def attention_rows() -> list[list[str]]:
    """[12, 1, S] @ [12, S, 64]: the graph's own schedules (B batched: no template), counted as scheduled."""
    useful = HEADS * HEAD_DIM * CACHE
    ks = THREADS // FEW_ROWS_COLS
    after = _row(f"{HEADS}x1x{CACHE} @ {HEADS}x{CACHE}x{HEAD_DIM} (weights x values): few-row {FEW_ROWS_COLS}x{ks}",
                 (HEAD_DIM // FEW_ROWS_COLS, HEADS, 1), (FEW_ROWS_COLS, ks, 1), -(-CACHE // ks), useful)
    tiles = -(-HEAD_DIM // MATMUL_TILE)
    before = _row(f"same: before, {MATMUL_TILE}x{MATMUL_TILE} tiles (one row of each tile's threads computes)",
                  (tiles, 1, HEADS), (MATMUL_TILE, MATMUL_TILE, 1), CACHE, useful, active=MATMUL_TILE)
    return [after, before]


def _gelu(h, root):
    return 0.5 * h * (1 + np.tanh(root * (h + 0.044715 * h ** 3)))


def mlp_f32(x, w1, w2):
    return _gelu(x @ w1, 0.7978845608) @ w2


def mlp_picogpt(x, w1, w2):
    """picoGPT's GELU: np.sqrt(2 / np.pi) is a float64 scalar: numpy computes the GELU and the second product in
    float64 (the graph's few-row schedule, not the float32 GEMV)."""
    return _gelu(x @ w1, np.sqrt(2 / np.pi)) @ w2


def gelu_rows() -> list[list[str]]:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    import gpu_sim
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((1, C), (C, 4 * C), (4 * C, C))]
    rows = []
    for fn in (mlp_f32, mlp_picogpt):
        traced = gpu_sim.lower_traced(jitop.kernel(fn, target="cuda -arch=sm_90"), *args)
        calls: Counter = Counter()
        gpu_sim.run(traced.func, *traced.arrays, *traced.outputs, calls=calls)
        tanh = calls["tanh"]
        error = np.abs(traced.outputs[0] - fn(*(a.astype(np.float64) for a in args))).max()
        rows.append([f"{fn.__name__} ({traced.outputs[0].dtype})", f"{tanh:,}", f"{tanh / (4 * C):,.0f}",
                     f"{error:.1e}"])
    return rows


def _table(header: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main() -> None:
    header = ["kernel", "blocks", "threads computing / block", "multiply-adds issued", "issued / needed",
              "multiply-adds per thread (in sequence)"]
    _table(header, dense_rows() + attention_rows())
    print()
    _table(["GPT-2's MLP, one row", "GELU evaluations (tanh calls)", "per element of the hidden row (3072)",
            "max error vs float64 numpy"], gelu_rows())


if __name__ == "__main__":
    main()
