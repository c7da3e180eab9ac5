"""The @jitop.kernel targets of issue 3: plain numpy functions under @jitop.kernel, next to numpy (and
numexpr, numba, torch.compile when installed), in one run.

1. elementwise chain tanh(a*b + c)*0.5 + exp(-a*a) on 2**24 float32;
2. softmax over the last axis of (4096, 1024) float32;
3. layer norm over the last axis of (4096, 1024) float32, with gamma and beta;
4. per-call overhead of a + b on 10 float64 and on 10 float32 (µs per call);
5. first call (trace + compile) of a fresh 10-op elementwise function (ms, median of 3 new decorations).

Times in 1-3 are the best of several calls, the first call excluded (its time is in the notes). Every result
is compared with numpy; a jitop result off by more than the case's tolerance is reported as wrong instead of
timed. The kernels are declared with fallback=False, so a function that would silently run as plain numpy
shows as unavailable rather than as a numpy figure under jitop's name. A first call of torch.compile can be
served by inductor's on-disk cache from an earlier run.

    python benchmarks/bench_kernel.py [--n 16777216] [--rows 4096] [--cols 1024]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import timeit
from typing import Any, Callable

import numpy as np

import jitop

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import best_of, machine, table, versions  # noqa: E402

HEADERS = ["implementation", "ms", "max abs diff vs numpy", "notes"]


# ** the numpy functions, as a user has them **

def chain(a, b, c):
    return np.tanh(a * b + c) * 0.5 + np.exp(-a * a)


def softmax(x):
    m = x.max(-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(-1, keepdims=True)


def layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


def add(a, b):
    return a + b


def ten_ops(a, b, c):
    # sin, *, exp, +, +2, /, -, abs, sqrt, + : 10 ufunc calls
    return np.sin(a) * b + np.exp(c) - a / (b + 2) + np.sqrt(np.abs(c))


# ** measuring **

def reason(e: BaseException) -> str:
    if isinstance(e, ImportError):
        return f"{e.name or 'module'} not installed"
    first = (str(e).strip().splitlines() or [""])[0]
    first = first if len(first) <= 90 else first[:87] + "..."
    return f"{type(e).__name__}: {first}".rstrip(": ").replace("|", "/")


def max_abs_diff(got: Any, ref: np.ndarray) -> float:
    got = np.asarray(got)
    if got.shape != ref.shape:
        return float("inf")
    return float(np.abs(got.astype(np.float64) - ref.astype(np.float64)).max())


def row(label: str, make: Callable[[], Callable[[], Any]], ref: np.ndarray, tol: float | None = None,
        compiles: bool = True) -> list:
    """Build the call (`make`), time its first call, check its result against `ref`, then time it."""
    try:
        call = make()
        t0 = time.perf_counter()
        got = call()
        first_ms = (time.perf_counter() - t0) * 1e3
        diff = max_abs_diff(got, ref)
        del got  # a big jitop output is recycled by the next call only once nobody holds it
        if tol is not None and not diff <= tol:
            return [label, f"WRONG RESULT (tolerance {tol:.0e}), not timed", f"{diff:.1e}", ""]
        return [label, best_of(call) * 1e3, f"{diff:.1e}", f"first call {first_ms:.0f} ms" if compiles else ""]
    except Exception as e:  # a peer that is missing or cannot compile here
        return [label, f"unavailable ({reason(e)})", "", ""]


def jitop_kernel(fn: Callable) -> Callable:
    return jitop.kernel(fn, fallback=False)


def torch_call(fn: Callable, *arrays: np.ndarray) -> Callable[[], Any]:
    import torch
    compiled = torch.compile(fn)
    tensors = [torch.from_numpy(x) for x in arrays]
    return lambda: compiled(*tensors)


# ** the cases **

def case_chain(n: int) -> str:
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    ref = chain(a, b, c)

    def numexpr_call():
        import numexpr
        return lambda: numexpr.evaluate("tanh(a*b+c)*0.5 + exp(-a*a)", local_dict={"a": a, "b": b, "c": c})

    def numba_call():
        from bench_chain import numba_chain
        nb = numba_chain()
        return lambda: nb(a, b, c)

    def torch_chain(a, b, c):
        import torch
        return torch.tanh(a * b + c) * 0.5 + torch.exp(-a * a)

    f = jitop_kernel(chain)
    rows = [row("jitop.kernel", lambda: (lambda: f(a, b, c)), ref, tol=1e-5),
            row("numpy", lambda: (lambda: chain(a, b, c)), ref, compiles=False),
            row("numexpr", numexpr_call, ref),
            row("numba (parallel, prange)", numba_call, ref),
            row("torch.compile", lambda: torch_call(torch_chain, a, b, c), ref)]
    return f"### 1. tanh(a*b + c)*0.5 + exp(-a*a), {n} float32\n\n" + table(HEADERS, rows)


def case_softmax(shape: tuple[int, int]) -> str:
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    ref = softmax(x)

    def numba_call():
        import numba

        @numba.njit(parallel=True, fastmath=False)
        def nb(x):
            out = np.empty_like(x)
            n = x.shape[1]
            for i in numba.prange(x.shape[0]):
                m = x[i, 0]
                for j in range(1, n):
                    m = max(m, x[i, j])
                s = np.float32(0.0)
                for j in range(n):
                    e = np.exp(x[i, j] - m)
                    out[i, j] = e
                    s += e
                for j in range(n):
                    out[i, j] /= s
            return out
        return lambda: nb(x)

    def torch_softmax(x):
        import torch
        return torch.softmax(x, dim=-1)

    f = jitop_kernel(softmax)
    rows = [row("jitop.kernel", lambda: (lambda: f(x)), ref, tol=1e-6),
            row("numpy", lambda: (lambda: softmax(x)), ref, compiles=False),
            row("numba (parallel over rows)", numba_call, ref),
            row("torch.compile(torch.softmax)", lambda: torch_call(torch_softmax, x), ref)]
    return f"### 2. softmax over the last axis, {shape} float32\n\n" + table(HEADERS, rows)


def case_layer_norm(shape: tuple[int, int]) -> str:
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(np.float32)
    g, b = (rng.standard_normal(shape[-1]).astype(np.float32) for _ in range(2))
    ref = layer_norm(x, g, b)

    def numba_call():
        import numba

        @numba.njit(parallel=True, fastmath=False)
        def nb(x, g, b):
            out = np.empty_like(x)
            n = x.shape[1]
            for i in numba.prange(x.shape[0]):
                s = np.float32(0.0)
                for j in range(n):
                    s += x[i, j]
                mu = s / np.float32(n)
                v = np.float32(0.0)
                for j in range(n):
                    d = x[i, j] - mu
                    v += d * d
                inv = np.float32(1.0) / np.sqrt(v / np.float32(n) + np.float32(1e-5))
                for j in range(n):
                    out[i, j] = (x[i, j] - mu) * inv * g[j] + b[j]
            return out
        return lambda: nb(x, g, b)

    def torch_layer_norm(x, g, b):
        import torch
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + 1e-5) * g + b

    f = jitop_kernel(layer_norm)
    rows = [row("jitop.kernel", lambda: (lambda: f(x, g, b)), ref, tol=1e-4),
            row("numpy", lambda: (lambda: layer_norm(x, g, b)), ref, compiles=False),
            row("numba (parallel over rows)", numba_call, ref),
            row("torch.compile (same formula)", lambda: torch_call(torch_layer_norm, x, g, b), ref)]
    return (f"### 3. layer norm over the last axis, {shape} float32, gamma/beta ({shape[-1]},)\n\n"
            + table(HEADERS, rows))


def per_call_us(call: Callable[[], Any], number: int = 20_000, repeat: int = 7) -> float:
    call()
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6


def case_overhead() -> str:
    rng = np.random.default_rng(3)
    rows = []

    def one(label: str, make: Callable[[], Callable[[], Any]], ref: np.ndarray, note: str, check: bool = False) -> None:
        try:
            call = make()
            diff = max_abs_diff(call(), ref)
            if check and diff != 0.0:
                rows.append([label, f"WRONG RESULT (max abs diff {diff:.1e}), not timed", note])
                return
            rows.append([label, per_call_us(call), note])
        except Exception as e:
            rows.append([label, f"unavailable ({reason(e)})", note])

    for dtype in (np.float64, np.float32):
        a, b = rng.standard_normal(10).astype(dtype), rng.standard_normal(10).astype(dtype)
        ref, name = a + b, np.dtype(dtype).name

        def numba_call(a=a, b=b):
            import numba
            nb = numba.njit(add)
            return lambda: nb(a, b)

        f = jitop_kernel(add)
        one(f"jitop.kernel ({name})", lambda: (lambda: f(a, b)), ref,
            "native entry: checks dtype/shape/layout, allocates the output, calls the kernel", True)
        one(f"numpy a + b ({name})", lambda: (lambda: a + b), ref, "")
        one(f"numba njit ({name})", numba_call, ref, "")
    rows = [[r[0], f"{r[1]:.2f}" if isinstance(r[1], float) else r[1], r[2]] for r in rows]
    return "### 4. per-call overhead, a + b on 10 elements\n\n" + table(["implementation", "µs per call", "notes"], rows)


def first_call_ms(decorate: Callable[[Callable], Callable], shapes: list[tuple[int, ...]]) -> tuple[float, float]:
    """(median ms of the first call of a newly decorated ten_ops, one decoration per shape; max abs diff vs numpy)."""
    times, worst = [], 0.0
    for k, shape in enumerate(shapes):
        rng = np.random.default_rng(10 + k)
        a, b, c = (rng.standard_normal(shape) for _ in range(3))
        b = np.abs(b)  # keep b + 2 away from zero
        fn = decorate(ten_ops)
        t0 = time.perf_counter()
        got = fn(a, b, c)
        times.append((time.perf_counter() - t0) * 1e3)
        worst = max(worst, max_abs_diff(got, ten_ops(a, b, c)))
    return statistics.median(times), worst


def case_first_call() -> str:
    # shapes used nowhere else in this process; a throw-away cache directory, so no persistent cache can help
    shapes = [(1013, 7), (3001,), (17, 11, 29)]
    rows = []
    old = os.environ.get("JITOP_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="jitop-bench-") as d:
        os.environ["JITOP_CACHE_DIR"] = d
        try:
            ms, diff = first_call_ms(jitop_kernel, shapes)
            if diff > 1e-12:
                rows.append(["jitop.kernel", f"WRONG RESULT (max abs diff {diff:.1e})", f"{diff:.1e}", ""])
            else:
                rows.append(["jitop.kernel", ms, f"{diff:.1e}", "trace + fuse + lower + LLVM + load, float64"])
        except Exception as e:
            rows.append(["jitop.kernel", f"unavailable ({reason(e)})", "", ""])
        finally:
            if old is None:
                os.environ.pop("JITOP_CACHE_DIR", None)
            else:
                os.environ["JITOP_CACHE_DIR"] = old
    try:
        import numba
        ms, diff = first_call_ms(numba.njit, shapes)
        rows.append(["numba njit", ms, f"{diff:.1e}", "type inference + LLVM, no cache=True"])
    except Exception as e:
        rows.append(["numba njit", f"unavailable ({reason(e)})", "", ""])
    return ("### 5. first call (trace + compile) of a fresh 10-op elementwise function, median of 3 new "
            f"decorations on shapes {', '.join(map(str, shapes))}\n\n" + table(HEADERS, rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2 ** 24, help="elements of the chain's inputs")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=1024)
    args = p.parse_args()
    shape = (args.rows, args.cols)
    start = time.perf_counter()
    print(f"@jitop.kernel (issue 3) — {machine()}; {versions('numexpr', 'numba', 'torch', 'llvmlite')}; "
          f"1-min load average at start {os.getloadavg()[0]:.2f}\n")
    for section in (case_chain(args.n), case_softmax(shape), case_layer_norm(shape), case_overhead(),
                    case_first_call()):
        print(section + "\n", flush=True)
    print(f"Total {time.perf_counter() - start:.0f} s; 1-min load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
