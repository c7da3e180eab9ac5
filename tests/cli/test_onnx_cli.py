"""The command line for ONNX models (issue 24, item 3): `jitop compile`, `jitop run`, `jitop tune MODEL` and
`jitop explain MODEL`, called in process (jitop.cli.main) on two tiny models built with onnx.helper: a
Conv+Relu+GlobalAveragePool+Gemm net and a MatMul+Add+Softmax one, both with a symbolic batch dim.

Every test has a cache of its own (`private_cache`: `jitop tune` holds the cache's tuning lock until the
process ends); tuning measures with tests/tuning_fakes.py's synthetic measurer and the roofline is a fixed,
fake peak, so nothing here measures the machine.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import jitop.onnx  # noqa: E402
from jitop.cli import UsageError, main, parse  # noqa: E402
from jitop.target import Target  # noqa: E402
from jitop.tuner import peak as peak_mod  # noqa: E402
from jitop.tuner.peak import Peak  # noqa: E402

pytestmark = pytest.mark.usefixtures("private_cache", "fixed_peak")


def _model(nodes, inputs, outputs, inits, name):
    graph = helper.make_graph(nodes, name, inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv_net():
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2,
             "b": rng.standard_normal(8).astype(np.float32) * 0.1,
             "fw": rng.standard_normal((10, 8)).astype(np.float32) * 0.2,
             "fb": rng.standard_normal(10).astype(np.float32) * 0.1}
    nodes = [helper.make_node("Conv", ["data", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["logits"], transB=1)]
    return _model(nodes, [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["N", 3, 16, 16])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits, "convnet")


def mlp():
    rng = np.random.default_rng(1)
    inits = {"w": rng.standard_normal((16, 32)).astype(np.float32) * 0.2,
             "b": rng.standard_normal(32).astype(np.float32) * 0.1}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Softmax", ["a"], ["probs"], axis=-1)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                  [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 32])], inits, "mlp")


def two_inputs(op: str = "Add"):
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("a", "b", "y")]
    return _model([helper.make_node(op, ["a", "b"], ["y"])], info[:2], info[2:], {}, "pair")


@pytest.fixture
def fixed_peak(monkeypatch):
    """A stored-looking peak far above what these kernels reach: the roofline is never measured."""
    def fake(target=None, **kwargs):
        target = target or Target.current()
        return Peak(target_key=target.key, target=target.describe(), isa=target.isa, lanes=16, accumulators=12,
                    threads=target.threads, gflops_1=1e5, gflops_all=1e5 * target.threads, bandwidth_gbs=1e4,
                    triad_bytes=128 << 20, measured_at=1.0)
    monkeypatch.setattr(peak_mod, "measure", fake)
    peak_mod.forget()
    yield
    peak_mod.forget()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("models")
    paths = {}
    for name, proto in (("conv", conv_net()), ("mlp", mlp()), ("pair", two_inputs()),
                        ("unsupported", two_inputs("BitShift"))):
        paths[name] = where / f"{name}.onnx"
        onnx.save(proto, paths[name])
    (where / "garbage.onnx").write_bytes(b"\x01not a model at all")
    paths["garbage"] = where / "garbage.onnx"
    assert all(p.stat().st_size < 8192 for p in paths.values())
    return paths


def cli(capsys, *argv) -> tuple[int, str, str]:
    status = main([str(a) for a in argv])
    out = capsys.readouterr()
    return status, out.out, out.err


# ---------------------------------------------------------------------------------------------
# compile
# ---------------------------------------------------------------------------------------------

def test_compile_writes_one_file_that_loads_without_the_onnx_package(models, tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "conv.jitop"
    status, text, err = cli(capsys, "compile", models["conv"], "-o", out, "--shape", "data=2,3,16,16")
    assert status == 0, err
    assert f"wrote {out}: " in text and " KiB (code and weights) in " in text, text
    assert "serves data[2, 3, 16, 16]" in text, text
    x = np.random.default_rng(2).standard_normal((2, 3, 16, 16)).astype(np.float32)
    expected = jitop.onnx.load(str(models["conv"]))(x)
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` fails from here on
    compiled = jitop.onnx.load(str(out))
    assert compiled.kernel is None
    np.testing.assert_allclose(compiled(x), expected, rtol=1e-5, atol=1e-6)
    assert b"pickle" not in out.read_bytes()[:64]


def test_compile_defaults_next_to_the_model_with_a_symbolic_dim_at_1(models, tmp_path, capsys) -> None:
    model = tmp_path / "mlp.onnx"
    model.write_bytes(models["mlp"].read_bytes())
    status, text, err = cli(capsys, "compile", model)
    assert status == 0, err
    assert "note: x: batch = 1 (give --shape x=... for another size)" in text, text
    assert (tmp_path / "mlp.jitop").is_file() and "serves x[1, 16]" in text, text


# ---------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------

def test_run_reads_npy_inputs_saves_the_outputs_and_times_repeats(models, tmp_path, capsys) -> None:
    x = np.random.default_rng(3).standard_normal((2, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    status, text, err = cli(capsys, "run", models["conv"], "--input", f"data={tmp_path / 'x.npy'}",
                            "--output", tmp_path / "out.npz", "--repeat", "3")
    assert status == 0, err
    assert "input  data: float32[2, 3, 16, 16]" in text and "output logits: float32[2, 10]  min " in text, text
    assert "first call " in text and "traces and compiles the model" in text, text
    assert "time per run: median " in text and "(3 runs)" in text, text
    saved = np.load(tmp_path / "out.npz")
    assert list(saved.files) == ["logits"]
    np.testing.assert_allclose(saved["logits"], jitop.onnx.load(str(models["conv"]))(x), rtol=1e-5, atol=1e-6)


def test_run_generates_random_and_zero_inputs_of_the_given_shape(models, tmp_path, capsys) -> None:
    status, text, err = cli(capsys, "run", models["mlp"], "--input", "x=random", "--shape", "x=3,16",
                            "--output", tmp_path / "p.npz")
    assert status == 0, err
    assert "input  x: float32[3, 16] (random)" in text and "output probs: float32[3, 32]" in text, text
    probs = np.load(tmp_path / "p.npz")["probs"]
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    status, text, err = cli(capsys, "run", models["mlp"], "--input", "zeros")  # the only input: NAME= left out
    assert status == 0, err
    assert "input  x: float32[1, 16] (zeros; batch = 1: give --shape x=... for another size)" in text, text


def test_run_a_compiled_model_and_a_shape_it_was_not_compiled_for(models, tmp_path, capsys) -> None:
    out = tmp_path / "mlp.jitop"
    assert cli(capsys, "compile", models["mlp"], "-o", out, "--shape", "x=4,16")[0] == 0
    status, text, err = cli(capsys, "run", out, "--input", "x=random", "--repeat", "2")
    assert status == 0, err
    assert "compiled jitop model 'mlp'" in text and "output probs: float32[4, 32]" in text, text
    assert "links the compiled code" in text, text
    status, text, err = cli(capsys, "run", out, "--input", "x=random", "--shape", "x=5,16")
    assert status == 2 and err.startswith("jitop run: --shape 'x=5,16' does not fit the model's input x: "
                                          "float32[4, 16]: dim 0 is 4, not 5"), err  # its inputs were pinned
    at_1 = tmp_path / "mlp1.jitop"  # a symbolic dim compiled at 1: the file declares it symbolic still
    assert cli(capsys, "compile", models["mlp"], "-o", at_1)[0] == 0
    status, text, err = cli(capsys, "run", at_1, "--input", "x=random", "--shape", "x=5,16")
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith("jitop run: this compiled model was not compiled for these input shapes (x(5, 16))"), err


def test_run_on_the_gpu(models, tmp_path, capsys, monkeypatch) -> None:
    """--target cuda: the model on this machine's GPU (here the simulated one, tests/sim_gpu.py), the same
    outputs as on the CPU; a compiled .jitop model is CPU code and refuses it."""
    import sim_gpu
    x = np.random.default_rng(4).standard_normal((2, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    sim_gpu.gpu_or_simulated(monkeypatch)
    status, text, err = cli(capsys, "run", models["conv"], "--target", "cuda", "--input", f"data={tmp_path / 'x.npy'}",
                            "--output", tmp_path / "gpu.npz")
    assert status == 0, err
    assert "on sm_" in text.splitlines()[0] and "output logits: float32[2, 10]" in text, text
    want = jitop.onnx.load(str(models["conv"]))(x)  # 27-term convolutions, a 256-term mean, an 8-term product
    np.testing.assert_allclose(np.load(tmp_path / "gpu.npz")["logits"], want, rtol=0, atol=1e-4 * np.abs(want).max())
    out = tmp_path / "mlp.jitop"
    assert cli(capsys, "compile", models["mlp"], "-o", out, "--shape", "x=4,16")[0] == 0
    status, _, err = cli(capsys, "run", out, "--target", "cuda", "--input", "x=random")
    assert status == 2 and "compiled jitop model, which runs on the CPU it was compiled for" in err, err


# ---------------------------------------------------------------------------------------------
# errors: one line, status 2
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, expected", [
    (["run", "{tmp}/missing.onnx", "--input", "x=random"], "model '{tmp}/missing.onnx' not found"),
    (["compile", "{tmp}/missing.onnx"], "not found"),
    (["run", "{garbage}", "--input", "x=random"], "is not a readable ONNX model (DecodeError"),
    (["run", "{unsupported}", "--input", "a=zeros"], "UnsupportedOperatorError: "),
    (["run", "{mlp}", "--input", "y=random"], "--input 'y=random': the model has no input 'y' (its inputs: x)"),
    (["run", "{mlp}", "--input", "x="], "--input 'x=': nothing after x="),
    (["run", "{pair}", "--input", "a.npy"], "--input 'a.npy': expected NAME=FILE.npy, random or zeros"),
    (["run", "{pair}", "--input", "a=random"], "no --input for b: give --input b=FILE.npy"),
    (["run", "{mlp}", "--input", "x={tmp}/none.npy"], "file '{tmp}/none.npy' not found"),
    (["run", "{mlp}", "--input", "x={tmp}/wrong.npy"], "input 'x': expected shape (batch, 16), got (2, 15)"),
    (["run", "{mlp}", "--input", "x={tmp}/f64.npy"], "input 'x': expected dtype float32, got float64"),
    (["run", "{mlp}", "--input", "x=random", "--shape", "x=3,15"],
     "--shape 'x=3,15' does not fit the model's input x: float32[batch, 16]: dim 1 is 16, not 15"),
    (["compile", "{conv}", "--shape", "data=1,3,16"], "has 4 dims, not 3"),
    (["explain", "{mlp}", "--shape", "x=2,a"], "--shape 'x=2,a': expected positive integers"),
    (["tune", "{mlp}", "--shape", "y=1,16", "--trials", "2"], "the model has no input 'y'"),
    (["tune", "--script", "prog.py", "{mlp}"], "give a model ({mlp}) or --script prog.py, not both"),
    (["tune", "prog.py", "--trials", "2"], "prog.py is a Python program: jitop tune --script prog.py"),
    (["explain", "{mlp}", "--", "3"], "arguments after -- (3) are a script's"),
])
def test_bad_input_is_one_line_and_status_2(models, tmp_path, capsys, argv, expected) -> None:
    np.save(tmp_path / "wrong.npy", np.zeros((2, 15), np.float32))
    np.save(tmp_path / "f64.npy", np.zeros((2, 16)))
    names = {"tmp": tmp_path, **models}
    status, _, err = cli(capsys, *[a.format(**names) for a in argv])
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith(f"jitop {argv[0]}: "), err
    assert expected.format(**names) in err and "Traceback" not in err, err


# ---------------------------------------------------------------------------------------------
# tune
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def synthetic_measurer(monkeypatch):
    """What tune() builds to measure, without worker processes or LLVM (tests/tuning_fakes.py)."""
    from tuning_fakes import SyntheticMeasurer

    import jitop.tuner.measure as measure_mod

    class Measurer(SyntheticMeasurer):
        def __init__(self, options=None):
            super().__init__()
    monkeypatch.setattr(measure_mod, "LocalMeasurer", Measurer)


def test_tune_tunes_the_models_tasks_into_the_cache_for_a_later_load(models, capsys, synthetic_measurer) -> None:
    status, text, err = cli(capsys, "tune", models["conv"], "--shape", "data=2,3,16,16", "--trials", "8",
                            "--tuner", "random", "--no-progress")
    assert status == 0, err
    # the plan: the model's tasks at the --shape sizes, heaviest first, with their share of the flops
    assert "its tuning tasks at data: float32[2, 3, 16, 16]" in err, err
    plan = err[err.index("task "):]
    assert plan.index("conv2d 2x3x16x16 oc8 3x3/1") < plan.index("matmul 2x10x8"), err
    assert "conv2d 2x3x16x16 oc8 3x3/1 NCHW float32" in text and "matmul 2x10x8 float32" in text, text
    assert "best configs saved in the cache" in text and "jitop.onnx.load(" in text, text
    # a later load of the .onnx model compiles with the tuned configs, from the cache
    x = np.zeros((2, 3, 16, 16), np.float32)
    explained = jitop.onnx.load(str(models["conv"]), shapes={"data": x.shape}).kernel.explain(x)
    sources = [line for line in explained.splitlines() if ": template " in line]
    assert len(sources) == 2 and all("tuned config" in s and "from the cache" in s for s in sources), explained


def test_tune_a_model_without_tunable_operators_says_so(models, capsys) -> None:
    status, _, err = cli(capsys, "tune", models["pair"], "--trials", "2")
    assert status == 1 and "runs no tunable operator (MatMul, Gemm, Conv)" in err, err


def test_tune_parses_a_model_with_the_usual_options() -> None:
    args = parse(["tune", "m.onnx", "--budget", "10m", "--shape", "x=1,16", "--tasks", "matmul"])
    assert (args.model, args.budget, args.shape, args.tasks, args.script) == \
        ("m.onnx", "10m", ["x=1,16"], "matmul", None)
    with pytest.raises(UsageError, match="unknown argument '48'"):  # with --script, still a stray argument
        parse(["tune", "--script", "prog.py", "48"])


# ---------------------------------------------------------------------------------------------
# explain
# ---------------------------------------------------------------------------------------------

def test_explain_a_model_abbreviated_with_times_and_the_profile(models, capsys) -> None:
    status, text, err = cli(capsys, "explain", models["conv"], "--shape", "data=2,3,16,16")
    assert status == 0, err
    assert "operators: 5 nodes, opset 17: Conv 1, Flatten 1, Gemm 1, GlobalAveragePool 1, Relu 1" in text, text
    assert "explained at data: float32[2, 3, 16, 16]" in text, text
    assert "fusion groups" in text and "operator templates" in text and "default config" in text, text
    assert "traced graph: " in text and "loop IR: " in text and "(--full shows it)" in text, text
    assert "loop IR (schedule applied)" not in text, text
    assert "tuning tasks (2; jitop tune " in text and "conv2d 2x3x16x16 oc8 3x3/1 NCHW float32" in text, text
    assert "roofline: peak " in text and "% of peak" in text and "(median of " in text, text
    assert "loop nests by time" in text and "conv2d float32[2, 8, 16, 16]" in text, text
    status, text, err = cli(capsys, "explain", models["mlp"], "--full", "--no-profile")
    assert status == 0, err
    assert "loop IR (schedule applied)" in text and "traced graph:\n" in text, text
    assert "note: x: batch = 1" in text and "loop nests by time" not in text, text


def test_explain_a_compiled_model(models, tmp_path, capsys) -> None:
    out = tmp_path / "mlp.jitop"
    assert cli(capsys, "compile", models["mlp"], "-o", out, "--shape", "x=2,16")[0] == 0
    status, text, err = cli(capsys, "explain", out)
    assert status == 0, err
    assert "executable: serves x[2, 16]" in text and "per call at x: float32[2, 16]" in text, text


def test_help_of_the_model_commands(capsys) -> None:
    for command in ("compile", "run"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "--shape NAME=D0,D1,..." in capsys.readouterr().out
