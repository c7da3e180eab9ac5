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
    k = check.push(i < 5)  # a symbolic range is not narrowed (the fact still counts)
    assert check.ranges[i] == (0, n - 1) and check.in_bounds(i, n)
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
    text = _ir(s, [X, F])
    assert "E = allocate(float32[4, m], 'local')" in text  # 4 rows of the whole symbolic row
    assert "if i.outer * 4 + i < n:" in text
