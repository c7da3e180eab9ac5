"""Features of configs (tuner/features.py): fixed shape, deterministic, finite, sensitive to the loop nest,
and equal to the exact per-config lowering when computed through a class fit."""
import random

import numpy as np
import pytest

import jitop
from jitop.tuner import features as F
from jitop.tuner.registry import get
from jitop.tuner.task import Task

TARGET = jitop.Target.from_string("haswell")


def matmul_task(m=24, n=40, k=20):
    return Task("matmul", get("matmul").workload_type(m=m, n=n, k=k), TARGET)


def conv_task(layout, c=8, hw=6, oc=16):
    wl = get("conv2d").workload_type(n=1, c=c, h=hw, w=hw, oc=oc, kh=3, kw=3, stride=(1, 1), pads=(1, 1, 1, 1),
                                     dilation=(1, 1), groups=1, layout=layout)
    return Task("conv2d", wl, TARGET)


# small workloads, whole spaces: 1152 matmul configs, 576 NCHW conv configs of both algorithms (the gemm ones are
# lowered one by one: their classes fit no monomials), 96 NHWC ones
@pytest.mark.parametrize("task", [matmul_task(), conv_task("NCHW", 4, 4, 8), conv_task("NHWC", 4, 4, 8)], ids=str)
def test_whole_small_space_featurises(task):
    F._CACHES.pop((task.key, task.constant_weights), None)  # featurised here, not looked up from another test's run
    configs = list(task.config_space())
    x = F.features(task, configs)
    assert x.shape == (len(configs), len(F.feature_names(task)))
    assert x.dtype == np.float32
    assert np.isfinite(x).all()
    assert (x.std(axis=0) > 0).sum() > 20  # many columns actually vary over the space


@pytest.mark.parametrize("template,tasks", [("matmul", (matmul_task(), matmul_task(33, 17, 64))),
                                            ("conv2d", (conv_task("NCHW"), conv_task("NCHW", 16, 9, 32)))])
def test_width_fixed_across_workloads(template, tasks):
    widths = {F.features(t, [t.config_space().get(0)]).shape[1] for t in tasks}
    assert len(widths) == 1
    assert F.feature_names(tasks[0]) == F.feature_names(tasks[1])


def test_deterministic_and_independent_of_batch():
    task = matmul_task(30, 48, 16)
    configs = list(task.config_space())
    one = F.features(task, configs[:3])
    F._CACHES.clear()
    every = F.features(task, configs)   # now the classes are fitted, not lowered one by one
    np.testing.assert_array_equal(one, every[:3])
    F._CACHES.clear()
    np.testing.assert_array_equal(F.features(task, configs[:3]), one)


def test_class_fit_matches_exact_lowering():
    task = matmul_task(64, 96, 48)
    space = task.config_space()
    configs = list(space)
    fitted = F.features(task, configs)
    assert any(f is not None for f in F._cache(task).fits.values())
    for c in random.Random(0).sample(configs, 12):
        sk, q = F._lower(task, c)
        ir = F._derive(sk, q[None, :], F._stmt_order(sk), TARGET.threads).matrix()[0]
        exact = np.concatenate([ir, F._knob_features(space, [c]).matrix()[0]]).astype(np.float32)
        np.testing.assert_allclose(fitted[configs.index(c)], exact, rtol=1e-5, atol=1e-5)


def test_loop_nest_knob_changes_features():
    task = matmul_task()
    space = task.config_space()
    base = space.get(0)
    names = F.feature_names(task)
    ir_cols = [k for k, n in enumerate(names) if not n.startswith("knob_")]
    # pack_b "none" (2): a product this small runs serial, where packing per panel or at root is the same
    for knob, cand in (("tile_m", 1), ("tile_n", 1), ("order", 1), ("pack_b", 2)):
        other = F._with(space, base, next(k for k, kn in enumerate(space.knobs) if kn.name == knob), cand)
        x = F.features(task, [base, other])
        assert not np.array_equal(x[0, ir_cols], x[1, ir_cols]), knob


def test_names_describe_the_ir():
    names = F.feature_names(matmul_task())
    assert len(names) == len(set(names))
    assert "s0_log2_register_tile" in names and "log2_parallel_extent" in names
    assert any(n.startswith("knob_tile_m") for n in names)
