"""Dispatch overhead of pytree arguments (@jitop.kernel with `*params`, a list or a dict of 108 arrays).

Each kernel takes x and 108 small float64 arrays (16 elements; 54 weight/bias pairs for the chain), in the
four spellings `f(x, *params)`, `f(x, params_list)`, `f(x, params_dict)` and, for scale, a 2-argument flat
call that the native entry serves. Rows:

- touch one: returns `x + params[0]`, so the time is almost all dispatch (binding, flattening 108 leaves,
  the key, checking and passing 109 arrays); numpy does the one add.
- sum all: `x + params[0] + ... + params[107]`, one fused kernel; numpy does 108 adds.
- chain: 54 x (x @ w + b, relu) on a 2x16 x (16x16 weights): the done-when model shape, numpy alongside.

    python benchmarks/bench_pytree_args.py
"""
from __future__ import annotations

import os
import platform
import sys

import numpy as np

import jitop

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import best_time, cpu_name, table  # noqa: E402

N_PARAMS = 108


def touch_one(x, params):
    return x + params[0]


def sum_all(x, params):
    for p in params:
        x = x + p
    return x


def chain(x, params):
    for w, b in zip(params[0::2], params[1::2]):
        x = np.maximum(x @ w + b, 0.0)
    return x


def spellings(body):
    """The same body as f(x, *params), f(x, params_list) and f(x, params_dict) kernels."""
    def star(x, *params):
        return body(x, params)

    def listed(x, params):
        return body(x, params)

    def keyed(x, params):
        return body(x, [params[f"p{k}"] for k in range(len(params))])
    return {"f(x, *params)": (jitop.kernel(star, fallback=False), lambda f, x, ps, d: f(x, *ps)),
            "f(x, params_list)": (jitop.kernel(listed, fallback=False), lambda f, x, ps, d: f(x, ps)),
            "f(x, params_dict)": (jitop.kernel(keyed, fallback=False), lambda f, x, ps, d: f(x, d))}


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 16))
    vec = [rng.standard_normal(16) for _ in range(N_PARAMS)]
    layers = [rng.standard_normal((16, 16)) * 0.25 if k % 2 == 0 else rng.standard_normal(16) * 0.1
              for k in range(N_PARAMS)]
    rows = []
    for name, body, params in (("touch one", touch_one, vec), ("sum all", sum_all, vec),
                               ("chain", chain, layers)):
        d = {f"p{k}": p for k, p in enumerate(params)}
        want = body(x, params)
        t_np = best_time(lambda: body(x, params))
        for spelling, (f, call) in spellings(body).items():
            np.testing.assert_allclose(call(f, x, params, d), want, rtol=1e-12, atol=1e-12)
            t = best_time(lambda: call(f, x, params, d))
            assert f.misses == 1
            rows.append([name, spelling, f"{t * 1e6:.1f}", f"{t_np * 1e6:.1f}", f"{t_np / t:.2f}"])
    flat = jitop.kernel(lambda a, b: a + b)
    t = best_time(lambda: flat(x, x))
    rows.append(["touch one", "f(x, p) (2 arrays, native entry)", f"{t * 1e6:.2f}",
                 f"{best_time(lambda: x + x) * 1e6:.2f}", ""])
    print(f"{cpu_name()}, {os.cpu_count()} cores; Python {platform.python_version()}, numpy {np.__version__}")
    print(table(["kernel", "call", "jitop µs/call", "numpy µs/call", "numpy/jitop"], rows))


if __name__ == "__main__":
    main()
