"""jitop.onnx's model interface: symbolic batch dims through a shape subgraph, the errors (unsupported operators,
attributes, wrong inputs), onnxruntime's run(), and a compiled model saved to a .jitop file and loaded back."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st

import jitop.onnx
from onnx_checks import check, data, dot, make_model, node, reference

F32, I64 = np.float32, np.int64


def flatten_model() -> onnx.ModelProto:
    """What torch.onnx.export emits for `x.view(x.size(0), -1) @ w + b` on a (batch, 3, 4, 5) input:
    Shape -> Gather(0) -> Unsqueeze -> Concat([n, -1]) -> Reshape, then MatMul and Add."""
    x = data((8, 3, 4, 5), F32)
    consts = {"idx0": np.array(0, I64), "ax0": np.array([0], I64), "minus1": np.array([-1], I64),
              "w": data((60, 7), F32, -1, 1, salt=1), "b": data((7,), F32, salt=2)}
    nodes = [node("Shape", ["x"], "shape"), node("Gather", ["shape", "idx0"], "n", axis=0),
             node("Unsqueeze", ["n", "ax0"], "n1"), node("Concat", ["n1", "minus1"], "target", axis=0),
             node("Reshape", ["x", "target"], "flat"), node("MatMul", ["flat", "w"], "mm"),
             node("Add", ["mm", "b"], "y")]
    return make_model(nodes, {"x": x}, ["y"], consts, opset=13, shapes={"x": ["batch", 3, 4, 5]})


def test_shape_subgraph_symbolic_batch():
    """The batch dim is symbolic: the shape subgraph computes with it (a SymInt) and one model serves batch 8
    and batch 3, both right (dot(60 + 1): a 60-term dot product and the bias)."""
    model = flatten_model()
    m = jitop.onnx.load(model)
    assert m.inputs[0].shape == ("batch", 3, 4, 5)
    for batch in (8, 3):
        x = data((batch, 3, 4, 5), F32, salt=batch)
        want = reference(model, {"x": x})[0]
        got = m(x)
        assert got.dtype == want.dtype and got.shape == (batch, 7)
        bound = dot(61).bound(model, {"x": x}, 0)
        assert np.all(np.abs(got.astype(np.float64) - want) <= bound)
    # traced once: the first call (batch 8) traces the batch as a symbol, batch 3 reuses that kernel
    assert m.kernel.traces == 1, m.kernel.traces


def test_shape_subgraph_pinned_batch():
    """shapes= pins the symbolic dim: the model serves that batch only and says so for another."""
    model = flatten_model()
    m = jitop.onnx.load(model, shapes={"x": (2, 3, 4, 5)})
    x = data((2, 3, 4, 5), F32)
    assert m(x).shape == (2, 7)
    with pytest.raises(ValueError, match="'x'"):
        m(data((3, 3, 4, 5), F32))
    with pytest.raises(ValueError, match="does not fit"):
        jitop.onnx.load(model, shapes={"x": (2, 3, 4, 6)})
    with pytest.raises(ValueError, match="not inputs"):
        jitop.onnx.load(model, shapes={"data": (2, 3, 4, 5)})


def test_unsupported_operators_listed_in_one_error():
    x = data((4, 4), F32)
    nodes = [node("NonMaxSuppression", ["x", "x"], "nms1"), node("TopK", ["x", "k"], ["v", "i"]),
             node("NonMaxSuppression", ["x", "x"], "nms2"), node("Loop", ["", ""], "l"), node("Relu", ["x"], "y")]
    model = make_model(nodes, {"x": x}, ["y"], {"k": np.array([2], I64)}, opset=13)
    with pytest.raises(jitop.onnx.UnsupportedOperatorError) as info:
        jitop.onnx.load(model)
    err = info.value
    assert set(err.ops) == {"NonMaxSuppression", "TopK", "Loop"}
    assert err.ops["NonMaxSuppression"][0] == 2 and err.ops["TopK"][0] == 1 and err.ops["Loop"][0] == 1
    message = str(err)
    for part in ("NonMaxSuppression x2", "TopK x1", "Loop x1", "3 operator type(s)", "opset 13"):
        assert part in message, message
    assert isinstance(err, NotImplementedError)


def test_unsupported_domain_named():
    x = data((4,), F32)
    custom = node("Gelu", ["x"], "y")
    custom.domain = "com.microsoft"
    model = make_model([custom], {"x": x}, ["y"])
    with pytest.raises(jitop.onnx.UnsupportedOperatorError, match="com.microsoft.Gelu"):
        jitop.onnx.load(model)


def test_unknown_attribute_named():
    x = data((4,), F32)
    model = make_model([node("Relu", ["x"], "r", foo=1), node("Softmax", ["r"], "y", axis=0, bar_baz=2.0)],
                       {"x": x}, ["y"])
    with pytest.raises(jitop.onnx.OnnxError) as info:
        jitop.onnx.load(model)
    assert "'foo'" in str(info.value) and "'bar_baz'" in str(info.value)


def test_unsupported_attribute_value_named():
    """A known attribute with a value the converter refuses names the node, the attribute and the value."""
    x = data((2, 3), F32)
    model = make_model([node("Cast", ["x"], "y", to=8)], {"x": x}, ["y"])  # 8: STRING
    with pytest.raises(jitop.onnx.OnnxError, match=r"Cast.*to=8"):
        jitop.onnx.load(model)(x)


def test_converter_error_on_first_call_is_onnx_error():
    """A node the converter refuses only once it sees the values (a Reshape to a shape computed from the data,
    found while tracing the first call) raises the converter's OnnxError, not the kernel's FallbackError."""
    x = data((2, 3), F32)
    model = make_model([node("Reshape", ["x", "s"], "y")], {"x": x, "s": np.array([3, 2], I64)}, ["y"])
    m = jitop.onnx.load(model)
    for _ in range(2):
        with pytest.raises(jitop.onnx.OnnxError, match=r"Reshape.*'shape' must be a constant"):
            m(x, np.array([3, 2], I64))


def test_model_without_inputs(tmp_path):
    """A model whose values all come from initializers (no graph inputs): its outputs are numpy's, in calls, in
    run() and from a saved .jitop file."""
    a, b = data((3,), F32), data((2, 3), F32, salt=1)
    model = make_model([node("Add", ["a", "b"], "sum"), node("Relu", ["sum"], "y")], {}, ["sum", "y"],
                       {"a": a, "b": b})
    m = jitop.onnx.load(model)
    for got, want in zip(m(), (a + b, np.maximum(a + b, 0))):
        assert got.dtype == F32 and np.array_equal(got, want)
    assert np.array_equal(m.run(["y"], {})[0], np.maximum(a + b, 0))
    m.save(str(tmp_path / "constant.jitop"))
    assert np.array_equal(jitop.onnx.load(str(tmp_path / "constant.jitop"))()[0], a + b)


@pytest.fixture(scope="module")
def two_input_model():
    """y = relu(x) + b, z = x * 2: inputs x float32 (batch, 3) and b int64 -> float (cast) (3,)."""
    x, b = data((2, 3), F32), data((3,), I64, -5, 5)
    nodes = [node("Relu", ["x"], "r"), node("Cast", ["b"], "bf", to=1), node("Add", ["r", "bf"], "y"),
             node("Mul", ["x", "two"], "z")]
    model = make_model(nodes, {"x": x, "b": b}, ["y", "z"], {"two": np.array(2.0, F32)}, opset=13,
                       shapes={"x": ["batch", 3]})
    return model, jitop.onnx.load(model), {"x": x, "b": b}


def test_run_and_calls(two_input_model):
    model, m, feeds = two_input_model
    want = reference(model, feeds)
    y, z = m.run(None, feeds)
    assert np.array_equal(y, want[0]) and np.array_equal(z, want[1])
    (only_z,) = m.run(["z"], feeds)
    assert np.array_equal(only_z, want[1])
    z2, y2 = m.run(["z", "y"], feeds)
    assert np.array_equal(y2, want[0]) and np.array_equal(z2, want[1])
    for got in (m(feeds["x"], feeds["b"]), m(x=feeds["x"], b=feeds["b"]), m(feeds["x"], b=feeds["b"])):
        assert isinstance(got, tuple) and np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    with pytest.raises(ValueError, match="'w'"):
        m.run(["w"], feeds)


def test_input_errors_name_the_input(two_input_model):
    _, m, feeds = two_input_model
    x, b = feeds["x"], feeds["b"]
    with pytest.raises(TypeError, match=r"input 'b'.*int64.*int32"):
        m(x, b.astype(np.int32))
    with pytest.raises(TypeError, match=r"input 'x'.*float32.*float64"):
        m.run(None, {"x": x.astype(np.float64), "b": b})
    with pytest.raises(ValueError, match=r"input 'x'.*\(batch, 3\).*\(2, 4\)"):
        m(np.zeros((2, 4), F32), b)
    with pytest.raises(ValueError, match=r"input 'b'.*\(3\).*\(3, 1\)"):
        m(x, b.reshape(3, 1))
    with pytest.raises(TypeError, match=r"missing.*'b'"):
        m(x)
    with pytest.raises(TypeError, match=r"missing.*'x'"):
        m.run(None, {"b": b})
    with pytest.raises(TypeError, match=r"unknown input 'bias'"):
        m.run(None, {"x": x, "b": b, "bias": b})
    with pytest.raises(TypeError, match=r"'x' given twice"):
        m(x, b, x=x)
    with pytest.raises(TypeError, match="takes 2 input"):
        m(x, b, b)


def test_save_and_load_compiled(two_input_model, tmp_path):
    """A compiled model saved to a .jitop file loads back (no onnx needed) and computes the same; the symbolic
    batch dim is kept (another batch runs too); a flipped byte anywhere after the header's magic is a ValueError."""
    model, m, feeds = two_input_model
    m.run(None, feeds)
    path = tmp_path / "m.jitop"
    m.save(str(path))
    loaded = jitop.onnx.load(str(path))
    assert loaded.kernel is None
    assert [v.name for v in loaded.inputs] == ["x", "b"] and [v.name for v in loaded.outputs] == ["y", "z"]
    for x in (feeds["x"], data((5, 3), F32, salt=5)):
        fresh = {"x": x, "b": feeds["b"]}
        for got, want in zip(loaded.run(None, fresh), m.run(None, fresh)):
            assert got.dtype == want.dtype and np.array_equal(got, want)
    assert np.array_equal(jitop.onnx.load(path.read_bytes()).run(["z"], feeds)[0], m.run(["z"], feeds)[0])

    raw = bytearray(path.read_bytes())
    for at in (len(raw) // 2, len(raw) - 1, 12):  # a blob, the last byte, the version / digest
        bad = bytearray(raw)
        bad[at] ^= 0x01
        corrupt = tmp_path / f"bad{at}.jitop"
        corrupt.write_bytes(bytes(bad))
        with pytest.raises(ValueError):
            jitop.onnx.load(str(corrupt))
    with pytest.raises(ValueError):
        jitop.onnx.load(bytes(raw[:20]) + b"JITOPMDL")


def test_save_before_compile_refused(tmp_path):
    x = data((2,), F32)
    m = jitop.onnx.load(make_model([node("Relu", ["x"], "y")], {"x": x}, ["y"]))
    with pytest.raises(ValueError, match="nothing to save"):
        m.save(str(tmp_path / "empty.jitop"))
    m.compile()
    m.save(str(tmp_path / "ok.jitop"))
    assert np.array_equal(jitop.onnx.load(str(tmp_path / "ok.jitop"))(x), np.maximum(x, 0))


@settings(max_examples=8, deadline=None, derandomize=True)
@given(st.data())
def test_elementwise_broadcasting_property(draw):
    """Any two broadcast-compatible shapes (rank 1-3, dims 0-4; rank 0 inputs: test_ops): Add/Mul/Max/Where agree with the reference exactly (one rounding each)."""
    rank = draw.draw(st.integers(1, 3))
    out = draw.draw(st.lists(st.sampled_from([0, 1, 2, 3, 4]), min_size=rank, max_size=rank))
    shapes = []
    for _ in range(2):
        r = draw.draw(st.integers(1, rank))
        shapes.append(tuple(d if draw.draw(st.booleans()) else 1 for d in out[rank - r:]))
    a, b = data(shapes[0], F32, salt=1), data(shapes[1], F32, salt=2)
    feeds = {"a": a, "b": b, "c": a > 0}
    nodes = [node("Add", ["a", "b"], "s"), node("Mul", ["a", "b"], "p"), node("Max", ["a", "b"], "m"),
             node("Where", ["c", "a", "b"], "w")]
    check(make_model(nodes, feeds, ["s", "p", "m", "w"], opset=13), feeds)


def test_symbolic_shape_arithmetic():
    """Shape values computed from a symbolic batch dim stay symbolic through Gather (a 0-d index), Mul, Div,
    Cast, Unsqueeze, Concat, Slice (to INT_MAX), Reshape, Expand of a constant and ConstantOfShape: one model,
    called at batch 4, 3 and 5, traced once, exact (data movement and one add per element)."""
    from onnx import helper
    x = data((4, 6), F32)
    consts = {"i0": np.array(0, I64), "i1": np.array(1, I64), "two": np.array(2, I64), "ax": np.array([0], I64),
              "st": np.array([-1], I64), "en": np.array([np.iinfo(np.int64).max], I64), "row": data((6,), F32, salt=3)}
    nodes = [node("Shape", ["x"], "s"), node("Gather", ["s", "i0"], "n"), node("Gather", ["s", "i1"], "m"),
             node("Mul", ["n", "two"], "n2"), node("Div", ["m", "two"], "m2"), node("Cast", ["n2"], "n2c", to=7),
             node("Unsqueeze", ["n2c", "ax"], "n2u"), node("Unsqueeze", ["m2", "ax"], "m2u"),
             node("Concat", ["n2u", "m2u"], "target", axis=0), node("Reshape", ["x", "target"], "folded"),
             node("Expand", ["row", "s"], "rows"), node("Add", ["rows", "x"], "plus"),
             node("Slice", ["s", "st", "en"], "last"), node("Unsqueeze", ["n", "ax"], "nu"),
             node("Concat", ["nu", "last"], "t2", axis=0),
             node("ConstantOfShape", ["t2"], "ones", value=helper.make_tensor("v", 1, [1], [1.0])),
             node("Reshape", ["x", "t2"], "x2"), node("Add", ["x2", "ones"], "x2p")]
    model = make_model(nodes, {"x": x}, ["folded", "plus", "x2p"], consts, opset=13, shapes={"x": ["batch", 6]})
    m = jitop.onnx.load(model)
    for batch in (4, 3, 5):
        xb = data((batch, 6), F32, salt=batch)
        for got, w in zip(m(xb), reference(model, {"x": xb})):
            assert got.dtype == w.dtype and got.shape == w.shape and np.array_equal(got, w)
    assert m.kernel.traces == 1


def test_constant_output_survives_save_and_load(tmp_path):
    """An output that depends on no input (the Shape of a fixed-shape input) is filled in outside the kernel,
    and a compiled .jitop file keeps it."""
    x = data((2, 3), F32)
    model = make_model([node("Shape", ["x"], "s"), node("Relu", ["x"], "r")], {"x": x}, ["s", "r"])
    m = jitop.onnx.load(model)
    s, r = m(x)
    assert s.dtype == np.int64 and s.tolist() == [2, 3] and np.array_equal(r, np.maximum(x, 0))
    m.save(str(tmp_path / "c.jitop"))
    s2, r2 = jitop.onnx.load(str(tmp_path / "c.jitop"))(x)
    assert s2.tolist() == [2, 3] and np.array_equal(r2, r)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["light_squeezenet"])
def test_light_models_shipped_with_onnx(name):
    """A whole model from the onnx wheel (opset 9, fire modules joined by Concat), against the reference
    evaluator. Its weights are ConstantOfShape fills ("light"), folded at load. (light_shufflenet, densenet121,
    inception v1/v2, resnet50, vgg19, alexnet and zfnet load and match onnxruntime too: too slow to compile
    for every CI run.)

    Its logits are ~7e9 and nearly equal, so one float32 ulp (512) between two summation orders moves a class's
    softmax from 1/968 to 0: the logits are compared (relative error of float32 sums), and the final Softmax is
    checked against jitop's own logits."""
    import os
    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", name + ".onnx")
    model = onnx.load(path)
    last = model.graph.node[-1]
    assert last.op_type == "Softmax"
    whole = jitop.onnx.load(path)
    del model.graph.output[:]
    model.graph.output.append(onnx.helper.make_tensor_value_info(last.input[0], onnx.TensorProto.FLOAT, None))
    model.graph.node.remove(last)
    (inp,) = whole.inputs
    x = data(tuple(inp.shape), F32)
    logits = jitop.onnx.load(model)(x)
    # the reference evaluator's opset-9 Softmax takes the last axis (not the 2-D view of the spec): it runs the
    # model up to the final Softmax's input
    want_logits = reference(model, {inp.name: x})[0]
    # float32 convolutions chained (K up to a few thousand terms per layer): a loose relative bound
    assert logits.shape == want_logits.shape and logits.dtype == want_logits.dtype
    assert np.allclose(logits, want_logits, rtol=1e-4, atol=1e-5 * float(np.abs(want_logits).max()))
    flat = logits.reshape(logits.shape[0], -1).astype(np.float64)
    e = np.exp(flat - flat.max(axis=1, keepdims=True))
    want = (e / e.sum(axis=1, keepdims=True)).reshape(logits.shape).astype(np.float32)
    got = whole(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.allclose(got, want, rtol=1e-5, atol=1e-7)
