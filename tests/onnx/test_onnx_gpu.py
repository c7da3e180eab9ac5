"""ONNX models on an NVIDIA GPU (`jitop.onnx.load(model, target="cuda")`). Without a GPU: the model's graph,
lowered for sm_90 as the GPU compile lowers it, runs on the GPU simulator (tests/gpu_sim.py) against onnx's
reference evaluator, its PTX passes ptxas, and the whole call runs on a simulated GPU (tests/sim_gpu.py); on a
machine with a GPU the calls run on it."""
from __future__ import annotations

import os

import numpy as np
import pytest

import gpu_sim
import jitop.onnx
import sim_gpu
from jitop.codegen.nvptx import check_ptx, ptxas_path
from jitop.graph.gpu import compile_graph_gpu
from onnx_checks import EXACT, assert_matches, data, dot, make_model, node, reference

SM90 = "cuda -arch=sm_90"


def _simulated(model, feeds):
    m = jitop.onnx.load(model, target=SM90)
    outs, tasks = gpu_sim.run_traced(m.kernel, *feeds.values())
    return m, outs, tasks


def small_cnn():
    """A ResNet in miniature: conv + batch norm + ReLU, max pool, a residual block, global average pool, a
    classifier; odd sizes (7 channels, a 13x11 image, 5 classes)."""
    rng = np.random.default_rng(3)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    consts = {"w1": f32(8, 3, 3, 3), "b1": f32(8), "scale": f32(8), "shift": f32(8), "mean": f32(8),
              "var": np.abs(f32(8)) + 0.5, "w2": f32(8, 8, 3, 3), "b2": f32(8), "fc": f32(5, 8), "fcb": f32(5)}
    nodes = [node("Conv", ["x", "w1", "b1"], "c1", pads=[1, 1, 1, 1]),
             node("BatchNormalization", ["c1", "scale", "shift", "mean", "var"], "bn"),
             node("Relu", ["bn"], "r1"),
             node("MaxPool", ["r1"], "p", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             node("Conv", ["p", "w2", "b2"], "c2", pads=[1, 1, 1, 1]),
             node("Add", ["c2", "p"], "s"),
             node("Relu", ["s"], "r2"),
             node("GlobalAveragePool", ["r2"], "g"),
             node("Flatten", ["g"], "f"),
             node("Gemm", ["f", "fc", "fcb"], "y", transB=1)]
    feeds = {"x": data((2, 3, 13, 11), salt=1)}
    return make_model(nodes, feeds, ["y"], consts), feeds


def test_a_small_cnn_equals_the_reference():
    model, feeds = small_cnn()
    m, (got,), tasks = _simulated(model, feeds)
    assert sorted(t.template for t in tasks) == ["cuda.conv2d", "cuda.conv2d", "cuda.gemv"]  # the FC: 2 rows
    # three dot products in a row (27, 72 and 8 terms; the pool's 36 sums): their lengths add up in the bound
    tol = dot(27 + 72 + 36 + 8, extra_ulps=8).bound(model, feeds, 0)
    assert_matches(got, reference(model, feeds)[0], tol)
    assert repr(m).endswith("on sm_90>")


def test_depthwise_convolutions_and_relu6():
    """MobileNet's block: a 1x1 expansion, a depthwise 3x3 (one thread per output), ReLU6 (Clip)."""
    rng = np.random.default_rng(4)
    consts = {"we": rng.standard_normal((12, 4, 1, 1)).astype(np.float32),
              "wd": rng.standard_normal((12, 1, 3, 3)).astype(np.float32),
              "lo": np.float32(0), "hi": np.float32(6)}
    nodes = [node("Conv", ["x", "we"], "e"), node("Clip", ["e", "lo", "hi"], "r"),
             node("Conv", ["r", "wd"], "y", group=12, strides=[2, 2], pads=[1, 1, 1, 1])]
    feeds = {"x": data((1, 4, 9, 10), salt=2)}
    model = make_model(nodes, feeds, ["y"], consts)
    _, (got,), tasks = _simulated(model, feeds)
    assert [t.template for t in tasks] == ["cuda.conv2d"]  # the 1x1; the depthwise one is direct
    assert_matches(got, reference(model, feeds)[0], dot(4 + 9, extra_ulps=4).bound(model, feeds, 0))


def attention():
    """An encoder's attention in miniature: embedding lookup (Gather), projections (3-D @ 2-D), heads split
    (Reshape, Transpose), scores, softmax, the weighted sum, heads merged, layer norm."""
    rng = np.random.default_rng(5)
    f32 = lambda *s: (rng.standard_normal(s) * 0.5).astype(np.float32)  # noqa: E731
    consts = {"emb": f32(11, 12), "wq": f32(12, 12), "wk": f32(12, 12), "wv": f32(12, 12),
              "heads": np.array([2, 7, 3, 4], np.int64), "merged": np.array([2, 7, 12], np.int64),
              "gamma": f32(12), "beta": f32(12)}
    nodes = [node("Gather", ["emb", "ids"], "h"),
             *(node("MatMul", ["h", w], p) for w, p in (("wq", "q0"), ("wk", "k0"), ("wv", "v0"))),
             *(node("Reshape", [p, "heads"], f"{p}r") for p in ("q0", "k0", "v0")),
             node("Transpose", ["q0r"], "q", perm=[0, 2, 1, 3]),
             node("Transpose", ["k0r"], "k", perm=[0, 2, 3, 1]),
             node("Transpose", ["v0r"], "v", perm=[0, 2, 1, 3]),
             node("MatMul", ["q", "k"], "s"), node("Softmax", ["s"], "a", axis=-1),
             node("MatMul", ["a", "v"], "o"), node("Transpose", ["o"], "ot", perm=[0, 2, 1, 3]),
             node("Reshape", ["ot", "merged"], "om"),
             node("LayerNormalization", ["om", "gamma", "beta"], "y", axis=-1, epsilon=1e-5)]
    feeds = {"ids": np.random.default_rng(6).integers(0, 11, (2, 7)).astype(np.int64)}
    return make_model(nodes, feeds, ["y"], consts), feeds


def test_attention_equals_the_reference():
    model, feeds = attention()
    _, (got,), tasks = _simulated(model, feeds)
    assert [t.template for t in tasks] == ["cuda.matmul"] * 3  # the projections: [2, 7, 12] @ [12, 12] as 14 x 12
    want = reference(model, feeds)[0]
    # layer norm divides by a standard deviation of O(1): an absolute bound from the chain's lengths (12-term
    # projections, 3-term scores, 7-term sums, 12-term statistics), scaled by the values' magnitude
    assert_matches(got, want, 64 * (12 + 3 + 7 + 7 + 12) * np.finfo(np.float32).eps * (1 + np.abs(want)))


def test_an_index_out_of_range_raises_index_error():
    """Gather's range check runs in the GPU kernel (the error flag, raised after the launches)."""
    model, feeds = attention()
    bad = feeds["ids"].copy()
    bad[1, 3] = 11
    with pytest.raises(IndexError, match="index 11 is out of bounds|out of bounds"):
        _simulated(model, {"ids": bad})


def test_a_gpu_model_cannot_be_saved_and_a_compiled_one_takes_no_target(tmp_path):
    model, feeds = small_cnn()
    m = jitop.onnx.load(model, target=SM90)
    assert m.target.arch == "sm_90"
    with pytest.raises(NotImplementedError, match="cannot be saved"):
        m.save(str(tmp_path / "m.jitop"))
    cpu = jitop.onnx.load(model)
    cpu(**feeds)
    cpu.save(str(tmp_path / "m.jitop"))
    with pytest.raises(ValueError, match="target='cuda' applies to an .onnx model"):
        jitop.onnx.load(str(tmp_path / "m.jitop"), target="cuda")
    assert jitop.onnx.load(str(tmp_path / "m.jitop")).target is None


@pytest.mark.skipif(ptxas_path() is None and os.environ.get("JITOP_REQUIRE_PTXAS") != "1",
                    reason="ptxas not installed (pip install nvidia-cuda-nvcc, or jitop[cuda-test])")
@pytest.mark.parametrize("build", [small_cnn, attention])
def test_the_models_compile_to_ptx_that_ptxas_accepts(build):
    model, feeds = build()
    kf = jitop.onnx.load(model, target=SM90).kernel
    tr = kf.trace(list(feeds.values()))
    exe = compile_graph_gpu(kf.__name__, tr.inputs, tr.names, tr.plan, tr.results, kf.gpu)
    check_ptx(exe.function.built.ptx)


def test_exact_ops_are_exact():
    """Data movement and max pooling lose nothing on the GPU either."""
    feeds = {"x": data((1, 3, 6, 5), salt=7)}
    model = make_model([node("MaxPool", ["x"], "m", kernel_shape=[2, 2], strides=[1, 2]),
                        node("Transpose", ["m"], "y", perm=[0, 3, 2, 1])], feeds, ["y"])
    _, (got,), _ = _simulated(model, feeds)
    assert_matches(got, reference(model, feeds)[0], EXACT)


def test_models_run_on_the_simulated_gpu(monkeypatch):
    """jitop.onnx.load(model, target="cuda") end to end on a GPU whose launches run on the simulator
    (tests/sim_gpu.py): numpy in, numpy out; the projections' kernel shared (or their launches merged); a wrong
    token id an IndexError raised from the kernels' error flag."""
    gpu = sim_gpu.gpu_or_simulated(monkeypatch)
    model, feeds = attention()
    m = jitop.onnx.load(model, target="cuda")
    want = reference(model, feeds)[0]
    assert_matches(m(**feeds), want, 64 * 41 * np.finfo(np.float32).eps * (1 + np.abs(want)))
    # the projections: one kernel launched for each, or (single blocks one after another) one launch for two
    shared = gpu is not None and len(gpu.launched) > len(set(gpu.launched))
    assert gpu is None or shared or "matmul_1 runs in cuda.matmul's single block" in m.kernel.explain(**feeds)
    bad = feeds["ids"].copy()
    bad[0, 2] = -12
    with pytest.raises(IndexError):
        m(ids=bad)
    model, feeds = small_cnn()
    tol = dot(27 + 72 + 36 + 8, extra_ulps=8).bound(model, feeds, 0)
    assert_matches(jitop.onnx.load(model, target="cuda")(**feeds), reference(model, feeds)[0], tol)


def test_a_gpu_model_takes_device_arrays_and_returns_them(monkeypatch):
    """Inputs already on the GPU (jitop's device arrays here; torch's and CuPy's alike) are read in place, the
    outputs stay there; their dtype and shape are checked as a host array's."""
    from jitop.runtime.cuda import memory
    sim_gpu.gpu_or_simulated(monkeypatch)
    model, feeds = small_cnn()
    m = jitop.onnx.load(model, target="cuda")
    got = m(memory.to_device(feeds["x"]))
    assert isinstance(got, memory.DeviceArray)
    np.testing.assert_array_equal(got.get(), m(feeds["x"]))
    with pytest.raises(TypeError, match="input 'x': expected dtype float32, got float64"):
        m(memory.to_device(feeds["x"].astype(np.float64)))
    with pytest.raises(ValueError, match=r"input 'x': expected shape \(2, 3, 13, 11\), got \(2, 3, 13, 12\)"):
        m(memory.to_device(np.zeros((2, 3, 13, 12), np.float32)))


def test_a_symbolic_batch_is_one_gpu_function(monkeypatch):
    """A dense model's symbolic batch is one GPU function per row bucket (up to 16 rows, more): the SGEMM with
    symbolic rows."""
    sim_gpu.gpu_or_simulated(monkeypatch)
    rng = np.random.default_rng(6)
    model = make_model([node("MatMul", ["x", "w"], "mm"), node("Add", ["mm", "b"], "s"), node("Relu", ["s"], "y")],
                       {"x": data((8, 24), salt=3)}, ["y"],
                       {"w": rng.standard_normal((24, 10)).astype(np.float32),
                        "b": rng.standard_normal(10).astype(np.float32)}, shapes={"x": ["batch", 24]})
    m = jitop.onnx.load(model, target="cuda")
    for batch in (8, 3, 5, 40):
        x = data((batch, 24), salt=batch)
        (got,) = m.run(None, {"x": x})
        assert_matches(got, reference(model, {"x": x})[0], dot(25).bound(model, {"x": x}, 0))
    assert m.kernel.traces == 2  # every batch compiled a function of its own
    assert [t.template for t in gpu_sim.lower_traced(m.kernel, data((7, 24))).tasks] == ["cuda.matmul"]


def test_a_convolution_with_a_varying_batch_is_one_implicit_gemm_and_a_varying_image_is_traced_per_size(
        monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    rng = np.random.default_rng(7)
    w = rng.standard_normal((6, 3, 3, 3)).astype(np.float32)
    k = jitop.kernel(lambda x: np.maximum(jitop.conv2d(x, w, padding=1), 0), target="cuda", fallback=False)
    bound = 27 * 8 * np.finfo(np.float32).eps * 27  # 27 products of |x|, |w| < ~4.5 each, any order
    for batch in (2, 3, 4, 9):
        x = rng.standard_normal((batch, 3, 9, 7)).astype(np.float32)
        got, want = k(x), np.maximum(jitop.conv2d(x, w, padding=1), 0)
        np.testing.assert_allclose(got, want, rtol=0, atol=bound)
    assert k.traces == 2 and not k.policy.refused()  # the first batch, then a symbolic one
    (symbolic,) = [ov for ov in k.dispatcher.overloads() if ov.accepts is not None]
    from jitop.graph.gpu import lower_trace
    tr = symbolic.trace
    _, choices = lower_trace(k.__name__, tr.inputs, tr.names, tr.results, k.gpu)
    assert [task.template for task, _ in choices.values()] == ["cuda.conv2d"]  # the implicit GEMM, batch symbolic
    assert [p.shape[0] for p in symbolic.exe.function.params[:1]] == ["x_0"]
    for hw in ((9, 7), (11, 5), (6, 8)):  # the image size varies: traced at each (the template takes a batch only)
        x = rng.standard_normal((2, 3, *hw)).astype(np.float32)
        np.testing.assert_allclose(k(x), np.maximum(jitop.conv2d(x, w, padding=1), 0), rtol=0, atol=bound)
    (reason,) = k.policy.refused().values()
    assert "symbolic image size" in reason
