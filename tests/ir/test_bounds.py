"""The bounds prover (jitop/tir/bounds.py) on constant shapes: what the GPU's im2col tiles and register-tile
tails need proved, so they carry no run-time checks. Each proof is paired with a near miss it must refuse."""
from __future__ import annotations

from jitop import te
from jitop.tir.bounds import BoundsCheck
from jitop.dtypes import float32
from jitop.tir.nodes import Buffer


def test_a_quotient_plus_a_constant_is_bounded_by_the_guard_on_its_numerator():
    """The channel of an im2col tail: (y + 46) // 49 + 2 < 3 where the guard says y + 144 < 147, y = t % 4 * 4
    (a term no single variable's range can be narrowed by)."""
    t = te.var("t")
    y = t % 4 * 4
    check = BoundsCheck({t: (0, 15)})
    assert not check.in_bounds((y + 46) // 49 + 2, 3)  # y = 3..12 reaches channel 3
    k = check.push(y + 144 < 147)
    assert check.in_bounds((y + 46) // 49 + 2, 3) and check.in_bounds(2 + (y + 46) // 49, 3)
    assert not check.in_bounds((y + 46) // 49 + 3, 3)
    check.pop(k)
    assert not check.in_bounds((y + 46) // 49 + 2, 3)


def test_an_access_under_a_guard_no_iteration_meets_is_in_bounds():
    """Row 8 v + 1 of a one-row register tile exists only if 8 v + 1 < 1: never, for v >= 0."""
    v = te.var("v")
    tile = Buffer("tile", float32, (1, 8), "local")
    check = BoundsCheck({v: (0, 3)})
    assert not check.proves(tile, (v * 8 + 1, te.const(0)))
    k = check.push(v * 8 + 1 < 1)
    assert check.proves(tile, (v * 8 + 1, te.const(0)))
    check.pop(k)
    assert not check.proves(tile, (v * 8 + 1, te.const(0)))  # the answer depends on the guards: not memoized past them
    k = check.push(v * 8 + 1 < 9)  # v = 0 only: row 1 of a 1-row tile is still out of bounds
    assert not check.proves(tile, (v * 8 + 1, te.const(0)))
    check.pop(k)


def test_a_fused_index_s_row_is_bounded_by_the_guard_on_the_fused_index():
    """A shared tile's row 8 o + t // 2 (o, t < 8: the fused index 16 o + t read two per row) under the fill's
    guard 16 o + t < 64 is at most 31: a tile of 32 rows needs no check, one of 31 does."""
    o, t = te.var("o"), te.var("t")
    check = BoundsCheck({o: (0, 7), t: (0, 7)})
    row = o * 8 + t // 2
    assert not check.in_bounds(row, 32)
    k = check.push(o * 16 + t < 64)
    assert check.in_bounds(row, 32) and not check.in_bounds(row, 31) and not check.in_bounds(row + 1, 32)
    check.pop(k)


def test_what_is_worked_out_under_a_guard_is_forgotten_when_the_guard_ends():
    """The prover keeps the simplifier's work (bounds of each node) per level of guards: inside `if i < 10` the
    index i is at most 9; outside, after it, at most 99 again."""
    i = te.var("i")
    row = Buffer("row", float32, (10,), "global")
    check = BoundsCheck({i: (0, 99)})
    k = check.push(i < 10)
    assert check.proves(row, (i * 1,)) and check.in_bounds(i + 0, 10)
    check.pop(k)
    assert not check.in_bounds(i * 1, 10) and not check.in_bounds(i + 0, 10)
    k = check.push(i < 11)
    assert not check.in_bounds(i + 0, 10)
    check.pop(k)
