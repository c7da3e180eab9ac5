"""A compiled, loaded kernel: call it with numpy arrays; save/load it without running LLVM again."""
from __future__ import annotations

import ctypes
import io
import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from typing import Any, Sequence

import numpy as np

from jitop.runtime import fastcall
from jitop.runtime.args import (SYMBOL_LIMITS, ParamSpec, ShapeBinder, SymbolSpec, check_array, check_no_overlap,
                                check_symbols)
from jitop.target import Target

# errors a kernel reports about values (codegen.kernel.RAISE_IF), by the name its error entry starts with
_VALUE_ERRORS = {"ValueError": ValueError, "OverflowError": OverflowError, "ZeroDivisionError": ZeroDivisionError,
                 "MemoryError": MemoryError, "IndexError": IndexError}
FORMAT_VERSION = 3  # 2: meta['target'] is a jitop Target; 3: the object code carries its signature


def flagged_error(name: str, checked: Sequence[str], code: int) -> Exception:
    """The error a kernel's flag `code` stands for: a value numpy/Python refuses (codegen.kernel.RAISE_IF: the
    entry names its type) or an access out of bounds (skipped; `checked` holds the entries, the code is 1-based)."""
    what = checked[code - 1] if 0 < code <= len(checked) else f"access (check #{code})"
    kind, _, message = what.partition(": ")
    if kind in _VALUE_ERRORS:
        return _VALUE_ERRORS[kind](message)
    return IndexError(f"{name}: out-of-bounds {what}; the access was skipped, the outputs are incomplete. Check "
                      "the compute's index expressions against the shapes")


def signature_json(params: list[dict], symbols: list[dict] | None = None) -> str:
    """The canonical JSON of a kernel's parameter specs (`ParamSpec.to_json()` each, as in meta["params"])
    and, for a kernel with symbolic shapes, its symbols (`SymbolSpec.to_json()` each, as in meta["symbols"]):
    what its object code carries as `<symbol>_signature` (KernelCodegen emits it) and what the metadata
    must still say when the code is loaded. A kernel without symbols signs its params alone, as before."""
    signed: object = {"params": params, "symbols": symbols} if symbols else params
    return json.dumps(signed, sort_keys=True, separators=(",", ":"))


def _data_offset_ok() -> bool:
    """Whether numpy's array struct keeps the data pointer where the generated trampolines read it."""
    global _OFFSET_OK
    if _OFFSET_OK is None:
        from jitop.codegen.kernel import ARRAY_DATA_OFFSET
        probe = np.arange(3.0)
        ptr = ctypes.c_void_p.from_address(id(probe) + ARRAY_DATA_OFFSET).value
        _OFFSET_OK = ptr == probe.ctypes.data
    return _OFFSET_OK


def _dims_offset_ok() -> bool:
    """Whether numpy's array struct keeps the dimensions pointer where a symbolic kernel's trampoline reads it."""
    global _DIMS_OK
    if _DIMS_OK is None:
        from jitop.codegen.kernel import ARRAY_DIMS_OFFSET
        probe = np.zeros((3, 5, 7))
        dims = ctypes.c_void_p.from_address(id(probe) + ARRAY_DIMS_OFFSET).value
        _DIMS_OK = bool(dims) and list((ctypes.c_int64 * 3).from_address(dims)) == [3, 5, 7]
    return _DIMS_OK


_OFFSET_OK: bool | None = None
_DIMS_OK: bool | None = None


class Module:
    """A callable compiled function. Call with one array per parameter (inputs, then outputs),
    or with the inputs only to get freshly allocated outputs back.

    >>> f = jitop.build(s, [A, B])          # doctest: +SKIP
    >>> f(a, b)                              # doctest: +SKIP
    >>> b = f(a)                             # doctest: +SKIP
    """

    def __init__(self, meta: dict, object_code: bytes, ll: str | None = None):
        self.meta, self.object_code, self._ll = meta, object_code, ll
        self.params = [ParamSpec.from_json(p) for p in meta["params"]]
        self.symbols = [SymbolSpec.from_json(s) for s in meta.get("symbols", [])]
        # a kernel with symbolic shapes: reads its symbols from the arguments and checks the other symbolic dims
        self.binder = ShapeBinder(self.params, self.symbols) if self.symbols else None
        self.n_inputs = sum(not p.is_output for p in self.params)
        self.target = Target.from_json(meta["target"])
        self.checked = meta.get("checked_accesses", [])
        self.runnable = not self.target.missing_on(Target.host())
        if self.runnable:  # code for a CPU this one does not cover is never linked in, let alone run
            self._load()
        else:
            self.call_arrays = self._refuse
            self._error = None
            self.address = 0
            self.profile_counters = None

    def _refuse(self, *_: Any) -> None:
        self.target.check_runs_on(what=f"kernel '{self.name}'")

    def _load(self) -> None:
        from jitop.codegen.loader import load_object, read_global
        meta, object_code, symbol = self.meta, self.object_code, self.meta["symbol"]
        # the object's own symbol names say whether it calls the pool (edited metadata cannot leave it unlinked)
        if meta.get("uses_parallel") or b"jitop_parallel_for" in object_code:
            from jitop.runtime.parallel import parallel_for_address
            parallel_for_address()  # links jitop_parallel_for before the object that calls it
        flag = [f"{symbol}_error"] if self.checked else []
        stages = meta.get("profile_stages") or []
        counters = [f"{symbol}_profile"] if stages else []
        try:
            addrs = load_object(object_code, [symbol, f"{symbol}_objects"], [*flag, *counters, f"{symbol}_signature"])
            signed = read_global(object_code, f"{symbol}_signature", addrs[f"{symbol}_signature"])
        except (RuntimeError, ValueError) as err:
            raise ValueError(f"kernel '{self.name}': its object code cannot be loaded ({err}); rebuild it") from None
        # linked, not yet run: the code must index its buffers as the metadata's parameters describe them
        ours = signature_json(self.meta["params"], self.meta.get("symbols"))
        if signed != ours.encode() + b"\0":
            raise ValueError(f"kernel '{self.name}': object code and metadata disagree about its parameters: the "
                             f"code was compiled for {signed.rstrip(bytes(1)).decode('utf-8', 'replace')[:2000]}, "
                             f"the metadata says {ours[:2000]}; the file was edited or mixed up, rebuild it")
        n = len(self.params)
        self.address = addrs[symbol]  # the kernel itself: void kernel(void *param0, ...) (jitop.runtime.fastcall)
        # a kernel with symbols takes one more pointer: to an int64 array of their values
        self._cfunc = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * (n + bool(self.symbols)))(addrs[meta["symbol"]])
        # fast entry taking the arrays themselves (only for arrays already checked by the caller; a symbolic
        # kernel's reads the symbols from the arrays' dimensions)
        fast = _data_offset_ok() and (not self.symbols or _dims_offset_ok())
        self.call_arrays = (ctypes.CFUNCTYPE(None, *[ctypes.py_object] * n)(addrs[f"{meta['symbol']}_objects"])
                            if fast else self._call_pointers)
        self._error = ctypes.c_int32.from_address(addrs[flag[0]]) if flag else None
        # a profiling build: cycle-counter ticks spent in each top-level loop nest, summed over calls
        self.profile_counters = (ctypes.c_uint64 * len(stages)).from_address(addrs[counters[0]]) if stages else None

    def _call_pointers(self, *arrays: np.ndarray) -> None:
        ptrs = [a.ctypes.data for a in arrays]
        if self.binder is None:
            return self._cfunc(*ptrs)
        values = self.binder.values(arrays)
        self._cfunc(*ptrs, (ctypes.c_int64 * len(values))(*values))

    @property
    def name(self) -> str:
        return self.meta["name"]

    # whether the first call may compile the native entry if its object code is not cached (load_module: no, a
    # process that only loads saved kernels never runs LLVM)
    _entry_may_compile = True
    _fast: tuple[int, Any, Any, Any] | None = None  # see _fast_entries

    def __call__(self, *arrays: Any) -> Any:
        fast = self._fast or self._fast_entries()
        n = len(arrays)
        if n == fast[0]:  # outputs given: the entry checks what it can; writeable and apart from the others here
            if fast[2](arrays) and fast[1](*arrays) is not fastcall.MISS:
                return None
        elif n == self.n_inputs:
            r = fast[3](*arrays)
            if r is not fastcall.MISS:
                return r
        # the Python path: anything the native entry does not serve, and every error
        if len(arrays) == self.n_inputs and self.n_inputs < len(self.params):
            shapes = self._output_shapes(arrays)
            given = iter(arrays)
            full = [np.empty(shapes[k], p.dtype) if p.is_output else next(given) for k, p in enumerate(self.params)]
            self._run(full)
            outs = [a for a, p in zip(full, self.params) if p.is_output]
            return outs[0] if len(outs) == 1 else tuple(outs)
        self._run(list(arrays))
        return None

    def _fast_entries(self) -> tuple[int, Any, Any, Any]:
        """(number of parameters, native entry taking every array, precheck of that entry's outputs, native entry
        taking the inputs and allocating the outputs), built on the first call; an entry that cannot serve this
        kernel (unavailable, too many parameters) always misses and the Python path runs."""
        try:
            given, fresh = self._fast_specs()
        except ValueError:  # something the entry cannot express
            given = fresh = None
        fast = (len(self.params),
                fastcall.Table([given]).entry() if given is not None else _always_miss, _outputs_apart(self.params),
                fastcall.Table([fresh]).entry() if fresh is not None else _always_miss)
        self._fast = fast
        return fast

    def _fast_specs(self) -> tuple["fastcall.Spec | None", "fastcall.Spec | None"]:
        """This kernel's signatures for the native entry (jitop.runtime.fastcall): every array given (the result
        None), and the inputs only (the outputs allocated, returned as `__call__` returns them)."""
        if not (self.runnable and self.address and fastcall.available(self._entry_may_compile)):
            return None, None
        flag = self.error_flag_address()
        if self.checked and not flag:
            return None, None
        common = dict(error_flag=flag, raise_error=self.raise_if_error if flag else None,
                      symbols=[s.name for s in self.symbols],
                      guards=[f"{s.name} <= {SYMBOL_LIMITS[s.dtype]}" for s in self.symbols])
        n = len(self.params)
        given = fastcall.Spec(n, self.address, [fastcall.Array(k, p.dtype, p.shape) for k, p in enumerate(self.params)],
                              [], _none, **common)
        ins, outs = [p for p in self.params if not p.is_output], [p for p in self.params if p.is_output]
        if not outs or [p.is_output for p in self.params] != [False] * len(ins) + [True] * len(outs):
            return given, None  # the entry passes inputs, then outputs
        fresh = fastcall.Spec(len(ins), self.address, [fastcall.Array(k, p.dtype, p.shape) for k, p in enumerate(ins)],
                              [fastcall.Output(p.dtype, p.shape) for p in outs], 0 if len(outs) == 1 else _tuple,
                              **common)
        return given, fresh

    def _output_shapes(self, inputs: tuple) -> list[tuple]:
        """Each parameter's shape, for allocating the outputs: a symbolic kernel's from its inputs' symbols."""
        if self.binder is None:
            return [p.shape for p in self.params]
        for k, (p, a) in enumerate(zip(self.params, inputs)):
            check_array(p, k, a)
        values = self.binder.bind(inputs)
        return [self.binder.shape(k, values) if p.is_output else () for k, p in enumerate(self.params)]

    def _run(self, arrays: list) -> None:
        if not self.runnable:
            self._refuse()
        if len(arrays) != len(self.params):
            sig = ", ".join(p.name for p in self.params)
            raise TypeError(f"{self.name}({sig}) takes {len(self.params)} arrays (or the {self.n_inputs} inputs), "
                            f"got {len(arrays)}")
        ptrs = [check_array(p, k, a) for k, (p, a) in enumerate(zip(self.params, arrays))]
        symbols = None
        if self.binder is not None:
            values = self.binder.bind(arrays)
            symbols = (ctypes.c_int64 * len(values))(*values)  # alive until the call returns
            ptrs.append(ctypes.addressof(symbols))
        check_no_overlap(self.params, arrays)
        self._cfunc(*ptrs)
        self.raise_if_error()

    def error_flag_address(self) -> int:
        """Address of the int32 a run-time bounds check sets (0: the kernel has none); `raise_if_error` reads it."""
        flag = self._error
        return ctypes.addressof(flag) if isinstance(flag, ctypes.c_int32) else 0

    def raise_if_error(self) -> None:
        """Raise the IndexError a run-time bounds check recorded during the last call, if any."""
        if self._error is not None and self._error.value:
            code, self._error.value = self._error.value, 0
            raise flagged_error(self.name, self.checked, code)

    def get_source(self, fmt: str = "ll") -> str:
        """The optimised LLVM IR ("ll") or the machine code as assembly ("asm")."""
        if fmt not in ("ll", "asm"):
            raise ValueError(f"get_source: fmt must be 'll' or 'asm', got {fmt!r}")
        if self._ll is None:
            raise ValueError("this module was loaded without its LLVM IR; rebuild it to see the source")
        if fmt == "ll":
            return self._ll
        from jitop.codegen.target import emit_assembly
        return emit_assembly(self._ll, self.target)

    def save(self, path: str | os.PathLike) -> None:
        """Write object code + metadata (+ LLVM IR) to one file; jitop.load_module reads it back."""
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            z.writestr("meta.json", json.dumps({**self.meta, "format": FORMAT_VERSION}))
            z.writestr("kernel.o", self.object_code)
            if self._ll is not None:
                z.writestr("kernel.ll", self._ll)
        tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(buf.getvalue())
        os.replace(tmp, path)

    def export_library(self, path: str | os.PathLike) -> None:
        """Link the kernel (and the thread pool it calls, if parallel) into a shared library with the system linker."""
        linker = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if linker is None:
            raise RuntimeError("export_library needs a system linker (cc/gcc/clang) on PATH; use save() instead")
        with tempfile.TemporaryDirectory() as d:
            objs = [os.path.join(d, "kernel.o")]
            with open(objs[0], "wb") as f:
                f.write(self.object_code)
            if self.meta.get("uses_parallel"):
                from jitop.runtime.parallel import pool_object_code
                objs.append(os.path.join(d, "pool.o"))
                with open(objs[1], "wb") as f:
                    f.write(pool_object_code())
            subprocess.run([linker, "-shared", "-o", os.fspath(path), *objs, "-lm", "-lpthread"], check=True,
                           capture_output=True)

    def __repr__(self) -> str:
        sig = ", ".join(f"{p.name}: {p.describe()}" for p in self.params)
        return f"<jitop.Module {self.name}({sig})>"


def _always_miss(*_: Any) -> Any:
    return fastcall.MISS


def _none(*_: Any) -> None:
    return None


def _tuple(*outputs: np.ndarray) -> tuple:
    return outputs


def _outputs_apart(params: list[ParamSpec]) -> Any:
    """check(arrays): whether every output is an exact, writeable ndarray that may not share memory with any other
    argument (numpy's bounds test; where it may, the Python path's exact check decides) and the others are exact
    ndarrays. The native entry checks the rest (dtype, shape, contiguity, alignment) before it calls the kernel."""
    n, outs = len(params), [k for k, p in enumerate(params) if p.is_output]
    tests = [f"type(a{k}) is nd" for k in range(n)] + [f"a{k}.flags.writeable" for k in outs] + \
        [f"not may_share(a{k}, a{j})" for k in outs for j in range(n) if j != k]
    names = ", ".join(f"a{k}" for k in range(n))
    env = {"nd": np.ndarray, "may_share": np.may_share_memory}
    # unrolled (a loop over the arrays costs as much again); the source holds indices only
    exec(f"def check(arrays):\n    {names}, = arrays\n    return {' and '.join(tests)}", env)  # noqa: S102
    return env["check"]


def load_module(path: str | os.PathLike) -> Module:
    """Load a module written by Module.save (no LLVM optimisation or code generation runs).

    Raises `jitop.TargetMismatchError` (and runs nothing) if the module was built for a CPU whose
    features this machine lacks, and ValueError for a file that is not a well-formed module.

    Trust: the file holds native code, so loading it is like loading a shared library: only load
    modules from a trusted source. The checks (the object code is a well-formed x86-64 ELF object, its
    embedded parameter signature equals the metadata, the target runs here) protect against corruption
    and version skew, not against a malicious author.

    >>> f = jitop.load_module("kernel.jitop")   # doctest: +SKIP
    """
    try:
        with zipfile.ZipFile(path) as z:
            meta = json.loads(z.read("meta.json"))
            if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
                found = meta.get("format") if isinstance(meta, dict) else None
                raise ValueError(f"{path}: saved by an incompatible jitop (format {found}, "
                                 f"expected {FORMAT_VERSION}); rebuild and save it again")
            if not isinstance(meta.get("target"), dict) or "features" not in meta["target"]:
                raise ValueError(f"{path}: saved without a jitop Target (an older jitop); rebuild and save it again")
            target = Target.from_json(meta["target"])
            check_meta(meta, f"{path}: ")
            ll = z.read("kernel.ll").decode() if "kernel.ll" in z.namelist() else None
            object_code = z.read("kernel.o")
    except (zipfile.BadZipFile, KeyError, TypeError, AttributeError, UnicodeDecodeError, RecursionError) as err:
        raise ValueError(f"{path}: not a well-formed jitop module ({type(err).__name__}: {err})") from None
    target.check_runs_on(what=f"{os.fspath(path)}")
    module = Module(meta, object_code, ll)
    module._entry_may_compile = False  # loading saved code never runs LLVM, not even for the native entry
    return module


def check_meta(meta: dict, where: str = "") -> None:
    """Raise ValueError unless saved metadata's names and parameters have the types a Module uses
    (KeyError/TypeError for a parameter missing a field or with an unreadable dtype)."""
    if not (isinstance(meta.get("symbol"), str) and isinstance(meta.get("name"), str)):
        raise ValueError(f"{where}kernel symbol and name must be strings")
    checked = meta.get("checked_accesses", [])
    if not (isinstance(checked, list) and all(isinstance(c, str) for c in checked)):
        raise ValueError(f"{where}checked_accesses must be a list of strings")
    stages = meta.get("profile_stages", [])
    if not (isinstance(stages, list) and all(isinstance(c, str) for c in stages)):
        raise ValueError(f"{where}profile_stages must be a list of strings")
    params, symbols = meta.get("params"), meta.get("symbols", [])
    if not isinstance(params, list) or not isinstance(symbols, list):
        raise ValueError(f"{where}params and symbols must be lists")
    specs = []
    for p in params:
        spec = ParamSpec.from_json(p)
        if (not isinstance(spec.name, str) or type(spec.is_output) is not bool or spec.dtype.kind not in "biuf"
                or not spec.dtype.isnative or not all((type(d) is int and d >= 0) or type(d) is str for d in spec.shape)):
            raise ValueError(f"{where}malformed parameter {p!r}: expected a name, a native numeric dtype, "
                             "a shape of non-negative ints (or symbolic dims as strings) and a bool is_output")
        specs.append(spec)
    try:
        check_symbols(specs, [SymbolSpec.from_json(s) for s in symbols])
    except ValueError as err:
        raise ValueError(f"{where}malformed symbols: {err}") from None
