"""Horizontal batching: a Python loop over slices, joined by a concatenation, computed as one batched loop.

numpy code often loops over equal slices of an array and joins the results: GPT-2's attention, one head per
64-column slice of q, k and v, stacked by `np.hstack`. Traced, that is H copies of one subgraph, each its own
reductions and matmuls: H times the kernels (on a GPU, H times the launches). This pass finds a `concat`
whose parts are copies of one computation that differ only in which slice of an array they read (each
read's offset a multiple of the copy's number: x[:, 64 i : 64 (i + 1)], x[i]) and computes the copies at
once: each read becomes one read of all the slices with the copies on a new leading axis, each node the
batched node of its primitive's rule (jitop.graph.batch_rules, in jitop.graph.prims' table: a reduction's
axes move by one, a matmul gains a batch dim), and the concatenation a transpose and reshape of the batched
result. Nodes every copy shares (a weight, a scalar) stay shared. The result is the same values.

A concat is left as it is where its parts differ otherwise, where a node of a copy is also read outside the
concatenation (it would be computed twice), where a primitive has no rule, or where the copies hold nothing
but free index arithmetic (fusion already makes that one loop).

>>> import numpy as np
>>> from jitop.dtypes import as_dtype
>>> x = node("arg", (4, 6), as_dtype("float32"), index=0)
>>> parts = [node("reduce", (4,), x.dtype, (node("index", (4, 3), x.dtype, (x,),
...           spec=(("slice", 0, 1, 0), ("slice", 3 * i, 1, 1))),), op="sum", axes=(1,)) for i in range(2)]
>>> both = node("concat", (8,), x.dtype, parts, axis=0)
>>> notes = []
>>> [n.prim for n in toposort(batch_slices([both], notes)) if n.prim in ("reduce", "concat")], notes
(['reduce'], ['concat[8]:float32 of 2 copies: batched (1 loop nests for all the copies, not 1 per copy)'])
"""
from __future__ import annotations

from jitop.graph import prims
from jitop.graph.batch_rules import shifted_entry
from jitop.graph.ir import Node, consumers, node, same_dims, same_op, same_value, toposort
from jitop.graph.layout import transposed


def batch_slices(results: list[Node], notes: list[str] | None = None) -> list[Node]:
    """`results` with each concatenation of copies of one computation over slices batched (module docstring);
    the nodes themselves when there is none. `notes`, if given, receives a line per concatenation of copies:
    batched, or why not."""
    order = toposort(results)
    concats = [n for n in order if n.prim == "concat" and len(n.src) >= 2]
    if not concats:
        return results
    readers = consumers(order)
    batched = {}
    for c in concats:
        b, why = batched_concat(c, readers)
        if b is not None:
            batched[c] = b
        if notes is not None and why:
            notes.append(f"{c} of {len(c.src)} copies: {why}")
    return _substituted(results, batched) if batched else results


def batched_concat(c: Node, readers: dict[Node, list[Node]]) -> tuple[Node | None, str]:
    """The batched form of concat `c` (None where its parts are not copies over slices, module docstring), and
    what was decided: empty where the parts are not copies of one computation at all."""
    parts = c.src
    matches = [_Match() for _ in parts[1:]]
    if c.dtype is not parts[0].dtype or not all(m.unify(parts[0], p) for m, p in zip(matches, parts[1:])):
        return None, ""
    varying = set(matches[0].pairs)
    if parts[0] not in varying or any(set(m.pairs) != varying for m in matches):
        return None, ""
    stages = sum(prims.get(n.prim).own_stage for n in varying)
    if not stages:
        return None, "elementwise and index arithmetic only: fused into one loop already (not batched)"
    if not _read_only_here(c, parts, matches, varying, readers):
        return None, "a copy's intermediate is read outside the concatenation (not batched: computed twice)"
    leaves = {}
    for leaf, (entry, delta) in matches[0].deltas.items():
        if any(m.deltas.get(leaf) != (entry, delta * (k + 1)) for k, m in enumerate(matches)):
            return None, "slice offsets not in step with the copy's number (not batched)"
        wide = _all_slices(leaf, entry, delta, len(parts))
        if wide is None:
            return None, "slices that do not tile their array: gaps or overlaps (not batched)"
        leaves[leaf] = wide
    stacked = _batched(parts[0], varying, leaves)
    if stacked is None:
        return None, "a primitive without a batch rule (not batched)"
    return _joined(stacked, c), f"batched ({stages} loop nests for all the copies, not {stages} per copy)"


class _Match:
    """How one copy differs from the first: `pairs` maps each node of the first copy that differs to its
    counterpart; `deltas` each differing slice read to (the spec entry that differs, its offset)."""

    def __init__(self) -> None:
        self.pairs: dict[Node, Node] = {}
        self.deltas: dict[Node, tuple[int, int]] = {}

    def unify(self, first: Node, other: Node) -> bool:
        """Whether `other` computes what `first` does up to slice offsets (iterative: copies can be deep)."""
        stack = [(first, other)]
        while stack:
            a, b = stack.pop()
            if a is b:
                continue  # shared by the two copies
            seen = self.pairs.get(a)
            if seen is not None:
                if seen is not b:
                    return False
                continue
            self.pairs[a] = b
            delta = _slice_delta(a, b)
            if delta is not None:
                self.deltas[a] = delta
            elif not same_op(a, b) or not a.src:
                return False
            else:
                stack.extend(zip(a.src, b.src))
        return True


def _slice_delta(a: Node, b: Node) -> tuple[int, int] | None:
    """(entry, offset) when `a` and `b` read one source through index specs that differ only in the start of
    one entry (an int index or a slice's start, constants both)."""
    if a.prim != "index" or b.prim != "index" or a.src[0] is not b.src[0] or not same_dims(a.shape, b.shape):
        return None
    sa, sb = a.param("spec"), b.param("spec")
    differ = [k for k, (x, y) in enumerate(zip(sa, sb)) if not same_value(x, y)]
    if len(differ) != 1:
        return None
    k = differ[0]
    x, y = sa[k], sb[k]
    if x[0] != y[0] or type(x[1]) is not int or type(y[1]) is not int or not same_value(x[2:], y[2:]):
        return None
    return k, y[1] - x[1]


def _all_slices(leaf: Node, entry: int, delta: int, h: int) -> Node | None:
    """One read of the `h` slices `leaf` and its copies read (the copy k's offset k * delta), the copies on a
    new leading axis; None where they do not tile the source (a slice's copies must be adjacent)."""
    spec, src = leaf.param("spec"), leaf.src[0]
    e = spec[entry]
    shifted = tuple(shifted_entry(x) for x in spec)
    if e[0] == "int":  # x[i]: the copies along a new axis, step delta
        wide = shifted[:entry] + (("slice", e[1], delta, 0),) + shifted[entry + 1:]
        return node("index", (h,) + tuple(leaf.shape), leaf.dtype, (src,), spec=wide)
    _, start, step, ax = e
    d = leaf.shape[ax]
    if type(d) is not int or type(step) is not int or delta != d * step or d == 0:
        return None
    shape = tuple(leaf.shape)
    whole = _read(src, shape[:ax] + (h * d,) + shape[ax + 1:], spec)
    split = node("reshape", shape[:ax] + (h, d) + shape[ax + 1:], leaf.dtype, (whole,))
    return transposed(split, (ax,) + tuple(k for k in range(len(shape) + 1) if k != ax))


def _read(src: Node, shape: tuple, spec: tuple) -> Node:
    """index(src, spec) of `shape`; src itself where that reads all of it in order."""
    whole = all(e[0] == "slice" and e[1:] == (0, 1, k) for k, e in enumerate(spec)) and same_dims(shape, src.shape)
    return src if whole else node("index", shape, src.dtype, (src,), spec=spec)


def _batched(first: Node, varying: set[Node], leaves: dict[Node, Node]) -> Node | None:
    """The batched node of the first copy's result, built from its varying nodes inputs first."""
    done: dict[Node, Node] = dict(leaves)
    for n in toposort([first], skip=lambda m: m not in varying or m in leaves):
        rule = prims.get(n.prim).batch
        srcs = [(done.get(s, s), s in varying) for s in n.src]
        out = rule(n, srcs) if rule is not None else None
        if out is None:
            return None
        done[n] = out
    return done[first]


def _joined(stacked: Node, c: Node) -> Node:
    """The concatenation along c's axis of the copies stacked on the leading axis of `stacked`."""
    ax = c.param("axis")
    at_axis = transposed(stacked, tuple(range(1, ax + 1)) + (0,) + tuple(range(ax + 1, c.ndim + 1)))
    return node("reshape", c.shape, c.dtype, (at_axis,))


def _read_only_here(c: Node, parts: tuple[Node, ...], matches: list["_Match"], varying: set[Node],
                    readers: dict[Node, list[Node]]) -> bool:
    """Whether every differing node of every copy is read only inside its copy or by the concatenation (a
    free one, index arithmetic, may be read elsewhere too: computing it twice costs nothing)."""
    copies = [{n: n for n in varying}] + [m.pairs for m in matches]
    for part, pairs in zip(parts, copies):
        inside = set(pairs.values())
        for n in inside:
            if not prims.get(n.prim).free and any(r is not c and r not in inside for r in readers.get(n, ())):
                return False
            if n is not part and c in readers.get(n, ()):
                return False
    return True


def _substituted(results: list[Node], new: dict[Node, Node]) -> list[Node]:
    """`results` rebuilt with each node of `new` replaced by its value there (inputs first, iteratively)."""
    done: dict[Node, Node] = {}
    stack = [(r, False) for r in results]
    while stack:
        n, ready = stack.pop()
        if n in done:
            continue
        deps = (new[n],) if n in new else n.src
        if not ready:
            stack.append((n, True))
            stack.extend((d, False) for d in deps if d not in done)
            continue
        if n in new:
            done[n] = done[new[n]]
            continue
        src = tuple(done[s] for s in n.src)
        same = all(a is b for a, b in zip(src, n.src))
        done[n] = n if same else node(n.prim, n.shape, n.dtype, src, n.weak, **dict(n.params))
    return [done[r] for r in results]
