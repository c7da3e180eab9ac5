"""A short GPU tuning run (issue 25, item 4): jitop.tune on one SGEMM size of the "cuda.matmul" template, then
the default and the tuned config side by side in GFLOP/s, and the tuned kernel checked against numpy.

Measured by the GPU measurer (CUDA events, the median of 5 measurements, in the isolated runner process); the
tuned kernel is rebuilt through `schedule_matmul(C, target=...)` without a cfg, so the line also shows that
the record is picked up. The cache is a fresh temporary directory (nothing is left behind).

    python benchmarks/bench_gpu_tune.py --size 2048 --budget 60      # about 90 s on an H100
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=2048, help="M = N = K of the SGEMM (default 2048)")
    p.add_argument("--budget", type=float, default=60.0, help="tuning seconds (default 60)")
    p.add_argument("--records", help="also keep every measured record in this JSON-lines file")
    args = p.parse_args()
    os.environ.setdefault("JITOP_CACHE_DIR", tempfile.mkdtemp(prefix="jitop-gpu-tune-"))

    import numpy as np
    import jitop
    from jitop import te
    from jitop.driver import cuda_target
    from jitop.runtime.cuda import driver
    from jitop.topi import cuda
    from jitop.topi.cuda_space import to_cfg
    from jitop.topi.cuda_templates import CudaMatmulWorkload
    from jitop.tuner.task import Task, pick
    from jitop.tuner.tuning import WeightedTask

    if not driver.available():
        print(f"no GPU here: {driver.unavailable_reason()}", file=sys.stderr)
        return 3
    target, n = cuda_target(), args.size
    print(f"GPU: {driver.device_attributes()['name']}; target: {target.describe()}")
    task = Task("cuda.matmul", CudaMatmulWorkload(n, n, n), target)
    print(f"tuning SGEMM {n}^3 float32 for {args.budget:.0f} s over {len(task.config_space())} configs", flush=True)
    start = time.perf_counter()
    report = jitop.tune([WeightedTask(task, 1)], budget=args.budget, records=args.records, progress=True,
                        apply=False, cache=True)
    print(report)
    (row,) = report.tasks
    choice = pick(task)
    default = cuda.default_matmul_config(n, n, n, target)
    print(f"\nSGEMM {n}^3 float32 on {target.arch}: default {row.default_gflops:,.0f} GFLOP/s {default}; tuned "
          f"{row.best_gflops:,.0f} GFLOP/s {to_cfg(choice.config)} ({choice.source}); "
          f"{row.best_gflops / max(row.default_gflops, 1e-9):.2f}x; {row.trials} trials in "
          f"{time.perf_counter() - start:.0f} s")

    # the tuned record, picked by schedule_matmul without a cfg, computes numpy's product
    A, B = te.placeholder((n, n), name="A"), te.placeholder((n, n), name="B")
    C = cuda.matmul(A, B)
    f = jitop.build(cuda.schedule_matmul(C, target=target), [A, B, C], target=target)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
    err = float(np.max(np.abs(f(a, b) - a.astype(np.float64) @ b)))
    ok = err <= 1e-4 * n ** 0.5 * 4
    print(f"tuned kernel vs numpy (float64): max |error| {err:.3g} -> {'OK' if ok else 'WRONG'}")
    return 0 if ok and choice.source == "tuned" else 1


if __name__ == "__main__":
    sys.exit(main())
