"""Tensor cores (issue 25, Deliver 3): the TF32 `mma.sync` knob of the CUDA matmul (topi.cuda_mma, codegen.mma).

No GPU has run any of this. What is checked here is all that can be without one:
- the fragment maps against the PTX ISA's stated layouts, and a numpy emulation of one mma through them
  (every tile element held by exactly one lane, D = A @ B + C);
- the codegen's rewrite of a real lowered nest into one mma: for every lane, the registers `operands` loads,
  fed to the emulated mma, give what the scalar per-lane nest computes (random shared-memory contents);
- the whole block: every C element is stored once, by the lane whose accumulator sums A's row and B's
  column of that element, and the k-steps cover the padded K once;
- the space (tc offered on sm_80+ float32 matmuls only, default off), the PTX (mma.sync, ptxas for sm_90
  and sm_80, odd shapes), the tuner's TF32 tolerance. The GPU test (skipped without a driver) compares with
  numpy within `tf32_tolerance`.
"""
from __future__ import annotations

import itertools
import os
import random

import numpy as np
import pytest

import jitop
from jitop import te
from jitop.codegen import mma
from jitop.codegen.nvptx import check_ptx, ptxas_path
from jitop.runtime.cuda import driver
from jitop.schedule.schedule import ForKind
from jitop.target import Target
from jitop.te.expr import Expr, Op, const, substitute
from jitop.tir.nodes import For, IfThenElse, Seq, Allocate, Store, walk_stmts
from jitop.tir.simplify import simplify
from jitop.topi import cuda, cuda_mma
from jitop.topi.cuda_space import to_cfg
from jitop.topi.cuda_templates import CudaConv2dWorkload, CudaMatmulWorkload
from jitop.tuner import registry
from jitop.tuner._measure_worker import _compare
from jitop.tuner.space import Config
from jitop.tuner.task import Task

SM90, SM80 = Target.from_string("cuda -arch=sm_90"), Target.from_string("cuda -arch=sm_80")
SM75 = Target.from_string("cuda -arch=sm_75")
needs_ptxas = pytest.mark.skipif(ptxas_path() is None and os.environ.get("JITOP_REQUIRE_PTXAS") != "1",
                                 reason="ptxas not installed (pip install nvidia-cuda-nvcc)")
requires_gpu = pytest.mark.skipif(not driver.available(), reason=f"no usable NVIDIA GPU: {driver.unavailable_reason()}")


# ** fragment maps and the emulated mma **

def test_maps_are_the_ptx_isa_layouts() -> None:
    g, t = 5, 3
    lane = 4 * g + t
    assert [mma.a_coords(lane, i) for i in range(4)] == [(g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)]
    assert [mma.b_coords(lane, i) for i in range(2)] == [(t, g), (t + 4, g)]
    assert [mma.c_coords(lane, i) for i in range(4)] == [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]
    assert mma.intrinsic(8) == "llvm.nvvm.mma.m16n8k8.row.col.tf32" and mma.fragment_sizes(4) == (2, 1)


@pytest.mark.parametrize("k", mma.MMA_KS)
def test_each_tile_element_is_held_by_one_lane(k) -> None:
    na, nb = mma.fragment_sizes(k)
    for coords, n, shape in ((mma.a_coords, na, (16, k)), (mma.b_coords, nb, (k, 8)), (mma.c_coords, 4, (16, 8))):
        held = sorted(coords(ln, i) for ln in range(32) for i in range(n))
        assert held == sorted(itertools.product(range(shape[0]), range(shape[1])))
    assert all(mma.c_owner(*mma.c_coords(ln, i)) == (ln, i) for ln in range(32) for i in range(4))


@pytest.mark.parametrize("k", mma.MMA_KS)
def test_emulated_mma_through_the_fragments_is_a_at_b_plus_c(k) -> None:
    rng = np.random.default_rng(k)
    a, b, c = (mma.to_tf32(rng.standard_normal(s).astype(np.float32)) for s in ((16, k), (k, 8), (16, 8)))
    d = mma.emulate_mma(*mma.warp_fragments(a, b, c))
    want = a.astype(np.float64) @ b + c
    for ln in range(32):
        for i in range(4):
            assert d[ln, i] == pytest.approx(want[mma.c_coords(ln, i)], rel=1e-12, abs=1e-12)


def test_tf32_rounding_keeps_ten_mantissa_bits() -> None:
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32)
    r = mma.to_tf32(x)
    assert np.all(r.view(np.uint32) & 0x1FFF == 0)
    assert np.max(np.abs(r - x) / np.abs(x)) <= 2.0 ** -11
    assert np.isinf(mma.to_tf32(np.float32(np.inf))) and np.isnan(mma.to_tf32(np.float32(np.nan)))


def test_topi_states_the_codegen_contract() -> None:
    # topi may not import codegen (tests/test_layering.py): its marker names and C layout are restated there
    assert (cuda_mma.MMA_TF32, cuda_mma.TF32_ROUND) == (mma.MMA_TF32, mma.TF32_ROUND)
    A, B = te.placeholder((40, 24), name="A"), te.placeholder((24, 20), name="B")
    C = cuda.matmul(A, B, tc="tf32")
    frag = C.op.input_tensors[0]
    ti, tj, ln, f = (iv.var for iv in frag.op.axis)
    loads = [e for e in _loads(frag.op.body[0]) if e.arg.name in ("A.T", "B.p")]
    (row,), (col,) = ([x.src[1] for x in loads if x.arg.name == n] for n in ("A.T", "B.p"))
    for lane, i in itertools.product(range(32), range(4)):
        at = {ti: const(0), tj: const(0), ln: const(lane), f: const(i)}
        assert (_int(substitute(row, at)), _int(substitute(col, at))) == mma.c_coords(lane, i)
    i, j = (iv.var for iv in C.op.axis)
    (read,) = _loads(C.op.body[0])
    for r, c in itertools.product(range(16), range(8)):
        idx = [_int(substitute(x, {i: const(16 + r), j: const(8 + c)})) for x in read.src]
        assert idx == [1, 1, *mma.c_owner(r, c)]


# ** the lowered kernel: the mma nest and the block **

CASES = [((127, 61, 253), dict(bm=64, bn=64, bk=16, tm=4, tn=4)),
         ((40, 24, 20), dict(bm=32, bn=16, bk=8, tm=2, tn=2)),
         ((33, 17, 9), dict(bm=16, bn=16, bk=4, tm=1, tn=4))]


def _lowered(sizes, cfg):
    m, n, k = sizes
    A, B = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
    C = cuda.matmul(A, B, tc="tf32")
    s = cuda.schedule_matmul(C, {**cfg, "tc": "tf32"}, SM90)
    return jitop.lower(s, [A, B, C]), (A, B, C)


def _paths(s, stack=()):
    """(statement, enclosing For loops) for every statement."""
    yield s, stack
    if isinstance(s, For):
        yield from _paths(s.body, stack + (s,))
    elif isinstance(s, Allocate):
        yield from _paths(s.body, stack)
    elif isinstance(s, Seq):
        for x in s.stmts:
            yield from _paths(x, stack)
    elif isinstance(s, IfThenElse):
        yield from _paths(s.then, stack)
        if s.else_ is not None:
            yield from _paths(s.else_, stack)


def _mma_nests(func):
    """(nest, enclosing loops, the lane loop) of every mma nest (a partitioned loop's copies: several)."""
    found = [(s, stack) for s, stack in _paths(func.body) if isinstance(s, For) and mma.match_nest(s)]
    assert found
    return [(mma.match_nest(loop), stack, next(f for f in reversed(stack) if f.kind is ForKind.THREAD_X))
            for loop, stack in found]


def _mma_nest(func):
    return _mma_nests(func)[0]


@pytest.mark.parametrize("sizes,cfg", CASES, ids=lambda x: str(x))
def test_the_rewrite_to_one_mma_equals_the_scalar_nest(sizes, cfg) -> None:
    func, _ = _lowered(sizes, cfg)
    for nest, stack, lane_loop in _mma_nests(func):
        _check_rewrite(nest, stack, lane_loop, cfg)


def _check_rewrite(nest, stack, lane_loop, cfg) -> None:
    lane = lane_loop.var
    assert int(lane_loop.extent.value) == 32 and nest.k == (8 if cfg["bk"] % 8 == 0 else 4)
    rng = np.random.default_rng(1)
    shared = {buf: mma.to_tf32(rng.standard_normal(buf.shape).astype(np.float32))
              for buf in (nest.a.arg, nest.b.arg)}
    outer = {f.var: const(int(rng.integers(int(f.extent.value)))) for f in stack if f is not lane_loop}

    def value(load: Expr, at: dict) -> float:
        return shared[load.arg][tuple(_int(substitute(x, {**outer, **at})) for x in load.src)]

    scalar = np.zeros((32, 4))
    for ln, f, kk in itertools.product(range(32), range(4), range(nest.k)):
        at = {lane: const(ln), nest.f_var: const(f), nest.k_var: const(kk)}
        scalar[ln, f] += value(nest.a, at) * value(nest.b, at)
    a_regs, b_regs, accs = mma.operands(nest, lane)
    fa = np.array([[value(e, {lane: const(ln)}) for e in a_regs] for ln in range(32)])
    fb = np.array([[value(e, {lane: const(ln)}) for e in b_regs] for ln in range(32)])
    d = mma.emulate_mma(fa, fb, np.zeros((32, 4)))
    np.testing.assert_allclose(d, scalar, rtol=1e-12, atol=1e-12)
    assert [tuple(_int(substitute(x, outer)) for x in idx)[-1] for idx in accs] == [0, 1, 2, 3]


@pytest.mark.parametrize("sizes,cfg", CASES, ids=lambda x: str(x))
def test_every_output_is_stored_once_by_the_lane_that_sums_its_row_and_column(sizes, cfg) -> None:
    """The whole block: each store C[i, j] = frag[ti, tj, 0, f] is made by a thread whose mma nest, at that (ti, tj,
    f), reads A's row i and B's column j (shared-tile coordinates plus the block's origin), and the nest's k steps
    (K loop x k-steps x mma k) visit each padded k once."""
    func, (A, B, C) = _lowered(sizes, cfg)
    m, n, k = sizes
    nest, nest_stack, _ = _mma_nest(func)
    stores = [(s, st) for s, st in _paths(func.body) if isinstance(s, Store) and s.buffer.name == C.name]
    seen = np.zeros((m, n), np.int64)
    for store, stack in stores:  # (a partitioned loop's copies: several)
        _cover(seen, store, stack, nest, nest_stack, cfg)
    assert np.all(seen == 1)
    tiles = 0
    for nest, nest_stack, _ in _mma_nests(func):  # a peeled first K step: a copy of its own
        loops = [f for f in nest_stack if not f.kind.is_gpu_index]
        ks = [f for f in loops if f.var in _free(nest.a.src[0])]
        k_tiles = [f for f in loops if f.var not in _free(nest.a.src[0]) | _free(nest.b.src[0]) | _free(nest.a.src[1])
                   | _free(nest.b.src[1])]
        steps = sorted(_int(substitute(nest.a.src[0], {**{f.var: const(v) for f, v in zip(ks, p)},
                                                        nest.k_var: const(kk)}))
                       for p in itertools.product(*(range(int(f.extent.value)) for f in ks)) for kk in range(nest.k))
        assert steps == list(range(cfg["bk"]))  # the k steps cover a shared tile once
        tiles += int(np.prod([int(f.extent.value) for f in k_tiles]))
    assert tiles * cfg["bk"] == -(-k // 8) * 8  # and the shared tiles the padded K once


def _cover(seen, store, stack, nest, nest_stack, cfg) -> None:
    """Count the elements `store` writes in `seen`; each must be the one its accumulator's A row and B column
    make (the guards of the edge tiles are not modelled: indices outside C are skipped, as they guard them)."""
    m, n = seen.shape
    data = [f for f in stack if not f.kind.is_gpu_index]
    gpu = [f for f in stack if f.kind.is_gpu_index]
    block = {f.kind: f.var for f in gpu}  # a grid dimension of 1 has no loop
    for point in itertools.product(*(range(int(f.extent.value)) for f in gpu + data)):
        at = {f.var: const(v) for f, v in zip(gpu + data, point)}
        i, j = (_int(substitute(x, at)) for x in store.indices)
        if not (i < m and j < n):
            continue  # the lowering guards these (the edge tiles)
        seen[i, j] += 1
        (read,) = _loads(store.value)
        ti, tj, _, f = (_int(substitute(x, at)) for x in read.src)
        mine = {**{g.var: at[g.var] for g in gpu}, nest.f_var: const(f), nest.k_var: const(0),
                **_fragment_loop_values(nest_stack, ti, tj)}
        by, bx = (_int(at[block[kind]]) if kind in block else 0 for kind in (ForKind.BLOCK_Y, ForKind.BLOCK_X))
        a_row = _int(substitute(nest.a.src[1], mine)) + cfg["bm"] * by
        b_col = _int(substitute(nest.b.src[1], mine)) + cfg["bn"] * bx
        assert (a_row, b_col) == (i, j)


def _fragment_loop_values(stack, ti, tj) -> dict:
    # the unrolled fragment loops are named ti, tj (matmul_tc's axes); the rest of the nest's loops at 0
    out = {}
    for f in stack:
        if f.kind.is_gpu_index:
            continue
        out[f.var] = const(ti if f.var.name == "ti" else tj if f.var.name == "tj" else 0)
    return out


# ** the space, the PTX **

def test_tc_is_offered_on_sm80_and_newer_float32_matmuls_that_allow_tf32_only() -> None:
    mm = CudaMatmulWorkload(256, 256, 256, precision="tf32")
    for target, offered in ((SM90, True), (SM80, True), (SM75, False)):
        names = [kn.name for kn in Task("cuda.matmul", mm, target).config_space().knobs]
        assert ("tc" in names) == offered
    # a float32 workload (every traced program's, jitop.tune's) keeps float32 numerics: no TF32 point to pick
    fp32 = CudaMatmulWorkload(256, 256, 256)
    assert "tc" not in [kn.name for kn in Task("cuda.matmul", fp32, SM90).config_space().knobs]
    assert Task("cuda.matmul", fp32, SM90).key != Task("cuda.matmul", mm, SM90).key
    conv = CudaConv2dWorkload(2, 16, 14, 14, 32, 3, 3, padding=(1, 1))
    assert "tc" not in [kn.name for kn in Task("cuda.conv2d", conv, SM90).config_space().knobs]
    default = registry.get("cuda.matmul").default_config(mm, SM90)
    assert default["tc"] == 0  # float32 numerics unless the tuner picks (and checks) a TF32 point
    space = Task("cuda.matmul", mm, SM90).config_space()
    for config in space:
        if config["tc"]:
            cfg = to_cfg(config)
            cuda._check_matmul_config(cfg, SM90)
            wm, wn = cuda_mma.warp_tile(cfg["bm"], cfg["bn"], cfg["tm"], cfg["tn"])
            assert (cfg["bm"] // wm) * (cfg["bn"] // wn) * 32 == (cfg["bm"] // cfg["tm"]) * (cfg["bn"] // cfg["tn"])


def _ptx(sizes, cfg, target):
    m, n, k = sizes
    A, B = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
    C = cuda.matmul(A, B, tc="tf32")
    return jitop.build(cuda.schedule_matmul(C, cfg, target), [A, B, C], target=target).built.ptx


@needs_ptxas
@pytest.mark.parametrize("wl", [CudaMatmulWorkload(1024, 1024, 1024, precision="tf32"),
                                CudaMatmulWorkload(100, 70, 33, precision="tf32")],
                         ids=lambda wl: wl.describe())
def test_sampled_tc_points_build_mma_ptx_that_ptxas_accepts(wl) -> None:
    space = Task("cuda.matmul", wl, SM90).config_space()
    points = [c for c in space if c["tc"]]
    for config in random.Random(wl.describe()).sample(points, 3):
        cfg = to_cfg(config)
        for target in (SM90, SM80):
            ptx = _ptx(wl.gemm, cfg, target)
            shape = "m16n8k8" if cfg["bk"] % 8 == 0 else "m16n8k4"
            assert f"mma.sync.aligned.{shape}.row.col.f32.tf32.tf32.f32" in ptx and "cvt.rna.tf32.f32" in ptx
            check_ptx(ptx, target.arch)


@needs_ptxas
@pytest.mark.parametrize("sizes,cfg", [((127, 61, 253), dict(bm=64, bn=32, bk=16, tm=4, tn=4)),
                                       ((1, 300, 77), dict(bm=16, bn=64, bk=8, tm=2, tn=2)),
                                       ((1, 300, 77), None)], ids=str)
def test_odd_shapes_build_and_pass_ptxas(sizes, cfg) -> None:
    func, _ = _lowered(sizes, cfg or cuda.default_matmul_config(*sizes[:2], sizes[2], SM90))
    _, _, lane = _mma_nest(func)
    around = [s for s, st in _paths(func.body) if isinstance(s, IfThenElse) and lane in st and _holds_mma(s)]
    assert not any(lane.var in _free(g.cond) for g in around)  # every lane of a warp reaches its mma
    for target in (SM90, SM80):
        ptx = _ptx(sizes, {**(cfg or {}), "tc": "tf32"}, target)
        assert "mma.sync.aligned.m16n8k" in ptx
        check_ptx(ptx, target.arch)


def test_tc_configs_are_refused_where_they_cannot_run() -> None:
    A, B = te.placeholder((64, 64), name="A"), te.placeholder((64, 64), name="B")
    cfg = {"bm": 64, "bn": 64, "bk": 8, "tm": 4, "tn": 4, "tc": "tf32"}
    with pytest.raises(ValueError, match="sm_80"):
        cuda.schedule_matmul(cuda.matmul(A, B, tc="tf32"), cfg, SM75)
    with pytest.raises(ValueError, match="tc='tf32'"):
        cuda.schedule_matmul(cuda.matmul(A, B), cfg, SM90)
    with pytest.raises(ValueError, match="tensor-core modes"):
        cuda.matmul(A, B, tc="fp16")
    with pytest.raises(TypeError, match="float32"):
        cuda.matmul(te.placeholder((8, 8), "float64"), te.placeholder((8, 8), "float64"), tc="tf32")


# ** the tuner's TF32 check **

def test_the_tuner_checks_tc_points_with_the_tf32_tolerance() -> None:
    wl = CudaMatmulWorkload(64, 64, 1024, precision="tf32")
    tc = Config.of(tile=(64, 64, 4, 4), bk=16, tc="tf32")
    assert wl.tolerance(Config.of(tile=(64, 64, 4, 4), bk=16, tc=0)) is None
    tol = wl.tolerance(tc)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 1024)).astype(np.float32), rng.standard_normal((1024, 64)).astype(np.float32)
    ref = (a @ b).astype(np.float32)
    tf32 = (mma.to_tf32(a).astype(np.float64) @ mma.to_tf32(b)).astype(np.float32)
    assert _compare([tf32], [ref], tol) == ""
    assert "exceeds" in _compare([tf32], [ref])  # float32's own tolerance would call TF32 wrong
    wrong = tf32.copy()
    wrong[3, 5] += 3 * float(np.std(ref))  # e.g. a lost k-step
    assert "exceeds" in _compare([wrong], [ref], tol)


def test_the_gpu_build_worker_sends_the_tolerance_with_a_tc_candidate() -> None:
    from jitop.tuner import _gpu_worker
    task = Task("cuda.matmul", CudaMatmulWorkload(100, 70, 33, precision="tf32"), SM90)
    meta, _ = _gpu_worker._build(task.to_json(), Config.of(tile=(32, 32, 2, 2), bk=8, tc="tf32").to_json())
    assert meta["tolerance"] == list(cuda_mma.tf32_tolerance(33))
    meta, _ = _gpu_worker._build(task.to_json(), None)
    assert "tolerance" not in meta


# ** on a GPU (skipped without a driver; never run here) **

@requires_gpu
@pytest.mark.parametrize("sizes", [(127, 61, 253), (1, 300, 77), (1024, 1024, 1024)], ids=str)
def test_tc_matmul_on_the_gpu_equals_numpy_within_tf32(sizes) -> None:
    m, n, k = sizes
    target = jitop.driver.cuda_target()
    if not cuda_mma.tc_available(target):
        pytest.skip(f"{target.arch} has no TF32 tensor cores")
    A, B = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
    C = cuda.matmul(A, B, tc="tf32")
    f = jitop.build(cuda.schedule_matmul(C, {"tc": "tf32"}, target), [A, B, C], target=target)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    c = np.full((m, n), np.nan, np.float32)
    f(a, b, c)
    ref = (a.astype(np.float64) @ b).astype(np.float32)
    assert _compare([c], [ref], cuda_mma.tf32_tolerance(k)) == ""


# ** helpers **

def _nodes(e: Expr, op: Op) -> list[Expr]:
    """The nodes of expression `e` with operation `op` (each occurrence)."""
    out, todo = [], [e]
    while todo:
        x = todo.pop()
        if x.op is op:
            out.append(x)
        todo.extend(x.src)
    return out


def _loads(e: Expr) -> list[Expr]:
    return _nodes(e, Op.LOAD)


def _int(e: Expr) -> int:
    v = simplify(e, {})
    assert v.op is Op.CONST, f"not a constant: {v}"
    return int(v.value)


def _free(e: Expr) -> set:
    return set(_nodes(e, Op.VAR))


def _holds_mma(guard: IfThenElse) -> bool:
    return any(isinstance(s, For) and mma.match_nest(s) for s in walk_stmts(guard.then))
