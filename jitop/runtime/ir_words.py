"""What the native entry's llvmlite.ir builders share (jitop.runtime.entry_ir, dimprog_ir, copy_in): the types
they use, a word read from an i64 table (a spec's words, a call's slots) and the few control-flow shapes they
repeat.

>>> b = ir.IRBuilder(ir.Function(ir.Module(), ir.FunctionType(I64, [PTR]), "f").append_basic_block())
>>> b.ret(word(b, b.function.args[0], 3))  # doctest: +ELLIPSIS
<ir.Ret ...>
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

from llvmlite import ir

__all__ = ["I1", "I8", "I32", "I64", "PTR", "CodePointer", "word", "pointer_word", "function", "call_named",
           "require", "counted", "index_loop", "answer", "stack_slot", "stack_array", "i64_variable"]

I1, I8, I32, I64, PTR = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.PointerType()


class CodePointer(ir.PointerType):
    """An opaque pointer (printed `ptr`) to code of a known function type: llvmlite calls only through a value
    whose type names the callee's function type.

    >>> str(CodePointer(ir.FunctionType(ir.VoidType(), [I64])))
    'ptr'
    """

    def __init__(self, function_type: ir.FunctionType):
        super().__init__()
        self.pointee = function_type


def word(b: ir.IRBuilder, base: ir.Value, index: ir.Value | int, name: str = "") -> ir.Value:
    """base[index] of an i64 array."""
    index = I64(index) if isinstance(index, int) else index
    return b.load(b.gep(base, [index], source_etype=I64), typ=I64, name=name)


def pointer_word(b: ir.IRBuilder, base: ir.Value, index: ir.Value | int, name: str = "",
                 typ: ir.Type = PTR) -> ir.Value:
    """base[index] of an i64 array, read as a pointer (a word holding an address)."""
    index = I64(index) if isinstance(index, int) else index
    return b.load(b.gep(base, [index], source_etype=I64), typ=typ, name=name)


def function(mod: ir.Module, name: str, ret: ir.Type, params: Sequence[tuple[str, ir.Type]],
             blocks: Sequence[str] = ("entry",), internal: bool = True,
             attributes: Sequence[str] = ()) -> tuple[ir.Function, dict[str, ir.Block]]:
    """A function of `mod` with named parameters and its basic blocks, by label (the first is its entry)."""
    fn = ir.Function(mod, ir.FunctionType(ret, [t for _, t in params]), name)
    if internal:
        fn.linkage = "internal"
    for attribute in attributes:
        fn.attributes.add(attribute)
    for arg, (pname, _) in zip(fn.args, params):
        arg.name = pname
    return fn, {label: fn.append_basic_block(label) for label in blocks}


def call_named(b: ir.IRBuilder, name: str, args: Sequence[ir.Value], result: str = "") -> ir.CallInstr:
    """A call of the function `name` of the builder's module (declared or defined before)."""
    return b.call(b.module.get_global(name), list(args), name=result)


def require(b: ir.IRBuilder, ok: ir.Value, fail: ir.Block) -> None:
    """Go on if `ok`, else to `fail`."""
    cont = b.function.append_basic_block("ok")
    b.cbranch(ok, cont, fail)
    b.position_at_end(cont)


def index_loop(b: ir.IRBuilder, bb: dict[str, ir.Block], n: ir.Value) -> ir.PhiInstr:
    """for d in range(n) over blocks "entry" (the builder's), "loop" and "cmp": the builder left in "cmp" (the
    body, which adds d + 1 as the phi's incoming value from the block that loops back); "yes" when d reaches n."""
    b.branch(bb["loop"])
    b.position_at_end(bb["loop"])
    d = b.phi(I64, "d")
    d.add_incoming(I64(0), bb["entry"])
    b.cbranch(b.icmp_signed("==", d, n), bb["yes"], bb["cmp"])
    b.position_at_end(bb["cmp"])
    return d


def answer(b: ir.IRBuilder, bb: dict[str, ir.Block], yes: str = "yes", no: str = "no") -> None:
    """Blocks `yes` and `no` return i1 1 and 0."""
    for label, value in ((yes, 1), (no, 0)):
        b.position_at_end(bb[label])
        b.ret(I1(value))


def stack_slot(b: ir.IRBuilder, typ: ir.Type, name: str, align: int | None = None) -> ir.Value:
    """A stack slot of `typ` where the builder is, as an opaque pointer (llvmlite types its allocas)."""
    slot = b.alloca(typ, name=name)
    slot.align = align
    slot.type = PTR
    return slot


def stack_array(b: ir.IRBuilder, element: ir.Type, n: int, name: str) -> ir.Value:
    """An n-element array on the stack, 16-byte aligned."""
    return stack_slot(b, ir.ArrayType(element, n), name, 16)


def i64_variable(b: ir.IRBuilder, name: str) -> ir.Value:
    """An i64 stack slot (LLVM's mem2reg makes it a register); build it in the entry block."""
    return stack_slot(b, I64, name)


@contextlib.contextmanager
def counted(b: ir.IRBuilder, counter: ir.Value, n: ir.Value) -> Iterator[ir.Value]:
    """for i in range(n), counting in the i64 variable `counter`: the body is built inside the with block; the
    builder continues after the loop."""
    fn = b.function
    head, body, after = (fn.append_basic_block(name) for name in ("loop", "body", "after"))
    b.store(I64(0), counter)
    b.branch(head)
    b.position_at_end(head)
    i = b.load(counter, typ=I64, name="i")
    b.cbranch(b.icmp_signed("<", i, n), body, after)
    b.position_at_end(body)
    yield i
    b.store(b.add(i, I64(1)), counter)
    b.branch(head)
    b.position_at_end(after)
