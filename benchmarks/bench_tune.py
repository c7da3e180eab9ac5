"""Auto-tuning (issue 11): what tuning gains over the default configs, how fast the search finds it.

    python benchmarks/bench_tune.py                      # both sections (about 20 minutes on 2 cores)
    python benchmarks/bench_tune.py --budget 5m --sections program
    python benchmarks/bench_tune.py --quick              # smoke test: tiny budget, printed only

1. program: the matmuls (1024^3, 128x768x3072, 127x513x255) and the ResNet-18 convolutions (stem, layer1-4,
   NCHW and NHWC) tuned together by `jitop.tune` with one wall-clock budget (xgb); then each op timed with
   its default config and with the tuned one (apply_records), next to numpy (both OpenBLAS settings) and
   torch (NCHW / channels_last) in the same run; the time to reach 95 % of each task's best; the split of
   tuning time into build / measure / model / search.
2. search: on one workload, xgb vs random vs grid (3 seeds each, a shared memo so a config is measured once
   whoever proposes it): best-so-far against trials and seconds, and the trials each needs to reach 95 % of
   the best random search found.
"""
from __future__ import annotations

import argparse
import math
import os
import pathlib
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import jitop  # noqa: E402
from bench_ops import (fmt_peak, fmt_ratio, geomean, gflops, numpy_subprocess, ratio, strict_ops,  # noqa: E402
                       timed, to_numpy)
from common import (Im2colConv2d, machine, numpy_conv2d_seconds, numpy_label, numpy_matmul_seconds,  # noqa: E402
                    pct_of_peak, peak_gflops, table, versions)
from jitop.tuner import records as rec_io  # noqa: E402
from jitop.tuner.measure import LocalMeasurer, MeasureInput, MeasureOptions  # noqa: E402
from jitop.tuner.records import Record  # noqa: E402
from jitop.tuner.registry import get  # noqa: E402
from jitop.tuner.report import describe_task  # noqa: E402
from jitop.tuner.search import make_search  # noqa: E402
from jitop.tuner.task import Task  # noqa: E402
from jitop.tuner.tuning import WeightedTask  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

MATMULS = [(1024, 1024, 1024), (128, 3072, 768), (127, 513, 255)]   # (m, n, k)
# (label, C, H=W, OC, K, stride, padding): the ResNet-18 convolutions, batch 1
CONVS = [("stem 3x224 -> 64, 7x7/2", 3, 224, 64, 7, 2, 3), ("layer1 64x56 -> 64", 64, 56, 64, 3, 1, 1),
         ("layer2 128x28 -> 128", 128, 28, 128, 3, 1, 1), ("layer3 256x14 -> 256", 256, 14, 256, 3, 1, 1),
         ("layer4 512x7 -> 512", 512, 7, 512, 3, 1, 1)]
QUICK_MATMULS = [(64, 96, 80)]
QUICK_CONVS = [("small 16x14 -> 16", 16, 14, 16, 3, 1, 1)]


def conv_task(c: int, hw: int, oc: int, k: int, s: int, p: int, layout: str, target: jitop.Target) -> Task:
    wl = get("conv2d").workload_type(n=1, c=c, h=hw, w=hw, oc=oc, kh=k, kw=k, stride=(s, s), pads=(p, p, p, p),
                                     dilation=(1, 1), groups=1, layout=layout, dtype="float32")
    return Task("conv2d", wl, target)


def matmul_task(m: int, n: int, k: int, target: jitop.Target) -> Task:
    return Task("matmul", get("matmul").workload_type(m=m, n=n, k=k, dtype="float32"), target)


# ** 1. the program **

def program_tasks(quick: bool, target: jitop.Target) -> list[tuple[str, Task, tuple]]:
    out = [(f"matmul {m}x{n}x{k}", matmul_task(m, n, k, target), ("matmul", m, n, k))
           for m, n, k in (QUICK_MATMULS if quick else MATMULS)]
    for label, c, hw, oc, k, s, p in (QUICK_CONVS if quick else CONVS):
        for layout in ("NCHW", "NHWC"):
            out.append((f"{label} {layout}", conv_task(c, hw, oc, k, s, p, layout, target),
                        ("conv2d", c, hw, oc, k, s, p, layout)))
    return out


def time_op(spec: tuple, rng: np.random.Generator) -> dict[str, object]:
    """Seconds of jitop (with whatever configs `pick` gives now), torch and numpy on one op."""
    if spec[0] == "matmul":
        _, m, n, k = spec
        a, b = rng.random((m, k), dtype=np.float32), rng.random((k, n), dtype=np.float32)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        jit, err = timed(lambda: jitop.matmul(a, b), ref, 1e-4)
        tch = "n/a"
        if torch is not None:
            at, bt = torch.from_numpy(a), torch.from_numpy(b)
            tch, _ = timed(lambda: torch.matmul(at, bt), ref, 1e-4)
        nps = numpy_subprocess(lambda core: numpy_matmul_seconds(m, n, k, core))
        return {"jitop": jit, "err": err, "torch": tch, "numpy": nps}
    _, c, hw, oc, k, s, p, layout = spec
    x, w = rng.random((1, c, hw, hw), dtype=np.float32), rng.random((oc, c, k, k), dtype=np.float32)
    ref = Im2colConv2d(x.shape, w.shape, s, p, dtype=np.float64)(x.astype(np.float64), w.astype(np.float64))
    if layout == "NCHW":
        jit, err = timed(lambda: jitop.conv2d(x, w, stride=s, padding=p), ref, 1e-4)
    else:
        xh = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        jit, err = timed(lambda: jitop.conv2d(xh, w, stride=s, padding=p, layout="NHWC"), ref, 1e-4,
                         view=lambda y: to_numpy(y).transpose(0, 3, 1, 2))
    tch = "n/a"
    if torch is not None:
        xt, wt = torch.from_numpy(x), torch.from_numpy(w)
        if layout == "NHWC":
            xt, wt = (t.contiguous(memory_format=torch.channels_last) for t in (xt, wt))
        with torch.no_grad():
            tch, _ = timed(lambda: torch.nn.functional.conv2d(xt, wt, stride=s, padding=p), ref, 1e-4)
    nps = numpy_subprocess(lambda core: numpy_conv2d_seconds(x.shape, w.shape, s, p, core))
    return {"jitop": jit, "err": err, "torch": tch, "numpy": nps}


def seconds_to_95(records: list, start: float) -> float:
    """Seconds from `start` until a record reached 95 % of the best of `records`."""
    ok = sorted((r for r in records if r.result.ok), key=lambda r: r.result.timestamp)
    if not ok:
        return math.nan
    best = max(r.gflops for r in ok)
    return next(r.result.timestamp - start for r in ok if r.gflops >= 0.95 * best)


def section_program(args: argparse.Namespace, peak: float | None, target: jitop.Target) -> str:
    tasks = program_tasks(args.quick, target)
    path = os.path.join(args.workdir, "program.jsonl")
    start = time.time()
    report = jitop.tune([WeightedTask(t, 1) for _, t, _ in tasks], budget=args.budget, records=path,
                        tuner="xgb", seed=0, apply=False, peak_gflops=peak, progress=True)
    recs = rec_io.load(path)
    rng = np.random.default_rng(0)
    rows, vs_torch = [], {"NCHW": [], "NHWC": [], "matmul": []}
    for (label, task, spec), row in zip(tasks, report.tasks):
        default = time_op(spec, rng)
        with jitop.apply_records(recs):
            tuned = time_op(spec, rng)
        flops = float(task.flops)
        g = {k: gflops(flops, v) for k, v in (("default", default["jitop"]), ("tuned", tuned["jitop"]),
                                               ("torch", tuned["torch"]), ("np_h", tuned["numpy"][0]),
                                               ("np_a", tuned["numpy"][1]))}
        kind = "matmul" if spec[0] == "matmul" else spec[-1]
        vs_torch[kind].append(ratio(g["tuned"], g["torch"]))
        own = [r for r in recs if r.task.key == task.key]
        rows.append([label, g["default"], g["tuned"], pct_of_peak(g["tuned"], peak), g["np_h"], g["np_a"], g["torch"],
                     fmt_ratio(ratio(g["tuned"], g["torch"])), fmt_ratio(ratio(g["tuned"], g["np_a"])), row.trials,
                     f"{seconds_to_95(own, start):.0f}", tuned["err"]])
    np_h, np_a = numpy_label("Haswell", short=True), numpy_label(None, short=True)
    torch_note = "torch NCHW for NCHW rows, channels_last for NHWC rows, torch.matmul for matmuls"
    summary = []
    for kind in ("NCHW", "NHWC"):
        rs = vs_torch[kind]
        if rs and all(isinstance(r, float) for r in rs):
            summary.append(f"- conv2d {kind} tuned / torch: lowest {min(rs):.2f}, geometric mean {geomean(rs):.2f} "
                           f"(target: every layer >= 1.0, geomean >= 1.15)")
    split = ", ".join(f"{k} {v:.0f} s" for k, v in (report.split or {}).items())
    return (f"### 1. The program's tasks tuned together: budget {args.budget}, xgb, {report.seconds:.0f} s in all; "
            f"peak {fmt_peak(peak)}\n\n"
            f"GFLOP/s of each op called through jitop (default config, then with the tuned records applied), "
            f"numpy (both OpenBLAS settings) and torch ({torch_note}), same run. Trials: measured configs of "
            f"the task (its default included); to 95 %: seconds from the start of tuning until the task's "
            f"best-so-far reached 95 % of its final best. Tuning time split: {split}.\n\n"
            + table(["op", "jitop default", "jitop tuned", f"tuned % of peak ({fmt_peak(peak, unit=False)})",
                     np_h, np_a, "torch", "tuned / torch", f"tuned / {np_a}", "trials", "s to 95 %",
                     "tuned max rel err"], rows)
            + "\n\n" + "\n".join(summary) + "\n\nThe tuner's own table (its measurements, not re-timed):\n\n```\n"
            + str(report) + "\n```")


# ** 2. search efficiency **

class MemoMeasurer:
    """Measures each (task, config) once; strategies and seeds share the results (one measurement each)."""

    def __init__(self, inner: LocalMeasurer):
        self.inner, self.memo = inner, {}  # (task key, config) -> result

    def measure(self, inputs: list[MeasureInput], on_result=None) -> list:  # noqa: ANN001
        new = [i for i in dict.fromkeys(inputs) if (i.task.key, i.config) not in self.memo]
        for inp, res in zip(new, self.inner.measure(new) if new else []):
            self.memo[(inp.task.key, inp.config)] = res
        results = [self.memo[(i.task.key, i.config)] for i in inputs]
        for n, r in enumerate(results if on_result is not None else []):
            on_result(n, r)
        return results


def search_curve(name: str, task: Task, seed: int, trials: int, measurer: MemoMeasurer, batch: int = 16
                 ) -> tuple[list[float], list[float]]:
    """Best GFLOP/s after each trial, and the tuning seconds spent by then (its own builds, runs, model and
    search; a config measured first by another strategy costs what it cost then)."""
    search = make_search(name, task, seed=seed)
    best, curve, secs, spent = 0.0, [], [], 0.0
    while len(curve) < trials and search.has_next():
        before = sum(search.seconds.values())
        configs = search.next_batch(min(batch, trials - len(curve)))
        inputs = [MeasureInput(task, c) for c in configs]
        results = measurer.measure(inputs)
        search.update(inputs, results)
        spent += sum(search.seconds.values()) - before
        for res in results:  # builds of a batch run side by side on every core
            spent += res.build_s / (os.cpu_count() or 1) + res.run_s
            best = max(best, task.flops / res.cost / 1e9 if res.ok else 0.0)
            curve.append(best)
            secs.append(spent)
    return curve, secs


def section_search(args: argparse.Namespace, target: jitop.Target) -> str:
    c, hw, oc, k, s, p = (16, 14, 16, 3, 1, 1) if args.quick else (256, 14, 256, 3, 1, 1)
    task = conv_task(c, hw, oc, k, s, p, "NCHW", target)
    trials = {"random": 40 if args.quick else args.random_trials, "grid": 40 if args.quick else args.xgb_trials,
              "xgb": 40 if args.quick else args.xgb_trials}
    curves: dict[str, list] = {}
    with LocalMeasurer(MeasureOptions()) as inner:
        measurer = MemoMeasurer(inner)
        for name in ("random", "xgb", "grid"):
            for seed in range(1 if name == "grid" else 3):
                t0 = time.perf_counter()
                curve, secs = search_curve(name, task, seed, trials[name], measurer)
                curves.setdefault(name, []).append((curve, secs))
                print(f"  {name} seed {seed}: best {curve[-1]:.1f} GFLOP/s after {len(curve)} trials "
                      f"({time.perf_counter() - t0:.0f} s, {len(measurer.memo)} configs measured so far)", flush=True)
    args.search_records = [Record(task, cfg, res) for (_, cfg), res in measurer.memo.items()]
    random_best = float(np.median([cv[-1] for cv, _ in curves["random"]]))
    goal = 0.95 * random_best
    rows = []
    for name, runs in curves.items():
        reach = [next((k + 1 for k, g in enumerate(cv) if g >= goal), None) for cv, _ in runs]
        secs = [sc[k - 1] if k else None for (_, sc), k in zip(runs, reach)]
        med = _median_or_none(reach)
        rows.append([name, len(runs), len(runs[0][0]), f"{np.median([cv[-1] for cv, _ in runs]):.1f}",
                     " / ".join(str(r) if r else "-" for r in reach), med if med is not None else "not reached",
                     " / ".join(f"{x:.0f}" if x is not None else "-" for x in secs)])
    plot_note = _plot(curves, args)
    x_med = _median_or_none([next((k + 1 for k, g in enumerate(cv) if g >= goal), None) for cv, _ in curves["xgb"]])
    r_med = _median_or_none([next((k + 1 for k, g in enumerate(cv) if g >= goal), None) for cv, _ in curves["random"]])
    verdict = (f"xgb median {x_med} trials vs random {r_med}: "
               + ("met" if x_med is not None and r_med is not None and x_med * 3 <= r_med else "NOT met")
               + " (target: xgb <= 1/3 of random's trials)")
    return (f"### 2. Search efficiency on ResNet-18 conv {c}x{hw}x{hw} -> {oc}, {k}x{k}/{s}, NCHW "
            f"({len(task.config_space())} configs in its space)\n\n"
            f"Goal: 95 % of the best a {trials['random']}-trial random search finds (median over 3 seeds: "
            f"{random_best:.1f} GFLOP/s) = {goal:.1f} GFLOP/s. Measured once per config and shared between the "
            f"runs; seconds: each run's own builds (on "
            f"{os.cpu_count()} build workers), measurements, model fitting and search.\n\n"
            + table(["tuner", "seeds", "trials per seed", "median best GFLOP/s", "trials to goal per seed",
                     "median trials to goal", "seconds to goal per seed"], rows)
            + f"\n\n- {verdict}\n" + plot_note)


# ** 3. the cost model on the search section's measurements **

def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def knob_only_predictions(task: Task, train: list, test: list) -> np.ndarray:
    """The same booster on the knob positions alone (the baseline the lowered-loop features must beat)."""
    import xgboost as xgb
    from jitop.tuner import model as M
    space = task.config_space()
    y = np.array([r.gflops for r in train])
    dm = xgb.DMatrix(np.array([space.knob_vector(r.config) for r in train], dtype=np.float32), label=y / y.max())
    dm.set_group([len(y)])
    booster = xgb.train({**M.PARAMS, "seed": 0}, dm, num_boost_round=M.ROUNDS)
    return booster.predict(xgb.DMatrix(np.array([space.knob_vector(r.config) for r in test], dtype=np.float32)))


def section_model(args: argparse.Namespace, target: jitop.Target) -> str:
    from jitop.tuner import features as F
    from jitop.tuner.model import CostModel
    recs = [r for r in getattr(args, "search_records", []) if r.result.ok]
    if len(recs) < 80:
        return "### 3. Cost model\n\n(needs the search section's measurements: run with --sections search model)"
    task = recs[0].task
    rows = []
    rng = np.random.default_rng(0)
    for n_train in (32, 64, 128, 256):
        if n_train >= len(recs) - 20:
            continue
        rhos, knob = [], []
        for seed in range(3):
            order = rng.permutation(len(recs))
            train, test = [recs[i] for i in order[:n_train]], [recs[i] for i in order[n_train:]]
            truth = np.array([r.gflops for r in test])
            model = CostModel(task, seed=seed)
            model.fit(train)
            rhos.append(spearman(model.predict([r.config for r in test]), truth))
            knob.append(spearman(knob_only_predictions(task, train, test), truth))
        rows.append([n_train, len(recs) - n_train, f"{np.median(rhos):.3f}", f"{np.median(knob):.3f}"])
    speed = []
    for label, t in (("matmul 1024^3", matmul_task(1024, 1024, 1024, target)), (describe_task(task), task),
                     ("conv layer3 NHWC", conv_task(256, 14, 256, 3, 1, 1, "NHWC", target))):
        space = t.config_space()
        configs = [space.get(int(i)) for i in np.random.default_rng(1).choice(len(space), 500, replace=False)]
        F._CACHES.clear()
        t0 = time.perf_counter()
        F.features(t, configs)
        cold = len(configs) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        all_configs = list(space)
        F.features(t, all_configs)
        whole = len(all_configs) / (time.perf_counter() - t0)
        speed.append([label, len(space), f"{cold:.0f}", f"{whole:.0f}"])
    return ("### 3. Cost model on the search section's measurements\n\n"
            f"Held-out Spearman rank correlation of predicted vs measured GFLOP/s on {describe_task(task)} "
            f"({len(recs)} measured configs; median over 3 random splits): the XGBoost rank model on lowered-loop "
            "features + knobs (`CostModel`) against the same booster on the knob positions alone.\n\n"
            + table(["train records", "test records", "CostModel", "knob-only"], rows)
            + "\n\nFeature extraction, one process (configs/s; target >= 1000): 500 random configs of an empty "
            "memo (cold), then the rest of the space (configs of one class share one fit):\n\n"
            + table(["task", "space", "cold, 500 random", "rest of the space"], speed))


def _median_or_none(values: list) -> float | None:
    if any(v is None for v in values):
        vals = sorted(v if v is not None else math.inf for v in values)
        mid = vals[len(vals) // 2]
        return None if math.isinf(mid) else mid
    return float(np.median(values))


def _plot(curves: dict, args: argparse.Namespace) -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "- (matplotlib not installed: no plot)"
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, runs in curves.items():
        for k, (cv, secs) in enumerate(runs):
            a.plot(range(1, len(cv) + 1), cv, label=f"{name} seed {k}")
            b.plot(secs, cv, label=f"{name} seed {k}")
    a.set(xlabel="trials", ylabel="best GFLOP/s so far")
    b.set(xlabel="seconds", ylabel="best GFLOP/s so far")
    a.legend(fontsize="small")
    fig.tight_layout()
    out = pathlib.Path(__file__).resolve().parent / ("tune_curves_quick.png" if args.quick else "tune_curves.png")
    fig.savefig(out)
    return f"- best-so-far curves: benchmarks/{out.name}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny workloads and budget (smoke test)")
    p.add_argument("--sections", nargs="+", choices=["program", "search", "model"],
                   default=["program", "search", "model"])
    p.add_argument("--budget", default="10m", help="wall-clock budget of the program section (default 10m)")
    p.add_argument("--random-trials", type=int, default=1000)
    p.add_argument("--xgb-trials", type=int, default=300)
    p.add_argument("--workdir", default=None, help="where the records go (default: a temporary directory)")
    args = p.parse_args()
    if args.quick:
        args.budget = "40s"
    strict_ops()
    target = jitop.Target.current()
    peak = peak_gflops(target.threads)
    with tempfile.TemporaryDirectory() as tmp:
        args.workdir = args.workdir or tmp
        print(f"Auto-tuning{' (--quick)' if args.quick else ''} — {machine()}; {versions('torch', 'llvmlite', 'xgboost-cpu')}; "
              f"1-min load average at start {os.getloadavg()[0]:.2f}\n", flush=True)
        start = time.perf_counter()
        if "program" in args.sections:
            print(section_program(args, peak, target) + "\n", flush=True)
        if "search" in args.sections:
            print(section_search(args, target) + "\n", flush=True)
        if "model" in args.sections:
            print(section_model(args, target) + "\n", flush=True)
        print(f"Total {time.perf_counter() - start:.0f} s; 1-min load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
