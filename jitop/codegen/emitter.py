"""What the CPU (jitop.codegen.kernel) and GPU (jitop.codegen.nvptx) code generators share: walking loop IR
statements, the bounds facts known under a condition, serial loops, scalar expressions and the loads that may
only run where a check holds.

Each back end adds its own on top: SIMD lanes, parallel outlining and heap buffers on the CPU; bound loops,
shared memory, barriers and shuffles on the GPU. Where the two differ, a back end overrides a small hook.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, TypeVar

from llvmlite import ir

from jitop.codegen import ops
from jitop.te.expr import Expr, Op, const, walk
from jitop.te.printer import expr_str
from jitop.tir.bounds import BoundsCheck
from jitop.tir.nodes import Allocate, Buffer, For, IfThenElse, Seq, Stmt, Store
from jitop.tir.passes import substitute_stmt
from jitop.tir.simplify import Ranges, simplify

I64 = ir.IntType(64)
T = TypeVar("T")


class LoopEmitter(ABC):
    """Emits loop IR into the LLVM module `module`. A subclass says where the function being built keeps its
    builder and variables (`b`, `env`) and emits loops, allocations, loads, stores and calls its own way."""

    def __init__(self, module: ir.Module, symbol: str, ranges: Ranges):
        """`ranges`: each loop variable's and symbol's range, for proving accesses in bounds."""
        self.module, self.symbol = module, symbol
        self.bounds = BoundsCheck(ranges)
        self.checked: list[str] = []  # accesses checked at run time; the error flag holds 1 + their index
        self.contract = False  # FMA fusion allowed (reduction updates only)
        self._memo: dict = {}  # this statement's values by expression (see `stmt`)
        # (buffer, indices) -> its simplified flat offset: an unrolled register tile asks for the same few
        # accesses in every copy of its body (expressions are interned: equal ones are one key)
        self._flat: dict[tuple[Buffer, tuple[Expr, ...]], Expr] = {}

    @property
    @abstractmethod
    def b(self) -> ir.IRBuilder:
        """The builder of the function being emitted."""

    @property
    @abstractmethod
    def env(self) -> dict[Expr, ir.Value]:
        """Variable -> its i64 (or symbol) value in the function being emitted."""

    # ** statements **
    def stmt(self, s: Stmt) -> None:
        self._memo = {}  # values are reused only within one statement: they must dominate their uses
        if isinstance(s, Seq):
            for x in s.stmts:
                self.stmt(x)
        elif isinstance(s, Store):
            self.store(s)
        elif isinstance(s, For):
            self.loop(s)
        elif isinstance(s, IfThenElse):
            self.if_then_else(s)
        elif isinstance(s, Allocate):
            self.allocate(s)
        else:
            self.backend_stmt(s)

    def backend_stmt(self, s: Stmt) -> None:
        """A statement only some back ends have (the GPU's barriers and cross-thread reductions)."""
        raise TypeError(f"cannot generate code for {type(s).__name__}")

    @abstractmethod
    def store(self, s: Store) -> None: ...

    @abstractmethod
    def loop(self, s: For) -> None: ...

    @abstractmethod
    def allocate(self, s: Allocate) -> None: ...

    def if_then_else(self, s: IfThenElse) -> None:
        self._conditional(s, self.expr(s.cond))

    def _conditional(self, s: IfThenElse, cond: ir.Value) -> None:
        """`s` as two blocks, one taken (the CPU's vector code masks lanes instead: it overrides this)."""
        with self.b.if_else(cond) as (then, other):
            with then:
                self._under(s.cond, True, lambda: self.stmt(s.then))
            with other:
                if s.else_ is not None:
                    self._under(s.cond, False, lambda: self.stmt(s.else_))

    def _under(self, cond: Expr, holds: bool, emit: Callable[[], T]) -> T:
        """Emit with `cond` (or its negation) known to hold: the bounds prover may use it."""
        n = self.bounds.push(cond, holds)
        try:
            return emit()
        finally:
            self.bounds.pop(n)

    def _serial(self, var: Expr, begin: ir.Value, end: ir.Value, emit_body: Callable[[], None]) -> None:
        """for var in [begin, end): a loop whose counter is a phi, entered only when it runs at least once."""
        b = self.b
        pre = b.block
        head = b.append_basic_block("loop")
        done = b.append_basic_block("loop.end")
        b.cbranch(b.icmp_signed("<", begin, end), head, done)
        b.position_at_end(head)
        i = b.phi(I64, name=ident(var.name))
        i.add_incoming(begin, pre)
        self.env[var] = i
        emit_body()
        nxt = b.add(i, ir.Constant(I64, 1), flags=("nsw", "nuw"))
        i.add_incoming(nxt, b.block)
        b.cbranch(b.icmp_signed("<", nxt, end), head, done)
        b.position_at_end(done)
        del self.env[var]

    def _unrolled(self, s: For, extent: int) -> None:
        """One copy of the body per iteration, the variable a constant in each (so local tiles stay registers)."""
        for k in range(extent):
            self.stmt(substitute_stmt(s.body, {s.var: const(k)}))

    # ** memory **
    @abstractmethod
    def load(self, e: Expr) -> ir.Value: ...

    def flat_index(self, buf: Buffer, indices: tuple[Expr, ...]) -> Expr:
        """The simplified row-major element offset of `indices` in `buf` (memoized)."""
        key = (buf, tuple(indices))
        flat = self._flat.get(key)
        if flat is None:
            flat = self._flat[key] = simplify(flatten(buf, indices))
        return flat

    def _stored_value(self, s: Store) -> ir.Value:
        if s.value.dtype != s.buffer.dtype:  # a pass that changed a value's type: never write the wrong width
            raise TypeError(f"store of a {s.value.dtype} value into {s.buffer.dtype} buffer {s.buffer.name}")
        self.contract = is_accumulation(s)  # FMA only in a reduction's update
        value = self.expr(s.value)
        self.contract = False
        return value

    def _check_entry(self, what: str, buf: Buffer, indices: tuple[Expr, ...]) -> int:
        """Record an access checked at run time; the error code (1-based entry of `checked`) it sets."""
        self.checked.append(f"{what} {buf.name}[{', '.join(expr_str(i) for i in indices)}] with shape {buf.shape}")
        return len(self.checked)

    def _value_error_code(self, message: str) -> int:
        """The error code (1-based entry of `checked`) of a value numpy/Python refuses, "<Type>: <message>"
        (codegen.kernel.RAISE_IF): one entry per message, however many places raise it."""
        if message not in self.checked:
            self.checked.append(message)
        return self.checked.index(message) + 1

    def _load_or_zero(self, ok: ir.Value, address: Callable[[], ir.Value], elem: ir.Type) -> ir.Value:
        """The `elem` at `address()` where `ok` holds, else 0: the address is made and read only when it does."""
        b = self.b
        with b.if_else(ok) as (then, other):
            with then:
                val, then_block = b.load(address(), typ=elem), b.block
            with other:
                other_block = b.block
        phi = b.phi(elem)
        phi.add_incoming(val, then_block)
        phi.add_incoming(ir.Constant(elem, 0), other_block)
        return phi

    # ** expressions **
    def expr(self, e: Expr) -> ir.Value:
        if e not in self._memo:
            self._memo[e] = self._expr(e)  # the memo as it is after `e`: a branch inside may have replaced it
        return self._memo[e]

    def _expr(self, e: Expr) -> ir.Value:
        op, b = e.op, self.b
        if op is Op.CONST:
            return ops.constant(e.dtype, e.value)
        if op is Op.VAR:
            return self._var(e)
        if op is Op.LOAD:
            return self.load(e)
        if op is Op.SELECT:
            return self._select(e)
        if op is Op.CALL:
            return self._call(e)
        args = self._operands(e.src)
        if op is Op.CAST:
            return ops.cast(b, e.src[0].dtype, e.dtype, args[0])
        if len(args) == 1:
            return ops.unary(b, op, e.dtype, args[0])
        return ops.binary(b, op, e.src[0].dtype, args[0], args[1], self.contract)

    def _var(self, e: Expr) -> ir.Value:
        return self.env[e]

    def _operands(self, src: tuple[Expr, ...]) -> list[ir.Value]:
        """The values of an operation's operands (the CPU's vector code widens them to one lane count)."""
        return [self.expr(x) for x in src]

    @abstractmethod
    def _call(self, e: Expr) -> ir.Value: ...

    def _select(self, e: Expr) -> ir.Value:
        cond = self.expr(e.src[0])
        if not any(n.op is Op.LOAD for x in e.src[1:] for n in walk(x)):
            return ops.select(self.b, cond, self.expr(e.src[1]), self.expr(e.src[2]))
        return self._guarded_select(e, cond)

    def _guarded_select(self, e: Expr, cond: ir.Value) -> ir.Value:
        """if_then_else whose branches read memory: only the taken side's loads may happen (the other may be
        out of bounds), so each side is a block, joined by a phi."""
        before = dict(self._memo)
        with self.b.if_else(cond) as (then, other):
            with then:
                yes, yes_block = self._under(e.src[0], True, lambda: self.expr(e.src[1])), self.b.block
            self._memo = dict(before)
            with other:
                no, no_block = self._under(e.src[0], False, lambda: self.expr(e.src[2])), self.b.block
            self._memo = before
        lanes = ops.lanes_of(yes) or ops.lanes_of(no)  # one side may be a CPU vector loop's lanes
        if lanes:  # a scalar side is widened in its own block: the value must dominate the phi's edge
            with self.b.goto_block(yes_block):
                yes = ops.splat(self.b, yes, lanes)
            with self.b.goto_block(no_block):
                no = ops.splat(self.b, no, lanes)
        phi = self.b.phi(ops.llvm_type(e.dtype) if not lanes else ir.VectorType(ops.llvm_type(e.dtype), lanes))
        phi.add_incoming(yes, yes_block)
        phi.add_incoming(no, no_block)
        return phi


def is_accumulation(s: Store) -> bool:
    """buf[idx] = buf[idx] + ...: the update of a sum reduction."""
    v = s.value
    return (v.op is Op.ADD and v.dtype.is_float and v.src[0].op is Op.LOAD and v.src[0].arg is s.buffer
            and all(a is b for a, b in zip(v.src[0].src, s.indices)))


def ident(name: str) -> str:
    """`name` as an LLVM identifier."""
    return "".join(c if c.isalnum() or c in "._" else "_" for c in name)


def flatten(buf: Buffer, indices: tuple[Expr, ...]) -> Expr:
    """The row-major element offset of `indices` in `buf`."""
    flat: Expr = const(0)
    for dim, idx in zip(buf.shape, indices):
        flat = flat * dim + idx
    return flat
