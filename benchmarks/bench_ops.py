"""The operator library with its default configs, float32, 2 threads, next to numpy and torch, in one run.

1. jitop.matmul, GFLOP/s: square N = 64 ... 4096, 1000^3 and (M, N, K) = (127, 513, 255) (a is (M, K));
   peers np.matmul with OPENBLAS_CORETYPE=Haswell (AVX2 kernels) and unset (the kernels OpenBLAS detects,
   what users get; the column names them, e.g. SkylakeX), torch.matmul; "% of peak" against the FP32 FMA
   peak measured at the start of the run (benchmarks/peak.py) for the Target's thread count.
2. jitop.conv2d, GFLOP/s (2*N*OC*OH*OW*IC*KH*KW), batch 1, the ResNet-18 layers (`--conv-shapes ragged`:
   six convolutions with odd output channel counts instead), NCHW and NHWC; peers
   torch NCHW and channels_last, and numpy im2col + one sgemm (common.Im2colConv2d) under both OpenBLAS
   settings; geometric means and the target ratios (jitop NCHW / torch NCHW geomean >= 0.8, jitop / numpy
   im2col (OPENBLAS_CORETYPE unset) >= 1.3 per layer).
3. jitop.softmax and jitop.layer_norm on (4096, 1024), ms; peers numpy (as users write it) and torch.

Every figure is the best of several single calls (more of them when a call is short), the first
(compiling) call excluded, each library's turn after 0.2 s idle so the previous one's spinning worker
threads are asleep. numpy runs in a fresh process per OPENBLAS_CORETYPE setting (OpenBLAS reads it at load
time). Each jitop and torch result is checked once against a reference (a float64 product for matmul, a
float64 im2col for conv2d, numpy's float32 formulas for softmax and layer_norm) and reported as WRONG
instead of timed when off by more than the tolerance. jitop's operator kernels run with fallback=False, so
an operator that cannot compile shows as unavailable, not as a numpy time under jitop's name. jitop.conv2d
rows are skipped when the function does not exist. JITOP_NUM_THREADS and OPENBLAS_NUM_THREADS default to 2
here; torch.set_num_threads follows jitop's thread count. The header and footer give the CPU use of other
processes (sampled from /proc/stat): 2-thread figures are only meaningful on an otherwise idle machine.

    python benchmarks/bench_ops.py [--quick] [--sections matmul conv2d norm] [--conv-shapes resnet18|ragged]
                                   [--peak GFLOPS]
    JITOP_CPU=haswell python benchmarks/bench_ops.py    # AVX2 code (and AVX2 peak) on an AVX-512 machine

The code is built for jitop.Target.current() (the host, or the CPU named by JITOP_CPU); the header states
it and the measured peak. --peak overrides the measured peak (GFLOP/s of the threads used).

--quick: small sizes only (a smoke test of the script; its figures say nothing about the targets).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any, Callable

THREADS = 2
for _var in ("JITOP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, str(THREADS))  # before numpy and jitop load

import numpy as np  # noqa: E402

import jitop  # noqa: E402
from jitop import config  # noqa: E402
from jitop.kernel import KernelFunction  # noqa: E402

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_kernel import layer_norm as numpy_layer_norm  # noqa: E402
from bench_kernel import reason  # noqa: E402
from bench_kernel import softmax as numpy_softmax  # noqa: E402
from common import (CORETYPES, Im2colConv2d, best_time, busy_cores, machine, numpy_conv2d_seconds,  # noqa: E402
                    numpy_label, numpy_matmul_seconds, pct_of_peak, peak_gflops, table, versions)

try:
    import torch
except ImportError:  # torch is optional: its columns say so
    torch = None

MATMUL = [(n, n, n) for n in (64, 128, 256, 512, 1024, 2048, 4096)] + [(1000, 1000, 1000), (127, 513, 255)]
MATMUL_QUICK = [(64, 64, 64), (128, 128, 128), (256, 256, 256), (127, 513, 255)]
# (label, C, H=W, OC, K, stride, padding): the ResNet-18 convolutions, batch 1
LAYERS = [("layer1 64x56x56 -> 64, 3x3/1 p1", 64, 56, 64, 3, 1, 1),
          ("layer2 128x28x28 -> 128, 3x3/1 p1", 128, 28, 128, 3, 1, 1),
          ("layer3 256x14x14 -> 256, 3x3/1 p1", 256, 14, 256, 3, 1, 1),
          ("layer4 512x7x7 -> 512, 3x3/1 p1", 512, 7, 512, 3, 1, 1),
          ("conv1 3x224x224 -> 64, 7x7/2 p3", 3, 224, 64, 7, 2, 3)]
# --conv-shapes ragged: output channels the direct register tile does not divide (odd, MobileNet-like counts)
RAGGED = [("37x61x61 -> 53, 3x3/1 p1", 37, 61, 53, 3, 1, 1), ("16x56x56 -> 24, 3x3/1 p1", 16, 56, 24, 3, 1, 1),
          ("48x28x28 -> 40, 3x3/1 p1", 48, 28, 40, 3, 1, 1), ("64x30x30 -> 100, 3x3/1 p1", 64, 30, 100, 3, 1, 1),
          ("112x14x14 -> 112, 3x3/1 p1", 112, 14, 112, 3, 1, 1), ("3x112x112 -> 24, 3x3/2 p1", 3, 112, 24, 3, 2, 1)]
LAYERS_QUICK = [("64x14x14 -> 64, 3x3/1 p1", 64, 14, 64, 3, 1, 1),
                ("3x32x32 -> 16, 7x7/2 p3", 3, 32, 16, 7, 2, 3)]
NORM_SHAPE, NORM_SHAPE_QUICK = (4096, 1024), (512, 1024)
NORM_TARGET_MS = {"softmax": 1.2, "layer_norm": 0.8}
CONV_TORCH_TARGET, CONV_NUMPY_TARGET = 0.8, 1.3

Result = Any  # seconds (float) or why there is no time (str)


# ** measuring **

def strict_ops() -> None:
    """Make jitop's operator kernels raise instead of silently running as plain numpy."""
    for name, module in list(sys.modules.items()):
        if name.startswith("jitop.ops") and module is not None:
            for value in vars(module).values():
                if isinstance(value, KernelFunction):
                    value.fallback = False


def to_numpy(x: Any) -> np.ndarray:
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


def rel_err(got: Any, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref| (inf on a shape mismatch)."""
    got = to_numpy(got)
    if got.shape != ref.shape:
        return float("inf")
    return float(np.abs(got.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


def abs_err(got: Any, ref: np.ndarray) -> float:
    got = to_numpy(got)
    if got.shape != ref.shape:
        return float("inf")
    return float(np.abs(got.astype(np.float64) - ref).max())


SETTLE_S = 0.2  # idle before each library's turn: OpenBLAS's workers spin ~2**28 cycles after a call, OpenMP's too


def settle() -> None:
    """Let the previous library's spinning worker threads go to sleep before the next one is measured."""
    time.sleep(SETTLE_S)


def timed(call: Callable[[], Any], ref: np.ndarray, tol: float, repeat: int = 7,
          err: Callable[[Any, np.ndarray], float] = rel_err, view: Callable[[Any], Any] = lambda y: y
          ) -> tuple[Result, str]:
    """(best seconds of `call`, or why it was not timed; its error vs `ref` as text). The first call, which
    compiles, is the checked one and is not timed."""
    try:
        settle()
        got = call()
        e = err(view(got), ref)
        del got  # a big jitop output is recycled by the next call only once nobody holds it
        if not e <= tol:
            return f"WRONG (err {e:.1e} > {tol:.0e}), not timed", f"{e:.1e}"
        return best_time(call, repeat), f"{e:.1e}"
    except Exception as ex:  # missing, cannot compile here, or fails
        return f"unavailable ({reason(ex)})", ""


def gflops(flops: float, r: Result) -> Result:
    return flops / r / 1e9 if isinstance(r, float) else r


def ratio(x: Result, y: Result) -> Result:
    return x / y if isinstance(x, float) and isinstance(y, float) else "n/a"


def fmt_ratio(r: Result) -> str:
    return f"{r:.2f}" if isinstance(r, float) else r


def geomean(values: list[Result]) -> Result:
    if not values or not all(isinstance(v, float) and v > 0 for v in values):
        return "n/a"
    return math.exp(sum(math.log(v) for v in values) / len(values))


def numpy_subprocess(run: Callable[[str | None], float]) -> list[Result]:
    """[seconds with OPENBLAS_CORETYPE=Haswell, seconds with it unset]."""
    out: list[Result] = []
    for _, core in CORETYPES:
        try:
            settle()
            out.append(run(core))
        except Exception as ex:
            out.append(f"unavailable ({reason(ex)})")
    return out


def no_torch() -> tuple[Result, str]:
    return "unavailable (torch not installed)", ""


# ** 1. matmul **

def fmt_peak(peak: float | None, unit: bool = True) -> str:
    return "not measured" if not peak else f"{peak:.0f} GFLOP/s" if unit else f"{peak:.0f}"


def section_matmul(sizes: list[tuple[int, int, int]], peak: float | None) -> str:
    rows = []
    rng = np.random.default_rng(0)
    for m, n, k in sizes:
        a = rng.random((m, k), dtype=np.float32)
        b = rng.random((k, n), dtype=np.float32)
        ref = (a.astype(np.float64) @ b.astype(np.float64))
        flops = 2.0 * m * n * k
        repeat = 3 if m * n * k >= 4096 ** 3 else 7
        jit, jit_err = timed(lambda: jitop.matmul(a, b), ref, 1e-4, repeat)
        nps = numpy_subprocess(lambda core: numpy_matmul_seconds(m, n, k, core, repeat))
        if torch is not None:
            at, bt = torch.from_numpy(a), torch.from_numpy(b)
            tch, _ = timed(lambda: torch.matmul(at, bt), ref, 1e-4, repeat)
        else:
            tch, _ = no_torch()
        jit_g, tch_g = gflops(flops, jit), gflops(flops, tch)
        np_h, np_a = (gflops(flops, t) for t in nps)
        label = str(m) if m == n == k else f"{m}x{n}x{k}"
        rows.append([label, jit_g, np_h, np_a, tch_g, fmt_ratio(ratio(jit_g, np_a)), pct_of_peak(jit_g, peak),
                     jit_err])
    np_h_label, np_d_label = (numpy_label(core, short=True) for _, core in CORETYPES)
    return (f"### 1. matmul, float32, GFLOP/s (2*M*N*K / time); peak {fmt_peak(peak)}\n\n"
            f"Size N is N x N x N; MxNxK is (M, K) @ (K, N). {np_h_label}: OPENBLAS_CORETYPE=Haswell (AVX2 kernels); "
            f"{np_d_label}: OPENBLAS_CORETYPE unset, the kernels OpenBLAS detects. % of peak: of the peak measured "
            "at the start of this run. Error: max |C - C64| / max |C64| against a float64 product.\n\n"
            + table(["size", "jitop", np_h_label, np_d_label, "torch", f"jitop / {np_d_label}",
                     f"jitop % of peak ({fmt_peak(peak, unit=False)})", "jitop max rel err"], rows))


# ** 2. conv2d **

def section_conv2d(layers: list[tuple], peak: float | None) -> str:
    np_h, np_d = (numpy_label(core, short=True) for _, core in CORETYPES)
    has_conv = hasattr(jitop, "conv2d")
    rng = np.random.default_rng(1)
    perf, checks = [], []
    cols: dict[str, list[Result]] = {k: [] for k in ("jn", "jh", "tn", "tc", "nh", "na")}
    for label, c, hw, oc, ksz, s, p in layers:
        x = rng.random((1, c, hw, hw), dtype=np.float32)
        w = rng.random((oc, c, ksz, ksz), dtype=np.float32)
        ref = Im2colConv2d(x.shape, w.shape, s, p, dtype=np.float64)(x.astype(np.float64), w.astype(np.float64))
        _, _, oh, ow = ref.shape
        flops = 2.0 * oc * oh * ow * c * ksz * ksz
        if has_conv:
            jn, jn_err = timed(lambda: jitop.conv2d(x, w, stride=s, padding=p), ref, 1e-4)
            xh = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
            jh, jh_err = timed(lambda: jitop.conv2d(xh, w, stride=s, padding=p, layout="NHWC"), ref, 1e-4,
                               view=lambda y: to_numpy(y).transpose(0, 3, 1, 2))
        else:
            (jn, jn_err), (jh, jh_err) = ("jitop.conv2d missing", ""), ("jitop.conv2d missing", "")
        if torch is not None:
            F = torch.nn.functional
            xt, wt = torch.from_numpy(x), torch.from_numpy(w)
            xc, wc = xt.contiguous(memory_format=torch.channels_last), wt.contiguous(memory_format=torch.channels_last)
            with torch.no_grad():
                tn, _ = timed(lambda: F.conv2d(xt, wt, stride=s, padding=p), ref, 1e-4)
                tc, _ = timed(lambda: F.conv2d(xc, wc, stride=s, padding=p), ref, 1e-4)
        else:
            (tn, _), (tc, _) = no_torch(), no_torch()
        nh, na = numpy_subprocess(lambda core: numpy_conv2d_seconds(x.shape, w.shape, s, p, core))
        g = {key: gflops(flops, r) for key, r in zip(cols, (jn, jh, tn, tc, nh, na))}
        for key in cols:
            cols[key].append(g[key])
        perf.append([label, *g.values()])
        checks.append([label, fmt_ratio(ratio(g["jn"], g["tn"])), fmt_ratio(ratio(g["jn"], g["na"])),
                       fmt_ratio(ratio(g["jh"], g["na"])), fmt_ratio(ratio(g["jh"], g["tc"])), jn_err, jh_err])
    means = {key: geomean(v) for key, v in cols.items()}
    perf.append(["geometric mean", *means.values()])
    r_torch = geomean([ratio(a, b) for a, b in zip(cols["jn"], cols["tn"])])
    r_np = [ratio(a, b) for a, b in zip(cols["jn"], cols["na"])]
    r_np_h = [ratio(a, b) for a, b in zip(cols["jh"], cols["na"])]
    checks.append(["geometric mean", fmt_ratio(r_torch), fmt_ratio(geomean(r_np)), fmt_ratio(geomean(r_np_h)),
                   fmt_ratio(geomean([ratio(a, b) for a, b in zip(cols["jh"], cols["tc"])])), "", ""])

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    lines = []
    if isinstance(r_torch, float):
        lines.append(f"- jitop NCHW / torch NCHW, geometric mean over the {len(layers)} layers: {r_torch:.2f} "
                     f"(target >= {CONV_TORCH_TARGET}): {verdict(r_torch >= CONV_TORCH_TARGET)}")
    for name, rs in (("jitop NCHW", r_np), ("jitop NHWC", r_np_h)):
        if all(isinstance(r, float) for r in rs):
            worst = min(range(len(rs)), key=lambda i: rs[i])
            hits = sum(r >= CONV_NUMPY_TARGET for r in rs)
            lines.append(f"- {name} / {np_d} im2col, per layer: {hits} of {len(rs)} layers >= "
                         f"{CONV_NUMPY_TARGET}, lowest {rs[worst]:.2f} ({layers[worst][0]}): "
                         f"{verdict(hits == len(rs))}")
    if not has_conv:
        lines.append("- jitop.conv2d does not exist in this checkout: jitop rows skipped")
    return (f"### 2. conv2d, batch 1, float32, GFLOP/s (2*N*OC*OH*OW*IC*KH*KW / time); peak {fmt_peak(peak)}\n\n"
            "jitop NHWC: layout=\"NHWC\" (input (N, H, W, C), output (N, OH, OW, OC)); torch channels_last: input "
            "and weight in torch.channels_last; numpy im2col: common.Im2colConv2d (padded copy + KH*KW strided "
            "copies into a preallocated column matrix + one np.matmul, all timed) with OPENBLAS_CORETYPE=Haswell "
            f"({np_h} im2col) and unset ({np_d} im2col, the kernels OpenBLAS detects).\n\n"
            + table(["layer", "jitop NCHW", "jitop NHWC", "torch NCHW", "torch channels_last", f"{np_h} im2col",
                     f"{np_d} im2col"], perf)
            + "\n\nRatios (GFLOP/s over GFLOP/s) and jitop's max |y - y64| / max |y64| against a float64 im2col:\n\n"
            + table(["layer", "jitop NCHW / torch NCHW", f"jitop NCHW / {np_d} im2col",
                     f"jitop NHWC / {np_d} im2col", "jitop NHWC / torch channels_last",
                     "jitop NCHW max rel err", "jitop NHWC max rel err"], checks)
            + ("\n\n" + "\n".join(lines) if lines else ""))


# ** 3. softmax, layer_norm **

def section_norm(shape: tuple[int, int]) -> str:
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape, dtype=np.float32)
    w, b = (rng.standard_normal(shape[-1], dtype=np.float32) for _ in range(2))
    cases = [("softmax", lambda: jitop.softmax(x), lambda: numpy_softmax(x), 1e-6,
              lambda t: (lambda: torch.softmax(t[0], dim=-1))),
             ("layer_norm", lambda: jitop.layer_norm(x, shape[-1], w, b), lambda: numpy_layer_norm(x, w, b), 1e-4,
              lambda t: (lambda: torch.nn.functional.layer_norm(t[0], (shape[-1],), t[1], t[2], eps=1e-5)))]
    rows = []
    for name, jit_call, np_call, tol, torch_call in cases:
        ref = np_call().astype(np.float64)
        jit, jit_err = timed(jit_call, ref, tol, err=abs_err)
        settle()
        npy = best_time(np_call)
        if torch is not None:
            with torch.no_grad():
                tch, tch_err = timed(torch_call([torch.from_numpy(v) for v in (x, w, b)]), ref, tol, err=abs_err)
        else:
            tch, tch_err = no_torch()
        target = NORM_TARGET_MS[name]
        ms = [f"{r * 1e3:.2f}" if isinstance(r, float) else r for r in (jit, npy, tch)]
        met = ("met" if jit * 1e3 <= target else "NOT met") if isinstance(jit, float) else "n/a"
        rows.append([f"jitop.{name}", *ms, f"{target} ({met})", jit_err, tch_err])
    return (f"### 3. softmax and layer_norm over the last axis, {shape} float32, ms\n\n"
            "numpy: the usual formulas (bench_kernel.softmax, bench_kernel.layer_norm, eps 1e-5); torch: "
            "torch.softmax, torch.nn.functional.layer_norm. Errors: max abs difference from numpy.\n\n"
            + table(["op", "jitop ms", "numpy ms", "torch ms", "target ms", "jitop max abs diff",
                     "torch max abs diff"], rows))


BUSY_LIMIT = 0.2  # cores used by other processes above which the run is flagged
BUSY_WARNING = ("**Warning: other processes were using the CPU.** A 2-thread library whose threads wait for each "
                "other loses a scheduler time slice per call while another process holds a core (OpenBLAS then "
                "drops to a few GFLOP/s): figures of this run are not fit for the targets.")


def busy_text(busy: float | None) -> str:
    return "CPU use of other processes unknown" if busy is None else f"other processes busy {busy:.2f} cores"


def print_end_of_run(start: float) -> None:
    """The run's total time and the machine's load at its end (flagged when other processes used the CPU)."""
    busy = busy_cores()
    print(f"Total {time.perf_counter() - start:.0f} s; 1-min load average at end {os.getloadavg()[0]:.2f}; "
          f"{busy_text(busy)} at end")
    if busy is not None and busy > BUSY_LIMIT:
        print("\n" + BUSY_WARNING)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes only (smoke test, not for the targets)")
    p.add_argument("--sections", nargs="+", choices=["matmul", "conv2d", "norm"],
                   default=["matmul", "conv2d", "norm"])
    p.add_argument("--conv-shapes", choices=["resnet18", "ragged"], default="resnet18",
                   help="conv2d section: ResNet-18's layers, or convolutions with odd channel counts")
    p.add_argument("--peak", type=float, default=None,
                   help="peak float32 GFLOP/s of the threads used (default: measured at the start, peak.py)")
    args = p.parse_args()
    strict_ops()
    threads = config.num_threads()
    peak = args.peak or peak_gflops(threads)
    if torch is not None:
        torch.set_num_threads(threads)
    start = time.perf_counter()
    busy = busy_cores()
    quick = " (--quick: small sizes, not the targets)" if args.quick else ""
    given = f"peak given by --peak: {args.peak:.0f} GFLOP/s (used for % of peak); " if args.peak else ""
    print(f"Operator library, default configs, float32{quick} — {machine()}; "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}, torch threads="
          f"{torch.get_num_threads() if torch is not None else 'n/a'}; {versions('torch', 'llvmlite')}; "
          f"{given}1-min load average at start {os.getloadavg()[0]:.2f}; {busy_text(busy)} at start\n", flush=True)
    if busy is not None and busy > BUSY_LIMIT:
        print(BUSY_WARNING + "\n", flush=True)
    if "matmul" in args.sections:
        print(section_matmul(MATMUL_QUICK if args.quick else MATMUL, peak) + "\n", flush=True)
    if "conv2d" in args.sections:
        layers = LAYERS_QUICK if args.quick else RAGGED if args.conv_shapes == "ragged" else LAYERS
        print(section_conv2d(layers, peak) + "\n", flush=True)
    if "norm" in args.sections:
        print(section_norm(NORM_SHAPE_QUICK if args.quick else NORM_SHAPE) + "\n", flush=True)
    print_end_of_run(start)


if __name__ == "__main__":
    main()
