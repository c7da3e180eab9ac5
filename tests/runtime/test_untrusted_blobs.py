"""Edited blobs and saved modules: what stands between edited bytes and a crash.

A blob's sha256 detects corruption; it is not a signature, so every blob here is re-checksummed after
its edit (what a careless tool or a version mix-up produces). Loading native code stays a matter of
trust (see `Executable.from_bytes`): these checks turn corruption and version skew into ValueError,
they do not make a malicious object safe. Anything that crashed before its check existed runs in a
child process, so a regression fails the test instead of killing the test run.
"""
from __future__ import annotations

import functools
import io
import json
import os
import pathlib
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import jitop
from jitop import te
from jitop.codegen.loader import check_object, load_object, read_global
from jitop.runtime import executable as ex
from jitop.runtime.executable import Executable, Plan
from jitop.runtime.module import load_module, signature_json
from jitop.target import Target

REPO = pathlib.Path(__file__).resolve().parents[2]
BIG = 1 << 20


# ** kernels and blobs **
@functools.cache
def _kernels() -> dict[str, jitop.Module]:
    A = te.placeholder((BIG,), "float32", "A")
    B = te.compute((BIG,), lambda i: A[i] + 1.0, name="B")
    big = jitop.build(jitop.create_schedule(B.op), [A, B], name="big")
    X = te.placeholder((1000,), "float64", "X")
    Y = te.compute((1000,), lambda i: X[i] * 2.0, name="Y")
    f64 = jitop.build(jitop.create_schedule(Y.op), [X, Y], name="twice")
    P = te.placeholder((64, 1000), "float64", "P")
    k = te.reduce_axis((0, 1000), "k")
    R = te.compute((64,), lambda r: te.sum(P[r, k] * P[r, k], axis=k), name="R")
    s = jitop.create_schedule(R.op)
    s[R].parallel(R.op.axis[0])
    par = jitop.build(s, [P, R], name="rowsq")
    assert par.meta["uses_parallel"] and not big.meta["uses_parallel"]
    return {"big": big, "twice": f64, "rowsq": par}


def _blob(which: str) -> bytes:
    module = _kernels()[which]
    p_in, p_out = module.params
    return Executable(module, Plan([("arg", 0)], [(p_out.shape, p_out.dtype)], [0], result=["out", 0, False])).to_bytes()


def _files(blob: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(blob[ex._HEADER.size:])) as z:
        return {n: z.read(n) for n in z.namelist()}


def _resigned(blob: bytes, replace: dict[str, bytes]) -> bytes:
    """The blob with some files replaced and a recomputed (valid) checksum."""
    payload = ex._zip({**_files(blob), **replace})
    return ex._HEADER.pack(ex.MAGIC, ex.FORMAT_VERSION, ex.hashlib.sha256(payload).digest()) + payload


def _edited(blob: bytes, meta=None, plan=None) -> bytes:
    files = _files(blob)
    m, p = json.loads(files["meta.json"]), json.loads(files["plan.json"])
    if meta:
        meta(m)
    if plan:
        plan(p)
    return _resigned(blob, {"meta.json": json.dumps(m).encode(), "plan.json": json.dumps(p).encode()})


def _saved_module(tmp_path: pathlib.Path, which: str, meta=None, object_code: bytes | None = None) -> pathlib.Path:
    """`which` saved with Module.save, then its meta.json and/or kernel.o replaced."""
    path = tmp_path / f"{which}.jitop"
    _kernels()[which].save(path)
    with zipfile.ZipFile(path) as z:
        files = {n: z.read(n) for n in z.namelist()}
    m = json.loads(files["meta.json"])
    if meta:
        meta(m)
    files["meta.json"] = json.dumps(m).encode()
    if object_code is not None:
        files["kernel.o"] = object_code
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


CHILD = r"""
import sys
import numpy as np
import jitop
from jitop.runtime.executable import Executable

for kind, path in zip(sys.argv[1::2], sys.argv[2::2]):
    try:
        if kind == "blob":
            f = Executable.from_bytes(open(path, "rb").read())
        else:
            f = jitop.load_module(path)
    except ValueError as err:
        print("ValueError:", str(err).replace("\n", " "), flush=True)
        continue
    print("LOADED", flush=True)
    if kind == "run":
        x = np.random.default_rng(0).standard_normal((64, 1000))
        np.testing.assert_allclose(f(x), (x * x).sum(axis=1), rtol=1e-12)
        print("RAN", flush=True)
"""


def _child(cases: list[tuple[str, pathlib.Path]]) -> list[str]:
    """Load each (kind, path) in a fresh interpreter: one line per case; a crash fails the test."""
    argv = [str(a) for case in cases for a in case]
    res = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, timeout=300,
                         cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, f"the child crashed (exit {res.returncode}) after:\n{res.stdout}\n{res.stderr[-3000:]}"
    return res.stdout.splitlines()


# ** 1a: object code that is not a well-formed x86-64 ELF object never reaches LLVM **
def _patched(obj: bytes, fmt: str, offset: int, value: int) -> bytes:
    out = bytearray(obj)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def _object() -> bytes:
    return _kernels()["twice"].object_code


BAD_OBJECTS = {
    "garbage": lambda o: b"garbage" * 20,
    "empty": lambda o: b"",
    "magic": lambda o: b"\x7fELG" + o[4:],
    "elfclass32": lambda o: _patched(o, "<B", 4, 1),
    "big-endian": lambda o: _patched(o, "<B", 5, 2),
    "executable": lambda o: _patched(o, "<H", 16, 2),                # e_type ET_EXEC
    "shared-library": lambda o: _patched(o, "<H", 16, 3),            # e_type ET_DYN
    "aarch64": lambda o: _patched(o, "<H", 18, 183),                 # e_machine
    "section-table-past-end": lambda o: _patched(o, "<Q", 40, len(o)),
    "too-many-sections": lambda o: _patched(o, "<H", 60, 0xFFFF),
    "no-sections": lambda o: _patched(o, "<H", 60, 0),
    "bad-name-section": lambda o: _patched(o, "<H", 62, 0xFFFF),
    "truncated": lambda o: o[: len(o) // 2],
    "header-only": lambda o: o[:64],
}


@pytest.mark.parametrize("make", BAD_OBJECTS.values(), ids=BAD_OBJECTS.keys())
def test_malformed_object_code_is_refused_before_llvm(make):
    with pytest.raises(ValueError, match="object code"):
        check_object(make(_object()))


def test_a_section_outside_the_object_is_refused():
    obj = _object()
    shoff, shnum = struct.unpack_from("<Q", obj, 40)[0], struct.unpack_from("<H", obj, 60)[0]
    k = next(k for k in range(1, shnum) if struct.unpack_from("<I", obj, shoff + k * 64 + 4)[0] != 8)  # not NOBITS
    with pytest.raises(ValueError, match="section"):
        check_object(_patched(obj, "<Q", shoff + k * 64 + 32, len(obj) * 4))  # sh_size


def test_well_formed_objects_pass_and_list_what_they_need():
    info = check_object(_kernels()["rowsq"].object_code)
    assert "jitop_parallel_for" in info.undefined
    symbol = _kernels()["twice"].meta["symbol"]
    assert check_object(_object()).sizes[f"{symbol}_signature"] > 0


def test_blobs_and_modules_with_malformed_object_code_are_refused_in_a_child(tmp_path):
    blob = _blob("twice")
    cases = []
    for name in ("garbage", "aarch64", "truncated", "section-table-past-end"):
        path = tmp_path / f"{name}.bin"
        path.write_bytes(_resigned(blob, {"kernel.o": BAD_OBJECTS[name](_object())}))
        cases.append(("blob", path))
    cases.append(("module", _saved_module(tmp_path, "twice", object_code=b"garbage" * 20)))
    lines = _child(cases)
    assert len(lines) == len(cases), lines
    for line in lines:
        assert line.startswith("ValueError:") and "kernel 'twice'" in line and "object code" in line, line


def test_object_code_without_the_kernel_is_a_value_error_naming_it():
    other = _kernels()["big"].object_code  # well-formed, but defines another kernel's symbols
    with pytest.raises(ValueError, match=r"kernel 'twice'.*does not define"):
        Executable.from_bytes(_resigned(_blob("twice"), {"kernel.o": other}))


def test_object_code_needing_a_symbol_the_process_lacks_is_refused():
    from jitop.codegen.target import compile_ir
    ll = ("declare void @jitop_no_such_runtime_function()\n"
          "define void @f() {\n  call void @jitop_no_such_runtime_function()\n  ret void\n}\n")
    with pytest.raises(ValueError, match="jitop_no_such_runtime_function"):
        load_object(compile_ir(ll, Target.host())[1], ["f"])


def test_a_parallel_kernel_whose_metadata_denies_it_still_links_the_pool(tmp_path):
    # the object code calls jitop_parallel_for: an unlinked pool would be a call to address 0
    blob = tmp_path / "blob.bin"
    blob.write_bytes(_edited(_blob("rowsq"), meta=lambda m: m.__setitem__("uses_parallel", False)))
    module = _saved_module(tmp_path, "rowsq", meta=lambda m: m.__setitem__("uses_parallel", False))
    assert _child([("run", blob)]) == ["LOADED", "RAN"]
    assert _child([("run", module)]) == ["LOADED", "RAN"]


# ** 1b: the object code carries its signature; metadata that disagrees is refused before anything runs **
def test_object_code_carries_the_parameter_signature():
    f = _kernels()["twice"]
    symbol = f"{f.meta['symbol']}_signature"
    addr = load_object(f.object_code, [], [symbol])[symbol]
    text = read_global(f.object_code, symbol, addr)
    assert text == signature_json(f.meta["params"]).encode() + b"\0"
    assert json.loads(text[:-1]) == [p.to_json() for p in f.params]


def _shrink_output(m: dict) -> None:
    m["params"][1]["shape"] = [4]


def test_edited_output_shape_in_meta_and_plan_is_refused():
    data = _edited(_blob("big"), meta=_shrink_output, plan=lambda p: p["outputs"][0].__setitem__(0, [4]))
    with pytest.raises(ValueError, match="object code and metadata disagree"):
        Executable.from_bytes(data)


@pytest.mark.parametrize("edit", [
    lambda p: p.__setitem__("dtype", "int8"),
    lambda p: p.__setitem__("shape", [10]),
    lambda p: p.__setitem__("shape", [1000.0]),
    lambda p: p.__setitem__("is_output", 1),
    lambda p: p.__setitem__("name", "Z"),
], ids=["dtype", "shape", "float-shape", "int-flag", "name"])
def test_any_edit_of_an_input_parameter_is_refused(edit):
    # the plan ("arg", 0) carries no dtype or shape: only the object code's signature can tell
    with pytest.raises(ValueError, match="disagree|malformed"):
        Executable.from_bytes(_edited(_blob("twice"), meta=lambda m: edit(m["params"][0])))


def test_edited_saved_module_is_refused(tmp_path):
    path = _saved_module(tmp_path, "big", meta=_shrink_output)
    with pytest.raises(ValueError, match="object code and metadata disagree"):
        load_module(path)


def test_the_unedited_blob_and_module_still_load_and_run(tmp_path):
    x = np.random.default_rng(2).standard_normal(1000)
    exe = Executable.from_bytes(_blob("twice"))
    np.testing.assert_array_equal(exe(x), x * 2)
    path = _saved_module(tmp_path, "twice")
    np.testing.assert_array_equal(load_module(path)(x), x * 2)


# ** 1c: the plan hands each parameter a buffer of its parameter's dtype and shape **
@pytest.mark.parametrize("entry", [
    ["arg_swapped", [0, "|i1"]],    # int8 converted, read as float64: 8x past the buffer
    ["arg_swapped", [0, "<f4"]],
    ["scalar", [0, "|i1"]],         # a 1-byte 0-d array read as 1000 float64
    ["scalar", [0, "<f8"]],         # the right dtype, but the parameter is not 0-d
    ["arg", -1],
    ["arg", True],
    ["arg", [0]],
    ["bogus", 0],
], ids=["swapped-int8", "swapped-float32", "scalar-int8", "scalar-of-an-array", "negative", "bool", "list", "kind"])
def test_plan_inputs_that_do_not_fit_their_parameter_are_refused(entry):
    data = _edited(_blob("twice"), plan=lambda p: p["inputs"].__setitem__(0, entry))
    with pytest.raises(ValueError, match="malformed"):
        Executable.from_bytes(data)


def test_plan_outputs_must_be_the_output_parameters():
    for edit in (lambda p: p["outputs"][0].__setitem__(1, "|i1"), lambda p: p["outputs"][0].__setitem__(0, [999])):
        with pytest.raises(ValueError, match="malformed"):
            Executable.from_bytes(_edited(_blob("twice"), plan=edit))


def test_byte_swapped_input_of_the_parameters_dtype_is_accepted():
    data = _edited(_blob("twice"), plan=lambda p: p["inputs"].__setitem__(0, ["arg_swapped", [0, "<f8"]]))
    exe = Executable.from_bytes(data)
    x = np.arange(1000, dtype=">f8")
    np.testing.assert_array_equal(exe(x), np.arange(1000.0) * 2)


def test_one_argument_for_two_parameters_is_refused():
    X = te.placeholder((8,), "float64", "X")
    W = te.placeholder((8,), "float64", "W")
    Y = te.compute((8,), lambda i: X[i] + W[i], name="Y")
    module = jitop.build(jitop.create_schedule(Y.op), [X, W, Y])
    blob = Executable(module, Plan([("arg", 0), ("arg", 1)], [((8,), np.dtype("float64"))], [0])).to_bytes()
    Executable.from_bytes(blob)
    with pytest.raises(ValueError, match="twice"):
        Executable.from_bytes(_edited(blob, plan=lambda p: p["inputs"].__setitem__(1, ["arg", 0])))


# ** 2: whatever the target description holds, a malformed one is a ValueError **
@pytest.mark.parametrize("edit", [
    lambda t: t.__setitem__("features", 5),
    lambda t: t.__setitem__("triple", None),
    lambda t: t.__setitem__("vector_bytes", "64"),
    lambda t: t.__setitem__("threads", -1),
    lambda t: t.clear(),
], ids=["features-int", "triple-none", "width-str", "negative", "empty"])
def test_malformed_target_is_a_value_error(edit):
    with pytest.raises(ValueError, match="malformed"):
        Executable.from_bytes(_edited(_blob("twice"), meta=lambda m: edit(m["target"])))


@pytest.mark.parametrize("error", [TypeError, AttributeError, ValueError])
def test_any_failure_reading_the_target_is_a_value_error(monkeypatch, error):
    def broken(*args, **kwargs):
        raise error("broken target description")
    blob = _blob("twice")
    monkeypatch.setattr(Target, "check_runs_on", broken)
    with pytest.raises(ValueError, match="malformed"):
        Executable.from_bytes(blob)
    monkeypatch.undo()
    monkeypatch.setattr(Target, "from_json", staticmethod(broken))
    with pytest.raises(ValueError, match="malformed"):
        Executable.from_bytes(blob)


def test_meta_that_is_not_an_object_is_a_value_error():
    for meta in (b"[]", b'"text"', b"3"):
        with pytest.raises(ValueError, match="malformed"):
            Executable.from_bytes(_resigned(_blob("twice"), {"meta.json": meta}))


@pytest.mark.parametrize("edit", [
    lambda m: m.__setitem__("params", {"a": 1}),
    lambda m: m["params"][0].__setitem__("dtype", "object"),
    lambda m: m["params"][0].__setitem__("shape", [-4]),
    lambda m: m["params"][0].pop("name"),
    lambda m: m.__setitem__("symbol", 5),
    lambda m: m.__setitem__("checked_accesses", [1]),
], ids=["params-dict", "object-dtype", "negative-shape", "no-name", "symbol-int", "checked-int"])
def test_malformed_saved_module_metadata_is_a_value_error(tmp_path, edit):
    with pytest.raises(ValueError):
        load_module(_saved_module(tmp_path, "twice", meta=edit))


def test_a_saved_module_that_is_not_a_zip_is_a_value_error(tmp_path):
    path = tmp_path / "x.jitop"
    path.write_bytes(b"not a zip at all")
    with pytest.raises(ValueError, match="not a well-formed jitop module"):
        load_module(path)


# ** 1d: the trust model is documented where blobs and modules are loaded **
def test_loading_documents_its_trust_model():
    for doc in (Executable.from_bytes.__doc__, load_module.__doc__):
        text = " ".join(doc.split())
        assert "trusted source" in text and "shared library" in text and "malicious" in text


def test_run_time_error_codes_past_the_metadata_list_still_raise_index_error():
    f = _kernels()["twice"]
    module = jitop.runtime.module.Module({**f.meta}, f.object_code)
    module._error = type("Flag", (), {"value": 7})()  # a code the (edited) metadata has no entry for
    module.checked = []
    with pytest.raises(IndexError, match="check #7"):
        module.raise_if_error()
