"""A compiled traced function: loaded object code + the Plan that turns call arguments into its arrays.

An Executable saves to plain bytes (JSON + object code + .npy constants in a checksummed zip, no
pickle) and loads back without LLVM's optimiser or code generator and without the tracer:

>>> blob = exe.to_bytes()                              # doctest: +SKIP
>>> Executable.from_bytes(blob).call([a, b])           # doctest: +SKIP

The function's result structure is data too (a JSON tree, see `rebuild`), so a loaded Executable
returns what the traced function returned.

A kernel with symbolic shapes (`Module.symbols`) has a symbolic Plan: its output dims are the printed
expressions of the kernel's output parameters ("n", "n * 2") and its `guards` are relations the symbols must
satisfy ("n >= 2"). Each call binds the symbols from the arguments' shapes, checks the tied dims and the guards
(a mismatch is a ValueError on the Python path, a MISS on the native entry) and allocates the outputs at the
bound sizes. A constant-shape Plan saves, loads and runs exactly as before.
"""
from __future__ import annotations

import ast
import hashlib
import io
import itertools
import json
import math
import operator
import struct
import sys
import zipfile
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from jitop.errors import TargetMismatchError
from jitop.runtime import fastcall
from jitop.runtime.args import SYMBOL_LIMITS, VALUE, Dim, DimFn, ParamSpec, compile_dim, dim_names, shape_str
from jitop.runtime.module import FORMAT_VERSION as MODULE_FORMAT
from jitop.runtime.module import Module, check_meta
from jitop.target import Target
from jitop.tir.storage import ALIGN

MAGIC = b"JITOPEXE"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sI32s")  # magic, format version, sha256 of the payload
_DTYPE_KINDS = "biufc"              # numbers only: never object, string, void or datetime arrays


@dataclass
class Plan:
    """How a call's arguments become the kernel's arrays, and its outputs the function's result."""

    # ("arg", pos) | ("arg_swapped", (pos, dtype)) | ("scalar", (pos, dtype[, int dtype names])) | ("const", array);
    # a scalar's dtype names: the integer dtypes a Python int argument must fit (NEP 50: else OverflowError)
    inputs: list[tuple[str, Any]]
    # each output's shape (a symbolic kernel's: the printed dims of its output parameter, "n * 2") and dtype
    outputs: list[tuple[tuple[Dim, ...], np.dtype]]
    result_slots: list[int]                  # flat function result k -> output array index
    n_scratch: int = 0                       # trailing output buffers that are only intermediates
    result: Any = None                       # result tree (see `rebuild`); None: the flat list of results
    # relations over the kernel's symbols every call must satisfy ("n >= 2", "n % 3 == 0", "n != m"):
    # comparisons of dim expressions joined by `and`
    guards: list[str] = field(default_factory=list)

    @property
    def symbolic(self) -> bool:
        """Whether any output dim is an expression of symbols, or the plan has guards."""
        return bool(self.guards) or any(isinstance(d, str) for shape, _ in self.outputs for d in shape)


_PLAN_RESULT = object()  # fast_spec's default result: the plan's


@dataclass
class Executable:
    """A compiled traced function: `call(values)` with the argument values of the original function
    returns its result; `exe(*values)` does the same after checking them against the compiled signature.

    >>> exe = Executable.from_bytes(blob)      # doctest: +SKIP
    >>> exe(np.ones(4, np.float32))            # doctest: +SKIP
    """

    module: Module
    plan: Plan
    groups: list[Any] = field(default_factory=list)     # fusion groups, for explain() (not saved)
    func: Any = None  # the lowered loop IR, for explain() (not saved)
    templates: list[str] = field(default_factory=list)  # operator templates and their configs, for explain() (not saved)
    decisions: list[str] = field(default_factory=list)  # other pipeline decisions, for explain() (not saved)

    def __post_init__(self) -> None:
        self._shapes: _SymbolicShapes | None = None
        if self.module.symbols or self.plan.symbolic:  # symbolic dims must be exactly the kernel's parameters'
            _check_outputs(self.plan, self.module.params)
            _check_guards(self.plan.guards, self.module.params, [s.name for s in self.module.symbols])
            self._shapes = _SymbolicShapes(self.plan, self.module)
        self.run = _specialised_runner(self.plan, self.module)
        self.set_result(self.plan.result)

    @property
    def symbolic(self) -> bool:
        """Whether one compiled kernel serves many shapes (symbolic dims, or guards on them)."""
        return bool(self.module.symbols or self.plan.guards)

    def set_result(self, tree: Any) -> None:
        """Make `call` return the structure `tree` describes (see `rebuild`); None: the flat list of results."""
        if tree is not None:
            _check_tree(tree, len(self.plan.result_slots), allow_objects=True)
        self.plan.result = tree
        self.call = self.run if tree is None else _specialised_runner(self.plan, self.module, tree)
        self._fast: Callable[..., Any] | None = None  # built on the first __call__, for this result

    def __call__(self, *values: Any) -> Any:
        """The function's result for these arguments, checked first (a mismatch raises, never crashes)."""
        fast = self._fast
        if fast is None:
            spec = self.fast_spec(compile=False)  # loading saved code never runs LLVM, not even for the entry
            fast = self._fast = fastcall.Table([spec]).entry() if spec is not None else _always_miss
        r = fast(*values)  # the native entry: exactly the signature's arrays, else MISS
        if r is not fastcall.MISS:
            return r
        _check_values(self.plan, self.module.params, values, self._shapes)
        return self.call(values)

    def accepts(self, values: Sequence[Any]) -> bool:
        """Whether `values` fit the compiled signature (for a symbolic kernel: ranks, constant dims, tied dims
        and guards): what a dispatcher asks before serving a new size with this executable."""
        try:
            _check_values(self.plan, self.module.params, values, self._shapes)
        except (TypeError, ValueError, OverflowError):
            return False
        return True

    def fast_spec(self, nargs: int | None = None, scalar_types: dict[int, type] | None = None,
                  compile: bool = True, copies: Sequence["fastcall.CopyIn"] = (),
                  result: Any = _PLAN_RESULT) -> "fastcall.Spec | None":
        """This executable's signature for the native entry (jitop.runtime.fastcall), or None if it has none
        (the entry is unavailable, or the plan converts arguments: byte-swapped or numpy-scalar inputs).

        nargs: the exact number of positional arguments, each of which the plan must use (a caller whose
        cache key covers every argument); default: up to the last one the plan uses.
        scalar_types: {position: float | int | bool}, the Python type each scalar argument must have (a caller
        whose key distinguishes them); default: the type whose natural dtype is the parameter's.
        compile: whether the entry may be compiled if its object code is not cached (see fastcall.available).
        copies: regions the entry copies into arguments before or after the kernel (jitop.runtime.copy_in).
        result: the structure the entry returns (as `set_result` takes it), if not the plan's.

        >>> fast = fastcall.Table([exe.fast_spec()]).entry()   # doctest: +SKIP
        """
        try:
            return _fast_spec(self.plan, self.module, nargs, scalar_types, compile, copies,
                              self.plan.result if result is _PLAN_RESULT else result)
        except ValueError:  # something the entry cannot express: the slow path serves it
            return None

    # ** bytes **
    def to_bytes(self, constants: bool = True) -> bytes:
        """Object code, metadata, LLVM IR (if kept), plan, constants and result tree as one blob.

        constants=False leaves out the constant arrays and the result tree: whoever loads the blob supplies
        them (`from_bytes(blob, constants=[...])`), as the dispatcher does from a fresh trace (a captured
        array is read where it lives now, not as it was when the blob was written).

        >>> Executable.from_bytes(exe.to_bytes())(a)   # doctest: +SKIP
        """
        plan_json, constants_list = _plan_to_json(self.plan, constants)
        try:
            ll = self.module.get_source("ll")
        except ValueError:
            ll = None
        files = {"plan.json": json.dumps(plan_json).encode(),
                 "meta.json": json.dumps({**self.module.meta, "format": MODULE_FORMAT}).encode(),
                 "kernel.o": self.module.object_code}
        if ll is not None:
            files["kernel.ll"] = ll.encode()
        for i, c in enumerate(constants_list):
            npy = io.BytesIO()
            np.save(npy, c, allow_pickle=False)
            files[f"const{i}.npy"] = npy.getvalue()
        payload = _zip(files)
        return _HEADER.pack(MAGIC, FORMAT_VERSION, hashlib.sha256(payload).digest()) + payload

    @staticmethod
    def from_bytes(data: bytes, constants: Sequence[np.ndarray] | None = None,
                   expect: Callable[[list[ParamSpec], Plan], None] | None = None) -> "Executable":
        """Load a blob written by `to_bytes`: no LLVM optimisation/codegen, no tracing.

        constants: the constant arrays, in order, of a blob written with `to_bytes(constants=False)` (each
        must have the shape and dtype the kernel was compiled for).
        expect: called with the blob's kernel parameters and plan (both checked against each other) before its
        object code is linked in; whatever it raises, nothing is loaded (the dispatcher refuses a blob built for
        another signature this way).

        Raises ValueError for a corrupt, truncated or incompatible blob, and `jitop.TargetMismatchError`
        (loading nothing) if it was built for a CPU whose features this machine lacks.

        Trust: the blob holds native code, so loading it is like loading a shared library: only load
        blobs from a trusted source (keep the persistent cache directory private to the user). The
        checks (sha256 checksum, the object code is a well-formed x86-64 ELF object, its embedded
        parameter signature equals the metadata, the plan matches the parameters, the target runs
        here) protect against corruption and version skew, not against a malicious author: the
        checksum detects damage, it is not a signature.

        >>> exe = Executable.from_bytes(open("f.jitexe", "rb").read())   # doctest: +SKIP
        """
        files = _unzip(_payload(data))
        try:
            meta, plan_json = json.loads(files["meta.json"]), json.loads(files["plan.json"])
            if not isinstance(meta, dict):
                raise TypeError(f"meta.json holds a {type(meta).__name__}, not an object")
            target = Target.from_json(meta["target"])
            name = str(meta.get("name", "?"))[:200]
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as err:
            raise ValueError(f"malformed jitop Executable (metadata: {type(err).__name__}: {err})") from None
        # before any object code is linked in: foreign code is refused, never loaded
        try:
            target.check_runs_on(what=f"the saved kernel '{name}'")
        except TargetMismatchError:
            raise
        except (TypeError, AttributeError, ValueError) as err:
            raise ValueError(f"malformed jitop Executable (target: {type(err).__name__}: {err})") from None
        try:
            plan = _decode(meta, plan_json, files, list(constants or ()))
            ll = files["kernel.ll"].decode() if "kernel.ll" in files else None
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, RecursionError) as err:
            raise ValueError(f"malformed jitop Executable ({type(err).__name__}: {err})") from None
        if expect is not None:  # before any object code is linked in (the object is checked against meta below)
            expect([ParamSpec.from_json(p) for p in meta["params"]], plan)
        # loads the object code (checked: a well-formed ELF object whose signature equals meta's params)
        return Executable(Module(meta, files["kernel.o"], ll), plan)


# ** the hot path **
def _specialised_runner(plan: Plan, module: Module, tree: Any = None) -> Callable[[Sequence[Any]], Any]:
    """run(args) -> outputs (or the result `tree` describes), generated as straight-line Python for this plan
    (the per-call hot path). The caller has checked the arguments' types and dtypes (and, for a constant-shape
    kernel, their shapes); a symbolic kernel's runner checks their ranks, constant dims, ties and guards itself."""
    n_real = len(plan.outputs) - plan.n_scratch
    env: dict[str, Any] = {"call": module.call_arrays, "check": module.raise_if_error,
                           "contiguous": np.ascontiguousarray, "asarray": np.asarray}
    lines = ["def run(args):"]
    names = []
    for k, (kind, what) in enumerate(plan.inputs):
        name = f"i{k}"
        names.append(name)
        if kind == "arg":
            lines += [f"    {name} = args[{what}]", f"    f = {name}.flags",
                      f"    if not (f.c_contiguous and f.aligned): {name} = contiguous({name})"]
        elif kind == "arg_swapped":
            env[f"dt{k}"] = what[1]
            # asarray, not ascontiguousarray: that one makes a 0-d array 1-d
            lines.append(f"    {name} = asarray(args[{what[0]}], dt{k}, order='C')")
        elif kind == "scalar":
            env[f"dt{k}"] = what[1]
            if len(what) > 2:  # a Python int must fit every integer dtype it meets, as numpy checks
                lo, hi = _int_range(what[2])
                env[f"overflow{k}"] = _overflow_error(what[2])
                lines.append(f"    if type(args[{what[0]}]) is int and not {lo} <= args[{what[0]}] <= {hi}: "
                             f"overflow{k}(args[{what[0]}])")
            lines.append(f"    {name} = asarray(args[{what[0]}], dt{k})")
        else:
            env[f"c{k}"] = what
            lines.append(f"    {name} = c{k}")
    if module.symbols:  # bind the symbols (ties and guards checked), then allocate at the bound sizes
        env["shapes"] = _SymbolicShapes(plan, module).output_shapes
        lines.append(f"    s = shapes(({''.join(n + ', ' for n in names)}))")
    sized = 0  # the symbolic outputs are allocated at the shapes `shapes` gives, in order
    for k, (shape, dt) in enumerate(plan.outputs):
        if any(isinstance(d, str) for d in shape):
            env[f"alloc{k}"] = _sized_allocator(dt, scratch=k >= n_real)
            lines.append(f"    o{k} = alloc{k}(s[{sized}])")
            sized += 1
        else:
            env[f"alloc{k}"] = _allocator(shape, dt, scratch=k >= n_real)
            lines.append(f"    o{k} = alloc{k}()")
        names.append(f"o{k}")
    lines.append(f"    call({', '.join(names)})")
    if module.checked:
        lines.append("    check()")
    results = [f"o{k}" for k in plan.result_slots]
    if tree is None:
        lines.append(f"    return [{', '.join(results)}]")
    else:
        # the result is built inline: a single array result costs nothing beyond `return o0`
        build, expr = _result_code(tree, results, env)
        lines += build + [f"    return {expr}"]
    exec("\n".join(lines), env)  # noqa: S102 - generated from the plan above; data values only via env
    return env["run"]


def _always_miss(*_: Any) -> Any:
    return fastcall.MISS


_NATURAL = {float: np.dtype(np.float64), int: np.dtype(np.int64), bool: np.dtype(np.bool_)}


def _fast_spec(plan: Plan, module: Module, nargs: int | None, scalar_types: dict[int, type] | None,
               compile: bool, copies: Sequence["fastcall.CopyIn"], tree: Any) -> "fastcall.Spec | None":
    """The plan as a fastcall.Spec: the same inputs, outputs (recycled as `_allocator` does), the result
    `tree` builds, and `copies`."""
    if not (module.runnable and module.address and fastcall.available(compile)):
        return None
    flag = module.error_flag_address()
    if module.checked and not flag:
        return None
    inputs: list[Any] = []
    positions = []
    held = {sym.param: sym for sym in module.symbols if sym.dim == VALUE}  # ints that are a symbol's value
    for k, ((kind, what), p) in enumerate(zip(plan.inputs, module.params)):
        if kind == "arg":  # a symbolic parameter's dims are printed expressions: the entry binds and ties them
            inputs.append(fastcall.Array(what, p.dtype, p.shape))
            positions.append(what)
        elif kind == "const":
            inputs.append(fastcall.Const(what))
        elif kind == "scalar":
            pos, dt = what[0], np.dtype(what[1])
            py = scalar_types.get(pos) if scalar_types is not None else \
                next((t for t, d in _NATURAL.items() if d == dt), None)
            if _NATURAL.get(py) != dt:  # e.g. np.float64 (a float subclass) keys its own signature
                return None
            # a Python int must fit every integer dtype it meets (NEP 50): outside, the slow path raises
            lo, hi = _int_range(what[2]) if py is int and len(what) > 2 else (-2 ** 63, 2 ** 63 - 1)
            if k in held:  # a size: the program's guards check the rest of its range
                sym = held[k]
                inputs.append(fastcall.Scalar(pos, py, max(lo, 0), min(hi, SYMBOL_LIMITS[sym.dtype]), sym.name))
            else:
                inputs.append(fastcall.Scalar(pos, py, lo, hi))
            positions.append(pos)
        else:  # byte-swapped: converted on each call
            return None
    if nargs is None:
        nargs = max(positions, default=-1) + 1
    elif sorted(positions) != list(range(nargs)):  # an argument the plan ignores would go unchecked
        return None
    n_real = len(plan.outputs) - plan.n_scratch
    outputs = [fastcall.Output(dt, shape, recycle=k >= n_real or _big(shape, dt))
               for k, (shape, dt) in enumerate(plan.outputs)]
    return fastcall.Spec(nargs, module.address, inputs, outputs, _fast_result(plan, tree),
                         error_flag=flag, raise_error=module.raise_if_error if flag else None,
                         symbols=[sym.name for sym in module.symbols], guards=_entry_guards(plan, module),
                         copies=copies)


def _big(shape: tuple[Dim, ...], dt: np.dtype) -> bool:
    """Whether an output is worth recycling: REUSE_BYTES or more, or of a symbolic size (the entry reuses a
    spare only at the same shape)."""
    if any(isinstance(d, str) for d in shape):
        return True
    return math.prod(shape) * dt.itemsize >= REUSE_BYTES


def _entry_guards(plan: Plan, module: Module) -> list[str]:
    """The plan's guards, plus the range of each symbol (args.SYMBOL_LIMITS: what the compiler proved the
    kernel for; the entry binds every symbol as an int64, `ShapeBinder.values` checks the same on the slow
    path)."""
    limits = [f"{sym.name} <= {SYMBOL_LIMITS[sym.dtype]}" for sym in module.symbols]
    return [*plan.guards, *limits]


def _fast_result(plan: Plan, tree: Any) -> int | tuple[str, int] | Callable[..., Any]:
    """How the entry returns the result `tree` describes: an output index, ("scalar", k) for a 0-d output
    returned as a numpy scalar, or a function of all the outputs that builds it (the same code `call` runs)."""
    slots = plan.result_slots
    if tree is not None and tree[0] == "out" and tree[2] != "py":
        return ("scalar", slots[tree[1]]) if tree[2] else slots[tree[1]]
    names = [f"o{k}" for k in slots]
    env: dict[str, Any] = {}
    build, expr = _result_code(tree, names, env) if tree is not None else ([], f"[{', '.join(names)}]")
    params = ", ".join(f"o{k}" for k in range(len(plan.outputs)))
    exec("\n".join([f"def post({params}):", *build, f"    return {expr}"]), env)  # noqa: S102 - indices only
    return env["post"]


REUSE_BYTES = 1 << 20  # outputs this big are recycled once the caller has dropped them


def aligned_empty(shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    """np.empty(shape, dt) whose data starts on a cache line (tir.storage.ALIGN, the alignment the storage planner
    gives each intermediate's offset in the arena): numpy's large allocations start 16 bytes past one, which put
    every intermediate 16 bytes off a line, so each 64-byte vector access straddled two. A view: its `base` is the buffer that owns the memory.

    >>> a = aligned_empty((3, 5), np.dtype(np.float32))
    >>> a.ctypes.data % ALIGN, a.shape, a.base.dtype
    (0, (3, 5), dtype('uint8'))
    """
    nbytes = math.prod(shape) * dt.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dt).reshape(shape)


def _in_use(a: np.ndarray) -> bool:
    """Whether someone besides the caller's one reference holds `a` (an `aligned_empty` view) or a view of its
    memory: every view's `base` is the owning buffer, so a caller's slice of a result counts through it."""
    return sys.getrefcount(a) > 3 or sys.getrefcount(a.base) > 2


def _allocator(shape: tuple[int, ...], dt: np.dtype, scratch: bool = False) -> Callable[[], np.ndarray]:
    """A fresh output array. A big one reuses the previous call's result if nothing references it any more:
    its pages are already mapped, which saves the page faults that otherwise dominate memory-bound kernels.
    Scratch buffers (intermediates) are always recycled that way."""
    if math.prod(shape) * dt.itemsize < REUSE_BYTES and not scratch:
        return lambda: aligned_empty(shape, dt)
    spare: list[np.ndarray] = []

    def alloc() -> np.ndarray:
        try:
            a = spare.pop()  # atomic: two threads never get the same array
        except IndexError:
            a = None
        if a is None or _in_use(a):
            a = aligned_empty(shape, dt)
        spare.append(a)
        return a
    return alloc


def _sized_allocator(dt: np.dtype, scratch: bool = False) -> Callable[[tuple[int, ...]], np.ndarray]:
    """alloc(shape) for an output of a symbolic size: as `_allocator`, a big one reuses the previous call's
    array if nothing references it any more, but only at the same shape. Scratch: `_scratch_allocator`."""
    if scratch:
        return _scratch_allocator(dt)
    spare: list[np.ndarray] = []

    def alloc(shape: tuple[int, ...]) -> np.ndarray:
        if math.prod(shape) * dt.itemsize < REUSE_BYTES:
            return aligned_empty(shape, dt)
        try:
            a = spare.pop()  # atomic: two threads never get the same array
        except IndexError:
            a = None
        if a is None or a.shape != shape or _in_use(a):
            a = aligned_empty(shape, dt)
        spare.append(a)
        return a
    return alloc


def _scratch_allocator(dt: np.dtype) -> Callable[[tuple[int, ...]], np.ndarray]:
    """alloc(shape) for an intermediate of a symbolic size: a view of one flat buffer that only ever grows
    (a smaller call reuses the pages a bigger one mapped). A buffer still in use (another thread's call: its
    view holds a reference) is never handed out twice."""
    spare: list[np.ndarray] = []

    def alloc(shape: tuple[int, ...]) -> np.ndarray:
        size = math.prod(shape)
        try:
            flat = spare.pop()
        except IndexError:
            flat = None
        if flat is None or flat.size < size or _in_use(flat):
            flat = aligned_empty((size,), dt)
        spare.append(flat)
        return flat[:size].reshape(shape)
    return alloc


# ** symbolic shapes at call time **
class _SymbolicShapes:
    """A symbolic plan's shape work on each call: checks the inputs' ranks and constant dims, binds the
    symbols (`ShapeBinder.bind`: tied dims), checks the guards and computes the outputs' shapes."""

    def __init__(self, plan: Plan, module: Module):
        params = module.params
        self.params, self.binder = params, module.binder
        self.symbols = module.symbols
        self.names = [sym.name for sym in module.symbols]
        # each array argument: (its index among the kernel's inputs, argument position, rank, constant dims)
        self.arrays = [(k, what if kind == "arg" else what[0], len(p.shape),
                        tuple((j, d) for j, d in enumerate(p.shape) if not isinstance(d, str)))
                       for k, ((kind, what), p) in enumerate(zip(plan.inputs, params)) if kind.startswith("arg")]
        self.guards = [(g, compile_guard(g)) for g in plan.guards]
        self.sized = [(k, tuple((compile_dim(d), d) if isinstance(d, str) else int(d) for d in shape))
                      for k, (shape, _) in enumerate(plan.outputs) if any(isinstance(d, str) for d in shape)]

    def bind(self, inputs: Sequence[np.ndarray]) -> dict[str, int]:
        """The symbols' values for the kernel's input arrays (in parameter order); ValueError for a rank, a
        constant dim, a tied dim or a guard they do not satisfy."""
        for k, pos, rank, consts in self.arrays:
            shape = inputs[k].shape
            if len(shape) != rank or any(shape[j] != d for j, d in consts):
                p = self.params[k]
                raise ValueError(f"argument '{p.name}' (position {pos}) must have shape {shape_str(p.shape)}, "
                                 f"got {shape}; the Executable was compiled for that signature")
        if self.binder is None:
            return {}
        env = dict(zip(self.names, self.binder.bind(inputs)))
        for text, holds in self.guards:
            if not holds(env):
                raise ValueError(f"the arguments' shapes give {self._bound(env)}, but this Executable was compiled "
                                 f"for shapes where {text}")
        return env

    def output_shapes(self, inputs: Sequence[np.ndarray]) -> list[tuple[int, ...]]:
        """The shape of each output with a symbolic dim, in order, at the symbols the inputs bind (after
        checking them as `bind` does); a constant-shape output is allocated once its shape is known."""
        env = self.bind(inputs)
        return [self._shape(k, dims, env) for k, dims in self.sized]

    def _shape(self, k: int, dims: tuple, env: dict[str, int]) -> tuple[int, ...]:
        try:
            shape = tuple(d[0](env) if type(d) is tuple else d for d in dims)
        except ZeroDivisionError:
            shape = None
        if shape is None or any(d < 0 for d in shape):
            printed = tuple(d[1] if type(d) is tuple else d for d in dims)
            raise ValueError(f"output {k} of shape {shape_str(printed)} has no valid shape with {self._bound(env)}")
        return shape

    def _bound(self, env: dict[str, int]) -> str:
        def source(sym: Any) -> str:
            where = "value" if sym.dim == VALUE else f"dimension {sym.dim}"
            return f"argument '{self.params[sym.param].name}' {where}"
        return ", ".join(f"{sym.name} = {env[sym.name]} (from {source(sym)})" for sym in self.symbols)


_COMPARE: dict[type, Callable[[int, int], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge}
MAX_GUARD_TEXT = 4096


def compile_guard(text: str) -> Callable[[dict[str, int]], bool]:
    """A predicate over the symbols' values for a guard: comparisons (== != < <= > >=, chained) of dim
    expressions (args.compile_dim's language), joined by `and`; ValueError for anything else.

    >>> compile_guard("n >= 2 and n % 3 == 0")({"n": 6})
    True
    """
    if not isinstance(text, str) or len(text) > MAX_GUARD_TEXT:
        raise ValueError(f"a guard must be a string of at most {MAX_GUARD_TEXT} characters, got {text!r:.100}")
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise ValueError(f"guard {text!r} is not an expression") from None
    parts = node.values if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And) else [node]
    checks: list[tuple[Callable[[int, int], bool], DimFn, DimFn]] = []
    for part in parts:
        if not (isinstance(part, ast.Compare) and all(type(o) in _COMPARE for o in part.ops)):
            raise ValueError(f"guard {text!r}: only comparisons (== != < <= > >=) joined by 'and' are allowed")
        operands = [compile_dim(ast.unparse(e)) for e in [part.left, *part.comparators]]
        checks += [(_COMPARE[type(o)], a, b) for o, a, b in zip(part.ops, operands, operands[1:])]

    def holds(env: dict[str, int]) -> bool:
        try:
            return all(cmp(a(env), b(env)) for cmp, a, b in checks)
        except ZeroDivisionError:
            return False
    return holds


# ** result trees **
# ["out", k, scalar]      flat result k; scalar: a 0-d computation numpy returns as a scalar (outs[k][()]),
#                         or "py": a Python scalar (outs[k][()].item())
# ["tuple", [t, ...]] / ["list", [t, ...]] / ["dict", [[key, t], ...]]   (a key is a "const" or "obj" leaf)
# ["const", v]            v is None, bool, int, float or str (JSON round-trips it exactly)
# ["obj", v]              any other Python value: works in memory, cannot be saved
_CONST_TYPES = (type(None), bool, int, float, str)
MAX_RESULT_DEPTH = 100


def rebuild(tree: Any, outs: Sequence[Any]) -> Any:
    """The value `tree` describes, taking array k from `outs`.

    >>> outs = [np.arange(3), np.array(2.5)]
    >>> r = rebuild(["tuple", [["out", 0, False], ["dict", [[["const", "s"], ["out", 1, True]]]]]], outs)
    >>> r[0] is outs[0], type(r[1]["s"]) is np.float64
    (True, True)
    """
    return rebuilder(tree, len(outs))(outs)


def rebuilder(tree: Any, n_outs: int) -> Callable[[Sequence[Any]], Any]:
    """`rebuild` of `tree` compiled once, for a caller that rebuilds the same structure on every call.

    >>> make = rebuilder(["list", [["out", 1, False], ["out", 0, False]]], 2)
    >>> make(["a", "b"]), make([1, 2])
    (['b', 'a'], [2, 1])
    """
    _check_tree(tree, n_outs, allow_objects=True)
    env: dict[str, Any] = {}
    build, expr = _result_code(tree, [f"outs[{k}]" for k in range(n_outs)], env)
    exec("\n".join(["def rebuild(outs):", *build, f"    return {expr}"]), env)  # noqa: S102 - indices only
    return env["rebuild"]


def leaf(value: Any) -> list:
    """The tree leaf for a plain Python value: "const" if it survives JSON unchanged, else "obj"."""
    return ["const", value] if type(value) in _CONST_TYPES else ["obj", value]


def _result_code(tree: Any, outs: list[str], env: dict[str, Any]) -> tuple[list[str], str]:
    """Statements (one per container, so deep trees never nest expressions) and the expression of the result;
    values go through `env`, never into the source text."""
    lines: list[str] = []
    fresh = itertools.count()

    def emit(t: list) -> str:
        kind = t[0]
        if kind == "out":
            if t[2] == "py":  # a Python scalar's value (a function of Python scalar arguments)
                return f"{outs[t[1]]}[()].item()"
            return f"{outs[t[1]]}[()]" if t[2] else outs[t[1]]
        name = f"r{next(fresh)}"
        if kind in ("const", "obj"):
            env[name] = t[1]
            return name
        if kind == "dict":
            body = "{" + ", ".join(f"{emit(k)}: {emit(v)}" for k, v in t[1]) + "}"
        elif kind == "list":
            body = "[" + ", ".join(emit(s) for s in t[1]) + "]"
        else:
            body = "(" + "".join(f"{emit(s)}, " for s in t[1]) + ")"
        lines.append(f"    {name} = {body}")
        return name
    return lines, emit(tree)


def _check_tree(tree: Any, n_results: int, allow_objects: bool) -> None:
    """Raise ValueError unless `tree` is a well-formed result tree over `n_results` arrays."""
    stack = [(tree, 0)]
    while stack:
        t, depth = stack.pop()
        if not (isinstance(t, list) and t and isinstance(t[0], str)):
            raise ValueError(f"bad result tree node {t!r}")
        if depth > MAX_RESULT_DEPTH:  # code generation and JSON recurse over it
            raise ValueError(f"result nested deeper than {MAX_RESULT_DEPTH} levels")
        kind = t[0]
        if kind == "out":
            if not (len(t) == 3 and type(t[1]) is int and 0 <= t[1] < n_results and
                    (type(t[2]) is bool or t[2] == "py")):
                raise ValueError(f"bad result leaf {t!r} (expected ['out', k < {n_results}, bool])")
        elif kind in ("const", "obj"):
            if len(t) != 2 or (kind == "const" and type(t[1]) not in _CONST_TYPES):
                raise ValueError(f"bad constant in result tree: {t!r}")
            if kind == "obj" and not allow_objects:
                raise ValueError(f"a result part of type {type(t[1]).__name__} cannot be saved")
        elif kind in ("tuple", "list", "dict") and len(t) == 2 and isinstance(t[1], list):
            if kind == "dict":
                if not all(isinstance(kv, list) and len(kv) == 2 for kv in t[1]):
                    raise ValueError(f"bad dict in result tree: {t!r}")
                for k, v in t[1]:
                    if not (isinstance(k, list) and k and k[0] in ("const", "obj")):
                        raise ValueError(f"bad dict key in result tree: {k!r}")
                    stack += [(k, depth + 1), (v, depth + 1)]
            else:
                stack += [(s, depth + 1) for s in t[1]]
        else:
            raise ValueError(f"bad result tree node {t!r}")


# ** serialisation **
def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)  # same input, same bytes
    return buf.getvalue()


def _payload(data: bytes) -> bytes:
    """The checked payload of a blob: right magic, version and sha256."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"Executable.from_bytes expects bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < _HEADER.size:
        raise ValueError(f"not a jitop Executable: {len(data)} bytes is shorter than the header (truncated?)")
    magic, version, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError("not a jitop Executable (bad magic bytes)")
    if version != FORMAT_VERSION:
        raise ValueError(f"jitop Executable format version {version}, this jitop reads version {FORMAT_VERSION}; "
                         "rebuild it with this jitop")
    payload = data[_HEADER.size:]
    if hashlib.sha256(payload).digest() != digest:
        raise ValueError("jitop Executable checksum mismatch: the blob is corrupt or truncated; rebuild it")
    return payload


def _unzip(payload: bytes) -> dict[str, bytes]:
    try:
        with zipfile.ZipFile(io.BytesIO(payload)) as z:
            infos = z.infolist()
            if any(i.compress_type != zipfile.ZIP_STORED for i in infos):  # sizes bounded by the blob's
                raise ValueError("compressed entries")
            files = {i.filename: z.read(i) for i in infos}
    except (zipfile.BadZipFile, ValueError, EOFError, OSError) as err:
        raise ValueError(f"malformed jitop Executable (container: {err})") from None
    missing = {"meta.json", "plan.json", "kernel.o"} - set(files)
    if missing:
        raise ValueError(f"malformed jitop Executable: missing {sorted(missing)}")
    return files


def _dtype(text: Any) -> np.dtype:
    """A plan dtype from its string: native-order numbers only (never object/pickled data)."""
    if not isinstance(text, str):
        raise ValueError(f"dtype must be a string, got {text!r}")
    dt = np.dtype(text)
    if dt.kind not in _DTYPE_KINDS or dt.hasobject or not dt.isnative:
        raise ValueError(f"dtype {text!r} is not a native numeric dtype")
    return dt


def _dim(d: Any) -> Dim:
    """An output dim of a saved plan: a non-negative int, or a symbolic dim's printed expression."""
    if isinstance(d, str):
        compile_dim(d)  # the whitelisted language and length limit (the names are checked by `_check_plan`)
        return d
    return _position(d)


def _position(p: Any) -> int:
    if type(p) is not int or p < 0:
        raise ValueError(f"argument position must be a non-negative int, got {p!r}")
    return p


def _plan_to_json(plan: Plan, with_constants: bool = True) -> tuple[dict, list[np.ndarray]]:
    """The plan as JSON (dtypes as strings, constants as indices, or as references to arrays the loader
    supplies) and its constants."""
    if plan.result is not None and with_constants:
        try:
            _check_tree(plan.result, len(plan.result_slots), allow_objects=False)
        except ValueError as err:
            raise ValueError(f"this Executable cannot be saved: {err} (only arrays, None, bool, int, float and str "
                             "in tuples, lists and dicts survive to_bytes)") from None
    inputs: list[list] = []
    constants: list[np.ndarray] = []
    for kind, what in plan.inputs:
        if kind == "arg":
            inputs.append([kind, what])
        elif kind in ("arg_swapped", "scalar"):
            inputs.append([kind, [what[0], np.dtype(what[1]).str, *([list(what[2])] if len(what) > 2 else [])]])
        elif with_constants:
            inputs.append([kind, len(constants)])
            constants.append(np.asarray(what))
        else:
            inputs.append(["const_ref", len(constants)])
            constants.append(np.empty(0, np.uint8))  # a placeholder: numbered like the saved ones, not written
    out = {"inputs": inputs, "outputs": [[list(s), np.dtype(d).str] for s, d in plan.outputs],
           "result_slots": list(plan.result_slots), "n_scratch": plan.n_scratch,
           "result": plan.result if with_constants else None}
    if plan.guards:  # only symbolic plans have the key: a constant-shape plan's bytes are as they always were
        out["guards"] = list(plan.guards)
    return out, constants if with_constants else []


def _decode(meta: dict, plan_json: dict, files: dict[str, bytes], supplied: list[np.ndarray]) -> Plan:
    """The Plan of a blob, checked against the module's parameters so a kernel never sees a wrong buffer;
    `supplied`: the arrays of its "const_ref" inputs, in order."""
    if meta.get("format") != MODULE_FORMAT:
        raise ValueError(f"module format {meta.get('format')}, expected {MODULE_FORMAT}")
    check_meta(meta)
    params = [ParamSpec.from_json(p) for p in meta["params"]]
    for p in params:
        _dtype(p.dtype.str)
    inputs: list[tuple[str, Any]] = []
    for kind, what in plan_json["inputs"]:
        if kind == "arg":
            inputs.append((kind, _position(what)))
        elif kind in ("arg_swapped", "scalar"):
            inputs.append((kind, (_position(what[0]), _dtype(what[1]), *_int_dtypes(what[2:]))))
        elif kind == "const":
            c = np.load(io.BytesIO(files[f"const{_position(what)}.npy"]), allow_pickle=False)
            if not isinstance(c, np.ndarray):
                raise ValueError(f"constant {what} is not a .npy array")
            _dtype(c.dtype.str)
            c.flags.writeable = False
            inputs.append((kind, c))
        elif kind == "const_ref":
            k = _position(what)
            if k >= len(supplied):
                raise ValueError(f"the blob refers to constant {k}; {len(supplied)} were supplied")
            c = supplied[k]
            if not (isinstance(c, np.ndarray) and c.flags.c_contiguous and c.flags.aligned):
                raise ValueError(f"supplied constant {k} must be a C-contiguous, aligned ndarray")
            inputs.append(("const", c))
        else:
            raise ValueError(f"unknown input kind {kind!r}")
    outputs = [(tuple(_dim(d) for d in s), _dtype(dt)) for s, dt in plan_json["outputs"]]
    slots = [_position(k) for k in plan_json["result_slots"]]
    guards = plan_json.get("guards", [])
    if not (isinstance(guards, list) and all(isinstance(g, str) for g in guards)):
        raise ValueError("guards must be a list of strings")
    plan = Plan(inputs, outputs, slots, _position(plan_json["n_scratch"]), plan_json["result"], guards)
    # (check_meta accepted the symbols: each a dict with a name)
    _check_plan(plan, params, [s["name"] for s in meta.get("symbols", []) if s.get("dim") == VALUE])
    return plan


_NARROW_INTS = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "uint64")  # int64 is checked by asarray


def _int_range(names: tuple[str, ...]) -> tuple[int, int]:
    """The values that fit every one of these integer dtypes."""
    return (max(int(np.iinfo(d).min) for d in names), min(int(np.iinfo(d).max) for d in names))


def _overflow_error(names: tuple[str, ...]) -> Callable[[int], None]:
    def overflow(value: int) -> None:
        dtype = next(d for d in names if not np.iinfo(d).min <= value <= np.iinfo(d).max)
        raise OverflowError(f"Python integer {value} out of bounds for {dtype}")
    return overflow


def check_python_int(value: Any, names: tuple[str, ...]) -> None:
    """Raise numpy's OverflowError where `value` is a Python int outside one of the integer dtypes `names`.

    >>> check_python_int(300, ("int16",)); check_python_int(300, ("int16", "int8"))
    Traceback (most recent call last):
    OverflowError: Python integer 300 out of bounds for int8
    """
    lo, hi = _int_range(names)
    if type(value) is int and not lo <= value <= hi:
        _overflow_error(names)(value)


def _int_dtypes(extra: list) -> list[tuple[str, ...]]:
    """A scalar input's optional integer dtype names (those a Python int argument must fit), or nothing."""
    if not extra:
        return []
    names = extra[0]
    if len(extra) != 1 or not isinstance(names, list) or not names or \
            not all(isinstance(n, str) and n in _NARROW_INTS for n in names):
        raise ValueError(f"malformed scalar dtype list {extra!r}: expected names among {_NARROW_INTS}")
    return [tuple(names)]


def _check_plan(plan: Plan, params: list[ParamSpec], held: Sequence[str] = ()) -> None:
    """Raise ValueError unless every buffer the plan hands the kernel is the one its parameter describes:
    the kernel indexes each as its parameter's shape and dtype, whatever it is given (`held`: the symbols
    int arguments hold)."""
    if len(plan.inputs) + len(plan.outputs) != len(params) or plan.n_scratch > len(plan.outputs):
        raise ValueError(f"plan has {len(plan.inputs)} inputs and {len(plan.outputs)} outputs for "
                         f"{len(params)} kernel parameters")
    positions = [what if kind == "arg" else what[0] for kind, what in plan.inputs if kind != "const"]
    if len(set(positions)) != len(positions):  # the tracer gives each argument one parameter at most
        raise ValueError(f"plan reads an argument twice (positions {positions})")
    for (kind, what), p in zip(plan.inputs, params):
        if p.is_output:
            ok = False
        elif kind == "const":
            ok = what.shape == p.shape and what.dtype == p.dtype
        elif kind == "arg_swapped":  # converted to this dtype on each call: it must be the parameter's
            ok = np.dtype(what[1]).newbyteorder("=") == p.dtype
        elif kind == "scalar":       # becomes a 0-d array of this dtype
            ok = np.dtype(what[1]) == p.dtype and p.shape == ()
        else:                        # "arg": checked against the parameter on each checked call
            ok = kind == "arg" and type(what) is int and what >= 0
        if not ok:
            raise ValueError(f"plan input {kind} {_describe_input(kind, what)} does not match kernel parameter "
                             f"{p.name}: {'an output' if p.is_output else p.describe()}")
    _check_outputs(plan, params)
    _check_guards(plan.guards, params, held)
    if any(k >= len(plan.outputs) - plan.n_scratch for k in plan.result_slots):
        raise ValueError("a result slot points past the kernel's outputs")
    if plan.result is not None:
        _check_tree(plan.result, len(plan.result_slots), allow_objects=False)


def _check_outputs(plan: Plan, params: list[ParamSpec]) -> None:
    """Raise ValueError unless each plan output has its output parameter's dtype and exactly its dims (a
    symbolic dim: the same printed expression)."""
    outs = params[len(plan.inputs):]
    if len(outs) != len(plan.outputs):
        raise ValueError(f"plan has {len(plan.outputs)} outputs for {len(outs)} kernel output parameters")
    for (shape, dt), p in zip(plan.outputs, outs):
        if not p.is_output or tuple(shape) != p.shape or dt != p.dtype:
            raise ValueError(f"plan output {dt} {shape_str(shape)} does not match kernel parameter {p.name}: "
                             f"{p.describe()}")


def _check_guards(guards: Sequence[str], params: list[ParamSpec], held: Sequence[str] = ()) -> None:
    """Raise ValueError unless every guard is a well-formed relation over the kernel's symbols (the names its
    parameters' symbolic dims use, and `held`: those int arguments hold)."""
    symbols = {n for p in params for d in p.shape if type(d) is str for n in dim_names(d)} | set(held)
    for g in guards:
        compile_guard(g)
        unknown = dim_names(g) - symbols
        if unknown:
            raise ValueError(f"guard {g!r} uses {', '.join(sorted(unknown))}, which is not a symbol of the kernel "
                             f"({', '.join(sorted(symbols)) or 'none'})")


def _describe_input(kind: str, what: Any) -> str:
    if kind == "const":
        return f"({what.dtype.name} array of shape {what.shape})"
    if kind in ("arg_swapped", "scalar"):
        return f"(argument {what[0]} as {np.dtype(what[1]).name})"
    return f"(argument {what})"


def _check_values(plan: Plan, params: list[ParamSpec], values: Sequence[Any],
                  shapes: "_SymbolicShapes | None" = None) -> None:
    """Raise TypeError/ValueError unless `values` fit the signature the kernel was compiled for; a symbolic
    kernel's (`shapes`): their ranks and constant dims, then the tied dims and guards."""
    arrays: list[Any] = []
    for (kind, what), p in zip(plan.inputs, params):
        arrays.append(what if kind == "const" else None)
        if kind == "const":
            continue
        pos = what if kind == "arg" else what[0]
        if pos >= len(values):
            raise TypeError(f"missing argument {pos} ('{p.name}', {p.describe()}); got {len(values)} arguments")
        v, where = values[pos], f"argument '{p.name}' (position {pos})"
        if kind == "scalar":
            if np.ndim(v) != 0:
                raise ValueError(f"{where} must be a scalar, got shape {np.shape(v)}")
            arrays[-1] = v  # (its value may bind a symbol)
            continue
        if not isinstance(v, np.ndarray):
            raise TypeError(f"{where} must be a numpy.ndarray ({p.describe()}), got {type(v).__name__}")
        if not _fits(p.shape, v.shape) or v.dtype.newbyteorder("=") != p.dtype or \
                (kind == "arg" and not v.dtype.isnative):
            raise ValueError(f"{where} must be a {p.describe()}, got a {v.dtype.str} array of shape {v.shape}; "
                             "the Executable was compiled for that signature")
        arrays[-1] = v
    if shapes is not None:
        shapes.bind(arrays)


def _fits(shape: tuple[Dim, ...], got: tuple[int, ...]) -> bool:
    """Whether an array's shape fits a parameter's: equal, or (symbolic dims) its rank and constant dims."""
    if shape == got:
        return True
    return len(shape) == len(got) and any(type(d) is str for d in shape) and \
        all(type(d) is str or d == g for d, g in zip(shape, got))
