"""The native entry's symbolic signatures (jitop.runtime.fastcall with jitop.runtime.dimprog): dims bound into
slots and tied, guards, output dims computed from the symbols; every failed check is a MISS, never a wrong
call. Kernels: hand-built symbolic PrimFuncs (as tests/codegen/test_symbolic_build.py builds them) and probe
functions written here with llvmlite.ir."""
from __future__ import annotations

import ctypes
import functools
import gc
import sys

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

import jitop
from jitop import te
from jitop.codegen.loader import load_object
from jitop.codegen.target import compile_ir
from jitop.driver import compile_func, default_target
from jitop.runtime import dimprog, fastcall
from jitop.runtime.fastcall import MISS, Array, Const, Output, Scalar, Spec, Table
from jitop.schedule.schedule import ForKind
from jitop.tir.nodes import Buffer, For, PrimFunc, Store

from kernel_checks import tvm_add_example

F4, I4, I8 = np.dtype("float32"), np.dtype("int32"), np.dtype("int64")

pytestmark = pytest.mark.skipif(not fastcall.available(), reason="the native entry is not available here")


# ** kernels **
@functools.cache
def vector_add():
    """C[i] = A[i] + B[i] over a symbolic n (vectorized)."""
    n, f32 = te.var("n"), te.placeholder((1,), "float32", "probe").dtype
    A, B, C = (Buffer(name, f32, (n,), "param") for name in "ABC")
    i = te.var("i")
    body = For(i, n, ForKind.VECTORIZED, Store(C, (i,), A.load((i,)) + B.load((i,))))
    return compile_func(PrimFunc("vadd", (A, B, C), body, outputs=(2,), symbols=(n,)), default_target())


@functools.cache
def static_add(n: int):
    """C = A + B at the constant shape (n,)."""
    A, B = te.placeholder((n,), "float32", "A"), te.placeholder((n,), "float32", "B")
    C = te.compute((n,), lambda i: A[i] + B[i], name="C")
    return jitop.build(jitop.create_schedule(C.op), [A, B, C])


@functools.cache
def row_add():
    """C[i, j] = A[i, j] + B[j] over symbolic (n, m)."""
    n, m, f32 = te.var("n"), te.var("m"), te.placeholder((1,), "float32", "probe").dtype
    A, B, C = Buffer("A", f32, (n, m), "param"), Buffer("B", f32, (m,), "param"), Buffer("C", f32, (n, m), "param")
    i, j = te.var("i"), te.var("j")
    body = For(i, n, ForKind.SERIAL, For(j, m, ForKind.VECTORIZED,
                                         Store(C, (i, j), A.load((i, j)) + B.load((j,)))))
    return compile_func(PrimFunc("radd", (A, B, C), body, outputs=(2,), symbols=(n, m)), default_target())


@functools.cache
def probes() -> dict[str, int]:
    """Functions of 4 pointer parameters (x, y, out, symbols), built with llvmlite.ir:
    noop: does nothing; symbols: out[k] = symbols[k] for k < 2 (int64); gil: out[0] = PyGILState_Check()."""
    i32, i64, ptr = ir.IntType(32), ir.IntType(64), ir.PointerType(ir.IntType(8))
    mod = ir.Module("probes")
    fnty = ir.FunctionType(ir.VoidType(), [ptr] * 4)
    noop = ir.Function(mod, fnty, "jitop_test_noop")
    ir.IRBuilder(noop.append_basic_block()).ret_void()
    syms = ir.Function(mod, fnty, "jitop_test_symbols")
    b = ir.IRBuilder(syms.append_basic_block())
    out, src = (b.bitcast(syms.args[k], i64.as_pointer()) for k in (2, 3))
    for k in range(2):
        b.store(b.load(b.gep(src, [i64(k)])), b.gep(out, [i64(k)]))
    b.ret_void()
    check = ir.Function(mod, ir.FunctionType(i32, []), "PyGILState_Check")
    gil = ir.Function(mod, fnty, "jitop_test_gil")
    b = ir.IRBuilder(gil.append_basic_block())
    b.store(b.call(check, []), b.bitcast(gil.args[2], i32.as_pointer()))
    b.ret_void()
    llvm.add_symbol("PyGILState_Check", ctypes.cast(ctypes.pythonapi.PyGILState_Check, ctypes.c_void_p).value)
    _, obj = compile_ir(str(mod))
    return load_object(obj, ["jitop_test_noop", "jitop_test_symbols", "jitop_test_gil"])


def module_spec(module, guards=()) -> Spec:
    """A spec read off a built module's metadata (as the Executable's will be): inputs are the arguments."""
    params, symbols = module.meta["params"], [s["name"] for s in module.meta["symbols"]]
    ins = [Array(k, np.dtype(p["dtype"]), tuple(p["shape"])) for k, p in enumerate(params) if not p["is_output"]]
    outs = [Output(np.dtype(p["dtype"]), tuple(p["shape"])) for p in params if p["is_output"]]
    return Spec(len(ins), module.address, ins, outs, 0, symbols=symbols, guards=guards)


def add_spec(guards=(), static: int | None = None, **kw) -> Spec:
    """The vector add's signature: symbolic (n,), or static (static,)."""
    shape = ("n",) if static is None else (static,)
    address = vector_add().address if static is None else static_add(static).address
    return Spec(2, address, [Array(0, F4, shape), Array(1, F4, shape)], [Output(F4, shape, **kw)], 0,
                symbols=["n"] if static is None else [], guards=guards)


def probe_spec(name: str, shapes, out_shape, out_dtype=I8, guards=(), symbols=("n", "m"), **kw) -> Spec:
    """A spec over a probe: two f4 inputs of `shapes`, one output."""
    return Spec(2, probes()[f"jitop_test_{name}"], [Array(0, F4, shapes[0]), Array(1, F4, shapes[1])],
                [Output(out_dtype, out_shape)], 0, symbols=list(symbols), guards=guards, **kw)


def inputs(*shapes, seed=0):
    g = np.random.default_rng(seed)
    return [g.standard_normal(s).astype(F4) for s in shapes]


# ** bind **
@pytest.mark.parametrize("n", [0, 1, 2, 7, 64, 1000, 4099])
def test_one_symbolic_spec_serves_every_size(n):
    spec = add_spec()
    fast = Table([spec]).entry()
    a, b = inputs(n, n)
    r = fast(a, b)
    assert r is not MISS and r.shape == (n,) and r.dtype == F4
    np.testing.assert_array_equal(r, a + b)
    assert spec.calls == 1


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 100, 4099, 100_000])
def test_a_built_te_var_kernel_through_the_entry(n):
    spec = module_spec(tvm_add_example())
    fast = Table([spec]).entry()
    a, b = inputs(n, n)
    r = fast(a, b)
    assert r is not MISS and r.shape == (n,)
    np.testing.assert_array_equal(r, a + b)
    assert fast(a, inputs(n + 1)[0]) is MISS and spec.calls == 1


def test_the_kernel_gets_the_bound_symbols_in_order():
    fast = Table([probe_spec("symbols", (("n", "m"), ("m",)), (2,))]).entry()
    for n, m in [(0, 0), (3, 5), (17, 1), (0, 9)]:
        x, y = inputs((n, m), m)
        assert fast(x, y).tolist() == [n, m]


def test_two_symbols_real_kernel_and_n_zero():
    spec = Spec(2, row_add().address, [Array(0, F4, ("n", "m")), Array(1, F4, ("m",))], [Output(F4, ("n", "m"))],
                0, symbols=["n", "m"])
    fast = Table([spec]).entry()
    for n, m in [(0, 0), (0, 5), (3, 0), (1, 1), (7, 9), (33, 100)]:
        a, b = inputs((n, m), m)
        r = fast(a, b)
        assert r.shape == (n, m)
        np.testing.assert_array_equal(r, a + b)


# ** ties, guards: MISS **
def test_a_tied_dim_that_differs_is_a_miss():
    spec = add_spec()
    fast = Table([spec]).entry()
    a, b = inputs(5, 6)
    assert fast(a, b) is MISS and fast(b, a) is MISS
    with pytest.raises(ValueError, match="must equal"):  # the slow path's error
        vector_add()(a, b)
    assert spec.calls == 0
    fast2 = Table([probe_spec("noop", (("n", "m"), ("m",)), ("n",))]).entry()
    x, y = inputs((2, 3), 4)
    assert fast2(x, y) is MISS
    assert fast2(x, inputs(3)[0]).shape == (2,)


def test_an_input_dim_that_is_an_expression_is_checked():
    fast = Table([probe_spec("noop", (("n",), ("n * 2 + 1",)), ("n",), symbols=["n"])]).entry()
    x, = inputs(4)
    assert fast(x, inputs(9)[0]).shape == (4,)
    assert fast(x, inputs(8)[0]) is MISS and fast(x, inputs(10)[0]) is MISS


@pytest.mark.parametrize("n, served", [(0, False), (1, False), (2, True), (3, True), (100, True)])
def test_a_lower_bound_guard(n, served):
    fast = Table([add_spec(guards=["n >= 2"])]).entry()
    a, b = inputs(n, n)
    r = fast(a, b)
    assert (r is not MISS) == served
    if served:
        np.testing.assert_array_equal(r, a + b)


def test_guards_of_every_comparison():
    fast = Table([probe_spec("noop", (("n",), ("m",)), ("n",), guards=["n != m", "1 < n <= 10 and m > 0",
                                                                       "n * 2 == min(m, 20)"])]).entry()
    cases = {(4, 8): True, (3, 6): True, (4, 4): False, (1, 2): False, (11, 22): False, (10, 30): True,
             (4, 9): False}
    for (n, m), served in cases.items():
        assert (fast(*inputs(n, m)) is not MISS) == served, (n, m)


# ** output dims **
@pytest.mark.parametrize("n, m", [(0, 0), (1, 1), (7, 3), (13, 5), (100, 8)])
def test_output_dims_are_computed_from_the_symbols(n, m):
    out = ("n", "m * 2", "(n + 7) // 8", "max(n - m, 0)", 3, "min(n, m) % 4")
    fast = Table([probe_spec("noop", (("n",), ("m",)), out)]).entry()
    r = fast(*inputs(n, m))
    assert r.shape == (n, 2 * m, (n + 7) // 8, max(n - m, 0), 3, min(n, m) % 4) and r.dtype == I8


@pytest.mark.parametrize("m", [0, 1, 2, 3, 4, 5, 9])
def test_division_by_zero_is_impossible(m):
    """n // (m - 3) and n % (m - 3): floor semantics as Python's; a zero divisor or a negative dim is a MISS."""
    fast = Table([probe_spec("noop", (("n",), ("m",)), ("n // (m - 3)", "n % (m - 3) + 0 * m"))]).entry()
    for n in (0, 1, 7, 10):
        r = fast(*inputs(n, m))
        if m == 3 or n // (m - 3) < 0 or n % (m - 3) < 0:
            assert r is MISS, (n, m)
        else:
            assert r.shape == (n // (m - 3), n % (m - 3)), (n, m)


def test_an_overflowing_dim_is_a_miss():
    fast = Table([probe_spec("noop", (("n",), ("m",)), ("n * 4611686018427387904",))]).entry()
    assert fast(*inputs(2, 0)) is MISS and fast(*inputs(4, 0)) is MISS
    fast = Table([probe_spec("noop", (("n",), ("m",)), ("n - 9223372036854775807 - 2",))]).entry()
    assert fast(*inputs(3, 0)) is MISS


def test_the_program_agrees_with_the_reference_interpreter():
    out = ("n // (m - 3)", "n % (m - 3)", "(n - 10) // 4 + 5", "-n + 2 * m")
    spec = probe_spec("noop", (("n",), ("m",)), out)
    plan = dimprog.plan_dims(["n", "m"], [("n",), ("m",)], [out], (), [(4, ("n",)), (4, ("m",)), (8, out)])
    fast = Table([spec]).entry()
    for n in range(0, 12):
        for m in range(0, 8):
            ok, odims, _ = dimprog.run(plan.program, [n, m])
            r = fast(*inputs(n, m))
            assert (r is not MISS) == ok, (n, m)
            if ok:
                assert list(r.shape) == odims


# ** several specs **
def test_several_specs_with_different_shapes_in_one_table():
    static = add_spec(static=10)
    sym1 = add_spec()
    sym2 = Spec(2, row_add().address, [Array(0, F4, ("n", "m")), Array(1, F4, ("m",))], [Output(F4, ("n", "m"))],
                0, symbols=["n", "m"])
    fast = Table([static, sym1, sym2]).entry()
    for shape in [10, 3, 10, (4, 6), 0, (0, 2)]:
        a, b = inputs(shape, shape if isinstance(shape, int) else shape[1])
        np.testing.assert_array_equal(fast(a, b), a + b)
    assert (static.calls, sym1.calls, sym2.calls) == (2, 2, 2)
    a, b = inputs((4, 6), 5)
    assert fast(a, b) is MISS


def test_a_symbolic_spec_that_misses_falls_through_to_the_next():
    guarded, other = add_spec(guards=["n >= 2"]), add_spec()
    fast = Table([guarded, other]).entry()
    for n in (1, 5):
        a, b = inputs(n, n)
        np.testing.assert_array_equal(fast(a, b), a + b)
    assert (guarded.calls, other.calls) == (1, 1)


def test_scalars_and_constants_with_symbols():
    c = np.arange(3, dtype=F4)
    spec = Spec(3, probes()["jitop_test_noop"], [Array(0, F4, ("n",)), Scalar(2, float), Const(c)],
                [Output(F4, ("n + 1",))], 0, symbols=["n"])
    fast = Table([spec]).entry()
    assert fast(inputs(4)[0], None, 2.5).shape == (5,)  # argument 1 is not read by this spec
    assert fast(inputs(4)[0], None, 2) is MISS          # an int for a float parameter


# ** recycled outputs: a spare of another shape is not reused **
def test_a_recycled_spare_is_reused_only_at_its_shape():
    spec = add_spec(recycle=True)
    fast = Table([spec]).entry()
    a5, b5 = inputs(5, 5)
    first = fast(a5, b5)
    addr = first.ctypes.data
    del first
    again = fast(a5, b5)
    assert again.ctypes.data == addr  # reused: same shape, nothing else held it
    del again
    a6, b6 = inputs(6, 6)
    r6 = fast(a6, b6)
    assert r6.shape == (6,)
    np.testing.assert_array_equal(r6, a6 + b6)
    assert [s.shape for s in spec.spares()] == [(6,)]
    held = fast(a6, b6)
    assert held is not r6  # r6 is still held: never reused
    np.testing.assert_array_equal(r6, a6 + b6)


# ** the GIL: released from RELEASE_GIL_BYTES, as for a static spec **
@pytest.mark.parametrize("n", [1, 2730, 2731, 5000])
def test_the_gil_release_rule_is_the_static_one(n):
    """f4 (n,) + f4 (n,) -> i4 (n,) touches 12 n bytes: the GIL is released from n = 2731."""
    x, y = inputs(n, n)
    sym = probe_spec("gil", (("n",), ("n",)), ("n",), out_dtype=I4, symbols=["n"])
    static = probe_spec("gil", ((n,), (n,)), (n,), out_dtype=I4, symbols=())
    held_sym = Table([sym]).entry()(x, y)[0]
    held_static = Table([static]).entry()(x, y)[0]
    assert held_sym == held_static == int(12 * n < fastcall.RELEASE_GIL_BYTES)
    forced = probe_spec("gil", (("n",), ("n",)), ("n",), out_dtype=I4, symbols=["n"], release_gil=True)
    assert Table([forced]).entry()(x, y)[0] == 0


# ** references, validation **
def test_no_reference_leaks():
    fast = Table([add_spec(guards=["n >= 2"])]).entry()
    a, b = inputs(8, 8)
    short = inputs(1)[0]
    for _ in range(3):
        fast(a, b), fast(short, short), fast(a, short)
    gc.collect()
    before = (sys.getrefcount(a), sys.getrefcount(short), sys.getrefcount(MISS), sys.gettotalrefcount()
              if hasattr(sys, "gettotalrefcount") else 0)
    for _ in range(1000):
        fast(a, b)
        fast(short, short)
        fast(a, short)
    gc.collect()
    after = (sys.getrefcount(a), sys.getrefcount(short), sys.getrefcount(MISS), sys.gettotalrefcount()
             if hasattr(sys, "gettotalrefcount") else 0)
    assert before == after


@pytest.mark.parametrize("make, match", [
    (lambda: add_spec(guards=["x >= 2"]), "not a symbol"),
    (lambda: Spec(1, 1, [Array(0, F4, ("n * 2",))], [Output(F4, ("n",))], 0, symbols=["n"]), "on its own"),
    (lambda: Spec(1, 1, [Array(0, F4, ("n",))], [Output(F4, ("k",))], 0, symbols=["n"]), "not a symbol"),
    (lambda: Spec(1, 1, [Array(0, F4, ("n",))], [Output(F4, ("n",))], 0), "int dims"),
    (lambda: Spec(1, 1, [Array(0, F4, ("n",))], [Output(F4, ("n",))], 0, symbols=["n"], guards=["n"]),
     "comparisons"),
    (lambda: Spec(1, 1, [Array(0, F4, ("n ** 2",))], [Output(F4, ("n",))], 0, symbols=["n"]), "not allowed"),
    (lambda: Spec(1, 1, [Array(0, F4, tuple(f"s{k}" for k in range(17)))], [Output(F4, (1,))], 0,
                  symbols=[f"s{k}" for k in range(17)]), "at most 16"),
    (lambda: Spec(1, 1, [Array(0, F4, ("n",))] * 31, [Output(F4, ("n",))], 0, symbols=["n"]), "parameters"),
])
def test_spec_validation(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_static_specs_keep_their_words():
    """A static spec has no program and its GIL word is decided from its bytes, as before."""
    spec = add_spec(static=10)
    assert spec.words[fastcall.S_PROG] == 0 and spec.words[fastcall.S_NSYM] == 0
    assert spec.words[fastcall.S_GIL] == 0
    assert add_spec().words[fastcall.S_GIL] == fastcall.GIL_FROM_PROGRAM


# ** the dim program on its own (no LLVM) **
def test_dim_words_bind_tie_and_expression_slots():
    plan = dimprog.plan_dims(["n", "m"], [(np.int64(3), "n", "m"), ("m", "n * 2")], [("n", 4)])
    tie = dimprog.tie_word
    assert plan.inputs == [[3, dimprog.bind_word(0), dimprog.bind_word(1)], [tie(1), dimprog.bind_word(2)]]
    assert plan.outputs == [[-1, 4]] and plan.n_slots == 3
    assert dimprog.run(plan.program, [5, 7, 10]) == (True, [5, 4], 0)
    assert not dimprog.run(plan.program, [5, 7, 11])[0]  # slot 2 must be n * 2


@pytest.mark.parametrize("a", [-7, -1, 0, 1, 6, 7, 2 ** 62])
@pytest.mark.parametrize("b", [-3, -1, 1, 2, 7])
def test_reference_interpreter_floor_semantics(a, b):
    plan = dimprog.plan_dims(["x"], [("x",)], [], guards=[f"x // {b} == {a // b}", f"x % {b} == {a % b}"])
    assert dimprog.run(plan.program, [a])[0]
    assert not dimprog.run(plan.program, [a + 1])[0]  # x // b and x % b together determine x


def test_stack_depth_is_bounded_when_planned():
    deep = "n" + "".join(f" + (n * {k}" for k in range(40)) + ")" * 40  # nested right-hand operands
    with pytest.raises(ValueError, match="stack"):
        dimprog.plan_dims(["n"], [("n",)], [(deep,)])
    dimprog.plan_dims(["n"], [("n",)], [(" + ".join(["n"] * 200),)])  # left-leaning sums need 2 cells


def test_threads_calling_one_symbolic_entry_with_different_sizes():
    """The slots and output dims are per call: threads at different sizes (some releasing the GIL) never mix."""
    import threading
    fast = Table([module_spec(tvm_add_example()), add_spec()]).entry()
    errors = []

    def work(n):
        a, b = inputs(n, n, seed=n)
        try:
            for _ in range(200):
                r = fast(a, b)
                assert r.shape == (n,)
                np.testing.assert_array_equal(r, a + b)
        except AssertionError as err:  # pragma: no cover - reported below
            errors.append((n, err))

    threads = [threading.Thread(target=work, args=(n,)) for n in (3, 17, 5000, 40_000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
