"""What the native entry's llvmlite.ir builders share (jitop.runtime.fastcall's symbolic parts,
jitop.runtime.copy_in): the types they use and a word read from an i64 table (a spec's words, a call's slots).

>>> b = ir.IRBuilder(ir.Function(ir.Module(), ir.FunctionType(I64, [PTR]), "f").append_basic_block())
>>> b.ret(word(b, b.function.args[0], 3))  # doctest: +ELLIPSIS
<ir.Ret ...>
"""
from __future__ import annotations

from llvmlite import ir

__all__ = ["I1", "I8", "I32", "I64", "PTR", "word"]

I1, I8, I32, I64, PTR = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.PointerType()


def word(b: ir.IRBuilder, base: ir.Value, index: ir.Value | int, name: str = "") -> ir.Value:
    """base[index] of an i64 array."""
    index = I64(index) if isinstance(index, int) else index
    return b.load(b.gep(base, [index], source_etype=I64), typ=I64, name=name)
