"""A deep kernel's parts compiled in forked child processes, beside the parent.

Building a large kernel is Python (generating LLVM IR) and then LLVM (parsing, optimising), both on one core:
the GIL and llvmlite's lock make threads useless. A kernel of several `<symbol>.partP` functions
(jitop.codegen.kernel.kernel_parts) can be split instead: the parent forks children, each child generates,
parses and optimises a module holding only its share of the parts and sends it back as bitcode, while the
parent does the same with the kernel function and its own share. The parent links the children's modules
into its own and emits one object file, so the Module a compile returns looks as a serial one does.

A child never decides whether a compile succeeds (jitop.codegen.children): whatever goes wrong in or with it
(an exception, a crash, a hang, a reply that does not parse) makes the parent build that share itself.
"""
from __future__ import annotations

import functools
import json
import struct
from dataclasses import dataclass
from typing import Iterable

import llvmlite.binding as llvm

from jitop.codegen import children
from jitop.codegen.instances import Shared, find_shared
from jitop.codegen.kernel import MAX_UNROLL, KernelCodegen, Split, kernel_parts, top_level_nests
from jitop.codegen.target import emit_object, link_modules, optimised_module
from jitop.target import Target
from jitop.tir.nodes import ForKind, PrimFunc, Stmt

# what generating a nest costs beside its size, in `_size` units (fit to ResNet-50's parts: 16 nests, ~0.3 s)
NEST_COST = 350
_LENGTH = struct.Struct("<Q")  # a reply: header length, JSON header, then the bitcode

stats = {"forked": 0, "fallbacks": 0}  # builds that forked children; child shares the parent built itself


@dataclass
class Compiled:
    """A kernel compiled to object code, with what its Module's metadata needs."""

    optimised: llvm.ModuleRef  # the optimised module (linked, when children built parts of it)
    object_code: bytes
    checked: list[str]         # the error flag's messages: flag value k means checked[k - 1]
    uses_parallel: bool
    profile_stages: list[str] | None = None


@dataclass
class _Share:
    """A module of parts: which parts it defines, the messages its error codes (offset by its base) mean."""

    parts: list[int]
    checked: list[str]
    uses_parallel: bool
    module: llvm.ModuleRef


def compile_kernel(func: PrimFunc, symbol: str, target: Target, signature: str, jobs: int) -> Compiled:
    """Generate, optimise and emit the kernel `symbol` for `func`, its parts spread over up to `jobs`
    processes (this one and forked children) when it has several and forking is safe here."""
    shares = _shares(func, jobs) if _may_fork(func) else []
    if len(shares) < 2:
        cg = KernelCodegen(func, symbol, target, signature=signature)
        mod = optimised_module(str(cg.build()), target)
        return Compiled(mod, emit_object(mod, target), cg.checked, cg.uses_parallel, cg.profile_stages)
    return _compile_split(func, symbol, target, signature, shares)


def _may_fork(func: PrimFunc) -> bool:
    """Forking is safe (`children.may_fork`) and it is no profiling build (its counters are the kernel's own
    nests)."""
    return children.may_fork() and not func.attrs.get("profile")


def _shares(func: PrimFunc, jobs: int) -> list[frozenset[int]]:
    """The parts each process builds, the parent's first; [] when there are too few parts for `jobs` > 1.
    Greedy: the biggest part first, each to the process it makes the least loaded, counting a group of
    identical nests (jitop.codegen.instances) once per process that holds one of them: the first instance
    in a module generates the group's function, the others only call it."""
    nests = top_level_nests(func.body)
    parts = kernel_parts(len(nests))
    jobs = min(jobs, len(parts))
    if jobs < 2:
        return []
    shared = find_shared(nests, func.attrs.get("ranges", {}), frozenset(func.symbols))
    sizes = [_size(nest) for nest in nests]
    cost = lambda ks, have: _cost(ks, sizes, shared, have)  # noqa: E731
    loads, shares, groups = [0] * jobs, [set() for _ in range(jobs)], [set() for _ in range(jobs)]
    for p in sorted(range(len(parts)), key=lambda p: -cost(parts[p], set())):
        j = min(range(jobs), key=lambda j: loads[j] + cost(parts[p], groups[j]))
        loads[j] += cost(parts[p], groups[j])
        shares[j].add(p)
        groups[j] |= {id(shared[k]) for k in parts[p] if k in shared}
    kept = [frozenset(shares[0])] + [frozenset(s) for s in shares[1:] if s]  # a child with nothing to build: none
    return kept if len(kept) > 1 else []


def _cost(nests: Iterable[int], sizes: list[int], shared: dict[int, Shared], have: set[int]) -> int:
    """What building `nests` adds to a process that already generated the groups (ids) in `have`."""
    total, seen = 0, set(have)
    for k in nests:
        group = shared.get(k)
        if group is not None and id(group) in seen:
            total += 1  # a call of the group's function
            continue
        total += sizes[k] + NEST_COST
        if group is not None:
            seen.add(id(group))
    return total


def _size(s: Stmt) -> int:
    return children.emitted_size(s, MAX_UNROLL, (ForKind.UNROLLED,))


def _compile_split(func: PrimFunc, symbol: str, target: Target, signature: str,
                   shares: list[frozenset[int]]) -> Compiled:
    """The parent's side: fork a child per share after the first, build the kernel and the first share,
    collect the children's modules (building a share itself where a child failed), link, emit."""
    stats["forked"] += 1

    def own() -> tuple[KernelCodegen, llvm.ModuleRef]:
        cg = KernelCodegen(func, symbol, target, signature=signature, split=Split(shares[0]))
        return cg, optimised_module(str(cg.build()), target)
    works = [functools.partial(_child_work, func, symbol, target, shares[j], j) for j in range(1, len(shares))]
    (cg, mod), built = children.run_beside(works, own, lambda k, data: _decoded(data, shares[k + 1], symbol))
    for j, share in enumerate(built, start=1):
        if share is None:
            stats["fallbacks"] += 1
            built[j - 1] = _build_share(func, symbol, target, shares[j], j)
    return _link(mod, cg, built, symbol, target)


def _link(mod: llvm.ModuleRef, cg: KernelCodegen, built: list[_Share], symbol: str, target: Target) -> Compiled:
    """Link the shares into the kernel's module with the globals they refer to (the error flag, each share's
    error base), make what only the kernel calls internal again, and emit object code."""
    checked, bases = list(cg.checked), []
    for share in built:
        bases.append(len(checked))
        checked += share.checked
    defs = [f'@"{symbol}_error_base{j}" = constant i32 {base}' for j, base in enumerate(bases, start=1)]
    if cg.error_flag is None and checked:  # the kernel's own parts check nothing: define the flag here
        defs.append(f'@"{symbol}_error" = global i32 0')
    link_modules(mod, [share.module for share in built] + [optimised_module("\n".join(defs), target, 0)])
    for j, share in enumerate(built, start=1):
        mod.get_global_variable(f"{symbol}_error_base{j}").linkage = "internal"
        for p in share.parts:
            mod.get_function(f"{symbol}.part{p}").linkage = "internal"
    uses_parallel = cg.uses_parallel or any(share.uses_parallel for share in built)
    return Compiled(mod, emit_object(mod, target), checked, uses_parallel)


def _build_share(func: PrimFunc, symbol: str, target: Target, parts: frozenset[int], j: int) -> _Share:
    """Generate and optimise the module of share j: the bodies of `parts` only, externally visible, its
    error codes offset by `<symbol>_error_base<j>`."""
    split = Split(parts, kernel=False, error_base=f"{symbol}_error_base{j}")
    cg = KernelCodegen(func, symbol, target, split=split)
    mod = optimised_module(str(cg.build()), target)
    return _Share(sorted(parts), cg.checked, cg.uses_parallel, mod)


# ** the child's side **
def _child_work(func: PrimFunc, symbol: str, target: Target, parts: frozenset[int], j: int) -> bytes:
    """The reply of the child building share j: header length, JSON header, the module's bitcode."""
    share = _build_share(func, symbol, target, parts, j)
    header = json.dumps({"parts": share.parts, "checked": share.checked,
                         "uses_parallel": share.uses_parallel}).encode()
    return _LENGTH.pack(len(header)) + header + share.module.as_bitcode()


# ** the parent's side of a child **
def _decoded(data: bytes, parts: frozenset[int], symbol: str) -> _Share | None:
    """A child's reply as its share; None if it is malformed."""
    try:
        return _decode(data, parts, symbol)
    except (ValueError, TypeError, KeyError, RuntimeError, NameError):  # json, llvm.parse_bitcode, lookups
        return None


def _decode(data: bytes, parts: frozenset[int], symbol: str) -> _Share:
    """A child's reply as a share; ValueError unless it describes `parts` and its module defines them."""
    if len(data) < _LENGTH.size:
        raise ValueError("reply shorter than its header's length")
    (n,) = _LENGTH.unpack_from(data)
    header = json.loads(data[_LENGTH.size:_LENGTH.size + n])
    checked, uses_parallel = header["checked"], header["uses_parallel"]
    if header["parts"] != sorted(parts) or not isinstance(uses_parallel, bool) or not (
            isinstance(checked, list) and all(isinstance(c, str) for c in checked)):
        raise ValueError("reply header does not describe the share asked for")
    module = llvm.parse_bitcode(data[_LENGTH.size + n:])
    if any(module.get_function(f"{symbol}.part{p}").is_declaration for p in parts):
        raise ValueError("reply module lacks a part")
    return _Share(sorted(parts), checked, uses_parallel, module)
