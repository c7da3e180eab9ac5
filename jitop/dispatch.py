"""The dispatcher: one object with one job, a call's signature -> the overload that serves it.

A front end (`jitop.kernel.KernelFunction`) turns a call into a key and knows how to build an overload (trace,
then the disk cache, else compile and save); the `Dispatcher` holds the overloads: memory first, else the
front end's build, kept for the next call. It serves its hot overloads through one native entry
(`jitop.runtime.fastcall`), counts hits and misses, and keeps the call log: how often each overload ran and what
one call took. The workload log (`drain_all`), background tuning (`overloads`, `Overload.served`, `replace`),
`jitop.matmul` (the native entry) and `jitop explain` (`on_first_call`) read it through this interface only.

Overloads are keyed by the front end's exact key; an overload compiled with symbolic dims (`Overload.accepts`)
is also held under its structure key (the exact key with ranks for shapes), so `lookup` serves a new size of a
known symbolic signature without tracing: newest first, the first whose shape checks and guards hold.

>>> d = Dispatcher("doc.add")
>>> d.lookup(("f4", 3)) is None
True
>>> ov = d.get(("f4", 3), lambda: Overload(lambda values: values[0] + values[1]))
>>> d.first_call(ov, (1, 2), rerun=lambda: None), d.lookup(("f4", 3)) is ov, (d.hits, d.misses)
(3, True, (1, 1))
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import threading
import time
import types
import weakref
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

from jitop.runtime import fastcall

__all__ = ["FALLBACK", "PENDING", "MAX_FAST_SIGNATURES", "PROMOTE_AFTER", "CallCount", "Dispatcher", "Overload",
           "clear_all", "dispatchers", "drain_all", "on_first_call"]

MAX_FAST_SIGNATURES = 16  # overloads the native entry tries, newest first (each costs a few ns to rule out)
PROMOTE_AFTER = 16       # slow calls before an overload displaces one from a full native entry (see promote)
MAX_ACCEPTED = 1024      # keys remembered as served by a symbolic overload (Dispatcher._accepted)


class _Fallback:
    """What serves a signature that runs as plain numpy (the front end's decision, kept like an overload)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "jitop.dispatch.FALLBACK"


FALLBACK = _Fallback()


class _Pending:
    """What serves a call whose signature a child process builds (jitop.build_beside): plain numpy, this call only
    (never kept: a later call looks again)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "jitop.dispatch.PENDING"


PENDING = _Pending()
_UNSET = object()  # an overload whose native spec was not asked for yet


def _always_miss(*_: Any) -> Any:
    return fastcall.MISS


class Overload:
    """One compiled signature: `call(values)` runs it; the rest is what the front end, `explain` and the
    workload log read (its executable, trace, the disk cache's answer, its tuning tasks).

    calls: calls served by the Python path (the native entry counts its own, in `spec`); seconds: one call's
    time, measured at the first call (None until then); logged: calls already in the workload log.

    >>> ov = Overload(lambda values: sum(values))
    >>> ov.call([1, 2]), ov.served, ov.key
    (3, 0, None)
    """

    __slots__ = ("key", "call", "exe", "trace", "lookup", "tasks", "calls", "seconds", "logged", "spec", "native",
                 "waiting", "accepts", "struct")

    def __init__(self, call: Callable[[Sequence[Any]], Any], exe: Any = None, trace: Any = None, lookup: Any = None,
                 tasks: Sequence[Any] = (), native: bool = True,
                 accepts: Callable[[Sequence[Any]], bool] | None = None):
        self.key: Any = None  # set when a dispatcher holds it
        # a symbolic overload: whether it serves a call's leaves of its structure (shape checks and guards)
        self.accepts = accepts
        self.struct: Any = None  # the structure key it serves (symbolic overloads only)
        self.call, self.exe, self.trace, self.lookup, self.tasks = call, exe, trace, lookup, list(tasks)
        self.calls, self.seconds, self.logged = 0, None, 0
        self.spec: Any = _UNSET if native else None  # its fastcall.Spec; None: the native entry cannot serve it
        self.native = False  # the native entry serves it now
        self.waiting = 0     # slow calls while a full native entry had no room for it

    @property
    def served(self) -> int:
        """Calls it served: the Python path's and its native entry's."""
        spec = self.spec
        return self.calls + (spec.calls if spec is not None and spec is not _UNSET else 0)


class CallCount(NamedTuple):
    """Calls of one tuning task (and their share of the time) one function ran since the last drain."""

    function: str
    task: Any
    calls: int
    seconds: float


class Dispatcher:
    """Signature -> overload for one function: memory, else the front end's `build` (disk cache, else compile
    and save), kept; the hot overloads served by `entry`, a native function that returns fastcall.MISS for any
    call it does not serve.

    >>> d = Dispatcher("doc.f")
    >>> a = d.get("k", lambda: Overload(lambda values: "a"))
    >>> d.replace(a, Overload(lambda values: "b")), d.lookup("k").call(()), len(d.overloads())
    (True, 'b', 1)
    >>> d.clear(); d.lookup("k") is None
    True
    """

    def __init__(self, name: str):
        self.name = name  # the function's module.qualname: the workload log's name for it
        self.entry: Callable[..., Any] = _always_miss
        self.misses = 0    # lookups that had to build
        self.compiles = 0  # builds the disk cache did not serve (LLVM ran)
        self.lock = threading.RLock()  # held while building: one build per dispatcher at a time
        self._hits = 0
        self._native_hits = ctypes.c_int64(0)
        self._memo: dict[Any, Overload | _Fallback] = {}
        self._symbolic: dict[Any, list[Overload]] = {}  # structure key -> symbolic overloads, newest first
        self._accepts_memo: dict[Any, Overload] = {}  # key -> the symbolic overload that accepted it (`_accepted`)
        self._native: list[Overload] = []  # what `entry` serves, newest first
        # a collected function's unlogged calls still reach the workload log
        weakref.finalize(self, _retire, name, self._memo)
        _LIVE.add(self)

    @property
    def hits(self) -> int:
        """Calls served by an overload already held (through the native entry or not)."""
        return self._hits + self._native_hits.value

    def lookup(self, key: Any, leaves: Sequence[Any] | None = None, struct: Any = None,
               by_shape: bool = False) -> Overload | _Fallback | None:
        """What serves `key` (counted as a hit), or None: the exact key's overload, else (given the call's
        `leaves` and `struct`, its structure key) the newest symbolic overload that accepts them. `by_shape`: the
        key holds everything acceptance depends on (arrays only: their shapes and dtypes; a Python int's value
        is not in a key), so the answer is remembered for the key."""
        ov = self.find(key, leaves, struct, by_shape)
        if ov is not None:
            self._hits += 1
        return ov

    def find(self, key: Any, leaves: Sequence[Any] | None = None, struct: Any = None,
             by_shape: bool = False) -> Overload | _Fallback | None:
        """`lookup` without counting a hit (for introspection)."""
        ov = self._memo.get(key)
        if ov is None and struct is not None:
            ov = self._accepted(key, struct, leaves) if by_shape else self._accepting(struct, leaves)
        return ov

    def _accepting(self, struct: Any, leaves: Sequence[Any] | None) -> Overload | None:
        for ov in self._symbolic.get(struct, ()):
            if ov.accepts(leaves):
                return ov
        return None

    def _accepted(self, key: Any, struct: Any, leaves: Sequence[Any] | None) -> Overload | None:
        """`_accepting`, remembered per key (of arrays only: what acceptance depends on), so that a size served
        twice is checked once. Forgotten whenever the symbolic overloads change."""
        ov = self._accepts_memo.get(key)
        if ov is None:
            ov = self._accepting(struct, leaves)
            if ov is not None:
                if len(self._accepts_memo) >= MAX_ACCEPTED:
                    self._accepts_memo.clear()
                self._accepts_memo[key] = ov
        return ov

    def get(self, key: Any, build: Callable[[], Overload | _Fallback], memo: bool = True,
            struct: Any = None, leaves: Sequence[Any] | None = None) -> Overload | _Fallback:
        """What serves `key`: held (or a symbolic overload of `struct` accepting `leaves`), else `build()`
        (once, under the lock), kept unless memo=False; a symbolic one also under `struct`."""
        with self.lock:
            ov = self.find(key, leaves, struct)
            if ov is not None:
                return ov
            self.misses += 1
            ov = build()
            if isinstance(ov, Overload):
                ov.key = key
                self.compiles += ov.lookup is None or getattr(ov.lookup, "status", None) != "hit"
                if ov.accepts is not None and struct is not None and memo:
                    ov.struct = struct
                    self._symbolic.setdefault(struct, []).insert(0, ov)
                    self._accepts_memo.clear()
            if memo and ov is not PENDING:
                self._memo[key] = ov
        return ov

    def serves(self, ov: Overload) -> bool:
        """Whether `ov` serves its signature now (not replaced, not cleared)."""
        return self._memo.get(ov.key) is ov

    def replace(self, old: Overload, new: Overload) -> bool:
        """Serve `old`'s signature with `new` from the next call on (calls in flight finish on `old`); also puts
        an earlier overload back. Returns whether it did (False if `old` no longer serves it)."""
        with self.lock:
            if not self.serves(old):
                return False
            _RETIRED.extend(_counts(self.name, [old]))  # the old kernel's calls go to the workload log first
            new.key = old.key
            self._memo[old.key] = new
            self._accepts_memo.clear()
            if old.struct is not None:
                held = self._symbolic.get(old.struct, [])
                if new.accepts is not None:
                    new.struct = old.struct
                self._symbolic[old.struct] = [new if o is old else o for o in held if o is not old or new.accepts]
            if old.native:
                self._publish([o for o in self._native if o is not old])  # `new` joins on its next call
        return True

    def retire(self, ov: Overload) -> None:
        """Move `ov`'s unlogged calls to the workload log's next flush now (its tasks, and what it accepts, are
        about to change)."""
        _RETIRED.extend(_counts(self.name, [ov]))
        self._accepts_memo.clear()

    def clear(self) -> None:
        """Forget every signature (each traces and builds again); calls not yet logged are kept for the log."""
        with self.lock:
            _RETIRED.extend(_counts(self.name, list(self._memo.values())))
            self._publish([])
            self._memo.clear()
            self._symbolic.clear()
            self._accepts_memo.clear()

    def overloads(self) -> list[Overload]:
        """The overloads serving a signature now (not the signatures that run as numpy)."""
        return [ov for ov in list(self._memo.values()) if ov is not FALLBACK]

    def signatures(self) -> Mapping[Any, Overload | _Fallback]:
        """Every signature held -> what serves it (an Overload or FALLBACK): a live, read-only view."""
        return types.MappingProxyType(self._memo)

    def native(self) -> list[Overload]:
        """The overloads the native entry serves, newest first."""
        return list(self._native)

    def drain(self) -> list[CallCount]:
        """The calls of each tuning task since the last drain; marks them logged."""
        return _counts(self.name, list(self._memo.values()))

    def first_call(self, ov: Overload, values: Sequence[Any], rerun: Callable[[], Any]) -> Any:
        """An overload's first call: timed (the workload log weighs tasks by where the time goes), and told to
        the `on_first_call` hooks with `rerun`, which calls the function again with this call's arguments."""
        t0 = time.perf_counter()
        result = ov.call(values)
        ov.seconds = time.perf_counter() - t0
        for hook in list(_FIRST_CALL_HOOKS):
            hook(self, ov, rerun)
        return result

    def promote(self, ov: Overload, make_spec: Callable[[], Any]) -> None:
        """Let the native entry serve `ov` from the next call on (`make_spec()` gives its fastcall.Spec, or None:
        it cannot). A full entry drops its oldest overload for `ov` only after PROMOTE_AFTER slow calls of `ov`:
        a new entry costs ~10 µs, and signatures taking turns would otherwise make one on every call."""
        if len(self._native) >= MAX_FAST_SIGNATURES and ov.spec is not _UNSET:
            ov.waiting += 1
            if ov.waiting < PROMOTE_AFTER:
                return
        with self.lock:
            if ov.spec is _UNSET:
                ov.spec = make_spec()
            if ov.spec is None or ov.native or not self.serves(ov):
                return
            ov.waiting = 0
            native = [ov, *self._native]
            if len(native) > MAX_FAST_SIGNATURES:  # drop the oldest exact one: a symbolic one serves many sizes
                exact = [o for o in native if o.accepts is None]
                native.remove(exact[-1] if exact else native[-1])
            self._publish(native)

    def _publish(self, native: list[Overload]) -> None:
        """Serve `native` through a new entry, swapped in at once (a call in flight finishes on the old one).
        Exact signatures go before symbolic ones (a mismatched dim rules an exact one out in nanoseconds, and a
        symbolic overload may accept a call that an exact one serves faster)."""
        native = sorted(native, key=lambda ov: ov.accepts is not None)
        for ov in self._native:
            ov.native = False
        for ov in native:
            ov.native = True
        self._native = native
        self.entry = fastcall.Table([ov.spec for ov in native], self._native_hits).entry() if native else _always_miss


_LIVE: "weakref.WeakSet[Dispatcher]" = weakref.WeakSet()
_RETIRED: collections.deque[CallCount] = collections.deque()  # counts of overloads dropped before a drain
_FIRST_CALL_HOOKS: list[Callable[[Dispatcher, Overload, Callable[[], Any]], None]] = []


def dispatchers() -> list[Dispatcher]:
    """Every live dispatcher (one per @jitop.kernel function)."""
    return list(_LIVE)


def drain_all() -> list[CallCount]:
    """The calls since the last drain of every live dispatcher, and of overloads dropped or collected meanwhile."""
    out = []
    while _RETIRED:  # popleft: a finalizer may append meanwhile, from any thread
        out.append(_RETIRED.popleft())
    for d in dispatchers():
        out += d.drain()
    return out


def clear_all() -> None:
    """Forget every dispatcher's signatures (the schedule sources changed: kernels may hold stale configs)."""
    for d in dispatchers():
        d.clear()


@contextlib.contextmanager
def on_first_call(hook: Callable[[Dispatcher, Overload, Callable[[], Any]], None]) -> Iterator[None]:
    """While inside: `hook(dispatcher, overload, rerun)` at each overload's first call (`jitop explain` times
    each signature again with `rerun`).

    >>> seen = []
    >>> d = Dispatcher("doc.g")
    >>> ov = d.get("k", lambda: Overload(lambda values: 1))
    >>> with on_first_call(lambda d, ov, rerun: seen.append(d.name)):
    ...     _ = d.first_call(ov, (), rerun=lambda: 1)
    >>> seen
    ['doc.g']
    """
    _FIRST_CALL_HOOKS.append(hook)
    try:
        yield
    finally:
        _FIRST_CALL_HOOKS.remove(hook)


def _counts(name: str, held: Sequence[Overload | _Fallback]) -> list[CallCount]:
    """The unlogged calls of `held` per tuning task, the time split by the tasks' flops; marks them logged."""
    out = []
    for ov in held:
        if ov is FALLBACK or not ov.tasks:
            continue
        total = ov.served
        new, ov.logged = total - ov.logged, total
        if new <= 0:
            continue
        flops = sum(t.flops for t in ov.tasks) or 1
        out += [CallCount(name, t, new, new * (ov.seconds or 0.0) * t.flops / flops) for t in ov.tasks]
    return out


def _retire(name: str, memo: dict) -> None:
    """A dispatcher was collected: its unlogged calls wait for the next drain."""
    try:
        _RETIRED.extend(_counts(name, list(memo.values())))
    except Exception:  # noqa: BLE001 - a finalizer must never raise
        pass


def _forget_in_child() -> None:
    """After fork: the parent logs its own calls; the child starts from zero (else they are logged twice)."""
    for d in dispatchers():
        d.drain()
    _RETIRED.clear()


os.register_at_fork(after_in_child=_forget_in_child)
