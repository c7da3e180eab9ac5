"""Deep programs under one @jitop.kernel (issue 21): a 5,000-op elementwise chain, a 200-layer residual MLP and
a ResNet-50-depth conv net compile as one kernel and match numpy.

Every pass over the graph is iterative; the passes over one fused expression or one loop nest recurse, and
fusion (MAX_FUSE_DEPTH) and row fusion (MAX_ROW_MEMBERS) bound how deep those get. The tests prove it by
compiling under a fixed stack budget (STACK_BUDGET frames above the caller), far less than these programs'
depth in nodes: anything that recursed once per node or per layer would fail.

Tolerances come from the arithmetic, not from one machine's rounding: the reference runs in float64 and
carries, element by element, a first-order bound on the error of the same computation in float32 (each
rounding at most the unit roundoff U of the result, a dot product of k terms at most gamma(k) of its sum of
absolute terms, as in Higham's "Accuracy and Stability of Numerical Algorithms", errors of the inputs
propagated through each operation's derivative).
"""
from __future__ import annotations

import inspect
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

import jitop
from jitop.graph import fusion
from jitop.graph.compile import prepare
from jitop.graph.ir import toposort

U = float(np.finfo(np.float32).eps) / 2  # unit roundoff of float32
TANH_ULPS = 2.0  # jitop's tanh is within 1.3 ulp (tests/codegen/test_vecmath.py), numpy's within 1
# Frames a compile may use above its caller, whatever the program's length: a fused expression of
# MAX_FUSE_DEPTH nodes and a row loop of MAX_ROW_MEMBERS stages need ~350.
STACK_BUDGET = 500
# The bounds are first order: the products of two roundings they leave out are ~U**2 relative. Every
# comparison allows 25% more than the bound, far more than those terms, so they can never fail a test.
SLACK = 1.25


def gamma(k: int) -> float:
    """Higham's gamma_k: the relative error bound of k float32 roundings in a row (a dot product of k terms)."""
    return k * U / (1 - k * U)


@contextmanager
def stack_budget(frames: int = STACK_BUDGET):
    """Python's recursion limit set to the current depth + `frames` (restored after)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + frames)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


@dataclass
class Bounded:
    """A float64 reference value and a bound on how far the float32 computation of it may be."""

    v: np.ndarray
    e: np.ndarray


def assert_within(got: np.ndarray, ref: Bounded, meaningful: float) -> None:
    """got is within the bound of the reference, and the bound is tight enough to catch a wrong result (at
    most `meaningful` times the largest reference value: a dropped layer or a wrong index is far larger)."""
    assert got.dtype == np.float32 and got.shape == ref.v.shape
    assert ref.e.max() <= meaningful * np.abs(ref.v).max(), (ref.e.max(), np.abs(ref.v).max())
    err = np.abs(got.astype(np.float64) - ref.v)
    worst = np.unravel_index(np.argmax(err - SLACK * ref.e), err.shape)
    assert np.all(err <= SLACK * ref.e), f"error {err[worst]} > bound {ref.e[worst]} at {worst}"


# ** the programs, written once over an `ops` namespace: numpy/jitop ops traced, Bounded ops as reference **

def chain(x: Any, n_ops: int, ops: Any) -> Any:
    """n_ops elementwise ops, alternating tanh(x) and x * 1.0001 + 0.5 (two ops)."""
    done = 0
    while done < n_ops:
        x, done = (ops.tanh(x), done + 1) if done % 3 == 0 else (ops.affine(x, 1.0001, 0.5), done + 2)
    return x


def residual_mlp(h: Any, weights: list, biases: list, ops: Any) -> Any:
    for w, b in zip(weights, biases):
        h = ops.add(h, ops.relu(ops.dense(h, w, b)))
    return h


RESNET50_BLOCKS = (3, 4, 6, 3)


def resnet50(x: Any, params: list, ops: Any, blocks: tuple[int, ...] = RESNET50_BLOCKS) -> Any:
    """ResNet-50 (bottleneck blocks 3-4-6-3, batch norm folded into each conv's weight and bias): 53 convs,
    then global average pool and a dense layer. params: weight, bias of each conv in order, then the dense
    layer's weight and bias. Other `blocks` give shallower or deeper bottleneck ResNets."""
    it = iter(params)

    def conv(x: Any, stride: int, pad: int, relu: bool = True) -> Any:
        y = ops.conv(x, next(it), next(it), stride, pad)
        return ops.relu(y) if relu else y
    x = ops.max_pool(conv(x, 2, 3))
    for stage, n_blocks in enumerate(blocks):
        for k in range(n_blocks):
            stride = 2 if k == 0 and stage > 0 else 1
            y = conv(conv(conv(x, 1, 0), stride, 1), 1, 0, relu=False)
            shortcut = conv(x, stride, 0, relu=False) if k == 0 else x
            x = ops.relu(ops.add(y, shortcut))
    return ops.dense(ops.spatial_mean(x), next(it), next(it))


def resnet50_convs(width: int, blocks: tuple[int, ...] = RESNET50_BLOCKS) -> list[tuple[int, int, int]]:
    """(out channels, in channels, kernel size) of the 53 convs in the order resnet50 reads them."""
    convs, c = [(width, 3, 7)], width
    for stage, n_blocks in enumerate(blocks):
        mid = width * 2 ** stage
        for k in range(n_blocks):
            convs += [(mid, c, 1), (mid, mid, 3), (4 * mid, mid, 1)] + ([(4 * mid, c, 1)] if k == 0 else [])
            c = 4 * mid
    return convs


TRACED = SimpleNamespace(
    tanh=np.tanh, affine=lambda x, a, b: x * a + b, relu=lambda x: np.maximum(x, 0), add=lambda x, y: x + y,
    dense=lambda x, w, b: x @ w + b, spatial_mean=lambda x: x.mean(axis=(2, 3)),
    conv=lambda x, w, b, stride, pad: jitop.conv2d(x, w, b, stride=stride, padding=pad),
    max_pool=lambda x: jitop.max_pool2d(x, 3, stride=2, padding=1))


def _f32(c: float) -> float:
    """A Python float constant as a float32 array op uses it (NEP 50: it takes the array's dtype)."""
    return float(np.float32(c))


def _conv64(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = sliding_window_view(xp, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
    return np.einsum("ncyxrs,ocrs->noyx", win, w)


def _pool64(x: np.ndarray, fill: float) -> np.ndarray:
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=fill)
    return sliding_window_view(xp, (3, 3), axis=(2, 3))[:, :, ::2, ::2].max(axis=(-2, -1))


def _tanh(x: Bounded) -> Bounded:
    y = np.tanh(x.v)
    return Bounded(y, (1 - y * y) * x.e + TANH_ULPS * 2 * U * np.abs(y))


def _affine(x: Bounded, a: float, b: float) -> Bounded:
    a, b = _f32(a), _f32(b)
    y = x.v * a + b
    return Bounded(y, abs(a) * x.e + U * (np.abs(x.v * a) + np.abs(y)))


def _dense(x: Bounded, w: np.ndarray, b: np.ndarray) -> Bounded:
    w64, b64 = w.astype(np.float64), b.astype(np.float64)
    k = w.shape[0]
    y = x.v @ w64 + b64
    return Bounded(y, x.e @ np.abs(w64) + gamma(k + 1) * (np.abs(x.v) @ np.abs(w64) + np.abs(b64)))


def _conv(x: Bounded, w: np.ndarray, b: np.ndarray, stride: int, pad: int) -> Bounded:
    w64, b64 = w.astype(np.float64), b.astype(np.float64)[None, :, None, None]
    k = w[0].size
    y = _conv64(x.v, w64, stride, pad) + b64
    e = _conv64(x.e, np.abs(w64), stride, pad) + gamma(k + 1) * (_conv64(np.abs(x.v), np.abs(w64), stride, pad)
                                                                  + np.abs(b64))
    return Bounded(y, e)


def _spatial_mean(x: Bounded) -> Bounded:
    n = x.v.shape[2] * x.v.shape[3]
    return Bounded(x.v.mean(axis=(2, 3)), x.e.mean(axis=(2, 3)) + gamma(n + 1) * np.abs(x.v).mean(axis=(2, 3)))


REFERENCE = SimpleNamespace(
    tanh=_tanh, affine=_affine, dense=_dense, conv=_conv, spatial_mean=_spatial_mean,
    relu=lambda x: Bounded(np.maximum(x.v, 0), x.e),  # exact, and 1-Lipschitz
    add=lambda x, y: Bounded(x.v + y.v, x.e + y.e + U * np.abs(x.v + y.v)),
    # exact; a max moves at most by the largest error among its window's inputs
    max_pool=lambda x: Bounded(_pool64(x.v, -np.inf), _pool64(x.e, 0.0)))


def reference(program: Callable, x: np.ndarray, *args: Any) -> Bounded:
    """The program in float64 with its float32 error bound (its inputs are exact float32 values)."""
    return program(Bounded(x.astype(np.float64), np.zeros(x.shape)), *args, REFERENCE)


def _inlined_order(group: fusion.Group) -> list:
    """The group's inlined members, producers first, then its root."""
    members = set(group.members)
    return [m for m in toposort([group.root]) if m in members] + [group.root]


def _group_depth(group: fusion.Group) -> int:
    """Nodes along the longest path of a fusion group's expression (its root and inlined members)."""
    depth: dict = {}
    for n in _inlined_order(group):
        depth[n] = 1 + max((depth[s] for s in n.src if s in depth), default=0)
    return depth[group.root]


def _tree_size(group: fusion.Group) -> int:
    """Nodes of the group's expression as a tree (a member read twice counts twice): what to_te builds."""
    size: dict = {}
    for n in _inlined_order(group):
        size[n] = 1 + sum(size[s] for s in n.src if s in size)
    return size[group.root]


def _groups(fn: Callable, *args: np.ndarray) -> tuple[list[fusion.Group], int]:
    """The fusion groups of fn's trace (no LLVM) and the number of nodes of its graph."""
    tr = jitop.kernel(fn).trace(list(args))
    prep = prepare("f", tr.inputs, tr.names, tr.plan, tr.results)
    return fusion.groups(prep.unique, prep.why), len(toposort(prep.unique))


# ** bounded recursion, checked on the graph (no LLVM) **

def test_fusion_cuts_a_long_chain_so_no_expression_nests_deeper_than_max_fuse_depth():
    x = np.random.default_rng(0).random(64).astype(np.float32)
    groups, nodes = _groups(lambda x: chain(x, 1000, TRACED), x)
    assert max(_group_depth(g) for g in groups) <= fusion.MAX_FUSE_DEPTH
    # cut where it must, not everywhere: about one stage per MAX_FUSE_DEPTH ops
    assert len(groups) <= 2 * 1000 // fusion.MAX_FUSE_DEPTH + 2
    assert any("an inlined chain" in g.reason for g in groups)


@pytest.mark.parametrize("step", [lambda x: x * x * 0.5 + 0.5, lambda x: (x * x + x) * 0.25 + 0.25,
                                  lambda x: np.where(x > 0.5, x, x * x)],
                         ids=["x*x", "x*x+x", "where"])
def test_reused_subexpressions_are_not_inlined_into_an_exponential_tree(step):
    """x * x reads an inlined x twice: 50 steps would be a tree of 2**50 nodes. A node read more than once
    is inlined only while cheap (MAX_SHARED_COST), so each group's tree stays small and compiling is quick."""
    def f(x):
        for _ in range(50):
            x = step(x)
        return x
    x = np.random.default_rng(1).random((8, 40)).astype(np.float32)
    groups, nodes = _groups(f, x)
    assert sum(_tree_size(g) for g in groups) <= 4 * nodes
    # each step maps [0, 1] into itself with a derivative of at most 1: its <= 4 roundings never grow
    got = jitop.kernel(f, fallback=False)(x)
    np.testing.assert_allclose(got, f(x.astype(np.float64)), rtol=0, atol=SLACK * 50 * 4 * U)


# ** deep programs, compiled under a fixed stack budget **

def test_inlined_reshapes_and_transposes_keep_their_index_math_a_dag():
    """Each reshape reads its source at (p // W, p % W) of one flat index p: inlined through transposes, the
    index expression reuses p, and the simplifier walked it as a tree (16 rounds took a minute)."""
    def f(x):
        for _ in range(40):
            x = x.reshape(2, 4, 4, 4).transpose(3, 1, 0, 2).reshape(128) * 1.0001 + 1
        return x
    x = np.random.default_rng(11).standard_normal(128).astype(np.float32)
    with stack_budget():
        got = jitop.kernel(f, fallback=False)(x)
    ref = reference(lambda x, ops: _permute_affine(x, 40), x)
    assert_within(got, ref, meaningful=1e-4)


def _permute_affine(x: Bounded, rounds: int) -> Bounded:
    for _ in range(rounds):
        perm = lambda a: a.reshape(2, 4, 4, 4).transpose(3, 1, 0, 2).reshape(128)  # noqa: E731
        x = _affine(Bounded(perm(x.v), perm(x.e)), 1.0001, 1)
    return x



def test_a_concatenation_of_400_arrays_selects_its_part_by_bisection():
    """One select per part in a chain would nest 400 deep; a balanced tree nests 9."""
    def f(x):
        return np.concatenate([x * k for k in range(400)])
    x = np.random.default_rng(10).standard_normal(8).astype(np.float32)
    with stack_budget():
        got = jitop.kernel(f, fallback=False)(x)
    np.testing.assert_array_equal(got, f(x))  # one rounding per element, as numpy's



def test_a_1500_op_chain_of_rows_compiles_within_a_fixed_stack_budget():
    """2-D, so row fusion puts the chain's stages in the output's row loop too (at most MAX_ROW_MEMBERS)."""
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    f = jitop.kernel(lambda x: chain(x, 1500, TRACED), fallback=False)
    with stack_budget():
        got = f(x)
    assert_within(got, reference(chain, x, 1500), meaningful=1e-3)


@pytest.mark.slow
def test_a_5000_op_elementwise_chain_compiles_and_matches_numpy():
    x = np.random.default_rng(3).standard_normal(1000).astype(np.float32) * 3
    f = jitop.kernel(lambda x: chain(x, 5000, TRACED), fallback=False)
    with stack_budget():
        got = f(x)
    ref = reference(chain, x, 5000)
    assert_within(got, ref, meaningful=1e-3)
    assert_within(chain(x, 5000, TRACED), ref, meaningful=1e-3)  # numpy's float32 result keeps the bound too


def mlp_params(layers: int, width: int, seed: int) -> tuple[list, list]:
    """Residual branches scaled by 1/layers (as deep residual nets initialise them) keep h bounded."""
    rng = np.random.default_rng(seed)
    scale = 1 / (layers * width ** 0.5)
    ws = [(rng.standard_normal((width, width)) * scale).astype(np.float32) for _ in range(layers)]
    bs = [(rng.standard_normal(width) * 0.1).astype(np.float32) for _ in range(layers)]
    return ws, bs


@pytest.mark.slow
def test_a_200_layer_residual_mlp_compiles_as_one_kernel_and_matches_numpy():
    ws, bs = mlp_params(200, 32, seed=4)
    h = np.random.default_rng(5).standard_normal((16, 32)).astype(np.float32)
    f = jitop.kernel(lambda h: residual_mlp(h, ws, bs, TRACED), fallback=False)
    with stack_budget():
        got = f(h)
    ref = reference(residual_mlp, h, ws, bs)
    assert_within(got, ref, meaningful=1e-3)
    assert_within(residual_mlp(h, ws, bs, TRACED), ref, meaningful=1e-3)


def test_a_30_layer_residual_mlp_compiles_within_a_fixed_stack_budget():
    ws, bs = mlp_params(30, 16, seed=6)
    h = np.random.default_rng(7).standard_normal((8, 16)).astype(np.float32)
    f = jitop.kernel(lambda h: residual_mlp(h, ws, bs, TRACED), fallback=False)
    with stack_budget(STACK_BUDGET):
        got = f(h)
    assert_within(got, reference(residual_mlp, h, ws, bs), meaningful=1e-3)


def resnet50_params(width: int, classes: int, seed: int, blocks: tuple[int, ...] = RESNET50_BLOCKS
                    ) -> list[np.ndarray]:
    """Folded conv weights >= 0 averaging 1/fan-in (activations stay ~1 and the abs-value error bound is the
    computation itself: tight), biases of both signs (so ReLU clips); a signed dense layer last."""
    rng = np.random.default_rng(seed)
    params = []
    for oc, ic, k in resnet50_convs(width, blocks):
        fan = ic * k * k
        params += [(rng.random((oc, ic, k, k)) * 2 / fan).astype(np.float32),
                   (rng.standard_normal(oc) * 0.2).astype(np.float32)]
    c = 32 * width
    return params + [(rng.standard_normal((c, classes)) / c ** 0.5).astype(np.float32),
                     (rng.standard_normal(classes) * 0.1).astype(np.float32)]


@pytest.mark.slow
def test_a_resnet50_depth_conv_net_with_108_array_parameters_compiles_as_one_kernel():
    """Its 108 weights passed as forward(x, *params) and as forward(x, params): each is one compiled kernel."""
    params = resnet50_params(width=4, classes=10, seed=8)
    assert len(resnet50_convs(4)) == 53 and len(params) == 108
    x = np.random.default_rng(9).random((1, 3, 32, 32)).astype(np.float32)
    variadic = jitop.kernel(lambda x, *params: resnet50(x, list(params), TRACED), fallback=False)
    listed = jitop.kernel(lambda x, params: resnet50(x, params, TRACED), fallback=False)
    with stack_budget():
        got = variadic(x, *params)
        again = listed(x, params)
    assert len(variadic.cache) == len(listed.cache) == 1
    assert_within(got, reference(resnet50, x, params), meaningful=1e-3)
    np.testing.assert_array_equal(again, got)  # the same program: the same kernel (the disk cache's, here)
