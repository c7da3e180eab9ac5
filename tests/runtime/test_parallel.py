"""The LLVM-IR thread pool behind `jitop_parallel_for`: coverage, chunks, late workers, re-entrancy, no hangs.

Every call that could deadlock runs under a timeout guard (a daemon thread, or a subprocess),
so a hang fails the test instead of the whole run.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from jitop.codegen.loader import load_object
from jitop.codegen.target import compile_ir
from jitop.runtime import parallel
from jitop.runtime.parallel import get_num_threads, parallel_for_address, run_parallel, set_num_threads

TIMEOUT = 60.0
SIZES = [0, 1, 2, 3, 7, 1000, 1_000_003]
DriveFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
DriveListFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
REPO_ROOT = Path(parallel.__file__).parents[2]

# Test bodies. Each is `void body(i64 begin, i64 end, ptr closure)`.
BODIES_IR = r"""
declare void @jitop_parallel_for(ptr, ptr, i64)

; a[i] += 1 for i in [begin, end) (atomically, so an overlap would show as a 2)
define void @add_one(i64 %b, i64 %e, ptr %a) {
entry:
  %empty = icmp sge i64 %b, %e
  br i1 %empty, label %out, label %loop
loop:
  %i = phi i64 [ %b, %entry ], [ %next, %loop ]
  %p = getelementptr i64, ptr %a, i64 %i
  %old = atomicrmw add ptr %p, i64 1 monotonic, align 8
  %next = add i64 %i, 1
  %last = icmp eq i64 %next, %e
  br i1 %last, label %out, label %loop
out:
  ret void
}

; c[0] counts calls; call k stores its range at c[1 + 2k], c[2 + 2k]
define void @record_chunk(i64 %b, i64 %e, ptr %c) {
  %k = atomicrmw add ptr %c, i64 1 seq_cst, align 8
  %twice = shl i64 %k, 1
  %ib = add i64 %twice, 1
  %ie = add i64 %twice, 2
  %pb = getelementptr i64, ptr %c, i64 %ib
  %pe = getelementptr i64, ptr %c, i64 %ie
  store i64 %b, ptr %pb, align 8
  store i64 %e, ptr %pe, align 8
  ret void
}

; closure = {ptr a, i64 m}: for each i in [begin, end), a parallel add_one over row i (m items)
define void @nested(i64 %b, i64 %e, ptr %c) {
entry:
  %a = load ptr, ptr %c, align 8
  %mp = getelementptr i64, ptr %c, i64 1
  %m = load i64, ptr %mp, align 8
  %empty = icmp sge i64 %b, %e
  br i1 %empty, label %out, label %loop
loop:
  %i = phi i64 [ %b, %entry ], [ %next, %loop ]
  %off = mul i64 %i, %m
  %row = getelementptr i64, ptr %a, i64 %off
  call void @jitop_parallel_for(ptr @add_one, ptr %row, i64 %m)
  %next = add i64 %i, 1
  %last = icmp eq i64 %next, %e
  br i1 %last, label %out, label %loop
out:
  ret void
}

; a[i] = the calling thread's id for i in [begin, end)
define void @record_tid(i64 %b, i64 %e, ptr %a) {
entry:
  %empty = icmp sge i64 %b, %e
  br i1 %empty, label %out, label %tid
tid:
  %t = call i64 (i64, ...) @syscall(i64 186)    ; gettid
  br label %loop
loop:
  %i = phi i64 [ %b, %tid ], [ %next, %loop ]
  %p = getelementptr i64, ptr %a, i64 %i
  store i64 %t, ptr %p, align 8
  %next = add i64 %i, 1
  %last = icmp eq i64 %next, %e
  br i1 %last, label %out, label %loop
out:
  ret void
}

declare i64 @syscall(i64, ...)

; closure = {ptr a, i64 first_ns, i64 other_ns}: sleep first_ns if begin == 0, else other_ns,
; then add_one over [begin, end) of a
define void @sleepy_add_one(i64 %b, i64 %e, ptr %c) {
  %a = load ptr, ptr %c, align 8
  %first.p = getelementptr i64, ptr %c, i64 1
  %other.p = getelementptr i64, ptr %c, i64 2
  %first = load i64, ptr %first.p, align 8
  %other = load i64, ptr %other.p, align 8
  %at0 = icmp eq i64 %b, 0
  %ns = select i1 %at0, i64 %first, i64 %other
  %ts = alloca { i64, i64 }, align 8
  %sec = udiv i64 %ns, 1000000000
  %nsec = urem i64 %ns, 1000000000
  store i64 %sec, ptr %ts, align 8
  %nsec.p = getelementptr { i64, i64 }, ptr %ts, i32 0, i32 1
  store i64 %nsec, ptr %nsec.p, align 8
  %r = call i64 (i64, ...) @syscall(i64 35, ptr %ts, ptr null)   ; nanosleep
  call void @add_one(i64 %b, i64 %e, ptr %a)
  ret void
}

; jobs holds `count` pairs {closure, n}: jitop_parallel_for(body, closure, n) for each, back to back
define void @drive_list(ptr %body, ptr %jobs, i64 %count) {
entry:
  %none = icmp sle i64 %count, 0
  br i1 %none, label %out, label %loop
loop:
  %r = phi i64 [ 0, %entry ], [ %next, %loop ]
  %cp = getelementptr { ptr, i64 }, ptr %jobs, i64 %r, i32 0
  %c = load ptr, ptr %cp, align 8
  %np = getelementptr { ptr, i64 }, ptr %jobs, i64 %r, i32 1
  %n = load i64, ptr %np, align 8
  call void @jitop_parallel_for(ptr %body, ptr %c, i64 %n)
  %next = add i64 %r, 1
  %last = icmp eq i64 %next, %count
  br i1 %last, label %out, label %loop
out:
  ret void
}

; call jitop_parallel_for(body, closure, n) `reps` times, without ctypes in between
define void @drive(ptr %body, ptr %closure, i64 %n, i64 %reps) {
entry:
  %none = icmp sle i64 %reps, 0
  br i1 %none, label %out, label %loop
loop:
  %r = phi i64 [ 0, %entry ], [ %next, %loop ]
  call void @jitop_parallel_for(ptr %body, ptr %closure, i64 %n)
  %next = add i64 %r, 1
  %last = icmp eq i64 %next, %reps
  br i1 %last, label %out, label %loop
out:
  ret void
}
"""


@pytest.fixture(scope="module")
def bodies() -> dict[str, int]:
    parallel_for_address()  # registers the symbol the `nested` and `drive` functions link against
    _, obj = compile_ir(BODIES_IR)
    return load_object(obj, ["add_one", "record_chunk", "record_tid", "sleepy_add_one", "nested", "drive",
                             "drive_list"])


@pytest.fixture(autouse=True)
def restore_threads():
    before = get_num_threads()
    yield
    set_num_threads(before)


@pytest.fixture
def worker_delay():
    """Set how long every worker sleeps between reading the unclaimed range and claiming (a late
    wake-up); reset to 0 afterwards, once no worker is left inside a launch."""
    pool = parallel._get_pool()

    def set_delay(ns: int) -> None:
        settle(pool)  # no worker from an earlier launch is still on its way to a claim
        pool.test_delay_ns.value = ns

    yield set_delay
    pool.test_delay_ns.value = 0
    settle(pool)


def settle(pool) -> None:
    deadline = time.monotonic() + TIMEOUT
    while pool.awake_workers() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert pool.awake_workers() == 0, "workers still awake long after the last launch"


def guarded(fn, *args, timeout: float = TIMEOUT):
    """Run fn(*args) in a daemon thread; fail (instead of hanging) if it does not finish."""
    result: list = []

    def target():
        try:
            result.append(("ok", fn(*args)))
        except BaseException as exc:  # re-raised in the test thread
            result.append(("err", exc))

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn.__name__} did not finish within {timeout}s: deadlock?"
    kind, value = result[0]
    if kind == "err":
        raise value
    return value


def add_one_everywhere(bodies, n: int) -> np.ndarray:
    a = np.zeros(max(n, 1), dtype=np.int64)
    guarded(run_parallel, bodies["add_one"], a.ctypes.data, n)
    return a[:n]


def expected_chunks(n: int, k: int) -> list[tuple[int, int]]:
    """The pool's chunks of [0, n) with k threads: min(n, CHUNKS_PER_THREAD * k), balanced."""
    if k <= 1:
        return [(0, n)] if n else []
    c = min(n, parallel.CHUNKS_PER_THREAD * k)
    base, rem = divmod(n, c)
    starts = [i * base + min(i, rem) for i in range(c + 1)]
    return list(zip(starts[:-1], starts[1:]))


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("n", SIZES)
def test_every_index_exactly_once(bodies, threads, n):
    set_num_threads(threads)
    a = add_one_everywhere(bodies, n)
    assert a.shape == (n,)
    np.testing.assert_array_equal(a, 1)


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("n", SIZES + [31, 32, 33])
def test_balanced_chunks_each_run_once(bodies, threads, n):
    set_num_threads(threads)
    rec = np.zeros(1 + 2 * 4096, dtype=np.int64)  # room for far more calls than any correct launch makes
    guarded(run_parallel, bodies["record_chunk"], rec.ctypes.data, n)
    calls = int(rec[0])
    got = sorted(zip(rec[1:1 + 2 * calls:2].tolist(), rec[2:2 + 2 * calls:2].tolist()))
    assert got == expected_chunks(n, min(threads, n))


def random_launches(rng, buffers: list[np.ndarray], count: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """`count` launches of add_one on random buffers and lengths (mostly short, some long enough
    for a late worker to join while the caller still works), and the counts they must leave."""
    jobs = np.zeros((count, 2), dtype=np.uint64)
    expect = [np.zeros_like(b) for b in buffers]
    for r in range(count):
        which = int(rng.integers(len(buffers)))
        size = len(buffers[which])
        n = int(rng.integers(1, size + 1)) if rng.random() < 0.1 else int(rng.integers(1, 3000))
        jobs[r] = buffers[which].ctypes.data, n
        expect[which][:n] += 1
    return jobs, expect


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("delay_ns", [2_000, 50_000, 1_000_000])
def test_late_workers_run_nothing_twice(bodies, worker_delay, threads, delay_ns):
    """Back-to-back launches on different buffers while every worker claims late: a worker that
    read the unclaimed range of a finished launch must neither run a chunk twice nor a chunk of one
    launch with another's closure, and no launch may return before its chunks ran."""
    set_num_threads(threads)
    worker_delay(delay_ns)
    rng = np.random.default_rng(threads * 7919 + delay_ns)
    buffers = [np.zeros(50_000, dtype=np.int64) for _ in range(3)]
    jobs, expect = random_launches(rng, buffers, 300)
    drive_list = DriveListFn(bodies["drive_list"])
    guarded(drive_list, bodies["add_one"], jobs.ctypes.data, len(jobs))
    got = [b.copy() for b in buffers]  # at once: a chunk still running after the return shows here
    for g, e in zip(got, expect):
        np.testing.assert_array_equal(g, e)


def test_launch_waits_for_the_chunks_workers_claimed(bodies):
    """Two chunks: the caller's (chunk 0) takes 5 ms, so a worker claims the other and holds it
    for 30 ms; the launch must not return before that chunk is done. (If the worker comes later
    than 5 ms, the caller runs both chunks and the test proves nothing, but cannot fail.)"""
    set_num_threads(2)
    a = np.zeros(2, dtype=np.int64)
    closure = np.array([a.ctypes.data, 5_000_000, 30_000_000], dtype=np.int64)
    for launch in range(1, 6):
        guarded(run_parallel, bodies["sleepy_add_one"], closure.ctypes.data, 2)
        assert a.tolist() == [launch, launch], "the launch returned before every chunk had run"


def test_launch_does_not_wait_for_late_workers(bodies, worker_delay):
    """With every worker asleep for a second before it claims, the caller runs all the chunks
    itself (a static split would leave the workers' shares to them)."""
    set_num_threads(3)
    worker_delay(1_000_000_000)
    a = np.zeros(1000, dtype=np.int64)

    def launch() -> int:
        run_parallel(bodies["record_tid"], a.ctypes.data, len(a))
        return threading.get_native_id()

    caller = guarded(launch)
    np.testing.assert_array_equal(a, caller)


def test_nested_call_runs_serially_and_correctly(bodies):
    set_num_threads(3)
    rows, m = 37, 1001
    a = np.zeros(rows * m, dtype=np.int64)
    closure = np.array([a.ctypes.data, m], dtype=np.int64)
    for _ in range(5):
        guarded(run_parallel, bodies["nested"], closure.ctypes.data, rows)
    np.testing.assert_array_equal(a, 5)


@pytest.mark.parametrize("delay_ns", [0, 20_000])
def test_concurrent_callers_from_python_threads(bodies, worker_delay, delay_ns):
    """Callers that find the pool busy run serially; launches of different callers follow each
    other closely, so late workers meet other callers' jobs."""
    set_num_threads(2)
    worker_delay(delay_ns)
    n, reps = 10_007, 200
    arrays = [np.zeros(n, dtype=np.int64) for _ in range(4)]
    start = threading.Barrier(len(arrays))

    def hammer(a):
        start.wait()
        for _ in range(reps):
            run_parallel(bodies["add_one"], a.ctypes.data, n)  # ctypes releases the GIL

    threads = [threading.Thread(target=hammer, args=(a,), daemon=True) for a in arrays]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads), "concurrent launches deadlocked"
    for a in arrays:
        np.testing.assert_array_equal(a, reps)


def test_many_launches_from_jit_code(bodies):
    drive = DriveFn(bodies["drive"])
    a = np.zeros(64, dtype=np.int64)
    for threads in (2, 4, 1, 3):
        set_num_threads(threads)
        guarded(drive, bodies["add_one"], a.ctypes.data, len(a), 5_000)
    np.testing.assert_array_equal(a, 20_000)


def test_idle_pool_sleeps(bodies):
    set_num_threads(4)
    add_one_everywhere(bodies, 1000)
    pool = parallel._get_pool()
    deadline = time.monotonic() + TIMEOUT
    while pool.awake_workers() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.awake_workers() == 0, "workers still spinning long after the last launch"
    cpu0 = time.process_time()
    time.sleep(0.3)
    assert time.process_time() - cpu0 < 0.15, "an idle pool should not use CPU"


def test_symbol_and_object_code_are_exposed():
    addr = parallel_for_address()
    assert addr and addr == parallel_for_address()
    assert parallel.pool_object_code().startswith(b"\x7fELF")
    assert parallel._get_pool().test_delay_ns.value == 0


def test_thread_count_api():
    set_num_threads(3)
    assert get_num_threads() == 3
    for bad in (0, -1, parallel.MAX_THREADS + 1, 2.0, True, "2"):
        with pytest.raises(ValueError, match="set_num_threads"):
            set_num_threads(bad)
    assert get_num_threads() == 3


@pytest.mark.parametrize("env, expected", [
    ({"JITOP_NUM_THREADS": "3", "OMP_NUM_THREADS": "5"}, 3),
    ({"OMP_NUM_THREADS": "5"}, 5),
    ({"OMP_NUM_THREADS": "4,2"}, 4),
    ({}, os.cpu_count()),
])
def test_default_thread_count_from_env(monkeypatch, env, expected):
    for var in ("JITOP_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert parallel._default_num_threads() == min(expected, parallel.MAX_THREADS)


def test_bad_env_value_warns_and_falls_back(monkeypatch):
    monkeypatch.setenv("JITOP_NUM_THREADS", "lots")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    with pytest.warns(RuntimeWarning, match="JITOP_NUM_THREADS"):
        assert parallel._default_num_threads() == 2


def run_script(body: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `body` in a fresh interpreter with `BODIES_IR` loaded as functions `f` and `drive`."""
    prelude = textwrap.dedent(f"""
        import ctypes, os, sys
        import numpy as np
        from jitop.codegen.loader import load_object
        from jitop.codegen.target import compile_ir
        from jitop.runtime.parallel import parallel_for_address, run_parallel, set_num_threads
        parallel_for_address()
        f = load_object(compile_ir({BODIES_IR!r})[1], ["add_one", "drive"])
        drive = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(f["drive"])
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_stress_and_prompt_exit_in_subprocess():
    """Thousands of launches with changing thread counts, then exit while workers still spin."""
    proc = run_script("""
        a = np.zeros(1000, dtype=np.int64)
        expect = np.zeros(1000, dtype=np.int64)
        for i in range(40):
            set_num_threads(1 + i % 4)
            n = 1 + i * 23
            drive(f["add_one"], a.ctypes.data, n, 500)
            run_parallel(f["add_one"], a.ctypes.data, n)
            expect[:n] += 501
        assert (a == expect).all()
        print("ok")
    """)
    assert proc.stdout.strip() == "ok"


def test_forked_child_gets_its_own_workers():
    """A child forked after the pool ran has no workers; its launches must create new ones."""
    proc = run_script("""
        set_num_threads(3)
        a = np.zeros(1000, dtype=np.int64)
        run_parallel(f["add_one"], a.ctypes.data, 1000)      # parent's workers now exist
        pid = os.fork()
        if pid == 0:
            import signal; signal.alarm(20)                    # a hung child dies instead of leaking
            drive(f["add_one"], a.ctypes.data, 1000, 100)
            os._exit(0 if (a == 101).all() else 1)
        _, status = os.waitpid(pid, 0)
        run_parallel(f["add_one"], a.ctypes.data, 1000)      # the parent's pool still works
        print(os.waitstatus_to_exitcode(status), int(a.min()), int(a.max()))
    """, timeout=60)
    assert proc.stdout.split() == ["0", "2", "2"]
