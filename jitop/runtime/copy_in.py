"""Regions copied into arguments before a kernel runs, by the native entry (jitop.runtime.fastcall).

A decode step writes a row into its cache argument and then reads the cache (`cache[t] = k`, t and k arguments):
jitop.graph.writeback writes that row into the caller's array before the kernel, which then reads the array
itself. A `CopyIn` lets the native entry do that write, so such a call runs without Python: the entry checks
everything first (each target writeable, each position inside its axis) and copies only when all hold; when one
fails it misses, nothing written, and the Python path raises numpy's error. Arguments may share memory: the
copies are made in order, as numpy's assignments are, before the kernel reads anything.

The entry reads a spec's copies as words (`section`): their count, then per copy

    [target input, source input, target's argument position, region bytes, n_index,
     per index entry: (is_arg, value or the scalar input, axis length, axis stride in bytes)]

where an "input" is the kernel parameter the entry's match fills (its data pointer, or a scalar's value).

>>> inputs = [("array", 0, np.dtype("f4"), (4, 3)), ("array", 1, np.dtype("f4"), (3,)), ("int", 2)]
>>> section([CopyIn(target=0, source=1, index=(("arg", 2),))], inputs)
[1, 0, 1, 0, 12, 1, 1, 2, 4, 12]
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from llvmlite import ir
import numpy as np

__all__ = ["CopyIn", "MAX_COPIES", "section", "copy_in_ir"]

MAX_COPIES = 8  # copies one spec makes (the entry keeps each one's offset on its stack)
_I1, _I32, _I64, _I8, _PTR = ir.IntType(1), ir.IntType(32), ir.IntType(64), ir.IntType(8), ir.PointerType()

InputInfo = tuple  # ("array", position, dtype, shape) | ("int", position) | ("other",)


@dataclass(frozen=True)
class CopyIn:
    """Before the kernel: argument `source` (an array of the target's dtype and exactly the region's shape)
    copied into `target[index]`, `index` one entry per leading axis of the target: an int, or ("arg", p) the
    Python int argument at position p (negative counts from the end, as in numpy)."""

    target: int
    source: int
    index: tuple[int | tuple[str, int], ...]


def section(copies: Sequence[CopyIn], inputs: Sequence[InputInfo]) -> list[int]:
    """The words the entry's @copy_in reads for `copies`; `inputs`: the spec's inputs in parameter order.
    Raises ValueError for a copy the entry cannot make exactly as numpy's assignment would."""
    if not 0 < len(copies) <= MAX_COPIES:
        raise ValueError(f"a spec makes 1 to {MAX_COPIES} copies in, not {len(copies)}")
    arrays = {i[1]: (k, i) for k, i in enumerate(inputs) if i[0] == "array"}
    ints = {i[1]: k for k, i in enumerate(inputs) if i[0] == "int"}
    words = [len(copies)]
    for c in copies:
        if c.target not in arrays or c.source not in arrays or c.target == c.source:
            raise ValueError(f"{c}: target and source must be two array arguments of the kernel")
        (tk, (_, _, dt, shape)), (sk, (_, _, sdt, sshape)) = arrays[c.target], arrays[c.source]
        if any(type(d) is not int for d in (*shape, *sshape)) or sdt != dt or len(c.index) > len(shape) or \
                tuple(sshape) != tuple(shape[len(c.index):]):
            raise ValueError(f"{c}: the source must be an array of the target's dtype and the region's shape")
        strides = [dt.itemsize * int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(len(shape))]
        lead = []
        for i, (entry, dim, stride) in enumerate(zip(c.index, shape, strides)):
            lead += [1, ints[entry[1]], dim, stride] if _is_arg(entry, ints) else [0, _constant(entry, dim), dim, stride]
        words += [tk, sk, c.target, _nbytes(arrays[c.source][1]), len(c.index), *lead]
    return words


def _is_arg(entry: Any, ints: dict[int, int]) -> bool:
    if type(entry) is tuple:
        if entry[0] != "arg" or entry[1] not in ints:
            raise ValueError(f"index entry {entry}: not an int argument of the kernel")
        return True
    return False


def _constant(entry: Any, dim: int) -> int:
    if type(entry) is not int or not -dim <= entry < dim:
        raise ValueError(f"index entry {entry!r} is not an int inside an axis of length {dim}")
    return entry % dim


def _nbytes(info: InputInfo) -> int:
    """An array input's bytes."""
    return info[2].itemsize * int(np.prod(info[3], dtype=np.int64))


# ** the entry's @copy_in, built with llvmlite.ir **

def copy_in_ir(flags_offset: int, writeable: int) -> str:
    """@copy_in(sec, args, ptrs, scal) -> i1, as LLVM IR text for the entry's module: `sec` a spec's section,
    `args` the call's arguments, `ptrs`/`scal` what the entry's match filled (data pointers, scalar values).
    Checks every copy, then copies them in order (a memmove: a source may overlap its target, as numpy allows);
    0 (nothing written) if a check fails. `flags_offset`: where an ndarray
    keeps its flags; `writeable`: NPY_ARRAY_WRITEABLE."""
    mod = ir.Module("jitop_copy_in")
    fn = ir.Function(mod, ir.FunctionType(_I1, [_PTR] * 4), "copy_in")
    fn.linkage = "internal"
    sec, args, ptrs, scal = fn.args
    for arg, name in zip(fn.args, ("sec", "args", "ptrs", "scal")):
        arg.name = name
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    v = _Vars(b, "c", "at", "j", "off")
    offs = b.alloca(ir.ArrayType(_I64, MAX_COPIES), name="offs")
    offs.type = _PTR  # opaque, like every other pointer here
    fail = fn.append_basic_block("fail")
    n = _word(b, sec, 0, "n")
    b.store(_I64(1), v.at)
    with _range(b, v.c, n) as c:
        _check_one(b, v, sec, args, ptrs, scal, fail, flags_offset, writeable)
        b.store(b.load(v.off, typ=_I64), b.gep(offs, [c], source_etype=_I64))
    b.store(_I64(1), v.at)
    with _range(b, v.c, n) as c:
        at = b.load(v.at, typ=_I64)
        dst = b.gep(_pointer(b, ptrs, _word(b, sec, at)), [_word(b, offs, c)], source_etype=_I8)
        src = _pointer(b, ptrs, _word(b, sec, b.add(at, _I64(1))))
        b.call(_memmove(mod), [dst, src, _word(b, sec, b.add(at, _I64(3))), _I1(0)])
        b.store(_next_copy(b, sec, at), v.at)
    b.ret(_I1(1))
    b.position_at_end(fail)
    b.ret(_I1(0))
    return "\n".join(str(g) for g in mod.functions)


def _check_one(b: ir.IRBuilder, v: "_Vars", sec: ir.Value, args: ir.Value, ptrs: ir.Value, scal: ir.Value,
               fail: ir.Block, flags_offset: int, writeable: int) -> None:
    """The checks of the copy at word v.at (the target writeable, each index inside its axis); its byte offset
    into the target left in v.off."""
    at = b.load(v.at, typ=_I64, name="at")
    field = lambda k: _word(b, sec, b.add(at, _I64(k)))  # noqa: E731 - the copy's k-th word
    target = b.load(b.gep(args, [field(2)], source_etype=_PTR), typ=_PTR, name="target")
    flags = b.load(b.gep(target, [_I64(flags_offset)], source_etype=_I8), typ=_I32, name="flags")
    _require(b, b.icmp_unsigned("!=", b.and_(flags, _I32(writeable)), _I32(0)), fail)
    b.store(_I64(0), v.off)
    with _range(b, v.j, field(4)) as j:  # each index entry: inside its axis, its bytes added to the offset
        e = b.add(b.add(at, _I64(5)), b.mul(j, _I64(4)))
        entry = lambda k: _word(b, sec, b.add(e, _I64(k)))  # noqa: E731
        is_arg = b.icmp_unsigned("!=", entry(0), _I64(0))
        given = b.select(is_arg, _word(b, scal, b.select(is_arg, entry(1), _I64(0))), entry(1), name="given")
        dim = entry(2)
        idx = b.select(b.icmp_signed("<", given, _I64(0)), b.add(given, dim), given, name="idx")
        _require(b, b.and_(b.icmp_signed(">=", idx, _I64(0)), b.icmp_signed("<", idx, dim)), fail)
        b.store(b.add(b.load(v.off, typ=_I64), b.mul(idx, entry(3))), v.off)
    b.store(_next_copy(b, sec, at), v.at)


def _next_copy(b: ir.IRBuilder, sec: ir.Value, at: ir.Value) -> ir.Value:
    """The word after the copy at `at`."""
    return b.add(b.add(at, _I64(5)), b.mul(_word(b, sec, b.add(at, _I64(4))), _I64(4)))


class _Vars:
    """i64 stack slots (LLVM's mem2reg makes them registers), made in the entry block."""

    def __init__(self, b: ir.IRBuilder, *names: str):
        for name in names:
            slot = b.alloca(_I64, name=name)
            slot.type = _PTR
            setattr(self, name, slot)


@contextlib.contextmanager
def _range(b: ir.IRBuilder, counter: ir.Value, n: ir.Value) -> Iterator[ir.Value]:
    """for i in range(n): the body built inside the with block; the builder continues after the loop."""
    fn = b.function
    head, body, after = (fn.append_basic_block(name) for name in ("loop", "body", "after"))
    b.store(_I64(0), counter)
    b.branch(head)
    b.position_at_end(head)
    i = b.load(counter, typ=_I64, name="i")
    b.cbranch(b.icmp_signed("<", i, n), body, after)
    b.position_at_end(body)
    yield i
    b.store(b.add(i, _I64(1)), counter)
    b.branch(head)
    b.position_at_end(after)


def _require(b: ir.IRBuilder, ok: ir.Value, fail: ir.Block) -> None:
    """Go on if `ok`, else to `fail`."""
    cont = b.function.append_basic_block("ok")
    b.cbranch(ok, cont, fail)
    b.position_at_end(cont)


def _word(b: ir.IRBuilder, base: ir.Value, index: ir.Value | int, name: str = "") -> ir.Value:
    index = _I64(index) if isinstance(index, int) else index
    return b.load(b.gep(base, [index], source_etype=_I64), typ=_I64, name=name)


def _pointer(b: ir.IRBuilder, ptrs: ir.Value, k: ir.Value) -> ir.Value:
    return b.load(b.gep(ptrs, [k], source_etype=_PTR), typ=_PTR)


def _memmove(mod: ir.Module) -> ir.Function:
    name = "llvm.memmove.p0.p0.i64"
    return mod.globals.get(name) or ir.Function(mod, ir.FunctionType(ir.VoidType(), [_PTR, _PTR, _I64, _I1]), name)
