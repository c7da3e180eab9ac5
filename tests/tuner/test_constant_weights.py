"""Tasks whose weights are constants of the program (an ONNX model's initializers) are measured as the graph
runs them: weights packed once for the candidate's config and passed in their place, and cold (another copy
each timed run). The flag travels with the task (JSON, the workload log) but is not part of its key."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import jitop
from jitop.tuner import registry
from jitop.tuner._operands import ColdCopies
from jitop.tuner.measure import ErrorCode, LocalMeasurer, MeasureInput, MeasureOptions
from jitop.tuner.task import Task

TARGET = jitop.Target.current()


def _conv(**fields) -> Task:
    base = dict(n=1, c=16, h=9, w=7, oc=40, kh=3, kw=3, pads=(1, 1, 1, 1), layout="NHWC")
    return Task("conv2d", registry.get("conv2d").workload_type(**{**base, **fields}), TARGET, constant_weights=True)


def _matmul() -> Task:
    return Task("matmul", registry.get("matmul").workload_type(m=13, n=70, k=37), TARGET, constant_weights=True)


def _spread(task: Task, count: int) -> list:
    """The default config and `count` more, spread over the space (different packings among them)."""
    space = task.config_space()
    step = max(1, len(space) // (count + 1))
    template = registry.get(task.template)
    return [template.default_config(task.workload, TARGET)] + [space.get(k * step) for k in range(1, count + 1)]


def test_the_flag_is_not_part_of_the_key_and_survives_json() -> None:
    task = _conv()
    plain = dataclasses.replace(task, constant_weights=False)
    assert task == plain and task.key == plain.key and hash(task) == hash(plain)
    assert Task.from_json(task.to_json()).constant_weights
    assert not Task.from_json(plain.to_json()).constant_weights
    assert "constant_weights" not in plain.to_json()  # a record of an unflagged task is written as before


def _reference_conv(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    """NHWC input, OIHW weights, stride 1, float64."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    oc, _, kh, kw = w.shape
    n, h, wd, _ = x.shape
    out = np.zeros((n, h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1, oc))
    for r in range(kh):
        for s in range(kw):
            out += xp[:, r:r + out.shape[1], s:s + out.shape[2], :] @ w[:, :, r, s].T.astype(np.float64)
    return out


@pytest.mark.parametrize("task", [_conv(), _conv(kh=1, kw=1, pads=(0, 0, 0, 0)), _conv(layout="NCHW")],
                         ids=["nhwc3x3", "nhwc1x1", "nchw3x3"])
def test_a_prepacked_build_computes_the_convolution(task: Task) -> None:
    """Every config's prepacked build, given `prepack`'s arrays (or W itself where the config reads it in
    place), gives the convolution: error bound from the accumulation length (k*k*c terms)."""
    wl, template = task.workload, registry.get("conv2d")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((wl.n, wl.h, wl.w, wl.c)).astype(np.float32)
    w = rng.standard_normal((wl.oc, wl.c, wl.kh, wl.kw)).astype(np.float32)
    pad = wl.pads[0]
    want = _reference_conv(x, w, pad)
    terms = wl.kh * wl.kw * wl.c
    bound = 2 * terms * np.finfo(np.float32).eps * _reference_conv(np.abs(x), np.abs(w), pad)
    for config in _spread(task, 6):
        s, tensors = template.build(wl, config, TARGET, prepacked=True)
        packed = template.prepack(wl, config, TARGET, w)
        assert len(tensors) == 2 + max(len(packed), 1)
        fn = jitop.build(s, tensors)
        xin = x if wl.layout == "NHWC" else np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        out = np.zeros(tensors[-1].shape, np.float32)
        fn(xin, *(packed or [w]), out)
        got = out if wl.layout == "NHWC" else out.transpose(0, 2, 3, 1)
        assert np.all(np.abs(got - want) <= bound), config.to_json()


def test_a_prepacked_matmul_build_computes_the_product() -> None:
    task = _matmul()
    wl, template = task.workload, registry.get("matmul")
    rng = np.random.default_rng(4)
    a = rng.standard_normal((wl.m, wl.k)).astype(np.float32)
    b = rng.standard_normal((wl.k, wl.n)).astype(np.float32)
    want = a.astype(np.float64) @ b
    bound = 2 * wl.k * np.finfo(np.float32).eps * (np.abs(a).astype(np.float64) @ np.abs(b))
    for config in _spread(task, 6):
        s, tensors = template.build(wl, config, TARGET, prepacked=True)
        packed = template.prepack(wl, config, TARGET, b)
        out = np.zeros((wl.m, wl.n), np.float32)
        jitop.build(s, tensors)(a, *(packed or [b]), out)
        assert np.all(np.abs(out - want) <= bound), config.to_json()


@pytest.fixture(scope="module")
def measurer():
    with LocalMeasurer(MeasureOptions(repeat=2, min_repeat_ms=1.0)) as m:
        yield m


@pytest.mark.parametrize("task", [_conv(), _conv(kh=1, kw=1, pads=(0, 0, 0, 0)), _matmul()],
                         ids=["conv3x3", "conv1x1", "matmul"])
def test_candidates_with_different_packings_measure_and_agree(measurer, task: Task) -> None:
    """The runner packs the same logical weights for each candidate: every candidate matches the default
    config's output (the check), whatever its packing."""
    results = measurer.measure([MeasureInput(task, c) for c in _spread(task, 5)])
    for r in results:
        assert r.error == ErrorCode.NO_ERROR, r.error_msg
        assert all(0 < c < 1 for c in r.costs)


def test_a_wrong_answer_with_constant_weights_is_still_caught() -> None:
    task = _conv()
    configs = _spread(task, 2)
    faults = ((configs[1].to_json(), "wrong"),)
    with LocalMeasurer(MeasureOptions(repeat=1, min_repeat_ms=1.0, faults=faults)) as m:
        ok, wrong, after = m.measure([MeasureInput(task, c) for c in configs])
    assert ok.error == ErrorCode.NO_ERROR and after.error == ErrorCode.NO_ERROR
    assert wrong.error == ErrorCode.WRONG_ANSWER


def test_cold_copies_are_distinct_aligned_and_equal() -> None:
    x = np.ones(5, np.float32)
    w1, w2 = np.arange(100, dtype=np.float32).reshape(4, 25), np.arange(7, dtype=np.float64)
    out = [np.zeros(3, np.float32)]
    cold = ColdCopies()
    rotation = cold.rotation([x, w1, w2], out, total=64 * 1024)
    assert len(rotation) == 64 * 1024 // (448 + 64)
    addresses = set()
    for args in rotation:
        assert args[0] is x and args[-1] is out[0]
        for copy, w in zip(args[1:3], (w1, w2)):
            assert copy.ctypes.data % 64 == 0 and np.array_equal(copy, w) and copy.dtype == w.dtype
            addresses.add(copy.ctypes.data)
    assert len(addresses) == 2 * len(rotation)
    # other weights (another config's packing) refill the copies
    changed = w1 + 1
    assert all(np.array_equal(args[1], changed) for args in cold.rotation([x, changed, w2], out, total=64 * 1024))


def test_weights_larger_than_the_budget_run_as_they_are() -> None:
    x, w, out = np.ones(2), np.ones(1000), [np.zeros(2)]
    assert ColdCopies().rotation([x, w], out, total=1000) == [[x, w, *out]]


def _conv_model() -> bytes:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_models_initializer_weights_make_constant_weight_tasks() -> None:
    import jitop.onnx
    model = jitop.onnx.load(_conv_model())
    x = np.ones((1, 4, 6, 6), np.float32)
    (weighted,) = jitop.tuner.extract_tasks(model.kernel, x)
    assert weighted.task.template == "conv2d" and weighted.task.constant_weights
    (argument,) = jitop.tuner.extract_tasks(lambda a, b: jitop.conv2d(a, b, padding=1), x,
                                            np.ones((8, 4, 3, 3), np.float32))
    assert not argument.task.constant_weights


def test_weights_packed_on_several_threads_give_the_serial_result(monkeypatch, tmp_path) -> None:
    """prepack_all packs big weights on a thread pool: the model computes what it computes packed serially."""
    import jitop.onnx
    from jitop.graph import compile as graph_compile
    x = np.random.default_rng(5).standard_normal((1, 4, 6, 6)).astype(np.float32)
    serial = jitop.onnx.load(_conv_model())(x)
    pools = []

    class CountedPool(graph_compile.ThreadPoolExecutor):
        def __init__(self, workers: int):
            pools.append(workers)
            super().__init__(workers)
    monkeypatch.setattr(graph_compile, "ThreadPoolExecutor", CountedPool)
    monkeypatch.setattr(graph_compile, "_pack_workers", lambda sizes, target: 2)
    threaded = jitop.onnx.load(_conv_model())(x)
    assert pools == [2]
    np.testing.assert_array_equal(threaded, serial)
