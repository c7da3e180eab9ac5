"""The loaded Module: argument checks, save/load (also in a second process, without LLVM), sources."""
from __future__ import annotations

import functools
import re
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import jitop
from jitop import te
from targets import runnable_targets

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def add_kernel():
    """C[i, j] = A[i, j] + B[j]: inputs A (float32[4, 5]) and B (float32[5]), output C."""
    A = te.placeholder((4, 5), "float32", "A")
    B = te.placeholder((5,), "float32", "B")
    C = te.compute((4, 5), lambda i, j: A[i, j] + B[j], name="C")
    s = jitop.create_schedule(C.op)
    return jitop.build(s, [A, B, C])


def good_args():
    a = np.arange(20, dtype=np.float32).reshape(4, 5)
    b = np.arange(5, dtype=np.float32) * 10
    return a, b, np.empty((4, 5), np.float32)


# ---------------------------------------------------------------------------------------------
# calling conventions
# ---------------------------------------------------------------------------------------------

def test_call_with_outputs_or_inputs_only():
    f = add_kernel()
    a, b, c = good_args()
    assert f(a, b, c) is None
    np.testing.assert_array_equal(c, a + b)
    out = f(a, b)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_array_equal(out, a + b)
    # read-only inputs and inputs sharing memory with each other are fine
    ra = a.copy()
    ra.flags.writeable = False
    np.testing.assert_array_equal(f(ra, a[0]), a + a[0])


def test_function_without_inputs_and_with_several_outputs():
    D = te.compute((5,), lambda i: i * 2, name="D")
    g = jitop.build(jitop.create_schedule(D.op), [D])
    np.testing.assert_array_equal(g(), np.arange(5) * 2)
    A = te.placeholder((3,), "int32", "A")
    P, Q = te.compute((3,), lambda i: (A[i] + 1, A[i] * 2.0), name="PQ")
    h = jitop.build(jitop.create_schedule(P.op), [A, P, Q])
    p, q = h(np.array([1, 2, 3], np.int32))
    assert p.dtype == np.int32 and q.dtype == np.float64
    np.testing.assert_array_equal(p, [2, 3, 4])
    np.testing.assert_array_equal(q, [2.0, 4.0, 6.0])


def test_inputs_only_call_with_output_listed_first():
    A = te.placeholder((4,), "float32", "A")
    B = te.compute((4,), lambda i: A[i] * 2.0, name="B")
    f = jitop.build(jitop.create_schedule(B.op), [B, A])
    a = np.arange(4, dtype=np.float32)
    b = np.zeros(4, np.float32)
    f(b, a)                                    # explicit arrays in parameter order work
    np.testing.assert_array_equal(b, a * 2)
    out = f(a)                                 # the inputs-only form must find the input by position
    np.testing.assert_array_equal(a, np.arange(4, dtype=np.float32))  # input untouched
    np.testing.assert_array_equal(out, a * 2)


def test_concurrent_calls_from_threads(monkeypatch):
    import threading
    monkeypatch.setenv("JITOP_PARALLEL_MIN_WORK", "1")
    X = te.placeholder((16, 300), "float64", "X")
    k = te.reduce_axis((0, 300), "k")
    R = te.compute((16,), lambda r: te.sum(X[r, k] * 2.0, axis=k), name="R")
    s = jitop.create_schedule(R.op)
    s[R].parallel(R.op.axis[0])
    f = jitop.build(s, [X, R])
    errors = []

    def work(seed):
        x = np.random.default_rng(seed).standard_normal((16, 300))
        for _ in range(20):
            try:
                np.testing.assert_allclose(f(x), (x * 2).sum(axis=1), rtol=1e-12)
            except AssertionError as e:  # pragma: no cover - reported below
                errors.append(e)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a concurrent call hung"
    assert not errors, errors[0]


# ---------------------------------------------------------------------------------------------
# argument checks: a mismatch is a clear error, never a crash
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 4, 5])
def test_wrong_number_of_arguments(n):
    f = add_kernel()
    a, b, c = good_args()
    args = [a, b, c, c, c][:n]
    with pytest.raises(TypeError) as info:
        f(*args)
    msg = str(info.value)
    assert "takes 3 arrays" in msg and "2 inputs" in msg and f"got {n}" in msg and "A, B, C" in msg


@pytest.mark.parametrize("bad", [[[1.0] * 5] * 4, 1.0, np.float32(1.0), None, "A"], ids=repr)
def test_non_array_argument(bad):
    f = add_kernel()
    _, b, _ = good_args()
    with pytest.raises(TypeError) as info:
        f(bad, b)
    msg = str(info.value)
    assert "'A'" in msg and "position 0" in msg and "numpy.ndarray" in msg
    assert "float32" in msg and "(4, 5)" in msg and type(bad).__name__ in msg


def test_wrong_dtype():
    f = add_kernel()
    a, b, c = good_args()
    with pytest.raises(TypeError) as info:
        f(a.astype(np.float64), b)
    msg = str(info.value)
    assert "'A'" in msg and "float32" in msg and "float64" in msg and "astype" in msg
    with pytest.raises(TypeError, match=r"'C'.*float32.*int32"):
        f(a, b, np.zeros((4, 5), np.int32))


def test_wrong_byte_order_message():
    f = add_kernel()
    a, b, _ = good_args()
    with pytest.raises(TypeError, match=r">f4|byte order|big-endian|byteswap"):
        f(a.astype(">f4"), b)


def test_wrong_shape():
    f = add_kernel()
    a, b, c = good_args()
    with pytest.raises(ValueError) as info:
        f(a, np.ones(4, np.float32))
    msg = str(info.value)
    assert "'B'" in msg and "(5,)" in msg and "(4,)" in msg
    with pytest.raises(ValueError, match=r"'A'.*\(4, 5\).*\(5, 4\)"):
        f(a.reshape(5, 4), b)
    with pytest.raises(ValueError, match="'C'"):
        f(a, b, np.empty((4, 6), np.float32))
    with pytest.raises(ValueError):
        f(a.reshape(20), b)


@pytest.mark.parametrize("kind", ["transposed", "strided", "fortran", "negative_stride"])
def test_non_contiguous(kind):
    f = add_kernel()
    a, b, c = good_args()
    bad = {"transposed": np.ones((5, 4), np.float32).T,
           "strided": np.ones((8, 5), np.float32)[::2],
           "fortran": np.asfortranarray(a),
           "negative_stride": a[::-1]}[kind]
    assert bad.shape == (4, 5)
    with pytest.raises(ValueError, match=r"'A'.*C-contiguous.*ascontiguousarray"):
        f(bad, b)
    with pytest.raises(ValueError, match=r"'C'.*C-contiguous"):
        f(a, b, np.empty((5, 4), np.float32).T)


def test_misaligned():
    f = add_kernel()
    _, b, _ = good_args()
    raw = np.zeros(4 * 5 * 4 + 1, np.uint8)[1:]
    mis = raw.view(np.float32).reshape(4, 5)
    assert not mis.flags.aligned
    with pytest.raises(ValueError, match=r"'A'.*aligned"):
        f(mis, b)


def test_read_only_output():
    f = add_kernel()
    a, b, c = good_args()
    c.flags.writeable = False
    with pytest.raises(ValueError, match=r"'C'.*output.*read-only"):
        f(a, b, c)


def test_output_aliasing_an_input():
    f = add_kernel()
    a, b, _ = good_args()
    with pytest.raises(ValueError) as info:
        f(a, b, a)
    msg = str(info.value)
    assert "'C'" in msg and "'A'" in msg and "shares memory" in msg
    big = np.zeros(30, np.float32)
    with pytest.raises(ValueError, match=r"'C'.*shares memory.*'B'"):
        f(a, big[20:25], big[5:25].reshape(4, 5))   # partial overlap
    # an argument error leaves the output untouched
    out = np.full((4, 5), 7.0, np.float32)
    with pytest.raises(TypeError):
        f(a, b.astype(np.float64), out)
    assert (out == 7.0).all()


# ---------------------------------------------------------------------------------------------
# save / load
# ---------------------------------------------------------------------------------------------

@functools.cache
def saved_kernels(tmp: str):
    """A vectorized elementwise kernel and a parallel reduction, built and saved into `tmp`."""
    A = te.placeholder((1000,), "float32", "A")
    C = te.compute((1000,), lambda i: te.exp(A[i] * 0.5) + 1.0, name="C")
    s = jitop.create_schedule(C.op)
    o, i = s[C].split(C.op.axis[0], factor=16)
    s[C].vectorize(i)
    f = jitop.build(s, [A, C])
    f.save(os.path.join(tmp, "ew.jitop"))

    X = te.placeholder((64, 1000), "float64", "X")
    k = te.reduce_axis((0, 1000), "k")
    R = te.compute((64,), lambda r: te.sum(X[r, k] * X[r, k], axis=k), name="R")
    s = jitop.create_schedule(R.op)
    s[R].parallel(R.op.axis[0])
    g = jitop.build(s, [X, R])
    assert g.meta["uses_parallel"]
    g.save(os.path.join(tmp, "par.jitop"))
    return f, g


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("saved"))
    f, g = saved_kernels(tmp)
    return tmp, f, g


def _inputs():
    a = np.linspace(-3, 3, 1000, dtype=np.float32)
    x = np.random.default_rng(0).standard_normal((64, 1000))
    return a, x


def test_save_load_round_trip_same_process(saved):
    tmp, f, g = saved
    a, x = _inputs()
    f2 = jitop.load_module(os.path.join(tmp, "ew.jitop"))
    g2 = jitop.load_module(os.path.join(tmp, "par.jitop"))
    np.testing.assert_array_equal(f2(a), f(a))
    np.testing.assert_allclose(f2(a), np.exp(a * np.float32(0.5)) + 1, rtol=2e-6)
    np.testing.assert_allclose(g2(x), (x * x).sum(axis=1), rtol=1e-12)
    assert repr(f2) == repr(f)
    assert f2.get_source("ll") == f.get_source("ll")
    # argument checks survive the round trip
    with pytest.raises(TypeError, match="float32"):
        f2(a.astype(np.float64))
    with pytest.raises(ValueError, match="shape"):
        f2(a[:999])


SECOND_PROCESS = r"""
import sys
sys.path.insert(0, REPO)
import numpy as np
import llvmlite.binding as llvm

def forbidden(*args, **kwargs):
    raise AssertionError("LLVM optimisation / code generation ran while loading a saved module")

# a warm process must only load object code: no pass pipeline, no object or assembly emission
llvm.TargetMachine.emit_object = forbidden
llvm.TargetMachine.emit_assembly = forbidden
llvm.create_pass_builder = forbidden
import jitop
import jitop.codegen.target as target
target.compile_ir = forbidden
target.optimize = forbidden

f = jitop.load_module(sys.argv[1])
if sys.argv[2] == "ew":
    a = np.linspace(-3, 3, 1000, dtype=np.float32)
    out = f(a)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np.exp(a * np.float32(0.5)) + 1, rtol=2e-6)
    c = np.empty_like(a)
    f(a, c)
    np.testing.assert_array_equal(c, out)
    try:
        f(a.astype(np.float64))
    except TypeError:
        pass
    else:
        raise AssertionError("wrong dtype accepted")
else:
    x = np.random.default_rng(0).standard_normal((64, 1000))
    np.testing.assert_allclose(f(x), (x * x).sum(axis=1), rtol=1e-12)
print("OK")
"""


def _run_second_process(path: str, which: str, env: dict | None = None, forbid_llvm: bool = True
                        ) -> subprocess.CompletedProcess:
    code = SECOND_PROCESS.replace("sys.path.insert(0, REPO)", f"sys.path.insert(0, {str(REPO)!r})")
    if not forbid_llvm:
        code = code.replace("llvm.TargetMachine.emit_object = forbidden", "forbidden = None") \
            .replace("llvm.TargetMachine.emit_assembly = forbidden", "") \
            .replace("llvm.create_pass_builder = forbidden", "") \
            .replace("target.compile_ir = forbidden", "").replace("target.optimize = forbidden", "")
    return subprocess.run([sys.executable, "-c", code, path, which], capture_output=True, text=True, timeout=120,
                          cwd=str(REPO), env={**os.environ, **(env or {})})


def test_load_in_second_process_without_llvm(saved, tmp_path):
    tmp, _, _ = saved
    res = _run_second_process(os.path.join(tmp, "ew.jitop"), "ew", {"JITOP_CACHE_DIR": str(tmp_path)})
    assert res.returncode == 0 and res.stdout.strip().endswith("OK"), res.stderr[-3000:]


def test_load_parallel_module_in_warm_second_process_without_llvm(saved, tmp_path):
    """A parallel kernel also needs the thread pool: a cold cache compiles it once, a warm process never."""
    tmp, _, _ = saved
    env = {"JITOP_CACHE_DIR": str(tmp_path / "cache")}
    path = os.path.join(tmp, "par.jitop")
    cold = _run_second_process(path, "par", env, forbid_llvm=False)
    assert cold.returncode == 0 and cold.stdout.strip().endswith("OK"), cold.stderr[-3000:]
    warm = _run_second_process(path, "par", env)
    assert warm.returncode == 0 and warm.stdout.strip().endswith("OK"), warm.stderr[-3000:]


def test_load_parallel_module_in_second_process(saved):
    tmp, _, _ = saved
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(REPO)!r})
        import numpy as np, jitop
        f = jitop.load_module(sys.argv[1])
        x = np.random.default_rng(0).standard_normal((64, 1000))
        np.testing.assert_allclose(f(x), (x * x).sum(axis=1), rtol=1e-12)
        print("OK")
    """)
    res = subprocess.run([sys.executable, "-c", code, os.path.join(tmp, "par.jitop")], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip().endswith("OK"), res.stderr[-3000:]


def test_load_rejects_other_formats(tmp_path, saved):
    import json
    import zipfile
    tmp, _, _ = saved
    src = os.path.join(tmp, "ew.jitop")
    bad = tmp_path / "old.jitop"
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(bad, "w") as out:
        for name in z.namelist():
            data = z.read(name)
            if name == "meta.json":
                meta = json.loads(data)
                meta["format"] = 999
                data = json.dumps(meta).encode()
            out.writestr(name, data)
    with pytest.raises(ValueError, match="format 999"):
        jitop.load_module(bad)


def test_save_is_atomic_and_overwrites(tmp_path, saved):
    _, f, _ = saved
    path = tmp_path / "k.jitop"
    f.save(path)
    first = path.read_bytes()
    f.save(path)
    assert path.read_bytes() == first
    assert [p.name for p in tmp_path.iterdir()] == ["k.jitop"]  # no temporary left behind


# ---------------------------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------------------------

def _has_avx512f() -> bool:
    try:
        with open("/proc/cpuinfo") as fh:
            return any(line.startswith("flags") and " avx512f" in line for line in fh)
    except OSError:
        return False


def test_get_source_ll_and_asm(saved):
    _, f, _ = saved
    ll = f.get_source("ll")
    assert "define" in ll
    assert f.meta["symbol"] in ll
    asm = f.get_source("asm")
    assert f.meta["symbol"] in asm
    with pytest.raises(ValueError, match="'ll' or 'asm'"):
        f.get_source("c")


@pytest.mark.parametrize("target", runnable_targets())
def test_vector_loop_uses_the_targets_widest_registers(saved, target):
    """A loop vectorized one register wide: zmm with AVX-512, ymm (and never zmm) with AVX2."""
    lanes = target.lanes(4)
    A = te.placeholder((1024,), "float32", "A")
    B = te.placeholder((1024,), "float32", "B")
    C = te.compute((1024,), lambda i: A[i] * B[i] + 2.0, name="C")
    s = jitop.create_schedule(C.op)
    o, i = s[C].split(C.op.axis[0], factor=lanes)
    s[C].vectorize(i)
    f = jitop.build(s, [A, B, C], target=target)
    assert f"<{lanes} x float>" in f.get_source("ll")
    asm = f.get_source("asm")
    assert {64: "zmm", 32: "ymm"}[target.vector_bytes] in asm
    assert target.vector_bytes == 64 or "zmm" not in asm


# ---------------------------------------------------------------------------------------------
# code generation for a Target: lane counts and instruction choices come from the Target passed down
# ---------------------------------------------------------------------------------------------

def _long_vector_loop(dtype: str, split: int | None = None, math: bool = False):
    """C[i] = f(A[i]) over 1000 elements (not a multiple of any vector width), vectorized whole (longer
    than MAX_LANES, so code generation chunks it) or split by `split` first."""
    A = te.placeholder((1000,), dtype, "A")
    C = te.compute((1000,), lambda i: te.exp(A[i] * 0.5) + 1.0 if math else A[i] * 3 + 1, name="C")
    s = jitop.create_schedule(C.op)
    axis = C.op.axis[0]
    if split:
        _, axis = s[C].split(axis, factor=split)
    s[C].vectorize(axis)
    return s, [A, C]


_LLVM_ELEMENT = {"float32": "float", "float64": "double", "int8": "i8", "int16": "i16"}


@pytest.mark.parametrize("cpu", ["x86-64", "haswell", "skylake-avx512"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int8"])
def test_long_vectorized_loop_is_chunked_one_register_wide(cpu, dtype):
    from jitop.codegen.kernel import KernelCodegen
    from jitop.target import Target
    target = Target.from_string(cpu)
    ll = str(KernelCodegen(jitop.lower(*_long_vector_loop(dtype)), "k", target).build())
    widths = set(re.findall(rf"<(\d+) x {_LLVM_ELEMENT[dtype]}>", ll))
    assert widths == {str(target.lanes(np.dtype(dtype).itemsize))}, (target.describe(), widths)


def test_chunk_width_follows_the_widest_element_of_the_loop():
    from jitop.codegen.kernel import KernelCodegen
    from jitop.target import Target
    A = te.placeholder((1000,), "float32", "A")
    C = te.compute((1000,), lambda i: te.cast(A[i], "float64") * 0.5, name="C")  # float32 in, float64 out
    s = jitop.create_schedule(C.op)
    s[C].vectorize(C.op.axis[0])
    ll = str(KernelCodegen(jitop.lower(s, [A, C]), "k", Target.from_string("haswell")).build())
    assert set(re.findall(r"<(\d+) x (?:float|double)>", ll)) == {"4"}  # one ymm of float64


@pytest.mark.parametrize("target", runnable_targets())
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_chunked_loop_gives_the_results_of_sixteen_lane_chunks(target, dtype):
    """The chunk width is the Target's, the results are those of the former fixed 16-lane chunks."""
    a = np.linspace(-40, 40, 1000).astype(dtype)
    whole = jitop.build(*_long_vector_loop(dtype, math=True), target=target)(a)
    by_16 = jitop.build(*_long_vector_loop(dtype, split=16, math=True), target=target)(a)
    np.testing.assert_array_equal(whole, by_16)
    np.testing.assert_allclose(whole, np.exp(a * 0.5) + 1, rtol=4e-7 if dtype == "float32" else 1e-15)


@pytest.mark.parametrize("avx512", [False, True])
def test_math_library_takes_avx512_from_its_caller(avx512):
    from llvmlite import ir

    from jitop import dtypes
    from jitop.codegen.math import emit_call
    from jitop.codegen.vecmath import emit_math
    v16 = ir.VectorType(ir.FloatType(), 16)
    for emit in (lambda b, x: emit_math(b, "exp", [x], avx512=avx512),
                 lambda b, x: emit_call(b, "exp", dtypes.float32, [x], avx512=avx512)):
        mod = ir.Module()
        fn = ir.Function(mod, ir.FunctionType(v16, [v16]), "k")
        b = ir.IRBuilder(fn.append_basic_block())
        b.ret(emit(b, fn.args[0]))
        assert ("llvm.x86.avx512.mask.scalef" in str(mod)) == avx512


@pytest.mark.parametrize("cpu", ["haswell", "skylake-avx512"])
def test_kernel_passes_its_targets_avx512_to_the_math_library(cpu):
    from jitop.codegen.kernel import KernelCodegen
    from jitop.target import Target
    target = Target.from_string(cpu)
    cg = KernelCodegen(jitop.lower(*_long_vector_loop("float32", split=16, math=True)), "k", target)
    ll = str(cg.build())
    assert not hasattr(cg.module, "target_features")  # no hidden state on llvmlite's module
    assert ("llvm.x86.avx512.mask.scalef" in ll) == ("avx512f" in target.required_features)
