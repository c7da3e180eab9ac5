"""The host target: LLVM initialisation, the CPU's name and features, a TargetMachine."""
from __future__ import annotations

import functools

import llvmlite
import llvmlite.binding as llvm


@functools.cache
def init_llvm() -> None:
    """Initialise LLVM's native target once per process (llvmlite 0.50 does the core itself)."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()


@functools.cache
def host_cpu() -> tuple[str, str]:
    """(cpu name, feature string) of the machine we run on, e.g. ("znver5", "+avx512f,...")."""
    init_llvm()
    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


@functools.cache
def target_machine(opt: int = 3) -> llvm.TargetMachine:
    """A TargetMachine for the host CPU, PIC so object code can be loaded anywhere."""
    init_llvm()
    cpu, features = host_cpu()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=cpu, features=features, opt=opt, reloc="pic", codemodel="default", jit=False)


def target_key() -> dict[str, str]:
    """The parts of the target that make compiled object code valid (cache-key material)."""
    cpu, features = host_cpu()
    return {"triple": llvm.get_process_triple(), "cpu": cpu, "features": features,
            "llvmlite": llvmlite.__version__, "llvm": ".".join(map(str, llvm.llvm_version_info))}


def optimize(mod: llvm.ModuleRef, speed_level: int = 3) -> None:
    """Run LLVM's new-pass-manager O<speed_level> pipeline on `mod` in place."""
    pto = llvm.create_pipeline_tuning_options(speed_level=speed_level)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(target_machine(), pto)
    pb.getModulePassManager().run(mod, pb)


def compile_ir(ll: str, speed_level: int = 3) -> tuple[llvm.ModuleRef, bytes]:
    """Parse, verify, optimise textual LLVM IR; return (optimised module, object code)."""
    init_llvm()
    mod = llvm.parse_assembly(ll)
    mod.verify()
    tm = target_machine()
    mod.triple = llvm.get_process_triple()
    mod.data_layout = str(tm.target_data)
    optimize(mod, speed_level)
    return mod, tm.emit_object(mod)
