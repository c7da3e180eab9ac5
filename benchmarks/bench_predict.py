"""Zero-shot configs: how good is the cost model's predicted config on convolutions that were never tuned?

1. Train: `jitop.tune` on ResNet-18's convolutions (NCHW, batch 1: the 3x3 ones of each stage, the stride-2 3x3
   ones into layers 2 and 3, and the 1x1 stride-2 shortcuts) with one budget, on a fresh temporary cache; it
   keeps its records there and trains the conv2d model for this Target (which then predicts for the kinds it
   saw: 3x3 and 1x1).
2. Unseen: ResNet-50's and MobileNet-V1's 1x1 convolutions (shapes no training task has). For each, `pick`
   gives the predicted config (no measurement); then `jitop.tune(trials=N)` on that task alone (not saved)
   gives the default's and the tuned best's GFLOP/s; the predicted config is measured in the same measurer.
   Reported: predicted / tuned best (target: geomean >= 0.8) and predicted / default (target: >= 1 on each),
   and the seconds of the first `pick` (it ranks the space once; later processes read the stored choice).

    python benchmarks/bench_predict.py [--train-budget 4m] [--trials 48] [--quick]
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
if __name__ == "__main__":  # not in the measurer's spawned processes, which import this module again
    CACHE = tempfile.mkdtemp(prefix="jitop-bench-predict-")
    os.environ["JITOP_CACHE_DIR"] = CACHE  # before jitop reads it: never the user's cache

import jitop  # noqa: E402
from common import cpu_name, table  # noqa: E402
from jitop.driver import default_target  # noqa: E402
from jitop.tuner.measure import LocalMeasurer, MeasureInput, MeasureOptions  # noqa: E402
from jitop.tuner.registry import get  # noqa: E402
from jitop.tuner.task import Task, pick  # noqa: E402
from jitop.tuner.tuning import WeightedTask  # noqa: E402

# (name, c, oc, hw, kernel, stride)
TRAIN = [("r18 layer1", 64, 64, 56, 3, 1), ("r18 layer2 /2", 64, 128, 56, 3, 2), ("r18 layer2", 128, 128, 28, 3, 1),
         ("r18 layer3 /2", 128, 256, 28, 3, 2), ("r18 layer3", 256, 256, 14, 3, 1), ("r18 layer4", 512, 512, 7, 3, 1),
         # ResNet-18's 1x1 stride-2 shortcut convolutions: a model predicts only for kinds it saw
         ("r18 shortcut 2 /2", 64, 128, 56, 1, 2), ("r18 shortcut 3 /2", 128, 256, 28, 1, 2),
         ("r18 shortcut 4 /2", 256, 512, 14, 1, 2)]
UNSEEN = [("r50 1x1 64->256 @56", 64, 256, 56, 1, 1), ("r50 1x1 256->64 @56", 256, 64, 56, 1, 1),
          ("r50 1x1 1024->256 @14", 1024, 256, 14, 1, 1), ("mobilenet 1x1 128->128 @56", 128, 128, 56, 1, 1),
          ("mobilenet 1x1 512->512 @14", 512, 512, 14, 1, 1), ("mobilenet 1x1 1024->1024 @7", 1024, 1024, 7, 1, 1)]


_keep = [False]


def conv_task(c: int, oc: int, hw: int, k: int, stride: int) -> Task:
    pad = k // 2
    wl = get("conv2d").workload_type(n=1, c=c, h=hw, w=hw, oc=oc, kh=k, kw=k, stride=(stride, stride),
                                     pads=(pad, pad, pad, pad))
    return Task("conv2d", wl, default_target())


def gflops(task: Task, seconds: float) -> float:
    return task.flops / seconds / 1e9 if 0 < seconds < math.inf else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-budget", default="4m")
    p.add_argument("--trials", type=int, default=48, help="trials of the reference tuning of each unseen shape")
    p.add_argument("--quick", action="store_true", help="train 60 s, 16 reference trials, 3 unseen shapes")
    p.add_argument("--keep-cache", action="store_true", help="keep the temporary cache (training records, model)")
    args = p.parse_args()
    _keep[0] = args.keep_cache
    budget, trials, unseen = ("60s", 16, UNSEEN[:3]) if args.quick else (args.train_budget, args.trials, UNSEEN)
    print(f"Predicted configs — {cpu_name()}, {os.cpu_count()} cores; Target {default_target().describe()}; "
          f"training: jitop.tune budget {budget} on {len(TRAIN)} ResNet-18 convs (3x3 and 1x1 /2); reference: {trials} trials each\n")
    jitop.tune([WeightedTask(conv_task(*t[1:]), 1) for t in TRAIN], budget=budget, records=None, progress=False,
               apply=False)
    rows, ratios_best, ratios_default = [], [], []
    with LocalMeasurer(MeasureOptions()) as measurer:
        for name, *shape in unseen:
            task = conv_task(*shape)
            start = time.perf_counter()
            choice = pick(task)  # ranks the space (once: the choice is stored)
            ranking = time.perf_counter() - start
            report = jitop.tune([WeightedTask(task, 1)], trials=trials, records=None, progress=False, apply=False,
                                cache=False)
            (predicted,) = measurer.measure([MeasureInput(task, choice.config)])
            row = report.tasks[0]
            pred = gflops(task, predicted.cost)
            best = max(row.best_gflops, pred)
            ratios_best.append(pred / best)
            ratios_default.append(pred / row.default_gflops)
            is_default = choice.config == get("conv2d").default_config(task.workload, task.target)
            rows.append([name, choice.source + (" (the default)" if is_default else ""), f"{row.default_gflops:.1f}", f"{pred:.1f}", f"{best:.1f}",
                         f"{pred / best:.2f}", f"{pred / row.default_gflops:.2f}", f"{ranking:.2f}"])
    print(table(["unseen conv (1x1, batch 1, NCHW)", "source", "default GFLOP/s", "predicted GFLOP/s",
                 "tuned best GFLOP/s", "predicted / best", "predicted / default", "pick s"], rows))
    geo = math.exp(sum(math.log(r) for r in ratios_best) / len(ratios_best))
    worst = min(ratios_default)
    print(f"\ngeomean predicted / tuned best: {geo:.2f} (target >= 0.8: {'met' if geo >= 0.8 else 'NOT met'}); "
          f"lowest predicted / default: {worst:.2f} (target >= 1 on every shape: "
          f"{'met' if worst >= 1.0 else 'NOT met'}; measurement noise is about +-3 %)")


if __name__ == "__main__":
    try:
        main()
    finally:
        if _keep[0]:
            print(f"cache kept in {CACHE}")
        else:
            shutil.rmtree(CACHE, ignore_errors=True)
