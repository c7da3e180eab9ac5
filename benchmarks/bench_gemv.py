"""One-row matmuls, (1, k) @ (k, n) float32: the matmul template's default config against its variants and numpy.

    python benchmarks/bench_gemv.py

The shapes of a GPT-2-small decode step's weights (k x n = 768 x 2304, 768 x 3072, 3072 x 768) and some whose B
fits in cache. The default's two forms: all of K in one loop with k unrolled by 4, and K chunks of 256 rows with k unrolled by 2
(the default takes the second where B is larger than twice the L2); the last column names the default's choice. Each figure is the best
single call (common.best_time) of a kernel built with jitop.build for that config, in this process; GB/s is
B's bytes over the time (B is read once per call).
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPES = ((768, 2304), (768, 3072), (3072, 768), (768, 768), (512, 512), (2048, 64), (1024, 4096))


def variants(default: dict, k: int) -> dict[str, dict]:
    """The two forms the default chooses between: all of K in one, k unrolled by 4 (the default before
    issue 23's second session, and still where B fits in cache); K chunks of 256 rows, k unrolled by 2."""
    return {"K in one, unroll 4": {**default, "tile_k": [-(-k // 4), 4], "k_chunk": 0},
            "K chunks 256, unroll 2": {**default, "tile_k": [-(-k // 2), 2], "k_chunk": 256 if k > 256 else 0}}


def main() -> None:
    os.environ.setdefault("JITOP_NUM_THREADS", "2")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
    os.environ["JITOP_CACHE"] = "0"
    import jitop
    from common import best_time, machine, table
    from jitop.driver import default_target
    from jitop.tuner import registry
    from jitop.tuner.space import Config
    print(machine())
    target, template = default_target(), registry.get("matmul")
    rng = np.random.default_rng(0)
    rows = []
    for k, n in SHAPES:
        wl = template.workload_type(m=1, n=n, k=k, dtype="float32")
        x, w = rng.standard_normal((1, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
        out = np.empty((1, n), np.float32)
        default = template.default_config(wl, target).as_dict()
        row = [f"{k} x {n}", f"{w.nbytes / 2**20:.1f}"]
        for cfg in variants(default, k).values():
            f = jitop.build(*template.build(wl, Config.of(**cfg), target))
            f(x, w, out)
            assert np.allclose(out, x @ w, rtol=1e-3, atol=1e-3)
            t = best_time(lambda: f(x, w, out))
            row.append(f"{t * 1e6:.1f} ({w.nbytes / t / 1e9:.0f})")
        t = best_time(lambda: x @ w)
        rows.append(row + [f"{t * 1e6:.1f} ({w.nbytes / t / 1e9:.0f})", "K chunks" if default["k_chunk"] else "K in one"])
    print()
    print(table(["k x n", "B MiB", *(f"{v} µs (GB/s)" for v in variants({}, 2)), "numpy µs (GB/s)", "default"],
                rows))


if __name__ == "__main__":
    main()
