"""Features of a config for the cost model, read from the config's lowered loop IR (AutoTVM's itervar
features): per statement its loop nest (extents, annotations, depth, vector lanes, unrolled register
tile, parallel extent), per buffer access its stride along the innermost loop and the bytes it touches
inside each of the innermost loop levels (reuse), arithmetic intensity and allocation sizes, then the
knob vector and the split factors themselves. Every quantity is a log or a ratio, so features of two
workloads of one template are comparable (the cost model trains on other workloads' records).

Speed (why this is not just "lower and walk"): building a template's schedule costs ~1 ms and its
unsimplified lowering ~2-3 ms, so featurising one config at a time reaches ~250 configs/s. Configs that
differ only in split factors share their loop structure; within one such *class* every primitive quantity
of the IR (a loop extent, an access stride, an allocation size) is a monomial of the split factors (an
extent is a factor or a product of factors, a stride a product of buffer dimensions). So a class is lowered
at a few probe configs, each primitive's exponents are found exactly per split knob, checked on one more
config, and every other config of the class is featurised by substitution (vectorised numpy). A class
whose probes disagree (another loop structure, a primitive that is not a monomial) is lowered per config.

>>> import jitop
>>> from jitop.tuner.registry import get
>>> from jitop.tuner.task import Task
>>> wl = get("matmul").workload_type(m=32, n=32, k=32)
>>> task = Task("matmul", wl, jitop.Target.from_string("haswell"))
>>> configs = list(task.config_space())[:5]
>>> x = features(task, configs)
>>> x.shape == (5, len(feature_names(task)))
True
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from jitop.te.expr import Expr, Op, walk
from jitop.tir.lower import Lowering
from jitop.tir.nodes import Allocate, Buffer, For, IfThenElse, PrimFunc, Seq, Stmt, Store
from jitop.tuner import registry
from jitop.tuner.space import Config, ConfigSpace, Knob
from jitop.tuner.task import Task

TOP_STMTS = 3      # statements described one by one (most iterations x flops first)
LEVELS = 6         # loop levels, counted from the innermost, at which footprints are described
ACCESSES = 4       # accesses per statement described one by one (the write first, then the reads)
_KINDS = ("SERIAL", "PARALLEL", "VECTORIZED", "UNROLLED")
_FLOP_OPS = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MIN, Op.MAX, Op.NEG, Op.CALL})


# ** the loop nest of one lowered config: a structure (skeleton) and its numbers (primitives) **

@dataclass(frozen=True)
class _Skeleton:
    """Everything about a lowered config but its numbers; configs of one class share it."""

    kinds: tuple[str, ...]                      # per loop, outer loops first (pre-order)
    stmts: tuple[tuple[int, ...], ...]          # per statement: the loops around it, outermost first
    flops: tuple[int, ...]                      # per statement: float operations per iteration
    accesses: tuple[tuple[tuple[str, int, bool], ...], ...]  # per statement: (buffer, itemsize, write)
    allocs: tuple[str, ...]                     # per allocation: its scope

    def stride_slot(self, stmt: int, access: int, level: int) -> int:
        """Index in the primitive vector of an access's stride along one of its statement's loops."""
        base = len(self.kinds)
        for s in range(stmt):
            base += len(self.accesses[s]) * len(self.stmts[s])
        return base + access * len(self.stmts[stmt]) + level


class _Walker:
    """One pass over unsimplified loop IR collecting loops, statements, accesses and allocations."""

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.extents: list[int] = []
        self.vars: list[Expr] = []
        self.stmts: list[tuple[int, ...]] = []
        self.flops: list[int] = []
        self.accesses: list[tuple[tuple[str, int, bool], ...]] = []
        self.strides: list[int] = []
        self.allocs: list[str] = []
        self.alloc_bytes: list[int] = []

    def visit(self, s: Stmt, loops: tuple[int, ...]) -> None:
        if isinstance(s, For):
            self.kinds.append(s.kind.name)
            self.extents.append(int(s.extent.value))
            self.vars.append(s.var)
            self.visit(s.body, loops + (len(self.kinds) - 1,))
        elif isinstance(s, Seq):
            for c in s.stmts:
                self.visit(c, loops)
        elif isinstance(s, IfThenElse):  # guards: the body runs (almost) always; tails are a knob feature
            self.visit(s.then, loops)
            if s.else_ is not None:
                self.visit(s.else_, loops)
        elif isinstance(s, Allocate):
            self.allocs.append(s.buffer.scope)
            self.alloc_bytes.append(s.buffer.size * s.buffer.dtype.itemsize)
            self.visit(s.body, loops)
        elif isinstance(s, Store):
            self.store(s, loops)

    def store(self, s: Store, loops: tuple[int, ...]) -> None:
        reads = [n for n in walk(s.value) if n.op is Op.LOAD and isinstance(n.arg, Buffer)]
        accesses = [(s.buffer, s.indices, True)] + [(n.arg, n.src, False) for n in reads]
        self.stmts.append(loops)
        self.flops.append(sum(1 for n in walk(s.value) if n.op in _FLOP_OPS and n.dtype.is_float))
        self.accesses.append(tuple((b.name, b.dtype.itemsize, w) for b, _, w in accesses))
        for buf, idx, _ in accesses:
            self.strides += _strides(buf, idx, [self.vars[l] for l in loops])

    def result(self) -> tuple[_Skeleton, np.ndarray]:
        sk = _Skeleton(tuple(self.kinds), tuple(self.stmts), tuple(self.flops), tuple(self.accesses),
                       tuple(self.allocs))
        return sk, np.array(self.extents + self.strides + self.alloc_bytes, dtype=np.float64)


def _strides(buf: Buffer, idx: Sequence[Expr], loop_vars: list[Expr]) -> list[int]:
    """Element stride of the flat address along each loop: finite differences at the origin (exact for
    affine indices, the within-tile stride for the // and % of packed layouts; no simplifier needed)."""
    row = [math.prod(buf.shape[d + 1:]) for d in range(len(buf.shape))]
    base = _flat(idx, row, {})
    return [_flat(idx, row, {v: 1}) - base for v in loop_vars]


def _flat(idx: Sequence[Expr], row: list[int], env: dict) -> int:
    memo: dict = {}
    return int(sum(_eval(i, env, memo) * r for i, r in zip(idx, row)))


_BIN = {Op.ADD: lambda a, b: a + b, Op.SUB: lambda a, b: a - b, Op.MUL: lambda a, b: a * b,
        Op.FLOORDIV: lambda a, b: a // b if b else 0, Op.FLOORMOD: lambda a, b: a % b if b else 0,
        Op.TRUNCDIV: lambda a, b: int(a / b) if b else 0, Op.TRUNCMOD: lambda a, b: int(math.fmod(a, b)) if b else 0,
        Op.MIN: min, Op.MAX: max}


def _eval(e: Expr, env: dict, memo: dict) -> Any:
    """Integer value of an index expression with loop variables from `env` (others 0)."""
    if e.op is Op.CONST:
        return e.value
    if e.op is Op.VAR:
        return env.get(e, 0)
    if e in memo:
        return memo[e]
    if e.op in _BIN:
        out = _BIN[e.op](_eval(e.src[0], env, memo), _eval(e.src[1], env, memo))
    elif e.op is Op.CAST:
        out = int(_eval(e.src[0], env, memo))
    elif e.op is Op.NEG:
        out = -_eval(e.src[0], env, memo)
    elif e.op is Op.SELECT:
        out = _eval(e.src[1] if _eval(e.src[0], env, memo) else e.src[2], env, memo)
    elif e.op in (Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ, Op.NE, Op.AND, Op.OR):
        a, b = _eval(e.src[0], env, memo), _eval(e.src[1], env, memo)
        out = {Op.LT: a < b, Op.LE: a <= b, Op.GT: a > b, Op.GE: a >= b, Op.EQ: a == b, Op.NE: a != b,
               Op.AND: bool(a) and bool(b), Op.OR: bool(a) or bool(b)}[e.op]
    else:  # an indirect index (a load) or an intrinsic: no stride to speak of
        out = 0
    memo[e] = out
    return out


def _lower(task: Task, config: Config) -> tuple[_Skeleton, np.ndarray]:
    """Build and lower (no simplification, no LLVM) one config, and walk its loop IR."""
    # a symbolic task is featurised at its representative sizes (its loops' extents are numbers there)
    s, args = task.build(config, concrete=True)
    low = Lowering(s, args)
    low.infer()
    func: PrimFunc = low.function("main")
    w = _Walker()
    w.visit(func.body, ())
    return w.result()


# ** features from a skeleton and its primitives (rows: configs of one class) **

class _Columns:
    """Named feature columns, appended in a fixed order (the names are the same for every class)."""

    def __init__(self, n: int) -> None:
        self.n, self.names, self.cols = n, [], []

    def add(self, name: str, col: Any) -> None:
        self.names.append(name)
        self.cols.append(np.broadcast_to(np.asarray(col, dtype=np.float64), (self.n,)))

    def matrix(self) -> np.ndarray:
        return np.stack(self.cols, axis=1) if self.cols else np.zeros((self.n, 0))


def _log2(x: Any) -> np.ndarray:
    return np.log2(np.maximum(np.asarray(x, dtype=np.float64), 1.0))


def _stmt_order(sk: _Skeleton, prims: np.ndarray | None = None) -> tuple[int, ...]:
    """Statements deepest first, then most flops (stable): from the structure alone, so a config's features
    never depend on which other configs were featurised with it."""
    key = lambda s: (-len(sk.stmts[s]), -sk.flops[s], s)  # noqa: E731
    return tuple(sorted(range(len(sk.stmts)), key=key))[:TOP_STMTS]


def _derive(sk: _Skeleton, prims: np.ndarray, order: tuple[int, ...], threads: int) -> _Columns:
    """The IR features of configs sharing `sk`; prims is (configs, primitives)."""
    n = prims.shape[0]
    out = _Columns(n)
    logext = _log2(prims[:, : len(sk.kinds)])
    iters = [logext[:, list(loops)].sum(axis=1) for loops in sk.stmts]
    _global_features(out, sk, prims, logext, iters, threads)
    for k in range(TOP_STMTS):
        if k < len(order):
            _stmt_features(out, sk, prims, logext, order[k], f"s{k}")
        else:
            _stmt_features(out, None, prims, logext, -1, f"s{k}")
    return out


def _global_features(out: _Columns, sk: _Skeleton, prims: np.ndarray, logext: np.ndarray,
                     iters: list[np.ndarray], threads: int) -> None:
    work = sum(np.exp2(it) * f for it, f in zip(iters, sk.flops)) if iters else 0.0
    out.add("log2_total_flops", _log2(work))
    out.add("log2_total_iterations", _log2(sum(np.exp2(it) for it in iters) if iters else 0.0))
    out.add("statements", len(sk.stmts))
    out.add("max_depth", max((len(l) for l in sk.stmts), default=0))
    par = [l for l, kind in enumerate(sk.kinds) if kind == "PARALLEL"]
    extent = np.exp2(logext[:, par].max(axis=1)) if par else np.ones(prims.shape[0])
    out.add("log2_parallel_extent", _log2(extent))
    # threads balance: the last wave of parallel iterations leaves threads idle
    out.add("parallel_balance", extent / (np.ceil(extent / threads) * threads))
    alloc = prims[:, prims.shape[1] - len(sk.allocs):] if sk.allocs else np.zeros((prims.shape[0], 0))
    local = [a for a, scope in enumerate(sk.allocs) if scope == "local"]
    glob = [a for a, scope in enumerate(sk.allocs) if scope != "local"]
    out.add("log2_local_alloc_bytes", _log2(alloc[:, local].sum(axis=1)))
    out.add("log2_max_local_alloc_bytes", _log2(alloc[:, local].max(axis=1) if local else 0.0))
    out.add("log2_global_alloc_bytes", _log2(alloc[:, glob].sum(axis=1)))


def _stmt_features(out: _Columns, sk: _Skeleton | None, prims: np.ndarray, logext: np.ndarray, s: int,
                   p: str) -> None:
    """One statement: loop nest, footprints per level, accesses, intensity (zeros for a missing one)."""
    loops = sk.stmts[s] if sk is not None else ()
    kinds = [sk.kinds[l] for l in loops] if sk is not None else []
    out.add(f"{p}_present", sk is not None)
    out.add(f"{p}_log2_iterations", logext[:, list(loops)].sum(axis=1))
    out.add(f"{p}_flops_per_iteration", sk.flops[s] if sk is not None else 0)
    out.add(f"{p}_depth", len(loops))
    for kind in _KINDS:
        out.add(f"{p}_innermost_{kind.lower()}", bool(kinds) and kinds[-1] == kind)
    out.add(f"{p}_log2_innermost_extent", logext[:, loops[-1]] if loops else 0.0)
    for kind in ("VECTORIZED", "UNROLLED", "PARALLEL"):
        out.add(f"{p}_log2_{kind.lower()}_product", logext[:, [l for l, k in zip(loops, kinds) if k == kind]].sum(axis=1))
    # the register tile: unrolled x vectorised iterations held in registers
    out.add(f"{p}_log2_register_tile", logext[:, [l for l, k in zip(loops, kinds) if k in ("VECTORIZED", "UNROLLED")]].sum(axis=1))
    foot = _footprints(sk, prims, s) if sk is not None else np.zeros((prims.shape[0], 0, 0))
    _level_features(out, sk, logext, loops, foot, p)
    _access_features(out, sk, prims, logext, s, foot, p)
    # arithmetic intensity at the outermost serial level: flops per byte brought in there
    first = next((k for k, kind in enumerate(kinds) if kind != "PARALLEL"), len(kinds))
    inner_iters = logext[:, list(loops[first:])].sum(axis=1)
    bytes_in = foot[:, :, len(loops) - 1 - first].sum(axis=1) if loops and first < len(loops) else np.ones(prims.shape[0])
    out.add(f"{p}_log2_intensity", inner_iters + math.log2((sk.flops[s] if sk else 0) + 1) - _log2(bytes_in))


def _footprints(sk: _Skeleton, prims: np.ndarray, s: int) -> np.ndarray:
    """(configs, accesses, levels) bytes each access touches inside the innermost level+1 loops: the product
    of the extents of the loops it moves along (an upper bound that ignores overlap)."""
    loops = sk.stmts[s]
    n, depth = prims.shape[0], len(loops)
    out = np.zeros((n, len(sk.accesses[s]), depth))
    for a, (_, itemsize, _) in enumerate(sk.accesses[s]):
        size = np.full(n, float(itemsize))
        for level in range(depth):
            j = depth - 1 - level
            moves = prims[:, sk.stride_slot(s, a, j)] != 0
            size = size * np.where(moves, np.maximum(prims[:, loops[j]], 1.0), 1.0)
            out[:, a, level] = size
    return out


def _level_features(out: _Columns, sk: _Skeleton | None, logext: np.ndarray, loops: tuple[int, ...],
                    foot: np.ndarray, p: str) -> None:
    depth = len(loops)
    for level in range(LEVELS):
        lv = min(level, depth - 1)
        inner = list(loops[depth - 1 - lv:]) if depth else []
        out.add(f"{p}_L{level}_log2_iterations", logext[:, inner].sum(axis=1))
        out.add(f"{p}_L{level}_log2_bytes", _log2(foot[:, :, lv].sum(axis=1)) if depth else 0.0)


def _access_features(out: _Columns, sk: _Skeleton | None, prims: np.ndarray, logext: np.ndarray, s: int,
                     foot: np.ndarray, p: str) -> None:
    loops = sk.stmts[s] if sk is not None else ()
    depth = len(loops)
    accesses = sk.accesses[s] if sk is not None else ()
    all_iters = logext[:, list(loops)].sum(axis=1)
    for a in range(ACCESSES):
        q = f"{p}_a{a}"
        here = a < len(accesses) and depth > 0
        st = np.abs(prims[:, sk.stride_slot(s, a, depth - 1)]) if here else np.zeros(prims.shape[0])
        out.add(f"{q}_present", here)
        out.add(f"{q}_write", here and accesses[a][2])
        out.add(f"{q}_innermost_stride0", here and (st == 0))
        out.add(f"{q}_innermost_stride1", here and (st == 1))
        out.add(f"{q}_log2_innermost_stride", np.log2(st + 1.0))
        out.add(f"{q}_log2_bytes_L2", _log2(foot[:, a, min(2, depth - 1)]) if here else 0.0)
        total = foot[:, a, depth - 1] if here else np.ones(prims.shape[0])
        out.add(f"{q}_log2_bytes_all", _log2(total))
        # reuse: iterations per element touched over the whole nest
        itemsize = accesses[a][1] if here else 1
        out.add(f"{q}_log2_reuse", all_iters - _log2(total / itemsize) if here else 0.0)


# ** knob features: positions, split factors (log2) and tail waste, numeric knob values **

def _knob_features(space: ConfigSpace, configs: Sequence[Config]) -> _Columns:
    out = _Columns(len(configs))
    for pos, knob in enumerate(space.knobs):
        idx = np.array([knob.candidates.index(c[knob.name]) for c in configs], dtype=np.float64)
        out.add(f"knob_{knob.name}", idx)
        values = [c[knob.name] for c in configs]
        if knob.kind == "split":
            comps = np.array(values, dtype=np.float64).reshape(len(configs), -1)
            for j in range(comps.shape[1]):
                out.add(f"knob_{knob.name}_log2_f{j}", _log2(comps[:, j]))
            # padding of a non-divisible split: the product of the factors over the smallest product
            least = min(math.prod(c) for c in knob.candidates) or 1
            out.add(f"knob_{knob.name}_waste", comps.prod(axis=1) / least if len(configs) else comps[:, 0])
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in knob.candidates):
            out.add(f"knob_{knob.name}_log2_value", np.log2(np.abs(np.array(values, dtype=np.float64)) + 1.0))
        elif _int_tuples(knob):  # a knob of several sizes at once (the GPU GEMM's tile: bm, bn, tm, tn)
            comps = np.array(values, dtype=np.float64).reshape(len(configs), -1)
            for j in range(comps.shape[1]):
                out.add(f"knob_{knob.name}_log2_v{j}", _log2(comps[:, j]))
    return out


def _int_tuples(knob: Knob) -> bool:
    """Whether every candidate of a (non-split) knob is a tuple of positive ints of one length."""
    cands = knob.candidates
    return all(isinstance(c, tuple) and len(c) == len(cands[0]) > 0 and
               all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in c) for c in cands)


# ** per-class monomial fit of the primitives **

_EXPONENTS = np.array(sorted(((a, b) for a in range(-2, 3) for b in range(-2, 3)),
                             key=lambda e: ((e[0] != 0) + (e[1] != 0), abs(e[0]) + abs(e[1]), e[0] < 0, e[1] < 0)),
                      dtype=np.float64)


@dataclass
class _ClassFit:
    """Primitives of every config of one class: sign(q0) * q0 * prod(comp / comp0) ** exponents."""

    skeleton: _Skeleton
    order: tuple[int, ...]
    q0: np.ndarray          # (primitives,) at the representative
    lc0: np.ndarray         # (components,) log2 split factors of the representative
    exps: np.ndarray        # (primitives, components)

    def primitives(self, lc: np.ndarray) -> np.ndarray:
        mag = np.exp2(_log2(np.abs(self.q0)) + (lc - self.lc0) @ self.exps.T)
        return np.rint(np.sign(self.q0) * mag)


def _split_knobs(space: ConfigSpace) -> list[int]:
    return [k for k, knob in enumerate(space.knobs) if knob.kind == "split"]


def _log_comps(space: ConfigSpace, configs: Sequence[Config]) -> np.ndarray:
    """(configs, components) log2 of every split factor (a 0 factor, of an empty axis, counts as 1)."""
    rows = [[v for k in _split_knobs(space) for v in c[space.knobs[k].name]] for c in configs]
    return _log2(np.array(rows, dtype=np.float64).reshape(len(configs), -1))


def _class_key(space: ConfigSpace, config: Config) -> tuple:
    """Configs of one class share their loop structure: the same non-split knobs, and the same split
    factors equal to 1 (a loop of extent 1 makes bound inference cover a whole axis: another structure)
    and the same divisibility (a padded split adds stages, and makes the padded size vary in the class)."""
    return tuple(config[k.name] if k.kind != "split" else _pattern(k, config[k.name]) for k in space.knobs)


def _pattern(knob: Knob, value: Sequence[int]) -> tuple:
    return tuple(v == 1 for v in value), math.prod(value) == min(math.prod(c) for c in knob.candidates)


def _same_pattern(space: ConfigSpace, knob: int, config: Config) -> list[int]:
    """Candidates of a split knob with the config's pattern of unit factors."""
    k = space.knobs[knob]
    return [i for i, c in enumerate(k.candidates) if _pattern(k, c) == _pattern(k, config[k.name])]


def _with(space: ConfigSpace, base: Config, knob: int, cand: int) -> Config:
    d = base.as_dict()
    d[space.knobs[knob].name] = space.knobs[knob].candidates[cand]
    return Config(tuple(sorted(d.items())))


def _fit_class(task: Task, space: ConfigSpace, member: Config, exact: dict) -> _ClassFit | None:
    """Lower the class of `member` at a representative, two probes per split knob and a check config;
    None if the class is not a monomial family (its configs are then lowered one by one)."""
    splits = _split_knobs(space)
    rep = member
    for k in splits:
        same = _same_pattern(space, k, member)
        rep = _with(space, rep, k, same[len(same) // 2])
    sk, q0 = _lower_cached(task, rep, exact)
    lc0 = _log_comps(space, [rep])[0]
    exps = np.zeros((q0.size, lc0.size))
    col = 0
    for k in splits:
        width = len(space.knobs[k].candidates[0])
        same = _same_pattern(space, k, member)
        probes = sorted({same[0], same[-1]} - {same[len(same) // 2]})
        got = _fit_knob(task, space, rep, k, probes, sk, q0, lc0[col:col + width], exact)
        if got is None:
            return None
        exps[:, col:col + width] = got
        col += width
    fit = _ClassFit(sk, _stmt_order(sk, q0), q0, lc0, exps)
    check = rep
    for k in splits:
        same = _same_pattern(space, k, member)
        check = _with(space, check, k, same[(len(same) // 2 + max(1, len(same) // 3)) % len(same)])
    csk, cq = _lower_cached(task, check, exact)
    if csk != sk or not np.array_equal(fit.primitives(_log_comps(space, [check]))[0], cq):
        return None
    return fit


def _fit_knob(task: Task, space: ConfigSpace, rep: Config, knob: int, probes: list[int], sk: _Skeleton,
              q0: np.ndarray, lc0: np.ndarray, exact: dict) -> np.ndarray | None:
    """(primitives, components of this knob) exponents matching every probe exactly, or None."""
    width = lc0.size
    out = np.zeros((q0.size, width))
    if not probes:
        return out
    ys, ds = [], []
    for cand in probes:
        cfg = _with(space, rep, knob, cand)
        psk, q = _lower_cached(task, cfg, exact)
        if psk != sk or np.any((q == 0) != (q0 == 0)) or np.any(np.sign(q) != np.sign(q0)):
            return None
        ys.append(_log2(np.abs(q)) - _log2(np.abs(q0)))
        start = sum(len(space.knobs[k].candidates[0]) for k in _split_knobs(space) if k < knob)
        ds.append(_log_comps(space, [cfg])[0][start:start + width] - lc0)
    y, d = np.array(ys), np.array(ds)                       # (probes, prims), (probes, width)
    table = _EXPONENTS if width == 2 else np.array([[a] for a in (0, 1, -1, 2, -2)], dtype=np.float64)
    pred = d @ table.T                                      # (probes, combos)
    ok = np.all(np.abs(y[:, :, None] - pred[:, None, :]) < 1e-9, axis=0)  # (prims, combos)
    if not ok.any(axis=1).all():
        return None
    return table[ok.argmax(axis=1)]


def _lower_cached(task: Task, config: Config, exact: dict) -> tuple[_Skeleton, np.ndarray]:
    if config not in exact:
        exact[config] = _lower(task, config)
    return exact[config]


# ** the public functions, memoised per task **

FIT_MIN = 8   # a class with fewer configs to featurise is lowered config by config (a fit costs ~8 lowerings)


@dataclass
class _TaskCache:
    space: ConfigSpace
    rows: dict            # Config -> feature row
    exact: dict           # Config -> (skeleton, primitives)
    fits: dict            # class key -> _ClassFit | None
    names: list[str] | None = None


_CACHES: dict[tuple[str, bool], _TaskCache] = {}
_MAX_TASKS = 32


def _cache(task: Task) -> _TaskCache:
    key = (task.key, task.constant_weights)  # the flag changes the measured kernel, not the task's key
    if key not in _CACHES:
        if len(_CACHES) >= _MAX_TASKS:
            _CACHES.pop(next(iter(_CACHES)))
        _CACHES[key] = _TaskCache(task.config_space(), {}, {}, {})
    return _CACHES[key]


def features(task: Task, configs: Sequence[Config]) -> np.ndarray:
    """(len(configs), F) float32 features of configs of `task`'s space; F is fixed per template and
    Target, and the values are memoised per (task, config). See the module docstring."""
    tc = _cache(task)
    todo = [c for c in dict.fromkeys(configs) if c not in tc.rows]
    classes: dict[tuple, list[Config]] = {}
    for c in todo:
        classes.setdefault(_class_key(tc.space, c), []).append(c)
    for key, members in classes.items():
        _featurise_class(task, tc, key, members)
    if not configs:
        return np.zeros((0, len(feature_names(task))), dtype=np.float32)
    return np.stack([tc.rows[c] for c in configs]).astype(np.float32)


def is_memoised(task: Task, config: Config) -> bool:
    """Whether `features(task, [config])` is a lookup (no lowering)."""
    return config in _cache(task).rows


def _featurise_class(task: Task, tc: _TaskCache, key: tuple, members: list[Config]) -> None:
    if key not in tc.fits and len(members) >= FIT_MIN:
        tc.fits[key] = _fit_class(task, tc.space, members[0], tc.exact)
    fit = tc.fits.get(key)
    threads = getattr(task.target, "threads", 1)  # a GPU Target's loops are bound to threads, not PARALLEL
    if fit is not None:
        ir = _derive(fit.skeleton, fit.primitives(_log_comps(tc.space, members)), fit.order, threads)
        _store(tc, members, ir)
        return
    for c in members:
        sk, q = _lower_cached(task, c, tc.exact)
        _store(tc, [c], _derive(sk, q[None, :], _stmt_order(sk, q), threads))


def _store(tc: _TaskCache, configs: list[Config], ir: _Columns) -> None:
    knobs = _knob_features(tc.space, configs)
    if tc.names is None:
        tc.names = ir.names + knobs.names
    rows = np.concatenate([ir.matrix(), knobs.matrix()], axis=1)
    rows = np.nan_to_num(rows, nan=0.0, posinf=64.0, neginf=-64.0)
    for c, row in zip(configs, rows):
        tc.rows[c] = row


def feature_names(task: Task) -> list[str]:
    """Names of the feature columns (the same for every workload of the task's template).

    >>> import jitop
    >>> from jitop.tuner.registry import get
    >>> task = Task("matmul", get("matmul").workload_type(m=8, n=8, k=8), jitop.Target.from_string("haswell"))
    >>> feature_names(task)[:2]
    ['log2_total_flops', 'log2_total_iterations']
    """
    tc = _cache(task)
    if tc.names is None:
        features(task, [registry.get(task.template).default_config(task.workload, task.target)])
    return list(tc.names)
