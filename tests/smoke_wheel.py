"""Smoke test of an installed jitop (a wheel in a fresh venv), run by .ci/run from outside the source tree:

    cd /tmp && /path/to/venv/bin/python /path/to/tests/smoke_wheel.py [SOURCE_TREE]

It checks that jitop was imported from the environment's site-packages (not from SOURCE_TREE), that its
subpackages are all there, and that a @jitop.kernel function, jitop.matmul and jitop.conv2d give numpy's
results. Exits non-zero on any failure. pytest does not collect it (the name does not start with test_).
"""
from __future__ import annotations

import os
import pathlib
import sys
import sysconfig
import tempfile


def _fail(msg: str) -> None:
    print(f"smoke_wheel: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


_passed = 0


def _check_close(name: str, got, want, rtol: float = 1e-4, atol: float = 1e-4) -> None:
    global _passed
    import numpy as np
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        _fail(f"{name}: got {got.shape} {got.dtype}, numpy gives {want.shape} {want.dtype}")
    if not np.allclose(got, want, rtol=rtol, atol=atol):
        _fail(f"{name}: max abs difference from numpy {float(np.max(np.abs(got - want)))}")
    _passed += 1
    print(f"smoke_wheel: {name} ok")


def _naive_conv2d(x, w, stride: int, padding: int):
    """NCHW cross-correlation, groups=1, in plain numpy loops over the kernel window."""
    import numpy as np
    n, c, h, wd = x.shape
    oc, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh, ow = (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1
    out = np.zeros((n, oc, oh, ow), np.float64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]      # (n, c, oh, ow)
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j], dtype=np.float64)
    return out.astype(x.dtype)


WARM_CHILD = """import numpy as np, jitop
from jitop.codegen.target import compile_count
a = np.arange(12, dtype=np.float32).reshape(3, 4)
f = jitop.kernel(lambda a: np.tanh(a) * 2 + 1)
r = f(a)
assert np.allclose(r, np.tanh(a) * 2 + 1), r
print(",".join(e.lookup.status for e in f.cache.values()), compile_count())
"""


def _check_cli_and_warm_process(cache_dir: str) -> None:
    """The installed `jitop` script answers, and a second process loads a kernel the first one saved."""
    global _passed
    import subprocess
    script = pathlib.Path(sys.executable).parent / "jitop"
    info = subprocess.run([str(script), "cache", "info"], capture_output=True, text=True, timeout=120)
    if info.returncode != 0 or cache_dir not in info.stdout:
        _fail(f"`jitop cache info` exited {info.returncode}: {info.stdout[-500:]} {info.stderr[-500:]}")
    _passed += 1
    print("smoke_wheel: jitop cache info ok")
    runs = [subprocess.run([sys.executable, "-c", WARM_CHILD], capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    outs = [r.stdout.strip().split() for r in runs]
    if any(r.returncode for r in runs) or [o[0] for o in outs] != ["miss", "hit"] or outs[1][1] != "0":
        _fail(f"cold/warm processes: {outs} {[r.stderr[-500:] for r in runs]}")
    _passed += 1
    print("smoke_wheel: second process loads the kernel from the cache, no LLVM ok")


def main(argv: list[str]) -> None:
    source_tree = pathlib.Path(argv[1]).resolve() if len(argv) > 1 else pathlib.Path(__file__).resolve().parents[1]
    # the persistent cache (thread-pool object code) goes to a throwaway directory, not the user's
    cache_dir = tempfile.mkdtemp(prefix="jitop-smoke-cache-")
    os.environ["JITOP_CACHE_DIR"] = cache_dir

    import numpy as np
    import jitop
    import jitop.cache.store, jitop.graph, jitop.ops, jitop.topi, jitop.tuner.space  # noqa: E401,F401

    where = pathlib.Path(jitop.__file__).resolve()
    site = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
    if source_tree in where.parents:
        _fail(f"jitop was imported from the source tree ({where}), not from the installed wheel")
    if site not in where.parents:
        _fail(f"jitop was imported from {where}, not from this environment's site-packages ({site})")
    for name in ("jitop.topi", "jitop.tuner", "jitop.cache", "jitop.graph", "jitop.ops"):
        mod = sys.modules[name]
        if site not in pathlib.Path(mod.__file__).resolve().parents:
            _fail(f"{name} was imported from {mod.__file__}, not from {site}")
    print(f"smoke_wheel: jitop {jitop.__version__} imported from {where.parent}")
    print(f"smoke_wheel: target {jitop.Target.current().describe()}")

    rng = np.random.default_rng(0)

    @jitop.kernel(fallback=False)
    def softmax(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    x = rng.standard_normal((37, 129)).astype(np.float32)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    _check_close("@jitop.kernel softmax", softmax(x), e / e.sum(axis=-1, keepdims=True), atol=1e-6)

    a = rng.standard_normal((67, 45)).astype(np.float32)
    b = rng.standard_normal((45, 83)).astype(np.float32)
    _check_close("jitop.matmul", jitop.matmul(a, b), np.matmul(a, b))

    img = rng.standard_normal((2, 3, 11, 13)).astype(np.float32)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    for stride, padding in ((1, 1), (2, 0)):
        _check_close(f"jitop.conv2d stride={stride} padding={padding}",
                     jitop.conv2d(img, w, stride=stride, padding=padding), _naive_conv2d(img, w, stride, padding))

    _check_cli_and_warm_process(cache_dir)
    import shutil
    os.environ["JITOP_CACHE"] = "0"  # the workload log's flush at exit must not write to a removed directory
    shutil.rmtree(cache_dir, ignore_errors=True)
    print(f"smoke_wheel: {_passed} passed, 0 failed")


if __name__ == "__main__":
    main(sys.argv)
