"""One symbolic kernel against kernels specialised on each size (issue 23, part 2's target: within 10 %).

    python benchmarks/bench_symbolic.py            # n in 1, 7, 64, 100, 128, 1000, 2048
    python benchmarks/bench_symbolic.py --quick    # n in 7, 100

For each operation, the row count n varies (C = 768 columns; matmul: (n, 768) @ (768, 768)):
- specialised: `@jitop.kernel(dynamic=False)`, compiled for exactly this n;
- symbolic: `@jitop.kernel(dynamic={"x": (0,)})`, compiled before the timings at n = 300 and n = 10 and called
  at every n (a matmul with a symbolic row count holds a kernel per size bucket, rows <= 16 and above, each
  with the config decided at its bucket's size: n = 10 compiles the small bucket's; the other operations have
  one kernel for every size). n = 1 is never symbolic (sizes 0 and 1 broadcast, so they get a kernel of their
  own): that row says so; the last column says whether a timed call traced anything;
- numpy beside them.
Each time is the best single call (common.best_time) in this process, with its own temporary JITOP_CACHE_DIR.
A last table times the call overhead: a 10-element a + b through the native entry, specialised vs symbolic.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

C = 768
SIZES = (1, 7, 64, 100, 128, 1000, 2048)
COMPILED_AT = (300, 10)  # one size per row bucket (jitop.graph.tasks.ROW_BUCKETS)


def matmul(x, w):
    return x @ w


def softmax(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def layer_norm(x, g, b):
    mean = np.mean(x, axis=-1, keepdims=True)
    var = np.var(x, axis=-1, keepdims=True)
    return g * (x - mean) / np.sqrt(var + 1e-5) + b


def chain(x, y):
    return np.tanh(x * y) + np.exp(-x) * 0.5 - y


def operands(name: str, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    x = rng.standard_normal((n, C)).astype(np.float32)
    rest = {"matmul": [(C, C)], "softmax": [], "layer_norm": [(C,), (C,)], "chain": [(n, C)]}[name]
    return [x] + [rng.standard_normal(s).astype(np.float32) for s in rest]


def agree(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-3, atol=1e-3)


def measure(sizes: tuple[int, ...]) -> list[list[str]]:
    import jitop
    from common import best_time
    rng = np.random.default_rng(23)
    rows = []
    for fn in (matmul, softmax, layer_norm, chain):
        symbolic = jitop.kernel(fn, dynamic={"x": (0,), **({"y": (0,)} if fn is chain else {})})
        for n in COMPILED_AT:
            symbolic(*operands(fn.__name__, n, rng))
        for n in sizes:
            args = operands(fn.__name__, n, rng)
            specialised = jitop.kernel(fn, dynamic=False)
            t_spec = best_time(lambda: specialised(*args))
            t_np = best_time(lambda: fn(*args))
            if n < 2:
                rows.append([fn.__name__, str(n), f"{t_np * 1e6:.1f}", f"{t_spec * 1e6:.1f}", "specialised (n < 2)",
                             "-", "-"])
                continue
            before = symbolic.traces
            t_sym = best_time(lambda: symbolic(*args))
            traced = symbolic.traces - before
            same = agree(symbolic(*args), fn(*args)) and agree(specialised(*args), fn(*args))
            rows.append([fn.__name__, str(n), f"{t_np * 1e6:.1f}", f"{t_spec * 1e6:.1f}", f"{t_sym * 1e6:.1f}",
                         f"{t_sym / t_spec:.2f}", "yes" if same and not traced else f"NO ({traced} traces)"])
    return rows


def overhead() -> list[list[str]]:
    import jitop
    from common import best_time
    a = np.ones(10, np.float32)
    specialised = jitop.kernel(lambda a, b: a + b, dynamic=False)
    symbolic = jitop.kernel(lambda a, b: a + b, dynamic=True)
    rows = []
    for name, f in (("specialised", specialised), ("symbolic", symbolic)):
        for _ in range(40):  # promoted to the native entry
            f(a, a)
        rows.append([name, f"{best_time(lambda: f(a, a), min_total=1.0) * 1e6:.3f}",
                     "yes" if f.dispatcher.native() else "no"])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    from common import bench_process
    with bench_process("symbolic"):
        from common import machine, table
        print(machine())
        print()
        print(table(["op", "n", "numpy µs", "specialised µs", "symbolic µs", "symbolic / specialised",
                     "same result, no trace"], measure((7, 100) if args.quick else SIZES)))
        print()
        print(table(["10-element a + b", "µs per call", "native entry"], overhead()))


if __name__ == "__main__":
    main()
