"""LLVM for a jitop Target: initialisation, a TargetMachine per Target, optimisation and object code."""
from __future__ import annotations

import functools
import threading

import llvmlite
import llvmlite.binding as llvm

from jitop.target import Target, init_llvm  # noqa: F401 - init_llvm is used from here by codegen and runtime


def llvm_version() -> str:
    """llvmlite and LLVM versions (object code from another LLVM may differ: cache-key material)."""
    return f"llvmlite {llvmlite.__version__}, LLVM {'.'.join(map(str, llvm.llvm_version_info))}"


def target_machine(target: Target) -> llvm.TargetMachine:
    """A TargetMachine for `target`'s CPU and features, PIC so object code can be loaded anywhere."""
    return _machine(target.triple, target.cpu, target.features, target.opt_level)


@functools.cache
def _machine(triple: str, cpu: str, features: str, opt: int) -> llvm.TargetMachine:
    init_llvm()
    return llvm.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=features, opt=min(max(opt, 0), 3), reloc="pic", codemodel="default", jit=False)


def optimize(mod: llvm.ModuleRef, target: Target, speed_level: int | None = None) -> None:
    """Run LLVM's new-pass-manager O<level> pipeline on `mod` in place (level: the target's opt_level)."""
    level = target.opt_level if speed_level is None else speed_level
    pto = llvm.create_pipeline_tuning_options(speed_level=min(max(level, 0), 3))
    pto.loop_vectorization = level >= 2
    pto.slp_vectorization = level >= 2
    pb = llvm.create_pass_builder(target_machine(target), pto)
    pb.getModulePassManager().run(mod, pb)


_compiles = 0  # how many times this process ran LLVM's optimiser and code generator
_llvm_lock = threading.RLock()


def compile_count() -> int:
    """How many IR modules this process has compiled to object code (a warm process that loads everything
    from the cache keeps it at 0).

    >>> compile_count() >= 0
    True
    """
    return _compiles


def compile_ir(ll: str, target: Target | None = None, speed_level: int | None = None) -> tuple[llvm.ModuleRef, bytes]:
    """Parse, verify, optimise textual LLVM IR; return (optimised module, object code for `target`,
    by default this machine)."""
    target = target or Target.host()
    mod = optimised_module(ll, target, speed_level)
    return mod, emit_object(mod, target)


def optimised_module(ll: str, target: Target, speed_level: int | None = None) -> llvm.ModuleRef:
    """Textual LLVM IR parsed, verified and optimised for `target` (no object code yet)."""
    init_llvm()
    with _llvm_lock:  # one LLVM context per process: compiles from several threads (background tuning) take turns
        mod = llvm.parse_assembly(ll)
        mod.verify()
        mod.triple = target.triple
        mod.data_layout = str(target_machine(target).target_data)
        optimize(mod, target, speed_level)
        return mod


def link_modules(mod: llvm.ModuleRef, others: list[llvm.ModuleRef | bytes]) -> None:
    """Link `others` (modules, or their bitcode) into `mod`, consuming them: declarations meet their
    definitions; clashing internal names are renamed."""
    with _llvm_lock:
        for other in others:
            mod.link_in(llvm.parse_bitcode(other) if isinstance(other, bytes) else other)


def emit_object(mod: llvm.ModuleRef, target: Target) -> bytes:
    """Object code of an optimised module for `target` (counted by `compile_count`)."""
    global _compiles
    with _llvm_lock:
        _compiles += 1
        return target_machine(target).emit_object(mod)


def emit_assembly(ll: str, target: Target) -> str:
    """The machine code of optimised IR `ll` for `target`, as assembly text."""
    init_llvm()
    return target_machine(target).emit_assembly(llvm.parse_assembly(ll))
