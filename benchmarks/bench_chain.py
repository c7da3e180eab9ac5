"""The elementwise chain tanh(a*b + c)*0.5 + exp(-a*a) on 2**24 float32, as one te.compute, next to numpy
(and numexpr, numba, torch.compile when installed).

    python benchmarks/bench_chain.py [--n 16777216]

The kernel is built for jitop.Target.current() (the host, or JITOP_CPU=haswell for AVX2 code), one vector
register of lanes per inner loop.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import jitop
from jitop import te

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import best_of, machine, table  # noqa: E402


def chain_schedule(n: int, lanes: int | None = None, parallel: bool = True):
    """The chain, split by `lanes` (default: one vector register of float32 on Target.current()) and vectorized."""
    lanes = lanes or jitop.Target.current().lanes(4)
    a, b, c = (te.placeholder((n,), "float32", name) for name in "abc")
    d = te.compute((n,), lambda i: te.tanh(a[i] * b[i] + c[i]) * 0.5 + te.exp(-a[i] * a[i]), name="d")
    s = jitop.create_schedule(d.op)
    outer, inner = s[d].split(d.op.axis[0], factor=lanes)
    s[d].vectorize(inner)
    if parallel:
        s[d].parallel(outer)
    return s, [a, b, c, d]


def numpy_chain(a, b, c):
    return np.tanh(a * b + c) * np.float32(0.5) + np.exp(-a * a)


def accuracy(got: np.ndarray, a, b, c) -> tuple[float, float]:
    """(max ulp vs numpy over the terms' scale, max abs error vs a float64 reference)."""
    a64, b64, c64 = (x.astype(np.float64) for x in (a, b, c))
    exact = np.tanh(a64 * b64 + c64) * 0.5 + np.exp(-a64 * a64)
    ref = numpy_chain(a, b, c)
    # the two terms can cancel; measure ulps at the scale of the larger term, as a float32 evaluation sees it
    scale = np.maximum(np.abs(np.tanh(a * b + c) * np.float32(0.5)), np.exp(-a * a)).astype(np.float32)
    ulp = np.abs(got.astype(np.float64) - ref) / np.spacing(scale)
    return float(ulp.max()), float(np.abs(got - exact).max())


def numba_chain():
    """The chain as a numba parallel loop (raises ImportError without numba)."""
    import numba

    @numba.njit(parallel=True, fastmath=False)
    def nb(a, b, c):
        out = np.empty_like(a)
        for i in numba.prange(a.shape[0]):
            out[i] = np.tanh(a[i] * b[i] + c[i]) * np.float32(0.5) + np.exp(-a[i] * a[i])
        return out
    return nb


def peers(a, b, c) -> list[list[object]]:
    rows = [["numpy", best_of(lambda: numpy_chain(a, b, c)) * 1e3, ""]]
    try:
        import numexpr
        rows.append(["numexpr", best_of(lambda: numexpr.evaluate("tanh(a*b+c)*0.5 + exp(-a*a)",
                                                                         local_dict={"a": a, "b": b, "c": c})) * 1e3, ""])
    except ImportError:
        rows.append(["numexpr", "not installed", ""])
    try:
        nb = numba_chain()
        rows.append(["numba (parallel)", best_of(lambda: nb(a, b, c)) * 1e3, ""])
    except ImportError:
        rows.append(["numba", "not installed", ""])
    try:
        import torch
        ta, tb, tc = (torch.from_numpy(x) for x in (a, b, c))
        tf = torch.compile(lambda a, b, c: torch.tanh(a * b + c) * 0.5 + torch.exp(-a * a))
        rows.append(["torch.compile", best_of(lambda: tf(ta, tb, tc)) * 1e3, ""])
    except Exception as e:  # torch missing, or no compiler for inductor
        rows.append(["torch.compile", f"unavailable ({type(e).__name__})", ""])
    return rows


def run(n: int) -> str:
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    rows = []
    for label, par in (("jitop (1 thread)", False), ("jitop (parallel)", True)):
        t0 = time.perf_counter()
        f = jitop.build(*chain_schedule(n, parallel=par))
        compile_ms = (time.perf_counter() - t0) * 1e3
        d = np.empty(n, np.float32)
        ms = best_of(lambda: f(a, b, c, d)) * 1e3
        ulp, abs_err = accuracy(d, a, b, c)
        rows.append([label, ms, f"compile {compile_ms:.0f} ms; {ulp:.1f} ulp vs numpy; abs err {abs_err:.1e}"])
    rows += peers(a, b, c)
    return table(["implementation", "ms", "notes"], rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2 ** 24)
    args = p.parse_args()
    print(f"Elementwise chain on {args.n} float32 — {machine()}\n")
    print(run(args.n))


if __name__ == "__main__":
    main()
