"""A native entry point for compiled kernels: checks the arguments, allocates the outputs and calls the kernel
without running any Python, in ~0.1 µs instead of the generated-Python runner's ~2 µs.

One generic entry (its IR built with llvmlite.ir by jitop.runtime.entry_ir, reading the words laid out in
jitop.runtime.entry_words), compiled once per machine (its object code is cached like the thread pool's), is
exposed as built-in functions with CPython's METH_FASTCALL convention. Each built-in's
`self` is a `Table`: raw words naming the signatures (`Spec`s) it serves. A Spec is plain data an Executable
derives from its Plan: per argument the ndarray type, dtype descriptor, ndim and shape it needs (or the
Python scalar type), per output its descriptor and shape, the kernel's address and how to build the result.

A kernel with symbolic shapes has a symbolic Spec: its dims are printed expressions of the kernel's symbols.
The entry binds each symbol from an input's dim into a call-local slot (the slots are the i64[k] array the kernel
takes last), ties the other dims to them, and runs the spec's check-and-shape program (jitop.runtime.dimprog:
guards, output dims, the bytes that decide the GIL). A static Spec runs exactly the checks it always did.

A static Spec may also copy regions into its arguments, from other arguments before the kernel runs or from its
outputs after (`CopyIn`, jitop.runtime.copy_in: a decode step's `cache[t] = k`); when a copy's checks fail (a
position outside its axis, a read-only target, an argument sharing memory with a target written after the
kernel) the entry writes nothing and returns MISS.

The entry only ever accepts what the slow path would accept and compute identically: exact ndarrays with
the expected (native, singleton) dtype descriptor, shape, C-contiguous and aligned; exact Python float/int/bool
for scalar parameters. For anything else (a subclass, another dtype or shape, a strided view, a wrong argument
count, an int outside its range) it returns `MISS` and the caller takes its slow path, which raises today's
errors by construction.

>>> table = Table([spec])             # doctest: +SKIP
>>> fast = table.entry()              # doctest: +SKIP
>>> r = fast(a, b)                    # doctest: +SKIP
>>> r is MISS                         # doctest: +SKIP
False
"""
from __future__ import annotations

import ctypes
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import llvmlite.binding as llvm
import numpy as np

from jitop.codegen.loader import load_object
from jitop.codegen.target import compile_ir
from jitop.runtime import copy_in, dimprog, dimprog_ir, entry_ir, entry_words, ir_words
from jitop.runtime.copy_in import CopyIn, section
from jitop.runtime.entry_ir import PY_API, entry_module
from jitop.runtime.entry_words import (
    ALIGNED, C_CONTIGUOUS, GIL_FROM_PROGRAM, IN_ARRAY, IN_BOOL, IN_CONST, IN_FLOAT, IN_INT, IN_SIZE, MAX_PARAMS,
    OFFSETS, R_ARRAY, R_POST, R_SCALAR, RELEASE_GIL_BYTES, S_CALLS, S_GIL, S_NIN, S_NOUT, S_NSYM, S_OUTREC, S_PROG,
    S_RECORDS, T_ARRAY, T_BOOL, T_EMPTY, T_FLOAT, T_HITS, T_LONG, T_NEW, T_NSPECS, T_SENTINEL, T_SPECS, T_TRUE,
    WRITEABLE)
from jitop.runtime.object_key import NoStore, object_key
from jitop.target import Target

__all__ = ["MISS", "MAX_PARAMS", "RELEASE_GIL_BYTES", "Output", "Scalar", "Array", "Const", "CopyIn", "Spec", "Table",
           "available", "use_object_store"]


class _Miss:
    """The value a fast entry returns when it does not handle the call: take the slow path."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "jitop.runtime.fastcall.MISS"


MISS = _Miss()
ENABLED = True                # False: `available()` says no (tests compare against the slow path)
_OFF = OFFSETS                # the C layouts the entry reads, verified by `_layout_ok` before any use
METH_FASTCALL = 0x80
_NEW_FROM_DESCR, _ARRAY_TYPE = 94, 2   # slots of numpy's C API table (__multiarray_api.h)


# ** loading (once per process) **
class _MethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p), ("ml_flags", ctypes.c_int),
                ("ml_doc", ctypes.c_char_p)]


_object_store: Callable[[], Any] = NoStore
_lock = threading.Lock()
_state: dict[str, Any] | None = None   # the loaded entry; {} when unavailable
_store_missed = False                  # a caller that may not compile found no cached object code


def use_object_store(make_store: Callable[[], Any]) -> None:
    """Where the entry keeps its object code between processes: `make_store()` (called when the entry is first
    needed) returns anything with get(key) -> bytes | None, put(key, bytes) and delete(key)."""
    global _object_store
    _object_store = make_store


def available(compile: bool = True) -> bool:
    """Whether the fast entry can be used in this process: the object layouts and numpy's C API it relies on
    check out against live objects (otherwise every call takes the slow path).

    compile=False: only if its object code is loaded already or in the object store (a process that only
    loads saved kernels never runs LLVM, not even for the entry).
    """
    return ENABLED and bool(_loaded(compile))


def _loaded(compile: bool = True) -> dict[str, Any]:
    global _state, _store_missed
    if _state is None and (compile or not _store_missed):
        with _lock:
            if _state is None:
                api = _numpy_api() if _layout_ok() else None
                loaded = _load_entry(api, compile) if api is not None else {}
                if loaded is None:
                    _store_missed = True  # not now: a later caller that may compile will
                    return {}
                _state = loaded
    return _state or {}


def _load_entry(api: tuple[int, int], compile: bool) -> dict[str, Any] | None:
    """The loaded entry; None if its object code is not cached and `compile` is False. A cached object that
    does not load (not an object file, or one without the entry's symbol: another component's) is a miss and is
    removed (the cache never makes a call fail, nor leaves the entry unavailable from one process to the next):
    compiled again if allowed, else None (a later caller that may compile builds and stores it)."""
    # (the modules its IR is generated from: a process that loads the stored entry never generates it, ~15 ms)
    key = object_key("fastcall", [sys.modules[__name__], entry_ir, entry_words, copy_in, dimprog, dimprog_ir,
                                  ir_words])
    store = _object_store()
    obj = store.get(key)
    if obj is not None:
        try:
            return _load(api, obj)
        except (ValueError, RuntimeError):
            getattr(store, "delete", lambda _: None)(key)
    if not compile:
        return None
    _, obj = compile_ir(str(entry_module()), Target.host())
    loaded = _load(api, obj)
    store.put(key, obj)
    return loaded


def _pyapi(name: str, restype: Any, *argtypes: Any) -> Any:
    """A private prototype of a C API function (ctypes.pythonapi's own are shared with other code): called with
    the GIL held; an exception it sets is raised."""
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


def _load(api: tuple[int, int], obj: bytes) -> dict[str, Any]:
    for name in PY_API:  # MCJIT resolves them through LLVM's table, which may not see the executable's
        llvm.add_symbol(name, ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value)
    addr = load_object(obj, ["jitop_fastcall"])["jitop_fastcall"]
    method = _MethodDef(b"jitop_fast_entry", addr, METH_FASTCALL, None)  # outlives every built-in made from it
    new = _pyapi("PyCFunction_NewEx", ctypes.py_object, ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p)
    return {"method": method, "new": new, "new_from_descr": api[0], "array_type": api[1], "empty": ()}


def _layout_ok() -> bool:
    """Whether the struct offsets the entry reads hold in this process (checked on live objects)."""
    try:
        return _check_layout()
    except (ValueError, OverflowError, AttributeError, TypeError):
        return False


def _check_layout() -> bool:
    if sys.maxsize != 2 ** 63 - 1:
        return False
    word = lambda obj, off: ctypes.c_ssize_t.from_address(id(obj) + off).value  # noqa: E731
    i32 = lambda obj, off: ctypes.c_int32.from_address(id(obj) + off).value     # noqa: E731
    base = np.arange(24.0).reshape(4, 6)
    views = [base, base[:, ::2], base[::-1], base.T, np.zeros((), np.float32), np.ones(3, np.int8)]
    ro = np.ones(5)
    ro.flags.writeable = False
    views.append(ro)
    views.append(np.frombuffer(bytearray(17), np.uint8)[1:].view(np.int32)[:3])  # misaligned
    for a in views:
        nd = a.ndim
        dims = ctypes.cast(word(a, _OFF["dimensions"]), ctypes.POINTER(ctypes.c_ssize_t))
        strides = ctypes.cast(word(a, _OFF["strides"]), ctypes.POINTER(ctypes.c_ssize_t))
        flags = i32(a, _OFF["flags"])
        ok = (word(a, _OFF["ob_type"]) == id(np.ndarray) and word(a, _OFF["data"]) == a.ctypes.data
              and i32(a, _OFF["nd"]) == nd and tuple(dims[k] for k in range(nd)) == a.shape
              and tuple(strides[k] for k in range(nd)) == a.strides
              and word(a, _OFF["base"]) == (0 if a.base is None else id(a.base))
              and word(a, _OFF["descr"]) == id(a.dtype)
              and bool(flags & C_CONTIGUOUS) == a.flags.c_contiguous and bool(flags & ALIGNED) == a.flags.aligned
              and bool(flags & WRITEABLE) == a.flags.writeable)
        if not ok:
            return False
    probe, held = object(), []
    counts = []
    for _ in range(3):  # the field moves with sys.getrefcount, one per reference taken
        counts.append((word(probe, _OFF["ob_refcnt"]), sys.getrefcount(probe)))
        held.append(probe)
    if not all(r - counts[0][0] == k and g - counts[0][1] == k for k, (r, g) in enumerate(counts)) \
            or not 0 < counts[0][0] <= counts[0][1] or word(1.5, _OFF["ob_type"]) != id(float):
        return False
    words = _words_type(2)()
    return word(words, _OFF["b_ptr"]) == ctypes.addressof(words)


def _numpy_api() -> tuple[int, int] | None:
    """(PyArray_NewFromDescr, &PyArray_Type) from numpy's C API table, after checking both on live objects;
    None if they do not check out."""
    try:
        from numpy._core import _multiarray_umath as mu
    except ImportError:  # numpy 1.x
        from numpy.core import _multiarray_umath as mu  # type: ignore[no-redef]
    get_name = _pyapi("PyCapsule_GetName", ctypes.c_char_p, ctypes.py_object)
    get_pointer = _pyapi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
    capsule = getattr(mu, "_ARRAY_API", None)
    if capsule is None or type(capsule).__name__ != "PyCapsule":
        return None
    table = get_pointer(capsule, get_name(capsule))
    if not table:
        return None
    slots = (ctypes.c_void_p * (_NEW_FROM_DESCR + 1)).from_address(table)
    if slots[_ARRAY_TYPE] != id(np.ndarray):
        return None
    new_from_descr = slots[_NEW_FROM_DESCR]
    return (new_from_descr, id(np.ndarray)) if _new_from_descr_ok(new_from_descr) else None


def _new_from_descr_ok(address: int) -> bool:
    """Whether `address` behaves as PyArray_NewFromDescr(&PyArray_Type, descr, nd, dims, NULL, NULL, 0, NULL)."""
    fn = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.py_object, ctypes.c_int,
                           ctypes.POINTER(ctypes.c_ssize_t), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                           ctypes.c_void_p)(address)
    incref = _pyapi("Py_IncRef", None, ctypes.py_object)
    for dt, shape in ((np.dtype(np.float32), (2, 3)), (np.dtype(np.int16), ()), (np.dtype(np.float64), (0, 4))):
        incref(dt)  # the function steals a reference to the descriptor
        a = fn(id(np.ndarray), dt, len(shape), (ctypes.c_ssize_t * max(1, len(shape)))(*shape), None, None, 0, None)
        if not (type(a) is np.ndarray and a.dtype is dt and a.shape == shape and a.flags.c_contiguous
                and a.flags.writeable and a.flags.aligned and a.base is None and sys.getrefcount(a) == 2):
            return False
    return True


# ** specs: plain data the entry reads **
Dim = int | str  # a dimension: an int, or (a signature with symbols) its printed expression over them


@dataclass(frozen=True)
class Array:
    """Input: argument `position`, an exact ndarray of `dtype` (the native descriptor) and `shape` (a symbolic
    spec's dims may be expressions of its symbols: "n", "n * 2")."""

    position: int
    dtype: np.dtype
    shape: tuple[Dim, ...]


@dataclass(frozen=True)
class Scalar:
    """Input: argument `position`, an exact Python `kind` (float, int or bool), as a 0-d float64/int64/bool;
    an int must lie in [lo, hi]. `symbol`: the spec's symbol whose value the int is (a Python int used as a
    size; it binds the symbol as an input's dim does)."""

    position: int
    kind: type
    lo: int = -2 ** 63
    hi: int = 2 ** 63 - 1
    symbol: str | None = None


@dataclass(frozen=True)
class Const:
    """Input: a constant array (C-contiguous and aligned), passed as is."""

    array: np.ndarray


@dataclass(frozen=True)
class Output:
    """A freshly allocated output of `shape` (dims as Array's); `recycle`: reuse the previous call's array when
    nothing else holds it (and, for a symbolic spec, it has the new shape)."""

    dtype: np.dtype
    shape: tuple[Dim, ...]
    recycle: bool = False


class Spec:
    """One compiled signature as the entry reads it: nargs exact positional arguments, `inputs` then
    `outputs` as the kernel's parameters, and the result: output `result` (an int), that 0-d output as a
    numpy scalar (`("scalar", k)`), or `post(*outputs)` (a callable).

    A kernel with `symbols` (its symbol names, in the order of its i64[k] last argument) has symbolic dims:
    the entry reads each symbol from the first input dim that is exactly its name, checks every other symbolic
    input dim and the `guards` ("n >= 2", "m != 1"), computes the output dims, and misses (the slow path runs)
    when any check fails (jitop.runtime.dimprog).

    `copies`: regions copied into arguments before or after the kernel (jitop.runtime.copy_in.CopyIn; the
    arrays they involve have int dims).

    >>> spec = Spec(2, address, [Array(0, f4, (10,)), Array(1, f4, (10,))], [Output(f4, (10,))], 0)  # doctest: +SKIP
    >>> spec = Spec(2, address, [Array(0, f4, ("n",)), Array(1, f4, ("n",))], [Output(f4, ("n",))], 0,
    ...             symbols=["n"], guards=["n >= 2"])                                                # doctest: +SKIP
    """

    def __init__(self, nargs: int, kernel_address: int, inputs: Sequence[Array | Scalar | Const],
                 outputs: Sequence[Output], result: int | tuple[str, int] | Callable[..., Any],
                 error_flag: int = 0, raise_error: Callable[[], None] | None = None, release_gil: bool | None = None,
                 symbols: Sequence[str] = (), guards: Sequence[str] = (), copies: Sequence[CopyIn] = ()):
        if len(inputs) + len(outputs) + bool(symbols) > MAX_PARAMS or not 0 < len(inputs) + len(outputs):
            raise ValueError(f"a fast entry calls kernels of 1 to {MAX_PARAMS} parameters (the symbols count one)")
        plan = self._plan(inputs, outputs, symbols, guards)
        words = [0] * S_RECORDS
        self._keep: list[Any] = []  # every object a word points to
        in_dims = iter(plan.inputs) if plan else None
        for i in inputs:
            words += self._input(i, next(in_dims) if in_dims and isinstance(i, Array) else None, list(symbols))
        out_at = len(words)
        slots = []
        for k, o in enumerate(outputs):
            dt = _native(o.dtype)
            self._keep.append(dt)
            slots.append(len(words) + 3)
            words += [id(dt), len(o.shape), int(o.recycle), 0, *(plan.outputs[k] if plan else o.shape)]
        prog_at = len(words) if plan else 0
        words += plan.program if plan else []
        copies_at = len(words) if copies else 0
        words += self._copies(copies, inputs, outputs) if copies else []
        gil = GIL_FROM_PROGRAM if plan and release_gil is None else \
            int(_nbytes(inputs, outputs) >= RELEASE_GIL_BYTES if release_gil is None else release_gil)
        words[:S_RECORDS] = self._head(nargs, inputs, outputs, kernel_address, gil, error_flag, raise_error,
                                       result, out_at) + [len(symbols), prog_at, copies_at]
        self.words = (ctypes.c_int64 * len(words))(*words)
        self.address = ctypes.addressof(self.words)
        self.nargs = nargs
        self.symbols = list(symbols)
        # the spare outputs are strong references held in the words: dropped with the spec
        weakref.finalize(self, _drop_spares, self.words, slots)

    @staticmethod
    def _copies(copies: Sequence[CopyIn], inputs: Sequence[Array | Scalar | Const],
                outputs: Sequence[Output]) -> list[int]:
        """The words of the regions copied into arguments (jitop.runtime.copy_in.section: ValueError where an
        array a copy involves has a symbolic dim)."""
        info = [("array", i.position, _native(i.dtype), i.shape) if isinstance(i, Array) else
                ("int", i.position) if isinstance(i, Scalar) and i.kind is int else ("other",) for i in inputs]
        return section(copies, info, [(_native(o.dtype), o.shape) for o in outputs])

    @staticmethod
    def _plan(inputs: Sequence[Array | Scalar | Const], outputs: Sequence[Output], symbols: Sequence[str],
              guards: Sequence[str]) -> "dimprog.DimPlan | None":
        """A symbolic spec's dim words and program (None for a static spec, whose dims must all be ints)."""
        arrays = [i for i in inputs if isinstance(i, Array)]
        if not symbols:
            if guards or any(isinstance(d, str) for a in [*arrays, *outputs] for d in a.shape):
                raise ValueError("a spec without symbols has int dims and no guards (give its symbols)")
            return None
        sized = [(_native(a.dtype).itemsize, a.shape) for a in [*arrays, *outputs]]
        const = sum(i.array.nbytes if isinstance(i, Const) else 8 for i in inputs if not isinstance(i, Array))
        held = [i.symbol for i in inputs if isinstance(i, Scalar) and i.symbol is not None]
        return dimprog.plan_dims(symbols, [a.shape for a in arrays], [o.shape for o in outputs], guards,
                                 sized, const, held)

    def _head(self, nargs: int, inputs: Sequence[Any], outputs: Sequence[Output], kernel_address: int, gil: int,
              error_flag: int, raise_error: Callable[[], None] | None,
              result: int | tuple[str, int] | Callable[..., Any], out_at: int) -> list[int]:
        """The spec's words up to S_NSYM."""
        kind, slot, post = (R_ARRAY, result, None) if isinstance(result, int) else \
            (R_SCALAR, result[1], None) if isinstance(result, tuple) else (R_POST, 0, result)
        if kind != R_POST and not 0 <= slot < len(outputs):
            raise ValueError(f"result slot {slot} is not one of the {len(outputs)} outputs")
        if error_flag and raise_error is None:
            raise ValueError("a kernel with an error flag needs the function that raises its error")
        self._keep += [post, raise_error]
        return [nargs, len(inputs), len(outputs), kernel_address, gil, error_flag,
                id(raise_error) if error_flag else 0, kind, slot, id(post) if post is not None else 0, out_at, 0]

    def _input(self, i: Array | Scalar | Const, dim_words: list[int] | None = None,
               symbols: Sequence[str] = ()) -> list[int]:
        if isinstance(i, Array):
            dt = _native(i.dtype)
            self._keep.append(dt)
            return [IN_ARRAY, i.position, id(dt), len(i.shape), *(i.shape if dim_words is None else dim_words)]
        if isinstance(i, Const):
            a = i.array
            if not (type(a) is np.ndarray and a.flags.c_contiguous and a.flags.aligned):
                raise ValueError("a constant input must be a C-contiguous, aligned ndarray")
            self._keep.append(a)
            return [IN_CONST, a.ctypes.data, 0, 0]
        kind = {float: IN_FLOAT, int: IN_INT, bool: IN_BOOL}.get(i.kind)
        if kind is None:
            raise ValueError(f"a scalar input must be a Python float, int or bool, not {i.kind.__name__}")
        words = [kind, i.position, max(i.lo, -2 ** 63), min(i.hi, 2 ** 63 - 1)]
        if i.symbol is None:
            return words
        if i.kind is not int or i.symbol not in symbols:
            raise ValueError(f"scalar input {i.position} holds symbol {i.symbol!r}: an int, and one of {symbols}")
        return [IN_SIZE, *words[1:], symbols.index(i.symbol)]

    @property
    def calls(self) -> int:
        """Calls the native entry served with this signature."""
        return int(self.words[S_CALLS])

    def spares(self) -> list[Any]:
        """The recycled outputs the spec holds (for tests)."""
        n_out, at = self.words[S_NOUT], self.words[S_OUTREC]
        found = []
        for _ in range(n_out):
            if self.words[at + 3]:
                found.append(ctypes.cast(self.words[at + 3], ctypes.py_object).value)
            at += 4 + self.words[at + 1]
        return found


def _drop_spares(words: Any, slots: list[int]) -> None:
    decref = _pyapi("Py_DecRef", None, ctypes.c_void_p)
    for s in slots:
        obj, words[s] = words[s], 0
        if obj:
            decref(obj)


def _native(dtype: Any) -> np.dtype:
    """numpy's own descriptor for a native numeric dtype: the one arrays of that dtype normally carry."""
    given = np.dtype(dtype)
    dt = np.dtype(given.name)
    if given != dt or dt.kind not in "biuf" or np.empty(0, dt).dtype is not dt:
        raise ValueError(f"dtype {dtype} has no canonical native descriptor")
    return dt


def _nbytes(inputs: Sequence[Array | Scalar | Const], outputs: Sequence[Output]) -> int:
    """The bytes a static signature's call touches (the GIL is released from RELEASE_GIL_BYTES)."""
    n = sum(i.array.nbytes if isinstance(i, Const) else
            _native(i.dtype).itemsize * _prod(i.shape) if isinstance(i, Array) else 8 for i in inputs)
    return n + sum(_native(o.dtype).itemsize * _prod(o.shape) for o in outputs)


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class Table:
    """The signatures one fast entry serves, tried in order. `entry()` is the built-in function: call it with
    the positional arguments; it returns the result, or MISS. `hits` counts the calls it served.

    >>> fast = Table([spec]).entry()     # doctest: +SKIP
    """

    def __init__(self, specs: Sequence[Spec], hits: ctypes.c_int64 | None = None):
        state = _loaded()
        if not state:
            raise RuntimeError("the fast entry is not available in this process (see available())")
        self.specs = list(specs)
        self.hits = hits if hits is not None else ctypes.c_int64(0)
        head = [0] * T_SPECS
        head[T_NSPECS], head[T_SENTINEL], head[T_HITS] = len(self.specs), id(MISS), ctypes.addressof(self.hits)
        head[T_NEW], head[T_ARRAY], head[T_EMPTY] = state["new_from_descr"], state["array_type"], id(state["empty"])
        head[T_FLOAT], head[T_LONG], head[T_BOOL], head[T_TRUE] = id(float), id(int), id(bool), id(True)
        words = [*head, *(s.address for s in self.specs)]
        mem = _words_type(len(words))(*words)
        mem.keep = (self.specs, self.hits, state["method"])  # the built-in holds `mem`; `mem` holds the rest
        self._entry = state["new"](ctypes.addressof(state["method"]), mem, None)

    def entry(self) -> Callable[..., Any]:
        """The built-in function: fast(*args) -> the result, or MISS."""
        return self._entry


_word_types: dict[int, type] = {}


def _words_type(n: int) -> type:
    """An int64 array type of n words whose instances have a __dict__: a Table's memory (the entry's `self`)
    keeps what its words point to alive there."""
    t = _word_types.get(n)
    if t is None:
        t = _word_types[n] = type(f"_Words{n}", (ctypes.Array,), {"_type_": ctypes.c_int64, "_length_": n})
    return t
