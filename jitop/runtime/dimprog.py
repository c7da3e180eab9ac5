"""Dimension slots and the check-and-shape program of a symbolic signature of the native entry (fastcall).

A kernel with symbolic shapes is served by the native entry through *slots*: call-local int64 cells. Slots
0..k-1 hold the kernel's k symbols (they are the i64[k] array the kernel takes as its last argument); further
slots hold input dimensions that are expressions of the symbols, checked by the program.

Each dimension of an input record is a *dim word*:

- ``w >= 0``: the dimension must equal ``w`` (as for a static signature);
- ``-MAX_SLOTS <= w < 0``: *bind*: store the array's dimension into slot ``-(1 + w)``;
- ``w < -MAX_SLOTS``: *tie*: the dimension must equal the value bound in slot ``s``, where ``w = -1 - MAX_SLOTS - s``.

The program, run after every input matched, is a list of int64 words in reverse Polish notation over a small
stack (`Op`): it checks the guards (lower bounds, ties to expressions), computes each output dimension into
``odims`` (outputs' dims concatenated, in order) and the bytes the call touches (whether the GIL is released).
Every operation is checked: a division or modulo by zero, an int64 overflow, a negative output dimension or a
failed assertion make the program fail, and the entry then tries the next signature (or returns MISS: the
caller's slow path raises the right error). Division and modulo follow Python's floor semantics.

>>> plan = plan_dims(["n"], [("n",), ("n",)], [("n",)], guards=["n >= 2"], sized=[(4, ("n",))] * 3)
>>> plan.inputs, plan.outputs
([[-1], [-17]], [[-1]])
>>> run(plan.program, [5])
(True, [5], 60)
>>> run(plan.program, [1])[0]
False
"""
from __future__ import annotations

import ast
import enum
import operator
from dataclasses import dataclass
from typing import Sequence

from jitop.runtime.args import compile_dim

__all__ = ["MAX_SLOTS", "MAX_STACK", "MAX_ODIMS", "Op", "DimPlan", "plan_dims", "bind_word", "tie_word", "run"]

MAX_SLOTS = 16     # slots per call: symbols plus input dims that are expressions
MAX_STACK = 32     # the program's stack depth
MAX_ODIMS = 256    # output dims of one signature, all outputs together
I64_MIN, I64_MAX = -2 ** 63, 2 ** 63 - 1

Dim = int | str


class Op(enum.IntEnum):
    """The program's operations; PUSH_SLOT, PUSH_CONST and STORE_OUT take the next word as their operand."""

    END = 0
    PUSH_SLOT = 1    # push slots[i]
    PUSH_CONST = 2   # push c
    ADD = 3          # pop b, a; push a + b (overflow: fail)
    SUB = 4
    MUL = 5
    FLOORDIV = 6     # a // b (b == 0 or overflow: fail)
    FLOORMOD = 7     # a % b (b == 0: fail)
    MIN = 8
    MAX = 9
    ASSERT_EQ = 10   # pop b, a; fail unless a == b
    ASSERT_NE = 11
    ASSERT_GE = 12
    ASSERT_GT = 13
    STORE_OUT = 14   # pop v; fail if v < 0; odims[j] = v
    SET_GIL = 15     # pop the bytes the call touches (the entry releases the GIL at RELEASE_GIL_BYTES)


_ARG_OPS = (Op.PUSH_SLOT, Op.PUSH_CONST, Op.STORE_OUT)
_POPS = {Op.PUSH_SLOT: -1, Op.PUSH_CONST: -1, Op.STORE_OUT: 1, Op.SET_GIL: 1, Op.END: 0,  # net cells popped
         Op.ASSERT_EQ: 2, Op.ASSERT_NE: 2, Op.ASSERT_GE: 2, Op.ASSERT_GT: 2}  # the rest: pop 2, push 1
_ASSERTS = {ast.Eq: (Op.ASSERT_EQ, False), ast.NotEq: (Op.ASSERT_NE, False), ast.GtE: (Op.ASSERT_GE, False),
            ast.Gt: (Op.ASSERT_GT, False), ast.LtE: (Op.ASSERT_GE, True), ast.Lt: (Op.ASSERT_GT, True)}
_BINOPS = {ast.Add: Op.ADD, ast.Sub: Op.SUB, ast.Mult: Op.MUL, ast.FloorDiv: Op.FLOORDIV, ast.Mod: Op.FLOORMOD}


def bind_word(slot: int) -> int:
    """The dim word storing an input's dimension into `slot`."""
    return -1 - slot


def tie_word(slot: int) -> int:
    """The dim word comparing an input's dimension with the value bound in `slot`."""
    return -1 - MAX_SLOTS - slot


@dataclass(frozen=True)
class DimPlan:
    """The dim words of each input array and output, and the program (see the module docstring).

    inputs: per input array, its dim words; outputs: per output, its dims: constants, and ``-(1 + j)`` for a
    dimension the program stores into ``odims[j]`` (every dimension of a symbolic signature's outputs is stored
    there, constants too, so the entry reads output j's dims from ``odims`` at its running offset).
    """

    inputs: list[list[int]]
    outputs: list[list[int]]
    program: list[int]
    n_slots: int


def plan_dims(symbols: Sequence[str], inputs: Sequence[Sequence[Dim]], outputs: Sequence[Sequence[Dim]],
              guards: Sequence[str] = (), sized: Sequence[tuple[int, Sequence[Dim]]] = (),
              const_bytes: int = 0, held: Sequence[str] = ()) -> DimPlan:
    """Slots and program for a signature whose kernel has `symbols` (slots 0..k-1, in order).

    inputs / outputs: each array's dims (ints, or printed expressions over the symbols); guards: conditions
    on the symbols (``"n >= 2"``, ``"n != m"``, ``and`` and chained comparisons); sized: (itemsize, dims) of
    every array the call touches and const_bytes the rest, whose sum decides the GIL. Each symbol must be an
    input's dimension on its own or `held` (the entry binds those from int arguments: their values), ValueError
    otherwise, or when slots, stack or output dims run out.
    """
    b = _Builder(list(symbols), held)
    words = [[b.input_word(d) for d in dims] for dims in inputs]
    missing = [s for s in symbols if s not in b.bound]
    if missing:
        raise ValueError(f"symbol(s) {', '.join(missing)} must be a dimension of an input on its own")
    for text, slot in b.checks:
        b.expr(_parse(text), text)
        b.emit(Op.PUSH_SLOT, slot)
        b.emit(Op.ASSERT_EQ)
    for g in guards:
        b.guard(g)
    out_words = [[b.output_dim(d) for d in dims] for dims in outputs]
    b.bytes_expr(sized, const_bytes)
    b.emit(Op.SET_GIL)
    b.emit(Op.END)
    return DimPlan(words, out_words, b.program, b.n_slots)


class _Builder:
    def __init__(self, symbols: list[str], held: Sequence[str] = ()):
        if len(set(symbols)) != len(symbols) or len(symbols) > MAX_SLOTS:
            raise ValueError(f"symbols {symbols} must be distinct and at most {MAX_SLOTS}")
        self.slots = {s: k for k, s in enumerate(symbols)}
        # symbols the entry binds from int arguments, in whatever order they come: a dim equal to one is checked
        # by the program (after every input matched), never tied to a slot that may not hold it yet
        self.held = set(held) & set(symbols)
        self.bound: set[str] = set(self.held)
        self.checks: list[tuple[str, int]] = []   # (an input dim's expression, the slot holding the dim)
        self.n_slots, self.n_odims = len(symbols), 0
        self.program: list[int] = []
        self.depth = 0

    def input_word(self, d: Dim) -> int:
        if not isinstance(d, str):
            return _constant(d)
        text = _checked(d)
        if text in self.slots and text not in self.held:
            slot = self.slots[text]
            if text in self.bound:
                return tie_word(slot)
            self.bound.add(text)
            return bind_word(slot)
        slot = self._new_slot()
        self.checks.append((text, slot))
        return bind_word(slot)

    def output_dim(self, d: Dim) -> int:
        if not isinstance(d, str):
            self.emit(Op.PUSH_CONST, _constant(d))
        else:
            text = _checked(d)
            self.expr(_parse(text), text)
        if self.n_odims >= MAX_ODIMS:
            raise ValueError(f"a signature's outputs have at most {MAX_ODIMS} dimensions in all")
        self.emit(Op.STORE_OUT, self.n_odims)
        self.n_odims += 1
        return -self.n_odims if isinstance(d, str) else _constant(d)

    def guard(self, text: str) -> None:
        if not isinstance(text, str) or len(text) > 4096:
            raise ValueError("a guard must be a comparison of at most 4096 characters")
        try:
            node = ast.parse(text, mode="eval").body
        except SyntaxError:
            raise ValueError(f"guard {text!r} is not an expression") from None
        self._condition(node, text)

    def _condition(self, node: ast.AST, text: str) -> None:
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            for v in node.values:
                self._condition(v, text)
            return
        if not (isinstance(node, ast.Compare) and all(type(o) in _ASSERTS for o in node.ops)):
            raise ValueError(f"guard {text!r}: only comparisons (== != < <= > >=) joined by 'and' are allowed")
        left = node.left
        for op, right in zip(node.ops, node.comparators):
            code, swap = _ASSERTS[type(op)]
            a, b = (right, left) if swap else (left, right)
            self.expr(a, text)
            self.expr(b, text)
            self.emit(code)
            left = right

    def bytes_expr(self, sized: Sequence[tuple[int, Sequence[Dim]]], const_bytes: int) -> None:
        """Push the bytes the call touches: const_bytes + sum(itemsize * prod(dims)), the terms with the same
        symbolic dims summed first (a + b over (n,): 12 * n)."""
        terms: dict[tuple[str, ...], int] = {}
        for itemsize, dims in sized:
            symbolic = tuple(_checked(d) for d in dims if isinstance(d, str))
            scale = itemsize * _prod([_constant(d) for d in dims if not isinstance(d, str)])
            if symbolic:
                terms[symbolic] = terms.get(symbolic, 0) + scale
            else:
                const_bytes += scale
        self.emit(Op.PUSH_CONST, const_bytes)
        for symbolic, scale in terms.items():
            self.emit(Op.PUSH_CONST, scale)
            for d in symbolic:
                self.expr(_parse(d), d)
                self.emit(Op.MUL)
            self.emit(Op.ADD)

    def expr(self, node: ast.AST, text: str) -> None:
        """Emit `node` (already admitted by args.compile_dim's whitelist, or a guard's operand)."""
        if isinstance(node, ast.Constant) and type(node.value) is int:
            self.emit(Op.PUSH_CONST, node.value)
        elif isinstance(node, ast.Name):
            if node.id not in self.slots:
                raise ValueError(f"{text!r} uses {node.id!r}, which is not a symbol of the kernel")
            self.emit(Op.PUSH_SLOT, self.slots[node.id])
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            self.expr(node.left, text)
            self.expr(node.right, text)
            self.emit(_BINOPS[type(node.op)])
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            self.emit(Op.PUSH_CONST, 0)
            self.expr(node.operand, text)
            self.emit(Op.SUB)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max")
              and not node.keywords and len(node.args) >= 2):
            self.expr(node.args[0], text)
            for a in node.args[1:]:
                self.expr(a, text)
                self.emit(Op.MIN if node.func.id == "min" else Op.MAX)
        else:
            raise ValueError(f"{text!r}: {ast.unparse(node)!r} is not allowed (only ints, symbol names, "
                             "+ - * // %, unary minus, min and max)")

    def emit(self, op: Op, arg: int | None = None) -> None:
        self.depth -= _POPS.get(op, 1)
        if self.depth > MAX_STACK:
            raise ValueError(f"a dimension expression needs more than {MAX_STACK} stack cells")
        if arg is not None and not I64_MIN <= arg <= I64_MAX:
            raise ValueError(f"constant {arg} does not fit in int64")
        self.program += [int(op)] if arg is None else [int(op), arg]

    def _new_slot(self) -> int:
        if self.n_slots >= MAX_SLOTS:
            raise ValueError(f"a signature binds at most {MAX_SLOTS} symbols and symbolic input dims")
        self.n_slots += 1
        return self.n_slots - 1


def _constant(d: object) -> int:
    """A constant dimension: a non-negative int (numpy's integers too)."""
    try:
        v = operator.index(d)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"dimension {d!r} is neither an int nor an expression") from None
    if v < 0:
        raise ValueError(f"dimension {v} is negative")
    return int(v)


def _checked(text: str) -> str:
    compile_dim(text)  # the same whitelist and length limit as the slow path's
    return text


def _parse(text: str) -> ast.AST:
    return ast.parse(text, mode="eval").body


def _prod(values: Sequence[int]) -> int:
    n = 1
    for v in values:
        n *= v
    return n


# ** a reference interpreter: what the native entry computes, in Python (tests and documentation) **
def run(program: Sequence[int], slots: Sequence[int]) -> tuple[bool, list[int], int]:
    """(ok, odims, bytes) as the native entry computes them for `slots` (ok False: the signature is missed)."""
    stack: list[int] = []
    odims: dict[int, int] = {}
    nbytes, pc = 0, 0
    while True:
        op = Op(program[pc])
        if op == Op.END:
            return True, [odims[j] for j in range(len(odims))], nbytes
        if op in _ARG_OPS:
            arg, pc = program[pc + 1], pc + 2
            if op == Op.PUSH_SLOT:
                stack.append(slots[arg])
            elif op == Op.PUSH_CONST:
                stack.append(arg)
            else:
                v = stack.pop()
                if v < 0:
                    return False, [], 0
                odims[arg] = v
            continue
        pc += 1
        if op == Op.SET_GIL:
            nbytes = stack.pop()
            continue
        b, a = stack.pop(), stack.pop()
        v = _apply(op, a, b)
        if v is None:
            return False, [], 0
        if op < Op.ASSERT_EQ:
            stack.append(v)


def _apply(op: Op, a: int, b: int) -> int | None:
    """a op b, or None where the program fails (overflow, a zero divisor, a failed assertion)."""
    if op in (Op.FLOORDIV, Op.FLOORMOD) and b == 0:
        return None
    v = {Op.ADD: lambda: a + b, Op.SUB: lambda: a - b, Op.MUL: lambda: a * b, Op.FLOORDIV: lambda: a // b,
         Op.FLOORMOD: lambda: a % b, Op.MIN: lambda: min(a, b), Op.MAX: lambda: max(a, b),
         Op.ASSERT_EQ: lambda: int(a == b), Op.ASSERT_NE: lambda: int(a != b), Op.ASSERT_GE: lambda: int(a >= b),
         Op.ASSERT_GT: lambda: int(a > b)}[op]()
    if op >= Op.ASSERT_EQ:
        return v or None
    return v if I64_MIN <= v <= I64_MAX else None
