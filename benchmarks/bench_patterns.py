"""Everyday numpy patterns under @jitop.kernel next to numpy: a sweep that shows a pattern jitop runs much
slower than numpy (a missing schedule rule) before a user meets it.

    python benchmarks/bench_patterns.py [--repeat 10] [--only NAME ...]

Each row is one small function (reductions along either axis, argmax, strided and reversed views,
concatenation, padding, gathers, where/clip, transposed matmul operands, NCHW reductions) on float32 arrays of
a few MB (and a 64 MiB one, past the last-level cache, for column reductions), called with the same arrays:
the best of `--repeat` calls after a warm-up call (the first call compiles). `jitop / numpy` is numpy's time
over jitop's (above 1: jitop faster); a row under 0.5 is marked SLOW, and one that @jitop.kernel runs as plain
numpy (an unsupported function: its fallback warning) says so. Every result is checked against numpy first
(float32 tolerances from the arithmetic: a sum of K products within K * eps of its terms' magnitude).
"""
from __future__ import annotations

import argparse
import sys
import warnings

import numpy as np

import jitop

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import best_of, machine, table  # noqa: E402

SLOW = 0.5


def cases(rng: np.random.Generator) -> dict[str, tuple]:
    """name -> (function, arguments)."""
    a, b = (rng.standard_normal((2048, 2048)).astype(np.float32) for _ in range(2))
    big = rng.standard_normal((8192, 2048)).astype(np.float32)  # 64 MiB: past the last-level cache
    v = rng.standard_normal(2048).astype(np.float32)
    x = rng.standard_normal((8, 64, 56, 56)).astype(np.float32)
    rows = rng.integers(0, 2048, 4096)
    return {
        "a.sum(axis=0)": (lambda a: a.sum(axis=0), (a,)),
        "a.sum(axis=1)": (lambda a: a.sum(axis=1), (a,)),
        "a.max(axis=0)": (lambda a: a.max(axis=0), (a,)),
        "big.sum(axis=0), 64 MiB": (lambda a: a.sum(axis=0), (big,)),
        "big.mean(axis=0), 64 MiB": (lambda a: a.mean(axis=0), (big,)),
        "a.argmax(axis=1)": (lambda a: a.argmax(axis=1), (a,)),
        "a.argmax(axis=0)": (lambda a: a.argmax(axis=0), (a,)),
        "a.mean()": (lambda a: a.mean(), (a,)),
        "a + v[:, None]": (lambda a, v: a + v[:, None], (a, v)),
        "a[:, ::2] * 2": (lambda a: a[:, ::2] * 2, (a,)),
        "a[::-1, ::-1] + 1": (lambda a: a[::-1, ::-1] + 1, (a,)),
        "concatenate axis=1": (lambda a, b: np.concatenate([a, b], axis=1), (a, b)),
        "np.pad(a, 3)": (lambda a: np.pad(a, 3), (a,)),
        "a[rows] * 1": (lambda a, r: a[r] * 1, (a, rows)),
        "np.where(a > 0, a, b)": (lambda a, b: np.where(a > 0, a, b), (a, b)),
        "np.clip(a, -1, 1)": (lambda a: np.clip(a, -1, 1), (a,)),
        "softmax(a, axis=0)": (lambda a: np.exp(a - a.max(axis=0)) / np.exp(a - a.max(axis=0)).sum(axis=0), (a,)),
        "x.mean(axis=(2, 3)), NCHW": (lambda x: x.mean(axis=(2, 3)), (x,)),
        "x.sum(axis=1), NCHW": (lambda x: x.sum(axis=1), (x,)),
        "a.T @ b": (lambda a, b: a.T @ b, (a, b)),
        "a @ b.T": (lambda a, b: a @ b.T, (a, b)),
        "np.outer(v, v)": (lambda v: np.outer(v, v), (v,)),
    }


def check(got: np.ndarray, want: np.ndarray, args: tuple) -> None:
    """numpy's dtype and shape; values within K * eps * scale for float results (K: the longest dimension
    summed over, at most the largest argument's size along one axis), exact otherwise."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want)
        return
    k = max(max(np.shape(x)) for x in args if np.ndim(x))
    scale = max(float(np.abs(x).max()) for x in args if np.asarray(x).dtype.kind == "f")
    np.testing.assert_allclose(got, want, rtol=0, atol=k * np.finfo(np.float32).eps * scale * scale)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--only", nargs="*", help="case names to run (default: all)")
    args = p.parse_args()
    print(machine())
    rows = []
    for name, (fn, operands) in cases(np.random.default_rng(0)).items():
        if args.only and name not in args.only:
            continue
        kernel = jitop.kernel(fn)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", jitop.JitopFallbackWarning)
            check(np.asarray(kernel(*operands)), np.asarray(fn(*operands)), operands)
        fell_back = any(issubclass(w.category, jitop.JitopFallbackWarning) for w in caught)
        t_np = best_of(lambda: fn(*operands), args.repeat)
        t_jit = best_of(lambda: kernel(*operands), args.repeat)
        ratio = t_np / t_jit
        note = "runs as numpy (not compiled)" if fell_back else "SLOW" if ratio < SLOW else ""
        rows.append([name, f"{1e3 * t_np:.3f}", f"{1e3 * t_jit:.3f}", f"{ratio:.2f}", note])
    print(table(["pattern", "numpy ms", "jitop ms", "jitop / numpy", ""], rows))


if __name__ == "__main__":
    main()
