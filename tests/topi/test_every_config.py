"""A template must be right for every config the tuner may pick.

For small, awkward workloads (sizes that no tile divides, batches, broadcast operands, strides, dilation,
groups, depthwise), every point of the template's ConfigSpace is built from te placeholders with the
template's `build` (through the registry's functions) and `jitop.build`, run, and compared with numpy, for
each Target whose code this machine runs: the host and haswell (AVX2: 16 registers, 8 float32 lanes), whose
spaces differ. Parallel loops are made to really run on threads (the Target's parallel_min_work=1), as
they do at tuning sizes.

Configs whose loop IR is identical to one already built (e.g. the conv template ignores `pack` when the
rows are outermost) are lowered and checked but not compiled again. A build costs 0.1-0.9 s and the spaces
hold ~5,000 points on two targets, so each space is SAMPLED, deterministically, by `_pairwise`: every value
of every knob, and every pair of values of any two knobs, occurs in some built config (a covering array of
strength 2: a template bug that needs two knobs to meet is still found), and each workload's default config
is always built. About 500 builds instead of ~2,500 (test_samples_cover_every_pair_of_knob_values).
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

import jitop
from jitop import te
from jitop.target import Target
from jitop.topi import conv2d as tc
from jitop.topi import matmul as tm
from jitop.tuner.space import Config, ConfigSpace

from kernel_checks import conv2d_reference
from targets import HOST, runnable_targets

RNG = np.random.default_rng(7)
_BUILT: dict[str, object] = {}  # loop IR text -> compiled module (identical IR is compiled once)


def _pairwise(space: ConfigSpace, always: tuple[int, ...] = ()) -> list[int]:
    """Indices of a covering array of strength 2: `always`, then greedily the point that covers the most
    (knob, value) pairs not covered yet (lowest index on ties), until every pair of values of every two knobs
    occurs in some picked point. Deterministic; a space with a single knob is taken whole."""
    points = [_value_pairs(space, space.get(i)) for i in range(len(space))]
    uncovered = set().union(*points) if points else set()
    picked: list[int] = []
    for i in always:
        picked.append(i)
        uncovered -= points[i]
    while uncovered:
        best = max(range(len(points)), key=lambda i: (len(points[i] & uncovered), -i))
        picked.append(best)
        uncovered -= points[best]
    return sorted(set(picked))


def _value_pairs(space: ConfigSpace, config: Config) -> set[tuple]:
    """Every (knob, value) of `config` alone and every two of them together."""
    values = [(knob.name, repr(config[knob.name])) for knob in space.knobs]
    return {(v,) for v in values} | set(itertools.combinations(values, 2))


def _build(s, args, target: Target):
    func = jitop.lower(s, args)
    key = f"{target.key}\n{func}"
    if key not in _BUILT:
        # parallel loops of these small workloads get real threads, not a serial loop
        _BUILT[key] = jitop.build(func, target=target.replace(parallel_min_work=1))
    return _BUILT[key]


def _close(got, ref, magnitude, dtype) -> None:
    assert got.dtype == np.dtype(dtype)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    err = np.abs(got.astype(np.float64) - ref)
    bound = 32 * np.finfo(dtype).eps * magnitude + np.finfo(dtype).tiny
    bad = err > bound
    assert not bad.any(), \
        f"{bad.sum()} of {bad.size} wrong, e.g. at {np.argwhere(bad)[0].tolist()}: max err {err.max():.3g}"


# ** matmul **

MATMUL = {  # name: (batch of C, batch of B, m, n, k, dtype)
    "13x37x9_f32": ((), (), 13, 37, 9, "float32"),
    "b2_5x17x3_f32": ((2,), (2,), 5, 17, 3, "float32"),
    "b3_4x9x5_f64_shared_B": ((3,), (), 4, 9, 5, "float64"),   # B broadcast over C's batch
    "b2x1_3x20x2_f32_broadcast_B": ((2, 3), (1, 3), 3, 20, 2, "float32"),
    "1x1x1_f32": ((), (), 1, 1, 1, "float32"),
    "2x70x1_f64": ((), (), 2, 70, 1, "float64"),
    # K long enough for K chunks (k_chunk 256 / 512: the last chunk partial)
    "5x37x600_f32_k_chunks": ((), (), 5, 37, 600, "float32"),
    "b2_3x20x300_f64_shared_B_k_chunks": ((2,), (), 3, 20, 300, "float64"),
}


def _matmul_workload(name) -> tm.MatmulWorkload:
    batch, b_batch, m, n, k, dtype = MATMUL[name]
    return tm.MatmulWorkload(m, n, k, dtype, a_batch=batch, b_batch=b_batch)


def _matmul_space(name, target=HOST):
    return tm.config_space(_matmul_workload(name), target)


def _matmul_cases():
    for target in runnable_targets():
        t = target.values[0]
        for name in MATMUL:
            space = _matmul_space(name, t)
            default = space.index_of(tm.default_config(_matmul_workload(name), t))
            for idx in _pairwise(space, (default,)):
                yield pytest.param(name, idx, t, id=f"{target.id}-{name}-{idx}")


_MATMUL_DATA: dict[str, tuple] = {}


def _matmul_data(name):
    if name not in _MATMUL_DATA:
        batch, b_batch, m, n, k, dtype = MATMUL[name]
        a = RNG.standard_normal(batch + (m, k)).astype(dtype)
        b = RNG.standard_normal(b_batch + (k, n)).astype(dtype)
        ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
        magnitude = np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
        _MATMUL_DATA[name] = a, b, ref, magnitude
    return _MATMUL_DATA[name]


@pytest.mark.parametrize("name, idx, target", list(_matmul_cases()))
def test_matmul_every_config(name, idx, target):
    wl = _matmul_workload(name)
    s, args = tm.TEMPLATE.build(wl, _matmul_space(name, target).get(idx), target)
    f = _build(s, args, target)
    a, b, ref, magnitude = _matmul_data(name)
    _close(f(a, b), ref, magnitude, wl.dtype)


# ** conv2d **

CONV = {  # name: Workload
    "nchw_1x5x6x7_oc7_3x3_pad1": tc.Conv2dWorkload(1, 5, 6, 7, 7, 3, 3, pads=(1, 1, 1, 1)),
    "nhwc_stride2_dil2_groups2": tc.Conv2dWorkload(2, 4, 9, 8, 6, 3, 2, stride=(2, 2), pads=(1, 1, 0, 2),
                                             dilation=(2, 2), groups=2, layout="NHWC"),
    "nchw_depthwise_x2_f64": tc.Conv2dWorkload(1, 6, 5, 5, 12, 3, 3, pads=(1, 1, 1, 1), groups=6, dtype="float64"),
    "nhwc_depthwise_stride_2x1": tc.Conv2dWorkload(2, 3, 4, 6, 3, 2, 3, stride=(2, 1), pads=(0, 1, 1, 1), groups=3,
                                             layout="NHWC"),
    # many channels on a 3x3 output: the gemm algorithm applies (its knobs describe the matmul);
    # oc 20 = a full and a partial vector of float32 channels
    "nchw_gemm_oc24_on_3x3": tc.Conv2dWorkload(1, 5, 3, 3, 24, 3, 3, pads=(1, 1, 1, 1)),
    "nhwc_groups2_oc20_asym": tc.Conv2dWorkload(1, 6, 5, 11, 20, 2, 3, stride=(1, 2), pads=(1, 0, 2, 2), groups=2,
                                          layout="NHWC"),
    # whole-row tiles (tile_ow (1, 6)) take two output rows where the registers allow: 5 rows, a 1-row tail
    "nhwc_3x3_two_row_tiles": tc.Conv2dWorkload(1, 8, 5, 6, 32, 3, 3, pads=(1, 1, 1, 1), layout="NHWC"),
    # an image's 3 channels: the direct algorithm's padded copy is planar (n, row, channel, column)
    "nhwc_stem_3ch_7x7_stride2": tc.Conv2dWorkload(1, 3, 13, 10, 16, 7, 7, stride=(2, 2), pads=(3, 3, 3, 3),
                                                   layout="NHWC"),
    # 512 float32 channels (2 KiB pixels): the padded copy's pixels are spaced one cache line further apart
    "nhwc_512ch_3x3_stride2_pitched": tc.Conv2dWorkload(1, 512, 5, 4, 16, 3, 3, stride=(2, 2), pads=(1, 1, 1, 1),
                                                        layout="NHWC"),
    # unpadded NHWC 1x1: gemm with the pixels as rows (9x8 / 2 -> 5x4 = 20 pixels), 20 channels
    "nhwc_1x1_stride2_oc20": tc.Conv2dWorkload(2, 7, 9, 8, 20, 1, 1, stride=(2, 2), layout="NHWC"),
}


def _conv_cases():
    for target in runnable_targets():
        t = target.values[0]
        for name, wl in CONV.items():
            space = tc.config_space(wl, t)
            default = space.index_of(tc.default_config(wl, t))
            for idx in _pairwise(space, (default,)):
                yield pytest.param(name, idx, t, id=f"{target.id}-{name}-{idx}")


_CONV_DATA: dict[str, tuple] = {}


def _conv_data(name):
    if name not in _CONV_DATA:
        wl = CONV[name]
        dtype = wl.dtype
        x = RNG.standard_normal((wl.n, wl.c, wl.h, wl.w) if wl.layout == "NCHW" else (wl.n, wl.h, wl.w, wl.c))
        w = RNG.standard_normal((wl.oc, wl.icg, wl.kh, wl.kw))
        x, w = x.astype(dtype), w.astype(dtype)
        ref = conv2d_reference(x, w, wl)
        assert ref.shape == wl.out_shape
        _CONV_DATA[name] = x, w, ref, conv2d_reference(np.abs(x), np.abs(w), wl)
    return _CONV_DATA[name]


@pytest.mark.parametrize("name, idx, target", list(_conv_cases()))
def test_conv2d_every_config(name, idx, target):
    wl = CONV[name]
    s, args = tc.TEMPLATE.build(wl, tc.config_space(wl, target).get(idx), target)
    f = _build(s, args, target)
    x, w, ref, magnitude = _conv_data(name)
    _close(f(x, w), ref, magnitude, wl.dtype)


def test_samples_cover_every_pair_of_knob_values():
    """Each sample holds every pair of values of every two knobs (the space is their product, so every pair
    exists), and is a real saving on the larger spaces."""
    spaces = [_matmul_space(n) for n in MATMUL] + [tc.config_space(wl, HOST) for wl in CONV.values()]
    for space in spaces:
        picked = [space.get(i) for i in _pairwise(space)]
        for a, b in itertools.combinations(space.knobs, 2):
            seen = {(repr(c[a.name]), repr(c[b.name])) for c in picked}
            assert len(seen) == len(a.candidates) * len(b.candidates), (space, a.name, b.name)
    largest = max(spaces, key=len)
    assert len(_pairwise(largest)) < len(largest) // 10


# ** defaults lie in the space; configs are plain data **

CPUS = {  # defaults are only derived here, never run: any Target will do
    "host": HOST,
    "avx512_64_threads": Target.from_string("x86-64-v4").replace(threads=64),
    "avx2": Target.from_string("haswell").replace(threads=8),
    "sse": Target.from_string("x86-64-v2").replace(threads=1),
}

MATMUL_SHAPES = [(1, 1, 1), (1, 1000, 1), (1000, 1, 3), (13, 37, 9), (6, 64, 4), (7, 65, 2), (64, 64, 64),
                 (100, 17, 300), (512, 512, 512), (3, 4096, 5), (4096, 3, 4096)]


@pytest.mark.parametrize("k, n, bn, k_chunk", [(8192, 128, 64, 0), (8192, 64, 32, 0), (8192, 16, 16, 0),
                                                (1024, 64, 64, 0), (8192, 2304, 256, 256)])
def test_a_one_row_product_has_a_panel_per_thread_where_its_width_allows(k, n, bn, k_chunk):
    """[1, k] @ [k, n] float32 on 16 lanes and 2 threads: the row's only parallel loop is over panels, so a
    narrow B of 1 MiB or more is split into one panel per thread (at least 2 vectors wide; a smaller one is
    read faster than a parallel launch costs), and K is cut into chunks only where a chunk is enough work for
    a parallel launch (a decode step's 2304-wide weights)."""
    target = Target.from_string("x86-64-v4").replace(threads=2)
    typed = tm.MatmulConfig.from_config(tm.default_config(tm.MatmulWorkload(1, n, k, "float32"), target))
    assert (typed.bn, typed.k_chunk) == (bn, k_chunk)


@pytest.mark.parametrize("cpu", list(CPUS))
@pytest.mark.parametrize("itemsize", [4, 8])
def test_matmul_default_config_is_a_point_of_the_space(cpu, itemsize):
    target = CPUS[cpu]
    for m, n, k in MATMUL_SHAPES:
        wl = tm.MatmulWorkload(m, n, k, {4: "float32", 8: "float64"}[itemsize])
        space = tm.config_space(wl, target)
        point = tm.default_config(wl, target)
        idx = space.index_of(point)
        assert space.get(idx) == point
        typed = tm.MatmulConfig.from_config(point)
        assert typed.to_config(m, n, k) == point, (m, n, k)
        # the register tile and its operands fit the Target's vector registers
        vectors = typed.bn // target.lanes(itemsize)
        assert typed.mr * vectors + vectors + 1 <= target.vector_registers or m == 1, (m, n, k, typed)


CONV_WORKLOADS = [
    tc.Conv2dWorkload(1, 3, 224, 224, 64, 7, 7, stride=(2, 2), pads=(3, 3, 3, 3)),
    tc.Conv2dWorkload(1, 64, 56, 56, 64, 3, 3, pads=(1, 1, 1, 1)),
    tc.Conv2dWorkload(8, 256, 14, 14, 512, 1, 1, stride=(2, 2), layout="NHWC"),
    tc.Conv2dWorkload(1, 32, 112, 112, 32, 3, 3, pads=(1, 1, 1, 1), groups=32),            # depthwise
    tc.Conv2dWorkload(1, 32, 17, 17, 64, 3, 3, pads=(1, 1, 1, 1), groups=32, dtype="float64"),  # depthwise x2
    tc.Conv2dWorkload(2, 12, 9, 10, 24, 3, 3, pads=(1, 1, 1, 1), groups=3),                # 8 channels per group
    tc.Conv2dWorkload(2, 12, 9, 10, 60, 3, 3, pads=(1, 1, 1, 1), groups=3),                # 20 channels per group
    tc.Conv2dWorkload(1, 5, 1, 1, 7, 3, 3, pads=(1, 1, 1, 1)),
    tc.Conv2dWorkload(1, 1, 7, 11, 1, 1, 1),
    tc.Conv2dWorkload(1, 7, 30, 3, 100, 2, 2, stride=(1, 1), pads=(0, 1, 0, 1), dilation=(2, 1), layout="NHWC"),
    tc.Conv2dWorkload(3, 6, 40, 40, 6, 5, 5, stride=(2, 2), pads=(2, 2, 2, 2), groups=2, dtype="float64"),
    tc.Conv2dWorkload(1, 0, 4, 4, 4, 3, 3),                                                # no input channels
]


@pytest.mark.parametrize("cpu", list(CPUS))
def test_conv2d_default_config_is_a_point_of_the_space(cpu):
    for base in CONV_WORKLOADS:
        for layout in ("NCHW", "NHWC"):
            wl = dataclasses.replace(base, layout=layout)
            space = tc.config_space(wl, CPUS[cpu])
            point = tc.default_config(wl, CPUS[cpu])
            idx = space.index_of(point)
            assert space.get(idx) == point
            cfg = tc.Conv2dConfig.from_config(point)
            assert cfg.to_config(wl) == point, wl
            assert cfg.bn % CPUS[cpu].lanes(wl.itemsize) == 0


def _all_spaces():
    for name in MATMUL:
        yield pytest.param(f"matmul-{name}", _matmul_space(name), lambda cfg, n=name:
                           tm.MatmulConfig.from_config(cfg).to_config(*MATMUL[n][2:5]), id=f"matmul-{name}")
    for name, wl in CONV.items():
        yield pytest.param(f"conv2d-{name}", tc.config_space(wl, HOST), lambda cfg, wl=wl:
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


@pytest.mark.parametrize("cpu", list(CPUS))
def test_conv2d_gemm_default_is_the_matmul_default(cpu):
    """On a small output (1x1 .. 4x4) the gemm algorithm's register tile is the matmul template's default
    for the same product (OC x OH*OW x C*KH*KW), not cut down to the output width."""
    target = CPUS[cpu]
    for hw in (1, 2, 4):
        wl = tc.Conv2dWorkload(1, 64, hw, hw, 512, 3, 3, pads=(1, 1, 1, 1))
        cfg = tc.Conv2dConfig.from_config(tc.default_config(wl, target))
        mm = tm.default_tile(512, hw * hw, 64 * 9, 4, target)
        assert cfg.algorithm == "gemm"
        assert (cfg.mr, cfg.bn, cfg.ic_unroll, not cfg.oc_outer) == (mm.mr, mm.bn, mm.k_unroll, mm.panel_outer), hw


@pytest.mark.parametrize("cpu", list(CPUS))
def test_conv2d_default_is_gemm_for_every_1x1_nchw_convolution(cpu):
    """A 1x1 convolution is a plain matmul: the default takes the gemm algorithm whatever the output size, in
    NCHW and, unpadded, in NHWC (3x3 ones on a large output stay direct; grouped and padded NHWC ones cannot
    use gemm)."""
    target = CPUS[cpu]
    for c, oc, hw, stride in ((64, 256, 56, 1), (256, 64, 56, 1), (64, 128, 56, 2), (3, 5, 7, 1)):
        wl = tc.Conv2dWorkload(1, c, hw, hw, oc, 1, 1, stride=(stride, stride))
        assert tc.Conv2dConfig.from_config(tc.default_config(wl, target)).algorithm == "gemm", (c, oc, hw)
    big_3x3 = tc.Conv2dWorkload(1, 64, 56, 56, 64, 3, 3, pads=(1, 1, 1, 1))
    assert tc.Conv2dConfig.from_config(tc.default_config(big_3x3, target)).algorithm == "direct"
    for stride in (1, 2):
        nhwc = tc.Conv2dWorkload(1, 64, 56, 56, 256, 1, 1, stride=(stride, stride), layout="NHWC")
        assert tc.Conv2dConfig.from_config(tc.default_config(nhwc, target)).algorithm == "gemm"
    for kernel, pads in ((1, (1, 1, 1, 1)), (3, (1, 1, 1, 1))):
        nhwc = tc.Conv2dWorkload(1, 64, 56, 56, 256, kernel, kernel, pads=pads, layout="NHWC")
        assert tc.Conv2dConfig.from_config(tc.default_config(nhwc, target)).algorithm == "direct"


@pytest.mark.parametrize("cpu", list(CPUS))
def test_conv2d_default_is_gemm_when_the_direct_tile_does_not_divide_the_output_channels(cpu):
    """Direct's ragged last tile of output channels ran 1.5-8x slower than gemm (37 -> 53 channels: 91 vs 237
    GFLOP/s on AVX-512): such NCHW convolutions default to gemm, whose pixel tile is 1, 2 or 4 whole vectors."""
    target = CPUS[cpu]
    lanes = target.lanes(4)
    ragged = 0
    for c, oc, hw in ((37, 53, 61), (48, 40, 28), (64, 100, 30), (16, 24, 56)):
        wl = tc.Conv2dWorkload(1, c, hw, hw, oc, 3, 3, pads=(1, 1, 1, 1))
        cfg = tc.Conv2dConfig.from_config(tc.default_config(wl, target))
        if oc % tc.default_tile(wl, target).bn:  # the direct register tile's channels
            ragged += 1
            assert cfg.algorithm == "gemm", (c, oc, hw)
            assert cfg.bn in (lanes, 2 * lanes, 4 * lanes), (c, oc, hw, cfg.bn)
    assert ragged >= 2
    whole = tc.Conv2dWorkload(1, 64, 56, 56, 64, 3, 3, pads=(1, 1, 1, 1))  # ResNet-18 layer1: tiles divide
    assert tc.Conv2dConfig.from_config(tc.default_config(whole, target)).algorithm == "direct"
    ragged_nhwc = tc.Conv2dWorkload(1, 37, 61, 61, 53, 3, 3, pads=(1, 1, 1, 1), layout="NHWC")  # no gemm there
    assert tc.Conv2dConfig.from_config(tc.default_config(ragged_nhwc, target)).algorithm == "direct"


def test_a_whole_row_direct_tile_takes_two_rows_where_the_registers_allow():
    """ResNet's 7x7 512-channel 3x3 convolution on AVX-512: the default tile is a whole row (7 pixels x 2
    vectors); two rows' accumulators and operands fit the 32 registers, so the tile is 2 rows. A 14-wide row
    does not fit twice; on AVX2 (16 registers) only a 1-vector whole row does; never in NCHW (its lanes
    scatter to channel planes)."""
    avx512, avx2 = Target.from_string("skylake-avx512"), Target.from_string("haswell")
    for h, rows in ((7, 2), (14, 1)):
        wl = tc.Conv2dWorkload(1, 512, h, h, 512, 3, 3, pads=(1, 1, 1, 1), layout="NHWC")
        cfg = tc.Conv2dConfig.from_config(tc.default_config(wl, avx512))
        assert cfg.algorithm == "direct" and tc._tile_rows(wl, cfg, avx512) == rows, (h, cfg)
    wl = tc.Conv2dWorkload(1, 512, 7, 7, 512, 3, 3, pads=(1, 1, 1, 1), layout="NHWC")
    assert tc._tile_rows(wl, tc.Conv2dConfig(mr=7, bn=8), avx2) == 2
    assert tc._tile_rows(wl, tc.Conv2dConfig(mr=7, bn=16), avx2) == 1
    assert tc._tile_rows(dataclasses.replace(wl, layout="NCHW"), tc.Conv2dConfig(mr=7, bn=8), avx2) == 1


def test_fewer_channels_than_a_vector_pad_into_channel_planes():
    """The stem's padded copy holds channel planes (vectors along each row), a wide input stays channels-last.
    Either is padded by all of `pads`: 10 + 3 + 3 = 16 columns, though stride 2 reads only 15 of them."""
    target = Target.from_string("skylake-avx512")
    for c, planar in ((3, True), (16, False)):
        wl = tc.Conv2dWorkload(1, c, 13, 10, 16, 7, 7, stride=(2, 2), pads=(3, 3, 3, 3), layout="NHWC")
        cfg = tc.Conv2dConfig(mr=4, bn=16, ic_unroll=1)
        t = tc.conv2d(lambda n, ch, y, x: te.const(1.0, "float32"), lambda o, i, r, s: te.const(1.0, "float32"),
                      wl, "float32", cfg, target)
        assert tc.planar_padding(wl, target) is planar
        assert tuple(t.padded.shape) == ((1, 19, c, 16) if planar else (1, 19, 16, c)), t.padded.shape


def test_pixels_of_a_multiple_of_2k_bytes_are_padded_a_cache_line_apart():
    """At 512 float32 (or 256 float64) channels a pixel is 2 KiB: the padded copy holds a cache line more per
    pixel, so the register tile's pixels do not all fall in one L1 set; other widths stay dense."""
    target = Target.from_string("skylake-avx512")
    for c, dtype, pitch in ((512, "float32", 528), (1024, "float32", 1040), (256, "float64", 264),
                            (256, "float32", 256), (384, "float32", 384)):
        wl = tc.Conv2dWorkload(1, c, 5, 4, 16, 3, 3, stride=(2, 2), pads=(1, 1, 1, 1), layout="NHWC", dtype=dtype)
        cfg = tc.Conv2dConfig(mr=2, bn=16 if dtype == "float32" else 8, ic_unroll=4)
        t = tc.conv2d(lambda n, ch, y, x: te.const(1.0, dtype), lambda o, i, r, s: te.const(1.0, dtype),
                      wl, dtype, cfg, target)
        assert tc.channel_pitch(wl) == pitch and t.padded.shape[-1] == pitch, (c, dtype, t.padded.shape)


@pytest.mark.parametrize("batch", [1, 8])
def test_two_row_tiles_keep_the_tail_guard_out_of_the_reduction(batch):
    """7 rows in pairs leave a 1-row tail: the pairs are a serial loop split into whole pairs and the tail, so
    no condition on the parallel loop's index is evaluated inside the tile's reduction (with the pairs fused
    into the parallel loop it was, at batch 8; the tail's own guard is on an unrolled row: a constant)."""
    target = Target.from_string("skylake-avx512")
    wl = tc.Conv2dWorkload(batch, 512, 7, 7, 512, 3, 3, pads=(1, 1, 1, 1), layout="NHWC")
    config = tc.default_config(wl, target)
    assert tc._tile_rows(wl, tc.Conv2dConfig.from_config(config), target) == 2
    s, tensors = tc.build(wl, config, target, prepacked=True)
    lines = str(jitop.lower(s, tensors)).splitlines()
    depth = min(len(ln) - len(ln.lstrip()) for ln in lines if ln.strip().startswith("for r in"))
    reduction = [ln for ln in lines if len(ln) - len(ln.lstrip()) > depth]
    assert not any(ln.strip().startswith("if ") and "fused" in ln for ln in reduction)
