"""Padded copies written by their producers: a convolution's zero-bordered copy of its input, made by a loop nest of
its own, becomes the memory its input is written to in the first place.

A direct convolution reads a copy of its input with a zero border (`topi.conv2d`'s `_padded` stage): a nest
`P[i] = select(i - off inside X, X[i - off], 0)`. When X is an intermediate that nothing writes after that copy,
X can live inside P instead: every access X[j] becomes P[j + off] (X's producer stores straight into P's
interior, its other readers read it there), and the copy shrinks to a nest that zeroes P's border. The copy's
pass over memory (a read and a write of the whole activation) is gone; onnxruntime pads inside its kernels to
the same end. Only constant-size intermediates of the function qualify, and only a copy whose condition is
exactly "inside X" (checked conjunct by conjunct), so the result is the same array P as before, bit for bit.

>>> from jitop.dtypes import as_dtype
>>> from jitop.te.expr import var
>>> f32, i, j, one = as_dtype("float32"), var("i"), var("j"), const(1.0, "float32")
>>> x, p = Buffer("x", f32, (4, 16), "param"), Buffer("p", f32, (6, 16), "param")
>>> fill = For(i, const(4), ForKind.SERIAL, For(j, const(16), ForKind.SERIAL, Store(x, (i, j), one)))
>>> inside = (i - 1 >= 0) & (i - 1 < 4)
>>> copy = For(i, const(6), ForKind.SERIAL, For(j, const(16), ForKind.SERIAL,
...            Store(p, (i, j), select(inside, x.load((i - 1, j)), const(0.0, "float32")))))
>>> func = PrimFunc("f", (x, p), Seq((fill, copy)))
>>> folded = fold_padding(func, scratch=2, lanes=16)
>>> [b.name for b in folded.params], folded.attrs["padding"]
(['p'], (('p', 'x'),))
"""
from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass, replace

from jitop.te.expr import Expr, Op, const, rewrite, select, var, walk
from jitop.tir.bounds import facts
from jitop.tir.nodes import Buffer, For, ForKind, IfThenElse, PrimFunc, Seq, Stmt, Store, seq, walk_stmts
from jitop.tir.passes import map_stmt
from jitop.tir.simplify import simplify
from jitop.tir.storage import touched

__all__ = ["PadCopy", "fold_padding", "pad_copy", "padding"]


@dataclass(frozen=True)
class PadCopy:
    """A nest writing `padded` as `source` shifted by `offset` with zeros around it."""

    padded: Buffer
    source: Buffer
    offset: tuple[int, ...]


def fold_padding(func: PrimFunc, scratch: int, lanes: int) -> PrimFunc:
    """`func` with each padded copy between two of its last `scratch` parameters (intermediates) folded into the
    copy's source's producers: the source's parameter is gone, its accesses moved into the padded buffer, the copy
    replaced by a nest zeroing the border (innermost loops vectorized in `lanes`). attrs["padding"] names the
    (padded, source) pairs."""
    if not isinstance(func.body, Seq):
        return func
    first = len(func.params) - scratch
    candidates = {b for b in func.params[first:] if not b.symbolic}
    nests = list(func.body.stmts)
    ranges = dict(func.attrs.get("ranges", {}))
    folded: list[PadCopy] = []
    for k in range(len(nests)):
        copy = pad_copy(nests[k], candidates)
        if copy is None or not _foldable(nests, k, copy):
            continue
        nests = [_moved(nest, copy) for nest in nests]
        nests[k] = border_zeros(copy.padded, copy.offset, copy.source.shape, lanes, ranges)
        candidates.discard(copy.source)
        folded.append(copy)
    if not folded:
        return func
    gone = {c.source for c in folded}
    pairs = tuple((c.padded.name, c.source.name) for c in folded)
    return replace(func, params=tuple(b for b in func.params if b not in gone), body=Seq(tuple(nests)),
                   attrs={**func.attrs, "ranges": ranges, "padding": pairs})


def padding(func: PrimFunc) -> str:
    """What `fold_padding` did, for explain."""
    pairs = func.attrs.get("padding", ())
    if not pairs:
        return "no padded copy folded into its producer"
    return f"{len(pairs)} padded copies written by their producers ({', '.join(p for p, _ in pairs)})"


def pad_copy(nest: Stmt, candidates: set[Buffer]) -> PadCopy | None:
    """The copy `nest` makes, if every store of it writes one candidate P as select(inside, X[i - off], 0) with X
    another candidate of P's dtype and rank and `inside` exactly "i - off is inside X" over P's extent."""
    stores = [s for s in walk_stmts(nest) if isinstance(s, Store)]
    if not stores or len({s.buffer for s in stores}) != 1 or stores[0].buffer not in candidates:
        return None
    found = {_store_copy(s, candidates) for s in stores}
    return found.pop() if len(found) == 1 and None not in found else None


def _store_copy(store: Store, candidates: set[Buffer]) -> PadCopy | None:
    conds, value = _peel_selects(store.value)
    if value.op is not Op.LOAD or value.arg not in candidates or value.arg is store.buffer:
        return None
    src, dst = value.arg, store.buffer
    if src.dtype != dst.dtype or len(src.shape) != len(dst.shape) or len(dst.shape) < 2 \
            or any(_loads(i) for i in (*store.indices, *value.src)):
        return None
    offset = tuple(_constant(simplify(s - x)) for s, x in zip(store.indices, value.src))
    if any(o is None or o < 0 or o + n > m for o, n, m in zip(offset, src.shape, dst.shape)):
        return None
    if not _exactly_inside(conds, value.src, offset, src.shape, dst.shape):
        return None
    return PadCopy(dst, src, offset)


def _peel_selects(e: Expr) -> tuple[list[Expr], Expr]:
    """(conditions, value) of select(c1, select(c2, value, 0), 0) (any depth, zero a +0 constant)."""
    conds = []
    while e.op is Op.SELECT and _positive_zero(e.src[2]):
        conds.append(e.src[0])
        e = e.src[1]
    return conds, e


def _positive_zero(e: Expr) -> bool:
    return e.op is Op.CONST and e.value == 0 and math.copysign(1.0, e.value) > 0


def _exactly_inside(conds: list[Expr], index: tuple[Expr, ...], offset: tuple[int, ...],
                    shape: tuple[int, ...], padded: tuple[int, ...]) -> bool:
    """Whether the conjunction of `conds` holds exactly where `index` (ranging over the padded extent less
    `offset`) is inside `shape`: every conjunct bounds one index, and together they cut each dim where the
    padded buffer reaches past the source."""
    low = [-o for o in offset]                      # what the padded extent itself allows
    high = [p - o for p, o in zip(padded, offset)]
    for c in (x for cond in conds for x in _conjuncts(cond)):
        bound = _index_bound(c, index)
        if bound is None:
            return False
        d, lower, upper = bound
        low[d], high[d] = max(low[d], lower), min(high[d], upper)
    return low == [0] * len(shape) and high == list(shape)


def _conjuncts(e: Expr) -> list[Expr]:
    """The parts of a conjunction, each checked on its own (a constant true part left out)."""
    if e.op is Op.AND and e.dtype.name == "bool":
        return _conjuncts(e.src[0]) + _conjuncts(e.src[1])
    return [] if e.op is Op.CONST and e.value else [e]


def _index_bound(c: Expr, index: tuple[Expr, ...]) -> tuple[int, float, float] | None:
    """(dim, lower, upper): the comparison `c` as lower <= index[dim] < upper (one side infinite), for exactly one
    dim; None for anything else."""
    found = facts(c)
    if len(found) != 1:
        return None
    (e, hi), = found  # e <= hi
    shifts = []
    for d, i in enumerate(index):
        if (k := _constant(simplify(e - i))) is not None:      # index[d] + k <= hi
            shifts.append((d, -math.inf, hi - k + 1))
        elif (k := _constant(simplify(e + i))) is not None:    # k - index[d] <= hi
            shifts.append((d, k - hi, math.inf))
    return shifts[0] if len(shifts) == 1 else None


def _constant(e: Expr) -> int | None:
    return e.value if e.op is Op.CONST and isinstance(e.value, int) else None


def _loads(e: Expr) -> bool:
    return any(n.op is Op.LOAD for n in walk(e))


def _foldable(nests: list[Stmt], k: int, copy: PadCopy) -> bool:
    """Whether moving the source into the padded buffer keeps every nest's meaning: the source is written only
    before the copy, the padded buffer touched only by it and after it."""
    for j, nest in enumerate(nests):
        stored = {s.buffer for s in walk_stmts(nest) if isinstance(s, Store)}
        if j >= k and copy.source in stored or j < k and copy.padded in touched(nest):
            return False
        if j > k and copy.padded in stored:
            return False
    return True


def _moved(nest: Stmt, copy: PadCopy) -> Stmt:
    """`nest` with each access source[j] made padded[j + offset]."""
    if copy.source not in touched(nest):
        return nest
    memo: dict[Expr, Expr] = {}

    def shifted(index: tuple[Expr, ...]) -> tuple[Expr, ...]:
        return tuple(i + o if o else i for i, o in zip(index, copy.offset))

    def expr(e: Expr) -> Expr:
        return rewrite(e, lambda n: copy.padded.load(shifted(n.src)) if n.op is Op.LOAD and n.arg is copy.source
                       else None, memo)

    def visit(s: Stmt) -> Stmt:
        if isinstance(s, Store):
            indices = tuple(expr(i) for i in s.indices)
            if s.buffer is copy.source:
                return Store(copy.padded, shifted(indices), expr(s.value))
            return Store(s.buffer, indices, expr(s.value))
        if isinstance(s, IfThenElse):
            return IfThenElse(expr(s.cond), s.then, s.else_)
        if isinstance(s, For):
            return replace(s, extent=expr(s.extent))
        return s
    return map_stmt(nest, visit) or Seq(())


def border_zeros(padded: Buffer, offset: tuple[int, ...], shape: tuple[int, ...], lanes: int,
                 ranges: dict) -> Stmt:
    """A nest storing 0 to every element of `padded` outside the box `offset` + `shape`, one parallel loop over its
    rows (all dims but the last two): a row outside the box is zeroed whole, one inside it before and after the
    box in each of the last two dims. In memory order, so that the lines it writes come in as streams. The
    loops' ranges go into `ranges`."""
    *outer, rows_w, rows_c = padded.shape
    row = var(f"{padded.name}_row")
    count = math.prod(outer)
    ranges[row] = (0, count - 1)
    index, stride = [], count
    for m in outer:
        stride //= m
        index.append(const(0) if m == 1 else row // stride if stride * m == count else row // stride % m)
    inside = [i >= o for i, o in zip(index, offset) if o > 0]
    inside += [i < o + n for i, o, n, m in zip(index, offset, shape, outer) if o + n < m]
    (ow, oc), (w, c) = offset[-2:], shape[-2:]
    cut = [(0, ow), (ow + w, rows_w)]  # along w, whole pixels
    edges = [_zero_box(padded, index, [(a, b), (0, rows_c)], lanes, ranges) for a, b in cut if a < b]
    edges += [_zero_box(padded, index, [(ow, ow + w), (a, b)], lanes, ranges)
              for a, b in ((0, oc), (oc + c, rows_c)) if a < b]
    whole = _zero_box(padded, index, [(0, rows_w), (0, rows_c)], lanes, ranges)
    body = seq(*edges) if not inside else IfThenElse(functools.reduce(operator.and_, inside), seq(*edges), whole)
    return For(row, const(count), ForKind.PARALLEL, body)


def _zero_box(buf: Buffer, prefix: list[Expr], box: list[tuple[int, int]], lanes: int, ranges: dict) -> Stmt:
    """buf[prefix..., box] = 0 over a 2-D box, the last dim in vectors of `lanes` where they divide its extent."""
    (w0, w1), (c0, c1) = box
    px, lane = var(f"{buf.name}_px"), var(f"{buf.name}_lane")
    ranges[px] = (0, w1 - w0 - 1)
    vectors = (c1 - c0) // lanes if (c1 - c0) % lanes == 0 else 0
    step, inner = (var(f"{buf.name}_vec"), lanes) if vectors else (None, c1 - c0)
    ranges[lane] = (0, inner - 1)
    channel = lane + step * lanes if step is not None else lane
    body: Stmt = Store(buf, (*prefix, px + w0 if w0 else px, channel + c0 if c0 else channel), const(0, buf.dtype))
    body = For(lane, const(inner), ForKind.VECTORIZED if inner <= 4 * lanes else ForKind.SERIAL, body)
    if step is not None:
        ranges[step] = (0, vectors - 1)
        body = For(step, const(vectors), ForKind.SERIAL, body)
    return For(px, const(w1 - w0), ForKind.SERIAL, body)
