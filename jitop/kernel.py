"""@jitop.kernel: trace a numpy function once per argument signature, compile it, dispatch later calls.

Dispatch is in-memory (ArgSpec key -> compiled executable); the persistent cache and tuned
schedules plug in at `_compile` later. Anything that cannot be traced runs as plain numpy with one
warning per construct (or raises with fallback=False).
"""
from __future__ import annotations

import inspect
import threading
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from jitop import dtypes
from jitop.errors import FallbackError, JitopFallbackWarning
from jitop.graph.compile import compile_graph
from jitop.graph.ir import Node, node, toposort
from jitop.graph.tracer import Tracer, TracerConversionError, Unsupported
from jitop.runtime.executable import Executable, leaf

_FALLBACK = object()  # cache entry: this signature runs as plain numpy


def argspec(value: Any, static: bool) -> tuple:
    """The part of the cache key one argument contributes (shape/dtype for arrays, the value if static)."""
    if static:
        return ("static", value)
    if type(value) is np.ndarray:
        return (value.dtype, value.shape)
    if isinstance(value, np.ndarray):
        return ("subclass", type(value), value.dtype, value.shape)
    if isinstance(value, (bool, int, float)):
        return ("scalar", type(value))
    if isinstance(value, np.generic):
        return ("npscalar", value.dtype.str)
    return ("static", value)


class Compiled:
    """A cache entry: the executable (which rebuilds the function's result itself) and its trace."""

    __slots__ = ("exe", "trace", "call")

    def __init__(self, exe: Executable, trace: "Trace"):
        self.exe, self.trace = exe, trace
        self.call = exe.call


@dataclass
class Trace:
    """What tracing one signature produced."""

    inputs: list[Node] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    plan: list[tuple[str, Any]] = field(default_factory=list)
    results: list[Node] = field(default_factory=list)
    result: Any = None  # the result's structure as a tree over `results` (jitop.runtime.executable.rebuild)


class KernelFunction:
    """A numpy function compiled per (shape, dtype) signature. Created by @jitop.kernel."""

    def __init__(self, fn: Callable, static_argnums: Sequence[int] = (), static_argnames: Sequence[str] = (),
                 fallback: bool = True):
        self.fn = fn
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = fn.__doc__
        self.signature = inspect.signature(fn)
        names = list(self.signature.parameters)
        self.static = {names[i] for i in static_argnums} | set(static_argnames)
        self._static_flags = tuple(n in self.static for n in names)
        self._simple = not self.static and all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                                               for p in self.signature.parameters.values())
        self.fallback = fallback
        self.cache: dict[tuple, Any] = {}
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    # ** calling **
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(a, Tracer) for a in args) or any(isinstance(v, Tracer) for v in kwargs.values()):
            return self.fn(*args, **kwargs)  # called from inside another kernel's trace: trace through
        values, key = self._bind(args, kwargs)
        entry = self.cache.get(key)
        if entry is None:
            entry = self._compile(key, values, lambda: self.fn(*args, **kwargs))
        else:
            self.hits += 1
        if entry is _FALLBACK:
            return self.fn(*args, **kwargs)
        return entry.call(values)

    def _bind(self, args: tuple, kwargs: dict) -> tuple[list[Any], tuple]:
        if self._simple and not kwargs and len(args) == len(self._static_flags):
            # fast path: arrays key on (dtype, shape) directly
            key = tuple([(a.dtype, a.shape) if type(a) is np.ndarray else argspec(a, False) for a in args])
            try:
                hash(key)
                return args, key
            except TypeError:
                pass
        if kwargs or len(args) != len(self.signature.parameters):
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            values = list(bound.arguments.values())
        else:
            values = list(args)
        try:
            key = tuple(argspec(v, st) for v, st in zip(values, self._static_flags))
            hash(key)
        except TypeError:
            key = ("unhashable", tuple(id(v) for v in values))
        return values, key

    def _compile(self, key: tuple, values: list[Any], run_numpy: Callable[[], Any] | None = None) -> Any:
        with self._lock:
            if key in self.cache:
                return self.cache[key]
            self.misses += 1
            try:
                entry = self._trace_and_build(values)
            except (Unsupported, TracerConversionError, NotImplementedError) as err:
                entry = self._fall_back(err)
            except Exception as err:
                # numpy's own error (a shape mismatch, say) must surface as numpy raises it; if numpy
                # succeeds, jitop failed on valid code: run it as numpy rather than break it
                if run_numpy is None or self._numpy_raises(run_numpy):
                    raise
                entry = self._fall_back(Unsupported(f"jitop internal error {type(err).__name__}: {err}"))
            if key[0] != "unhashable":
                self.cache[key] = entry
            return entry

    def _trace_and_build(self, values: list[Any]) -> "Compiled":
        tr = self.trace(values)
        exe = compile_graph(self.__name__, tr.inputs, tr.names, tr.plan, tr.results)
        exe.set_result(tr.result)
        return Compiled(exe, tr)

    # ** tracing **
    def trace(self, values: list[Any]) -> Trace:
        """Run the function on tracers; the graph of every array it returns."""
        tr = Trace()
        pos, kw = [], {}
        for k, (name, v) in enumerate(zip(self.signature.parameters, values)):
            param = self.signature.parameters[name]
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise Unsupported("a function with *args or **kwargs parameters")
            t = self._tracer_for(k, name, v, tr)
            if param.kind is param.KEYWORD_ONLY:
                kw[name] = t
            else:
                pos.append(t)
        result = self.fn(*pos, **kw)
        tr.results, tr.result = _flatten(result)
        _bound_python_ints(tr)
        return tr

    def _tracer_for(self, k: int, name: str, value: Any, tr: Trace) -> Any:
        if name in self.static:
            return value
        if isinstance(value, np.ndarray) and type(value) is not np.ndarray:
            raise Unsupported(f"argument '{name}' of type {type(value).__name__} (an ndarray subclass)")
        if isinstance(value, np.ndarray):
            if value.dtype.name not in dtypes.DTYPES:
                raise Unsupported(f"argument '{name}' of dtype {value.dtype}")
            n = node("arg", value.shape, dtypes.as_dtype(value.dtype), index=k)
            # a non-native byte order is converted on each call (the kernel reads native values)
            tr.plan.append(("arg", k) if value.dtype.isnative else ("arg_swapped", (k, value.dtype.newbyteorder("="))))
        elif isinstance(value, (bool, int, float, np.generic)) and not isinstance(value, np.ndarray):
            dt = dtypes.scalar_dtype(value)
            if isinstance(value, np.generic) and value.dtype.name not in dtypes.DTYPES:
                raise Unsupported(f"argument '{name}' of dtype {value.dtype}")
            n = node("scalar_arg", (), dt, weak=not isinstance(value, np.generic), index=k)
            tr.plan.append(("scalar", (k, dt.np)))
        else:
            return value  # other Python objects act as constants of this trace (part of the key)
        tr.inputs.append(n)
        tr.names.append(name)
        return Tracer(n, array0d=n.prim == "arg")

    @staticmethod
    def _numpy_raises(run_numpy: Callable[[], Any]) -> bool:
        try:
            run_numpy()
        except Exception:
            return True
        return False

    # ** fallback **
    def _fall_back(self, err: Exception) -> Any:
        construct = getattr(err, "construct", None) or f"{type(err).__name__}: {err}"
        message = f"jitop.kernel '{self.__name__}' runs as plain numpy: {err} ({self._user_line(err)})"
        if not self.fallback:
            raise FallbackError(message.replace("runs as plain numpy", "cannot be compiled")) from err
        if construct not in self._warned:
            self._warned.add(construct)
            warnings.warn(message, JitopFallbackWarning, stacklevel=4)
        return _FALLBACK

    def _user_line(self, err: Exception) -> str:
        code = getattr(self.fn, "__code__", None)
        frames = [f for f in traceback.extract_tb(err.__traceback__) if code and f.filename == code.co_filename]
        if not frames:
            return f"{code.co_filename}:{code.co_firstlineno}: def {self.__name__}" if code else "source line unknown"
        f = frames[-1]
        return f"{f.filename}:{f.lineno}: {(f.line or '').strip()}"

    # ** introspection **
    def explain(self, *args: Any, **kwargs: Any) -> str:
        """Print and return the traced graph, fusion groups, schedules and loop IR for these arguments."""
        values, key = self._bind(args, kwargs)
        cached = key in self.cache
        entry = self._compile(key, values)
        if entry is _FALLBACK:
            text = f"{self.__name__}: runs as plain numpy for this signature (see the warning)"
        else:
            from jitop.graph.explain import describe
            text = describe(self.__name__, entry.exe, entry.trace, cached)
        print(text)
        return text


def _bound_python_ints(tr: Trace) -> None:
    """NEP 50: a Python int argument that meets an integer array must fit the array's dtype (numpy raises
    OverflowError otherwise). The kernel receives it as int64 and would wrap it, so the plan names the
    integer dtypes the function's ufuncs use it as, and the call checks the value against each."""
    meets: dict[int, set[str]] = {}
    for n in toposort(tr.results):
        if n.prim != "ufunc":
            continue
        for s, name in zip(n.src, n.param("in_dtypes")):
            d = np.dtype(name)
            if s.prim == "scalar_arg" and s.weak and s.dtype.is_int and d.kind in "iu" and d != np.int64:
                meets.setdefault(s.param("index"), set()).add(d.name)
    tr.plan = [(kind, (what[0], what[1], tuple(sorted(meets[what[0]])))) if kind == "scalar" and what[0] in meets
               else (kind, what) for kind, what in tr.plan]


def _flatten(result: Any) -> tuple[list[Node], list]:
    """Array leaves of a (nested) tuple/list/dict result and the result's structure as data: a JSON tree
    (jitop.runtime.executable.rebuild) unless it holds Python objects JSON cannot carry ("obj" leaves).

    >>> _flatten(("n", 3))
    ([], ['tuple', [['const', 'n'], ['const', 3]]])
    """
    leaves: list[Node] = []

    def walk(x: Any) -> list:
        if isinstance(x, Tracer):
            leaves.append(x.node)
            # numpy gives a scalar for a 0-d computation, a 0-d array only for a 0-d array argument
            return ["out", len(leaves) - 1, x.node.ndim == 0 and not x.array0d]
        if type(x) in (tuple, list):
            return [type(x).__name__, [walk(v) for v in x]]
        if isinstance(x, (tuple, list)):  # a namedtuple is not rebuilt from an iterable
            raise Unsupported(f"returning a {type(x).__name__} (a tuple/list subclass); return a tuple, list or dict")
        if isinstance(x, dict):
            return ["dict", [[leaf(k), walk(v)] for k, v in x.items()]]
        if isinstance(x, np.ndarray):
            raise Unsupported("returning a constant numpy array that does not depend on the arguments")
        return leaf(x)
    tree = walk(result)
    return leaves, tree


def kernel(fn: Callable | None = None, *, static_argnums: Sequence[int] = (), static_argnames: Sequence[str] = (),
           fallback: bool = True) -> Any:
    """Compile a numpy function: traced per (shape, dtype) of its array arguments, fused, vectorized, parallel.

    >>> @jitop.kernel
    ... def f(a, b):
    ...     return np.tanh(a * b) + np.exp(-a)
    >>> f(np.ones(4, np.float32), np.ones(4, np.float32))   # doctest: +SKIP

    static_argnums/static_argnames: arguments whose Python value changes the graph (recompiles per value).
    fallback=False: raise FallbackError instead of running unsupported code as plain numpy.
    """
    def wrap(f: Callable) -> KernelFunction:
        return KernelFunction(f, static_argnums, static_argnames, fallback)
    return wrap(fn) if fn is not None else wrap


def explain(fn: KernelFunction, *args: Any, **kwargs: Any) -> str:
    """jitop.explain(f, *args): what f compiles to for these arguments."""
    return fn.explain(*args, **kwargs)
