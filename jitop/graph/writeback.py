"""How a kernel's call gives the caller's arrays the values the function assigned to them in place.

The kernel computes the new values as extra results (jitop.graph.mutation records which arguments changed);
after it runs they are written into the caller's arrays. Where the function changed one region of an argument
(`cache[t] = row`, a decode step's cache) only the region and its traced positions are results, assigned with
numpy's indexing: a row, not a copy of the whole cache per call.

>>> w = Write(0, (("at", 0), ("slice", 0, 1, 0)))
>>> a = np.zeros((3, 2))
>>> _ = w.apply(a, [np.ones(2), np.int64(-1)])
>>> a.tolist()
[[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from jitop.graph.ir import Node
from jitop.graph.tracer import Tracer


@dataclass(frozen=True)
class Write:
    """Argument `leaf`'s new value: the whole array (spec None; one result), or the region a constant basic
    index spec selects (its results: the region's value, then the position of each "at" entry)."""

    leaf: int
    spec: tuple | None = None

    def apply(self, target: np.ndarray, results: Sequence[Any]) -> np.ndarray | None:
        """Write this argument's results into `target`; the array whose values it took when whole (else None)."""
        if self.spec is None:
            np.copyto(target, results[0], casting="unsafe")
            return results[0]
        value, positions = results[0], results[1:]
        lengths = iter(value.shape)
        index = []
        for s in self.spec:
            if s[0] == "int":
                index.append(s[1])
            elif s[0] == "at":
                index.append(int(positions[s[1]]))
            else:
                start, step, length = s[1], s[2], next(lengths)
                stop = start + step * length
                index.append(slice(start, None if stop < 0 else stop, step))
        target[tuple(index)] = value
        return None


def plan(written: dict[int, Tracer], returned: set[int]) -> list[tuple[Write, list[Node]]]:
    """Each written argument's Write and the nodes it needs as results. A single region update of the argument
    as it came in is written as a region, unless the function returns the argument (then the caller gets its
    own array back, whole)."""
    out = []
    for leaf, t in written.items():
        n = t.node
        region = n.prim == "update" and n.src[0].prim == "arg" and n.src[0].param("index") == leaf \
            and id(t) not in returned and _constant(n)
        if region:
            out.append((Write(leaf, n.param("spec")), list(n.src[1:])))
        else:
            out.append((Write(leaf), [n]))
    return out


def _constant(n: Node) -> bool:
    """Whether an update's region is known without its symbols (slice starts and the value's shape are ints)."""
    return all(type(d) is int for d in n.src[1].shape) and all(
        type(s[1]) is int for s in n.param("spec") if s[0] in ("int", "slice"))
