"""Property test: tests/graph/test_hypothesis_programs.py's random numpy programs (elementwise ufuncs, broadcasting,
reductions, transposes, slicing, where, clip over float32 / float64 / int32 inputs with size-0 and size-1 dims)
compiled with @jitop.kernel(target="cuda") give numpy's answer, on this machine's GPU or the simulated one."""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings

import jitop
import sim_gpu

sys.path.insert(0, str(Path(__file__).parent.parent / "graph"))
from test_hypothesis_programs import RTOL, _compare, programs  # noqa: E402


@settings(max_examples=int(os.environ.get("JITOP_HYPO_EXAMPLES", 40)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(programs())
def test_random_program_on_the_gpu_matches_numpy(prog) -> None:
    src, inputs, exact, all_values = prog
    note(src)
    note(f"inputs: {[(a.dtype, a.shape) for a in inputs]}")
    namespace: dict = {"np": np}
    exec(compile(src, "<random program>", "exec"), namespace)
    fn = namespace["program"]
    with pytest.MonkeyPatch.context() as mp, np.errstate(all="ignore"), warnings.catch_warnings():
        sim_gpu.gpu_or_simulated(mp)
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = fn(*[a.copy() for a in inputs])
        got = jitop.kernel(fn, target="cuda", fallback=False)(*inputs)
    values = [np.asarray(v) for v in all_values]
    finite = [float(np.abs(v[np.isfinite(v)].astype(np.float64)).max()) for v in values
              if v.dtype.kind == "f" and v.size and np.isfinite(v).any()]
    scale = 1.0 + (max(finite) if finite else 0.0)
    rtol = max(RTOL.get(v.dtype, 0.0) for v in values) or RTOL[np.dtype("float64")]
    assert isinstance(got, tuple) and len(got) == len(expected)
    for g, e, ex in zip(got, expected, exact):
        _compare(g, e, ex, min(scale, 1e300), rtol)
