"""The matmul template with symbolic M, N and/or K (issue 23 part 2): one kernel for every size.

A workload names a symbolic dim "name~rep" (rep: the size heuristics decide at); `build` gives each symbol a
te.size_var. A config of a symbolic space is valid at every size (fixed tiles, tails split off; no K chunks
when K is symbolic), so each kernel is built once and run at sizes 1, 2, 7, 13, 64, 97, 128, 1000 against
numpy. Also: the template used TVM-style on `te.var` placeholders (with a bias + relu epilogue), and TVM's GEMM
walk-through ("How to optimize GEMM on CPU") with symbolic M, N, K. Concrete workloads keep their spaces and
code (their printed IR was compared before and after this change).
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

import jitop
from jitop import te
from jitop.topi import matmul as tm
from jitop.tuner import registry
from jitop.tuner.space import Config
from kernel_checks import GemmTutorial
from targets import HOST

# parallel loops run on threads at every size (the run-time work test would keep small sizes serial)
TARGET = HOST.replace(parallel_min_work=1)
RNG = np.random.default_rng(23)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype("float32")


def _check(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert got.shape == ref.shape and got.dtype == np.float32
    k = a.shape[-1]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * max(k, 1) ** 0.5 * 10)


@functools.cache
def _built(wl: tm.MatmulWorkload, config: Config | None = None) -> jitop.Module:
    config = config or tm.default_config(wl, TARGET)
    s, args = tm.build(wl, config, TARGET)
    return jitop.build(s, args, target=TARGET)


def _run(wl: tm.MatmulWorkload, sizes: dict[str, int], config: Config | None = None) -> None:
    """Build `wl` (once) and run it with its symbols at `sizes`."""
    dims = {f: sizes[d.partition("~")[0]] if isinstance(d, str) else d for f in "mnk" for d in [getattr(wl, f)]}
    a = _rand(*wl.a_batch, dims["m"], dims["k"])
    b = _rand(*wl.b_batch, dims["k"], dims["n"])
    f = _built(wl, config)
    _check(f(a, b), a, b)
    _no_checked_access(f)


def _no_checked_access(f: jitop.Module) -> None:
    """Every access is proven in bounds (a buffer of a symbolic size is still checked for malloc failing)."""
    checked = [c for c in f.checked if not c.startswith("MemoryError")]
    assert not checked, f"accesses checked at run time: {checked}"


SIZES = (1, 2, 7, 13, 64, 97, 128, 1000)
# (workload, [sizes of its symbols]): every size of the list for one symbol; a covering set for several
CASES = {
    "m": (tm.MatmulWorkload("s0~256", 97, 64), [{"s0": v} for v in SIZES]),
    "n": (tm.MatmulWorkload(13, "s0~256", 97), [{"s0": v} for v in SIZES]),
    "k": (tm.MatmulWorkload(64, 97, "s0~256"), [{"s0": v} for v in SIZES]),
    "mnk": (tm.MatmulWorkload("s0~256", "s1~256", "s2~256"),
            [dict(zip(("s0", "s1", "s2"), v)) for v in
             [(1, 1, 1), (2, 7, 13), (13, 1000, 2), (64, 97, 128), (97, 64, 1000), (128, 13, 7), (1000, 2, 97)]]),
    "m_eq_n": (tm.MatmulWorkload("s0~256", "s0~256", 64), [{"s0": v} for v in (1, 13, 128)]),
    "vector_times_matrix": (tm.MatmulWorkload(1, "s0~256", "s1~256"),
                            [{"s0": n, "s1": k} for n, k in [(1, 7), (97, 13), (1000, 128)]]),
    "batch_mn": (tm.MatmulWorkload("s0~64", "s1~64", 13, a_batch=(2, 3), b_batch=(3,)),
                 [{"s0": m, "s1": n} for m, n in [(1, 7), (13, 2), (64, 97)]]),
    "batch2_mn": (tm.MatmulWorkload("s0~256", "s1~256", 64, a_batch=(2,)),
                  [{"s0": m, "s1": n} for m, n in [(2, 1), (97, 13), (7, 128)]]),
    "batch_k": (tm.MatmulWorkload(7, 64, "s0~256", a_batch=(4,), b_batch=(4,)),
                [{"s0": k} for k in (2, 97, 1000)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_default_config_at_every_size(case):
    wl, sizes = CASES[case]
    for s in sizes:
        _run(wl, s)


# a few points of the all-symbolic space: every tile_m edge, panel width, k unroll, order and packing
POINTS = [dict(tile_m=1, vectors=1, tile_k=1, order="row_outer", pack_b="none"),
          dict(tile_m=5, vectors=3, tile_k=8, order="panel_outer", pack_b="panel"),
          dict(tile_m=12, vectors=2, tile_k=2, order="panel_outer", pack_b="root"),
          dict(tile_m=8, vectors=4, tile_k=4, order="row_outer", pack_b="root"),
          dict(tile_m=3, vectors=1, tile_k=4, order="panel_outer", pack_b="none")]


@pytest.mark.parametrize("point", range(len(POINTS)))
def test_space_points(point):
    wl = CASES["mnk"][0]
    p, lanes = POINTS[point], TARGET.lanes(4)
    config = Config.of(tile_m=(-1, p["tile_m"]), tile_n=(-1, p["vectors"] * lanes), tile_k=(-1, p["tile_k"]),
                       order=p["order"], k_chunk=0, pack_b=p["pack_b"])
    tm.config_space(wl, TARGET).index_of(config)  # a point of the space
    for s in ({"s0": 1, "s1": 2, "s2": 1}, {"s0": 13, "s1": 97, "s2": 7}, {"s0": 128, "s1": 1000, "s2": 64}):
        _run(wl, s, config)


def test_symbolic_space():
    wl = tm.MatmulWorkload("s0~256", "s1~256", "s2~256")
    space = tm.config_space(wl, TARGET)
    knobs = {k.name: k.candidates for k in space.knobs}
    assert knobs["tile_m"] == tuple((-1, r) for r in range(1, 13))
    assert knobs["tile_n"] == tuple((-1, v * TARGET.lanes(4)) for v in (1, 2, 3, 4))
    assert knobs["tile_k"] == ((-1, 1), (-1, 2), (-1, 4), (-1, 8))
    assert knobs["k_chunk"] == (0,)  # no K chunks for a symbolic K
    # the default is a point of the space, decided at the representative size: the one of a concrete 256 cube
    default = tm.default_config(wl, TARGET)
    space.index_of(default)
    concrete = tm.default_config(tm.MatmulWorkload(256, 256, 256), TARGET)
    assert {k: v[-1] if k.startswith("tile") else v for k, v in default.values} == \
        {k: v[-1] if k.startswith("tile") else v for k, v in concrete.values}
    # a concrete K keeps its chunks; symbolic rows keep the concrete columns' filters
    assert tm.config_space(tm.MatmulWorkload("s0~256", 8, 3000), TARGET).knobs[4].candidates == (0, 256, 512, 1024, 2048)
    assert wl.flops == 2 * 256 ** 3 and tm.MatmulWorkload("s0~64", 2, 3).flops == 2 * 64 * 6
    assert tm.rep("s0~64") == 64 and tm.rep("s0") == tm.REP == 256
    # a symbolic workload round-trips through the registry's JSON; a concrete one's JSON is unchanged
    assert registry.workload_to_json(tm.MatmulWorkload(2, 3, 4)) == \
        '{"a_batch":[],"b_batch":[],"dtype":"float32","k":4,"m":2,"n":3}'
    assert tm.TEMPLATE.workload_from_json(registry.workload_to_json(wl)) == wl


def test_compute_needs_a_binding():
    wl = tm.MatmulWorkload("s0~256", 4, 4)
    with pytest.raises(ValueError, match="binding"):
        tm.compute(wl, tm.default_config(wl, TARGET), TARGET, (None, None))


def test_template_on_te_var_placeholders_with_an_epilogue():
    """TVM style: te.var sizes, placeholders, the template's compute and schedule (the register tile feeding
    a bias + relu epilogue), jitop.build."""
    m, n, k = te.var("m"), te.var("n"), te.var("k")
    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    bias = te.placeholder((n,), name="bias")
    wl = tm.MatmulWorkload(m, n, k)
    config = tm.default_config(tm.MatmulWorkload("m", "n", "k"), TARGET)
    t = tm.compute(wl, config, TARGET, (lambda bi, i, r: A[i, r], lambda bi, r, j: B[r, j]))
    E = te.compute((m, n), lambda i, j: te.if_then_else(t.out[i, j] + bias[j] > 0.0, t.out[i, j] + bias[j], 0.0),
                   name="E")
    s = jitop.create_schedule(E.op)
    tm.schedule(s, t, wl, config, TARGET, epilogue=E)
    f = jitop.build(s, [A, B, bias, E], target=TARGET)
    _no_checked_access(f)
    for mm, nn, kk in [(1, 1, 1), (7, 97, 13), (128, 64, 1000), (1000, 13, 2)]:
        a, b, c = _rand(mm, kk), _rand(kk, nn), _rand(nn)
        ref = np.maximum(a.astype(np.float64) @ b + c, 0)
        np.testing.assert_allclose(f(a, b, c), ref, rtol=1e-4, atol=1e-3)


# ** TVM's GEMM walk-through ("How to optimize GEMM on CPU") with symbolic M, N, K **

TUTORIAL = GemmTutorial(bn=32)
GEMMS = {"blocking": (TUTORIAL.blocking, False), "vectorize": (TUTORIAL.vectorize, False),
         "loop_permutation": (TUTORIAL.loop_permutation, False), "array_packing": (TUTORIAL.array_packing, True),
         "write_cache_parallel": (TUTORIAL.parallel, True)}
GEMM_SIZES = [(1, 1, 1), (2, 13, 7), (64, 128, 97), (97, 1000, 64), (128, 2, 1000), (1000, 97, 13)]  # M, N, K


@pytest.mark.parametrize("name", list(GEMMS))
def test_tvm_gemm_walk_through_symbolic(name):
    schedule, packed = GEMMS[name]
    A, B, C, P = TUTORIAL.compute(te.var("M"), te.var("N"), te.var("K"), packed)
    s = jitop.create_schedule(C.op)
    schedule(s, A, B, C, P)
    f = jitop.build(s, [A, B, C], target=TARGET)
    for m, n, k in GEMM_SIZES:
        a, b = _rand(m, k), _rand(k, n)
        c = np.full((m, n), np.nan, np.float32)
        f(a, b, c)
        _check(c, a, b)
        f(a, b, c)  # a second call on the same output does not accumulate into it
        _check(c, a, b)
