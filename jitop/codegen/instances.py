"""Identical top-level loop nests: generated once, called once per instance.

A program that repeats one computation on different data (the 12 attention heads of a transformer block,
each `softmax(q_h @ k_h.T) @ v_h` on its slice of q, k and v) lowers to the same loop nests again and again,
differing only in which buffers they touch and by constant offsets into them (head h reads columns
64*h ... 64*h + 63). Each such group of nests becomes one internal function taking a pointer per buffer
("slot"); the kernel calls it once per instance with that instance's buffers, each advanced by its offset
into the buffer. Code generation and LLVM then see one copy instead of twelve.

Two nests are instances of one another when they are equal after renaming loop variables and their own
allocations, with each buffer they share with the rest of the program (a slot) of the same dtype and shape,
and every index into a slot differing from the representative's by the same constant in each dimension.
A slot is one buffer: two slots are never one buffer within an instance (their pointers may be noalias).
Only nests whose every access to a slot is proven in bounds join a group (an offset pointer would defeat a
run-time check), and an instance's offsets must stay inside its buffers. A kernel with shape symbols shares
nests too (a decode step's heads over a growing cache): the symbols are the kernel's, the same in every
instance, and a slot of a symbolic shape may be offset where the offset is a constant (a column block of a
(rows, 768) cache; rows are not).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from jitop.te.expr import Expr, Op
from jitop.tir.bounds import BoundsCheck
from jitop.tir.nodes import Allocate, Buffer, For, IfThenElse, Seq, Stmt, Store

MIN_INSTANCES = 2  # a nest that occurs once is emitted in place


@dataclass(frozen=True)
class Instance:
    """One occurrence of a shared nest: the buffers it passes for the slots and each one's element offset."""

    buffers: tuple[Buffer, ...]
    offsets: tuple[int, ...]


@dataclass
class Shared:
    """A group of identical nests: `body`, the representative, is generated once with `slots` as its
    buffers; `name` is filled in when its function is emitted."""

    body: Stmt
    slots: tuple[Buffer, ...]
    instances: dict[int, Instance]  # position of the nest in the top-level sequence -> its instance
    name: str | None = None


def find_shared(nests: tuple[Stmt, ...], ranges: dict[Expr, tuple[int, int]],
                symbols: frozenset[Expr] = frozenset()) -> dict[int, Shared]:
    """The nests (by position) that are instances of a nest occurring at least MIN_INSTANCES times, each
    mapped to its group. `ranges`: the loop variables' ranges (PrimFunc.attrs['ranges']) for the bounds
    prover; `symbols`: the kernel's shape symbols (the same variables in every nest, never renamed)."""
    interner: dict[tuple, int] = {}
    groups: dict[tuple, list[tuple[int, _Shape]]] = {}
    for k, nest in enumerate(nests):
        shape = _Shape.of(nest, interner, symbols)
        if shape is not None:
            groups.setdefault(shape.key, []).append((k, shape))
    found: dict[int, Shared] = {}
    for members in groups.values():
        members = [(k, s) for k, s in members if _proven(nests[k], s, ranges)] if len(members) >= MIN_INSTANCES else []
        if len(members) < MIN_INSTANCES:
            continue
        (_, rep), instances = members[0], {}
        for k, shape in members:
            offsets = shape.offsets_from(rep)
            if offsets is not None:
                instances[k] = Instance(tuple(shape.slots), offsets)
        if len(instances) >= MIN_INSTANCES:
            group = Shared(nests[members[0][0]], tuple(rep.slots), instances)
            found.update({k: group for k in instances})
    return found


class _Shape:
    """A nest's structure with names abstracted: `key` (equal for instances of one another), the slots in
    order of first use and, per slot, the constant part of its first index in each dimension (`base`)."""

    def __init__(self, interner: dict[tuple, int], symbols: frozenset[Expr] = frozenset()):
        self.interner = interner
        self.symbols = symbols
        self.vars: dict[Expr, int] = {}
        self.local: dict[Buffer, int] = {}
        self.slots: list[Buffer] = []
        self.base: dict[Buffer, tuple[int, ...]] = {}
        self.memo: dict[Expr, int] = {}
        self.key: tuple = ()

    @classmethod
    def of(cls, nest: Stmt, interner: dict[tuple, int], symbols: frozenset[Expr] = frozenset()) -> "_Shape | None":
        """The shape of `nest`, or None for one that cannot be shared."""
        shape = cls(interner, symbols)
        try:
            body = shape.stmt(nest)
        except _NotShareable:
            return None
        if body is None:
            return None
        # dims by identity (hash-consed Exprs: == on them would build a comparison)
        shape.key = (body, tuple((b.dtype.name, tuple(id(d) if isinstance(d, Expr) else d for d in b.shape))
                                 for b in shape.slots))
        return shape

    def offsets_from(self, rep: "_Shape") -> tuple[int, ...] | None:
        """Each slot's element offset relative to `rep`'s, or None when one would point outside its buffer."""
        offsets = []
        for mine, theirs in zip(self.slots, rep.slots):
            flat = 0
            for dim, a, b in zip(mine.shape, self.base[mine], rep.base[theirs]):
                if flat and isinstance(dim, Expr):  # a symbolic stride: not a constant offset
                    return None
                flat = (flat * dim if flat else 0) + (a - b)
            # a symbolic size: the instance's own accesses are proven in bounds (find_shared), so is its offset
            if flat < 0 or isinstance(mine.size, int) and flat >= max(mine.size, 1):
                return None
            offsets.append(flat)
        return tuple(offsets)

    # ** statements: nested tuples of interned ids **
    def stmt(self, s: Stmt) -> Any:
        if isinstance(s, Seq):
            parts = [self.stmt(x) for x in s.stmts]
            return None if any(p is None for p in parts) else ("seq", *parts)
        if isinstance(s, For):
            body = self.stmt(s.body)
            return None if body is None else ("for", self.expr(s.var), self.expr(s.extent), s.kind.name, body)
        if isinstance(s, Store):
            return ("store", self.access(s.buffer, s.indices), self.expr(s.value))
        if isinstance(s, IfThenElse):
            then = self.stmt(s.then)
            other = self.stmt(s.else_) if s.else_ is not None else ()
            return None if then is None or other is None else ("if", self.expr(s.cond), then, other)
        if isinstance(s, Allocate):
            buf = s.buffer  # a symbolic size is an expression of the kernel's symbols: the same in every instance
            self.local[buf] = len(self.local)
            body = self.stmt(s.body)
            shape = tuple(self.expr(d) if isinstance(d, Expr) else d for d in buf.shape)
            return None if body is None else ("alloc", buf.dtype.name, shape, buf.scope, body)
        return None

    def access(self, buf: Buffer, indices: tuple[Expr, ...]) -> Any:
        """A slot's indices as (non-constant part, constant part minus the slot's base) per dimension."""
        if buf in self.local:
            return ("local", self.local[buf], tuple(self.expr(i) for i in indices))
        split = [_split_const(i) for i in indices]
        if buf not in self.base:
            self.base[buf] = tuple(c for _, c in split)
            self.slots.append(buf)
        base = self.base[buf]
        return ("slot", self.slots.index(buf),
                tuple((self.expr(rest) if rest is not None else -1, c - b) for (rest, c), b in zip(split, base)))

    # ** expressions: one interned id per distinct shape, built without recursion (deep fused expressions) **
    def expr(self, root: Expr) -> int:
        memo = self.memo
        stack = [root]
        while stack:
            e = stack[-1]
            if e in memo:
                stack.pop()
                continue
            todo = [c for c in _children(e) if c not in memo]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            memo[e] = self.interner.setdefault(self._node(e), len(self.interner))
        return memo[root]

    def _node(self, e: Expr) -> tuple:
        if e.op is Op.VAR and e in self.symbols:  # the kernel's symbol: the same variable in every instance
            return ("symbol", id(e))
        if e.op is Op.VAR:
            return ("var", self.vars.setdefault(e, len(self.vars)), e.dtype.name)
        if e.op is Op.LOAD:
            if not isinstance(e.arg, Buffer):
                raise _NotShareable
            return ("load", e.dtype.name, self.access(e.arg, e.src))
        return (e.op.name, e.dtype.name, _arg(e.arg), tuple(self.memo[c] for c in e.src))


class _NotShareable(Exception):
    """A nest with something the grouping does not handle: it is emitted in place."""


def _children(e: Expr) -> tuple[Expr, ...]:
    """The sub-expressions `_Shape._node` needs encoded first (a load's: the non-constant parts of its indices)."""
    if e.op is Op.LOAD:
        return tuple(r for r, _ in map(_split_const, e.src) if r is not None)
    return e.src


def _arg(arg: Any) -> Any:
    """A node's argument as a key: floats by their bits (0.0 and -0.0 differ), bools apart from ints."""
    if isinstance(arg, (float, np.floating)):
        return ("f", struct.pack("<d", float(arg)))
    return ("b", arg) if isinstance(arg, bool) else arg


def _split_const(idx: Expr) -> tuple[Expr | None, int]:
    """idx as (rest, c) with idx == rest + c, c an int (rest None when idx is a constant)."""
    if idx.op is Op.CONST:
        return None, int(idx.value)
    if idx.op is Op.ADD and idx.src[1].op is Op.CONST:
        return idx.src[0], int(idx.src[1].value)
    if idx.op is Op.SUB and idx.src[1].op is Op.CONST:
        return idx.src[0], -int(idx.src[1].value)
    return idx, 0


def _proven(nest: Stmt, shape: _Shape, ranges: dict[Expr, tuple[int, int]]) -> bool:
    """Whether every access of `nest` to one of its slots is proven in bounds, under the guards around it
    (as the code generator proves them: what it cannot prove it checks at run time)."""
    check = BoundsCheck(dict(ranges))
    slots = set(shape.slots)

    def accesses_ok(e: Expr) -> bool:
        stack, seen = [e], set()
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            if x.op is Op.LOAD and x.arg in slots and not check.proves(x.arg, x.src):
                return False
            stack.extend(x.src)
        return True

    def visit(s: Stmt) -> bool:
        if isinstance(s, Seq):
            return all(visit(x) for x in s.stmts)
        if isinstance(s, (For, Allocate)):
            return visit(s.body)
        if isinstance(s, Store):
            return (s.buffer not in slots or check.proves(s.buffer, s.indices)) and accesses_ok(s.value) \
                and all(accesses_ok(i) for i in s.indices)
        if isinstance(s, IfThenElse):
            if not accesses_ok(s.cond):
                return False
            for holds, branch in ((True, s.then), (False, s.else_)):
                if branch is None:
                    continue
                n = check.push(s.cond, holds)
                try:
                    if not visit(branch):
                        return False
                finally:
                    check.pop(n)
            return True
        return False

    return visit(nest)
