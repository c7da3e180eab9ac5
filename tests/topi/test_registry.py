"""The template registry, tasks and `pick`: templates are found by name, workloads and tasks are plain
JSON data, and the graph builds each matmul/conv2d with the config `pick` chose for its task."""
from __future__ import annotations

import json

import numpy as np
import pytest

import jitop
from jitop.tuner import registry
from jitop.tuner.space import Config
from jitop.tuner.task import Choice, Task, add_source, pick, remove_source
from targets import HOST, runnable_targets
from tuning_fakes import tuned_source

MATMUL_FIELDS = dict(m=7, n=19, k=5, dtype="float32", a_batch=(2,), b_batch=())
CONV_FIELDS = dict(n=1, c=3, h=9, w=8, oc=5, kh=3, kw=3, stride=(2, 1), pads=(1, 1, 0, 1), dilation=(1, 1),
                   groups=1, layout="NHWC", dtype="float64")


def _naive_conv_nhwc(x, w, stride, pads):
    xp = np.pad(x, ((0, 0), (pads[0], pads[1]), (pads[2], pads[3]), (0, 0)))
    oc, _, kh, kw = w.shape
    oh = (xp.shape[1] - kh) // stride[0] + 1
    ow = (xp.shape[2] - kw) // stride[1] + 1
    out = np.zeros((x.shape[0], oh, ow, oc))
    for r in range(kh):
        for s in range(kw):
            win = xp[:, r:r + (oh - 1) * stride[0] + 1:stride[0], s:s + (ow - 1) * stride[1] + 1:stride[1], :]
            out += np.einsum("nhwc,oc->nhwo", win, w[:, :, r, s])
    return out


def test_registry_lists_the_templates_and_names_unknown_ones():
    assert {"matmul", "conv2d"} <= set(registry.names())
    with pytest.raises(jitop.errors.TemplateNotFoundError, match="no operator template 'winograd'.*registered"):
        registry.get("winograd")


@pytest.mark.parametrize("target", runnable_targets())
def test_matmul_workload_json_round_trip_builds_the_op(target):
    template = registry.get("matmul")
    wl = template.workload_from_json(json.dumps(MATMUL_FIELDS))
    assert registry.workload_to_json(wl) == registry.workload_to_json(template.workload_type(**MATMUL_FIELDS))
    s, args = template.build(wl, template.default_config(wl, target), target)
    f = jitop.build(s, args, target=target)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 7, 5)).astype(np.float32)
    b = rng.standard_normal((5, 19)).astype(np.float32)
    np.testing.assert_allclose(f(a, b), jitop.matmul(a, b), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(f(a, b), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", runnable_targets())
def test_conv2d_workload_json_round_trip_builds_the_op(target):
    template = registry.get("conv2d")
    wl = template.workload_from_json(json.dumps(CONV_FIELDS))
    assert wl.stride == (2, 1) and isinstance(wl.pads, tuple)
    s, args = template.build(wl, template.default_config(wl, target), target)
    f = jitop.build(s, args, target=target)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 9, 8, 3))
    w = rng.standard_normal((5, 3, 3, 3))
    got = f(x, w)
    np.testing.assert_allclose(got, _naive_conv_nhwc(x, w, (2, 1), (1, 1, 0, 1)), rtol=1e-10, atol=1e-10)


def test_workload_from_another_version_is_refused():
    with pytest.raises(ValueError, match="workload fields"):
        registry.get("matmul").workload_from_json(json.dumps({**MATMUL_FIELDS, "transpose_b": True}))


def test_task_key_is_stable_and_names_every_part():
    wl = registry.get("matmul").workload_type(**MATMUL_FIELDS)
    task = Task("matmul", wl, HOST)
    assert task.key == Task("matmul", registry.get("matmul").workload_type(**MATMUL_FIELDS), HOST).key
    assert Task.from_json(task.to_json()) == task
    assert task.flops == 2 * 2 * 7 * 19 * 5
    other_shape = registry.get("matmul").workload_type(**{**MATMUL_FIELDS, "k": 6})
    assert len({task.key, Task("matmul", other_shape, HOST).key, Task("matmul", wl, HOST.replace(threads=7)).key}) == 3


def test_pick_returns_the_default_with_its_source():
    wl = registry.get("conv2d").workload_type(**CONV_FIELDS)
    choice = pick(Task("conv2d", wl, HOST))
    assert isinstance(choice, Choice) and choice.source == "default"
    assert choice.config == registry.get("conv2d").default_config(wl, HOST)


def test_pick_asks_sources_first_and_ignores_configs_outside_the_space():
    wl = registry.get("matmul").workload_type(**MATMUL_FIELDS)
    task = Task("matmul", wl, HOST)
    space = task.config_space()
    last = space.get(len(space) - 1)

    def tuned(t):
        return Choice(last, "tuned") if t == task else None

    def broken(t):
        return Choice(Config.of(tile_m=(1, 999)), "tuned")
    def failing(t):
        raise OSError("records file unreadable")
    add_source(failing)
    add_source(broken)
    add_source(tuned)
    try:
        with pytest.warns(RuntimeWarning, match="failing failed"):
            with pytest.warns(RuntimeWarning, match="not a point of the space"):
                assert pick(task) == Choice(last, "tuned")
    finally:
        remove_source(failing)
        remove_source(broken)
        remove_source(tuned)
    assert pick(task).source == "default"


def test_graph_builds_the_picked_config_and_explain_says_so():
    """A source's config reaches the generated code: explain names it, and the result is still numpy's."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((9, 13)).astype(np.float32)
    b = rng.standard_normal((13, 21)).astype(np.float32)

    @jitop.kernel
    def f(a, b):
        return np.maximum(a @ b, 0)
    with tuned_source() as chosen:
        text = f.explain(a, b)
        got = f(a, b)
    assert "tuned config" in text and chosen["config"].to_json() in text
    np.testing.assert_allclose(got, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)
