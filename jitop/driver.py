"""lower() and build(): a Schedule to loop IR, loop IR to a loaded Module."""
from __future__ import annotations

import hashlib
import json
import re
from typing import Sequence

from jitop.codegen.collector import deferring_full_collections
from jitop.codegen.forked import compile_kernel
from jitop.codegen.target import llvm_version
from jitop.config import compile_jobs
from jitop.runtime.args import ParamSpec, SymbolSpec, check_symbols
from jitop.runtime.module import Module
from jitop.runtime.parallel import get_num_threads
from jitop.schedule.schedule import Schedule
from jitop.te.expr import Expr, Op
from jitop.te.printer import expr_str
from jitop.te.tensor import Tensor
from jitop.codegen.ptx_shares import build_ptx
from jitop.runtime.cuda.function import GpuFunction, function_meta
from jitop.target import CudaTarget, Target
from jitop.tir.lower import lower as _lower
from jitop.tir.nodes import Allocate, Barrier, For, PrimFunc, walk_stmts


@deferring_full_collections
def lower(s: Schedule, args: Sequence[Tensor], name: str = "main", simple_mode: bool = True) -> PrimFunc:
    """Lower a schedule to loop IR; print the result to read the loops.

    >>> print(jitop.lower(s, [A, B]))   # doctest: +SKIP
    def main(A: float32[1024], B: float32[1024]):
        for i in range(1024):
            B[i] = A[i] * 2.0f
    """
    return _lower(s, args, name)


@deferring_full_collections
def build(s: Schedule | PrimFunc, args: Sequence[Tensor] | None = None,
          target: str | Target | CudaTarget | None = None, name: str = "main") -> "Module | GpuFunction":
    """Compile a schedule (or lowered function) and load it if this machine can run it.

    target: a `jitop.Target`, a string ("llvm", "llvm -mcpu=haswell -mattr=+avx2,-avx512f") or None for
    `default_target()` (the host, or JITOP_CPU). Code for a CPU this machine does not cover can be built,
    inspected and saved, but calling it raises `jitop.TargetMismatchError`. target="cuda" (this machine's GPU,
    else an H100's sm_90) or "cuda -arch=sm_80" builds a GPU function (loops bound with `Stage.bind`).

    >>> f = jitop.build(s, [A, B])   # doctest: +SKIP
    >>> f(a, b)                       # doctest: +SKIP
    """
    target = resolve_target(target)
    if isinstance(s, Schedule):
        if args is None:
            raise TypeError("build(schedule, args): give the argument tensors (inputs, then outputs)")
        func = _lower(s, args, name)
    else:
        func = s
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"build: name {name!r} must be an identifier")
    if isinstance(target, CudaTarget):
        return compile_gpu_func(func, target)
    _check_cpu_function(func)
    return compile_func(func, target)


def default_target() -> Target:
    """The Target of a compile that names none: `Target.current()` (the host or JITOP_CPU) with the thread
    pool's thread count (so `jitop.runtime.parallel.set_num_threads` reaches schedules too)."""
    return Target.current().replace(threads=get_num_threads())


def resolve_target(target: str | Target | CudaTarget | None) -> Target | CudaTarget:
    """A Target from build()'s `target` argument: a Target, a string, or None for `default_target()`."""
    if target is None or isinstance(target, (Target, CudaTarget)):
        return target or default_target()
    if isinstance(target, str) and target.strip() == "cuda":
        return cuda_target()
    if isinstance(target, str) and target.split()[:1] == ["cuda"]:
        return Target.from_string(target)
    if not isinstance(target, str) or not target.split()[:1] == ["llvm"]:
        raise ValueError(f"target {target!r} is not supported: give 'llvm', 'llvm -mcpu=NAME -mattr=+a,-b', "
                         "'cuda', 'cuda -arch=sm_90', or a jitop.Target")
    chosen = Target.current() if target.strip() == "llvm" else Target.from_string(target)
    return chosen.replace(threads=get_num_threads())


def cuda_target() -> CudaTarget:
    """This machine's GPU as a build target (its architecture and limits from the driver); an H100's (sm_90)
    where no GPU is at hand, so GPU code can be built and checked anywhere.

    >>> cuda_target().kind
    'cuda'
    """
    from jitop.runtime.cuda import driver
    if driver.available():
        return CudaTarget.from_attributes(driver.device_attributes())
    return Target.from_string("cuda")


def compile_gpu_func(func: PrimFunc, target: CudaTarget) -> GpuFunction:
    """PTX for a function whose loops are bound to GPU blocks and threads, as a callable GpuFunction."""
    digest = hashlib.sha256(f"{func}|{target.key}".encode()).hexdigest()[:16]
    params, symbols = _signature(func)
    built = build_ptx(func, f"jitop_{_identifier(func.name)}_{digest}", target, compile_jobs())
    return GpuFunction(function_meta(func.name, params, symbols, target), built)


def _check_cpu_function(func: PrimFunc) -> None:
    """A function with GPU-bound loops or shared memory cannot run on a CPU: say which target it needs."""
    for s in walk_stmts(func.body):
        gpu = (isinstance(s, For) and s.kind.is_gpu_index) or isinstance(s, Barrier) or \
            (isinstance(s, Allocate) and s.buffer.scope == "shared")
        if gpu:
            raise ValueError(f"function '{func.name}' binds loops to GPU blocks/threads or uses shared memory; build "
                             "it with target='cuda' (a CPU schedule uses parallel/vectorize instead)")


def _identifier(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def compile_func(func: PrimFunc, target: Target) -> Module:
    """Generate LLVM IR for a PrimFunc, optimise it, emit object code for `target`, load it if it runs here."""
    from jitop.runtime.module import signature_json
    digest = hashlib.sha256(f"{func}|{target.key}|{bool(func.attrs.get('profile'))}|{func.attrs.get('arena')}"
                            .encode()).hexdigest()[:16]
    symbol = f"jitop_{func.name}_{digest}"
    params, symbols = _signature(func)
    # the object code carries its parameter signature: loading checks the metadata against it
    built = compile_kernel(func, symbol, target, signature_json(params, symbols), jobs=compile_jobs())
    meta = {"name": func.name, "symbol": symbol, "params": params,
            "uses_parallel": built.uses_parallel, "checked_accesses": built.checked,
            "target": json.loads(target.to_json()), "llvm": llvm_version()}
    if symbols:
        meta["symbols"] = symbols
    if built.profile_stages is not None:
        meta["profile_stages"] = built.profile_stages
    return Module(meta, built.object_code, str(built.optimised))


def _signature(func: PrimFunc) -> tuple[list[dict], list[dict]]:
    """The parameter specs (symbolic dims as their printed expressions) and the symbols (where each is read
    from) of a function, as JSON; ValueError when a call could not bind or check them."""
    params = [ParamSpec(b.name, b.dtype.np, tuple(printed_dim(d) for d in b.shape), k in func.outputs)
              for k, b in enumerate(func.params)]
    symbols = [SymbolSpec(v.name, k, j, v.dtype.name) for v, (k, j) in zip(func.symbols, func.symbol_sources())]
    try:
        check_symbols(params, symbols)
    except ValueError as err:
        raise ValueError(f"function '{func.name}': its symbolic shapes cannot be checked at call time: {err}") from None
    return [p.to_json() for p in params], [s.to_json() for s in symbols]


def printed_dim(d: int | Expr) -> int | str:
    """A dim as a kernel's parameters and plans hold it: an int, or a symbolic dim's printed expression.

    >>> from jitop import te
    >>> printed_dim(3), printed_dim(te.size_var("n") * 2)
    (3, 'n * 2')
    """
    if isinstance(d, int):
        return d
    return int(d.value) if d.op is Op.CONST else expr_str(d)
