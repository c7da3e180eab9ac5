"""lower() and build(): a Schedule to loop IR, loop IR to a loaded Module."""
from __future__ import annotations

import hashlib
import re
from typing import Sequence

from jitop.codegen.kernel import KernelCodegen
from jitop.codegen.target import compile_ir, target_key
from jitop.runtime.args import ParamSpec
from jitop.runtime.module import Module
from jitop.schedule.schedule import Schedule
from jitop.te.tensor import Tensor
from jitop.tir.lower import lower as _lower
from jitop.tir.nodes import PrimFunc


def lower(s: Schedule, args: Sequence[Tensor], name: str = "main", simple_mode: bool = True) -> PrimFunc:
    """Lower a schedule to loop IR; print the result to read the loops.

    >>> print(jitop.lower(s, [A, B]))   # doctest: +SKIP
    def main(A: float32[1024], B: float32[1024]):
        for i in range(1024):
            B[i] = A[i] * 2.0f
    """
    return _lower(s, args, name)


def build(s: Schedule | PrimFunc, args: Sequence[Tensor] | None = None, target: str = "llvm",
          name: str = "main") -> Module:
    """Compile a schedule (or lowered function) for the host CPU and load it.

    >>> f = jitop.build(s, [A, B])   # doctest: +SKIP
    >>> f(a, b)                       # doctest: +SKIP
    """
    if not target.startswith("llvm"):
        raise ValueError(f"target {target!r} is not supported; jitop generates code for the host CPU ('llvm')")
    if isinstance(s, Schedule):
        if args is None:
            raise TypeError("build(schedule, args): give the argument tensors (inputs, then outputs)")
        func = _lower(s, args, name)
    else:
        func = s
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"build: name {name!r} must be an identifier")
    return compile_func(func)


def compile_func(func: PrimFunc) -> Module:
    """Generate LLVM IR for a PrimFunc, optimise it, emit object code, load it."""
    digest = hashlib.sha256(str(func).encode()).hexdigest()[:16]
    symbol = f"jitop_{func.name}_{digest}"
    cg = KernelCodegen(func, symbol)
    ll = str(cg.build())
    optimised, obj = compile_ir(ll)
    params = [ParamSpec(b.name, b.dtype.np, b.shape, k in func.outputs) for k, b in enumerate(func.params)]
    meta = {"name": func.name, "symbol": symbol, "params": [p.to_json() for p in params],
            "uses_parallel": cg.uses_parallel, "checked_accesses": cg.checked, "target": target_key()}
    return Module(meta, obj, str(optimised))
