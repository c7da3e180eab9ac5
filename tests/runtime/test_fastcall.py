"""The native call entry (jitop.runtime.fastcall): the same results as the Python runner, every argument the
checks reject falls through to the slow path (which raises today's error), no reference leaks, threads."""
from __future__ import annotations

import ctypes
import sys
import threading

import numpy as np
import pytest

import jitop
from jitop import te
from jitop.runtime import fastcall
from jitop.runtime.executable import Executable, Plan

MISS = fastcall.MISS



def test_the_entry_is_available_here():
    # CPython 3.11 with numpy 2 on x86-64: every layout and C API slot the entry reads checks out
    assert fastcall.available()


def fast_and_slow(fn):
    """(a kernel the native entry serves, one that always takes the Python path) for `fn`."""
    fast, slow = jitop.kernel(fn), jitop.kernel(fn)
    slow._serve_natively = lambda *_: None  # never learns a native signature
    return fast, slow


def warm(f, *args):
    """Call twice (compile, then learn the signature); the native entry now serves `args`."""
    f(*args)
    f(*args)
    assert f.dispatcher.entry(*args) is not MISS, "the native entry does not serve this signature"


def same(got, want):
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            same(g, w)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            same(got[k], want[k])
    elif isinstance(want, (np.ndarray, np.generic)):
        assert got.dtype == want.dtype and np.shape(got) == np.shape(want)
        np.testing.assert_array_equal(got, want)
    else:
        assert got == want


def outcome(call):
    """What a call does: ("ok", result) or ("raises", type, message)."""
    try:
        return ("ok", call())
    except Exception as err:  # noqa: BLE001 - the error itself is what is compared
        return ("raises", type(err), str(err))


def same_outcome(a, b):
    assert a[0] == b[0], (a, b)
    if a[0] == "ok":
        same(a[1], b[1])
    else:
        assert a[1:] == b[1:]


def add(a, b):
    return a + b


F4 = np.float32


# ** results **
@pytest.mark.parametrize("fn, args", [
    (add, (np.arange(10, dtype=F4), np.ones(10, F4))),
    (add, (np.arange(6, dtype=np.int16).reshape(2, 3), np.full((2, 3), 7, np.int16))),
    (lambda a, b: a < b, (np.arange(5.0), np.full(5, 2.5))),
    (lambda a: a.sum(), (np.arange(7, dtype=F4),)),                               # a 0-d result: a numpy scalar
    (lambda a, b: (a + b, a * b), (np.arange(4.0), np.arange(4.0))),              # a tuple
    (lambda a: {"s": a.sum(), "d": [a * 2, None]}, (np.arange(3, dtype=np.int32),)),  # dict and list
    (lambda a: a + np.arange(10, dtype=F4), (np.ones(10, F4),)),                  # a constant input
    (lambda a, s: a * s, (np.arange(5, dtype=F4), 2.5)),                          # Python scalars
    (lambda a, s: a + s, (np.arange(5, dtype=np.int8), 3)),
    (lambda a, s: a & s, (np.ones(5, bool), True)),
    (lambda a, s: a * s, (np.arange(5, dtype=F4), np.float64(2.5))),              # a numpy scalar: slow path
    (add, (np.ones((), F4), np.ones((), F4))),                                    # 0-d arrays
    (add, (np.ones(0, F4), np.ones(0, F4))),                                      # empty
    (add, (np.ones((3, 0)), np.ones((3, 0)))),
    (lambda a: np.tanh(a) * 2, (np.linspace(-3, 3, 300_000).astype(F4),)),        # big: GIL released, recycled
])
def test_results_equal_numpy_and_the_python_path(fn, args):
    fast, slow = fast_and_slow(fn)
    fast(*args)
    fast(*args)
    got = fast(*args)
    want = fn(*args)
    same(slow(*args), got)
    if isinstance(want, np.ndarray) or isinstance(want, np.generic):
        np.testing.assert_allclose(got, want, rtol=2e-6)
        assert got.dtype == want.dtype and type(got) is type(want)


def test_common_calls_go_through_the_native_entry_and_count_as_hits():
    f = jitop.kernel(add)
    a = np.ones(10, F4)
    warm(f, a, a)
    hits = f.hits
    for _ in range(10):
        f(a, a)
    assert f.hits == hits + 10
    assert f.misses == 1


def test_a_numpy_scalar_and_a_python_scalar_keep_their_own_signatures():
    f = jitop.kernel(lambda a, s: a * s)
    a = np.arange(4, dtype=F4)
    for s in (2.5, np.float64(2.5), 2.5, np.float64(2.5)):
        f(a, s)
    assert f(a, 2.5).dtype == np.float32 and f(a, np.float64(2.5)).dtype == np.float64  # NEP 50
    assert f(a, True).dtype == np.float32 and f(a, 2).dtype == np.float32


# ** every rejected argument takes the slow path, with the same outcome **
def _misaligned(n: int) -> np.ndarray:
    buf = np.zeros(n * 4 + 1, np.uint8)[1:]
    a = buf.view(F4)
    a[:] = np.arange(n)
    assert not a.flags.aligned
    return a


class Sub(np.ndarray):
    pass


A = np.arange(10, dtype=F4)
BAD_ARGS = {
    "dtype": (A, A.astype(np.float64)),
    "int dtype": (A, A.astype(np.int32)),
    "shape": (A, np.ones(11, F4)),
    "ndim": (A, np.ones((1, 10), F4)),
    "strided": (A, np.arange(20, dtype=F4)[::2]),
    "reversed": (A, A[::-1]),
    "fortran": (np.ones((4, 3), F4), np.asfortranarray(np.ones((4, 3), F4))),
    "misaligned": (A, _misaligned(10)),
    "byte order": (A, A.astype(">f4")),
    "subclass": (A, A.view(Sub)),
    "matrix": (np.ones((1, 10), F4), np.ones((1, 10), F4).view(np.matrix)),
    "masked": (A, np.ma.masked_array(A, mask=A > 5)),
    "list": (A, list(A)),
    "python float": (A, 1.5),
    "numpy scalar": (A, F4(1.5)),
    "None": (A, None),
    "string": (A, "x"),
    "one argument": (A,),
    "three arguments": (A, A, A),
    "no arguments": (),
}


@pytest.mark.filterwarnings("ignore::jitop.JitopFallbackWarning")        # subclasses and objects run as numpy
@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")          # np.matrix
@pytest.mark.parametrize("name", sorted(BAD_ARGS))
def test_the_native_entry_rejects_what_the_checks_reject(name):
    args = BAD_ARGS[name]
    fast, slow = fast_and_slow(add)
    warm(fast, A, A)
    if name == "fortran":
        warm(fast, args[0], args[0])
    assert fast.dispatcher.entry(*args) is MISS
    with np.errstate(all="ignore"):
        same_outcome(outcome(lambda: fast(*args)), outcome(lambda: slow(*args)))
        if name not in ("one argument", "three arguments", "no arguments", "None", "string"):
            # and numpy agrees (jitop's own messages may word a broadcast error differently)
            got, want = outcome(lambda: fast(*args)), outcome(lambda: add(*args))
            assert got[0] == want[0] and (got[1] is want[1] if got[0] == "raises" else True)
            if got[0] == "ok":
                np.testing.assert_array_equal(got[1], want[1])


def test_keyword_arguments_take_the_python_path():
    fast, slow = fast_and_slow(add)
    warm(fast, A, A)
    same(fast(A, b=A), slow(A, b=A))
    same(fast(a=A, b=A + 1), add(A, A + 1))
    with pytest.raises(TypeError):
        fast.dispatcher.entry(A, b=A)  # never called with keywords: it takes none


def test_read_only_inputs_are_served_and_outputs_are_fresh_and_writeable():
    f = jitop.kernel(add)
    a = A.copy()
    a.flags.writeable = False
    warm(f, a, a)
    r = f.dispatcher.entry(a, a)
    assert r.flags.writeable and r.flags.c_contiguous and r.flags.owndata
    assert not np.shares_memory(r, a)
    r2 = f.dispatcher.entry(A, A)
    assert not np.shares_memory(r, r2)


def test_the_same_array_twice_is_fine():
    f = jitop.kernel(lambda a, b: a * b + a)
    a = np.arange(10, dtype=F4)
    warm(f, a, a)
    same(f(a, a), a * a + a)


def test_a_python_int_outside_its_dtype_raises_numpys_overflow_error():
    fast, slow = fast_and_slow(lambda a, s: a + s)
    a = np.arange(5, dtype=np.int8)
    warm(fast, a, 3)
    for s in (127, -128, 300, -129, 2 ** 62, 2 ** 63, 2 ** 70, -2 ** 64):
        if not -128 <= s <= 127:
            assert fast.dispatcher.entry(a, s) is MISS
        same_outcome(outcome(lambda: fast(a, s)), outcome(lambda: slow(a, s)))
    with pytest.raises(OverflowError, match="out of bounds for int8"):
        fast(a, 300)


def test_a_float_argument_of_a_bool_or_int_signature_is_not_served():
    f = jitop.kernel(lambda a, s: a + s)
    a = np.arange(5, dtype=F4)
    warm(f, a, 2)
    assert f.dispatcher.entry(a, 2.0) is MISS and f.dispatcher.entry(a, True) is MISS
    same(f(a, 2.0), a + 2.0)
    same(f(a, True), a + True)


def test_a_static_or_object_argument_keeps_every_call_on_the_python_path():
    f = jitop.kernel(lambda a, op: a + 1 if op == "inc" else a - 1)
    warm_calls = [f(A, "inc") for _ in range(3)]
    assert f.dispatcher.entry(A, "inc") is MISS and f.dispatcher.entry(A, "dec") is MISS  # the string is part of the key
    same(warm_calls[-1], A + 1)
    same(f(A, "dec"), A - 1)


def test_many_signatures_all_stay_correct():
    f = jitop.kernel(add, dynamic=False)  # a kernel per shape (automatic dynamic shapes would make one)
    limit = sys.modules["jitop.dispatch"].MAX_FAST_SIGNATURES
    arrays = [np.arange(n, dtype=F4) for n in range(1, limit + 5)]  # more than MAX_FAST_SIGNATURES
    for _ in range(3):
        for a in arrays:
            same(f(a, a), a + a)
    assert len(f.dispatcher.native()) == sys.modules["jitop.dispatch"].MAX_FAST_SIGNATURES


# ** references **
def test_no_reference_leaks():
    f = jitop.kernel(add)
    g = jitop.kernel(lambda a, s: (a * s, a.sum()))
    a, b = np.ones(10, F4), np.ones(10, F4)
    warm(f, a, b)
    warm(g, a, 2.0)
    s = 2.0
    before = [sys.getrefcount(x) for x in (a, b, s, MISS, np.dtype(F4), f.dispatcher.entry)]
    for _ in range(2000):
        f(a, b)
        g(a, s)
        f.dispatcher.entry(a, b[:5])      # a miss
        f.dispatcher.entry(a)             # a miss
    after = [sys.getrefcount(x) for x in (a, b, s, MISS, np.dtype(F4), f.dispatcher.entry)]
    assert before == after
    r = f(a, b)
    assert sys.getrefcount(r) == 2  # the local and getrefcount's argument: the caller owns the only reference
    _, slow = fast_and_slow(g.fn)
    t, u = g(a, s), slow(a, s)
    assert [sys.getrefcount(x) for x in (t, t[0], t[1])] == [sys.getrefcount(x) for x in (u, u[0], u[1])]
    assert sys.getrefcount(t) == 2


def test_no_leak_when_a_miss_follows_a_partial_match_or_an_error():
    f = jitop.kernel(lambda a, b, c: a + b + c)
    a = np.ones(10, F4)
    warm(f, a, a, a)
    before = [sys.getrefcount(x) for x in (a, MISS)]
    for _ in range(1000):
        assert f.dispatcher.entry(a, a, a[::-1]) is MISS
    assert [sys.getrefcount(x) for x in (a, MISS)] == before


def test_big_outputs_are_recycled_once_dropped_and_never_while_held():
    f = jitop.kernel(lambda a: a * 2)
    x = np.arange(1 << 19, dtype=F4)  # a 2 MB output
    warm(f, x)
    r = f(x)
    address = r.ctypes.data
    del r
    r = f(x)
    assert r.ctypes.data == address  # dropped: its pages are reused, as the Python path does
    held = f(x + 1)
    assert held.ctypes.data != r.ctypes.data
    np.testing.assert_array_equal(r, x * 2)
    np.testing.assert_array_equal(held, (x + 1) * 2)
    spec, = [ov.spec for ov in f.dispatcher.native()]
    assert all(sys.getrefcount(s) >= 3 for s in spec.spares())  # the spec's reference, and ours


def test_a_dropped_spec_releases_its_spare_outputs():
    f = jitop.kernel(lambda a: a * 2)
    x = np.arange(1 << 19, dtype=F4)
    warm(f, x)
    r = f(x)
    before = sys.getrefcount(r)
    spec, = [ov.spec for ov in f.dispatcher.native()]
    assert any(s is r for s in spec.spares())
    del f, spec
    import gc
    gc.collect()
    assert sys.getrefcount(r) == before - 1


# ** threads **
def test_threads_calling_one_kernel_at_once():
    small = jitop.kernel(add)
    big = jitop.kernel(lambda a, b: a * b + 1)   # GIL released, outputs recycled
    n_big = 1 << 18
    warm(small, A, A)
    base = np.arange(n_big, dtype=F4)
    warm(big, base, base)
    errors = []

    def work(k: int) -> None:
        try:
            a = np.full(10, k, F4)
            x = np.full(n_big, k, F4)
            kept = []
            for i in range(300):
                np.testing.assert_array_equal(small(a, a), a + a)
                r = big(x, x)
                assert r[0] == k * k + 1 and r[-1] == k * k + 1
                if i % 50 == 0:
                    kept.append(r)  # held results must never be reused by any thread
            for r in kept:
                assert (r == k * k + 1).all()
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_threads_learning_signatures_at_once():
    f = jitop.kernel(add)
    errors = []

    def work(k: int) -> None:
        try:
            for i in range(200):
                a = np.arange(1 + (k + i) % 5, dtype=F4)
                np.testing.assert_array_equal(f(a, a), a + a)
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ** a kernel's error flag **
def _gather() -> Executable:
    A_ = te.placeholder((8,), "float32", name="A")
    I_ = te.placeholder((4,), "int64", name="I")
    B_ = te.compute((4,), lambda i: A_[I_[i]], name="B")
    module = jitop.build(jitop.create_schedule(B_.op), [A_, I_, B_])
    assert module.checked, "the gather's index cannot be proven in bounds: it is checked at run time"
    return Executable(module, Plan([("arg", 0), ("arg", 1)], [((4,), np.dtype(F4))], [0], 0, ["out", 0, False]))


def test_a_kernel_that_sets_its_error_flag_raises_through_the_native_entry():
    exe = _gather()
    a, good, bad = np.arange(8, dtype=F4), np.array([1, 2, 3, 7]), np.array([1, 9, 0, 0])
    same(exe(a, good), a[good])
    assert exe._fast is not None and exe._fast(a, good) is not MISS
    with pytest.raises(IndexError, match=r"out-of-bounds read of A\[I\[i\]\]") as fast_err:
        exe._fast(a, bad)
    with pytest.raises(IndexError) as slow_err:
        exe.call([a, bad])
    assert str(fast_err.value) == str(slow_err.value)
    same(exe(a, good), a[good])  # the flag was cleared
    before = sys.getrefcount(a)
    for _ in range(100):
        with pytest.raises(IndexError):
            exe(a, bad)
    assert sys.getrefcount(a) == before


# ** Executable.__call__ **
def test_executable_call_uses_the_entry_and_keeps_its_errors():
    f = jitop.kernel(lambda a, s: a * s)
    a = np.arange(6, dtype=F4).reshape(2, 3)
    f(a, 2.0)
    (entry,) = f.cache.values()
    exe = Executable.from_bytes(entry.exe.to_bytes())
    same(exe(a, 2.0), a * 2.0)
    assert exe._fast(a, 2.0) is not MISS
    with pytest.raises(ValueError, match="must be a float32 array of shape"):
        exe(np.ones(3, F4), 2.0)
    with pytest.raises(TypeError, match="must be a numpy.ndarray"):
        exe([1.0], 2.0)
    same(exe(a.T.copy().T, 2.0), a * 2.0)  # a strided view: the Python path copies it


# ** what the entry relies on is checked against the live process **
def test_numpy_api_table_slots_check_out_by_calling_them():
    new_from_descr, array_type = fastcall._numpy_api()
    assert array_type == id(np.ndarray)
    assert fastcall._new_from_descr_ok(new_from_descr)


def test_a_wrong_struct_offset_disables_the_entry(monkeypatch):
    assert fastcall._check_layout()
    for field, wrong in (("descr", 48), ("flags", 72), ("nd", 32), ("b_ptr", 24)):
        monkeypatch.setitem(fastcall._OFF, field, wrong)
        assert not fastcall._layout_ok(), field
        monkeypatch.setitem(fastcall._OFF, field, {"descr": 56, "flags": 64, "nd": 24, "b_ptr": 16}[field])


def test_disabled_entry_leaves_every_call_on_the_python_path(monkeypatch):
    monkeypatch.setattr(fastcall, "ENABLED", False)
    f = jitop.kernel(add)
    for _ in range(3):
        same(f(A, A), A + A)
    assert f.dispatcher.entry(A, A) is MISS and not f.dispatcher.native()


def test_spec_validation():
    f4 = np.dtype(F4)
    with pytest.raises(ValueError, match="1 to"):
        fastcall.Spec(0, 0, [], [], 0)
    with pytest.raises(ValueError, match="result slot"):
        fastcall.Spec(1, 1, [fastcall.Array(0, f4, (3,))], [fastcall.Output(f4, (3,))], 1)
    with pytest.raises(ValueError, match="canonical native"):
        fastcall.Spec(1, 1, [fastcall.Array(0, np.dtype(">f4"), (3,))], [fastcall.Output(f4, (3,))], 0)
    with pytest.raises(ValueError, match="C-contiguous"):
        fastcall.Spec(0, 1, [fastcall.Const(np.ones((3, 2))[:, 0])], [fastcall.Output(f4, (3,))], 0)
    with pytest.raises(ValueError, match="Python float, int or bool"):
        fastcall.Spec(1, 1, [fastcall.Scalar(0, complex)], [fastcall.Output(f4, (3,))], 0)
    assert ctypes.sizeof(fastcall._MethodDef) == 32


# ** a process that only loads saved code never runs LLVM for the entry **
LOAD_ONLY_CHILD = r"""
import sys
import numpy as np
import llvmlite.binding as llvm

def forbidden(*args, **kwargs):
    raise AssertionError("LLVM code generation ran in a process that only loads saved code")

llvm.TargetMachine.emit_object = forbidden
llvm.create_pass_builder = forbidden
import jitop
import jitop.codegen.target as target
target.compile_ir = forbidden
from jitop.runtime import fastcall
from jitop.runtime.executable import Executable

exe = Executable.from_bytes(open(sys.argv[1], "rb").read())
a = np.arange(6, dtype=np.float32)
np.testing.assert_array_equal(exe(a, a), a + a)
print("FAST" if exe._fast(a, a) is not fastcall.MISS else "SLOW")
"""


COMPILING_CHILD = r"""
import numpy as np
import jitop

a = np.arange(6, dtype=np.float32)
np.testing.assert_array_equal(jitop.kernel(lambda x, y: x + y)(a, a), a + a)  # compiles the native entry too
"""


def test_a_load_only_process_uses_the_cached_entry_or_the_python_path(tmp_path):
    import os
    import pathlib
    import subprocess
    f = jitop.kernel(add, dynamic=False)  # exactly (6,) + (6,): a serial kernel, no thread pool to link
    a = np.arange(6, dtype=F4)
    f(a, a)
    (entry,) = f.cache.values()
    (tmp_path / "exe.bin").write_bytes(entry.exe.to_bytes())
    repo = pathlib.Path(__file__).resolve().parents[2]

    def child(cache: pathlib.Path) -> str:
        env = {**os.environ, "JITOP_CACHE_DIR": str(cache), "PYTHONPATH": str(repo)}
        res = subprocess.run([sys.executable, "-c", LOAD_ONLY_CHILD, str(tmp_path / "exe.bin")], capture_output=True,
                             text=True, timeout=300, env=env, cwd=str(repo))
        assert res.returncode == 0, res.stderr[-3000:]
        return res.stdout.strip()

    assert child(tmp_path / "cold") == "SLOW"   # no cached entry: the Python path, no LLVM
    # a process that compiles the native entry saves it in its cache directory: a child reading that goes native
    warm = tmp_path / "warm"
    compiled = subprocess.run([sys.executable, "-c", COMPILING_CHILD, str(tmp_path / "exe.bin")], capture_output=True,
                              text=True, timeout=300, cwd=str(repo),
                              env={**os.environ, "JITOP_CACHE_DIR": str(warm), "PYTHONPATH": str(repo)})
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    assert child(warm) == "FAST"
