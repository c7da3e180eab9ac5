"""Loads object code into the process (MCJIT's RuntimeDyld): no LLVM optimisation or codegen runs here."""
from __future__ import annotations

import threading

import llvmlite.binding as llvm

from jitop.codegen.target import init_llvm, target_machine
from jitop.target import Target

_lock = threading.Lock()
_engines: list[llvm.ExecutionEngine] = []  # kept alive: their code must outlive every caller


def load_object(obj: bytes, symbols: list[str], variables: list[str] = ()) -> dict[str, int]:
    """Link `obj` into the process; return the address of each function in `symbols` and global in `variables`."""
    init_llvm()
    with _lock:
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), target_machine(Target.host()))
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        _engines.append(engine)
        addrs = {name: engine.get_function_address(name) for name in symbols}
        addrs.update({name: engine.get_global_value_address(name) for name in variables})
    missing = [n for n, a in addrs.items() if not a]
    if missing:
        raise RuntimeError(f"object code does not define {missing}; it may be corrupt or from another jitop version")
    return addrs
