"""How a kernel's call gives the caller's arrays the values the function assigned to them in place.

jitop.graph.mutation records which arguments changed. Three ways, cheapest first:
- **before the kernel**: the function writes one region of an argument with a value it was given (`cache[t] =
  k`, k and t arguments: a decode step) and reads the argument only after that write. The call writes the
  region into the caller's array with numpy's indexing (numpy's casts and errors), then the kernel reads the
  array itself: no copy of the cache per call;
- **a region after the kernel**: one region written with a computed value: the region's value and its traced
  positions are extra results, assigned with numpy's indexing after the kernel;
- **whole after the kernel**: anything else: the argument's new value is an extra result, copied back.

A call of the first two kinds runs through the native entry when each region is leading indices (constants or
int arguments) and whole trailing axes, and its value an array of the target's dtype and the region's shape
(an argument before the kernel, the kernel's output after it): `copies_in` says what the entry copies.

>>> w = Write(0, (("at", 0), ("slice", 0, 1, 0)), (2,))
>>> a = np.zeros((3, 2))
>>> _ = w.apply(a, [np.ones(2), np.int64(-1)])
>>> a.tolist()
[[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from jitop.graph.ir import Node, toposort
from jitop.graph.tracer import Tracer
from jitop.runtime.copy_in import CopyIn

Source = tuple  # ("leaf", index into the call's leaves) or ("const", value)


@dataclass(frozen=True)
class Write:
    """Argument `leaf`'s new value: the whole array (spec None; one result), or the region a constant basic
    index spec selects (`region`: the lengths of its slices). `positions`: where the position of each "at"
    entry comes from when every one is an argument or a constant (else None). Its results: the region's value,
    then the positions; none if `early` says where the value comes from (written before the kernel runs, at
    `positions`)."""

    leaf: int
    spec: tuple | None = None
    region: tuple[int, ...] = ()
    early: Source | None = None
    positions: tuple[Source, ...] | None = None

    def apply(self, target: np.ndarray, results: Sequence[Any]) -> np.ndarray | None:
        """Write this argument's results into `target`; the array whose values it took when whole (else None)."""
        if self.spec is None:
            np.copyto(target, results[0], casting="unsafe")
            return results[0]
        target[self._index(results[1:])] = results[0]
        return None

    def write_early(self, values: Sequence[Any]) -> None:
        """The region write done before the kernel, from the call's leaves."""
        values[self.leaf][self._index([_value(p, values) for p in self.positions])] = _value(self.early, values)

    def _index(self, positions: Sequence[Any]) -> tuple:
        fixed, at = self._fixed
        if not at:
            return fixed
        index = list(fixed)
        for k, j in at:
            index[k] = int(positions[j])
        return tuple(index)

    @functools.cached_property
    def _fixed(self) -> tuple[tuple, list[tuple[int, int]]]:
        """The numpy index without its traced positions, and where each goes (item k: position j)."""
        lengths = iter(self.region)
        index: list[Any] = []
        at = []
        for s in self.spec:
            if s[0] == "int":
                index.append(s[1])
            elif s[0] == "at":
                at.append((len(index), s[1]))
                index.append(None)
            else:
                start, step, length = s[1], s[2], next(lengths)
                stop = start + step * length
                index.append(slice(start, None if stop < 0 else stop, step))
        return tuple(index), at


def copies_in(writes: Sequence[Write], values: Sequence[Any], outputs: Sequence[int | None]) -> list[CopyIn] | None:
    """The native entry's copies (jitop.runtime.copy_in) for a call whose every write is a plain copy into
    leading indices and whole trailing axes of an argument: of another argument before the kernel, or of the
    kernel's output `outputs[k]` (write k's region value) after it (dtypes and shapes are the entry's to
    check); None if one is not (such a call takes the Python path)."""
    out = []
    for w, output in zip(writes, outputs):
        if w.early is not None and w.early[0] == "leaf":
            value = w.early[1]
        elif w.early is None and w.spec is not None and w.positions is not None and output is not None:
            value = ("out", output)
        else:
            return None
        n_lead = sum(1 for s in w.spec if s[0] != "slice")
        trailing = w.spec[n_lead:]
        if any(s[0] != "slice" or s[1:3] != (0, 1) for s in trailing) or \
                tuple(w.region) != tuple(values[w.leaf].shape[n_lead:]):
            return None
        index = [s[1] if s[0] == "int" else _index_source(w.positions[s[1]]) for s in w.spec[:n_lead]]
        if None in index:
            return None
        out.append(CopyIn(w.leaf, value, tuple(index)))
    return out


def _index_source(source: Source) -> int | tuple[str, int] | None:
    if source[0] == "leaf":
        return ("arg", source[1])
    return int(source[1]) if isinstance(source[1], (int, np.integer)) else None


def _value(source: Source, values: Sequence[Any]) -> Any:
    return values[source[1]] if source[0] == "leaf" else source[1]


def plan(written: dict[int, Tracer], returned: set[int], roots: list[Node]) -> list[tuple[Write, list[Node]]]:
    """Each written argument's Write and the nodes it needs as results. `returned`: ids of the tracers the
    function returns (an argument returned is written whole: the caller gets its own array back); `roots`: the
    nodes the kernel computes otherwise (the results)."""
    out = []
    graph = toposort(roots + [t.node for t in written.values()])
    for leaf, t in written.items():
        n = t.node
        if not (n.prim == "update" and n.src[0].prim == "arg" and n.src[0].param("index") == leaf
                and id(t) not in returned and _constant(n)):
            out.append((Write(leaf), [n]))
            continue
        region = tuple(d for d in n.src[1].shape)
        positions = tuple(_source(p) for p in n.src[2:])
        positions = None if None in positions else positions
        early = _early(n, graph) if positions is not None else None
        out.append((Write(leaf, n.param("spec"), region, early, positions),
                    [] if early is not None else list(n.src[1:])))
    return out


def early_updates(writes: list[tuple[Write, list[Node]]], written: dict[int, Tracer]) -> dict[int, Node]:
    """id of each update written before the kernel -> the argument it is then read as."""
    return {id(written[w.leaf].node): written[w.leaf].node.src[0] for w, _ in writes if w.early is not None}


def _constant(n: Node) -> bool:
    """Whether an update's region is known without its symbols (slice starts and the value's shape are ints)."""
    return all(type(d) is int for d in n.src[1].shape) and all(
        type(s[1]) is int for s in n.param("spec") if s[0] in ("int", "slice"))


def _early(n: Node, graph: list[Node]) -> Source | None:
    """Where update n's value comes from, if it can be written before the kernel (its positions being arguments
    or constants): the argument's old value is read by nothing else, and the value is an argument or a constant
    (cast and broadcast as numpy's assignment casts and broadcasts it)."""
    arg = n.src[0]
    if any(s is arg for m in graph if m is not n for s in m.src):
        return None
    return _source(n.src[1])


def _source(n: Node) -> Source | None:
    while n.prim in ("cast", "broadcast", "position"):  # (a position: numpy's indexing wraps and checks it too)
        n = n.src[0]
    if n.prim in ("arg", "scalar_arg"):
        return ("leaf", n.param("index"))
    if n.prim == "const":
        return ("const", n.param("value"))
    return None
