"""`@jitop.kernel(target="cuda")`: traced numpy functions as GPU kernels. Without a GPU: the graph compiles to
PTX that ptxas accepts, with the stages scheduled as the GPU rules say; results equal numpy's on this machine's GPU,
or on the simulated one (tests/sim_gpu.py)."""
from __future__ import annotations

import os

import numpy as np
import pytest

import jitop
import sim_gpu
from jitop.codegen.nvptx import check_ptx, ptxas_path
from jitop.graph.gpu import compile_graph_gpu

needs_ptxas = pytest.mark.skipif(ptxas_path() is None and os.environ.get("JITOP_REQUIRE_PTXAS") != "1",
                                 reason="ptxas not installed (pip install nvidia-cuda-nvcc, or jitop[cuda-test])")
EPS32 = np.finfo(np.float32).eps


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def mlp(x, w, b):
    return np.maximum(x @ w + b, 0)


def layer_norm(x, g, b):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


def chain(a, b, c):
    return np.tanh(a * b) + np.exp(-c), (a + 1).sum()


def batched(a, b):
    return a @ b


def args_of(name, seed=0):
    rng = np.random.default_rng(seed)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return {"softmax": (f32(7, 300),), "mlp": (f32(5, 33), f32(33, 17), f32(17)),
            "layer_norm": (f32(9, 129), f32(129), f32(129)), "chain": (f32(1000), f32(1000), f32(1000)),
            "batched": (f32(3, 20, 7), f32(7, 11))}[name]


FUNCTIONS = {"softmax": softmax, "mlp": mlp, "layer_norm": layer_norm, "chain": chain, "batched": batched}


def gpu_build(name):
    kf = jitop.kernel(FUNCTIONS[name], target="cuda -arch=sm_90")
    tr = kf.trace(list(args_of(name)))
    return compile_graph_gpu(kf.__name__, tr.inputs, tr.names, tr.plan, tr.results, kf.gpu)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_compiles_to_gpu_kernels(name):
    exe = gpu_build(name)
    assert len(exe.function.built.kernels) >= 1
    if ptxas_path() is not None or os.environ.get("JITOP_REQUIRE_PTXAS") == "1":
        check_ptx(exe.function.built.ptx)


def test_reductions_are_split_over_threads():
    exe = gpu_build("softmax")
    func = exe.function
    assert len(func.built.kernels) == 1  # max, exp (read twice), sum and divide: one row group
    assert "shfl.sync.bfly" in func.built.ptx  # the threads of a row combine their partial results


def test_matmul_uses_shared_tiles_and_computes_its_tail_from_the_register_tile():
    exe = gpu_build("mlp")
    (kernel,) = exe.function.built.kernels  # relu(x @ w + b): the bias and relu are the SGEMM's epilogue
    assert kernel.shared_bytes > 0


def test_cpu_targets_are_refused():
    with pytest.raises(ValueError, match="target= is for 'cuda'"):
        jitop.kernel(mlp, target="llvm")


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_results_equal_numpy(name, monkeypatch):
    sim_gpu.gpu_or_simulated(monkeypatch)  # this machine's GPU, else the simulated one
    args = args_of(name, seed=1)
    kf = jitop.kernel(FUNCTIONS[name], target="cuda")
    got, want = kf(*args), FUNCTIONS[name](*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        g = np.asarray(g)
        assert g.shape == np.shape(w) and g.dtype == np.asarray(w).dtype
        scale = np.abs(np.asarray(w)).max() + 1
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2000 * EPS32 * scale)


def test_a_second_compile_comes_from_the_disk_cache(monkeypatch):
    import jitop.graph.gpu as gpu
    compiled = []
    real = gpu.compile_gpu_func
    monkeypatch.setattr(gpu, "compile_gpu_func", lambda func, target: compiled.append(1) or real(func, target))

    def scaled(x):  # a function no other test compiles: its first compile is a miss
        return np.sqrt(np.abs(x)) * 3.5 - 1

    first = jitop.kernel(scaled, target="cuda -arch=sm_90")
    tr = first.trace([np.ones((3, 77), np.float32)])
    a = compile_graph_gpu("scaled", tr.inputs, tr.names, tr.plan, tr.results, first.gpu)
    b = compile_graph_gpu("scaled", tr.inputs, tr.names, tr.plan, tr.results, first.gpu)
    assert len(compiled) == 1  # the second came from the cache
    assert b.function.built == a.function.built and b.function.meta == a.function.meta
    other = jitop.kernel(scaled, target="cuda -arch=sm_80")  # another GPU: another entry
    tr80 = other.trace([np.ones((3, 77), np.float32)])
    compile_graph_gpu("scaled", tr80.inputs, tr80.names, tr80.plan, tr80.results, other.gpu)
    assert len(compiled) == 2


@pytest.mark.usefixtures("private_cache")
def test_explain_shows_the_gpu_kernels_templates_and_loop_ir(capsys):
    kf = jitop.kernel(mlp, target="cuda -arch=sm_90")
    args = args_of("mlp")
    text = kf.explain(*args)
    assert capsys.readouterr().out.strip() == text.strip()
    assert "compiled for this call (cache miss)" in text and "target: cuda sm_90" in text
    assert "template cuda.matmul, default config" in text
    (launch,) = [line for line in text.splitlines() if line.startswith("  jitop_mlp_")]
    assert "block (" in launch and "bytes of shared memory" in launch
    assert "kernel launches, in order (1, 1 distinct kernels)" in text and "in threadIdx." in text
    assert "in-memory cache hit" in kf.explain(*args)
    rows = jitop.kernel(softmax, target="cuda -arch=sm_90").explain(*args_of("softmax"))
    assert "kernel launches, in order (1," in rows and "'shared')" in rows  # the row group: exp in shared memory
    assert "row group: divide computes max, exp, sum in its block per row, reading x.shared from shared memory" \
        in rows
    assert "matmul's register tile (its epilogue)" in text  # mlp: bias and relu


def test_profile_of_a_gpu_kernel_says_what_to_use_instead():
    with pytest.raises(NotImplementedError, match="runs on the GPU"):
        jitop.kernel(mlp, target="cuda -arch=sm_90").profile(*args_of("mlp"))


GPU_PROG = '''\
import numpy as np
import jitop


@jitop.kernel(target="cuda")
def gpu_scaled(x):
    return np.tanh(x) * 2.0


if __name__ == "__main__":
    for n in (10, 11, 12):
        gpu_scaled(np.ones(n, np.float32))
'''


def test_the_explain_command_lists_a_gpu_kernel_without_timing_it(monkeypatch, tmp_path, capsys):
    from jitop.cli import main
    from jitop.tuner import peak as peak_mod
    sim_gpu.gpu_or_simulated(monkeypatch)
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "cli"))
    from test_figures import fake_peak
    monkeypatch.setattr(peak_mod, "measure", lambda target=None, **kw: fake_peak(target))
    peak_mod.forget()
    prog = tmp_path / "gpu_prog.py"
    prog.write_text(GPU_PROG)
    try:
        assert main(["explain", str(prog)]) == 0  # it raised AttributeError: a GPU function has no loop nests
    finally:
        peak_mod.forget()
    first, symbolic = capsys.readouterr().out.split("gpu_scaled(")[1:]  # size 10, then the symbolic function
    assert "launch(es) of 1 GPU kernel(s) for sm_" in first and "not measured for GPU kernels" in first
    assert "symbolic shapes: traced at x_0 = 11; checks x_0 >= 2" in symbolic
