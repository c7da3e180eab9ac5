"""Which dims of a kernel's arguments are traced as symbols (issue 23): one object per @jitop.kernel function.

- automatic (`dynamic=None`, the default): a dim that differed between two calls of the same argument
  structure (dtypes, ranks, static values) is symbolic from the next compile on, as torch.compile's automatic
  dynamic shapes do; the decision is sticky and is kept in the disk cache, so a warm process compiles the
  symbolic kernel's signature at its first call, whatever size that call has;
- `dynamic=True`: every dim of every array argument, from the first call;
- `dynamic={"x": (0,), "cache": (0, 1)}`: those dims of those arguments (parameter names or pytree leaf
  paths such as `params[0]`), from the first call; `dynamic=False`: none (a kernel per shape, as before).

Sizes 0 and 1 are never symbolic (they broadcast): a call with such a size traces that dim as a constant.
A dim the function converts to a Python int (`range(x.shape[0])`) becomes constant again through the trace's
ties; a symbolic trace that fails is traced again with its dims constant, and the reason is kept (`why`).

>>> p = ShapePolicy(None)
>>> key = ("f4", 2)
>>> p.dims(key, ["x"], [(3, 4)]), p.dims(key, ["x"], [(5, 4)])
({}, {0: (0,)})
>>> p.why[("x", 0)]
'x dim 0: 3 at one call, 5 at another'
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

Dims = dict[int, tuple[int, ...]]  # leaf index -> its symbolic dims
RECOMPILE_LIMIT = 8  # constant-shape kernels of one structure before a JitopRecompileWarning (torch's limit)


class ShapePolicy:
    """The dims a function traces as symbols, per argument structure (`struct`: its key with ranks for shapes).

    `load(struct)` / `save(struct, dims)`: where the automatic decisions persist (the disk cache; None: memory
    only)."""

    def __init__(self, dynamic: bool | Mapping[str, Sequence[int]] | None,
                 load: Callable[[Any], list | None] | None = None, save: Callable[[Any, list], None] | None = None):
        if isinstance(dynamic, Mapping):
            for name, dims in dynamic.items():
                if not isinstance(name, str) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
                    raise TypeError(f"dynamic={{{name!r}: {dims!r}}}: expected a parameter name (or leaf path) "
                                    "mapped to a tuple of dim indices, such as {'x': (0,)}")
        elif dynamic not in (None, True, False):
            raise TypeError(f"dynamic must be None, True, False or a dict of parameter name -> dims, got {dynamic!r}")
        self.mode = dynamic
        self._load, self._save = load, save
        self._seen: dict[Any, list[tuple[int, ...]]] = {}    # struct -> the first call's shapes
        self._decided: dict[Any, set[tuple[int, int]]] = {}  # struct -> (leaf, dim) symbolic (automatic mode)
        self._refused: dict[Any, str] = {}                   # struct -> why its symbolic trace failed
        self._compiles: dict[Any, int] = {}                  # struct -> constant-shape kernels built
        self.why: dict[tuple[str, int], str] = {}            # (leaf name, dim) -> why it is symbolic
        self.static: dict[tuple[str, int], str] = {}         # (leaf name, dim) -> the user's line that fixed it

    def check_names(self, names: Sequence[str]) -> None:
        """Raise TypeError if `dynamic=` names a parameter the function does not have (`names`: its parameters)."""
        if isinstance(self.mode, Mapping):
            roots = {n.split("[")[0] for n in self.mode}
            unknown = sorted(roots - set(names))
            if unknown:
                raise TypeError(f"dynamic= names {', '.join(map(repr, unknown))}, which the function has no "
                                f"parameter for (it has {', '.join(map(repr, names)) or 'none'})")

    def dims(self, struct: Any, names: Sequence[str], shapes: Sequence[tuple[int, ...] | None]) -> Dims:
        """The symbolic dims of a call that missed: `names` and `shapes` per leaf (None for a non-array)."""
        if self.mode is False or struct in self._refused:
            return {}
        if self.mode is True:
            return {k: tuple(range(len(s))) for k, s in enumerate(shapes) if s}
        if isinstance(self.mode, Mapping):
            return self._named(names, shapes)
        return self._automatic(struct, names, shapes)

    def _named(self, names: Sequence[str], shapes: Sequence[tuple[int, ...] | None]) -> Dims:
        out: Dims = {}
        for k, (name, shape) in enumerate(zip(names, shapes)):
            dims = self.mode.get(name, ())  # type: ignore[union-attr]
            if dims and shape is None:
                raise TypeError(f"dynamic= names '{name}', which is not an array in this call")
            bad = [d for d in dims if not -len(shape or ()) <= d < len(shape or ())]
            if bad:
                raise ValueError(f"dynamic= gives dim {bad[0]} of '{name}', which has {len(shape or ())} dims")
            if dims:
                out[k] = tuple(sorted({d % len(shape) for d in dims}))  # type: ignore[arg-type]
        return out

    def _automatic(self, struct: Any, names: Sequence[str], shapes: Sequence[tuple[int, ...] | None]) -> Dims:
        decided = self._decided.get(struct)
        if decided is None and self._load is not None:
            stored = self._load(struct)
            if stored:
                decided = self._decided[struct] = {(k, d) for k, d in stored}
                for k, d in decided:
                    self.why.setdefault((names[k], d), f"{names[k]} dim {d}: varied in an earlier run (disk cache)")
        first = self._seen.setdefault(struct, list(shapes))
        new = {(k, d) for k, (a, b) in enumerate(zip(first, shapes)) if a is not None and b is not None
               for d, (x, y) in enumerate(zip(a, b)) if x != y} - (decided or set())
        if new:
            for k, d in sorted(new):
                self.why[(names[k], d)] = f"{names[k]} dim {d}: {first[k][d]} at one call, {shapes[k][d]} at another"
            decided = self._decided[struct] = (decided or set()) | new
            if self._save is not None:
                self._save(struct, sorted(decided))
        out: Dims = {}
        for k, d in sorted(decided or ()):
            out.setdefault(k, ())
            out[k] += (d,)
        return out

    def compiled(self, struct: Any, symbolic: bool) -> str | None:
        """Count a compile of `struct`; past RECOMPILE_LIMIT kernels of constant shapes for one structure whose
        dims vary, once: why they stay constant (the user's line that fixed a dim, or the refused trace)."""
        if symbolic or self.mode is False:
            return None
        n = self._compiles[struct] = self._compiles.get(struct, 0) + 1
        if n != RECOMPILE_LIMIT + 1:
            return None
        why = [f"{leaf} dim {dim}: {what}" for (leaf, dim), what in self.static.items()]
        if struct in self._refused:
            why.append(f"the symbolic trace failed ({self._refused[struct]})")
        if not why:
            return None
        return (f"{RECOMPILE_LIMIT + 1} kernels for one argument structure, one per shape, although its dims vary: "
                + "; ".join(why))

    def refuse(self, struct: Any, reason: str) -> None:
        """The symbolic trace of `struct` failed: it is traced with constant dims from now on."""
        self._refused[struct] = reason

    def refused(self) -> dict[Any, str]:
        """Each structure whose symbolic trace failed -> why."""
        return dict(self._refused)


class IntPolicy:
    """Which Python int parameters the function uses as sizes are traced as symbols (torch.compile's automatic
    dynamic ints): a parameter made static on use (`cache[:t + 1]` with t an argument) whose value differs
    between two calls of one structure is a symbol from the next compile on (`symbolic`; the key then holds
    ("symint", value) for a value in the symbols' range, which a symbolic kernel serves through its guards); one
    the function converts to a Python int again (`range(t)`) is static once more (`demote`). Decisions persist
    through `save(symbolic, demoted)`.

    >>> p = IntPolicy()
    >>> p.varied((("f4", 2), ("static", (int, 5))), ["x", "t"], {"t"})
    set()
    >>> p.varied((("f4", 2), ("static", (int, 6))), ["x", "t"], {"t"})
    {'t'}
    >>> p.demote("t", "range(t) at f.py:3"); sorted(p.symbolic), p.demoted
    ([], {'t': 'range(t) at f.py:3'})
    """

    def __init__(self, save: Callable[[list[str], dict[str, str]], None] | None = None):
        self.symbolic: set[str] = set()
        self.demoted: dict[str, str] = {}             # name -> why it is static again
        self._first: dict[Any, tuple[Any, ...]] = {}  # structure, sizes erased -> the first call's sizes
        self._save = save

    def load(self, symbolic: Sequence[str], demoted: Mapping[str, str]) -> None:
        """An earlier run's decisions (for the names the function has)."""
        self.demoted.update(demoted)
        self.symbolic |= set(symbolic) - set(self.demoted)

    def varied(self, specs: tuple, names: Sequence[str], candidates: set[str]) -> set[str]:
        """The `candidates` (parameters static on use; `names`: each leaf's) whose int value in `specs` (a call's
        key, one spec per parameter) differs from the first call of the same structure: symbolic from now on."""
        sizes = [k for k, (s, name) in enumerate(zip(specs, names)) if name in candidates and
                 name not in self.demoted and name not in self.symbolic and _int_spec(s)]
        if not sizes:
            return set()
        erased = tuple(("static", int) if k in sizes else s for k, s in enumerate(specs))
        values = tuple(specs[k] for k in sizes)
        first = self._first.setdefault(erased, values)
        new = {names[k] for k, a, b in zip(sizes, first, values) if a != b}
        if new:
            self.symbolic |= new
            self._persist()
        return new

    def demote(self, name: str, why: str) -> None:
        """`name` was converted to a Python int by the function (`why`: where): static again, for good."""
        self.symbolic.discard(name)
        self.demoted[name] = why
        self._persist()

    def _persist(self) -> None:
        if self._save is not None:
            self._save(sorted(self.symbolic), dict(self.demoted))


def _int_spec(spec: Any) -> bool:
    """A static Python int (the spec `argspec` gives it): 0 then 1 vary as much as 5 then 6 (a decode loop's
    first steps), though only values from 2 up are served by the symbolic kernel."""
    return type(spec) is tuple and len(spec) == 2 and spec[0] == "static" and type(spec[1]) is tuple \
        and spec[1][0] is int


def struct_key(key: tuple) -> Any:
    """A call's key with each array's shape replaced by its rank: the calls a symbolic overload may serve
    (None for a key that is not by value: such a call is never memoised)."""
    if key[:1] == ("unhashable",):
        return None
    if key[:1] == ("pytree",):
        return ("pytree", key[1], struct_key(key[2]))
    return tuple((s[0], len(s[1])) if len(s) == 2 and isinstance(s[1], tuple) and type(s[0]) is not str
                 else ("subclass", s[1], s[2], len(s[3])) if s[:1] == ("subclass",)
                 else ("symint",) if s[:1] == ("symint",) else s for s in key)
