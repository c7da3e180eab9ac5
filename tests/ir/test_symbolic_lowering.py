"""Lowering of random schedules on symbolic extents, run by a small loop-IR interpreter (no LLVM) at many
sizes: every access must be inside its buffer and every output element right. This checks bound inference,
the symbolic simplifier and loop partitioning together (a wrong proof shows up as an access outside, or
as an element written twice or never)."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jitop
from jitop import te
from jitop.te.expr import Op
from jitop.tir.nodes import Allocate, For, IfThenElse, Seq, Store

SIZES = [0, 1, 2, 3, 5, 8, 9, 13, 17]
_BIN = {Op.ADD: lambda a, b: a + b, Op.SUB: lambda a, b: a - b, Op.MUL: lambda a, b: a * b,
        Op.FLOORDIV: lambda a, b: a // b if b else 0, Op.FLOORMOD: lambda a, b: a % b if b else 0,
        Op.MIN: min, Op.MAX: max, Op.LT: lambda a, b: a < b, Op.LE: lambda a, b: a <= b,
        Op.GT: lambda a, b: a > b, Op.GE: lambda a, b: a >= b, Op.EQ: lambda a, b: a == b,
        Op.NE: lambda a, b: a != b, Op.AND: lambda a, b: a and b, Op.OR: lambda a, b: a or b}


class Interpreter:
    def __init__(self, func, arrays: dict, symbols: dict):
        self.arrays = {b: arrays[b.name] for b in func.params}
        self.env = dict(symbols)

    def value(self, e):
        if e.op is Op.CONST:
            return e.value
        if e.op is Op.VAR:
            return self.env[e]
        if e.op is Op.LOAD:
            return self.arrays[e.arg][self.index(e.arg, e.src)]
        if e.op is Op.CAST:
            return self.value(e.src[0])
        if e.op is Op.NEG:
            return -self.value(e.src[0])
        if e.op is Op.SELECT:
            return self.value(e.src[1]) if self.value(e.src[0]) else self.value(e.src[2])
        return _BIN[e.op](*(self.value(s) for s in e.src))

    def index(self, buf, idx):
        at = tuple(int(self.value(i)) for i in idx)
        shape = self.arrays[buf].shape
        assert all(0 <= a < d for a, d in zip(at, shape)), f"{buf.name}{list(at)} outside shape {shape}"
        return at

    def run(self, s):
        if isinstance(s, Seq):
            for x in s.stmts:
                self.run(x)
        elif isinstance(s, For):
            for k in range(self.value(s.extent)):
                self.env[s.var] = k
                self.run(s.body)
        elif isinstance(s, IfThenElse):
            branch = s.then if self.value(s.cond) else s.else_
            if branch is not None:
                self.run(branch)
        elif isinstance(s, Allocate):
            shape = tuple(int(self.value(te.const(d) if isinstance(d, int) else d)) for d in s.buffer.shape)
            self.arrays[s.buffer] = np.full(shape, np.nan)
            self.run(s.body)
        elif isinstance(s, Store):
            self.arrays[s.buffer][self.index(s.buffer, s.indices)] = self.value(s.value)
        else:
            raise TypeError(type(s))


KINDS = ["serial", "parallel", "vectorize", "unroll"]


def _annotate(s, stage, iv, kind):
    if kind != "serial":
        getattr(s[stage], kind)(iv)


@st.composite
def one_d(draw):
    """(schedule function, description) over C = A + B on a symbolic n."""
    f1, f2 = draw(st.integers(1, 9)), draw(st.integers(0, 4))
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=3, max_size=3))
    nparts = draw(st.booleans())

    def schedule(s, C):
        if nparts:
            xo, xi = s[C].split(C.op.axis[0], nparts=f1)
        else:
            xo, xi = s[C].split(C.op.axis[0], f1)
        loops = [xo, xi]
        if f2:
            xio, xii = s[C].split(xi, f2)
            loops = [xo, xio, xii]
        for iv, kind in zip(loops, kinds):
            if not (kind == "parallel" and iv is not loops[0]):
                _annotate(s, C, iv, kind)
    return schedule, (f1, f2, kinds, nparts)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(one_d())
def test_random_one_dimensional_schedules(case):
    schedule, _ = case
    n = te.var("n")
    A, B = te.placeholder((n,), "float64", "A"), te.placeholder((n,), "float64", "B")
    C = te.compute(A.shape, lambda i: A[i] * 2.0 + B[i], name="C")
    s = jitop.create_schedule(C.op)
    schedule(s, C)
    func = jitop.lower(s, [A, B, C])
    for size in SIZES:
        a, b = np.arange(size) + 1.0, np.arange(size) * 3.0
        c = np.full(size, np.nan)
        Interpreter(func, {"A": a, "B": b, "C": c}, {n: size}).run(func.body)
        np.testing.assert_array_equal(c, a * 2.0 + b, err_msg=f"n={size}\n{func}")


@st.composite
def two_d(draw):
    fx, fy = draw(st.integers(1, 6)), draw(st.integers(1, 9))
    fuse, vec, par = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    at = draw(st.sampled_from(["none", "outer", "inner"]))

    def schedule(s, Y, E):
        xo, yo, xi, yi = s[Y].tile(Y.op.axis[0], Y.op.axis[1], fx, fy)
        outer = s[Y].fuse(xo, yo) if fuse else xo
        if vec:
            s[Y].vectorize(yi)
        if par:
            s[Y].parallel(outer)
        if at != "none":
            s[E].compute_at(s[Y], outer if at == "outer" else xi)
    return schedule, (fx, fy, fuse, vec, par, at)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(two_d())
def test_random_tiled_schedules_with_compute_at(case):
    schedule, _ = case
    n, m = te.var("n"), te.var("m")
    X = te.placeholder((n, m), "float64", "X")
    E = te.compute((n, m), lambda i, j: X[i, j] + 1.0, name="E")
    Y = te.compute((n, m), lambda i, j: E[i, j] * 2.0, name="Y")
    s = jitop.create_schedule(Y.op)
    schedule(s, Y, E)
    func = jitop.lower(s, [X, Y])
    for shape in [(0, 3), (1, 1), (2, 7), (5, 4), (7, 9), (4, 16)]:
        x = np.arange(shape[0] * shape[1], dtype=float).reshape(shape)
        y = np.full(shape, np.nan)
        Interpreter(func, {"X": x, "Y": y}, {n: shape[0], m: shape[1]}).run(func.body)
        np.testing.assert_array_equal(y, (x + 1.0) * 2.0, err_msg=f"shape={shape}\n{func}")
