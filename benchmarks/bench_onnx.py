"""ONNX models: jitop.onnx next to onnxruntime and torch, in one run.

    python benchmarks/bench_onnx.py                                   # every model at batch 1 and 8
    python benchmarks/bench_onnx.py --models resnet50 --batch 1 --repeat 20
    python benchmarks/bench_onnx.py --quick                           # smoke test: resnet18, batch 1, 3 runs
    jitop tune --budget 30m --script benchmarks/bench_onnx.py -- --log-only --models resnet50 --batch 1
    python benchmarks/bench_onnx.py --tuned --models resnet50 --batch 1   # ... then with the tuned configs

The models (benchmarks/onnx_models.py, built in plain torch with random seeded weights, exported by
torch.onnx.export, TorchScript exporter, opset 17, constant folding; one file per model with the batch
dimension symbolic, kept in --model-dir and re-exported only when its builder changes): ResNet-18,
ResNet-50 (v1.5), MobileNet-V2 (input "data", (batch, 3, 224, 224) float32) and a BERT-base encoder
(12 layers, hidden 768, 12 heads, FFN 3072, erf GELU; input "input_ids", (batch, 128) int64). --fixed uses
files exported with every dimension fixed instead.

Per model and batch, the same file and the same inputs (onnx_models.sample_inputs, fixed seed) for
- onnxruntime: CPUExecutionProvider, intra_op_num_threads = the thread count (2), inter_op 1, graph
  optimizations ORT_ENABLE_ALL;
- torch: the torch module the file was exported from (same weights), eval mode, torch.no_grad(),
  torch.set_num_threads(2);
- jitop: `jitop.onnx.load(path, shapes={input: shape})`, called as `m(*inputs)` (the keyword form and
  `m.run(None, feed)` are checked to give the same result). Where jitop.onnx does not exist (or has no
  `load`), "jitop.onnx not available" is printed and the other two are still measured.

Columns:
- `median ms`, `min ms`: of --repeat single runs, in this process, the garbage collector off, taken in 5 rounds
  that time each implementation in turn (each block after a 50 ms pause and one warm-up run), so a machine
  whose speed drifts during the run favours none of them; `speed vs ort`: onnxruntime's median / this median
  (> 1: faster than onnxruntime);
- `GFLOP/s`, `% of peak`: the model's conv/matmul flops (onnx_models.flops: 2 per multiply-add) / the median,
  and that over the all-thread FP32 peak measured at the start of this run (peak.py);
- `first run s, cold`: a fresh child process (`python -c`), timed inside it after its imports: load the file
  and run once. onnxruntime: create the session (its graph optimizations) + the first run. jitop: on a new,
  empty JITOP_CACHE_DIR (its one-time start-up, every compile, the saving to the cache) + the first run;
  `warm`: a second child process on the same directory (the kernels loaded from it), with the LLVM compiles
  it still did (`compiles`, should be 0). The timed runs above use that directory too (a warm load).
  Each (model, batch) gets its own directory, removed at the end;
- `max rel err vs ort`: max |y - y_ort| / max |y_ort| over the output; a jitop result off by more than 1e-3
  is reported as WRONG and the script exits non-zero (as it does when jitop.onnx fails on a model).
--tuned labels a run made after `jitop tune`: the tuned records of the current cache (JITOP_CACHE_DIR or
the default) are copied into each fresh directory, so jitop compiles with the tuned configs (without --tuned
the fresh directories have none: the templates' default configs). --log-only loads and runs each model once
through jitop in the current cache, untimed: the program for `jitop tune --script` to log the workloads of.
JITOP_NUM_THREADS and OPENBLAS_NUM_THREADS default to 2; the children inherit them.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
for _var in ("JITOP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "2")  # before numpy and jitop load (here and in the children)
THREADS = int(os.environ["JITOP_NUM_THREADS"])

import numpy as np  # noqa: E402

import onnx_models as om  # noqa: E402
from common import interleaved_times, lscpu_model  # noqa: E402

TOL = 1e-3
DEFAULT_DIR = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "jitop-bench-onnx"

_CHILD = """
import json, sys, time
args = json.loads(sys.argv[1])
sys.path.insert(0, args["here"])
import numpy as np
import onnx_models as om
feed = om.sample_inputs(args["model"], args["batch"])
out = {}
if args["impl"] == "jitop":
    import jitop, jitop.onnx, jitop.codegen.target
    t0 = time.perf_counter()
    m = jitop.onnx.load(args["path"], shapes={k: v.shape for k, v in feed.items()})
    t1 = time.perf_counter()
    y = m(*feed.values())
    t2 = time.perf_counter()
    out["compiles"] = jitop.codegen.target.compile_count()
else:
    import onnxruntime as ort
    t0 = time.perf_counter()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = args["threads"], 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(args["path"], opts, providers=["CPUExecutionProvider"])
    t1 = time.perf_counter()
    y = sess.run(None, feed)
    t2 = time.perf_counter()
out.update(load=t1 - t0, first_run=t2 - t1)
print(json.dumps(out))
"""


def child_first_run(impl: str, model: str, batch: int, path: str, env: dict[str, str]) -> dict[str, Any]:
    """Load + first run of `impl` in a fresh process (timed inside it, after its imports). Python caches
    bytecode there, as an installed package has it (PYTHONDONTWRITEBYTECODE, set on some machines, would make
    every lazily imported module compile from source inside the timed load)."""
    args = json.dumps({"here": str(HERE), "impl": impl, "model": model, "batch": batch, "path": path,
                       "threads": THREADS})
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.run([sys.executable, "-c", _CHILD, args], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise RuntimeError(tail[-1] if tail else f"exit {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rel_err(y: Any, ref: np.ndarray) -> float:
    y = np.asarray(y)
    if y.shape != ref.shape:
        raise ValueError(f"shape {y.shape}, onnxruntime's {ref.shape}")
    return float(np.max(np.abs(y.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def first_output(y: Any) -> np.ndarray:
    return np.asarray(y[0] if isinstance(y, (list, tuple)) else y)


def reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160] if text else ''}"


@dataclass
class Row:
    model: str
    batch: int
    impl: str
    median: float | None = None
    best: float | None = None
    cold: float | None = None
    warm: float | None = None
    compiles: int | None = None
    err: float | None = None
    failed: str = ""
    notes: list[str] = field(default_factory=list)


def jitop_onnx() -> tuple[Any, str]:
    """(the jitop.onnx module, "") or (None, why not)."""
    try:
        import jitop.onnx as jo
    except Exception as e:  # noqa: BLE001 - not written yet, or broken: the peers are still measured
        return None, reason(e)
    if not callable(getattr(jo, "load", None)):
        return None, "jitop.onnx has no load()"
    return jo, ""


def tuned_records() -> list[tuple[str, bytes]]:
    from jitop import cachedir
    return list(cachedir.store().items("tuned/"))


def fresh_cache_dir(tuned: list[tuple[str, bytes]]) -> str:
    """A new, empty JITOP_CACHE_DIR with `tuned` put in it (removed at exit)."""
    directory = tempfile.mkdtemp(prefix="jitop-bench-onnx-")
    atexit.register(shutil.rmtree, directory, True)
    if tuned:
        from jitop import cachedir
        with cache_dir(directory):
            store = cachedir.store()
            for key, value in tuned:
                store.put(key, value)
    return directory


@contextlib.contextmanager
def cache_dir(directory: str) -> Any:
    """JITOP_CACHE_DIR set to `directory` inside the block, restored after."""
    old = os.environ.get("JITOP_CACHE_DIR")
    os.environ["JITOP_CACHE_DIR"] = directory
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("JITOP_CACHE_DIR", None)
        else:
            os.environ["JITOP_CACHE_DIR"] = old


def ort_session(path: str) -> Any:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = THREADS, 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def run_one(name: str, batch: int, path: str, repeat: int, torch: Any, jo: Any,
            tuned: list[tuple[str, bytes]]) -> list[Row]:
    """The three implementations loaded and checked first, then timed together (`interleaved_times`)."""
    feed = om.sample_inputs(name, batch)
    ort_row, ref, ort_call = onnxruntime_side(name, batch, path, feed)
    t_row, torch_call = torch_side(name, batch, feed, torch, ref)
    j_row, jitop_call = jitop_side(name, batch, path, feed, jo, tuned, ref)
    calls = {row.impl: call for row, call in ((ort_row, ort_call), (t_row, torch_call), (j_row, jitop_call))
             if call is not None}
    if calls:
        grad = torch.no_grad() if torch is not None else contextlib.nullcontext()
        with grad:
            times = interleaved_times(calls, repeat)
        for row in (ort_row, t_row, j_row):
            row.median, row.best = times.get(row.impl, (None, None))
    return [ort_row, t_row, j_row]


def onnxruntime_side(name: str, batch: int, path: str, feed: dict) -> tuple[Row, Any, Any]:
    """(its row with the cold first run, its output as the reference, its call) (None for both if it fails)."""
    row = Row(name, batch, "onnxruntime")
    try:
        first = child_first_run("ort", name, batch, path, dict(os.environ))
        row.cold = first["load"] + first["first_run"]
        sess = ort_session(path)
        ref = np.asarray(sess.run(None, feed)[0], np.float64)
        row.err = 0.0
        return row, ref, lambda: sess.run(None, feed)
    except Exception as e:  # noqa: BLE001
        row.failed = reason(e)
        return row, None, None


def torch_side(name: str, batch: int, feed: dict, torch: Any, ref: np.ndarray | None) -> tuple[Row, Any]:
    """(its row with its error, its call): the module the file was exported from."""
    row = Row(name, batch, f"torch {torch.__version__}" if torch is not None else "torch")
    if torch is None:
        row.failed = "torch not installed"
        return row, None
    try:
        module = om.torch_module(name)
        targs = [torch.from_numpy(v) for v in feed.values()]
        with torch.no_grad():
            y = module(*targs).numpy()
        row.err = rel_err(y, ref) if ref is not None else None
        return row, lambda: module(*targs)
    except Exception as e:  # noqa: BLE001
        row.failed = reason(e)
        return row, None


def jitop_side(name: str, batch: int, path: str, feed: dict, jo: Any, tuned: list[tuple[str, bytes]],
               ref: np.ndarray | None) -> tuple[Row, Any]:
    """(its row with the cold and warm first runs and its error, its call; None when it failed or is WRONG)."""
    row = Row(name, batch, "jitop.onnx" + (" (tuned)" if tuned else ""))
    if jo is None:
        row.failed = "jitop.onnx not available"
        return row, None
    cache = fresh_cache_dir(tuned)
    env = {**os.environ, "JITOP_CACHE_DIR": cache}
    try:
        cold = child_first_run("jitop", name, batch, path, env)
        row.cold = cold["load"] + cold["first_run"]
        warm = child_first_run("jitop", name, batch, path, env)
        row.warm, row.compiles = warm["load"] + warm["first_run"], warm.get("compiles")
    except Exception as e:  # noqa: BLE001
        row.failed = f"child process: {reason(e)}"
        return row, None
    try:
        with cache_dir(cache):
            m = jo.load(path, shapes={k: v.shape for k, v in feed.items()})
            args = list(feed.values())
            y = first_output(m(*args))
            by_name = first_output(m(**feed))
            listed = m.run(None, feed)
        if not isinstance(listed, list) or not np.array_equal(np.asarray(listed[0]), y) \
                or not np.array_equal(by_name, y):
            row.notes.append("m(**feed) / m.run(None, feed) differ from m(*inputs)")
        row.err = rel_err(y, ref) if ref is not None else None
        if row.err is not None and not row.err <= TOL:
            row.failed = f"WRONG: max rel err {row.err:.2e} > {TOL:g}"
            return row, None
        return row, lambda: m(*args)
    except Exception as e:  # noqa: BLE001
        row.failed = reason(e)
        return row, None


def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.2f}" if v < 0.1 else f"{v * 1e3:.1f}"


def fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def fmt_err(v: float | None) -> str:
    return "-" if v is None else "0" if v == 0 else f"{v:.1e}"


def log_only(names: list[str], batches: list[int], model_dir: pathlib.Path, fixed: bool) -> None:
    """Load and run each model once through jitop in the current cache (for `jitop tune --script`)."""
    jo, why = jitop_onnx()
    if jo is None:
        raise SystemExit(f"jitop.onnx not available ({why})")
    for name in names:
        for batch in batches:
            path = om.export(name, model_dir, batch, dynamic=not fixed)
            feed = om.sample_inputs(name, batch)
            t0 = time.perf_counter()
            jo.load(path, shapes={k: v.shape for k, v in feed.items()})(*feed.values())
            print(f"{name} batch {batch}: load + first run {time.perf_counter() - t0:.2f} s", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=list(om.MODELS), default=None)
    p.add_argument("--batch", nargs="+", type=int, default=None, help="batch sizes (default 1 8)")
    p.add_argument("--repeat", type=int, default=None, help="timed runs per implementation (default 10; quick 3)")
    p.add_argument("--quick", action="store_true", help="smoke test: resnet18 at batch 1, 3 timed runs")
    p.add_argument("--tuned", action="store_true",
                   help="a run after `jitop tune`: copy the current cache's tuned records into the fresh caches")
    p.add_argument("--fixed", action="store_true", help="files exported with fixed shapes (default: symbolic batch)")
    p.add_argument("--model-dir", type=pathlib.Path, default=DEFAULT_DIR,
                   help=f"where the exported .onnx files are kept (default {DEFAULT_DIR})")
    p.add_argument("--log-only", action="store_true",
                   help="run each model once through jitop in the current cache, untimed (for jitop tune --script)")
    args = p.parse_args()
    names = args.models or (["resnet18"] if args.quick else list(om.MODELS))
    batches = args.batch or ([1] if args.quick else [1, 8])
    repeat = args.repeat or (3 if args.quick else 10)
    if args.log_only:
        log_only(names, batches, args.model_dir, args.fixed)
        return

    from bench_ops import BUSY_LIMIT, BUSY_WARNING, busy_text, print_end_of_run
    from common import busy_cores, machine, peak_gflops, table, versions
    try:
        import torch
        torch.set_num_threads(THREADS)
    except ImportError:
        torch = None
    jo, why = jitop_onnx()
    tuned = tuned_records() if args.tuned else []

    start = time.perf_counter()
    busy = busy_cores()
    peak = peak_gflops(THREADS)
    quick = " (--quick)" if args.quick else ""
    label = f" [--tuned: {len(tuned)} tuned records from the current cache]" if args.tuned else ""
    cpu, described = lscpu_model(), machine()
    if not described.startswith(cpu):
        described = f"{cpu}; {described}"
    print(f"ONNX models{quick}{label} — {described}; threads: jitop {THREADS} "
          f"(JITOP_NUM_THREADS), onnxruntime intra-op {THREADS} / inter-op 1, torch "
          f"{torch.get_num_threads() if torch is not None else 'n/a'}, OPENBLAS_NUM_THREADS="
          f"{os.environ.get('OPENBLAS_NUM_THREADS')}; {versions('onnxruntime', 'onnx', 'torch', 'llvmlite')}; "
          f"1-min load average at start {os.getloadavg()[0]:.2f}; {busy_text(busy)} at start\n", flush=True)
    if busy is not None and busy > BUSY_LIMIT:
        print(BUSY_WARNING + "\n", flush=True)
    if jo is None:
        print(f"jitop.onnx not available ({why}): onnxruntime and torch only.\n", flush=True)
    if args.tuned and not tuned:
        print("**--tuned, but the current cache has no tuned records** (run `jitop tune` first): jitop runs with "
              "the default configs.\n", flush=True)
    peak_text = f"the measured {THREADS}-thread FP32 peak ({peak:.0f} GFLOP/s)" if peak else "(peak not measured)"
    print(f"Times: median and min of {repeat} runs in 5 rounds alternating the implementations (a warm-up run per "
          f"block); speed vs ort = onnxruntime's median / the row's (> 1: faster than onnxruntime); % of peak "
          f"against {peak_text}; first runs (load + one run) in fresh processes; errors: max |y - y_ort| / "
          "max |y_ort|.\n", flush=True)

    summary, bad = [], []
    for name in names:
        for batch in batches:
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                path = om.export(name, args.model_dir, batch, dynamic=not args.fixed)
            exported = time.perf_counter() - t0
            gflop = om.flops(name, batch) / 1e9
            rows = run_one(name, batch, path, repeat, torch, jo, tuned)
            ort_med = rows[0].median
            body = []
            for r in rows:
                speed = f"{ort_med / r.median:.2f}" if ort_med and r.median else "-"
                gfs = gflop / r.median if r.median else None
                cold = fmt_s(r.cold) if r.cold is not None else "-"
                warm = "-" if r.warm is None else f"{r.warm:.2f} ({r.compiles} compiles)"
                err = fmt_err(r.err)
                med = r.failed if r.failed and r.median is None else fmt_ms(r.median)
                body.append([r.impl, med, fmt_ms(r.best), speed, "-" if gfs is None else f"{gfs:.1f}",
                             f"{gfs / peak * 100:.0f}%" if gfs and peak else "-", cold, warm, err])
                for note in r.notes:
                    body[-1][0] += f" ({note})"
            desc = os.path.basename(path) + (f", exported in {exported:.1f} s" if exported > 1 else "")
            print(f"### {name}, batch {batch} ({gflop:.1f} GFLOP; {desc})\n", flush=True)
            print(table(["implementation", "median ms", "min ms", "speed vs ort", "GFLOP/s", "% of peak",
                         "first run s, cold", "first run s, warm", "max rel err vs ort"], body) + "\n", flush=True)
            j, t = rows[2], rows[1]
            summary.append([name, batch, fmt_ms(ort_med), fmt_ms(t.median), fmt_ms(j.median),
                            f"{ort_med / j.median:.2f}" if ort_med and j.median else "-",
                            f"{t.median / j.median:.2f}" if t.median and j.median else "-",
                            fmt_s(rows[0].cold), fmt_s(j.cold), fmt_s(j.warm), fmt_err(j.err)])
            if jo is not None and j.failed:
                bad.append(f"{name} batch {batch}: {j.failed}")

    print("### Summary\n\n" + table(["model", "batch", "onnxruntime ms", "torch ms", "jitop ms",
                                     "jitop speed / ort", "jitop speed / torch", "ort first run s",
                                     "jitop first run s, cold", "jitop warm", "jitop rel err"], summary) + "\n")
    print_end_of_run(start)
    if bad:
        raise SystemExit(f"jitop.onnx failed or gave a wrong result on: {'; '.join(bad)}")


if __name__ == "__main__":
    main()
