"""@jitop.kernel: trace a numpy function once per argument signature, compile it, dispatch later calls.

Arguments are bound to the signature; a list, tuple or dict holding arrays (a *args tuple, a **kwargs dict,
nested) is a pytree (jitop/pytree.py): its leaves are the kernel's inputs, its structure part of the key.
Dispatch (jitop/dispatch.py): ArgSpec key -> in memory -> the persistent disk cache (jitop/graph/kernel_cache.py,
keyed on the trace) -> compile and save. The dispatcher counts each signature's calls for the workload log.
Anything that cannot be traced runs as plain numpy with one warning per construct (or raises with
fallback=False).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import inspect
import math
import operator
import re
import traceback
import types
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jitop import dtypes, pytree
from jitop.errors import FallbackError, JitopFallbackWarning, JitopRecompileWarning, ScalarNeeded
from jitop.graph.capture import capture, code_objects, holds, reading
from jitop import build_beside, config
from jitop import dispatch
from jitop import workloads
from jitop.dispatch import FALLBACK, PENDING, Dispatcher, Overload
from jitop.codegen.collector import full_collections_deferred
from jitop.driver import default_target, resolve_target
from jitop.runtime.cuda.memory import DeviceArray, declared_shape_dtype, is_device_array
from jitop.target import CudaTarget
from jitop.autotune import mode as autotune_mode
from jitop.autotune import watch as watch_for_autotune
from jitop.graph import kernel_cache, mutation, warm, writeback
from jitop.graph.masked import Masked
from jitop.graph.numpy_api import TRACING_NUMPY
from jitop.graph.compile import compile_graph, flops_at, graph_tasks, prepare
from jitop.graph.ufuncs import INT_BEYOND_64
from jitop.graph.ir import Node, node, resolve_graph, substituted, toposort
from jitop.graph.tasks import row_buckets
from jitop.graph.shapes import MIN_SYMBOL, ShapeEnv, SymInt, as_dim
from jitop.shape_policy import RECOMPILE_LIMIT, IntPolicy, ShapePolicy, struct_key
from jitop.tir.nodes import VALUE
from jitop.tir.simplify import SYMBOL_MAX
from jitop.te.printer import expr_str
from jitop.graph.tracer import Tracer, TracerConversionError, Unsupported
from jitop.runtime import fastcall
from jitop.runtime.executable import Executable, leaf
from jitop.tuner.task import Task, on_sources_changed

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_MISS = fastcall.MISS
_GUARDED_DEPTH = 5  # the same from a guarded call: _fall_back, call, _call, __call__ above the caller
_BUILD_DEPTH = 7  # a warning while building names the caller's line: 6 frames of jitop (_build, get, ...) above it


class _Restart(Exception):
    """Raised out of a build whose trace made a parameter static (`err`), or a Python int parameter a size symbol
    (err None): the call is keyed again and built anew."""

    def __init__(self, err: ScalarNeeded | None):
        super().__init__(str(err))
        self.err = err


def argspec(value: Any, static: bool) -> tuple:
    """The part of the cache key one argument (or pytree leaf) contributes: shape/dtype for arrays, the type for
    scalars, the value if static. A container holding arrays is not one argument: see `_flatten_params`."""
    if static:
        return ("static", _frozen(value))
    if type(value) is np.ndarray:
        return (value.dtype, value.shape)
    if isinstance(value, np.ndarray):
        return ("subclass", type(value), value.dtype, value.shape)
    if isinstance(value, (bool, int, float)):
        if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
            return ("bigint", value)  # beyond int64: traced as its exact value, like a constant (NEP 50)
        return ("scalar", type(value))
    if isinstance(value, np.generic):
        return ("npscalar", value.dtype.str)
    return ("static", _frozen(value))  # a list, tuple, None, str, ...: a constant of the trace, by value


def _frozen(value: Any) -> Any:
    """A static value as a key part: equal only if the trace would be the same (1, 1.0 and True differ, so do
    0.0 and -0.0 and [1] and (1,)); a list's key is its elements' (an unhashable element makes the key so)."""
    t = type(value)
    if t is float:
        return (t, value, math.copysign(1.0, value))
    if t in (list, tuple):
        return (t, tuple(_frozen(v) for v in value))
    if t is dict or t is collections.OrderedDict:
        return (t, tuple((k, _frozen(v)) for k, v in value.items()))
    if t in (bool, int, complex) or isinstance(value, np.generic):
        return (t, value)
    return value


# leaves that sit in a container of arrays as constants of the trace (keyed by value); any other object there
# makes the signature run as numpy, naming it
_CONSTANT_LEAVES = (type(None), str, bytes, complex, type, np.dtype, type(Ellipsis))
_JUST_ARRAYS = {np.ndarray}
_PYTHON_SCALARS = (bool, int, float, complex)
_SCALARS_STATIC = "scalars"  # a static flag: static when the value is a Python scalar (made so on use)
_INT_SIZES = "ints"  # a static flag: a Python int in the symbols' range is a size symbol, other scalars static
_DTYPE_SHAPE = operator.attrgetter("dtype", "shape")  # an exact ndarray's argspec


class _CalledWhileTracing(Exception):
    """A pytree argument holds a tracer: the kernel was called inside another kernel's trace."""


def _stand_in(value: Any) -> Any:
    """For a device array, a host array of its shape and dtype to key and trace with (no memory of its own:
    every element is the one zero); any other value as it is."""
    if not is_device_array(value):
        return value
    shape, dtype = declared_shape_dtype(value)
    return np.ndarray(shape, dtype, buffer=np.zeros(1, dtype), strides=(0,) * len(shape))


def _holds_array(value: Any) -> bool:
    return pytree.any_leaf(value, _is_array)


def _is_array(value: Any) -> bool:
    return isinstance(value, (np.ndarray, Tracer))


def _array_free(container: Any) -> bool:
    return not _holds_array(container)


def _leaf_spec(value: Any) -> tuple:
    """argspec of a leaf inside a container of arrays (an array-free container in there is one static leaf)."""
    if isinstance(value, (np.ndarray, bool, int, float, np.generic)):
        return argspec(value, False)
    if isinstance(value, _CONSTANT_LEAVES) or pytree.is_node(value):
        return ("static", _frozen(value))
    if isinstance(value, Tracer):
        raise _CalledWhileTracing
    return ("unsupported", type(value))


@dataclass
class Trace:
    """What tracing one signature produced."""

    inputs: list[Node] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    plan: list[tuple[str, Any]] = field(default_factory=list)
    results: list[Node] = field(default_factory=list)
    result: Any = None  # the result's structure as a tree over `results` (jitop.runtime.executable.rebuild)
    guards: list = field(default_factory=list)  # captured globals/closure data (jitop.graph.capture.Guard)
    python_ints: bool = False  # computes Python int arithmetic in int64 (checked for results beyond it)
    # the parameters' structure (jitop.pytree: a tuple with one entry per parameter) when a container argument
    # was flattened into several leaves; None when each parameter is one leaf. The kernel's inputs index leaves.
    arg_tree: Any = None
    # symbolic dims (jitop.graph.shapes): the trace's ShapeEnv (symbols, ties, guards, specialisations), None if
    # every dim was traced at its size
    env: ShapeEnv | None = None
    shape_guards: list[str] = field(default_factory=list)  # the env's guards, printed ("x_0 - 5 >= 0")
    symbols: dict[str, tuple[str, int]] = field(default_factory=dict)  # symbol -> (leaf name, dim) it came from
    flops: int | None = None  # a symbolic kernel's template flops at the traced call (its tasks': at their rep)
    reps: dict = field(default_factory=dict)  # symbolic matmul row count -> the size its config is decided at
    # how the arguments the function assigns to in place get their new values (which follow the result: _flatten)
    writes: tuple[writeback.Write, ...] = ()
    fixed_sizes: dict[str, str] = field(default_factory=dict)  # Python int size symbols the code made ints: where
    bounds: dict[str, tuple[int, int]] = field(default_factory=dict)  # symbol -> the range its guards leave it
    recorded: bool = False  # the fields a call needs only, from a warm record (jitop.graph.warm): not traced

    @property
    def sizes(self) -> dict[str, int]:
        """The kernel's symbols (those no tie replaced) at the traced call's sizes; empty without symbols."""
        env = self.env
        return {} if env is None else {s.name: env.hints[s] for s in env.symbols if s not in env.subst}


class KernelFunction:
    """A numpy function compiled per (shape, dtype) signature. Created by @jitop.kernel."""

    def __init__(self, fn: Callable, static_argnums: Sequence[int] = (), static_argnames: Sequence[str] = (),
                 fallback: bool = True, autotune: str | None = None,
                 dynamic: bool | Mapping[str, Sequence[int]] | None = None, target: str | None = None,
                 compile: str | None = None, warn_recompiles: bool = True):
        fn = _inputs_only(fn) if isinstance(fn, np.ufunc) else fn
        self.fn = fn
        self.warn_recompiles = warn_recompiles
        # a GPU target: traced graphs compile to GPU functions, one per shape (jitop.graph.gpu)
        self.gpu = resolve_target(target) if target is not None else None
        if self.gpu is not None and not isinstance(self.gpu, CudaTarget):
            raise ValueError(f"jitop.kernel(target={target!r}): a CPU kernel is built for the host (JITOP_CPU picks "
                             "another); target= is for 'cuda'")
        self.autotune = autotune_mode(autotune)
        self.compile_mode = _compile_mode(compile)
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = fn.__doc__
        self.signature = inspect.signature(fn)
        names = list(self.signature.parameters)
        self._static_on_use: set[str] = set()  # made static by a call (for Python scalars), kept for the next process
        # those of them traced as size symbols (their values varied), kept for the next process too
        self.int_sizes = IntPolicy(lambda symbolic, demoted: kernel_cache.save_int_sizes(
            self.qualified_name, self._code_digest(), symbolic, demoted))
        self._value_compiles: dict[Any, int] = {}  # argument structure, static values left out -> kernels built
        self._set_static({names[i] for i in static_argnums} | set(static_argnames))
        self._static_loaded = False
        self._binder = _positional_binder(list(self.signature.parameters.values()))
        self.fallback = fallback
        self._warned: set[str] = set()
        # signature -> overload, the call log and the native entry (checks the arguments itself and returns
        # MISS for anything else, which then takes the path below)
        self.dispatcher = Dispatcher(self.qualified_name)
        # which dims are traced as symbols (automatic: those that varied; decisions kept in the disk cache)
        self.policy = ShapePolicy(dynamic, functools.partial(kernel_cache.load_dynamic, self.qualified_name),
                                  functools.partial(kernel_cache.save_dynamic, self.qualified_name))
        self.policy.check_names(names)
        self.traces = 0  # how many times the function was traced (a new size of a symbolic signature is not)

    def _set_static(self, static: set[str]) -> None:
        """The parameters whose Python value is part of the key (traced as constants), and the fast paths that
        only a function without any may take."""
        params = list(self.signature.parameters.values())
        self.static = static
        # a parameter made static on use is so for Python scalars only (what was used as a size): an array passed
        # to it later is traced as ever, not keyed by identity and computed per call
        self._static_flags = tuple(_INT_SIZES if p.name in self.int_sizes.symbolic and p.name in self._static_on_use
                                   else _SCALARS_STATIC if p.name in self._static_on_use
                                   else p.name in static for p in params)
        positional = all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
        self._simple = not static and positional
        # a call of arrays and size symbols' ints by position is keyed without binding (`_arrays_key`)
        self._by_position = positional and all(f is False or f is _INT_SIZES for f in self._static_flags)
        # the native entry can serve a signature whose leaves are exactly the positional arguments
        # (a Python int that is a size symbol is an argument it checks: a static one is in the key by value)
        self._positional = all(f is False or f is _INT_SIZES for f in self._static_flags) and all(
            p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)

    def _made_static(self, err: ScalarNeeded, tree: Any) -> bool:
        """After a Python scalar argument was used as a size (`err`): its parameters made static (a compile per
        value, as torch.compile specialises an int used as a size; another thread's call may have made them so
        already), True; False where its leaves are not whole parameters (inside a list, or a *args tuple)."""
        params = list(self.signature.parameters.values())
        if tree is not None or any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            return False
        names = {params[k].name for k in err.leaves if k < len(params)}
        if not names:
            return False
        if not names <= self.static:
            self._static_on_use |= names - self.static
            self._set_static(self.static | names)
            kernel_cache.save_static(self.qualified_name, self._code_digest(), sorted(self._static_on_use))
        return True

    def _static_recompiles(self, struct: Any) -> str | None:
        """Count a compile of `struct` among those differing only in static values; past RECOMPILE_LIMIT of them,
        once: why each new value compiles and what serves every value with one kernel."""
        specs = struct[2] if struct is not None and struct[:1] == ("pytree",) else struct
        if not specs or not any(type(s) is tuple and s[:1] in (("static",), ("symint",)) for s in specs):
            return None
        erased = tuple(("static",) if type(s) is tuple and s[:1] in (("static",), ("symint",)) else s for s in specs)
        n = self._value_compiles[erased] = self._value_compiles.get(erased, 0) + 1
        if n != RECOMPILE_LIMIT + 1:
            return None
        names = ", ".join(sorted(self._static_on_use or self.static))
        why = "".join(f"; {name} stays static: {reason}" for name, reason in sorted(self.int_sizes.demoted.items()))
        return (f"{n} kernels, one per value of the static parameter(s) {names}: a value that changes on every "
                f"call compiles on every call{why}. A Python int used only as a size (`cache[:t + 1]`, "
                "`np.zeros(n)`) is one kernel for every value; one the code needs as a Python int (`range(n)`, "
                "a loop over it, a dict key) is not: keep that out of the kernel, or pass the arrays it selects")

    def _code_digest(self) -> str:
        """What identifies this version of the function's code (a record of what its calls made static on use
        serves only the code that made it)."""
        code = getattr(self.fn, "__code__", None)
        h = hashlib.sha256(repr(self.fn).encode() if code is None else b"")
        for c in code_objects(code) if code is not None else ():  # its comprehensions' and lambdas' too
            consts = [x for x in c.co_consts if not isinstance(x, types.CodeType)]  # (their repr has an address)
            h.update(repr((c.co_code, consts, c.co_names, c.co_varnames)).encode())
        return h.hexdigest()

    def _learned_static(self) -> set[str]:
        """Once per process, at the first compile: the parameters an earlier process's calls of this code made
        static on use (so its first call traces once, not twice) that are not static yet."""
        if self._static_loaded:
            return set()
        self._static_loaded = True
        params = {p.name for p in self.signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL,
                                                                                       p.VAR_KEYWORD)}
        code = self._code_digest()
        names = set(kernel_cache.load_static(self.qualified_name, code)) & params
        symbolic, demoted = kernel_cache.load_int_sizes(self.qualified_name, code)
        self.int_sizes.load(set(symbolic) & names, demoted)
        self._static_on_use |= names - self.static
        return names - self.static

    @property
    def cache(self) -> Mapping[tuple, Overload | Any]:
        """Every signature compiled so far -> its Overload (or jitop.dispatch.FALLBACK): a read-only view."""
        return self.dispatcher.signatures()

    @property
    def hits(self) -> int:
        """Calls served by an already compiled signature (through the native entry or not)."""
        return self.dispatcher.hits

    @property
    def misses(self) -> int:
        """Calls that traced (and compiled, or found on disk) a new signature."""
        return self.dispatcher.misses

    def clear_cache(self) -> None:
        """Forget every compiled signature (the next call of each traces and compiles again)."""
        self.dispatcher.clear()

    # ** calling **
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs:
            r = self.dispatcher.entry(*args)
            if r is not _MISS:
                return r
        return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict) -> Any:
        """A call the native entry did not serve. Apart from __call__ so that its closures (which make cells of
        the variables they capture, on every call) cost nothing on the native path: ~35 ns of a 0.27 µs call."""
        if Tracer in map(type, args) or kwargs and Tracer in map(type, kwargs.values()):
            return self.fn(*args, **kwargs)  # called from inside another kernel's trace: trace through
        on_device = self.gpu is not None and \
            (DeviceArray in map(type, args) or pytree.any_leaf((args, kwargs), is_device_array))
        if on_device:
            return self._call_on_device(args, kwargs)
        try:
            values, key, tree = self._bind(args, kwargs)
        except _CalledWhileTracing:  # the same, with tracers inside a list/tuple/dict argument
            return self.fn(*args, **kwargs)
        ov = self.dispatcher.lookup(key)
        if ov is None:  # a new size of a symbolic signature: served without tracing
            ov = self.dispatcher.lookup(key, values, struct_key(key))
        if ov is None:
            ov = self._compile(key, values, lambda: self.fn(*args, **kwargs), tree)
        if ov is FALLBACK or ov is PENDING:
            return self.fn(*args, **kwargs)
        if not kwargs and ov.spec is not None and not ov.native and self._positional \
                and len(values) == len(args) <= fastcall.MAX_PARAMS:
            self.dispatcher.promote(ov, lambda: _native_spec(ov, values, args))
        ov.calls += 1
        if ov.seconds is None:
            return self.dispatcher.first_call(ov, values, lambda: self(*args, **kwargs))
        return ov.call(values)

    def _call_on_device(self, args: tuple, kwargs: dict) -> Any:
        """A GPU kernel called with device arrays (jitop's, or anything with __cuda_array_interface__: torch,
        CuPy) among its arguments (by position or keyword, or inside lists, tuples and dicts): compiled for their
        shapes and dtypes, run on them in place; its results are device arrays."""
        key = self._arrays_key(args) if not kwargs else None
        if key is not None:  # arrays by position (the common call): keyed as `_bind` keys them, no stand-ins
            values, tree, device = args, None, None
        else:
            device = {}  # id of a stand-in -> the device array it stands for

            def stand_in(value: Any) -> Any:
                leaves, tree = pytree.flatten(value)
                keyed = [_stand_in(leaf) for leaf in leaves]
                device.update((id(s), leaf) for s, leaf in zip(keyed, leaves) if s is not leaf)
                return pytree.unflatten(tree, keyed)
            values, key, tree = self._bind(tuple(map(stand_in, args)), {k: stand_in(v) for k, v in kwargs.items()})
        ov = self.dispatcher.lookup(key) or self.dispatcher.lookup(key, values, struct_key(key), device is None) \
            or self._compile(key, values if device is not None else list(map(_stand_in, values)), None, tree)
        if ov is FALLBACK:
            raise TypeError(f"jitop.kernel '{self.__name__}' does not compile for the GPU (see the warning), and "
                            "numpy cannot read device arrays: pass numpy arrays, or change the function")
        return ov.call(values if device is None else [device.get(id(v), v) for v in values])

    def _arrays_key(self, args: tuple) -> tuple | None:
        """The key `_bind` gives a call whose arguments are, by position, numpy arrays or jitop DeviceArrays
        (each its (dtype, shape)), or ints of size symbols; None for any other call."""
        if not self._by_position or len(args) != len(self._static_flags):
            return None
        key = []
        for a, flag in zip(args, self._static_flags):
            if type(a) is DeviceArray or type(a) is np.ndarray:
                key.append((a.dtype, a.shape))
            elif type(a) is int and flag is _INT_SIZES and MIN_SYMBOL <= a <= SYMBOL_MAX:
                key.append(("symint", a))  # a size symbol's value (a decode step's t), as `_flatten_params` keys it
            else:
                return None
        return tuple(key)

    def _bind(self, args: tuple, kwargs: dict) -> tuple[Sequence[Any], tuple, Any]:
        """(values, key, tree) of a call: what the kernel reads (each parameter's value, or in place of a
        container of arrays its leaves), the cache key and the parameters' structure (None if nothing was
        flattened). Raises _CalledWhileTracing if a container holds a tracer."""
        if self._simple and not kwargs and len(args) == len(self._static_flags) and not any(map(pytree.is_node, args)):
            # fast path: arrays key on (dtype, shape) directly
            key = tuple([(a.dtype, a.shape) if type(a) is np.ndarray else argspec(a, False) for a in args])
            try:
                hash(key)
                return args, key, None
            except TypeError:
                pass
        values = self._binder(args) if not kwargs and self._binder is not None else None
        if values is None:
            bound = self.signature.bind(*args, **kwargs)  # raises Python's TypeError for a call that cannot bind
            bound.apply_defaults()
            values = list(bound.arguments.values())
        return self._keyed(values)

    def _keyed(self, values: Sequence[Any]) -> tuple[list[Any], tuple, Any]:
        """(leaves, cache key, structure) of bound parameter values; a key holding an unhashable static value
        (a list, an array) is the leaves' identities."""
        leaves, specs, tree = self._flatten_params(values)
        key = specs if tree is None else ("pytree", tree, specs)
        try:
            hash(key)
        except TypeError:
            key = ("unhashable", tuple(id(v) for v in leaves))
        return leaves, key, tree

    def _flatten_params(self, values: Sequence[Any]) -> tuple[list[Any], tuple, Any]:
        """(leaves, their argspecs, structure) of bound parameter values. A non-static list, tuple or dict (a
        *args tuple, a **kwargs dict) holding arrays is a pytree (jitop.pytree): its leaves take its place, and
        a container in it without arrays is one static leaf. The structure is None if nothing was flattened."""
        leaves: list[Any] = []
        specs: list[tuple] = []
        defs = []
        for v, flag in zip(values, self._static_flags):
            if flag is _INT_SIZES and type(v) is int and MIN_SYMBOL <= v <= SYMBOL_MAX:
                leaves.append(v)
                specs.append(("symint", v))  # its value is the kernel's size symbol (the structure drops it)
                defs.append(None)
                continue
            static = flag is True or (flag is _SCALARS_STATIC or flag is _INT_SIZES) and type(v) in _PYTHON_SCALARS
            if static or not pytree.is_node(v) or not _holds_array(v):
                leaves.append(v)
                specs.append(argspec(v, static))
                defs.append(None)
                continue
            sub, tree = pytree.flatten(v, is_leaf=_array_free)
            leaves += sub
            if set(map(type, sub)) == _JUST_ARRAYS:  # the common case, without a Python call per leaf
                specs += map(_DTYPE_SHAPE, sub)
            else:
                specs += [(x.dtype, x.shape) if type(x) is np.ndarray else _leaf_spec(x) for x in sub]
            defs.append(tree)
        nested = any(d is not None for d in defs)
        return leaves, tuple(specs), ((tuple, tuple(defs)) if nested else None)

    def _compile(self, key: tuple, values: Sequence[Any], run_numpy: Callable[[], Any] | None = None,
                 tree: Any = None, beside: bool = True) -> Overload | Any:
        """What serves `key`: the dispatcher's, else traced and built (the disk cache, else compiled and saved),
        verified (JITOP_VERIFY=1), or FALLBACK when it runs as numpy; PENDING (this call runs as numpy) while a
        child process builds it (compile="background", unless `beside` is False)."""
        learned = self._learned_static() if tree is None else set()
        if learned:
            self._set_static(self.static | learned)
            return self._compile(self._keyed(values)[1], values, run_numpy, tree, beside)
        struct = struct_key(key)
        build = functools.partial(self._build, values, run_numpy, tree, struct, key, beside)
        try:
            with full_collections_deferred():  # (a trace and a build allocate much and keep it to the end)
                ov = self.dispatcher.get(key, build, memo=struct is not None, struct=struct, leaves=values)
        except _Restart as restart:  # a parameter became static (or a size symbol): keyed again
            static_key = self._flatten_params(values)[1]
            if static_key == key and restart.err is not None:  # never: a static parameter is traced as its value
                return self._fall_back(restart.err, _BUILD_DEPTH - 1)
            return self._compile(static_key, values, run_numpy, tree, beside)
        workloads.maybe_flush()
        if self.autotune == "background" and isinstance(ov, Overload) and ov.tasks:
            watch_for_autotune(self)
        return ov

    def _build(self, values: Sequence[Any], run_numpy: Callable[[], Any] | None, tree: Any,
               struct: Any = None, key: Any = None, beside: bool = False) -> Overload | Any:
        # which dims are symbolic (a `dynamic=` that does not fit the call raises here, not as a fallback)
        dims = self._dynamic_dims(struct, values, tree) if struct is not None else {}
        if self._sizes_varied(struct):
            raise _Restart(None)
        owner = self._beside_owner(key, struct, dims) if beside and run_numpy is not None else None
        if owner is not None and build_beside.pending(owner):
            return PENDING  # a child builds for this structure: no record to look for yet
        records = self._warm_records(key, tree, dims)
        try:
            ov = self._from_record(records, values, tree)
            build = functools.partial(self._trace_and_build, values, tree, struct, dims, records)
            if ov is None and owner is not None and self._deferred(owner, key, struct, records, build):
                return PENDING  # (before the checks below: they are the child's, and this process's at the load)
            ov = ov or build()
            for name, why in ov.trace.fixed_sizes.items():
                self.int_sizes.demote(name, why)
                self._set_static(self.static)
            why = self.policy.compiled(struct, ov.accepts is not None) if struct is not None else None
            why = why or self._static_recompiles(struct)
            if why and self.warn_recompiles:
                warnings.warn(f"jitop.kernel '{self.__name__}': {why}", JitopRecompileWarning, stacklevel=_BUILD_DEPTH)
            if config.verify() and run_numpy is not None:
                ov = self._verified(ov, values, run_numpy, _BUILD_DEPTH)
            return ov
        except Warning:  # one made an exception (warnings.simplefilter("error")): the caller's, not jitop's failure
            raise
        except ScalarNeeded as err:
            if self._made_static(err, tree):
                raise _Restart(err) from None
            return self._fall_back(err, _BUILD_DEPTH)
        except (Unsupported, TracerConversionError, NotImplementedError) as err:
            if self._sizes_failed(struct, err):
                raise _Restart(None) from None
            return self._fall_back(err, _BUILD_DEPTH)
        except Exception as err:
            # numpy's own error (a shape mismatch, say) must surface as numpy raises it; if numpy
            # succeeds, jitop failed on valid code: run it as numpy rather than break it (or, where a size
            # symbol was traced, trace again with the int's value: a bad call never makes it static for good)
            numpy_error = None if run_numpy is None else self._numpy_raises(run_numpy)
            if run_numpy is None or numpy_error is not None and type(numpy_error) is type(err):
                raise
            if self._sizes_failed(struct, err):
                raise _Restart(None) from None
            if numpy_error is not None:  # numpy fails first, elsewhere: its error is the function's
                raise numpy_error
            internal = Unsupported(f"jitop internal error {type(err).__name__}: {err}")
            internal.__cause__ = err  # fallback=False shows where jitop failed, not only that it did
            return self._fall_back(internal, _BUILD_DEPTH)

    def _beside_owner(self, key: Any, struct: Any, dims: Mapping[int, Sequence[int]]) -> tuple | None:
        """compile="background": what a child builds this call's kernel for (this function, the argument structure,
        whether its kernel is symbolic: a call that made it symbolic is built anew), or None where it is built
        here: the child's kernel reaches this process through the disk cache only, and a CUDA context does not
        survive a fork."""
        if self.compile_mode != "background" or self.gpu is not None or struct is None or not config.cache_enabled():
            return None
        specs = key[2] if key[:1] == ("pytree",) else key
        return id(self), struct, bool(dims) or any(s[:1] == ("symint",) for s in specs)

    def _deferred(self, owner: tuple, key: Any, struct: Any, records: tuple[str, str] | None,
                  build: Callable[[], Overload]) -> bool:
        """Whether a child builds this call's kernel (the call runs as numpy): found afterwards by its warm records,
        or for a function without any by tracing it here once the child is done (its kernel, from the disk
        cache); a symbolic kernel by its structure's record."""
        where = records or (f"traced {id(self)} {hash(key)}", f"traced {id(self)} {hash(struct)}")
        return build_beside.defer(where if owner[2] else where[:1], owner, build)

    def _param_leaves(self, struct: Any) -> list[str] | None:
        """The parameters' names where `struct` has one leaf per parameter (no containers, no *args), else None:
        only such a parameter's int may be a size symbol."""
        names = list(self.signature.parameters)
        return None if struct is None or struct[:1] == ("pytree",) or len(struct) != len(names) else names

    def _sizes_varied(self, struct: Any) -> bool:
        """Whether this call makes Python int parameters size symbols (their value varied; IntPolicy): then it is
        keyed again. Only for parameters that are leaves of their own (on the CPU and the GPU alike)."""
        names = self._param_leaves(struct)
        if names is None or not self.int_sizes.varied(struct, names, self._static_on_use):
            return False
        self._set_static(self.static)
        return True

    def _sizes_failed(self, struct: Any, err: Exception) -> bool:
        """After a trace with size symbols failed (`err`): those parameters static again, True (keyed again)."""
        names = self._param_leaves(struct)
        if names is None:
            return False
        failed = [name for name, spec in zip(names, struct) if spec[:1] == ("symint",)]
        for name in failed:
            self.int_sizes.demote(name, f"the trace with {name} as a size symbol failed ({type(err).__name__}: "
                                        f"{err})")
        self._set_static(self.static)
        return bool(failed)

    def rebuild(self, old: Overload) -> bool:
        """Build `old`'s signature again from its trace (configs picked anew: a tuned record arrived), off the
        call path, then swap it in at once: the next call runs the new kernel, calls in flight finish on the
        old one. Returns whether it swapped (False if the signature changed meanwhile)."""
        return self.dispatcher.replace(old, self.built_again(old))

    def built_again(self, old: Overload) -> Overload:
        """A new kernel for `old`'s signature from its trace, configs picked anew; not swapped in."""
        tr = old.trace if not old.trace.recorded else self._traced_for(old.key)
        prep = prepare(self.__name__, tr.inputs, tr.names, tr.plan, tr.results, guards=tr.shape_guards,
                       bounds=tr.bounds, reps=tr.reps)
        exe, lookup = kernel_cache.load_or_build(prep, self.qualified_name)
        exe.set_result(tr.result)
        new = self._overload(exe, tr, lookup, [task for task, _ in prep.choices.values()])
        new.key = old.key
        return new

    def _verified(self, entry: Overload, values: Sequence[Any], run_numpy: Callable[[], Any],
                  stacklevel: int = 4) -> Any:
        """JITOP_VERIFY=1: the kernel's result on this call's arguments against numpy's, before first use; a
        kernel that disagrees is never used (this signature runs as numpy, with a warning) nor kept on disk."""
        from jitop.verify import compare
        writes = entry.trace.writes
        if writes:  # each side on copies (the call that follows changes the caller's arrays, once)
            mine, theirs = ([v.copy() if isinstance(v, np.ndarray) else v for v in values] for _ in range(2))
            pos, kw = _split_values(self, theirs, entry.trace.arg_tree)
            mismatch = compare((entry.call(mine), [mine[w.leaf] for w in writes]),
                               (self.fn(*pos, **kw), [theirs[w.leaf] for w in writes]))
        else:
            mismatch = compare(entry.call(values), run_numpy())
        key = entry.lookup.key if entry.lookup is not None else None
        if mismatch is None:
            if key is not None and entry.lookup.status in ("hit", "miss"):
                kernel_cache.mark_verified(key, "numpy")
            return entry
        if key is not None:
            kernel_cache.forget(key)
        warnings.warn(f"jitop.kernel '{self.__name__}' disagrees with numpy (JITOP_VERIFY=1): {mismatch}; this "
                      "signature runs as plain numpy. Please report it.", RuntimeWarning, stacklevel=stacklevel)
        return FALLBACK

    def _trace_and_build(self, values: Sequence[Any], tree: Any = None, struct: Any = None,
                         dims: Mapping[int, Sequence[int]] | None = None,
                         records: tuple[str, str] | None = None) -> Overload:
        """Trace (with `dims` symbolic: leaf index -> dims) and build. A symbolic trace or build that fails is
        done again with constant dims; if that works, this structure stays constant (the reason is kept).
        `records`: where the next process finds the kernel without tracing (`_warm_records`)."""
        if dims:
            try:
                return self._build_trace(self.trace(values, tree, dims), records)
            except Exception as err:  # noqa: BLE001 - the safety net: a symbol never makes a call fail
                symbolic_error = err
            ov = self._build_trace(self.trace(values, tree), records)  # its error, if any, is the call's
            self.policy.refuse(struct, f"{type(symbolic_error).__name__}: {symbolic_error}")
            return ov
        return self._build_trace(self.trace(values, tree), records)

    def _traced_for(self, key: tuple) -> Trace:
        """The trace of a signature whose overload came from a warm record (its key `_recordable`: arrays of no
        memory of their own stand in for the arguments; the trace reads only their shapes and dtypes)."""
        tree, specs = (key[1], key[2]) if key[:1] == ("pytree",) else (None, key)
        values = [_stand_in_for(spec) for spec in specs]
        return self.trace(values, tree, self._dynamic_dims(struct_key(key), values, tree))

    def _warm_records(self, key: Any, tree: Any, dims: Mapping[int, Sequence[int]]) -> tuple[str, str] | None:
        """Where this call's warm record may be (jitop.graph.warm): keyed by the call's exact key, and (a symbolic
        kernel's, serving other sizes) by its structure, for the CPU or the GPU target. None: a call with static
        values other than Python scalars, a function without a fingerprint, or JITOP_WARM_RECORDS=0."""
        specs = key[2] if key is not None and key[:1] == ("pytree",) else key
        if key is None or key[:1] == ("unhashable",) or \
                not all(_recordable(s) for s in specs) or not config.warm_records():
            return None
        printed = warm.fingerprint(self.fn)
        if printed is None:
            return None
        parts = (self.qualified_name, printed, dims, (self.gpu or default_target()).key, kernel_cache.code_version())
        return warm.record_key(parts, key), warm.record_key(parts, struct_key(key))

    def _from_record(self, records: tuple[str, str] | None, values: Sequence[Any], tree: Any) -> Overload | None:
        """The overload a warm record names for this call, built without tracing, or None. (Its `trace` holds
        what a call needs only; `explain` and a rebuild trace the function.)"""
        for k, where in enumerate(records or ()):
            found = warm.load(where, default_target()) if self.gpu is None else warm.load_gpu(where)
            if found is None:
                continue
            exe, result, writes, python_ints, tasks = found
            if exe.symbolic != (k == 1) or exe.symbolic and not exe.accepts(values):
                continue
            # (a fingerprinted function reads no array by name: its guards are values, checked on each call)
            guards = capture(self.fn, True, Tracer).guards
            tr = Trace(result=result, writes=writes, python_ints=python_ints, guards=guards, arg_tree=tree,
                       recorded=True)
            if self.gpu is not None:
                return self._gpu_overload(exe, tr)
            lookup = kernel_cache.Lookup("hit", reason="named by a warm record: the function was not traced")
            return self._overload(exe, tr, lookup, tasks)
        return None

    def _dynamic_dims(self, struct: Any, values: Sequence[Any], tree: Any) -> dict[int, tuple[int, ...]]:
        shapes = [v.shape if isinstance(v, np.ndarray) else None for v in values]
        dims = self.policy.dims(struct, self._leaf_names(tree), shapes)
        # sizes 0 and 1 are traced as constants (they broadcast): a call with only those traces as before
        dims = {k: tuple(d for d in ds if shapes[k][d] >= MIN_SYMBOL) for k, ds in dims.items()}
        return {k: ds for k, ds in dims.items() if ds}

    def _leaf_names(self, tree: Any) -> list[str]:
        """Each leaf's name: its parameter's, or inside a container its path (`params[0]['w']`)."""
        if tree is None:
            return list(self.signature.parameters)
        return [p for name, d in zip(self.signature.parameters, tree[1]) for p in pytree.paths(d, name)]

    def _build_trace(self, tr: Trace, records: tuple[str, str] | None = None) -> Overload:
        if self.gpu is not None:
            if any(w.early is None for w in tr.writes):  # (a row given as an argument is written before the kernel)
                raise Unsupported("in-place assignment of a computed value to an argument of a GPU kernel",
                                  "return the new value, or assign through the device array's index outside")
            from jitop.graph.gpu import compile_graph_gpu
            exe = compile_graph_gpu(self.__name__, tr.inputs, tr.names, tr.plan, tr.results, self.gpu,
                                    tr.shape_guards, tr.reps, tr.bounds)
            exe.set_result(tr.result)
            if records is not None:
                warm.save_gpu(records[exe.symbolic], exe, tr.result, tr.writes, tr.python_ints)
            return self._gpu_overload(exe, tr)
        # memory missed: the disk cache, keyed on this trace, else compile (and save)
        prep = prepare(self.__name__, tr.inputs, tr.names, tr.plan, tr.results, guards=tr.shape_guards,
                       bounds=tr.bounds, reps=tr.reps)
        exe, lookup = kernel_cache.load_or_build(prep, self.qualified_name)
        exe.set_result(tr.result)
        if tr.sizes:
            tr.flops = flops_at(prep, tr.env)
        if records is not None:
            warm.save(records[exe.symbolic], prep, lookup.key, tr.result, tr.writes, tr.python_ints)
        return self._overload(exe, tr, lookup, [task for task, _ in prep.choices.values()])

    def _gpu_overload(self, exe: Any, tr: Trace) -> Overload:
        return self._guarded(Overload(exe.call, exe, tr, native=False, accepts=exe.accepts if exe.symbolic else None))

    def _overload(self, exe: Executable, tr: Trace, lookup: Any, tasks: list[Task]) -> Overload:
        # a function reading globals/closure data, computing with Python ints or writing an argument whole
        # has no native entry: `call` serves it alone (a region's write, the entry makes)
        guarded = bool(tr.guards or tr.python_ints or any(w.spec is None for w in tr.writes))
        return self._guarded(Overload(exe.call, exe, tr, lookup, tasks, native=not guarded,
                                      accepts=exe.accepts if exe.symbolic else None))

    def _guarded(self, ov: Overload) -> Overload:
        """`ov`, whose call first checks the globals/closure data its trace read (traced again if they changed)
        and runs as numpy a call whose Python int arithmetic goes beyond int64, where its trace needs either. A
        symbolic one serves new sizes through the executable it holds now (a re-trace replaces it). Arguments
        the function assigns to get their new values (_run_writing)."""
        if ov.trace.guards or ov.trace.python_ints:
            ov.call = _guarded_call(ov, self)
            if ov.accepts is not None:
                ov.accepts = lambda leaves: ov.exe.accepts(leaves)
        elif ov.trace.writes:
            ov.call = functools.partial(_run_writing, ov, self)
        return ov

    @property
    def qualified_name(self) -> str:
        """module.qualname of the decorated function (its identity in the cache and the workload log)."""
        return f"{getattr(self.fn, '__module__', None) or '?'}.{getattr(self.fn, '__qualname__', self.__name__)}"

    # ** tracing **
    def trace(self, values: Sequence[Any], tree: Any = None,
              dynamic: Mapping[int, Sequence[int]] | None = None) -> Trace:
        """Run the function on tracers; the graph of every array it returns. `values`: one per parameter, or
        with `tree` (the structure `_bind` gave) the call's leaves. `dynamic`: leaf index -> the dims traced as
        symbols (`x_0`; sizes 0 and 1 stay constants)."""
        if tree is not None:
            values = pytree.unflatten(tree, values)
        leaves, specs, tree = self._flatten_params(values)
        code = getattr(self.fn, "__code__", None)
        sized = dynamic or any(s[:1] == ("symint",) for s in specs)
        env = ShapeEnv(user_files={code.co_filename} if code else set()) if sized else None
        tr = Trace(arg_tree=tree, env=env)
        self.traces += 1
        with env.active() if env is not None else contextlib.nullcontext():
            self._trace_into(tr, leaves, specs, tree, dynamic or {})
        if env is not None and env.symbols:
            self._settle_symbols(tr, env)
        return tr

    def _settle_symbols(self, tr: Trace, env: ShapeEnv) -> None:
        """After a symbolic trace: the graph with its ties substituted, the guards every call checks, the
        size buckets of symbolic matmul rows, and the dims the user's code made constant (for explain)."""
        tr.inputs, tr.results = resolve_graph(env, tr.inputs, tr.results)
        # every symbol is at least MIN_SYMBOL (the trace proved things from it: a symbol is never 1), then what
        # the trace decided at this call's sizes
        tr.shape_guards = [f"{name} >= {MIN_SYMBOL}" for name in tr.sizes] + \
            [f"{expr_str(g.expr)} {g.op} 0" for g in env.current_guards()]
        # a symbolic matmul row count: a kernel per size bucket, its config decided at the bucket's size
        tr.reps, buckets = row_buckets(tr.results, env.hint)
        tr.shape_guards += [f"{expr_str(m)} {rel}" for m, rel in buckets]
        tr.bounds = env.bounds()
        # a size symbol the trace tied or fixed stays the kernel's (its input holds it): the tie is a guard
        for n in tr.inputs:
            held = n.param("holds") if n.prim == "scalar_arg" else None
            if held is not None and held in env.subst:
                tied = as_dim(env.resolve(held))
                tr.shape_guards.append(f"{held.name} == {tied if isinstance(tied, int) else expr_str(tied)}")
        for sp in env.specialised:
            for sym in sp.symbols:
                leaf, dim = tr.symbols[sym]
                if dim == VALUE:  # a Python int the code needs as an int: static again
                    tr.fixed_sizes[leaf] = str(sp)
                else:
                    self.policy.static[(leaf, dim)] = str(sp)

    def _trace_into(self, tr: Trace, leaves: list, specs: tuple, tree: Any,
                    dynamic: Mapping[int, Sequence[int]]) -> None:
        names = self._leaf_names(tree)
        inputs = []
        for k, (name, v, spec) in enumerate(zip(names, leaves, specs)):
            if spec[0] == "unsupported":
                raise Unsupported(f"argument {name} is a {type(v).__name__}, inside a list/tuple/dict of arrays "
                                  "(jitop traces the arrays and numbers in there, and keeps None, strings and "
                                  "containers without arrays as constants; pass other objects as arguments of "
                                  "their own)")
            if spec[0] == "symint":
                inputs.append(self._size_symbol(k, name, v, tr))
            else:
                inputs.append(v if spec[0] == "static" else self._tracer_for(k, name, v, tr, dynamic.get(k, ())))
        pos, kw = _split_values(self, inputs, tree)
        # captured arrays are traced as live constants (read in place), and arrays the function creates with
        # np.zeros & co. as tracers (it may fill them in place); if the function uses one outside the tracer (an
        # `if` on its values, say), it is traced again with them as constants (captured ones guarded by contents)
        for live in (True, False):
            cap = capture(self.fn, live, lambda n: Tracer(n, array0d=True), TRACING_NUMPY if live else None)
            try:
                with reading(cap.live), mutation.tracking() as assigned:
                    result = cap.fn(*pos, **kw)
                break
            except ScalarNeeded:
                raise  # the same without live arrays: make the scalar static instead
            except (Unsupported, TracerConversionError):
                if not (live and cap.fn is not self.fn):
                    raise
        tr.guards = cap.guards
        returned = _returned_tracers(result)
        writes = writeback.plan(assigned.written, {id(t) for t in returned}, [t.node for t in returned])
        tr.results, tr.result = _flatten(result, writes, assigned.written)
        # an update written into the caller's array before the kernel runs is read there
        tr.results = substituted(tr.results, writeback.early_updates(writes, assigned.written))
        tr.writes = tuple(w for w, _ in writes)
        mutation.check(tr.results)
        # a Python-level check (7 // n of a Python int n, or n + 1 meeting an int8 array) raises whatever the
        # arrays it meets: computed as results of their own (not returned), never skipped for an empty array
        checks = [n for n in toposort(tr.results) if n.prim == "ufunc" and n.param("name").startswith("py_")]
        tr.results += checks + [n for n in assigned.checks if n not in checks]  # (indices an empty result never read)
        tr.python_ints = any(n.param("name").endswith("_int") or n.param("name") == "py_lshift" for n in checks)
        _bound_python_ints(tr, assigned.python_ints)

    def _tracer_for(self, k: int, name: str, value: Any, tr: Trace, dynamic: Sequence[int] = ()) -> Any:
        if isinstance(value, np.ndarray) and type(value) is not np.ndarray:
            raise Unsupported(f"argument '{name}' of type {type(value).__name__} (an ndarray subclass)")
        if isinstance(value, np.ndarray):
            if value.dtype.name not in dtypes.DTYPES:
                raise Unsupported(f"argument '{name}' of dtype {value.dtype}")
            shape = [self._symbol(tr, name, d, size) if d in dynamic else size for d, size in enumerate(value.shape)]
            n = node("arg", shape, dtypes.as_dtype(value.dtype), index=k)
            # a non-native byte order is converted on each call (the kernel reads native values)
            tr.plan.append(("arg", k) if value.dtype.isnative else ("arg_swapped", (k, value.dtype.newbyteorder("="))))
        elif isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
            # no int64 holds it: numpy treats it by its exact value (uint64, float, object or OverflowError),
            # so it is a constant of this trace (the key holds the value)
            return value
        elif isinstance(value, (bool, int, float, np.generic)) and not isinstance(value, np.ndarray):
            if isinstance(value, np.generic) and value.dtype.name not in dtypes.DTYPES:
                raise Unsupported(f"argument '{name}' of dtype {value.dtype}")
            dt = dtypes.scalar_dtype(value)
            n = node("scalar_arg", (), dt, weak=not isinstance(value, np.generic), index=k)
            tr.plan.append(("scalar", (k, dt.np)))
        else:
            return value  # other Python objects act as constants of this trace (part of the key)
        tr.inputs.append(n)
        tr.names.append(name if name.isidentifier() else _identifier(name))
        if n.prim == "arg":  # numpy keeps a non-native byte order through views and copies
            return Tracer(n, array0d=True, order=None if value.dtype.isnative else value.dtype)
        return Tracer(n)

    @staticmethod
    def _size_symbol(k: int, name: str, value: int, tr: Trace) -> SymInt:
        """A Python int argument used as a size, as the symbol `<name>`: its value binds it on each call (a 0-d
        int64 input holding it), and the trace sees a SymInt."""
        symbol = _identifier(name)
        tr.symbols[symbol] = (name, VALUE)
        sym = tr.env.symbol(symbol, value)
        tr.env.held[sym] = node("scalar_arg", (), dtypes.int64, weak=True, index=k, holds=sym)
        tr.inputs.append(tr.env.held[sym])
        tr.names.append(symbol)
        tr.plan.append(("scalar", (k, dtypes.int64.np)))
        return SymInt(sym, tr.env)

    @staticmethod
    def _symbol(tr: Trace, name: str, dim: int, size: int) -> Any:
        """Dim `dim` of leaf `name` as a symbol named `<name>_<dim>` (sizes 0 and 1: the int itself)."""
        symbol = f"{_identifier(name)}_{dim}"
        tr.symbols[symbol] = (name, dim)
        return tr.env.symbol(symbol, size)

    @staticmethod
    def _numpy_raises(run_numpy: Callable[[], Any]) -> Exception | None:
        """The exception running the function as numpy raises, if any."""
        try:
            run_numpy()
        except Exception as err:  # noqa: BLE001 - any error of the user's function
            return err
        return None

    # ** fallback **
    def _fall_back(self, err: Exception, stacklevel: int = 4) -> Any:
        construct = getattr(err, "construct", None) or f"{type(err).__name__}: {err}"
        message = f"jitop.kernel '{self.__name__}' runs as plain numpy: {err} ({self._user_line(err)})"
        if not self.fallback:
            raise FallbackError(message.replace("runs as plain numpy", "cannot be compiled")) from err
        if construct not in self._warned:
            self._warned.add(construct)
            warnings.warn(message, JitopFallbackWarning, stacklevel=stacklevel)
        return FALLBACK

    def _user_line(self, err: Exception) -> str:
        code = getattr(self.fn, "__code__", None)
        frames = [f for f in traceback.extract_tb(err.__traceback__) if code and f.filename == code.co_filename]
        # (an error found after the construct was made carries the stack of where it was: a returned mask read)
        frames = frames or [f for f in getattr(err, "stack", ()) if code and f.filename == code.co_filename]
        if not frames:
            return f"{code.co_filename}:{code.co_firstlineno}: def {self.__name__}" if code else "source line unknown"
        f = frames[-1]
        return f"{f.filename}:{f.lineno}: {(f.line or '').strip()}"

    # ** introspection **
    def profile(self, *args: Any, repeat: int = 10, **kwargs: Any) -> "Profile":
        """Where a call with these arguments spends its time: a profiling build (cycle counters around each
        loop nest) run `repeat` times; `print(f.profile(a, b))` lists the slowest loop nests."""
        if self.gpu is not None:
            raise NotImplementedError(f"profile() of '{self.__name__}': it times CPU loop nests; this kernel runs on "
                                      "the GPU (explain() lists its launches; time calls with CUDA events: "
                                      "jitop.runtime.cuda.driver.Event)")
        from jitop.runtime.profile import Profile, profile_executable
        values, _, tree = self._bind(args, kwargs)
        tr = self.trace(values, tree)
        exe = compile_graph(self.__name__, tr.inputs, tr.names, tr.plan, tr.results, profile=True)
        return profile_executable(exe, values, repeat)

    def tuning_tasks(self, *args: Any, **kwargs: Any) -> list[Task]:
        """The tuning tasks (each matmul/conv2d workload) of a call with these arguments, one per use, without
        compiling anything; `jitop.tuner.extract_tasks` and `jitop.tune` ask this."""
        values, _, tree = self._bind(args, kwargs)
        return graph_tasks(self.trace(values, tree).results)

    def explain(self, *args: Any, **kwargs: Any) -> str:
        """Print and return the traced graph, fusion groups, schedules, the disk cache's answer (its key parts,
        and on a miss the part that differed from the nearest stored entry) and loop IR for these arguments."""
        values, key, tree = self._bind(args, kwargs)
        struct = struct_key(key)
        cached = self.dispatcher.find(key, values, struct) is not None
        entry = self._compile(key, values, lambda: self.fn(*args, **kwargs), tree, beside=False)
        if entry is not FALLBACK and entry.trace.recorded:  # built from a warm record: traced now
            entry = self._build_trace(self.trace(values, tree, self._dynamic_dims(struct, values, tree)))
        if entry is FALLBACK:
            text = f"{self.__name__}: runs as plain numpy for this signature (see the warning)"
        elif self.gpu is not None:
            from jitop.graph.explain import shape_lines
            from jitop.graph.gpu import explain_gpu
            shapes = shape_lines(entry.trace, self.policy.why, self.policy.static, self.policy.refused())
            text = explain_gpu(self.__name__, entry.exe, entry.trace, cached, self.gpu, shapes)
        else:
            from jitop.graph.explain import describe, shape_lines
            func = entry.exe.func
            if func is None:  # loaded from disk without its loop IR: rebuilt for display only
                tr = entry.trace
                func = compile_graph(self.__name__, tr.inputs, tr.names, tr.plan, tr.results,
                                     guards=tr.shape_guards, bounds=tr.bounds, reps=tr.reps).func
            shapes = shape_lines(entry.trace, self.policy.why, self.policy.static, self.policy.refused())
            text = describe(self.__name__, entry.exe, entry.trace, cached, entry.lookup, func, shapes)
        print(text)
        return text


# the schedule sources changed (records applied or removed): compiled kernels may hold stale configs
on_sources_changed(dispatch.clear_all)


def _native_spec(ov: Overload, values: Sequence[Any], args: tuple) -> Any:
    """The fastcall.Spec of an overload for a call of positional arguments, or None if it has none. The native
    entry checks positional arguments only, so it serves a signature whose leaves (`values`) are the call's
    positional arguments themselves (true of every call with this key, as the key holds the structure)."""
    specs = _leaf_specs(ov.key)
    if specs is None or len(values) != len(args) or any(v is not a for v, a in zip(values, args)):
        return None
    scalars = {k: int if part[0] == "symint" else part[1] for k, part in enumerate(specs)
               if part[0] in ("scalar", "symint")}
    if not ov.trace.writes:
        return ov.exe.fast_spec(len(values), scalars)
    # a function writing regions of its arguments: the entry copies them in (its checks first: any that fails
    # is a miss, and _run_writing serves the call), and returns the function's result alone
    copies = writeback.copies_in(ov.trace.writes, values, _region_outputs(ov))
    if copies is None:
        return None
    return ov.exe.fast_spec(len(values), scalars, copies=copies, result=ov.trace.result[1][0])


def _region_outputs(ov: Overload) -> list[int | None]:
    """For each write of ov's trace, the output of its executable that holds the region's value (None for a
    write with no results): the trace's result tree is [function's tree, a tuple of results per write]."""
    slots = ov.exe.plan.result_slots
    return [slots[part[1][0][1]] if part[1] else None for part in ov.trace.result[1][1][1]]


def _guarded_call(entry: Overload, kf: KernelFunction) -> Callable[[Sequence[Any]], Any]:
    """entry's call, first checking the data the function captured; traced again for the new data if it
    changed (a rebound global), or run as numpy if that trace cannot compile."""
    def call(values: Sequence[Any]) -> Any:
        if holds(entry.trace.guards):
            return run(values)
        with kf.dispatcher.lock:
            if not holds(entry.trace.guards):
                pos, kw = _split_values(kf, values, entry.trace.arg_tree)
                try:  # device arrays (a GPU kernel's) are traced as host stand-ins of their shapes
                    new = kf._trace_and_build([_stand_in(v) for v in values], entry.trace.arg_tree)
                    if config.verify():
                        new = kf._verified(new, list(values), lambda: kf.fn(*pos, **kw))
                        if new is FALLBACK:
                            return kf.fn(*pos, **kw)
                except (Unsupported, TracerConversionError, NotImplementedError) as err:
                    kf._fall_back(err, _GUARDED_DEPTH)
                    return kf.fn(*pos, **kw)
                except Exception as err:
                    numpy_error = kf._numpy_raises(lambda: kf.fn(*pos, **kw))
                    if numpy_error is not None:
                        raise numpy_error if type(numpy_error) is not type(err) else err
                    kf._fall_back(Unsupported(f"jitop internal error {type(err).__name__}: {err}"), _GUARDED_DEPTH)
                    return kf.fn(*pos, **kw)
                kf.dispatcher.retire(entry)  # calls so far ran the old graph's tasks
                entry.exe, entry.trace, entry.lookup, entry.tasks = new.exe, new.trace, new.lookup, new.tasks
                entry.seconds = None
        return run(values)

    def run(values: Sequence[Any]) -> Any:
        try:  # (the trace in use now: a new one may write arguments where the old did not)
            return _run_writing(entry, kf, values) if entry.trace.writes else entry.exe.call(values)
        except OverflowError as err:
            if not (entry.trace.python_ints and str(err) == INT_BEYOND_64):
                raise
        # Python's int is bigger than int64: this call runs as numpy
        pos, kw = _split_values(kf, values, entry.trace.arg_tree)
        return kf.fn(*pos, **kw)
    return call


def _run_writing(entry: Overload, kf: KernelFunction, values: Sequence[Any]) -> Any:
    """entry's executable on `values` for a function that assigns to arguments in place: each argument gets
    its new value (jitop.graph.writeback). An argument numpy could not write (read-only) raises numpy's error;
    one written after the kernel and sharing memory with another argument makes the call run as numpy (the
    kernel reads each argument as it was, numpy's code would see its own writes through the other; a write
    made before the kernel, as numpy makes it, is seen by whatever reads its memory after)."""
    writes = entry.trace.writes
    for w in writes:
        target = values[w.leaf]
        if isinstance(target, np.ndarray) and not target.flags.writeable:  # (a GPU kernel's device array is)
            raise ValueError("assignment destination is read-only")
        if w.early is not None:
            continue
        for j, v in enumerate(values):  # (a loop, not any(): this runs on every call of a decode step)
            if j != w.leaf and isinstance(v, np.ndarray) and np.may_share_memory(target, v):
                pos, kw = _split_values(kf, values, entry.trace.arg_tree)
                return kf.fn(*pos, **kw)
    for w in writes:
        if w.early is not None:
            w.write_early(values)
    result, new = entry.exe.call(values)
    placed = {}
    for w, results in zip(writes, new):
        whole = None if w.early is not None else w.apply(values[w.leaf], results)
        if whole is not None:
            placed[id(whole)] = values[w.leaf]
    return _swapped(result, placed) if placed else result


def _swapped(result: Any, placed: Mapping[int, Any]) -> Any:
    """`result` with each array in `placed` (by identity) replaced by its value there: an argument the function
    wrote and returned is the caller's array itself, as in numpy."""
    if id(result) in placed:
        return placed[id(result)]
    if type(result) in (tuple, list):
        return type(result)(_swapped(x, placed) for x in result)
    if type(result) is dict:
        return {k: _swapped(v, placed) for k, v in result.items()}
    return result


def _inputs_only(ufunc: np.ufunc) -> Callable:
    """`jitop.kernel(np.exp)`: the ufunc as a function of its inputs alone. Its own signature has keyword-only
    options (dtype=, signature=) that a call may not pass together, even at their defaults."""
    def call(*inputs: Any) -> Any:
        return ufunc(*inputs)
    names = ["x"] if ufunc.nin == 1 else [f"x{i + 1}" for i in range(ufunc.nin)]
    call.__signature__ = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names])
    call.__name__ = call.__qualname__ = ufunc.__name__
    call.__doc__ = ufunc.__doc__
    return call


def _split_values(kf: KernelFunction, values: Sequence[Any], tree: Any = None) -> tuple[list, dict]:
    """Bound argument values (or with `tree`, the parameters' structure, a call's leaves) back into positional
    and keyword arguments of kf.fn."""
    if tree is not None:
        values = pytree.unflatten(tree, values)
    pos, kw = [], {}
    for (name, p), v in zip(kf.signature.parameters.items(), values):
        if p.kind is p.KEYWORD_ONLY:
            kw[name] = v
        elif p.kind is p.VAR_POSITIONAL:
            pos.extend(v)
        elif p.kind is p.VAR_KEYWORD:
            kw.update(v)
        else:
            pos.append(v)
    return pos, kw


def _positional_binder(params: Sequence[inspect.Parameter]) -> Callable[[tuple], list | None] | None:
    """A function binding a call without keyword arguments to one value per parameter (defaults filled in, a
    *args tuple, an empty **kwargs dict) much faster than Signature.bind for many arguments; it returns None
    for a call it cannot bind (Signature.bind then raises Python's error). None if a keyword-only parameter
    has no default (such a call never binds without keywords)."""
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    rest = [p for p in params if p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD)]
    if any(p.kind is p.KEYWORD_ONLY and p.default is p.empty for p in rest):
        return None
    n, required = len(pos), sum(p.default is p.empty for p in pos)
    defaults = [p.default for p in pos]
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in params)
    tail = [(p.kind is p.VAR_KEYWORD, p.default) for p in rest]

    def bind(args: tuple) -> list | None:
        m = len(args)
        if m < required or (m > n and not var_pos):
            return None
        values = list(args[:n]) if m >= n else [*args, *defaults[m:]]
        if var_pos:
            values.append(tuple(args[n:]))
        values += [{} if var_kw else default for var_kw, default in tail]
        return values
    return bind


def _leaf_specs(key: tuple) -> tuple | None:
    """The argspec of each leaf a cache key covers (None for a key that is not by value)."""
    if key[:1] == ("unhashable",):
        return None
    return key[2] if key[:1] == ("pytree",) else key


def _recordable(spec: Any) -> bool:
    """A leaf's key part a warm record may be keyed by: an array's dtype and shape, a scalar's type, a size
    symbol's value, a static Python scalar (its value), a numpy scalar's dtype."""
    if type(spec) is not tuple or not spec:
        return False
    if isinstance(spec[0], np.dtype):
        return True
    if spec[0] == "static":
        return type(spec[1]) is tuple and spec[1][:1] in ((int,), (float,), (bool,))
    return spec[0] in ("scalar", "symint", "npscalar")


def _stand_in_for(spec: tuple) -> Any:
    """A value with this `_recordable` key part (an array: one zero seen at every index)."""
    if isinstance(spec[0], np.dtype):
        return np.ndarray(spec[1], spec[0], buffer=np.zeros(1, spec[0]), strides=(0,) * len(spec[1]))
    if spec[0] == "scalar":
        return spec[1](0)
    if spec[0] == "npscalar":
        return np.dtype(spec[1]).type(0)
    return spec[1] if spec[0] == "symint" else spec[1][1]  # a size symbol's value, a static scalar's


def _identifier(path: str) -> str:
    """A leaf's path (params[3]['w']) as a kernel parameter name (params_3_w)."""
    return "_".join(filter(None, re.split(r"\W+", path))) or "arg"


def _bound_python_ints(tr: Trace, met: Mapping[int, set[str]]) -> None:
    """NEP 50: a Python int argument that meets an integer array must fit the array's dtype (numpy raises
    OverflowError otherwise). The kernel receives it as int64 and would wrap it, so the plan names the
    integer dtypes the function's ufuncs use it as (`met`: those the trace saw, also where the graph dropped the
    operation), and the call checks the value against each."""
    meets: dict[int, set[str]] = {k: set(v) for k, v in met.items()}
    for n in toposort(tr.results):
        if n.prim == "cast" and n.param("fit"):  # a fill value (np.full_like): it must fit the array's dtype
            s = n.src[0]
            if s.prim == "scalar_arg" and s.weak and s.dtype.is_int:
                meets.setdefault(s.param("index"), set()).add(n.dtype.name)
        if n.prim != "ufunc":
            continue
        for s, name in zip(n.src, n.param("in_dtypes")):
            d = np.dtype(name)
            if s.prim == "scalar_arg" and s.weak and s.dtype.is_int and d.kind in "iu" and d != np.int64:
                meets.setdefault(s.param("index"), set()).add(d.name)
    tr.plan = [(kind, (what[0], what[1], tuple(sorted(meets[what[0]])))) if kind == "scalar" and what[0] in meets
               else (kind, what) for kind, what in tr.plan]


def _flatten(result: Any, writes: Sequence[tuple[writeback.Write, list[Node]]] = (),
             written: Mapping[int, Tracer] | None = None) -> tuple[list[Node], list]:
    """Array leaves of a (nested) tuple/list/dict result and the result's structure as data: a JSON tree
    (jitop.runtime.executable.rebuild) unless it holds Python objects JSON cannot carry ("obj" leaves). The
    nodes the `writes` of arguments the function assigned to need come first (`written`: argument index ->
    tracer); the tree is then ["tuple", [result's tree, ["tuple", a tuple per write]]], and an argument written
    whole and returned is its write's leaf.

    >>> _flatten(("n", 3))
    ([], ['tuple', [['const', 'n'], ['const', 3]]])
    """
    leaves: list[Node] = []
    parts, returned = [], {}
    for w, nodes in writes:
        first = len(leaves)
        leaves += nodes
        parts.append(["tuple", [["out", first + j, bool(w.spec is not None and n.ndim == 0)]
                                for j, n in enumerate(nodes)]])
        if w.spec is None and written is not None:
            returned[id(written[w.leaf])] = ["out", first, False]

    def walk(x: Any) -> list:
        if isinstance(x, SymInt):  # a size returned as a Python int: this call's value, which it must keep
            x = int(x)
        if id(x) in returned:
            return returned[id(x)]
        if isinstance(x, Tracer):
            if x.order is not None:
                raise Unsupported(f"returning a view or copy of a {x.order.str} array (numpy keeps its byte order, "
                                  "the kernel's outputs are native)")
            leaves.append(x.node)
            # numpy gives a scalar for a 0-d computation, a 0-d array only for a 0-d array argument
            if x.node.weak:  # a Python scalar stays one (s * 2 of a Python float argument is a float)
                return ["out", len(leaves) - 1, "py"]
            return ["out", len(leaves) - 1, x.node.ndim == 0 and not x.array0d]
        if type(x) in (tuple, list):
            return [type(x).__name__, [walk(v) for v in x]]
        if isinstance(x, (tuple, list)):  # a namedtuple is not rebuilt from an iterable
            raise Unsupported(f"returning a {type(x).__name__} (a tuple/list subclass); return a tuple, list or dict")
        if isinstance(x, dict):
            return ["dict", [[leaf(k), walk(v)] for k, v in x.items()]]
        if isinstance(x, np.ndarray):
            raise Unsupported("returning a constant numpy array that does not depend on the arguments")
        if isinstance(x, Masked):
            x._unsupported()
        return leaf(x)
    tree = walk(result)
    if writes:
        tree = ["tuple", [tree, ["tuple", parts]]]
    return leaves, tree


def _returned_tracers(result: Any) -> list[Tracer]:
    """The tracers a function's result holds (in tuples, lists and dict values)."""
    if isinstance(result, Tracer):
        return [result]
    if type(result) in (tuple, list):
        return [t for x in result for t in _returned_tracers(x)]
    if type(result) is dict:
        return _returned_tracers(list(result.values()))
    return []


def kernel(fn: Callable | None = None, *, static_argnums: Sequence[int] = (), static_argnames: Sequence[str] = (),
           fallback: bool = True, autotune: str | None = None,
           dynamic: bool | Mapping[str, Sequence[int]] | None = None, target: str | None = None,
           compile: str | None = None, warn_recompiles: bool = True) -> Any:
    """Compile a numpy function: traced per (shape, dtype) of its array arguments, fused, vectorized, parallel.

    >>> @jitop.kernel
    ... def f(a, b):
    ...     return np.tanh(a * b) + np.exp(-a)
    >>> f(np.ones(4, np.float32), np.ones(4, np.float32))   # doctest: +SKIP

    static_argnums/static_argnames: arguments whose Python value changes the graph (recompiles per value);
    static_argnums counts parameters (a *args parameter is one: the whole tuple), not call positions.
    Arguments may be pytrees: (nested) lists, tuples, namedtuples and dicts of arrays, `*args`, `**kwargs`
    (`forward(x, *params)`, `forward(x, params)`): their arrays and numbers are traced, one signature per
    structure and leaf shapes/dtypes; a container without arrays (a shape, axes) is a constant, by value.
    Results may be (nested) tuples, lists and dicts of arrays, returned with their structure.
    fallback=False: raise FallbackError instead of running unsupported code as plain numpy.
    autotune="background" (or JITOP_AUTOTUNE=background): tune its heaviest matmul/conv2d workloads in a
    low-priority process while the program runs, and swap each better kernel in (jitop.autotune).
    dynamic: which dims one compiled kernel serves at every size (symbolic shapes, jitop.shape_policy). None
    (default): a dim that differs between two calls becomes symbolic at the next compile; True: every dim from
    the first call; {"x": (0,)}: those dims of those parameters; False: a kernel per shape. Sizes 0 and 1
    are always compiled as constants (they broadcast).
    target="cuda": run it on this machine's NVIDIA GPU (jitop.graph.gpu): numpy arguments are copied to the GPU
    and the results back; device arrays stay there.
    compile="background" (or JITOP_COMPILE=background): a call whose kernel is neither in memory nor on disk runs
    as plain numpy while a child process compiles it into the disk cache; later calls load it from there once
    it is ready (jitop.build_beside). compile="now" (default): the call traces and compiles.
    warn_recompiles=False: no JitopRecompileWarning when many values of a static argument (or many shapes) each
    compile a kernel: for a function meant to have one per value (the operator library's, per layer geometry).

    >>> @jitop.kernel
    ... def double(x):
    ...     return x * 2
    >>> [double(np.ones(n, np.float32)).shape for n in (3, 4, 5)], double.traces   # 5: no trace
    ([(3,), (4,), (5,)], 2)

    In-place assignment compiles with numpy's effect on the caller's arrays (jitop.graph.mutation):

    >>> @jitop.kernel(fallback=False)
    ... def step(cache, row, t):
    ...     cache[t] = row
    ...     return cache.sum(axis=0)
    >>> cache = np.zeros((4, 2))
    >>> step(cache, np.ones(2), 1), step(cache, np.ones(2), -1), cache[:, 0]
    (array([1., 1.]), array([2., 2.]), array([0., 1., 0., 1.]))
    """
    def wrap(f: Callable) -> KernelFunction:
        return KernelFunction(f, static_argnums, static_argnames, fallback, autotune, dynamic, target, compile,
                              warn_recompiles)
    return wrap(fn) if fn is not None else wrap


def _compile_mode(mode: str | None) -> str:
    """compile= of @jitop.kernel: "now" or "background" (None: JITOP_COMPILE, else "now")."""
    given = config.compile_mode() if mode is None else mode
    if given not in ("now", "background"):
        where = f"environment variable JITOP_COMPILE={given!r}" if mode is None else f"jitop.kernel(compile={given!r})"
        raise ValueError(f"{where}: expected 'now' or 'background'")
    return given


def profile(fn: KernelFunction, *args: Any, repeat: int = 10, **kwargs: Any) -> Any:
    """jitop.profile(f, *args): f's loop nests for these arguments by time, slowest first.

    >>> @jitop.kernel
    ... def f(a):
    ...     return np.exp(a).sum()
    >>> p = jitop.profile(f, np.ones(1000, np.float32))
    >>> p.nests[0].share > 0
    True
    """
    return fn.profile(*args, repeat=repeat, **kwargs)


def explain(fn: KernelFunction, *args: Any, **kwargs: Any) -> str:
    """jitop.explain(f, *args): what f compiles to for these arguments."""
    return fn.explain(*args, **kwargs)
