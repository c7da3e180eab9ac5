"""Kernels that share code: the GPU back end emits one kernel per loop-nest structure (jitop.tir.structure) and
launches it on each nest's own buffers (a transformer's twelve layers: one set of kernels). The keys tell apart
anything that changes the code; the launches pass each kernel its buffers; and whole functions run on a
simulated GPU (tests/sim_gpu.py: the runtime's launches executed by tests/gpu_sim.py) to numpy's results."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jitop
import sim_gpu
from jitop import te
from jitop.codegen.nvptx import build_ptx
from jitop.target import Target
from jitop.tir.structure import shape_of

SM90 = Target.from_string("cuda -arch=sm_90")
BX, TX = te.thread_axis("blockIdx.x"), te.thread_axis("threadIdx.x")


def _elementwise(body, shape=(1000,), dtype="float32", factor=128, kind="bind"):
    """A lowered one-stage GPU function B = body(A)."""
    A = te.placeholder(shape, dtype, name="A")
    B = te.compute(shape, lambda i: body(A[i]), name="B")
    s = jitop.create_schedule(B)
    bx, tx = s[B].split(B.op.axis[0], factor=factor)
    s[B].bind(bx, BX)
    if kind == "bind":
        s[B].bind(tx, TX)
    else:
        s[B].unroll(tx)
    return jitop.lower(s, [A, B])


def _key(func):
    return shape_of(func.body, func.symbols, func.attrs.get("ranges", {}))[0]


def test_the_same_computation_on_other_buffers_has_one_key():
    assert _key(_elementwise(lambda a: a * 2.0)) == _key(_elementwise(lambda a: a * 2.0))


@pytest.mark.parametrize("other", [
    dict(body=lambda a: a * 3.0),                      # another constant
    dict(body=lambda a: a + 2.0),                      # another operation
    dict(body=lambda a: a * 2.0, dtype="float64"),    # another dtype
    dict(body=lambda a: a * 2.0, shape=(999,)),       # another shape (a guard, other extents)
    dict(body=lambda a: a * 2.0, factor=64),          # other loop extents
    dict(body=lambda a: a * 2.0, kind="unroll"),      # another loop kind
    dict(body=lambda a: a * np.float32(2.0000002)),   # a constant one float32 ulp away
])
def test_anything_that_changes_the_code_changes_the_key(other):
    assert _key(_elementwise(lambda a: a * 2.0)) != _key(_elementwise(**other))


def _doubled_exp(x):
    return te.compute(x.shape, lambda i: te.exp(x[i]) * 2.0, name=f"{x.name}2")


def test_structurally_equal_stages_share_one_kernel_launched_on_their_own_buffers():
    A, B = te.placeholder((500,), name="A"), te.placeholder((500,), name="B")
    outs = [_doubled_exp(x) for x in (A, B)]
    C = te.compute((300,), lambda i: A[i] + 1.0, name="C")  # another kernel
    s = jitop.create_schedule([t.op for t in outs + [C]])
    for t in outs + [C]:
        bx, tx = s[t].split(t.op.axis[0], factor=128)
        s[t].bind(bx, BX)
        s[t].bind(tx, TX)
    built = build_ptx(jitop.lower(s, [A, B, *outs, C]), "shared", SM90)
    names = [k.name for k in built.kernels]
    assert names[0] == names[1] != names[2] and built.ptx.count(".entry") == 2
    # parameters A, B, A2, B2, C: each kernel takes the arrays it touches, in the first kernel's order
    assert [k.args for k in built.kernels] == [(0, 2), (1, 3), (0, 4)]


def test_a_checked_access_of_a_shared_kernel_names_every_launch_s_buffer():
    """The error flag says which access failed, not in which launch: the message names all the arrays."""
    A1, A2 = te.placeholder((50,), name="A1"), te.placeholder((50,), name="A2")
    I1, I2 = te.placeholder((100,), "int64", name="I1"), te.placeholder((100,), "int64", name="I2")
    def gather(a, ix, name):
        return te.compute((100,), lambda i: a[ix[i]] * 2.0, name=name)
    gathers = [gather(A1, I1, "T1"), gather(A2, I2, "T2")]
    s = jitop.create_schedule([t.op for t in gathers])
    for t in gathers:
        bx, tx = s[t].split(t.op.axis[0], factor=64)
        s[t].bind(bx, BX)
        s[t].bind(tx, TX)
    built = build_ptx(jitop.lower(s, [A1, I1, A2, I2, *gathers]), "gather", SM90)
    assert len({k.name for k in built.kernels}) == 1 < len(built.kernels)
    (entry,) = built.checked
    assert entry.startswith("read of A1[") and entry.endswith("(or the same access to A2: one kernel launched on each)")


# ** whole functions on the simulated GPU **

def softmax(h):
    e = np.exp(h - h.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def twice(x, y, w, b):
    """One dense layer and softmax on two inputs of one shape: the second input's kernels are the first's."""
    return softmax(np.maximum(x @ w + b, 0)), softmax(np.maximum(y @ w + b, 0))


def test_a_traced_function_runs_on_the_simulated_gpu(monkeypatch):
    gpu = sim_gpu.gpu_or_simulated(monkeypatch)
    rng = np.random.default_rng(0)
    x, y, w = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((2, 9, 24), (2, 9, 24), (24, 24)))
    b = rng.standard_normal(24).astype(np.float32)
    got = jitop.kernel(twice, target="cuda")(x, y, w, b)
    want = twice(*(a.astype(np.float64) for a in (x, y, w, b)))
    for g, r in zip(got, want):  # a 24-term dot product, then exp (an O(1) argument) and a 24-term sum
        assert g.dtype == np.float32 and g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=0, atol=64 * 24 * np.finfo(np.float32).eps)
    assert gpu is None or len(gpu.launched) == 2 * len(set(gpu.launched))  # y's kernels are x's


def test_device_arrays_in_device_arrays_out(monkeypatch):
    """A traced GPU kernel takes device arrays (here jitop's on the simulated GPU; torch's and CuPy's through
    __cuda_array_interface__) as they are, and returns device arrays; numpy in, numpy out still."""
    from jitop.runtime.cuda import memory
    sim_gpu.gpu_or_simulated(monkeypatch)
    rng = np.random.default_rng(1)
    x, y, w = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((2, 9, 24), (2, 9, 24), (24, 24)))
    b = rng.standard_normal(24).astype(np.float32)
    kf = jitop.kernel(twice, target="cuda")
    on_host = kf(x, y, w, b)
    on_device = kf(memory.to_device(x), memory.to_device(y), w, b)
    assert all(isinstance(r, memory.DeviceArray) for r in on_device)
    for h, d in zip(on_host, on_device):
        np.testing.assert_array_equal(d.get(), h)  # the same kernels
    assert kf.traces == 1  # device arrays key as their shape and dtype: one signature
    by_keyword = kf(x, y=memory.to_device(y), w=memory.to_device(w), b=b)
    for h, d in zip(on_host, by_keyword):
        np.testing.assert_array_equal(d.get(), h)


def pair(xy, params):
    """Device arrays inside a tuple and a dict."""
    x, y = xy
    return twice(x, y, params["w"], params["b"])


def test_device_arrays_inside_containers(monkeypatch):
    from jitop.runtime.cuda import memory
    sim_gpu.gpu_or_simulated(monkeypatch)
    rng = np.random.default_rng(2)
    x, y, w = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((3, 24), (3, 24), (24, 24)))
    b = rng.standard_normal(24).astype(np.float32)
    kf = jitop.kernel(pair, target="cuda")
    on_host = kf((x, y), {"w": w, "b": b})
    on_device = kf((memory.to_device(x), y), params={"w": memory.to_device(w), "b": b})
    assert all(isinstance(r, memory.DeviceArray) for r in on_device)
    for h, d in zip(on_host, on_device):
        np.testing.assert_array_equal(d.get(), h)


UNARY = [np.exp, np.tanh, np.abs, lambda v: np.maximum(v, 0)]
BINARY = [np.add, np.multiply, np.maximum, np.subtract]


@st.composite
def chains(draw):
    """A random elementwise chain over two arrays (a broadcast row among them) and the shape it runs at."""
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    ops = draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.booleans()), min_size=1, max_size=4))
    return shape, ops


def _chain(ops, a, b):
    v = a
    for u, bi, binary in ops:
        v = BINARY[bi](v, b) if binary else UNARY[u](v)
    return v


@settings(max_examples=12, deadline=None, derandomize=True)
@given(chains())
def test_random_chains_on_two_inputs_share_kernels_and_equal_numpy(case):
    """The same chain on two pairs of inputs in one function: the second pair's kernels are the first's (or one
    launch runs both: independent kernels of one launch shape merge), and both results are numpy's (elementwise
    float32: a few ulps, exp's growth included)."""
    shape, ops = case
    mp = pytest.MonkeyPatch()
    try:
        gpu = sim_gpu.gpu_or_simulated(mp)
        rng = np.random.default_rng(len(ops))
        a, c = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
        b, d = (rng.standard_normal(shape[-1:]).astype(np.float32) for _ in range(2))
        kf = jitop.kernel(lambda a, b, c, d: (_chain(ops, a, b), _chain(ops, c, d)), target="cuda", fallback=False)
        got = kf(a, b, c, d)
        for g, args in zip(got, ((a, b), (c, d))):
            want = _chain(ops, *args)
            np.testing.assert_allclose(g, want, rtol=16 * np.finfo(np.float32).eps, atol=1e-30)
        distinct = len(set(gpu.launched)) if gpu else 0
        assert gpu is None or len(gpu.launched) in (distinct, 2 * distinct) and distinct > 0
    finally:
        mp.undo()
