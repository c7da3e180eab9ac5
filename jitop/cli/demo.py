"""`jitop demo`: build a fused elementwise kernel and show its speed next to numpy."""
from __future__ import annotations

import time

import numpy as np


def demo(n: int) -> None:
    """Build tanh(a*b + c)*0.5 + exp(-a*a) as one vectorized, parallel kernel for the current Target
    (the host, or JITOP_CPU) and time it against numpy."""
    import jitop
    from jitop import te
    from jitop.driver import default_target

    target = default_target()
    print(f"target: {target.describe()}\n")

    a, b, c = (te.placeholder((n,), "float32", name) for name in "abc")
    d = te.compute((n,), lambda i: te.tanh(a[i] * b[i] + c[i]) * 0.5 + te.exp(-a[i] * a[i]), name="d")
    s = jitop.create_schedule(d.op)
    outer, inner = s[d].split(d.op.axis[0], factor=target.lanes(4))  # one vector register of float32
    s[d].vectorize(inner)
    s[d].parallel(outer)
    print(jitop.lower(s, [a, b, c, d]))
    t0 = time.perf_counter()
    f = jitop.build(s, [a, b, c, d], target=target)
    print(f"\nbuilt in {(time.perf_counter() - t0) * 1e3:.0f} ms")
    rng = np.random.default_rng(0)
    xa, xb, xc = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    out = np.empty(n, np.float32)
    ref = np.tanh(xa * xb + xc) * np.float32(0.5) + np.exp(-xa * xa)
    t_jit = _best(lambda: f(xa, xb, xc, out))
    t_np = _best(lambda: np.tanh(xa * xb + xc) * np.float32(0.5) + np.exp(-xa * xa))
    print(f"jitop {t_jit * 1e3:7.2f} ms   numpy {t_np * 1e3:7.2f} ms   speed-up {t_np / t_jit:.1f}x   "
          f"max abs difference {np.abs(out - ref).max():.1e}")


def _best(fn, repeat: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
