"""jitop.tuner.peak: the FP32 peak and the memory bandwidth are measured once per Target, kept in the cache,
reused, measured again when the stored entry is damaged (a warning, never a failure) or when a kernel beats
them; `jitop tune`'s table divides by them (issue 21, part 5). No test asserts a speed: the fakes below stand
in for the machine, and the one real measurement is only checked for being a measurement."""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from jitop.target import Target
from jitop.tuner import peak as peak_mod
from jitop.tuner.peak import Peak

pytestmark = pytest.mark.usefixtures("private_cache")


def fake_peak(target: Target, gflops: float = 2.0, gbs: float = 3.0) -> Peak:
    return Peak(target_key=target.key, target=target.describe(), isa=target.isa, lanes=16, accumulators=12,
                threads=target.threads, gflops_1=gflops / target.threads, gflops_all=gflops, bandwidth_gbs=gbs,
                triad_bytes=128 << 20, measured_at=1.0)


@pytest.fixture
def measured(monkeypatch):
    """jitop.tuner.peak.measure replaced by a fake that counts its calls; `measured.figures` are what the next
    calls return (the last one repeats)."""
    class Fake:
        calls = 0
        figures = [(2.0, 3.0)]

        def __call__(self, target=None, bandwidth=True, **kwargs):
            g, b = self.figures[min(self.calls, len(self.figures) - 1)]
            self.calls += 1
            return fake_peak(target or Target.current(), g, b if bandwidth else None)
    fake = Fake()
    monkeypatch.setattr(peak_mod, "measure", fake)
    peak_mod.forget()
    yield fake
    peak_mod.forget()


def test_the_peak_is_measured_once_then_read_from_the_cache(measured) -> None:
    target = Target.current()
    first = peak_mod.machine_peak(target)
    assert measured.calls == 1 and first.gflops_all == 2.0
    assert peak_mod.machine_peak(target) is first and measured.calls == 1  # this process: kept
    peak_mod.forget()  # another process: the cache's
    again = peak_mod.machine_peak(target)
    assert measured.calls == 1 and again == first
    assert peak_mod.stored_peak(target.key) == first and first in peak_mod.stored_peaks()


def test_each_target_has_its_own_peak(measured) -> None:
    host = Target.current()
    other = host.replace(threads=host.threads + 1)
    assert peak_mod.machine_peak(host).target_key == host.key
    assert peak_mod.machine_peak(other).target_key == other.key and measured.calls == 2


@pytest.mark.parametrize("payload", [b"not json", b'{"schema": 1}', b"[]", b'{"schema": 999, "gflops_all": 1}'])
def test_an_unusable_stored_peak_is_measured_again_with_a_warning(measured, payload: bytes) -> None:
    from jitop.cachedir import store
    target = Target.current()
    store().put(peak_mod.key(target), payload)
    with pytest.warns(RuntimeWarning, match="stored peak .* unusable.*measuring it again"):
        p = peak_mod.machine_peak(target)
    assert measured.calls == 1 and p.gflops_all == 2.0
    peak_mod.forget()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert peak_mod.machine_peak(target) == p and measured.calls == 1  # the new one was stored


def test_a_nonsense_or_foreign_stored_peak_is_measured_again(measured) -> None:
    from jitop.cachedir import store
    target = Target.current()
    bad = [dataclasses.replace(fake_peak(target), gflops_all=-5.0),
           dataclasses.replace(fake_peak(target), gflops_all=float("nan")),
           dataclasses.replace(fake_peak(target), target_key="someone-else")]
    for n, p in enumerate(bad, 1):
        store().put(peak_mod.key(target), p.to_json().encode())
        peak_mod.forget()
        with pytest.warns(RuntimeWarning, match="measuring it again"):
            assert peak_mod.machine_peak(target).gflops_all == 2.0
        assert measured.calls == n


def test_a_stored_peak_failing_its_checksum_is_measured_again_with_a_warning(measured) -> None:
    from jitop.cachedir import store
    target = Target.current()
    peak_mod.machine_peak(target)
    st = store()
    raw = st._open().get(peak_mod.key(target))
    st._open().set(peak_mod.key(target), raw[:-3] + b"xyz")  # the payload changed under its checksum
    peak_mod.forget()
    with pytest.warns(RuntimeWarning, match="failed its checksum"):
        assert peak_mod.machine_peak(target).gflops_all == 2.0
    assert measured.calls == 2


def test_a_kernel_beating_the_peak_makes_it_measured_again_once(measured) -> None:
    target = Target.current()
    measured.figures = [(2.0, 3.0), (50.0, 4.0), (500.0, 40.0)]
    assert peak_mod.machine_peak(target).gflops_all == 2.0
    assert peak_mod.machine_peak(target, at_least=1.5).gflops_all == 2.0 and measured.calls == 1  # not beaten
    p = peak_mod.machine_peak(target, at_least=10.0)  # beaten: measured again, the higher figures kept
    assert (p.gflops_all, p.bandwidth_gbs, measured.calls) == (50.0, 4.0, 2)
    assert peak_mod.machine_peak(target, at_least=100.0).gflops_all == 50.0 and measured.calls == 2  # once
    peak_mod.forget()
    assert peak_mod.machine_peak(target).gflops_all == 50.0  # and stored


def test_a_kernel_beating_the_bandwidth_makes_it_measured_again(measured) -> None:
    target = Target.current()
    measured.figures = [(2.0, 3.0), (1.0, 9.0)]
    peak_mod.machine_peak(target)
    p = peak_mod.machine_peak(target, at_least_gbs=5.0)
    assert (p.gflops_all, p.bandwidth_gbs, measured.calls) == (2.0, 9.0, 2)  # each figure: the higher one


def test_the_triad_is_measured_only_when_a_caller_needs_the_bandwidth(measured) -> None:
    from jitop.tuner.report import measured_peak_gflops
    target = Target.current()
    assert measured_peak_gflops(target) == 2.0  # tune's report: the FMA peak alone
    assert peak_mod.machine_peak(target, bandwidth=False).bandwidth_gbs is None and measured.calls == 1
    assert peak_mod.machine_peak(target).bandwidth_gbs == 3.0 and measured.calls == 2  # explain's: the triad too
    peak_mod.forget()
    assert peak_mod.machine_peak(target).bandwidth_gbs == 3.0 and measured.calls == 2  # stored with it


def test_a_failed_measurement_leaves_the_report_without_percent_not_failed(monkeypatch) -> None:
    from jitop.tuner.report import measured_peak_gflops

    def broken(*args, **kwargs):
        raise RuntimeError("no LLVM today")
    monkeypatch.setattr(peak_mod, "measure", broken)
    peak_mod.forget()
    try:
        with pytest.warns(RuntimeWarning, match="could not be measured.*no LLVM today"):
            assert measured_peak_gflops(Target.current()) is None
    finally:
        peak_mod.forget()


def test_peak_json_round_trips_and_per_thread() -> None:
    target = Target.current()
    p = fake_peak(target, 8.0)
    assert Peak.from_json(p.to_json()) == p
    assert p.per_thread(target.threads) == 8.0 and p.per_thread(1) == pytest.approx(8.0 / target.threads)
    assert "STREAM triad" in p.describe() and "24 bytes per element" in p.describe_bandwidth()


def test_triad_arrays_are_4x_the_caches_within_bounds(monkeypatch) -> None:
    host = Target.current()
    small = host.replace(l2_bytes=1 << 20, l3_bytes=8 << 20, threads=2)
    emr = host.replace(l2_bytes=2 << 20, l3_bytes=300 << 20, threads=16)
    huge = host.replace(l2_bytes=2 << 20, l3_bytes=2 << 30, threads=64)
    monkeypatch.setattr(peak_mod.os, "sysconf", lambda name: {"SC_PHYS_PAGES": 1 << 22, "SC_PAGE_SIZE": 4096}[name])
    assert peak_mod.triad_array_bytes(small) == peak_mod.TRIAD_MIN_BYTES
    assert 3 * peak_mod.triad_array_bytes(emr) >= 4 * (332 << 20)            # 4x L3 + L2s, over three arrays
    assert peak_mod.triad_array_bytes(emr) < 450 << 20
    assert peak_mod.triad_array_bytes(huge) == peak_mod.TRIAD_MAX_BYTES    # 16 GiB of memory: 1 GiB arrays
    monkeypatch.setattr(peak_mod.os, "sysconf", lambda name: {"SC_PHYS_PAGES": 1 << 20, "SC_PAGE_SIZE": 4096}[name])
    assert peak_mod.triad_array_bytes(huge) <= (4 << 30) // 12 + peak_mod.TRIAD_BLOCK * 8  # 4 GiB: a twelfth
    for t in (small, emr, huge):
        assert peak_mod.triad_array_bytes(t) % (peak_mod.TRIAD_BLOCK * 8) == 0


@pytest.mark.parametrize("cpu", [None, "x86-64"])  # the host; a CPU without FMA (a multiply and an add)
def test_the_fma_loop_is_what_it_should_be(cpu: str | None) -> None:
    target = Target.current() if cpu is None else Target.from_string(f"llvm -mcpu={cpu}")
    asm, _, lanes, acc = peak_mod.compiled(target)
    assert peak_mod.check_asm(asm, target, acc) == []
    assert lanes == target.lanes(4) and "fma_body" in asm


def test_the_triad_is_jitops_own_parallel_vector_kernel() -> None:
    target = Target.current()
    n = 2 * peak_mod.TRIAD_BLOCK
    triad = peak_mod.triad_kernel(target, n)
    b, c = np.arange(n, dtype=np.float64), np.linspace(-1.0, 1.0, n)
    np.testing.assert_array_equal(triad(b, c), b + peak_mod.TRIAD_SCALAR * c)
    assert triad.meta["uses_parallel"]  # on jitop_parallel_for
    adds = [line for line in peak_mod.hot_loop(triad.get_source("asm"), "addpd").splitlines() if "addpd" in line]
    reg = {64: "zmm", 32: "ymm"}.get(target.vector_bytes, "xmm")
    assert adds and all(f"%{reg}" in line for line in adds)  # on whole vector registers


def test_a_real_measurement_measures(monkeypatch) -> None:
    # only that it is a measurement (positive, finite, of this Target, with its array size): no speed asserted
    target = Target.current()
    monkeypatch.setattr(peak_mod, "TRIAD_REPEAT", 2)
    monkeypatch.setattr(peak_mod, "triad_array_bytes", lambda target: 16 << 20)  # the plumbing, not the memory
    p = peak_mod.measure(target, call_seconds=0.002, repeat=2)
    assert p.target_key == target.key and p.threads == target.threads and p.asm_problems == ()
    assert np.isfinite([p.gflops_1, p.gflops_all, p.bandwidth_gbs]).all()
    assert min(p.gflops_1, p.gflops_all, p.bandwidth_gbs) > 0
    assert p.triad_bytes == peak_mod.triad_array_bytes(target) and p.seconds > 0
