"""`@jitop.kernel(target="cuda")` computes a traced conv2d on the GPU: NCHW float32 with groups 1 and symmetric
padding with topi.cuda's implicit GEMM (the "cuda.conv2d" template, its tuned records applying), any other
convolution one thread per output element. Without a GPU: the graph's loop IR runs on the GPU simulator
(tests/gpu_sim.py: races, out-of-bounds indices, unwritten memory as NaN) against a float64 reference, and
ptxas accepts its PTX."""
from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

import jitop
from jitop.codegen.nvptx import check_ptx, ptxas_path
from jitop.target import Target
from jitop.topi.cuda_space import to_config
from jitop.tuner.records import Record
from kernel_checks import conv2d_reference
from jitop.codegen.nvptx import kernel_nests
from jitop.tuner.measure import ErrorCode, MeasureResult

import gpu_sim

SM90 = "cuda -arch=sm_90"
EPS32 = float(np.finfo(np.float32).eps)


def simulate(fn, *args):
    """fn's results computed by its GPU loop IR on the simulator, and the GPU tasks of its nodes."""
    outs, tasks = gpu_sim.run_traced(jitop.kernel(fn, target=SM90), *args)
    return (outs[0] if len(outs) == 1 else outs), tasks


def reference(x, w, stride=1, pad=0, dilation=1, groups=1, pads=None):
    """float64 conv2d (NCHW) and the bound of its float32 rounding error: |error| <= 2 (taps + 1) eps sum |x w|."""
    n, c, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    top, bottom, left, right = pads or (pad,) * 4
    oh = (h + top + bottom - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + left + right - dilation * (kw - 1) - 1) // stride + 1
    wl = SimpleNamespace(n=n, oc=oc, oh=oh, ow=ow, kh=kh, kw=kw, icg=icg, ocg=oc // groups, pads=(top, bottom, left,
                         right), stride=(stride, stride), dilation=(dilation, dilation), layout="NCHW")
    exact = conv2d_reference(x, w, wl)
    scale = conv2d_reference(np.abs(x), np.abs(w), wl)
    return exact, 2 * (icg * kh * kw + 1) * EPS32 * scale


def _data(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _assert_within(got, exact, bound):
    assert got.dtype == np.float32 and got.shape == exact.shape
    assert not np.isnan(got).any()
    err = np.abs(got.astype(np.float64) - exact)
    assert (err <= bound + 1e-30).all(), float((err - bound).max())


@pytest.mark.parametrize("x_shape, w_shape, stride, pad, dilation", [
    ((2, 5, 9, 7), (12, 5, 3, 3), 1, 1, 1),     # odd sizes, a partial block of pixels and of channels
    ((1, 3, 11, 13), (7, 3, 3, 3), 2, 1, 1),    # stride 2, prime channel count
    ((3, 16, 5, 5), (33, 16, 1, 1), 1, 0, 1),   # 1x1, more channels than a block tile of rows
    ((1, 1, 1, 1), (1, 1, 1, 1), 1, 0, 1),      # one pixel, one channel
    ((2, 6, 8, 9), (5, 6, 3, 3), 1, 2, 2),      # dilated
])
def test_an_nchw_float32_conv2d_is_the_implicit_gemm(x_shape, w_shape, stride, pad, dilation):
    x, w = _data(x_shape, w_shape)
    got, tasks = simulate(lambda a, b: jitop.conv2d(a, b, stride=stride, padding=pad, dilation=dilation), x, w)
    assert [t.template for t in tasks] == ["cuda.conv2d"]
    _assert_within(got, *reference(x, w, stride, pad, dilation))


def test_bias_relu_and_a_residual_run_on_the_convolutions_register_tile():
    """The elementwise tail is the template's epilogue: one kernel, the tail computed before the store."""
    x, w, b = _data((2, 8, 6, 6), (8, 8, 3, 3), (8,))

    def block(x, w, b):
        return np.maximum(jitop.conv2d(x, w, b, padding=1) + x, 0)
    assert len(kernel_nests(gpu_sim.lower_traced(jitop.kernel(block, target=SM90), x, w, b).func)) == 1
    got, tasks = simulate(block, x, w, b)
    exact, bound = reference(x, w, pad=1)
    exact = exact + b[:, None, None] + x
    _assert_within(got, np.maximum(exact, 0), bound + 2 * EPS32 * (np.abs(exact) + np.abs(x)))
    assert [t.template for t in tasks] == ["cuda.conv2d"]


def test_a_producer_of_the_input_is_computed_in_the_shared_fill():
    x, w = _data((1, 4, 7, 7), (6, 4, 3, 3))
    fn = lambda a, b: jitop.conv2d(np.maximum(a, 0) * 2, b, padding=1)  # noqa: E731
    assert len(kernel_nests(gpu_sim.lower_traced(jitop.kernel(fn, target=SM90), x, w).func)) == 1  # no own kernel
    got, _ = simulate(fn, x, w)
    _assert_within(got, *reference(np.maximum(x, 0) * 2, w, pad=1))


@pytest.mark.parametrize("case", ["depthwise", "grouped", "asymmetric", "float64"])
def test_other_convolutions_compute_each_output_on_its_own_thread(case):
    x, w = _data((2, 6, 8, 9), (6, 1, 3, 3) if case == "depthwise" else (4, 3, 3, 3) if case == "grouped"
                 else (5, 6, 3, 3))
    groups = {"depthwise": 6, "grouped": 2}.get(case, 1)
    pads = (0, 1, 2, 1) if case == "asymmetric" else None
    if case == "float64":
        x, w = x.astype(np.float64), w.astype(np.float64)
    got, tasks = simulate(lambda a, b: jitop.conv2d(a, b, padding=pads or 1, groups=groups),
                          x, w)
    exact, bound = reference(x, w, pad=1, groups=groups, pads=pads)
    if case == "float64":
        assert got.dtype == np.float64 and not tasks
        np.testing.assert_allclose(got, exact, rtol=1e-12, atol=1e-12)
        return
    assert not tasks  # the implicit GEMM does not take it
    _assert_within(got, exact, bound)


def test_a_tuned_record_picks_the_convolutions_tiles(monkeypatch):
    """A record for the conv2d's GPU task (applied as jitop.apply_records does) changes its block tiles."""
    x, w = _data((1, 8, 10, 10), (16, 8, 3, 3))
    fn = lambda a, b: jitop.conv2d(a, b, padding=1)  # noqa: E731
    default = gpu_sim.lower_traced(jitop.kernel(fn, target=SM90), x, w)
    (task,) = default.tasks
    cfg = {"bm": 16, "bn": 16, "bk": 8, "tm": 2, "tn": 2}
    record = Record(task, to_config(cfg), MeasureResult((1e-4,), ErrorCode.NO_ERROR))
    with jitop.apply_records([record]):
        tuned = gpu_sim.lower_traced(jitop.kernel(fn, target=SM90), x, w)
    gpu_sim.run(tuned.func, *tuned.arrays, *tuned.outputs)
    assert tuned.tasks == [task]
    assert str(tuned.func) != str(default.func)  # another config, other loops
    _assert_within(tuned.outputs[0], *reference(x, w, pad=1))


needs_ptxas = pytest.mark.skipif(ptxas_path() is None and os.environ.get("JITOP_REQUIRE_PTXAS") != "1",
                                 reason="ptxas not installed (pip install nvidia-cuda-nvcc, or jitop[cuda-test])")


@needs_ptxas
def test_a_residual_block_compiles_to_ptx_that_ptxas_accepts():
    x, w1, w2 = _data((2, 16, 14, 14), (16, 16, 3, 3), (16, 16, 3, 3))

    @jitop.kernel(target=SM90)
    def block(x, w1, w2):
        y = np.maximum(jitop.conv2d(x, w1, padding=1), 0)
        return np.maximum(jitop.conv2d(y, w2, padding=1) + x, 0)
    tr = block.trace([x, w1, w2])
    from jitop.graph.gpu import compile_graph_gpu
    exe = compile_graph_gpu("block", tr.inputs, tr.names, tr.plan, tr.results, Target.from_string(SM90))
    assert sum(k.shared_bytes > 0 for k in exe.function.built.kernels) == 2
    check_ptx(exe.function.built.ptx)
