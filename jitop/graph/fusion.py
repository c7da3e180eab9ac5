"""Fusion: which nodes are materialized (kernel boundaries), following TVM's operator classes.

Injective nodes (elementwise, broadcast, reshape, slicing) are inlined into their consumers, so an
injective chain becomes one loop nest and injective producers fuse into a reduction's input.
A node is materialized (gets its own stage and buffer) when it is an output, a reduction or a
matmul, or when recomputing it would be expensive: several consumers share it, a consumer broadcasts
it (reads each element many times), or it feeds a matmul/conv operand that the template reads once per
panel. Into such repeated reads only what is free to recompute is fused (layout, index, cast and a couple
of cheap ops, by `recompute_cost`); a packed operand is read once, so its producer runs while packing.
An injective chain longer than MAX_FUSE_DEPTH is cut into several stages, so a fused expression's depth
is bounded whatever the program's length (TVM's FuseOps caps its fusion depth too).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from jitop.graph import prims
from jitop.graph.ir import Node, consumers, toposort
from jitop.graph.shapes import rep, same_dims

MAX_SHARED_COST = 8  # a subtree shared by several consumers is recomputed by each unless it costs more
FREE_TO_RECOMPUTE = 2  # extra cheap ops per element a consumer that rereads it may recompute
# a transposed operand read several times is copied once above this size: smaller, its strided passes hit the
# core's own caches (a 2048x2048 float32 a.T read in place made a.T @ b 2.6x slower than numpy)
TRANSPOSED_INLINE_BYTES = 1 << 20
# A consumer reading an inlined node twice (x * x) computes it once (the code generator emits equal
# subexpressions once), but the passes before it walk the expression as a tree: a chain of such reads
# doubles the tree at each step. A node read repeatedly is computed once when it costs more than this.
MAX_REPEATED_COST = 64
# The most nodes one fused expression nests (a root and its inlined producers, along any path). The expression
# passes (to_te, lowering, the simplifier, codegen) recurse over an expression's depth, so a bounded depth keeps
# them within Python's stack for programs of any length. 64 elementwise ops per element between two passes
# over memory cost more than the store and load a cut adds (256 multiply-adds over 4M float32, 2 threads,
# AVX-512: 21.6 ms cut every 64 ops, 22.8 ms in one expression).
MAX_FUSE_DEPTH = 64


@dataclass
class Group:
    """A materialized node and the injective nodes inlined into it."""

    root: Node
    members: list[Node]
    reason: str


def op_cost(n: Node) -> int:
    """Cost of evaluating one element of `n` itself, in cheap-op units (layout and index changes are free)."""
    p = prims.get(n.prim)
    return 0 if p.free else p.cost(n)


def recompute_cost(n: Node, materialized: set[Node] | dict, memo: dict[Node, int] | None = None) -> int:
    """Cost of one element of `n` with everything not materialized inlined into it (shared subtrees counted
    once per use, as inlining evaluates them)."""
    memo = {} if memo is None else memo
    if n in memo:
        return memo[n]
    # producers first (iteratively: an inlined chain may be thousands of nodes long); `memo` keeps a shared
    # subtree's cost, so each node is visited once however often it is used
    for m in toposort([n], skip=lambda s: s in memo or (s is not n and not _inlined(s, materialized))):
        memo[m] = op_cost(m) + sum(memo[s] for s in m.src if _inlined(s, materialized))
    return memo[n]


def _inlined(s: Node, materialized: set[Node] | dict) -> bool:
    return s not in materialized and not prims.get(s.prim).is_input


def _inlinable(n: Node, why: dict[Node, str]) -> bool:
    p = prims.get(n.prim)
    return n not in why and not p.is_input and not p.constant


def materialize(outputs: list[Node], padded_tails: bool = False) -> dict[Node, str]:
    """Materialized non-input nodes -> why a kernel stage ends there; `padded_tails`: also a template's tail
    that a convolution reads with padding (where the compiler stores it into the padded copy, see
    `tails_on_tiles`)."""
    order = toposort(outputs)
    users = consumers(order)
    reads = _reads(order)
    why: dict[Node, str] = {}
    for n in order:
        p = prims.get(n.prim)
        if p.is_input or p.constant and n not in outputs:
            continue
        if n in outputs:
            why[n] = "output of the function"
        elif p.own_stage:
            why[n] = f"{n.prim} (reductions, matmuls and convolutions get their own loop nest)"
    memo: dict[Node, int] = {}
    for n in reversed(order):  # consumers first, so a shared subtree is judged as a whole
        if not _inlinable(n, why):
            continue
        if len(users[n]) >= 2 and (cost := recompute_cost(n, why, memo)) > MAX_SHARED_COST:
            why[n] = f"shared by {len(users[n])} consumers and costly to recompute ({cost} ops)"
        elif reads[n] >= 2 and (cost := recompute_cost(n, why, memo)) > MAX_REPEATED_COST:
            why[n] = f"read {reads[n]} times by its consumer and its expression is large ({cost} ops)"
        elif (b := _broadcast_reads(n, users[n])) > 1 and (cost := recompute_cost(n, why, memo)) > FREE_TO_RECOMPUTE:
            why[n] = (f"broadcast: each element is read {b} times by its consumer and costs {cost} ops "
                      "to recompute, so it is computed once")
    tails_on_tiles(order, users, why, padded_tails)
    bound_depth(order, why)
    return why


def tails_on_tiles(order: list[Node], users: dict[Node, list[Node]], why: dict[Node, str],
                   padded_tails: bool = False) -> None:
    """Materialize a matmul/conv's elementwise tail (bias, activation) that would be inlined into a consumer
    evaluating each of its elements more than once (a max pooling's overlapping windows over a convolution's
    ReLU): materialized, it is the template's epilogue, computed once on the register tile at no extra pass
    over memory, and the consumer reads finished values (ResNet's stem: its pooling reran the bias and ReLU
    2.25 times per element). With `padded_tails`, so is a tail a convolution reads with padding: the template
    then stores it into that convolution's zero-bordered copy (jitop.tir.padding, CPU code), and the copy's
    own pass over memory is gone."""
    evaluations = _evaluations(order, users, why)
    for t in reversed(order):  # consumers first: a tail materialized below changes only its producers' counts
        if prims.get(t.prim).workload is None:
            continue
        end = _chain_end(t, users, why)
        if end is t or end in why:
            continue
        single_reader = len(users[end]) == 1 and users[end][0] not in why
        if single_reader and (k := evaluations[end]) > 1:
            why[end] = (f"the elementwise tail of a {t.prim}, which its consumer would evaluate on {k} paths: "
                        "computed once, on the template's register tile")
        elif padded_tails and any(_padded_input(end, u) for u in users[end]):
            why[end] = (f"the elementwise tail of a {t.prim}, the padded input of a convolution: computed on "
                        "the template's register tile, stored into the convolution's padded copy")
        else:
            continue
        evaluations = _evaluations(order, users, why)


def _padded_input(n: Node, user: Node) -> bool:
    """Whether `user` is a convolution reading `n` as its input with padding (its copy with a zero border is
    then where n's producer can write n: jitop.tir.padding)."""
    return user.prim == "conv2d" and user.src[0] is n and any(user.param("pads"))


def _chain_end(t: Node, users: dict[Node, list[Node]], why: dict[Node, str]) -> Node:
    """The last of the inlined same-shape elementwise nodes following `t` one user at a time (`t` if none)."""
    n = t
    while len(users[n]) == 1:
        u = users[n][0]
        if u in why or not (prims.get(u.prim).elementwise and same_dims(u.shape, t.shape)):
            break
        n = u
    return n


def _evaluations(order: list[Node], users: dict[Node, list[Node]], why: dict[Node, str]) -> dict[Node, int]:
    """Node -> how many times the materialized nodes evaluate each of its elements, summed over the inlined paths
    to them (a concatenation read by nine window slices counts nine; a reader using it twice, once)."""
    out: dict[Node, int] = {}
    for m in reversed(order):
        out[m] = sum(1 if u in why else out[u] for u in users[m]) or 1
    return out


def _reads(order: list[Node]) -> dict[Node, int]:
    """Node -> how many operands of other nodes are it (a reader that uses it twice counts twice)."""
    out = dict.fromkeys(order, 0)
    for n in order:
        for s in n.src:
            out[s] += 1
    return out


def bound_depth(order: list[Node], why: dict[Node, str]) -> None:
    """Materialize the sources whose inlined expression would nest a consumer's deeper than MAX_FUSE_DEPTH
    levels (an elementwise chain is cut every MAX_FUSE_DEPTH nodes).

    `order` is topological (producers first); a node's depth is its own levels plus the largest depth among
    its inlined sources."""
    depth: dict[Node, int] = {}
    for n in order:
        own = _levels(n)
        for s in n.src:
            if depth[s] + own > MAX_FUSE_DEPTH and _inlinable(s, why):
                why[s] = f"an inlined chain {depth[s]} levels deep (the deepest one fused expression may nest)"
        depth[n] = own + max((depth[s] for s in n.src if _inlined(s, why)), default=0)


def _levels(n: Node) -> int:
    """How deep n's own expression nests: one, or a balanced tree of selects for a concatenation."""
    return prims.get(n.prim).levels(n)


def _broadcast_reads(n: Node, users: list[Node]) -> int:
    """How many times the consumers that broadcast `n` read each of its elements (1 if none does)."""
    # a heuristic: symbolic sizes at their representative value
    size = _rep_size(n)
    return max([_rep_size(u) // max(size, 1) for u in users if prims.get(u.prim).broadcasts and _rep_size(u) > size],
               default=1)


def _rep_size(n: Node) -> int:
    """n's element count, symbols at their representative size (constant shapes: the exact count)."""
    return math.prod(d if type(d) is int else rep(d) for d in n.shape)


def fuse_operands(why: dict[Node, str], operand_reads: dict[Node, tuple[int, ...]]) -> list[str]:
    """Materialize the producers of matmul/conv operands that are not free to recompute.

    operand_reads: templated node -> how many times its template evaluates each element of each operand.
    An operand read once (packed) keeps its producer inlined: it is computed while packing. Returns one
    line per operand with an inlined producer, saying what was decided and why (for explain).
    """
    decisions = []
    for n, reads in operand_reads.items():
        for k, (src, r) in enumerate(zip(n.src, reads)):
            if not _inlinable(src, why):
                continue
            cost = recompute_cost(src, why)
            what = f"{n.prim} operand {k} ({src.prim}{list(src.shape)}, {cost} ops per element, read {r}x)"
            # the template evaluates an operand in its inner loop, one element at a time: every extra read
            # of a costly element is paid in full (a cheap one fused into a previous matmul's epilogue is free)
            if cost * (r - 1) > FREE_TO_RECOMPUTE:
                why[src] = (f"operand {k} of a {n.prim}, which reads each element {r} times: recomputing its "
                            f"{cost}-op expression each time costs more than computing it once")
                decisions.append(f"{what}: computed once, materialized (costly to recompute)")
            elif r > 1 and _rep_size(src) * src.dtype.itemsize > TRANSPOSED_INLINE_BYTES \
                    and _moves_last_axis(src, why):
                # read in place through a transpose, the rows the template walks are columns in memory, one
                # cache line (and page) per element, on every pass: a.T @ b ran 2.6x slower than numpy so;
                # copied once (a tiled transpose, at memory speed), the passes read rows
                why[src] = (f"operand {k} of a {n.prim}, which reads each element {r} times: it is transposed "
                            f"(its last axis is not its source's), so each pass would stride through memory")
                decisions.append(f"{what}: copied once, materialized (read transposed)")
            else:
                done = "inlined (each element is read once)" if r == 1 else "inlined (free to recompute)"
                decisions.append(f"{what}: {done}")
    return decisions


def _moves_last_axis(n: Node, why: dict[Node, str]) -> bool:
    """Some transpose inlined into `n` (n itself or a producer that is not materialized) moves its source's
    last axis away from the last place: reading `n` along its last axis strides through that source."""
    return any(m.prim == "transpose" and m.param("perm")[-1] != len(m.shape) - 1
               for m in toposort([n], skip=lambda s: s is not n and not _inlined(s, why)))


def groups(outputs: list[Node], why: dict[Node, str]) -> list[Group]:
    """Each materialized node with the nodes inlined into it, in execution order."""
    out = []
    for root in toposort(outputs):
        if root not in why:
            continue
        members, stack, seen = [], list(root.src), set()
        while stack:
            n = stack.pop()
            if n in why or prims.get(n.prim).is_input or id(n) in seen:
                continue
            seen.add(id(n))
            members.append(n)
            stack.extend(n.src)
        out.append(Group(root, members, why[root]))
    return out
