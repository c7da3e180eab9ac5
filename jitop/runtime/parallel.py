"""A persistent thread pool for generated kernels, written in LLVM IR.

Generated code runs a parallel loop by calling the C ABI

    void jitop_parallel_for(void (*body)(int64_t begin, int64_t end, void *closure),
                            void *closure, int64_t n);

which splits [0, n) into c = min(n, CHUNKS_PER_THREAD * k) contiguous, balanced chunks
(k = min(num_threads, n) threads): chunk i gets n // c elements, plus one if i < n % c. The
calling thread and the workers claim chunks one at a time until none is left (OpenMP's
schedule(dynamic)), so a worker that wakes late, or is descheduled, costs the launch at most
the chunk it holds, not a k-th of the range; the call returns when every chunk has run.

Protocol (all state lives in the IR module's globals):

- `busy` is a try-lock taken with cmpxchg. A call that cannot take it (a nested call from
  inside a body, or a concurrent call from another thread) runs the whole range serially in
  its own thread, so the pool can never deadlock on itself. So does a call with k == 1.
- The caller publishes a launch by writing the job (body, closure, n, c), zeroing the *done
  counter*, and then storing the unclaimed chunks [0, c) into `range` (front << 32 | back)
  with release. Each worker owns a cache-line-sized slot holding a *generation counter* and a
  `sleeping` flag; the caller then bumps the generation of slots 1..k-1 with a seq_cst
  atomicrmw (workers beyond k are not signalled at all, so they keep sleeping), and claims
  chunks itself.
- A claim is a cmpxchg (acquire) of `range` that takes its front chunk (the caller) or its
  back chunk (a worker): threads on time keep the same part of the range from launch to
  launch, so their data stays in their caches (one shared end measured ~3% slower on a
  2-thread matmul). `range` is empty between launches, so no claim
  succeeds before the release store that publishes the job. A thread runs the chunks it
  claimed, then adds their number to the done counter (a thread that claimed nothing
  touches nothing); the launch is finished when that reaches c. The caller, after its own
  claims, waits for it and then releases `busy`; the thread whose add reaches c wakes the
  caller if the caller went to sleep.
- Late workers need no generation number: a launch cannot finish while a thread holds
  claimed chunks it has not counted, so between its first claim and its add a thread's
  claims, its reads of the job and its add all belong to one launch. A worker reads `range`
  after it wakes and claims with that guess; if the launch has finished meanwhile, the
  guess's cmpxchg fails (`range` is empty until the next launch is published) or succeeds as
  an ordinary claim in the next launch, whose job the worker reads only after the claim.
  Workers never read the job before claiming, so they hold no stale job state.
- Waiting (a worker for its generation, the caller for the done counter) first spins with
  `pause` for about SPIN_TICKS time-stamp-counter ticks (~100 us; the caller, blocked in the
  launch anyway, 8x longer), so back-to-back launches cost a cache-line round trip, then
  sleeps on the word with FUTEX_WAIT, so an idle pool uses no CPU. With more threads than
  CPUs the spin calls sched_yield instead of `pause`, so a waiter hands its core to the
  thread it waits for.
- Before waking a sleeping worker the caller keeps it off the caller's own CPU with
  sched_setaffinity (see `steer_away`): otherwise, on virtual machines, the woken worker
  queues behind the caller and gets to claim nothing: the caller runs every chunk alone.
- No wake-up is lost: the sleeper stores `sleeping = 1` and then re-reads the word, the waker
  changes the word and then reads `sleeping` (both seq_cst, Dekker-style), so at least one
  sees the other; FUTEX_WAIT itself re-checks the word in the kernel. The waker makes the
  futex syscall only when the sleeper announced that it sleeps.

Workers are created lazily with pthread_create when a launch first needs them, are detached,
never exit and block every signal (signals go to Python's threads). Lowering the thread
count makes the surplus workers idle (asleep on their futex); raising it again reuses them.
Tests can make every worker sleep `jitop_pool_test_delay_ns` nanoseconds between reading
`range` and claiming (`_Pool.test_delay_ns`; 0 by default, which costs a load and a branch).
At interpreter exit we wait briefly until every worker sleeps in the kernel, so none is still
executing JIT code when LLVM frees it; the process then exits without joining them. A forked
child forgets the parent's workers (they do not exist there) and creates its own.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import ctypes
import os
import threading
import time
import warnings
from typing import Any, Callable

import llvmlite.binding as llvm

from jitop import config
from jitop.codegen.loader import load_object
from jitop.codegen.target import compile_ir, llvm_version
from jitop.target import Target

__all__ = ["MAX_THREADS", "get_num_threads", "parallel_for_address", "pool_object_code", "run_parallel",
           "set_num_threads"]

MAX_THREADS = 256       # size of the worker-slot table in the IR
SPIN_TICKS = 1 << 18    # TSC ticks a waiter spins before it sleeps (~100 us at 2.6 GHz)
CHUNKS_PER_THREAD = 8   # a launch of k threads claims up to 8k chunks: claims stay rare, the tail short
_LIBC_SYMBOLS = ("memcpy", "memset", "pthread_create", "pthread_detach", "pthread_sigmask", "sched_getcpu",
                 "sigfillset", "syscall")


def _default_num_threads() -> int:
    return min(config.num_threads(), MAX_THREADS)


# ---------------------------------------------------------------------------------------
# The pool in LLVM IR. Every shared word sits in its own 128-byte block (two cache lines,
# because Zen and Intel prefetch adjacent lines) so the caller and workers don't false-share.
# ---------------------------------------------------------------------------------------
_POOL_IR = r"""
%Job = type { ptr, ptr, i64, i64 }        ; body, closure, n, nchunks
%Slot = type { i32, i32, i32, i32, [112 x i8] }   ; generation (futex word), sleeping, tid,
                                                 ; 1 + the CPU it is kept off, padding

@busy = internal global i32 0, align 128            ; try-lock held by the launching thread
@nthreads = internal global i32 NUM_THREADS, align 128   ; thread count (caller included)
@spin_ticks = internal global i64 SPIN_TICKS, align 128  ; how long a waiter spins before it sleeps
@oversubscribed = internal global i32 0, align 128  ; more threads than CPUs
@cpu_mask = internal global [16 x i64] zeroinitializer, align 128   ; the process's CPUs (cpu_set_t)
@nstarted = internal global i32 0, align 128        ; workers created so far (they never exit)
@job = internal global %Job zeroinitializer, align 128
@range = internal global i64 0, align 128           ; front << 32 | back: chunks [front, back) are unclaimed
@done = internal global i32 0, align 128            ; chunks finished this launch, by any thread
@jitop_pool_test_delay_ns = global i64 0, align 128 ; tests only: workers sleep this long before claiming
@caller_sleeping = internal global i32 0, align 128
@slots = internal global [MAX_THREADS x %Slot] zeroinitializer, align 128   ; slot 0 unused

declare i64 @syscall(i64, ...)
declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_detach(i64)
declare i32 @pthread_sigmask(i32, ptr, ptr)
declare i32 @sigfillset(ptr)
declare void @llvm.x86.sse2.pause()
declare i64 @llvm.readcyclecounter()

; Bodies are generated code and never unwind (no C++ exceptions cross the pool).
attributes #0 = { nounwind }

; ---- futex: SYS_futex = 202, FUTEX_WAIT_PRIVATE = 128, FUTEX_WAKE_PRIVATE = 129 ----------
; syscall() reads every argument as a long, so all are passed as i64.

define internal void @futex_wait(ptr %word, i32 %expected) #0 {
  %val = zext i32 %expected to i64
  %r = call i64 (i64, ...) @syscall(i64 202, ptr %word, i64 128, i64 %val, ptr null)
  ret void
}

define internal void @futex_wake_one(ptr %word) #0 {
  %r = call i64 (i64, ...) @syscall(i64 202, ptr %word, i64 129, i64 1)
  ret void
}

; Wait until *word != old and return the new value: spin, then sleep on the futex.
define internal i32 @await_change(ptr %word, i32 %old, ptr %sleeping, i64 %budget) #0 {
entry:
  %t0 = call i64 @llvm.readcyclecounter()
  %over = load atomic i32, ptr @oversubscribed monotonic, align 4
  %yield = icmp ne i32 %over, 0
  br label %check
check:
  %v = load atomic i32, ptr %word acquire, align 4
  %changed = icmp ne i32 %v, %old
  br i1 %changed, label %out, label %relax
relax:
  br i1 %yield, label %yield_cpu, label %pause
yield_cpu:
  %r = call i64 (i64, ...) @syscall(i64 24)      ; SYS_sched_yield
  br label %clock
pause:
  call void @llvm.x86.sse2.pause()
  br label %clock
clock:
  %t = call i64 @llvm.readcyclecounter()
  %elapsed = sub i64 %t, %t0
  %spin = icmp ult i64 %elapsed, %budget
  br i1 %spin, label %check, label %sleep
sleep:
  ; announce, then re-check: the waker changes *word before it reads *sleeping
  store atomic i32 1, ptr %sleeping seq_cst, align 4
  %v2 = load atomic i32, ptr %word seq_cst, align 4
  %same = icmp eq i32 %v2, %old
  br i1 %same, label %wait, label %woke
wait:
  call void @futex_wait(ptr %word, i32 %old)
  br label %woke
woke:
  store atomic i32 0, ptr %sleeping monotonic, align 4
  br label %check             ; spin budget is spent: a spurious wake-up sleeps again at once
out:
  ret i32 %v
}

; ---- work ------------------------------------------------------------------------------

; Run chunk i of the job: chunks are balanced, n/nchunks iterations each and the first
; n%nchunks one more. Called only right after claiming the chunk, so the launch cannot have
; finished and the job is the one the claim belongs to.
define internal void @run_chunk(i64 %i) #0 {
  %body = load ptr, ptr @job, align 8
  %closure.p = getelementptr %Job, ptr @job, i32 0, i32 1
  %closure = load ptr, ptr %closure.p, align 8
  %n.p = getelementptr %Job, ptr @job, i32 0, i32 2
  %n = load i64, ptr %n.p, align 8
  %chunks.p = getelementptr %Job, ptr @job, i32 0, i32 3
  %chunks = load i64, ptr %chunks.p, align 8
  %base = udiv i64 %n, %chunks
  %rem = urem i64 %n, %chunks
  %extra = call i64 @llvm.umin.i64(i64 %i, i64 %rem)
  %skip = mul i64 %i, %base
  %begin = add i64 %skip, %extra
  %has_extra = icmp ult i64 %i, %rem
  %one = zext i1 %has_extra to i64
  %len = add i64 %base, %one
  %end = add i64 %begin, %len
  call void %body(i64 %begin, i64 %end, ptr %closure)
  ret void
}

declare i64 @llvm.umin.i64(i64, i64)

; Claim chunks and run them until none is left; return how many ran. The caller claims from
; the front of the unclaimed range, workers from the back, so threads that arrive on time keep
; the same part of the range from launch to launch (with two threads, as a static split does).
; `guess` is a read of @range, possibly stale: the cmpxchg corrects it. The first successful
; claim ties this thread to the launch then running, which cannot finish before this thread
; reports its chunks; so every claim, and every read of the job, is of that one launch.
define internal i32 @work(i64 %guess, i1 %from_back) #0 {
entry:
  br label %check
check:
  %range = phi i64 [ %guess, %entry ], [ %taken, %ran ], [ %actual, %claim ]
  %count = phi i32 [ 0, %entry ], [ %count1, %ran ], [ %count, %claim ]
  %front = lshr i64 %range, 32
  %back = and i64 %range, 4294967295
  %none = icmp uge i64 %front, %back
  br i1 %none, label %out, label %claim
claim:
  %back1 = sub i64 %back, 1
  %chunk = select i1 %from_back, i64 %back1, i64 %front
  %step = select i1 %from_back, i64 -1, i64 4294967296     ; back - 1, or front + 1
  %taken = add i64 %range, %step
  %cx = cmpxchg ptr @range, i64 %range, i64 %taken acquire monotonic, align 8
  %actual = extractvalue { i64, i1 } %cx, 0
  %ok = extractvalue { i64, i1 } %cx, 1
  br i1 %ok, label %ran, label %check          ; lost the race: retry with the actual value
ran:
  call void @run_chunk(i64 %chunk)
  %count1 = add i32 %count, 1
  br label %check             ; %taken is the likeliest value of @range now; a miss costs one retry
out:
  ret i32 %count
}

; Add `ran` chunks to @done and return whether that finished the launch. Only a thread that
; ran chunks of the current launch calls this, before which the launch cannot finish, so the
; job (and @done) still belong to it.
define internal i1 @report(i32 %ran) #0 {
  %chunks.p = getelementptr %Job, ptr @job, i32 0, i32 3
  %chunks = load i64, ptr %chunks.p, align 8
  %chunks32 = trunc i64 %chunks to i32
  %prev = atomicrmw add ptr @done, i32 %ran seq_cst, align 4
  %count = add i32 %prev, %ran
  %last = icmp eq i32 %count, %chunks32
  ret i1 %last
}

; Tests only: hold a worker between reading @range and claiming, as a late wake-up would.
define internal void @test_delay() #0 {
entry:
  %ns = load atomic i64, ptr @jitop_pool_test_delay_ns monotonic, align 8
  %off = icmp eq i64 %ns, 0
  br i1 %off, label %out, label %sleep
sleep:
  %ts = alloca { i64, i64 }, align 8
  %sec = udiv i64 %ns, 1000000000
  %nsec = urem i64 %ns, 1000000000
  store i64 %sec, ptr %ts, align 8
  %nsec.p = getelementptr { i64, i64 }, ptr %ts, i32 0, i32 1
  store i64 %nsec, ptr %nsec.p, align 8
  %r = call i64 (i64, ...) @syscall(i64 35, ptr %ts, ptr null)   ; nanosleep (signals are blocked)
  br label %out
out:
  ret void
}

define internal ptr @worker_main(ptr %arg) #0 {
entry:
  %idx = ptrtoint ptr %arg to i64
  %gen = getelementptr [MAX_THREADS x %Slot], ptr @slots, i64 0, i64 %idx, i32 0
  %sleeping = getelementptr [MAX_THREADS x %Slot], ptr @slots, i64 0, i64 %idx, i32 1
  %tid.p = getelementptr [MAX_THREADS x %Slot], ptr @slots, i64 0, i64 %idx, i32 2
  %tid = call i64 (i64, ...) @syscall(i64 186)       ; gettid, for steer_away
  %tid32 = trunc i64 %tid to i32
  store atomic i32 %tid32, ptr %tid.p monotonic, align 4   ; published by the seq_cst `sleeping` store
  %seen = alloca i32, align 4
  store i32 0, ptr %seen, align 4    ; the slot was never signalled before this thread existed
  br label %loop
loop:
  %old = load i32, ptr %seen, align 4
  %budget = load atomic i64, ptr @spin_ticks monotonic, align 8
  %new = call i32 @await_change(ptr %gen, i32 %old, ptr %sleeping, i64 %budget)
  store i32 %new, ptr %seen, align 4
  %guess = load atomic i64, ptr @range monotonic, align 8
  call void @test_delay()    ; a late worker's guess is stale: work() must cope
  %ran = call i32 @work(i64 %guess, i1 true)
  %any = icmp ne i32 %ran, 0
  br i1 %any, label %report, label %loop       ; nothing claimed: touch nothing of the launch
report:
  %last = call i1 @report(i32 %ran)
  br i1 %last, label %maybe_wake, label %loop
maybe_wake:
  %s = load atomic i32, ptr @caller_sleeping seq_cst, align 4
  %asleep = icmp ne i32 %s, 0
  br i1 %asleep, label %wake, label %loop
wake:
  call void @futex_wake_one(ptr @done)
  br label %loop
}

; ---- launching -------------------------------------------------------------------------

; Create worker `idx` with all signals blocked (the new thread inherits the mask).
define internal i1 @spawn_worker(i64 %idx) #0 {
entry:
  %tid = alloca i64, align 8
  %all = alloca [128 x i8], align 8        ; sigset_t
  %saved = alloca [128 x i8], align 8
  %r0 = call i32 @sigfillset(ptr %all)
  %r1 = call i32 @pthread_sigmask(i32 2, ptr %all, ptr %saved)      ; SIG_SETMASK
  %arg = inttoptr i64 %idx to ptr
  %rc = call i32 @pthread_create(ptr %tid, ptr null, ptr @worker_main, ptr %arg)
  %r2 = call i32 @pthread_sigmask(i32 2, ptr %saved, ptr null)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %detach, label %out
detach:
  %t = load i64, ptr %tid, align 8
  %r3 = call i32 @pthread_detach(i64 %t)
  br label %out
out:
  ret i1 %ok
}

; Make sure workers 1..want-1 exist; return how many chunks we can run (fewer if
; pthread_create failed). Called with `busy` held.
define internal i64 @ensure_workers(i64 %want) #0 {
entry:
  br label %check
check:
  %have32 = load atomic i32, ptr @nstarted monotonic, align 4
  %have = zext i32 %have32 to i64
  %more = add i64 %have, 1
  %short = icmp ult i64 %more, %want
  br i1 %short, label %spawn, label %out
spawn:
  %ok = call i1 @spawn_worker(i64 %more)
  br i1 %ok, label %count, label %out
count:
  %have1 = add i32 %have32, 1
  store atomic i32 %have1, ptr @nstarted monotonic, align 4
  br label %check
out:
  %usable = call i64 @llvm.umin.i64(i64 %want, i64 %more)
  ret i64 %usable
}

; Publish a job of `chunks` chunks. @range is empty between launches, so no claim succeeds
; until the release store below, which makes the job and the reset @done visible to claimers.
define internal void @publish(ptr %body, ptr %closure, i64 %n, i64 %chunks) #0 {
  %job.0 = insertvalue %Job poison, ptr %body, 0
  %job.1 = insertvalue %Job %job.0, ptr %closure, 1
  %job.2 = insertvalue %Job %job.1, i64 %n, 2
  %job.3 = insertvalue %Job %job.2, i64 %chunks, 3
  store %Job %job.3, ptr @job, align 8
  store atomic i32 0, ptr @done monotonic, align 4
  store atomic i64 %chunks, ptr @range release, align 8   ; [0, chunks)
  ret void
}

; Bump the generation of workers 1..k-1, waking those asleep.
define internal void @start_workers(i64 %k) #0 {
entry:
  br label %loop
loop:
  %i = phi i64 [ 1, %entry ], [ %next, %signalled ]
  %gen = getelementptr [MAX_THREADS x %Slot], ptr @slots, i64 0, i64 %i, i32 0
  %sleeping = getelementptr [MAX_THREADS x %Slot], ptr @slots, i64 0, i64 %i, i32 1
  %prev = atomicrmw add ptr %gen, i32 1 seq_cst, align 4
  %s = load atomic i32, ptr %sleeping seq_cst, align 4
  %asleep = icmp ne i32 %s, 0
  br i1 %asleep, label %wake, label %signalled
wake:
  call void @steer_away(i64 %i)
  call void @futex_wake_one(ptr %gen)
  br label %signalled
signalled:
  %next = add i64 %i, 1
  %again = icmp ult i64 %next, %k
  br i1 %again, label %loop, label %out
out:
  ret void
}

; Keep a sleeping worker off the caller's CPU before waking it. A Linux guest sees its halted
; vCPUs as "preempted", not idle, so it queues a woken thread behind the waker on the waker's
; own CPU, and the chunks then run one after the other until the load balancer steps in
; (~1 ms). Only when the caller's CPU differs from last time is the mask changed.
define internal void @steer_away(i64 %i) #0 {
entry:
  %over = load atomic i32, ptr @oversubscribed monotonic, align 4
  %shared = icmp ne i32 %over, 0                 ; oversubscribed: threads must share CPUs
  %cpu = call i32 @sched_getcpu()
  %unknown = icmp uge i32 %cpu, 1024             ; -1 on error, or beyond cpu_set_t
  %skip = or i1 %shared, %unknown
  br i1 %skip, label %out, label %check
check:
  %ex.p = getelementptr [MAX_THREADS x %Slot], ptr @slots, i64 0, i64 %i, i32 3
  %ex = load i32, ptr %ex.p, align 4
  %tag = add i32 %cpu, 1
  %same = icmp eq i32 %ex, %tag
  br i1 %same, label %out, label %set
set:
  store i32 %tag, ptr %ex.p, align 4
  %mask = alloca [16 x i64], align 8
  call void @llvm.memcpy.p0.p0.i64(ptr %mask, ptr @cpu_mask, i64 128, i1 false)
  %word = lshr i32 %cpu, 6
  %word.p = getelementptr [16 x i64], ptr %mask, i32 0, i32 %word
  %bits = load i64, ptr %word.p, align 8
  %bit = and i32 %cpu, 63
  %bit64 = zext i32 %bit to i64
  %one = shl i64 1, %bit64
  %keep = xor i64 %one, -1
  %cleared = and i64 %bits, %keep
  store i64 %cleared, ptr %word.p, align 8
  %tid.p = getelementptr [MAX_THREADS x %Slot], ptr @slots, i64 0, i64 %i, i32 2
  %tid = load atomic i32, ptr %tid.p monotonic, align 4
  %tid64 = zext i32 %tid to i64
  %r = call i64 (i64, ...) @syscall(i64 203, i64 %tid64, i64 128, ptr %mask)   ; sched_setaffinity
  br label %out
out:
  ret void
}

declare i32 @sched_getcpu()
declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)

; Wait until every chunk of the launch has finished (the caller has claimed, run and reported its own).
define internal void @await_chunks(i64 %chunks) #0 {
entry:
  %target = trunc i64 %chunks to i32
  br label %check
check:
  %d = load atomic i32, ptr @done acquire, align 4
  %finished = icmp eq i32 %d, %target
  br i1 %finished, label %out, label %wait
wait:
  ; The caller is blocked in this launch anyway, so it spins longer than an idle worker:
  ; waking a sleeping thread costs 20 us to milliseconds on a virtual machine.
  %spin = load atomic i64, ptr @spin_ticks monotonic, align 8
  %budget = shl i64 %spin, 3
  %d2 = call i32 @await_change(ptr @done, i32 %d, ptr @caller_sleeping, i64 %budget)
  br label %check
out:
  ret void
}

define void @jitop_parallel_for(ptr %body, ptr %closure, i64 %n) #0 {
entry:
  %empty = icmp sle i64 %n, 0
  br i1 %empty, label %out, label %size
size:
  %nt32 = load atomic i32, ptr @nthreads monotonic, align 4
  %nt = zext i32 %nt32 to i64
  %want = call i64 @llvm.umin.i64(i64 %nt, i64 %n)
  %one = icmp ule i64 %want, 1
  br i1 %one, label %serial, label %lock
lock:
  %cx = cmpxchg ptr @busy, i32 0, i32 1 acquire monotonic, align 4
  %got = extractvalue { i32, i1 } %cx, 1
  br i1 %got, label %launch, label %serial      ; pool busy (nested or concurrent call)
launch:
  %k = call i64 @ensure_workers(i64 %want)
  %alone = icmp ule i64 %k, 1
  br i1 %alone, label %serial_unlock, label %parallel
parallel:
  %most = mul i64 %k, CHUNKS_PER_THREAD
  %chunks = call i64 @llvm.umin.i64(i64 %n, i64 %most)
  call void @publish(ptr %body, ptr %closure, i64 %n, i64 %chunks)
  call void @start_workers(i64 %k)
  %ran = call i32 @work(i64 %chunks, i1 false)
  %last = call i1 @report(i32 %ran)
  br i1 %last, label %unlock, label %wait
wait:
  call void @await_chunks(i64 %chunks)
  br label %unlock
unlock:
  store atomic i32 0, ptr @busy release, align 4
  br label %out
serial_unlock:
  store atomic i32 0, ptr @busy release, align 4
  br label %serial
serial:
  call void %body(i64 0, i64 %n, ptr %closure)
  br label %out
out:
  ret void
}

define void @jitop_parallel_configure(i32 %n, i64 %spin, i32 %oversubscribed) #0 {
  store atomic i32 %n, ptr @nthreads monotonic, align 4
  store atomic i64 %spin, ptr @spin_ticks monotonic, align 8
  store atomic i32 %oversubscribed, ptr @oversubscribed monotonic, align 4
  %r = call i64 (i64, ...) @syscall(i64 204, i64 0, i64 128, ptr @cpu_mask)   ; sched_getaffinity
  ret void
}

; A forked child has none of the parent's workers: forget them, so launches respawn workers.
define void @jitop_parallel_after_fork() #0 {
  store i32 0, ptr @busy, align 4
  store i32 0, ptr @nstarted, align 4
  store i32 0, ptr @done, align 4
  store i32 0, ptr @caller_sleeping, align 4
  call void @llvm.memset.p0.i64(ptr align 128 @slots, i8 0, i64 SLOTS_BYTES, i1 false)
  ret void
}

declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)

; Workers not (yet) asleep in the kernel; used to let the pool settle before exit.
define i32 @jitop_parallel_awake_workers() #0 {
entry:
  %n = load atomic i32, ptr @nstarted monotonic, align 4
  %n64 = zext i32 %n to i64
  br label %loop
loop:
  %i = phi i64 [ 1, %entry ], [ %next, %body ]
  %awake = phi i32 [ 0, %entry ], [ %awake1, %body ]
  %past = icmp ugt i64 %i, %n64
  br i1 %past, label %out, label %body
body:
  %sleeping = getelementptr [MAX_THREADS x %Slot], ptr @slots, i64 0, i64 %i, i32 1
  %s = load atomic i32, ptr %sleeping monotonic, align 4
  %is_awake = icmp eq i32 %s, 0
  %inc = zext i1 %is_awake to i32
  %awake1 = add i32 %awake, %inc
  %next = add i64 %i, 1
  br label %loop
out:
  ret i32 %awake
}
"""

_ParallelForFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class _Pool:
    """The loaded pool: symbol addresses and ctypes entry points."""

    def __init__(self, addrs: dict[str, int], object_code: bytes):
        self.object_code = object_code
        self.parallel_for_addr = addrs["jitop_parallel_for"]
        self.parallel_for = _ParallelForFn(self.parallel_for_addr)
        configure_fn = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int64, ctypes.c_int32)
        self.configure = configure_fn(addrs["jitop_parallel_configure"])    # threads, spin, oversubscribed
        self.awake_workers = ctypes.CFUNCTYPE(ctypes.c_int32)(addrs["jitop_parallel_awake_workers"])
        self.after_fork = ctypes.CFUNCTYPE(None)(addrs["jitop_parallel_after_fork"])
        # tests only: nanoseconds each worker sleeps between reading `range` and claiming
        self.test_delay_ns = ctypes.c_int64.from_address(addrs["jitop_pool_test_delay_ns"])


_lock = threading.Lock()
_pool: _Pool | None = None
_num_threads = _default_num_threads()


def _register_libc_symbols() -> None:
    # MCJIT resolves external names through LLVM's symbol table, which does not see libc's
    # exports unless we hand them over.
    libc = ctypes.CDLL(None)
    for name in _LIBC_SYMBOLS:
        llvm.add_symbol(name, ctypes.cast(getattr(libc, name), ctypes.c_void_p).value)


def _build_pool() -> _Pool:
    _register_libc_symbols()
    # the initial values matter only where nothing calls configure (a library built from the object)
    ll = (_POOL_IR.replace("MAX_THREADS", str(MAX_THREADS)).replace("SLOTS_BYTES", str(MAX_THREADS * 128))
          .replace("NUM_THREADS", str(_num_threads)).replace("SPIN_TICKS", str(SPIN_TICKS))
          .replace("CHUNKS_PER_THREAD", str(CHUNKS_PER_THREAD)))
    obj, addrs = _pool_object(ll)
    llvm.add_symbol("jitop_parallel_for", addrs["jitop_parallel_for"])
    pool = _Pool(addrs, obj)
    pool.configure(_num_threads, SPIN_TICKS, _oversubscribed(_num_threads))
    atexit.register(_settle, pool)
    os.register_at_fork(after_in_child=pool.after_fork)
    return pool


class _NoStore:
    def get(self, key: str) -> None:
        return None

    def put(self, key: str, value: bytes) -> None:
        pass

    def delete(self, key: str) -> None:
        pass


_object_store = _NoStore  # makes the persistent cache; installed by the layer that owns it (use_object_store)


def use_object_store(make_store: Callable[[], Any]) -> None:
    """Where the pool keeps its object code between processes: `make_store()` (called when the pool is
    first built) returns anything with get(key) -> bytes | None, put(key, bytes) and delete(key)."""
    global _object_store
    _object_store = make_store


def _pool_object(ll: str) -> tuple[bytes, dict[str, int]]:
    """Object code of the pool for this machine, loaded, and its symbols' addresses: from the object store,
    else compiled (and stored). A stored object that does not load (not an object file, or one without the
    pool's symbols: another component's) is removed and compiled afresh: the cache never leaves the pool
    unavailable, and the kernels that need it running as numpy, from one process to the next."""
    host = Target.host()
    key = "pool-" + hashlib.sha256(json.dumps([ll, host.triple, host.cpu, host.features, llvm_version()]).encode()).hexdigest()
    store = _object_store()
    obj = store.get(key)
    if obj is not None:
        try:
            return obj, _load_pool(obj)
        except (ValueError, RuntimeError):
            getattr(store, "delete", lambda _: None)(key)
    # Launch cost is cache-line transfers and syscalls, not instruction quality: the IR
    # optimiser leaves it unchanged (measured) and would double the first-use compile time.
    _, obj = compile_ir(ll, host, speed_level=0)
    addrs = _load_pool(obj)
    store.put(key, obj)
    return obj, addrs


def _load_pool(obj: bytes) -> dict[str, int]:
    return load_object(obj, ["jitop_parallel_for", "jitop_parallel_configure", "jitop_parallel_awake_workers",
                             "jitop_parallel_after_fork"], ["jitop_pool_test_delay_ns"])


def _get_pool() -> _Pool:
    global _pool
    if _pool is None:
        with _lock:
            if _pool is None:
                _pool = _build_pool()
    return _pool


def _oversubscribed(nthreads: int) -> bool:
    # With more threads than CPUs, a waiter spinning on `pause` holds the core that the thread
    # it waits for needs (a launch then costs a scheduler time slice): spin on sched_yield.
    return nthreads > len(os.sched_getaffinity(0))


def _settle(pool: _Pool, timeout: float = 1.0) -> None:
    # Wait (bounded) until every worker sleeps in FUTEX_WAIT, so none is still running JIT
    # code when interpreter teardown frees it; exit_group then ends the sleeping threads.
    deadline = time.monotonic() + timeout
    while pool.awake_workers() and time.monotonic() < deadline:
        time.sleep(1e-4)


def parallel_for_address() -> int:
    """Address of `jitop_parallel_for`, compiling and loading the pool on first use.

    The symbol is also registered with LLVM, so object code loaded later that calls
    `jitop_parallel_for` links against it.

    >>> addr = parallel_for_address()   # doctest: +SKIP
    """
    return _get_pool().parallel_for_addr


def pool_object_code() -> bytes:
    """The pool's object code for this host CPU, e.g. to link into a shared library with kernels.

    Outside this process nothing calls the configure function: such a library uses the thread
    count in effect when the pool was compiled.

    >>> open("pool.o", "wb").write(pool_object_code())   # doctest: +SKIP
    """
    return _get_pool().object_code


def run_parallel(body_address: int, closure_address: int | None, n: int) -> None:
    """Call `jitop_parallel_for(body, closure, n)` from Python (the GIL is released).

    >>> run_parallel(body_fn_address, ctypes.addressof(buf), len(buf))   # doctest: +SKIP
    """
    _get_pool().parallel_for(body_address, closure_address, n)


def set_num_threads(n: int) -> None:
    """Use `n` threads (the caller included) for later parallel loops; 1 runs loops serially.

    Workers beyond `n` stay asleep; raising `n` again reuses or creates workers.

    >>> set_num_threads(2)   # doctest: +SKIP
    """
    global _num_threads
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_THREADS:
        raise ValueError(f"set_num_threads: expected an integer in [1, {MAX_THREADS}], got {n!r}")
    with _lock:
        _num_threads = n
        if _pool is not None:
            _pool.configure(n, SPIN_TICKS, _oversubscribed(n))


def get_num_threads() -> int:
    """The number of threads parallel loops use (default: JITOP_NUM_THREADS, OMP_NUM_THREADS, all CPUs)."""
    return _num_threads
