"""Call plans of GPU functions (jitop/runtime/cuda/plan.py): the workspaces' arena, sizes of symbols."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop
import sim_gpu
from jitop import te
from jitop.runtime.args import compile_dim
from jitop.runtime.cuda import plan


def _planner(workspaces):
    dims = {d: compile_dim(d) for _, _, shape in workspaces for d in shape if isinstance(d, str)}
    return plan.Planner([], ["n"], 1, [(np.dtype("f4"), ("n", 2))], lambda k, values: (values[0], 2), workspaces,
                        dims, None)


def test_workspaces_share_one_arena_each_at_an_aligned_offset_of_its_own():
    p = _planner([("a", "float32", ("n", 3)), ("b", "int8", (5,)), ("c", "float64", (0,)),
                  ("d", "float16", ("n * 2",))]).plan([7], 1)
    assert p.offsets == [0, 256, 512, 512] and p.arena_bytes == 768  # 84, 5, 0 and 28 bytes
    assert p.outputs == [((7, 2), np.dtype("f4"), 14, 512)]  # 56 bytes: the smallest size class
    assert _planner([("a", "float32", ("n",))]).plan([3], 2).outputs == []  # the outputs were given


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["int8", "float16", "float32", "float64"]),
                          st.integers(0, 3), st.integers(0, 700)), min_size=1, max_size=8), st.integers(0, 50))
def test_workspaces_never_overlap_and_start_aligned(spec, n):
    workspaces = [(f"w{k}", dt, ("n",) * rank_n + (size,)) for k, (dt, rank_n, size) in enumerate(spec)]
    p = _planner(workspaces).plan([n], 1)
    spans = sorted((at, at + n ** rank_n * size * np.dtype(dt).itemsize)
                   for at, (dt, rank_n, size) in zip(p.offsets, spec))
    assert all(at % plan.ARENA_ALIGN == 0 for at in p.offsets)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:])) and spans[-1][1] <= p.arena_bytes


def test_a_grid_over_the_gpus_limit_is_refused_with_the_kernel_and_a_remedy_named(monkeypatch):
    sim_gpu.install(monkeypatch)
    n = te.size_var("n")
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    s = jitop.create_schedule(B)
    outer, inner = s[B].split(B.op.axis[0], factor=32)
    s[B].bind(outer, te.thread_axis("blockIdx.y"))
    s[B].bind(inner, te.thread_axis("threadIdx.x"))
    f = jitop.build(s, [A, B], target=jitop.Target.from_string("cuda -arch=sm_90"))
    np.testing.assert_array_equal(f(np.arange(64, dtype=np.float32)), np.arange(64, dtype=np.float32) + 1)
    with pytest.raises(ValueError, match=r"grid dimension y of 70000 exceeds .* 65535; in kernel \S+, bind a larger"):
        f(np.zeros(32 * 70000, np.float32))


def _add_one(n=None):
    n = n if n is not None else te.size_var("n")
    A, B = te.placeholder((n,), name="A"), te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: A[i] * B[i] + 1.0, name="C")
    s = jitop.create_schedule(C)
    outer, inner = s[C].split(C.op.axis[0], factor=32)
    s[C].bind(outer, te.thread_axis("blockIdx.x"))
    s[C].bind(inner, te.thread_axis("threadIdx.x"))
    return jitop.build(s, [A, B, C], target=jitop.Target.from_string("cuda -arch=sm_90"))


def test_numpy_and_device_inputs_mixed_give_device_results_and_numpy_alone_numpy_results(monkeypatch):
    sim_gpu.install(monkeypatch)
    f = _add_one()
    a, b = np.arange(37, dtype=np.float32), np.linspace(-1, 1, 74, dtype=np.float32)[::2]  # b: a strided view
    want = a * b + 1
    host = f(a, b)
    assert type(host) is np.ndarray and host.dtype == np.float32
    np.testing.assert_array_equal(host, want)
    mixed = f(jitop.cuda.to_device(a), b)
    assert isinstance(mixed, jitop.cuda.DeviceArray)
    np.testing.assert_array_equal(mixed.get(), want)
    with pytest.raises(TypeError, match=r"argument 'B' \(position 1\) must have dtype float32, got float64"):
        f(a, b.astype(np.float64))
    with pytest.raises(ValueError, match=r"argument 'B' \(position 1\) dimension 0 is 36, but it must equal"):
        f(jitop.cuda.to_device(a), b[:36])


def test_a_launch_shape_seen_before_reuses_its_prepared_launch(monkeypatch):
    from jitop.runtime.cuda import driver
    sim_gpu.install(monkeypatch)
    prepared, counted = [], driver.Function.prepared
    monkeypatch.setattr(driver.Function, "prepared", lambda self, grid, *a, **k: prepared.append(grid) or
                        counted(self, grid, *a, **k))
    f = _add_one()
    for n in (37, 40, 64, 100, 37):  # 2, 2, 2, 4, 2 blocks of 32
        a = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(f(a, a), a * a + 1)
    assert [g[0] for g in prepared] == [2, 4]


class _CountedKernel:
    """A stand-in driver.Function: counts the launches it prepares (grid, block)."""

    def __init__(self):
        self.prepared_shapes = []

    def prepared(self, grid, block, arg_types, grid_hint=""):
        self.prepared_shapes.append((grid, block))
        return lambda args: None


def test_a_constant_launch_is_prepared_once_and_a_symbolic_one_per_new_shape():
    from jitop.codegen.nvptx import Launch
    launches = [Launch("fixed", (4, 1, 1), (128, 1, 1), 0), Launch("rows", ("n * 2", 1, 1), (64, 1, 1), 0)]
    dims = {"n * 2": compile_dim("n * 2")}
    kernels = [_CountedKernel(), _CountedKernel()]
    templates = [plan.LaunchTemplate(k, launch, 2, 1, dims) for k, launch in zip(kernels, launches)]
    planner = plan.Planner(templates, ["n"], 1, [(np.dtype("f4"), ("n", 3))], lambda k, v: (v[0], 3), [], dims, None)
    plans = [planner.plan([n], 1) for n in (5, 6, 7, 6)]
    assert kernels[0].prepared_shapes == [((4, 1, 1), (128, 1, 1))]
    assert [grid for grid, _ in kernels[1].prepared_shapes] == [(10, 1, 1), (12, 1, 1), (14, 1, 1)]
    assert [len(p.launches) for p in plans] == [2] * 4 and plans[1].launches[1][0] is plans[3].launches[1][0]
    assert [p.outputs[0][0] for p in plans] == [(5, 3), (6, 3), (7, 3), (6, 3)]  # symbolic: per plan
    fixed = plan.Planner(templates, ["n"], 1, [(np.dtype("f4"), (2, 3))], None, [], dims, None).plan([9], 1)
    assert fixed.outputs == [((2, 3), np.dtype("f4"), 6, plan.BlockPool.rounded(24))]  # constant: no function


def test_a_new_size_accepted_by_the_dispatcher_is_checked_once(monkeypatch):
    from jitop.runtime.args import ShapeBinder
    sim_gpu.install(monkeypatch)
    bound, real = [], ShapeBinder.bind
    monkeypatch.setattr(ShapeBinder, "bind", lambda self, arrays: bound.append(1) or real(self, arrays))

    @jitop.kernel(target="cuda -arch=sm_90")
    def scaled(x):
        return x * 2.5 - 1

    for n in (40, 41, 42):  # the second size makes the function symbolic; later sizes are accepted, then called
        x = jitop.cuda.to_device(np.arange(n, dtype=np.float32))
        np.testing.assert_array_equal(scaled(x).get(), np.arange(n, dtype=np.float32) * 2.5 - 1)
    bound.clear()
    x = jitop.cuda.to_device(np.arange(43, dtype=np.float32))
    np.testing.assert_array_equal(scaled(x).get(), np.arange(43, dtype=np.float32) * 2.5 - 1)
    assert len(bound) == 1


def test_checked_shapes_remembered_never_skip_the_address_check(monkeypatch):
    from jitop.runtime.cuda.memory import DeviceArray
    sim_gpu.install(monkeypatch)
    f = _add_one()
    a, out = (jitop.cuda.to_device(np.arange(37, dtype=np.float32)) for _ in range(2))
    shifted = DeviceArray((37,), np.float32, a.ptr + 4, owner=a)  # same shape and dtype, an unaligned address
    assert f.symbol_values([a, a, out]) == f.symbol_values([shifted, a, out]) == [37]  # shapes only
    with pytest.raises(ValueError, match=r"argument 'A' \(position 0\) starts at a device address"):
        f.launcher([shifted, a, out])  # its shapes were checked last: its address still is
    assert f.symbol_values([a, a]) == [37]
    with pytest.raises(ValueError, match=r"argument 'B' \(position 1\) dimension 0 is 36, but it must equal"):
        f.symbol_values([a, jitop.cuda.to_device(np.zeros(36, np.float32))])
    with pytest.raises(TypeError, match=r"takes its 2 inputs, or all 3 arguments"):
        f.symbol_values([a])
