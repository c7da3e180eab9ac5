"""The primitive table (jitop.graph.prims): every primitive the front ends build (the tracer's numpy API, the
operator library, the ONNX converters, the compile pipeline's copies) has an entry, each entry's fields fit its
operator class, a template's entry yields a workload its template accepts, and a primitive without an entry is
an error that names it. No LLVM."""
from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

import jitop
from jitop.graph import fusion, prims, tasks
from jitop.graph.ir import node
from jitop.graph.prims import Kind, Prim
from jitop.graph.tracer import trace_symbolic
from jitop.target import Target
from jitop.tuner import registry

JITOP = pathlib.Path(jitop.__file__).resolve().parent


def built_primitives() -> dict[str, str]:
    """Every primitive name a `node("name", ...)` call in jitop's sources builds -> where it is first built."""
    found: dict[str, str] = {}
    for path in sorted(JITOP.rglob("*.py")):
        for call in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "node"
                    and call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
                found.setdefault(call.args[0].value, f"{path.relative_to(JITOP.parent)}:{call.lineno}")
    return found


BUILT = built_primitives()


def test_the_scan_sees_the_front_ends() -> None:
    # the tracer's numpy API, the operator library's conv2d and the kernel's arguments: if the scan stops
    # seeing them, the test below checks nothing
    assert {"ufunc", "reduce", "take", "iota", "dim", "matmul", "conv2d", "scalar_arg", "copy"} <= set(BUILT)


@pytest.mark.parametrize("name", sorted(BUILT))
def test_every_built_primitive_has_an_entry(name: str) -> None:
    assert name in prims.PRIMS, f"{name!r} (built at {BUILT[name]}) has no entry in jitop.graph.prims.PRIMS"


@pytest.mark.parametrize("name", sorted(prims.PRIMS))
def test_entries_are_consistent(name: str) -> None:
    assert prims.problems(prims.PRIMS[name]) == []


@pytest.mark.parametrize("entry, problem", [
    (Prim(Kind.INJECTIVE), "needs an expression emitter"),
    (Prim(Kind.REDUCTION, emit=lambda c, n, i: None, build=lambda c, n: None), "only injective primitives"),
    (Prim(Kind.REDUCTION), "needs a stage builder"),
    (Prim(Kind.INJECTIVE, emit=lambda c, n, i: None, build=lambda c, n: None), "no stage of its own"),
    (Prim(Kind.COMPLEX, build=lambda c, n: None, row_fusable=False, symbolic_fields=("m",)), "workload"),
    (Prim(Kind.COMPLEX, build=lambda c, n: None, row_fusable=False, workload=dict), "symbolic_fields"),
    (Prim(Kind.COMPLEX, build=lambda c, n: None, workload=dict, symbolic_fields=("m",)), "tiles, not rows"),
    (Prim(Kind.REDUCTION, build=lambda c, n: None, free=True), "only injective primitives are inlined"),
    (Prim(Kind.INPUT, elementwise=True), "only injective primitives are inlined"),
    (Prim(Kind.INJECTIVE, emit=lambda c, n, i: None, constant=True), "free to recompute"),
    (Prim(Kind.INJECTIVE, emit=lambda c, n, i: None, symbolic_fields=("m",)), "for template primitives"),
])
def test_inconsistent_entries_are_reported(entry: Prim, problem: str) -> None:
    assert any(problem in p for p in prims.problems(entry)), prims.problems(entry)


def test_the_classes_match_fusion() -> None:
    """The table reproduces the sets fusion kept before it (TVM's classes as jitop applies them)."""
    def having(flag: str) -> set[str]:
        return {k for k, p in prims.PRIMS.items() if getattr(p, flag)}
    assert having("is_input") == {"arg", "scalar_arg", "array_const"}
    assert having("own_stage") == {"reduce", "argreduce", "scan", "scatter", "matmul", "conv2d"}
    assert {k for k, p in prims.PRIMS.items() if p.kind is Kind.COMPLEX} == {"matmul", "conv2d"}
    assert having("free") == {"broadcast", "reshape", "transpose", "index", "cast", "copy", "const", "dim", "iota"}
    assert having("broadcasts") == {"broadcast", "ufunc", "where", "take", "update"}
    assert having("elementwise") == {"ufunc", "cast", "where"}
    assert having("constant") == {"const", "dim"}


def _matmul(a, b):
    return a @ b


def _conv(x, w):
    return jitop.conv2d(x, w, padding=1)


@pytest.mark.parametrize("fn, shapes", [(_matmul, [(5, 7), (7, 3)]), (_conv, [(1, 2, 6, 6), (4, 2, 3, 3)])])
def test_template_entries_make_their_templates_workload(fn, shapes) -> None:
    args = [np.ones(s, np.float32) for s in shapes]
    n = trace_symbolic(fn, args, {}).result.node
    p = prims.get(n.prim)
    assert p.kind is Kind.COMPLEX
    fields = p.workload(n)
    assert set(p.symbolic_fields) <= set(fields)
    task = tasks.task_of(n, Target.from_string("llvm -mcpu=haswell"))
    assert task.template == n.prim and task.workload == registry.get(n.prim).workload_type(**fields)


def test_a_primitive_without_an_entry_is_named() -> None:
    x = node("arg", (4,), jitop.dtypes.as_dtype("float32"), index=0)
    y = node("no_such_prim", (4,), x.dtype, (x,))
    with pytest.raises(LookupError, match="'no_such_prim' has no entry in jitop.graph.prims.PRIMS"):
        fusion.materialize([y])


def test_every_entry_is_built_somewhere() -> None:
    # an entry no front end builds is dead code the other tables would have to keep consistent
    assert set(prims.PRIMS) <= set(BUILT), sorted(set(prims.PRIMS) - set(BUILT))
