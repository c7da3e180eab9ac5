"""Python's full garbage collections, deferred while jitop compiles.

A compile allocates millions of small container objects (expressions, loop IR, llvmlite's IR) that stay alive
until it ends. CPython runs a young collection every 700 allocations and, every 100 young ones (thresholds
700, 10, 10), a *full* collection that walks the whole heap: the compiler's objects and the program's. On
ResNet-18's cold compile those full collections took 20-25 % of the time, growing with the heap. While a build
runs they wait (young collections still run, so short-lived cycles are freed as before); the thresholds come
back when the last build running in the process ends, and the next full collection catches up.

>>> import gc
>>> before = gc.get_threshold()
>>> with full_collections_deferred():
...     gc.get_threshold()[2] >= DEFERRED_THRESHOLD
True
>>> gc.get_threshold() == before
True
"""
from __future__ import annotations

import contextlib
import functools
import gc
import threading
from typing import Any, Callable, Iterator, TypeVar

DEFERRED_THRESHOLD = 1000  # the oldest generation's threshold while a build runs (CPython's default: 10)

_lock = threading.Lock()
_running = 0                                   # builds running now, in any thread
_saved: tuple[int, ...] | None = None          # the thresholds before the first of them

F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def full_collections_deferred() -> Iterator[None]:
    """Defer full collections for the block (nested and concurrent blocks share one deferral)."""
    global _running, _saved
    with _lock:
        if _running == 0:
            _saved = gc.get_threshold()
            gc.set_threshold(*_saved[:2], max(_saved[2], DEFERRED_THRESHOLD))
        _running += 1
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            if _running == 0 and _saved is not None:
                gc.set_threshold(*_saved)


def deferring_full_collections(fn: F) -> F:
    """`fn`, run with full collections deferred (a build's entry point)."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with full_collections_deferred():
            return fn(*args, **kwargs)
    return run  # type: ignore[return-value]
