"""Helpers for the ONNX operator tests: build a small model, run it through onnx's ReferenceEvaluator (the spec)
and through jitop.onnx, and compare dtype, shape and values within a bound derived from the arithmetic.

A tolerance is one of
- `EXACT` (0): bit-equal (integers, bools, data movement, max/min/relu, one rounding both sides agree on);
- `ulp(n)`: |got - want| <= n * eps * |want| per element (plus n * the smallest normal, for results that
  underflow): an elementwise result both sides round from the same real value, each within a few ulp;
- an array: an absolute bound per element;
- `dot(K)`: a K-term dot product or sum (conv, matmul, gemm, average pooling, reductions) summed in another
  order: 2 * K * eps * (the same model run in float64 on |inputs|), which bounds both sides' rounding.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import jitop.onnx

IR_VERSION = 10  # what ReferenceEvaluator (onnx 1.23) and jitop.onnx both read; opsets up to 21 allow it
EXACT = 0.0
RNG_SEED = 20240611


def rng(salt: int = 0) -> np.random.Generator:
    return np.random.default_rng(RNG_SEED + salt)


def data(shape: Sequence[int], dtype: Any = np.float32, lo: float = -3.0, hi: float = 3.0, salt: int = 0) -> np.ndarray:
    """Random test values: uniform in [lo, hi) for floats, integers in [lo, hi) for ints, coin flips for bools."""
    g = rng(salt + len(shape) * 7 + int(np.prod(shape, dtype=np.int64)))
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return g.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return g.integers(int(lo), int(hi), size=shape).astype(dtype)
    return g.uniform(lo, hi, size=shape).astype(dtype)


def ulp(n: float) -> "Ulp":
    return Ulp(n)


class Ulp:
    def __init__(self, n: float):
        self.n = n

    def bound(self, want: np.ndarray) -> np.ndarray:
        info = np.finfo(want.dtype)
        return self.n * (info.eps * np.abs(want.astype(np.float64)) + info.smallest_normal)


def tensor_type(dtype: Any) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def value_info(name: str, dtype: Any = None, shape: Sequence[Any] | None = None) -> onnx.ValueInfoProto:
    if dtype is None:  # an output whose type the test leaves to the model
        return helper.make_value_info(name, onnx.TypeProto())
    return helper.make_tensor_value_info(name, tensor_type(dtype), None if shape is None else list(shape))


def make_model(nodes: Sequence[onnx.NodeProto], inputs: Mapping[str, Any], outputs: Sequence[str],
               consts: Mapping[str, np.ndarray] | None = None, opset: int = 17,
               shapes: Mapping[str, Sequence[Any]] | None = None, name: str = "test") -> onnx.ModelProto:
    """A model of `nodes`. inputs: name -> an example array (its dtype and shape declare the input; `shapes`
    overrides a shape, e.g. with a symbolic 'batch' dim); consts: initializers; outputs: their names (untyped)."""
    shapes = dict(shapes or {})
    ins = [value_info(k, v.dtype, shapes.get(k, v.shape)) for k, v in inputs.items()]
    outs = [value_info(o) for o in outputs]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (consts or {}).items()]
    graph = helper.make_graph(list(nodes), name, ins, outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)


def node(op_type: str, inputs: Sequence[str], outputs: Sequence[str] | str = "y", **attrs: Any) -> onnx.NodeProto:
    outputs = [outputs] if isinstance(outputs, str) else list(outputs)
    return helper.make_node(op_type, list(inputs), outputs, **attrs)


def reference(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    with np.errstate(all="ignore"):  # log(0), 1/0, exp overflow: the values (inf, nan) are what is compared
        return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, dict(feeds))]


Tol = Any  # float (0: exact), Ulp, Dot, or an array of absolute bounds


def assert_matches(got: np.ndarray, want: np.ndarray, tol: Tol = EXACT, what: str = "output") -> None:
    """got has want's dtype and shape, and its values within tol (NaNs where want has NaNs)."""
    got = np.asarray(got)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, the reference's is {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, the reference's is {want.shape}"
    if isinstance(tol, Ulp):
        bound = tol.bound(want)
    else:
        bound = np.asarray(tol, np.float64)
    if not np.any(bound) or want.dtype.kind not in "fc":
        ok = (got == want) | (np.isnan(got) & np.isnan(want) if want.dtype.kind in "fc" else False)
        if not np.all(ok):
            bad = np.argwhere(~np.asarray(ok))[:5]
            raise AssertionError(f"{what}: {int(np.size(ok) - np.count_nonzero(ok))} of {np.size(ok)} elements "
                                 f"differ (expected exact); first at {bad.tolist()}: got "
                                 f"{[got[tuple(i)] for i in bad]}, want {[want[tuple(i)] for i in bad]}")
        return
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    same_special = (np.isnan(g64) & np.isnan(w64)) | (np.isinf(w64) & (g64 == w64))
    with np.errstate(invalid="ignore"):
        err = np.where(same_special, 0.0, np.abs(g64 - w64))
    ok = same_special | (err <= np.broadcast_to(bound, err.shape))
    if not np.all(ok):
        bad = np.argwhere(~ok)[:5]
        b = np.broadcast_to(bound, err.shape)
        raise AssertionError(f"{what}: {int(ok.size - ok.sum())} of {ok.size} elements out of bounds; worst "
                             f"error/bound {np.nanmax(err / np.maximum(b, 1e-300)):.3g}; first at {bad.tolist()}: "
                             f"got {[got[tuple(i)] for i in bad]}, want {[want[tuple(i)] for i in bad]}, "
                             f"bound {[b[tuple(i)] for i in bad]}")


def check(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], tol: Tol | Mapping[str, Tol] = EXACT,
          want: Sequence[np.ndarray] | Mapping[str, np.ndarray] | None = None,
          shapes: Mapping[str, Sequence[int]] | None = None) -> jitop.onnx.Model:
    """Run `model` on `feeds` through jitop.onnx and compare every output with the reference evaluator's, or
    with `want` where the reference evaluator deviates from the spec (all outputs, or output name -> value);
    returns the jitop Model."""
    names = [o.name for o in model.graph.output]
    if want is None or isinstance(want, Mapping):
        fixed = dict(want or {})
        want = [fixed.get(name, r) for name, r in zip(names, reference(model, feeds))]
    m = jitop.onnx.load(model, shapes=shapes)
    got = m.run(None, feeds)
    assert len(got) == len(want) == len(names)
    for name, g, w in zip(names, got, want):
        t = tol.get(name, EXACT) if isinstance(tol, Mapping) else tol
        if isinstance(t, Dot):
            t = t.bound(model, feeds, names.index(name))
        assert_matches(g, np.asarray(w), t, what=f"output {name!r}")
    return m


def check_op(op_type: str, feeds: Mapping[str, np.ndarray], tol: Tol = EXACT, opset: int = 17,
             consts: Mapping[str, np.ndarray] | None = None, n_outputs: int = 1,
             input_names: Sequence[str] | None = None,
             want: Sequence[np.ndarray] | None = None, shapes: Mapping[str, Sequence[Any]] | None = None,
             **attrs: Any) -> jitop.onnx.Model:
    """One node of `op_type` over the feeds (graph inputs, in order) then the consts (initializers), or over
    `input_names` ('' for an omitted optional input), compared with the reference."""
    consts = dict(consts or {})
    names = list(input_names) if input_names is not None else list(feeds) + list(consts)
    outs = ["y"] if n_outputs == 1 else [f"y{k}" for k in range(n_outputs)]
    model = make_model([node(op_type, names, outs, **attrs)], feeds, outs, consts, opset, shapes=shapes)
    return check(model, feeds, tol, want=want)


def variants(op_type: str, feeds: Mapping[str, np.ndarray], cases: Sequence[Mapping[str, Any]], tol: Tol = EXACT,
             opset: int = 17, consts: Mapping[str, np.ndarray] | None = None) -> jitop.onnx.Model:
    """Several nodes of `op_type` over the same inputs in ONE model (one compile), one output each: a case is
    the node's attributes, plus optionally '_inputs' (its input names) and '_outputs' (how many it has)."""
    nodes, outs = [], []
    for k, case in enumerate(cases):
        attrs = {a: v for a, v in case.items() if not a.startswith("_")}
        ins = case.get("_inputs", list(feeds) + list(consts or {}))
        names = [f"y{k}"] if case.get("_outputs", 1) == 1 else [f"y{k}_{j}" for j in range(case["_outputs"])]
        nodes.append(node(op_type, ins, names, **attrs))
        outs += names
    model = make_model(nodes, feeds, outs, consts, opset)
    return check(model, feeds, tol)


def abs_reference(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The model run by the reference evaluator in float64 on |inputs| and |initializers| (for dot_bound)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype.kind == "f":
            t.CopyFrom(numpy_helper.from_array(np.abs(a).astype(np.float64), t.name))
    for v in m.graph.input:
        if v.type.tensor_type.elem_type in (TensorProto.FLOAT, TensorProto.FLOAT16):
            v.type.tensor_type.elem_type = TensorProto.DOUBLE
    f64 = {k: np.abs(v).astype(np.float64) if v.dtype.kind == "f" else v for k, v in feeds.items()}
    return reference(m, f64)


def dot(terms: int, dtype: Any = np.float32, extra_ulps: float = 2) -> "Dot":
    return Dot(terms, dtype, extra_ulps)


class Dot:
    """The bound of a sum of `terms` products computed in `dtype` by two summation orders: 2 * terms * eps *
    (the same computation on absolute values, in float64), plus `extra_ulps` for what follows the sum."""

    def __init__(self, terms: int, dtype: Any, extra_ulps: float):
        self.terms, self.dtype, self.extra = terms, np.dtype(dtype), extra_ulps

    def bound(self, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], output: int) -> np.ndarray:
        mag = abs_reference(model, feeds)[output]
        info = np.finfo(self.dtype)
        return (2 * self.terms + self.extra) * info.eps * mag + info.smallest_normal
