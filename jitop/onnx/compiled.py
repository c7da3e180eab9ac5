"""A compiled model in one file (`jitop compile model.onnx -o model.jitop`): no onnx package, no pickle.

Layout: MAGIC, format version, sha256 of the manifest, its length; then a JSON manifest (the model's name,
inputs and outputs, the byte ranges of its executables and of its constant outputs with their sha256), then
the blobs: executables in jitop.runtime.executable's format (object code, plan, weights as .npy; each carries
its own checksum and is checked for this CPU before it is linked, so the file's bytes are hashed once) and
constant outputs as .npy.
An executable serves the shapes it was compiled for (a symbolic one: every size its guards allow).
"""
from __future__ import annotations

import hashlib
import io
import json
import struct
from typing import Any, Mapping, Sequence

import numpy as np

from jitop.onnx.proto import ValueInfo
from jitop.runtime.executable import Executable

MAGIC = b"JITOPMDL"
VERSION = 1
_HEADER = struct.Struct("<8sI32sQ")  # magic, version, sha256(manifest), manifest length


def dumps(name: str, inputs: Sequence[ValueInfo], outputs: Sequence[ValueInfo],
          executables: Sequence[Executable], constants: Mapping[int, np.ndarray] | None = None) -> bytes:
    """The file's bytes for a model, the executables compiled for it and its outputs that depend on no input
    (output index -> value; the executables return None in their place)."""
    if not executables:
        raise ValueError("nothing to save: the model has no compiled executable yet (call it once, or use "
                         "Model.compile(shapes))")
    constants = dict(constants or {})
    blobs = [exe.to_bytes() for exe in executables] + [_npy(constants[k]) for k in sorted(constants)]
    ranges, offset = [], 0
    for b in blobs:
        ranges.append([offset, len(b)])
        offset += len(b)
    manifest = json.dumps({"name": name, "inputs": [_info_json(v) for v in inputs],
                           "outputs": [_info_json(v) for v in outputs], "executables": ranges[:len(executables)],
                           "constants": [[k, *r, hashlib.sha256(b).hexdigest()] for k, r, b in
                                         zip(sorted(constants), ranges[len(executables):], blobs[len(executables):])]}
                          ).encode()
    return _HEADER.pack(MAGIC, VERSION, hashlib.sha256(manifest).digest(), len(manifest)) + manifest + b"".join(blobs)


def is_compiled(data: bytes) -> bool:
    return data[:len(MAGIC)] == MAGIC


def loads(data: bytes) -> tuple[str, list[ValueInfo], list[ValueInfo], list[Executable], dict[int, np.ndarray]]:
    """(name, inputs, outputs, executables, constant outputs) of a file written by `dumps`; ValueError if it
    is damaged or from another version, jitop.TargetMismatchError if it was compiled for a CPU this machine is not."""
    if len(data) < _HEADER.size:
        raise ValueError("not a compiled jitop model (too short)")
    magic, version, digest, n = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError("not a compiled jitop model (bad magic)")
    if version != VERSION:
        raise ValueError(f"compiled jitop model format {version}; this jitop reads format {VERSION}: compile "
                         "the .onnx model again")
    body = memoryview(data)[_HEADER.size:]
    if hashlib.sha256(body[:n]).digest() != digest:
        raise ValueError("compiled jitop model is damaged (manifest checksum mismatch)")
    try:
        manifest = json.loads(bytes(body[:n]))
        inputs = [_info(v) for v in manifest["inputs"]]
        outputs = [_info(v) for v in manifest["outputs"]]
        ranges = [(int(a), int(b)) for a, b in manifest["executables"]]
        const_ranges = [(int(k), int(a), int(b), str(h)) for k, a, b, h in manifest["constants"]]
        name = str(manifest["name"])
        blobs = body[n:]
        constants = {k: _constant(bytes(blobs[a:a + b]), h) for k, a, b, h in const_ranges}
    except (KeyError, TypeError, ValueError, OSError) as err:
        raise ValueError(f"compiled jitop model has a malformed manifest ({type(err).__name__}: {err})") from None
    exes = [Executable.from_bytes(bytes(blobs[a:a + b])) for a, b in ranges]
    return name, inputs, outputs, exes, constants


def runner(executables: Sequence[Executable], inputs: Sequence[ValueInfo],
           constants: Mapping[int, np.ndarray] | None = None) -> Any:
    """A call for the Model: the first executable that accepts the arguments runs them."""
    constants = dict(constants or {})

    def run(values: list) -> tuple:
        for exe in executables:
            if exe.accepts(values):
                return tuple(constants[k] if r is None else r for k, r in enumerate(exe(*values)))
        shapes = ", ".join(f"{v.name}{tuple(np.shape(x))}" for v, x in zip(inputs, values))
        raise ValueError(f"this compiled model was not compiled for these input shapes ({shapes}); compile "
                         "the .onnx model for them (jitop compile --shape NAME=D0,D1,...)")
    return run


def _constant(blob: bytes, digest: str) -> np.ndarray:
    if hashlib.sha256(blob).hexdigest() != digest:
        raise ValueError("constant output damaged (checksum mismatch)")
    return np.load(io.BytesIO(blob), allow_pickle=False)


def _npy(a: np.ndarray) -> bytes:
    f = io.BytesIO()
    np.save(f, a, allow_pickle=False)
    return f.getvalue()


def _info_json(v: ValueInfo) -> dict:
    return {"name": v.name, "dtype": v.dtype.str, "shape": None if v.shape is None else list(v.shape)}


def _info(d: dict) -> ValueInfo:
    shape = d["shape"]
    dims = None if shape is None else tuple(x if x is None or isinstance(x, (int, str)) else int(x) for x in shape)
    dtype = np.dtype(str(d["dtype"]))
    if dtype.kind not in "biuf":
        raise ValueError(f"input/output dtype {dtype} is not a numeric dtype")
    return ValueInfo(str(d["name"]), dtype, dims)
