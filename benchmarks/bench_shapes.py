"""Programs whose shapes change from call to call, each in a fresh process: numpy, jitop on an empty cache,
jitop again on the cache the first run left (issue 23's recompilation storm).

    python benchmarks/bench_shapes.py                    # both programs
    python benchmarks/bench_shapes.py --programs mlp     # one
    python benchmarks/bench_shapes.py --quick            # fewer tokens and batches (a smoke test)
    python benchmarks/bench_shapes.py --background       # also @jitop.kernel(compile="background") cold

1. decode: greedy generation with 2 GPT-2-width layers (C=768, 12 heads, float32, random weights): a 16-token
   prompt through `prefill` (one call per layer), then 48 new tokens, each through `decode_step` per layer with
   the layer's key/value cache one row longer than at the step before; the next token is the argmax of the
   output against a 4096-token embedding table, in numpy. jitop: `prefill` and `decode_step` under
   `@jitop.kernel`, nothing else changed.
2. mlp: a 3-layer MLP (512 -> 1024 -> 1024 -> 10, ReLU) called with 32 batch sizes (1..256) in a shuffled
   order, twice; jitop: the MLP under `@jitop.kernel`.

Each figure comes from its own child process (`python bench_shapes.py --child ...`) with its own temporary
JITOP_CACHE_DIR (never the user's): the program's time inside the child (after imports and weights), LLVM
compiles (`jitop.codegen.target.compile_count()`), the signatures each decorated function holds, and for
decode the steady time per step (the generation run again in the same process). The jitop runs' outputs are
compared with numpy's (the tokens generated, the MLP's outputs within float32 bounds).

Targets (issue 23): at most 2 compiles per decorated function in a cold process; a warm process >= 1.5x numpy
end to end; a steady decode step >= 2x numpy.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

C, HEADS, LAYERS, VOCAB = 768, 12, 2, 4096
PROMPT, NEW_TOKENS = 16, 48
MLP_DIMS, BATCHES = (512, 1024, 1024, 10), 32


# ** the programs, as a user writes them in numpy **
def layer_norm(x, g, b, eps=1e-5):
    mean = np.mean(x, axis=-1, keepdims=True)
    variance = np.var(x, axis=-1, keepdims=True)
    return g * (x - mean) / np.sqrt(variance + eps) + b


def gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(q, k, v, mask):
    d = q.shape[-1] // HEADS
    heads = []
    for i in range(HEADS):
        qh, kh, vh = q[:, i * d:(i + 1) * d], k[:, i * d:(i + 1) * d], v[:, i * d:(i + 1) * d]
        s = qh @ kh.T / math.sqrt(d) + mask  # a Python float: float32 stays float32 (NEP 50)
        e = np.exp(s - np.max(s, axis=-1, keepdims=True))
        heads.append(e / np.sum(e, axis=-1, keepdims=True) @ vh)
    return np.hstack(heads)


def block_rest(x, a, w_attn, b_attn, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj):
    x = x + a @ w_attn + b_attn
    return x + gelu(layer_norm(x, ln2_g, ln2_b) @ w_fc + b_fc) @ w_proj + b_proj


def prefill(x, ln1_g, ln1_b, w_qkv, b_qkv, w_attn, b_attn, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj):
    """One layer over the (T, C) prompt: its output and the layer's key and value cache."""
    q, k, v = np.split(layer_norm(x, ln1_g, ln1_b) @ w_qkv + b_qkv, 3, axis=-1)
    mask = (1 - np.tri(x.shape[0], dtype=x.dtype)) * -1e10
    a = attention(q, k, v, mask)
    return block_rest(x, a, w_attn, b_attn, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj), k, v


def decode_step(x, k_cache, v_cache, ln1_g, ln1_b, w_qkv, b_qkv, w_attn, b_attn, ln2_g, ln2_b, w_fc, b_fc,
                w_proj, b_proj):
    """One layer for one new token x (1, C) given its cache (S, C): the output and the cache one row longer."""
    q, k, v = np.split(layer_norm(x, ln1_g, ln1_b) @ w_qkv + b_qkv, 3, axis=-1)
    k_cache, v_cache = np.vstack([k_cache, k]), np.vstack([v_cache, v])
    a = attention(q, k_cache, v_cache, 0)
    return block_rest(x, a, w_attn, b_attn, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj), k_cache, v_cache


def mlp3(x, w1, b1, w2, b2, w3, b3):
    h = np.maximum(x @ w1 + b1, 0)
    h = np.maximum(h @ w2 + b2, 0)
    return h @ w3 + b3


# ** inputs **
def decode_weights(rng: np.random.Generator) -> tuple[list[list[np.ndarray]], np.ndarray]:
    def normal(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def layer() -> list[np.ndarray]:
        ln = lambda: [(1 + rng.standard_normal(C) * 0.1).astype(np.float32), normal(C)]  # noqa: E731
        return [*ln(), normal(C, 3 * C), normal(3 * C), normal(C, C), normal(C),
                *ln(), normal(C, 4 * C), normal(4 * C), normal(4 * C, C), normal(C)]
    return [layer() for _ in range(LAYERS)], normal(VOCAB, C, std=1.0)


def generate(prefill_fn, step_fn, layers, embed, prompt: list[int], new_tokens: int) -> tuple[list[int], list]:
    """Greedy generation: the tokens generated and each step's wall time."""
    x = embed[prompt]
    caches = []
    for params in layers:
        x, k, v = prefill_fn(x, *params)
        caches.append((k, v))
    tokens, times = [], []
    token = int(np.argmax(embed @ x[-1]))
    for _ in range(new_tokens):
        t0 = time.perf_counter()
        x = embed[token][None, :]
        for i, params in enumerate(layers):
            x, k, v = step_fn(x, *caches[i], *params)
            caches[i] = (k, v)
        token = int(np.argmax(embed @ x[0]))
        times.append(time.perf_counter() - t0)
        tokens.append(token)
    return tokens, times


def mlp_weights(rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for d_in, d_out in zip(MLP_DIMS, MLP_DIMS[1:]):
        out += [(rng.standard_normal((d_in, d_out)) / np.sqrt(d_in)).astype(np.float32),
                (rng.standard_normal(d_out) * 0.1).astype(np.float32)]
    return out


def batch_sizes(rng: np.random.Generator, count: int) -> list[int]:
    sizes = [int(s) for s in rng.choice(np.arange(1, 257), size=count, replace=False)]
    return sizes + list(rng.permutation(sizes).astype(int))


# ** one child process **
def child(program: str, mode: str, quick: bool, out_dir: str) -> dict:
    """Run one program under numpy or jitop in this process; what the parent reports."""
    t_import = time.perf_counter()
    if mode == "jitop-background":
        os.environ["JITOP_COMPILE"] = "background"
        mode = "jitop"
    if mode == "jitop":
        import jitop
        from jitop import build_beside
        from jitop.codegen.target import compile_count
    import_s = time.perf_counter() - t_import
    rng = np.random.default_rng(23)
    result: dict = {"import_s": import_s}
    if program == "decode":
        layers, embed = decode_weights(rng)
        prompt = [int(t) for t in rng.integers(0, VOCAB, PROMPT)]
        new = 8 if quick else NEW_TOKENS
        pre, step = (jitop.kernel(prefill), jitop.kernel(decode_step)) if mode == "jitop" else (prefill, decode_step)
        t0 = time.perf_counter()
        tokens, _ = generate(pre, step, layers, embed, prompt, new)
        result["program_s"] = time.perf_counter() - t0
        result["compiles"] = compile_count() if mode == "jitop" else 0
        _built_beside(result, mode)
        _, times = generate(pre, step, layers, embed, prompt, new)  # again: every shape seen once already
        if mode == "jitop" and not build_beside.wait(0):  # (compile="background": the builds this run started)
            build_beside.wait()
            _, times = generate(pre, step, layers, embed, prompt, new)
        result["steady_step_s"] = float(np.median(times))
        result["tokens"] = tokens
        if mode == "jitop":
            result["signatures"] = {"prefill": len(pre.cache), "decode_step": len(step.cache)}
    else:
        weights = mlp_weights(rng)
        sizes = batch_sizes(rng, 8 if quick else BATCHES)
        xs = [rng.standard_normal((b, MLP_DIMS[0])).astype(np.float32) for b in sizes]
        fn = jitop.kernel(mlp3) if mode == "jitop" else mlp3
        t0 = time.perf_counter()
        outs = [fn(x, *weights) for x in xs]
        result["program_s"] = time.perf_counter() - t0
        result["compiles"] = compile_count() if mode == "jitop" else 0
        _built_beside(result, mode)
        np.savez(os.path.join(out_dir, f"mlp-{mode}-{os.getpid()}.npz"), *outs)
        result["outputs"] = os.path.join(out_dir, f"mlp-{mode}-{os.getpid()}.npz")
        if mode == "jitop":
            result["signatures"] = {"mlp3": len(fn.cache)}
    return result


def _built_beside(result: dict, mode: str) -> None:
    """compile="background": how long after the program its kernels were all built (the children's work)."""
    if mode == "jitop" and os.environ.get("JITOP_COMPILE") == "background":
        from jitop import build_beside
        t0 = time.perf_counter()
        build_beside.wait()
        result["built_after_s"] = time.perf_counter() - t0


def run_child(program: str, mode: str, quick: bool, cache: str, out_dir: str) -> dict:
    env = {**os.environ, "JITOP_CACHE_DIR": cache}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", program, mode, out_dir] + (["--quick"] if quick else [])
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{program}/{mode} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_s"] = wall
    return result


def mlp_agrees(numpy_file: str, jitop_file: str) -> bool:
    """Outputs within float32 bounds: K-term dot products of values near 1 in magnitude, three layers deep."""
    a, b = np.load(numpy_file), np.load(jitop_file)
    bound = 64 * np.finfo(np.float32).eps * max(MLP_DIMS)
    return all(np.allclose(a[k], b[k], rtol=bound, atol=bound) for k in a.files)


def measure(program: str, quick: bool, root: str, background: bool) -> list[list[str]]:
    cache = os.path.join(root, f"cache-{program}")
    ref = run_child(program, "numpy", quick, os.path.join(root, "unused-cache"), root)
    cold = run_child(program, "jitop", quick, cache, root)
    warm = run_child(program, "jitop", quick, cache, root)
    runs = [("numpy", ref), ("jitop, empty cache", cold), ("jitop, warm cache", warm)]
    if background:  # compile="background" on an empty cache of its own, then a plain run on what it left
        cache = os.path.join(root, f"cache-{program}-background")
        cold_bg = run_child(program, "jitop-background", quick, cache, root)
        runs += [(f"jitop compile=background, empty cache (built {cold_bg['built_after_s']:.2f} s after)", cold_bg),
                 ("jitop, the cache it left", run_child(program, "jitop", quick, cache, root))]
    rows = []
    for name, r in runs:
        if program == "decode":
            same = "-" if r is ref else ("yes" if r["tokens"] == ref["tokens"] else "NO")
            steady = f"{r['steady_step_s'] * 1e3:.2f}"
            vs = f"{ref['steady_step_s'] / r['steady_step_s']:.2f}x"
        else:
            same = "-" if r is ref else ("yes" if mlp_agrees(ref["outputs"], r["outputs"]) else "NO")
            steady, vs = "-", "-"
        rows.append([name, f"{r['program_s']:.2f}", f"{ref['program_s'] / r['program_s']:.2f}x",
                     str(r["compiles"]), json.dumps(r.get("signatures", "-")), steady, vs, same,
                     f"{r['process_s']:.2f}"])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--programs", nargs="+", choices=("decode", "mlp"), default=["decode", "mlp"])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--background", action="store_true", help="also compile=background on an empty cache")
    p.add_argument("--child", nargs=3, metavar=("PROGRAM", "MODE", "OUT_DIR"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        program, mode, out_dir = args.child
        print(json.dumps(child(program, mode, args.quick, out_dir)))
        return
    os.environ.setdefault("JITOP_NUM_THREADS", "2")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
    from common import machine, table  # noqa: E402 - the benchmarks' shared helpers
    print(machine())
    header = ["run", "program s", "speed vs numpy", "LLVM compiles", "signatures held", "steady step ms",
              "steady vs numpy", "same result", "process s"]
    with tempfile.TemporaryDirectory(prefix="jitop-bench-shapes-") as root:
        for program in args.programs:
            print(f"\n### {program}\n")
            print(table(header, measure(program, args.quick, root, args.background)))


if __name__ == "__main__":
    main()
