"""A decode loop whose key/value cache grows by a row per token, under `@jitop.kernel(target="cuda")`: how many
GPU functions it compiles and what the host spends, with symbolic shapes (the default: a dim that varied is
traced as a symbol), the same with the weights copied to the GPU once (jitop.cuda.to_device; the caches then
stay there), and with `dynamic=False` (a compile per cache length, what every GPU kernel did before).

    python benchmarks/bench_gpu_shapes.py                 # 16-token prompt, 32 new tokens
    python benchmarks/bench_gpu_shapes.py --tokens 8      # shorter

The program is benchmarks/bench_shapes.py's decode (2 GPT-2-width layers, C=768, 12 heads, float32): `prefill`
and `decode_step` under `@jitop.kernel(target="cuda")`. Each mode runs in its own child process with its own
temporary JITOP_CACHE_DIR, cold, then the generation again in the same process (steady: every shape seen).

On a machine with an NVIDIA GPU the kernels run there and the tokens are compared with numpy's. Without one the
driver is tests/fake_driver.py's stand-in: launches do nothing (the tokens are not checked, the times are the
host's work alone: tracing, PTX compiles, argument checks, copies into host memory posing as the GPU's).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


WEIGHTS_ON_GPU = "symbolic, weights on the GPU"


def _fake_gpu() -> None:
    """tests/fake_driver.py's libcuda stand-in in place of the real one (no GPU here)."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from fake_driver import FakeDriver
    from jitop.runtime.cuda import driver
    fake = FakeDriver()
    driver.lib = lambda: fake


def _host_activations(fn):
    """fn whose first result (the activations the numpy loop reads a row of) comes back to the host; the key and
    value caches stay device arrays."""
    def call(*args):
        x, k, v = fn(*args)
        return x.get(), k, v
    return call


def child(mode: str, tokens: int) -> dict:
    import bench_shapes as bs
    import jitop
    from jitop.runtime.cuda import driver
    real = driver.available()
    if not real:
        _fake_gpu()
    rng = np.random.default_rng(23)
    layers, embed = bs.decode_weights(rng)
    prompt = [int(t) for t in rng.integers(0, bs.VOCAB, bs.PROMPT)]
    if mode == "numpy":
        pre, step = bs.prefill, bs.decode_step
    else:
        options = {"dynamic": False} if mode == "dynamic=False" else {}
        pre, step = (jitop.kernel(f, target="cuda", **options) for f in (bs.prefill, bs.decode_step))
    kernels = (pre, step)
    if mode == WEIGHTS_ON_GPU:  # copied once: the caches they meet stay on the GPU too (device arrays out)
        layers = [[jitop.cuda.to_device(w) for w in params] for params in layers]
        pre, step = _host_activations(pre), _host_activations(step)
    t0 = time.perf_counter()
    got, _ = bs.generate(pre, step, layers, embed, prompt, tokens)
    cold = time.perf_counter() - t0
    _, times = bs.generate(pre, step, layers, embed, prompt, tokens)
    out = {"gpu": real, "cold_s": cold, "steady_step_ms": float(np.median(times)) * 1e3, "tokens": got}
    if mode != "numpy":
        out.update(traces=kernels[1].traces, compiles=sum(k.dispatcher.compiles for k in kernels),
                   signatures=len(kernels[1].dispatcher.overloads()))
    return out


def run_child(mode: str, tokens: int, root: str) -> dict:
    env = {**os.environ, "JITOP_CACHE_DIR": os.path.join(root, mode.replace("=", "-"))}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--tokens", str(tokens)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.tokens)))
        return
    with tempfile.TemporaryDirectory() as root:
        runs = {mode: run_child(mode, args.tokens, root) for mode in ("numpy", "symbolic (default)", WEIGHTS_ON_GPU,
                                                                      "dynamic=False")}
    gpu = runs["symbolic (default)"]["gpu"]
    print(f"decode loop, {args.tokens} new tokens after a 16-token prompt; "
          + ("on this machine's GPU" if gpu else "no GPU: launches are no-ops, host work only"))
    print("\n| run | cold program (s) | steady step (ms) | GPU compiles | decode_step traces | its functions |"
          " tokens = numpy's |")
    print("|---|---|---|---|---|---|---|")
    for mode, r in runs.items():
        same = "-" if mode == "numpy" else ("yes" if r["tokens"] == runs["numpy"]["tokens"] else "NO") \
            if gpu else "not checked"
        print(f"| {mode} | {r['cold_s']:.2f} | {r['steady_step_ms']:.2f} | {r.get('compiles', '-')} | "
              f"{r.get('traces', '-')} | {r.get('signatures', '-')} | {same} |")


if __name__ == "__main__":
    main()
