"""The thread pool of jitop.runtime.parallel as an llvmlite.ir module (the protocol: parallel's docstring).

`pool_module` builds it from the pool's parameters, one Python function per IR function. All state lives in
the module's globals; every shared word sits in its own 128-byte block (two cache lines, because Zen and Intel
prefetch adjacent lines) so the caller and workers don't false-share. Every defined function is `nounwind`:
bodies are generated code and never unwind (no C++ exceptions cross the pool). Only the entry points
(jitop_parallel_for, _configure, _after_fork, _awake_workers) and jitop_pool_test_delay_ns are exported.

>>> m = pool_module(max_threads=4, num_threads=2, spin_ticks=1 << 18, chunks_per_thread=8)
>>> [f.name for f in m.functions if f.blocks and f.linkage != "internal"]
['jitop_parallel_for', 'jitop_parallel_configure', 'jitop_parallel_after_fork', 'jitop_parallel_awake_workers']
>>> m.get_global("work").linkage, m.get_global("slots").align
('internal', 128)
"""
from __future__ import annotations

from llvmlite import ir

from jitop.runtime.ir_words import I1, I8, I32, I64, PTR, CodePointer, call_named, function, stack_slot

__all__ = ["SLOT_BYTES", "pool_module"]

VOID = ir.VoidType()
BODY_PTR = CodePointer(ir.FunctionType(VOID, [I64, I64, PTR]))  # a loop body(begin, end, closure)
SLOT_BYTES = 128     # a worker's slot: generation, sleeping, tid, 1 + the CPU it is kept off, padding
ALIGN = 128          # of every global: two cache lines
CPU_SET_BYTES = 128  # sizeof(cpu_set_t): 1024 CPUs, as [16 x i64]
NULL = ir.Constant(PTR, None)

# syscall numbers (x86-64) and arguments
SYS_SCHED_YIELD, SYS_NANOSLEEP, SYS_GETTID, SYS_FUTEX = 24, 35, 186, 202
SYS_SCHED_SETAFFINITY, SYS_SCHED_GETAFFINITY = 203, 204
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129
SIG_SETMASK = 2

# fields of a %Slot and of the %Job
GENERATION, SLEEPING, TID, EXCLUDED = 0, 1, 2, 3
CLOSURE, N, NCHUNKS = 1, 2, 3   # field 0 is the body


class _Pool:
    """The module being built: its types, globals and external declarations, and what its functions share."""

    def __init__(self, max_threads: int, num_threads: int, spin_ticks: int, chunks_per_thread: int):
        self.module = ir.Module(name="jitop_pool", context=ir.Context())  # its own context: its own %Job, %Slot
        self.chunks_per_thread = chunks_per_thread
        self.job_t = self.module.context.get_identified_type("Job")
        self.job_t.set_body(PTR, PTR, I64, I64)                      # body, closure, n, nchunks
        self.slot_t = self.module.context.get_identified_type("Slot")
        self.slot_t.set_body(I32, I32, I32, I32, ir.ArrayType(I8, SLOT_BYTES - 16))
        self.slots_t = ir.ArrayType(self.slot_t, max_threads)
        self.slots_bytes = max_threads * SLOT_BYTES
        g = self._global
        self.busy = g("busy", I32)                               # try-lock held by the launching thread
        self.nthreads = g("nthreads", I32, num_threads)          # thread count (caller included)
        self.spin_ticks = g("spin_ticks", I64, spin_ticks)       # how long a waiter spins before it sleeps
        self.oversubscribed = g("oversubscribed", I32)           # more threads than CPUs
        self.cpu_mask = g("cpu_mask", ir.ArrayType(I64, CPU_SET_BYTES // 8))   # the process's CPUs (cpu_set_t)
        self.nstarted = g("nstarted", I32)                       # workers created so far (they never exit)
        self.job = g("job", self.job_t)
        self.range = g("range", I64)                   # front << 32 | back: chunks [front, back) are unclaimed
        self.done = g("done", I32)                     # chunks finished this launch, by any thread
        self.test_delay_ns = g("jitop_pool_test_delay_ns", I64, exported=True)   # tests only: see test_delay
        self.caller_sleeping = g("caller_sleeping", I32)
        self.slots = g("slots", self.slots_t)          # slot 0 unused
        d = self._declare
        self.syscall = d("syscall", I64, [I64], var_arg=True)   # reads every argument as a long: pass i64s
        self.pthread_create = d("pthread_create", I32, [PTR, PTR, PTR, PTR])
        self.pthread_detach = d("pthread_detach", I32, [I64])
        self.pthread_sigmask = d("pthread_sigmask", I32, [I32, PTR, PTR])
        self.sigfillset = d("sigfillset", I32, [PTR])
        self.sched_getcpu = d("sched_getcpu", I32, [])
        self.pause = d("llvm.x86.sse2.pause", VOID, [])
        self.readcyclecounter = d("llvm.readcyclecounter", I64, [])
        self.umin = d("llvm.umin.i64", I64, [I64, I64])
        self.memcpy = d("llvm.memcpy.p0.p0.i64", VOID, [PTR, PTR, I64, I1])
        self.memset = d("llvm.memset.p0.i64", VOID, [PTR, I8, I64, I1])

    def _global(self, name: str, typ: ir.Type, value: int | None = None, exported: bool = False) -> ir.GlobalVariable:
        """A zero-initialised (or `value`) global in its own 128-byte block, internal unless `exported`."""
        var = ir.GlobalVariable(self.module, typ, name)
        var.type = PTR  # an opaque pointer, like every other (llvmlite types globals)
        var.initializer = ir.Constant(typ, value)
        var.align = ALIGN
        if not exported:
            var.linkage = "internal"
        return var

    def _declare(self, name: str, ret: ir.Type, args: list[ir.Type], var_arg: bool = False) -> ir.Function:
        """An external function (libc or an intrinsic)."""
        return ir.Function(self.module, ir.FunctionType(ret, args, var_arg=var_arg), name)

    def define(self, name: str, ret: ir.Type, params: list[tuple[str, ir.Type]], blocks: list[str],
               exported: bool = False) -> tuple[ir.IRBuilder, dict[str, ir.Block]]:
        """A nounwind function (internal unless `exported`) with named parameters and basic blocks: a builder at
        the end of the first block, and the blocks by name."""
        _, named = function(self.module, name, ret, params, blocks, internal=not exported, attributes=["nounwind"])
        return ir.IRBuilder(named[blocks[0]]), named

    def sys(self, b: ir.IRBuilder, number: int, *args: ir.Value, result: str = "r") -> ir.CallInstr:
        """syscall(number, args...)."""
        return b.call(self.syscall, [I64(number), *args], name=result)

    def slot(self, b: ir.IRBuilder, i: ir.Value, field: int, name: str) -> ir.Value:
        """&slots[i].field."""
        return b.gep(self.slots, [I64(0), i, I32(field)], source_etype=self.slots_t, name=name)

    def job_field(self, b: ir.IRBuilder, field: int, typ: ir.Type, name: str) -> ir.Value:
        """The job's `field` (a plain load: read only after a claim, which orders it after the publishing)."""
        ptr = b.gep(self.job, [I32(0), I32(field)], source_etype=self.job_t, name=name + ".p")
        return b.load(ptr, typ=typ, align=8, name=name)


def _store_atomic(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, ordering: str, align: int) -> None:
    """store atomic `value` to `ptr` (IRBuilder.store_atomic of llvmlite 0.50 reads the pointee type of `ptr`,
    which an opaque pointer lacks)."""
    b._insert(ir.instructions.StoreAtomicInstr(b.block, value, ptr, ordering, align))


# ---- futex (FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE) -----------------------------------------------------------

def _futex_wait(p: _Pool) -> None:
    """futex_wait(word, expected): sleep while *word == expected (the kernel re-checks the word)."""
    b, _ = p.define("futex_wait", VOID, [("word", PTR), ("expected", I32)], ["entry"])
    word, expected = b.function.args
    p.sys(b, SYS_FUTEX, word, I64(FUTEX_WAIT_PRIVATE), b.zext(expected, I64, name="val"), NULL)
    b.ret_void()


def _futex_wake_one(p: _Pool) -> None:
    """futex_wake_one(word): wake one thread asleep on `word`."""
    b, _ = p.define("futex_wake_one", VOID, [("word", PTR)], ["entry"])
    p.sys(b, SYS_FUTEX, b.function.args[0], I64(FUTEX_WAKE_PRIVATE), I64(1))
    b.ret_void()


def _await_change(p: _Pool) -> None:
    """await_change(word, old, sleeping, budget) -> the new value of *word, once it differs from `old`: spin
    (`pause`, or sched_yield when oversubscribed, so a waiter hands its core to the thread it waits for) for
    `budget` TSC ticks, then sleep on the futex. No wake-up is lost: the sleeper stores *sleeping = 1, then
    re-reads the word (both seq_cst); the waker changes *word before it reads *sleeping."""
    b, bb = p.define("await_change", I32, [("word", PTR), ("old", I32), ("sleeping", PTR), ("budget", I64)],
                     ["entry", "check", "relax", "yield_cpu", "pause", "clock", "sleep", "wait", "woke", "out"])
    word, old, sleeping, budget = b.function.args
    t0 = b.call(p.readcyclecounter, [], name="t0")
    over = b.load_atomic(p.oversubscribed, "monotonic", 4, name="over", typ=I32)
    yield_ = b.icmp_unsigned("!=", over, I32(0), name="yield")
    b.branch(bb["check"])
    b.position_at_end(bb["check"])
    v = b.load_atomic(word, "acquire", 4, name="v", typ=I32)
    b.cbranch(b.icmp_unsigned("!=", v, old, name="changed"), bb["out"], bb["relax"])
    b.position_at_end(bb["relax"])
    b.cbranch(yield_, bb["yield_cpu"], bb["pause"])
    b.position_at_end(bb["yield_cpu"])
    p.sys(b, SYS_SCHED_YIELD)
    b.branch(bb["clock"])
    b.position_at_end(bb["pause"])
    b.call(p.pause, [])
    b.branch(bb["clock"])
    b.position_at_end(bb["clock"])
    elapsed = b.sub(b.call(p.readcyclecounter, [], name="t"), t0, name="elapsed")
    b.cbranch(b.icmp_unsigned("<", elapsed, budget, name="spin"), bb["check"], bb["sleep"])
    b.position_at_end(bb["sleep"])
    # announce, then re-check: the waker changes *word before it reads *sleeping
    _store_atomic(b, I32(1), sleeping, "seq_cst", 4)
    v2 = b.load_atomic(word, "seq_cst", 4, name="v2", typ=I32)
    b.cbranch(b.icmp_unsigned("==", v2, old, name="same"), bb["wait"], bb["woke"])
    b.position_at_end(bb["wait"])
    call_named(b, "futex_wait", [word, old])
    b.branch(bb["woke"])
    b.position_at_end(bb["woke"])
    _store_atomic(b, I32(0), sleeping, "monotonic", 4)
    b.branch(bb["check"])  # spin budget is spent: a spurious wake-up sleeps again at once
    b.position_at_end(bb["out"])
    b.ret(v)


# ---- work -----------------------------------------------------------------------------------------------------

def _run_chunk(p: _Pool) -> None:
    """run_chunk(i): run chunk i of the job. Chunks are balanced: n/nchunks iterations each and the first
    n%nchunks one more. Called only right after claiming the chunk, so the launch cannot have finished and the
    job is the one the claim belongs to."""
    b, _ = p.define("run_chunk", VOID, [("i", I64)], ["entry"])
    i, = b.function.args
    body = b.load(p.job, typ=BODY_PTR, align=8, name="body")
    closure = p.job_field(b, CLOSURE, PTR, "closure")
    n = p.job_field(b, N, I64, "n")
    chunks = p.job_field(b, NCHUNKS, I64, "chunks")
    base = b.udiv(n, chunks, name="base")
    rem = b.urem(n, chunks, name="rem")
    extra = b.call(p.umin, [i, rem], name="extra")
    begin = b.add(b.mul(i, base, name="skip"), extra, name="begin")
    one = b.zext(b.icmp_unsigned("<", i, rem, name="has_extra"), I64, name="one")
    end = b.add(begin, b.add(base, one, name="len"), name="end")
    b.call(body, [begin, end, closure])
    b.ret_void()


def _work(p: _Pool) -> None:
    """work(guess, from_back) -> how many chunks this thread claimed and ran, until none is left. The caller
    claims from the front of the unclaimed range, workers from the back, so threads that arrive on time keep
    the same part of the range from launch to launch (with two threads, as a static split does). `guess` is a
    read of @range, possibly stale: the cmpxchg corrects it. The first successful claim ties this thread to the
    launch then running, which cannot finish before this thread reports its chunks; so every claim, and every
    read of the job, is of that one launch."""
    b, bb = p.define("work", I32, [("guess", I64), ("from_back", I1)], ["entry", "check", "claim", "ran", "out"])
    guess, from_back = b.function.args
    b.branch(bb["check"])
    b.position_at_end(bb["check"])
    range_ = b.phi(I64, name="range")
    count = b.phi(I32, name="count")
    front = b.lshr(range_, I64(32), name="front")
    back = b.and_(range_, I64(0xFFFFFFFF), name="back")
    b.cbranch(b.icmp_unsigned(">=", front, back, name="none"), bb["out"], bb["claim"])
    b.position_at_end(bb["claim"])
    chunk = b.select(from_back, b.sub(back, I64(1), name="back1"), front, name="chunk")
    step = b.select(from_back, I64(-1), I64(1 << 32), name="step")   # back - 1, or front + 1
    taken = b.add(range_, step, name="taken")
    cx = b.cmpxchg(p.range, range_, taken, "acquire", "monotonic", name="cx")
    actual = b.extract_value(cx, 0, name="actual")
    b.cbranch(b.extract_value(cx, 1, name="ok"), bb["ran"], bb["check"])  # lost the race: retry with `actual`
    b.position_at_end(bb["ran"])
    call_named(b, "run_chunk", [chunk])
    count1 = b.add(count, I32(1), name="count1")
    b.branch(bb["check"])  # `taken` is the likeliest value of @range now; a miss costs one retry
    b.position_at_end(bb["out"])
    b.ret(count)
    range_.add_incoming(guess, bb["entry"])
    range_.add_incoming(taken, bb["ran"])
    range_.add_incoming(actual, bb["claim"])
    count.add_incoming(I32(0), bb["entry"])
    count.add_incoming(count1, bb["ran"])
    count.add_incoming(count, bb["claim"])


def _report(p: _Pool) -> None:
    """report(ran) -> whether adding `ran` chunks to @done finished the launch. Only a thread that ran chunks of
    the current launch calls this, before which the launch cannot finish, so the job (and @done) still belong to
    it."""
    b, _ = p.define("report", I1, [("ran", I32)], ["entry"])
    ran, = b.function.args
    chunks32 = b.trunc(p.job_field(b, NCHUNKS, I64, "chunks"), I32, name="chunks32")
    prev = b.atomic_rmw("add", p.done, ran, "seq_cst", name="prev")
    b.ret(b.icmp_unsigned("==", b.add(prev, ran, name="count"), chunks32, name="last"))


def _test_delay(p: _Pool) -> None:
    """test_delay(): tests only: hold a worker between reading @range and claiming, as a late wake-up would, for
    jitop_pool_test_delay_ns nanoseconds (0 by default, which costs a load and a branch)."""
    b, bb = p.define("test_delay", VOID, [], ["entry", "sleep", "out"])
    ns = b.load_atomic(p.test_delay_ns, "monotonic", 8, name="ns", typ=I64)
    b.cbranch(b.icmp_unsigned("==", ns, I64(0), name="off"), bb["out"], bb["sleep"])
    b.position_at_end(bb["sleep"])
    timespec = ir.LiteralStructType([I64, I64])
    ts = stack_slot(b, timespec, "ts", 8)
    sec = b.udiv(ns, I64(10**9), name="sec")
    nsec = b.urem(ns, I64(10**9), name="nsec")
    b.store(sec, ts, align=8)
    b.store(nsec, b.gep(ts, [I32(0), I32(1)], source_etype=timespec, name="nsec.p"), align=8)
    p.sys(b, SYS_NANOSLEEP, ts, NULL)  # signals are blocked: no EINTR
    b.branch(bb["out"])
    b.position_at_end(bb["out"])
    b.ret_void()


def _worker_main(p: _Pool) -> None:
    """worker_main(idx as a ptr): a worker's thread, forever: wait for its slot's generation to change, claim and
    run chunks, report them, and wake the caller if its report finished the launch and the caller sleeps. A
    worker that claimed nothing touches nothing of the launch."""
    b, bb = p.define("worker_main", PTR, [("arg", PTR)], ["entry", "loop", "report", "maybe_wake", "wake"])
    idx = b.ptrtoint(b.function.args[0], I64, name="idx")
    gen = p.slot(b, idx, GENERATION, "gen")
    sleeping = p.slot(b, idx, SLEEPING, "sleeping")
    tid_p = p.slot(b, idx, TID, "tid.p")
    tid = p.sys(b, SYS_GETTID, result="tid")  # for steer_away
    _store_atomic(b, b.trunc(tid, I32, name="tid32"), tid_p, "monotonic", 4)  # published by the seq_cst `sleeping`
    seen = stack_slot(b, I32, "seen", 4)
    b.store(I32(0), seen, align=4)  # the slot was never signalled before this thread existed
    b.branch(bb["loop"])
    b.position_at_end(bb["loop"])
    old = b.load(seen, typ=I32, align=4, name="old")
    budget = b.load_atomic(p.spin_ticks, "monotonic", 8, name="budget", typ=I64)
    b.store(call_named(b, "await_change", [gen, old, sleeping, budget], "new"), seen, align=4)
    guess = b.load_atomic(p.range, "monotonic", 8, name="guess", typ=I64)
    call_named(b, "test_delay", [])  # a late worker's guess is stale: work() must cope
    ran = call_named(b, "work", [guess, I1(1)], "ran")
    b.cbranch(b.icmp_unsigned("!=", ran, I32(0), name="any"), bb["report"], bb["loop"])
    b.position_at_end(bb["report"])
    b.cbranch(call_named(b, "report", [ran], "last"), bb["maybe_wake"], bb["loop"])
    b.position_at_end(bb["maybe_wake"])
    s = b.load_atomic(p.caller_sleeping, "seq_cst", 4, name="s", typ=I32)
    b.cbranch(b.icmp_unsigned("!=", s, I32(0), name="asleep"), bb["wake"], bb["loop"])
    b.position_at_end(bb["wake"])
    call_named(b, "futex_wake_one", [p.done])
    b.branch(bb["loop"])


# ---- launching ------------------------------------------------------------------------------------------------

def _spawn_worker(p: _Pool) -> None:
    """spawn_worker(idx) -> whether pthread_create made worker `idx`, detached, with every signal blocked (the
    new thread inherits the mask; signals go to Python's threads)."""
    b, bb = p.define("spawn_worker", I1, [("idx", I64)], ["entry", "detach", "out"])
    idx, = b.function.args
    tid = stack_slot(b, I64, "tid", 8)
    sigset = ir.ArrayType(I8, 128)
    all_ = stack_slot(b, sigset, "all", 8)
    saved = stack_slot(b, sigset, "saved", 8)
    b.call(p.sigfillset, [all_], name="r0")
    b.call(p.pthread_sigmask, [I32(SIG_SETMASK), all_, saved], name="r1")
    arg = b.inttoptr(idx, PTR, name="arg")
    worker_main = p.module.get_global("worker_main")
    worker_main.type = PTR  # passed, never called: an opaque pointer
    rc = b.call(p.pthread_create, [tid, NULL, worker_main, arg], name="rc")
    b.call(p.pthread_sigmask, [I32(SIG_SETMASK), saved, NULL], name="r2")
    ok = b.icmp_unsigned("==", rc, I32(0), name="ok")
    b.cbranch(ok, bb["detach"], bb["out"])
    b.position_at_end(bb["detach"])
    b.call(p.pthread_detach, [b.load(tid, typ=I64, align=8, name="t")], name="r3")
    b.branch(bb["out"])
    b.position_at_end(bb["out"])
    b.ret(ok)


def _ensure_workers(p: _Pool) -> None:
    """ensure_workers(want) -> how many chunks we can run: make sure workers 1..want-1 exist (fewer if
    pthread_create failed). Called with `busy` held."""
    b, bb = p.define("ensure_workers", I64, [("want", I64)], ["entry", "check", "spawn", "count", "out"])
    want, = b.function.args
    b.branch(bb["check"])
    b.position_at_end(bb["check"])
    have32 = b.load_atomic(p.nstarted, "monotonic", 4, name="have32", typ=I32)
    more = b.add(b.zext(have32, I64, name="have"), I64(1), name="more")
    b.cbranch(b.icmp_unsigned("<", more, want, name="short"), bb["spawn"], bb["out"])
    b.position_at_end(bb["spawn"])
    b.cbranch(call_named(b, "spawn_worker", [more], "ok"), bb["count"], bb["out"])
    b.position_at_end(bb["count"])
    _store_atomic(b, b.add(have32, I32(1), name="have1"), p.nstarted, "monotonic", 4)
    b.branch(bb["check"])
    b.position_at_end(bb["out"])
    b.ret(b.call(p.umin, [want, more], name="usable"))


def _publish(p: _Pool) -> None:
    """publish(body, closure, n, chunks): publish a job of `chunks` chunks. @range is empty between launches, so
    no claim succeeds until the release store of [0, chunks) into it, which makes the job and the reset @done
    visible to claimers."""
    b, _ = p.define("publish", VOID, [("body", PTR), ("closure", PTR), ("n", I64), ("chunks", I64)], ["entry"])
    job = ir.FormattedConstant(p.job_t, "poison")
    for k, arg in enumerate(b.function.args):
        job = b.insert_value(job, arg, k, name=f"job.{k}")
    b.store(job, p.job, align=8)
    _store_atomic(b, I32(0), p.done, "monotonic", 4)
    _store_atomic(b, b.function.args[3], p.range, "release", 8)  # [0, chunks)
    b.ret_void()


def _steer_away(p: _Pool) -> None:
    """steer_away(i): keep sleeping worker i off the caller's CPU (sched_setaffinity) before waking it. A Linux
    guest sees its halted vCPUs as "preempted", not idle, so it queues a woken thread behind the waker on the
    waker's own CPU, and the chunks then run one after the other until the load balancer steps in (~1 ms). Only
    when the caller's CPU differs from last time is the mask changed; oversubscribed threads must share CPUs."""
    b, bb = p.define("steer_away", VOID, [("i", I64)], ["entry", "check", "set", "out"])
    i, = b.function.args
    over = b.load_atomic(p.oversubscribed, "monotonic", 4, name="over", typ=I32)
    shared = b.icmp_unsigned("!=", over, I32(0), name="shared")  # oversubscribed: threads must share CPUs
    cpu = b.call(p.sched_getcpu, [], name="cpu")
    unknown = b.icmp_unsigned(">=", cpu, I32(CPU_SET_BYTES * 8), name="unknown")  # -1 on error, or beyond cpu_set_t
    b.cbranch(b.or_(shared, unknown, name="skip"), bb["out"], bb["check"])
    b.position_at_end(bb["check"])
    ex_p = p.slot(b, i, EXCLUDED, "ex.p")
    ex = b.load(ex_p, typ=I32, align=4, name="ex")
    tag = b.add(cpu, I32(1), name="tag")
    b.cbranch(b.icmp_unsigned("==", ex, tag, name="same"), bb["out"], bb["set"])
    b.position_at_end(bb["set"])
    b.store(tag, ex_p, align=4)
    mask_t = p.cpu_mask.value_type
    mask = stack_slot(b, mask_t, "mask", 8)
    b.call(p.memcpy, [mask, p.cpu_mask, I64(CPU_SET_BYTES), I1(0)])
    word_p = b.gep(mask, [I32(0), b.lshr(cpu, I32(6), name="word")], source_etype=mask_t, name="word.p")
    bits = b.load(word_p, typ=I64, align=8, name="bits")
    bit64 = b.zext(b.and_(cpu, I32(63), name="bit"), I64, name="bit64")
    keep = b.xor(b.shl(I64(1), bit64, name="one"), I64(-1), name="keep")
    b.store(b.and_(bits, keep, name="cleared"), word_p, align=8)
    tid = b.load_atomic(p.slot(b, i, TID, "tid.p"), "monotonic", 4, name="tid", typ=I32)
    p.sys(b, SYS_SCHED_SETAFFINITY, b.zext(tid, I64, name="tid64"), I64(CPU_SET_BYTES), mask)
    b.branch(bb["out"])
    b.position_at_end(bb["out"])
    b.ret_void()


def _start_workers(p: _Pool) -> None:
    """start_workers(k): bump the generation of workers 1..k-1 (seq_cst, then read `sleeping`: Dekker-style with
    await_change), waking those asleep; workers beyond k are not signalled and keep sleeping."""
    b, bb = p.define("start_workers", VOID, [("k", I64)], ["entry", "loop", "wake", "signalled", "out"])
    k, = b.function.args
    b.branch(bb["loop"])
    b.position_at_end(bb["loop"])
    i = b.phi(I64, name="i")
    gen = p.slot(b, i, GENERATION, "gen")
    sleeping = p.slot(b, i, SLEEPING, "sleeping")
    b.atomic_rmw("add", gen, I32(1), "seq_cst", name="prev")
    s = b.load_atomic(sleeping, "seq_cst", 4, name="s", typ=I32)
    b.cbranch(b.icmp_unsigned("!=", s, I32(0), name="asleep"), bb["wake"], bb["signalled"])
    b.position_at_end(bb["wake"])
    call_named(b, "steer_away", [i])
    call_named(b, "futex_wake_one", [gen])
    b.branch(bb["signalled"])
    b.position_at_end(bb["signalled"])
    next_ = b.add(i, I64(1), name="next")
    b.cbranch(b.icmp_unsigned("<", next_, k, name="again"), bb["loop"], bb["out"])
    b.position_at_end(bb["out"])
    b.ret_void()
    i.add_incoming(I64(1), bb["entry"])
    i.add_incoming(next_, bb["signalled"])


def _await_chunks(p: _Pool) -> None:
    """await_chunks(chunks): wait until every chunk of the launch has finished (the caller has claimed, run and
    reported its own). The caller is blocked in this launch anyway, so it spins 8x longer than an idle worker:
    waking a sleeping thread costs 20 us to milliseconds on a virtual machine."""
    b, bb = p.define("await_chunks", VOID, [("chunks", I64)], ["entry", "check", "wait", "out"])
    target = b.trunc(b.function.args[0], I32, name="target")
    b.branch(bb["check"])
    b.position_at_end(bb["check"])
    d = b.load_atomic(p.done, "acquire", 4, name="d", typ=I32)
    b.cbranch(b.icmp_unsigned("==", d, target, name="finished"), bb["out"], bb["wait"])
    b.position_at_end(bb["wait"])
    spin = b.load_atomic(p.spin_ticks, "monotonic", 8, name="spin", typ=I64)
    budget = b.shl(spin, I64(3), name="budget")
    call_named(b, "await_change", [p.done, d, p.caller_sleeping, budget], "d2")
    b.branch(bb["check"])
    b.position_at_end(bb["out"])
    b.ret_void()


# ---- the entry points -----------------------------------------------------------------------------------------

def _parallel_for(p: _Pool) -> None:
    """jitop_parallel_for(body, closure, n): run body over [0, n) in chunks on the pool. A call that cannot take
    `busy` (a nested call from inside a body, or a concurrent one) or that would use one thread runs the whole
    range serially in its own thread, so the pool can never deadlock on itself."""
    b, bb = p.define("jitop_parallel_for", VOID, [("body", BODY_PTR), ("closure", PTR), ("n", I64)],
                     ["entry", "size", "lock", "launch", "parallel", "wait", "unlock", "serial_unlock", "serial",
                      "out"], exported=True)
    body, closure, n = b.function.args
    b.cbranch(b.icmp_signed("<=", n, I64(0), name="empty"), bb["out"], bb["size"])
    b.position_at_end(bb["size"])
    nt32 = b.load_atomic(p.nthreads, "monotonic", 4, name="nt32", typ=I32)
    want = b.call(p.umin, [b.zext(nt32, I64, name="nt"), n], name="want")
    b.cbranch(b.icmp_unsigned("<=", want, I64(1), name="one"), bb["serial"], bb["lock"])
    b.position_at_end(bb["lock"])
    cx = b.cmpxchg(p.busy, I32(0), I32(1), "acquire", "monotonic", name="cx")
    b.cbranch(b.extract_value(cx, 1, name="got"), bb["launch"], bb["serial"])  # busy: nested or concurrent call
    b.position_at_end(bb["launch"])
    k = call_named(b, "ensure_workers", [want], "k")
    b.cbranch(b.icmp_unsigned("<=", k, I64(1), name="alone"), bb["serial_unlock"], bb["parallel"])
    b.position_at_end(bb["parallel"])
    most = b.mul(k, I64(p.chunks_per_thread), name="most")
    chunks = b.call(p.umin, [n, most], name="chunks")
    call_named(b, "publish", [body, closure, n, chunks])
    call_named(b, "start_workers", [k])
    ran = call_named(b, "work", [chunks, I1(0)], "ran")
    b.cbranch(call_named(b, "report", [ran], "last"), bb["unlock"], bb["wait"])
    b.position_at_end(bb["wait"])
    call_named(b, "await_chunks", [chunks])
    b.branch(bb["unlock"])
    for unlock, then in (("unlock", "out"), ("serial_unlock", "serial")):
        b.position_at_end(bb[unlock])
        _store_atomic(b, I32(0), p.busy, "release", 4)
        b.branch(bb[then])
    b.position_at_end(bb["serial"])
    b.call(body, [I64(0), n, closure])
    b.branch(bb["out"])
    b.position_at_end(bb["out"])
    b.ret_void()


def _configure(p: _Pool) -> None:
    """jitop_parallel_configure(n, spin, oversubscribed): set the thread count, the spin budget and whether
    threads outnumber CPUs, and read the process's CPUs (sched_getaffinity) for steer_away."""
    b, _ = p.define("jitop_parallel_configure", VOID, [("n", I32), ("spin", I64), ("oversubscribed", I32)],
                    ["entry"], exported=True)
    n, spin, over = b.function.args
    _store_atomic(b, n, p.nthreads, "monotonic", 4)
    _store_atomic(b, spin, p.spin_ticks, "monotonic", 8)
    _store_atomic(b, over, p.oversubscribed, "monotonic", 4)
    p.sys(b, SYS_SCHED_GETAFFINITY, I64(0), I64(CPU_SET_BYTES), p.cpu_mask)
    b.ret_void()


def _after_fork(p: _Pool) -> None:
    """jitop_parallel_after_fork(): a forked child has none of the parent's workers: forget them, so launches
    respawn workers."""
    b, _ = p.define("jitop_parallel_after_fork", VOID, [], ["entry"], exported=True)
    for var in (p.busy, p.nstarted, p.done, p.caller_sleeping):
        b.store(I32(0), var, align=4)
    memset = b.call(p.memset, [p.slots, I8(0), I64(p.slots_bytes), I1(0)], arg_attrs={0: ()})
    memset.arg_attributes[0].align = ALIGN
    b.ret_void()


def _awake_workers(p: _Pool) -> None:
    """jitop_parallel_awake_workers() -> how many workers are not (yet) asleep in the kernel; used to let the
    pool settle before exit."""
    b, bb = p.define("jitop_parallel_awake_workers", I32, [], ["entry", "loop", "body", "out"], exported=True)
    n = b.load_atomic(p.nstarted, "monotonic", 4, name="n", typ=I32)
    n64 = b.zext(n, I64, name="n64")
    b.branch(bb["loop"])
    b.position_at_end(bb["loop"])
    i = b.phi(I64, name="i")
    awake = b.phi(I32, name="awake")
    b.cbranch(b.icmp_unsigned(">", i, n64, name="past"), bb["out"], bb["body"])
    b.position_at_end(bb["body"])
    s = b.load_atomic(p.slot(b, i, SLEEPING, "sleeping"), "monotonic", 4, name="s", typ=I32)
    inc = b.zext(b.icmp_unsigned("==", s, I32(0), name="is_awake"), I32, name="inc")
    awake1 = b.add(awake, inc, name="awake1")
    next_ = b.add(i, I64(1), name="next")
    b.branch(bb["loop"])
    b.position_at_end(bb["out"])
    b.ret(awake)
    i.add_incoming(I64(1), bb["entry"])
    i.add_incoming(next_, bb["body"])
    awake.add_incoming(I32(0), bb["entry"])
    awake.add_incoming(awake1, bb["body"])


_FUNCTIONS = (_futex_wait, _futex_wake_one, _await_change, _run_chunk, _work, _report, _test_delay, _worker_main,
              _spawn_worker, _ensure_workers, _publish, _steer_away, _start_workers, _await_chunks, _parallel_for,
              _configure, _after_fork, _awake_workers)   # each after the functions it calls


def pool_module(max_threads: int, num_threads: int, spin_ticks: int, chunks_per_thread: int) -> ir.Module:
    """The pool's IR: a slot table of `max_threads` workers (slot 0 unused); `num_threads` and `spin_ticks`, the
    thread count and the TSC ticks a waiter spins before it sleeps until jitop_parallel_configure sets them (a
    library built from the object never calls it); a launch of k threads makes up to `chunks_per_thread` * k
    chunks."""
    p = _Pool(max_threads, num_threads, spin_ticks, chunks_per_thread)
    for define in _FUNCTIONS:
        define(p)
    return p.module
