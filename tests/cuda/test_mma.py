"""Tensor cores (issue 25, Deliver 3): the TF32 and BF16 `mma.sync` knob of the CUDA matmul (topi.cuda_mma,
codegen.mma), every test of a mode parametrized over both.

No GPU has run any of this. What is checked here is all that can be without one:
- the fragment maps against the PTX ISA's stated layouts, and a numpy emulation of one mma through them
  (every tile element held by exactly one lane, D = A @ B + C); the operand roundings (TF32: ties away,
  BF16: ties to even) against independent references, and the bf16x2 packing order in the PTX;
- the codegen's rewrite of a real lowered nest into one mma: for every lane, the elements `operands` loads,
  fed to the emulated mma, give what the scalar per-lane nest computes (random shared-memory contents);
- the whole block: every C element is stored once, by the lane whose accumulator sums A's row and B's
  column of that element, and the k-steps cover the padded K once;
- the space (tc offered on sm_80+ float32 matmuls of that precision only, default off), the PTX (mma.sync,
  ptxas for sm_90 and sm_80, odd shapes), the tuner's tolerances. The GPU test (skipped without a driver)
  compares with numpy within the mode's tolerance.
"""
from __future__ import annotations

import itertools
import os
import random
import re

import numpy as np
import pytest

import gpu_cases
import jitop
from jitop import te
from jitop.codegen import mma
from jitop.codegen import nvptx
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
MODES = list(mma.MODES)
MODE_KS = [(mode, k) for mode in MODES for k in mma.MODES[mode].ks]


# ** fragment maps and the emulated mma **

def test_maps_are_the_ptx_isa_layouts() -> None:
    g, t = 5, 3
    lane = 4 * g + t
    assert [mma.a_coords(lane, i) for i in range(4)] == [(g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)]
    assert [mma.b_coords(lane, i) for i in range(2)] == [(t, g), (t + 4, g)]
    assert [mma.c_coords(lane, i) for i in range(4)] == [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]
    assert mma.intrinsic(8) == "llvm.nvvm.mma.m16n8k8.row.col.tf32" and mma.fragment_sizes(4) == (2, 1)


def test_bf16_maps_are_the_ptx_isa_m16n8k16_layouts() -> None:
    # the PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (.bf16), written out per lane;
    # m16n8k8 (.bf16) holds the first 4 of A's and 2 of B's elements, the same places
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        a = [(g if i in (0, 1, 4, 5) else g + 8, t * 2 + (i & 1) + (8 if i >= 4 else 0)) for i in range(8)]
        b = [(t * 2 + (i & 1) + (8 if i >= 2 else 0), g) for i in range(4)]
        assert [mma.a_coords(lane, i, "bf16") for i in range(8)] == a
        assert [mma.b_coords(lane, i, "bf16") for i in range(4)] == b
    assert mma.intrinsic(16, "bf16") == "llvm.nvvm.mma.m16n8k16.row.col.bf16"
    assert mma.fragment_sizes(16, "bf16") == (8, 4) and mma.fragment_sizes(8, "bf16") == (4, 2)
    with pytest.raises(ValueError, match="BF16 mma has k in"):
        mma.fragment_sizes(4, "bf16")


@pytest.mark.parametrize("mode,k", MODE_KS)
def test_each_tile_element_is_held_by_one_lane(mode, k) -> None:
    na, nb = mma.fragment_sizes(k, mode)
    a_map, b_map = (lambda ln, i: mma.a_coords(ln, i, mode)), (lambda ln, i: mma.b_coords(ln, i, mode))
    for coords, n, shape in ((a_map, na, (16, k)), (b_map, nb, (k, 8)), (mma.c_coords, 4, (16, 8))):
        held = sorted(coords(ln, i) for ln in range(32) for i in range(n))
        assert held == sorted(itertools.product(range(shape[0]), range(shape[1])))
    assert all(mma.c_owner(*mma.c_coords(ln, i)) == (ln, i) for ln in range(32) for i in range(4))


@pytest.mark.parametrize("mode,k", MODE_KS)
def test_emulated_mma_through_the_fragments_is_a_at_b_plus_c(mode, k) -> None:
    rng = np.random.default_rng(k)
    a, b, c = (mma.round_operand(rng.standard_normal(s).astype(np.float32), mode) for s in ((16, k), (k, 8), (16, 8)))
    d = mma.emulate_mma(*mma.warp_fragments(a, b, c, mode), mode)
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


def test_bf16_rounding_is_to_nearest_even_with_eight_significant_bits() -> None:
    x = np.random.default_rng(0).standard_normal(100000).astype(np.float32)
    x[:4] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 3.0 * 2 ** 100]  # ties, and a large value
    r = mma.to_bf16(x)
    assert np.all(r.view(np.uint32) & 0xFFFF == 0)
    m, e = np.frexp(x.astype(np.float64))
    want = np.ldexp(np.round(m * 2 ** 8), e - 8)  # numpy rounds half to even: an independent reference
    np.testing.assert_array_equal(r.astype(np.float64), want)
    assert np.max(np.abs(r - x) / np.abs(x)) <= 2.0 ** -8
    assert np.isinf(mma.to_bf16(np.float32(np.inf))) and np.isnan(mma.to_bf16(np.float32(np.nan)))
    assert np.isinf(mma.to_bf16(np.float32(3.4e38)))  # rounds past bfloat16's largest finite value


def test_bf16x2_packing_puts_the_lower_element_in_the_low_half() -> None:
    """The emitter's pack_bf16x2(lo, hi) is `cvt.rn.bf16x2.f32 d, hi, lo`, which the PTX ISA defines as
    d[31:16] = hi, d[15:0] = lo: the fragment tables' "elements low to high" order."""
    from llvmlite import ir
    module = ir.Module("pack")
    module.triple = "nvptx64-nvidia-cuda"
    fn = ir.Function(module, ir.FunctionType(nvptx.I32, [ir.FloatType(), ir.FloatType()]), "pack")
    b = ir.IRBuilder(fn.append_basic_block())
    b.ret(nvptx.pack_bf16x2(b, *fn.args))
    ptx = nvptx._emit_ptx(str(module), SM80)
    params = dict(re.findall(r"ld\.param\.b32\s+(%r\d+), \[pack_param_(\d)\]", ptx))
    (hi, lo), = re.findall(r"cvt\.rn\.bf16x2\.f32\s+%r\d+, (%r\d+), (%r\d+);", ptx)
    assert (params[hi], params[lo]) == ("1", "0")


@pytest.mark.parametrize("mode", MODES)
def test_topi_states_the_codegen_contract(mode) -> None:
    # topi may not import codegen (tests/test_layering.py): its marker names and C layout are restated there
    assert (cuda_mma.MMA_TF32, cuda_mma.TF32_ROUND) == (mma.MMA_TF32, mma.TF32_ROUND)
    assert (cuda_mma.MMA_BF16, cuda_mma.BF16_ROUND) == (mma.MMA_BF16, mma.BF16_ROUND)
    spec, facts = cuda_mma.MODES[mode], mma.MODES[mode]
    assert (spec.marker, spec.rounding, spec.ks) == (facts.marker, facts.rounding, facts.ks)
    assert set(cuda_mma.TC_MODES) == {0, *mma.MODES}
    A, B = te.placeholder((40, 24), name="A"), te.placeholder((24, 20), name="B")
    C = cuda.matmul(A, B, tc=mode)
    frag = C.op.input_tensors[0]
    assert frag.op.reduce_axis[0].extent == const(-(-24 // spec.ks[0]) * spec.ks[0])
    assert {e.arg for e in _nodes(frag.op.input_tensors[0].op.body[0], Op.CALL)} == {spec.rounding}
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

CASES = [("tf32", (127, 61, 253), dict(bm=64, bn=64, bk=16, tm=4, tn=4)),   # m16n8k8
         ("tf32", (40, 24, 20), dict(bm=32, bn=16, bk=8, tm=2, tn=2)),
         ("tf32", (33, 17, 9), dict(bm=16, bn=16, bk=4, tm=1, tn=4)),      # m16n8k4
         ("bf16", (127, 61, 253), dict(bm=64, bn=64, bk=16, tm=4, tn=4)),   # m16n8k16
         ("bf16", (40, 24, 20), dict(bm=32, bn=16, bk=8, tm=2, tn=2)),      # m16n8k8
         ("bf16", (33, 17, 9), dict(bm=16, bn=16, bk=16, tm=1, tn=4)),
         ("bf16", (50, 40, 96), dict(bm=32, bn=32, bk=32, tm=2, tn=4)),
         ("tf32", (127, 61, 253), dict(bm=64, bn=64, bk=16, tm=4, tn=4, stages=2)),  # double-buffered tiles
         ("bf16", (127, 61, 253), dict(bm=64, bn=64, bk=16, tm=4, tn=4, stages=2))]


def _lowered(sizes, cfg, mode="tf32"):
    m, n, k = sizes
    A, B = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
    C = cuda.matmul(A, B, tc=mode)
    s = cuda.schedule_matmul(C, {**cfg, "tc": mode}, SM90)
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


@pytest.mark.parametrize("mode,sizes,cfg", CASES, ids=lambda x: str(x))
def test_the_rewrite_to_one_mma_equals_the_scalar_nest(mode, sizes, cfg) -> None:
    func, _ = _lowered(sizes, cfg, mode)
    for nest, stack, lane_loop in _mma_nests(func):
        assert nest.mode == mode
        _check_rewrite(nest, stack, lane_loop, cfg)


def _check_rewrite(nest, stack, lane_loop, cfg) -> None:
    lane = lane_loop.var
    assert int(lane_loop.extent.value) == 32
    assert nest.k == next(k for k in mma.MODES[nest.mode].ks if cfg["bk"] % k == 0)
    rng = np.random.default_rng(1)
    shared = {buf: mma.round_operand(rng.standard_normal(buf.shape).astype(np.float32), nest.mode)
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
    d = mma.emulate_mma(fa, fb, np.zeros((32, 4)), nest.mode)
    np.testing.assert_allclose(d, scalar, rtol=1e-12, atol=1e-12)
    assert [tuple(_int(substitute(x, outer)) for x in idx)[-1] for idx in accs] == [0, 1, 2, 3]


@pytest.mark.parametrize("mode,sizes,cfg", CASES, ids=lambda x: str(x))
def test_every_output_is_stored_once_by_the_lane_that_sums_its_row_and_column(mode, sizes, cfg) -> None:
    """The whole block: each store C[i, j] = frag[ti, tj, 0, f] is made by a thread whose mma nest, at that (ti, tj,
    f), reads A's row i and B's column j (shared-tile coordinates plus the block's origin), and the nest's k steps
    (K loop x k-steps x mma k) visit each padded k once. A shared tile is read at (k, row) or, double-buffered, at
    (copy, k, row)."""
    func, (A, B, C) = _lowered(sizes, cfg, mode)
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
        ks = [f for f in loops if f.var in _free(nest.a.src[-2])]
        indices = (*nest.a.src[-2:], *nest.b.src[-2:])
        k_tiles = [f for f in loops if f.var not in set().union(*map(_free, indices))]
        steps = sorted(_int(substitute(nest.a.src[-2], {**{f.var: const(v) for f, v in zip(ks, p)},
                                                        nest.k_var: const(kk)}))
                       for p in itertools.product(*(range(int(f.extent.value)) for f in ks)) for kk in range(nest.k))
        assert steps == list(range(cfg["bk"]))  # the k steps cover a shared tile once
        tiles += int(np.prod([int(f.extent.value) for f in k_tiles]))
    pad = cuda_mma.MODES[mode].ks[0]
    assert tiles * cfg["bk"] == -(-k // pad) * pad  # and the shared tiles the padded K once


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
        a_row = _int(substitute(nest.a.src[-1], mine)) + cfg["bm"] * by
        b_col = _int(substitute(nest.b.src[-1], mine)) + cfg["bn"] * bx
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

@pytest.mark.parametrize("mode", MODES)
def test_tc_is_offered_on_sm80_and_newer_float32_matmuls_of_its_precision_only(mode) -> None:
    mm = CudaMatmulWorkload(256, 256, 256, precision=mode)
    for target, offered in ((SM90, True), (SM80, True), (SM75, False)):
        knobs = {kn.name: kn for kn in Task("cuda.matmul", mm, target).config_space().knobs}
        assert ("tc" in knobs) == offered
        assert not offered or list(knobs["tc"].candidates) == [0, mode]
    # a float32 workload (every traced program's, jitop.tune's) keeps float32 numerics: no TF32 point to pick
    fp32 = CudaMatmulWorkload(256, 256, 256)
    assert "tc" not in [kn.name for kn in Task("cuda.matmul", fp32, SM90).config_space().knobs]
    assert Task("cuda.matmul", fp32, SM90).key != Task("cuda.matmul", mm, SM90).key
    assert len({Task("cuda.matmul", CudaMatmulWorkload(256, 256, 256, precision=p), SM90).key
                for p in ("float32", *MODES)}) == 1 + len(MODES)
    conv = CudaConv2dWorkload(2, 16, 14, 14, 32, 3, 3, padding=(1, 1))
    assert "tc" not in [kn.name for kn in Task("cuda.conv2d", conv, SM90).config_space().knobs]
    default = registry.get("cuda.matmul").default_config(mm, SM90)
    assert default["tc"] == 0  # float32 numerics unless the tuner picks (and checks) a tensor-core point
    space = Task("cuda.matmul", mm, SM90).config_space()
    for config in space:
        if config["tc"]:
            cfg = to_cfg(config)
            cuda._check_matmul_config(cfg, SM90)
            wm, wn = cuda_mma.warp_tile(cfg["bm"], cfg["bn"], cfg["tm"], cfg["tn"])
            assert (cfg["bm"] // wm) * (cfg["bn"] // wn) * 32 == (cfg["bm"] // cfg["tm"]) * (cfg["bn"] // cfg["tn"])


def _ptx(sizes, cfg, target, mode="tf32"):
    m, n, k = sizes
    A, B = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
    C = cuda.matmul(A, B, tc=mode)
    return jitop.build(cuda.schedule_matmul(C, cfg, target), [A, B, C], target=target).built.ptx


ROUNDING_PTX = {"tf32": "cvt.rna.tf32.f32", "bf16": "cvt.rn.bf16x2.f32"}


@needs_ptxas
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sizes", [(1024, 1024, 1024), (100, 70, 33)], ids=str)
def test_sampled_tc_points_build_mma_ptx_that_ptxas_accepts(mode, sizes) -> None:
    wl = CudaMatmulWorkload(*sizes, precision=mode)
    space = Task("cuda.matmul", wl, SM90).config_space()
    points = [c for c in space if c["tc"]]
    for config in random.Random(wl.describe()).sample(points, 3):
        cfg = to_cfg(config)
        shape = next(k for k in mma.MODES[mode].ks if cfg["bk"] % k == 0)
        for target in (SM90, SM80):
            ptx = _ptx(wl.gemm, cfg, target, mode)
            assert f"mma.sync.aligned.m16n8k{shape}.row.col.f32.{mode}.{mode}.f32" in ptx and ROUNDING_PTX[mode] in ptx
            check_ptx(ptx, target.arch)


@needs_ptxas
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sizes,cfg", [((127, 61, 253), dict(bm=64, bn=32, bk=16, tm=4, tn=4)),
                                       ((1, 300, 77), dict(bm=16, bn=64, bk=8, tm=2, tn=2)),
                                       ((1, 300, 77), None)], ids=str)
def test_odd_shapes_build_and_pass_ptxas(mode, sizes, cfg) -> None:
    full = cfg or cuda.default_matmul_config(*sizes[:2], sizes[2], SM90)
    func, _ = _lowered(sizes, full, mode)
    _, _, lane = _mma_nest(func)
    around = [s for s, st in _paths(func.body) if isinstance(s, IfThenElse) and lane in st and _holds_mma(s)]
    assert not any(lane.var in _free(g.cond) for g in around)  # every lane of a warp reaches its mma
    for target in (SM90, SM80):
        ptx = _ptx(sizes, {**(cfg or {}), "tc": mode}, target, mode)
        assert f"mma.sync.aligned.m16n8k{next(k for k in mma.MODES[mode].ks if full['bk'] % k == 0)}." in ptx
        check_ptx(ptx, target.arch)


@pytest.mark.parametrize("mode", MODES)
def test_tc_configs_are_refused_where_they_cannot_run(mode) -> None:
    A, B = te.placeholder((64, 64), name="A"), te.placeholder((64, 64), name="B")
    cfg = {"bm": 64, "bn": 64, "bk": 8, "tm": 4, "tn": 4, "tc": mode}
    with pytest.raises(ValueError, match="sm_80"):
        cuda.schedule_matmul(cuda.matmul(A, B, tc=mode), cfg, SM75)
    with pytest.raises(ValueError, match=f"tc='{mode}'"):
        cuda.schedule_matmul(cuda.matmul(A, B), cfg, SM90)
    with pytest.raises(ValueError, match="tensor-core modes"):
        cuda.matmul(A, B, tc="fp16")
    with pytest.raises(TypeError, match="float32"):
        cuda.matmul(te.placeholder((8, 8), "float64"), te.placeholder((8, 8), "float64"), tc=mode)
    smallest = mma.MODES[mode].ks[-1]
    if smallest > 4:  # BF16 has no k = 4 shape: bk = 4 cannot hold one mma
        with pytest.raises(ValueError, match=f"bk a multiple of {smallest}"):
            cuda.schedule_matmul(cuda.matmul(A, B, tc=mode), {**cfg, "bk": 4}, SM90)
    with pytest.raises(ValueError, match="precision"):
        CudaMatmulWorkload(8, 8, 8, precision="fp16")


# ** the tuner's check of a tensor-core point **

@pytest.mark.parametrize("mode", MODES)
def test_the_tuner_checks_tc_points_with_the_mode_tolerance(mode) -> None:
    wl = CudaMatmulWorkload(64, 64, 1024, precision=mode)
    tc = Config.of(tile=(64, 64, 4, 4), bk=16, tc=mode)
    assert wl.tolerance(Config.of(tile=(64, 64, 4, 4), bk=16, tc=0)) is None
    tol = wl.tolerance(tc)
    assert tol == cuda_mma.tc_tolerance(mode, 1024)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 1024)).astype(np.float32), rng.standard_normal((1024, 64)).astype(np.float32)
    ref = (a @ b).astype(np.float32)
    got = (mma.round_operand(a, mode).astype(np.float64) @ mma.round_operand(b, mode)).astype(np.float32)
    assert _compare([got], [ref], tol) == ""
    assert "exceeds" in _compare([got], [ref])  # float32's own tolerance would call it wrong
    wrong = got.copy()
    wrong[3, 5] += 3 * float(np.std(ref))  # e.g. a lost k-step
    assert "exceeds" in _compare([wrong], [ref], tol)


def test_the_bf16_tolerance_is_tf32s_scaled_by_the_unit_roundoffs() -> None:
    for k in (8, 64, 1024, 8192):  # 2^-8 / 2^-11
        assert np.allclose(cuda_mma.bf16_tolerance(k), [8 * x for x in cuda_mma.tf32_tolerance(k)])


@pytest.mark.parametrize("mode", MODES)
def test_the_gpu_build_worker_sends_the_tolerance_with_a_tc_candidate(mode) -> None:
    from jitop.tuner import _gpu_worker
    task = Task("cuda.matmul", CudaMatmulWorkload(100, 70, 33, precision=mode), SM90)
    meta, _ = _gpu_worker._build(task.to_json(), Config.of(tile=(32, 32, 2, 2), bk=8, stages=1, tc=mode).to_json())
    assert meta["tolerance"] == list(cuda_mma.tc_tolerance(mode, 33))
    meta, _ = _gpu_worker._build(task.to_json(), None)
    assert "tolerance" not in meta


# ** on a GPU (skipped without a driver; never run here) **

@requires_gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sizes", [(127, 61, 253), (1, 300, 77), (1024, 1024, 1024)], ids=str)
def test_tc_matmul_on_the_gpu_equals_numpy_within_the_mode_tolerance(mode, sizes) -> None:
    m, n, k = sizes
    target = jitop.driver.cuda_target()
    if not cuda_mma.tc_available(target):
        pytest.skip(f"{target.arch} has no TF32/BF16 tensor cores")
    c, ref, exact = gpu_cases.run_tc_matmul(mode, m, n, k)
    assert _compare([c], [ref.astype(np.float32)], cuda_mma.tc_tolerance(mode, k)) == ""
    # against the products of the operands rounded as `round_operand` does (the float32 sum's error only)
    assert _compare([c], [exact.astype(np.float32)], (1e-4, 1e-4)) == ""


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
