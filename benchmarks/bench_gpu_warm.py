"""Cold vs warm start of `@jitop.kernel(target="cuda")` on a GPU machine: the first call of a traced function in a
fresh process with an empty cache directory (trace, lowering, PTX, the driver's PTX JIT), then in a second fresh
process with the cache the first one filled (trace, then the cached cubin loaded), then a later call.

    python benchmarks/bench_gpu_warm.py [--out report.md]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np, jitop
t_import = time.perf_counter() - t0

@jitop.kernel(target="cuda")
def block(x, w1, w2, g):
    h = np.maximum(x @ w1, 0) @ w2 + x
    mu = h.mean(axis=-1, keepdims=True)
    var = ((h - mu) ** 2).mean(axis=-1, keepdims=True)
    return (h - mu) / np.sqrt(var + 1e-5) * g

rng = np.random.default_rng(0)
x = rng.standard_normal((256, 512)).astype(np.float32)
w1 = (rng.standard_normal((512, 1024)) / 32).astype(np.float32)
w2 = (rng.standard_normal((1024, 512)) / 32).astype(np.float32)
g = np.ones(512, np.float32)
t1 = time.perf_counter()
y = block(x, w1, w2, g)
first = time.perf_counter() - t1
t2 = time.perf_counter()
for _ in range(10):
    y = block(x, w1, w2, g)
later = (time.perf_counter() - t2) / 10
h = np.maximum(x.astype(np.float64) @ w1, 0) @ w2 + x
mu = h.mean(axis=-1, keepdims=True)
ref = (h - mu) / np.sqrt(((h - mu) ** 2).mean(axis=-1, keepdims=True) + 1e-5)
print(json.dumps({"import_s": t_import, "first_call_s": first, "later_call_s": later,
                  "max_err": float(np.abs(y - ref).max())}))
"""


def run_child(cache: str) -> dict:
    env = {**os.environ, "JITOP_CACHE_DIR": cache}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="jitop-gpu-warm-") as cache:
        cold, warm = run_child(cache), run_child(cache)
    rows = ["| process | import (s) | first call (s) | later call (ms) | max error vs float64 |", "|---|---|---|---|---|"]
    for name, r in (("cold (empty cache)", cold), ("warm (cache filled)", warm)):
        rows.append(f"| {name} | {r['import_s']:.2f} | {r['first_call_s']:.3f} | {r['later_call_s'] * 1e3:.2f} | "
                    f"{r['max_err']:.1e} |")
    text = ("\n### @jitop.kernel(target=\"cuda\"): cold vs warm process (an MLP block with layer norm, 256x512)\n\n"
            + "\n".join(rows) + "\n\nA call copies the numpy arguments to the GPU and the result back.\n")
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
