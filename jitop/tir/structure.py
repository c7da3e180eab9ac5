"""The structure of a loop nest up to the names of its buffers and variables: two nests with equal `shape_of`
keys compute the same thing on corresponding buffers, so one compiled kernel serves both (the GPU back end
emits a kernel once per key: a transformer's layers repeat the same kernels with other weights).

The key is exact, not a hash: every statement and expression node with its operation, dtype and argument
(constants by their exact value and type), variables and buffers numbered by first appearance (a buffer with
its dtype, shape and scope; the function's symbols by their position), each variable's known range, and
anything the key cannot describe by its identity (so it only matches itself).

>>> from jitop import te
>>> import jitop
>>> def nest(name):
...     A = te.placeholder((8,), name=f"{name}_in")
...     B = te.compute((8,), lambda i: A[i] * 2.0, name=f"{name}_out")
...     f = jitop.lower(jitop.create_schedule(B), [A, B])
...     return f.body, f.params
>>> (a, pa), (b, pb) = nest("x"), nest("y")
>>> ka, ua = shape_of(a, (), {}); kb, ub = shape_of(b, (), {})
>>> ka == kb, [x.name for x in ua], [x.name for x in ub]
(True, ['x_out', 'x_in'], ['y_out', 'y_in'])
"""
from __future__ import annotations

from typing import Any, Sequence

from jitop.te.expr import Expr, Op
from jitop.tir.nodes import Allocate, Barrier, Buffer, For, IfThenElse, Seq, Stmt, Store, ThreadReduce


class _Namer:
    """Numbers variables and buffers by first appearance and writes the key's tokens."""

    def __init__(self, symbols: Sequence[Expr], ranges: dict):
        self.vars: dict[Expr, int] = {v: -1 - k for k, v in enumerate(symbols)}  # symbols: by position
        self.buffers: dict[Buffer, int] = {}
        self.ranges = ranges
        self.exprs: dict[int, int] = {}  # id(expr) -> its token's position (a repeated subexpression)
        self.out: list[Any] = []

    def var(self, v: Expr) -> Any:
        if v not in self.vars:
            self.vars[v] = len(self.vars)
            self.out.append(("range", self.vars[v], self._range(v)))
        return ("var", self.vars[v])

    def _range(self, v: Expr) -> Any:
        lo_hi = self.ranges.get(v)
        return None if lo_hi is None else tuple(self.expr(x) if isinstance(x, Expr) else x for x in lo_hi)

    def buffer(self, b: Buffer) -> int:
        if b not in self.buffers:
            self.buffers[b] = len(self.buffers)
            dims = tuple(self.expr(d) if isinstance(d, Expr) else d for d in b.shape)
            self.out.append(("buffer", self.buffers[b], b.dtype.name, dims, b.scope))
        return self.buffers[b]

    def expr(self, e: Expr) -> Any:
        seen = self.exprs.get(id(e))
        if seen is not None:
            return ("ref", seen)
        if e.op is Op.VAR:
            token = self.var(e)
        elif e.op is Op.CONST:
            v = e.value
            token = ("const", e.dtype.name, type(v).__name__, float(v).hex() if isinstance(v, float) else v)
        else:
            arg = self.buffer(e.arg) if e.op is Op.LOAD else e.arg if isinstance(e.arg, (str, type(None))) \
                else ("object", id(e.arg))
            token = (e.op.name, e.dtype.name, arg, tuple(self.expr(s) for s in e.src))
        self.exprs[id(e)] = len(self.out)
        self.out.append(token)
        return ("ref", self.exprs[id(e)])

    def stmt(self, s: Stmt) -> None:
        if isinstance(s, Seq):
            self.out.append(("seq", len(s.stmts)))
            for x in s.stmts:
                self.stmt(x)
        elif isinstance(s, For):
            self.out.append(("for", self.var(s.var), self.expr(s.extent), s.kind.value))
            self.stmt(s.body)
        elif isinstance(s, Store):
            self.out.append(("store", self.buffer(s.buffer), tuple(self.expr(i) for i in s.indices),
                             self.expr(s.value)))
        elif isinstance(s, IfThenElse):
            self.out.append(("if", self.expr(s.cond), s.else_ is not None))
            self.stmt(s.then)
            if s.else_ is not None:
                self.stmt(s.else_)
        elif isinstance(s, Allocate):
            self.out.append(("allocate", self.buffer(s.buffer)))
            self.stmt(s.body)
        elif isinstance(s, ThreadReduce):
            self.out.append(("thread_reduce", self.buffer(s.buffer), id(s.reducer), s.kind.value, s.extent))
        elif isinstance(s, Barrier):
            self.out.append(("barrier",))
        else:
            self.out.append(("object", id(s)))


def shape_of(nest: Stmt, symbols: Sequence[Expr], ranges: dict) -> tuple[tuple, list[Buffer]]:
    """(the nest's key, the buffers it names in order of first appearance: what corresponds between two nests
    with equal keys). `symbols`: the function's, `ranges`: its variables' (PrimFunc.attrs["ranges"])."""
    namer = _Namer(symbols, ranges)
    namer.stmt(nest)
    return tuple(namer.out), list(namer.buffers)
