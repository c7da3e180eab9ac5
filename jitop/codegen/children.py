"""Work done in forked child processes beside the parent: a compile's independent pieces (a CPU kernel's parts,
a GPU function's kernels) generated in parallel, since the GIL and llvmlite's lock make threads useless.

A child runs one function returning bytes, writes them to a pipe and leaves (never returning into the parent's
frames, never running its atexit handlers). The parent reads the reply; whatever goes wrong in or with a child
(an exception, a crash, a hang) makes `receive` return None, and the parent builds that piece itself: a child
never decides whether a compile succeeds.
"""
from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator, NoReturn, Sequence, TypeVar

from jitop.te.expr import Expr, Op, walk
from jitop.tir.nodes import Allocate, For, ForKind, IfThenElse, Seq, Stmt, Store

T = TypeVar("T")
R = TypeVar("R")

# the parent waits this long for a child after finishing its own share, or 4 times what its share took
REPLY_TIMEOUT_S = 60.0


@dataclass
class Child:
    pid: int
    fd: int  # the read end of the pipe it replies through


def may_fork() -> bool:
    """Forking is safe: no other Python thread can hold a lock the child needs (the JIT runtime's native pool
    threads take none of them)."""
    return hasattr(os, "fork") and threading.active_count() == 1


def reply_deadline(now: float, own_seconds: float) -> float:
    """When the parent stops waiting for its children, having spent `own_seconds` on its own share."""
    return now + max(REPLY_TIMEOUT_S, 4 * own_seconds)


@contextlib.contextmanager
def objects_frozen() -> Iterator[None]:
    """The program's objects out of every collection while children build: they copy no pages for the
    collector's sake, and the parent's full collections do not scan them again and again (unless the program
    froze objects itself: unfreezing would undo that)."""
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()


def run_beside(works: Sequence[Callable[[], bytes]], own: Callable[[], T],
               decode: Callable[[int, bytes], R | None]) -> tuple[T, list[R | None]]:
    """Fork a child per work, run `own` here meanwhile, then each child's reply decoded by `decode(k, reply)`
    (None where the child failed, crashed, missed its deadline or `decode` refused the reply: the caller does
    that work itself). `own`'s exception propagates, after the children are stopped."""
    pending: dict[int, Child | None] = {}
    with objects_frozen():
        try:
            for k, work in enumerate(works):
                pending[k] = fork(work)
            start = time.monotonic()
            mine = own()
            deadline = reply_deadline(time.monotonic(), time.monotonic() - start)
            replies: list[R | None] = []
            for k in range(len(works)):
                child = pending.pop(k)
                data = receive(child, deadline) if child is not None else None
                replies.append(None if data is None else decode(k, data))
        finally:
            for child in filter(None, pending.values()):  # not collected (`own` raised): stop
                stop(child)
    return mine, replies


def fork(work: Callable[[], bytes]) -> Child | None:
    """A child running `work` and replying with its bytes through a pipe; None when no child could be started."""
    try:
        read, write = os.pipe()
    except OSError:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12 warns of fork beside (native) threads
        try:
            pid = os.fork()
        except OSError:
            os.close(read)
            os.close(write)
            return None
    if pid == 0:
        os.close(read)
        _child_main(write, work)
    os.close(write)
    return Child(pid, read)


def _child_main(fd: int, work: Callable[[], bytes]) -> NoReturn:
    """Work, reply and leave."""
    status = 1
    try:
        view = memoryview(work())
        while view:
            view = view[os.write(fd, view):]
        status = 0
    except BaseException:  # noqa: BLE001 - any failure: the parent builds this piece itself
        pass
    finally:
        os._exit(status)


def receive(child: Child, deadline: float) -> bytes | None:
    """The child's reply once it has exited cleanly; None if it failed, crashed or missed `deadline` (then it is
    killed)."""
    data = None
    try:
        data = _read_all(child.fd, deadline)
    finally:  # also when interrupted: no child outlives the compile
        status = stop(child, kill=data is None)
    return data if status == 0 else None


def _read_all(fd: int, deadline: float) -> bytes | None:
    """Everything until the child closes the pipe (it exits), or None at `deadline`."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def poll(child: Child) -> int | None:
    """The child's exit code once it has exited (then its pipe is closed and it is reaped), else None: for a child
    whose work is its side effect (jitop.build_beside), never read."""
    try:
        pid, status = os.waitpid(child.pid, os.WNOHANG)
    except ChildProcessError:  # reaped already (SIGCHLD ignored): its outcome is unknown, its work tells
        pid, status = child.pid, 0
    if pid == 0:
        return None
    os.close(child.fd)
    return os.waitstatus_to_exitcode(status)


def stop(child: Child, kill: bool = True) -> int:
    """Close the pipe, kill the child if asked, wait for it; its exit code (negative: killed by a signal)."""
    os.close(child.fd)
    if kill:
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        _, status = os.waitpid(child.pid, 0)
    except ChildProcessError:  # reaped already (SIGCHLD ignored): a complete reply still has to decode
        return 0
    return os.waitstatus_to_exitcode(status)


def emitted_size(s: Stmt, max_unroll: int, unrolled: tuple[ForKind, ...]) -> int:
    """About how much LLVM IR `s` becomes, to share work out by: its expression nodes, the body of a loop of a
    kind in `unrolled` (a code generator copies it per iteration, up to `max_unroll`) once per iteration."""
    if isinstance(s, Store):
        return _nodes(s.value, *s.indices)
    if isinstance(s, For):
        extent = int(s.extent.value) if s.extent.op is Op.CONST else 0
        copies = extent if s.kind in unrolled and 0 < extent <= max_unroll else 1
        return 1 + copies * emitted_size(s.body, max_unroll, unrolled)
    if isinstance(s, Seq):
        return sum(emitted_size(x, max_unroll, unrolled) for x in s.stmts)
    if isinstance(s, IfThenElse):
        return _nodes(s.cond) + sum(emitted_size(x, max_unroll, unrolled) for x in (s.then, s.else_) if x is not None)
    if isinstance(s, Allocate):
        return 1 + emitted_size(s.body, max_unroll, unrolled)
    return 1


def _nodes(*exprs: Expr) -> int:
    return sum(1 for e in exprs for _ in walk(e))
