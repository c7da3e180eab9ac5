"""Loop-IR passes: small functions from PrimFunc/Stmt to Stmt."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from jitop.te.expr import Expr, Op
from jitop.tir.nodes import Allocate, For, IfThenElse, PrimFunc, Seq, Stmt, Store, seq
from jitop.tir.simplify import Ranges, simplify


def map_stmt(s: Stmt, fn: Callable[[Stmt], Stmt | None]) -> Stmt | None:
    """Rebuild `s` bottom-up; `fn` gets each rebuilt statement and returns its replacement (None drops it)."""
    if isinstance(s, For):
        body = map_stmt(s.body, fn)
        return fn(replace(s, body=body)) if body is not None else None
    if isinstance(s, Allocate):
        body = map_stmt(s.body, fn)
        return fn(replace(s, body=body)) if body is not None else None
    if isinstance(s, Seq):
        stmts = [x for x in (map_stmt(c, fn) for c in s.stmts) if x is not None]
        return fn(seq(*stmts)) if stmts else None
    if isinstance(s, IfThenElse):
        then = map_stmt(s.then, fn)
        other = map_stmt(s.else_, fn) if s.else_ is not None else None
        if then is None and other is None:
            return None
        return fn(IfThenElse(s.cond, then if then is not None else Seq(()), other))
    return fn(s)


def simplify_stmt(s: Stmt, ranges: Ranges) -> Stmt:
    """Simplify every expression; drop guards the loop ranges prove and code they prove dead."""
    def visit(node: Stmt) -> Stmt | None:
        if isinstance(node, Store):
            return Store(node.buffer, tuple(simplify(i, ranges) for i in node.indices), simplify(node.value, ranges))
        if isinstance(node, IfThenElse):
            cond = simplify(node.cond, ranges)
            if cond.op is Op.CONST:
                return node.then if cond.value else node.else_
            return IfThenElse(cond, node.then, node.else_)
        if isinstance(node, For):
            extent = simplify(node.extent, ranges)
            if extent.op is Op.CONST and extent.value <= 0:
                return None
            return replace(node, extent=extent)
        return node
    out = map_stmt(s, visit)
    return out if out is not None else Seq(())


def simplify_func(f: PrimFunc, ranges: Ranges) -> PrimFunc:
    return replace(f, body=simplify_stmt(f.body, ranges))
