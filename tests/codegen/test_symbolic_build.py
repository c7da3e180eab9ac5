"""Kernels with symbolic shapes: one compiled kernel for every size, checked against numpy.

The hand-built PrimFuncs test code generation on its own (symbolic serial, vectorized, parallel and
unrolled loops, heap allocations, the ABI's symbol array); the schedules at the end go through
te -> lower -> build.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

import jitop
from jitop import te
from jitop.driver import compile_func, default_target
from jitop.schedule.schedule import ForKind
from jitop.te.expr import Op, binary, const
from jitop.tir.nodes import Allocate, Buffer, For, IfThenElse, PrimFunc, Seq, Store

SIZES = [0, 1, 7, 8, 9, 1000, 4099]


def _f32():
    return te.placeholder((1,), "float32", "probe").dtype


def _vector_add(kind: ForKind, split: str | None = None, min_work: int | None = None):
    """C[i] = A[i] + B[i] over a symbolic n, the loop as `kind` (split by 8 first: guarded, or `min` extent)."""
    n, f32 = te.var("n"), _f32()
    A, B, C = (Buffer(name, f32, (n,), "param") for name in "ABC")
    i = te.var("i")
    if split is None:
        body = For(i, n, kind, Store(C, (i,), A.load((i,)) + B.load((i,))))
    else:
        io, ii = te.var("io"), te.var("ii")
        at = io * 8 + ii
        store = Store(C, (at,), A.load((at,)) + B.load((at,)))
        inner = (For(ii, const(8), ForKind.VECTORIZED, IfThenElse(at < n, store)) if split == "guard" else
                 For(ii, _min(const(8), n - io * 8), ForKind.VECTORIZED, store))
        body = For(io, (n + 7) // 8, kind, inner)
    f = PrimFunc("vadd", (A, B, C), body, outputs=(2,), symbols=(n,))
    target = default_target() if min_work is None else default_target().replace(parallel_min_work=min_work)
    return compile_func(f, target)


def _min(a, b):
    return binary(Op.MIN, a, b)


def _inputs(n: int, seed: int = 0):
    g = np.random.default_rng(seed)
    return g.standard_normal(n).astype("float32"), g.standard_normal(n).astype("float32")


KERNELS = {
    "serial": lambda: _vector_add(ForKind.SERIAL),
    "unrolled": lambda: _vector_add(ForKind.UNROLLED),
    "vectorized": lambda: _vector_add(ForKind.VECTORIZED),
    "parallel": lambda: _vector_add(ForKind.PARALLEL, min_work=1),
    "parallel_never": lambda: _vector_add(ForKind.PARALLEL),
    "split_guard_parallel": lambda: _vector_add(ForKind.PARALLEL, "guard", min_work=1),
    "split_min_parallel": lambda: _vector_add(ForKind.PARALLEL, "min", min_work=1),
    "split_min_serial": lambda: _vector_add(ForKind.SERIAL, "min"),
}


@functools.cache
def kernel(name: str) -> jitop.Module:
    return KERNELS[name]()


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", list(KERNELS))
def test_hand_built_vector_add(name, n):
    a, b = _inputs(n)
    f = kernel(name)
    np.testing.assert_array_equal(f(a, b), a + b)
    c = np.full(n, np.nan, "float32")
    f(a, b, c)
    np.testing.assert_array_equal(c, a + b)


def test_symbolic_kernel_signature_and_abi():
    f = kernel("serial")
    assert f.meta["symbols"] == [{"name": "n", "param": 0, "dim": 0, "dtype": "int64"}]
    assert [p["shape"] for p in f.meta["params"]] == [["n"], ["n"], ["n"]]
    ll = f.get_source()
    assert "ptr noalias %symbols" in ll or "%symbols" in ll


@pytest.mark.parametrize("n", [0, 5, 1000])
def test_object_trampoline_reads_the_dims(n):
    a, b = _inputs(n)
    c = np.zeros(n, "float32")
    kernel("vectorized").call_arrays(a, b, c)
    np.testing.assert_array_equal(c, a + b)
    c[:] = 0
    kernel("vectorized")._call_pointers(a, b, c)  # the entry used where numpy's struct layout is not as expected
    np.testing.assert_array_equal(c, a + b)


def test_tied_dims_mismatch_is_a_value_error():
    a, _ = _inputs(4)
    with pytest.raises(ValueError, match=r"argument 'B' \(position 1\) dimension 0 is 5, but it must equal "
                                         r"argument 'A' \(position 0\) dimension 0 \(n = 4\)"):
        kernel("serial")(a, np.zeros(5, "float32"))
    with pytest.raises(ValueError, match=r"argument 'C' \(position 2\) dimension 0 is 3"):
        kernel("serial")(a, a.copy(), np.zeros(3, "float32"))


def test_save_load_keeps_the_symbols(tmp_path):
    f = kernel("split_min_parallel")
    f.save(tmp_path / "k.jitop")
    g = jitop.load_module(tmp_path / "k.jitop")
    assert g.meta["symbols"] == f.meta["symbols"]
    a, b = _inputs(77)
    np.testing.assert_array_equal(g(a, b), a + b)
    with pytest.raises(ValueError, match="must equal"):
        g(a, b[:5])


def test_edited_symbols_are_refused(tmp_path):
    import json
    import zipfile
    f = kernel("serial")
    f.save(tmp_path / "k.jitop")
    with zipfile.ZipFile(tmp_path / "k.jitop") as z:
        meta, obj = json.loads(z.read("meta.json")), z.read("kernel.o")
    meta["symbols"][0]["dtype"] = "int32"
    with zipfile.ZipFile(tmp_path / "e.jitop", "w") as z:
        z.writestr("meta.json", json.dumps(meta))
        z.writestr("kernel.o", obj)
    with pytest.raises(ValueError, match="disagree"):
        jitop.load_module(tmp_path / "e.jitop")


def _two_symbols():
    """2-D: T = A * 2 in a heap buffer of shape (n, m), C = T + B[j] (B: float32[m]); C's rows unrolled,
    columns vectorized."""
    n, m, f32 = te.var("n"), te.var("m"), _f32()
    A, B, C = Buffer("A", f32, (n, m), "param"), Buffer("B", f32, (m,), "param"), Buffer("C", f32, (n, m), "param")
    T = Buffer("T", f32, (n, m), "global")
    i, j = te.var("i"), te.var("j")
    fill = For(i, n, ForKind.SERIAL, For(j, m, ForKind.VECTORIZED, Store(T, (i, j), A.load((i, j)) * 2.0)))
    use = For(i, n, ForKind.UNROLLED, For(j, m, ForKind.VECTORIZED,
                                           Store(C, (i, j), T.load((i, j)) + B.load((j,)))))
    f = PrimFunc("two", (A, B, C), Allocate(T, Seq((fill, use))), outputs=(2,), symbols=(n, m))
    return compile_func(f, default_target())


@pytest.mark.parametrize("shape", [(0, 0), (0, 5), (3, 0), (1, 1), (7, 9), (33, 100)])
def test_two_symbols_and_a_heap_allocation(shape):
    f = _two_symbols_kernel()
    a = np.random.default_rng(1).standard_normal(shape).astype("float32")
    b = np.random.default_rng(2).standard_normal(shape[1]).astype("float32")
    np.testing.assert_array_equal(f(a, b), a * np.float32(2) + b)


@functools.cache
def _two_symbols_kernel():
    return _two_symbols()


def test_two_symbols_bind_in_order():
    f = _two_symbols_kernel()
    assert [(s["name"], s["param"], s["dim"]) for s in f.meta["symbols"]] == [("n", 0, 0), ("m", 0, 1)]
    with pytest.raises(ValueError, match=r"argument 'B' \(position 1\) dimension 0 is 4, but it must equal "
                                         r"argument 'A' \(position 0\) dimension 1 \(m = 3\)"):
        f(np.zeros((2, 3), "float32"), np.zeros(4, "float32"))


def test_many_nests_pass_the_symbols_to_each_part():
    """More top-level nests than one LLVM function takes (NESTS_PER_FUNCTION): each part binds the symbols."""
    from jitop.codegen.kernel import NESTS_PER_FUNCTION
    n, f32 = te.var("n"), _f32()
    A, C = Buffer("A", f32, (n,), "param"), Buffer("C", f32, (n,), "param")
    nests = []
    for k in range(NESTS_PER_FUNCTION + 3):
        i = te.var(f"i{k}")
        src = A.load((i,)) if k == 0 else C.load((i,))
        nests.append(For(i, n, ForKind.SERIAL, Store(C, (i,), src + 1.0)))
    f = compile_func(PrimFunc("many", (A, C), Seq(tuple(nests)), outputs=(1,), symbols=(n,)), default_target())
    a = np.arange(10, dtype="float32")
    np.testing.assert_array_equal(f(a), a + len(nests))


def test_a_symbol_no_input_has_is_a_build_error():
    n, m, f32 = te.var("n"), te.var("m"), _f32()
    A, C = Buffer("A", f32, (n,), "param"), Buffer("C", f32, (n * m,), "param")
    i = te.var("i")
    f = PrimFunc("bad", (A, C), For(i, n, ForKind.SERIAL, Store(C, (i,), A.load((i,)))), outputs=(1,),
                 symbols=(n, m))
    with pytest.raises(ValueError, match=r"symbol\(s\) m must be a dimension of an input on its own"):
        compile_func(f, default_target())


def test_constant_kernels_keep_their_abi():
    A = te.placeholder((16,), "float32", "A")
    C = te.compute((16,), lambda i: A[i] + 1.0, name="C")
    f = jitop.build(jitop.create_schedule(C.op), [A, C])
    assert "symbols" not in f.meta and f.binder is None
    assert "%symbols" not in f.get_source()


# ---------------------------------------------------------------------------------------------
# te -> lower -> build (TVM's example and schedules on a symbolic axis)
# ---------------------------------------------------------------------------------------------

def _tvm_example():
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute(A.shape, lambda i: A[i] + B[i], name="C")
    return A, B, C


def _lowers_symbolic() -> bool:
    A, B, C = _tvm_example()
    try:
        jitop.lower(jitop.create_schedule(C.op), [A, B, C])
    except (TypeError, ValueError):
        return False
    return True


needs_lowering = pytest.mark.skipif(not _lowers_symbolic(), reason="lowering of symbolic shapes (issue 23 A4) "
                                                                    "has not landed")


def _split_vectorize_parallel(s, C):
    outer, inner = s[C].split(C.op.axis[0], factor=8)
    s[C].vectorize(inner)
    s[C].parallel(outer)


BUILDS = {"default": lambda s, C: None, "split_vectorize_parallel": _split_vectorize_parallel}


@functools.cache
def built(name: str) -> jitop.Module:
    A, B, C = _tvm_example()
    s = jitop.create_schedule(C.op)
    BUILDS[name](s, C)
    return jitop.build(s, [A, B, C], target=default_target().replace(parallel_min_work=1))


@needs_lowering
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", list(BUILDS))
def test_tvm_example_runs_for_every_n(name, n):
    a, b = _inputs(n)
    f = built(name)
    c = np.empty(n, "float32")
    f(a, b, c)
    np.testing.assert_array_equal(c, a + b)
    np.testing.assert_array_equal(f(a, b), a + b)


@needs_lowering
def test_built_kernel_checks_tied_dims_and_round_trips(tmp_path):
    f = built("split_vectorize_parallel")
    with pytest.raises(ValueError, match=r"argument 'B' \(position 1\) dimension 0 is 5, but it must equal "
                                         r"argument 'A' \(position 0\) dimension 0 \(n = 4\)"):
        f(np.zeros(4, "float32"), np.zeros(5, "float32"))
    f.save(tmp_path / "k.jitop")
    g = jitop.load_module(tmp_path / "k.jitop")
    assert g.meta["symbols"] == f.meta["symbols"]
    a, b = _inputs(1001)
    np.testing.assert_array_equal(g(a, b), a + b)
