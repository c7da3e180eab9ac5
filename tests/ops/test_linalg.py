"""jitop.matmul / dense / batch_matmul against numpy: np.matmul's shapes, dtypes and errors."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jitop
from op_checks import assert_close, assert_matmul, no_fallback, rand  # noqa: F401 - no_fallback is autouse

rng = np.random.default_rng(20261121)

# (a's shape, b's shape): np.matmul's 1-D promotion, batch broadcasting, sizes 1, primes, empty dims
SHAPES = [
    ((4,), (4, 5)),              # 1-D @ 2-D: a row vector, the 1 is removed
    ((4, 5), (5,)),              # 2-D @ 1-D: a column vector
    ((5,), (5,)),                # 1-D @ 1-D: a scalar
    ((5,), (2, 5, 3)),           # 1-D @ a batch
    ((2, 3, 5), (5,)),           # a batch @ 1-D
    ((3, 1, 4, 5), (2, 5, 6)),   # batch dims broadcast: (3, 1) with (2,) -> (3, 2)
    ((1, 1), (1, 1)),
    ((1, 7), (7, 1)),
    ((7, 13), (13, 11)),         # primes: no tile divides
    ((0, 3), (3, 4)),            # empty rows
    ((3, 0), (0, 4)),            # empty reduction: zeros
    ((2, 0, 3), (3, 4)),
    ((0,), (0,)),                # empty dot: 0
]
DTYPES = [np.float32, np.float64, np.int32, np.int64]


@pytest.mark.parametrize("sa,sb", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_matmul_shapes_and_dtypes(sa, sb, dtype):
    a, b = rand(rng, sa, dtype), rand(rng, sb, dtype)
    assert_matmul(jitop.matmul(a, b), a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_matmul_tiles_do_not_divide(dtype):
    # 127 x 513 x 255: every register/cache tile has a remainder in every dimension
    a, b = rand(rng, (127, 513), dtype), rand(rng, (513, 255), dtype)
    assert_matmul(jitop.matmul(a, b), a, b)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint32, np.uint64])
def test_matmul_integer_overflow_wraps_like_numpy(dtype):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, (5, 7), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, (7, 3), dtype=dtype, endpoint=True)
    expected = np.matmul(a, b)
    # the products do overflow (else this test proves nothing): numpy's result differs from exact integers
    exact = np.array([[sum(int(x) * int(y) for x, y in zip(row, col)) for col in b.T] for row in a], dtype=object)
    assert (expected.astype(object) != exact).any()
    assert_close(jitop.matmul(a, b), expected)


@pytest.mark.parametrize("da,db", [(np.float32, np.float64), (np.int32, np.float32), (np.int32, np.int64),
                                   (np.uint8, np.int8), (np.uint32, np.int32), (np.int64, np.float32),
                                   (np.uint64, np.int64), (np.int8, np.int8)],
                         ids=lambda d: np.dtype(d).name)
def test_matmul_mixed_dtypes_promote_like_numpy(da, db):
    a, b = rand(rng, (3, 6), da), rand(rng, (6, 4), db)
    r = jitop.matmul(a, b)
    assert r.dtype == np.result_type(da, db)
    assert_matmul(r, a, b)


def test_matmul_python_lists():
    a, b = [[1, 2, 3], [4, 5, 6]], [[1.5], [0.5], [-1]]
    assert_matmul(jitop.matmul(a, b), a, b)
    assert_matmul(jitop.matmul([1, 2], [3, 4]), [1, 2], [3, 4])


def test_matmul_strided_transposed_fortran_bigendian_and_broadcast_views():
    x = rand(rng, (9, 12), np.float32)
    y = rand(rng, (12, 9), np.float32)
    cases = [
        (x[::-1, ::2], y[::2, ::-1]),                          # negative and non-unit strides
        (x.T, y.T),                                            # transposed views
        (np.asfortranarray(x), np.asfortranarray(y)),
        (x.astype(">f4"), y.astype(">f4")),                    # big-endian
        (x.astype(">i4"), y.astype("<i4")),
        (rand(rng, (4, 2, 12), np.float32), np.broadcast_to(y[None], (4, 12, 9))),  # zero strides
    ]
    for a, b in cases:
        assert_matmul(jitop.matmul(a, b), a, b)


def test_matmul_bool_and_complex_run_as_numpy():
    a, b = rng.random((3, 4)) < 0.5, rng.random((4, 2)) < 0.5
    assert_matmul(jitop.matmul(a, b), a, b)
    c = (rand(rng, (3, 4), np.float64) + 1j * rand(rng, (3, 4), np.float64)).astype(np.complex64)
    d = rand(rng, (4, 2), np.float32)
    r, e = jitop.matmul(c, d), np.matmul(c, d)
    assert r.dtype == e.dtype and r.shape == e.shape
    np.testing.assert_allclose(r, e, rtol=1e-5)


def test_matmul_same_shape_new_values_recomputes():
    a, b = rand(rng, (6, 5), np.float32), rand(rng, (5, 3), np.float32)
    first = jitop.matmul(a, b)
    a2 = a + 1
    assert_matmul(jitop.matmul(a2, b), a2, b)
    assert_matmul(first, a, b)  # results are fresh arrays, not a reused buffer


# ---- out= ----

def test_matmul_out_is_written_and_returned():
    a, b = rand(rng, (3, 4), np.float32), rand(rng, (4, 5), np.float32)
    out = np.full((3, 5), np.nan, np.float32)
    r = jitop.matmul(a, b, out=out)
    assert r is out
    assert_matmul(out, a, b)


def test_matmul_out_same_kind_cast_and_views():
    a, b = rand(rng, (2, 3, 4), np.float64), rand(rng, (4, 5), np.float64)
    out = np.zeros((2, 3, 5), np.float32)  # float64 -> float32 is a 'same_kind' cast
    assert jitop.matmul(a, b, out=out) is out
    np.testing.assert_allclose(out, np.matmul(a, b).astype(np.float32), rtol=1e-6, atol=1e-6)
    base = np.zeros((4, 3, 5), np.float64)
    view = base[::2]  # a non-contiguous out
    assert jitop.matmul(a, b, out=view) is view
    assert_matmul(view, a, b)
    assert not base[1::2].any()  # only the view was written
    ints = np.zeros((2, 3, 5), np.int16)  # int64 -> int16 is 'same_kind' too
    ia, ib = rand(rng, (2, 3, 4), np.int64), rand(rng, (4, 5), np.int64)
    jitop.matmul(ia, ib, out=ints)
    assert_close(ints, np.matmul(ia, ib).astype(np.int16))


def test_matmul_out_scalar_result_and_aliasing_an_input():
    v, w = rand(rng, (6,), np.float64), rand(rng, (6,), np.float64)
    out = np.zeros((), np.float64)
    assert jitop.matmul(v, w, out=out) is out
    np.testing.assert_allclose(out, np.dot(v, w), rtol=1e-12)
    a, b = rand(rng, (4, 4), np.float64), rand(rng, (4, 4), np.float64)
    expected = np.matmul(a, b)
    assert jitop.matmul(a, b, out=a) is a  # out is an input: the product uses the old values
    np.testing.assert_allclose(a, expected, rtol=1e-12)


@pytest.mark.parametrize("out,exc,match", [
    (np.zeros((3, 4), np.float32), ValueError, r"'out' has shape \(3, 4\).*\(3, 5\)"),
    (np.zeros((1, 3, 5), np.float32), ValueError, r"'out' has shape"),
    (np.zeros((15,), np.float32), ValueError, r"'out' has shape"),
    (np.zeros((3, 5), np.int32), TypeError, r"float32 result into 'out' of dtype int32"),
    (np.zeros((3, 5), np.bool_), TypeError, r"'out' of dtype bool"),
    ([[0.0] * 5] * 3, TypeError, r"'out' must be a numpy array"),
])
def test_matmul_bad_out(out, exc, match):
    a, b = rand(rng, (3, 4), np.float32), rand(rng, (4, 5), np.float32)
    with pytest.raises(exc, match=match):
        jitop.matmul(a, b, out=out)


def test_matmul_read_only_out():
    out = np.zeros((2, 2), np.float64)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="'out' is read-only"):
        jitop.matmul(np.ones((2, 3)), np.ones((3, 2)), out=out)


def test_matmul_unsafe_int_out_from_ints():
    with pytest.raises(TypeError, match="'out'"):
        jitop.matmul(np.ones((2, 3), np.int64), np.ones((3, 2), np.int64), out=np.zeros((2, 2), np.uint8))


# ---- argument errors ----

@pytest.mark.parametrize("sa,sb,match", [
    ((), (3, 4), r"'a' must have at least 1 dimension"),
    ((3, 4), (), r"'b' must have at least 1 dimension"),
    ((3, 4), (3, 2), r"last dimension of 'a' \(4\).*second-to-last dimension of 'b' \(3\)"),
    ((3,), (4,), r"last dimension of 'a' \(3\).*first dimension of 'b' \(4\)"),
    ((2, 3), (2,), r"last dimension of 'a' \(3\).*first dimension of 'b' \(2\)"),
    ((5,), (4, 3), r"last dimension of 'a' \(5\)"),
    ((2, 3, 4), (3, 4, 5), r"batch dimensions \(2,\) of 'a' and \(3,\) of 'b' do not broadcast"),
])
def test_matmul_bad_shapes(sa, sb, match):
    with pytest.raises(ValueError, match=match):
        jitop.matmul(np.ones(sa, np.float32), np.ones(sb, np.float32))
    # numpy agrees that these are errors
    with pytest.raises(ValueError):
        np.matmul(np.ones(sa, np.float32), np.ones(sb, np.float32))


def test_matmul_python_scalar_is_an_error():
    with pytest.raises(ValueError, match="'a'.*use '\\*'"):
        jitop.matmul(2.0, np.ones((3, 3)))


# ---- dense ----

@pytest.mark.parametrize("xshape", [(4, 6), (6,), (2, 3, 6), (1, 6), (0, 6)], ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_dense(xshape, bias):
    x, w = rand(rng, xshape, np.float32), rand(rng, (5, 6), np.float32)
    b = rand(rng, (5,), np.float32) if bias else None
    got = jitop.dense(x, w, b) if bias else jitop.dense(x, w)
    # the reference, written out: y[..., o] = sum_i x[..., i] * w[o, i] + b[o]
    expected = np.einsum("...i,oi->...o", x.astype(np.float64), w.astype(np.float64))
    if bias:
        expected = expected + b
    assert got.dtype == np.float32 and got.shape == xshape[:-1] + (5,)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dx,dw,db", [(np.float64, np.float64, np.float64), (np.int32, np.int32, np.int32),
                                      (np.int64, np.int64, None), (np.float32, np.float32, np.float64),
                                      (np.int32, np.float32, np.float32)], ids=str)
def test_dense_dtypes_follow_numpy(dx, dw, db):
    x, w = rand(rng, (3, 7), dx), rand(rng, (4, 7), dw)
    if db is None:
        assert_matmul(jitop.dense(x, w), x, w.T)
        return
    b = rand(rng, (4,), db)
    expected = np.matmul(x, w.T) + b
    got = jitop.dense(x, w, b)
    rtol = 0 if expected.dtype.kind != "f" else 1e-5
    assert_close(got, expected, rtol=rtol, atol=rtol)


# x @ w.T has three lowerings: row dot products (up to 4 rows), (w @ x.T).T (rows <= columns / 4), and the
# matmul template gathering w.T; each must be numpy's matmul, for floats and exactly for integers
@pytest.mark.parametrize("m,k,n", [(1, 37, 50), (4, 130, 33), (5, 70, 20), (7, 33, 64), (16, 9, 200), (40, 17, 30)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64], ids=lambda d: np.dtype(d).name)
def test_x_times_w_transposed_every_lowering(m, k, n, dtype):
    x, w = rand(rng, (m, k), dtype), rand(rng, (n, k), dtype)
    assert_matmul(jitop.matmul(x, w.T), x, w.T)
    assert_matmul(jitop.kernel(lambda a, b: a @ b.T)(x, w), x, w.T)


def test_few_rows_times_w_transposed_is_a_row_reduction_not_a_matmul():
    x, w = rand(rng, (2, 300), np.float32), rand(rng, (64, 300), np.float32)
    f = jitop.kernel(lambda a, b: a @ b.T)
    text = jitop.explain(f, x, w)
    assert "topi.matmul" not in text and "sum" in text
    assert_matmul(f(x, w), x, w.T)


@pytest.mark.parametrize("x,w,b,match", [
    ((3, 5), (4,), None, r"'weight' must have 2 dimensions"),
    ((3, 5), (2, 4, 5), None, r"'weight' must have 2 dimensions"),
    ((3, 5), (4, 6), None, r"last dimension of 'x' \(3, 5\) must equal in_features = weight.shape\[1\] = 6"),
    ((), (4, 5), None, r"'x'"),
    ((3, 5), (4, 5), (3,), r"'bias' must have shape \(4,\), got \(3,\)"),
    ((3, 5), (4, 5), (1, 4), r"'bias' must have shape \(4,\)"),
    ((3, 5), (4, 5), (), r"'bias' must have shape \(4,\)"),
])
def test_dense_bad_shapes(x, w, b, match):
    args = [np.ones(x, np.float32), np.ones(w, np.float32)] + ([] if b is None else [np.ones(b, np.float32)])
    with pytest.raises(ValueError, match=match):
        jitop.dense(*args)


# ---- batch_matmul ----

@pytest.mark.parametrize("sa,sb", [((2, 3, 4), (2, 4, 5)), ((1, 3, 4), (5, 4, 2)), ((6, 1, 7), (1, 7, 1)),
                                   ((3, 0, 4), (3, 4, 2))], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.int64], ids=lambda d: np.dtype(d).name)
def test_batch_matmul(sa, sb, dtype):
    a, b = rand(rng, sa, dtype), rand(rng, sb, dtype)
    got = jitop.batch_matmul(a, b)
    # the reference, one matrix product per batch entry (a batch of 1 repeats)
    batch = max(sa[0], sb[0])
    expected = np.stack([a[i % sa[0]] @ b[i % sb[0]] for i in range(batch)])
    assert_matmul(got, a, b)
    assert_close(got, expected, rtol=1e-5 if dtype == np.float32 else 0, atol=1e-5 if dtype == np.float32 else 0)


@pytest.mark.parametrize("sa,sb,match", [
    ((3, 4), (2, 4, 5), r"batch_matmul: argument 'a' must have 3 dimensions"),
    ((1, 2, 3, 4), (2, 4, 5), r"argument 'a' must have 3 dimensions"),
    ((2, 3, 4), (4, 5), r"batch_matmul: argument 'b' must have 3 dimensions"),
    ((2, 3, 4), (4,), r"argument 'b' must have 3 dimensions"),
    ((2, 3, 4), (2, 3, 5), r"last dimension of 'a' \(4\)"),
    ((2, 3, 4), (3, 4, 5), r"batch dimensions \(2,\) of 'a' and \(3,\) of 'b'"),
])
def test_batch_matmul_bad_shapes(sa, sb, match):
    with pytest.raises(ValueError, match=match):
        jitop.batch_matmul(np.ones(sa, np.float32), np.ones(sb, np.float32))


# ---- inside @jitop.kernel ----

def test_dense_relu_traces_through_kernel():
    @jitop.kernel
    def layer(x, w, b):
        return jitop.relu(jitop.dense(x, w, b))

    x, w, b = rand(rng, (9, 6), np.float32), rand(rng, (5, 6), np.float32), rand(rng, (5,), np.float32)
    expected = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + b, 0)
    got = layer(x, w, b)
    assert got.dtype == np.float32 and got.shape == (9, 5)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    text = jitop.explain(layer, x, w, b)
    assert isinstance(text, str) and "layer" in text


def test_matmul_variants_trace_through_kernel():
    @jitop.kernel
    def f(a, b, c):
        return jitop.matmul(a, b) * 2 + jitop.batch_matmul(c, c.transpose(0, 2, 1)).sum(axis=0)

    a, b, c = rand(rng, (4, 6), np.float32), rand(rng, (6, 4), np.float32), rand(rng, (3, 4, 5), np.float32)
    expected = np.matmul(a, b) * 2 + np.matmul(c, c.transpose(0, 2, 1)).sum(axis=0)
    assert_close(f(a, b, c), expected, rtol=1e-5, atol=1e-5)

    @jitop.kernel
    def dot(v, w):
        return jitop.matmul(v, w)

    v, w = rand(rng, (7,), np.int64), rand(rng, (7,), np.int64)
    assert_close(dot(v, w), np.matmul(v, w))  # a numpy scalar, as np.matmul gives


def test_matmul_out_inside_kernel_falls_back_with_a_warning():
    @jitop.kernel
    def f(a, out):
        return jitop.matmul(a, a.T, out=out)

    a = rand(rng, (3, 4), np.float32)
    out = np.zeros((3, 3), np.float32)
    with pytest.warns(jitop.JitopFallbackWarning, match=r"out="):
        r = f(a, out)
    assert_matmul(r, a, a.T)


def test_matmul_errors_inside_kernel_are_the_same_errors():
    @jitop.kernel(fallback=False)
    def f(a, b):
        return jitop.matmul(a, b)

    with pytest.raises(ValueError, match=r"last dimension of 'a' \(4\)"):
        f(np.ones((3, 4), np.float32), np.ones((3, 4), np.float32))


# ---- properties ----

@st.composite
def matmul_operands(draw):
    m, k, n = (draw(st.integers(1, 9)) for _ in range(3))
    a_vec, b_vec = draw(st.booleans()), draw(st.booleans())
    batch = draw(st.lists(st.integers(1, 3), max_size=2))
    # each operand takes the batch dims with some of them set to 1 or dropped from the left
    def batch_of():
        dims = [d if draw(st.booleans()) else 1 for d in batch]
        return tuple(dims[draw(st.integers(0, len(dims))):])
    sa = (k,) if a_vec else batch_of() + (m, k)
    sb = (k,) if b_vec else batch_of() + (k, n)
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int32]))
    return sa, sb, dtype


@settings(max_examples=25, deadline=None)
@given(matmul_operands())
def test_matmul_property(operands):
    sa, sb, dtype = operands
    a, b = rand(rng, sa, dtype), rand(rng, sb, dtype)
    assert_matmul(jitop.matmul(a, b), a, b)
