"""Fusion: which nodes are materialized (kernel boundaries), following TVM's operator classes.

Injective nodes (elementwise, broadcast, reshape, slicing) are inlined into their consumers, so an
injective chain becomes one loop nest and injective producers fuse into a reduction's input.
A node is materialized (gets its own stage and buffer) when it is an output, a reduction or a
matmul, or when several consumers share it and recomputing it would be expensive.
"""
from __future__ import annotations

from dataclasses import dataclass

from jitop.graph.ir import Node, consumers, toposort

INPUTS = frozenset({"arg", "scalar_arg", "array_const"})
COMPLEX = frozenset({"matmul", "conv2d"})  # complex-out-fusable: elementwise consumers run on their tiles
OPAQUE = frozenset({"reduce", "argreduce"}) | COMPLEX
EXPENSIVE_UFUNCS = frozenset("""exp exp2 expm1 log log2 log10 log1p logaddexp logaddexp2 sin cos tan arcsin arccos
arctan arctan2 sinh cosh tanh arcsinh arccosh arctanh power float_power sqrt cbrt hypot divide true_divide
floor_divide remainder mod fmod""".split())
MAX_INLINE_OPS = 8  # a shared injective subtree bigger than this is computed once


@dataclass
class Group:
    """A materialized node and the injective nodes inlined into it."""

    root: Node
    members: list[Node]
    reason: str


def _inline_cost(n: Node, materialized: set[Node], memo: dict[Node, tuple[int, bool]]) -> tuple[int, bool]:
    """(ops, has an expensive op) of the subtree inlined into `n`."""
    if n in memo:
        return memo[n]
    ops, expensive = 1, n.prim == "ufunc" and n.param("name") in EXPENSIVE_UFUNCS
    for s in n.src:
        if s not in materialized and s.prim not in INPUTS:
            o, e = _inline_cost(s, materialized, memo)
            ops, expensive = ops + o, expensive or e
    memo[n] = (ops, expensive)
    return memo[n]


def materialize(outputs: list[Node]) -> dict[Node, str]:
    """Materialized non-input nodes -> why a kernel stage ends there."""
    order = toposort(outputs)
    users = consumers(order)
    why: dict[Node, str] = {}
    for n in order:
        if n.prim in INPUTS or n.prim == "const" and n not in outputs:
            continue
        if n in outputs:
            why[n] = "output of the function"
        elif n.prim in OPAQUE:
            why[n] = f"{n.prim} (reductions, matmuls and convolutions get their own loop nest)"
    memo: dict[Node, tuple[int, bool]] = {}
    for n in reversed(order):  # consumers first, so a shared subtree is judged as a whole
        if n in why or n.prim in INPUTS or n.prim == "const" or len(users[n]) < 2:
            continue
        ops, expensive = _inline_cost(n, set(why), memo)
        if expensive or ops > MAX_INLINE_OPS:
            why[n] = f"shared by {len(users[n])} consumers and costly to recompute ({ops} ops)"
    return why


def groups(outputs: list[Node], why: dict[Node, str]) -> list[Group]:
    """Each materialized node with the nodes inlined into it, in execution order."""
    out = []
    for root in toposort(outputs):
        if root not in why:
            continue
        members, stack, seen = [], list(root.src), set()
        while stack:
            n = stack.pop()
            if n in why or n.prim in INPUTS or id(n) in seen:
                continue
            seen.add(id(n))
            members.append(n)
            stack.extend(n.src)
        out.append(Group(root, members, why[root]))
    return out
