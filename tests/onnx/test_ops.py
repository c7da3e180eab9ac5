"""Every operator of jitop.onnx's table the importer promises, checked against onnx.reference.ReferenceEvaluator
(the spec) over its attributes, odd shapes (scalars, 1, primes, 0-size dims, broadcasting), dtypes and the
opset versions where its semantics changed.

Attribute variants of one op share ONE model (a node per variant, one output each): one compile per test.
Tolerances are derived in onnx_checks (exact, ulp(n), dot(K)); each test says why its bound holds.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import jitop.onnx
from onnx_checks import EXACT, check, check_op, data, dot, make_model, node, reference, tensor_type, ulp, variants

F32, F64, I32, I64 = np.float32, np.float64, np.int32, np.int64
FLOATS = [F32, F64]
EPS32 = float(np.finfo(F32).eps)


def ops_model(ops: dict[str, dict], x: np.ndarray, opset: int = 17, consts: dict | None = None) -> tuple:
    """One node per (output name -> node spec) over input 'x' (and `consts`): the model and its outputs' names;
    a spec is the node's attributes plus '_op' (default: the name up to ':') and '_inputs' (default: x)."""
    nodes = [node(spec.pop("_op", name.split(":")[0]), spec.pop("_inputs", ["x"]), name, **spec)
             for name, spec in ((k, dict(v)) for k, v in ops.items())]
    return make_model(nodes, {"x": x}, list(ops), consts, opset=opset), list(ops)


# ---- elementwise unary ---------------------------------------------------------------------------------------

SHAPES = [(), (1,), (2, 0, 3), (3, 5, 7)]


def _unary_x(shape, dtype):
    x = data(shape, dtype, -4, 4)
    if x.ndim == 1 and x.size == 1:
        return x
    flat = x.reshape(-1)
    specials = np.array([0.0, -0.0, 1.0, -1.0, 1e-3, 20.0, -20.0, 88.0, -90.0], dtype)
    flat[:min(flat.size, specials.size)] = specials[:flat.size]
    return x


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_unary_float(shape, dtype):
    """Each transcendental is within a few ulp of the real result on both sides (jitop's vector libm and
    numpy's), so the two differ by at most the sum: 4 ulp; data movement, max/min and sign flips are exact;
    1/x is one correctly rounded division. The reference's Erf rounds through float32 (np.vectorize(math.erf,
    otypes='f')): the float64 expectation is math.erf itself."""
    x = _unary_x(shape, dtype)
    ops = {"Relu": {}, "Neg": {}, "Identity": {}, "Reciprocal": {}, "Sqrt": {}, "Exp": {}, "Log": {}, "Tanh": {},
           "Erf": {}, "Sigmoid": {}, "LeakyRelu": {}, "LeakyRelu:a": {"alpha": 0.3},
           "Dropout": {}, "Dropout:ratio": {"_inputs": ["x", "ratio"]}}
    model, names = ops_model(ops, x, opset=17, consts={"ratio": np.array(0.25, F32)})
    tol = {n: ulp(4) for n in ("Exp", "Log", "Tanh", "Erf", "Sigmoid")}  # sqrt: correctly rounded (IEEE)
    erf = np.vectorize(math.erf, otypes=[dtype])(x).astype(dtype).reshape(x.shape)
    check(model, {"x": x}, tol, want={"Erf": erf})


def test_dropout_inference():
    """Dropout at inference is the identity; its mask output (opset 12: with ratio and training_mode=False
    inputs; opset 10: the ratio attribute) is all True, AND-ed here with a bool input so that the output
    depends on the inputs; training_mode=True is refused by name."""
    x, keep = data((3, 5), F32), data((3, 5), bool)
    feeds = {"x": x, "keep": keep}
    consts = {"ratio": np.array(0.5, F32), "train": np.array(False)}
    nodes = [node("Dropout", ["x", "ratio", "train"], ["y", "mask"]), node("And", ["mask", "keep"], "m")]
    check(make_model(nodes, feeds, ["y", "m"], consts, opset=12), feeds)
    nodes = [node("Dropout", ["x"], ["y", "mask"], ratio=0.3), node("And", ["mask", "keep"], "m")]
    check(make_model(nodes, feeds, ["y", "m"], opset=10), feeds)
    consts["train"] = np.array(True)
    model = make_model([node("Dropout", ["x", "ratio", "train"], ["y"])], {"x": x}, ["y"], consts, opset=12)
    with pytest.raises(jitop.onnx.OnnxError, match="training_mode"):
        jitop.onnx.load(model)(x)


@pytest.mark.parametrize("dtype", FLOATS)
def test_hard_sigmoid_and_swish(dtype):
    """alpha * x + beta, clipped, rounded once or twice (FMA or not): within eps * (|alpha x| + |beta|) of the
    reference; HardSwish multiplies that by x (one more rounding). Float attributes are float32 in ONNX, their
    defaults too: a float64 model computes with alpha = float32(0.2) (and HardSwish's float32(1/6))."""
    x = _unary_x((4, 11), dtype)
    eps = np.finfo(dtype).eps
    ops = {"HardSigmoid": {}, "HardSigmoid:ab": {"alpha": 0.5, "beta": 0.25}, "HardSwish": {}}
    model, _ = ops_model(ops, x)
    x64 = np.abs(x.astype(F64))
    tol = {"HardSigmoid": eps * (0.2 * x64 + 0.5), "HardSigmoid:ab": eps * (0.5 * x64 + 0.25),
           "HardSwish": 2 * eps * x64 * (x64 / 6 + 0.5)}
    check(model, {"x": x}, tol)


@pytest.mark.parametrize("dtype", [I32, I64])
def test_unary_int(dtype):
    x = data((3, 7), dtype, -50, 50)
    model, _ = ops_model({"Relu": {}, "Neg": {}, "Identity": {}}, x)
    check(model, {"x": x})


def test_not():
    x = data((2, 0, 3), bool), data((5, 3), bool)
    for v in x:
        check_op("Not", {"x": v})


@pytest.mark.parametrize("dtype", FLOATS)
def test_softplus_extremes(dtype):
    """Softplus is log(1 + exp(x)): exp(x) must not overflow for large x (the result is x) nor 1 + exp(x) round
    away the result for very negative x (it is exp(x)). The reference evaluator computes log(exp(x) + 1), which
    does both: the expectation is numpy's logaddexp(x, 0) in float64. exp and log1p within a few ulp: ulp(4)."""
    x = np.array([-np.inf, -120.0, -30.0, -20.0, -1.0, 0.0, 0.5, 20.0, 89.0, 100.0, 800.0, np.inf, np.nan], dtype)
    with np.errstate(invalid="ignore"):
        want = np.logaddexp(x.astype(F64), 0).astype(dtype)
    check_op("Softplus", {"x": x}, ulp(4), want=[want])


@pytest.mark.parametrize("dtype", [F32, F64, I32, I64])
def test_clip(dtype):
    """Clip with min and max inputs, one of them omitted (''), both omitted, a min above max (all max), and
    opset 6's attributes; for every numeric type (opset 12+)."""
    x = data((3, 1, 5), dtype, -10, 10)
    lo, hi = np.array(-2, dtype), np.array(3, dtype)
    cases = {"both": ["x", "lo", "hi"], "min": ["x", "lo"], "max": ["x", "", "hi"], "none": ["x"],
             "crossed": ["x", "hi", "lo"]}
    nodes = [node("Clip", ins, name) for name, ins in cases.items()]
    model = make_model(nodes, {"x": x}, list(cases), {"lo": lo, "hi": hi}, opset=13)
    check(model, {"x": x})
    if dtype == F32:
        nodes = [node("Clip", ["x"], "a", min=-1.5, max=2.0), node("Clip", ["x"], "b", max=0.5),
                 node("Clip", ["x"], "c")]
        check(make_model(nodes, {"x": x}, ["a", "b", "c"], opset=6), {"x": x})


def test_clip_bounds_as_inputs():
    """Clip's min and max may be graph inputs (traced scalars), not only constants."""
    x = data((4, 6), F32)
    feeds = {"x": x, "lo": np.array(-1.0, F32), "hi": np.array(0.5, F32)}
    check_op("Clip", feeds, opset=13)


# ---- elementwise binary --------------------------------------------------------------------------------------

BROADCASTS = [((3, 4), (3, 4)), ((2, 3, 5), (5,)), ((1, 7), (3, 1)), ((), (2, 3)), ((4, 1, 3), (2, 1)),
              ((0, 3), (1, 3))]


def _nonzero(b):
    return np.where(b == 0, 1, b).astype(b.dtype)


@pytest.mark.parametrize("dtype", [F32, F64, I32, I64])
@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_arithmetic(shapes, dtype):
    """Add, Sub, Mul, Div: one IEEE rounding each, the same on both sides (exact); integer Div truncates toward
    zero (ONNX, C), not toward -inf (numpy's //), so negative operands are part of the data; Equal/Less/Greater
    and Min/Max are exact; Sum/Min/Max take two operands here (variadic below)."""
    a = data(shapes[0], dtype, -20, 20, salt=1)
    b = _nonzero(data(shapes[1], dtype, -9, 9, salt=2))
    ops = ["Add", "Sub", "Mul", "Div", "Equal", "Less", "Greater", "Max", "Min"] + (["Sum"] if dtype in FLOATS else [])
    nodes = [node(o, ["a", "b"], o) for o in ops]
    model = make_model(nodes, {"a": a, "b": b}, ops)
    check(model, {"a": a, "b": b})


def test_int_div_truncates():
    a = np.array([7, -7, 7, -7, 0, 1, -1, 9, -9], I64)
    b = np.array([2, 2, -2, -2, 3, -3, 3, 3, -3], I64)
    model = make_model([node("Div", ["a", "b"])], {"a": a, "b": b}, ["y"])
    m = check(model, {"a": a, "b": b})
    assert m(a, b).tolist() == [3, -3, -3, 3, 0, 0, 0, 3, 3]


@pytest.mark.parametrize("dtype", FLOATS)
def test_pow(dtype):
    """x ** y for x > 0 and any y: jitop's pow and numpy's are each within ~2 ulp of the real result, exp(y log x)
    amplifies nothing beyond that when both are good; x ** 2 (x * x), x ** 0.5 (sqrt) and x ** 3 (a constant
    exponent) are the rewrites of the converter: x * x is exact, sqrt correctly rounded; an int64 exponent
    (T1 differs from T) and a negative base with integer exponents."""
    x = data((3, 5), dtype, 0.1, 4, salt=3)
    y = data((5,), dtype, -3, 3, salt=4)
    neg = data((3, 5), dtype, -3, 3, salt=5)
    k = np.array([0, 1, 2, 3, -1], I64)
    consts = {"two": np.array(2.0, dtype), "half": np.array(0.5, dtype), "three": np.array(3.0, dtype), "k": k}
    spec = {"xy": ["x", "y"], "x2": ["x", "two"], "sqrt": ["x", "half"], "x3": ["x", "three"], "nk": ["neg", "k"],
            "n2": ["neg", "two"]}
    model = make_model([node("Pow", ins, name) for name, ins in spec.items()], {"x": x, "y": y, "neg": neg},
                       list(spec), consts, opset=15)
    check(model, {"x": x, "y": y, "neg": neg}, {"xy": ulp(4), "x3": ulp(4), "nk": ulp(4), "sqrt": ulp(1)})


@pytest.mark.parametrize("dtype", [I32, I64])
def test_pow_int(dtype):
    x = data((2, 6), dtype, -5, 6)
    e = np.array([0, 1, 2, 3, 4, 5], dtype)
    check_op("Pow", {"x": x, "e": e}, opset=15)


def test_pow_half_edge_cases():
    """x ** 0.5 with a constant exponent is computed as sqrt, but with pow's edge cases (C's pow, numpy's
    np.power, onnxruntime): pow(-inf, 0.5) = inf where sqrt gives nan, pow(-0.0, 0.5) = +0.0 where sqrt gives
    -0.0; a negative base is nan."""
    x = np.array([-np.inf, -0.0, 0.0, 4.0, 2.0, -4.0, np.inf, np.nan], F32)
    want = np.array([np.inf, 0.0, 0.0, 2.0, np.sqrt(F32(2.0)), np.nan, np.inf, np.nan], F32)
    m = check_op("Pow", {"x": x}, consts={"half": np.array(0.5, F32)}, want=[want])
    assert not np.signbit(m(x)[1])


@pytest.mark.parametrize("dtype", [I32, I64])
def test_pow_int_negative_exponent(dtype):
    """An integer base to a negative integer power is the real power truncated toward zero (the spec's T is the
    base's integer type; onnxruntime): 1 for base 1, 1 or -1 for base -1 (even or odd exponent), else 0; 0 for
    base 0 too (a division by zero). The exponent as an input, a constant array and a constant scalar."""
    x = np.array([1, 2, -1, 3, 0, -1, -2, 5, 7, -3], dtype)
    e = np.array([-1, -1, -2, -3, -1, -3, -2, 0, 2, 3], dtype)
    feeds = {"x": x, "e": e}
    nodes = [node("Pow", ["x", "e"], "input"), node("Pow", ["x", "ce"], "const"), node("Pow", ["x", "m1"], "scalar")]
    consts = {"ce": e.astype(I64), "m1": np.array(-1, I64)}
    powers = np.array([1, 0, 1, 0, 0, -1, 0, 1, 49, -27], dtype)
    want = [powers, powers, np.array([1, 0, -1, 0, 0, -1, 0, 0, 0, 0], dtype)]  # (numpy's power raises)
    check(make_model(nodes, feeds, ["input", "const", "scalar"], consts, opset=15), feeds, want=want)


@pytest.mark.parametrize("n_inputs", [1, 2, 3])
@pytest.mark.parametrize("dtype", [F32, I32])
def test_variadic(n_inputs, dtype):
    """Sum, Min and Max over 1-3 inputs that broadcast against each other (floats: Sum's two roundings happen in
    the same order, left to right, on both sides)."""
    shapes = [(2, 1, 4), (3, 1), (4,)][:n_inputs]
    feeds = {f"x{k}": data(s, dtype, -10, 10, salt=k) for k, s in enumerate(shapes)}
    ops = ["Min", "Max"] + (["Sum"] if dtype == F32 else [])
    model = make_model([node(o, list(feeds), o) for o in ops], feeds, ops, opset=13)
    check(model, feeds)


def test_where():
    """Where broadcasts three ways; float, int and bool branches."""
    c = data((2, 1, 5), bool)
    feeds = {"c": c, "x": data((3, 5), F32), "y": data((1,), F32), "i": data((5,), I64, -9, 9),
             "j": data((3, 1), I64, -9, 9), "p": data((3, 5), bool), "q": data((), bool)}
    spec = {"f": ["c", "x", "y"], "i": ["c", "i", "j"], "b": ["c", "p", "q"]}
    model = make_model([node("Where", ins, "w" + k) for k, ins in spec.items()], feeds, ["w" + k for k in spec])
    check(model, feeds)


def test_compare_bool_and_equal():
    a, b = data((4, 3), bool, salt=1), data((3,), bool, salt=2)
    model = make_model([node("Equal", ["a", "b"], "e")], {"a": a, "b": b}, ["e"], opset=19)
    check(model, {"a": a, "b": b})


@pytest.mark.parametrize("src,to", [(F32, I32), (F32, I64), (F64, F32), (I64, F32), (I32, I64), (F32, bool),
                                    (bool, F32), (I64, bool), (bool, I32), (F32, F64), (I64, I32)], ids=str)
def test_cast(src, to):
    """Cast float -> int truncates toward zero (values in range); float64 -> float32 rounds to nearest; anything
    -> bool is != 0."""
    x = data((3, 7), src, -100, 100, salt=9)
    if np.dtype(src).kind == "f":
        x.reshape(-1)[:4] = [0.5, -0.5, -2.75, 0.0]
    check_op("Cast", {"x": x}, to=tensor_type(to), opset=13)


# ---- shapes and data movement (all exact) --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, I64, bool])
def test_flatten(dtype):
    x = data((2, 3, 5), dtype)
    variants("Flatten", {"x": x}, [{"axis": a} for a in (0, 1, 2, 3, -1, -3)], opset=13)


def test_flatten_zero_size():
    """The reference evaluator cannot flatten a 0-size array (its reshape to (prod, -1) is ambiguous): the
    expected shapes are the spec's (prod(dims before axis), prod(dims from axis))."""
    x = data((0, 3, 4), F32)
    model = make_model([node("Flatten", ["x"], "a"), node("Flatten", ["x"], "b", axis=0),
                        node("Flatten", ["x"], "c", axis=-1)], {"x": x}, ["a", "b", "c"], opset=11)
    check(model, {"x": x}, want=[x.reshape(0, 12), x.reshape(1, 0), x.reshape(0, 4)])


@pytest.mark.parametrize("dtype", [F32, I32, bool])
def test_reshape(dtype):
    """Reshape: 0 copies the input's dim (opset 5+), -1 is inferred; allowzero=1 (opset 14) takes 0 literally."""
    x = data((2, 3, 5), dtype)
    targets = {"a": [0, -1], "b": [-1], "c": [5, 0, 2], "d": [0, 0, 5, 1], "e": [1, 30, 1], "f": [3, -1, 1, 2]}
    consts = {f"s{k}": np.array(v, I64) for k, v in targets.items()}
    nodes = [node("Reshape", ["x", f"s{k}"], k) for k in targets]
    check(make_model(nodes, {"x": x}, list(targets), consts, opset=14), {"x": x})


def test_reshape_allowzero():
    x = data((0, 4), F32)
    consts = {"z": np.array([4, 0], I64), "k": np.array([0, 4], I64), "m": np.array([2, 0, 4], I64)}
    nodes = [node("Reshape", ["x", "z"], "z", allowzero=1), node("Reshape", ["x", "k"], "k"),
             node("Reshape", ["x", "m"], "m", allowzero=1)]
    check(make_model(nodes, {"x": x}, ["z", "k", "m"], consts, opset=14), {"x": x})


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 7, 1, 2), (3, 0, 2)], ids=str)
def test_transpose(shape):
    x = data(shape, F32)
    r = len(shape)
    perms = [{}, {"perm": list(range(r))}, {"perm": [r - 1] + list(range(r - 1))}, {"perm": [1, 0] + list(range(2, r))}]
    variants("Transpose", {"x": x}, perms)
    variants("Transpose", {"x": x.astype(I64)}, perms[:1])


def test_squeeze_unsqueeze_opset11():
    """Opset 11: axes are an attribute (negative allowed); Squeeze without axes drops every 1."""
    x = data((1, 3, 1, 5, 1), F32)
    variants("Squeeze", {"x": x}, [{}, {"axes": [0]}, {"axes": [-1, 2]}, {"axes": [0, 2, 4]}], opset=11)
    variants("Unsqueeze", {"x": x[0, :, 0]}, [{"axes": [0]}, {"axes": [-1]}, {"axes": [3, 0]}, {"axes": [1, -1, 2]}],
             opset=11)


@pytest.mark.parametrize("dtype", [F32, I64, bool])
def test_squeeze_unsqueeze_opset13(dtype):
    """Opset 13: axes are an input (Squeeze's optional: none squeezes every 1)."""
    x = data((1, 3, 1, 5), dtype)
    consts = {"a0": np.array([0], I64), "a1": np.array([-2, 0], I64), "u0": np.array([0, 4], I64),
              "u1": np.array([-1], I64), "u2": np.array([2, -6, 3], I64)}
    spec = {"s": ("Squeeze", ["x"]), "s0": ("Squeeze", ["x", "a0"]), "s1": ("Squeeze", ["x", "a1"]),
            "u0": ("Unsqueeze", ["x", "u0"]), "u1": ("Unsqueeze", ["x", "u1"]), "u2": ("Unsqueeze", ["x", "u2"])}
    nodes = [node(o, ins, name) for name, (o, ins) in spec.items()]
    check(make_model(nodes, {"x": x}, list(spec), consts, opset=13), {"x": x})


def test_unsqueeze_scalar_and_empty():
    """Unsqueeze of a constant scalar (the shape-subgraph pattern) and of a 0-size tensor."""
    feeds = {"x": data((0, 3), F32), "zero": np.zeros(1, I64)}
    consts = {"k": np.array(7, I64), "ax": np.array([0], I64), "ax2": np.array([1, 3], I64)}
    nodes = [node("Unsqueeze", ["k", "ax"], "k1"), node("Add", ["k1", "zero"], "k1+0"),
             node("Unsqueeze", ["x", "ax2"], "e")]
    check(make_model(nodes, feeds, ["k1+0", "e"], consts, opset=13), feeds)


@pytest.mark.parametrize("dtype", [F32, I32, bool])
def test_concat(dtype):
    a, b, c = data((2, 3, 1), dtype, salt=1), data((2, 3, 4), dtype, salt=2), data((2, 3, 0), dtype)
    d = data((1, 3, 5), dtype, salt=3)
    feeds = {"a": a, "b": b, "c": c, "d": d}
    nodes = [node("Concat", ["a", "b", "c"], "last", axis=-1), node("Concat", ["a", "c", "b", "a"], "last2", axis=2),
             node("Concat", ["b", "b"], "first", axis=0), node("Concat", ["d"], "one", axis=1)]
    check(make_model(nodes, feeds, ["last", "last2", "first", "one"], opset=13), feeds)


def test_split():
    """Split: opset 11 sizes as attribute, 13 as input, default even parts; 18 num_outputs with an uneven last
    part (ceil(dim / n) each, the rest last); negative axis; a 0-size part."""
    x = data((4, 7, 3), F32)
    cases11 = [{"axis": 1, "split": [2, 5], "_outputs": 2}, {"axis": 0, "_outputs": 2},
               {"axis": -1, "split": [1, 0, 2], "_outputs": 3}]
    variants("Split", {"x": x}, cases11, opset=11)
    consts = {"s": np.array([3, 1, 3], I64), "t": np.array([4], I64)}
    cases13 = [{"_inputs": ["x", "s"], "axis": 1, "_outputs": 3}, {"_inputs": ["x", "t"], "axis": 0, "_outputs": 1},
               {"_inputs": ["x"], "axis": -1, "_outputs": 3}]
    variants("Split", {"x": x}, cases13, opset=13, consts=consts)
    cases18 = [{"_inputs": ["x"], "axis": 1, "num_outputs": 3, "_outputs": 3},
               {"_inputs": ["x"], "axis": 1, "num_outputs": 2, "_outputs": 2},
               {"_inputs": ["x"], "axis": 0, "num_outputs": 4, "_outputs": 4},
               {"_inputs": ["x", "s"], "axis": -2, "_outputs": 3}]
    variants("Split", {"x": x}, cases18, opset=18, consts=consts)


INT_MAX, INT_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


def test_slice():
    """Slice (opset 10+: inputs): negative starts/ends, ends past the dim and INT_MAX, negative steps with
    INT_MIN ends (down to the first element), axes omitted or negative, steps omitted, an empty result."""
    x = data((5, 7, 4), F32)
    spec = {
        "basic": ([1, 2], [4, 6], None, None),
        "neg": ([-3], [-1], [1], None),
        "intmax": ([2, 1], [INT_MAX, INT_MAX], [0, 2], None),
        "rev": ([-1], [INT_MIN], [1], [-1]),
        "rev2": ([4, 6], [0, -10], [0, 1], [-2, -3]),
        "step": ([0, 1], [INT_MAX, 7], [-1, 1], [2, 3]),
        "clamp": ([-100], [100], [2], None),
        "empty": ([3], [1], [0], None),
        "empty_rev": ([1], [3], [0], [-1]),
    }
    consts, nodes = {}, []
    for name, (st, en, ax, sp) in spec.items():
        ins = ["x"]
        for part, v in (("st", st), ("en", en), ("ax", ax), ("sp", sp)):
            if v is None:
                ins.append("")
                continue
            consts[f"{name}_{part}"] = np.array(v, I64)
            ins.append(f"{name}_{part}")
        while ins[-1] == "":
            ins.pop()
        nodes.append(node("Slice", ins, name))
    check(make_model(nodes, {"x": x}, list(spec), consts, opset=13), {"x": x})


def test_slice_opset1_attributes():
    x = data((5, 7), I64)
    variants("Slice", {"x": x}, [{"starts": [1], "ends": [3]},
                                 {"starts": [0, -3], "ends": [INT_MAX, -1], "axes": [0, 1]},
                                 {"starts": [2], "ends": [100], "axes": [-1]}], opset=1)


def _spec_slice(x, start, end, step):
    """Slice-13 on a 1-D x as the spec words it: a negative start/end plus the dim, then start clamped to
    [0, dim] ([0, dim - 1] for a negative step) and end to [0, dim] ([-1, dim - 1])."""
    dim = len(x)
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return x[list(range(start, end, step))]


def test_slice_clamps_as_the_spec():
    """Where the spec's clamping differs from Python's slice: a negative step with a start below -dim starts at
    0 (Python's takes nothing), on a fixed dim and on a symbolic one (traced once per side of the clamp), plus
    the other clamps (a start past the end, ends beyond either side, INT_MIN/INT_MAX ends)."""
    spec = {"below": (-7, -10, -1), "below2": (-9, INT_MIN, -2), "past": (10, -7, -1), "from_neg": (-7, 3, 1),
            "ends": (-100, 100, 2), "rev_all": (INT_MAX, INT_MIN, -1), "at_end": (-1, -6, -1), "short": (-7, -6, -1)}
    consts, nodes = {}, []
    for name, parts in spec.items():
        for part, v in zip(("st", "en", "sp"), parts):
            consts[f"{name}_{part}"] = np.array([v], I64)
        nodes.append(node("Slice", ["x", f"{name}_st", f"{name}_en", "ax", f"{name}_sp"], name))
    consts["ax"] = np.array([0], I64)
    x = data((5,), F32)
    model = make_model(nodes, {"x": x}, list(spec), consts, opset=13)
    check(model, {"x": x}, want={name: _spec_slice(x, *parts) for name, parts in spec.items()})
    m = jitop.onnx.load(make_model(nodes, {"x": x}, list(spec), consts, opset=13, shapes={"x": ["n"]}))
    for n in (5, 8, 3, 12):
        xn = data((n,), F32, salt=n)
        for name, got in zip(spec, m.run(None, {"x": xn})):
            assert np.array_equal(got, _spec_slice(xn, *spec[name])), (n, name, got)


@pytest.mark.parametrize("dtype", [F32, I64])
def test_gather_constant_indices(dtype):
    """Gather with constant indices on traced data: negative indices, a 0-d index (drops the axis), 2-D indices,
    axis 1 and -1, int32 indices."""
    x = data((5, 6, 3), dtype)
    consts = {"i": np.array([0, -1, 2, 2], I64), "s": np.array(-2, I64), "m": np.array([[1, 0], [4, -5]], I64),
              "i32": np.array([2, 0], I32), "z": np.array(0, I64), "e": np.zeros((0,), I64)}
    spec = {"g": ("i", 0), "scalar": ("s", 0), "mat": ("m", 1), "i32": ("i32", -1), "z1": ("z", 1), "s2": ("s", 2),
            "empty": ("e", 1)}
    nodes = [node("Gather", ["x", idx], name, axis=axis) for name, (idx, axis) in spec.items()]
    check(make_model(nodes, {"x": x}, list(spec), consts, opset=13), {"x": x})


def test_gather_embedding_lookup():
    """Gather with the indices a graph INPUT (int64): an embedding lookup, token ids of shape (batch, seq) into a
    (vocab, dim) table; negative ids count from the end."""
    table = data((11, 4), F32)
    ids = np.array([[0, 3, 10, -1, 5], [7, 7, 1, -11, 2]], I64)
    check_op("Gather", {"ids": ids}, consts={"table": table}, input_names=["table", "ids"], opset=13)
    check_op("Gather", {"ids": ids[:, 1:3]}, consts={"table": table}, input_names=["table", "ids"], opset=13, axis=0)
    check_op("Gather", {"x": table, "ids": np.array([3, 0, 3], I64)}, axis=1, opset=13)


@pytest.mark.parametrize("dtype", [F32, I32, bool])
def test_expand(dtype):
    """Expand broadcasts both ways: the target may be shorter than the input or have 1 where the input does not."""
    x = data((3, 1), dtype)
    targets = {"a": [2, 3, 6], "b": [3, 1], "c": [1], "d": [4, 1, 1, 5], "e": [0, 3, 2]}
    consts = {f"t{k}": np.array(v, I64) for k, v in targets.items()}
    nodes = [node("Expand", ["x", f"t{k}"], k) for k in targets]
    check(make_model(nodes, {"x": x}, list(targets), consts, opset=13), {"x": x})


@pytest.mark.parametrize("dtype", [F32, I64, bool])
def test_tile(dtype):
    x = data((2, 1, 3), dtype)
    reps = {"a": [1, 1, 1], "b": [2, 3, 1], "c": [1, 5, 2], "d": [3, 1, 0]}
    consts = {f"r{k}": np.array(v, I64) for k, v in reps.items()}
    nodes = [node("Tile", ["x", f"r{k}"], k) for k in reps]
    check(make_model(nodes, {"x": x}, list(reps), consts, opset=13), {"x": x})


def test_shape_and_constants():
    """Shape (with start/end, opset 15), Constant in each of its forms, ConstantOfShape (default float32 zeros,
    an int64 value, a 0 dim): values known while tracing, each added to a zero graph input (zi: int64, zf:
    float32) so that every output depends on the inputs; and mixed with the data (x + Constant,
    ConstantOfShape(Shape(x)) + x)."""
    from onnx import helper, numpy_helper
    x = data((2, 3, 5), F32)
    nodes = [node("Shape", ["x"], "shape"), node("Shape", ["x"], "tail", start=1),
             node("Shape", ["x"], "mid", start=-2, end=-1),
             node("Constant", [], "c_t", value=numpy_helper.from_array(np.arange(6, dtype=F32).reshape(2, 3))),
             node("Constant", [], "c_f", value_float=1.5), node("Constant", [], "c_fs", value_floats=[1.0, -2.5]),
             node("Constant", [], "c_i", value_int=-4), node("Constant", [], "c_is", value_ints=[3, 1, 4]),
             node("ConstantOfShape", ["shape"], "zeros"),
             node("ConstantOfShape", ["c_is"], "sevens", value=helper.make_tensor("v", 7, [1], [7])),
             node("ConstantOfShape", ["e_shape"], "empty"),
             node("Constant", [], "c_row", value=numpy_helper.from_array(np.arange(5, dtype=F32))),
             node("Add", ["x", "c_row"], "plus"),
             node("ConstantOfShape", ["shape"], "ones", value=helper.make_tensor("v", 1, [1], [1.0])),
             node("Add", ["x", "ones"], "plus1")]
    consts = ["shape", "tail", "mid", "c_t", "c_f", "c_fs", "c_i", "c_is", "zeros", "sevens", "empty"]
    ints = {"shape", "tail", "mid", "c_i", "c_is", "sevens"}
    nodes += [node("Add", [c, "zi" if c in ints else "zf"], c + "+0") for c in consts]
    feeds = {"x": x, "zi": np.zeros(1, I64), "zf": np.zeros(1, F32)}
    model = make_model(nodes, feeds, [c + "+0" for c in consts] + ["plus", "plus1"], {"e_shape": np.array([2, 0], I64)},
                       opset=15)
    check(model, feeds)


def test_constant_outputs():
    x = data((2, 3), F32)
    model = make_model([node("Shape", ["x"], "s"), node("Relu", ["x"], "r")], {"x": x}, ["s", "r"])
    check(model, {"x": x})


# ---- reductions and normalisations ---------------------------------------------------------------------------

def _reduce_model(op_type, x, opset, cases):
    """One node per case over x: a case is (name, axes or None, keepdims, noop_with_empty_axes); axes go in as an
    attribute before the op's axes-input opset (ReduceSum 13, the others 18), as an initializer from it."""
    since = 13 if op_type == "ReduceSum" else 18
    nodes, consts = [], {}
    for name, axes, keep, noop in cases:
        attrs = {"keepdims": keep}
        if opset >= since:
            attrs["noop_with_empty_axes"] = noop
        ins = ["x"]
        if axes is not None and opset < since:
            attrs["axes"] = axes
        elif axes is not None:
            consts[name + "_axes"] = np.array(axes, I64)
            ins.append(name + "_axes")
        nodes.append(node(op_type, ins, name, **attrs))
    return make_model(nodes, {"x": x}, [c[0] for c in cases], consts, opset)


REDUCE_CASES = [("all", None, 1, 0), ("all0", None, 0, 0), ("a1", [1], 1, 0), ("a1k0", [1], 0, 0),
                ("neg", [-1, 0], 0, 0), ("neg1", [-2], 1, 0)]
NOOP_CASES = [("noop", [], 1, 1), ("empty_all", [], 0, 0)]


@pytest.mark.parametrize("op_type,opset", [("ReduceSum", 11), ("ReduceSum", 13), ("ReduceMean", 13),
                                           ("ReduceMean", 18), ("ReduceMax", 13), ("ReduceMax", 18)])
@pytest.mark.parametrize("dtype", [F32, F64, I32, I64])
def test_reduce(op_type, opset, dtype):
    """keepdims 0/1, negative axes, all axes (none given) and, where axes are an input, an empty axes tensor
    with noop_with_empty_axes 1 (identity) and 0 (reduce all). Sums of K terms in another order: dot(K) (a mean
    adds one division: 1 more ulp); max is exact; an integer mean truncates toward zero (numpy's mean in the
    input's dtype, the reference's)."""
    x = data((3, 5, 7), dtype, -10, 10)
    since = 13 if op_type == "ReduceSum" else 18
    cases = REDUCE_CASES + (NOOP_CASES if opset >= since else [])
    model = _reduce_model(op_type, x, opset, cases)
    k = {"all": 105, "all0": 105, "a1": 5, "a1k0": 5, "neg": 21, "neg1": 5, "noop": 1, "empty_all": 105}
    tol = EXACT if op_type == "ReduceMax" or dtype in (I32, I64) else {c[0]: dot(k[c[0]], dtype) for c in cases}
    check(model, {"x": x}, tol)


def test_reduce_zero_size():
    """A 0-size dim that is not reduced keeps the result empty; a sum over a 0-size axis is 0."""
    x = data((0, 4, 3), F32)
    model = _reduce_model("ReduceSum", x, 13, [("keep_empty", [1], 1, 0), ("over_empty", [0], 0, 0)])
    check(model, {"x": x})
    check(_reduce_model("ReduceMax", x, 18, [("m", [2], 0, 0)]), {"x": x})


@pytest.mark.parametrize("dtype", [F32, I32])
def test_reduce_max_min_over_zero_size_axis(dtype):
    """ReduceMax (ReduceMin) over no elements is the dtype's lowest (highest) value, -inf (inf) for floats (the
    spec; numpy's max raises): over a 0-size axis, with keepdims 0 and 1, and over all axes."""
    x = data((2, 0, 3), dtype)
    low, high = (-np.inf, np.inf) if dtype == F32 else (np.iinfo(dtype).min, np.iinfo(dtype).max)
    cases = [("a1", [1], 1, 0), ("a1k0", [1], 0, 0), ("all", None, 0, 0)]
    shapes = {"a1": (2, 1, 3), "a1k0": (2, 3), "all": ()}
    for op_type, fill in (("ReduceMax", low), ("ReduceMin", high)):
        model = _reduce_model(op_type, x, 18, cases)
        check(model, {"x": x}, want=[np.full(shapes[c[0]], fill, dtype) for c in cases])


@pytest.mark.parametrize("dtype", [F32, I32])
def test_reduce_composite_noop(dtype):
    """noop_with_empty_axes=1 with no axes (omitted or empty) reduces over no axes, but the composite reductions
    still perform their elementwise steps (the spec): ReduceSumSquare gives x * x, ReduceL1 |x|, ReduceL2
    sqrt(x * x) = |x| (exact: the root of a correctly rounded square); ReduceSum and ReduceMax x itself."""
    x = data((3, 4), dtype, -5, 5)
    x[0, :3] = [-3, 0, 2]
    want = {"ReduceSumSquare": x * x, "ReduceL1": np.abs(x), "ReduceL2": np.abs(x), "ReduceSum": x,
            "ReduceMax": x}
    for op_type, w in want.items():
        model = _reduce_model(op_type, x, 18, [("omitted", None, 1, 1), ("empty", [], 0, 1)])
        check(model, {"x": x}, want=[w, w])


def _softmax_2d(x, axis, log):
    """Softmax before opset 13: x taken as 2-D, [prod(shape[:axis]), prod(shape[axis:])], normalised per row."""
    flat = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1).astype(np.float64)
    e = np.exp(flat - flat.max(axis=1, keepdims=True))
    y = e / e.sum(axis=1, keepdims=True)
    return (np.log(y) if log else y).reshape(x.shape).astype(x.dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax(dtype):
    """Opset 13: one axis (default -1). exp within 2 ulp each side, a K-term sum, one division: relative error
    (2K + 10) eps; LogSoftmax: log(sum) and log(softmax) differ by that absolutely, plus 4 ulp of the result."""
    x = data((2, 3, 5), dtype)
    cases = [{}, {"axis": 0}, {"axis": 1}, {"axis": -2}, {"axis": 2}]
    eps = np.finfo(dtype).eps
    for op_type in ("Softmax", "LogSoftmax"):
        nodes = [node(op_type, ["x"], f"y{k}", **c) for k, c in enumerate(cases)]
        model = make_model(nodes, {"x": x}, [f"y{k}" for k in range(len(cases))], opset=13)
        want = reference(model, {"x": x})
        terms = [5, 2, 3, 3, 5]
        if op_type == "Softmax":
            tol = {f"y{k}": (2 * t + 10) * eps * np.abs(w.astype(F64)) for k, (t, w) in enumerate(zip(terms, want))}
        else:
            tol = {f"y{k}": (2 * t + 10) * eps + 4 * eps * np.abs(w.astype(F64))
                   for k, (t, w) in enumerate(zip(terms, want))}
        check(model, {"x": x}, tol, want=want)


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
def test_softmax_opset11_coerces_to_2d(op_type):
    """Before opset 13, Softmax normalises over ALL dims from axis on (default axis 1), the input taken as 2-D.
    onnx's ReferenceEvaluator implements only opset 13's per-axis form for every opset, so the expectation here
    is the spec's, computed in float64 (the bound: jitop's float32 error as above, K = prod(dims from axis))."""
    x = data((2, 3, 5), F32)
    cases = [({}, 1), ({"axis": 0}, 0), ({"axis": 2}, 2), ({"axis": -2}, 1)]
    nodes = [node(op_type, ["x"], f"y{k}", **c) for k, (c, _) in enumerate(cases)]
    model = make_model(nodes, {"x": x}, [f"y{k}" for k in range(len(cases))], opset=11)
    want = [_softmax_2d(x, axis, op_type == "LogSoftmax") for _, axis in cases]
    terms = [15, 30, 5, 15]
    tol = {f"y{k}": ((2 * t + 10) * EPS32 if op_type == "LogSoftmax" else 0) + (2 * t + 10) * EPS32 * np.abs(w)
           for k, (t, w) in enumerate(zip(terms, want))}
    check(model, {"x": x}, tol, want=want)


def test_softmax_zero_size_axis():
    """Softmax and LogSoftmax over a 0-size axis (opset 13, and the 2-D coercion before it): an empty result of
    the input's shape (numpy's max over the empty axis, for the shift, raises)."""
    x = data((2, 0, 3), F32)
    for opset, axis in ((13, 1), (13, -2), (11, 1)):
        nodes = [node(op, ["x"], op, axis=axis) for op in ("Softmax", "LogSoftmax")]
        model = make_model(nodes, {"x": x}, ["Softmax", "LogSoftmax"], opset=opset)
        check(model, {"x": x}, want=[x, x])


@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_normalization(dtype):
    """LayerNormalization (opset 17) over the last axis and the last two (axis=1 of a 3-D input), epsilon, with
    and without bias, and a scale that broadcasts. Bound: the mean and variance are K-term sums (relative
    (2K + 8) eps, the centring's error |dmean| adds to |x - mean|), times inv_std * |scale|, plus the bias's
    rounding."""
    x = data((2, 3, 7), dtype, -2, 4)
    scale, bias = data((7,), dtype, salt=1), data((7,), dtype, salt=2)
    scale2, bias2 = data((3, 7), dtype, salt=3), data((3, 7), dtype, salt=4)
    consts = {"s": scale, "b": bias, "s2": scale2, "b2": bias2}
    spec = {"last": (["x", "s", "b"], {}), "nobias": (["x", "s"], {"epsilon": 0.1}),
            "two": (["x", "s2", "b2"], {"axis": 1}), "two_neg": (["x", "s2"], {"axis": -2, "epsilon": 1e-3})}
    nodes = [node("LayerNormalization", ins, name, **attrs) for name, (ins, attrs) in spec.items()]
    model = make_model(nodes, {"x": x}, list(spec), consts, opset=17)
    eps = np.finfo(dtype).eps
    x64 = x.astype(F64)

    def bound(axes, s, b, epsilon):
        k = int(np.prod([x.shape[a] for a in axes]))
        mean = x64.mean(axis=axes, keepdims=True)
        inv = 1 / np.sqrt(((x64 - mean) ** 2).mean(axis=axes, keepdims=True) + float(np.float32(epsilon)))
        spread = np.abs(x64 - mean) + np.abs(x64).mean(axis=axes, keepdims=True)
        return (2 * k + 8) * eps * spread * inv * np.abs(s) + (0 if b is None else 2 * eps * np.abs(b))

    tol = {"last": bound((2,), scale, bias, 1e-5), "nobias": bound((2,), scale, None, 0.1),
           "two": bound((1, 2), scale2, bias2, 1e-5), "two_neg": bound((1, 2), scale2, None, 1e-3)}
    check(model, {"x": x}, tol)


def test_layer_normalization_stash_type():
    """Mean and InvStdDev are of stash_type (U), float32 by default, whatever x's type; x's standardisation is
    done in at least that precision (float64 x: in float64, as onnxruntime; the reference evaluator returns them
    as x's type). Bound: as above (float64 sums of 7 terms), then the float32 rounding of Mean and InvStdDev."""
    x = data((2, 3, 7), F64, -2, 4)
    scale = data((7,), F64, salt=1)
    model = make_model([node("LayerNormalization", ["x", "s"], ["y", "mean", "inv"])], {"x": x},
                       ["y", "mean", "inv"], {"s": scale}, opset=17)
    mean = x.mean(axis=-1, keepdims=True)
    inv = 1 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + float(np.float32(1e-5)))
    eps = np.finfo(F64).eps
    tol = {"y": 30 * eps * (np.abs(x - mean) + np.abs(x).mean(axis=-1, keepdims=True)) * inv * np.abs(scale),
           "mean": ulp(1), "inv": ulp(1)}
    check(model, {"x": x}, tol, want=[(x - mean) * inv * scale, mean.astype(F32), inv.astype(F32)])
    x32 = x.astype(F32)  # float32 x: computed in float32 as before, the statistics' types unchanged
    model = make_model([node("LayerNormalization", ["x", "s"], ["y", "mean", "inv"], stash_type=1)], {"x": x32},
                       ["y", "mean", "inv"], {"s": scale.astype(F32)}, opset=17)
    assert [v.dtype for v in jitop.onnx.load(model)(x32)] == [F32, F32, F32]


def _bn_params(c, dtype, salt=0):
    return {"scale": data((c,), dtype, 0.5, 2, salt=salt + 1), "bias": data((c,), dtype, salt=salt + 2),
            "mean": data((c,), dtype, salt=salt + 3), "var": data((c,), dtype, 0.1, 3, salt=salt + 4)}


def _bn_bound(x, p, epsilon, eps):
    """y = (x - mean) * k + bias, k = scale / sqrt(var + epsilon): each side rounds ~5 times, each rounding within
    eps of a term no larger than |x k| + |mean k| + |bias| (the reference subtracts first, jitop folds into
    x * k + shift)."""
    shape = (-1,) + (1,) * (x.ndim - 2)
    k = np.abs(p["scale"].astype(F64) / np.sqrt(p["var"].astype(F64) + epsilon)).reshape(shape)
    return 8 * eps * (np.abs(x.astype(F64)) * k + np.abs(p["mean"].astype(F64)).reshape(shape) * k
                      + np.abs(p["bias"].astype(F64)).reshape(shape))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 4), (3, 2, 6)], ids=str)
def test_batch_normalization(shape, dtype):
    """BatchNormalization (inference, opset 15) on a 4-D, 2-D and 3-D input, constant statistics."""
    x = data(shape, dtype)
    p = _bn_params(shape[1], dtype)
    nodes = [node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], "y"),
             node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], "y_eps", epsilon=0.01)]
    model = make_model(nodes, {"x": x}, ["y", "y_eps"], p, opset=15)
    eps = np.finfo(dtype).eps
    check(model, {"x": x}, {"y": _bn_bound(x, p, 1e-5, eps), "y_eps": _bn_bound(x, p, 0.01, eps)})


def test_batch_normalization_statistics_as_inputs():
    """The statistics may be graph inputs (traced): the converter computes k and the shift in the kernel."""
    x = data((2, 3, 4, 4), F32)
    p = _bn_params(3, F32)
    feeds = {"x": x, **p}
    model = make_model([node("BatchNormalization", list(feeds), "y")], feeds, ["y"], opset=15)
    check(model, feeds, {"y": _bn_bound(x, p, 1e-5, EPS32)})


def test_conv_batch_norm_fold():
    """Conv -> BatchNormalization with constant weights and statistics is folded at load (rewrite.fold_batch_norm:
    the Conv's weights times k, its bias k * b + shift, computed in float64 and rounded once). Bound: the conv's
    K-term sums scaled by |k| (dot(K) per output, one more ulp per weight for the fold's rounding), plus the
    BN's own roundings; with and without a conv bias, and a Conv whose output has a second reader (not folded)."""
    from jitop.onnx.proto import read
    from jitop.onnx.rewrite import fold_batch_norm
    x = data((2, 3, 6, 5), F32)
    w, b = data((4, 3, 3, 3), F32, -1, 1, salt=5), data((4,), F32, salt=6)
    p = _bn_params(4, F32, salt=10)
    nodes = [node("Conv", ["x", "w", "b"], "c1", pads=[1, 1, 1, 1]),
             node("BatchNormalization", ["c1", "scale", "bias", "mean", "var"], "y1"),
             node("Conv", ["x", "w"], "c2"),
             node("BatchNormalization", ["c2", "scale", "bias", "mean", "var"], "y2", epsilon=1e-3),
             node("Conv", ["x", "w"], "c3", strides=[2, 2]),
             node("BatchNormalization", ["c3", "scale", "bias", "mean", "var"], "y3"),
             node("Relu", ["c3"], "r3")]
    consts = {"w": w, "b": b, **p}
    model = make_model(nodes, {"x": x}, ["y1", "y2", "y3", "r3"], consts, opset=15)
    assert fold_batch_norm(read(model)) == 2  # c3 has two readers: kept

    conv_only = make_model([n for n in nodes if n.op_type == "Conv"], {"x": x}, ["c1", "c2", "c3"],
                           {"w": w, "b": b}, opset=15)
    from onnx_checks import abs_reference
    mags = abs_reference(conv_only, {"x": x})
    want = reference(model, {"x": x})
    k_terms = 3 * 3 * 3 + 1
    tol = {}
    for name, mag, out, epsilon in (("y1", mags[0], want[0], 1e-5), ("y2", mags[1], want[1], 1e-3),
                                    ("y3", mags[2], want[2], 1e-5)):
        kk = np.abs(p["scale"].astype(F64) / np.sqrt(p["var"].astype(F64) + epsilon)).reshape(-1, 1, 1)
        tol[name] = (2 * k_terms + 4) * EPS32 * mag * kk + _bn_bound(out, p, epsilon, EPS32)
    tol["r3"] = dot(k_terms)
    check(model, {"x": x}, tol, want=want)


# ---- matmul, gemm ---------------------------------------------------------------------------------------------

MATMUL_SHAPES = [((3, 7), (7, 5)), ((2, 3, 4), (2, 4, 6)), ((2, 1, 3, 4), (5, 4, 2)), ((4,), (4, 3)), ((3, 4), (4,)),
                 ((5,), (5,)), ((1, 1), (1, 1)), ((3, 0), (0, 2)), ((0, 3), (3, 2)), ((2, 3, 4), (4,))]


@pytest.mark.parametrize("dtype", [F32, F64, I32, I64])
def test_matmul(dtype):
    """MatMul: 2-D, batched, broadcast batch dims, 1-D operands (promoted and the dim dropped, two 1-D: a 0-d
    result), K = 1 and K = 0 (zeros), a 0-size M. Integers exact (no overflow at these sizes), floats dot(K)."""
    feeds, nodes, tol = {}, [], {}
    for k, (sa, sb) in enumerate(MATMUL_SHAPES):
        feeds[f"a{k}"] = data(sa, dtype, -5, 5, salt=2 * k)
        feeds[f"b{k}"] = data(sb, dtype, -5, 5, salt=2 * k + 1)
        nodes.append(node("MatMul", [f"a{k}", f"b{k}"], f"y{k}"))
        tol[f"y{k}"] = dot(sb[0] if len(sb) == 1 else sb[-2], dtype) if dtype in FLOATS else EXACT
    check(make_model(nodes, feeds, [f"y{k}" for k in range(len(MATMUL_SHAPES))], opset=13), feeds, tol)


def test_matmul_constant_weight():
    """A (batch, K) @ (K, N) with the weight an initializer (the usual model): the packed-constant path."""
    x = data((4, 33), F32)
    w = data((33, 17), F32, salt=3)
    check_op("MatMul", {"x": x}, consts={"w": w}, tol=dot(33))


@pytest.mark.parametrize("dtype", FLOATS)
def test_gemm(dtype):
    """Gemm: alpha, beta, transA, transB, C broadcast from (N,), (M, 1), (1, N), () and (M, N), no C, beta = 0.
    Bound: (2K + 4) eps (|alpha| |A| |B| + |beta| |C|)."""
    m, k, n = 3, 7, 5
    a, b = data((m, k), dtype, salt=1), data((k, n), dtype, salt=2)
    cs = {"cn": data((n,), dtype, salt=3), "cm1": data((m, 1), dtype, salt=4), "c1n": data((1, n), dtype, salt=5),
          "c0": data((), dtype, salt=6), "cmn": data((m, n), dtype, salt=7)}
    feeds = {"a": a, "b": b, "at": np.ascontiguousarray(a.T), "bt": np.ascontiguousarray(b.T)}
    spec = {"plain": (["a", "b", "cn"], {}), "alpha": (["a", "b", "cm1"], {"alpha": 0.5, "beta": -2.0}),
            "tA": (["at", "b", "c1n"], {"transA": 1}), "tB": (["a", "bt", "c0"], {"transB": 1, "beta": 0.25}),
            "tAB": (["at", "bt", "cmn"], {"transA": 1, "transB": 1, "alpha": -1.5}),
            "noC": (["a", "b"], {"alpha": 2.0}),
            "beta0": (["a", "b", "cmn"], {"beta": 0.0})}
    nodes = [node("Gemm", ins, name, **attrs) for name, (ins, attrs) in spec.items()]
    model = make_model(nodes, feeds, list(spec), cs, opset=13)
    eps = np.finfo(dtype).eps
    ab = np.abs(a.astype(F64)) @ np.abs(b.astype(F64))
    tol = {}
    for name, (ins, attrs) in spec.items():
        alpha = abs(float(np.float32(attrs.get("alpha", 1.0))))
        beta = abs(float(np.float32(attrs.get("beta", 1.0))))
        c = np.abs(cs[ins[2]].astype(F64)) if len(ins) > 2 else 0.0
        tol[name] = (2 * k + 4) * eps * (alpha * ab + beta * c)
    check(model, feeds, tol)


# ---- conv, pooling ---------------------------------------------------------------------------------------------

CONV_CASES = {  # name: (input channels, output channels, group, kernel, attributes)
    "basic": (4, 6, 1, (3, 3), {}),
    "pads": (4, 6, 1, (3, 3), {"pads": [1, 1, 1, 1]}),
    "asym": (4, 5, 1, (3, 2), {"pads": [0, 1, 2, 0]}),
    "strides": (4, 3, 1, (3, 3), {"strides": [2, 3], "pads": [1, 0, 1, 2]}),
    "dilation": (4, 3, 1, (2, 3), {"dilations": [2, 1], "pads": [1, 1, 1, 1]}),
    "groups": (4, 6, 2, (3, 3), {"pads": [1, 1, 1, 1]}),
    "depthwise": (4, 4, 4, (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "depthwise_x2": (4, 8, 4, (3, 3), {}),
    "pointwise": (4, 7, 1, (1, 1), {}),
    "same_upper": (4, 3, 1, (4, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "same_lower": (4, 3, 1, (4, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 1]}),
    "same_upper_dil": (4, 3, 1, (2, 2), {"auto_pad": "SAME_UPPER", "dilations": [2, 2]}),
    "valid": (4, 3, 1, (3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    "kernel_shape": (4, 2, 1, (2, 2), {"kernel_shape": [2, 2], "strides": [2, 2]}),
}


@pytest.mark.parametrize("dtype,names", [(F32, list(CONV_CASES)),
                                         (F64, ["asym", "groups", "depthwise_x2", "same_lower"])],
                         ids=["float32", "float64"])
def test_conv(dtype, names):
    """Conv 2-D over a (2, 4, 7, 5) input (prime spatial sizes): pads (asymmetric too), strides, dilations, groups
    (grouped, depthwise, depthwise with a channel multiplier), 1x1, auto_pad SAME_UPPER / SAME_LOWER / VALID,
    an explicit kernel_shape; every other case with a bias; weights constant (initializers). float64 runs a few
    (each conv costs ~0.5 s of compile). Bound: dot(C/group * kh * kw + 1)."""
    x = data((2, 4, 7, 5), dtype)
    consts, nodes, tol = {}, [], {}
    for k, name in enumerate(names):
        cin, cout, group, (kh, kw), attrs = CONV_CASES[name]
        consts[f"w_{name}"] = data((cout, cin // group, kh, kw), dtype, -1, 1, salt=k)
        ins = ["x", f"w_{name}"]
        if k % 2:
            consts[f"b_{name}"] = data((cout,), dtype, salt=100 + k)
            ins.append(f"b_{name}")
        nodes.append(node("Conv", ins, name, group=group, **attrs))
        tol[name] = dot(cin // group * kh * kw + 1, dtype)
    check(make_model(nodes, {"x": x}, names, consts, opset=11), {"x": x}, tol)


def test_conv_weights_as_inputs():
    """Conv with the weights and bias graph inputs (traced, not constants)."""
    feeds = {"x": data((1, 3, 6, 6), F32), "w": data((2, 3, 3, 3), F32, salt=1), "b": data((2,), F32, salt=2)}
    check_op("Conv", feeds, tol=dot(28), pads=[1, 1, 1, 1])


def test_conv_batch_one_channel_one():
    x = data((1, 1, 5, 3), F32)
    check_op("Conv", {"x": x}, consts={"w": data((1, 1, 5, 3), F32, salt=1)}, tol=dot(16))


POOL_INPUT = (2, 3, 7, 6)


@pytest.mark.parametrize("dtype", FLOATS)
def test_max_pool(dtype):
    """MaxPool (opset 12): kernel 2x2 / 3x3 / 3x2, strides, pads (padding never wins: -inf; asymmetric ones and
    ones over half the window padded by the converter), ceil_mode (a last window must start inside the input
    or the leading padding), dilations, auto_pad SAME_UPPER / SAME_LOWER / VALID; exact."""
    x = data(POOL_INPUT, dtype)
    cases = [{"kernel_shape": [2, 2]}, {"kernel_shape": [3, 3], "strides": [2, 2]},
             {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
             {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
             {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
             {"kernel_shape": [2, 2], "dilations": [2, 2]},
             {"kernel_shape": [3, 3], "dilations": [2, 1], "strides": [1, 2], "pads": [2, 1, 2, 1]},
             {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
             {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"},
             {"kernel_shape": [3, 2], "pads": [0, 1, 2, 0], "strides": [2, 2], "ceil_mode": 1},
             {"kernel_shape": [2, 3], "auto_pad": "VALID", "strides": [2, 1]}]
    variants("MaxPool", {"x": x}, cases, opset=12)


def test_max_pool_int():
    """MaxPool on uint8 and int8 (opset 12): padding never wins. The reference evaluator pads integers with NaN
    and fails, so the expectation is its float64 result (every int8/uint8 exact in float64) cast back."""
    cases = [{"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
             {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER"}]
    for dtype in (np.uint8, np.int8):
        x = data(POOL_INPUT, dtype, 0 if dtype == np.uint8 else -100, 100)
        nodes = [node("MaxPool", ["x"], f"y{k}", **c) for k, c in enumerate(cases)]
        as_float = reference(make_model(nodes, {"x": x.astype(F64)}, ["y0", "y1"], opset=12), {"x": x.astype(F64)})
        check(make_model(nodes, {"x": x}, ["y0", "y1"], opset=12), {"x": x}, want=[w.astype(dtype) for w in as_float])


@pytest.mark.parametrize("dtype", FLOATS)
def test_average_pool(dtype):
    """AveragePool (opset 11): count_include_pad 0 (divide by the window's part inside the input) and 1, pads
    (asymmetric, and over half the window: padded by the converter, rescaled when the padding does not count),
    strides, ceil_mode, auto_pad; a sum of kh * kw terms, a division and maybe a rescaling: dot(kh * kw)."""
    x = data(POOL_INPUT, dtype)
    cases = [{"kernel_shape": [2, 2]}, {"kernel_shape": [3, 3], "strides": [2, 2]},
             {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
             {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
             {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
             {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
             {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1, "count_include_pad": 1},
             {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER"}, {"kernel_shape": [3, 3], "auto_pad": "VALID"},
             {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER", "count_include_pad": 1, "strides": [2, 1]},
             {"kernel_shape": [3, 2], "pads": [0, 1, 2, 0], "strides": [2, 2], "ceil_mode": 1},
             {"kernel_shape": [3, 2], "pads": [0, 1, 2, 0], "strides": [2, 2], "ceil_mode": 1, "count_include_pad": 1},
             {"kernel_shape": [3, 3], "pads": [2, 2, 2, 2], "strides": [3, 3]}]
    variants("AveragePool", {"x": x}, cases, opset=11, tol=dot(9, dtype))


@pytest.mark.parametrize("shape", [(2, 3, 7, 5), (1, 4, 1, 1), (2, 3, 6)], ids=str)
def test_global_average_pool(shape):
    x = data(shape, F32)
    check_op("GlobalAveragePool", {"x": x}, tol=dot(int(np.prod(shape[2:]))))


def test_zero_batch():
    """A batch of 0 through the model-level ops (nothing to compute; shapes and dtypes must still be right).
    The reference evaluator's GlobalAveragePool (it divides by the element count) and Flatten fail on 0 elements:
    their expectations are the spec's empty shapes."""
    x = data((0, 3, 5, 5), F32)
    consts = {"w": data((2, 3, 3, 3), F32), **_bn_params(3, F32)}
    nodes = [node("Conv", ["x", "w"], "conv", pads=[1, 1, 1, 1]), node("MaxPool", ["x"], "max", kernel_shape=[2, 2]),
             node("AveragePool", ["x"], "avg", kernel_shape=[3, 3], strides=[2, 2]),
             node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], "bn")]
    check(make_model(nodes, {"x": x}, ["conv", "max", "avg", "bn"], consts, opset=15), {"x": x})
    model = make_model([node("GlobalAveragePool", ["x"], "gap"), node("Flatten", ["x"], "flat")], {"x": x},
                       ["gap", "flat"], opset=15)
    check(model, {"x": x}, want=[np.zeros((0, 3, 1, 1), F32), x.reshape(0, 75)])
    rows = data((0, 5), F32)
    consts = {"s": data((5,), F32), "g": data((5, 3), F32), "ax": np.array([1], I64)}
    nodes = [node("Softmax", ["x"], "sm"), node("LayerNormalization", ["x", "s"], "ln"),
             node("Gemm", ["x", "g"], "gemm"),
             node("ReduceSum", ["x", "ax"], "sum"), node("MatMul", ["x", "g"], "mm")]
    check(make_model(nodes, {"x": rows}, ["sm", "ln", "gemm", "sum", "mm"], consts, opset=17), {"x": rows})


@pytest.mark.parametrize("size", [1, 2, 5])
def test_lrn(size):
    """LocalResponseNormalization (AlexNet, Inception v1): even and odd windows, cut at the channel edges.
    Bound: a sum of up to 5 squares (5 roundings, relative), raised to 0.75 (scales it by 0.75, plus pow's own
    few ulp), one division: within 12 ulp."""
    x = data((2, 7, 3, 4), F32)
    model = make_model([node("LRN", ["x"], "y", size=size, alpha=0.02, beta=0.75, bias=1.5)], {"x": x}, ["y"])
    # the spec, in float64 (onnx's reference loops its window over the batch axis instead of the channels)
    x64, square_sum = x.astype(np.float64), np.zeros(x.shape)
    for c in range(x.shape[1]):
        lo, hi = max(0, c - (size - 1) // 2), min(x.shape[1], c + size // 2 + 1)
        square_sum[:, c] = (x64[:, lo:hi] ** 2).sum(axis=1)
    want = (x64 / (1.5 + 0.02 / size * square_sum) ** 0.75).astype(np.float32)
    check(model, {"x": x}, ulp(12), want=[want])
