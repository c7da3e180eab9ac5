"""Loop IR: buffers and statements. Expressions are jitop.te.expr.Expr (LOAD nodes point at a Buffer)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator

from jitop.dtypes import DType
from jitop.schedule.schedule import ForKind
from jitop.te.expr import Expr, Op


@dataclass(frozen=True, eq=False)
class Buffer:
    """A row-major array in memory: a function argument or an allocation (compared by identity)."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    scope: str = "global"  # "param" (argument), "global" (allocated), "local" (allocated at an attach point)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def load(self, indices: tuple[Expr, ...]) -> Expr:
        return Expr(Op.LOAD, self.dtype, tuple(indices), self)

    def __repr__(self) -> str:
        return f"Buffer({self.name}, {self.dtype}{list(self.shape)}, {self.scope})"


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
class Allocate(Stmt):
    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, eq=False, repr=False)
class PrimFunc:
    """A lowered function: parameters (inputs then outputs) and a loop-IR body. `print(f)` shows the loops."""

    name: str
    params: tuple[Buffer, ...]
    body: Stmt
    outputs: tuple[int, ...] = ()      # indices into params written by the function
    attrs: dict = field(default_factory=dict)

    def __str__(self) -> str:
        from jitop.tir.printer import func_str
        return func_str(self)

    __repr__ = __str__


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
