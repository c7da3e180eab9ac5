"""Where a runtime component keeps its object code between processes (the thread pool's, the native entry's):
the key it is stored under, and the store used until the persistent cache installs its own.

The key is a digest of the Python modules the component's IR is generated from (their source: a process that
finds the object never builds the IR just to name it), the parameters baked into it, this machine's target and
the LLVM version, so object code is never loaded on a CPU or by an LLVM it was not built for.

>>> from jitop.runtime import ir_words
>>> object_key("demo", [ir_words], {"threads": 2}).startswith("demo-")
True
"""
from __future__ import annotations

import hashlib
import json
import types
from typing import Any, Sequence

from jitop.codegen.target import llvm_version
from jitop.target import Target

__all__ = ["NoStore", "object_key"]


def object_key(component: str, sources: Sequence[types.ModuleType], parameters: Any = None) -> str:
    """`component`-<digest of the `sources` modules' files, `parameters` (JSON data), the host and LLVM>."""
    h = hashlib.sha256()
    for module in sources:
        with open(module.__file__, "rb") as f:
            h.update(f.read())
    host = Target.host()
    identity = json.dumps([h.hexdigest(), parameters, host.triple, host.cpu, host.features, llvm_version()])
    return f"{component}-" + hashlib.sha256(identity.encode()).hexdigest()


class NoStore:
    """A store that keeps nothing (before the persistent cache installs its own, or with it off)."""

    def get(self, key: str) -> None:
        return None

    def put(self, key: str, value: bytes) -> None:
        pass

    def delete(self, key: str) -> None:
        pass
