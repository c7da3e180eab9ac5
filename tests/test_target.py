"""jitop.Target: parsing, JSON round trip, key stability, the JITOP_CPU / JITOP_OPT_LEVEL overrides,
feature compatibility, and code built for a CPU the host does not cover (saved, refused, never run)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import jitop
from jitop import te
from jitop.target import KNOWN_CPUS, Target

HOST = Target.host()


def _add_one(n: int = 1000):
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0 + 1.0, name="B")
    s = jitop.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=16)
    s[B].vectorize(xi)
    return s, [A, B]


# ---------------------------------------------------------------------------------------------
# parsing
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["llvm -mcpu=haswell", "haswell", "  llvm   -mcpu=haswell  ", "-mcpu=haswell"])
def test_from_string_cpu(text: str) -> None:
    t = Target.from_string(text)
    assert (t.cpu, t.isa, t.vector_bytes, t.vector_registers) == ("haswell", "avx2", 32, 16)
    assert {"avx2", "fma", "avx"} <= t.required_features and "avx512f" not in t.required_features
    assert t.triple == HOST.triple
    assert t == Target.from_string("llvm -mcpu=haswell")


def test_from_string_mattr_adds_and_removes_features() -> None:
    wide = Target.from_string("llvm -mcpu=haswell -mattr=+avx512f")
    assert (wide.isa, wide.vector_bytes, wide.vector_registers, wide.lanes(4)) == ("avx512", 64, 32, 16)
    assert "+avx512f" in wide.features.split(",")
    narrow = Target.from_string("llvm -mcpu=znver4 -mattr=-avx512f")
    assert narrow.isa == "avx2" and narrow.vector_bytes == 32
    # AVX-512's extensions go with it, explicitly off
    assert not any(f.startswith("avx512") for f in narrow.required_features)
    assert "-avx512vl" in narrow.features.split(",")
    no_avx2 = Target.from_string("llvm -mcpu=sapphirerapids -mattr=-avx2")
    # what needs AVX2 goes with it (FMA stays: it needs only AVX); AMX needs none of them (as in LLVM)
    assert no_avx2.isa == "avx" and no_avx2.vector_bytes == 32
    assert {"avx2", "avx512f", "avx512bw", "avxvnni", "vaes"} & no_avx2.required_features == {"vaes"}
    assert "fma" in no_avx2.required_features
    # implications: +avx2 brings AVX; -avx takes AVX2, FMA and F16C with it
    assert Target.from_string("llvm -mcpu=x86-64 -mattr=+avx2").vector_bytes == 32
    no_avx = Target.from_string("llvm -mcpu=haswell -mattr=-avx")
    assert no_avx.isa == "sse" and not {"avx2", "fma", "f16c"} & no_avx.required_features
    # a named CPU states every feature this LLVM knows: code for it can use nothing it does not list
    assert "-gfni" in Target.from_string("haswell").features.split(",")
    assert "gfni" in Target.from_string("icelake-server").required_features
    # every feature is stated once, sorted
    names = [f[1:] for f in no_avx2.features.split(",")]
    assert names == sorted(set(names))


def test_from_string_native_is_the_host() -> None:
    for text in ("llvm -mcpu=native", "native", "llvm"):
        t = Target.from_string(text)
        assert (t.cpu, t.features) == (HOST.cpu, HOST.features)


def test_unknown_cpu_error_names_the_cpu_and_the_known_ones() -> None:
    with pytest.raises(ValueError) as err:
        Target.from_string("llvm -mcpu=pentium9000")
    msg = str(err.value)
    assert "pentium9000" in msg and "unknown CPU" in msg
    assert "haswell" in msg and "znver4" in msg and "native" in msg


@pytest.mark.parametrize("text, words", [
    ("llvm -mcpu=haswell -O3", ["-O3", "unknown option"]),
    ("llvm -mtriple=x86_64", ["-mtriple=x86_64", "unknown option"]),
    ("llvm haswell znver4", ["znver4", "unknown option"]),
    ("llvm -mcpu=haswell -mattr=avx2", ["'avx2'", "must start with + or -"]),
    ("llvm -mcpu=haswell -mattr=+fma,avx512f", ["'avx512f'", "must start with + or -"]),
])
def test_bad_options_are_errors(text: str, words: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        Target.from_string(text)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_every_known_cpu_parses() -> None:
    for name in KNOWN_CPUS:
        t = Target.from_string(name)
        assert t.cpu == name and KNOWN_CPUS[name][0] <= t.required_features


def test_build_rejects_an_unknown_target_string() -> None:
    s, args = _add_one()
    with pytest.raises(ValueError, match="not supported.*'cuda'"):
        jitop.build(s, args, target="opencl")


# ---------------------------------------------------------------------------------------------
# JSON and the key
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("t", [HOST, Target.from_string("haswell"), Target.from_string("znver4 -mattr=-avx512f"),
                               Target.from_string("haswell").replace(threads=7, opt_level=1, parallel_min_work=3)],
                         ids=["host", "haswell", "znver4-no512", "haswell-options"])
def test_json_round_trip(t: Target) -> None:
    text = t.to_json()
    assert isinstance(json.loads(text), dict)
    back = Target.from_json(text)
    assert back == t and hash(back) == hash(t) and back.key == t.key
    assert Target.from_json(json.loads(text)) == t   # a parsed dict is accepted too


def test_from_json_rejects_other_data() -> None:
    with pytest.raises(ValueError, match="not a jitop Target"):
        Target.from_json('{"cpu": "haswell"}')
    data = json.loads(HOST.to_json())
    with pytest.raises(ValueError, match="unknown fields"):
        Target.from_json({**data, "colour": "blue"})


def test_key_is_stable_for_equal_targets() -> None:
    a, b = Target.from_string("llvm -mcpu=haswell"), Target.from_string("haswell")
    assert a == b and a.key == b.key and isinstance(a.key, str)
    assert a.key.startswith("haswell-avx2-")
    assert len({Target.from_string("znver3").key for _ in range(3)}) == 1


def test_key_is_the_same_in_another_process() -> None:
    code = "from jitop.target import Target; print(Target.from_string('haswell').replace(threads=2).key)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == Target.from_string("haswell").replace(threads=2).key


@pytest.mark.parametrize("change", [dict(threads=3), dict(opt_level=0), dict(parallel_min_work=1),
                                    dict(vector_registers=8), dict(l2_bytes=123 << 10)])
def test_key_changes_with_what_code_depends_on(change: dict) -> None:
    base = Target.from_string("haswell").replace(threads=2, opt_level=3)
    other = base.replace(**change)
    assert other != base and other.key != base.key


def test_key_changes_with_features() -> None:
    keys = {Target.from_string(s).key for s in ("haswell", "haswell -mattr=-fma", "haswell -mattr=+avx512f",
                                                 "znver3", "skylake")}
    assert len(keys) == 5


# ---------------------------------------------------------------------------------------------
# environment overrides: JITOP_CPU, JITOP_OPT_LEVEL, threads
# ---------------------------------------------------------------------------------------------

def test_jitop_cpu_overrides_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JITOP_CPU", "haswell")
    assert Target.current() == Target.from_string("haswell")
    monkeypatch.setenv("JITOP_CPU", "llvm -mcpu=znver3 -mattr=-fma")
    t = Target.current()
    assert t.cpu == "znver3" and "fma" not in t.required_features
    monkeypatch.setenv("JITOP_CPU", "")
    assert Target.current() == Target.host()
    monkeypatch.delenv("JITOP_CPU")
    assert Target.current() == Target.host()
    monkeypatch.setenv("JITOP_CPU", "not-a-cpu")
    with pytest.raises(ValueError, match="not-a-cpu"):
        Target.current()


def test_jitop_cpu_selects_the_target_of_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JITOP_CPU", "haswell")
    s, args = _add_one()
    f = jitop.build(s, args)
    assert f.target.cpu == "haswell" and f.target.isa == "avx2"
    asm = f.get_source("asm")
    assert "ymm" in asm and "zmm" not in asm
    a = np.arange(1000, dtype=np.float32)
    np.testing.assert_array_equal(f(a), a * 2 + 1)


def test_thread_count_is_read_into_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JITOP_NUM_THREADS", "3")
    assert Target.current().threads == 3 and Target.from_string("haswell").threads == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert Target.current().threads == 3
    monkeypatch.delenv("JITOP_NUM_THREADS")
    assert Target.current().threads == 5


def test_jitop_opt_level(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JITOP_OPT_LEVEL", raising=False)
    default = Target.current()
    assert default.opt_level == 3
    monkeypatch.setenv("JITOP_OPT_LEVEL", "0")
    t = Target.current()
    assert t.opt_level == 0 and Target.from_string("haswell").opt_level == 0
    assert t.key != default.key
    s, args = _add_one()
    f0 = jitop.build(s, args, target=t)
    assert f0.target.opt_level == 0
    a = np.linspace(-3, 3, 1000, dtype=np.float32)
    np.testing.assert_array_equal(f0(a), a * np.float32(2) + np.float32(1))
    f3 = jitop.build(s, args, target=default)
    np.testing.assert_array_equal(f3(a), f0(a))
    # the level is honoured: O0 leaves the IR unoptimised (allocas and all), O3 does not
    assert f0.get_source("ll") != f3.get_source("ll")
    monkeypatch.setenv("JITOP_OPT_LEVEL", "fast")
    with pytest.raises(ValueError, match="JITOP_OPT_LEVEL"):
        Target.current()


# ---------------------------------------------------------------------------------------------
# compatibility
# ---------------------------------------------------------------------------------------------

def test_missing_on() -> None:
    haswell, spr = Target.from_string("haswell"), Target.from_string("sapphirerapids")
    zen4, zen5 = Target.from_string("znver4"), Target.from_string("znver5")
    assert haswell.missing_on(spr) == [] and haswell.missing_on(zen4) == [] and haswell.missing_on(haswell) == []
    on_haswell = spr.missing_on(haswell)
    assert {"avx512f", "avx512fp16", "amx-tile"} <= set(on_haswell) and on_haswell == sorted(on_haswell)
    assert {"avx512f", "sse4a"} <= set(zen4.missing_on(haswell))
    assert {"amx-tile", "amx-int8", "avx512fp16"} <= set(spr.missing_on(zen5))   # AMX is Intel's
    assert "avx512f" not in spr.missing_on(zen5)
    assert {"sse4a", "clzero"} <= set(zen4.missing_on(spr))                       # SSE4a is AMD's
    with pytest.raises(jitop.TargetMismatchError, match="amx-tile"):
        spr.check_runs_on(haswell)
    haswell.check_runs_on(spr)   # no error


def test_target_mismatch_error_is_a_jitop_error() -> None:
    assert issubclass(jitop.TargetMismatchError, jitop.JitopError)


def _foreign_target() -> Target:
    """A CPU whose code this host cannot run: AMD's have SSE4a (Intel's lack it), Intel's AMX (AMD's lack it)."""
    for name in ("sapphirerapids", "znver4", "znver5"):
        t = Target.from_string(f"llvm -mcpu={name}")
        if t.missing_on(HOST):
            return t
    pytest.skip(f"this host ({HOST.cpu}) runs code for every candidate CPU")


def test_code_for_a_foreign_cpu_is_saved_refused_and_never_run(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    foreign = _foreign_target()
    missing = foreign.missing_on(HOST)
    from jitop.codegen import loader

    def never(*args, **kwargs):
        raise AssertionError("code for a foreign CPU was linked into the process")

    monkeypatch.setattr(loader, "load_object", never)
    s, args = _add_one()
    f = jitop.build(s, args, target=f"llvm -mcpu={foreign.cpu}")
    assert f.target.cpu == foreign.cpu and f.target.missing_on(HOST) == missing
    assert f.get_source("asm")   # it can be inspected
    path = tmp_path / "foreign.jitop"
    f.save(path)
    assert path.stat().st_size > 0

    with pytest.raises(jitop.TargetMismatchError) as err:
        jitop.load_module(path)
    msg = str(err.value)
    assert all(name in msg for name in missing), msg
    assert foreign.cpu in msg and "Rebuild" in msg

    a = np.ones(1000, np.float32)
    for call in (lambda: f(a), lambda: f(a, np.empty_like(a))):
        with pytest.raises(jitop.TargetMismatchError) as err:
            call()
        assert all(name in str(err.value) for name in missing)


def test_code_for_a_covered_cpu_loads_and_runs(tmp_path) -> None:
    s, args = _add_one()
    f = jitop.build(s, args, target="llvm -mcpu=haswell")
    path = tmp_path / "haswell.jitop"
    f.save(path)
    g = jitop.load_module(path)
    assert g.target == f.target
    a = np.arange(1000, dtype=np.float32)
    np.testing.assert_array_equal(g(a), a * 2 + 1)
