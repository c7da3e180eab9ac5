"""The persistent kernel cache: what a program's first call costs in a fresh process, with an empty cache
and with a warm one.

    python benchmarks/bench_cache.py                       # every section
    python benchmarks/bench_cache.py --sections coldwarm --repeat 5
    python benchmarks/bench_cache.py --quick               # smoke test: one warm process, fewer steady calls

1. coldwarm: five workloads under @jitop.kernel (fallback=False): a 10-op elementwise chain
   (bench_kernel.ten_ops) on 2**20 float32, softmax over the last axis of (512, 1024) float32
   (bench_kernel.softmax), a @ b on 1024x1024 float32, jitop.conv2d on ResNet-18's layer1 shape
   (1x64x56x56, 64 3x3 filters, padding 1) and the GPT-2-small block of bench_models (T=128, one kernel).
   Every figure comes from fresh child processes (`python -c`), each workload with its own new temporary
   JITOP_CACHE_DIR (never the user's cache; removed at the end):
   - cold: the first process, on the empty directory: `import jitop` time and the first call (trace,
     lower, LLVM, save; it also builds the thread pool and the native call entry, whose object code the
     cache keeps too), both timed with time.perf_counter inside the child;
   - warm: --repeat more processes on the same directory (median reported): the first call,
     `jitop.codegen.target.compile_count()` after it (LLVM runs in this process; 0 when everything came
     from disk) and each signature's `f.cache[key].lookup.status`;
   - steady: one more warm process times a few calls after the first (median), the scale the first call is
     read against;
   - process: the wall time of the cold and warm processes as the parent sees them (start of `python -c`
     to exit: interpreter, imports, building the inputs, the first call, exit).
   Each warm result is compared with the cold process's result (saved as .npy): code loaded from disk
   must compute what the freshly compiled code computed. Before the workloads, one untimed process imports
   everything with JITOP_CACHE=0, so Python's own bytecode cache (.pyc) and the OS file cache are warm in
   the cold process too: the cold/warm difference is jitop's cache alone.
   Targets: a warm first call of at most 5 ms per kernel; the GPT-2 block (one kernel for the whole traced
   function) at most 100 ms.

JITOP_NUM_THREADS and OPENBLAS_NUM_THREADS default to 2 (as in bench_models.py); the children inherit them.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
THREADS = 2
for _var in ("JITOP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, str(THREADS))  # before numpy and jitop load (here and in the children)

import numpy as np  # noqa: E402

import jitop  # noqa: E402
from bench_kernel import softmax, ten_ops  # noqa: E402
from bench_models import args_gpt2, gpt2_block, median_time  # noqa: E402
from common import busy_cores, cpu_name, table, versions  # noqa: E402


# ** the workloads (module-level functions: a kernel's cache identity is its module.qualname) **

def matmul(a, b):
    return a @ b


def conv2d_layer1(x, w):
    return jitop.conv2d(x, w, padding=1)


def args_chain() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(20)
    return tuple(rng.random(1 << 20, dtype=np.float32) for _ in range(3))  # in [0, 1): b + 2 never 0


def args_softmax() -> tuple[np.ndarray, ...]:
    return (np.random.default_rng(21).standard_normal((512, 1024)).astype(np.float32),)


def args_matmul() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(22)
    return tuple(rng.random((1024, 1024), dtype=np.float32) for _ in range(2))


def args_conv2d() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(23)
    return rng.random((1, 64, 56, 56), dtype=np.float32), rng.random((64, 64, 3, 3), dtype=np.float32)


@dataclass(frozen=True)
class Workload:
    label: str
    fn: Callable
    make_args: Callable[[], tuple]
    target_ms: float  # warm first call target (5 ms per kernel; the GPT-2 block as a whole 100 ms)


WORKLOADS = {
    "chain": Workload("10-op elementwise chain, 2^20 f32", ten_ops, args_chain, 5.0),
    "softmax": Workload("softmax (512, 1024) f32", softmax, args_softmax, 5.0),
    "matmul": Workload("matmul 1024^3 f32", matmul, args_matmul, 5.0),
    "conv2d": Workload("conv2d ResNet-18 layer1 64x56x56, 3x3", conv2d_layer1, args_conv2d, 5.0),
    "gpt2": Workload("GPT-2 block T=128", gpt2_block, args_gpt2, 100.0),
}


# ** the child process: import jitop, build the inputs, time the first call, report as JSON **

# `import jitop` is timed before anything else imports it (bench_cache imports it too)
CHILD = """import time
t0 = time.perf_counter()
import jitop
import_s = time.perf_counter() - t0
import sys
sys.path.insert(0, {here!r})
from bench_cache import child_main
child_main(import_s)
"""


def tiny(a):
    return a + 1


def child_main(import_s: float) -> None:
    """In the child: argv = workload, steady calls (0: none), reference .npy (written if absent, else compared).
    A steady-state child first calls a small kernel (2**16 elements: a parallel loop): its first call pays what a
    process pays once (opening the cache, jitop's code digest, loading the thread pool and the native entry),
    so the workload's first call
    then shows what one more kernel costs. Every other child calls the tiny kernel last (so it is cached)."""
    from jitop.codegen.target import compile_count
    name, steady_calls, ref = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    wl = WORKLOADS[name]
    args = wl.make_args()
    f, small = jitop.kernel(wl.fn, fallback=False), jitop.kernel(tiny)
    init_s = None
    if steady_calls:
        t0 = time.perf_counter()
        small(np.ones(1 << 16, np.float32))
        init_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = f(*args)
    first_s = time.perf_counter() - t0
    compiles = compile_count()  # before anything else could compile
    lookups = [e.lookup for e in f.cache.values() if getattr(e, "lookup", None) is not None]
    steady_s = median_time(lambda: f(*args), steady_calls)[0] if steady_calls else None
    if not steady_calls:
        small(np.ones(1 << 16, np.float32))
    print(json.dumps({"import_s": import_s, "first_s": first_s, "init_s": init_s, "compiles": compiles, "steady_s": steady_s,
                      "kernels": len(f.cache), "statuses": [lk.status for lk in lookups],
                      "lookup_s": [lk.seconds for lk in lookups],
                      "not_hit": [lk.describe() for lk in lookups if lk.status != "hit"],
                      "diff": compare_or_save(np.asarray(out), ref),
                      "target": jitop.Target.current().describe()}))


def compare_or_save(out: np.ndarray, ref: str) -> float | None:
    """None (and save `out`) if there is no reference yet, else max |out - reference| (inf: shape/dtype differ)."""
    if not os.path.exists(ref):
        np.save(ref, out)
        return None
    expect = np.load(ref)
    if expect.shape != out.shape or expect.dtype != out.dtype:
        return float("inf")
    return float(np.max(np.abs(out.astype(np.float64) - expect), initial=0.0))


# ** the parent: run children on one cache directory **

def child_env(cache_dir: str, enabled: bool = True) -> dict[str, str]:
    env = dict(os.environ)
    env["JITOP_CACHE_DIR"] = cache_dir  # a temporary directory of ours, never the user's cache
    env["JITOP_CACHE"] = "1" if enabled else "0"
    return env


def run_child(name: str, cache_dir: str, ref: str, steady_calls: int = 0) -> tuple[dict[str, Any], float]:
    """(the child's report, its wall time as seen from here: process start to exit)."""
    cmd = [sys.executable, "-c", CHILD.format(here=str(HERE)), name, str(steady_calls), ref]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=child_env(cache_dir), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"child exited {proc.returncode}: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall  # the JSON is the last line


def prime(root: str) -> None:
    """One untimed process that imports everything with the jitop cache off: .pyc files and the OS file cache
    are then warm for every measured process, cold ones included."""
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import bench_cache"
    subprocess.run([sys.executable, "-c", code], env=child_env(os.path.join(root, "prime"), enabled=False),
                   check=True, capture_output=True)


def measure(name: str, root: str, warm_n: int, steady_calls: int) -> dict[str, Any]:
    """Cold process, `warm_n` warm processes, one steady-state process, all on a new cache directory."""
    cache_dir = tempfile.mkdtemp(prefix=f"{name}-", dir=root)
    ref = os.path.join(root, f"{name}.npy")
    cold, cold_wall = run_child(name, cache_dir, ref)
    warm = [run_child(name, cache_dir, ref) for _ in range(warm_n)]
    steady, _ = run_child(name, cache_dir, ref, steady_calls)  # its wall time includes the steady calls: unused
    return {"cold": cold, "cold_wall": cold_wall, "warm": [w for w, _ in warm],
            "warm_wall": [t for _, t in warm], "steady": steady}


# ** the section **

def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}" if seconds >= 0.01 else f"{seconds * 1e3:.2f}"


def workload_row(wl: Workload, m: dict[str, Any]) -> tuple[list[object], str, list[str]]:
    """(table row, target line, detail lines) of one measured workload."""
    warm_first = statistics.median(w["first_s"] for w in m["warm"])
    warm_all = [*m["warm"], m["steady"]]  # every warm process counts for compiles and statuses
    compiles = max(w["compiles"] for w in warm_all)
    met = warm_first * 1e3 <= wl.target_ms and compiles == 0
    row = [wl.label, ms(m["cold"]["first_s"]), ms(warm_first), ms(m["steady"]["first_s"]),
           f"{warm_first / m['cold']['first_s']:.2g}",
           f"{compiles}" if compiles == 0 else f"**{compiles}**", ms(m["steady"]["steady_s"]),
           f"{m['cold_wall']:.2f}", f"{statistics.median(m['warm_wall']):.2f}"]
    scope = "the whole block" if wl.target_ms > 5 else "per kernel"
    kernels = m["steady"]["kernels"]
    # the first call also runs the kernel once: first - steady is what the cache and the tracer cost
    overhead = warm_first - m["steady"]["steady_s"]
    further = m["steady"]["first_s"]
    met_further = further * 1e3 <= wl.target_ms and compiles == 0
    target = (f"- {wl.label}: warm first call {ms(warm_first)} ms (minus one steady call: {ms(overhead)} ms; "
              f"once the process has loaded one kernel: {ms(further)} ms, "
              f"{'met' if met_further else '**NOT met**'} for a further kernel), "
              f"target <= {wl.target_ms:g} ms ({scope}; {kernels} kernel{'s' if kernels != 1 else ''})"
              f"{'' if compiles == 0 else f', {compiles} LLVM compiles'}: {'met' if met else '**NOT met**'}")
    return row, target, details(wl, m)


def details(wl: Workload, m: dict[str, Any]) -> list[str]:
    cold, warm = m["cold"], [*m["warm"], m["steady"]]
    statuses = sorted({s for w in warm for s in w["statuses"]})
    diffs = [w["diff"] for w in warm]
    same = "identical to the cold result" if all(d == 0.0 for d in diffs) else \
        f"**differs from the cold result** (max abs diff {max(d for d in diffs if d is not None):.3g})"
    lines = [f"- {wl.label}: import jitop {ms(cold['import_s'])} ms cold, "
             f"{ms(statistics.median(w['import_s'] for w in warm))} ms warm; cold process ran LLVM "
             f"{cold['compiles']} times (statuses {', '.join(cold['statuses'])}); warm statuses "
             f"{', '.join(statuses)}; process init (a tiny kernel's warm first call) "
             f"{ms(m['steady']['init_s'])} ms; of the warm first call, "
             f"{ms(statistics.median(s for w in warm for s in w['lookup_s']))} ms in the cache lookup (open the "
             f"store, key, read, load the object code), the rest traces, prepares and runs the call; "
             f"warm results {same}"]
    for w in warm:
        lines += [f"  warm process not served from disk:\n\n```\n{text}\n```" for text in w["not_hit"]]
    return lines


HEADERS = ["workload", "cold first call ms", "warm first call ms", "warm, after process init ms", "warm/cold",
           "LLVM compiles warm",
           "steady call ms", "process cold s", "process warm s"]


def section_coldwarm(args: argparse.Namespace, root: str) -> str:
    warm_n = args.repeat or (1 if args.quick else 3)
    steady_calls = 5 if args.quick else 20
    prime(root)
    rows, targets, notes, failed = [], [], [], []
    for name, wl in WORKLOADS.items():
        print(f"  coldwarm: {name} ...", file=sys.stderr, flush=True)
        try:
            row, target, lines = workload_row(wl, measure(name, root, warm_n, steady_calls))
        except Exception as err:  # one workload failing must not hide the others
            failed.append(name)
            rows.append([wl.label, f"failed ({err})", *[""] * (len(HEADERS) - 2)])
            continue
        rows.append(row)
        targets.append(target)
        notes += lines
    head = (f"### Cold vs warm first call ({warm_n} warm process{'es' if warm_n > 1 else ''}, median; steady: "
            f"median of {steady_calls} calls after the first)\n\n")
    text = head + table(HEADERS, rows) + "\n\nTargets (warm first call, no LLVM in the warm process):\n\n" + \
        "\n".join(targets) + "\n\nDetails:\n\n" + "\n".join(notes)
    if failed:
        args.failed += failed
    return text


# ** section "tune": `jitop tune --script` on a ResNet-18-style program, its time before and after **

RESNET_SCRIPT = """import json, sys, time
import numpy as np
import jitop

# ResNet-18's 3x3 convolutions, one per stage, and the stride-2 convolutions between stages (NCHW, batch 1)
LAYERS = [("layer1 64x56x56", 64, 64, 56, 1), ("layer2 down 64->128 /2", 64, 128, 56, 2),
          ("layer2 128x28x28", 128, 128, 28, 1), ("layer3 down 128->256 /2", 128, 256, 28, 2),
          ("layer3 256x14x14", 256, 256, 14, 1), ("layer4 512x7x7", 512, 512, 7, 1)]


def layer(x, w, stride):
    return np.maximum(jitop.conv2d(x, w, stride=stride, padding=1), 0)


if __name__ == "__main__":
    iters = int(sys.argv[1])
    rng = np.random.default_rng(0)
    data = [(name, rng.standard_normal((1, c, hw, hw)).astype(np.float32),
             (rng.standard_normal((oc, c, 3, 3)) * 0.05).astype(np.float32), s) for name, c, oc, hw, s in LAYERS]
    times = {}
    for name, x, w, s in data:
        layer(x, w, s)  # the first call compiles (or loads from the cache)
        runs = []
        for _ in range(iters):
            t0 = time.perf_counter()
            layer(x, w, s)
            runs.append(time.perf_counter() - t0)
        times[name] = sorted(runs)[len(runs) // 2]
    print(json.dumps(times))
"""


def run_resnet(script: str, cache_dir: str, iters: int) -> dict[str, float]:
    """Per-layer median seconds of one run of the program (a fresh process on `cache_dir`)."""
    proc = subprocess.run([sys.executable, script, str(iters)], env=child_env(cache_dir), capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the program failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def section_tune(args: argparse.Namespace, root: str) -> str:
    script = os.path.join(root, "resnet_layers.py")
    pathlib.Path(script).write_text(RESNET_SCRIPT)
    cache_dir = tempfile.mkdtemp(prefix="tune-", dir=root)
    iters = 5 if args.quick else 30
    limit = ["--trials", "48"] if args.quick else ["--budget", args.tune_budget]
    before = run_resnet(script, cache_dir, iters)
    print(f"  tune: jitop tune {' '.join(limit)} --script ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    tuned = subprocess.run([sys.executable, "-m", "jitop", "tune", *limit, "--no-progress", "--script", script, "3"],
                           env=child_env(cache_dir), capture_output=True, text=True, cwd=root)
    tune_s = time.perf_counter() - t0
    if tuned.returncode != 0:
        args.failed.append("tune")
        return f"### jitop tune --script\n\nfailed: {tuned.stderr.strip()[-800:]}"
    after = run_resnet(script, cache_dir, iters)
    rows = [[name, ms(before[name]), ms(after[name]), f"{before[name] / after[name]:.2f}"] for name in before]
    total_b, total_a = sum(before.values()), sum(after.values())
    rows.append(["**all six layers**", ms(total_b), ms(total_a), f"**{total_b / total_a:.2f}**"])
    report = tuned.stdout.strip().split("task ", 1)
    table_text = ("task " + report[1]) if len(report) == 2 else tuned.stdout.strip()
    return (f"### `jitop tune {' '.join(limit)} --script resnet_layers.py` ({tune_s:.0f} s), then the same "
            f"program in a new process (median of {iters} calls per layer, conv2d + ReLU, NCHW, batch 1)\n\n"
            + table(["layer", "defaults ms", "tuned (from the cache) ms", "speed-up"], rows)
            + "\n\nThe tuner's own table (its measurements, per task):\n\n```\n" + table_text + "\n```")


# ** section "hotpath": what the cache and the workload log cost a call that is already compiled **

HOT_CHILD = """import json, time
import numpy as np
import jitop

def add(a, b):
    return a + b

def best_us(call, n=20000, repeat=7):
    call()
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return sorted(runs)[len(runs) // 2]

a = np.ones(10, np.float32)
m = np.ones((8, 8), np.float32)
shapes = [(np.ones((8 + i, 8), np.float32), m) for i in range(12)]  # 12 signatures taking turns

def twelve():
    for x, y in shapes:
        jitop.matmul(x, y)

f = jitop.kernel(add)
f(a, a)
print(json.dumps({"kernel a + b, 10 f32 (native entry)": best_us(lambda: f(a, a)),
                  "kernel a + b, keyword call (slow path)": best_us(lambda: f(a, b=a)),
                  "jitop.matmul 8x8 f32": best_us(lambda: jitop.matmul(m, m)),
                  "jitop.matmul, 12 shapes in turn (per call)": best_us(twelve, n=2000) / 12}))
"""


def hot_path(pythonpath: str | None, cache_dir: str) -> dict[str, float]:
    env = child_env(cache_dir)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath  # another jitop checkout (e.g. the commit before the cache)
    out = subprocess.run([sys.executable, "-c", HOT_CHILD], env=env, capture_output=True, text=True, check=True,
                         cwd=pythonpath or None)
    return json.loads(out.stdout.strip().splitlines()[-1])


def section_hotpath(args: argparse.Namespace, root: str) -> str:
    rounds = 1 if args.quick else 3
    runs = {"this jitop": [hot_path(None, os.path.join(root, "hot")) for _ in range(rounds)]}
    if args.baseline:
        runs[f"baseline {args.baseline}"] = [hot_path(args.baseline, os.path.join(root, "hot-base"))
                                             for _ in range(rounds)]
    names = list(runs["this jitop"][0])
    rows = [[name, *(f"{statistics.median(r[name] for r in rs):.3f}" for rs in runs.values())] for name in names]
    return (f"### Per-call time of compiled kernels (µs, median of {rounds} processes x 7 x 20000 calls)\n\n"
            + table(["call", *runs], rows))


# name -> section(args, root): its markdown; root is the run's temporary directory (cache directories go under
# it); a section appends the names of what failed to args.failed (the script then exits non-zero)
SECTIONS: dict[str, Callable[[argparse.Namespace, str], str]] = {
    "coldwarm": section_coldwarm, "tune": section_tune, "hotpath": section_hotpath}


def machine_line() -> str:
    cpu = cpu_name()
    busy = busy_cores()
    busy_text = "CPU use of other processes unknown" if busy is None else f"other processes busy {busy:.2f} cores"
    return (f"{cpu}, {os.cpu_count()} cores; Target: {jitop.Target.current().describe()}; Python "
            f"{platform.python_version()}, numpy {np.__version__}, {versions('llvmlite')}; JITOP_NUM_THREADS="
            f"{os.environ['JITOP_NUM_THREADS']}, OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}; "
            f"{busy_text} at start")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one warm process, 5 steady calls (same sizes)")
    p.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    p.add_argument("--repeat", type=int, default=None, help="warm processes per workload (default 3; 1 with --quick)")
    p.add_argument("--tune-budget", default="5m", help="budget of `jitop tune` in section tune (default 5m)")
    p.add_argument("--baseline", help="section hotpath: also time another jitop checkout (a directory to put on "
                                      "PYTHONPATH, e.g. a git worktree of the commit before the cache)")
    args = p.parse_args()
    args.failed = []
    print(f"Kernel cache (cold vs warm processes){' (--quick)' if args.quick else ''} — {machine_line()}\n",
          flush=True)
    root = tempfile.mkdtemp(prefix="jitop-bench-cache-")  # every cache directory of the run lives under it
    try:
        for name in args.sections:
            print(SECTIONS[name](args, root) + "\n", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.failed:
        raise SystemExit(f"failed: {', '.join(args.failed)} (see the rows above)")


if __name__ == "__main__":
    main()
