"""The cost model (tuner/model.py) on synthetic measurements: a roofline-like throughput of the register
tile, padding, unroll and packing (what real matmul timings depend on), with multiplicative noise."""
import math
import random

import numpy as np
import pytest

import jitop
from jitop.tuner import model as M
from jitop.tuner.measure import ErrorCode, MeasureResult
from jitop.tuner.records import Record
from jitop.tuner.registry import get
from jitop.tuner.task import Task

TARGET = jitop.Target.from_string("haswell")   # 8 float32 lanes, 16 vector registers
LANES = TARGET.lanes(4)


def task_of(m, n, k):
    return Task("matmul", get("matmul").workload_type(m=m, n=n, k=k), TARGET)


def synthetic_gflops(task, cfg, rng):
    wl = task.workload
    mr, bn, ku = cfg["tile_m"][-1], cfg["tile_n"][-1], cfg["tile_k"][-1]
    vectors = bn // LANES
    acc = mr * vectors
    tile = min(acc, 12) / 12 * (0.3 if acc + vectors + 1 > 16 else 1.0)   # spills cost most of the speed
    waste = wl.m * wl.n / (math.ceil(wl.m / mr) * mr * math.ceil(wl.n / bn) * bn)
    unroll = {1: 0.8, 2: 0.92, 4: 1.0, 8: 0.96}[ku]
    pack = {"root": 1.0, "panel": 1.0, "none": 0.85}[cfg["pack_b"]]
    return 50.0 * tile * waste * unroll * pack * math.exp(rng.gauss(0.0, 0.05))


def records_of(task, configs, seed=0, fail_every=0):
    rng = random.Random(seed)
    out = []
    for k, cfg in enumerate(configs):
        if fail_every and k % fail_every == 0:
            out.append(Record(task, cfg, MeasureResult((math.inf,), ErrorCode.RUN_ERROR), version="test"))
            continue
        cost = task.flops / (synthetic_gflops(task, cfg, rng) * 1e9)
        out.append(Record(task, cfg, MeasureResult((cost,), ErrorCode.NO_ERROR), version="test"))
    return out


def spearman(a, b):
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def split(task, n_train, seed=0):
    configs = list(task.config_space())
    random.Random(seed).shuffle(configs)
    return configs[:n_train], configs[n_train:]


def truth(task, configs):
    return np.array([synthetic_gflops(task, c, random.Random(0)) for c in configs])


def knob_only_spearman(train_recs, test, task):
    """Baseline: the same booster on the knob positions alone."""
    import xgboost as xgb
    space = task.config_space()
    x = np.array([space.knob_vector(r.config) for r in train_recs], dtype=np.float32)
    y = np.array([r.gflops for r in train_recs])
    dm = xgb.DMatrix(x, label=y / y.max())
    dm.set_group([len(y)])
    booster = xgb.train({**M.PARAMS, "seed": 0}, dm, num_boost_round=M.ROUNDS)
    pred = booster.predict(xgb.DMatrix(np.array([space.knob_vector(c) for c in test], dtype=np.float32)))
    return spearman(pred, truth(task, test))


def test_not_fitted_before_enough_records():
    task = task_of(48, 64, 32)
    model = M.CostModel(task)
    assert not model.fitted
    with pytest.raises(RuntimeError, match="before a successful fit"):
        model.predict([task.config_space().get(0)])
    model.fit(records_of(task, split(task, 5)[0]))
    assert not model.fitted


def test_ranks_held_out_configs():
    task = task_of(48, 64, 32)
    train, test = split(task, 96)
    recs = records_of(task, train, fail_every=10)   # failed records rank last
    model = M.CostModel(task)
    model.fit(recs)
    assert model.fitted
    pred = model.predict(test)
    rho = spearman(pred, truth(task, test))
    print(f"held-out Spearman {rho:.3f}, knob-only {knob_only_spearman(recs, test, task):.3f}")
    # a random ranking's Spearman has standard deviation 1/sqrt(n - 1): ask for ~15 of them
    floor = 15 / math.sqrt(len(test) - 1)
    assert rho > min(floor, 0.8), rho
    assert rho > knob_only_spearman(recs, test, task) - 0.05
    assert np.std(pred) > 0


def test_transfer_ranks_a_new_workload():
    task, other = task_of(48, 64, 32), task_of(40, 96, 24)
    own_train, test = split(task, 4, seed=1)
    model = M.CostModel(task)
    model.fit(records_of(task, own_train))
    assert not model.fitted                        # 4 own records: not enough alone
    model.set_transfer(records_of(other, split(other, 160)[0], seed=2))
    model.fit(records_of(task, own_train))
    assert model.fitted
    rho = spearman(model.predict(test), truth(task, test))
    print(f"transfer + 4 own records: held-out Spearman {rho:.3f}")
    assert rho > 0.5, rho


def test_transfer_weight_decays_to_own_records():
    task, other = task_of(48, 64, 32), task_of(40, 96, 24)
    own = records_of(task, split(task, 2 * 64)[0])
    test = split(task, 2 * 64)[1][:100]
    alone = M.CostModel(task)
    alone.fit(own)
    model = M.CostModel(task)
    model.set_transfer(records_of(other, split(other, 160)[0], seed=2))
    model.fit(own)
    np.testing.assert_allclose(model.predict(test), alone.predict(test))
    assert [M.transfer_weight(n, 64) for n in (0, 32, 128)] == [1.0, 0.75, 0.0]


def test_transfer_rejects_other_templates():
    conv = Task("conv2d", get("conv2d").workload_type(n=1, c=4, h=4, w=4, oc=8, kh=1, kw=1), TARGET)
    model = M.CostModel(task_of(48, 64, 32))
    with pytest.raises(ValueError, match="not of template"):
        model.set_transfer([Record(conv, conv.config_space().get(0), MeasureResult((1e-6,), ErrorCode.NO_ERROR))])
