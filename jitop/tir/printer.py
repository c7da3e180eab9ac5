"""Readable text for expressions and loop IR, like Python source."""
from __future__ import annotations

from jitop.te.printer import expr_str
from jitop.tir.nodes import Allocate, Barrier, For, ForKind, IfThenElse, PrimFunc, Seq, Stmt, Store, ThreadReduce

def _lines(s: Stmt, depth: int) -> list[str]:
    pad = "    " * depth
    if isinstance(s, Seq):
        return [line for x in s.stmts for line in _lines(x, depth)]
    if isinstance(s, For):
        head = f"range({expr_str(s.extent)})" if s.kind is ForKind.SERIAL else f"{s.kind.value}({expr_str(s.extent)})"
        return [f"{pad}for {s.var.name} in {head}:"] + _lines(s.body, depth + 1)
    if isinstance(s, Store):
        return [f"{pad}{s.buffer.name}[{', '.join(expr_str(i) for i in s.indices)}] = {expr_str(s.value)}"]
    if isinstance(s, IfThenElse):
        out = [f"{pad}if {expr_str(s.cond)}:"] + _lines(s.then, depth + 1)
        return out + ([f"{pad}else:"] + _lines(s.else_, depth + 1) if s.else_ is not None else [])
    if isinstance(s, Barrier):
        return [f"{pad}barrier()"]
    if isinstance(s, ThreadReduce):
        acc = f"{s.buffer.name}[0]"
        return [f"{pad}{acc} = thread_reduce({s.reducer.name}, {acc}, {s.kind.value}({s.extent}))"]
    if isinstance(s, Allocate):
        b = s.buffer
        return [f"{pad}{b.name} = allocate({b.dtype.name}[{', '.join(map(str, b.shape))}], {b.scope!r})"] + \
            _lines(s.body, depth)
    raise TypeError(f"unknown statement {type(s).__name__}")


def stmt_str(s: Stmt, depth: int = 0) -> str:
    return "\n".join(_lines(s, depth))


def func_str(f: PrimFunc) -> str:
    params = ", ".join(f"{b.name}: {b.dtype.name}[{', '.join(map(str, b.shape))}]" for b in f.params)
    return f"def {f.name}({params}):\n{stmt_str(f.body, 1)}"
