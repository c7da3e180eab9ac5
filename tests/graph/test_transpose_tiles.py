"""Transposing copies run in square tiles (jitop.graph.schedule_rules): the output's last axis in vector lanes
inside a block of the axis that indexes the input's innermost dimension, with numpy's result for every
permutation, odd sizes (tails on both tiled axes) and dtype."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop
from jitop import te
from jitop.graph.schedule_rules import schedule_injective
from jitop.schedule.schedule import create_schedule
from jitop.target import Target

AVX512 = Target.from_string("skylake-avx512")  # 16 float32 lanes


def _scheduled(shape: tuple[int, ...], perm: tuple[int, ...]):
    x = te.placeholder(shape, "float32", name="x")
    out_shape = tuple(shape[p] for p in perm)
    inverse = np.argsort(perm)
    t = te.compute(out_shape, lambda *i: x[tuple(i[inverse[d]] for d in range(len(shape)))], name="t")
    s = create_schedule(t.op)
    schedule_injective(s, t, AVX512)
    return s, x, t


def test_an_nhwc_to_nchw_copy_reads_whole_lines_in_tiles() -> None:
    """(n, c, y, x) from NHWC: the loops are (n, y, c blocks) in parallel, then x blocks, 16 channels of a
    block, 16 columns in vector lanes, so the 16 channels of each pixel (one cache line) are read together."""
    s, _, t = _scheduled((2, 30, 33, 40), (0, 3, 1, 2))
    leaves = s[t].leaf_iter_vars
    # out axes (i0, i1, i2, i3) = (n, c, y, x)
    assert [iv.name for iv in leaves] == ["i0.i2.fused.i1.outer.fused", "i3.outer", "i1.inner", "i3.inner"]
    assert [iv.extent for iv in leaves[1:]] == [3, 16, 16]
    assert s[t].iter_kind[leaves[-1]].name == "VECTORIZED" and s[t].iter_kind[leaves[0]].name == "PARALLEL"


@pytest.mark.parametrize("shape,perm", [((64, 64), (0, 1)), ((4, 64), (1, 0)), ((64, 8), (1, 0))])
def test_copies_in_order_and_thin_transposes_keep_the_row_schedule(shape, perm) -> None:
    """Not a transpose, or a tiled axis shorter than a vector: rows in parallel, the last axis in lanes."""
    s, _, t = _scheduled(shape, perm)
    assert [iv.name for iv in s[t].leaf_iter_vars] == ["i0", "i1.outer", "i1.inner"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=2, max_size=4), st.randoms(use_true_random=False),
       st.sampled_from(["float32", "float64", "int8", "int64", "bool"]))
def test_transposes_match_numpy(shape, rnd, dtype) -> None:
    perm = list(range(len(shape)))
    rnd.shuffle(perm)
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 50).astype(dtype)

    @jitop.kernel
    def f(a):
        return np.transpose(a, perm) * 2 if dtype != "bool" else ~np.transpose(a, perm)

    with warnings.catch_warnings():
        warnings.simplefilter("error", jitop.JitopFallbackWarning)
        got = f(x)
    want = np.transpose(x, perm) * 2 if dtype != "bool" else ~np.transpose(x, perm)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_a_transpose_fused_with_an_elementwise_sum_matches_numpy() -> None:
    """NHWC activations back to NCHW plus an NCHW operand: the tiles read one transposed, one in order."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 19, 23, 37)).astype(np.float32)
    y = rng.standard_normal((2, 37, 19, 23)).astype(np.float32)
    f = jitop.kernel(lambda a, b: np.maximum(np.transpose(a, (0, 3, 1, 2)) + b, 0))
    np.testing.assert_array_equal(f(x, y), np.maximum(np.transpose(x, (0, 3, 1, 2)) + y, 0))


def test_a_transpose_with_symbolic_sizes_is_tiled_and_matches_numpy() -> None:
    """One kernel for every height and width (dynamic dims): tiles with run-time tails on both axes."""
    f = jitop.kernel(lambda a: np.maximum(np.transpose(a, (0, 3, 1, 2)), np.float32(0)), dynamic={"a": (1, 2)})
    rng = np.random.default_rng(5)
    for h, w in ((20, 33), (17, 16), (3, 50), (40, 2)):
        a = rng.standard_normal((2, h, w, 37)).astype(np.float32)
        np.testing.assert_array_equal(f(a), np.maximum(np.transpose(a, (0, 3, 1, 2)), 0))
    loops = jitop.explain(f, a).split("loop IR (schedule applied):")[1]
    lanes = jitop.Target.current().lanes(4)
    assert "for i0.i2.fused.i1.outer.fused in parallel(" in loops and f"i3.inner in vectorized({lanes})" in loops


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=2, max_size=4), st.randoms(use_true_random=False))
def test_a_transpose_plus_a_broadcast_operand_matches_numpy(shape, rnd) -> None:
    """The tiled stage also reads an operand broadcast along some of the output's axes (a bias per channel,
    a row vector): each element of it is read at the right place inside the tiles."""
    perm = list(range(len(shape)))
    rnd.shuffle(perm)
    out_shape = [shape[p] for p in perm]
    b_shape = [d if rnd.random() < 0.5 else 1 for d in out_shape][rnd.randrange(len(out_shape)):]
    rng = np.random.default_rng(len(shape) + len(b_shape))
    x = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    f = jitop.kernel(lambda a, c: np.transpose(a, perm) - c)
    with warnings.catch_warnings():
        warnings.simplefilter("error", jitop.JitopFallbackWarning)
        got = f(x, b)
    np.testing.assert_array_equal(got, np.transpose(x, perm) - b)
