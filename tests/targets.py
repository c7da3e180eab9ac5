"""Targets the ISA-specific tests run for: this machine and haswell (AVX2, which every machine here
runs), so an AVX-512 host also proves the AVX2 code. Code for a target the host cannot run is only built.
An AVX2 host with haswell's vector width and register count (a Zen 3, say) runs its own target only: its
config spaces and code shapes are haswell's, and testing both twice the time proved nothing more."""
from __future__ import annotations

import pytest

from jitop.target import Target

HOST = Target.host()
HASWELL = Target.from_string("llvm -mcpu=haswell")
RUNNABLE = [t for t in dict.fromkeys([HOST, HASWELL]) if not t.missing_on(HOST)]
if len(RUNNABLE) == 2 and (HOST.isa, HOST.vector_bytes, HOST.vector_registers) == \
        (HASWELL.isa, HASWELL.vector_bytes, HASWELL.vector_registers):
    RUNNABLE = [HOST]


def runnable_targets():
    """pytest parameters: each target whose code this machine can run, with a readable id."""
    return [pytest.param(t, id=f"{t.cpu}-{t.isa}") for t in RUNNABLE]
