"""Symbolic extents (te.var / te.size_var dimensions) through TE, schedules and lowering. No LLVM here."""
from __future__ import annotations

import numpy as np
import pytest

import jitop
from jitop import te
from jitop.te.expr import is_size_var
from jitop.te.tensor import broadcast_index


def vector_add(n):
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute(A.shape, lambda i: A[i] + B[i], name="C")
    return A, B, C


# ** te **

def test_tvm_example_reaches_create_schedule():
    n = te.var("n")
    A, B, C = vector_add(n)
    s = jitop.create_schedule(C.op)
    assert A.shape == (n,) and C.shape[0] is n
    assert C.op.axis[0].extent is n
    assert [st.name for st in s.stages] == ["A", "B", "C"]


def test_constant_dims_stay_python_ints():
    A = te.placeholder((np.int64(4), te.const(3)), name="A")
    assert A.shape == (4, 3) and all(type(d) is int for d in A.shape)
    B = te.compute(A.shape, lambda i, j: A[i, j], name="B")
    assert all(type(iv.extent) is int for iv in B.op.axis)
    assert type(te.reduce_axis((0, np.int32(5))).extent) is int


def test_shape_arithmetic_and_if_then_else():
    n = te.var("n")
    A = te.placeholder((n, n * 2), name="A")
    B = te.compute((n * 2,), lambda j: te.if_then_else(j < n, A[0, j], A[1, j]), name="B")
    assert repr(A.shape) == "(n, n * 2)"
    assert repr(B.shape[0]) == "n * 2"
    k = te.reduce_axis((0, n), "k")
    assert k.extent is n and k.dom == (0, n)
    S = te.compute((n * 2,), lambda j: te.sum(A[k, j], axis=k), name="S")
    assert S.op.reduce_axis[0] is k


def test_size_var_is_a_marked_variable():
    n, m = te.size_var("n"), te.var("n")
    assert is_size_var(n) and not is_size_var(m)
    assert n is not m and n.name == m.name == "n" and n.dtype.name == "int64"


@pytest.mark.parametrize("dim, error, words", [
    (-1, ValueError, "negative"),
    (1.5, TypeError, "must be an int or an int64 expression"),
    (te.var("x", "int32"), TypeError, "must be int64"),
])
def test_bad_dims_say_which_dimension(dim, error, words):
    with pytest.raises(error, match=words) as info:
        te.placeholder((3, dim), name="Z")
    assert "placeholder 'Z', dimension 1" in str(info.value)


def test_a_read_is_not_a_dimension():
    A = te.placeholder((4,), "int64", name="A")
    with pytest.raises(TypeError, match="integer arithmetic of symbols"):
        te.compute((A[0],), lambda i: i, name="B")


def test_broadcast_index_with_symbols():
    n, i, j = te.var("n"), te.var("i"), te.var("j")
    assert broadcast_index((1, n), (n, n), (i, j)) == (te.const(0), j)
    # a symbolic dim is never pinned, even against a 1
    assert broadcast_index((n,), (1,), (i,)) == (i,)
    assert broadcast_index((1,), (1,), (i,)) == (i,)


def test_keys_distinguish_symbolic_shapes():
    n, m = te.var("n"), te.var("m")
    keys = {te.placeholder(shape, name="A").op.key for shape in ((n,), (m,), (n * 2,), (4,))}
    assert len(keys) == 4


# ** bounds of accesses against symbolic dims **

def test_bounds_check_proves_symbolic_dims_from_ranges_and_guards():
    from jitop.tir.bounds import BoundsCheck
    from jitop.tir.simplify import SYMBOL_MAX
    n, io, ii, i = te.var("n"), te.var("io"), te.var("ii"), te.var("i")
    check = BoundsCheck({n: (0, SYMBOL_MAX), io: (0, (n + 7) // 8 - 1), ii: (0, 7), i: (0, n - 1)})
    assert check.in_bounds(i, n) and check.in_bounds(i, n * 2)
    assert not check.in_bounds(i + 1, n) and not check.in_bounds(i - 1, n)
    assert not check.in_bounds(io * 8 + ii, n)  # the tail of the split
    k = check.push(io * 8 + ii < n)
    assert check.in_bounds(io * 8 + ii, n) and not check.in_bounds(io * 8 + ii + 1, n)
    check.pop(k)
    assert not check.in_bounds(io * 8 + ii, n)
    k = check.push(i < 5)  # a symbolic range narrowed by a fact keeps both ends in a min
    assert repr(check.ranges[i][1]) == "min(n - 1, 4)" and check.in_bounds(i, 5) and check.in_bounds(i, n)
    check.pop(k)
    assert check.ranges[i] == (0, n - 1)
    k = check.push(io < n // 8)  # the main branch of a partitioned parallel loop
    assert repr(check.ranges[io][1]) == "n // 8 - 1" and check.in_bounds(io * 8 + ii, n)
    check.pop(k)


# ** lowering: printed IR with symbols **

def _ir(s, args) -> str:
    return str(jitop.lower(s, args))


def test_golden_tvm_example():
    n = te.var("n")
    A, B, C = vector_add(n)
    f = jitop.lower(jitop.create_schedule(C.op), [A, B, C])
    assert str(f) == """\
def main(A: float32[n], B: float32[n], C: float32[n]):
    for i in range(n):
        C[i] = A[i] + B[i]"""
    assert f.symbols == (n,)
    assert f.attrs["ranges"][n][0] == 0


def test_split_of_a_divisible_symbolic_extent_needs_no_guard():
    n = te.var("n")
    A = te.placeholder((n * 8,), name="A")
    B = te.compute(A.shape, lambda i: A[i] * 2.0, name="B")
    s = jitop.create_schedule(B.op)
    s[B].split(B.op.axis[0], 8)
    assert "if" not in _ir(s, [A, B]) and "range(n)" in _ir(s, [A, B])


def test_two_symbols_named_alike_are_an_error():
    A = te.placeholder((te.var("n"),), name="A")
    B = te.placeholder((te.var("n"),), name="B")
    C = te.compute(A.shape, lambda i: A[i] + B[i], name="C")
    with pytest.raises(jitop.errors.LoweringError, match=r"two distinct symbols are named 'n' \(the first in 'A' "
                                                         r"dimension 0, the other in 'B' dimension 0\)"):
        jitop.lower(jitop.create_schedule(C.op), [A, B, C])


def test_a_symbol_no_argument_has_is_an_error():
    n = te.var("n")
    A = te.placeholder((4,), name="A")
    B = te.compute((n,), lambda i: A[0] * 2.0, name="B")
    C = te.compute((4,), lambda i: A[i] + B[0], name="C")
    with pytest.raises(jitop.errors.LoweringError, match="stage 'B': the extent n of loop 'i' uses symbol 'n'"):
        jitop.lower(jitop.create_schedule(C.op), [A, C])


def test_symbols_in_argument_order():
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((m, n), name="A")
    B = te.compute((m, n), lambda i, j: A[i, j], name="B")
    assert jitop.lower(jitop.create_schedule(B.op), [A, B]).symbols == (m, n)


def test_compute_at_region_of_a_symbolic_dim():
    n, m = te.var("n"), te.var("m")
    X = te.placeholder((n, m), name="X")
    E = te.compute((n, m), lambda i, j: X[i, j] + 1.0, name="E")
    F = te.compute((n, m), lambda i, j: E[i, j] * 2.0, name="F")
    s = jitop.create_schedule(F.op)
    fo, _ = s[F].split(F.op.axis[0], 4)
    s[E].compute_at(s[F], fo)
    assert _ir(s, [X, F]) == """\
def main(X: float32[n, m], F: float32[n, m]):
    for i.outer in range(n // 4):
        E = allocate(float32[4, m], 'local')
        for i in range(4):
            for j in range(m):
                E[i, j] = X[i.outer * 4 + i, j] + 1.0f
        for i.inner in range(4):
            for j in range(m):
                F[i.outer * 4 + i.inner, j] = E[i.inner, j] * 2.0f
    E = allocate(float32[4, m], 'local')
    for i in range(n % 4):
        for j in range(m):
            E[i, j] = X[n // 4 * 4 + i, j] + 1.0f
    for i.inner in range(n % 4):
        for j in range(m):
            F[n // 4 * 4 + i.inner, j] = E[i.inner, j] * 2.0f"""


# ** loop partitioning of symbolic extents: a guard-free main loop and a tail **

def _split_vectorize(kind=None, factor=8):
    n = te.var("n")
    A, B, C = vector_add(n)
    s = jitop.create_schedule(C.op)
    xo, xi = s[C].split(C.op.axis[0], factor)
    s[C].vectorize(xi)
    if kind == "parallel":
        s[C].parallel(xo)
    return _ir(s, [A, B, C])


def test_golden_split_vectorize_peels_one_masked_tail():
    assert _split_vectorize() == """\
def main(A: float32[n], B: float32[n], C: float32[n]):
    for i.outer in range(n // 8):
        for i.inner in vectorized(8):
            C[i.outer * 8 + i.inner] = A[i.outer * 8 + i.inner] + B[i.outer * 8 + i.inner]
    for i.inner in vectorized(8):
        if n // 8 * 8 + i.inner < n:
            C[n // 8 * 8 + i.inner] = A[n // 8 * 8 + i.inner] + B[n // 8 * 8 + i.inner]"""


def test_golden_split_vectorize_parallel_balances_the_tail_inside():
    assert _split_vectorize("parallel") == """\
def main(A: float32[n], B: float32[n], C: float32[n]):
    for i.outer in parallel((n + 7) // 8):
        if i.outer < n // 8:
            for i.inner in vectorized(8):
                C[i.outer * 8 + i.inner] = A[i.outer * 8 + i.inner] + B[i.outer * 8 + i.inner]
        else:
            for i.inner in vectorized(8):
                if n // 8 * 8 + i.inner < n:
                    C[n // 8 * 8 + i.inner] = A[n // 8 * 8 + i.inner] + B[n // 8 * 8 + i.inner]"""


def test_golden_tile_fuse_parallel_inner_extent_is_a_min_and_whole_vectors_unmasked():
    n, m = te.var("n"), te.var("m")
    X = te.placeholder((n, m), name="X")
    Y = te.compute((n, m), lambda i, j: X[i, j] * 2.0, name="Y")
    s = jitop.create_schedule(Y.op)
    xo, yo, xi, yi = s[Y].tile(Y.op.axis[0], Y.op.axis[1], 4, 8)
    s[Y].parallel(s[Y].fuse(xo, yo))
    s[Y].vectorize(yi)
    f = "i.outer.j.outer.fused"
    row, col = f"{f} // ((m + 7) // 8) * 4 + i.inner", f"{f} % ((m + 7) // 8) * 8 + j.inner"
    assert _ir(s, [X, Y]) == f"""\
def main(X: float32[n, m], Y: float32[n, m]):
    for {f} in parallel((n + 3) // 4 * ((m + 7) // 8)):
        for i.inner in range(min(n - {f} // ((m + 7) // 8) * 4, 4)):
            if {f} % ((m + 7) // 8) * 8 + 7 < m:
                for j.inner in vectorized(8):
                    Y[{row}, {col}] = X[{row}, {col}] * 2.0f
            else:
                for j.inner in vectorized(8):
                    if {col} < m:
                        Y[{row}, {col}] = X[{row}, {col}] * 2.0f"""


def test_golden_reduction_tail_is_a_short_loop():
    n, m = te.var("n"), te.var("m")
    X = te.placeholder((n, m), name="X")
    k = te.reduce_axis((0, m), "k")
    D = te.compute((n,), lambda i: te.sum(X[i, k], axis=k), name="D")
    s = jitop.create_schedule(D.op)
    s[D].split(k, 4)
    assert _ir(s, [X, D]) == """\
def main(X: float32[n, m], D: float32[n]):
    for i in range(n):
        D[i] = 0.0f
        for k.outer in range(m // 4):
            for k.inner in range(4):
                D[i] = D[i] + X[i, k.outer * 4 + k.inner]
        for k.inner in range(m % 4):
            D[i] = D[i] + X[i, m // 4 * 4 + k.inner]"""


def test_an_unguarded_store_keeps_the_peeled_tail_behind_a_test():
    # T[io] is written outside the split's guard: the peeled iteration must not run when 8 divides n
    from jitop.schedule.schedule import ForKind
    from jitop.tir.nodes import Buffer, For, IfThenElse, Store, seq
    from jitop.tir.passes import partition_loops
    from jitop.tir.simplify import SYMBOL_MAX
    n, io, ii = te.var("n"), te.var("i.outer"), te.var("i.inner")
    f32 = te.placeholder((1,), name="p").dtype
    C, T = Buffer("C", f32, (n,), "param"), Buffer("T", f32, ((n + 7) // 8,), "param")
    body = seq(Store(T, (io,), te.const(1.0, "float32")),
               For(ii, te.const(8), ForKind.VECTORIZED, IfThenElse(io * 8 + ii < n, Store(C, (io * 8 + ii,), te.const(2.0, "float32")))))
    ranges = {n: (0, SYMBOL_MAX), io: (0, (n + 7) // 8 - 1), ii: (0, 7)}
    out = partition_loops(For(io, (n + 7) // 8, ForKind.SERIAL, body), ranges)
    assert repr(out) == """\
for i.outer in range(n // 8):
    T[i.outer] = 1.0f
    for i.inner in vectorized(8):
        C[i.outer * 8 + i.inner] = 2.0f
if n // 8 < (n + 7) // 8:
    T[n // 8] = 1.0f
    for i.inner in vectorized(8):
        if n // 8 * 8 + i.inner < n:
            C[n // 8 * 8 + i.inner] = 2.0f"""


def test_a_stray_variable_in_a_body_is_an_error():
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n,), name="A")
    C = te.compute((n,), lambda i: A[i] * m.astype("float32"), name="C")
    with pytest.raises(jitop.errors.LoweringError, match=r"stage 'C' uses the variable 'm', which is neither one of "
                                                         r"its axes nor a symbol of an argument's shape \(n\)"):
        jitop.lower(jitop.create_schedule(C.op), [A, C])
    D = te.compute((n,), lambda i: A[i] * n.astype("float32"), name="D")  # a symbol is a value in a body
    assert "D[i] = A[i] * float32(n)" in str(jitop.lower(jitop.create_schedule(D.op), [A, D]))


def test_bounds_check_divides_a_guarded_fused_index():
    """A fused index split over blocks (f = o * 256 + t, guarded by f < 37000) read as (f // 37, f % 37): the
    row f // 37 is below 1000 under the guard, and not without it."""
    from jitop.tir.bounds import BoundsCheck
    o, t = te.var("o"), te.var("t")
    check = BoundsCheck({o: (0, 144), t: (0, 255)})
    f = o * 256 + t
    assert not check.in_bounds(f // 37, 1000)
    k = check.push(f < 37000)
    assert check.in_bounds(f // 37, 1000) and not check.in_bounds(f // 37, 999)
    assert check.in_bounds(f % 37, 37) and not check.in_bounds(f // 36, 1000)
    check.pop(k)


def test_bounds_check_proves_a_concatenation_s_rows_of_a_symbolic_length():
    """np.vstack([cache, row]) of an n-row cache, 768 wide, split over blocks of 256 threads (f = 256 o + t,
    o < 3 n + 3: no guard, the split is exact): the row f // 768 is below n + 1, and past the select that takes
    the cache's rows (f // 768 < n), the new row's index f // 768 - n is 0. Each with a near miss refused."""
    from jitop.tir.bounds import BoundsCheck
    from jitop.tir.simplify import SYMBOL_MAX
    n, o, t = te.var("n"), te.var("o"), te.var("t")
    check = BoundsCheck({n: (2, SYMBOL_MAX), o: (0, n * 3 + 2), t: (0, 255)})
    f = o * 256 + t
    assert check.in_bounds(f // 768, n + 1) and not check.in_bounds(f // 768, n)
    assert not check.in_bounds(f // 768 - n, 1)  # rows below n give negative indices
    k = check.push(f // 768 < n, False)
    assert check.in_bounds(f // 768 - n, 1) and not check.in_bounds(f // 768 - n + 1, 1)
    assert not check.in_bounds(f // 768 - n - 1, 1)
    check.pop(k)
    assert not check.in_bounds(f // 768 - n, 1)


def test_bounds_check_proves_quotients_and_remainders_by_a_symbolic_divisor():
    """Scores of 12 heads over n + 1 cache rows, one block each (g < 12 (n + 1)): the head g // (n + 1) is below
    12 (its 64 columns below 768) and the row g % (n + 1) below n + 1; not for 13 heads' blocks."""
    from jitop.tir.bounds import BoundsCheck
    from jitop.tir.simplify import SYMBOL_MAX
    n, g, c = te.var("n"), te.var("g"), te.var("c")
    check = BoundsCheck({n: (2, SYMBOL_MAX), g: (0, n * 12 + 11), c: (0, 63)})
    assert check.in_bounds(g // (n + 1), 12) and not check.in_bounds(g // (n + 1), 11)
    assert check.in_bounds(g // (n + 1) * 64 + c, 768) and not check.in_bounds(g // (n + 1) * 64 + c, 767)
    assert check.in_bounds(g % (n + 1), n + 1) and not check.in_bounds(g % (n + 1), n)
    assert not check.in_bounds(g // n, 12)  # g // n reaches 12 at g = 12 n
    wide = BoundsCheck({n: (2, SYMBOL_MAX), g: (0, n * 13 + 12)})
    assert not wide.in_bounds(g // (n + 1), 12)
