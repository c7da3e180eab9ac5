"""numpy functions that used to run as plain numpy under @jitop.kernel and now compile (running sums and products,
the NaN-ignoring reductions, select / roll / tile / repeat / linalg.norm, boolean-mask assignment, integer-array
indexing with several arrays, assignment through index arrays, a reduced boolean-mask read): each as a user
writes it, jitop next to numpy and torch (where installed and it has the function) in one run, float32, 2 threads.

    python benchmarks/bench_numpy_functions.py [--quick]

Each row: the median and best of single calls (interleaved rounds: a machine whose speed drifts biases no one),
the first (compiling) call excluded; jitop's result checked against numpy's before timing (exactly for the
running sums, which add in numpy's order; within float32 bounds for the rest) and reported WRONG instead of
timed when off. The machine line gives the CPU, jitop's Target and the FP32 peak measured at the start.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

os.environ.setdefault("JITOP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jitop  # noqa: E402
from common import bench_process, busy_cores, interleaved_times, machine, table  # noqa: E402

try:
    import torch
    torch.set_num_threads(2)
except ImportError:  # torch is optional: its column says so
    torch = None


def _clamp_negative(x):
    x = x.copy()
    x[x < 0] = 0
    return x


def _scatter_rows(x, idx, v):
    x = x.copy()
    x[idx] = v
    return x


def _onehot(labels, cols):
    out = np.zeros((labels.shape[0], cols), np.float32)
    out[np.arange(labels.shape[0]), labels] = 1
    return out


def _embedding_grad(ids, g):
    grad = np.zeros((1000, g.shape[1]), np.float32)
    np.add.at(grad, ids, g)
    return grad


def _torch_indexing(t):
    """The indexing rows' torch functions (t: the identity, or None without torch)."""
    def scatter_rows(x, idx, v):
        x = x.clone()
        x[idx] = v
        return x

    def onehot(labels, cols):
        out = torch.zeros((labels.shape[0], cols))
        out[torch.arange(labels.shape[0]), labels] = 1
        return out
    def embedding_grad(ids, g):
        return torch.zeros((1000, g.shape[1])).index_add_(0, ids, g)
    return (t(lambda x, labels: x[torch.arange(x.shape[0]), labels]), t(scatter_rows), t(onehot), t(embedding_grad))


def cases(rows: int, cols: int) -> list[tuple[str, object, object, tuple]]:
    """(name, numpy function, torch function or None, arguments) per row."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    with_nan = x.copy()
    with_nan[:, ::7] = np.nan
    labels, idx = rng.integers(0, cols, rows), rng.integers(-rows, rows, rows // 4)
    v = rng.standard_normal((rows // 4, cols)).astype(np.float32)
    t = (lambda f: f) if torch is not None else (lambda f: None)
    torch_pick, torch_scatter, torch_onehot, torch_embedding_grad = _torch_indexing(t)
    indexing = [
        ("x[arange(rows), labels]", lambda x, labels: x[np.arange(x.shape[0]), labels], torch_pick, (x, labels)),
        ("x[idx] = v (rows, a copy)", _scatter_rows, torch_scatter, (x, idx, v)),
        ("onehot[arange, labels] = 1", _onehot, torch_onehot, (labels, cols)),
        ("np.add.at(grad(1000, cols), ids, x)", _embedding_grad, torch_embedding_grad,
         (rng.integers(0, 1000, rows), x)),
        ("x[x > 0].mean()", lambda x: x[x > 0].mean(), t(lambda x: x[x > 0].mean()), (x,)),
    ]
    return [(name, fn, tf, (a,)) for name, fn, tf, a in [
        ("cumsum(x, axis=-1)", lambda x: np.cumsum(x, axis=-1), t(lambda x: torch.cumsum(x, -1)), x),
        ("cumsum(x, axis=0)", lambda x: np.cumsum(x, axis=0), t(lambda x: torch.cumsum(x, 0)), x),
        ("cumprod(x, axis=-1)", lambda x: np.cumprod(x, axis=-1), t(lambda x: torch.cumprod(x, -1)), x),
        ("nansum(x, axis=-1)", lambda x: np.nansum(x, axis=-1), t(lambda x: torch.nansum(x, -1)), with_nan),
        ("nanmean(x, axis=-1)", lambda x: np.nanmean(x, axis=-1), t(lambda x: torch.nanmean(x, -1)), with_nan),
        ("nanmax(x, axis=-1)", lambda x: np.nanmax(x, axis=-1), None, with_nan),
        ("nanstd(x, axis=-1)", lambda x: np.nanstd(x, axis=-1), None, with_nan),
        ("select([x>1, x<-1], [x, -x])", lambda x: np.select([x > 1, x < -1], [x, -x]), None, x),
        ("roll(x, 3, axis=-1)", lambda x: np.roll(x, 3, axis=-1), t(lambda x: torch.roll(x, 3, -1)), x),
        ("tile(x, (1, 2))", lambda x: np.tile(x, (1, 2)), t(lambda x: torch.tile(x, (1, 2))), x),
        ("repeat(x, 2, axis=0)", lambda x: np.repeat(x, 2, axis=0),
         t(lambda x: torch.repeat_interleave(x, 2, 0)), x),
        ("linalg.norm(x, axis=-1)", lambda x: np.linalg.norm(x, axis=-1),
         t(lambda x: torch.linalg.vector_norm(x, dim=-1)), x),
        ("x[x < 0] = 0 (a copy)", _clamp_negative, None, x),
    ]] + indexing


def _checked(name: str, got, want) -> bool:
    if name.startswith("cum"):
        return np.array_equal(got, want, equal_nan=True)
    return got.shape == want.shape and np.allclose(got, want, rtol=1e-5, atol=1e-4, equal_nan=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a small array (a smoke test of the script)")
    args = p.parse_args()
    rows, cols = (64, 100) if args.quick else (2048, 1024)
    print(machine())
    print(f"other processes kept {busy_cores() or 0:.2f} cores busy at the start; float32 ({rows}, {cols})\n")
    out = []
    for name, fn, torch_fn, x in cases(rows, cols):
        kernel = jitop.kernel(fn, fallback=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = fn(*x)
        calls = {"numpy": lambda fn=fn, x=x: fn(*x)}
        verdict = "ok" if _checked(name, kernel(*x), want) else "WRONG"
        if verdict == "ok":
            calls["jitop"] = lambda kernel=kernel, x=x: kernel(*x)
        if torch_fn is not None:
            tx = [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in x]
            calls["torch"] = lambda torch_fn=torch_fn, tx=tx: torch_fn(*tx)
        times = interleaved_times(calls, repeat=25 if not args.quick else 5)
        ms = {k: f"{v[0] * 1e3:.3f} / {v[1] * 1e3:.3f}" for k, v in times.items()}
        speed = f"{times['numpy'][0] / times['jitop'][0]:.1f}x" if "jitop" in times else verdict
        out.append([name, ms["numpy"], ms.get("jitop", verdict), ms.get("torch", "-"), speed])
    print(table(["function (median / best ms)", "numpy", "jitop", "torch", "jitop vs numpy (medians)"], out))


if __name__ == "__main__":
    with bench_process("numpy-functions"):
        main()
