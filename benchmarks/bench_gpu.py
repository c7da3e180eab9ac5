"""jitop on an NVIDIA GPU next to torch, in one run (issue 25's targets).

  (a) an elementwise chain, exp(a) * b + c over 4096 x 4096 float32: jitop (schedule_injective) vs torch eager vs
      torch.compile (in a child process with a timeout), in GB/s and % of the device-to-device copy bandwidth
      (torch clone of the same array, the reference);
  (b) softmax and layer norm over the rows of 4096 x 4096 float32 (schedule_row_reduce, and the numpy functions
      as @jitop.kernel(target="cuda") on device arrays: a row group, one kernel) vs torch;
  (c) SGEMM float32 at 1024, 2048, 4096, 8192 (schedule_matmul's default tiles) vs torch.mm with TF32 off (cuBLAS
      FP32) and, for reference, with TF32 on; a sweep of tile configs at 4096 and 2048;
  (c0) one row times GPT-2's weight matrices (a decode step's GEMVs): topi.cuda_gemv's schedule vs the SGEMM tiles
      the traced graph used for them before vs torch.mm, in GB/s and % of the copy bandwidth;
  (c'') the same SGEMMs on TF32 tensor cores (topi.cuda.matmul(A, B, tc="tf32"): the best of TC_CONFIGS) vs
      torch.mm with TF32 on (cuBLAS TF32; issue 25's target: >= 60 %), and on BF16 tensor cores (tc="bf16") vs
      cuBLAS on bfloat16 copies with float32 accumulation (torch.mm(..., out_dtype=float32) where torch has it,
      else bfloat16 out; the table says which), --no-tc skips both;
  (d) launch overhead: a tiny kernel called from Python with device arrays, microseconds per call;
  (e) conv2d float32 on ResNet-50's layers at batch 8 and 32 (topi.cuda.conv2d_nchw + schedule_conv2d, an implicit
      GEMM) vs torch.nn.functional.conv2d with cuDNN TF32 off, and the geomean ratio per batch (--no-conv skips);
  (f) whole models written in numpy (bench_models' ResNet-50 at batch 8 and GPT-2 block) as
      @jitop.kernel(target="cuda") vs the same functions in torch eager, numpy in and out (--no-models skips).

GPU time is measured with CUDA events (jitop's own driver.Event for jitop, torch.cuda.Event for torch; both on
the legacy default stream of the same primary context), after warm-up; every jitop result is checked against
torch / a float64 reference before it is timed. Device arrays are made once (jitop.runtime.cuda.memory), so no
host copies are timed. Every section is independent: an error is printed and recorded, and the run goes on.
The markdown report is printed and written to --out after every section (a killed run keeps what it had).

    python benchmarks/bench_gpu.py --out bench_gpu.md        # about 2 minutes on an H100
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any, Callable

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)
N_EW = 4096           # elementwise / row operators: N_EW x N_EW float32
GEMM_SIZES = (1024, 2048, 4096, 8192)
SWEEP = [             # SGEMM tile configs measured at the sweep sizes (the first is the 4096 default);
    # stages=2 double-buffers the shared tiles (never measured before this table: the first four rows compare)
    {"bm": 128, "bn": 128, "bk": 16, "tm": 8, "tn": 8},
    {"bm": 128, "bn": 128, "bk": 16, "tm": 8, "tn": 8, "stages": 2},
    {"bm": 128, "bn": 128, "bk": 8, "tm": 8, "tn": 8},
    {"bm": 128, "bn": 128, "bk": 8, "tm": 8, "tn": 8, "stages": 2},
    {"bm": 64, "bn": 64, "bk": 8, "tm": 8, "tn": 8, "stages": 2},
    {"bm": 128, "bn": 64, "bk": 8, "tm": 8, "tn": 4},
    {"bm": 64, "bn": 128, "bk": 8, "tm": 4, "tn": 8},
    {"bm": 128, "bn": 64, "bk": 16, "tm": 8, "tn": 8},
    {"bm": 64, "bn": 64, "bk": 8, "tm": 8, "tn": 8},
    {"bm": 64, "bn": 64, "bk": 16, "tm": 4, "tn": 4},
    {"bm": 128, "bn": 128, "bk": 8, "tm": 8, "tn": 4},
]
TC_CONFIGS = [        # tensor-core (mma.sync) configs of section (c''), each with tc = the mode: the warps of these
    {"bm": 128, "bn": 128, "bk": 16, "tm": 8, "tn": 8},   # thread tiles
    {"bm": 128, "bn": 128, "bk": 32, "tm": 8, "tn": 8},
    {"bm": 128, "bn": 64, "bk": 16, "tm": 8, "tn": 4},
]
MODEL_BATCH = 8       # section (f): ResNet-50's batch
TC_PRODUCT_ERROR = {"tf32": 2.0 ** -10, "bf16": 2.0 ** -7}  # a product of two rounded operands: 2 unit roundoffs


# ** the report **

class Report:
    def __init__(self, out: str | None):
        self.out, self.parts = out, []

    def add(self, text: str) -> None:
        print(text, flush=True)
        self.parts.append(text)
        self.flush()

    def table(self, title: str, head: list[str], rows: list[list[Any]], note: str = "") -> None:
        lines = [f"\n### {title}\n", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(_fmt(x) for x in r) + " |" for r in rows]
        if note:
            lines.append(f"\n{note}")
        self.add("\n".join(lines))

    def flush(self) -> None:
        if self.out:
            try:
                with open(self.out, "w") as f:
                    f.write("\n".join(self.parts) + "\n")
            except OSError as err:
                print(f"(could not write {self.out}: {err})", file=sys.stderr)


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        if x != x:
            return "n/a"
        return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"
    return str(x)


# ** timing **

class Ctx:
    """What every section shares: torch (or None), jitop's driver and memory modules, the GPU target."""

    def __init__(self) -> None:
        self.torch = None
        try:
            import torch
            if torch.cuda.is_available():
                torch.zeros(1, device="cuda")  # the primary context exists before jitop retains it
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.backends.cudnn.allow_tf32 = False
                self.torch = torch
            else:
                print("torch has no CUDA here: jitop only", flush=True)
        except Exception as err:  # noqa: BLE001 - torch is optional
            print(f"torch unavailable ({type(err).__name__}: {err}): jitop only", flush=True)
        import jitop
        from jitop.runtime.cuda import driver, memory
        from jitop.topi import cuda as topi_cuda
        self.jitop, self.driver, self.memory, self.topi = jitop, driver, memory, topi_cuda
        driver.context()
        try:
            from jitop.driver import cuda_target
            self.target = cuda_target()
        except Exception:  # noqa: BLE001 - schedules fall back to an H100's numbers
            self.target = None
        self.copy_gbs = float("nan")

    def sync(self) -> None:
        self.driver.synchronize()
        if self.torch is not None:
            self.torch.cuda.synchronize()

    def time_ms(self, fn: Callable[[], Any], who: str = "jitop", budget_ms: float = 200.0, reps: int = 5) -> float:
        """Median GPU milliseconds of one call of `fn` (CUDA events around a batch of calls, after warm-up)."""
        if who == "torch" or not hasattr(self.driver, "Event"):
            torch = self.torch
            make = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
            elapsed = lambda s, e: (e.synchronize(), s.elapsed_time(e))[1]  # noqa: E731
        else:
            Event = self.driver.Event
            make = lambda: Event()  # noqa: E731
            elapsed = Event.elapsed_ms
        fn()
        fn()
        self.sync()
        start, end = make(), make()
        start.record()
        fn()
        end.record()
        one = max(elapsed(start, end), 1e-3)
        n = int(max(2, min(2000, budget_ms / reps / one)))
        times = []
        for _ in range(reps):
            start.record()
            for _ in range(n):
                fn()
            end.record()
            times.append(elapsed(start, end) / n)
        return statistics.median(times)

    def build(self, s, args):
        t0 = time.perf_counter()
        f = self.jitop.build(s, args, target="cuda")
        return f, time.perf_counter() - t0

    def rand(self, shape, seed: int = 0, scale: float = 1.0) -> np.ndarray:
        rng = np.random.default_rng(seed)
        return ((rng.random(shape, dtype=np.float32) - 0.5) * (2 * scale)).astype(np.float32)


def raw_launcher(f, arrays) -> Callable[[], None] | None:
    """A closure that launches f's single kernel on `arrays` straight through the driver (no argument checks, no
    Python wrapper): the kernel's own time even where the wrapper's per-call cost would leave the GPU idle
    between calls. None when f has several kernels, workspaces or symbols (or the internals changed)."""
    try:
        if len(f.built.kernels) != 1 or f.built.workspaces or getattr(f, "symbols", None):
            return None
        (launch,) = f.built.kernels
        if not all(isinstance(d, int) for d in (*launch.grid, *launch.block)):
            return None
        _, planner = f._load()
        (fn,) = [t.kernel for t in planner.templates]
        ptrs = launch.pointers([int(a.ptr) for a in arrays])  # the arrays the kernel takes
        kinds = ["ptr"] * len(ptrs)
        return lambda: fn.launch(launch.grid, launch.block, ptrs, kinds, shared_bytes=0)
    except Exception as err:  # noqa: BLE001 - an optional measurement
        print(f"(no raw launch: {type(err).__name__}: {err})", flush=True)
        return None


def us_per_call(fn: Callable[[], Any], sync: Callable[[], None], calls: int = 3000) -> float:
    """Microseconds per call of `fn`: the best of 3 runs of `calls` back-to-back calls, each run ended by
    `sync()` (the GPU's queue drained), after 50 calls of warm-up."""
    for _ in range(50):
        fn()
    sync()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


# ** sections **

def section_env(ctx: Ctx, rep: Report) -> None:
    import platform
    attrs = ctx.driver.device_attributes()
    name = attrs.get("name", "?")
    if ctx.torch is not None:
        name = ctx.torch.cuda.get_device_name(0)
    import llvmlite
    rows = [["GPU", name], ["arch / SMs", f"{attrs.get('arch')} / {attrs.get('sm_count')}"],
            ["jitop target", ctx.target.describe() if ctx.target is not None else "n/a"],
            ["python", platform.python_version()], ["numpy", np.__version__], ["llvmlite", llvmlite.__version__],
            ["torch", ctx.torch.__version__ if ctx.torch is not None else "not available"]]
    try:
        rows.append(["CUDA driver", str(ctx.driver.driver_version())])
    except Exception:  # noqa: BLE001
        pass
    rep.add(f"# jitop GPU benchmark ({name})\n\n{time.strftime('%Y-%m-%d %H:%M:%S')}")
    rep.table("Environment", ["", ""], rows)


def section_copy(ctx: Ctx, rep: Report) -> None:
    torch = ctx.torch
    if torch is None:
        rep.add("\n(copy bandwidth: torch not available, no reference)")
        return
    x = torch.rand(N_EW, N_EW, device="cuda")
    y = torch.empty_like(x)
    nbytes = 2 * x.numel() * 4
    clone_ms = ctx.time_ms(lambda: x.clone(), "torch")
    copy_ms = ctx.time_ms(lambda: y.copy_(x), "torch")
    ctx.copy_gbs = nbytes / clone_ms / 1e6
    rep.table(f"Device-to-device copy, {N_EW}x{N_EW} float32 (the bandwidth reference)",
              ["op", "time (us)", "GB/s"],
              [["torch clone", clone_ms * 1e3, ctx.copy_gbs], ["torch copy_", copy_ms * 1e3, nbytes / copy_ms / 1e6]])


def _pct(gbs: float, ctx: Ctx) -> str:
    return f"{100 * gbs / ctx.copy_gbs:.0f} %" if ctx.copy_gbs == ctx.copy_gbs else "n/a"


def _bandwidth_row(ctx: Ctx, label: str, ms: float, nbytes: int, err: str = "", secs: str = "") -> list[Any]:
    """A row of a bandwidth table: kernel, time (us), GB/s, % of copy, max error, build (s)."""
    gbs = nbytes / ms / 1e6
    return [label, ms * 1e3, gbs, _pct(gbs, ctx), err, secs]


def _jitop_rows(ctx: Ctx, rows: list[list[Any]], label: str, build: Callable[[], tuple[Any, float]], dev: list[Any],
                want: np.ndarray, nbytes: int, raw: bool = True, show_block: bool = False) -> None:
    """Append a jitop kernel's rows to a bandwidth table: built, run on `dev` (the output last) and checked
    against `want`, timed per call and (`raw`) by raw driver launches; an error row where a step fails."""
    try:
        f, secs = build()
        f(*dev)
        err = float(np.abs(dev[-1].get() - want).max())
        ms = ctx.time_ms(lambda: f(*dev))
        block = f.built.kernels[0].block if show_block else None
        shown = f"{label} (block {block[0]}x{block[1]})" if block else label
        rows.append(_bandwidth_row(ctx, shown, ms, nbytes, f"{err:.1e}", f"{secs:.2f}"))
        launch = raw_launcher(f, dev) if raw else None
        if launch is not None:
            rows.append(_bandwidth_row(ctx, "jitop, the same kernel by raw driver launches", ctx.time_ms(launch),
                                       nbytes))
    except Exception as err:  # noqa: BLE001
        traceback.print_exc()
        rows.append([label, "error", f"{type(err).__name__}: {err}"[:120], "", "", ""])


def section_elementwise(ctx: Ctx, rep: Report) -> None:
    te, topi, mem = ctx.jitop.te, ctx.topi, ctx.memory
    shape = (N_EW, N_EW)
    A, B, Cc = (te.placeholder(shape, name=n) for n in "ABC")
    Y = te.compute(shape, lambda i, j: te.exp(A[i, j]) * B[i, j] + Cc[i, j], name="Y")
    a, b, c = ctx.rand(shape, 0, 2.0), ctx.rand(shape, 1), ctx.rand(shape, 2)
    da, db, dc, dy = mem.to_device(a), mem.to_device(b), mem.to_device(c), mem.empty(shape, np.float32)
    nbytes = 4 * a.nbytes
    want = np.exp(a.astype(np.float64)) * b + c
    rows: list[list[Any]] = []
    for label, kw in (("jitop schedule_injective (default)", {}), ("jitop per_thread=1", {"per_thread": 1}),
                      ("jitop per_thread=4", {"per_thread": 4})):
        build = lambda: ctx.build(topi.schedule_injective(Y, target=ctx.target, **kw), [A, B, Cc, Y])  # noqa: E731
        _jitop_rows(ctx, rows, label, build, [da, db, dc, dy], want, nbytes, raw=not kw)  # raw: the default only
    eager = None
    if ctx.torch is not None:
        torch = ctx.torch
        ta, tb, tc = (torch.from_numpy(x).cuda() for x in (a, b, c))
        got = (torch.exp(ta) * tb + tc).cpu().numpy()
        eager = ctx.time_ms(lambda: torch.exp(ta) * tb + tc, "torch")
        rows.append(_bandwidth_row(ctx, "torch eager", eager, nbytes, f"{np.abs(got - want).max():.1e}"))
        # jitop reading torch's tensors in place (__cuda_array_interface__)
        try:
            ty = torch.empty_like(ta)
            f, _ = ctx.build(topi.schedule_injective(Y, target=ctx.target), [A, B, Cc, Y])
            ms = ctx.time_ms(lambda: f(ta, tb, tc, ty))
            rows.append(_bandwidth_row(ctx, "jitop on torch tensors", ms, nbytes,
                                       f"{np.abs(ty.cpu().numpy() - want).max():.1e}"))
        except Exception as err:  # noqa: BLE001
            traceback.print_exc()
            rows.append(["jitop on torch tensors", "error", f"{type(err).__name__}: {err}"[:120], "", "", ""])
    ratio = ""
    if eager is not None and rows and isinstance(rows[0][1], float):
        ratio = f"jitop (default) is {eager * 1e3 / rows[0][1]:.2f}x torch eager."
    rep.table(f"(a) elementwise exp(a) * b + c, {N_EW}x{N_EW} float32 (16 bytes per element)",
              ["kernel", "time (us)", "GB/s", "% of copy", "max error", "build (s)"], rows, ratio)


COMPILE_CHILD = r"""
import json, sys, time, torch
n = int(sys.argv[1])
torch.backends.cuda.matmul.allow_tf32 = False
a, b, c = (torch.rand(n, n, device="cuda") for _ in range(3))
fn = torch.compile(lambda a, b, c: torch.exp(a) * b + c)
t0 = time.perf_counter(); y = fn(a, b, c); torch.cuda.synchronize(); first = time.perf_counter() - t0
err = float((y - (torch.exp(a) * b + c)).abs().max())
for _ in range(3): fn(a, b, c)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
times = []
for _ in range(5):
    s.record()
    for _ in range(20): fn(a, b, c)
    e.record(); e.synchronize(); times.append(s.elapsed_time(e) / 20)
times.sort()
print(json.dumps({"ms": times[2], "first_call_s": first, "err": err}))
"""


def section_torch_compile(ctx: Ctx, rep: Report, timeout: float) -> None:
    if ctx.torch is None:
        return
    done = subprocess.run([sys.executable, "-c", COMPILE_CHILD, str(N_EW)], capture_output=True, text=True,
                          timeout=timeout)
    line = next((ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("{")), None)
    if done.returncode != 0 or line is None:
        rep.add(f"\n(torch.compile failed: exit {done.returncode}; {done.stderr.strip()[-600:]})")
        return
    r = json.loads(line)
    gbs = 4 * N_EW * N_EW * 4 / r["ms"] / 1e6
    rep.table("(a') torch.compile of the same chain (child process)", ["kernel", "time (us)", "GB/s", "% of copy",
                                                                      "first call (s)", "max error vs eager"],
              [["torch.compile", r["ms"] * 1e3, gbs, _pct(gbs, ctx), r["first_call_s"], f"{r['err']:.1e}"]])


def section_rows(ctx: Ctx, rep: Report) -> None:
    te, topi, mem = ctx.jitop.te, ctx.topi, ctx.memory
    shape = (N_EW, N_EW)
    x = ctx.rand(shape, 3, 4.0)
    g, bb = ctx.rand(N_EW, 4) + 1, ctx.rand(N_EW, 5)
    dx, dg, dbb, dy = mem.to_device(x), mem.to_device(g), mem.to_device(bb), mem.empty(shape, np.float32)
    nbytes = 2 * x.nbytes
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    want_sm = e / e.sum(axis=1, keepdims=True)
    mean = x64.mean(axis=1, keepdims=True)
    want_ln = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(axis=1, keepdims=True) + 1e-5) * g + bb
    rows: list[list[Any]] = []
    torch = ctx.torch
    for name in ("softmax", "layer_norm"):
        X = te.placeholder(shape, name="X")
        if name == "softmax":
            Y = topi.softmax(X)
            args, dev, want = [X, Y], [dx, dy], want_sm
        else:
            G, Bt = te.placeholder((N_EW,), name="g"), te.placeholder((N_EW,), name="b")
            Y = topi.layer_norm(X, G, Bt, 1e-5)
            args, dev, want = [X, G, Bt, Y], [dx, dg, dbb, dy], want_ln
        build = lambda: ctx.build(topi.schedule_row_reduce(Y, target=ctx.target), args)  # noqa: E731
        _jitop_rows(ctx, rows, f"jitop {name}", build, dev, want, nbytes, show_block=True)
        _traced_rows(ctx, rows, f"jitop traced numpy {name}", TRACED_ROWS[name], dev[:-1], want, nbytes)
        if torch is not None:
            tx = torch.from_numpy(x).cuda()
            if name == "softmax":
                op = lambda: torch.softmax(tx, dim=1)  # noqa: E731
            else:
                tg, tb = torch.from_numpy(g).cuda(), torch.from_numpy(bb).cuda()
                op = lambda: torch.nn.functional.layer_norm(tx, (N_EW,), tg, tb, 1e-5)  # noqa: E731
            terr = float(np.abs(op().cpu().numpy() - want).max())
            rows.append(_bandwidth_row(ctx, f"torch {name}", ctx.time_ms(op, "torch"), nbytes, f"{terr:.1e}"))
    rep.table(f"(b) softmax and layer norm over rows, {N_EW}x{N_EW} float32 (8 bytes per element)",
              ["kernel", "time (us)", "GB/s", "% of copy", "max error vs float64", "build (s)"], rows)


def _numpy_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _numpy_layer_norm(x, g, b):
    mu = x.mean(axis=-1, keepdims=True)
    d = x - mu
    return d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + 1e-5) * g + b


TRACED_ROWS = {"softmax": _numpy_softmax, "layer_norm": _numpy_layer_norm}


def _traced_rows(ctx: Ctx, rows: list[list[Any]], label: str, fn: Callable, dev: list[Any], want: np.ndarray,
                 nbytes: int) -> None:
    """A row for the numpy function as `@jitop.kernel(target="cuda")` on device arrays (a row group: one kernel
    per call; the result is allocated on the device by each call, as a user's call does)."""
    try:
        kernel = ctx.jitop.kernel(fn, target="cuda", fallback=False)
        t0 = time.perf_counter()
        out = kernel(*dev)
        secs = time.perf_counter() - t0
        err = float(np.abs(out.get() - want).max())
        rows.append(_bandwidth_row(ctx, label, ctx.time_ms(lambda: kernel(*dev)), nbytes, f"{err:.1e}",
                                   f"{secs:.2f}"))
    except Exception as err:  # noqa: BLE001
        traceback.print_exc()
        rows.append([label, "error", f"{type(err).__name__}: {err}"[:120], "", "", ""])


def _gemm_error_ratio(ctx: Ctx, got: np.ndarray | Any, ta, tb) -> float:
    """max |C - C64| / (K eps sum_k |a||b|): at most 1 for a correct float32 product (computed with torch)."""
    torch = ctx.torch
    k = ta.shape[1]
    c64 = ta.double() @ tb.double()
    bound = (k * EPS32) * (ta.abs().double() @ tb.abs().double()) + 1e-30
    g = got if isinstance(got, torch.Tensor) else torch.from_numpy(np.asarray(got)).cuda()
    return float(((g.double() - c64).abs() / bound).max())


def section_sgemm(ctx: Ctx, rep: Report, sizes, deadline: float) -> None:
    te, topi, mem, torch = ctx.jitop.te, ctx.topi, ctx.memory, ctx.torch
    rows = []
    for n in sizes:
        if time.time() > deadline:
            rows.append([n, "skipped (time budget)", "", "", "", "", "", ""])
            continue
        a, b = ctx.rand((n, n), 6), ctx.rand((n, n), 7)
        da, db, dc = mem.to_device(a), mem.to_device(b), mem.empty((n, n), np.float32)
        flops = 2.0 * n ** 3
        row: list[Any] = [n]
        try:
            A, B = te.placeholder((n, n), name="A"), te.placeholder((n, n), name="B")
            C = topi.matmul(A, B)
            cfg = topi.default_matmul_config(n, n, n, ctx.target)
            f, secs = ctx.build(topi.schedule_matmul(C, cfg, target=ctx.target), [A, B, C])
            f(da, db, dc)
            ms = ctx.time_ms(lambda: f(da, db, dc))
            jt = flops / ms / 1e9
            row += [f"{cfg['bm']}x{cfg['bn']}x{cfg['bk']} / {cfg['tm']}x{cfg['tn']}", jt]
        except Exception as err:  # noqa: BLE001
            traceback.print_exc()
            row += [f"error: {type(err).__name__}: {err}"[:120], float("nan")]
            jt = float("nan")
        if torch is not None:
            ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            torch.backends.cuda.matmul.allow_tf32 = False
            fp32 = flops / ctx.time_ms(lambda: torch.mm(ta, tb), "torch") / 1e9
            torch.backends.cuda.matmul.allow_tf32 = True
            tf32 = flops / ctx.time_ms(lambda: torch.mm(ta, tb), "torch") / 1e9
            torch.backends.cuda.matmul.allow_tf32 = False
            ratio = _gemm_error_ratio(ctx, dc.get(), ta, tb) if jt == jt else float("nan")
            row += [fp32, f"{100 * jt / fp32:.0f} %", tf32, f"{100 * jt / tf32:.0f} %", f"{ratio:.2g}",
                    f"{secs:.2f}" if jt == jt else ""]
        else:
            row += ["", "", "", "", "", ""]
        rows.append(row)
        del da, db, dc
    rep.table("(c) SGEMM float32, square (TFLOP/s)",
              ["n", "jitop tiles (bm x bn x bk / tm x tn)", "jitop", "cuBLAS FP32", "jitop / FP32", "cuBLAS TF32",
               "jitop / TF32", "error / bound", "build (s)"], rows,
              "error / bound: max |C - C_float64| / (K eps sum|a||b|), at most 1 when correct.")


GEMV_SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 50257)]  # GPT-2 small's decode (k, n)


def section_gemv(ctx: Ctx, rep: Report) -> None:
    """One row times GPT-2's weights (a decode step's dense layers): the "cuda.gemv" schedule (the graph's choice
    for at most GEMV_ROWS rows), the SGEMM tiles the graph used before it, torch.mm (FP32); a read of B, so GB/s
    against the copy bandwidth."""
    from jitop.topi import cuda_gemv
    te, topi, mem, torch = ctx.jitop.te, ctx.topi, ctx.memory, ctx.torch
    rows: list[list[Any]] = []
    for k, n in GEMV_SHAPES:
        a, b = ctx.rand((1, k), 8), ctx.rand((k, n), 9)
        da, db, dc = mem.to_device(a), mem.to_device(b), mem.empty((1, n), np.float32)
        nbytes = 4 * (k * n + k + n)
        want = a.astype(np.float64) @ b
        A, B = te.placeholder((1, k), name="A"), te.placeholder((k, n), name="B")
        label = f"1x{k}x{n}"
        cfg = cuda_gemv.default_gemv_config(1, n, k, ctx.target)
        G = cuda_gemv.gemv(A, B)
        _jitop_rows(ctx, rows, f"{label} jitop gemv {cfg['cols']}x{cfg['ks']}", lambda: ctx.build(
            cuda_gemv.schedule_gemv(G, cfg, ctx.target), [A, B, G]), [da, db, dc], want, nbytes, raw=False)
        C = topi.matmul(A, B)
        _jitop_rows(ctx, rows, f"{label} jitop SGEMM tiles (before)", lambda: ctx.build(
            topi.schedule_matmul(C, target=ctx.target), [A, B, C]), [da, db, dc], want, nbytes, raw=False)
        if torch is not None:
            ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            got = torch.mm(ta, tb).cpu().numpy()
            rows.append(_bandwidth_row(ctx, f"{label} torch.mm", ctx.time_ms(lambda: torch.mm(ta, tb), "torch"),
                                       nbytes, f"{np.abs(got - want).max():.1e}"))
        del da, db, dc
    _gelu_gemv_rows(ctx, rows)
    rep.table("(c0) One row times a weight matrix (GEMV), float32", ["kernel", "time (us)", "GB/s", "% of copy",
                                                                   "max error", "build (s)"], rows)


def _gelu_gemv_rows(ctx: Ctx, rows: list[list[Any]], k: int = 3072, n: int = 768) -> None:
    """GPT-2's MLP down-projection of one token, GELU(h) @ W: jitop's GEMV computes the GELU of its block's row
    into shared memory (once per block of columns), torch runs the GELU and the product as two kernels."""
    from jitop.topi import cuda_gemv
    te, mem, torch = ctx.jitop.te, ctx.memory, ctx.torch
    h, b = ctx.rand((1, k), 10), ctx.rand((k, n), 11)
    h64 = h.astype(np.float64)
    want = (0.5 * h64 * (1 + np.tanh(0.7978845608 * (h64 + 0.044715 * h64 ** 3)))) @ b
    dh, db, dc = mem.to_device(h), mem.to_device(b), mem.empty((1, n), np.float32)
    nbytes = 4 * (k * n + k + n)
    H, B = te.placeholder((1, k), name="H"), te.placeholder((k, n), name="B")
    A = te.compute((1, k), lambda i, j: 0.5 * H[i, j] * (1.0 + te.tanh(0.7978845608 * (
        H[i, j] + 0.044715 * H[i, j] * H[i, j] * H[i, j]))), name="gelu")
    G = cuda_gemv.gemv(A, B)
    cfg = cuda_gemv.default_gemv_config(1, n, k, ctx.target)
    _jitop_rows(ctx, rows, f"GELU(1x{k}) x {k}x{n} jitop gemv {cfg['cols']}x{cfg['ks']}", lambda: ctx.build(
        cuda_gemv.schedule_gemv(G, cfg, ctx.target), [H, B, G]), [dh, db, dc], want, nbytes, raw=False)
    if torch is not None:
        th, tb = torch.from_numpy(h).cuda(), torch.from_numpy(b).cuda()

        def torch_gelu_mm():
            return torch.mm(torch.nn.functional.gelu(th, approximate="tanh"), tb)
        got = torch_gelu_mm().cpu().numpy()
        rows.append(_bandwidth_row(ctx, f"GELU(1x{k}) x {k}x{n} torch gelu + mm",
                                   ctx.time_ms(torch_gelu_mm, "torch"), nbytes, f"{np.abs(got - want).max():.1e}"))
    del dh, db, dc


def _tc_error_ratio(ctx: Ctx, got: Any, ta, tb, mode: str) -> float:
    """max |C - C64| / ((u + K eps) sum_k |a||b|), u = TC_PRODUCT_ERROR[mode]: at most 1 for a correct TF32 / BF16
    product (each operand rounded to 11 / 8 significant bits, the sum in float32)."""
    torch = ctx.torch
    k = ta.shape[1]
    c64 = ta.double() @ tb.double()
    bound = (TC_PRODUCT_ERROR[mode] + k * EPS32) * (ta.abs().double() @ tb.abs().double()) + 1e-30
    g = got if isinstance(got, torch.Tensor) else torch.from_numpy(np.asarray(got)).cuda()
    return float(((g.double() - c64).abs() / bound).max())


def _tc_peer(ctx: Ctx, mode: str, ta, tb) -> tuple[Callable[[], Any], str]:
    """cuBLAS's counterpart of a `mode` tensor-core SGEMM and its name: for TF32 torch.mm of the float32 tensors
    (timed with allow_tf32 on); for BF16 torch.mm of bfloat16 copies made beforehand, float32 accumulation
    (reduced-precision reductions off), float32 out where torch.mm takes out_dtype, else bfloat16 out."""
    torch = ctx.torch
    if mode == "tf32":
        return (lambda: torch.mm(ta, tb)), "cuBLAS TF32"
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    a16, b16 = ta.bfloat16(), tb.bfloat16()
    try:
        torch.mm(a16, b16, out_dtype=torch.float32)
        return (lambda: torch.mm(a16, b16, out_dtype=torch.float32)), "cuBLAS BF16 (fp32 acc, fp32 out)"
    except (TypeError, RuntimeError):  # torch without mm(out_dtype=) on CUDA
        return (lambda: torch.mm(a16, b16)), "cuBLAS BF16 (fp32 acc, bf16 out)"


def section_sgemm_tc(ctx: Ctx, rep: Report, sizes, deadline: float, mode: str = "tf32") -> None:
    """(c'') SGEMM on `mode` ("tf32", "bf16") tensor cores: the best of TC_CONFIGS per size vs cuBLAS's
    counterpart (`_tc_peer`)."""
    te, topi, mem, torch = ctx.jitop.te, ctx.topi, ctx.memory, ctx.torch
    rows, peer_name = [], "cuBLAS " + mode.upper()
    for n in sizes:
        a, b = ctx.rand((n, n), 6), ctx.rand((n, n), 7)
        da, db, dc = mem.to_device(a), mem.to_device(b), mem.empty((n, n), np.float32)
        ta, tb = (torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()) if torch is not None else (None, None)
        flops, best = 2.0 * n ** 3, None
        for tiles in TC_CONFIGS:
            cfg = {**tiles, "tc": mode}
            label = f"{cfg['bm']}x{cfg['bn']}x{cfg['bk']} / {cfg['tm']}x{cfg['tn']}"
            if time.time() > deadline:
                rows.append([n, label, "skipped (time budget)", "", "", "", ""])
                continue
            try:
                A, B = te.placeholder((n, n), name="A"), te.placeholder((n, n), name="B")
                C = topi.matmul(A, B, tc=mode)
                f, _ = ctx.build(topi.schedule_matmul(C, cfg, target=ctx.target), [A, B, C])
                f(da, db, dc)
                ratio = _tc_error_ratio(ctx, dc.get(), ta, tb, mode) if torch is not None else float("nan")
                jt = flops / ctx.time_ms(lambda: f(da, db, dc), budget_ms=100, reps=3) / 1e9
            except Exception as err:  # noqa: BLE001
                traceback.print_exc()
                rows.append([n, label, f"error: {type(err).__name__}: {err}"[:120], "", "", "", ""])
                continue
            row = [n, label, jt, "", "", f"{ratio:.2g}", f.built.kernels[0].block]
            rows.append(row)
            best = row if best is None or jt > best[2] else best
        if torch is not None and best is not None:
            peer, peer_name = _tc_peer(ctx, mode, ta, tb)
            torch.backends.cuda.matmul.allow_tf32 = True  # the TF32 peer's setting (bfloat16 GEMMs ignore it)
            try:
                tflops = flops / ctx.time_ms(peer, "torch") / 1e9
            finally:
                torch.backends.cuda.matmul.allow_tf32 = False
            best[3:5] = [tflops, f"{100 * best[2] / tflops:.0f} % (best)"]
        del da, db, dc
    m = mode.upper()
    rep.table(f"(c'') SGEMM on {m} tensor cores, float32 in and out (TFLOP/s)",
              ["n", f"tiles (bm x bn x bk / tm x tn), tc={mode}", "jitop", peer_name, f"jitop / {peer_name}",
               f"error / {m} bound", "block"], rows,
              f"error / {m} bound: max |C - C_float64| / ((2^{int(np.log2(TC_PRODUCT_ERROR[mode]))} + K eps) "
              f"sum|a||b|), at most 1 when correct. Target (issue 25): the best config >= 60 % of {peer_name}.")


CONV_LAYERS = [       # ResNet-50's conv layers (C, H=W, K, R=S, stride, pad), measured at CONV_BATCHES
    (64, 56, 64, 1, 1, 0), (64, 56, 64, 3, 1, 1), (64, 56, 256, 1, 1, 0), (128, 28, 128, 3, 1, 1),
    (256, 14, 256, 3, 1, 1), (512, 7, 512, 3, 1, 1), (1024, 14, 256, 1, 1, 0), (3, 224, 64, 7, 2, 3),
]
CONV_BATCHES = (8, 32)


def _conv_error_ratio(ctx: Ctx, got: Any, tx, tw, stride: int, pad: int) -> float:
    """max |Y - Y_float64| / (C R S eps conv(|x|, |w|)): at most 1 for a correct float32 convolution."""
    F = ctx.torch.nn.functional
    crs = tw.shape[1] * tw.shape[2] * tw.shape[3]
    y64 = F.conv2d(tx.double(), tw.double(), stride=stride, padding=pad)
    bound = (crs + 2) * EPS32 * F.conv2d(tx.abs().double(), tw.abs().double(), stride=stride, padding=pad) + 1e-30
    g = got if isinstance(got, ctx.torch.Tensor) else ctx.torch.from_numpy(np.asarray(got)).cuda()
    return float(((g.double() - y64).abs() / bound).max())


def section_conv(ctx: Ctx, rep: Report, deadline: float) -> None:
    """(e) ResNet-50 conv layers as implicit GEMMs (schedule_conv2d's default tiles) vs cuDNN FP32 (TF32 off)."""
    te, topi, mem, torch = ctx.jitop.te, ctx.topi, ctx.memory, ctx.torch
    deadline = min(deadline, time.time() + 75.0)  # the whole section: about a minute, builds included
    if torch is not None:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
    rows: list[list[Any]] = []
    for batch in CONV_BATCHES:
        ratios = []
        for c, h, k, r, stride, pad in CONV_LAYERS:
            label = f"{c}x{h}x{h} -> {k}, {r}x{r}/{stride} pad {pad}"
            if time.time() > deadline:
                rows.append([batch, label, "skipped (time budget)", "", "", "", "", ""])
                continue
            row: list[Any] = [batch, label]
            jt = float("nan")
            try:
                X = te.placeholder((batch, c, h, h), name="X")
                W = te.placeholder((k, c, r, r), name="W")
                Y = topi.conv2d_nchw(X, W, stride, pad)
                g = Y.op.input_tensors[0]
                cfg = topi.default_conv2d_config(g.shape[0], g.shape[1], g.op.reduce_axis[0].extent, ctx.target)
                f, secs = ctx.build(topi.schedule_conv2d(Y, cfg, target=ctx.target), [X, W, Y])
                _, _, p, q = Y.shape
                flops = 2.0 * batch * k * p * q * c * r * r
                x, w = ctx.rand((batch, c, h, h), 12), ctx.rand((k, c, r, r), 13)
                dx, dw, dy = mem.to_device(x), mem.to_device(w), mem.empty(Y.shape, np.float32)
                f(dx, dw, dy)
                launch = raw_launcher(f, [dx, dw, dy]) or (lambda: f(dx, dw, dy))
                ms = ctx.time_ms(launch, budget_ms=100, reps=3)
                jt = flops / ms / 1e9
                row += [f"{cfg['bm']}x{cfg['bn']}x{cfg['bk']} / {cfg['tm']}x{cfg['tn']}", jt]
            except Exception as err:  # noqa: BLE001
                traceback.print_exc()
                row += [f"error: {type(err).__name__}: {err}"[:120], float("nan"), "", "", "", ""]
                rows.append(row)
                continue
            if torch is not None:
                try:
                    F = torch.nn.functional
                    tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
                    for _ in range(3):  # warm-up: cudnn.benchmark picks its algorithm here
                        F.conv2d(tx, tw, stride=stride, padding=pad)
                    tt = flops / ctx.time_ms(lambda: F.conv2d(tx, tw, stride=stride, padding=pad), "torch",
                                             budget_ms=100, reps=3) / 1e9
                    err = _conv_error_ratio(ctx, dy.get(), tx, tw, stride, pad)
                    ratios.append(jt / tt)
                    row += [tt, f"{jt / tt:.2f}", f"{err:.2g}", f"{secs:.2f}"]
                    del tx, tw
                except Exception as err:  # noqa: BLE001
                    traceback.print_exc()
                    row += [f"error: {type(err).__name__}: {err}"[:120], "", "", f"{secs:.2f}"]
            else:
                row += ["", "", "", f"{secs:.2f}"]
            rows.append(row)
            del dx, dw, dy
        if ratios:
            geo = float(np.exp(np.mean(np.log(ratios))))
            rows.append([batch, f"**geomean of {len(ratios)} layers**", "", "", "", f"**{geo:.2f}**", "", ""])
    rep.table("(e) conv2d float32, ResNet-50 layers, NCHW (TFLOP/s): implicit GEMM vs cuDNN FP32",
              ["batch", "layer (C x H x W -> K, R x S / stride)", "jitop tiles (bm x bn x bk / tm x tn)", "jitop",
               "cuDNN FP32", "jitop / cuDNN", "error / bound", "build (s)"], rows,
              "cuDNN: torch.nn.functional.conv2d, cudnn.allow_tf32 = False, cudnn.benchmark = True, after warm-up. "
              "jitop: kernel time (raw launches). error / bound: max |Y - Y_float64| / (C R S eps conv(|x|, |w|)), "
              "at most 1 when correct. Target: geomean >= 0.7.")


def _wall_ms(fn: Callable[[], Any], budget_s: float = 3.0, reps: int = 5) -> float:
    """Median wall milliseconds of one call of `fn` (a call that returns host data, so it waits for the GPU)."""
    fn()
    t0 = time.perf_counter()
    fn()
    n = int(max(1, min(50, budget_s / reps / max(time.perf_counter() - t0, 1e-6))))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(times)


def _models() -> list[tuple[str, Callable, Callable, tuple, float]]:
    """(label, numpy function, torch function, numpy arguments, flops) of section (f)'s models, from
    bench_models (benchmarks/ is on sys.path when this file runs as a script): the weights are the functions'
    own constants, the first argument the input."""
    import bench_models as bm  # noqa: E402 - a sibling script's module
    params = bm.resnet_params(bm.RESNET50_BLOCKS, True, seed=50)
    x = np.random.default_rng(51).standard_normal((MODEL_BATCH, 3, 224, 224)).astype(np.float32)

    def resnet50(x):
        return bm.resnet(x, params, bm.RESNET50_BLOCKS, True)

    def torch_resnet50(x, torch_params):
        import torch
        F = torch.nn.functional
        return bm.resnet(x, torch_params, bm.RESNET50_BLOCKS, True, F.conv2d, F.max_pool2d, torch.relu)
    g = bm.args_gpt2()

    def gpt2(x):
        return bm.gpt2_block(x, *g[1:])

    def torch_gpt2(x, torch_params):
        return bm.torch_gpt2_block(x, *torch_params)
    return [(f"ResNet-50, batch {MODEL_BATCH}, 3x224x224", resnet50, torch_resnet50, (x, params),
             MODEL_BATCH * bm.resnet_flops(bm.RESNET50_BLOCKS, True)),
            (f"GPT-2-small block, T={bm.T_PREFILL}, as written (12 heads in a Python loop)", gpt2, torch_gpt2,
             (g[0], g[1:]), bm._gpt2_flops(bm.T_PREFILL, bm.T_PREFILL, bm.C_GPT2))]


def section_models(ctx: Ctx, rep: Report, deadline: float) -> None:
    """(f) whole models written in numpy, as `@jitop.kernel(target="cuda")` (ONNX models take this path too:
    jitop.onnx.load(model, target="cuda") traces into the same graph) vs the same functions in torch eager on
    the GPU: numpy in and out for both (the input copied to the GPU, the output back, per call), then with the
    input already on the GPU (a torch CUDA tensor, which the jitop kernel reads in place) and the output left
    there."""
    rows = []
    for label, fn, torch_fn, (x, params), flops in _models():
        if time.time() > deadline - 20:
            rows.append([label, "skipped (time budget)"] + [""] * 7)
            continue
        try:
            rows.append([label, *_model_row(ctx, fn, torch_fn, x, params, flops)])
        except Exception as err:  # noqa: BLE001
            traceback.print_exc()
            rows.append([label, f"error: {type(err).__name__}: {err}"[:160]] + [""] * 7)
    rep.table("(f) whole models on the GPU, float32 (ms per call)",
              ["model", "jitop first call (s)", "jitop ms, numpy in/out", "jitop GFLOP/s", "torch ms, numpy in/out",
               "torch / jitop", "jitop ms, on the GPU", "torch ms, on the GPU", "max |jitop - torch| / max |torch|"],
              rows,
              "jitop: `jitop.kernel(f, target='cuda')` of the numpy function (weights are its constants, copied to "
              "the GPU once); first call = trace + compile + PTX load + run. torch: the same function on torch "
              "tensors (cuDNN / cuBLAS, TF32 off). numpy in/out: `torch.from_numpy(x).cuda()` in, `.cpu().numpy()` "
              "out (jitop copies alike); on the GPU: a CUDA tensor in, the result left on the GPU, then a "
              "synchronize. Wall time per call, median of 5 batches.")


def _model_row(ctx: Ctx, fn: Callable, torch_fn: Callable, x: np.ndarray, params: Any, flops: float) -> list[Any]:
    """Section (f)'s cells for one model (see section_models)."""
    kernel = ctx.jitop.kernel(fn, target="cuda", fallback=False)
    t0 = time.perf_counter()
    got = kernel(x)
    cold = time.perf_counter() - t0
    ms = _wall_ms(lambda: kernel(x))
    row: list[Any] = [f"{cold:.1f}", ms, flops / ms / 1e9]
    torch = ctx.torch
    if torch is None:
        return row + [""] * 5
    tp = [torch.from_numpy(np.ascontiguousarray(p)).cuda() for p in params]
    tx = torch.from_numpy(x).cuda()

    def run_torch(inp):
        with torch.no_grad():
            return torch_fn(inp, tp)
    want = run_torch(tx).cpu().numpy()
    tms = _wall_ms(lambda: run_torch(torch.from_numpy(x).cuda()).cpu().numpy())
    on_gpu = _wall_ms(lambda: (kernel(tx), ctx.sync()))
    torch_on_gpu = _wall_ms(lambda: (run_torch(tx), ctx.sync()))
    err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
    return row + [tms, f"{tms / ms:.2f}", on_gpu, torch_on_gpu, f"{err:.1e}"]


def section_sgemm_sweep(ctx: Ctx, rep: Report, sizes, deadline: float) -> None:
    te, topi, mem = ctx.jitop.te, ctx.topi, ctx.memory
    rows = []
    for n in sizes:
        a, b = ctx.rand((n, n), 8), ctx.rand((n, n), 9)
        da, db, dc = mem.to_device(a), mem.to_device(b), mem.empty((n, n), np.float32)
        if ctx.torch is not None:
            ta, tb = ctx.torch.from_numpy(a).cuda(), ctx.torch.from_numpy(b).cuda()
        for cfg in SWEEP:
            label = f"{cfg['bm']}x{cfg['bn']}x{cfg['bk']} / {cfg['tm']}x{cfg['tn']}"
            label += ", 2 stages" if cfg.get("stages", 1) == 2 else ""
            if time.time() > deadline:
                rows.append([n, label, "skipped (time budget)", "", ""])
                continue
            try:
                A, B = te.placeholder((n, n), name="A"), te.placeholder((n, n), name="B")
                C = topi.matmul(A, B)
                f, _ = ctx.build(topi.schedule_matmul(C, cfg, target=ctx.target), [A, B, C])
            except Exception as err:  # noqa: BLE001
                rows.append([n, label, f"error: {type(err).__name__}: {err}"[:120], "", ""])
                continue
            try:
                f(da, db, dc)
                ratio = _gemm_error_ratio(ctx, dc.get(), ta, tb) if ctx.torch is not None else float("nan")
                ms = ctx.time_ms(lambda: f(da, db, dc), budget_ms=100, reps=3)
                rows.append([n, label, 2.0 * n ** 3 / ms / 1e9, f"{ratio:.2g}", f.built.kernels[0].block])
            except Exception as err:  # noqa: BLE001
                traceback.print_exc()
                rows.append([n, label, f"error: {type(err).__name__}: {err}"[:120], "", ""])
        del da, db, dc
    rep.table("(c') SGEMM tile configs (TFLOP/s)", ["n", "bm x bn x bk / tm x tn", "jitop", "error / bound", "block"],
              rows)


def _tiny_numpy(a, b):
    return a * b + 1


def section_launch(ctx: Ctx, rep: Report) -> None:
    te, topi, mem, driver = ctx.jitop.te, ctx.topi, ctx.memory, ctx.driver
    n = 256
    A, B = te.placeholder((n,), name="A"), te.placeholder((n,), name="B")
    Y = te.compute((n,), lambda i: A[i] * B[i] + 1.0, name="Y")
    f, _ = ctx.build(topi.schedule_injective(Y, target=ctx.target), [A, B, Y])
    a, b = ctx.rand(n, 10), ctx.rand(n, 11)
    da, db, dy = mem.to_device(a), mem.to_device(b), mem.empty((n,), np.float32)
    f(da, db, dy)
    assert np.allclose(dy.get(), a * b + 1, rtol=1e-6, atol=1e-6), "tiny kernel: wrong result"
    rows = []

    def per_call_us(fn, calls: int = 3000) -> float:
        return us_per_call(fn, ctx.sync, calls)

    rows.append(["jitop f(da, db, out) with device arrays", per_call_us(lambda: f(da, db, dy))])
    raw = raw_launcher(f, [da, db, dy])
    if raw is not None:
        rows.append(["the same kernel, raw driver launches (no wrapper)", per_call_us(raw)])
    rows.append(["jitop f(da, db): output allocated per call", per_call_us(lambda: f(da, db), 1000)])
    if ctx.torch is not None:
        torch = ctx.torch
        ta, tb, ty = (torch.from_numpy(x).cuda() for x in (a, b, np.empty(n, np.float32)))
        rows.append(["jitop f(ta, tb, out) with torch tensors", per_call_us(lambda: f(ta, tb, ty))])
        rows.append(["torch.mul(ta, tb, out=ty) (reference)",
                     per_call_us(lambda: torch.mul(ta, tb, out=ty))])
    rows.append(["jitop f(a, b) numpy in/out (copies)", per_call_us(lambda: f(a, b), 300)])
    label = "@jitop.kernel(target='cuda') of a * b + 1, device arrays in and out"
    try:
        traced = ctx.jitop.kernel(_tiny_numpy, target="cuda", fallback=False)
        assert np.allclose(traced(da, db).get(), a * b + 1, rtol=1e-6, atol=1e-6), "traced kernel: wrong result"
        rows.append([label, per_call_us(lambda: traced(da, db), 1000)])
        symbolic = ctx.jitop.kernel(_tiny_numpy, target="cuda", dynamic=True, fallback=False)
        assert np.allclose(symbolic(da, db).get(), a * b + 1, rtol=1e-6, atol=1e-6), "symbolic: wrong result"
        rows.append([label + ", symbolic size (dynamic=True)", per_call_us(lambda: symbolic(da, db), 1000)])
    except Exception as err:  # noqa: BLE001
        traceback.print_exc()
        rows.append([label, f"error: {type(err).__name__}: {err}"[:120]])
    rep.table(f"(d) launch overhead from Python: a {n}-element kernel", ["call", "us per call"], rows,
              "Wall time per call over thousands of back-to-back calls, then one synchronize.")


# ** main **

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="write the markdown report here (also printed)")
    p.add_argument("--budget", type=float, default=200.0, help="seconds after which remaining sections are skipped")
    p.add_argument("--sizes", type=int, nargs="*", default=list(GEMM_SIZES), help="SGEMM sizes")
    p.add_argument("--sweep", type=int, nargs="*", default=[4096, 2048], help="SGEMM sizes of the config sweep")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--no-conv", action="store_true", help="skip the ResNet-50 conv2d section")
    p.add_argument("--no-tc", action="store_true", help="skip the TF32 and BF16 tensor-core SGEMM sections")
    p.add_argument("--no-models", action="store_true", help="skip the whole-model section (f)")
    args = p.parse_args(argv)
    t0 = time.time()
    deadline = t0 + args.budget
    rep = Report(args.out)
    failures = 0
    try:
        ctx = Ctx()
    except Exception:  # noqa: BLE001
        rep.add("# jitop GPU benchmark\n\nno usable GPU / jitop runtime:\n\n```\n" + traceback.format_exc() + "```")
        return 1
    sections: list[tuple[str, Callable[[], None]]] = [
        ("environment", lambda: section_env(ctx, rep)),
        ("copy bandwidth", lambda: section_copy(ctx, rep)),
        ("elementwise", lambda: section_elementwise(ctx, rep)),
        ("softmax / layer norm", lambda: section_rows(ctx, rep)),
        ("GEMV", lambda: section_gemv(ctx, rep)),
        ("SGEMM", lambda: section_sgemm(ctx, rep, args.sizes, deadline)),
    ]
    if not args.no_tc:
        sections += [(f"SGEMM {mode.upper()}", lambda mode=mode: section_sgemm_tc(ctx, rep, args.sizes, deadline - 60,
                                                                                 mode)) for mode in ("tf32", "bf16")]
    if not args.no_conv:
        sections.append(("conv2d", lambda: section_conv(ctx, rep, deadline)))
    if not args.no_models:
        sections.append(("models", lambda: section_models(ctx, rep, deadline)))
    sections += [
        ("launch overhead", lambda: section_launch(ctx, rep)),
        ("SGEMM configs", lambda: section_sgemm_sweep(ctx, rep, args.sweep, deadline - 30)),
    ]
    if not args.no_compile:
        sections.append(("torch.compile", lambda: section_torch_compile(
            ctx, rep, timeout=max(10.0, min(120.0, deadline - time.time())))))
    for name, run in sections:
        if time.time() > deadline:
            rep.add(f"\n({name}: skipped, the {args.budget:.0f} s budget is spent)")
            continue
        t = time.time()
        try:
            run()
        except Exception as err:  # noqa: BLE001 - one section's failure must not stop the others
            failures += 1
            tb = traceback.format_exc()
            print(tb, file=sys.stderr, flush=True)
            rep.add(f"\n### {name}: FAILED\n\n```\n{type(err).__name__}: {err}\n{tb[-1500:]}```")
        print(f"[{name}: {time.time() - t:.1f} s]", file=sys.stderr, flush=True)
    rep.add(f"\n(total {time.time() - t0:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
