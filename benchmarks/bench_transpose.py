"""Transposing copies under @jitop.kernel next to numpy and torch (when installed), memory bandwidth beside.

    python benchmarks/bench_transpose.py [--repeat 7]

Cases (float32, each a new contiguous array, as the kernel returns one):
- `a.T + b` on 4096 x 4096;
- NHWC activations back to NCHW with a ReLU: `maximum(x.transpose(0, 3, 1, 2), 0)` at (1, 56, 56, 256)
  and (8, 28, 28, 512);
- attention's K transposed for Q @ K^T, `swapaxes(k, 1, 2) * 0.125` at (96, 128, 64);
- the NHWC -> NCHW case again with the height and width dynamic (`dynamic={"x": (1, 2)}`: one kernel for
  every size, as a program whose shapes change gets).

GB/s counts each operand read once and the result written once (what a copy at memory speed moves); the
STREAM triad (jitop.tuner.peak), measured at the start of the run, is printed beside as the machine's
memory bandwidth.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import jitop

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import best_of, machine, table  # noqa: E402
from jitop.tuner.peak import measure  # noqa: E402


def cases(rng: np.random.Generator) -> list[tuple[str, object, object, tuple[np.ndarray, ...], dict]]:
    """(name, the numpy function, the same in torch, operands, @jitop.kernel's options)."""
    def f32(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)
    relu_nchw = lambda x: np.maximum(x.transpose(0, 3, 1, 2), np.float32(0))  # noqa: E731
    relu_nchw_torch = lambda x: x.permute(0, 3, 1, 2).clamp_min(0)  # noqa: E731
    return [("a.T + b, 4096 x 4096", lambda a, b: a.T + b, lambda a, b: a.T + b, (f32(4096, 4096), f32(4096, 4096)),
             {}),
            ("relu(NHWC -> NCHW), 1x56x56x256", relu_nchw, relu_nchw_torch, (f32(1, 56, 56, 256),), {}),
            ("relu(NHWC -> NCHW), 8x28x28x512", relu_nchw, relu_nchw_torch, (f32(8, 28, 28, 512),), {}),
            ("swapaxes(k, 1, 2) * 0.125, 96x128x64", lambda k: np.swapaxes(k, 1, 2) * np.float32(0.125),
             lambda k: k.transpose(1, 2) * 0.125, (f32(96, 128, 64),), {}),
            ("relu(NHWC -> NCHW), 1x56x56x256, h and w dynamic", relu_nchw, relu_nchw_torch, (f32(1, 56, 56, 256),),
             {"dynamic": {"x": (1, 2)}})]


def torch_version(fn, args: tuple[np.ndarray, ...]):
    """`fn` on torch tensors in eager mode (contiguous result), or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(jitop.Target.current().threads)
    ts = [torch.from_numpy(a) for a in args]
    return lambda: fn(*ts).contiguous()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    print(machine())
    print(f"STREAM triad: {measure().bandwidth_gbs:.1f} GB/s on {jitop.Target.current().threads} threads")
    rng = np.random.default_rng(0)
    rows = []
    for name, fn, fn_torch, operands, options in cases(rng):
        kernel = jitop.kernel(fn, **options)
        want = fn(*operands)
        np.testing.assert_array_equal(kernel(*operands), want)
        moved = sum(a.nbytes for a in operands) + want.nbytes
        t_np = best_of(lambda: np.ascontiguousarray(fn(*operands)), args.repeat)
        t_jit = best_of(lambda: kernel(*operands), args.repeat)
        torch_call = torch_version(fn_torch, operands)
        t_torch = best_of(torch_call, args.repeat) if torch_call else None
        rows.append([name, f"{1e3 * t_np:.3f}", f"{1e3 * t_torch:.3f}" if t_torch else "n/a", f"{1e3 * t_jit:.3f}",
                     f"{moved / t_jit / 1e9:.1f}", f"{t_np / t_jit:.2f}",
                     f"{t_torch / t_jit:.2f}" if t_torch else "n/a"])
    print(table(["case", "numpy ms", "torch ms", "jitop ms", "jitop GB/s", "speed vs numpy", "speed vs torch"],
                rows))


if __name__ == "__main__":
    main()
