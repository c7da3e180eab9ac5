"""@jitop.kernel with symbolic shapes (issue 23, part 3): which dims vary, guards, and serving a new size without
tracing. Results are numpy's at every size: 0, 1, primes, multiples of the vector width."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jitop
from jitop.runtime.fastcall import MISS

F4 = np.float32
SIZES = [2, 3, 7, 8, 13, 16, 31, 64, 97, 128, 257]


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def layer_norm(x, g, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return g * (x - m) / np.sqrt(v + 1e-5) + b


def chain(a, b):
    return np.tanh(a * b) + np.exp(-a) * 2 - b


def close(got, want, terms: int = 1) -> None:
    """float32 results within the rounding of `terms`-long accumulations (a few ulps each)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    bound = 8 * terms * np.finfo(got.dtype).eps
    np.testing.assert_allclose(got, want, rtol=bound, atol=bound)


def arrays(rng, *shape):
    return rng.standard_normal(shape).astype(F4)


# ** automatic: a dim that varied becomes symbolic **
def test_a_second_size_makes_the_dim_symbolic_and_later_sizes_trace_nothing():
    f = jitop.kernel(softmax)
    rng = np.random.default_rng(0)
    for k, n in enumerate(SIZES):
        x = arrays(rng, n, 33)
        close(f(x), softmax(x), 33)
        assert f.traces == min(k + 1, 2), (n, f.traces)
    assert f.policy.why == {("x", 0): "x dim 0: 2 at one call, 3 at another"}
    (sym,) = [ov for ov in f.dispatcher.overloads() if ov.accepts is not None]
    assert sym.exe.plan.guards == ["x_0 >= 2"]


@pytest.mark.parametrize("fn,shape,args", [
    (softmax, (None, 33), 1), (softmax, (5, None), 1), (chain, (None,), 2), (layer_norm, (None, 64), 1)])
def test_symbolic_kernels_agree_with_numpy_at_every_size(fn, shape, args):
    f = jitop.kernel(fn, dynamic=True)
    rng = np.random.default_rng(1)
    for n in [0, 1, *SIZES, 1000]:
        s = tuple(n if d is None else d for d in shape)
        xs = [arrays(rng, *s) for _ in range(args)]
        if fn is layer_norm:
            xs += [arrays(rng, s[-1]), arrays(rng, s[-1])]
        if fn is softmax and s[-1] == 0:  # a max over an empty row: numpy's error
            with pytest.raises(ValueError, match="zero-size array"):
                f(*xs)
            continue
        close(f(*xs), fn(*xs), s[-1] if fn is not chain else 4)
    # one symbolic kernel, and one each for sizes 0 and 1 (never symbolic: they broadcast)
    assert len(f.dispatcher.overloads()) <= 3


def test_sizes_0_and_1_get_kernels_of_their_own():
    f = jitop.kernel(lambda a, b: a + b, dynamic=True)
    for n in (5, 1, 0, 9):
        a, b = np.arange(n, dtype=F4), np.ones(1 if n == 1 else n, F4)
        np.testing.assert_array_equal(f(a, b), a + b)
    assert f.traces == 3
    # broadcasting 1 against n: the (n,) + (1,) signature is one more kernel, correct at every n
    for n in (4, 6):
        a, b = np.arange(n, dtype=F4), np.ones(1, F4)
        np.testing.assert_array_equal(f(a, b), a + b)


def test_dynamic_false_compiles_per_shape_and_a_dict_names_the_dims():
    f = jitop.kernel(softmax, dynamic=False)
    g = jitop.kernel(softmax, dynamic={"x": (1,)})
    rng = np.random.default_rng(2)
    for n in (3, 4, 5):
        x = arrays(rng, 6, n)
        close(f(x), softmax(x), n)
        close(g(x), softmax(x), n)
    assert f.traces == 3 and g.traces == 1
    y = arrays(rng, 7, 5)  # dim 0 is not dynamic: a new kernel
    close(g(y), softmax(y), 5)
    assert g.traces == 2


def test_bad_dynamic_arguments_are_clear_errors():
    with pytest.raises(TypeError, match="'y'.*no parameter"):
        jitop.kernel(softmax, dynamic={"y": (0,)})
    with pytest.raises(TypeError, match="dynamic must be"):
        jitop.kernel(softmax, dynamic="x")
    f = jitop.kernel(softmax, dynamic={"x": (2,)})
    with pytest.raises(ValueError, match="dim 2 of 'x', which has 2 dims"):
        f(np.ones((2, 3), F4))


# ** guards and ties **
def test_tied_dims_are_checked_not_retraced_and_a_mismatch_raises_numpys_error():
    f = jitop.kernel(lambda a, b: a * b + 1, dynamic=True)
    for n in (4, 9, 30):
        a, b = np.arange(n, dtype=F4), np.full(n, 2, F4)
        np.testing.assert_array_equal(f(a, b), a * b + 1)
    assert f.traces == 1
    (ov,) = f.dispatcher.overloads()
    assert [p.shape for p in ov.exe.module.params[:2]] == [("a_0",), ("a_0",)]  # b_0 := a_0
    with pytest.raises(ValueError, match="broadcast"):
        f(np.ones(4, F4), np.ones(5, F4))


def test_a_branch_on_a_size_is_a_guard_with_a_kernel_per_side():
    def f(x):
        if x.shape[0] > 10:
            return x * 2
        return x - 1
    k = jitop.kernel(f, dynamic=True)
    for n in (4, 20, 5, 30, 10, 11):
        x = np.arange(n, dtype=F4)
        np.testing.assert_array_equal(k(x), f(x))
    assert k.traces == 2
    guards = sorted(g for ov in k.dispatcher.overloads() for g in ov.exe.plan.guards if g != "x_0 >= 2")
    assert guards == ["-x_0 + 10 >= 0", "x_0 - 11 >= 0"]


def test_a_size_used_as_an_int_is_specialised_with_the_users_line():
    def f(x):
        out = x * 0
        for i in range(x.shape[0]):  # the loop's length is this call's size
            out = out + x[i]
        return out
    k = jitop.kernel(f, dynamic=True)
    for n in (3, 4):
        x = np.arange(n * 2, dtype=F4).reshape(n, 2)
        np.testing.assert_array_equal(k(x), f(x))
    assert k.traces == 2
    ((where, line),) = k.policy.static.items()
    assert where == ("x", 0) and "for i in range(x.shape[0])" in line


def test_a_size_returned_as_an_int_is_this_calls_value():
    k = jitop.kernel(lambda x: (x + 1, x.shape[0] * 2), dynamic=True)
    for n in (3, 5):
        out, size = k(np.zeros(n, F4))
        assert size == 2 * n and out.shape == (n,)


# ** serving a new size **
def test_the_native_entry_serves_new_sizes_without_tracing_or_the_python_path():
    f = jitop.kernel(lambda a, b: a + b)
    for n in (10, 11, 12, 12):
        a = np.ones(n, F4)
        f(a, a)
    assert any(ov.accepts is not None for ov in f.dispatcher.native())
    traces, hits = f.traces, f.hits
    for n in range(13, 60):
        a = np.arange(n, dtype=F4)
        np.testing.assert_array_equal(f(a, a), a + a)
    assert f.traces == traces and f.hits == hits + 47
    assert f.dispatcher.entry(np.ones(3, F4), np.ones(4, F4)) is MISS  # a tie that fails: the slow path decides


def test_a_failed_symbolic_build_is_traced_again_with_constant_dims():
    # a batched matmul whose batch dim varies: the matmul template takes only m, n, k symbolic
    f = jitop.kernel(lambda a, b: a @ b, dynamic={"a": (0,), "b": (0,)})
    rng = np.random.default_rng(3)
    for n in (2, 3):
        a, b = arrays(rng, n, 4, 5), arrays(rng, n, 5, 6)
        close(f(a, b), a @ b, 5)
    (reason,) = f.policy.refused().values()
    assert "symbolic" in reason and "only m, n, k may vary" in reason


def test_matmul_with_symbolic_rows_and_reduction():
    rng = np.random.default_rng(4)
    w = arrays(rng, 48, 20)
    f = jitop.kernel(lambda x, w: np.maximum(x @ w, 0), dynamic={"x": (0,)})
    g = jitop.kernel(lambda p, v: p @ v, dynamic={"p": (1,), "v": (0,)})  # attention's p @ V: k grows
    for n in (2, 7, 13, 64, 97):
        x = arrays(rng, n, 48)
        close(f(x, w), np.maximum(x @ w, 0), 48)
        p, v = arrays(rng, 3, n), arrays(rng, n, 16)
        close(g(p, v), p @ v, n)
    assert f.traces == 2 and g.traces == 1  # f: a kernel per row bucket (<= 16, above); g's rows are constant


def test_a_decode_loop_with_a_growing_cache_equals_numpy_and_compiles_twice():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    import bench_shapes as bs
    rng = np.random.default_rng(5)
    old = bs.C, bs.HEADS
    bs.C, bs.HEADS = 32, 2
    try:
        layers, embed = bs.decode_weights(rng)
        pre, step = jitop.kernel(bs.prefill), jitop.kernel(bs.decode_step)
        want, _ = bs.generate(bs.prefill, bs.decode_step, layers, embed, list(range(8)), 10)
        got, _ = bs.generate(pre, step, layers, embed, list(range(8)), 10)
    finally:
        bs.C, bs.HEADS = old
    assert got == want
    assert step.traces == 2 and step.dispatcher.compiles <= 2


WARM = textwrap.dedent("""
    import json, sys
    import numpy as np
    import jitop
    from jitop.codegen.target import compile_count

    def scale(x, y):
        return np.tanh(x) * y.sum()

    f = jitop.kernel(scale)
    sizes = [int(s) for s in sys.argv[1].split(",")]
    for n in sizes:
        x = np.linspace(-1, 1, n * 3, dtype=np.float32).reshape(n, 3)
        y = np.ones(n, np.float32)
        np.testing.assert_allclose(f(x, y), np.tanh(x) * y.sum(), rtol=1e-5, atol=1e-5)
    print(json.dumps({"compiles": compile_count(), "traces": f.traces}))
""")


def test_a_warm_second_process_serves_twenty_sizes_with_zero_compiles(tmp_path):
    import json
    env = {**os.environ, "JITOP_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(os.path.dirname(__file__)))])}
    env.pop("JITOP_CACHE", None)

    def run(sizes: list[int]) -> dict:
        done = subprocess.run([sys.executable, "-c", WARM, ",".join(map(str, sizes))], env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])
    cold = run([5, 6, 7])
    assert cold["compiles"] >= 1
    warm = run(list(range(30, 50)))  # 20 sizes it never saw, the first of them too
    assert warm["compiles"] == 0, warm
    assert warm["traces"] == 0  # the symbolic kernel's warm record serves a new size (jitop.graph.warm)


def test_explain_shows_the_symbols_ties_guards_and_why():
    def attn(q, k, v):
        s = q @ k.T
        if k.shape[0] > 20:
            s = s * 0.5
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v
    f = jitop.kernel(attn)
    q = np.ones((1, 16), F4)
    for n in (5, 6):
        f(q, np.ones((n, 16), F4), np.ones((n, 16), F4))
    text = f.explain(q, np.ones((7, 16), F4), np.ones((7, 16), F4))
    block = text[text.index("shapes:"):].split("\n\n")[0]
    assert "k_0 = k dim 0 (traced at 6): k dim 0: 5 at one call, 6 at another" in block
    assert "v dim 0 = k_0 (matmul core dimension at" in block
    assert "k_0 <= 20 (a comparison at test_dynamic_shapes.py:" in block and "if k.shape[0] > 20:" in block
    assert "in-memory cache hit" in text  # size 7 is served by the symbolic kernel
    constant = jitop.kernel(attn, dynamic=False)
    assert "every dim is a constant" in constant.explain(q, np.ones((7, 16), F4), np.ones((7, 16), F4))


def test_a_symbolic_row_count_gets_a_kernel_per_size_bucket_with_its_own_config():
    rng = np.random.default_rng(6)
    w = arrays(rng, 96, 80)
    f = jitop.kernel(lambda x, w: x @ w, dynamic={"x": (0,)})
    for n in (300, 7, 16, 17, 3, 1000):
        x = arrays(rng, n, 96)
        close(f(x, w), x @ w, 96)
    assert f.traces == 2  # one per bucket: rows <= 16 and above
    buckets = {g for ov in f.dispatcher.overloads() for g in ov.exe.plan.guards if g != "x_0 >= 2"}
    assert buckets == {"x_0 <= 16", "x_0 >= 17"}
    fields = sorted(ov.tasks[0].workload.m for ov in f.dispatcher.overloads())
    assert fields == ["s0~256", "s0~8"]  # tuned, recorded and picked per bucket: each is its own task


def _mixed(x, y):
    z = np.tanh(x) * y + 1  # y (m,) broadcast over x's rows
    return z.sum(-1), z.max(0), (z - z.mean(-1, keepdims=True)) / (z.std(-1, keepdims=True) + 1)


_MIXED = jitop.kernel(_mixed, dynamic=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(0, 40), m=st.integers(0, 40), seed=st.integers(0, 2 ** 16))
def test_random_shapes_of_one_symbolic_kernel_match_numpy(n, m, seed):
    rng = np.random.default_rng(seed)
    x, y = arrays(rng, n, m), arrays(rng, m)
    if n == 0:  # numpy's max over an empty axis raises
        with pytest.raises(ValueError):
            _MIXED(x, y)
        return
    for got, want in zip(_MIXED(x, y), _mixed(x, y)):
        close(got, want, max(m, n, 1))
    # a kernel per combination of {0, 1, symbol} of the two dims at most, never one per size
    assert len(_MIXED.dispatcher.overloads()) <= 9


def test_a_zero_d_byte_swapped_argument_beside_a_symbolic_one():
    f = jitop.kernel(lambda a, b: a + b)
    a = np.array(2.75, ">f8")
    for n in (2, 3, 4):  # symbolic from the second call: the runner checks the converted 0-d array's rank
        b = np.arange(n, dtype=np.int8).reshape(1, n)
        np.testing.assert_array_equal(f(a, b), a + b)
    assert f.traces == 2


def test_a_mean_over_a_varying_axis_stays_symbolic():
    f = jitop.kernel(lambda x: x - x.mean(-1, keepdims=True) + x.var(-1, ddof=1, keepdims=True))
    for n in (5, 6, 7, 40):
        x = np.linspace(-1, 1, 3 * n, dtype=F4).reshape(3, n)
        close(f(x), x - x.mean(-1, keepdims=True) + x.var(-1, ddof=1, keepdims=True), n)
    assert f.traces == 2 and not f.policy.static


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_padded_max_pool_of_a_varying_batch_stays_symbolic(layout):
    """ResNet's stem pool (3x3, stride 2, padding 1): its padding was made with np.full of the input's shape,
    which turned a symbolic batch into an int (a trace per batch size, an ONNX ResNet's compile per batch)."""
    from numpy.lib.stride_tricks import sliding_window_view
    f = jitop.kernel(lambda x: jitop.max_pool2d(x, 3, stride=2, padding=1, layout=layout))
    for n in (2, 3, 5, 8):
        x = np.linspace(-1, 1, n * 4 * 9 * 7, dtype=F4).reshape((n, 4, 9, 7) if layout == "NCHW" else (n, 9, 7, 4))
        axes = (2, 3) if layout == "NCHW" else (1, 2)
        pad = [(0, 0)] * 4
        for a in axes:
            pad[a] = (1, 1)
        win = sliding_window_view(np.pad(x, pad, constant_values=-np.inf), (3, 3), axis=axes)
        want = win.max(axis=(-2, -1))[tuple(slice(None, None, 2) if k in axes else slice(None) for k in range(4))]
        np.testing.assert_array_equal(f(x), want)
    assert f.traces <= 2 and not f.policy.static  # the first batch (unless a run before found it varies), then one


def test_a_convolution_with_varying_batch_and_image_size():
    from numpy.lib.stride_tricks import sliding_window_view
    rng = np.random.default_rng(7)
    w = arrays(rng, 8, 3, 3, 3)

    def reference(x):
        win = sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
        out = np.einsum("nchwij,ocij->nohw", win.astype(np.float64), w.astype(np.float64))
        return np.maximum(out, 0).astype(F4)
    f = jitop.kernel(lambda x, w: np.maximum(jitop.conv2d(x, w, padding=1), 0))
    for shape in [(2, 3, 16, 16), (3, 3, 16, 16), (5, 3, 16, 16), (2, 3, 20, 24), (4, 3, 7, 9), (3, 3, 13, 11)]:
        x = arrays(rng, *shape)
        close(f(x, w), reference(x), 27)
    assert f.traces == 3 and not f.policy.refused()  # the first shape; batch symbolic; then h and w too


def test_a_dim_made_constant_by_the_code_warns_once_past_the_recompile_limit():
    def f(x):
        return x * float(x.shape[0])  # the size as a Python float: dim 0 is this call's constant
    k = jitop.kernel(f)
    with pytest.warns(jitop.JitopRecompileWarning, match=r"x dim 0: .*float\(x.shape\[0\]\)") as caught:
        for n in range(2, 14):
            x = np.ones(n, F4)
            np.testing.assert_array_equal(k(x), f(x))
    assert len([w for w in caught if issubclass(w.category, jitop.JitopRecompileWarning)]) == 1


def test_checked_accesses_in_a_symbolic_kernel_compile():
    # (2, n, 2) softmax over the last axis: the row reads of its fused (2 x n) rows are checked at run time;
    # a checked read's address was computed inside its branch and reused by the next one (LLVM: "Instruction
    # does not dominate all uses"), which the safety net turned into a kernel per shape
    def softmax_last(x):
        e = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return e * (1 / np.sum(e, axis=-1, keepdims=True))
    f = jitop.kernel(softmax_last, dynamic={"x": (1,)})
    for n in (3, 5, 8, 13):
        x = np.linspace(-2, 2, 4 * n, dtype=F4).reshape(2, n, 2)
        close(f(x), softmax_last(x), 2)
    assert f.traces == 1 and not f.policy.refused()


def test_a_function_reading_captured_weights_serves_new_sizes_without_tracing():
    # each new batch size was traced again (a guarded overload did not serve sizes): closures over weights
    rng = np.random.default_rng(8)
    w, b = arrays(rng, 20, 9), arrays(rng, 9)

    def mlp(x):
        return np.maximum(x @ w + b, 0)
    f = jitop.kernel(mlp)
    for n in (20, 21, 40, 300, 33, 64):
        x = arrays(rng, n, 20)
        close(f(x), mlp(x), 21)
    assert f.traces == 2, f.traces
    w = arrays(rng, 20, 9)  # rebound: traced again, with the new weights, at this size and the next
    for n in (50, 51):
        x = arrays(rng, n, 20)
        close(f(x), mlp(x), 21)
