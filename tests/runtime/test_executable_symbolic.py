"""Executables whose kernel has symbolic shapes (issue 23, F2): one Plan + Module serves every size through the
Python path (`Executable.call`, `exe(...)` after a MISS) and the native entry (a fastcall Table of its Spec);
tied dims and guards are checked (ValueError on the Python path, MISS on the native one); the Plan's printed
dims and guards survive to_bytes/from_bytes and must be exactly the module's."""
from __future__ import annotations

import functools
import io
import json
import zipfile

import numpy as np
import pytest

import jitop
from jitop import te
from jitop.driver import compile_func, default_target
from jitop.runtime import fastcall
from jitop.runtime.executable import (
    _HEADER, FORMAT_VERSION, MAGIC, REUSE_BYTES, Executable, Plan, compile_guard, _entry_guards,
    _plan_to_json, _scratch_allocator, _sized_allocator)
from jitop.runtime.executable import _allocator
from jitop.tir.storage import ALIGN
from jitop.runtime.fastcall import MISS, Table
from jitop.schedule.schedule import ForKind
from jitop.te.expr import const
from jitop.tir.nodes import Buffer, For, PrimFunc, Store

from kernel_checks import tvm_add_example

F4 = np.dtype("float32")
SIZES = [0, 1, 2, 7, 1000, 4099]
native = pytest.mark.skipif(not fastcall.available(), reason="the native entry is not available here")


# ** kernels and plans **
@functools.cache
def static_add_module(n: int) -> jitop.Module:
    A, B = te.placeholder((n,), name="A"), te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: A[i] + B[i], name="C")
    return jitop.build(jitop.create_schedule(C.op), [A, B, C])


@functools.cache
def repeat_module() -> jitop.Module:
    """C[i] = 2 * T[i // 2] with T = A + B an intermediate (a scratch output): params A (n,), B (n,),
    C (n * 2,), T (n,)."""
    n = te.var("n")
    A, B = te.placeholder((n,), name="A"), te.placeholder((n,), name="B")
    T = te.compute(A.shape, lambda i: A[i] + B[i], name="T")
    C = te.compute((n * 2,), lambda i: T[i // 2] * 2, name="C")
    return jitop.build(jitop.create_schedule(C.op), [A, B, C, T])


@functools.cache
def int32_module() -> jitop.Module:
    """C[0] = 7 with an int8 input A of shape (n,), n an int32 symbol (the kernel never reads A)."""
    n, i = te.var("n", "int32"), te.var("i")
    i8 = te.placeholder((1,), "int8", "probe").dtype
    A, C = Buffer("A", i8, (n,), "param"), Buffer("C", i8, (1,), "param")
    body = For(i, const(1), ForKind.SERIAL, Store(C, (i,), const(7, i8)))
    return compile_func(PrimFunc("seven", (A, C), body, outputs=(1,), symbols=(n,)), default_target())


def add_exe(guards: list[str] | None = None) -> Executable:
    plan = Plan([("arg", 0), ("arg", 1)], [(("n",), F4)], [0], result=["out", 0, False], guards=list(guards or []))
    return Executable(tvm_add_example(), plan)


def repeat_exe() -> Executable:
    plan = Plan([("arg", 0), ("arg", 1)], [(("n * 2",), F4), (("n",), F4)], [0], n_scratch=1,
                result=["out", 0, False])
    return Executable(repeat_module(), plan)


def entry(exe: Executable, *more: Executable) -> tuple:
    """The native entry of a Table of these executables' specs (in this order), and the specs."""
    specs = [e.fast_spec() for e in (exe, *more)]
    assert all(s is not None for s in specs)
    return Table(specs).entry(), specs


def inputs(*shapes, seed=0):
    g = np.random.default_rng(seed)
    return [g.standard_normal(s).astype(F4) for s in shapes]


# ** one executable, every size **
@pytest.mark.parametrize("n", SIZES)
def test_the_python_path_serves_every_size(n):
    exe = add_exe()
    a, b = inputs(n, n)
    np.testing.assert_array_equal(exe.call([a, b]), a + b)
    r = exe(a, b)
    assert r.shape == (n,) and r.dtype == F4
    np.testing.assert_array_equal(r, a + b)


@native
@pytest.mark.parametrize("n", SIZES)
def test_the_native_entry_serves_every_size(n):
    exe = add_exe()
    fast, (spec,) = entry(exe)
    a, b = inputs(n, n)
    r = fast(a, b)
    assert r is not MISS and r.shape == (n,)
    np.testing.assert_array_equal(r, a + b)
    assert spec.calls == 1 and spec.symbols == ["n"]


@pytest.mark.parametrize("n", SIZES)
def test_output_dims_are_expressions_and_scratch_is_sized_per_call(n):
    exe = repeat_exe()
    a, b = inputs(n, n)
    want = np.repeat(a + b, 2) * 2
    np.testing.assert_allclose(exe.call([a, b]), want, rtol=1e-6)
    if fastcall.available():
        fast, _ = entry(exe)
        np.testing.assert_allclose(fast(a, b), want, rtol=1e-6)


def test_sizes_in_any_order_through_one_executable():
    """Big, small, big again: outputs and scratch are never a stale size, a held result is never overwritten."""
    exe = repeat_exe()
    fast = entry(exe)[0] if fastcall.available() else (lambda *v: exe.call(list(v)))
    held = []
    for n in [4099, 3, 1 << 18, 0, 1 << 18, 7, 4099]:
        a, b = inputs(n, n, seed=n)
        for run in (lambda: exe.call([a, b]), lambda: fast(a, b), lambda: exe(a, b)):
            r = run()
            held.append((r, np.repeat(a + b, 2) * 2))
    for r, want in held:
        np.testing.assert_allclose(r, want, rtol=1e-6)


# ** ties and guards **
@native
def test_a_tied_dim_mismatch_is_a_value_error_and_a_miss():
    exe = add_exe()
    fast, (spec,) = entry(exe)
    a, b = inputs(3, 4)
    assert fast(a, b) is MISS and spec.calls == 0
    with pytest.raises(ValueError, match=r"argument 'B' \(position 1\) dimension 0 is 4, but it must equal "
                                         r"argument 'A' \(position 0\) dimension 0 \(n = 3\)"):
        exe(a, b)
    with pytest.raises(ValueError, match="argument 'B'"):
        exe.call([a, b])  # the runner checks the ties itself (the dispatcher calls it directly)


def test_wrong_rank_or_dtype_is_refused():
    exe = add_exe()
    with pytest.raises(ValueError, match=r"argument 'A' \(position 0\) must be a float32 array of shape \(n,\)"):
        exe(np.ones((2, 2), F4), np.ones(2, F4))
    with pytest.raises(ValueError, match=r"must have shape \(n,\), got \(2, 2\)"):
        exe.call([np.ones((2, 2), F4), np.ones(2, F4)])
    with pytest.raises(ValueError, match="float32"):
        exe(np.ones(2, np.float64), np.ones(2, F4))


@pytest.mark.parametrize("guard, ok, bad", [("n >= 2", [2, 7], [0, 1]), ("n % 2 == 0 and n != 4", [0, 2, 6], [1, 4]),
                                            ("1 < n <= 8", [2, 8], [1, 9])])
def test_guards_hold_or_the_call_is_refused(guard, ok, bad):
    exe = add_exe([guard])
    fast = entry(exe)[0] if fastcall.available() else None
    for n in ok:
        a, b = inputs(n, n)
        np.testing.assert_array_equal(exe(a, b), a + b)
        if fast is not None:
            np.testing.assert_array_equal(fast(a, b), a + b)
    for n in bad:
        a, b = inputs(n, n)
        if fast is not None:
            assert fast(a, b) is MISS
        with pytest.raises(ValueError, match=f"n = {n} .from argument 'A' dimension 0.*compiled for shapes where"):
            exe(a, b)
        with pytest.raises(ValueError, match="compiled for shapes where"):
            exe.call([a, b])


def test_guard_language():
    assert compile_guard("n >= 2 and n % 3 == 0")({"n": 6})
    assert not compile_guard("n // m > 1")({"n": 1, "m": 0})  # a zero divisor: the guard does not hold
    assert compile_guard("min(n, 8) == 8")({"n": 9})
    for bad in ["n", "n >= 2 or n == 0", "n.real > 1", "f(n) > 1", "n >= 2; x", "x" * 5000]:
        with pytest.raises(ValueError):
            compile_guard(bad)


# ** int32 symbols **
def test_an_int32_symbol_gets_a_range_guard_on_the_native_entry():
    exe = Executable(int32_module(), Plan([("arg", 0)], [((1,), np.dtype(np.int8))], [0]))
    assert _entry_guards(exe.plan, exe.module) == ["n <= 2147483647"]
    small = np.zeros(5, np.int8)
    assert exe(small)[0][0] == 7
    huge = np.empty(2 ** 31, np.int8)  # 2 GiB of address space, never touched
    if fastcall.available():
        fast, (spec,) = entry(exe)
        assert fast(small)[0][0] == 7 and spec.calls == 1
        assert fast(huge) is MISS and spec.calls == 1
    with pytest.raises(ValueError, match=r"too large for symbol n \(int32\)"):
        exe(huge)


def test_an_int64_symbol_beyond_what_the_kernel_was_proved_for_misses_natively():
    """The compiler proves accesses for symbols up to SYMBOL_MAX (numpy allows a zero-size array of shape
    (2**50, 0)): the entry's spec carries that bound as a guard, which the entry checks (test_fastcall_symbolic)."""
    from jitop.tir.simplify import SYMBOL_MAX
    exe = add_exe()
    assert f"n <= {SYMBOL_MAX}" in _entry_guards(exe.plan, exe.module)


# ** table order: exact static specs first **
@native
def test_a_static_spec_before_the_symbolic_one_serves_its_own_size():
    static = Executable(static_add_module(7), Plan([("arg", 0), ("arg", 1)], [((7,), F4)], [0],
                                                   result=["out", 0, False]))
    fast, (s_static, s_sym) = entry(static, add_exe())
    for n in [7, 8, 7, 100]:
        a, b = inputs(n, n)
        np.testing.assert_array_equal(fast(a, b), a + b)
    assert (s_static.calls, s_sym.calls) == (2, 2)
    assert s_static.symbols == []


# ** bytes **
def test_a_symbolic_plan_round_trips():
    for exe in (add_exe(["n >= 1", "n != 5"]), repeat_exe()):
        loaded = Executable.from_bytes(exe.to_bytes())
        assert loaded.plan == exe.plan
        assert loaded.to_bytes() == exe.to_bytes()
        for n in [1, 7, 4099]:
            a, b = inputs(n, n)
            np.testing.assert_array_equal(loaded(a, b), exe(a, b))
    with pytest.raises(ValueError, match="n != 5"):
        Executable.from_bytes(add_exe(["n != 5"]).to_bytes())(*inputs(5, 5))


def test_a_constant_plan_has_no_guards_key():
    exe = Executable(static_add_module(7), Plan([("arg", 0), ("arg", 1)], [((7,), F4)], [0]))
    assert list(_plan_to_json(exe.plan)[0]) == ["inputs", "outputs", "result_slots", "n_scratch", "result"]
    assert "guards" not in json.loads(_files(exe.to_bytes())["plan.json"])
    assert exe.fast_spec() is None or exe.fast_spec().symbols == []


def _files(blob: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(blob[_HEADER.size:])) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def _edit_plan(blob: bytes, edit) -> bytes:
    """The blob with its plan.json edited and the checksum redone (version skew or a crafted file)."""
    import hashlib
    from jitop.runtime.executable import _zip
    files = _files(blob)
    plan = json.loads(files["plan.json"])
    edit(plan)
    files["plan.json"] = json.dumps(plan).encode()
    payload = _zip(files)
    return _HEADER.pack(MAGIC, FORMAT_VERSION, hashlib.sha256(payload).digest()) + payload


# ** refusals **
@pytest.mark.parametrize("outputs, guards, match", [
    ([(("n",), F4), (("n",), F4)], [], r"does not match kernel parameter C: float32 array of shape \(n \* 2,\)"),
    ([(("n*2",), F4), (("n",), F4)], [], "does not match kernel parameter C"),   # not the printed form
    ([((8,), F4), (("n",), F4)], [], "does not match kernel parameter C"),
    ([(("n * 2",), F4), (("n",), np.dtype("f8"))], [], "does not match kernel parameter T"),
    ([(("n * 2",), F4)], [], "1 outputs for 2 kernel output parameters"),
    ([(("n * 2",), F4), (("n",), F4)], ["m >= 2"], "uses m, which is not a symbol"),
    ([(("n * 2",), F4), (("n",), F4)], ["n"], "only comparisons"),
])
def test_a_plan_that_disagrees_with_the_module_is_refused(outputs, guards, match):
    plan = Plan([("arg", 0), ("arg", 1)], outputs, [0], n_scratch=len(outputs) - 1, guards=guards)
    with pytest.raises(ValueError, match=match):
        Executable(repeat_module(), plan)


@pytest.mark.parametrize("edit", [
    lambda p: p["outputs"][0].__setitem__(0, ["n + 1"]),
    lambda p: p["outputs"][0].__setitem__(0, ["n.__class__"]),
    lambda p: p["outputs"][0].__setitem__(0, [7]),
    lambda p: p.__setitem__("guards", ["k >= 1"]),
    lambda p: p.__setitem__("guards", "n >= 1"),
    lambda p: p.__setitem__("guards", [["n >= 1"]]),
    lambda p: p.__setitem__("guards", ["__import__('os')"]),
])
def test_a_saved_plan_that_disagrees_with_the_module_is_refused(edit):
    blob = _edit_plan(repeat_exe().to_bytes(), edit)
    with pytest.raises(ValueError, match="malformed jitop Executable"):
        Executable.from_bytes(blob)


def test_a_static_module_refuses_a_symbolic_plan():
    with pytest.raises(ValueError, match="does not match kernel parameter C"):
        Executable(static_add_module(7), Plan([("arg", 0), ("arg", 1)], [(("n",), F4)], [0]))
    with pytest.raises(ValueError, match="not a symbol"):
        Executable(static_add_module(7), Plan([("arg", 0), ("arg", 1)], [((7,), F4)], [0], guards=["n >= 1"]))


# ** allocators **
def test_a_big_output_is_reused_only_at_the_same_shape():
    alloc = _sized_allocator(F4)
    n = REUSE_BYTES // 4
    a = alloc((n,))
    address = a.ctypes.data
    del a
    b = alloc((n,))
    assert b.ctypes.data == address  # dropped by the caller: reused
    c = alloc((n,))
    assert c.ctypes.data != address  # b still held
    del b, c
    d = alloc((n + 1,))
    assert d.shape == (n + 1,)
    assert alloc((3,)).shape == (3,)


@pytest.mark.parametrize("kind", ["fixed", "sized", "scratch"])
def test_results_start_on_a_cache_line_and_a_slice_a_caller_keeps_keeps_its_buffer(kind):
    """Every buffer handed out is cache-line aligned (numpy's own large allocations are 16 bytes past one); a
    caller that keeps only a slice of a result (its base is the owning buffer, not the result) still holds
    the memory: the next call gets another buffer, and the same one once the slice is dropped."""
    n = REUSE_BYTES // 4 + 3
    fixed = _allocator((n,), F4, scratch=True)
    alloc = {"fixed": lambda: fixed(), "sized": lambda: _sized((n,)), "scratch": lambda: _scratch((n,))}[kind]
    _sized, _scratch = _sized_allocator(F4), _scratch_allocator(F4)
    a = alloc()
    assert a.ctypes.data % ALIGN == 0 and a.shape == (n,)
    address, part = a.ctypes.data, a[5:9]
    del a
    b = alloc()
    assert b.ctypes.data != address  # `part` still reads that memory
    second = b.ctypes.data
    del part, b
    assert alloc().ctypes.data == second  # nothing holds it any more: reused


def test_scratch_grows_and_never_shrinks():
    alloc = _scratch_allocator(F4)
    big = alloc((100, 10))
    base = big.base.ctypes.data
    del big
    small = alloc((7, 3))
    assert small.shape == (7, 3) and small.flags.c_contiguous and small.base.ctypes.data == base
    held = small
    other = alloc((5,))
    assert other.base.ctypes.data != base  # still in use: never handed out twice
    del held, small, other
    grown = alloc((2000,))
    assert grown.shape == (2000,) and grown.base.nbytes == 2000 * 4 + ALIGN  # grown to the size asked
    assert alloc((0, 4)).shape == (0, 4) and alloc(()).shape == ()
