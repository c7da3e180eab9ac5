"""jitop.tir.padding: a convolution's padded copy of an intermediate folded into that intermediate's producers.

The rule on hand-built loop nests (what it accepts, the copies it must refuse), the folded function compiled and
run against the original on the same inputs with every intermediate poisoned with NaN (so a border left unzeroed
or an element lost shows), and convolution chains through `jitop.kernel` against float64 numpy."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import jitop
from jitop.driver import compile_func, default_target
from jitop.dtypes import as_dtype
from jitop.te.expr import Expr, const, select, var
from jitop.tir import padding
from jitop.tir.nodes import Buffer, For, ForKind, PrimFunc, Seq, Store, walk_stmts
from jitop.tir.padding import PadCopy, fold_padding, pad_copy

F32 = as_dtype("float32")
ZERO = const(0.0, "float32")


def _loops(shape: tuple[int, ...], body) -> tuple[list[Expr], object]:
    """Serial loops over `shape` around body(indices) (the innermost vectorized)."""
    idx = [var(f"i{d}") for d in range(len(shape))]
    stmt = body(idx)
    for d in reversed(range(len(shape))):
        kind = ForKind.VECTORIZED if d == len(shape) - 1 else ForKind.SERIAL
        stmt = For(idx[d], const(shape[d]), kind, stmt)
    return idx, stmt


def _inside(index: list[Expr], shape: tuple[int, ...], offset: tuple[int, ...], padded: tuple[int, ...]) -> Expr:
    """The copy's condition as topi.conv2d writes it: one bound per side where the padded buffer reaches past."""
    conds = [c for i, o, n, m in zip(index, offset, shape, padded)
             for c in ((i - o >= 0) if o else None, (i - o < n) if o + n < m else None) if c is not None]
    out = const(True)
    for c in conds:
        out = out & c
    return out


def _copy(p: Buffer, x: Buffer, offset: tuple[int, ...], cond=None, fill: Expr = ZERO, shift=None):
    """The nest p[i] = select(cond, x[i - offset], fill)."""
    def body(idx):
        src = tuple(i - o for i, o in zip(idx, offset)) if shift is None else shift(idx)
        c = _inside(idx, x.shape, offset, p.shape) if cond is None else cond(idx)
        return Store(p, tuple(idx), select(c, x.load(src), fill))
    return _loops(p.shape, body)[1]


X4, P6 = Buffer("x", F32, (4, 16), "param"), Buffer("p", F32, (6, 18), "param")


def test_a_copy_with_a_zero_border_is_recognised() -> None:
    assert pad_copy(_copy(P6, X4, (1, 1)), {X4, P6}) == PadCopy(P6, X4, (1, 1))


@pytest.mark.parametrize("why, nest", [
    ("a side without its bound (row 5 would read x[4])",
     lambda: _copy(P6, X4, (1, 1), cond=lambda i: (i[0] - 1 >= 0) & (i[1] - 1 >= 0) & (i[1] - 1 < 16))),
    ("a condition that is not the box (zeroes some of x)",
     lambda: _copy(P6, X4, (1, 1), cond=lambda i: _inside(i, (4, 16), (1, 1), (6, 18)) & (i[1] < 5))),
    ("a border that is not zero", lambda: _copy(P6, X4, (1, 1), fill=const(1.0, "float32"))),
    ("a border of -0.0", lambda: _copy(P6, X4, (1, 1), fill=const(-0.0, "float32"))),
    ("a source index that is no shift", lambda: _copy(P6, X4, (1, 1), shift=lambda i: (i[0] // 2, i[1] - 1))),
    ("a padded buffer too small for the shifted source",
     lambda: _copy(Buffer("p", F32, (4, 18), "param"), X4, (1, 1))),
    ("a source of another dtype", lambda: _copy(P6, Buffer("x", as_dtype("float64"), (4, 16), "param"), (1, 1))),
])
def test_copies_the_rule_must_refuse(why: str, nest) -> None:
    stmt = nest()
    stores = [s for s in walk_stmts(stmt) if isinstance(s, Store)]
    buffers = {P6, X4} | {s.buffer for s in stores} | {s.value.src[1].arg for s in stores}
    assert pad_copy(stmt, buffers) is None, why


# ** the folded function computes what the original does **

def _program(shape: tuple[int, ...], offset: tuple[int, ...], padded: tuple[int, ...], late_write: bool = False,
             early_read: bool = False) -> PrimFunc:
    """a -> x = 2a (scratch) -> p = padded copy of x (scratch) -> y = 3p (output, reads the border too) and
    z = x + 1 (output: another reader of x)."""
    a, y = Buffer("a", F32, shape, "param"), Buffer("y", F32, padded, "param")
    z = Buffer("z", F32, shape, "param")
    x, p = Buffer("x", F32, shape, "param"), Buffer("p", F32, padded, "param")
    _, make_x = _loops(shape, lambda i: Store(x, tuple(i), a.load(tuple(i)) * const(2.0, "float32")))
    _, make_y = _loops(padded, lambda i: Store(y, tuple(i), p.load(tuple(i)) * const(3.0, "float32")))
    _, make_z = _loops(shape, lambda i: Store(z, tuple(i), x.load(tuple(i)) + const(1.0, "float32")))
    nests = [make_x, _copy(p, x, offset), make_y, make_z]
    if late_write:  # x written again after the copy: p would no longer be the copy of the x it was made from
        nests.append(_loops(shape, lambda i: Store(x, tuple(i), const(5.0, "float32")))[1])
    if early_read:  # p read before the copy writes it
        nests.insert(0, _loops(padded, lambda i: Store(y, tuple(i), p.load(tuple(i))))[1])
    return PrimFunc("padded_chain", (a, y, z, x, p), Seq(tuple(nests)), outputs=(1, 2, 3, 4))


def _run(func: PrimFunc, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(y, z) from the compiled function, every intermediate NaN before the call."""
    module = compile_func(func, default_target())
    arrays = [a] + [np.full(tuple(b.shape), np.nan, np.float32) for b in func.params[1:]]
    module(*arrays)
    return arrays[1], arrays[2]


CASES = [  # (source shape, offset, padded shape)
    ((2, 5, 7, 3), (0, 1, 2, 0), (2, 8, 10, 5)),        # a pitch wider than the channels, 3 lanes of 16
    ((1, 7, 7, 32), (0, 1, 1, 0), (1, 9, 9, 48)),        # the extra channels a whole vector
    ((3, 11, 13, 16), (0, 2, 0, 0), (3, 13, 15, 16)),    # rows padded on top only, columns after only
    ((1, 1, 1, 17), (0, 1, 1, 0), (1, 3, 3, 17)),        # one pixel
    ((2, 4, 6), (1, 0, 2), (3, 4, 9)),                    # padding in the outermost dim
]


@pytest.mark.parametrize("shape, offset, padded", CASES)
def test_the_folded_function_computes_what_the_copy_did(shape, offset, padded) -> None:
    func = _program(shape, offset, padded)
    folded = fold_padding(func, scratch=2, lanes=16)
    assert [b.name for b in folded.params] == ["a", "y", "z", "p"] and folded.attrs["padding"] == (("p", "x"),)
    a = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    expect_y = np.zeros(padded, np.float32)
    expect_y[tuple(slice(o, o + n) for o, n in zip(offset, shape))] = a * 2
    for y, z in (_run(func, a), _run(folded, a)):
        np.testing.assert_array_equal(y, expect_y * 3)
        np.testing.assert_array_equal(z, a * 2 + 1)


def test_without_its_border_nest_the_fold_would_be_wrong(monkeypatch) -> None:
    """The check above can fail: with the nest that zeroes the border left out, the border keeps the NaN."""
    monkeypatch.setattr(padding, "border_zeros", lambda *args: Seq(()))
    shape, offset, padded = CASES[0]
    a = np.ones(shape, np.float32)
    y, _ = _run(fold_padding(_program(shape, offset, padded), scratch=2, lanes=16), a)
    assert np.isnan(y[0, 0, 0, 0])


@pytest.mark.parametrize("late_write, early_read", [(True, False), (False, True)])
def test_a_source_written_after_the_copy_or_a_copy_read_before_it_is_not_folded(late_write, early_read) -> None:
    func = _program((2, 4, 4, 16), (0, 1, 1, 0), (2, 6, 6, 16), late_write, early_read)
    assert fold_padding(func, scratch=2, lanes=16) is func


def test_only_the_functions_intermediates_are_folded() -> None:
    """x as an output of the function (not among the last `scratch` parameters) keeps its own memory."""
    func = _program((2, 4, 4, 16), (0, 1, 1, 0), (2, 6, 6, 16))
    assert fold_padding(func, scratch=1, lanes=16) is func


# ** convolution chains through jitop.kernel **

def _conv64(x: np.ndarray, w: np.ndarray, pads=(0, 0, 0, 0), stride: int = 1) -> np.ndarray:
    """float64 NCHW convolution of x with w (OIHW), pads (top, bottom, left, right)."""
    top, bottom, left, right = pads
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    kh, kw = w.shape[2:]
    oh, ow = (xp.shape[2] - kh) // stride + 1, (xp.shape[3] - kw) // stride + 1
    out = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for i, j in itertools.product(range(kh), range(kw)):
        window = xp[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
        out += np.einsum("nchw,kc->nkhw", window, w[:, :, i, j].astype(np.float64))
    return out


def _weights(seed: int, *shapes) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32) for s in shapes]


def _check(fn, fn64, x: np.ndarray, depth: int, folded: int):
    """fn(x) against fn64 in float64, within depth * eps of the magnitudes behind each output (fn64 on |x|, |W|
    without activations bounds the sum of |products|), and explain's padding line naming `folded` copies.
    Returns the executable."""
    f = jitop.kernel(fn)
    for trial in range(2):  # a second call with other data: the border is zeroed on every call
        xs = x if trial == 0 else x[::-1].copy()
        got = f(xs)
        bound = depth * np.finfo(np.float32).eps * fn64(np.abs(xs.astype(np.float64)), True)
        assert np.all(np.abs(got - fn64(xs.astype(np.float64), False)) <= bound + 1e-30)
    (exe,) = [ov.exe for ov in f.dispatcher.overloads()]
    assert f"padding: {folded} padded copies written by their producers" in exe.decisions[1]
    return exe


def test_a_bottleneck_writes_its_activation_into_the_next_convolutions_padded_copy(private_cache) -> None:
    """relu(1x1 conv) read with padding by a 3x3 convolution, channels-last: the 1x1's epilogue stores into the
    zero-bordered copy (stride 2, asymmetric pads, odd sizes, 17 channels: a vector and one lane; fewer channels
    than a vector's lanes make the copy planar, which is not folded)."""
    w1, w2 = _weights(1, (17, 7, 1, 1), (11, 17, 3, 3))

    def fn(x):
        r = np.maximum(jitop.conv2d(x, w1, layout="NHWC"), 0)
        return jitop.conv2d(r, w2, padding=(1, 2, 0, 1), stride=2, layout="NHWC")

    def fn64(x, magnitude):
        relu = (lambda v: v) if magnitude else (lambda v: np.maximum(v, 0))
        a, b = (np.abs(w) if magnitude else w for w in (w1, w2))
        nchw = x.transpose(0, 3, 1, 2)
        return _conv64(relu(_conv64(nchw, a)), b, (1, 2, 0, 1), 2).transpose(0, 2, 3, 1)
    x = np.random.default_rng(2).standard_normal((2, 13, 11, 7)).astype(np.float32)
    _check(fn, fn64, x, 7 + 17 * 9 + 1, folded=1)


def test_a_residual_block_whose_input_is_padded_and_added(private_cache) -> None:
    """x = relu(1x1 conv) feeds a padded 3x3 convolution and the residual add after it (two readers of the
    bytes inside the padded copy); 64 channels, batch 3."""
    w1, w2, w3 = _weights(3, (64, 16, 1, 1), (64, 64, 3, 3), (64, 64, 3, 3))

    def fn(x):
        r = np.maximum(jitop.conv2d(x, w1), 0)
        h = np.maximum(jitop.conv2d(r, w2, padding=1), 0)
        return np.maximum(jitop.conv2d(h, w3, padding=1) + r, 0)

    def fn64(x, magnitude):
        relu = (lambda v: v) if magnitude else (lambda v: np.maximum(v, 0))
        a, b, c = (np.abs(w) if magnitude else w for w in (w1, w2, w3))
        r = relu(_conv64(x, a))
        return relu(_conv64(relu(_conv64(r, b, (1,) * 4)), c, (1,) * 4) + r)
    x = np.random.default_rng(4).standard_normal((3, 16, 9, 7)).astype(np.float32)
    _check(fn, fn64, x, 16 + 2 * 64 * 9 + 2, folded=2)


def test_a_padded_copy_with_spaced_pixels(private_cache) -> None:
    """512 channels: the padded copy spaces its pixels a cache line apart (topi.conv2d.channel_pitch), so the
    producer's stores land on a wider pitch and the extra channels are zeroed with the border."""
    w1, w2 = _weights(5, (512, 8, 1, 1), (4, 512, 3, 3))

    def fn(x):
        return jitop.conv2d(np.maximum(jitop.conv2d(x, w1, layout="NHWC"), 0), w2, padding=1, layout="NHWC")

    def fn64(x, magnitude):
        relu = (lambda v: v) if magnitude else (lambda v: np.maximum(v, 0))
        a, b = (np.abs(w) if magnitude else w for w in (w1, w2))
        return _conv64(relu(_conv64(x.transpose(0, 3, 1, 2), a)), b, (1,) * 4).transpose(0, 2, 3, 1)
    x = np.random.default_rng(6).standard_normal((1, 5, 3, 8)).astype(np.float32)
    _check(fn, fn64, x, 8 + 512 * 9 + 1, folded=1)


def test_a_block_output_padded_for_a_stride_2_convolution_is_written_over_the_block_input(private_cache) -> None:
    """y = relu(conv(conv(x)) + x), x and y both read by padded 3x3 convolutions, y's with stride 2 (which reads
    10 + 2 - 1 of its 12 padded rows): both copies are padded by all of `pads`, so they have one shape and y is
    written over x's padded buffer (storage's in-place rule), as it was over x before the copies were folded."""
    w0, w1, w2, w3 = _weights(7, (16, 8, 1, 1), (16, 16, 3, 3), (16, 16, 3, 3), (16, 16, 3, 3))

    def fn(x):
        r = np.maximum(jitop.conv2d(x, w0, layout="NHWC"), 0)
        h = np.maximum(jitop.conv2d(r, w1, padding=1, layout="NHWC"), 0)
        y = np.maximum(jitop.conv2d(h, w2, padding=1, layout="NHWC") + r, 0)
        return jitop.conv2d(y, w3, padding=1, stride=2, layout="NHWC")

    def fn64(x, magnitude):
        relu = (lambda v: v) if magnitude else (lambda v: np.maximum(v, 0))
        a, b, c, d = (np.abs(w) if magnitude else w for w in (w0, w1, w2, w3))
        r = relu(_conv64(x.transpose(0, 3, 1, 2), a))
        y = relu(_conv64(relu(_conv64(r, b, (1,) * 4)), c, (1,) * 4) + r)
        return _conv64(y, d, (1,) * 4, 2).transpose(0, 2, 3, 1)
    x = np.random.default_rng(8).standard_normal((2, 10, 12, 8)).astype(np.float32)
    exe = _check(fn, fn64, x, 8 + 3 * 16 * 9 + 2, folded=3)
    assert "1 written over their input in place" in exe.decisions[0]
