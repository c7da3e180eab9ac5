"""The numpy API on symbolic dims (issue 23, S2): trace_symbolic of the programs of benchmarks/bench_shapes.py,
and a property: a symbolic trace with the hints substituted is the concrete trace, node for node. No LLVM.
"""
from __future__ import annotations

import math
import os
import sys
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jitop.graph import shapes
from jitop.graph.ir import Node, node, toposort
from jitop.graph.tracer import Tracer, trace_symbolic
from jitop.te.expr import Expr

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import bench_shapes as bs  # noqa: E402


def nodes_of(result) -> list[Node]:
    outs = [t.node for t in (result if isinstance(result, (tuple, list)) else (result,)) if isinstance(t, Tracer)]
    return toposort(outs)


def show(shape) -> tuple:
    return tuple(d if type(d) is int else repr(d) for d in shape)


# ** the programs of bench_shapes **

@pytest.fixture(scope="module")
def decode_trace():
    rng = np.random.default_rng(0)
    layers, embed = bs.decode_weights(rng)
    cache = np.zeros((17, bs.C), np.float32)
    return trace_symbolic(bs.decode_step, [embed[:1], cache, cache.copy(), *layers[0]], {1: (0,), 2: (0,)})


def test_decode_step_cache_axis_is_symbolic(decode_trace):
    tr = decode_trace
    out, k, v = tr.result
    assert show(out.node.shape) == (1, bs.C)
    assert show(k.node.shape) == ("k_cache_0 + 1", bs.C)     # vstack([cache, k]) grows the symbol by one
    assert show(v.node.shape) == ("v_cache_0 + 1", bs.C)
    # p @ vh ties the two caches (core dims k_cache_0 + 1 and v_cache_0 + 1); nothing else is recorded
    assert [str(t) for t in tr.env.ties] == ["v_cache_0 := k_cache_0"]
    assert tr.env.guards == [] and tr.env.specialised == []
    order = nodes_of(tr.result)
    concat = [n for n in order if n.prim == "concat"]  # the two caches, and np.hstack(heads)
    assert {show(n.shape) for n in concat} == {("k_cache_0 + 1", bs.C), ("v_cache_0 + 1", bs.C), (1, bs.C)}
    # the scores and the softmax of every head are (1, k_cache_0 + 1); the heads' slices are constant
    scores = {show(n.shape) for n in order if n.prim == "reduce" and n.param("op") in ("max", "sum")
              and any(isinstance(d, Expr) for d in n.src[0].shape)}
    assert scores == {(1,), (1, "k_cache_0 + 1")}  # the softmax's max/sum, and q . k row by row
    assert any(show(n.shape) == (1, "k_cache_0 + 1") for n in order if n.prim == "ufunc" and n.param("name") == "exp")
    symbolic = [n for n in order if any(isinstance(d, Expr) for d in n.shape)]
    assert symbolic and all(n.prim != "arg" or n.param("index") in (1, 2) for n in symbolic)


def test_mlp_batch_is_symbolic():
    rng = np.random.default_rng(1)
    tr = trace_symbolic(bs.mlp3, [np.zeros((37, 512), np.float32), *bs.mlp_weights(rng)], {0: (0,)})
    assert show(tr.result.node.shape) == ("x_0", 10)
    assert tr.env.guards == [] and tr.env.ties == [] and tr.env.specialised == []
    mms = [n for n in nodes_of(tr.result) if n.prim == "matmul"]
    assert [show(n.shape) for n in mms] == [("x_0", 1024), ("x_0", 1024), ("x_0", 10)]


def test_prefill_specialises_tri():
    rng = np.random.default_rng(2)
    layers, embed = bs.decode_weights(rng)
    tr = trace_symbolic(bs.prefill, [embed[:9], *layers[0]], {0: (0,)})
    assert [s.value for s in tr.env.specialised] == [9]  # np.tri(x.shape[0]) is a Python int
    assert [str(t) for t in tr.env.ties] == ["x_0 := 9"]
    assert all(type(tr.env.resolve(d)) is int for n in nodes_of(tr.result) for d in n.shape)


# ** the helpers one by one **

def trace1(fn, *shape_dyn):
    arrays = [np.zeros(s, np.float32) for s, _ in shape_dyn]
    return trace_symbolic(fn, arrays, {k: d for k, (_, d) in enumerate(shape_dyn)})


def test_broadcasting_ties_pins_and_errors():
    tr = trace1(lambda a, b: a + b, ((5, 3), (0,)), ((5, 1), (0,)))
    assert show(tr.result.node.shape) == ("a_0", 3) and [str(t) for t in tr.env.ties] == ["b_0 := a_0"]
    tr = trace1(lambda a, b: a + b, ((5, 3), (0,)), ((5, 3), ()))
    assert show(tr.result.node.shape) == (5, 3) and [str(t) for t in tr.env.ties] == ["a_0 := 5"]
    tr = trace1(lambda a, b: a * b, ((5, 3), (0,)), ((1, 3), ()))   # a 1 broadcasts: nothing recorded
    assert show(tr.result.node.shape) == ("a_0", 3) and not tr.env.ties and not tr.env.guards
    with pytest.raises(ValueError, match="could not be broadcast"):
        trace1(lambda a, b: a + b, ((5, 3), (0,)), ((4, 3), (0,)))


def test_reshape_split_and_slices():
    tr = trace1(lambda x: x.reshape(-1), ((6, 4), (0,)))
    assert show(tr.result.node.shape) == ("x_0 * 4",) and not tr.env.guards
    tr = trace1(lambda x: x.reshape(-1, 8), ((6, 4), (0,)))   # x_0 * 4 % 8 == 0: a guard
    assert show(tr.result.node.shape) == ("x_0 // 2", 8) and [str(g) for g in tr.env.guards] == ["x_0 % 2 == 0"]
    tr = trace1(lambda x: np.split(x, 3, axis=0)[1], ((6, 4), (0,)))
    assert show(tr.result.node.shape) == ("x_0 // 3", 4) and [str(g) for g in tr.env.guards] == ["x_0 % 3 == 0"]
    with pytest.raises(ValueError, match="equal division"):
        trace1(lambda x: np.split(x, 4, axis=0), ((6, 4), (0,)))
    tr = trace1(lambda x: (x[1:], x[-3:], x[::-1], x[:, 1:3], x[-1], x[::2]), ((7, 4), (0,)))
    assert [show(t.node.shape) for t in tr.result] == \
        [("x_0 - 1", 4), (3, 4), ("x_0", 4), ("x_0", 2), (4,), ("(x_0 + 1) // 2", 4)]
    assert [str(g) for g in tr.env.guards] == ["x_0 >= 3"]   # x[-3:] is a window of 3 where x_0 >= 3
    tr = trace1(lambda x: x[:5], ((7, 4), (0,)))
    assert show(tr.result.node.shape) == (5, 4) and [str(g) for g in tr.env.guards] == ["x_0 >= 5"]
    tr = trace1(lambda x: x[3:5], ((7, 4), (0,)))   # x_0 >= 3, then x_0 >= 5: the weaker guard is dropped
    assert show(tr.result.node.shape) == (2, 4) and [str(g) for g in tr.env.guards] == ["x_0 >= 5"]
    with pytest.raises(IndexError):
        trace1(lambda x: x[9], ((7, 4), (0,)))
    tr = trace1(lambda x, y: (x[y.shape[0]:], np.split(x, [2, 4])[2], x[-1:0:-2]), ((7, 4), (0,)), ((5, 4), (0,)))
    assert [show(t.node.shape) for t in tr.result] == [("x_0 - y_0", 4), ("x_0 - 4", 4), ("x_0 // 2", 4)]
    assert [str(g) for g in tr.env.guards] == ["x_0 - y_0 >= 0", "x_0 >= 4"]


def test_concat_stack_matmul_einsum_creation():
    tr = trace1(lambda a, b: np.concatenate([a, b, a]), ((5, 3), (0,)), ((2, 3), (0,)))
    assert show(tr.result.node.shape) == ("a_0 * 2 + b_0", 3)
    tr = trace1(lambda a, b: np.stack([a, b]), ((5, 3), (0,)), ((5, 3), (0,)))
    assert show(tr.result.node.shape) == (2, "a_0", 3) and [str(t) for t in tr.env.ties] == ["b_0 := a_0"]
    tr = trace1(lambda a, b: a @ b, ((5, 3), (0, 1)), ((3, 4), ()))
    assert show(tr.result.node.shape) == ("a_0", 4) and [str(t) for t in tr.env.ties] == ["a_1 := 3"]
    tr = trace1(lambda a, b: np.einsum("ij,kj->ik", a, b), ((5, 3), (0,)), ((6, 3), (0,)))
    assert show(tr.result.node.shape) == ("a_0", "b_0") and not tr.env.ties
    tr = trace1(lambda a, b: np.einsum("bij,bjk->bik", a, b), ((2, 5, 3), (0, 1)), ((2, 3, 4), (0,)))
    assert show(tr.result.node.shape) == ("a_0", "a_1", 4) and [str(t) for t in tr.env.ties] == ["b_0 := a_0"]
    tr = trace1(lambda a: (np.zeros_like(a), np.full_like(a, 2.0), np.broadcast_to(a[:1], a.shape),
                           np.expand_dims(a, 1), np.squeeze(a[:, :1]), np.shape(a), np.size(a)), ((5, 3), (0,)))
    assert [show(t.node.shape) for t in tr.result[:5]] == [("a_0", 3)] * 3 + [("a_0", 1, 3), ("a_0",)]
    assert repr(tr.result[5]) == "(a_0, 3)" and repr(tr.result[6]) == "a_0 * 3"
    assert not tr.env.guards and not tr.env.ties and not tr.env.specialised


def test_conv_symbolic_batch_and_size():
    from jitop.ops.conv import _conv_node
    tr = trace1(lambda x, w: _conv_node(x, w, ((1, 1), (1, 1, 1, 1), (1, 1), 1, "NCHW")),
                ((3, 2, 9, 9), (0, 2, 3)), ((4, 2, 3, 3), ()))
    assert show(tr.result.node.shape) == ("x_0", 4, "x_2", "x_3")
    # the public entry: its shape checks decide on SymInts (proved here: nothing recorded)
    from jitop.ops.conv import conv2d
    tr = trace1(lambda x, w, b: conv2d(x, w, b, stride=2, padding=1), ((3, 2, 9, 9), (0, 2, 3)),
                ((4, 2, 3, 3), ()), ((4,), ()))
    assert show(tr.result.node.shape) == ("x_0", 4, "(x_2 + 1) // 2", "(x_3 + 1) // 2")
    assert not tr.env.guards and not tr.env.ties and not tr.env.specialised


def test_heuristics_decide_at_rep():
    """x @ x.T with 3 rows: the concrete trace takes dot products of rows (SMALL_M), the symbolic one decides at
    the representative size (256 rows: the matmul template) and records nothing; both are correct."""
    concrete = trace1(lambda x: x @ x.T, ((3, 4), ()))
    symbolic = trace1(lambda x: x @ x.T, ((3, 4), (0,)))
    assert concrete.result.node.prim == "reduce" and symbolic.result.node.prim == "matmul"
    assert not symbolic.env.guards and not symbolic.env.ties


# ** property: symbolic with the hints substituted == concrete, node for node **

OPS = {
    "scale": lambda x, y: x * 1.5 + x[:1],
    "softmax": lambda x, y: (lambda e: e / np.sum(e, axis=-1, keepdims=True))(
        np.exp(x - np.max(x, axis=-1, keepdims=True))),
    "lnorm": lambda x, y: (x - np.mean(x, axis=-1, keepdims=True)) / np.sqrt(np.var(x, axis=-1, keepdims=True) + 1e-5),
    "colmean": lambda x, y: x - np.mean(x, axis=0, keepdims=True),
    "vstack": lambda x, y: np.vstack([x, x[-1:]]),
    "hstack": lambda x, y: np.hstack([x, x]),
    "concat_y": lambda x, y: np.concatenate([x, y], axis=0),
    "add_y": lambda x, y: x + y,
    "slice": lambda x, y: x[1:],
    "window": lambda x, y: x[-3:],
    "head": lambda x, y: x[:4],
    "step": lambda x, y: x[::2],
    "flip": lambda x, y: x[::-1],
    "cols": lambda x, y: x[:, 1:],
    "row": lambda x, y: x[-1][None, :] + x,
    "split0": lambda x, y: np.split(x, 2, axis=0)[1],
    "split1": lambda x, y: np.split(x, [1], axis=1)[0] * x,
    "reshape": lambda x, y: x.reshape(-1).reshape(x.shape[0], -1),
    "transpose": lambda x, y: (x.T * 2).T,
    "gram": lambda x, y: x @ x.T @ x,
    "einsum": lambda x, y: np.einsum("ij,kj->ik", x, x) @ x,
    "where": lambda x, y: np.where(x > 0, x, 0.1 * x),
    "ones": lambda x, y: x + np.ones((x.shape[0], 1), x.dtype),
    "w": lambda x, y: x @ np.ones((3, 3), np.float32),
    "sum0": lambda x, y: x + np.sum(x, axis=0),
    "max0": lambda x, y: np.max(x, axis=0, keepdims=True) - x,
    "argmax0": lambda x, y: x + np.argmax(x, axis=0).astype(np.float32),
    "stack": lambda x, y: np.stack([x, x[::-1]])[1],
    "squeeze": lambda x, y: np.squeeze(np.expand_dims(x, 0), 0),
    "tril": lambda x, y: np.tril(x @ x.T) @ x,
    "bcast": lambda x, y: np.broadcast_to(x[:1], x.shape) + x,
    "xy": lambda x, y: x @ y.T @ y,
    "zeros": lambda x, y: np.zeros_like(x) + x[::-1],
    "reshape3": lambda x, y: x.reshape(x.shape[0], 1, -1).reshape(x.shape),
    "tail_y": lambda x, y: x[y.shape[0]:],
    "split_idx": lambda x, y: np.split(x, [2, 4])[2],
    "halves": lambda x, y: x[:x.shape[0] // 2] + x[x.shape[0] - x.shape[0] // 2:],
    "last": lambda x, y: x[x.shape[0] - 1] * x,
    "rsteps": lambda x, y: x[-1:0:-2],
}


def substitute_hints(n: Node, env: shapes.ShapeEnv, memo: dict) -> Node:
    """The node with every symbolic dim and parameter at its hint (rebuilt, so interned like a concrete one)."""
    if n in memo:
        return memo[n]

    def value(v):
        if isinstance(v, Expr):
            return env.hint(v)
        if isinstance(v, tuple):
            return tuple(value(x) for x in v)
        return v
    src = [substitute_hints(s, env, memo) for s in n.src]
    if n.prim == "dim":  # a size as a value (a mean's count): the concrete trace has the Python int there
        memo[n] = node("const", (), n.dtype, (), True, value=env.hint(n.param("expr")))
        return memo[n]
    out = node(n.prim, [value(d) for d in n.shape], n.dtype, src, n.weak, **{k: value(v) for k, v in n.params})
    # a view that is the identity at these sizes is its source, as the concrete trace records it (x[-3:] of a
    # symbolic axis is a window where x_0 >= 3, of 3 rows also the whole array)
    if out.prim in ("index", "reshape", "broadcast") and out.shape == src[0].shape and \
            (out.prim != "index" or all(sp[0] == "slice" and sp[1] == 0 and sp[2] == 1 for sp in out.param("spec"))):
        out = src[0]
    memo[n] = out
    return out


def run(fn, arrays, dynamic):
    try:
        return trace_symbolic(fn, arrays, dynamic), None
    except (ValueError, IndexError) as e:
        return None, type(e)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=4),
       n=st.integers(0, 9), m=st.integers(0, 9), c=st.sampled_from([1, 3, 4]), dyn_cols=st.booleans())
def test_symbolic_trace_at_its_hints_is_the_concrete_trace(ops, n, m, c, dyn_cols):
    def program(x, y):
        for op in ops:
            x = OPS[op](x, y)
        return x
    arrays = [np.zeros((n, c), np.float32), np.zeros((m, c), np.float32)]
    concrete, error = run(program, arrays, {})
    # the tracer's heuristics (which form of x @ w.T) decide at the representative size, not the hints: at the
    # hints here, so that the graphs compare (test_heuristics_decide_at_rep shows the default)
    with mock.patch.object(shapes.ShapeEnv, "rep_value", shapes.ShapeEnv.hint):
        symbolic, sym_error = run(program, arrays, {0: (0, 1) if dyn_cols else (0,), 1: (0,)})
    assert sym_error == error
    if error is not None:
        return
    memo: dict = {}
    assert substitute_hints(symbolic.result.node, symbolic.env, memo) is concrete.result.node
    # (nodes are hash-consed: the same output node is the same graph, node for node)
    # the guards and ties hold at the hints
    for g in symbolic.env.guards:
        assert symbolic.env.hint(g.relation)
    for t in symbolic.env.ties:
        assert symbolic.env.hint(t.symbol) == symbolic.env.hint(t.value)
    assert math.prod(symbolic.env.hint(d) for d in symbolic.result.node.shape) == \
        math.prod(concrete.result.node.shape)
