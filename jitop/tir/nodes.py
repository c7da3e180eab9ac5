"""Loop IR: buffers and statements. Expressions are jitop.te.expr.Expr (LOAD nodes point at a Buffer)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator

from jitop.dtypes import DType
from jitop.schedule.schedule import ForKind
from jitop.te.expr import Expr, Op, const

VALUE = -1  # the "dimension" a symbol is read from when it is its input's value (te.size_param), not a dim


@dataclass(frozen=True, eq=False)
class Buffer:
    """A row-major array in memory: a function argument or an allocation (compared by identity)."""

    name: str
    dtype: DType
    shape: tuple[int | Expr, ...]  # a dim is an int, or an int64 Expr over the function's symbols
    # "param" (argument), "global" (allocated), "local" (allocated at an attach point: per thread on a GPU),
    # "shared" (GPU: one copy per block, in on-chip shared memory)
    scope: str = "global"

    @property
    def symbolic(self) -> bool:
        """Whether some dimension is an expression over symbols rather than a constant."""
        return not all(isinstance(d, int) for d in self.shape)

    @property
    def size(self) -> int | Expr:
        """The number of elements: an int, or an Expr when the shape is symbolic."""
        if not self.symbolic:
            return math.prod(self.shape)
        return math.prod(self.shape, start=const(1))

    def load(self, indices: tuple[Expr, ...]) -> Expr:
        return Expr(Op.LOAD, self.dtype, tuple(indices), self)

    def __repr__(self) -> str:
        return f"Buffer({self.name}, {self.dtype}[{', '.join(map(str, self.shape))}], {self.scope})"


class Stmt:
    """Base of loop-IR statements."""

    def __repr__(self) -> str:
        from jitop.tir.printer import stmt_str
        return stmt_str(self)


@dataclass(frozen=True, eq=False, repr=False)
class For(Stmt):
    var: Expr
    extent: Expr
    kind: ForKind
    body: Stmt


@dataclass(frozen=True, eq=False, repr=False)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True, eq=False, repr=False)
class Store(Stmt):
    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True, eq=False, repr=False)
class IfThenElse(Stmt):
    cond: Expr
    then: Stmt
    else_: Stmt | None = None


@dataclass(frozen=True, eq=False, repr=False)
class Barrier(Stmt):
    """Every thread of a GPU block waits here until all have arrived (`__syncthreads()`), so what some threads
    wrote to shared memory is visible to the others."""


@dataclass(frozen=True, eq=False, repr=False)
class ThreadReduce(Stmt):
    """GPU: combine `buffer[0]` of the `extent` threads along `kind` (threadIdx.x, y or z) with `reducer` (a te
    Reducer); afterwards every one of those threads holds the result in its `buffer[0]` (warp shuffles, then
    shared memory across warps). Every thread of the block must reach it, as a barrier."""

    buffer: Buffer
    reducer: object
    kind: ForKind
    extent: int


@dataclass(frozen=True, eq=False, repr=False)
class Allocate(Stmt):
    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, eq=False, repr=False)
class PrimFunc:
    """A lowered function: parameters (inputs then outputs) and a loop-IR body. `print(f)` shows the loops.

    `symbols` are the int64 VARs the parameters' symbolic dims are built from, in binding order:
    the compiled kernel receives their values (read from the arrays' shapes) as one i64 array.
    """

    name: str
    params: tuple[Buffer, ...]
    body: Stmt
    outputs: tuple[int, ...] = ()      # indices into params written by the function
    attrs: dict = field(default_factory=dict)
    symbols: tuple[Expr, ...] = ()

    def symbol_sources(self) -> tuple[tuple[int, int], ...]:
        """(parameter, dimension) each symbol is read from at call time: the input whose value it is
        (te.size_param: dimension VALUE), else its first bare occurrence as a dim of an input (parameters in
        order). ValueError for a symbol that is never one (its value could not be read from the arguments) or
        for two distinct symbols with one name."""
        names = [v.name for v in self.symbols]
        if len(set(names)) != len(names):
            raise ValueError(f"function '{self.name}': two distinct symbols share a name ({', '.join(names)}); "
                             "give each te.var/te.size_var its own name")
        found: dict[Expr, tuple[int, int]] = {}
        held = self.attrs.get("symbol_values", {})  # symbol name -> the 0-d input whose value it is (te.size_param)
        for v in self.symbols:
            if v.name in held:
                found[v] = (held[v.name], VALUE)
        for k, buf in enumerate(self.params):
            for j, d in enumerate(buf.shape):
                if k not in self.outputs and isinstance(d, Expr) and d.op is Op.VAR:
                    found.setdefault(d, (k, j))
        missing = [v.name for v in self.symbols if v not in found]
        if missing:
            inputs = [f"{b.name}{_dims(b)}" for k, b in enumerate(self.params) if k not in self.outputs]
            raise ValueError(f"function '{self.name}': symbol(s) {', '.join(missing)} must be a dimension of an "
                             "input on its own (e.g. A: float32[n]) so its value can be read from the arguments; "
                             f"inputs: {', '.join(inputs) or 'none'}")
        return tuple(found[v] for v in self.symbols)

    def __str__(self) -> str:
        from jitop.tir.printer import func_str
        return func_str(self)

    __repr__ = __str__


def _dims(buf: Buffer) -> str:
    return f"[{', '.join(map(str, buf.shape))}]"


def seq(*stmts: Stmt | None) -> Stmt:
    """A sequence with nested Seqs flattened and Nones dropped."""
    flat: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Seq):
            flat.extend(s.stmts)
        elif s is not None:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def children(s: Stmt) -> Iterator[Stmt]:
    """Direct sub-statements."""
    if isinstance(s, (For, Allocate)):
        yield s.body
    elif isinstance(s, Seq):
        yield from s.stmts
    elif isinstance(s, IfThenElse):
        yield s.then
        if s.else_ is not None:
            yield s.else_


def walk_stmts(s: Stmt) -> Iterator[Stmt]:
    """Every statement of `s`, parents first."""
    yield s
    for c in children(s):
        yield from walk_stmts(c)
