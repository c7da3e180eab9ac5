"""Argument checks against a compiled signature: a mismatch is a clear error, never a crash.

A dimension of a parameter is an int, or (a kernel with symbolic shapes) the printed expression of its
size over the kernel's symbols ("n", "n * 2", "(n + 7) // 8"). Each symbol is read from one input's
dimension, or from the value of a 0-d int64 input (a Python int argument used as a size: `SymbolSpec` with
dim VALUE); every other symbolic dimension is an equality the kernel relies on, checked before the call
(`ShapeBinder`).
"""
from __future__ import annotations

import ast
import functools
import math
import operator
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from jitop.tir.nodes import VALUE  # SymbolSpec.dim of a symbol that is its 0-d int64 input's value
from jitop.tir.simplify import SYMBOL_MAX

Dim = int | str
MAX_DIM_TEXT = 4096  # a dimension's printed expression; longer text in metadata is refused, not parsed


@dataclass(frozen=True)
class ParamSpec:
    """One array parameter of a compiled function."""

    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...]   # ints, and the printed size expressions of symbolic dims
    is_output: bool

    @functools.cached_property  # read on every check of an argument (a frozen dataclass: cached in __dict__)
    def symbolic(self) -> bool:
        return not all(type(d) is int for d in self.shape)

    def describe(self) -> str:
        return f"{self.dtype.name} array of shape {shape_str(self.shape)}"

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype.name, "shape": list(self.shape), "is_output": self.is_output}

    @staticmethod
    def from_json(d: dict) -> "ParamSpec":
        return ParamSpec(d["name"], np.dtype(d["dtype"]), tuple(d["shape"]), d["is_output"])


def reshape_target(target: tuple[int, ...], size: int) -> tuple[int, ...]:
    """The shape numpy's reshape of `size` elements to `target` gives (one -1 inferred); numpy's ValueError
    otherwise.

    >>> reshape_target((3, -1), 12)
    (3, 4)
    """
    if target.count(-1) > 1:
        raise ValueError("can only specify one unknown dimension")
    if any(d < -1 for d in target):
        raise ValueError("negative dimensions not allowed")
    if -1 in target:
        known = math.prod(d for d in target if d != -1)
        if known == 0 or size % known:
            raise ValueError(f"cannot reshape array of size {size} into shape {target}")
        target = tuple(size // known if d == -1 else d for d in target)
    if math.prod(target) != size:
        raise ValueError(f"cannot reshape array of size {size} into shape {target}")
    return target


def shape_str(shape: Sequence[Dim]) -> str:
    """A shape as Python prints a tuple, symbolic dims unquoted: (n, 4)."""
    dims = ", ".join(map(str, shape))
    return f"({dims},)" if len(shape) == 1 else f"({dims})"


def check_array(spec: ParamSpec, position: int, a: object) -> int:
    """The data pointer of `a` after checking it matches `spec` (a symbolic spec: its rank and constant
    dims here; `ShapeBinder.bind` checks the symbolic ones)."""
    where = f"argument '{spec.name}' (position {position})"
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{where} must be a numpy.ndarray ({spec.describe()}), got {type(a).__name__}")
    if a.dtype != spec.dtype:
        if a.dtype.newbyteorder("=") == spec.dtype:
            raise TypeError(f"{where} must be a native-byte-order {spec.dtype.name} array, got byte order "
                            f"{a.dtype.str!r}; convert with .astype(np.{spec.dtype.name})")
        raise TypeError(f"{where} must have dtype {spec.dtype.name}, got {a.dtype.name}; "
                        f"convert with .astype(np.{spec.dtype.name}) or rebuild for {a.dtype.name}")
    if a.shape != spec.shape and (not spec.symbolic or not fits_constant_dims(spec.shape, a.shape)):
        if spec.symbolic:
            raise ValueError(f"{where} must have shape {shape_str(spec.shape)}, got {a.shape}")
        raise ValueError(f"{where} must have shape {spec.shape}, got {a.shape}; the function was compiled for that shape")
    flags = a.flags
    if not flags.c_contiguous:
        raise ValueError(f"{where} must be C-contiguous; pass np.ascontiguousarray({spec.name})")
    if not flags.aligned:
        raise ValueError(f"{where} is not aligned to its dtype; pass a copy (np.array({spec.name}))")
    if spec.is_output and not flags.writeable:
        raise ValueError(f"{where} is an output but read-only; pass a writeable array")
    return a.ctypes.data


def check_no_overlap(specs: list[ParamSpec], arrays: list[np.ndarray]) -> None:
    """Outputs must not share memory with any other argument (kernels assume no aliasing)."""
    for k, (spec, a) in enumerate(zip(specs, arrays)):
        if not spec.is_output or a.size == 0:
            continue
        for j, b in enumerate(arrays):
            if j != k and b.size and np.may_share_memory(a, b):
                raise ValueError(f"output '{spec.name}' shares memory with argument '{specs[j].name}'; "
                                 "jitop kernels need separate output arrays (pass a fresh np.empty_like)")


def fits_constant_dims(shape: tuple[Dim, ...], got: tuple[int, ...]) -> bool:
    """Whether an array of shape `got` has the rank of `shape` and its constant dims (a symbolic dim takes any).

    >>> fits_constant_dims(("n", 4), (7, 4)), fits_constant_dims(("n", 4), (7, 5))
    (True, False)
    """
    return len(shape) == len(got) and all(type(d) is not int or d == g for d, g in zip(shape, got))


# ** symbolic dims: a whitelisted expression language (ints, symbol names, + - * // %, unary -, min, max) **
_BINOPS: dict[type, Callable[[int, int], int]] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                                                  ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_CALLS: dict[str, Callable[..., int]] = {"min": min, "max": max}
DimFn = Callable[[Mapping[str, int]], int]


def compile_dim(text: str) -> DimFn:
    """A function of the symbols' values computing the dimension `text` (no `eval`: a walk of its syntax
    tree that admits only int literals, names, + - * // %, unary minus, min and max).

    >>> compile_dim("(n + 7) // 8")({"n": 9})
    2
    """
    if not isinstance(text, str) or len(text) > MAX_DIM_TEXT:
        raise ValueError(f"a symbolic dimension must be an expression of at most {MAX_DIM_TEXT} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"symbolic dimension {text!r} is not an expression") from None
    return _compile(tree.body, text)


def dim_names(text: str) -> set[str]:
    """The symbol names a symbolic dimension's expression uses (after `compile_dim` accepted it)."""
    return {n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)} - set(_CALLS)


def _compile(node: ast.AST, text: str) -> DimFn:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        value = node.value
        return lambda env: value
    if isinstance(node, ast.Name) and node.id not in _CALLS:
        name = node.id
        return lambda env: env[name]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        fn, left, right = _BINOPS[type(node.op)], _compile(node.left, text), _compile(node.right, text)
        return lambda env: fn(left(env), right(env))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _compile(node.operand, text)
        return lambda env: -inner(env)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS
            and not node.keywords and len(node.args) >= 2):
        fn, args = _CALLS[node.func.id], [_compile(a, text) for a in node.args]
        return lambda env: fn(*[a(env) for a in args])
    raise ValueError(f"symbolic dimension {text!r}: {ast.unparse(node)!r} is not allowed (only ints, symbol "
                     "names, + - * // %, unary minus, min and max)")


@dataclass(frozen=True)
class SymbolSpec:
    """A symbol of a kernel with symbolic shapes: read from input `param`'s dimension `dim` at call time (dim
    VALUE: the value of that 0-d int64 input)."""

    name: str
    param: int
    dim: int
    dtype: str = "int64"

    def to_json(self) -> dict:
        return {"name": self.name, "param": self.param, "dim": self.dim, "dtype": self.dtype}

    @staticmethod
    def from_json(d: dict) -> "SymbolSpec":
        return SymbolSpec(d["name"], d["param"], d["dim"], d.get("dtype", "int64"))


# the largest value a symbol may take: the compiler proved the kernel's accesses in bounds (and its index
# arithmetic free of overflow) for symbols up to tir.simplify.SYMBOL_MAX only; numpy allows larger dims (a
# zero-size array of shape (2**50, 0)), which must never reach the kernel
SYMBOL_LIMITS = {"int64": SYMBOL_MAX, "int32": min(SYMBOL_MAX, 2 ** 31 - 1)}


class ShapeBinder:
    """Reads a symbolic kernel's symbols from its arguments' shapes and checks every other symbolic dim.

    >>> specs = [ParamSpec("A", np.dtype("f4"), ("n",), False), ParamSpec("B", np.dtype("f4"), ("n",), True)]
    >>> ShapeBinder(specs, [SymbolSpec("n", 0, 0)]).bind([np.zeros(3, "f4"), np.zeros(3, "f4")])
    [3]
    """

    def __init__(self, specs: Sequence[ParamSpec], symbols: Sequence[SymbolSpec]):
        check_symbols(specs, symbols)
        self.specs, self.symbols = list(specs), list(symbols)
        sources = {(s.param, s.dim) for s in symbols}
        # every symbolic dim that does not bind a symbol: (param, dim, its size function, its text)
        self.checks = [(k, j, compile_dim(d), d) for k, p in enumerate(specs) for j, d in enumerate(p.shape)
                       if type(d) is str and (k, j) not in sources]
        # per parameter, its dims as ints or size functions (an output's shape for the symbols' values)
        self.dims = [tuple(d if type(d) is int else (compile_dim(d), d) for d in p.shape) for p in specs]
        self.by_name = {s.name: s for s in symbols}

    def bind(self, arrays: Sequence[np.ndarray]) -> list[int]:
        """The symbols' values, in order, from arrays already checked by `check_array` (or the inputs
        alone); ValueError for a dimension that disagrees with them."""
        values = self.values(arrays)
        env = dict(zip(self.by_name, values))
        for k, j, fn, text in self.checks:
            if k < len(arrays) and arrays[k].shape[j] != self._size(fn, env, text):
                raise ValueError(self._mismatch(k, j, arrays[k].shape[j], text, env))
        return values

    def values(self, arrays: Sequence[np.ndarray]) -> list[int]:
        values = [arrays[s.param].shape[s.dim] if s.dim != VALUE else int(arrays[s.param]) for s in self.symbols]
        for s, v in zip(self.symbols, values):
            if v > SYMBOL_LIMITS.get(s.dtype, SYMBOL_MAX):
                raise ValueError(f"{self._source(s)} is {v}, too large for symbol {s.name} ({s.dtype})")
            if v < 0:  # a value may be negative (a dim never is)
                raise ValueError(f"{self._source(s)} is {v}, but symbol {s.name} is a size (at least 0)")
        return values

    def shape(self, k: int, values: Sequence[int]) -> tuple[int, ...]:
        """Parameter k's shape for the symbols' `values` (to allocate an output)."""
        env = dict(zip(self.by_name, values))
        shape = tuple(d if type(d) is int else self._size(d[0], env, d[1]) for d in self.dims[k])
        if any(d < 0 for d in shape):
            raise ValueError(f"{self._where(k)} would have shape {shape} (shape {shape_str(self.specs[k].shape)} "
                             f"with {_bound(env)}): a dimension is negative")
        return shape

    @staticmethod
    def _size(fn: DimFn, env: dict[str, int], text: str) -> int:
        try:
            return fn(env)
        except ZeroDivisionError:
            raise ValueError(f"symbolic dimension {text} divides by zero with {_bound(env)}") from None

    def _where(self, k: int) -> str:
        return f"argument '{self.specs[k].name}' (position {k})"

    def _source(self, s: SymbolSpec) -> str:
        return f"{self._where(s.param)} {'value' if s.dim == VALUE else f'dimension {s.dim}'}"

    def _mismatch(self, k: int, j: int, got: int, text: str, env: dict[str, int]) -> str:
        head = f"{self._where(k)} dimension {j} is {got}, but it must "
        if text in self.by_name:
            return head + f"equal {self._source(self.by_name[text])} ({text} = {env[text]})"
        used = [self.by_name[n] for n in self.by_name if n in dim_names(text)]
        sources = ", ".join(f"{s.name} = {env[s.name]} from {self._source(s)}" for s in used)
        return head + f"be {text} = {self._size(compile_dim(text), env, text)} ({sources})"


def _bound(env: Mapping[str, int]) -> str:
    return ", ".join(f"{n} = {v}" for n, v in env.items())


def check_symbols(specs: Sequence[ParamSpec], symbols: Sequence[SymbolSpec]) -> None:
    """ValueError unless the symbols bind at bare symbolic dims of inputs, are distinct, and cover every name
    the parameters' symbolic dims use (each of which must be an admissible expression)."""
    names = [s.name for s in symbols]
    if len(set(names)) != len(names):
        raise ValueError(f"symbols {names} are not distinct")
    for s in symbols:
        if not (type(s.param) is int and 0 <= s.param < len(specs) and type(s.dim) is int
                and (0 <= s.dim < len(specs[s.param].shape) or s.dim == VALUE)):
            raise ValueError(f"symbol {s.name!r} is read from parameter {s.param!r} dimension {s.dim!r}, "
                             "which does not exist")
        if s.dim == VALUE:
            p = specs[s.param]
            if p.is_output or p.shape != () or p.dtype != np.int64 or p.name != s.name or s.dtype != "int64":
                raise ValueError(f"symbol {s.name!r} must be read from the value of a 0-d int64 input of its own "
                                 f"name (it is {p.name!r}, {p.describe()}, {s.dtype})")
            continue
        if specs[s.param].is_output or specs[s.param].shape[s.dim] != s.name or s.dtype not in SYMBOL_LIMITS:
            raise ValueError(f"symbol {s.name!r} must be read from an input dimension that is exactly {s.name!r}"
                             f" and be int64 or int32 (it is {specs[s.param].name!r} dimension {s.dim}, "
                             f"{s.dtype})")
    for p in specs:
        for d in p.shape:
            if type(d) is str and not dim_names(_checked_dim(d)) <= set(names):
                raise ValueError(f"parameter {p.name!r} dimension {d!r} uses a name that is not a symbol "
                                 f"of the kernel ({', '.join(names) or 'none'})")


def _checked_dim(text: str) -> str:
    compile_dim(text)
    return text
