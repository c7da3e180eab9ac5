"""Loop IR -> PTX for NVIDIA GPUs (llvmlite's NVPTX backend).

A lowered function becomes one GPU kernel per top-level loop nest. Loops bound to blockIdx.* / threadIdx.*
(`Stage.bind`) are not loops here: their variable is the block's or thread's index, and their extents make the
launch's grid and block. Shared-memory buffers are `addrspace(3)` globals of the kernel, per-thread (local)
buffers are allocas that LLVM keeps in registers when their indices are constant, `barrier()` is
`__syncthreads()`. The other loops run serially in each thread (unrolled and vectorized ones are unrolled).
Global intermediates of the function are workspaces the runtime allocates and passes like arguments.

Every access is proved in bounds or checked: a checked access that fails sets the module's error flag (read
by the runtime after the launches) instead of touching memory.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from llvmlite import ir

from jitop.codegen import libdevice, mma, ops
from jitop.codegen.emitter import LoopEmitter, ident
from jitop.codegen.kernel import NEGATIVE_POWER, RAISE_IF, top_level_nests
from jitop.dtypes import DType
from jitop.errors import ScheduleError
from jitop.te.expr import Expr, Op, const, var
from jitop.te.printer import expr_str
from jitop.target import CUDA_TRIPLE, CudaTarget
from jitop.tir.nodes import (Allocate, Barrier, Buffer, For, ForKind, IfThenElse, PrimFunc, Seq, Stmt, Store,
                             ThreadReduce, walk_stmts)
from jitop.tir.passes import guards_off_barriers
from jitop.tir.simplify import prove, simplify, to_lin
from jitop.tir.structure import shape_of

I32, I64 = ir.IntType(32), ir.IntType(64)
GLOBAL, SHARED, CONSTANT = 1, 3, 4  # NVPTX address spaces
MAX_UNROLL = 64        # unrolled/vectorized loops longer than this run as loops
MAX_SERIAL_WORK = 1 << 12  # a kernel with no bound loop may run this many iterations on one thread
ALLOC_ALIGN = 16       # bytes every array given to a GPU kernel is aligned to (cuMemAlloc gives 256; checked)
AXES = ("x", "y", "z")
_SREG = {"blockIdx": "ctaid", "threadIdx": "tid"}


class _BFloat(ir.Type):
    """LLVM's bfloat, which llvmlite's IR types lack: only the element of the bf16x2 conversion's result."""

    def _to_string(self) -> str:
        return "bfloat"


BF16X2 = ir.VectorType(_BFloat(), 2)


def pack_bf16x2(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> ir.Value:
    """float32 values lo, hi rounded to bfloat16 (to nearest even) in one .b32 register (an i32), lo in bits 15:0
    and hi in bits 31:16: `cvt.rn.bf16x2.f32 d, hi, lo` (the PTX ISA: d[31:16] = cvt(a), d[15:0] = cvt(b)). An mma's
    bf16x2 register holds elements 2j, 2j + 1 as (lo, hi), "low to high" in the ISA's fragment tables."""
    fn = ops.declare_intrinsic(b.module, "llvm.nvvm.ff2bf16x2.rn", [],
                               ir.FunctionType(BF16X2, [ir.FloatType(), ir.FloatType()]))
    return b.bitcast(b.call(fn, [hi, lo]), I32)


@dataclass(frozen=True)
class Launch:
    """One kernel of a GPU function: its PTX entry name and launch shape. Dims are ints, or the printed
    expressions of the function's symbols (`(n + 255) // 256`) the runtime evaluates per call."""

    name: str
    grid: tuple[int | str, int | str, int | str]
    block: tuple[int | str, int | str, int | str]
    shared_bytes: int
    # the kernel's array arguments: positions in the function's buffers (its parameters, then its workspaces);
    # None: all of them, in that order (what GPU functions built before kernels were shared take)
    args: tuple[int, ...] | None = None

    def to_json(self) -> dict:
        d = {"name": self.name, "grid": list(self.grid), "block": list(self.block), "shared_bytes": self.shared_bytes}
        return d if self.args is None else {**d, "args": list(self.args)}

    @staticmethod
    def from_json(d: dict) -> "Launch":
        args = d.get("args")
        return Launch(d["name"], tuple(d["grid"]), tuple(d["block"]), int(d["shared_bytes"]),
                      None if args is None else tuple(int(a) for a in args))

    def pointers(self, buffers: Sequence[int]) -> list[int]:
        """The kernel's array arguments taken from the pointers of every buffer of the function."""
        return list(buffers) if self.args is None else [buffers[a] for a in self.args]


@dataclass(frozen=True)
class GpuBuild:
    """What the GPU runtime needs of a compiled function: the PTX, its kernels in launch order, the workspace
    buffers (name, dtype, shape) passed after the parameters, and the accesses checked at run time."""

    ptx: str
    ll: str
    kernels: tuple[Launch, ...]
    workspaces: tuple[tuple[str, str, tuple[int | str, ...]], ...]
    checked: tuple[str, ...] = ()
    error_symbol: str = ""


def build_ptx(func: PrimFunc, symbol: str, target: CudaTarget) -> GpuBuild:
    """Compile a lowered function with GPU-bound loops to PTX for `target`, in this process
    (jitop.codegen.ptx_shares builds a large function's kernels in several).

    >>> from jitop import te
    >>> import jitop
    >>> A = te.placeholder((1000,), name="A")
    >>> B = te.compute((1000,), lambda i: A[i] * 2.0, name="B")
    >>> s = jitop.create_schedule(B)
    >>> bx, tx = s[B].split(B.op.axis[0], factor=128)
    >>> s[B].bind(bx, te.thread_axis("blockIdx.x")); s[B].bind(tx, te.thread_axis("threadIdx.x"))
    >>> out = build_ptx(jitop.lower(s, [A, B]), "k", CudaTarget())
    >>> out.kernels[0].grid, out.kernels[0].block, ".target sm_90" in out.ptx
    ((8, 1, 1), (128, 1, 1), True)
    """
    return build_planned(plan_kernels(func), symbol, target)


def build_planned(plan: "KernelPlan", symbol: str, target: CudaTarget) -> GpuBuild:
    """`build_ptx` of a function whose kernels are planned already."""
    share = emit_share(plan, range(plan.n_kernels), symbol, target)
    return finish_build(plan, [share], symbol, _emit_ptx(share.ll, target), share.ll)


@dataclass
class KernelPlan:
    """Which kernel each nest of a GPU function launches, before any is emitted: a nest with the structure of an
    earlier one (jitop.tir.structure) launches that one's kernel on its own buffers. `firsts[u]`: the nest that
    emits kernel u; `kernel_of[i]`: nest i's kernel; `touched[i]`: the function buffers nest i touches, in the
    order its structure names them (nests of one kernel pass theirs in place of each other's)."""

    func: PrimFunc
    nests: list[Stmt]
    buffers: list[Buffer]      # the function's parameters, then its workspaces
    workspaces: list[Buffer]
    firsts: list[int]
    kernel_of: list[int]
    touched: list[list[Buffer]]

    @property
    def n_kernels(self) -> int:
        return len(self.firsts)


def plan_kernels(func: PrimFunc) -> KernelPlan:
    """The KernelPlan of a lowered GPU function (its nests as `kernel_nests` gives them)."""
    nests = kernel_nests(func)
    _, workspaces = _peel_workspaces(func.body)
    buffers = list(func.params) + workspaces
    known = set(buffers)
    firsts, kernel_of, touched, by_key = [], [], [], {}
    for i, nest in enumerate(nests):
        key, named = shape_of(nest, func.symbols, func.attrs.get("ranges", {}))
        touched.append([b for b in named if b in known])
        if key not in by_key:
            by_key[key] = len(firsts)
            firsts.append(i)
        kernel_of.append(by_key[key])
    return KernelPlan(func, nests, buffers, workspaces, firsts, kernel_of, touched)


@dataclass
class Share:
    """Kernels of a GPU function emitted into one LLVM module (`ll`): each one's launch (its arguments: positions
    in the function's buffers) and entries of `checked` (the accesses checked at run time, and the values numpy
    refuses; the error flag's codes count from the share's base), the position of each checked access's buffer
    among the function's (none for a shared or local tile), and whether the module sets the error flag."""

    kernels: list[int]
    ll: str
    launches: list[Launch]
    spans: list[range]
    checked: list[str]
    accessed: dict[int, int]
    flagged: bool

    def to_json(self) -> dict:
        return {"kernels": self.kernels, "ll": self.ll, "launches": [x.to_json() for x in self.launches],
                "spans": [[r.start, r.stop] for r in self.spans], "checked": self.checked,
                "accessed": [[k, b] for k, b in self.accessed.items()], "flagged": self.flagged}

    @staticmethod
    def from_json(d: dict) -> "Share":
        return Share([int(k) for k in d["kernels"]], str(d["ll"]), [Launch.from_json(x) for x in d["launches"]],
                     [range(int(a), int(b)) for a, b in d["spans"]], [str(c) for c in d["checked"]],
                     {int(k): int(b) for k, b in d["accessed"]}, bool(d["flagged"]))


def emit_share(plan: KernelPlan, kernels: Sequence[int], symbol: str, target: CudaTarget,
               error_base: str | None = None) -> Share:
    """Emit `kernels` of `plan` into a module of their own. `error_base`: None for a module that is the whole
    function (it defines the error flag); else the name of the constant the error codes count from (another
    module defines it, and the flag)."""
    module = ir.Module(name=symbol)
    module.triple = CUDA_TRIPLE
    func = plan.func
    emitter = _Emitter(module, symbol, func.symbols, func.attrs.get("ranges", {}), target, error_base)
    position = {b: k for k, b in enumerate(plan.buffers)}
    launches, spans = [], []
    for u in kernels:
        i = plan.firsts[u]
        params = sorted(plan.touched[i], key=position.__getitem__)
        start = len(emitter.checked)
        launch = emitter.kernel(f"{symbol}_k{u}", plan.nests[i], params)
        launches.append(dataclasses.replace(launch, args=tuple(position[b] for b in params)))
        spans.append(range(start, len(emitter.checked)))
    _libm_through_libdevice(module)
    # (the accesses of the function's buffers: only those can be another launch's)
    accessed = {k: position[b] for k, b in emitter.accessed.items() if b in position}
    return Share(list(kernels), str(module), launches, spans, emitter.checked, accessed, emitter.error is not None)


def finish_build(plan: KernelPlan, shares: list[Share], symbol: str, ptx: str, ll: str) -> GpuBuild:
    """The GpuBuild of `plan` from its kernels' `shares` (in kernel order; the error codes of each count from the
    entries of those before it) and the PTX of their modules linked."""
    checked: list[str] = []
    emitted: dict[int, tuple[Launch, range]] = {}
    accessed: dict[int, Buffer] = {}
    for share in shares:
        base = len(checked)
        checked += share.checked
        accessed.update({base + k: plan.buffers[b] for k, b in share.accessed.items()})
        for u, launch, span in zip(share.kernels, share.launches, share.spans):
            emitted[u] = (launch, range(base + span.start, base + span.stop))
    launches = _launches(plan, emitted)
    _name_every_launch(plan, emitted, checked, accessed)
    shapes = tuple((b.name, b.dtype.np.name, tuple(_printed(d) for d in b.shape)) for b in plan.workspaces)
    flagged = any(share.flagged for share in shares)
    return GpuBuild(ptx, ll, tuple(launches), shapes, tuple(checked), error_flag_name(symbol) if flagged else "")


def error_flag_name(symbol: str) -> str:
    """The global a function's kernels set when a checked access fails (0: none did)."""
    return f"{symbol}_error"


def _launches(plan: KernelPlan, emitted: dict[int, tuple[Launch, range]]) -> list[Launch]:
    """A Launch per nest: its kernel's, on the nest's own buffers."""
    position = {b: k for k, b in enumerate(plan.buffers)}
    launches = []
    for i, u in enumerate(plan.kernel_of):
        first = emitted[u][0]
        if plan.firsts[u] == i:
            launches.append(first)
            continue
        # touched[i][j] plays the part of the first nest's touched[j]
        part = {b: j for j, b in enumerate(plan.touched[plan.firsts[u]])}
        args = tuple(position[plan.touched[i][part[plan.buffers[a]]]] for a in first.args)
        launches.append(dataclasses.replace(first, args=args))
    return launches


def _name_every_launch(plan: KernelPlan, emitted: dict[int, tuple[Launch, range]], checked: list[str],
                       accessed: dict[int, Buffer]) -> None:
    """A checked access of a kernel launched on several nests' buffers names them all: the error flag says which
    access failed, not in which launch."""
    also: dict[tuple[int, Buffer], list[Buffer]] = {}  # (kernel, buffer) -> the buffers later launches pass
    for i, u in enumerate(plan.kernel_of):
        if plan.firsts[u] != i:
            for mine, theirs in zip(plan.touched[i], plan.touched[plan.firsts[u]]):
                if mine is not theirs:
                    also.setdefault((u, theirs), []).append(mine)
    for u, (_, span) in emitted.items():
        for k in span:
            others = also.get((u, accessed.get(k)))
            if others:
                names = ", ".join(dict.fromkeys(b.name for b in others))
                checked[k] += f" (or the same access to {names}: one kernel launched on each)"


def kernel_nests(func: PrimFunc) -> list[Stmt]:
    """The kernels of a lowered GPU function, in launch order, exactly as the emitter receives them: the
    top-level loop nests of its body (global allocations peeled off: they are workspaces), empty sequences
    skipped, each with its guards moved off its barriers (`guards_off_barriers`).

    >>> from jitop import te
    >>> import jitop
    >>> A = te.placeholder((100,), name="A")
    >>> B = te.compute((100,), lambda i: A[i] + 1.0, name="B")
    >>> C = te.compute((100,), lambda i: B[i] * 2.0, name="C")
    >>> s = jitop.create_schedule(C)
    >>> for T in (B, C):
    ...     bx, tx = s[T].split(T.op.axis[0], factor=64)
    ...     s[T].bind(bx, te.thread_axis("blockIdx.x")); s[T].bind(tx, te.thread_axis("threadIdx.x"))
    >>> [type(nest).__name__ for nest in kernel_nests(jitop.lower(s, [A, C]))]
    ['For', 'For']
    """
    body, _ = _peel_workspaces(func.body)
    return [guards_off_barriers(nest) for nest in top_level_nests(body)
            if not (isinstance(nest, Seq) and not nest.stmts)]


def _peel_workspaces(body: Stmt) -> tuple[Stmt, list[Buffer]]:
    """The function's body without its global allocations (the runtime allocates them), and those buffers."""
    found = []
    while isinstance(body, Allocate) and body.buffer.scope == "global":
        found.append(body.buffer)
        body = body.body
    return body, found


def _printed(d: int | Expr) -> int | str:
    if isinstance(d, int):
        return d
    return int(d.value) if d.op is Op.CONST else expr_str(d)


# ** launch shape: the extents of the bound loops **

def launch_dims(nest: Stmt, ranges: dict) -> dict[ForKind, Expr]:
    """Each bound GPU index of a kernel -> its launch extent (the largest loop bound to it). ScheduleError for
    a kernel that binds nothing yet loops a lot, or binds one index to extents no launch can cover."""
    extents: dict[ForKind, list[Expr]] = {}
    for s in walk_stmts(nest):
        if isinstance(s, For) and s.kind.is_gpu_index:
            extents.setdefault(s.kind, []).append(s.extent)
    out = {}
    for kind, found in extents.items():
        consts = [int(e.value) for e in found if e.op is Op.CONST]
        symbolic = list(dict.fromkeys(e for e in found if e.op is not Op.CONST))
        if len(symbolic) > 1 or (symbolic and consts and prove(symbolic[0] >= max(consts), ranges) is not True):
            raise ScheduleError(f"loops bound to {kind.value} have extents {', '.join(map(expr_str, found))}; a "
                                f"kernel launches one {kind.value} range, so bind it to loops of one extent")
        out[kind] = symbolic[0] if symbolic else const(max(consts))
    if not out:
        work = _serial_work(nest)
        if work is None or work > MAX_SERIAL_WORK:
            what = "a symbolic number of" if work is None else f"{work}"
            raise ScheduleError(f"a loop nest of this GPU function binds no loop to blockIdx/threadIdx, so one GPU "
                                f"thread would run {what} iterations alone; split its outer loop and bind the "
                                "parts: s[T].bind(outer, te.thread_axis('blockIdx.x')), s[T].bind(inner, "
                                "te.thread_axis('threadIdx.x'))")
    return out


def _serial_work(s: Stmt) -> int | None:
    if isinstance(s, For):
        inner = _serial_work(s.body)
        return None if inner is None or s.extent.op is not Op.CONST else int(s.extent.value) * inner
    if isinstance(s, Seq):
        parts = [_serial_work(x) for x in s.stmts]
        return None if None in parts else sum(parts)
    if isinstance(s, IfThenElse):
        return _serial_work(s.then)
    if isinstance(s, Allocate):
        return _serial_work(s.body)
    return 1


def _check_block(dims: dict[ForKind, Expr], target: CudaTarget) -> None:
    threads = 1
    for kind in (ForKind.THREAD_X, ForKind.THREAD_Y, ForKind.THREAD_Z):
        e = dims.get(kind)
        if e is None:
            continue
        if e.op is not Op.CONST:
            raise ScheduleError(f"the loop bound to {kind.value} has the symbolic extent {expr_str(e)}; a block's "
                                "size must be a constant: split the loop by a constant factor and bind the inner part")
        threads *= int(e.value)
    if threads > target.max_threads_per_block:
        raise ScheduleError(f"a block of {threads} threads exceeds the {target.max_threads_per_block} threads per "
                            f"block of {target.arch}; bind smaller loops to threadIdx (split by a smaller factor)")


# ** code generation **

@dataclass
class _Kernel:
    fn: ir.Function
    builder: ir.IRBuilder
    entry: ir.Block
    env: dict = field(default_factory=dict)
    ptrs: dict = field(default_factory=dict)
    dims: dict = field(default_factory=dict)
    shared_bytes: int = 0
    lane: Expr | None = None  # the variable of the innermost enclosing loop bound to threadIdx.x
    globals_made: int = 0     # shared-memory globals of this kernel so far (their names: kernel, buffer, count)

    def next_global(self) -> int:
        self.globals_made += 1
        return self.globals_made - 1


class _Emitter(LoopEmitter):
    """Builds kernels into one module; each kernel takes the buffers it is given (global pointers) and every
    symbol."""

    def __init__(self, module: ir.Module, symbol: str, symbols: tuple[Expr, ...], ranges: dict, target: CudaTarget,
                 error_base: str | None = None):
        """`error_base`: see `emit_share`."""
        super().__init__(module, symbol, ranges)
        self.symbols, self.ranges, self.target = symbols, ranges, target
        self.error_base = error_base
        self.error: ir.GlobalVariable | None = None
        self.k: _Kernel | None = None
        self.accessed: dict[int, Buffer] = {}  # entry of `checked` -> the buffer of its checked access

    def _check_entry(self, what: str, buf: Buffer, indices: tuple[Expr, ...]) -> int:
        code = super()._check_entry(what, buf, indices)
        self.accessed[code - 1] = buf
        return code

    @property
    def b(self) -> ir.IRBuilder:
        return self.k.builder

    @property
    def env(self) -> dict[Expr, ir.Value]:
        return self.k.env

    def kernel(self, name: str, nest: Stmt, buffers: list[Buffer]) -> Launch:
        """Emit the nest as kernel `name` taking `buffers` (every function buffer it touches) then the symbols."""
        dims = launch_dims(nest, self.ranges)
        _check_block(dims, self.target)
        params = [ir.PointerType(addrspace=GLOBAL)] * len(buffers) + [I64] * len(self.symbols)
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), params), name)
        fn.calling_convention = "ptx_kernel"
        entry = fn.append_basic_block("entry")
        body = fn.append_basic_block("body")
        self.k = _Kernel(fn, ir.IRBuilder(body), entry, dims=dims)
        for buf, arg in zip(buffers, fn.args):
            arg.name = ident(buf.name)
            arg.add_attribute("noalias")  # with LLVM's inferred readonly: loads through the read-only data cache
            arg.attributes.align = ALLOC_ALIGN  # so adjacent accesses can merge into vector loads and stores
            self.k.ptrs[buf] = arg
        for v, arg in zip(self.symbols, fn.args[len(buffers):]):
            arg.name = ident(v.name)
            self.k.env[v] = arg
        self.stmt(nest)
        self.b.ret_void()
        ir.IRBuilder(entry).branch(body)
        if self.k.shared_bytes > self.target.shared_per_block:
            raise ScheduleError(f"kernel {name} needs {self.k.shared_bytes} bytes of shared memory, more than the "
                                f"{self.target.shared_per_block} a block of {self.target.arch} may use; make the "
                                "shared tiles smaller (a smaller split factor at the compute_at loop)")
        grid = tuple(_printed(dims.get(ForKind(f"blockIdx.{a}"), const(1))) for a in AXES)
        block = tuple(_printed(dims.get(ForKind(f"threadIdx.{a}"), const(1))) for a in AXES)
        return Launch(name, grid, block, self.k.shared_bytes)

    # ** statements **
    def backend_stmt(self, s: Stmt) -> None:
        if isinstance(s, Barrier):
            self._barrier()
        elif isinstance(s, ThreadReduce):
            self.thread_reduce(s)
        else:
            raise TypeError(f"cannot generate GPU code for {type(s).__name__}")

    def _barrier(self) -> None:
        fn = ops.declare_intrinsic(self.module, "llvm.nvvm.barrier0", [], ir.FunctionType(ir.VoidType(), []))
        self.b.call(fn, [])

    # ** cross-thread reduction: butterfly shuffles within a warp, then the warps' results through shared memory **
    def thread_reduce(self, s: ThreadReduce) -> None:
        """Combine buffer[0] of the `extent` threads along threadIdx.x, y or z (the others' indices fixed). The
        threads of one reduction are `stride` apart in the block's linear order (the block's size below the
        axis): where that is a power of two under a warp, the lanes one warp holds combine by butterfly
        shuffles first; what spans several warps goes through shared memory, read back by every thread."""
        axis = AXES.index(s.kind.value[-1])
        block = [self.k.dims.get(ForKind(f"threadIdx.{a}"), const(1)) for a in AXES]
        if block[axis] != const(s.extent):
            raise ScheduleError(f"'{s.buffer.name}' is reduced across {s.extent} threads of {s.kind.value}, but the "
                                f"block has {expr_str(block[axis])} along {AXES[axis]}: bind loops of equal extents")
        sizes = [int(d.value) for d in block]
        threads, stride = math.prod(sizes), math.prod(sizes[:axis])
        in_warp = min(s.extent, 32 // stride) if stride < 32 and stride & (stride - 1) == 0 else 1
        mask = 0xFFFFFFFF if threads >= 32 else (1 << threads) - 1
        b, dt = self.b, s.buffer.dtype
        at = (const(0),)
        self._memo = {}
        value = self.expr(s.buffer.load(at))
        offset = in_warp // 2
        while offset:
            value = self._combine(s.reducer, dt, value, self._shuffle(value, dt, offset * stride, mask))
            offset //= 2
        if s.extent > in_warp:
            value = self._across_warps(s, dt, value, sizes, axis, in_warp)
        b.store(ops.to_memory(b, dt, value), self._address(s.buffer, at))
        self._memo = {}

    def _across_warps(self, s: ThreadReduce, dt: DType, value: ir.Value, sizes: list[int], axis: int,
                      in_warp: int) -> ir.Value:
        """The first thread of each in-warp group writes the group's value to shared memory (slot: the thread's
        linear index with its axis index divided by `in_warp`); each thread combines its reduction's groups in
        order."""
        b, elem = self.b, ops.memory_type(dt)
        threads, stride, groups = math.prod(sizes), math.prod(sizes[:axis]), s.extent // in_warp
        scratch = ir.GlobalVariable(self.module, ir.ArrayType(elem, threads // in_warp),
                                    f"{self.k.fn.name}.reduce.{self.k.next_global()}", addrspace=SHARED)
        scratch.linkage, scratch.align = "internal", 16
        scratch.type = ir.PointerType(addrspace=SHARED)
        self.k.shared_bytes += threads // in_warp * dt.itemsize
        tid = [b.zext(self._sreg("tid", a), I64) for a in AXES]
        linear = b.add(tid[0], b.mul(ir.Constant(I64, sizes[0]), b.add(tid[1], b.mul(ir.Constant(I64, sizes[1]),
                                                                                       tid[2]))))
        low = b.urem(linear, ir.Constant(I64, stride))
        # the slot of group g of this thread's reduction
        first = b.add(low, b.mul(b.udiv(linear, ir.Constant(I64, stride * s.extent)),
                                 ir.Constant(I64, stride * groups)))

        def slot(group: ir.Value) -> ir.Value:
            return b.gep(scratch, [b.add(first, b.mul(group, ir.Constant(I64, stride)))], source_etype=elem)
        mine = b.udiv(tid[axis], ir.Constant(I64, in_warp))
        with b.if_then(b.icmp_unsigned("==", b.urem(tid[axis], ir.Constant(I64, in_warp)), ir.Constant(I64, 0))):
            b.store(ops.to_memory(b, dt, value), slot(mine))
        self._barrier()
        total = None
        for g in range(groups):
            part = ops.from_memory(b, dt, b.load(slot(ir.Constant(I64, g)), typ=elem))
            total = part if total is None else self._combine(s.reducer, dt, total, part)
        self._barrier()  # the scratch is free again for the next reduction
        return total

    def _combine(self, reducer, dt: DType, x: ir.Value, y: ir.Value) -> ir.Value:
        a, c = var("a", dt), var("b", dt)
        self.k.env[a], self.k.env[c] = x, y
        out = self.expr(reducer.combine(a, c))
        del self.k.env[a], self.k.env[c]
        return out

    def _sreg(self, prefix: str, axis: str) -> ir.Value:
        name = f"llvm.nvvm.read.ptx.sreg.{prefix}.{axis}"
        fn = self.module.globals.get(name) or ir.Function(self.module, ir.FunctionType(I32, []), name)
        return self.b.call(fn, [])

    def _shuffle(self, value: ir.Value, dt: DType, offset: int, mask: int) -> ir.Value:
        """The value of the lane `offset` apart (lane ^ offset), through 32-bit shuffles."""
        b = self.b
        if dt.bits == 64:
            bits = b.bitcast(value, I64) if dt.is_float else value
            lo = self._shuffle32(b.trunc(bits, I32), offset, mask)
            hi = self._shuffle32(b.trunc(b.lshr(bits, ir.Constant(I64, 32)), I32), offset, mask)
            out = b.or_(b.zext(lo, I64), b.shl(b.zext(hi, I64), ir.Constant(I64, 32)))
            return b.bitcast(out, value.type) if dt.is_float else out
        if dt.is_float:
            as_int = b.bitcast(value, ir.IntType(dt.bits))
            return b.bitcast(self._narrow(self._shuffle32(self._widen(as_int), offset, mask), dt.bits), value.type)
        width = value.type.width
        return self._narrow(self._shuffle32(self._widen(value), offset, mask), width)

    def _widen(self, v: ir.Value) -> ir.Value:
        return v if v.type.width == 32 else self.b.zext(v, I32)

    def _narrow(self, v: ir.Value, width: int) -> ir.Value:
        return v if width == 32 else self.b.trunc(v, ir.IntType(width))

    def _shuffle32(self, v: ir.Value, offset: int, mask: int) -> ir.Value:
        fn = ops.declare_intrinsic(self.module, "llvm.nvvm.shfl.sync.bfly.i32", [],
                                   ir.FunctionType(I32, [I32, I32, I32, I32]))
        return self.b.call(fn, [ir.Constant(I32, mask), v, ir.Constant(I32, offset), ir.Constant(I32, 0x1F)])

    def allocate(self, s: Allocate) -> None:
        buf = s.buffer
        if buf.symbolic:
            raise ScheduleError(f"buffer '{buf.name}' ({buf.scope}) has the symbolic shape {list(buf.shape)}; GPU "
                                "tiles must have constant sizes: compute_at an inner loop of constant extent")
        elem = ops.memory_type(buf.dtype)
        if buf.scope == "shared" and buf in self.k.ptrs:
            pass  # a copy of the same tile in a partitioned loop's tail: they never live at once, so they share
        elif buf.scope == "shared":
            g = ir.GlobalVariable(self.module, ir.ArrayType(elem, max(buf.size, 1)),
                                  f"{self.k.fn.name}.{ident(buf.name)}.{self.k.next_global()}", addrspace=SHARED)
            g.linkage = "internal"
            g.align = 16
            g.type = ir.PointerType(addrspace=SHARED)  # an opaque pointer like every other buffer's
            self.k.shared_bytes += max(buf.size, 1) * buf.dtype.itemsize
            self.k.ptrs[buf] = g
        elif buf.scope == "local":
            ptr = ir.IRBuilder(self.k.entry).alloca(ir.ArrayType(elem, max(buf.size, 1)), name=ident(buf.name))
            ptr.align = 16
            ptr.type = ir.PointerType()
            self.k.ptrs[buf] = ptr
        else:
            raise ScheduleError(f"buffer '{buf.name}' is allocated ({buf.scope}) inside a GPU kernel; compute its "
                                "stage at root (a workspace) or give it a 'local'/'shared' scope")
        self.stmt(s.body)

    def loop(self, s: For) -> None:
        if s.kind.is_gpu_index:
            return self._bound(s)
        if s.kind is ForKind.PARALLEL:
            raise ScheduleError(f"loop '{s.var.name}' is marked parallel, a CPU annotation; on a GPU bind it to "
                                "blockIdx/threadIdx instead")
        if mma.is_marked(s) and self._tensor_core(s):
            return None
        if s.kind in (ForKind.UNROLLED, ForKind.VECTORIZED) and s.extent.op is Op.CONST \
                and int(s.extent.value) <= MAX_UNROLL:
            return self._unrolled(s, int(s.extent.value))
        self._serial(s.var, ir.Constant(I64, 0), self.expr(s.extent), lambda: self.stmt(s.body))

    def _bound(self, s: For) -> None:
        """A loop bound to a GPU index: its variable is that index; iterations past its extent do nothing."""
        prefix, axis = s.kind.value.split(".")
        index = self.b.zext(self._sreg(_SREG[prefix], axis), I64, name=ident(s.var.name))
        self.k.env[s.var] = index
        launched = self.k.dims[s.kind]
        outer_lane, full = self.k.lane, s.extent is launched or s.extent == launched
        if s.kind is ForKind.THREAD_X:
            self.k.lane = s.var if full else None  # a guarded lane loop leaves lanes out: no mma under it
        if full:
            self.stmt(s.body)
        else:
            if any(isinstance(x, Barrier) for x in walk_stmts(s.body)):
                raise ScheduleError(f"loop '{s.var.name}' is bound to {s.kind.value} over {expr_str(s.extent)} "
                                    f"threads, but the kernel launches {expr_str(launched)}; a barrier inside it "
                                    "would wait for threads that never arrive: bind loops of equal extents")
            guard = s.var < s.extent
            with self.b.if_then(self.expr(guard)):
                self._under(guard, True, lambda: self.stmt(s.body))
        self.k.lane = outer_lane
        del self.k.env[s.var]

    # ** tensor cores: a marked per-lane nest becomes one warp-wide mma.sync (jitop.codegen.mma) **
    def _tensor_core(self, s: For) -> bool:
        """Emit `s` as one mma if it is an mma nest (True); False for a loop above one (emitted as usual)."""
        nest = mma.match_nest(s)
        if nest is None:
            if isinstance(s.body, (For, Seq, Allocate, IfThenElse)):
                return False
            raise ScheduleError(f"loop '{s.var.name}' combines with a tensor-core marker ({', '.join(mma.BY_MARKER)}) "
                                "but is not an mma nest (k loop of the mode's k, then the 4 accumulators, then the "
                                "update): schedule it as topi.cuda_mma")
        self._check_warp(s)
        b = self.b
        a_elems, b_elems, accs = mma.operands(nest, self.k.lane)
        pack = mma.MODES[nest.mode].pack
        regs = [self._register([self.expr(simplify(e, self.ranges)) for e in elems[j:j + pack]])
                for elems in (a_elems, b_elems) for j in range(0, len(elems), pack)]
        acc_ptrs = [self._address(nest.acc, idx) for idx in accs]
        elem = ops.memory_type(nest.acc.dtype)
        c = [b.load(p, typ=elem) for p in acc_ptrs]
        result = ir.LiteralStructType([elem] * mma.C_ELEMS)
        fn = ops.declare_intrinsic(self.module, mma.intrinsic(nest.k, nest.mode), [],
                                   ir.FunctionType(result, [I32] * len(regs) + [elem] * mma.C_ELEMS))
        d = b.call(fn, [*regs, *c])
        for i, ptr in enumerate(acc_ptrs):
            b.store(b.extract_value(d, i), ptr)
        return True

    def _register(self, values: list[ir.Value]) -> ir.Value:
        """One .b32 operand register of float32 values already rounded to the operand type: a TF32 value's bits,
        or a pair (lo, hi) of BF16 values (`pack_bf16x2`: exact)."""
        return self.b.bitcast(values[0], I32) if len(values) == 1 else pack_bf16x2(self.b, *values)

    def _round_operand(self, mode: str, x: ir.Value) -> ir.Value:
        """float32 -> the float32 holding the nearest TF32 (cvt.rna.tf32.f32: the value's bits, low 13 zero) or
        bfloat16 value (`pack_bf16x2` of (0, x): bf16(x) in the high half, zeros below)."""
        if mode == "bf16":
            return self.b.bitcast(pack_bf16x2(self.b, ir.Constant(ir.FloatType(), 0.0), x), ir.FloatType())
        fn = ops.declare_intrinsic(self.module, "llvm.nvvm.f2tf32.rna", [], ir.FunctionType(I32, [ir.FloatType()]))
        return self.b.bitcast(self.b.call(fn, [x]), ir.FloatType())

    def _check_warp(self, s: For) -> None:
        """An mma needs the 32 lanes of a warp along threadIdx.x, all of them present (no guard on a lane)."""
        x = self.k.dims.get(ForKind.THREAD_X)
        if self.k.lane is None or x is None or x != const(mma.WARP):
            raise ScheduleError(f"the mma at loop '{s.var.name}' needs blocks of exactly {mma.WARP} threads along "
                                "threadIdx.x (a warp's lanes), with the accumulators' loop nest bound to them")

    # ** memory **
    def _address(self, buf: Buffer, indices: tuple[Expr, ...]) -> ir.Value:
        return self._pointer(buf, self.flat_index(buf, indices))

    def _pointer(self, buf: Buffer, flat: Expr) -> ir.Value:
        return self.b.gep(self.k.ptrs[buf], [self.expr(flat)], source_etype=ops.memory_type(buf.dtype))

    def _alignment(self, buf: Buffer, flat: Expr) -> int:
        """The bytes the address of buf[flat] (a simplified flat index) is a multiple of (at most ALLOC_ALIGN,
        every buffer's base alignment), from the index's linear form: the largest power of two dividing each
        coefficient and the constant (an unrolled lane's constant offset included). Stated on the access, it lets
        LLVM merge neighbouring accesses into vector ones where its own inference loses track (an index through a
        loop variable that is a rotated loop's phi)."""
        lin = to_lin(flat, self.ranges, self.bounds.memo)  # the prover's ranges: its memo holds for them
        step = functools.reduce(math.gcd, [*lin.terms.values(), lin.const], ALLOC_ALIGN // buf.dtype.itemsize or 1)
        return min(ALLOC_ALIGN, (step & -step) * buf.dtype.itemsize)

    def _check(self, buf: Buffer, indices: tuple[Expr, ...], what: str) -> ir.Value | None:
        """None when the access is proved in bounds; else i1 'in bounds', with the error flag set when not."""
        if self.bounds.proves(buf, indices):
            return None
        b, ok = self.b, ir.Constant(ir.IntType(1), 1)
        for idx, dim in zip(indices, buf.shape):
            v = self.expr(idx)
            d = ir.Constant(I64, dim) if isinstance(dim, int) else self.expr(dim)
            ok = b.and_(ok, b.and_(b.icmp_signed(">=", v, ir.Constant(I64, 0)), b.icmp_signed("<", v, d)))
        code = self._check_entry(what, buf, indices)
        with b.if_then(b.not_(ok), likely=False):
            self._set_error_flag(code)
        return ok

    def _set_error_flag(self, code: int) -> None:
        """Store error code `code` (counted from the module's error base, if it has one) in the error flag."""
        if self.error is None:
            self.error = ir.GlobalVariable(self.module, I32, error_flag_name(self.symbol), addrspace=GLOBAL)
            if self.error_base is None:
                self.error.initializer = ir.Constant(I32, 0)  # else a declaration: another module defines it
        value = ir.Constant(I32, code)
        if self.error_base is not None:
            base = self.module.globals.get(self.error_base)
            if base is None:
                base = ir.GlobalVariable(self.module, I32, self.error_base, addrspace=CONSTANT)
                base.global_constant = True
            value = self.b.add(self.b.load(base), value)
        self.b.store(value, self.error)

    def load(self, e: Expr) -> ir.Value:
        buf, b = e.arg, self.b
        elem = ops.memory_type(buf.dtype)
        ok = self._check(buf, e.src, "read of")
        if ok is None:
            flat = self.flat_index(buf, e.src)
            value = b.load(self._pointer(buf, flat), typ=elem, align=self._alignment(buf, flat))
            return ops.from_memory(b, buf.dtype, value)
        value = self._load_or_zero(ok, lambda: self._address(buf, e.src), elem)
        self._memo = {}  # values made inside the branch (the address) do not dominate what follows
        return ops.from_memory(b, buf.dtype, value)

    def store(self, s: Store) -> None:
        value = self._stored_value(s)
        ok = self._check(s.buffer, s.indices, "write to")
        if ok is None:
            flat = self.flat_index(s.buffer, s.indices)
            self.b.store(ops.to_memory(self.b, s.buffer.dtype, value), self._pointer(s.buffer, flat),
                         align=self._alignment(s.buffer, flat))
            return
        with self.b.if_then(ok):
            self.b.store(ops.to_memory(self.b, s.buffer.dtype, value), self._address(s.buffer, s.indices))

    # ** expressions (scalar: one thread computes one element) **
    def _var(self, e: Expr) -> ir.Value:
        if e not in self.k.env:
            raise ScheduleError(f"variable '{e.name}' has no value in this GPU kernel (a loop of another kernel?)")
        return self.k.env[e]

    def _call(self, e: Expr) -> ir.Value:
        from jitop.codegen.math import emit_call
        if e.arg in mma.ROUNDINGS:
            return self._round_operand(mma.ROUNDINGS[e.arg].name, self.expr(e.src[0]))
        if e.arg in mma.BY_MARKER:
            raise ScheduleError(f"{e.arg} outside an mma nest: a tensor-core update must be the innermost "
                                "loops (k, then the 4 accumulators) of a schedule like topi.cuda_mma's")
        if e.arg.startswith(RAISE_IF):
            # call("raise_if:<Type>: <message>", value, bad): the value; the call raises where bad holds
            self._flag_if(self.expr(e.src[1]), e.arg[len(RAISE_IF):])
            return self.expr(e.src[0])
        args = self._operands(e.src)
        if e.arg == "ipow" and e.src[1].dtype.is_signed:  # numpy refuses a negative integer exponent
            self._flag_if(self.b.icmp_signed("<", args[1], ir.Constant(args[1].type, 0)), NEGATIVE_POWER)
        return emit_call(self.b, e.arg, e.src[0].dtype, args, avx512=False)

    def _flag_if(self, bad: ir.Value, message: str) -> None:
        """Set the error flag to `message`'s entry of `checked` where `bad` holds (the call raises it)."""
        code = self._value_error_code(message)
        with self.b.if_then(bad, likely=False):
            self._set_error_flag(code)


# ** PTX **

@functools.cache
def _machine(arch: str, features: str, opt: int):
    import llvmlite.binding as llvm
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm.Target.from_triple(CUDA_TRIPLE).create_target_machine(cpu=arch, features=features,
                                                                     opt=min(max(opt, 0), 3))


def _libm_through_libdevice(module: ir.Module) -> None:
    """Give each C math function the module declares (jitop.codegen.math's per-lane fallbacks: float64 pow,
    erf) a body calling libdevice's version, which `_emit_ptx` links in; where there is no libdevice they stay
    declarations (and `_emit_ptx` names them in its error)."""
    if libdevice.bitcode() is None:
        return
    for fn in [g for g in module.globals.values() if isinstance(g, ir.Function) and g.is_declaration]:
        nv_name = libdevice.wrapper_name(fn.name)
        if nv_name is None:
            continue
        nv = module.globals.get(nv_name) or ir.Function(module, fn.function_type, nv_name)
        fn.linkage = "internal"
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.ret(b.call(nv, fn.args))


def _link_libdevice(mod: Any) -> None:
    """Link libdevice into the parsed module `mod` when it calls __nv_ functions; libdevice's functions become
    internal, so the optimiser keeps only what the kernels call."""
    import llvmlite.binding as llvm
    if not any(f.is_declaration and f.name.startswith("__nv_") for f in mod.functions):
        return
    lib = llvm.parse_bitcode(libdevice.bitcode())
    lib.triple, lib.data_layout = mod.triple, mod.data_layout
    mod.link_in(lib)
    for f in mod.functions:
        if f.name.startswith("__nv_") and not f.is_declaration:
            f.linkage = llvm.Linkage.internal


def _emit_ptx(ll: str, target: CudaTarget) -> str:
    """Parse, verify and optimise the module for `target` (libdevice linked in where it calls libdevice), then
    print its PTX. A call to a function no GPU library defines (a C math routine where there is no libdevice) is
    a NotImplementedError naming it, before ptxas would fail on it."""
    from jitop.codegen.target import _llvm_lock
    with _llvm_lock:
        return _target_machine(target).emit_assembly(optimised_ptx_module(ll, target))


def optimised_ptx_module(ll: str, target: CudaTarget) -> Any:
    """The module `ll` (one share of a function's kernels) parsed and optimised as `_emit_ptx` does, for
    `linked_ptx`."""
    from jitop.codegen.target import _llvm_lock
    with _llvm_lock:
        mod = _parsed(ll, target)
        _optimise(mod, target)
        return mod


def linked_ptx(modules: Sequence[Any], definitions: str, internal: Sequence[str], target: CudaTarget) -> str:
    """The PTX of optimised modules (`optimised_ptx_module`) linked in order with `definitions` (LLVM IR of what
    they declare; the globals named `internal` are made internal once linked). The code generator folds a load
    of a constant the definitions give into the instruction that uses it (a run's error base into its codes)."""
    from jitop.codegen.target import _llvm_lock
    with _llvm_lock:
        mod, *others = modules
        for other in [*others, _parsed(definitions, target)]:
            mod.link_in(other)
        for name in internal:
            mod.get_global_variable(name).linkage = "internal"
        return _target_machine(target).emit_assembly(mod)


def _target_machine(target: CudaTarget) -> Any:
    return _machine(target.arch, target.ptx_features, target.opt_level)


def _parsed(ll: str, target: CudaTarget) -> Any:
    import llvmlite.binding as llvm
    mod = llvm.parse_assembly(ll)
    mod.verify()
    mod.data_layout = str(_target_machine(target).target_data)
    return mod


def _optimise(mod: Any, target: CudaTarget) -> None:
    import llvmlite.binding as llvm
    _link_libdevice(mod)
    pto = llvm.create_pipeline_tuning_options(speed_level=min(max(target.opt_level, 0), 3))
    pb = llvm.create_pass_builder(_target_machine(target), pto)
    pb.getModulePassManager().run(mod, pb)
    missing = [f.name for f in mod.functions if f.is_declaration and not f.name.startswith("llvm.")]
    if missing:
        hint = "" if libdevice.bitcode() is not None or not any(map(libdevice.wrapper_name, missing)) else \
            " (NVIDIA's libdevice defines them: pip install nvidia-nvvm, or set JITOP_LIBDEVICE to libdevice.10.bc)"
        raise NotImplementedError(f"GPU code would call {', '.join(missing)}, which no GPU library here "
                                  f"defines; this operation has no GPU code generator yet{hint}")


# ** offline check: NVIDIA's assembler, where installed (the `nvidia-cuda-nvcc` wheel: jitop[cuda-test]) **

def ptxas_path() -> str | None:
    """Where `ptxas` is: on PATH, or in the `nvidia-cuda-nvcc` wheel's folder; None when neither has it."""
    import os
    import shutil
    found = shutil.which("ptxas")
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        return None
    for base in getattr(nvidia, "__path__", []):
        for sub in ("cu13", "cu12", "cuda_nvcc"):
            path = os.path.join(base, sub, "bin", "ptxas")
            if os.access(path, os.X_OK):
                return path
    return None


def check_ptx(ptx: str, arch: str = "sm_90") -> str:
    """Assemble `ptx` for `arch` with ptxas (no GPU needed) and return its report (registers, spills, shared
    memory per kernel); RuntimeError with ptxas's messages when it refuses the code, FileNotFoundError when
    ptxas is not installed (`pip install nvidia-cuda-nvcc`)."""
    import os
    import subprocess
    import tempfile
    exe = ptxas_path()
    if exe is None:
        raise FileNotFoundError("ptxas not found: pip install nvidia-cuda-nvcc (or jitop[cuda-test])")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        done = subprocess.run([exe, f"-arch={arch}", "-v", src, "-o", os.path.join(tmp, "kernel.cubin")],
                              capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"ptxas -arch={arch} refused the PTX:\n{done.stderr.strip()}")
    return done.stderr
