"""A warm process finds a function's compiled kernel without tracing it again.

A cold process traces the function, compiles the graph and stores the kernel under a key of the graph (the disk
cache, jitop.graph.kernel_cache). A warm process used to trace again to learn that key: tens of ms per kernel of a
model (a 12-head attention is ~250 numpy calls through the tracer). A *warm record* saves that trace: stored after
the cold build, under a key of what decided the trace, it names the kernel and holds what the call needs beside it
(the result's structure, the writes into arguments, the tuning tasks).

What decided the trace is the call's key (dtypes, shapes, static values, the symbolic dims), jitop's code, numpy's
and Python's versions, the target, and the function's *fingerprint*: its code and everything its code can reach
by name, followed through helper functions (their code, defaults, closures) to the values they read (numbers,
strings, None and tuples, lists and dicts of them). Modules count by name (numpy, math); anything else a function
reads by name (an object, an array, a module of the user's, a class) leaves the function without a fingerprint:
it is traced in every process, as before. Editing a helper, a default or a global constant changes the
fingerprint, so a record never serves code it was not made from. A GPU kernel's record names its GPU cache
entry and holds its input plan (`save_gpu`, `load_gpu`).

>>> def double(x): return x * 2
>>> fingerprint(double) == fingerprint(double), fingerprint(lambda x: x * GLOBAL_OBJECT) is None
(True, True)
"""
from __future__ import annotations

import builtins
import hashlib
import json
import math
import sys
import types
from typing import Any, Callable

import numpy as np

from jitop.cachedir import NULL, store
from jitop.graph.capture import LiveArray, code_objects
from jitop.graph.compile import Prepared, kernel_constants, read_constants
from jitop.graph.kernel_cache import load_named, signature
from jitop.graph.to_te import choice_line
from jitop.graph.writeback import Write
from jitop.runtime.executable import Executable
from jitop.tuner.task import Choice, Task, pick

GLOBAL_OBJECT = object()  # (for the doctest: an object read by name has no fingerprint)
_MODULES_BY_NAME = ("numpy", "math", "cmath", "operator", "functools", "itertools", "jitop")
_MAX_DEPTH = 64   # helper functions followed, nested
_MAX_VALUE = 4096  # elements of a container read by name


class _NoFingerprint(Exception):
    """Something the function reads cannot be fingerprinted."""


def fingerprint(fn: Callable) -> str | None:
    """A digest of `fn`'s code and of everything it reaches by name (see the module docstring), or None."""
    h = hashlib.sha256()
    try:
        _function(fn, h, set(), 0)
    except (_NoFingerprint, RecursionError):
        return None
    return h.hexdigest()


def _function(fn: Any, h: Any, seen: set[int], depth: int) -> None:
    if id(fn) in seen:
        h.update(b"<again>")
        return
    if depth > _MAX_DEPTH or not isinstance(fn, types.FunctionType):
        raise _NoFingerprint
    seen.add(id(fn))
    h.update(f"function {fn.__module__}.{fn.__qualname__}\n".encode())
    names: set[str] = set()
    for code in code_objects(fn.__code__):
        consts = [c for c in code.co_consts if not isinstance(c, types.CodeType)]
        h.update(repr((code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars)).encode())
        names |= set(code.co_names)
    for value in (fn.__defaults__ or ()), fn.__kwdefaults__ or {}:
        _value(value, h, seen, depth)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            contents = cell.cell_contents
        except ValueError:
            contents = None
        h.update(f"cell {name}\n".encode())
        _value(contents, h, seen, depth)
    ns = fn.__globals__
    for name in sorted(names):  # (attribute names too: those not bound in the globals are skipped)
        if name in ns:
            h.update(f"global {name}\n".encode())
            _value(ns[name], h, seen, depth)
        elif not hasattr(builtins, name):
            h.update(f"unbound {name}\n".encode())


def _value(v: Any, h: Any, seen: set[int], depth: int) -> None:
    t = type(v)
    if t is types.FunctionType and getattr(v, "__module__", "").split(".")[0] in ("numpy", "jitop"):
        h.update(f"named {v.__module__}.{v.__qualname__}\n".encode())  # (their versions are in the record's key)
    elif v is None or t in (bool, int, str, bytes):
        h.update(f"{t.__name__} {v!r}\n".encode())
    elif t in (float, complex):
        h.update(f"{t.__name__} {v!r} {math.copysign(1.0, v.real)}\n".encode())
    elif t in (tuple, list, dict):
        items = list(v.items()) if t is dict else list(v)
        if len(items) > _MAX_VALUE:
            raise _NoFingerprint
        h.update(f"{t.__name__} {len(items)}\n".encode())
        for item in items:
            _value(item, h, seen, depth)
    elif t is types.FunctionType:
        _function(v, h, seen, depth + 1)
    elif t is types.ModuleType and v.__name__.split(".")[0] in _MODULES_BY_NAME:
        h.update(f"module {v.__name__}\n".encode())
    elif isinstance(v, (np.ufunc, types.BuiltinFunctionType, np.dtype)) or \
            t is type and (v.__module__ == "builtins" or v.__module__.split(".")[0] == "numpy"):
        h.update(f"named {getattr(v, '__module__', None)}.{getattr(v, '__qualname__', None) or v!r}\n".encode())
    elif callable(v) and getattr(v, "__module__", "").split(".")[0] == "numpy" and \
            not isinstance(v, types.FunctionType):
        h.update(f"numpy {v.__module__}.{getattr(v, '__qualname__', '?')}\n".encode())
    elif isinstance(v, np.generic):
        h.update(f"npscalar {v.dtype.str} {v.tobytes().hex()}\n".encode())
    else:
        raise _NoFingerprint


def record_key(parts: tuple[str, str, Any, str, str], call_key: Any) -> str:
    """Where a warm record is kept: everything that decided the trace (see the module docstring). `parts`: the
    function's qualified name, its fingerprint, the symbolic dims, the target's key and jitop's code version."""
    function, printed, dims, target, code = parts
    text = [function, printed, repr(call_key), repr(sorted(dims.items()) if dims else ()), target, code,
            np.__version__, sys.version]
    return "warm/" + hashlib.sha256("\n".join(text).encode()).hexdigest()


# ** the record: what a call needs beside the kernel **
SCHEMA = 1
MAX_CONSTANT_BYTES = 1 << 20  # a kernel reading more constant bytes (computed by numpy while tracing) has no record


def save(where: str, prep: Prepared, kernel_key: Any, result: Any, writes: tuple[Write, ...],
         python_ints: bool) -> None:
    """Keep the record of a build (`kernel_key`: the disk cache's key of its kernel, None if it has none), with
    the constant arrays the trace computed (none for a captured array, read in place, or beyond
    MAX_CONSTANT_BYTES) and the result's structure (JSON data only). Never fails a call."""
    if kernel_key is None or any(isinstance(n.param("data"), LiveArray) for n in read_constants(prep)):
        return
    _put(where, {"kernel": kernel_key.to_json(), "signature": json.dumps(signature(prep))}, result, writes,
         python_ints, list(prep.choices.values()), kernel_constants(prep))


def save_gpu(where: str, exe: Any, result: Any, writes: tuple[Write, ...], python_ints: bool) -> None:
    """`save` for a GPU function (`exe`: a jitop.graph.gpu.GpuExecutable stored in the GPU cache): the record
    names its cache entry and holds how the call's values reach its parameters (its input plan)."""
    if exe.stored_as is None or any(kind == "live" for kind, _ in exe.inputs):
        return  # (a captured array is read in place on each call; no fingerprinted function reads one anyway)
    rows, constants = [], []
    try:
        for kind, what in exe.inputs:
            if kind == "const":
                rows.append(["const", len(constants)])
                constants.append(np.asarray(what))
            elif kind == "arg":
                rows.append(["arg", int(what)])
            else:
                names = [str(t) for t in what[2]] if len(what) > 2 else []
                rows.append([kind, int(what[0]), np.dtype(what[1]).str, names])
    except (TypeError, ValueError):
        return
    _put(where, {"gpu": exe.stored_as, "plan": rows, "slots": list(exe.result_slots),
                 "guards": [text for text, _ in exe.guards]}, result, writes, python_ints, exe.choices, constants)


def _put(where: str, kernel: dict, result: Any, writes: tuple[Write, ...], python_ints: bool,
         choices: list[tuple[Task, Any]], constants: list[np.ndarray]) -> None:
    """Store a record: what names the kernel (`kernel`), then what every record holds beside it."""
    st = store()
    if st is NULL or sum(c.nbytes for c in constants) > MAX_CONSTANT_BYTES:
        return
    tasks = [(task.to_json(), json.dumps(choice.config.as_dict(), sort_keys=True)) for task, choice in choices]
    try:
        blob = dumps({"schema": SCHEMA, **kernel, "result": result,
                      "writes": [(w.leaf, w.spec, w.region, w.early, w.positions) for w in writes],
                      "python_ints": python_ints, "tasks": tasks,
                      "constants": [(c.dtype.str, c.shape, np.ascontiguousarray(c).tobytes().hex())
                                    for c in constants]})
        st.put(where, blob)
    except (TypeError, ValueError, OSError):
        pass


_LOAD_ERRORS = (TypeError, ValueError, KeyError, IndexError, AttributeError, RecursionError, OSError)


def load(where: str, target: Any) -> tuple[Executable, Any, tuple[Write, ...], bool, list[Task]] | None:
    """(kernel, result tree, writes, python_ints, tasks) of the record at `where`, or None: no record, one that
    is not well-formed, names a kernel not stored (or not built for its signature), or was made with configs
    other than those the tuning sources pick now (a tuned record arrived since). `target`: the Target the
    kernel's template lines (for explain) describe."""
    try:
        found = _get(where)
        if found is None or "kernel" not in found[0]:
            return None
        rec, choices, constants, writes = found
        exe = load_named(rec["kernel"], rec["signature"], constants)
        if exe is None:
            return None
        exe.set_result(rec["result"])  # (checked: a tree over the kernel's results)
        exe.templates = [choice_line(f"{task.template}{k}", task, choice, target)
                         for k, (task, choice) in enumerate(choices)]
        exe.decisions = ["named by a warm record: the function was not traced (explain traces it)"]
        return exe, rec["result"], writes, rec["python_ints"], [task for task, _ in choices]
    except _LOAD_ERRORS:
        return None


def load_gpu(where: str) -> tuple[Any, Any, tuple[Write, ...], bool, list[Task]] | None:
    """`load` for a GPU function (a GpuExecutable of the GPU cache's entry the record names, its input plan
    checked against the function's parameters), or None."""
    from jitop.graph.gpu import stored_executable
    try:
        found = _get(where)
        if found is None or "gpu" not in found[0]:
            return None
        rec, choices, constants, writes = found
        plan = [_plan_row(row, constants) for row in rec["plan"]]
        exe = stored_executable(rec["gpu"], plan, rec["slots"], rec["guards"], choices)
        if exe is None:
            return None
        exe.set_result(rec["result"])
        return exe, rec["result"], writes, rec["python_ints"], [task for task, _ in choices]
    except _LOAD_ERRORS:
        return None


def _get(where: str) -> tuple[dict, list[tuple[Task, Choice]], list[np.ndarray], tuple] | None:
    """The record at `where` (its data, each task with the config picked for it, constants and writes), or None
    where there is none, its schema is another, or a task's config is not the one the tuning sources pick now."""
    st = store()
    blob = None if st is NULL else st.get(where)
    if blob is None:
        return None
    rec = loads(blob)
    if rec.get("schema") != SCHEMA or type(rec["python_ints"]) is not bool:
        return None
    choices = []
    for task_json, config in rec["tasks"]:
        task = Task.from_json(task_json)
        choice = pick(task)
        if json.dumps(choice.config.as_dict(), sort_keys=True) != config:
            return None
        choices.append((task, choice))
    writes = tuple(_write(*w) for w in rec["writes"])
    return rec, choices, [_array(*c) for c in rec["constants"]], writes


def _plan_row(row: list, constants: list[np.ndarray]) -> tuple[str, Any]:
    """An input plan entry of a GPU record (its kinds and types checked)."""
    kind, *rest = row
    if kind == "const" and len(rest) == 1 and type(rest[0]) is int:
        return "const", constants[rest[0]]
    if kind == "arg" and len(rest) == 1 and type(rest[0]) is int and rest[0] >= 0:
        return "arg", rest[0]
    if kind in ("arg_swapped", "scalar") and len(rest) == 3 and type(rest[0]) is int and rest[0] >= 0:
        pos, dtype, names = rest[0], np.dtype(rest[1]), tuple(np.dtype(t).name for t in rest[2])
        if dtype.kind not in "biuf":
            raise ValueError("a malformed input plan")
        return kind, ((pos, dtype, names) if kind == "scalar" and names else (pos, dtype))
    raise ValueError("a malformed input plan")


def _array(dtype: str, shape: tuple, data: str) -> np.ndarray:
    """A constant from a record (numbers only; its size checked against its shape)."""
    dt = np.dtype(dtype)
    if dt.kind not in "biuf" or type(shape) is not tuple or not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError("a malformed constant")
    return np.frombuffer(bytes.fromhex(data), dt).reshape(shape).copy()


def _write(leaf: Any, spec: Any, region: Any, early: Any, positions: Any) -> Write:
    """A Write from a record, its fields checked for their types."""
    ints = (lambda xs: type(xs) is tuple and all(type(x) is int for x in xs))
    if type(leaf) is not int or not (spec is None or type(spec) is tuple and all(
            type(s) is tuple and s and type(s[0]) is str and ints(s[1:]) for s in spec)) or not ints(region):
        raise ValueError("a malformed write")
    for source in ((early,) if early is not None else ()) + (positions or ()):
        if not (type(source) is tuple and len(source) == 2 and source[0] in ("leaf", "const")):
            raise ValueError("a malformed write source")
    return Write(leaf, spec, region, early, positions)


def to_json(data: Any) -> Any:
    """A record's data as JSON (tuples tagged, so they come back as tuples); TypeError for anything else."""
    if data is None or type(data) in (bool, int, str):
        return data
    if type(data) is float:
        if not math.isfinite(data):
            raise TypeError("a non-finite float")
        return data
    if type(data) is tuple:
        return {"t": [to_json(x) for x in data]}
    if type(data) is list:
        return [to_json(x) for x in data]
    raise TypeError(f"a {type(data).__name__} in a warm record")


def from_json(data: Any) -> Any:
    """The inverse of `to_json`."""
    if isinstance(data, dict):
        return tuple(from_json(x) for x in data["t"])
    if isinstance(data, list):
        return [from_json(x) for x in data]
    return data


def dumps(record: dict) -> bytes:
    return json.dumps({k: to_json(v) for k, v in record.items()}).encode()


def loads(blob: bytes) -> dict:
    return {k: from_json(v) for k, v in json.loads(blob).items()}
