"""Regions copied into arguments by the native entry (jitop.runtime.fastcall), before or after the kernel.

A decode step writes a row into its cache argument and then reads the cache (`cache[t] = k`, t and k arguments):
jitop.graph.writeback writes that row into the caller's array before the kernel, which then reads the array
itself; a row the function computes (`cache[t] = x @ Wk`) is a result of the kernel, written into the array after
it. A `CopyIn` lets the native entry make either write, so such a call runs without Python: the entry checks
everything before the kernel (each target writeable, each position inside its axis, and for a copy after the
kernel no other array argument sharing the target's memory: the kernel read it as it was, numpy would see the
write) and goes on only when all hold; when one fails it misses, nothing written, and the Python path raises
numpy's error or runs the call as numpy. Copies before the kernel are made in order, as numpy's assignments are,
before the kernel reads anything: arguments may share memory with them.

The entry reads a spec's copies as words (`section`): their count, then per copy

    [target input, source parameter, after (0 or 1), target's argument position, region bytes, target bytes,
     n_index, n_other,
     per index entry: (is_arg, value or the scalar input, axis length, axis stride in bytes),
     per other array input (a copy after the kernel): (input, its bytes)]

where an "input" is a kernel parameter the entry's match fills (its data pointer, or a scalar's value), and the
source parameter an input or, after the kernel, an output (the kernel's parameters: inputs, then outputs).

>>> inputs = [("array", 0, np.dtype("f4"), (4, 3)), ("array", 1, np.dtype("f4"), (3,)), ("int", 2)]
>>> section([CopyIn(target=0, source=1, index=(("arg", 2),))], inputs, [])
[1, 0, 1, 0, 0, 12, 48, 1, 0, 1, 2, 4, 12]
>>> section([CopyIn(target=0, source=("out", 0), index=(("arg", 2),))], inputs, [(np.dtype("f4"), (3,))])
[1, 0, 3, 1, 0, 12, 48, 1, 1, 1, 2, 4, 12, 1, 12]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from llvmlite import ir
import numpy as np

from jitop.runtime.ir_words import I1, I8, I32, I64, PTR, counted, function, i64_variable, require, word

__all__ = ["CopyIn", "MAX_COPIES", "section", "add_copy_in"]

MAX_COPIES = 8  # copies one spec makes

InputInfo = tuple  # ("array", position, dtype, shape) | ("int", position) | ("other",)


@dataclass(frozen=True)
class CopyIn:
    """`source` copied into `target[index]`: an argument (by position), copied before the kernel, or ("out", j)
    the kernel's output j, copied after it; of the target's dtype and exactly the region's shape. `index`: one
    entry per leading axis of the target, an int or ("arg", p) the Python int argument at position p (negative
    counts from the end, as in numpy)."""

    target: int
    source: int | tuple[str, int]
    index: tuple[int | tuple[str, int], ...]


def section(copies: Sequence[CopyIn], inputs: Sequence[InputInfo], outputs: Sequence[tuple[Any, tuple]]) -> list[int]:
    """The words the entry's @copy_in reads for `copies`; `inputs`: the spec's inputs in parameter order,
    `outputs`: its outputs' (dtype, shape). Raises ValueError for a copy the entry cannot make exactly as
    numpy's assignment would."""
    if not 0 < len(copies) <= MAX_COPIES:
        raise ValueError(f"a spec makes 1 to {MAX_COPIES} copies, not {len(copies)}")
    arrays = {i[1]: (k, i) for k, i in enumerate(inputs) if i[0] == "array"}
    ints = {i[1]: k for k, i in enumerate(inputs) if i[0] == "int"}
    return [len(copies)] + [w for c in copies for w in _copy_words(c, arrays, ints, len(inputs), outputs)]


def _copy_words(c: CopyIn, arrays: dict[int, tuple[int, InputInfo]], ints: dict[int, int], n_inputs: int,
                outputs: Sequence[tuple[Any, tuple]]) -> list[int]:
    """One copy's words (the module docstring's layout); `arrays`/`ints`: argument position -> input."""
    after = type(c.source) is tuple
    if c.target not in arrays or c.target == c.source or not after and c.source not in arrays or \
            after and (c.source[0] != "out" or not 0 <= c.source[1] < len(outputs)):
        raise ValueError(f"{c}: the target must be an array argument, the source another or an output")
    tk, target = arrays[c.target]
    dt, shape = target[2], target[3]
    sk, (sdt, sshape) = (n_inputs + c.source[1], outputs[c.source[1]]) if after else \
        (arrays[c.source][0], arrays[c.source][1][2:])
    if any(type(d) is not int for d in (*shape, *sshape)) or np.dtype(sdt) != dt or len(c.index) > len(shape) \
            or tuple(sshape) != tuple(shape[len(c.index):]):
        raise ValueError(f"{c}: the source must be an array of the target's dtype and the region's shape")
    lead = []
    for d, entry in enumerate(c.index):
        given = [1, ints[entry[1]]] if _is_arg(entry, ints) else [0, _constant(entry, shape[d])]
        lead += [*given, shape[d], dt.itemsize * int(np.prod(shape[d + 1:], dtype=np.int64))]
    # a copy after the kernel: the other array inputs, none of which may share the target's memory
    others = [w for p, (k, i) in arrays.items() if p != c.target for w in (k, _nbytes(i))] if after else []
    return [tk, sk, int(after), c.target, dt.itemsize * int(np.prod(sshape, dtype=np.int64)), _nbytes(target),
            len(c.index), len(others) // 2, *lead, *others]


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
    """An array input's bytes; ValueError for one of a symbolic shape (the entry compares byte ranges it knows)."""
    if any(type(d) is not int for d in info[3]):
        raise ValueError(f"argument {info[1]} has a symbolic shape {info[3]}: its bytes are not known here")
    return info[2].itemsize * int(np.prod(info[3], dtype=np.int64))


# ** the entry's @copy_in, built with llvmlite.ir **
# a copy's words after its start (see the module docstring)
_TARGET, _SOURCE, _AFTER, _POSITION, _BYTES, _TARGET_BYTES, _N_INDEX, _N_OTHER, _HEAD = range(9)


def add_copy_in(mod: ir.Module, flags_offset: int, writeable: int) -> ir.Function:
    """@copy_in(sec, args, ptrs, scal, phase) -> i1, added to the entry's module: `sec` a spec's section, `args`
    the call's arguments, `ptrs`/`scal` the kernel's parameters the entry filled (data pointers, scalar values).
    Phase 0, before the kernel: checks every copy, then makes those before the kernel; 0 (nothing written) if a
    check fails. Phase 1, after it: makes the copies after the kernel. Each copy is a memmove (a source may
    overlap its target, as numpy allows). `flags_offset`: where an ndarray keeps its flags; `writeable`:
    NPY_ARRAY_WRITEABLE."""
    fn, bb = function(mod, "copy_in", I1, [("sec", PTR), ("args", PTR), ("ptrs", PTR), ("scal", PTR),
                                           ("phase", I64)], ["entry", "fail"])
    sec, args, ptrs, scal, phase = fn.args
    b = ir.IRBuilder(bb["entry"])
    v = _Vars(b, "c", "at", "j", "off")
    fail = bb["fail"]
    n = word(b, sec, 0, "n")
    with b.if_then(b.icmp_signed("==", phase, I64(0))):
        b.store(I64(1), v.at)
        with counted(b, v.c, n):
            _check_one(b, v, sec, args, ptrs, scal, fail, flags_offset, writeable)
    b.store(I64(1), v.at)
    with counted(b, v.c, n):
        at = b.load(v.at, typ=I64, name="at")
        with b.if_then(b.icmp_signed("==", _field(b, sec, at, _AFTER), phase)):
            _offset(b, v, sec, scal, at, None)
            dst = b.gep(_pointer(b, ptrs, _field(b, sec, at, _TARGET)), [b.load(v.off, typ=I64)], source_etype=I8)
            src = _pointer(b, ptrs, _field(b, sec, at, _SOURCE))
            b.call(_memmove(mod), [dst, src, _field(b, sec, at, _BYTES), I1(0)])
        b.store(_next_copy(b, sec, at), v.at)
    b.ret(I1(1))
    b.position_at_end(fail)
    b.ret(I1(0))
    return fn


def _check_one(b: ir.IRBuilder, v: "_Vars", sec: ir.Value, args: ir.Value, ptrs: ir.Value, scal: ir.Value,
               fail: ir.Block, flags_offset: int, writeable: int) -> None:
    """The checks of the copy at word v.at: the target writeable, each index inside its axis, and for a copy
    after the kernel no other array input overlapping the target."""
    at = b.load(v.at, typ=I64, name="at")
    target = b.load(b.gep(args, [_field(b, sec, at, _POSITION)], source_etype=PTR), typ=PTR, name="target")
    flags = b.load(b.gep(target, [I64(flags_offset)], source_etype=I8), typ=I32, name="flags")
    require(b, b.icmp_unsigned("!=", b.and_(flags, I32(writeable)), I32(0)), fail)
    _offset(b, v, sec, scal, at, fail)
    tstart = b.ptrtoint(_pointer(b, ptrs, _field(b, sec, at, _TARGET)), I64, name="tstart")
    tend = b.add(tstart, _field(b, sec, at, _TARGET_BYTES), name="tend")
    others = b.add(b.add(at, I64(_HEAD)), b.mul(_field(b, sec, at, _N_INDEX), I64(4)), name="others")
    with counted(b, v.j, _field(b, sec, at, _N_OTHER)) as j:  # no other array input's bytes overlap the target's
        o = b.add(others, b.mul(j, I64(2)))
        ostart = b.ptrtoint(_pointer(b, ptrs, word(b, sec, o)), I64)
        oend = b.add(ostart, word(b, sec, b.add(o, I64(1))))
        overlap = b.and_(b.icmp_unsigned("<", ostart, tend), b.icmp_unsigned("<", tstart, oend))
        require(b, b.not_(overlap), fail)
    b.store(_next_copy(b, sec, at), v.at)


def _offset(b: ir.IRBuilder, v: "_Vars", sec: ir.Value, scal: ir.Value, at: ir.Value,
            fail: ir.Block | None) -> None:
    """The byte offset of the region of the copy at `at` into its target, left in v.off; with `fail`, each
    index is checked to lie inside its axis (numpy's negative indices wrapped first)."""
    b.store(I64(0), v.off)
    with counted(b, v.j, _field(b, sec, at, _N_INDEX)) as j:
        e = b.add(b.add(at, I64(_HEAD)), b.mul(j, I64(4)))
        entry = lambda k: word(b, sec, b.add(e, I64(k)))  # noqa: E731 - the index entry's k-th word
        is_arg = b.icmp_unsigned("!=", entry(0), I64(0))
        given = b.select(is_arg, word(b, scal, b.select(is_arg, entry(1), I64(0))), entry(1), name="given")
        dim = entry(2)
        idx = b.select(b.icmp_signed("<", given, I64(0)), b.add(given, dim), given, name="idx")
        if fail is not None:
            require(b, b.and_(b.icmp_signed(">=", idx, I64(0)), b.icmp_signed("<", idx, dim)), fail)
        b.store(b.add(b.load(v.off, typ=I64), b.mul(idx, entry(3))), v.off)


def _field(b: ir.IRBuilder, sec: ir.Value, at: ir.Value, k: int) -> ir.Value:
    """Word k of the copy at `at`."""
    return word(b, sec, b.add(at, I64(k)))


def _next_copy(b: ir.IRBuilder, sec: ir.Value, at: ir.Value) -> ir.Value:
    """The word after the copy at `at`."""
    n_index, n_other = _field(b, sec, at, _N_INDEX), _field(b, sec, at, _N_OTHER)
    return b.add(b.add(at, I64(_HEAD)), b.add(b.mul(n_index, I64(4)), b.mul(n_other, I64(2))))


class _Vars:
    """The copy loop's i64 variables, made in the entry block."""

    def __init__(self, b: ir.IRBuilder, *names: str):
        for name in names:
            setattr(self, name, i64_variable(b, name))


def _pointer(b: ir.IRBuilder, ptrs: ir.Value, k: ir.Value) -> ir.Value:
    return b.load(b.gep(ptrs, [k], source_etype=PTR), typ=PTR)


def _memmove(mod: ir.Module) -> ir.Function:
    name = "llvm.memmove.p0.p0.i64"
    return mod.globals.get(name) or ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I1]), name)
