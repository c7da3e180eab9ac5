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
from onnx_checks import EXACT, check, tensor_type, check_op, data, dot, make_model, node, reference, ulp, variants

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

SCALAR_INPUT_BUG = ("jitop.onnx.model._checked feeds np.ascontiguousarray(value), which makes a 0-d input 1-d: "
                    "a scalar model input (shape []) gives shape (1,) results")
SHAPES = [pytest.param((), marks=pytest.mark.xfail(strict=True, reason=SCALAR_INPUT_BUG)), (1,), (2, 0, 3),
          (3, 5, 7)]


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
