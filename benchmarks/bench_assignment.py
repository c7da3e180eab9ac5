"""numpy code that assigns in place, compiled (before it ran as numpy, with a JitopFallbackWarning).

    python benchmarks/bench_assignment.py            # the sizes below
    python benchmarks/bench_assignment.py --quick    # smaller sizes

Each case is written as numpy users write it, with in-place assignment:
- softmax in place: `y -= y.max(...)`, `y /= y.sum(...)` on a copy of x (rows x 1024, float32);
- features: an output made with np.empty and filled a column per statistic (mean, std, max, min of each row);
- decode step: a KV cache (1024 x 64 and 8192 x 128, float32) argument gets row t written (`cache[t] = k`, t a
  Python int), then attention of one query over the whole cache; the cache is changed in the caller's array, as
  numpy changes it. The same attention without the write beside it says what the write costs;
- decode step, k and v computed: one head of a decode layer, its query, key and value projected from x (512 ->
  64, float32), k and v written into their caches (1024 x 64) at t, then attention over them;
- a decode loop slicing its cache in the kernel (`cache[t] = k`, then attention over `cache[:t + 1]`, t a Python
  int): t = 0, 1, 2, ... in order, each value once, as generation runs. The first 256 steps (compiles included)
  and then the mean step over the next 512 (every t new to the function) are reported, with the kernels traced
  (before t became a size symbol, each t was a compile of its own).
jitop runs each compiled (a given row is written into the caller's cache before the kernel, which reads it
there; a computed row after the kernel);
numpy runs the same function; torch (where installed) runs the same steps with in-place tensor ops. Times are
the best single call (common.best_time) in this process, with its own temporary JITOP_CACHE_DIR; the machine
and its measured FP32 peak are printed first. Before this change jitop ran all three as numpy (same time as the
numpy column, plus its dispatch).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def softmax_in_place(x):
    y = x.copy()
    y -= y.max(axis=-1, keepdims=True)
    y = np.exp(y)
    y /= y.sum(axis=-1, keepdims=True)
    return y


def features(x):
    out = np.empty((x.shape[0], 4), dtype=x.dtype)
    out[:, 0] = x.mean(axis=1)
    out[:, 1] = x.std(axis=1)
    out[:, 2] = x.max(axis=1)
    out[:, 3] = x.min(axis=1)
    return out


def decode_step(cache, k, q, t):
    cache[t] = k
    scores = cache @ q / 8.0
    scores -= scores.max()
    w = np.exp(scores)
    return w @ cache / w.sum()


def attention(cache, k, q, t):
    """decode_step without its write: what the write adds is the difference."""
    scores = cache @ q / 8.0
    scores -= scores.max()
    w = np.exp(scores)
    return w @ cache / w.sum()


def decode_sliced(cache, k, q, t):
    cache[t] = k
    kc = cache[:t + 1]
    scores = kc @ q / 8.0
    scores -= scores.max()
    w = np.exp(scores)
    return w @ kc / w.sum()


def decode_layer(kc, vc, x, wq, wk, wv, t):
    q = x @ wq
    kc[t] = x @ wk
    vc[t] = x @ wv
    scores = kc @ q / 8.0
    scores -= scores.max()
    w = np.exp(scores)
    return w @ vc / w.sum()


def torch_versions():
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(2)

    def softmax_t(x):
        y = x.clone()
        y -= y.amax(dim=-1, keepdim=True)
        y = torch.exp(y)
        y /= y.sum(dim=-1, keepdim=True)
        return y

    def features_t(x):
        out = torch.empty((x.shape[0], 4), dtype=x.dtype)
        out[:, 0] = x.mean(dim=1)
        out[:, 1] = x.std(dim=1, unbiased=False)
        out[:, 2] = x.amax(dim=1)
        out[:, 3] = x.amin(dim=1)
        return out

    def attention_t(cache, k, q, t):
        scores = cache @ q / 8.0
        scores -= scores.max()
        w = torch.exp(scores)
        return w @ cache / w.sum()

    def decode_t(cache, k, q, t):
        cache[t] = k
        return attention_t(cache, k, q, t)

    def sliced_t(cache, k, q, t):
        cache[t] = k
        return attention_t(cache[:t + 1], k, q, t)

    def layer_t(kc, vc, x, wq, wk, wv, t):
        q = x @ wq
        kc[t] = x @ wk
        vc[t] = x @ wv
        scores = kc @ q / 8.0
        scores -= scores.max()
        w = torch.exp(scores)
        return w @ vc / w.sum()
    return torch, {"softmax in place": softmax_t, "features": features_t, "decode step,": layer_t,
                   "decode step": decode_t, "attention": attention_t, "decode loop": sliced_t}


def cases(quick: bool, rng: np.random.Generator) -> list[tuple[str, object, list]]:
    rows = 256 if quick else 2048
    x = rng.standard_normal((rows, 1024)).astype(np.float32)
    f = rng.standard_normal((rows * 2, 256)).astype(np.float32)
    decode = []
    for length, width in ((1024, 64),) if quick else ((1024, 64), (8192, 128)):
        cache = rng.standard_normal((length, width)).astype(np.float32)
        k, q = rng.standard_normal(width).astype(np.float32), rng.standard_normal(width).astype(np.float32)
        decode.append((f"decode step (cache {length}x{width}, t={length - 300})", decode_step,
                       [cache, k, q, length - 300]))
        decode.append((f"attention alone, no write (cache {length}x{width})", attention, [cache, k, q, 0]))
    kc, vc = rng.standard_normal((2, 1024, 64)).astype(np.float32)
    token = rng.standard_normal(512).astype(np.float32)
    wq, wk, wv = rng.standard_normal((3, 512, 64)).astype(np.float32)
    decode.append(("decode step, k and v computed (x 512, caches 1024x64, t=724)", decode_layer,
                   [kc, vc, token, wq / 8, wk / 8, wv / 8, 724]))
    return [(f"softmax in place ({rows}x1024)", softmax_in_place, [x]),
            (f"features ({rows * 2}x256)", features, [f])] + decode


def measure(quick: bool) -> list[list[str]]:
    import jitop
    from common import best_time
    rng = np.random.default_rng(25)
    peers = torch_versions()
    rows = []
    for name, fn, args in cases(quick, rng):
        kernel = jitop.kernel(fn, fallback=False)
        mine = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        theirs = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        got, want = kernel(*mine), fn(*theirs)
        # (a computed row is a sum of 512 products in another order than numpy's: equal within rounding)
        same = np.allclose(got, want, rtol=1e-4, atol=1e-5) and all(
            np.allclose(m, t, rtol=1e-5, atol=1e-5) for m, t in zip(mine, theirs) if isinstance(t, np.ndarray))
        t_np = best_time(lambda: fn(*theirs))
        t_jit = best_time(lambda: kernel(*mine))
        t_torch = "-"
        if peers is not None:
            torch, fns = peers
            key = next(k for k in fns if name.startswith(k))
            targs = [torch.from_numpy(a.copy()) if isinstance(a, np.ndarray) else a for a in args]
            t_torch = f"{best_time(lambda: fns[key](*targs)) * 1e6:.1f}"
        rows.append([name, f"{t_np * 1e6:.1f}", t_torch, f"{t_jit * 1e6:.1f}", f"{t_np / t_jit:.2f}",
                     "yes" if same else "NO", str(kernel.traces)])
    return rows


def measure_loop(quick: bool) -> list[list[str]]:
    """The decode loop slicing its cache by t: first steps (compiles included), then the mean later step."""
    import time
    import jitop
    rng = np.random.default_rng(26)
    length, width, first, later = (512, 64, 64, 128) if quick else (1024, 64, 256, 512)
    ks = rng.standard_normal((first + later, width)).astype(np.float32)
    qs = rng.standard_normal((first + later, width)).astype(np.float32)
    peers = torch_versions()
    runs = [("numpy", decode_sliced, np.zeros((length, width), np.float32), lambda a: a)]
    if peers is not None:
        torch, fns = peers
        runs.append(("torch", fns["decode loop"], torch.zeros((length, width)), torch.from_numpy))
    kernel = jitop.kernel(decode_sliced, fallback=False)
    runs.append(("jitop", kernel, np.zeros((length, width), np.float32), lambda a: a))
    rows, outs = [], {}
    for name, fn, cache, conv in runs:
        args = [(conv(ks[t]), conv(qs[t])) for t in range(first + later)]
        t0 = time.perf_counter()
        for t in range(first):
            fn(cache, *args[t], t)
        t1 = time.perf_counter()
        outs[name] = [np.asarray(fn(cache, *args[t], t)) for t in range(first, first + later)]
        t2 = time.perf_counter()
        rows.append([name, f"{(t1 - t0) * 1e3:.1f}", f"{(t2 - t1) / later * 1e6:.1f}"])
    same = all(np.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(outs["numpy"], outs["jitop"]))
    rows[-1] += ["yes" if same else "NO", str(kernel.traces)]
    for r in rows[:-1]:
        r += ["-", "-"]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    from common import bench_process
    with bench_process("assignment"):
        from common import machine, peak_gflops, table
        print(machine())
        peak = peak_gflops()
        print(f"measured FP32 peak: {peak:.0f} GFLOP/s" if peak else "measured FP32 peak: unavailable")
        print()
        print(table(["case", "numpy µs", "torch µs", "jitop µs", "numpy / jitop", "numpy's result and arguments",
                     "traces"], measure(args.quick)))
        print()
        print("decode loop slicing its cache in the kernel (cache[t] = k; attention over cache[:t + 1]; t = 0, 1, ...)")
        print(table(["run", "first steps, ms in all", "later step, µs (mean)", "numpy's results", "traces"],
                    measure_loop(args.quick)))


if __name__ == "__main__":
    main()
