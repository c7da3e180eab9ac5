"""A persistent thread pool for generated kernels, written in LLVM IR (built by jitop.runtime.pool_ir).

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
import ctypes
import os
import threading
import time
import warnings
from typing import Any, Callable

import llvmlite.binding as llvm

from jitop import config
from jitop.codegen.loader import load_object
from jitop.codegen.target import compile_ir
from jitop.runtime import ir_words, pool_ir
from jitop.runtime.object_key import NoStore, object_key
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
    obj, addrs = _pool_object([MAX_THREADS, _num_threads, SPIN_TICKS, CHUNKS_PER_THREAD])
    llvm.add_symbol("jitop_parallel_for", addrs["jitop_parallel_for"])
    pool = _Pool(addrs, obj)
    pool.configure(_num_threads, SPIN_TICKS, _oversubscribed(_num_threads))
    atexit.register(_settle, pool)
    os.register_at_fork(after_in_child=pool.after_fork)
    return pool


_object_store: Callable[[], Any] = NoStore  # makes the persistent cache; installed by the layer that owns it (use_object_store)


def use_object_store(make_store: Callable[[], Any]) -> None:
    """Where the pool keeps its object code between processes: `make_store()` (called when the pool is
    first built) returns anything with get(key) -> bytes | None, put(key, bytes) and delete(key)."""
    global _object_store
    _object_store = make_store


def _pool_object(parameters: list[int]) -> tuple[bytes, dict[str, int]]:
    """Object code of the pool for this machine, loaded, and its symbols' addresses: from the object store,
    else compiled (and stored). A stored object that does not load (not an object file, or one without the
    pool's symbols: another component's) is removed and compiled afresh: the cache never leaves the pool
    unavailable, and the kernels that need it running as numpy, from one process to the next."""
    key = object_key("pool", [pool_ir, ir_words], parameters)
    store = _object_store()
    obj = store.get(key)
    if obj is not None:
        try:
            return obj, _load_pool(obj)
        except (ValueError, RuntimeError):
            getattr(store, "delete", lambda _: None)(key)
    # Launch cost is cache-line transfers and syscalls, not instruction quality: the IR
    # optimiser leaves it unchanged (measured) and would double the first-use compile time.
    _, obj = compile_ir(str(pool_ir.pool_module(*parameters)), Target.host(), speed_level=0)
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
