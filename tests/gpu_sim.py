"""A CPU simulator of GPU loop IR, for tests: it runs the kernels of a lowered GPU schedule on numpy arrays with
the GPU's semantics, and fails loudly where real hardware would silently misbehave.

`run(func, *arrays)` executes every kernel of `jitop.codegen.nvptx.kernel_nests(func)` (the nests exactly as the
PTX emitter receives them), one launch after another. The arrays are the function's parameters in order (their
dtypes and shapes must match; outputs are written in place); the symbols' values are read from their shapes
(`PrimFunc.symbol_sources`) unless `symbols` names them.

How it runs: the threads of a chunk of blocks (by default the whole grid) execute each statement together, in
lockstep, on numpy arrays over the threads ("lanes"). A loop bound to blockIdx/threadIdx is no loop: its variable
is each lane's index, and a bound loop shorter than the launch leaves the lanes past its extent out. A guard
(IfThenElse, the untaken side of a select that reads memory, a serial loop whose trip count differs between
threads) narrows the set of active lanes. Serial, unrolled and vectorized loops are plain loops that every active
thread runs. Blocks never wait for each other. Memory: parameters and workspaces (the function's global
allocations, made anew at each call) are flat arrays common to all; a "shared" buffer has one copy per block, a
"local" one a copy per thread.

It catches (each error names the buffer, the index and the threads):
- RaceError: an element of shared memory written by one thread of a block and read or written by another in
  the same barrier interval (no barrier() between them), which lockstep execution would otherwise hide by giving
  the "right" answer. Global memory (parameters, workspaces) is checked the same way within a block, and across
  blocks: an element one block writes and another block reads or writes in the same launch is a race.
- OutOfBoundsError: any index outside its buffer's shape, on any buffer (the real kernels check such accesses
  too, and fail after the launch).
- DivergenceError: a barrier() or a thread_reduce reached by some but not all threads of a block.
- Reads of memory never written give NaN rather than an error: every shared and local buffer is filled with
  poison each time its Allocate is entered (NaN; integers: the dtype's minimum; bools: True), workspaces at
  each call, so a read before the write poisons the result instead of borrowing what lockstep order left there.
  It is not an error because correct GPU code reads unwritten elements too: the SGEMM's threads of a tail block
  compute garbage rows of their register tile from the unfilled rows of the shared tile, and never store them.

Semantics as the PTX back end emits them: a thread_reduce (along threadIdx.x, y or z) combines its threads'
values with a butterfly among those one warp holds, then the warps' results in order; it is a barrier for shared
memory only when it spans more than one warp (only then does the emitted code synchronise). Integer division and modulo follow the IR's ops
(FLOORDIV/FLOORMOD: Python's and numpy's, TRUNCDIV/TRUNCMOD: C's; by zero: 0), min/max propagate NaN, casts are
numpy's astype. A call that raises at run time (raise_if, a negative integer power) raises the error the GPU
call would when an active thread meets it. Not supported: the tensor-core marker calls of jitop.codegen.mma /
topi.cuda_mma ("cuda.*": a warp-wide mma is no per-thread computation): NotImplementedError.
"""
from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from jitop.codegen.kernel import NEGATIVE_POWER, RAISE_IF
from jitop.codegen.nvptx import kernel_nests, launch_dims
from jitop.dtypes import DType
from jitop.runtime.module import flagged_error
from jitop.te.expr import BINARY, Expr, Op, var, walk
from jitop.tir.nodes import (Allocate, Barrier, Buffer, For, ForKind, IfThenElse, PrimFunc, Seq, Stmt, Store,
                             ThreadReduce, walk_stmts)

BLOCK_KINDS = (ForKind.BLOCK_X, ForKind.BLOCK_Y, ForKind.BLOCK_Z)
THREAD_KINDS = (ForKind.THREAD_X, ForKind.THREAD_Y, ForKind.THREAD_Z)
WARP = 32
MAX_LANES = 1 << 16  # threads simulated at once: a grid with more runs in chunks of whole blocks
NONE, SEVERAL = -1, -2  # the tracker's "nobody" and "more than one" thread or block


class GpuSimError(RuntimeError):
    """The simulated GPU code misbehaved."""


class RaceError(GpuSimError):
    """Two threads touched one element without a barrier between them, at least one of them writing."""


class OutOfBoundsError(GpuSimError):
    """An index outside its buffer's shape."""


class DivergenceError(GpuSimError):
    """A barrier (or a block-wide collective) that only some threads of a block reached."""


def run(func: PrimFunc, *arrays: np.ndarray, symbols: dict[str, int] | None = None,
        max_lanes: int = MAX_LANES, calls: Counter | None = None) -> None:
    """Execute every kernel of the lowered GPU function `func` on `arrays` (its parameters in order; outputs are
    written in place). `symbols`: the values of the function's symbols by name (default: read from the arrays'
    shapes). `calls`, if given, counts the intrinsic calls the threads evaluate (name -> evaluations, one per
    active thread: what a kernel recomputes). Raises RaceError, OutOfBoundsError or DivergenceError where the code
    is wrong (see the module)."""
    if len(arrays) != len(func.params):
        raise TypeError(f"{func.name} takes {len(func.params)} arrays ({', '.join(b.name for b in func.params)}), "
                        f"got {len(arrays)}")
    env = _symbol_env(func, arrays, symbols)
    memory = {buf: _bind(buf, arr, env) for buf, arr in zip(func.params, arrays)}
    for buf in _workspaces(func.body):
        memory[buf] = _poison(buf.dtype, (math.prod(_dims(buf, env)),))
    with np.errstate(all="ignore"):
        for nest in kernel_nests(func):
            _launch(nest, memory, env, func.attrs.get("ranges", {}), max_lanes, calls)


@dataclass
class Traced:
    """A traced function's graph lowered for a GPU as jitop.graph.gpu compiles it: the loop IR, the GPU template
    tasks of its nodes, its parameters' arrays (inputs, then constants) and its results' (uninitialized)."""

    func: PrimFunc
    tasks: list
    arrays: list
    outputs: list


def lower_traced(kf: Any, *args: Any) -> Traced:
    """The graph of `kf` (a @jitop.kernel(target="cuda ...")) traced on `args`, lowered for its GPU target."""
    from jitop.graph.compile import constant_array, distinct_outputs
    from jitop.graph.gpu import lower_trace, read_constants_of
    tr = kf.trace(list(args))
    func, choices = lower_trace(kf.__name__, tr.inputs, tr.names, tr.results, kf.gpu)
    unique = list(dict.fromkeys(distinct_outputs(tr.results)))
    consts = read_constants_of(unique)
    inputs = [np.asarray(args[what[0]], what[1]) if kind in ("scalar", "arg_swapped") else args[what]
              for kind, what in tr.plan]
    return Traced(func, [task for task, _ in choices.values()], inputs + [constant_array(n) for n in consts],
                  [np.empty(n.shape, n.dtype.np) for n in unique])


def run_traced(kf: Any, *args: Any) -> tuple[list[np.ndarray], list]:
    """`kf`'s results on `args` computed by its GPU loop IR on the simulator (the distinct results, in the order
    the traced function returns them first), and the GPU template tasks of its nodes."""
    traced = lower_traced(kf, *args)
    run(traced.func, *traced.arrays, *traced.outputs)
    return traced.outputs, traced.tasks


def _symbol_env(func: PrimFunc, arrays: tuple[np.ndarray, ...], symbols: dict[str, int] | None) -> dict:
    """Each symbol VAR -> its value (an int64 scalar)."""
    if symbols is not None:
        return {v: np.int64(symbols[v.name]) for v in func.symbols}
    if not func.symbols:
        return {}
    return {v: np.int64(arrays[k].shape[j]) for v, (k, j) in zip(func.symbols, func.symbol_sources())}


def _dims(buf: Buffer, env: dict) -> tuple[int, ...]:
    """The buffer's shape as ints (symbolic dims evaluated)."""
    return tuple(d if isinstance(d, int) else int(_Eval.standalone(d, env)) for d in buf.shape)


def _bind(buf: Buffer, arr: np.ndarray, env: dict) -> np.ndarray:
    """The flat view of a parameter's array, after checking that it is the buffer's (writes go to the caller)."""
    dims = _dims(buf, env)
    if not isinstance(arr, np.ndarray) or arr.dtype != buf.dtype.np or arr.shape != dims:
        raise ValueError(f"parameter {buf.name} is {buf.dtype.np.name}{list(dims)}, got "
                         f"{getattr(arr, 'dtype', type(arr).__name__)}{list(getattr(arr, 'shape', ()))}")
    if not arr.flags.c_contiguous:
        raise ValueError(f"parameter {buf.name}: pass a C-contiguous array (outputs are written in place)")
    return arr.reshape(-1)


def _workspaces(body: Stmt) -> list[Buffer]:
    """The function's global allocations that enclose its kernels (the runtime allocates them per call)."""
    found = []
    while isinstance(body, Allocate) and body.buffer.scope == "global":
        found.append(body.buffer)
        body = body.body
    return found


def _poison(dt: DType, shape: tuple[int, ...]) -> np.ndarray:
    """Fresh memory as the simulator gives it: NaN, the integer dtype's minimum, or True."""
    return np.full(shape, _poison_value(dt), dtype=dt.np)


def _poison_value(dt: DType) -> Any:
    if dt.is_float:
        return np.nan
    if dt.is_bool:
        return True
    return np.iinfo(dt.np).min


def _launch(nest: Stmt, memory: dict, env: dict, ranges: dict, max_lanes: int, calls: Counter | None = None) -> None:
    """One kernel launch: its blocks in chunks of at most `max_lanes` threads, run one chunk after another."""
    dims = launch_dims(nest, ranges)
    extent = {k: int(_Eval.standalone(dims[k], env)) if k in dims else 1 for k in BLOCK_KINDS + THREAD_KINDS}
    grid, block = tuple(extent[k] for k in BLOCK_KINDS), tuple(extent[k] for k in THREAD_KINDS)
    written = {s.buffer for s in walk_stmts(nest) if isinstance(s, Store)}
    trackers = {buf: _Tracker(buf, mem.size, across_blocks=True) for buf, mem in memory.items() if buf in written}
    per_chunk = max(1, max_lanes // math.prod(block))
    for first in range(0, math.prod(grid), per_chunk):
        geometry = _Geometry(grid, block, first, min(per_chunk, math.prod(grid) - first))
        _Chunk(geometry, memory, trackers, env, calls).stmt(nest, _Ctx(np.arange(geometry.lanes), dict(env)))


# ** where the threads are **

@dataclass(frozen=True)
class _Geometry:
    """A chunk of a launch: `blocks` consecutive blocks (linear numbers from `first`) of the grid, x fastest."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    first: int
    blocks: int

    @property
    def threads(self) -> int:
        return math.prod(self.block)

    @property
    def lanes(self) -> int:
        return self.blocks * self.threads

    def index(self, kind: ForKind) -> np.ndarray:
        """Each lane's blockIdx.* or threadIdx.* along `kind`."""
        lane = np.arange(self.lanes, dtype=np.int64)
        number, dims = (lane // self.threads + self.first, self.grid) if kind in BLOCK_KINDS \
            else (lane % self.threads, self.block)
        axis = "xyz".index(kind.value[-1])
        return number // math.prod(dims[:axis]) % dims[axis]

    def who(self, glane: int) -> str:
        """A thread of the launch, by its global lane number, as 'block (x, y, z) thread (x, y, z)'."""
        b, t = divmod(int(glane), self.threads)
        return f"block {_coords(b, self.grid)} thread {_coords(t, self.block)}"


def _coords(n: int, dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n // math.prod(dims[:a]) % dims[a] for a in range(3))


@dataclass
class _Ctx:
    """The active lanes (chunk lane numbers, ascending) and the variables' values: scalars, or arrays with one
    element per active lane."""

    lanes: np.ndarray
    env: dict

    def bind(self, v: Expr, value: Any) -> "_Ctx":
        return _Ctx(self.lanes, {**self.env, v: value})

    def where(self, mask: Any) -> "_Ctx":
        """The lanes where `mask` (one bool per active lane) holds."""
        mask = np.asarray(mask, dtype=bool)
        if mask.all():
            return self
        env = {k: (x[mask] if np.ndim(x) == 1 else x) for k, x in self.env.items()}
        return _Ctx(self.lanes[mask], env)


# ** race detection **

@dataclass(frozen=True)
class _Conflict:
    """What a racing access met at `position` (of the access's lanes): the element was `action` ("written",
    "read") by the thread `lane` (a global lane number), or by the block `block`, or else by `several`."""

    position: int
    action: str
    lane: int | None = None
    block: int | None = None
    several: str = "other threads"
    note: str = ""


def _same_bits(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Elementwise: x and y hold the same value (NaNs of the same bits are equal)."""
    x, y = np.ascontiguousarray(x), np.ascontiguousarray(y)
    as_uint = f"u{x.dtype.itemsize}"
    return x.view(as_uint) == y.view(as_uint)


def _per_cell(values: np.ndarray, cells: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The smallest and largest of `values` over the accesses of each distinct cell (cells in np.unique order)."""
    order = np.argsort(cells, kind="stable")
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return np.minimum.reduceat(values[order], starts), np.maximum.reduceat(values[order], starts)


class _Tracker:
    """Who read and wrote each element of one buffer: for shared memory the elements of every block of a chunk,
    for global memory the buffer's, for one launch. A thread is its global lane number, a barrier interval the
    block's count of barriers passed (its epoch); `across_blocks` also keeps the blocks that wrote and read.

    Writes of the value an element already holds (several threads storing one result, e.g. every lane of a row
    writing the row's reduced value) are not races; reading such an element in the same interval is."""

    def __init__(self, buf: Buffer, cells: int, across_blocks: bool):
        self.buf = buf
        self.w_lane, self.w_epoch = np.full(cells, NONE), np.full(cells, NONE)
        self.r_lane, self.r_epoch = np.full(cells, NONE), np.full(cells, NONE)
        self.blocks = across_blocks
        if across_blocks:
            self.w_block, self.r_block = np.full(cells, NONE), np.full(cells, NONE)

    def read(self, cells: np.ndarray, lanes: np.ndarray, blocks: np.ndarray, epochs: np.ndarray) -> _Conflict | None:
        """Record reads, or return the first conflict (and record nothing)."""
        if self.blocks:
            wb = self.w_block[cells]
            bad = (wb != NONE) & (wb != blocks)
            if bad.any():
                k = int(np.argmax(bad))
                return _Conflict(k, "written", block=None if wb[k] == SEVERAL else int(wb[k]), several="blocks")
        w = self.w_lane[cells]
        bad = (w != NONE) & (w != lanes) & (self.w_epoch[cells] == epochs)
        if bad.any():
            k = int(np.argmax(bad))
            return _Conflict(k, "written", lane=None if w[k] == SEVERAL else int(w[k]))
        self._note_reads(cells, lanes, blocks, epochs)
        return None

    def _note_reads(self, cells: np.ndarray, lanes: np.ndarray, blocks: np.ndarray, epochs: np.ndarray) -> None:
        u, first, counts = np.unique(cells, return_index=True, return_counts=True)
        self._note("r", u, first, counts, cells, lanes, blocks, epochs)

    def _note(self, kind: str, u: np.ndarray, first: np.ndarray, counts: np.ndarray, cells: np.ndarray,
              lanes: np.ndarray, blocks: np.ndarray, epochs: np.ndarray) -> None:
        """Record who touched each cell `u` ("r": read, "w": written) in this epoch: one lane (and block), or
        SEVERAL."""
        who, when = getattr(self, f"{kind}_lane"), getattr(self, f"{kind}_epoch")
        lane, epoch, w, we = lanes[first], epochs[first], who[u], when[u]
        alone = (we != epoch) | (w == NONE) | (w == lane)
        who[u] = np.where((counts == 1) & alone, lane, SEVERAL)
        when[u] = epoch
        if self.blocks:
            lo, hi = _per_cell(blocks, cells, counts)
            by = getattr(self, f"{kind}_block")
            wb = by[u]
            by[u] = np.where((lo == hi) & ((wb == NONE) | (wb == lo)), lo, SEVERAL)

    def write(self, cells: np.ndarray, lanes: np.ndarray, blocks: np.ndarray, epochs: np.ndarray,
              new: np.ndarray, old: np.ndarray) -> _Conflict | None:
        """Record writes of the values `new` over `old`, or return the first conflict (and record nothing)."""
        u, first, inverse, counts = np.unique(cells, return_index=True, return_inverse=True, return_counts=True)
        differ = ~_same_bits(new, new[first][inverse])
        if differ.any():
            k = int(np.argmax(differ))
            return _Conflict(k, "written", lane=int(lanes[first[inverse[k]]]),
                             note=" in the same statement (another value)")
        unchanged = _same_bits(new, old)
        found = self._block_conflict(cells, blocks, unchanged) if self.blocks else None
        found = found or self._lane_conflict(cells, lanes, epochs, unchanged)
        if found is None:
            self._note("w", u, first, counts, cells, lanes, blocks, epochs)
        return found

    def _block_conflict(self, cells: np.ndarray, blocks: np.ndarray, unchanged: np.ndarray) -> _Conflict | None:
        wb, rb = self.w_block[cells], self.r_block[cells]
        bad_w = (wb != NONE) & (wb != blocks) & ~unchanged
        bad_r = (rb != NONE) & (rb != blocks)
        for bad, action, who in ((bad_w, "written", wb), (bad_r, "read", rb)):
            if bad.any():
                k = int(np.argmax(bad))
                return _Conflict(k, action, block=None if who[k] == SEVERAL else int(who[k]), several="blocks")
        return None

    def _lane_conflict(self, cells: np.ndarray, lanes: np.ndarray, epochs: np.ndarray,
                       unchanged: np.ndarray) -> _Conflict | None:
        w, r = self.w_lane[cells], self.r_lane[cells]
        bad_w = (w != NONE) & (w != lanes) & (self.w_epoch[cells] == epochs) & ~unchanged
        bad_r = (r != NONE) & (r != lanes) & (self.r_epoch[cells] == epochs)
        for bad, action, who in ((bad_w, "written", w), (bad_r, "read", r)):
            if bad.any():
                k = int(np.argmax(bad))
                return _Conflict(k, action, lane=None if who[k] == SEVERAL else int(who[k]))
        return None


# ** expressions **

def _truncdiv(x: Any, y: Any) -> Any:
    """C's division: rounds toward zero (integers by zero: 0, as the generated code)."""
    if np.asarray(x).dtype.kind == "f":
        return np.trunc(np.true_divide(x, y))
    q, r = np.floor_divide(x, y), np.remainder(x, y)
    return np.where((r != 0) & ((np.asarray(x) < 0) != (np.asarray(y) < 0)), q + 1, q)


def _c_pow(x, y):
    """C's pow, as the GPU computes it (libdevice, jitop's vector math): numpy's power of an array takes
    x ** 0.5 as sqrt, which differs at -0.0 and -inf."""
    x, y = np.broadcast_arrays(np.asarray(x), np.asarray(y))
    out = np.power(x, y)
    half = (y == 0.5) & ((x == 0) | np.isneginf(x))
    out[half] = np.abs(x[half])
    return out


_BINARY: dict[Op, Callable] = {
    Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.true_divide,
    Op.FLOORDIV: np.floor_divide, Op.FLOORMOD: np.remainder, Op.TRUNCDIV: _truncdiv, Op.TRUNCMOD: np.fmod,
    Op.MIN: np.minimum, Op.MAX: np.maximum, Op.AND: np.bitwise_and, Op.OR: np.bitwise_or, Op.XOR: np.bitwise_xor,
    Op.SHL: np.left_shift, Op.SHR: np.right_shift, Op.EQ: np.equal, Op.NE: np.not_equal, Op.LT: np.less,
    Op.LE: np.less_equal, Op.GT: np.greater, Op.GE: np.greater_equal,
}
_UNARY: dict[Op, Callable] = {Op.NEG: np.negative, Op.NOT: np.logical_not, Op.INVERT: np.invert}
_CALLS: dict[str, Callable] = {
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2, "log10": np.log10,
    "log1p": np.log1p, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "sin": np.sin, "cos": np.cos,
    "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
    "tanh": np.tanh, "erf": np.vectorize(math.erf, otypes=[np.float64]), "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "cbrt": np.cbrt, "pow": _c_pow, "atan2": np.arctan2, "hypot": np.hypot, "copysign": np.copysign,
    "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "rint": np.rint, "fabs": np.fabs, "abs": np.abs,
    "fmod": np.fmod, "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite, "ipow": np.power,
}


def _typed(v: Any, dt: DType) -> np.ndarray:
    """`v` as an array of `dt` (numpy scalars and 0-d results become 0-d arrays)."""
    a = np.asarray(v)
    return a if a.dtype == dt.np else a.astype(dt.np)


def _cast(x: np.ndarray, dt: DType) -> np.ndarray:
    """numpy's astype; to bool: `x != 0` (NaN is True)."""
    return np.asarray(x != 0) if dt.is_bool else _typed(x, dt)


@functools.lru_cache(maxsize=None)
def _reads_memory(e: Expr) -> bool:
    return any(n.op is Op.LOAD for n in walk(e))


class _Eval:
    """Evaluates expressions over the active lanes; loads go to `memory(e, ctx, memo)`."""

    def __init__(self, load: Callable[[Expr, _Ctx, dict], np.ndarray], calls: Counter | None = None):
        self.load, self.calls = load, calls

    @staticmethod
    def standalone(e: Expr, env: dict) -> np.ndarray:
        """An expression over symbols alone (a launch dimension, a symbolic shape)."""
        return _Eval(_no_memory).value(e, _Ctx(np.arange(1), env), {})

    def value(self, e: Expr, ctx: _Ctx, memo: dict) -> np.ndarray:
        """The value of `e` for the active lanes: a 0-d array (the same for all) or one element per lane."""
        if e in memo:
            return memo[e]
        out = self._compute(e, ctx, memo)
        memo[e] = out
        return out

    def _compute(self, e: Expr, ctx: _Ctx, memo: dict) -> np.ndarray:
        op = e.op
        if op is Op.CONST:
            return np.asarray(e.value, dtype=e.dtype.np)
        if op is Op.VAR:
            if e not in ctx.env:
                raise GpuSimError(f"variable '{e.name}' has no value here (a loop of another kernel?)")
            return ctx.env[e]
        if op is Op.LOAD:
            return self.load(e, ctx, memo)
        if op is Op.SELECT:
            return self._select(e, ctx, memo)
        if op is Op.CALL:
            return self._call(e, ctx, memo)
        args = [self.value(x, ctx, memo) for x in e.src]
        if op is Op.CAST:
            return _cast(args[0], e.dtype)
        if op in _UNARY:
            return _typed(_UNARY[op](args[0]), e.dtype)
        if op in BINARY:
            return _typed(_BINARY[op](args[0], args[1]), e.dtype)
        raise NotImplementedError(f"the GPU simulator cannot evaluate {op.name} nodes ({e!r})")

    def _select(self, e: Expr, ctx: _Ctx, memo: dict) -> np.ndarray:
        """select / if_then_else: when a side reads memory only the chosen side's loads happen (as on the GPU)."""
        cond = self.value(e.src[0], ctx, memo)
        if np.ndim(cond) == 0:
            return self.value(e.src[1] if cond else e.src[2], ctx, memo)
        if not (_reads_memory(e.src[1]) or _reads_memory(e.src[2])):
            return _typed(np.where(cond, self.value(e.src[1], ctx, memo), self.value(e.src[2], ctx, memo)), e.dtype)
        out = np.empty(len(cond), dtype=e.dtype.np)
        for mask, side in ((cond, e.src[1]), (~cond, e.src[2])):
            if mask.any():
                sub = ctx.where(mask)
                out[mask] = self.value(side, sub, {})
        return out

    def _call(self, e: Expr, ctx: _Ctx, memo: dict) -> np.ndarray:
        name = e.arg
        if name.startswith("cuda."):
            raise NotImplementedError(f"'{name}' is a tensor-core marker (jitop.codegen.mma): the GPU simulator "
                                      "does not simulate mma nests (a warp-wide operation, not per-thread code)")
        if name.startswith(RAISE_IF):  # the call's error where an active thread's `bad` holds, as the GPU's flag
            if np.any(self.value(e.src[1], ctx, memo)):
                raise flagged_error(name, [name[len(RAISE_IF):]], 1)
            return self.value(e.src[0], ctx, memo)
        if name == "ipow" and e.src[1].dtype.is_signed and np.any(self.value(e.src[1], ctx, memo) < 0):
            raise flagged_error(name, [NEGATIVE_POWER], 1)
        if name not in _CALLS:
            raise NotImplementedError(f"the GPU simulator has no numpy version of the intrinsic '{name}'")
        if self.calls is not None:
            self.calls[name] += len(ctx.lanes)
        return _typed(_CALLS[name](*(self.value(x, ctx, memo) for x in e.src)), e.dtype)


def _no_memory(e: Expr, ctx: _Ctx, memo: dict) -> np.ndarray:
    raise GpuSimError(f"a launch dimension or a shape reads memory: {e!r}")


# ** statements **

class _Chunk:
    """Runs a kernel nest for the blocks of one chunk, all their threads in lockstep."""

    def __init__(self, geo: _Geometry, memory: dict, trackers: dict, env: dict, calls: Counter | None = None):
        self.geo, self.memory, self.symbols = geo, memory, env
        self.trackers = dict(trackers)  # the launch's, for global memory; the chunk's shared ones join them
        self.block_of = np.arange(geo.lanes) // geo.threads   # each lane's block within the chunk
        self.glane = np.arange(geo.lanes) + geo.first * geo.threads
        self.index = {k: geo.index(k) for k in BLOCK_KINDS + THREAD_KINDS}
        self.epoch = np.zeros(geo.blocks, dtype=np.int64)     # barriers each block has passed
        self.shared: dict[Buffer, np.ndarray] = {}           # [block, element]
        self.local: dict[Buffer, np.ndarray] = {}            # [lane, element]
        self.shapes: dict[Buffer, tuple[int, ...]] = {}
        self.eval = _Eval(self._load, calls)

    def stmt(self, s: Stmt, ctx: _Ctx) -> None:
        if not len(ctx.lanes):
            return
        if isinstance(s, Seq):
            for x in s.stmts:
                self.stmt(x, ctx)
        elif isinstance(s, For):
            self._loop(s, ctx)
        elif isinstance(s, IfThenElse):
            self._branch(s, ctx)
        elif isinstance(s, Store):
            self._store(s, ctx)
        elif isinstance(s, Allocate):
            self._allocate(s, ctx)
        elif isinstance(s, Barrier):
            self._barrier(ctx, "barrier()", sync=True)
        elif isinstance(s, ThreadReduce):
            self._thread_reduce(s, ctx)
        else:
            raise NotImplementedError(f"the GPU simulator cannot run {type(s).__name__}")

    def _loop(self, s: For, ctx: _Ctx) -> None:
        extent = self.eval.value(s.extent, ctx, {})
        if s.kind.is_gpu_index:
            idx = self.index[s.kind][ctx.lanes].astype(s.var.dtype.np)
            inner = ctx.bind(s.var, idx)
            return self.stmt(s.body, inner.where(idx < extent))
        if s.kind is ForKind.PARALLEL:
            raise GpuSimError(f"loop '{s.var.name}' is parallel, a CPU annotation (the GPU back end refuses it)")
        if np.ndim(extent) == 1 and not (extent == extent[0]).all():  # a trip count per thread
            for k in range(int(extent.max())):
                here = ctx.where(k < extent)
                self.stmt(s.body, here.bind(s.var, np.asarray(k, dtype=s.var.dtype.np)))
            return None
        for k in range(int(np.ravel(extent)[0])):
            self.stmt(s.body, ctx.bind(s.var, np.asarray(k, dtype=s.var.dtype.np)))
        return None

    def _branch(self, s: IfThenElse, ctx: _Ctx) -> None:
        cond = self.eval.value(s.cond, ctx, {})
        if np.ndim(cond) == 0:
            chosen = s.then if cond else s.else_
            if chosen is not None:
                self.stmt(chosen, ctx)
            return
        self.stmt(s.then, ctx.where(cond))
        if s.else_ is not None:
            self.stmt(s.else_, ctx.where(~cond))

    def _allocate(self, s: Allocate, ctx: _Ctx) -> None:
        """Fresh (poisoned) memory for the threads entering the allocation: per block, or per thread."""
        buf = s.buffer
        size = math.prod(self._shape(buf))
        if buf.scope == "shared":
            mem = self.shared.setdefault(buf, _poison(buf.dtype, (self.geo.blocks, size)))
            mem[np.unique(self.block_of[ctx.lanes])] = _poison_value(buf.dtype)
            if buf not in self.trackers:
                self.trackers[buf] = _Tracker(buf, mem.size, across_blocks=False)
        elif buf.scope == "local":
            mem = self.local.setdefault(buf, _poison(buf.dtype, (self.geo.lanes, size)))
            mem[ctx.lanes] = _poison_value(buf.dtype)
        else:
            raise GpuSimError(f"buffer '{buf.name}' is allocated ({buf.scope}) inside a GPU kernel; the GPU back end "
                              "refuses it (a workspace must enclose the kernels)")
        self.stmt(s.body, ctx)

    def _barrier(self, ctx: _Ctx, what: str, sync: bool) -> None:
        """Every thread of a block present, or none; `sync`: the blocks present start a new barrier interval."""
        counts = np.bincount(self.block_of[ctx.lanes], minlength=self.geo.blocks)
        partial = (counts > 0) & (counts < self.geo.threads)
        if partial.any():
            b = int(np.argmax(partial))
            first = int(ctx.lanes[np.argmax(self.block_of[ctx.lanes] == b)])
            raise DivergenceError(f"{what} reached by {counts[b]} of the {self.geo.threads} threads of block "
                                  f"{_coords(self.geo.first + b, self.geo.grid)} (one is "
                                  f"{self.geo.who(self.glane[first])}); every thread of a block must reach it: is it "
                                  "under a guard or in a loop that depends on threadIdx?")
        if sync:
            self.epoch[counts > 0] += 1

    # ** memory **
    def _shape(self, buf: Buffer) -> tuple[int, ...]:
        if buf not in self.shapes:
            self.shapes[buf] = _dims(buf, self.symbols)
        return self.shapes[buf]

    def _cells(self, buf: Buffer, indices: tuple[Expr, ...], ctx: _Ctx, memo: dict, what: str) -> np.ndarray:
        """The flat element number each active lane accesses; OutOfBoundsError for an index outside the shape."""
        dims = self._shape(buf)
        n = len(ctx.lanes)
        idx = [np.broadcast_to(self.eval.value(i, ctx, memo).astype(np.int64, copy=False), (n,)) for i in indices]
        bad = np.zeros(n, dtype=bool)
        for i, d in zip(idx, dims):
            bad |= (i < 0) | (i >= d)
        if bad.any():
            k = int(np.argmax(bad))
            raise OutOfBoundsError(f"{what} {buf.name}[{', '.join(str(int(i[k])) for i in idx)}] out of bounds of "
                                   f"its shape {list(dims)} ({buf.scope}) by {self.geo.who(self.glane[ctx.lanes[k]])}")
        flat = np.zeros(n, dtype=np.int64)
        for i, d in zip(idx, dims):
            flat = flat * d + i
        return flat

    def _place(self, buf: Buffer, flat: np.ndarray, lanes: np.ndarray) -> tuple[np.ndarray, Any]:
        """The array holding the buffer's elements and the positions of the accessed ones in it."""
        if buf.scope == "shared":
            return self._allocated(self.shared, buf), (self.block_of[lanes], flat)
        if buf.scope == "local":
            return self._allocated(self.local, buf), (lanes, flat)
        return self.memory[buf], flat

    @staticmethod
    def _allocated(where: dict, buf: Buffer) -> np.ndarray:
        if buf not in where:
            raise GpuSimError(f"buffer '{buf.name}' ({buf.scope}) is used outside its allocation")
        return where[buf]

    def _track(self, buf: Buffer, flat: np.ndarray, lanes: np.ndarray, new: np.ndarray | None = None,
               old: np.ndarray | None = None) -> None:
        """Check and record an access for races: a read, or the write of `new` over `old`."""
        tracker = self.trackers.get(buf)
        if tracker is None:
            return
        blocks = self.block_of[lanes]
        cells = blocks * math.prod(self.shapes[buf]) + flat if buf.scope == "shared" else flat
        who = (cells, self.glane[lanes], blocks + self.geo.first, self.epoch[blocks])
        found = tracker.read(*who) if new is None else tracker.write(*who, new, old)
        if found is not None:
            self._race(buf, flat, lanes, new is not None, found)

    def _race(self, buf: Buffer, flat: np.ndarray, lanes: np.ndarray, write: bool, c: _Conflict) -> None:
        index = [int(i) for i in np.unravel_index(int(flat[c.position]), self.shapes[buf])]
        me = self.glane[lanes[c.position]]
        if c.lane is not None:
            other, across = self.geo.who(c.lane), c.lane // self.geo.threads != me // self.geo.threads
        elif c.block is not None:
            other, across = f"block {_coords(c.block, self.geo.grid)}", True
        else:
            other, across = f"several {c.several}", c.several == "blocks"
        why = "blocks of one launch never synchronise" if across else "no barrier() between them"
        raise RaceError(f"data race on {buf.scope} buffer '{buf.name}' at {buf.name}{index}: "
                        f"{'written' if write else 'read'} by {self.geo.who(me)}, and {c.action} by {other}{c.note} "
                        f"({why})")

    def _load(self, e: Expr, ctx: _Ctx, memo: dict) -> np.ndarray:
        buf = e.arg
        flat = self._cells(buf, e.src, ctx, memo, "read of")
        mem, at = self._place(buf, flat, ctx.lanes)
        self._track(buf, flat, ctx.lanes)
        return mem[at]

    def _store(self, s: Store, ctx: _Ctx) -> None:
        memo: dict = {}
        value = _typed(self.eval.value(s.value, ctx, memo), s.buffer.dtype)
        flat = self._cells(s.buffer, s.indices, ctx, memo, "write to")
        mem, at = self._place(s.buffer, flat, ctx.lanes)
        value = np.broadcast_to(value, flat.shape)
        self._track(s.buffer, flat, ctx.lanes, value, mem[at])
        mem[at] = value

    # ** cross-thread reduction **
    def _thread_reduce(self, s: ThreadReduce, ctx: _Ctx) -> None:
        """Every thread gets its reduction's combined buffer[0] (the threads along s.kind, the other indices
        fixed): butterflies among the lanes one warp holds (where their stride is a power of two under a warp),
        then those groups in order."""
        axis = THREAD_KINDS.index(s.kind)
        block = self.geo.block
        stride = math.prod(block[:axis])
        in_warp = min(s.extent, WARP // stride) if stride < WARP and stride & (stride - 1) == 0 else 1
        sync = s.extent > in_warp  # the emitted code passes barriers only when the reduction spans several warps
        self._barrier(ctx, f"thread_reduce of '{s.buffer.name}'", sync=sync)
        if block[axis] != s.extent or s.extent & (s.extent - 1):
            raise GpuSimError(f"'{s.buffer.name}' is reduced across {s.extent} threads of {s.kind.value}, but the "
                              f"block is {block}: the GPU back end reduces a power-of-two threadIdx axis, the whole "
                              "of it")
        mem = self._allocated(self.local, s.buffer)
        # lanes in linear order: [rest, groups, in-warp, stride]
        v = mem[ctx.lanes, 0].reshape(-1, s.extent // in_warp, in_warp, stride)
        a, b = var("a", s.buffer.dtype), var("b", s.buffer.dtype)
        combine = s.reducer.combine(a, b)

        def both(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return self.eval.value(combine, _Ctx(ctx.lanes, {a: x, b: y}), {})

        lane = np.arange(in_warp)
        offset = in_warp // 2
        while offset:
            v = both(v, v[:, :, lane ^ offset, :])
            offset //= 2
        total = v[:, 0, 0, :]
        for g in range(1, v.shape[1]):
            total = both(total, v[:, g, 0, :])
        mem[ctx.lanes, 0] = np.broadcast_to(total[:, None, :], (total.shape[0], s.extent, stride)).reshape(-1)
