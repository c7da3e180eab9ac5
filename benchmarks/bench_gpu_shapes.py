"""A decode loop whose key/value cache grows by a row per token, under `@jitop.kernel(target="cuda")`: how many
GPU functions it compiles and what the host spends, with symbolic shapes (the default: a dim that varied is
traced as a symbol), the same with the weights copied to the GPU once (jitop.cuda.to_device; the caches then
stay there), and with `dynamic=False` (a compile per cache length, what every GPU kernel did before).

    python benchmarks/bench_gpu_shapes.py                 # 16-token prompt, 32 new tokens
    python benchmarks/bench_gpu_shapes.py --tokens 8      # shorter
    python benchmarks/bench_gpu_shapes.py --cnn /tmp/onnxm/resnet18.onnx   # an ONNX CNN at batches 1, 2, 4, 8, 3
    python benchmarks/bench_gpu_shapes.py --long 600      # 600 tokens, weights on the GPU: the memory pool's work

The program is benchmarks/bench_shapes.py's decode (2 GPT-2-width layers, C=768, 12 heads, float32): `prefill`
and `decode_step` under `@jitop.kernel(target="cuda")`. Each mode runs in its own child process with its own
temporary JITOP_CACHE_DIR, cold, then the generation again in the same process (steady: every shape seen).

On a machine with an NVIDIA GPU the kernels run there and the tokens are compared with numpy's. Without one the
driver is tests/fake_driver.py's stand-in: launches do nothing (the tokens are not checked, the times are the
host's work alone: tracing, PTX compiles, argument checks, copies into host memory posing as the GPU's).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


WEIGHTS_ON_GPU = "symbolic, weights on the GPU"


def _fake_gpu() -> None:
    """tests/fake_driver.py's libcuda stand-in in place of the real one (no GPU here), its allocations left
    uninitialised as cuMemAlloc's are (the stand-in zeroes them: a cost a GPU's host does not have)."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from fake_driver import FakeDriver
    from jitop.runtime.cuda import driver
    fake = FakeDriver()

    def uninitialised(nbytes: int) -> int:
        block = np.empty(nbytes, np.uint8)
        fake.memory[block.ctypes.data] = block
        return block.ctypes.data
    fake._host_memory = uninitialised
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
                   signatures=len(kernels[1].dispatcher.overloads()),
                   **_driver_calls_per_step(lambda n: bs.generate(pre, step, layers, embed, prompt, n), tokens))
    return out


COUNTED = {"launches": "cuLaunchKernel", "allocations": "cuMemAlloc_v2", "frees": "cuMemFree_v2"}


@contextlib.contextmanager
def driver_calls(names=tuple(COUNTED.values())):
    """Counts, while the block runs, the calls of the driver functions `names` (a dict by name, live)."""
    from jitop.runtime.cuda import driver
    lib = driver.lib()
    originals = {name: getattr(lib, name) for name in names}
    counts = dict.fromkeys(names, 0)

    def counted(name):
        def call(*args):
            counts[name] += 1
            return originals[name](*args)
        return call
    for name in names:
        setattr(lib, name, counted(name))
    try:
        yield counts
    finally:
        for name, fn in originals.items():
            setattr(lib, name, fn)


def _driver_calls_per_step(generate, tokens: int) -> dict[str, float]:
    """Kernel launches, device allocations and frees per generated token (a run of `tokens` less one of none:
    the prefill's), counted at the driver, after the timed runs. The pool of freed blocks is emptied (uncounted)
    before each run, as if the cache lengths were new: the timed runs left a block of every length in it."""
    from jitop.runtime.cuda import memory

    def run(n: int) -> dict[str, int]:
        memory.POOL.drain()
        with driver_calls() as counts:
            generate(n)
        return counts
    prefill, both = run(0), run(tokens)
    return {key: (both[name] - prefill[name]) / tokens for key, name in COUNTED.items()}


CALLS = "host cost per call"


def call_costs() -> dict:
    """Microseconds per call of a 256-element kernel (a * b + 1) with device arrays, best of 3 runs of 3000
    back-to-back calls: the raw driver launch, a `jitop.build` function (output given, and allocated per call),
    and `@jitop.kernel(target="cuda")` traced for a constant and for a symbolic size."""
    import bench_gpu
    import jitop
    from jitop import te
    from jitop.runtime.cuda import driver, memory
    from jitop.topi import cuda as topi_cuda
    if not driver.available():
        _fake_gpu()
    n = 256
    A, B = te.placeholder((n,), name="A"), te.placeholder((n,), name="B")
    Y = te.compute((n,), lambda i: A[i] * B[i] + 1.0, name="Y")
    target = jitop.Target("cuda") if driver.available() else jitop.Target.from_string("cuda -arch=sm_90")
    f = jitop.build(topi_cuda.schedule_injective(Y, target=target), [A, B, Y], target=target)
    da, db, dy = (memory.to_device(np.full(n, v, np.float32)) for v in (2, 3, 0))
    constant = jitop.kernel(bench_gpu._tiny_numpy, target="cuda", dynamic=False, fallback=False)
    symbolic = jitop.kernel(bench_gpu._tiny_numpy, target="cuda", dynamic=True, fallback=False)
    calls = {"raw driver launch (no wrapper)": bench_gpu.raw_launcher(f, [da, db, dy]),
             "jitop.build function, output given": lambda: f(da, db, dy),
             "jitop.build function, output allocated": lambda: f(da, db),
             "@jitop.kernel, constant shape": lambda: constant(da, db),
             "@jitop.kernel, symbolic size": lambda: symbolic(da, db)}
    calls.update(_decode_layer_calls())
    calls.update(_sliced_decode_calls())
    out = {name: bench_gpu.us_per_call(call, driver.synchronize) for name, call in calls.items() if call is not None}
    return {"gpu": driver.available(), "us": out}


def _decode_layer_calls() -> dict[str, Callable[[], Any]]:
    """One GPT-2-width decode layer (`decode_step`, weights and activations device arrays) called at one cache
    length again and again, and called on its own outputs (a cache one row longer every call: a new size each
    time, as in a decode loop)."""
    import bench_shapes as bs
    import jitop
    layers, embed = bs.decode_weights(np.random.default_rng(5))
    params = [jitop.cuda.to_device(w) for w in layers[0]]
    step = jitop.kernel(bs.decode_step, target="cuda")
    prefill = jitop.kernel(bs.prefill, target="cuda")
    x, k, v = prefill(embed[:bs.PROMPT], *params)
    h = jitop.cuda.to_device(embed[:1])
    for _ in range(3):  # the second length makes the cache's length a symbol
        _, k, v = step(h, k, v, *params)
    same, grown = (k, v), [k, v]

    def longer() -> None:
        _, grown[0], grown[1] = step(h, *grown, *params)
    return {"decode layer (10 launches), the same cache length": lambda: step(h, *same, *params),
            "decode layer, a cache one row longer every call": longer}


def _sliced_decode_calls() -> dict[str, Callable[[], Any]]:
    """bench_assignment's decode step that slices its cache by a Python int (`cache[t] = k`, attention over
    `cache[:t + 1]`; cache 1024 x 64 float32 on the GPU), t one more every call (a size symbol: one GPU function
    for every t), and numpy's on host arrays for scale."""
    import bench_assignment as ba
    import jitop
    rng = np.random.default_rng(6)
    host = [np.zeros((1024, 64), np.float32)] + [rng.standard_normal(64).astype(np.float32) for _ in range(2)]
    cache, k, q = (jitop.cuda.to_device(a) for a in host)
    step = jitop.kernel(ba.decode_sliced, target="cuda")
    for t in range(4):  # t = 0 and 1 are kernels of their own, then t is a size symbol
        step(cache, k, q, t)
    t = [4]

    def jitop_step() -> None:
        step(cache, k, q, t[0])
        t[0] = 4 + (t[0] - 3) % 1000

    def numpy_step() -> None:
        ba.decode_sliced(*host, t[0])
        t[0] = 4 + (t[0] - 3) % 1000
    return {"decode step slicing its cache by a Python int t (t + 1 every call)": jitop_step,
            "the same step, numpy on host arrays": numpy_step}


LONG = "long"


def long_decode(tokens: int) -> dict:
    """`tokens` decode steps after the prompt, weights on the GPU, numpy's activations in and out of each layer:
    per quarter of the run, the device allocations and frees per token (counted at the driver) and the median
    host time of a token's layer calls; the bytes the memory pool holds at the end."""
    from jitop.runtime.cuda import driver
    if not driver.available():
        _fake_gpu()
    with driver_calls(("cuMemAlloc_v2", "cuMemFree_v2")) as counts:
        return _long_decode_counted(tokens, counts)


def _long_decode_counted(tokens: int, counts: dict) -> dict:
    import bench_shapes as bs
    import jitop
    from jitop.runtime.cuda import driver, memory
    rng = np.random.default_rng(23)
    layers, embed = bs.decode_weights(rng)
    layers = [[jitop.cuda.to_device(w) for w in params] for params in layers]
    pre, step = (jitop.kernel(f, target="cuda") for f in (bs.prefill, bs.decode_step))
    x, caches = embed[:bs.PROMPT], []
    for params in layers:
        x, k, v = pre(x, *params)
        x = x.get()
        caches.append((k, v))
    rows = []
    for t in range(tokens):
        before, t0 = dict(counts), time.perf_counter()
        h = embed[t % bs.VOCAB][None, :]
        for i, params in enumerate(layers):
            h, k, v = step(h, *caches[i], *params)
            h = h.get()
            caches[i] = (k, v)
        rows.append((counts["cuMemAlloc_v2"] - before["cuMemAlloc_v2"],
                     counts["cuMemFree_v2"] - before["cuMemFree_v2"], time.perf_counter() - t0))
    quarter = max(1, tokens // 4)
    parts = [rows[k:k + quarter] for k in range(0, tokens, quarter)]
    return {"gpu": driver.available(), "held_mib": memory.POOL.held / 2 ** 20,
            "parts": [[k * quarter, sum(r[0] for r in p) / len(p), sum(r[1] for r in p) / len(p),
                       float(np.median([r[2] for r in p])) * 1e3] for k, p in enumerate(parts)]}


def print_long(tokens: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        r = run_child(LONG, tokens, root)
    print(f"decode of {tokens} tokens after a 16-token prompt, 2 layers, weights on the GPU "
          f"({'on this GPU' if r['gpu'] else 'no GPU: launches are no-ops, host work only'}); the pool holds "
          f"{r['held_mib']:.0f} MiB at the end\n")
    print("| tokens | allocations per token | frees per token | median host time of a token's layer calls (ms) |")
    print("|---|---|---|---|")
    for first, allocs, frees, ms in r["parts"]:
        print(f"| {first}-{first + tokens // 4 - 1} | {allocs:.2f} | {frees:.2f} | {ms:.2f} |")


CNN = "cnn"


def cnn_batches(model: str, batches: list[int]) -> dict:
    """An ONNX CNN with a symbolic batch under target="cuda", called with each batch in turn (random images):
    seconds per call (a first call at a new batch includes its compile, if any) and GPU compiles in all."""
    import jitop
    from jitop.runtime.cuda import driver
    if not driver.available():
        _fake_gpu()
    import jitop.onnx
    m = jitop.onnx.load(model, target="cuda")
    rng = np.random.default_rng(0)
    seconds = []
    for batch in batches:
        x = rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)
        t0 = time.perf_counter()
        m(x)
        seconds.append(time.perf_counter() - t0)
    return {"gpu": driver.available(), "seconds": seconds, "compiles": m.kernel.dispatcher.compiles,
            "traces": m.kernel.traces}


CNN_BATCHES = [1, 2, 4, 8, 3]


def print_cnn(model: str) -> None:
    with tempfile.TemporaryDirectory() as root:
        r = run_child(CNN, 0, root, ["--cnn", os.path.abspath(model)])
    print(f"{os.path.basename(model)} under target='cuda', batches in turn "
          f"({'on this GPU' if r['gpu'] else 'no GPU: launches are no-ops, host work only'}): "
          f"{r['compiles']} GPU compiles, {r['traces']} traces\n")
    print("| batch | " + " | ".join(map(str, CNN_BATCHES)) + " |\n|---|" + "---|" * len(CNN_BATCHES))
    print("| seconds (first call at this batch) | " + " | ".join(f"{t:.2f}" for t in r["seconds"]) + " |")


def run_child(mode: str, tokens: int, root: str, extra: list[str] = ()) -> dict:
    env = {**os.environ, "JITOP_CACHE_DIR": os.path.join(root, mode.replace("=", "-"))}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--tokens", str(tokens), *extra]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _allocs(run: dict) -> str:
    return f"{run['allocations']:.2f}, {run['frees']:.2f}" if "allocations" in run else "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--cnn", metavar="MODEL.onnx", help="instead: an ONNX CNN of a symbolic batch (3x224x224 "
                   "images, e.g. benchmarks/onnx_models.py's resnet18.onnx) called at batches " +
                   ", ".join(map(str, CNN_BATCHES)))
    p.add_argument("--long", type=int, metavar="TOKENS", help="instead: a decode of TOKENS tokens with the weights "
                   "on the GPU, its device allocations, frees and host time per token by quarter")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child == CNN:
        print(json.dumps(cnn_batches(args.cnn, CNN_BATCHES)))
        return
    if args.child == LONG:
        print(json.dumps(long_decode(args.tokens)))
        return
    if args.child:
        print(json.dumps(call_costs() if args.child == CALLS else child(args.child, args.tokens)))
        return
    if args.cnn:
        print_cnn(args.cnn)
        return
    if args.long:
        print_long(args.long)
        return
    with tempfile.TemporaryDirectory() as root:
        runs = {mode: run_child(mode, args.tokens, root) for mode in ("numpy", "symbolic (default)", WEIGHTS_ON_GPU,
                                                                      "dynamic=False")}
        costs = run_child(CALLS, args.tokens, root)
    gpu = runs["symbolic (default)"]["gpu"]
    print(f"decode loop, {args.tokens} new tokens after a 16-token prompt; "
          + ("on this machine's GPU" if gpu else "no GPU: launches are no-ops, host work only"))
    print("\n| run | cold program (s) | steady step (ms) | launches per step | step per launch (us) | GPU compiles "
          "| decode_step traces | its functions | allocations, frees per step | tokens = numpy's |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode, r in runs.items():
        same = "-" if mode == "numpy" else ("yes" if r["tokens"] == runs["numpy"]["tokens"] else "NO") \
            if gpu else "not checked"
        launches = r.get("launches")
        per_launch = f"{r['steady_step_ms'] * 1e3 / launches:.1f}" if launches else "-"
        print(f"| {mode} | {r['cold_s']:.2f} | {r['steady_step_ms']:.2f} | {launches or '-'} | {per_launch} | "
              f"{r.get('compiles', '-')} | {r.get('traces', '-')} | {r.get('signatures', '-')} | {_allocs(r)} | "
              f"{same} |")
    print(f"\nHost cost of a call: a 256-element kernel, one decode layer (`decode_step`, 10 launches), and a "
          "decode step slicing its cache by t (bench_assignment.decode_sliced, cache 1024 x 64), "
          "device arrays in and out, best of 3 x 3000 calls "
          f"({'this GPU' if costs['gpu'] else 'no GPU: the launch itself is a no-op stand-in'})\n")
    print("| call | us per call |\n|---|---|")
    for name, us in costs["us"].items():
        print(f"| {name} | {us:.1f} |")


if __name__ == "__main__":
    main()
