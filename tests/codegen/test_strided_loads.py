"""Vector lanes that read every 2nd, 3rd or 4th element (a stride-2 convolution or pooling, x[::2]) load the
span they cover with one masked load and pick the lanes with a shuffle, instead of gathering lane by lane.

Checked against numpy at every offset and length (a partial last vector has a lane mask, which must keep the
load inside the buffer: the span ends at the last lane's element, and the arrays here end exactly there),
for each dtype width, under a guard that masks lanes, and in the generated IR: no gather for those strides,
a gather still for a stride beyond them.
"""
from __future__ import annotations

import numpy as np
import pytest

import jitop
from jitop import te


def _strided(n: int, stride: int, offset: int, dtype: str, lanes: int, guard: bool = False) -> jitop.Module:
    """B[i] = A[i * stride + offset] (or, with `guard`, only where A's element is at an even i: else 0), the
    i loop split by `lanes` and vectorized; A holds exactly the elements the last i reads."""
    A = te.placeholder(((n - 1) * stride + offset + 1,) if n else (offset,), dtype, name="A")
    if guard:
        B = te.compute((n,), lambda i: te.if_then_else(i % 2 == 0, A[i * stride + offset], te.const(0, dtype)),
                       name="B")
    else:
        B = te.compute((n,), lambda i: A[i * stride + offset], name="B")
    s = jitop.create_schedule(B.op)
    _, inner = s[B].split(B.op.axis[0], factor=lanes)
    s[B].vectorize(inner)
    return jitop.build(s, [A, B])


def _reference(a: np.ndarray, n: int, stride: int, offset: int, guard: bool) -> np.ndarray:
    out = a[offset::stride][:n].copy()
    if guard:
        out[1::2] = 0
    return out


@pytest.mark.parametrize("stride", [2, 3, 4])
@pytest.mark.parametrize("dtype,lanes", [("float32", 16), ("float64", 8), ("int8", 16), ("uint16", 8)])
def test_strided_lanes_read_what_numpy_reads(stride, dtype, lanes):
    rng = np.random.default_rng(stride)
    for n, offset in [(1, 0), (lanes, 1), (lanes + 3, 2), (3 * lanes - 1, 0), (37, 3)]:
        f = _strided(n, stride, offset, dtype, lanes)
        a = (rng.standard_normal((n - 1) * stride + offset + 1) * 50).astype(dtype)
        b = np.empty(n, dtype)
        f(a, b)
        np.testing.assert_array_equal(b, _reference(a, n, stride, offset, False))


@pytest.mark.parametrize("stride", [2, 3])
def test_a_guard_masks_lanes_of_a_strided_read(stride):
    n, lanes = 29, 16
    f = _strided(n, stride, 1, "float32", lanes, guard=True)
    a = np.arange((n - 1) * stride + 2, dtype=np.float32) + 1
    b = np.full(n, np.nan, np.float32)
    f(a, b)
    np.testing.assert_array_equal(b, _reference(a, n, stride, 1, True))


def test_strides_two_to_four_load_a_span_and_wider_ones_still_gather():
    def ir(stride: int) -> str:
        return _strided(64, stride, 0, "float32", 16).get_source("ll")
    for stride in (2, 3, 4):
        text = ir(stride)
        assert "llvm.masked.load" in text and "llvm.masked.gather" not in text, stride
    assert "llvm.masked.gather" in ir(5)
