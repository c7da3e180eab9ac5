"""Runs jitop's GPU kernels as LLVM IR on this CPU, one OS thread per GPU thread: the module the NVPTX back end
turns into PTX (`GpuBuild.ll`, as jitop.codegen.nvptx emitted it), executed where no GPU is.

tests/gpu_sim.py runs the loop IR the emitter receives; this runs what the emitter made of it: its index
arithmetic and flat offsets, checked accesses and error codes, shared-memory globals, barriers, warp shuffles, the
tensor cores' operand rounding and register fragments, and how a split build's modules link.

How: the module's text is compiled for this CPU with the NVVM intrinsics (`llvm.nvvm.*`) renamed to functions of
a small runtime module built here with llvmlite.ir, and libdevice's `__nv_<f>` to the C library's `<f>`. A
launch starts one pthread per thread of a block; each runs the kernel for every block in turn, with a barrier
between blocks, so blocks run one after another and one copy of each shared-memory global serves them all.
`barrier0` waits on the block's barrier. A warp's shuffle or mma exchanges registers through the warp's scratch
words between two waits on the warp's barrier. The mma's fragments are the PTX ISA's tables ("Matrix Fragments
for mma.m16n8k8" .tf32, "for mma.m16n8k16 with floating point type" .bf16; k4 and bf16 k8 are their first
halves), written here apart from jitop.codegen.mma's maps: a lane's element of A, B or C/D, with g = lane >> 2,
t = lane % 4 and p elements per register (1 tf32, 2 bf16; the lower index in the low half):
A (row-major 16 x k) register r half h: (g + 8 (r & 1), p t + h + 4 p (r >> 1)); B (k x 8) register r half h:
(p t + h + 4 p r, g); C/D element i: (g + 8 (i >> 1), 2 t + (i & 1)).

Not modelled: blocks at once (no jitop kernel waits for another block), memory orders weaker than the barriers
give, the tensor cores' order of accumulation (products of the rounded operands are exact; they are added to the
accumulator in k order in float32). A barrier or shuffle some threads of a block never reach (undefined on a
GPU; the emitter refuses such schedules) leaves the launch stuck: after LAUNCH_TIMEOUT_S it raises TimeoutError.
"""
from __future__ import annotations

import ctypes
import functools
import os
import re
import time

import llvmlite.binding as llvm
from llvmlite import ir

from jitop.codegen import mma
from jitop.codegen.nvptx import BF16X2

I32, I64, F32, PTR, VOID = ir.IntType(32), ir.IntType(64), ir.FloatType(), ir.PointerType(), ir.VoidType()
SREGS = [f"{reg}.{axis}" for reg in ("tid", "ctaid", "ntid", "nctaid") for axis in "xyz"]
CTAID = SREGS.index("ctaid.x")
WARP = 32
SLOT_WORDS = 8        # i32 words a lane puts in its warp's scratch per exchange (an mma's A and B: at most 6)
BARRIER_BYTES = 64    # room for a pthread_barrier_t (32 bytes on x86-64 glibc)
STACK_BYTES = 1 << 20  # per emulated thread


LAUNCH_TIMEOUT_S = 300  # a launch whose threads are not all done by then is stuck (its threads are left waiting)
_STUCK: list = []       # what stuck launches' threads still use


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class ThreadState(ctypes.Structure):
    """One emulated thread: its special registers (SREGS order), lane, warp and the launch it belongs to."""
    _fields_ = [("sreg", ctypes.c_int32 * len(SREGS)), ("lane", ctypes.c_int32), ("warp", ctypes.c_int32),
                ("launch", ctypes.c_void_p)]


class LaunchState(ctypes.Structure):
    """What every thread of a launch shares: the kernel (its index among the program's), its `void**` parameters,
    the blocks to run, the block's barrier, one barrier per warp (BARRIER_BYTES apart) and the warps' scratch words."""
    _fields_ = [("kernel", ctypes.c_int64), ("params", ctypes.c_void_p), ("blocks", ctypes.c_int64),
                ("block_barrier", ctypes.c_void_p), ("warp_barriers", ctypes.c_void_p), ("scratch", ctypes.c_void_p)]


STATE = ir.LiteralStructType([ir.ArrayType(I32, len(SREGS)), I32, I32, PTR])
LAUNCH = ir.LiteralStructType([I64, PTR, I64, PTR, PTR, PTR])


# ** the runtime module: what the renamed intrinsics call **

class _Runtime:
    """Builds the runtime module's functions (each a small IR body over the calling thread's state)."""

    def __init__(self, defines_key: bool):
        self.m = ir.Module("nvvm_emulator")
        self.m.triple = llvm.get_process_triple()
        self.key = ir.GlobalVariable(self.m, I32, "emu_key")  # else declared: the shared runtime's
        if defines_key:
            self.key.initializer = ir.Constant(I32, 0)
        self.getspecific = self.declare("pthread_getspecific", PTR, [I32])
        self.setspecific = self.declare("pthread_setspecific", I32, [I32, PTR])
        self.wait = self.declare("pthread_barrier_wait", I32, [PTR])

    def declare(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        return ir.Function(self.m, ir.FunctionType(ret, args), name)

    def define(self, name: str, ret: ir.Type, args: list[ir.Type], body) -> None:
        """`name` returning body(builder, *arguments)."""
        fn = ir.Function(self.m, ir.FunctionType(ret, args), name)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        result = body(b, *fn.args)
        b.ret_void() if ret is VOID else b.ret(result)

    # ** the calling thread **
    def state(self, b: ir.IRBuilder) -> ir.Value:
        return b.call(self.getspecific, [b.load(self.key, typ=I32)])

    @staticmethod
    def field(b: ir.IRBuilder, ptr: ir.Value, struct: ir.Type, k: int) -> ir.Value:
        return b.gep(ptr, [ir.Constant(I32, 0), ir.Constant(I32, k)], source_etype=struct)

    def sreg(self, b: ir.IRBuilder, st: ir.Value, k: int) -> ir.Value:
        return b.gep(st, [ir.Constant(I32, 0), ir.Constant(I32, 0), ir.Constant(I32, k)], source_etype=STATE)

    def launch(self, b: ir.IRBuilder, st: ir.Value, k: int) -> ir.Value:
        launch = b.load(self.field(b, st, STATE, 3), typ=PTR)
        return b.load(self.field(b, launch, LAUNCH, k), typ=LAUNCH.elements[k])

    def warp_sync(self, b: ir.IRBuilder, st: ir.Value) -> None:
        warp = b.zext(b.load(self.field(b, st, STATE, 2), typ=I32), I64)
        at = b.gep(self.launch(b, st, 4), [b.mul(warp, ir.Constant(I64, BARRIER_BYTES))], source_etype=ir.IntType(8))
        b.call(self.wait, [at])

    def slot(self, b: ir.IRBuilder, st: ir.Value, lane: ir.Value) -> ir.Value:
        """The scratch words of `lane` (an i32) of the calling thread's warp."""
        warp = b.load(self.field(b, st, STATE, 2), typ=I32)
        index = b.mul(b.add(b.mul(warp, ir.Constant(I32, WARP)), lane), ir.Constant(I32, SLOT_WORDS))
        return b.gep(self.launch(b, st, 5), [b.zext(index, I64)], source_etype=I32)

    def word(self, b: ir.IRBuilder, slot: ir.Value, k: int) -> ir.Value:
        return b.gep(slot, [ir.Constant(I32, k)], source_etype=I32)


def _special_registers(rt: _Runtime) -> None:
    for k, name in enumerate(SREGS):
        rt.define(f"emu.nvvm.read.ptx.sreg.{name}", I32, [], lambda b, k=k: b.load(rt.sreg(b, rt.state(b), k), typ=I32))


def _barrier(rt: _Runtime) -> None:
    rt.define("emu.nvvm.barrier0", VOID, [], lambda b: b.call(rt.wait, [rt.launch(b, rt.state(b), 3)]))


def _shuffle(rt: _Runtime) -> None:
    """shfl.sync.bfly.i32(mask, value, lane mask, clamp): the value of lane ^ lane mask (the warp's 32 lanes)."""
    def body(b, mask, value, offset, clamp):
        st = rt.state(b)
        lane = b.load(rt.field(b, st, STATE, 1), typ=I32)
        b.store(value, rt.word(b, rt.slot(b, st, lane), 0))
        rt.warp_sync(b, st)
        got = b.load(rt.word(b, rt.slot(b, st, b.xor(lane, offset)), 0), typ=I32)
        rt.warp_sync(b, st)  # no lane writes its word again before every lane has read
        return got
    rt.define("emu.nvvm.shfl.sync.bfly.i32", I32, [I32] * 4, body)


def _roundings(rt: _Runtime) -> None:
    """cvt.rna.tf32.f32 (the float's bits, low 13 rounded off, ties away from zero; inf and NaN kept) and
    cvt.rn.bf16x2.f32 d, a, b (d's high half bf16(a), its low half bf16(b); to nearest even, NaN quieted)."""
    def tf32(b, x):
        bits = b.bitcast(x, I32)
        special = b.icmp_unsigned("==", b.and_(bits, ir.Constant(I32, 0x7F800000)), ir.Constant(I32, 0x7F800000))
        rounded = b.and_(b.add(bits, ir.Constant(I32, 0x1000)), ir.Constant(I32, 0xFFFFE000))
        return b.select(special, bits, rounded)

    def bf16(b, x):
        bits = b.bitcast(x, I32)
        nan = b.icmp_unsigned(">", b.and_(bits, ir.Constant(I32, 0x7FFFFFFF)), ir.Constant(I32, 0x7F800000))
        odd = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
        rounded = b.lshr(b.add(bits, b.add(ir.Constant(I32, 0x7FFF), odd)), ir.Constant(I32, 16))
        quiet = b.or_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 0x40))
        return b.and_(b.select(nan, quiet, rounded), ir.Constant(I32, 0xFFFF))

    rt.define("emu.nvvm.f2tf32.rna", I32, [F32], tf32)
    rt.define("emu.nvvm.ff2bf16x2.rn", BF16X2, [F32, F32],
              lambda b, hi, lo: b.bitcast(b.or_(b.shl(bf16(b, hi), ir.Constant(I32, 16)), bf16(b, lo)), BF16X2))
    # the C runtime's conversions, which this CPU's code generator calls for the bf16x2 values an optimised
    # kernel moves (compiler-rt's; this process's libgcc may lack them)
    bfloat = BF16X2.element
    rt.define("__truncsfbf2", bfloat, [F32], lambda b, x: b.bitcast(b.trunc(bf16(b, x), ir.IntType(16)), bfloat))
    rt.define("__extendbfsf2", F32, [bfloat], lambda b, x: b.bitcast(
        b.shl(b.zext(b.bitcast(x, ir.IntType(16)), I32), ir.Constant(I32, 16)), F32))


def _mma(rt: _Runtime, k: int, mode: str) -> None:
    """mma.sync.m16n8k`k`.row.col.f32.`mode`.`mode`.f32: each lane stores its A and B registers in its scratch
    words; after the warp's barrier each computes its four D elements from the lanes that hold their operands."""
    p = 1 if mode == "tf32" else 2
    na, nb = k // (2 * p), k // (4 * p)

    def operand(b, st, lane, word, half):
        bits = b.load(rt.word(b, rt.slot(b, st, lane), word), typ=I32)
        if p == 1:
            return b.bitcast(bits, F32)
        return b.bitcast(b.shl(bits, ir.Constant(I32, 16)) if half == 0 else
                         b.and_(bits, ir.Constant(I32, 0xFFFF0000)), F32)

    def body(b, *args):
        regs, acc = args[:na + nb], args[na + nb:]
        st = rt.state(b)
        lane = b.load(rt.field(b, st, STATE, 1), typ=I32)
        mine = rt.slot(b, st, lane)
        for w, reg in enumerate(regs):
            b.store(reg, rt.word(b, mine, w))
        rt.warp_sync(b, st)
        g4, t = b.and_(lane, ir.Constant(I32, ~3)), b.and_(lane, ir.Constant(I32, 3))
        out = ir.Constant(ir.LiteralStructType([F32] * 4), None)
        for i in range(4):
            row_half, col = i >> 1, b.add(b.mul(t, ir.Constant(I32, 2)), ir.Constant(I32, i & 1))
            total = acc[i]
            for kk in range(k):
                holder_t, half = (kk % (4 * p)) // p, kk % p
                a = operand(b, st, b.add(g4, ir.Constant(I32, holder_t)), 2 * (kk // (4 * p)) + row_half, half)
                b_lane = b.add(b.mul(col, ir.Constant(I32, 4)), ir.Constant(I32, holder_t))
                total = b.fadd(total, b.fmul(a, operand(b, st, b_lane, na + kk // (4 * p), half)))
            out = b.insert_value(out, total, i)
        rt.warp_sync(b, st)
        return out

    rt.define(f"emu.nvvm.mma.m16n8k{k}.row.col.{mode}", ir.LiteralStructType([F32] * 4),
              [I32] * (na + nb) + [F32] * 4, body)


def _worker(rt: _Runtime) -> None:
    """emu_worker(thread state): this thread's part of every block of the launch, blocks in order. It runs a
    block through `emu_entry(kernel, params)`, which the program's own module defines (`_entries`)."""
    entry = rt.declare("emu_entry", VOID, [I64, PTR])
    fn = ir.Function(rt.m, ir.FunctionType(PTR, [PTR]), "emu_worker")
    st = fn.args[0]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.call(rt.setspecific, [b.load(rt.key, typ=I32), st])
    kernel, params, blocks = (rt.launch(b, st, k) for k in range(3))
    nx, ny = (b.zext(b.load(rt.sreg(b, st, SREGS.index(f"nctaid.{a}")), typ=I32), I64) for a in "xy")
    pre, head, done = b.block, fn.append_basic_block("block"), fn.append_basic_block("done")
    b.cbranch(b.icmp_signed("<", ir.Constant(I64, 0), blocks), head, done)
    b.position_at_end(head)
    index = b.phi(I64)
    index.add_incoming(ir.Constant(I64, 0), pre)
    xyz = (b.urem(index, nx), b.urem(b.udiv(index, nx), ny), b.udiv(index, b.mul(nx, ny)))
    for axis, value in enumerate(xyz):
        b.store(b.trunc(value, I32), rt.sreg(b, st, CTAID + axis))
    b.call(entry, [kernel, params])
    b.call(rt.wait, [rt.launch(b, st, 3)])  # every thread is done with this block's shared memory
    following = b.add(index, ir.Constant(I64, 1))
    index.add_incoming(following, b.block)
    b.cbranch(b.icmp_signed("<", following, blocks), head, done)
    b.position_at_end(done)
    b.ret(ir.Constant(PTR, None))


@functools.cache
def _runtime() -> llvm.ExecutionEngine:
    """The functions the renamed intrinsics call, compiled once per process; their symbols (and the thread key
    `emu_key`) are given to LLVM's resolver, so every program's module finds them by name."""
    rt = _Runtime(defines_key=True)
    _special_registers(rt)
    _barrier(rt)
    _shuffle(rt)
    _roundings(rt)
    for mode, spec in mma.MODES.items():
        for k in spec.ks:
            _mma(rt, k, mode)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(rt.m)), _machine())
    engine.finalize_object()
    ctypes.c_uint32.from_address(engine.get_global_value_address("emu_key")).value = _thread_key()
    llvm.add_symbol("emu_key", engine.get_global_value_address("emu_key"))
    for fn in rt.m.functions:
        if not fn.is_declaration:
            llvm.add_symbol(fn.name, engine.get_function_address(fn.name))
    return engine


@functools.cache
def _worker_text() -> str:
    """Each program's own `emu_worker` (it calls that program's `emu_entry`)."""
    rt = _Runtime(defines_key=False)
    _worker(rt)
    return str(rt.m)


# ** a build's modules, compiled for this CPU **

# where each module of a split build's IR begins (jitop.codegen.ptx_shares): its runs', then their definitions
_MODULE_START = re.compile(r"(?m)^(?=; kernels \[|; what the modules declare)")


def cpu_modules(ll: str) -> list[str]:
    """The modules of a GPU build's IR (`GpuBuild.ll`: one, or a split build's), made compilable for this CPU:
    kernels with the C calling convention, NVVM intrinsics as the runtime's functions, libdevice as libm."""
    parts = [p for p in _MODULE_START.split(ll) if p.strip()]
    triple = f'target triple = "{llvm.get_process_triple()}"'
    out = []
    for text in parts:
        text = text.replace("define ptx_kernel ", "define ").replace('@"llvm.nvvm.', '@"emu.nvvm.')
        # a shared tile is the runtime's memory too (between barriers, other threads write it): not internal
        text = text.replace("= internal addrspace(3) global", "= addrspace(3) global")
        text = re.sub(r"(?m)^target triple = .*$", triple, _libdevice_as_libm(text))
        out.append(re.sub(r"(?m)^target datalayout = .*$", "", text))
    return out


def _libdevice_as_libm(text: str) -> str:
    """libdevice's `__nv_<f>` called as the C library's `<f>`; the module's own `<f>` (an internal wrapper of
    `__nv_<f>`: nvptx._libm_through_libdevice) is renamed out of its way."""
    for name in dict.fromkeys(re.findall(r'@"__nv_([^"]+)"', text)):
        text = text.replace(f'@"{name}"', f'@"emu.wrapper.{name}"').replace(f'@"__nv_{name}"', f'@"{name}"')
    return text


def _ir_type(text: str) -> ir.Type:
    """A kernel parameter's type from its LLVM spelling."""
    found = re.fullmatch(r"ptr(?: addrspace\((\d+)\))?", text)
    if found:
        return ir.PointerType(addrspace=int(found.group(1) or 0))
    if re.fullmatch(r"i\d+", text):
        return ir.IntType(int(text[1:]))
    return {"float": F32, "double": ir.DoubleType()}[text]


def _entries(module: llvm.ModuleRef, kernels: list[str]) -> str:
    """emu_entry(kernel index, void** params): calls that kernel with the values the parameters point at."""
    m = ir.Module("emu_entries")
    m.triple = llvm.get_process_triple()
    fn = ir.Function(m, ir.FunctionType(VOID, [I64, PTR]), "emu_entry")
    index, params = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    done = fn.append_basic_block("done")
    switch = b.switch(index, done)
    for k, name in enumerate(kernels):
        types = [_ir_type(str(a.type)) for a in module.get_function(name).arguments]
        kernel = ir.Function(m, ir.FunctionType(VOID, types), name)
        case = fn.append_basic_block(f"k{k}")
        switch.add_case(ir.Constant(I64, k), case)
        b.position_at_end(case)
        values = [b.load(b.load(b.gep(params, [ir.Constant(I64, j)], source_etype=PTR), typ=PTR), typ=t)
                  for j, t in enumerate(types)]
        b.call(kernel, values)
        b.branch(done)
    b.position_at_end(done)
    b.ret_void()
    return str(m)


def _machine() -> llvm.TargetMachine:
    """A machine for one execution engine (which owns it: freed with it)."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm.Target.from_default_triple().create_target_machine(opt=1)


def _check_resolved(module: llvm.ModuleRef) -> None:
    """Every function and global the module declares is this process's or the runtime's (MCJIT would leave a
    reference to a missing one as address 0): an NVVM intrinsic the runtime lacks is named here."""
    declared = [f.name for f in module.functions if f.is_declaration and not f.name.startswith("llvm.")]
    declared += [g.name for g in module.global_variables if g.is_declaration]
    missing = [name for name in declared if not llvm.address_of_symbol(name)]
    if missing:
        raise NotImplementedError(f"the emulated GPU has no {', '.join(missing)} (tests/nvvm_emulator.py)")


def _optimise(module: llvm.ModuleRef, level: int) -> None:
    """LLVM's O<level> pipeline for this CPU: it takes the emitted code at its word as the NVPTX optimiser does
    (noalias, alignment, nsw and nuw flags), so where a claim is false its code computes something else."""
    machine = _machine()
    module.data_layout = str(machine.target_data)
    options = llvm.create_pipeline_tuning_options(speed_level=level)
    options.loop_vectorization = options.slp_vectorization = level >= 2
    builder = llvm.create_pass_builder(machine, options)
    builder.getModulePassManager().run(module, builder)


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None)
    for name in ("pthread_create", "pthread_timedjoin_np", "pthread_barrier_init", "pthread_barrier_destroy",
                 "pthread_attr_init", "pthread_attr_setstacksize", "pthread_attr_destroy", "pthread_key_create"):
        getattr(libc, name).restype = ctypes.c_int
    libc.pthread_create.argtypes = [ctypes.c_void_p] * 4
    libc.pthread_timedjoin_np.argtypes = [ctypes.c_ulong, ctypes.c_void_p, ctypes.c_void_p]
    libc.pthread_barrier_init.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
    libc.pthread_attr_setstacksize.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


@functools.cache
def _thread_key() -> int:
    """The pthread key under which each emulated thread finds its ThreadState (one per process)."""
    key = ctypes.c_uint32()
    if _libc().pthread_key_create(ctypes.byref(key), None):
        raise OSError("pthread_key_create failed")
    return key.value


class Program:
    """A GPU build's kernels compiled for this CPU: `launch` runs one as cuLaunchKernel would.

    `ll`: the build's IR (GpuBuild.ll); `kernels`: the names of its kernels."""

    def __init__(self, ll: str, kernels: list[str], opt_level: int | None = None):
        _runtime()  # (LLVM's native target initialised before parsing)
        modules = [llvm.parse_assembly(text) for text in cpu_modules(ll)]
        module = modules[0]
        for other in modules[1:]:
            module.link_in(other)
        self.kernels = list(dict.fromkeys(kernels))
        module.link_in(llvm.parse_assembly(_entries(module, self.kernels)))
        module.link_in(llvm.parse_assembly(_worker_text()))
        module.verify()
        _check_resolved(module)
        level = int(os.environ.get("JITOP_EMULATED_OPT", "0")) if opt_level is None else opt_level
        if level:
            _optimise(module, level)
        self.engine = llvm.create_mcjit_compiler(module, _machine())
        self.engine.finalize_object()
        self.worker = self.engine.get_function_address("emu_worker")

    def global_address(self, name: str) -> int:
        return self.engine.get_global_value_address(name)

    def launch(self, name: str, grid: tuple[int, int, int], block: tuple[int, int, int], params: int) -> None:
        """Run kernel `name` over `grid` x `block` threads; `params`: the address of its `void**` parameters."""
        threads, blocks = block[0] * block[1] * block[2], grid[0] * grid[1] * grid[2]
        if not threads or not blocks:
            return
        libc, warps = _libc(), -(-threads // WARP)
        barriers = ctypes.create_string_buffer(BARRIER_BYTES * (warps + 1))  # the block's, then each warp's
        base = ctypes.addressof(barriers)
        counts = [threads] + [min(WARP, threads - w * WARP) for w in range(warps)]
        for k, count in enumerate(counts):
            libc.pthread_barrier_init(base + k * BARRIER_BYTES, None, count)
        scratch = (ctypes.c_int32 * (warps * WARP * SLOT_WORDS))()
        shared = LaunchState(self.kernels.index(name), params, blocks, base, base + BARRIER_BYTES,
                             ctypes.addressof(scratch))
        states = (ThreadState * threads)()
        for t, state in enumerate(states):
            state.sreg[:] = (t % block[0], t // block[0] % block[1], t // (block[0] * block[1]), 0, 0, 0,
                             *block, *grid)
            state.lane, state.warp, state.launch = t % WARP, t // WARP, ctypes.addressof(shared)
        finished = False
        try:
            finished = self._run_threads(states)
        finally:
            if not finished:  # threads wait (at a barrier) on what this launch made: it must outlive them
                _STUCK.append((barriers, scratch, shared, states))
        if not finished:
            raise TimeoutError(f"emulated kernel {name} did not finish in {LAUNCH_TIMEOUT_S} s: threads wait at a "
                               "barrier or shuffle that others never reach (undefined on a GPU)")
        for k in range(len(counts)):
            libc.pthread_barrier_destroy(ctypes.c_void_p(base + k * BARRIER_BYTES))

    def _run_threads(self, states: ctypes.Array) -> bool:
        """Run a thread per state to the end of the launch; False if they did not finish in LAUNCH_TIMEOUT_S."""
        libc = _libc()
        attr = ctypes.create_string_buffer(64)  # a pthread_attr_t (56 bytes on x86-64 glibc)
        libc.pthread_attr_init(attr)
        libc.pthread_attr_setstacksize(attr, STACK_BYTES)
        ids = (ctypes.c_ulong * len(states))()
        for t in range(len(states)):
            if libc.pthread_create(ctypes.addressof(ids) + t * 8, attr, self.worker, ctypes.addressof(states[t])):
                # the threads started wait for this one at the block's barrier forever: nothing can end them
                raise OSError(f"cannot start emulated thread {t} of {len(states)}")
        libc.pthread_attr_destroy(attr)
        deadline = Timespec(int(time.time()) + LAUNCH_TIMEOUT_S, 0)
        for t in range(len(states)):
            if libc.pthread_timedjoin_np(ids[t], None, ctypes.byref(deadline)):
                return False
        return True
