"""Loads object code into the process (MCJIT's RuntimeDyld): no LLVM optimisation or codegen runs here.

Object code is native code: loading it is like loading a shared library, so only load objects from a
trusted source. `check_object` only makes sure that what is handed to LLVM is a well-formed x86-64 ELF
relocatable object whose external symbols this process provides (LLVM's object reader trusts its input
and crashes on garbage; an unresolved symbol would be called as address 0); it does not make a
maliciously crafted object safe.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from dataclasses import dataclass

import llvmlite.binding as llvm

from jitop.codegen.target import init_llvm, target_machine
from jitop.target import Target

_lock = threading.Lock()
_engines: list[llvm.ExecutionEngine] = []  # kept alive: their code must outlive every caller
_spare: list[llvm.ExecutionEngine] = []    # created, nothing linked into it yet

# ELF64 (System V gABI): file header, section header, symbol
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
ET_REL, EM_X86_64 = 1, 62
SHT_SYMTAB, SHT_NOBITS = 2, 8
STB_GLOBAL = 1


@dataclass(frozen=True)
class ObjectInfo:
    """What `check_object` learnt from an object's symbol table."""

    undefined: tuple[str, ...]   # global symbols the object needs from the process
    sizes: dict[str, int]        # defined symbol -> size in bytes


def check_object(obj: bytes) -> ObjectInfo:
    """Raise ValueError unless `obj` is a well-formed x86-64 ELF relocatable object (what LLVM emits for a
    jitop kernel): header fields, and every section and symbol name inside the bytes."""
    if not isinstance(obj, (bytes, bytearray)):
        raise ValueError(f"object code must be bytes, got {type(obj).__name__}")
    size = len(obj)
    if size < _EHDR.size:
        raise ValueError(f"object code of {size} bytes is shorter than an ELF header")
    (ident, e_type, e_machine, e_version, _entry, _phoff, shoff, _flags, ehsize, _phentsize, phnum,
     shentsize, shnum, shstrndx) = _EHDR.unpack_from(obj)
    if ident[:4] != b"\x7fELF":
        raise ValueError("object code is not ELF (bad magic bytes)")
    if ident[4] != 2 or ident[5] != 1 or ident[6] != 1:
        raise ValueError("object code is not 64-bit little-endian ELF version 1")
    if e_type != ET_REL or e_machine != EM_X86_64 or e_version != 1:
        raise ValueError(f"object code is not an x86-64 relocatable object (e_type {e_type}, e_machine {e_machine})")
    if ehsize != _EHDR.size or shentsize != _SHDR.size or phnum != 0:
        raise ValueError("object code has a malformed ELF header (header sizes, or program headers in an object)")
    if not (0 < shnum and shstrndx < shnum):
        raise ValueError(f"object code has a malformed section table ({shnum} sections, names in {shstrndx})")
    if not _EHDR.size <= shoff <= size - shnum * _SHDR.size:
        raise ValueError(f"object code's section table (offset {shoff}, {shnum} sections) is outside its {size} bytes")
    sections = [_SHDR.unpack_from(obj, shoff + k * _SHDR.size) for k in range(shnum)]
    for k, (_name, sh_type, _f, _a, offset, length, link, _i, _al, entsize) in enumerate(sections):
        if sh_type != SHT_NOBITS and offset + length > size:
            raise ValueError(f"object code's section {k} (offset {offset}, {length} bytes) is outside its {size} bytes")
        if link >= shnum:
            raise ValueError(f"object code's section {k} links to section {link} of {shnum}")
        if sh_type == SHT_SYMTAB and (entsize != _SYM.size or length % _SYM.size):
            raise ValueError(f"object code's symbol table (section {k}) has entries of {entsize} bytes")
    undefined, sizes = [], {}
    for _name, sh_type, _f, _a, offset, length, link, _i, _al, _e in sections:
        if sh_type != SHT_SYMTAB:
            continue
        str_type, str_off, str_len = sections[link][1], sections[link][4], sections[link][5]
        if str_type == SHT_NOBITS:
            raise ValueError("object code's symbol names are not in the file")
        for at in range(offset, offset + length, _SYM.size):
            st_name, st_info, _other, shndx, _value, st_size = _SYM.unpack_from(obj, at)
            if not st_name:
                continue
            if st_name >= str_len:
                raise ValueError(f"object code has a symbol name outside its string table ({st_name} >= {str_len})")
            end = obj.find(b"\0", str_off + st_name, str_off + str_len)
            if end < 0:
                raise ValueError("object code has an unterminated symbol name")
            name = obj[str_off + st_name:end].decode("latin-1")
            if shndx == 0:
                if st_info >> 4 == STB_GLOBAL:  # a weak undefined symbol may stay 0: the code checks it
                    undefined.append(name)
            else:
                sizes[name] = st_size
    return ObjectInfo(tuple(undefined), sizes)


def load_object(obj: bytes, symbols: list[str], variables: list[str] = ()) -> dict[str, int]:
    """Link `obj` into the process; return the address of each function in `symbols` and global in `variables`.

    Raises ValueError for bytes that are not a well-formed x86-64 ELF object, that need a symbol this
    process does not provide or that do not define every name asked for (another component's object, say):
    all checked before LLVM sees them, so nothing of such an object is linked in; RuntimeError if a name its
    symbol table lists is still not found once linked.
    """
    info = check_object(obj)
    absent = [n for n in [*symbols, *variables] if n not in info.sizes]
    if absent:
        raise ValueError(f"object code does not define {absent}; it may be corrupt, another component's or from "
                         "another jitop version")
    init_llvm()
    with _lock:
        # an engine owns the (shared, cached) TargetMachine: it is never disposed, an unused one is kept for
        # the next load; and once one exists, LLVM's symbol search covers the process's own symbols
        engine = _spare.pop() if _spare else _new_engine()
        unresolved = [n for n in info.undefined if not llvm.address_of_symbol(n)]
        if unresolved:
            _spare.append(engine)
            raise ValueError(f"object code needs {sorted(unresolved)}, which this process does not provide; "
                             "it may be corrupt or from another jitop version")
        engine.add_object_file(llvm.ObjectFileRef.from_data(bytes(obj)))
        engine.finalize_object()
        addrs = {name: engine.get_function_address(name) for name in symbols}
        addrs.update({name: engine.get_global_value_address(name) for name in variables})
    missing = [n for n, a in addrs.items() if not a]
    if missing:
        raise RuntimeError(f"object code does not define {missing}; it may be corrupt or from another jitop version")
    return addrs


def _new_engine() -> llvm.ExecutionEngine:
    placeholder = llvm.parse_assembly("")
    engine = llvm.create_mcjit_compiler(placeholder, target_machine(Target.host()))
    # MCJIT would compile its empty placeholder module at every finalize (~0.5 ms per loaded object)
    engine.remove_module(placeholder)
    _engines.append(engine)
    return engine


def read_global(obj: bytes, name: str, address: int) -> bytes:
    """The bytes of global `name` of object `obj`, loaded at `address`: as many as its symbol's size says."""
    size = check_object(obj).sizes.get(name)
    if size is None:
        raise RuntimeError(f"object code does not define {name!r}")
    return ctypes.string_at(address, size)
