"""Constant weights are packed once, when the kernel is compiled (compile.prepack_all), not on every call.

A conv2d's or matmul's second operand that is a constant of the trace (a model's weights, reached through an
object rather than captured) is packed into the template's panels by numpy while compiling; the kernel reads
those panels as an input. A captured array is read as it is at each call, so it is packed on each call. Both
give numpy's results, from a fresh compile and from the disk cache.
"""
from __future__ import annotations

import numpy as np
import pytest

import jitop
from jitop.graph.compile import kernel_constants, prepare
from jitop.ops.conv import _reference as conv_reference

EPS = np.finfo(np.float32).eps


class Weights:
    """Holds arrays as attributes: read through it they are constants of the trace, not captured arrays."""

    def __init__(self, **arrays: np.ndarray):
        self.__dict__.update(arrays)


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


def _dot_bound(a: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """|fl(a @ b) - a @ b| <= 2 k eps (|a| @ |b|) for a k-term float32 dot product."""
    return 2 * k * EPS * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)) + 1e-30


def _packed_stages(fn) -> list[str]:
    """The lines of fn's (only) compiled loop IR that write or read a packing stage."""
    ov = fn.dispatcher.overloads()[0]
    return [line for line in str(ov.exe.func).splitlines() if "_packed" in line]


@pytest.mark.parametrize("oc,groups", [(5, 1), (37, 1), (64, 1), (12, 3), (8, 8)])
def test_conv_with_constant_weights_matches_numpy(oc, groups):
    rng = _rng()
    c = 8 if groups in (1, 8) else 6
    x = rng.standard_normal((2, c, 11, 13)).astype(np.float32)
    p = Weights(w=rng.standard_normal((oc, c // groups, 3, 3)).astype(np.float32),
                b=rng.standard_normal(oc).astype(np.float32))

    @jitop.kernel
    def f(x):
        return np.maximum(jitop.conv2d(x, p.w, p.b, padding=1, groups=groups), 0)

    got = f(x)
    geometry = ((1, 1), (1, 1, 1, 1), (1, 1), groups, "NCHW")
    ref = np.maximum(conv_reference(x.astype(np.float64), p.w.astype(np.float64), geometry)
                     + p.b.astype(np.float64).reshape(-1, 1, 1), 0)
    k = 9 * (c // groups)
    bound = 2 * k * EPS * (np.abs(conv_reference(np.abs(x).astype(np.float64), np.abs(p.w).astype(np.float64),
                                                 geometry)) + np.abs(p.b).reshape(-1, 1, 1)) + 1e-30
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.all(np.abs(got - ref) <= bound)


def test_constant_conv_weights_are_packed_at_compile_time_captured_ones_per_call():
    rng = _rng()
    x = rng.standard_normal((1, 16, 9, 9)).astype(np.float32)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    p = Weights(w=w.copy())

    @jitop.kernel
    def constant(x):
        return jitop.conv2d(x, p.w, padding=1)

    @jitop.kernel
    def captured(x):
        return jitop.conv2d(x, w, padding=1)

    a, b = constant(x), captured(x)
    assert np.array_equal(a, b)
    assert not _packed_stages(constant)   # the panels are an input: no packing loop
    assert _packed_stages(captured)       # a captured array may change: packed at each call
    w[:] = 0                                 # ... and the change is seen
    assert not captured(x).any()


def test_prepare_packs_each_constant_weight_once():
    rng = _rng()
    p = Weights(w=rng.standard_normal((32, 16, 3, 3)).astype(np.float32),
                m=rng.standard_normal((24, 19)).astype(np.float32))

    @jitop.kernel
    def f(x, y):
        return jitop.conv2d(x, p.w, padding=1), y @ p.m

    x, y = np.ones((1, 16, 28, 28), np.float32), np.ones((40, 24), np.float32)
    tr = f.trace([x, y])
    prep = prepare("f", tr.inputs, tr.names, tr.plan, tr.results)
    assert sorted(task.template for task, _ in prep.choices.values()) == ["conv2d", "matmul"]
    assert [c.config["algorithm"] for t, c in prep.choices.values() if t.template == "conv2d"] == ["direct"]
    shapes = sorted(a.shape for arrays in prep.packed.values() for a in arrays)
    assert len(prep.packed) == 2
    # conv: [panels, kh, kw, icg, bn]; matmul: [panels, k, bn] with n=19 zero-padded to whole panels
    conv = [s for s in shapes if len(s) == 5][0]
    assert conv[1:4] == (3, 3, 16) and conv[0] * conv[4] == 32
    mm = [s for s in shapes if len(s) == 3][0]
    assert mm[1] == 24 and mm[0] * mm[2] >= 19
    # the kernel carries each weight once, packed: the original arrays are not arguments
    assert sorted(c.shape for c in kernel_constants(prep)) == shapes


def test_a_weight_also_read_elsewhere_stays_an_argument():
    rng = _rng()
    p = Weights(w=rng.standard_normal((32, 16, 3, 3)).astype(np.float32))

    @jitop.kernel
    def f(x):
        return jitop.conv2d(x, p.w, padding=1), x[0, 0, 0, 0] * p.w

    x = rng.standard_normal((1, 16, 28, 28)).astype(np.float32)
    tr = f.trace([x])
    prep = prepare("f", tr.inputs, tr.names, tr.plan, tr.results)
    assert (32, 16, 3, 3) in [c.shape for c in kernel_constants(prep)]
    ref = conv_reference(x.astype(np.float64), p.w.astype(np.float64), ((1, 1), (1, 1, 1, 1), (1, 1), 1, "NCHW"))
    conv, scaled = f(x)
    bound = 2 * 16 * 9 * EPS * np.abs(conv_reference(np.abs(x).astype(np.float64), np.abs(p.w).astype(np.float64),
                                                     ((1, 1), (1, 1, 1, 1), (1, 1), 1, "NCHW"))) + 1e-30
    assert np.all(np.abs(conv - ref) <= bound)
    assert np.array_equal(scaled, x[0, 0, 0, 0] * p.w)  # one rounding, as numpy


@pytest.mark.parametrize("m,k,n", [(1, 2048, 1100), (3, 70, 37), (64, 129, 67)])
def test_matmul_with_constant_b_matches_numpy(m, k, n):
    """Ragged panels (n not a multiple of bn) and, for a row vector times a B bigger than L2, B cut into
    K chunks (one packed array per chunk)."""
    rng = _rng()
    a = rng.standard_normal((m, k)).astype(np.float32)
    p = Weights(b=rng.standard_normal((k, n)).astype(np.float32))

    @jitop.kernel
    def f(a):
        return a @ p.b

    got = f(a)
    ref = a.astype(np.float64) @ p.b.astype(np.float64)
    assert got.shape == (m, n) and got.dtype == np.float32
    assert np.all(np.abs(got - ref) <= _dot_bound(a, p.b, k))


def test_batched_constant_b():
    rng = _rng()
    a = rng.standard_normal((3, 5, 17)).astype(np.float32)
    p = Weights(b=rng.standard_normal((3, 17, 29)).astype(np.float32))

    @jitop.kernel
    def f(a):
        return np.matmul(a, p.b)

    got = f(a)
    ref = np.matmul(a.astype(np.float64), p.b.astype(np.float64))
    bound = 2 * 17 * EPS * np.matmul(np.abs(a).astype(np.float64), np.abs(p.b).astype(np.float64)) + 1e-30
    assert np.all(np.abs(got - ref) <= bound)


def test_prepacked_kernel_from_the_disk_cache_gives_the_same_result():
    rng = _rng()
    x = rng.standard_normal((1, 8, 7, 7)).astype(np.float32)
    p = Weights(w=rng.standard_normal((21, 8, 3, 3)).astype(np.float32), m=rng.standard_normal((7, 13)).astype(np.float32))

    def f(x):
        return jitop.conv2d(x, p.w, padding=1) @ p.m

    first = jitop.kernel(f)
    expected = first(x)
    again = jitop.kernel(f)  # a new dispatcher: the signature comes from the disk cache
    got = again(x)
    assert again.dispatcher.overloads()[0].lookup.status == "hit"
    assert np.array_equal(got, expected)


def test_template_prepack_layouts_with_ragged_panels():
    """The arrays prepack makes hold what the templates' packing stages compute, zero past the last column."""
    from jitop.topi.conv2d import Conv2dConfig, Conv2dWorkload
    from jitop.topi.matmul import MatmulConfig, MatmulWorkload
    from jitop.tuner import registry
    target = jitop.Target.host()
    rng = _rng()
    w = rng.standard_normal((37, 5, 3, 2)).astype(np.float32)
    wl = Conv2dWorkload(n=1, c=5, h=9, w=9, oc=37, kh=3, kw=2, stride=(1, 1), pads=(0, 0, 0, 0),
                        dilation=(1, 1), groups=1, layout="NCHW", dtype="float32")
    cfg = Conv2dConfig(mr=4, bn=16, ic_unroll=1, oc_outer=True, pack_per_panel=False, algorithm="direct")
    [packed] = registry.get("conv2d").prepack(wl, cfg.to_config(wl), target, w)
    assert packed.shape == (3, 3, 2, 5, 16)
    o, r, s_, i, lane = 2, 1, 1, 3, 4
    assert packed[o, r, s_, i, lane] == w[o * 16 + lane, i, r, s_]
    assert not packed[2, :, :, :, 5:].any()  # channels 37..47 do not exist
    b = rng.standard_normal((300, 21)).astype(np.float32)
    mwl = MatmulWorkload(m=1, n=21, k=300, dtype="float32", a_batch=(), b_batch=())
    mcfg = MatmulConfig(mr=1, bn=16, k_unroll=4, k_chunk=128, pack_b=True)
    chunks = registry.get("matmul").prepack(mwl, mcfg.to_config(1, 21, 300), target, b)
    assert [c.shape for c in chunks] == [(2, 128, 16), (2, 128, 16), (2, 44, 16)]
    assert chunks[1][1, 5, 3] == b[128 + 5, 16 + 3] and not chunks[2][1, :, 5:].any()  # columns 21..31
