"""Call plans of GPU functions (jitop/runtime/cuda/plan.py): the workspaces' arena, sizes of symbols."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from jitop.runtime.args import compile_dim
from jitop.runtime.cuda import plan


def _planner(workspaces):
    dims = {d: compile_dim(d) for _, _, shape in workspaces for d in shape if isinstance(d, str)}
    return plan.Planner([], ["n"], 1, [np.dtype("f4")], lambda k, values: (values[0], 2), workspaces, dims, None)


def test_workspaces_share_one_arena_each_at_an_aligned_offset_of_its_own():
    p = _planner([("a", "float32", ("n", 3)), ("b", "int8", (5,)), ("c", "float64", (0,)),
                  ("d", "float16", ("n * 2",))]).plan([7], 1)
    assert p.offsets == [0, 256, 512, 512] and p.arena_bytes == 768  # 84, 5, 0 and 28 bytes
    assert p.outputs == [((7, 2), np.dtype("f4"), 14)]
    assert _planner([("a", "float32", ("n",))]).plan([3], 2).outputs == []  # the outputs were given


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["int8", "float16", "float32", "float64"]),
                          st.integers(0, 3), st.integers(0, 700)), min_size=1, max_size=8), st.integers(0, 50))
def test_workspaces_never_overlap_and_start_aligned(spec, n):
    workspaces = [(f"w{k}", dt, ("n",) * rank_n + (size,)) for k, (dt, rank_n, size) in enumerate(spec)]
    p = _planner(workspaces).plan([n], 1)
    spans = sorted((at, at + n ** rank_n * size * np.dtype(dt).itemsize)
                   for at, (dt, rank_n, size) in zip(p.offsets, spec))
    assert all(at % plan.ARENA_ALIGN == 0 for at in p.offsets)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:])) and spans[-1][1] <= p.arena_bytes
