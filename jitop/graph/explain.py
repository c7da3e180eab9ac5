"""Text for f.explain(): the traced graph, fusion groups and why each ended, schedules and loop IR."""
from __future__ import annotations

from typing import Any

from jitop.graph.ir import Node, toposort
from jitop.graph.compile import rewritten
from jitop.tir.nodes import VALUE


def _node_line(n: Node, names: dict[Node, str]) -> str:
    params = ", ".join(f"{k}={v}" for k, v in n.params if k not in ("data", "index"))
    src = ", ".join(names[s] for s in n.src)
    return f"  {names[n]} = {n.prim}({src}{', ' if src and params else ''}{params}) : {n.dtype}{list(n.shape)}"


def shape_lines(trace: Any, why: dict, static: dict, refused: dict) -> list[str]:
    """The "shapes" block: each symbol with where it comes from and why it varies, the dims tied to it, the
    guards the kernel checks, the dims the function made constant, and a symbolic trace that was refused."""
    env = trace.env
    lines = ["shapes:"]
    if env is None or not env.symbols:
        lines.append("  every dim is a constant of this kernel (a new shape traces and compiles again, unless a "
                     "dim varies: see @jitop.kernel(dynamic=...))")
    else:
        for sym in env.symbols:
            leaf, dim = trace.symbols[sym.name]
            source = f"{leaf} dim {dim}" if dim != VALUE else f"the Python int {leaf}"
            if sym in env.subst:
                tie = next((t for t in env.ties if t.symbol is sym), None)
                where = f" ({tie.why} at {tie.line})" if tie is not None and tie.line else ""
                lines.append(f"  {source} = {env.resolve(sym)!r}{where}")
            else:
                reason = why.get((leaf, dim), "dynamic=") if dim != VALUE else "used as a size, its value varied"
                lines.append(f"  {sym.name} = {source} (traced at {env.hints[sym]}): {reason}")
        guards = [f"{g} ({g.why} at {g.line})" if g.line else str(g) for g in env.current_guards()]
        lines.append(f"  guards: every symbol >= 2{''.join('; ' + g for g in guards)}")
        lines.append("  sizes 0 and 1 are compiled as constants (they broadcast): a call with one gets its own kernel")
    lines += [f"  constant: {leaf} dim {dim}: {what}" for (leaf, dim), what in static.items()]
    lines += [f"  symbolic trace refused, so dims are constants: {reason}" for reason in refused.values()]
    return lines


def _graph_lines(name: str, trace: Any, cached: bool) -> tuple[list[str], dict[Node, str]]:
    """The header and the traced graph's lines; each node's name (%k, or its argument's name)."""
    order = toposort(trace.results)
    names = {n: f"%{k}" for k, n in enumerate(order)}
    for n, arg in zip(trace.inputs, trace.names):
        names[n] = arg
    lines = [f"jitop.kernel '{name}' — {'in-memory cache hit' if cached else 'compiled for this call (cache miss)'}",
             "", "traced graph:"]
    return lines + [_node_line(n, names) for n in order if n not in trace.inputs], names


def describe_gpu(name: str, trace: Any, cached: bool, target: Any, templates: list[str], decisions: list[str],
                 launches: Any, func: Any, shapes: list[str] | None = None) -> str:
    """explain() of a GPU function (jitop.graph.gpu): the traced graph, its `shapes` block (`shape_lines`), the
    GPU target, each template's config (`templates`: to_te.choice_line's), the schedule's decisions (epilogues,
    row groups), the kernel launches in order (`launches`: the build's) and the loop IR."""
    lines, _ = _graph_lines(name, trace, cached)
    if shapes:
        lines += ["", *shapes]
    lines += ["", f"target: {target.describe()} (key {target.key})"]
    if templates:
        lines += ["", "operator templates (task, schedule choice and its source):"] + [f"  {t}" for t in templates]
    if decisions:
        lines += ["", "schedule decisions:"] + [f"  {d}" for d in decisions]
    lines += ["", f"kernel launches, in order ({len(launches)}, {len({k.name for k in launches})} distinct "
              "kernels):"]
    lines += [f"  {k.name}: grid {k.grid}, block {k.block}, {k.shared_bytes} bytes of shared memory"
              for k in launches]
    lines += ["", "loop IR (schedule applied; one kernel per outermost loop bound to blockIdx):", str(func)]
    return "\n".join(lines)


def describe(name: str, exe: Any, trace: Any, cached: bool, lookup: Any = None, func: Any = None,
             shapes: list[str] | None = None) -> str:
    lines, names = _graph_lines(name, trace, cached)
    new = [n for n in toposort(rewritten(trace.results)) if n not in names]
    if new:  # the nodes the compiled graph has in place of the traced ones, numbered after them
        names.update((n, f"%{k}") for k, n in enumerate(new, start=len(names)))
        lines += ["", "compiled graph (loops over slices batched; convolutions channels-last, transposes pushed "
                  "through elementwise ops and poolings):"]
        lines += [_node_line(n, names) for n in new]
    if shapes:
        lines += ["", *shapes]
    lines += ["", "fusion groups (one loop nest each; inlined nodes run inside it):"]
    for g in exe.groups:
        inlined = ", ".join(names.get(m, "?") for m in g.members) or "nothing"
        lines.append(f"  {names.get(g.root, '?')}: inlines {inlined}; ends because: {g.reason}")
    lines += ["", "pipeline decisions:"] + [f"  {d}" for d in exe.decisions]
    target = exe.module.target
    lines += ["", f"target: {target.describe()} (key {target.key})"]
    if exe.templates:
        lines += ["", "operator templates (task, schedule choice and its source):"] + [f"  {t}" for t in exe.templates]
        untuned = sum(", default config " in t for t in exe.templates)
        if untuned:  # one line for all of them, never a warning per call
            lines.append(f"  {untuned} of {len(exe.templates)} untuned: template defaults for this Target "
                         "(jitop.tune(f, *args) tunes them)")
        imported = sum(", imported tuned config " in t for t in exe.templates)
        if imported:  # a claim from `jitop cache import`: say so once, as for the untuned ones
            lines.append(f"  {imported} of {len(exe.templates)} from imported records: imported, not measured here "
                         "(jitop.tune(f, *args) measures them)")
    if lookup is not None:
        lines += ["", lookup.describe()]
    lines += ["", "loop IR (schedule applied):", str(func if func is not None else exe.func)]
    return "\n".join(lines)
