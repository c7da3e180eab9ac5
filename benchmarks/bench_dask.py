"""Tuning throughput: the local process pool against a Dask LocalCluster of 2 and 4 workers, on the same trials.

One ResNet-18-style program (its six 3x3 convolutions, NCHW, batch 1), tuned by `jitop.tune` with the same
trial budget, seed and tuner in each mode, on a fresh temporary cache each time (never the user's):

- local: `LocalMeasurer` (builds in a pool of one process per core, then runs one at a time);
- local:2, local:4: `--cluster local:N` (every worker builds, one measurement per host at a time).

Reported per mode: trials per minute (cluster start-up excluded, shown apart), the time until the program
estimate (sum over layers of the best seconds found) came within 95 % of the best estimate any mode reached,
the program estimate with the defaults and after all trials (tuning quality for the same trials; the default
`local` mode runs twice, which shows how far two runs of the same mode differ), and where a trial's time goes.
On a 2-core machine the modes share the same two cores, so the cluster can only match the pool; the model
below extrapolates to W machines of C cores from the per-trial build and run seconds measured here:
    batch seconds = B * build_s / (W * C) + B * run_s / W + overhead per batch
(builds spread over every core of every machine, each machine runs its share of the measurements).

    python benchmarks/bench_dask.py [--trials 160] [--modes local,local:2,local:4] [--quick]
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
if __name__ == "__main__":  # not in the spawned measuring processes, which import this module again
    SCRATCH = tempfile.mkdtemp(prefix="jitop-bench-dask-")
    os.environ["JITOP_CACHE_DIR"] = SCRATCH  # before jitop reads it: never the user's cache

import jitop  # noqa: E402
from common import cpu_name, table  # noqa: E402
from jitop.driver import default_target  # noqa: E402
from jitop.tuner import records as rec_io  # noqa: E402
from jitop.tuner.registry import get  # noqa: E402
from jitop.tuner.task import Task  # noqa: E402
from jitop.tuner.tuning import WeightedTask  # noqa: E402

# ResNet-18's 3x3 convolutions, one per stage, and the stride-2 ones between stages: (name, c, oc, hw, stride)
LAYERS = [("layer1", 64, 64, 56, 1), ("layer2 /2", 64, 128, 56, 2), ("layer2", 128, 128, 28, 1),
          ("layer3 /2", 128, 256, 28, 2), ("layer3", 256, 256, 14, 1), ("layer4", 512, 512, 7, 1)]
BATCH = 16


def program_tasks() -> list[WeightedTask]:
    out = []
    for _, c, oc, hw, s in LAYERS:
        wl = get("conv2d").workload_type(n=1, c=c, h=hw, w=hw, oc=oc, kh=3, kw=3, stride=(s, s), pads=(1, 1, 1, 1))
        out.append(WeightedTask(Task("conv2d", wl, default_target()), 1))
    return out


def tune_mode(mode: str, trials: int, seed: int) -> dict:
    """Tune the program in one mode; the records (with their arrival times) and the timings."""
    root = tempfile.mkdtemp(prefix="jitop-bench-dask-run-")
    os.environ["JITOP_CACHE_DIR"] = os.path.join(root, "cache")
    client, start_s = None, 0.0
    try:
        if mode != "local":
            from jitop.tuner.measure_dask import local_cluster
            t0 = time.perf_counter()
            client = local_cluster(int(mode.split(":")[1]))
            start_s = time.perf_counter() - t0
        path = os.path.join(root, "tune.jsonl")
        t0 = time.time()
        report = jitop.tune(program_tasks(), trials=trials, records=path, seed=seed, batch_size=BATCH,
                            early_stopping=None, progress=False, apply=False, cache=False, cluster=client)
        return {"mode": mode, "records": rec_io.load(path), "t0": t0, "seconds": report.seconds,
                "start_s": start_s, "split": report.split}
    finally:
        if client is not None:
            client.close()
            client.cluster.close()
        shutil.rmtree(root, ignore_errors=True)


def default_estimate(run: dict) -> float:
    """The program estimate with every layer's default config (each task's first record)."""
    first: dict[str, float] = {}
    for r in sorted(run["records"], key=lambda r: r.result.timestamp):
        first.setdefault(r.task.key, r.result.cost)
    return sum(first.values())


def curve(run: dict) -> list[tuple[float, float]]:
    """(seconds since the start, program estimate) after each record, in arrival order."""
    best: dict[str, float] = {}
    out = []
    for r in sorted(run["records"], key=lambda r: r.result.timestamp):
        if r.result.ok:
            best[r.task.key] = min(best.get(r.task.key, math.inf), r.result.cost)
        estimate = sum(best.values()) if len(best) == len(LAYERS) else math.inf
        out.append((r.result.timestamp - run["t0"], estimate))
    return out


def time_to(points: list[tuple[float, float]], goal: float) -> float:
    return next((t for t, est in points if est <= goal), math.inf)


def per_trial(run: dict) -> tuple[float, float]:
    """Mean build and run seconds of one trial (as the workers measured them)."""
    recs = [r for r in run["records"] if r.result.ok]
    return (sum(r.result.build_s for r in recs) / len(recs), sum(r.result.run_s for r in recs) / len(recs))


def model_rows(build_s: float, run_s: float, overhead_s: float, cores: int) -> list[list[object]]:
    """Modelled trials/min on `machines` machines of `cores` cores: with batches of BATCH, and with batches
    growing with the cluster (BATCH per machine; the search and model cost per batch taken as constant)."""
    rows = []
    for machines in (1, 2, 4, 8, 16, 32):
        cells = [machines, cores]
        for batch in (BATCH, BATCH * machines):
            batch_s = batch * build_s / (machines * cores) + batch * run_s / machines + overhead_s
            cells.append(f"{60 * batch / batch_s:.0f}")
        rows.append(cells)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=160)
    p.add_argument("--modes", default="local,local:2,local:4,local",
                   help="comma-separated; local twice shows the run-to-run spread of the same mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="48 trials, local and local:2")
    args = p.parse_args()
    trials, modes = (48, ["local", "local:2"]) if args.quick else (args.trials, args.modes.split(","))
    cores = os.cpu_count() or 1
    print(f"Tuning on a Dask cluster — {cpu_name()}, {cores} cores; Target {default_target().describe()}; "
          f"{len(LAYERS)} ResNet-18 3x3 convs, {trials} trials, xgb, batch {BATCH}, seed {args.seed}\n")
    runs = [tune_mode(m, trials, args.seed) for m in modes]
    best_estimate = min(c[-1][1] for c in map(curve, runs))
    rows = []
    for run in runs:
        points = curve(run)
        build_s, run_s = per_trial(run)
        n = len(run["records"])
        rows.append([run["mode"], n, f"{run['seconds']:.1f}", f"{60 * n / run['seconds']:.1f}",
                     f"{time_to(points, best_estimate / 0.95):.1f}", f"{default_estimate(run) * 1e3:.3f}",
                     f"{points[-1][1] * 1e3:.3f}",
                     f"{build_s:.3f}", f"{run_s:.3f}", f"{run['split'].get('build', 0):.1f}",
                     f"{run['split'].get('measure', 0):.1f}", f"{run['start_s']:.1f}"])
    print(table(["mode", "trials", "tuning s", "trials/min", "s to 95% of best", "defaults ms", "tuned ms",
                 "build s/trial", "run s/trial", "build phase s", "run phase s", "cluster start s"], rows))
    local = runs[0]
    build_s, run_s = per_trial(local)
    batches = math.ceil(len(local["records"]) / BATCH)
    work = len(local["records"]) * (build_s / cores + run_s)
    overhead = max(0.0, (local["seconds"] - work) / batches)
    print(f"\nModel of larger clusters from the '{local['mode']}' run: build {build_s:.3f} s and run {run_s:.3f} s per "
          f"trial, {overhead:.2f} s per batch of {BATCH} outside both (search, model, process hand-offs)\n")
    print(table(["machines", "cores each", f"trials/min, batch {BATCH}", f"trials/min, batch {BATCH} x machines"],
                model_rows(build_s, run_s, overhead, cores)
                + model_rows(build_s, run_s, overhead, 8)[1:]))


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(SCRATCH, ignore_errors=True)
