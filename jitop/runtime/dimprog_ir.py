"""The native entry's symbolic parts, built with llvmlite.ir (jitop.runtime.entry_ir adds them to its module):
@dims_bind, which binds and ties an input's dims to the call's slots, and @dimprog, the interpreter of a symbolic
signature's check-and-shape program (jitop.runtime.dimprog: its words, its Python twin `dimprog.run`).

>>> mod = ir.Module()
>>> add_dims_bind(mod).name, add_dimprog(mod).name
('dims_bind', 'dimprog')
"""
from __future__ import annotations

from llvmlite import ir

from jitop.runtime import dimprog
from jitop.runtime.dimprog import MAX_SLOTS, MAX_STACK, Op
from jitop.runtime.ir_words import I1, I64, PTR, answer, function, index_loop, stack_array, word

__all__ = ["add_dims_bind", "add_dimprog"]


def add_dims_bind(mod: ir.Module) -> ir.Function:
    """@dims_bind(have, want, n, slots): an input's dims against a symbolic record's dim words (dimprog):
    constants compared, binds stored into their slot, ties compared with their slot's value."""
    fn, bb = function(mod, "dims_bind", I1, [("have", PTR), ("want", PTR), ("n", I64), ("slots", PTR)],
                      ["entry", "loop", "cmp", "fixed", "symbolic", "bind", "tie", "next", "yes", "no"])
    have, want, n, slots = fn.args
    b = ir.IRBuilder(bb["entry"])
    d = index_loop(b, bb, n)
    x, y = word(b, have, d, "x"), word(b, want, d, "y")
    d.add_incoming(b.add(d, I64(1), "d1"), bb["next"])
    b.cbranch(b.icmp_signed(">=", y, I64(0)), bb["fixed"], bb["symbolic"])
    b.position_at_end(bb["fixed"])
    b.cbranch(b.icmp_signed("==", x, y), bb["next"], bb["no"])
    b.position_at_end(bb["symbolic"])
    slot = b.sub(I64(-1), y, "slot")
    b.cbranch(b.icmp_signed("<", slot, I64(MAX_SLOTS)), bb["bind"], bb["tie"])
    b.position_at_end(bb["bind"])
    b.store(x, b.gep(slots, [slot], source_etype=I64))
    b.branch(bb["next"])
    b.position_at_end(bb["tie"])
    bound = word(b, slots, b.sub(slot, I64(MAX_SLOTS)), "bound")
    b.cbranch(b.icmp_signed("==", bound, x), bb["next"], bb["no"])
    b.position_at_end(bb["next"])
    b.branch(bb["loop"])
    answer(b, bb)
    return fn


_ARITH = {Op.ADD: "sadd", Op.SUB: "ssub", Op.MUL: "smul"}
_COMPARE = {Op.ASSERT_EQ: "==", Op.ASSERT_NE: "!=", Op.ASSERT_GE: ">=", Op.ASSERT_GT: ">"}


def add_dimprog(mod: ir.Module) -> ir.Function:
    """@dimprog(prog, slots, odims, nbytes): runs a symbolic signature's check-and-shape program
    (jitop.runtime.dimprog.Op): 1 if every check holds, with the output dims in odims and the bytes the call
    touches in nbytes; 0 on a failed assertion, a zero divisor, an int64 overflow or a negative output dim."""
    names = ["entry", "loop", "push.slot", "push.const", "push", "store", "store.ok", "gil", "operands",
             *(op.name.lower() for op in _ARITH), "divisor", "divide", "min", "max", "value",
             *(op.name.lower() for op in _COMPARE), "pop2", "done", "fail"]
    fn, bb = function(mod, "dimprog", I1, [(name, PTR) for name in ("prog", "slots", "odims", "nbytes")], names)
    prog, slots, odims, nbytes = fn.args
    b = ir.IRBuilder(bb["entry"])
    stack = stack_array(b, I64, MAX_STACK, "stack")
    b.branch(bb["loop"])
    b.position_at_end(bb["loop"])
    pc, sp = b.phi(I64, "pc"), b.phi(I64, "sp")
    for v in (pc, sp):
        v.add_incoming(I64(0), bb["entry"])
    r = _Regs(op=word(b, prog, pc, "op"), pc1=b.add(pc, I64(1), "pc1"), pc2=b.add(pc, I64(2), "pc2"),
              sp=sp, up=b.add(sp, I64(1), "up"), down=b.sub(sp, I64(1), "down"), down2=b.sub(sp, I64(2), "down2"))
    r.top = b.gep(stack, [r.down], source_etype=I64, name="top")
    r.below = b.gep(stack, [r.down2], source_etype=I64, name="below")
    sw = b.switch(r.op, bb["fail"])
    for op, label in ((Op.END, "done"), (Op.PUSH_SLOT, "push.slot"), (Op.PUSH_CONST, "push.const"),
                      (Op.STORE_OUT, "store"), (Op.SET_GIL, "gil")):
        sw.add_case(I64(int(op)), bb[label])
    for op in Op:
        if Op.ADD <= op <= Op.ASSERT_GT:
            sw.add_case(I64(int(op)), bb["operands"])
    _dimprog_push(b, bb, r, prog, slots, stack)
    _dimprog_store(b, bb, r, prog, odims, nbytes)
    _dimprog_operands(b, mod, bb, r)
    answer(b, bb, "done", "fail")
    return fn


class _Regs:
    """The interpreter loop's values: op, pc + 1, pc + 2, sp and its neighbours, the top two cells."""

    def __init__(self, **values: ir.Value):
        self.__dict__.update(values)


def _back(b: ir.IRBuilder, bb: dict, pc: ir.Value, sp: ir.Value) -> None:
    """Branch back to the loop with the next pc and sp."""
    pc_phi, sp_phi = bb["loop"].instructions[0], bb["loop"].instructions[1]
    pc_phi.add_incoming(pc, b.block)
    sp_phi.add_incoming(sp, b.block)
    b.branch(bb["loop"])


def _dimprog_push(b: ir.IRBuilder, bb: dict, r: _Regs, prog: ir.Value, slots: ir.Value, stack: ir.Value) -> None:
    b.position_at_end(bb["push.slot"])
    sv = word(b, slots, word(b, prog, r.pc1, "slot"), "sv")
    b.branch(bb["push"])
    b.position_at_end(bb["push.const"])
    cv = word(b, prog, r.pc1, "cv")
    b.branch(bb["push"])
    b.position_at_end(bb["push"])
    pv = b.phi(I64, "pv")
    pv.add_incoming(sv, bb["push.slot"])
    pv.add_incoming(cv, bb["push.const"])
    b.store(pv, b.gep(stack, [r.sp], source_etype=I64))
    _back(b, bb, r.pc2, r.up)


def _dimprog_store(b: ir.IRBuilder, bb: dict, r: _Regs, prog: ir.Value, odims: ir.Value,
                   nbytes: ir.Value) -> None:
    b.position_at_end(bb["store"])
    out = b.load(r.top, typ=I64, name="out")
    b.cbranch(b.icmp_signed("<", out, I64(0)), bb["fail"], bb["store.ok"])
    b.position_at_end(bb["store.ok"])
    b.store(out, b.gep(odims, [word(b, prog, r.pc1, "j")], source_etype=I64))
    _back(b, bb, r.pc2, r.down)
    b.position_at_end(bb["gil"])
    b.store(b.load(r.top, typ=I64), nbytes)
    _back(b, bb, r.pc1, r.down)


def _dimprog_operands(b: ir.IRBuilder, mod: ir.Module, bb: dict, r: _Regs) -> None:
    """The two-operand ops: arithmetic (checked), floor division and modulo, min, max and the assertions."""
    b.position_at_end(bb["operands"])
    rhs, lhs = b.load(r.top, typ=I64, name="b"), b.load(r.below, typ=I64, name="a")
    sw = b.switch(r.op, bb["fail"])
    for op in [*_ARITH, Op.MIN, Op.MAX, *_COMPARE]:
        sw.add_case(I64(int(op)), bb[op.name.lower()])
    for op in (Op.FLOORDIV, Op.FLOORMOD):
        sw.add_case(I64(int(op)), bb["divisor"])
    results = []
    for op, fn in _ARITH.items():
        b.position_at_end(bb[op.name.lower()])
        pair = b.call(_overflow_intrinsic(mod, fn), [lhs, rhs])
        results.append((b.extract_value(pair, 0), b.block))
        b.cbranch(b.extract_value(pair, 1), bb["fail"], bb["value"])
    results.append(_floor_divide(b, bb, r.op, lhs, rhs))
    for op, pred in ((Op.MIN, "<"), (Op.MAX, ">")):
        b.position_at_end(bb[op.name.lower()])
        results.append((b.select(b.icmp_signed(pred, lhs, rhs), lhs, rhs), b.block))
        b.branch(bb["value"])
    b.position_at_end(bb["value"])
    v = b.phi(I64, "v")
    for value, block in results:
        v.add_incoming(value, block)
    b.store(v, r.below)
    _back(b, bb, r.pc1, r.down)
    for op, pred in _COMPARE.items():
        b.position_at_end(bb[op.name.lower()])
        b.cbranch(b.icmp_signed(pred, lhs, rhs), bb["pop2"], bb["fail"])
    b.position_at_end(bb["pop2"])
    _back(b, bb, r.pc1, r.down2)


def _overflow_intrinsic(mod: ir.Module, fn: str) -> ir.Function:
    """llvm.<fn>.with.overflow.i64: {result, overflowed}."""
    name = f"llvm.{fn}.with.overflow.i64"
    return mod.globals.get(name) or ir.Function(mod, ir.FunctionType(ir.LiteralStructType([I64, I1]),
                                                                     [I64, I64]), name)


def _floor_divide(b: ir.IRBuilder, bb: dict, op: ir.Value, a: ir.Value, d: ir.Value) -> tuple[ir.Value, ir.Block]:
    """a // d or a % d (op) with Python's floor semantics; a zero divisor or INT64_MIN // -1 fails."""
    b.position_at_end(bb["divisor"])
    zero = b.icmp_signed("==", d, I64(0))
    overflow = b.and_(b.icmp_signed("==", d, I64(-1)), b.icmp_signed("==", a, I64(dimprog.I64_MIN)))
    b.cbranch(b.or_(zero, overflow), bb["fail"], bb["divide"])
    b.position_at_end(bb["divide"])
    q, rem = b.sdiv(a, d, "q"), b.srem(a, d, "rem")
    # the remainder's sign differs from the divisor's: floor, not truncation
    adjust = b.and_(b.icmp_signed("!=", rem, I64(0)), b.icmp_signed("<", b.xor(rem, d), I64(0)), "adjust")
    fq = b.sub(q, b.zext(adjust, I64))
    fr = b.select(adjust, b.add(rem, d), rem)
    result = b.select(b.icmp_signed("==", op, I64(int(Op.FLOORMOD))), fr, fq, "dv")
    b.branch(bb["value"])
    return result, b.block
