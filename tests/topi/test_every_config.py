"""A template must be right for every config the tuner may pick.

For small, awkward workloads (sizes that no tile divides, batches, broadcast operands, strides, dilation,
groups, depthwise), every point of the template's ConfigSpace is built from te placeholders with the
template's compute + schedule and `jitop.build`, run, and compared with numpy. Parallel loops are made to
really run on threads (JITOP_PARALLEL_MIN_WORK=1), as they do at tuning sizes.

Configs whose loop IR is identical to one already built (e.g. the conv template ignores `pack` when the
rows are outermost) are lowered and checked but not compiled again. A build costs 0.1-0.9 s, so the two
largest spaces (matmul 13x37x9: 288 points, conv nhwc_groups2_oc20_asym: 112) are SAMPLED, deterministically:
see `_sample`. Every knob value still occurs in the sample (test_samples_cover_every_knob_value), and the
default config of each workload is always included. All other spaces are built in full: 364 configs,
~325 distinct compiles, ~55 s on a 2-core machine.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import jitop
from jitop import te
from jitop.topi import conv2d as tc
from jitop.topi import matmul as tm
from jitop.topi.cpu import CPU, host
from jitop.tuner.space import Config, ConfigSpace

RNG = np.random.default_rng(7)
_BUILT: dict[str, object] = {}  # loop IR text -> compiled module (identical IR is compiled once)


def _sample(space: ConfigSpace, limit: int | None, always: tuple[int, ...] = ()) -> list[int]:
    """All indices if the space has at most `limit` points; otherwise every k-th index, k the smallest step
    >= len/limit that is coprime with the size of every knob (so the fastest knob takes all its values, and the
    stride is not aligned with any knob's radix), plus the last index and `always`."""
    n = len(space)
    if limit is None or n <= limit:
        return list(range(n))
    k = math.ceil(n / limit)
    while any(math.gcd(k, len(knob)) != 1 for knob in space.knobs):
        k += 1
    picked = set(range(0, n, k)) | {n - 1} | set(always)
    offset = k // 2  # a coprime step may be much larger than n / limit: a second sweep keeps the sample dense
    while len(picked) < limit * 3 // 4 and offset < k:
        picked |= set(range(offset, n, k))
        offset += 1
    return sorted(picked)


def _build(s, args):
    func = jitop.lower(s, args)
    key = str(func)
    if key not in _BUILT:
        _BUILT[key] = jitop.build(func)
    return _BUILT[key]


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    # read at build time: parallel loops of these small workloads get real threads, not a serial loop
    monkeypatch.setenv("JITOP_PARALLEL_MIN_WORK", "1")


def _close(got, ref, magnitude, dtype) -> None:
    assert got.dtype == np.dtype(dtype)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    err = np.abs(got.astype(np.float64) - ref)
    bound = 32 * np.finfo(dtype).eps * magnitude + np.finfo(dtype).tiny
    bad = err > bound
    assert not bad.any(), \
        f"{bad.sum()} of {bad.size} wrong, e.g. at {np.argwhere(bad)[0].tolist()}: max err {err.max():.3g}"


# ** matmul **

MATMUL = {  # name: (batch of C, batch of B, m, n, k, dtype, limit on the configs built (None: all))
    # 288 points: sampled (every 7th, ~42 builds); every tile_m, tile_n, tile_k and order value occurs
    "13x37x9_f32": ((), (), 13, 37, 9, "float32", 45),
    "b2_5x17x3_f32": ((2,), (2,), 5, 17, 3, "float32", None),
    "b3_4x9x5_f64_shared_B": ((3,), (), 4, 9, 5, "float64", None),   # B broadcast over C's batch
    "b2x1_3x20x2_f32_broadcast_B": ((2, 3), (1, 3), 3, 20, 2, "float32", None),
    "1x1x1_f32": ((), (), 1, 1, 1, "float32", None),
    "2x70x1_f64": ((), (), 2, 70, 1, "float64", None),
    # K long enough for K chunks (k_chunk 256 / 512: the last chunk partial), sampled
    "5x37x600_f32_k_chunks": ((), (), 5, 37, 600, "float32", 30),
    "b2_3x20x300_f64_shared_B_k_chunks": ((2,), (), 3, 20, 300, "float64", 30),
}


def _matmul_space(name):
    _, _, m, n, k, dtype, _ = MATMUL[name]
    return tm.config_space(m, n, k, np.dtype(dtype).itemsize)


def _matmul_cases():
    for name, (_, _, m, n, k, dtype, limit) in MATMUL.items():
        space = _matmul_space(name)
        default = space.index_of(tm.default_config(m, n, k, np.dtype(dtype).itemsize).to_config(m, n, k))
        for idx in _sample(space, limit, (default,)):
            yield pytest.param(name, idx, id=f"{name}-{idx}")


_MATMUL_DATA: dict[str, tuple] = {}


def _matmul_data(name):
    if name not in _MATMUL_DATA:
        batch, b_batch, m, n, k, dtype, _ = MATMUL[name]
        a = RNG.standard_normal(batch + (m, k)).astype(dtype)
        b = RNG.standard_normal(b_batch + (k, n)).astype(dtype)
        ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
        magnitude = np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
        _MATMUL_DATA[name] = a, b, ref, magnitude
    return _MATMUL_DATA[name]


@pytest.mark.parametrize("name, idx", list(_matmul_cases()))
def test_matmul_every_config(name, idx):
    batch, b_batch, m, n, k, dtype, _ = MATMUL[name]
    cfg = tm.MatmulConfig.from_config(_matmul_space(name).get(idx))
    A = te.placeholder(batch + (m, k), dtype, name="A")
    B = te.placeholder(b_batch + (k, n), dtype, name="B")
    lead = len(batch) - len(b_batch)

    def b_index(bi):  # numpy broadcasting of B's batch dims against C's
        return tuple(te.const(0) if d == 1 else bi[lead + j] for j, d in enumerate(b_batch))
    t = tm.matmul(lambda bi, i, r: A[bi + (i, r)], lambda bi, r, j: B[bi + (r, j)], batch, m, n, k, dtype,
                  cfg, b_batch=b_batch, b_index=b_index)
    C = t.out
    s = jitop.create_schedule(C.op)
    tm.schedule(s, t, cfg)
    f = _build(s, [A, B, C])
    a, b, ref, magnitude = _matmul_data(name)
    _close(f(a, b), ref, magnitude, dtype)


# ** conv2d **

CONV = {  # name: (Workload, limit on the configs built (None: all))
    "nchw_1x5x6x7_oc7_3x3_pad1": (tc.Workload(1, 5, 6, 7, 7, 3, 3, pads=(1, 1, 1, 1)), None),
    "nhwc_stride2_dil2_groups2": (tc.Workload(2, 4, 9, 8, 6, 3, 2, stride=(2, 2), pads=(1, 1, 0, 2),
                                              dilation=(2, 2), groups=2, layout="NHWC"), None),
    "nchw_depthwise_x2_f64": (tc.Workload(1, 6, 5, 5, 12, 3, 3, pads=(1, 1, 1, 1), groups=6, itemsize=8), None),
    "nhwc_depthwise_stride_2x1": (tc.Workload(2, 3, 4, 6, 3, 2, 3, stride=(2, 1), pads=(0, 1, 1, 1), groups=3,
                                              layout="NHWC"), None),
    # 112 points: sampled (every 3rd, 38 builds); oc 20 = a full and a partial vector of float32 channels
    "nhwc_groups2_oc20_asym": (tc.Workload(1, 6, 5, 11, 20, 2, 3, stride=(1, 2), pads=(1, 0, 2, 2), groups=2,
                                           layout="NHWC"), 40),
}


def _conv_cases():
    for name, (wl, limit) in CONV.items():
        space = tc.config_space(wl)
        default = space.index_of(tc.default_config(wl).to_config(wl))
        for idx in _sample(space, limit, (default,)):
            yield pytest.param(name, idx, id=f"{name}-{idx}")


def _conv_reference(x, w, wl: tc.Workload):
    """float64 NCHW/NHWC convolution: per output channel and kernel tap, a strided window of the padded input."""
    x = x.astype(np.float64)
    w = w.astype(np.float64)
    if wl.layout == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    top, bottom, left, right = wl.pads
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    (sh, sw), (dh, dw) = wl.stride, wl.dilation
    out = np.zeros((wl.n, wl.oc, wl.oh, wl.ow))
    for o in range(wl.oc):
        g = o // wl.ocg
        for r in range(wl.kh):
            for s in range(wl.kw):
                win = xp[:, g * wl.icg:(g + 1) * wl.icg, r * dh::sh, s * dw::sw][:, :, :wl.oh, :wl.ow]
                out[:, o] += np.einsum("nchw,c->nhw", win, w[o, :, r, s])
    return out.transpose(0, 2, 3, 1) if wl.layout == "NHWC" else out


_CONV_DATA: dict[str, tuple] = {}


def _conv_data(name):
    if name not in _CONV_DATA:
        wl, _ = CONV[name]
        dtype = {4: np.float32, 8: np.float64}[wl.itemsize]
        x = RNG.standard_normal((wl.n, wl.c, wl.h, wl.w) if wl.layout == "NCHW" else (wl.n, wl.h, wl.w, wl.c))
        w = RNG.standard_normal((wl.oc, wl.icg, wl.kh, wl.kw))
        x, w = x.astype(dtype), w.astype(dtype)
        ref = _conv_reference(x, w, wl)
        assert ref.shape == wl.out_shape
        _CONV_DATA[name] = x, w, ref, _conv_reference(np.abs(x), np.abs(w), wl)
    return _CONV_DATA[name]


@pytest.mark.parametrize("name, idx", list(_conv_cases()))
def test_conv2d_every_config(name, idx):
    wl, _ = CONV[name]
    dtype = {4: "float32", 8: "float64"}[wl.itemsize]
    cfg = tc.Conv2dConfig.from_config(tc.config_space(wl).get(idx))
    xshape = (wl.n, wl.c, wl.h, wl.w) if wl.layout == "NCHW" else (wl.n, wl.h, wl.w, wl.c)
    X = te.placeholder(xshape, dtype, name="X")
    W = te.placeholder((wl.oc, wl.icg, wl.kh, wl.kw), dtype, name="W")
    if wl.layout == "NCHW":
        def read_input(b, ch, y, x):
            return X[b, ch, y, x]
    else:
        def read_input(b, ch, y, x):
            return X[b, y, x, ch]
    t = tc.conv2d(read_input, lambda o, i, r, s: W[o, i, r, s], wl, dtype, cfg)
    s = jitop.create_schedule(t.out.op)
    tc.schedule(s, t, wl, cfg)
    f = _build(s, [X, W, t.out])
    x, w, ref, magnitude = _conv_data(name)
    _close(f(x, w), ref, magnitude, dtype)


def test_samples_cover_every_knob_value():
    """The sampled spaces still try every candidate of every knob (and are a real fraction of the space)."""
    spaces = [(_matmul_space(n), MATMUL[n][-1]) for n in MATMUL] + \
        [(tc.config_space(wl), limit) for wl, limit in CONV.values()]
    for space, limit in spaces:
        picked = [space.get(i) for i in _sample(space, limit)]
        assert len(picked) >= min(len(space), limit or len(space)) * 3 // 4
        for knob in space.knobs:
            assert {c[knob.name] for c in picked} == set(knob.candidates), (space, knob.name)


# ** defaults lie in the space; configs are plain data **

CPUS = {
    "host": None,
    "avx512_64_threads": CPU(vector_bytes=64, vector_registers=32, threads=64),
    "avx2": CPU(vector_bytes=32, vector_registers=16, threads=8),
    "sse": CPU(vector_bytes=16, vector_registers=16, threads=1),
}

MATMUL_SHAPES = [(1, 1, 1), (1, 1000, 1), (1000, 1, 3), (13, 37, 9), (6, 64, 4), (7, 65, 2), (64, 64, 64),
                 (100, 17, 300), (512, 512, 512), (3, 4096, 5), (4096, 3, 4096)]


@pytest.mark.parametrize("cpu", list(CPUS))
@pytest.mark.parametrize("itemsize", [4, 8])
def test_matmul_default_config_is_a_point_of_the_space(cpu, itemsize):
    for m, n, k in MATMUL_SHAPES:
        space = tm.config_space(m, n, k, itemsize, CPUS[cpu])
        cfg = tm.default_config(m, n, k, itemsize, CPUS[cpu])
        point = cfg.to_config(m, n, k)
        idx = space.index_of(point)
        assert space.get(idx) == point
        assert tm.MatmulConfig.from_config(point) == cfg, (m, n, k)


CONV_WORKLOADS = [
    tc.Workload(1, 3, 224, 224, 64, 7, 7, stride=(2, 2), pads=(3, 3, 3, 3)),
    tc.Workload(1, 64, 56, 56, 64, 3, 3, pads=(1, 1, 1, 1)),
    tc.Workload(8, 256, 14, 14, 512, 1, 1, stride=(2, 2), layout="NHWC"),
    tc.Workload(1, 32, 112, 112, 32, 3, 3, pads=(1, 1, 1, 1), groups=32),            # depthwise
    tc.Workload(1, 32, 17, 17, 64, 3, 3, pads=(1, 1, 1, 1), groups=32, itemsize=8),  # depthwise x2
    tc.Workload(2, 12, 9, 10, 24, 3, 3, pads=(1, 1, 1, 1), groups=3),                # 8 channels per group
    tc.Workload(2, 12, 9, 10, 60, 3, 3, pads=(1, 1, 1, 1), groups=3),                # 20 channels per group
    tc.Workload(1, 5, 1, 1, 7, 3, 3, pads=(1, 1, 1, 1)),
    tc.Workload(1, 1, 7, 11, 1, 1, 1),
    tc.Workload(1, 7, 30, 3, 100, 2, 2, stride=(1, 1), pads=(0, 1, 0, 1), dilation=(2, 1), layout="NHWC"),
    tc.Workload(3, 6, 40, 40, 6, 5, 5, stride=(2, 2), pads=(2, 2, 2, 2), groups=2, itemsize=8),
    tc.Workload(1, 0, 4, 4, 4, 3, 3),                                                # no input channels
]


@pytest.mark.parametrize("cpu", list(CPUS))
def test_conv2d_default_config_is_a_point_of_the_space(cpu):
    for base in CONV_WORKLOADS:
        for layout in ("NCHW", "NHWC"):
            wl = dataclasses.replace(base, layout=layout)
            space = tc.config_space(wl, CPUS[cpu])
            cfg = tc.default_config(wl, CPUS[cpu])
            point = cfg.to_config(wl)
            idx = space.index_of(point)
            assert space.get(idx) == point
            assert tc.Conv2dConfig.from_config(point) == cfg, wl
            assert cfg.bn % (CPUS[cpu] or host()).lanes(wl.itemsize) == 0


def _all_spaces():
    for name in MATMUL:
        yield pytest.param(f"matmul-{name}", _matmul_space(name), lambda cfg, n=name:
                           tm.MatmulConfig.from_config(cfg).to_config(*MATMUL[n][2:5]), id=f"matmul-{name}")
    for name, (wl, _) in CONV.items():
        yield pytest.param(f"conv2d-{name}", tc.config_space(wl), lambda cfg, wl=wl:
                           tc.Conv2dConfig.from_config(cfg).to_config(wl), id=f"conv2d-{name}")


@pytest.mark.parametrize("name, space, typed_round_trip", list(_all_spaces()))
def test_every_point_round_trips(name, space, typed_round_trip):
    """index -> Config -> JSON -> Config -> index, and Config -> typed config -> Config, for every point."""
    seen = set()
    for idx in range(len(space)):
        cfg = space.get(idx)
        back = Config.from_json(cfg.to_json())
        assert back == cfg and hash(back) == hash(cfg)
        assert space.index_of(back) == idx
        assert typed_round_trip(cfg) == cfg, (name, idx)
        seen.add(cfg)
    assert len(seen) == len(space)  # distinct indices are distinct configs
