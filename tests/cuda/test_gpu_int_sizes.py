"""A Python int used as a size inside a GPU kernel (`cache[:t + 1]`, `np.zeros(n)`) is a size symbol once its
value varied, as on the CPU (tests/graph/test_int_sizes.py): one GPU function serves every value its guards
admit, the value passed to the kernels as their symbol (never copied to the GPU), the guards' bounds proving
the accesses. Results are numpy's; on this machine's GPU, else on the simulated one (JITOP_TEST_GPU=emulated:
the emulated one)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import jitop
import sim_gpu
from jitop import te
from jitop.graph.gpu import compile_graph_gpu
from jitop.runtime.cuda import memory

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "graph"))
from test_int_sizes import decode_step, sizes  # noqa: E402

pytestmark = pytest.mark.usefixtures("private_cache")
F4 = np.float32


def _size_overload(kf):
    (ov,) = [ov for key, ov in kf.cache.items() if any(s[:1] == ("symint",) for s in key)]
    return ov


@pytest.mark.parametrize("on_device", [False, True], ids=["numpy", "device"])
def test_a_decode_step_slicing_its_cache_by_t_is_one_gpu_function_for_every_t(on_device, monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    kf = jitop.kernel(decode_step, target="cuda", fallback=False)
    rng = np.random.default_rng(0)
    theirs = np.zeros((24, 16), F4)
    mine = memory.to_device(theirs) if on_device else theirs.copy()
    put = memory.to_device if on_device else np.asarray
    for t in range(20):
        k, q = rng.standard_normal(16).astype(F4), rng.standard_normal(16).astype(F4)
        got, want = kf(mine, put(k), put(q), t), decode_step(theirs, k, q, t)
        got = got.get() if on_device else got
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * (t + 1))  # t + 1 terms of float32 products
        np.testing.assert_array_equal(mine.get() if on_device else mine, theirs)
    assert kf.int_sizes.symbolic == {"t"}
    assert kf.traces <= 4  # t = 0 (twice: a run-time value, then static), 1, then the symbolic function
    function = _size_overload(kf).exe.function
    assert function.built.checked == ()  # the guards bound t: every access proved, no error flag read per call


def test_ints_in_any_order_match_numpy_including_0_1_negative_and_beyond_the_array(monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)
    x = np.random.default_rng(1).standard_normal(29).astype(F4)
    kf = jitop.kernel(sizes, target="cuda")
    for n in [5, 7, 0, 1, -3, 29, 40, 12, 2, 3, -40, 6]:
        try:
            with np.errstate(all="ignore"):
                want = sizes(x, n)
        except (ValueError, IndexError) as err:
            with pytest.raises(type(err)):
                kf(x, n)
            continue
        with np.errstate(all="ignore"):
            got = kf(x, n)
        for g, w in zip(got, want):
            assert np.asarray(g).dtype == np.asarray(w).dtype and np.shape(g) == np.shape(w)
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * 29, equal_nan=True)
    assert kf.int_sizes.symbolic == {"n"}
    assert kf.traces < 12  # the symbolic function served most values


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(-5, 35), min_size=3, max_size=8))
def test_int_sequences_in_any_order_match_numpy(monkeypatch, values):
    sim_gpu.gpu_or_simulated(monkeypatch)
    x = np.random.default_rng(3).standard_normal(29).astype(F4)
    kf = jitop.kernel(lambda x, n: x[:n] * 2 + x[n // 2:n].sum(), target="cuda")
    for n in values:
        want = x[:n] * 2 + x[n // 2:n].sum()
        got = kf(x, n)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * 29)


def test_the_value_of_a_size_param_binds_its_symbol_and_reads_as_it(monkeypatch):
    """jitop.build(target="cuda") with te.size_param: the size is an int, a numpy integer or a 0-d array (read
    on the host: the kernels get it as their symbol, reading it is the symbol); anything else names it."""
    sim_gpu.gpu_or_simulated(monkeypatch)
    n = te.size_var("n")
    A = te.placeholder((64,), "float32", name="A")
    N = te.size_param(n)
    B = te.compute((n,), lambda i: A[i] * 2.0 + N[()].astype("float32"), name="B")
    s = jitop.create_schedule(B.op)
    bx, tx = s[B].split(B.op.axis[0], factor=32)
    s[B].bind(bx, te.thread_axis("blockIdx.x"))
    s[B].bind(tx, te.thread_axis("threadIdx.x"))
    f = jitop.build(s, [A, N, B], target="cuda")
    a = np.arange(64, dtype=F4)
    for size in (5, np.int32(7), np.array(9), memory.to_device(np.array(11))):
        m = int(size.get() if isinstance(size, memory.DeviceArray) else size)
        np.testing.assert_array_equal(f(a, size), a[:m] * 2 + m)
    with pytest.raises(TypeError, match="argument 'n' .* the size n: an int, got float"):
        f(a, 5.0)
    with pytest.raises(TypeError, match="argument 'n' .* shape \\(2,\\)"):
        f(a, np.array([1, 2]))
    with pytest.raises(ValueError, match="argument 'n' .* value is -3"):
        f(a, -3)
    with pytest.raises(ValueError, match="too large for symbol n"):
        f(a, 2 ** 70)
    launch = f.launcher([memory.to_device(a), 6, memory.empty((6,), F4)])  # a launcher takes the size as an int
    launch()
    f.raise_if_flagged()


def test_a_gpu_kernel_relying_on_its_guards_is_stored_under_them(monkeypatch):
    """The disk cache's key of a GPU function holds the guards (and the bounds lowering relied on): a trace
    with other guards compiles its own function."""
    sim_gpu.gpu_or_simulated(monkeypatch)
    kf = jitop.kernel(lambda x, n: x[:n] * 2, target="cuda")
    x = np.arange(40, dtype=F4)
    for n in (4, 5, 6):
        np.testing.assert_array_equal(kf(x, n), x[:n] * 2)
    tr = _size_overload(kf).trace
    guards, bounds = tr.shape_guards, tr.bounds
    assert bounds["n"][1] <= 40
    text = kf.explain(x, 7)
    assert "n = the Python int n (traced at 5)" in text and "grid ('(n + 255) // 256', 1, 1)" in text
    import jitop.graph.gpu as gpu
    compiled = []
    real = gpu.compile_gpu_func
    monkeypatch.setattr(gpu, "compile_gpu_func", lambda func, target: compiled.append(1) or real(func, target))
    monkeypatch.delenv("JITOP_CACHE", raising=False)  # (the simulated GPU turns the cache off)

    def build(guards, bounds):
        return compile_graph_gpu("f", tr.inputs, tr.names, tr.plan, tr.results, kf.gpu, guards, tr.reps, bounds)
    first, again = build(guards, bounds), build(guards, bounds)
    other = build(guards + ["n <= 20"], {"n": (bounds["n"][0], 20)})
    assert len(compiled) == 2 and again.function.built == first.function.built
    assert first.accepts([x, 30]) and not first.accepts([x, 1]) and not other.accepts([x, 30])
