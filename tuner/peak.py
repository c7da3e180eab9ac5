"""The machine's measured float32 FMA peak and memory bandwidth for a Target: what every "% of peak" and
"% of bandwidth" jitop prints (`jitop tune`, `jitop explain`, `jitop cache list`, the benchmarks) divides by.

Both are measured with code jitop itself generates for the Target, run on jitop's own thread pool
(`jitop_parallel_for`), never derived from a nominal clock:

- **FMA peak**: a loop of `accumulators` independent FMA chains `acc = fma(acc, x, y)` on full vector
  registers (<lanes x float>), unrolled `UNROLL` times, every operand in registers, no loads or stores in the
  hot loop. Enough chains hide the FMA latency (latency x FMA units, about 8 on current x86 cores; up to 12
  and at most the Target's vector registers minus 4, so nothing spills), so it runs at the FMA units'
  throughput. Timed on one thread (a direct call) and on `target.threads` threads (jitop_parallel_for);
  each figure is the best of several ~20 ms calls. `check_asm` verifies the hot loop is what we
  meant (vfmadd on ymm/zmm, no memory operand, no spill). A CPU without FMA runs a multiply and an add.
  The all-thread run has CHUNKS_PER_THREAD chain sets per thread, which the pool balances: one worker
  woken late costs an eighth of a call, not half of it.
- **Memory bandwidth**: STREAM's triad `a[i] = b[i] + s * c[i]` on float64 arrays, as jitop's own kernel
  (`triad_kernel`: a tensor expression, its loop split into blocks of TRIAD_BLOCK elements, the blocks
  parallel, each one vectorized), the blocks claimed by all `target.threads` threads, the arrays' pages first
  touched by the same threads (on a 2-core guest, within 1-2 % of the hand-written IR it replaced). Counted
  as STREAM counts: 3 x 8 bytes per element (two loads, one store; the write-allocate read of `a` is not
  counted), best of several passes. The three arrays together are 4x the caches (the L3 as reported, plus every thread's L2),
  as STREAM asks, each at least 128 MiB and at most 1 GiB (and a twelfth of the memory): with less, the L3
  serves part of the traffic. On a 16-core Emerald Rapids guest (L3 300 MiB) a C STREAM triad gave 280 GB/s
  with 32-64 MiB arrays, 123 with 128 MiB, 117 with 256 MiB and 82-85 with 512 MiB-1 GiB; on a 2-core guest
  reporting a 480 MiB L3, 45 GB/s with 32 MiB arrays and 26-27 from 128 MiB on.

Measured once per Target key (CPU, features, threads, build options) and kept in the persistent cache under
"machine/peak/<target key>" as versioned JSON (checksummed by the store like every entry); later processes
reuse it. A stored entry that is unreadable, of another version or Target, or holds nonsense is measured
again, with one warning, never a failure. A figure above the stored peak (the peak was measured while other
processes used the CPU) makes `machine_peak(target, at_least=...)` measure again, once per process, and keep
the higher figures.

>>> p = machine_peak(jitop.Target.current())       # doctest: +SKIP
>>> print(p.describe())                            # doctest: +SKIP
measured FP32 peak 92 GFLOP/s on 1 thread, 183 GFLOP/s on 2 threads (12 chains of <16 x float> fma); memory ...
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import math
import os
import re
import threading
import time
import warnings
from typing import TYPE_CHECKING, Callable

import numpy as np
from llvmlite import ir

from jitop.codegen.ops import declare_intrinsic
from jitop.target import Target

if TYPE_CHECKING:
    from jitop.runtime.module import Module

SCHEMA = 1               # version of the stored JSON (and of the measuring method): another one is measured again
PREFIX = "machine/peak/"
UNROLL = 4               # FMAs per chain per loop iteration (loop overhead well under 1 %)
CHUNKS_PER_THREAD = 8    # FMA tasks per thread in the all-thread measurement (the pool balances them)
CALL_SECONDS = 0.02      # length of one timed FMA call
REPEAT = 5               # timed FMA calls; the best counts
TRIAD_BLOCK = 1 << 15    # float64 elements per claimed block (256 KiB of each array)
TRIAD_SCALAR = 3.0       # the triad's s
TRIAD_REPEAT = 5         # timed triad passes; the best counts (STREAM reports the best of 10)
TRIAD_MIN_BYTES = 128 << 20
TRIAD_MAX_BYTES = 1 << 30


@dataclasses.dataclass(frozen=True)
class Peak:
    """Measured float32 FMA throughput and memory bandwidth of `target`; a figure is None where the code cannot
    run on this machine (`note` says why)."""

    target_key: str
    target: str                   # target.describe()
    isa: str
    lanes: int
    accumulators: int
    threads: int
    gflops_1: float | None        # one thread
    gflops_all: float | None      # `threads` threads
    bandwidth_gbs: float | None = None   # STREAM triad on `threads` threads, GB/s (1e9 bytes)
    triad_bytes: int = 0          # bytes of each of the triad's three arrays
    asm_problems: tuple[str, ...] = ()
    note: str = ""
    op: str = "fma"               # "mul+add" on a CPU without FMA
    seconds: float = 0.0          # how long measuring took
    measured_at: float = 0.0      # time.time() of the measurement
    schema: int = SCHEMA

    def per_thread(self, threads: int) -> float | None:
        """Peak for `threads` threads: the all-thread figure when that is what was measured, else scaled."""
        if self.gflops_1 is None or self.gflops_all is None:
            return None
        return self.gflops_all if threads == self.threads else self.gflops_1 * threads

    def describe(self) -> str:
        """One line: both figures, how they were measured, and a warning where the all-thread figure looks
        disturbed by other processes."""
        if self.gflops_1 is None:
            return f"FMA peak not measured ({self.note})"
        check = "" if not self.asm_problems else f" (WARNING: {'; '.join(self.asm_problems)})"
        if self.threads > 1 and self.gflops_all < 0.9 * self.threads * self.gflops_1:
            check += (f" (the {self.threads}-thread figure is below {self.threads} x the 1-thread one: shared cores, "
                      "or other processes were using the CPU)")
        text = (f"measured FP32 peak {self.gflops_1:.0f} GFLOP/s on 1 thread, {self.gflops_all:.0f} GFLOP/s on "
                f"{self.threads} threads ({self.accumulators} chains of <{self.lanes} x float> {self.op}){check}")
        if self.bandwidth_gbs:
            text += f"; {self.describe_bandwidth()}"
        return text

    def describe_bandwidth(self) -> str:
        return (f"memory bandwidth {self.bandwidth_gbs:.1f} GB/s (STREAM triad on {self.threads} threads, "
                f"3 x {self.triad_bytes >> 20} MiB float64, 24 bytes per element)")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str | bytes) -> "Peak":
        """A Peak from `to_json`'s text; ValueError unless every field is there, well typed and sensible."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"schema {data.get('schema') if isinstance(data, dict) else '?'}, expected {SCHEMA}")
        data["asm_problems"] = tuple(data.get("asm_problems", ()))
        try:
            p = Peak(**data)
        except TypeError as err:
            raise ValueError(str(err)) from None
        for name in ("gflops_1", "gflops_all", "bandwidth_gbs"):
            v = getattr(p, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} = {v!r}")
        if not (isinstance(p.threads, int) and p.threads >= 1 and isinstance(p.target_key, str)):
            raise ValueError("threads or target_key malformed")
        return p

    def merged(self, other: "Peak") -> "Peak":
        """The higher of each figure (a disturbed measurement only ever understates)."""
        def hi(a: float | None, b: float | None) -> float | None:
            return max(a, b) if a is not None and b is not None else a if b is None else b
        return dataclasses.replace(other, gflops_1=hi(self.gflops_1, other.gflops_1),
                                   gflops_all=hi(self.gflops_all, other.gflops_all),
                                   bandwidth_gbs=hi(self.bandwidth_gbs, other.bandwidth_gbs),
                                   triad_bytes=other.triad_bytes or self.triad_bytes)


# ---------------------------------------------------------------------------------------------
# the FMA loop
# ---------------------------------------------------------------------------------------------

I32, I64, PTR = ir.IntType(32), ir.IntType(64), ir.PointerType()
# the FMA body's closure, laid out as _FmaClosure: iterations per task, x and y (2 vectors), the chains' start
# values (`accumulators` vectors), the tasks' results (one vector each)
FMA_CLOSURE = ir.LiteralStructType([I64, PTR, PTR, PTR])


def accumulators_for(target: Target) -> int:
    """Independent FMA chains: enough to hide latency x units (~8), leaving registers for x, y and spare."""
    return max(4, min(12, target.vector_registers - 4))


def fma_loop_ir(lanes: int, accumulators: int, unroll: int = UNROLL, fma: bool = True) -> str:
    """LLVM IR of `fma_body(i64 begin, i64 end, ptr closure)`, a `jitop_parallel_for` body (fma=False: a
    separate multiply and add per step, for CPUs without FMA, where llvm.fma would be a libm call).

    closure -> { i64 iters, ptr xy (2 vectors: x, y), ptr init (accumulators vectors), ptr out }. Task t in
    [begin, end) starts every chain from its own `init` vector (different memory: LLVM cannot merge the
    chains), runs `iters` x `unroll` fmas per chain and stores the chains' sum to out[t]."""
    module = ir.Module(name="jitop_peak")
    vec = ir.VectorType(ir.FloatType(), lanes)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64, I64, PTR]), "fma_body")
    fn.attributes.add("nounwind")  # generated code never unwinds through the pool
    begin, end, closure = fn.args
    begin.name, end.name, closure.name = "begin", "end", "closure"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    iters, xy, init, out = _closure_fields(b, closure, FMA_CLOSURE)
    x, y = _load_vector(b, xy, vec, 0), _load_vector(b, xy, vec, 1)
    step = _chain_step(b, vec, fma)

    def run_task(t: ir.Value, _: list) -> list:
        starts = [_load_vector(b, init, vec, j) for j in range(accumulators)]
        ends = _counted_loop(b, I64(0), iters, starts, lambda _, chains: _unrolled_steps(chains, x, y, step, unroll),
                             "fma")
        b.store(functools.reduce(b.fadd, ends), b.gep(out, [t], source_etype=vec), align=4)
        return []

    with b.if_then(b.icmp_signed("<", begin, end)):  # the pool may hand a body an empty range
        _counted_loop(b, begin, end, [], run_task, "task")
    b.ret_void()
    return str(module)


def _closure_fields(b: ir.IRBuilder, closure: ir.Value, layout: ir.LiteralStructType) -> list[ir.Value]:
    """Every field of the `layout` struct that `closure` points to, loaded."""
    return [b.load(b.gep(closure, [I32(0), I32(k)], source_etype=layout), typ=typ)
            for k, typ in enumerate(layout.elements)]


def _load_vector(b: ir.IRBuilder, base: ir.Value, vec: ir.VectorType, k: int) -> ir.Value:
    """Vector `k` of the array at `base` (align 4: numpy promises a float32 array no more)."""
    return b.load(b.gep(base, [I64(k)], source_etype=vec), typ=vec, align=4)


def _chain_step(b: ir.IRBuilder, vec: ir.VectorType, fma: bool) -> Callable[[ir.Value, ir.Value, ir.Value], ir.Value]:
    """(acc, x, y) -> acc * x + y: one llvm.fma, or a multiply and an add that stay two instructions (no
    fast-math flags: LLVM may neither fuse them nor, without FMA hardware, call libm's fmaf)."""
    if fma:
        intrinsic = declare_intrinsic(b.module, "llvm.fma", [vec], ir.FunctionType(vec, [vec] * 3))
        return lambda acc, x, y: b.call(intrinsic, [acc, x, y])
    return lambda acc, x, y: b.fadd(b.fmul(acc, x), y)


def _unrolled_steps(chains: list[ir.Value], x: ir.Value, y: ir.Value, step: Callable, unroll: int) -> list[ir.Value]:
    """`unroll` steps of every chain, the chains interleaved: consecutive FMAs are independent, so the FMA
    units never wait for a result."""
    for _ in range(unroll):
        chains = [step(acc, x, y) for acc in chains]
    return chains


def _counted_loop(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, carried: list[ir.Value],
                  body: Callable[[ir.Value, list[ir.Value]], list[ir.Value]], name: str) -> list[ir.Value]:
    """`for i in range(start, stop)` at b, as one block testing at its bottom (the caller knows it runs at least
    once), carrying values in registers: body(i, values) emits an iteration and returns the next iteration's
    values. Returns their values after the loop, where b is left."""
    before, loop = b.block, b.append_basic_block(name)
    b.branch(loop)
    b.position_at_end(loop)
    phis = [b.phi(I64, f"{name}.index"), *(b.phi(v.type) for v in carried)]
    nxt = body(phis[0], phis[1:])
    i_next = b.add(phis[0], I64(1))
    for phi, first, then in zip(phis, (start, *carried), (i_next, *nxt)):
        phi.add_incoming(first, before)
        phi.add_incoming(then, b.block)  # body may have added blocks: the back edge leaves from the last
    after = b.append_basic_block(f"{name}.end")
    b.cbranch(b.icmp_signed("<", i_next, stop), loop, after)
    b.position_at_end(after)
    return nxt


def has_fma(target: Target) -> bool:
    return "fma" in target.required_features


def arith(target: Target) -> str:
    """The instruction the FMA loop's hot loop should be made of."""
    return "vfmadd" if has_fma(target) else "mulps"


def hot_loop(asm: str, op: str = "vfmadd") -> str:
    """The assembly of the block with the most `op` instructions (the measured loop)."""
    blocks = re.split(r"\n(?=\.LBB|\S+:)", asm)
    return max(blocks, key=lambda b: b.count(op), default="")


def check_asm(asm: str, target: Target, accumulators: int, unroll: int = UNROLL) -> list[str]:
    """What is wrong with the measured loop's machine code (empty: FMA-bound as intended)."""
    op = arith(target)
    loop = hot_loop(asm, op)
    reg = {64: "zmm", 32: "ymm"}.get(target.vector_bytes, "xmm")
    fmas = [line for line in loop.splitlines() if op in line]
    problems = []
    if len(fmas) < accumulators * unroll:
        problems.append(f"hot loop has {len(fmas)} {op}, expected {accumulators * unroll}")
    wrong = [f for f in fmas if f"%{reg}" not in f]
    if wrong:
        problems.append(f"{len(wrong)} {op} not on {reg} registers")
    if any("(" in f for f in fmas):
        problems.append(f"{op} with a memory operand in the hot loop")
    if re.search(r"\(%rsp\)|\(%rbp\)", loop):
        problems.append("stack access in the hot loop (spills)")
    return problems


@functools.cache
def compiled(target: Target) -> tuple[str, bytes, int, int]:
    """(assembly of the FMA loop, its object code, lanes, accumulators) for `target`."""
    from jitop.codegen.target import compile_ir, target_machine

    lanes, acc = target.lanes(4), accumulators_for(target)
    mod, obj = compile_ir(fma_loop_ir(lanes, acc, fma=has_fma(target)), target)
    return target_machine(target).emit_assembly(mod), obj, lanes, acc


@functools.cache
def triad_kernel(target: Target, n: int) -> Module:
    """jitop's own parallel triad a[i] = b[i] + TRIAD_SCALAR * c[i] over `n` float64 elements, called as
    kernel(b, c, a): a tensor expression whose loop is split into blocks of TRIAD_BLOCK elements, the blocks run
    on all threads (jitop_parallel_for), each block vectorized (into whole vector registers, as every jitop
    kernel). Built, like the FMA loop, for `target`."""
    from jitop.driver import build
    from jitop.schedule.schedule import create_schedule
    from jitop.te import compute, placeholder

    b, c = placeholder((n,), "float64", name="b"), placeholder((n,), "float64", name="c")
    a = compute((n,), lambda i: b[i] + TRIAD_SCALAR * c[i], name="a")
    s = create_schedule(a.op)
    blocks, block = s[a].split(a.op.axis[0], factor=TRIAD_BLOCK)
    s[a].parallel(blocks)
    s[a].vectorize(block)
    return build(s, [b, c, a], target=target, name="triad")


class _FmaClosure(ctypes.Structure):
    _fields_ = [("iters", ctypes.c_int64), ("xy", ctypes.c_void_p), ("init", ctypes.c_void_p),
                ("out", ctypes.c_void_p)]


def triad_array_bytes(target: Target) -> int:
    """Bytes of each triad array: the three together 4x the caches (L3 plus all threads' L2), as STREAM asks;
    at least 128 MiB, at most 1 GiB and a twelfth of the physical memory; a whole number of blocks."""
    caches = target.l3_bytes + target.l2_bytes * max(target.threads, 1)
    want = max(-(-4 * caches // 3), TRIAD_MIN_BYTES)
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        memory = 16 << 30
    want = max(min(want, TRIAD_MAX_BYTES, memory // 12), 16 << 20)
    block = TRIAD_BLOCK * 8
    return -(-want // block) * block


# ---------------------------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------------------------

def measure(target: Target | None = None, call_seconds: float = CALL_SECONDS, repeat: int = REPEAT,
            bandwidth: bool = True) -> Peak:
    """Build the FMA loop and the triad for `target` (default: Target.current()) and time them: the FMA loop
    on 1 and target.threads threads, the triad on target.threads threads (bandwidth=False: not the triad)."""
    from jitop.codegen.loader import load_object
    from jitop.errors import TargetMismatchError
    from jitop.runtime import parallel

    start = time.perf_counter()
    target = target or Target.current()
    asm, obj, lanes, acc = compiled(target)
    problems = tuple(check_asm(asm, target, acc))
    fields = dict(target_key=target.key, target=target.describe(), isa=target.isa, lanes=lanes, accumulators=acc,
                  threads=target.threads, asm_problems=problems, op="fma" if has_fma(target) else "mul+add")
    try:
        target.check_runs_on(what="the FMA peak loop")
    except TargetMismatchError as e:
        return Peak(gflops_1=None, gflops_all=None, note=str(e).split(";")[0], **fields)

    body_addr = load_object(obj, ["fma_body"])["fma_body"]
    body = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)(body_addr)
    threads = target.threads
    xy = np.concatenate([np.full(lanes, 0.999, np.float32), np.full(lanes, 1e-3, np.float32)])  # acc -> ~1
    init = np.arange(acc * lanes, dtype=np.float32) / (acc * lanes)
    tasks_all = CHUNKS_PER_THREAD * max(threads, 1)  # several per thread: a late worker costs an eighth, not half
    out = np.zeros((tasks_all, lanes), np.float32)
    closure = _FmaClosure(1, xy.ctypes.data, init.ctypes.data, out.ctypes.data)
    flops_per_iter = 2.0 * lanes * acc * UNROLL

    def call(tasks: int) -> float:
        t0 = time.perf_counter()
        if tasks == 1:
            body(0, 1, ctypes.addressof(closure))
        else:
            parallel.run_parallel(body_addr, ctypes.addressof(closure), tasks)
        return time.perf_counter() - t0

    def best(tasks: int) -> float:
        closure.iters = 1 << 12  # calibrate one call to ~call_seconds
        call(tasks)
        while (t := call(tasks)) < call_seconds / 8:
            closure.iters *= 4
        closure.iters = max(1, int(closure.iters * call_seconds / t))
        secs = min(call(tasks) for _ in range(repeat))
        if not np.isfinite(out[:tasks]).all():
            raise RuntimeError("the FMA peak loop produced non-finite values")
        return flops_per_iter * closure.iters * tasks / secs / 1e9

    old_threads = parallel.get_num_threads()
    bw, nbytes = None, 0
    try:
        g1 = best(1)
        gall = g1
        if threads > 1:
            parallel.set_num_threads(threads)
            gall = 0.0
            for _ in range(3):  # a figure below threads x one thread's: maybe disturbed, try again
                gall = max(gall, best(tasks_all))
                if gall >= 0.9 * threads * g1:
                    break
        if bandwidth:
            nbytes = triad_array_bytes(target)
            bw = _triad_gbs(triad_kernel(target, nbytes // 8), nbytes)
    finally:
        parallel.set_num_threads(old_threads)
    return Peak(gflops_1=g1, gflops_all=gall, bandwidth_gbs=bw, triad_bytes=nbytes,
                seconds=time.perf_counter() - start, measured_at=time.time(), **fields)


def _triad_gbs(triad: Module, nbytes: int, repeat: int | None = None) -> float:
    """Best STREAM-counted bandwidth (GB/s) of `triad` (triad_kernel's, for three arrays of `nbytes` each), on
    the pool's current thread count."""
    n = nbytes // 8
    # fresh mmap'd pages (zero until written); the triad itself writes them first, on the threads that time it
    a, b, c, untouched = (np.empty(n, np.float64) for _ in range(4))

    def run(dst: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        t0 = time.perf_counter()
        triad(x, y, dst)  # dst = x + TRIAD_SCALAR * y
        return time.perf_counter() - t0

    run(c, untouched, untouched)  # c's pages placed by the threads (reading `untouched` reads the shared zero page)
    del untouched
    c.fill(1.0)  # c = 1: what the triad reads must be written pages, never the zero page (it would come from cache)
    run(b, c, c)  # b = 4
    run(a, b, c)  # a = 7: every page of a written
    secs = min(run(a, b, c) for _ in range(repeat or TRIAD_REPEAT))
    if not (a[:: max(1, n // 64)] == 7.0).all():
        raise RuntimeError("the triad produced wrong values")
    return 3 * nbytes / secs / 1e9


# ---------------------------------------------------------------------------------------------
# measured once per Target, kept in the cache
# ---------------------------------------------------------------------------------------------

_known: dict[str, Peak] = {}       # target key -> the peak this process uses
_remeasured: set = set()           # target keys measured again in this process (at_least; (key, "bw"): triad)
_lock = threading.Lock()


def forget() -> None:
    """Forget the peaks this process knows (the next `machine_peak` reads the cache again)."""
    with _lock:
        _known.clear()
        _remeasured.clear()


def key(target: Target) -> str:
    """The store key of `target`'s peak."""
    return PREFIX + target.key


def machine_peak(target: Target, at_least: float | None = None, at_least_gbs: float | None = None,
                 bandwidth: bool = True) -> Peak:
    """`target`'s measured peak and bandwidth: this process's, else the cache's, else measured now (and
    stored). `bandwidth=False`: the FMA peak is enough (the triad, ~1 s on big-L3 machines, is measured the
    first time a caller needs it). `at_least` (GFLOP/s on `target.threads` threads) and `at_least_gbs` (GB/s
    from memory, not from a cache): figures some kernel reached; if one beats what is known, the peak was
    measured while other processes used the machine: it is measured again (once per process) and the higher
    figures kept."""
    with _lock:
        p = _known.get(target.key)
        if p is None:
            p = _stored(target)
            if p is None:
                p = _measure_and_store(target, bandwidth=bandwidth)
            _known[target.key] = p
        beaten = ((at_least is not None and p.gflops_all is not None and at_least > p.gflops_all)
                  or (at_least_gbs is not None and p.bandwidth_gbs is not None and at_least_gbs > p.bandwidth_gbs))
        if beaten and target.key not in _remeasured:
            _remeasured.add(target.key)
            p = _known[target.key] = _measure_and_store(target, keep=p, bandwidth=bandwidth)
        if bandwidth and p.bandwidth_gbs is None and p.gflops_all is not None and (target.key, "bw") not in _remeasured:
            _remeasured.add((target.key, "bw"))  # stored by a caller that needed only the FMA peak
            p = _known[target.key] = _measure_and_store(target, keep=p, bandwidth=True)
        return p


def stored_peaks() -> list[Peak]:
    """Every peak stored in the cache (readable ones), for `jitop cache list`."""
    from jitop.cachedir import store
    return [p for _, payload in store().items(PREFIX) if (p := _readable(payload)) is not None]


def stored_peak(target_key: str) -> Peak | None:
    """The stored peak of a Target key, without measuring (None if there is none or it is unreadable)."""
    from jitop.cachedir import store
    if target_key in _known:
        return _known[target_key]
    payload = store().get(PREFIX + target_key)
    return _readable(payload) if payload is not None else None


def _readable(payload: bytes) -> Peak | None:
    """A stored peak, or None if it cannot be read (listing never warns: `machine_peak` does, and measures)."""
    try:
        return Peak.from_json(payload)
    except (ValueError, TypeError, KeyError):
        return None


def _stored(target: Target) -> Peak | None:
    """The cache's peak for `target`; None if there is none; a damaged one is reported and None."""
    from jitop.cachedir import store
    st = store()
    stats = getattr(st, "stats", {})
    corrupt = stats.get("corrupt", 0)
    payload = st.get(key(target))
    if payload is None:
        if stats.get("corrupt", 0) > corrupt:
            _warn(f"the stored peak of Target {target.key} failed its checksum; measuring it again")
        return None
    try:
        p = Peak.from_json(payload)
        if p.target_key != target.key:
            raise ValueError(f"it is for Target {p.target_key}")
        if p.gflops_all is None:
            raise ValueError("it holds no figure")
        return p
    except (ValueError, TypeError, KeyError) as err:
        _warn(f"the stored peak of Target {target.key} is unusable ({str(err)[:120]}); measuring it again")
        return None


def _measure_and_store(target: Target, keep: Peak | None = None, bandwidth: bool = True) -> Peak:
    from jitop.cachedir import store
    p = measure(target, bandwidth=bandwidth)
    if keep is not None:
        p = keep.merged(p)
    if p.gflops_all is not None:
        store().put(key(target), p.to_json().encode())
    return p


def _warn(message: str) -> None:
    try:
        warnings.warn(f"jitop: {message}", RuntimeWarning, stacklevel=4)
    except Exception:  # noqa: BLE001 - warnings turned into errors must not fail the command
        pass
