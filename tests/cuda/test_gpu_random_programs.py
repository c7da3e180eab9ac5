"""Property test: tests/graph/test_hypothesis_programs.py's random numpy programs (elementwise ufuncs, broadcasting,
reductions, transposes, slicing, where, clip over float32 / float64 / int32 inputs with size-0 and size-1 dims)
compiled with @jitop.kernel(target="cuda") give numpy's answer, on this machine's GPU or the simulated one."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import jitop
import sim_gpu

sys.path.insert(0, str(Path(__file__).parent.parent / "graph"))
from test_hypothesis_programs import check_program, programs  # noqa: E402


@settings(max_examples=int(os.environ.get("JITOP_HYPO_EXAMPLES", 40)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(programs())
def test_random_program_on_the_gpu_matches_numpy(prog) -> None:
    with pytest.MonkeyPatch.context() as mp:
        sim_gpu.gpu_or_simulated(mp)
        check_program(prog, lambda fn: jitop.kernel(fn, target="cuda", fallback=False))
