"""`jitop tune`: tune the workloads programs actually ran (the cache's workload log), or those one script
runs (`--script prog.py [-- args...]`), and save the best configs in the cache for every later run.

jitop's options may come before or after `--script prog.py`; the script's own arguments follow `--`
(`jitop tune --script prog.py --budget 40s -- --epochs 3`)."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from jitop.cli.common import CommandError, run_script, table


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `jitop tune`."""
    p = sub.add_parser("tune", help="tune the logged workloads (or a script's, or an ONNX model's) and save the "
                                    "best configs",
                       usage="jitop tune [options] [--script SCRIPT] [-- SCRIPT_ARGS ...] | MODEL.onnx [options]",
                       description="Tune matmul/conv2d workloads. Without --script: those the workload log of the "
                                   "cache recorded (what your programs ran, weighted by their calls); with --script: "
                                   "run that program once to log its workloads, then tune them; with an ONNX model: "
                                   "the model's tasks (at the --shape sizes).",
                       epilog="jitop's options may stand before or after --script SCRIPT; the script's own "
                              "arguments follow --, e.g. jitop tune --script prog.py --budget 40s -- --epochs 3. "
                              "An option jitop does not know, before --, is a usage error.")
    limit = p.add_mutually_exclusive_group()
    limit.add_argument("--budget", help="wall-clock budget for all tasks together, e.g. 10m, 90s (default 10m)")
    limit.add_argument("--trials", type=int, help="total number of measured configs instead of a time budget")
    p.add_argument("--tasks", help="comma-separated filters: tune only tasks whose name or key contains one "
                                   "(e.g. 'conv2d', 'matmul 1024', a task key prefix)")
    p.add_argument("--tuner", choices=("xgb", "random", "grid"), default="xgb", help="search strategy (default xgb)")
    p.add_argument("--target", metavar="cuda", help="'cuda': tune the GPU templates of these workloads on this "
                                                     "machine's NVIDIA GPU (topi.cuda's matmul/conv2d schedules "
                                                     "use the configs found) instead of the CPU's")
    p.add_argument("--out", metavar="FILE.jsonl", help="also append every measured record to this file")
    p.add_argument("--top", type=int, default=16, help="at most this many logged workloads, heaviest first (16)")
    p.add_argument("--cluster", metavar="ADDRESS", help="measure on a Dask cluster: tcp://host:8786 (a running "
                                                         "scheduler) or local:N (N local worker processes); "
                                                         "needs `pip install jitop[dask]`")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    p.add_argument("--script", metavar="SCRIPT",
                   help="run this Python program once (with the arguments after --) and tune the workloads it ran")
    p.add_argument("model", nargs="?", metavar="MODEL.onnx", help="tune this ONNX model's matmul/conv tasks")
    from jitop.cli.models import add_shape_option
    add_shape_option(p)
    p.set_defaults(run=run, script_args=[], takes_script_args=True)


def run(args: argparse.Namespace) -> int:
    """Tune the chosen workloads, save the best configs in the cache, print the before/after table."""
    from jitop.cli.cache import _store
    from jitop.errors import TargetMismatchError
    from jitop.runtime.cuda.driver import CudaUnavailableError
    from jitop.tuner.tuning import WeightedTask, tune
    _hold_tuning_lock(_store())  # a disabled or refused cache: said before tuning, not after
    if args.trials is not None and args.trials < 1:
        raise CommandError(f"--trials must be a positive number, got {args.trials}")
    if args.script is not None and not args.script:
        raise CommandError("--script needs the path of a Python program, e.g. jitop tune --script prog.py")
    _check_cluster_address(args.cluster)
    if args.shape and args.model is None:
        raise CommandError("--shape applies to a model: jitop tune model.onnx --shape NAME=D0,D1,...")
    if args.target is not None and args.target.split()[:1] != ["cuda"]:
        raise CommandError(f"--target {args.target!r}: only 'cuda' (this machine's GPU) is a tuning target; CPU "
                           "workloads are tuned for the CPU they ran on")
    if args.model is not None and args.model.endswith(".py"):
        raise CommandError(f"{args.model} is a Python program: jitop tune --script {args.model} tunes what it runs")
    if args.model is not None:  # an ONNX model's tasks, each with its uses per run
        from jitop.cli.models import model_tasks
        tasks, plan = model_tasks(args)
        print(plan, file=sys.stderr)
        weighted = _filter(tasks, args.tasks)[:args.top]
        if len(weighted) < len(tasks) and not args.tasks:
            print(f"tuning the {len(weighted)} heaviest of its {len(tasks)} tasks (--top {args.top})\n",
                  file=sys.stderr)
    else:
        logged = _script_workloads(args) if args.script else _logged_workloads()
        if not logged:
            raise CommandError("no tunable workload (matmul, conv2d) was logged: run your program with the cache "
                               "enabled first, or give --script prog.py" if not args.script else
                               f"script {args.script!r} ran no tunable workload (matmul, conv2d) under "
                               "@jitop.kernel or jitop operators", status=1)
        chosen = _filter(logged, args.tasks)[:args.top]
        print(_plan_table(chosen), file=sys.stderr)
        weighted = [WeightedTask(w.task, max(1, w.calls)) for w in chosen]
    client = _client(args.cluster)
    try:
        report = tune(weighted, budget=args.budget, trials=args.trials, records=args.out, tuner=args.tuner,
                      progress=not args.no_progress, apply=False, cache=True, cluster=client, target=args.target)
    except ValueError as err:  # a malformed --budget, say
        raise CommandError(str(err)) from None
    except (CudaUnavailableError, TargetMismatchError) as err:  # --target cuda without a GPU, or not this GPU's
        raise CommandError(str(err), status=1) from None
    finally:
        if client is not None:
            client.close()
            if client.cluster is not None:  # the LocalCluster of --cluster local:N
                client.cluster.close()
    print(report)
    print(f"\nbest configs saved in the cache ({_cache_dir()}); later runs pick them with no code change"
          + (f" (jitop.onnx.load({args.model!r}), jitop run and jitop compile; a .jitop file compiled before "
             "keeps its configs: compile it again)" if args.model else "")
          + (f"; every record appended to {args.out}" if args.out else ""))
    return 0


def _check_cluster_address(address: str | None) -> None:
    """A usage error for an ill-formed --cluster before any work is done."""
    if address is None:
        return
    if address.startswith("local:"):
        workers = address.split(":", 1)[1]
        well_formed = workers.isdigit() and int(workers) >= 1
    else:  # tcp://host:port, or host:port (Dask's default protocol)
        well_formed = "://" in address or ":" in address
    if not well_formed:
        raise CommandError(f"--cluster {address!r}: expected tcp://host:port or local:N (N >= 1 workers)")


def _client(address: str | None) -> Any:
    """A distributed.Client for --cluster (None without it)."""
    if address is None:
        return None
    try:
        from jitop.tuner.measure_dask import local_cluster
        if address.startswith("local:"):
            return local_cluster(int(address.split(":", 1)[1]))
        from distributed import Client
        return Client(address, timeout=30)
    except ImportError:
        raise CommandError("--cluster needs Dask's distributed: pip install jitop[dask]") from None
    except ValueError:
        raise CommandError(f"--cluster {address!r}: expected tcp://host:port or local:N (N >= 1 workers)") from None
    except OSError as err:
        raise CommandError(f"--cluster {address!r}: cannot connect ({err})", status=1) from None


_held: list = []  # the lock file stays open (locked) until this process exits


def _hold_tuning_lock(st: Any) -> None:
    """One `jitop tune` per cache directory at a time (background tuners included): an exclusive lock on
    tune.lock in the cache (opened inside the directory the store checked), released when this process ends,
    however it ends."""
    import fcntl
    path = os.path.join(st.directory, "tune.lock")
    fd = os.open(os.path.join(st.path, "tune.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise CommandError(f"another jitop tune is running on this cache ({path} is locked); wait for it",
                           status=1) from None
    _held.append(fd)


def _script_workloads(args: argparse.Namespace) -> list:
    """Run the script once; the workloads it ran (this run's counts, also added to the log)."""
    from jitop import workloads
    workloads.flush()  # earlier counts of this process are not the script's
    run_script(args.script, list(args.script_args))
    ran = workloads.flush()
    return sorted(ran, key=lambda w: -w.seconds)


def _logged_workloads() -> list:
    """Logged workloads whose Target this machine runs (any thread count or build options), heaviest first."""
    from jitop import workloads
    from jitop.errors import TargetMismatchError
    runnable, foreign = [], 0
    for w in workloads.logged():
        try:
            w.task.target.check_runs_on(what=str(w.task))
            runnable.append(w)
        except TargetMismatchError:
            foreign += 1
    if foreign:
        print(f"skipping {foreign} logged workload(s) built for a CPU this machine cannot run", file=sys.stderr)
    return runnable


def _filter(logged: list, spec: str | None) -> list:
    """The workloads (anything with a .task) matching any of the comma-separated filters (a usage error if one
    matches nothing)."""
    if not spec:
        return logged
    from jitop.tuner.report import describe_task
    filters = [f.strip() for f in spec.split(",") if f.strip()]
    chosen = []
    for f in filters:
        hits = [w for w in logged if f in describe_task(w.task) or w.task.key.startswith(f)]
        if not hits:
            names = "; ".join(describe_task(w.task) for w in logged[:10])
            raise CommandError(f"--tasks filter {f!r} matches none of the {len(logged)} workload(s): {names}")
        chosen += [w for w in hits if w not in chosen]
    return chosen


def _plan_table(chosen: list) -> str:
    from jitop.tuner.report import describe_task
    total = sum(w.seconds for w in chosen) or 1.0
    rows = [[describe_task(w.task), str(w.calls), f"{w.seconds * 1e3:.1f}", f"{100 * w.seconds / total:.0f}%",
             ", ".join(w.functions[:3])] for w in chosen]
    return "tuning these workloads:\n" + table(rows, ["task", "calls", "ms", "share", "functions"]) + "\n"


def _cache_dir() -> str:
    from jitop import config
    return config.cache_dir()
