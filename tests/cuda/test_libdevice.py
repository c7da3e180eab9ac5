"""float64 pow and erf on the GPU: jitop's vector math has no float64 version of them, so GPU code calls NVIDIA's
libdevice, linked into the module (jitop.codegen.libdevice). Without libdevice the build fails naming the call."""
from __future__ import annotations

import os

import numpy as np
import pytest

import jitop
from jitop.codegen import libdevice
from jitop.codegen.nvptx import check_ptx, ptxas_path
from jitop.graph.gpu import compile_graph_gpu

SM90 = "cuda -arch=sm_90"
needs_libdevice = pytest.mark.skipif(libdevice.path() is None and os.environ.get("JITOP_REQUIRE_PTXAS") != "1",
                                     reason="no libdevice here (pip install nvidia-nvvm, or jitop[cuda-test])")


def _ptx(fn, *args) -> str:
    kf = jitop.kernel(fn, target=SM90)
    tr = kf.trace(list(args))
    return compile_graph_gpu("libm", tr.inputs, tr.names, tr.plan, tr.results, kf.gpu).function.built.ptx


def power_and_gelu(x, y):
    return np.power(x, y), 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


@needs_libdevice
def test_float64_pow_links_libdevice():
    x = np.ones(100, np.float64)
    ptx = _ptx(power_and_gelu, x, x)
    assert ".extern" not in ptx  # libdevice's pow is inlined, nothing left to resolve
    if ptxas_path() is not None or os.environ.get("JITOP_REQUIRE_PTXAS") == "1":
        check_ptx(ptx)


@pytest.fixture
def libdevice_at(monkeypatch):
    """Point JITOP_LIBDEVICE at a file for one test; the lookup is cached, so it is forgotten before and after."""
    def point(path) -> None:
        monkeypatch.setenv("JITOP_LIBDEVICE", str(path))
        libdevice.path.cache_clear()
        libdevice.bitcode.cache_clear()
    yield point
    monkeypatch.delenv("JITOP_LIBDEVICE", raising=False)
    libdevice.path.cache_clear()
    libdevice.bitcode.cache_clear()


def test_without_libdevice_the_build_names_the_call(libdevice_at, tmp_path):
    libdevice_at(tmp_path / "missing.bc")
    x = np.ones(8, np.float64)
    with pytest.raises(NotImplementedError, match=r"would call pow, .*libdevice"):
        _ptx(lambda a: a ** a, x)
    assert ".extern" not in _ptx(lambda a: a ** a, x.astype(np.float32))  # float32: jitop's own pow


def test_a_file_that_is_not_bitcode_is_not_linked(libdevice_at, tmp_path):
    fake = tmp_path / libdevice.FILE
    fake.write_bytes(b"not bitcode")
    libdevice_at(fake)
    assert libdevice.path() == str(fake) and libdevice.bitcode() is None
