"""Executable <-> bytes: a compiled kernel (object code + Plan + result tree) survives a round trip, loads in
another process without LLVM or the tracer, and a corrupt, foreign or unsafe blob is refused."""
from __future__ import annotations

import collections
import inspect
import io
import json
import os
import pathlib
import struct
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

import jitop
from jitop import te
from jitop.runtime import executable as ex
from jitop.runtime.executable import Executable, Plan, rebuild

REPO = pathlib.Path(__file__).resolve().parents[2]


# ** kernels (module level: the second process gets their source) **
def with_constants(x):
    return x * np.array([1.5, -2.0, 3.25], np.float32) + np.float32(1)


def with_scalars(x, s, t):
    return x * s + t


def nested(x):
    return {"y": x + 1, "stats": (x.sum(), [x.max() - 1, None, "ok", 3, 2.5, True]), 7: x * 2}


def zero_d(x):
    return x.sum() * 2


def softmax_and_total(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True), e.sum()


def byte_swapped(x):
    return np.sqrt(x) + x


def serial_mix(x, s):
    col = x.sum(axis=0)
    y = x / col * s + np.arange(8, dtype=np.float64)
    return {"y": y, "stats": (col.sum(), [y.max(axis=1), None, "ok", 3])}


def same(got, want):
    """Same structure, same Python constants, arrays/numpy scalars of numpy's kind, dtype, shape and values."""
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            same(got[k], want[k])
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            same(g, w)
    elif isinstance(want, (np.ndarray, np.generic)):
        assert got.dtype == want.dtype and np.shape(got) == np.shape(want), (got, want)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
    else:
        assert got == want


def _compiled(fn, *args):
    """The Executable @jitop.kernel built for these arguments, and the kernel's own result."""
    k = jitop.kernel(fn, fallback=False)
    result = k(*args)
    (entry,) = k.cache.values()
    return entry.exe, result


def _roundtrip(fn, *args) -> Executable:
    exe, first = _compiled(fn, *args)
    loaded = Executable.from_bytes(exe.to_bytes())
    want = fn(*args)
    same(first, want)
    same(loaded(*args), want)
    same(loaded.call(list(args)), want)
    return loaded


RNG = np.random.default_rng(0)


# ** round trips **
def test_constants_round_trip():
    loaded = _roundtrip(with_constants, RNG.standard_normal((4, 3)).astype(np.float32))
    assert any(kind == "const" for kind, _ in loaded.plan.inputs)


def test_scalars_round_trip():
    loaded = _roundtrip(with_scalars, RNG.standard_normal(5), 2.0, np.float32(3))
    assert [kind for kind, _ in loaded.plan.inputs] == ["arg", "scalar", "scalar"]


def test_nested_results_round_trip():
    loaded = _roundtrip(nested, RNG.standard_normal((3, 4)))
    assert loaded.plan.result[0] == "dict"


def test_zero_d_result_is_a_numpy_scalar():
    x = RNG.standard_normal(7).astype(np.float32)
    loaded = _roundtrip(zero_d, x)
    assert isinstance(loaded(x), np.float32)
    # a 0-d array argument stays what numpy makes of it
    _roundtrip(zero_d, np.array(3.0))


def test_scratch_buffers_round_trip():
    loaded = _roundtrip(softmax_and_total, RNG.standard_normal((8, 37)).astype(np.float32))
    assert loaded.plan.n_scratch > 0


def test_non_native_byte_order_argument_round_trip():
    loaded = _roundtrip(byte_swapped, np.arange(6, dtype=">f8"))
    assert loaded.plan.inputs[0][0] == "arg_swapped"


def test_single_array_result_is_the_runner_itself():
    # the hot path: no rebuild step around the generated runner for a bare array result
    k = jitop.kernel(with_constants, fallback=False)
    x = np.ones((2, 3), np.float32)
    out = k(x)
    (entry,) = k.cache.values()
    assert entry.exe.plan.result == ["out", 0, False]
    assert entry.call is entry.exe.call and entry.call.__name__ == "run"
    assert isinstance(out, np.ndarray)


def test_same_executable_gives_same_bytes():
    exe, _ = _compiled(with_constants, np.ones((2, 3), np.float32))
    assert exe.to_bytes() == exe.to_bytes()


def test_loaded_executable_checks_its_arguments():
    loaded = _roundtrip(with_scalars, np.ones(5), 2.0, 1.0)
    with pytest.raises(ValueError, match="shape"):
        loaded(np.ones(4), 2.0, 1.0)
    with pytest.raises(ValueError, match="float64"):
        loaded(np.ones(5, np.float32), 2.0, 1.0)
    with pytest.raises(ValueError, match="scalar"):
        loaded(np.ones(5), np.ones(3), 1.0)
    with pytest.raises(TypeError, match="missing argument"):
        loaded(np.ones(5))


# ** result trees **
def test_rebuild_from_a_tree():
    outs = [np.arange(3), np.array(2.5)]
    tree = ["list", [["tuple", []], ["dict", [[["const", 1], ["out", 1, True]], [["const", "a"], ["out", 0, False]]]],
                     ["const", None]]]
    got = rebuild(tree, outs)
    assert got[0] == () and got[2] is None and got[1]["a"] is outs[0]
    assert type(got[1][1]) is np.float64 and list(got[1]) == [1, "a"]
    assert json.loads(json.dumps(tree)) == tree


@pytest.mark.parametrize("tree", [["out", 2, False], ["out", 0], ["nope", []], ["const", object()],
                                  ["dict", [[["out", 0, False], ["const", 1]]]], "out", 5])
def test_malformed_trees_are_refused(tree):
    with pytest.raises(ValueError):
        rebuild(tree, [np.zeros(1)])


def test_a_python_object_in_the_result_works_but_cannot_be_saved():
    def keyed(x):
        return {(0, 1): x + 1}
    x = np.ones(3)
    exe, got = _compiled(keyed, x)
    same(got, keyed(x))
    with pytest.raises(ValueError, match="cannot be saved"):
        exe.to_bytes()


def test_a_namedtuple_result_runs_as_numpy():
    Pair = collections.namedtuple("Pair", "a b")

    def pair(x):
        return Pair(x + 1, x * 2)
    x = np.ones(3)
    with pytest.warns(jitop.JitopFallbackWarning, match="namedtuple|Pair"):
        got = jitop.kernel(pair)(x)
    assert type(got) is Pair
    np.testing.assert_array_equal(got.b, x * 2)


# ** refused blobs **
@pytest.fixture(scope="module")
def blob() -> bytes:
    exe, _ = _compiled(with_constants, np.ones((4, 3), np.float32))
    return exe.to_bytes()


def test_corrupt_byte_is_refused(blob):
    bad = bytearray(blob)
    bad[len(bad) // 2] ^= 0xFF
    with pytest.raises(ValueError, match="checksum"):
        Executable.from_bytes(bytes(bad))


@pytest.mark.parametrize("keep", [0, 10, ex._HEADER.size, ex._HEADER.size + 100, -1])
def test_truncated_blob_is_refused(blob, keep):
    with pytest.raises(ValueError):
        Executable.from_bytes(blob[:keep])


def test_wrong_version_is_refused(blob):
    bad = blob[:8] + struct.pack("<I", ex.FORMAT_VERSION + 1) + blob[12:]
    with pytest.raises(ValueError, match="version"):
        Executable.from_bytes(bad)


def test_other_data_is_refused(blob):
    with pytest.raises(ValueError, match="magic"):
        Executable.from_bytes(b"PK" + blob[2:])
    with pytest.raises(TypeError):
        Executable.from_bytes("not bytes")


def _resigned(blob: bytes, replace: dict[str, bytes]) -> bytes:
    """The blob with some files replaced and a valid checksum: what a crafted blob looks like."""
    with zipfile.ZipFile(io.BytesIO(blob[ex._HEADER.size:])) as z:
        files = {n: z.read(n) for n in z.namelist()}
    payload = ex._zip({**files, **replace})
    return ex._HEADER.pack(ex.MAGIC, ex.FORMAT_VERSION, ex.hashlib.sha256(payload).digest()) + payload


def _edit_plan(blob: bytes, edit) -> bytes:
    with zipfile.ZipFile(io.BytesIO(blob[ex._HEADER.size:])) as z:
        plan = json.loads(z.read("plan.json"))
    edit(plan)
    return _resigned(blob, {"plan.json": json.dumps(plan).encode()})


@pytest.mark.parametrize("edit", [
    lambda p: p["outputs"][0].__setitem__(1, "|O"),                # object dtype
    lambda p: p["outputs"][0].__setitem__(1, ">f4"),               # not what the kernel writes
    lambda p: p["outputs"][0].__setitem__(0, [4, 4]),              # bigger than the kernel's buffer
    lambda p: p["inputs"][0].__setitem__(1, "__import__('os')"),   # code in a position
    lambda p: p["inputs"].pop(),                                   # fewer inputs than parameters
    lambda p: p.__setitem__("result", ["out", 5, False]),          # result past the outputs
    lambda p: p.__setitem__("result", ["obj", 1]),                 # objects never load
], ids=["object-dtype", "byte-order", "shape", "position", "arity", "result-slot", "object-leaf"])
def test_crafted_plans_are_refused(blob, edit):
    with pytest.raises(ValueError, match="malformed"):
        Executable.from_bytes(_edit_plan(blob, edit))


def test_pickled_constant_is_refused(blob):
    npy = io.BytesIO()
    np.save(npy, np.array([object(), 1, 2], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="malformed"):
        Executable.from_bytes(_resigned(blob, {"const0.npy": npy.getvalue()}))


def test_wrong_constant_shape_is_refused(blob):
    npy = io.BytesIO()
    np.save(npy, np.ones(2, np.float32))
    with pytest.raises(ValueError, match="malformed"):
        Executable.from_bytes(_resigned(blob, {"const0.npy": npy.getvalue()}))


def _foreign_cpu() -> str:
    host = jitop.Target.host()
    for name in ("sapphirerapids", "znver4", "znver5"):
        if jitop.Target.from_string(name).missing_on(host):
            return name
    pytest.skip(f"this host ({host.cpu}) runs code for every candidate CPU")


def test_blob_for_a_foreign_cpu_is_refused_and_never_run(monkeypatch):
    name = _foreign_cpu()
    A = te.placeholder((1000,), "float32", name="A")
    B = te.compute((1000,), lambda i: A[i] * 2.0 + 1.0, name="B")
    module = jitop.build(jitop.create_schedule(B.op), [A, B], target=f"llvm -mcpu={name}")
    exe = Executable(module, Plan([("arg", 0)], [((1000,), np.dtype(np.float32))], [0], result=["out", 0, False]))
    data = exe.to_bytes()

    from jitop.codegen import loader

    def never(*args, **kwargs):
        raise AssertionError("code for a foreign CPU was linked into the process")
    monkeypatch.setattr(loader, "load_object", never)
    with pytest.raises(jitop.TargetMismatchError) as err:
        Executable.from_bytes(data)
    missing = jitop.Target.from_string(name).missing_on(jitop.Target.host())
    assert all(f in str(err.value) for f in missing), str(err.value)


# ** a second process: loads the bytes, runs them, no LLVM, no tracer **
CHILD = r"""
import sys
import numpy as np
import llvmlite.binding as llvm

def forbidden(*args, **kwargs):
    raise AssertionError("LLVM optimisation/code generation or the tracer ran while loading an Executable")

_parse = llvm.parse_assembly

def parse_empty_only(ll, *args, **kwargs):
    # the object loader links into an empty LLVM module (no IR to optimise); parsing real IR means compiling
    if ll.strip():
        forbidden()
    return _parse(ll, *args, **kwargs)

if sys.argv[2] == "forbid":
    llvm.parse_assembly = parse_empty_only
    llvm.TargetMachine.emit_object = forbidden
    llvm.TargetMachine.emit_assembly = forbidden
    llvm.create_pass_builder = forbidden
import jitop
import jitop.codegen.target as target
import jitop.graph.tracer as tracer
if sys.argv[2] == "forbid":
    target.compile_ir = forbidden
    target.optimize = forbidden
    tracer.Tracer.__init__ = forbidden
from jitop.runtime.executable import Executable

exe = Executable.from_bytes(open(sys.argv[1], "rb").read())
SOURCE
same(exe(*ARGS), FUNCTION(*ARGS))
print("OK")
"""


def _child(tmp_path: pathlib.Path, fn, args_src: str, cache: pathlib.Path, forbid: bool = True):
    """Run `fn` from its saved Executable in a fresh interpreter; ARGS are rebuilt there from `args_src`."""
    src = "\n".join(textwrap.dedent(inspect.getsource(f)) for f in (fn, same))
    code = (CHILD.replace("SOURCE", src + f"\nARGS = {args_src}\n").replace("FUNCTION", fn.__name__))
    env = {**os.environ, "JITOP_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code, str(tmp_path / "exe.bin"), "forbid" if forbid else "allow"],
                          capture_output=True, text=True, timeout=300, cwd=str(REPO), env=env)


def _save(tmp_path: pathlib.Path, fn, args_src: str) -> Executable:
    exe, _ = _compiled(fn, *eval(args_src))  # noqa: S307 - the test's own literal
    (tmp_path / "exe.bin").write_bytes(exe.to_bytes())
    return exe


SERIAL_ARGS = "(np.random.default_rng(1).standard_normal((16, 8)), 2.5)"
PARALLEL_ARGS = "(np.random.default_rng(1).standard_normal((8, 37)).astype(np.float32),)"


def test_second_process_runs_a_serial_kernel_without_llvm_or_tracer(tmp_path):
    # A serial kernel links nothing but its own object code, so even a cold cache needs no LLVM.
    # (A parallel one also needs the thread pool's object code: see the next test.)
    exe = _save(tmp_path, serial_mix, SERIAL_ARGS)
    assert not exe.module.meta["uses_parallel"], "pick a kernel that compiles serially for this test"
    assert exe.plan.n_scratch > 0 and any(kind == "scalar" for kind, _ in exe.plan.inputs)
    res = _child(tmp_path, serial_mix, SERIAL_ARGS, tmp_path / "cache")
    assert res.returncode == 0 and res.stdout.strip().endswith("OK"), res.stderr[-3000:]


def test_second_process_runs_a_parallel_kernel_from_a_warm_cache_without_llvm(tmp_path):
    # The thread pool's object code is compiled by LLVM the first time a process needs it, unless
    # JITOP_CACHE_DIR has it: a first (cold) child may compile and store it, a second must not use LLVM.
    _save(tmp_path, softmax_and_total, PARALLEL_ARGS)
    cache = tmp_path / "cache"
    cold = _child(tmp_path, softmax_and_total, PARALLEL_ARGS, cache, forbid=False)
    assert cold.returncode == 0 and cold.stdout.strip().endswith("OK"), cold.stderr[-3000:]
    warm = _child(tmp_path, softmax_and_total, PARALLEL_ARGS, cache)
    assert warm.returncode == 0 and warm.stdout.strip().endswith("OK"), warm.stderr[-3000:]


def test_a_python_int_arguments_range_check_survives_bytes():
    """NEP 50: an out-of-range Python int argument raises OverflowError, also after a round trip."""
    @jitop.kernel
    def f(x, y):
        return x + y
    a = np.ones(3, np.int8)
    f(a, 1)
    (entry,) = [e for e in f.cache.values() if e is not None]
    loaded = Executable.from_bytes(entry.exe.to_bytes())
    np.testing.assert_array_equal(loaded.call([a, 5]), a + 5)
    with pytest.raises(OverflowError, match="300 out of bounds for int8"):
        loaded.call([a, 300])
