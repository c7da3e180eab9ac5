"""Schedule primitives (loop shapes, misuse errors) and golden lowered IR. No kernel is compiled here."""
from __future__ import annotations

import re

import pytest

import jitop
from jitop import te
from jitop.errors import LoweringError, ScheduleError


def leaves(stage) -> list[tuple[str, int]]:
    return [(iv.name, iv.extent) for iv in stage.leaf_iter_vars]


def elementwise(shape=(10, 12)):
    A = te.placeholder(shape, "float32", "A")
    B = te.compute(shape, lambda i, j: A[i, j] + 1.0, name="B")
    C = te.compute(shape, lambda i, j: B[i, j] * 2.0, name="C")
    return A, B, C


def row_sum(n=10, m=12):
    A = te.placeholder((n, m), "float32", "A")
    k = te.reduce_axis((0, m), "k")
    D = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), name="D")
    E = te.compute((n,), lambda i: D[i] * 2.0, name="E")
    return A, k, D, E


# ---------------------------------------------------------------------------------------------
# loop shapes
# ---------------------------------------------------------------------------------------------

def test_default_leaf_order_is_axis_then_reduce_axis():
    A, k, D, E = row_sum()
    s = jitop.create_schedule(E.op)
    assert leaves(s[D]) == [("i", 10), ("k", 12)]
    assert leaves(s[E]) == [("i", 10)]
    assert [st.name for st in s.stages] == ["A", "D", "E"]


def test_split_factor_and_nparts():
    _, _, C = elementwise()
    s = jitop.create_schedule(C.op)
    i, j = C.op.axis
    io, ii = s[C].split(i, factor=3)
    assert (io.name, io.extent, ii.name, ii.extent) == ("i.outer", 4, "i.inner", 3)
    jo, ji = s[C].split(j, nparts=5)          # 12 in 5 parts: inner ceil(12/5) = 3, outer 4
    assert leaves(s[C]) == [("i.outer", 4), ("i.inner", 3), ("j.outer", 4), ("j.inner", 3)]
    _, _, C = elementwise((7, 1))
    s = jitop.create_schedule(C.op)
    s[C].split(C.op.axis[0], factor=16)      # factor bigger than the extent
    s[C].split(C.op.axis[1], factor=1)
    assert leaves(s[C]) == [("i.outer", 1), ("i.inner", 16), ("j.outer", 1), ("j.inner", 1)]


def test_tile_orders_outer_loops_first():
    _, _, C = elementwise()
    s = jitop.create_schedule(C.op)
    xo, yo, xi, yi = s[C].tile(C.op.axis[0], C.op.axis[1], 4, 5)
    assert leaves(s[C]) == [("i.outer", 3), ("j.outer", 3), ("i.inner", 4), ("j.inner", 5)]
    assert s[C].leaf_iter_vars == [xo, yo, xi, yi]


def test_fuse_and_split_of_fused():
    _, _, C = elementwise()
    s = jitop.create_schedule(C.op)
    f = s[C].fuse(*C.op.axis)
    assert (f.name, f.extent) == ("i.j.fused", 120)
    fo, fi = s[C].split(f, factor=16)
    assert leaves(s[C]) == [("i.j.fused.outer", 8), ("i.j.fused.inner", 16)]
    # three axes at once
    A = te.placeholder((2, 3, 5), "float32", "A")
    B = te.compute((2, 3, 5), lambda a, b, c: A[a, b, c], name="B")
    s = jitop.create_schedule(B.op)
    f3 = s[B].fuse(*B.op.axis)
    assert f3.extent == 30 and leaves(s[B]) == [(f3.name, 30)]


def test_reorder_permutes_only_the_named_positions():
    A = te.placeholder((2, 3, 5, 7), "float32", "A")
    B = te.compute((2, 3, 5, 7), lambda a, b, c, d: A[a, b, c, d], name="B")
    s = jitop.create_schedule(B.op)
    a, b, c, d = B.op.axis
    s[B].reorder(d, b)
    assert [n for n, _ in leaves(s[B])] == ["a", "d", "c", "b"]
    s[B].reorder(c, a, d)
    assert [n for n, _ in leaves(s[B])] == ["c", "a", "d", "b"]


def test_reorder_reduce_axis_outside():
    A, k, D, E = row_sum()
    s = jitop.create_schedule(E.op)
    ko, ki = s[D].split(k, factor=4)
    s[D].reorder(ko, D.op.axis[0], ki)
    assert leaves(s[D]) == [("k.outer", 3), ("i", 10), ("k.inner", 4)]


# ---------------------------------------------------------------------------------------------
# misuse: the error names the stage and the axis and says what to do
# ---------------------------------------------------------------------------------------------

def test_split_an_axis_twice():
    _, _, C = elementwise()
    s = jitop.create_schedule(C.op)
    i = C.op.axis[0]
    s[C].split(i, factor=3)
    with pytest.raises(ScheduleError) as info:
        s[C].split(i, factor=2)
    msg = str(info.value)
    assert "'C'" in msg and "'i'" in msg
    assert "already split into (i.outer, i.inner)" in msg
    assert "instead" in msg


def test_use_of_fused_axis_says_what_it_became():
    _, _, C = elementwise()
    s = jitop.create_schedule(C.op)
    s[C].fuse(*C.op.axis)
    with pytest.raises(ScheduleError, match=r"'j' was already fused into \(i\.j\.fused\)"):
        s[C].vectorize(C.op.axis[1])


def test_fuse_non_adjacent_axes():
    _, _, C = elementwise()
    s = jitop.create_schedule(C.op)
    i, j = C.op.axis
    io, ii = s[C].split(i, factor=3)
    with pytest.raises(ScheduleError) as info:
        s[C].fuse(io, j)
    msg = str(info.value)
    assert "'C'" in msg and "'i.outer'" in msg and "'j'" in msg
    assert "not adjacent" in msg and "i.outer, i.inner, j" in msg and "reorder" in msg
    with pytest.raises(ScheduleError, match="not adjacent"):
        s[C].fuse(j, ii)  # wrong order: inner before outer


def test_fuse_data_with_reduce_axis():
    A, k, D, E = row_sum()
    s = jitop.create_schedule(E.op)
    with pytest.raises(ScheduleError, match=r"'D'.*reduce"):
        s[D].fuse(D.op.axis[0], k)


def test_compute_inline_of_reduction():
    A, k, D, E = row_sum()
    s = jitop.create_schedule(E.op)
    with pytest.raises(ScheduleError) as info:
        s[D].compute_inline()
    msg = str(info.value)
    assert "'D'" in msg and "reduction" in msg and "compute_at" in msg


def test_compute_inline_of_output():
    A, k, D, E = row_sum()
    s = jitop.create_schedule(E.op)
    with pytest.raises(ScheduleError, match=r"'E' is an output"):
        s[E].compute_inline()


def test_inlined_stage_passed_as_argument():
    A, B, C = elementwise()
    s = jitop.create_schedule(C.op)
    s[B].compute_inline()
    with pytest.raises(LoweringError, match=r"'B'.*inlined.*compute_inline"):
        jitop.lower(s, [A, B, C])


def test_parallel_on_reduce_axis():
    A, k, D, E = row_sum()
    s = jitop.create_schedule(E.op)
    with pytest.raises(ScheduleError) as info:
        s[D].parallel(k)
    msg = str(info.value)
    assert "'D'" in msg and "'k'" in msg and "reduction axis" in msg and "data axis" in msg


def test_cache_write_after_split():
    _, _, C = elementwise()
    s = jitop.create_schedule(C.op)
    s[C].split(C.op.axis[0], factor=2)
    with pytest.raises(ScheduleError) as info:
        s.cache_write(C, "local")
    msg = str(info.value)
    assert "'C'" in msg and "before" in msg and "split" in msg


def chain3():
    """Three elementwise stages, each reading the one before: B, C, D."""
    A = te.placeholder((8,), "float32", "A")
    B = te.compute((8,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((8,), lambda i: B[i] * 2.0, name="C")
    D = te.compute((8,), lambda i: C[i] - 1.0, name="D")
    return B, C, D


def test_compute_at_cycles():
    B, C, D = chain3()
    s = jitop.create_schedule(D.op)
    s[B].compute_at(s[C], C.op.axis[0])
    with pytest.raises(ScheduleError, match=r"'C'.*'B'"):
        s[C].compute_at(s[B], B.op.axis[0])
    s[C].compute_at(s[D], D.op.axis[0])
    with pytest.raises(ScheduleError, match=r"'D'.*'B'"):   # D -> B -> C -> D
        s[D].compute_at(s[B], B.op.axis[0])
    with pytest.raises(ScheduleError, match="'C'"):
        s[C].compute_at(s[C], C.op.axis[0])


def test_compute_at_with_a_reader_outside_the_loop():
    A = te.placeholder((8,), "float32", "A")
    B = te.compute((8,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((8,), lambda i: B[i] * 2.0, name="C")
    D = te.compute((8,), lambda i: B[i] + C[i], name="D")
    s = jitop.create_schedule(D.op)
    s[B].compute_at(s[C], C.op.axis[0])
    with pytest.raises(LoweringError, match=r"'B'.*'C'.*'D'.*compute_root"):
        jitop.lower(s, [A, D])


def test_annotating_an_axis_of_another_stage():
    _, B, C = elementwise()
    s = jitop.create_schedule(C.op)
    io, ii = s[C].split(C.op.axis[0], factor=4)
    for primitive in ("vectorize", "parallel", "unroll"):
        with pytest.raises(ScheduleError) as info:
            getattr(s[B], primitive)(ii)
        msg = str(info.value)
        assert "stage 'B'" in msg and "'i.inner'" in msg and "(i, j)" in msg
    with pytest.raises(ScheduleError, match="stage 'B'"):
        s[B].split(io, factor=2)
    with pytest.raises(ScheduleError, match="stage 'B'"):
        s[B].reorder(C.op.axis[1], B.op.axis[0])


def test_other_misuse():
    A, B, C = elementwise()
    s = jitop.create_schedule(C.op)
    with pytest.raises(ScheduleError, match="placeholder"):
        s[A].compute_inline()
    with pytest.raises(ScheduleError, match="exactly one of factor= or nparts="):
        s[C].split(C.op.axis[0], factor=2, nparts=2)
    with pytest.raises(ScheduleError, match="positive int"):
        s[C].split(C.op.axis[0], factor=0)
    with pytest.raises(ScheduleError, match="listed twice"):
        s[C].reorder(C.op.axis[0], C.op.axis[0])
    with pytest.raises(TypeError, match="IterVar"):
        s[C].split("i", factor=2)
    with pytest.raises(TypeError, match="stage"):
        s[B].compute_at(C, C.op.axis[0])
    other = te.compute((3,), lambda i: A[i, 0], name="Other")
    with pytest.raises(KeyError, match="'Other' is not part of this schedule"):
        s[other]
    with pytest.raises(LoweringError, match="placeholder 'A' is read but is not among the arguments"):
        jitop.lower(s, [C])


# ---------------------------------------------------------------------------------------------
# golden lowered IR
# ---------------------------------------------------------------------------------------------

def check_no_index_noise(text: str) -> None:
    # "* 1", "+ 0", "- 0" (not followed by more digits or a decimal point) are arithmetic noise
    noise = re.findall(r"(?:\* 1|\+ 0|- 0)(?![\d.])", text)
    assert not noise, f"index arithmetic noise {noise} in:\n{text}"
    assert "(0)" not in text and "range(0)" not in text


def lowered(s, args) -> str:
    text = str(jitop.lower(s, args))
    check_no_index_noise(text)
    return text


def test_golden_elementwise():
    A = te.placeholder((7, 5), "float32", "A")
    B = te.compute((7, 5), lambda i, j: A[i, j] * 2.0 + 1.0, name="B")
    s = jitop.create_schedule(B.op)
    assert lowered(s, [A, B]) == """\
def main(A: float32[7, 5], B: float32[7, 5]):
    for i in range(7):
        for j in range(5):
            B[i, j] = A[i, j] * 2.0f + 1.0f"""


def test_golden_split_with_tail_guard():
    A = te.placeholder((10,), "float32", "A")
    B = te.compute((10,), lambda i: A[i] + 1.0, name="B")
    s = jitop.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=4)
    s[B].vectorize(xi)
    assert lowered(s, [A, B]) == """\
def main(A: float32[10], B: float32[10]):
    for i.outer in range(2):
        for i.inner in vectorized(4):
            B[i.outer * 4 + i.inner] = A[i.outer * 4 + i.inner] + 1.0f
    for i.inner in vectorized(4):
        if i.inner + 8 < 10:
            B[i.inner + 8] = A[i.inner + 8] + 1.0f"""


def test_golden_split_serial_tail_is_peeled_without_guard():
    A = te.placeholder((10,), "float32", "A")
    B = te.compute((10,), lambda i: A[i] + 1.0, name="B")
    s = jitop.create_schedule(B.op)
    s[B].split(B.op.axis[0], factor=4)
    assert lowered(s, [A, B]) == """\
def main(A: float32[10], B: float32[10]):
    for i.outer in range(2):
        for i.inner in range(4):
            B[i.outer * 4 + i.inner] = A[i.outer * 4 + i.inner] + 1.0f
    for i.inner in range(2):
        B[i.inner + 8] = A[i.inner + 8] + 1.0f"""


def test_golden_compute_at_region_sized_buffer():
    A = te.placeholder((9,), "float32", "A")
    B = te.compute((8,), lambda i: A[i] + A[i + 1], name="B")
    C = te.compute((8,), lambda i: B[i] * 2.0, name="C")
    s = jitop.create_schedule(C.op)
    co, ci = s[C].split(C.op.axis[0], factor=4)
    s[B].compute_at(s[C], co)
    assert lowered(s, [A, C]) == """\
def main(A: float32[9], C: float32[8]):
    for i.outer in range(2):
        B = allocate(float32[4], 'local')
        for i in range(4):
            B[i] = A[i.outer * 4 + i] + A[i.outer * 4 + i + 1]
        for i.inner in range(4):
            C[i.outer * 4 + i.inner] = B[i.inner] * 2.0f"""


def test_golden_reduction_with_init():
    A = te.placeholder((4, 6), "float32", "A")
    k = te.reduce_axis((0, 6), "k")
    B = te.compute((4,), lambda i: te.sum(A[i, k], axis=k), name="B")
    s = jitop.create_schedule(B.op)
    assert lowered(s, [A, B]) == """\
def main(A: float32[4, 6], B: float32[4]):
    for i in range(4):
        B[i] = 0.0f
        for k in range(6):
            B[i] = B[i] + A[i, k]"""


def test_golden_reduction_split_reduce_axis_and_where():
    A = te.placeholder((4, 8), "float32", "A")
    k = te.reduce_axis((0, 8), "k")
    B = te.compute((4,), lambda i: te.max(A[i, k], axis=k, where=k > i), name="B")
    s = jitop.create_schedule(B.op)
    ko, ki = s[B].split(k, factor=4)
    assert lowered(s, [A, B]) == """\
def main(A: float32[4, 8], B: float32[4]):
    for i in range(4):
        B[i] = -inff
        for k.outer in range(2):
            for k.inner in range(4):
                if k.outer * 4 + k.inner > i:
                    B[i] = max(B[i], A[i, k.outer * 4 + k.inner])"""


def test_no_index_noise_in_tiled_fused_cached_schedules():
    n, m, l = 5, 6, 7
    A = te.placeholder((n, l), "float32", "A")
    B = te.placeholder((l, m), "float32", "B")
    k = te.reduce_axis((0, l), "k")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = jitop.create_schedule(C.op)
    CC = s.cache_write(C, "local")
    xo, yo, xi, yi = s[C].tile(C.op.axis[0], C.op.axis[1], 2, 4)
    s[CC].compute_at(s[C], yo)
    ko, ki = s[CC].split(s[CC].op.reduce_axis[0], factor=3)
    text = lowered(s, [A, B, C])
    assert "C.local = allocate(float32[2, 4], 'local')" in text
    s2 = jitop.create_schedule(C.op)
    f = s2[C].fuse(*C.op.axis)
    s2[C].split(f, factor=8)
    lowered(s2, [A, B, C])


def test_compute_at_loop_names_are_unambiguous():
    A, B, C = elementwise((8, 6))
    s = jitop.create_schedule(C.op)
    s[B].compute_at(s[C], C.op.axis[0])
    text = lowered(s, [A, C])
    assert "i + i" not in text
    assert "range(1)" not in text
    assert not shadowed_loops(text), text


def shadowed_loops(text: str) -> list[str]:
    """Loop variables printed with the same name as an enclosing loop's variable."""
    open_loops: list[tuple[int, str]] = []
    bad = []
    for line in text.splitlines():
        depth = len(line) - len(line.lstrip())
        open_loops = [(d, n) for d, n in open_loops if d < depth]
        m = re.match(r"\s*for (\S+) in", line)
        if m:
            if any(n == m.group(1) for _, n in open_loops):
                bad.append(m.group(1))
            open_loops.append((depth, m.group(1)))
    return bad


# ---------------------------------------------------------------------------------------------
# the printer: Python-like text that means what it shows
# ---------------------------------------------------------------------------------------------

def test_printer_parenthesises_by_precedence():
    a, b, c = te.var("a"), te.var("b"), te.var("c")
    assert str(a - (b - c)) == "a - (b - c)"
    assert str(a - b - c) == "a - b - c"
    assert str(a * (b // c)) == "a * (b // c)"
    assert str(-(a + b)) == "-(a + b)"
    assert str((a & b) | c) == "a & b | c"
    assert str(a & (b | c)) == "a & (b | c)"
    assert str((a << b) + c) == "(a << b) + c"
    assert str(te.cast(a + b, "int32") * 2) == "int32(a + b) * 2"
    assert str(te.if_then_else(a < b, te.var("x", "float32"), 1.0)) == "select(a < b, x, 1.0f)"


def test_printer_distinguishes_or_xor_and_nested_comparisons():
    a, b, c = te.var("a"), te.var("b"), te.var("c")
    assert str((a | b) ^ c) != str(a | (b ^ c))
    assert str((a < b) == (b < c)) == "(a < b) == (b < c)"


def test_printer_float32_constants_are_short():
    x = te.var("x", "float32")
    assert str(x * 0.1) == "x * 0.1f"


def test_a_loop_another_stage_is_computed_at_cannot_be_reshaped() -> None:
    """compute_at, then split or fuse of that loop: a ScheduleError saying what to do (the stage was left attached
    to a loop that no longer existed, and lowering failed with 'IterVar(i) is not in list')."""
    _, B, C = elementwise((8, 8))
    s = jitop.create_schedule(C.op)
    s[B].compute_at(s[C], C.op.axis[0])
    with pytest.raises(ScheduleError, match=r"split of 'i' in stage 'C': stage 'B' is computed at that loop"):
        s[C].split(C.op.axis[0], factor=4)
    with pytest.raises(ScheduleError, match=r"fuse of 'i' in stage 'C': stage 'B' is computed at that loop"):
        s[C].fuse(*C.op.axis)
    s[C].split(C.op.axis[1], factor=4)  # another loop: as before


def test_compute_at_itself_and_inlining_an_attach_point_say_what_is_wrong() -> None:
    _, B, C = elementwise((8, 8))
    s = jitop.create_schedule(C.op)
    with pytest.raises(ScheduleError, match=r"'C' cannot be computed inside one of its own loops"):
        s[C].compute_at(s[C], C.op.axis[0])
    B, C, D = chain3()
    s = jitop.create_schedule(D.op)
    s[B].compute_at(s[C], C.op.axis[0])
    with pytest.raises(ScheduleError, match=r"stage\(s\) 'B' are computed at loops of 'C'"):
        s[C].compute_inline()


def test_split_takes_numpy_integers() -> None:
    import numpy as np
    _, _, C = elementwise((8, 8))
    s = jitop.create_schedule(C.op)
    outer, inner = s[C].split(C.op.axis[0], factor=np.int64(4))
    assert (outer.extent, inner.extent) == (2, 4)
    with pytest.raises(ScheduleError, match="positive int, got 2.5"):
        s[C].split(C.op.axis[1], factor=2.5)
