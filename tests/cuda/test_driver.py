"""The CUDA driver runtime (jitop/runtime/cuda): most tests run anywhere through a fake libcuda whose "device
memory" is host memory (error messages, parameter packing, launch checks, interop, zero-size arrays); those marked
`requires_gpu` run on an NVIDIA GPU (benchmarks/gpu_check.sh) and skip elsewhere."""
from __future__ import annotations

import ctypes
import gc
import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest

from fake_driver import FakeDriver
from jitop.runtime.cuda import driver, memory

requires_gpu = pytest.mark.skipif(not driver.available(), reason=f"no usable NVIDIA GPU: {driver.unavailable_reason()}")
H100 = driver.LaunchLimits(1024, (1024, 1024, 64), (2 ** 31 - 1, 65535, 65535), 48 << 10, 227 << 10)
@pytest.fixture
def fake(monkeypatch):
    """The fake library in place of libcuda, with fresh per-process caches; all put back afterwards."""
    lib = FakeDriver()
    monkeypatch.setattr(driver, "lib", lambda: lib)
    monkeypatch.setattr(driver, "_cache", {})
    monkeypatch.setattr(driver, "_thread", threading.local())
    monkeypatch.setattr(memory, "POOL", memory.BlockPool())  # fake blocks never reach the process's pool
    return lib


class FakeCudaArray:
    """What torch/CuPy expose: only a __cuda_array_interface__."""

    def __init__(self, shape, typestr="<f4", strides=None, ptr=0x7F0000000000, **extra):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3, **extra}


# ** without a GPU **
def test_available_never_raises():
    assert isinstance(driver.available(), bool)
    assert isinstance(driver.unavailable_reason(), str)
    assert (driver.unavailable_reason() == "") == driver.available()


@pytest.mark.skipif(driver.available(), reason="this machine has a GPU")
def test_no_driver_is_reported_not_raised():
    assert driver.available() is False
    assert "libcuda" in driver.unavailable_reason()
    with pytest.raises(driver.CudaUnavailableError, match="libcuda.so.1 not found"):
        driver.load_library()


def test_out_of_memory_names_the_call_the_error_and_the_bytes(fake):
    fake.fail["cuMemAlloc_v2"] = 2
    with pytest.raises(driver.CudaError) as info:
        memory.empty((1 << 20,), np.float64)
    e = info.value
    assert (e.code, e.name, e.call) == (2, "CUDA_ERROR_OUT_OF_MEMORY", "cuMemAlloc_v2")
    text = str(e)
    assert "cuMemAlloc_v2" in text and "CUDA_ERROR_OUT_OF_MEMORY" in text and "out of memory" in text
    assert f"asked for {8 << 20} bytes" in text and f"{1 << 30} of {80 << 30} bytes are free" in text
    again = pickle.loads(pickle.dumps(e))
    assert (again.code, again.name, again.call, str(again)) == (e.code, e.name, e.call, text)


def test_a_faulted_kernel_says_the_context_is_lost(fake):
    fake.fail["cuCtxSynchronize"] = 700
    with pytest.raises(driver.CudaError, match="CUDA_ERROR_ILLEGAL_ADDRESS.*faulted.*every later CUDA call"):
        driver.synchronize()


def test_an_unknown_error_code_still_reads(fake):
    with pytest.raises(driver.CudaError, match=r"cuInit failed with CUDA error 12345 \(12345\)") as info:
        driver.check("cuInit", 12345)
    assert info.value.name == "CUDA error 12345"


def test_device_attributes_and_the_primary_context(fake):
    from jitop.target import CudaTarget
    attrs = driver.device_attributes()
    assert attrs["name"] == "Fake H100" and attrs["arch"] == "sm_90" and attrs["compute_capability"] == (9, 0)
    assert attrs["max_block_dim"] == (1024, 1024, 64) and attrs["max_grid_dim"] == (2 ** 31 - 1, 65535, 65535)
    assert (attrs["sm_count"], attrs["l2_bytes"], attrs["total_memory"]) == (132, 50 << 20, 80 << 30)
    assert CudaTarget.from_attributes(attrs).shared_per_block_optin == 227 << 10
    with pytest.raises(ValueError, match="GPU ordinal 3 does not exist"):
        driver.device_attributes(3)
    ctx = driver.context()
    assert driver.context() is ctx and ctx.handle == 0xC0
    worker = threading.Thread(target=driver.context)
    worker.start()
    worker.join()
    assert fake.names().count("cuDevicePrimaryCtxRetain") == 1
    assert fake.names().count("cuCtxSetCurrent") == 2  # once per thread


def test_link_ptx_returns_the_cubin_and_shows_the_jit_log_on_failure(fake):
    assert driver.link_ptx(".version 8.0\n.target sm_90\n", arch="sm_90a") == b"\x7fELF fake cubin"
    assert fake.ptx.endswith(b"sm_90\n\0")  # NUL-terminated PTX, its size counting the NUL
    options = fake.link_options
    assert options[driver.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES] == options[driver.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES]
    assert options[driver.CU_JIT_TARGET] == 0x10000 + 90
    fake.fail["cuLinkAddData_v2"], fake.jit_log = 218, b"ptxas fatal : Unexpected token 'bogus'"
    with pytest.raises(driver.CudaError, match="(?s)cuLinkAddData_v2.*CUDA_ERROR_INVALID_PTX.*Unexpected token"):
        driver.link_ptx("bogus")
    assert fake.names().count("cuLinkDestroy") == 2
    with pytest.raises(ValueError, match="sm_90"):
        driver.link_ptx(".version 8.0", arch="compute_90")


def test_module_load_terminates_ptx_text_and_keeps_binaries(fake):
    driver.Module.load(b".version 8.0")
    driver.Module.load(b"\x7fELF\x02")
    images = [args[0] for name, args in fake.calls if name == "cuModuleLoadDataEx"]
    assert images == [b".version 8.0\0", b"\x7fELF\x02"]
    with pytest.raises(TypeError, match="non-empty bytes"):
        driver.Module.load(b"")


def _read(pointer, ctype):
    return ctypes.cast(pointer, ctypes.POINTER(ctype)).contents.value


def test_kernel_parameters_point_at_c_values_of_the_right_types():
    view = memory.DeviceArray((4,), np.float32, 0x7F00_0000_1000)
    args = [view, 0x7F00_0000_2000, FakeCudaArray((2,), ptr=0x7F00_0000_3000), 5, -3, 1.5, 2.25]
    params, keep = driver.pack_params(args, ["ptr", "ptr", "ptr", "i64", "i32", "f32", "f64"])
    assert len(params) == 7 and len(keep) == 7
    assert [_read(params[k], ctypes.c_uint64) for k in range(3)] == [0x7F00_0000_1000, 0x7F00_0000_2000,
                                                                      0x7F00_0000_3000]
    assert _read(params[3], ctypes.c_int64) == 5 and _read(params[4], ctypes.c_int32) == -3
    assert _read(params[5], ctypes.c_float) == 1.5 and _read(params[6], ctypes.c_double) == 2.25
    assert driver.pack_params([], [])[0]._length_ == 0


@pytest.mark.parametrize("args,types,error,match", [
    ([1, 2], ["ptr"], ValueError, "2 kernel arguments but 1 argument types"),
    ([1], ["u8"], ValueError, "argument 0: unknown type 'u8'"),
    ([1, "x"], ["i64", "f32"], TypeError, r"argument 1 \(f32\)"),
    ([object()], ["ptr"], TypeError, "device address"),
    ([2 ** 40], ["i32"], ValueError, r"argument 0 \(i32\): 1099511627776 does not fit"),
    ([-1], ["ptr"], ValueError, "does not fit"),
    ([1.5], ["i64"], TypeError, r"argument 0 \(i64\).*float"),
])
def test_bad_kernel_parameters_are_named(args, types, error, match):
    with pytest.raises(error, match=match):
        driver.pack_params(args, types)


@pytest.mark.parametrize("grid,block,shared,match", [
    ((1, 1, 1), (2048, 1, 1), 0, r"block of 2048 threads \(2048x1x1\) exceeds this GPU's 1024 threads per block"),
    ((1, 1, 1), (2, 2, 128), 0, "block dimension z of 128 exceeds this GPU's limit of 64"),
    ((1, 70000, 1), (32, 1, 1), 0, "grid dimension y of 70000 exceeds this GPU's limit of 65535"),
    ((0, 1, 1), (32, 1, 1), 0, "grid dimension x is 0"),
    ((1, 1), (32, 1, 1), 0, "3 integers"),
    ((1, 1, 1), (32, 1, 1), 64 << 10, r"call set_max_dynamic_shared\(65536\)"),
    ((1, 1, 1), (32, 1, 1), 300 << 10, "exceed this GPU's 232448 bytes per block"),
])
def test_launches_over_the_gpu_limits_are_refused(grid, block, shared, match):
    with pytest.raises(ValueError, match=match):
        H100.check(grid, block, shared)


def test_launch_passes_dims_stream_and_parameters(fake):
    f = driver.Function(0x55, "k", limits=H100)
    f.set_max_dynamic_shared(100 << 10)
    f.launch((3, 2, 1), (128, 1, 1), [0x1000, 7], ["ptr", "i64"], shared_bytes=64 << 10, stream=0xABC)
    assert fake.launched == (3, 2, 1, 128, 1, 1, 64 << 10, 0xABC, [0x1000, 7])
    f.launch(np.array([5, 1, 1]), (np.int32(64), 1, 1), [0x1000, np.int64(8)], ["ptr", "i64"])  # numpy integers
    assert fake.launched == (5, 1, 1, 64, 1, 1, 0, None, [0x1000, 8])
    with pytest.raises(ValueError, match="allows 0 to 232448 bytes"):
        f.set_max_dynamic_shared(1 << 20)
    fake.fail["cuLaunchKernel"] = 700
    with pytest.raises(driver.CudaError, match=r"cuLaunchKernel.*ILLEGAL_ADDRESS.*launching k with grid \(3, 2, 1\)"):
        f.launch((3, 2, 1), (128, 1, 1), [0x1000, 7], ["ptr", "i64"])


def test_device_array_interface_over_a_fake_allocation(fake):
    d = memory.empty((3, 5), np.float32)
    assert d.__cuda_array_interface__ == {"shape": (3, 5), "typestr": "<f4", "data": (d.ptr, False), "strides": None,
                                          "version": 3, "stream": 1}
    assert (len(d), d.size, d.ndim, d.nbytes, d.strides) == (3, 15, 2, 60, (20, 4))
    assert repr(d) == "DeviceArray(shape=(3, 5), dtype=float32, device='cuda')"
    assert memory.as_device_array(d) is d and driver.device_pointer(d) == d.ptr
    with pytest.raises(TypeError, match=r"call \.get\(\)"):
        np.asarray(d)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint16", "int64", "bool", "float16"])
@pytest.mark.parametrize("shape", [(), (1,), (7,), (13, 17), (2, 0, 3)])
def test_round_trip_through_fake_memory(fake, dtype, shape):
    a = (np.arange(int(np.prod(shape))) % 5).reshape(shape).astype(dtype)
    d = memory.to_device(a)
    assert d.shape == a.shape and d.dtype == a.dtype
    got = d.get()
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, a)
    ptr = d.ptr
    del d
    gc.collect()
    assert fake.freed == []  # a collected array's block goes to the pool
    if a.size:
        again = memory.empty(a.shape, a.dtype)
        assert again.ptr == ptr  # and the next array of its size reuses it
        del again
        gc.collect()
    memory.POOL.drain()
    assert fake.freed == ([ptr] if a.size else [])


def test_zero_size_arrays_never_touch_the_driver(fake):
    d = memory.empty((0, 3), np.float32)
    d.copy_from_host(np.zeros((0, 3), np.float32))
    assert d.ptr == 0 and d.get().shape == (0, 3) and d.__cuda_array_interface__["data"] == (0, False)
    assert memory.zeros(0, np.int32).size == 0
    assert fake.calls == []


def test_copies_check_shape_and_dtype_and_accept_any_layout(fake):
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    d = memory.to_device(a[:, ::2])  # non-contiguous input is made contiguous first
    np.testing.assert_array_equal(d.get(), a[:, ::2])
    d.copy_from_host(a[:, 1::2])
    np.testing.assert_array_equal(d.get(), a[:, 1::2])
    with pytest.raises(ValueError, match=r"expected an array of shape \(4, 3\) and dtype float32, got shape \(3, 4\)"):
        d.copy_from_host(np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match="dtype float32, got shape .* and dtype float64"):
        d.copy_from_host(np.zeros((4, 3)))
    assert memory.to_device([1, 2], dtype=np.int16).dtype == np.int16


def test_as_device_array_views_cuda_array_interface_exporters(fake):
    owner = FakeCudaArray((4, 3))
    view = memory.as_device_array(owner)
    assert (view.shape, view.dtype, view.ptr, view.owner) == ((4, 3), np.float32, 0x7F0000000000, owner)
    assert memory.as_device_array(FakeCudaArray((4, 3), strides=(12, 4))).shape == (4, 3)  # C strides, spelled out
    assert memory.as_device_array(FakeCudaArray((4, 1), strides=(4, 999))).shape == (4, 1)  # extent 1: any stride
    assert memory.as_device_array(FakeCudaArray((0, 3), strides=(4, 8), ptr=0)).ptr == 0
    assert memory.as_device_array(np.zeros(3)) is None and memory.as_device_array([1.0]) is None
    with pytest.raises(ValueError, match=r"strides \(4, 16\).*C-contiguous data \(strides \(12, 4\)\)"):
        memory.as_device_array(FakeCudaArray((4, 3), strides=(4, 16)))
    with pytest.raises(ValueError, match="mask"):
        memory.as_device_array(FakeCudaArray((2,), mask=FakeCudaArray((2,), "|b1")))
    with pytest.raises(ValueError, match="stream 0"):
        memory.as_device_array(FakeCudaArray((2,), stream=0))
    assert fake.calls == []
    memory.as_device_array(FakeCudaArray((2,), stream=0x5000))  # the producer's stream is waited for
    assert [(name, args[0].value) for name, args in fake.calls if name == "cuStreamSynchronize"] == [
        ("cuStreamSynchronize", 0x5000)]


def test_dlpack_capsules_are_read_with_the_right_layout():
    a = np.arange(12, dtype=np.int16).reshape(3, 4)
    ptr, device, shape, dtype, strides = memory.read_dlpack_capsule(a.__dlpack__())
    assert (ptr, device, shape, dtype) == (a.ctypes.data, (1, 0), (3, 4), np.int16)
    assert strides in (None, (8, 2))
    ptr, _, shape, _, strides = memory.read_dlpack_capsule(a[1:, ::2].__dlpack__())
    assert (ptr, shape, strides) == (a[1:].ctypes.data, (2, 2), (8, 4))
    with pytest.raises(ValueError, match=r"DLPack device \(1, 0\), not a CUDA GPU"):
        memory.from_dlpack(a)


def test_a_consumed_dlpack_capsule_is_released_with_its_view():
    a = np.arange(5.0)
    before = sys.getrefcount(a)
    capsule = a.__dlpack__()
    view = memory._consume(capsule, memory.DeviceArray((5,), np.float64, a.ctypes.data))
    del capsule
    gc.collect()
    assert sys.getrefcount(a) > before  # the DLPack tensor still holds the array
    del view
    gc.collect()
    assert sys.getrefcount(a) == before


def test_a_device_array_exports_dlpack_in_place_until_its_consumer_is_done(fake):
    d = memory.to_device(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert d.__dlpack_device__() == (2, 0)
    assert memory.read_dlpack_capsule(d.__dlpack__()) == (d.ptr, (2, 0), (2, 3), np.float32, None)
    gc.collect()
    assert not memory._exported  # a capsule no consumer took released its tensor
    view, ptr = memory.from_dlpack(d), d.ptr
    assert (view.ptr, view.shape, view.dtype) == (ptr, (2, 3), np.float32)
    del d
    gc.collect()
    assert len(memory._exported) == 1 and ptr not in fake.freed  # the consumer's view holds the memory
    np.testing.assert_array_equal(view.get(), np.arange(6).reshape(2, 3))
    del view
    gc.collect()
    assert not memory._exported
    kept = memory.to_device(np.ones(3, np.float32))
    capsule, ptr = kept.__dlpack__(), kept.ptr
    del kept
    gc.collect()
    assert memory.empty((3,), np.float32).ptr != ptr  # the capsule holds the memory: not back in the pool
    del capsule
    gc.collect()
    assert memory.empty((3,), np.float32).ptr == ptr  # released with it
    for dtype in (np.bool_, np.int8, np.uint64, np.float16, np.float64):
        a = memory.empty((0, 3), dtype)
        assert memory.read_dlpack_capsule(a.__dlpack__())[2:4] == ((0, 3), np.dtype(dtype))


def test_dlpack_export_waits_for_another_stream_and_refuses_what_it_cannot_give(fake):
    d = memory.to_device(np.ones(4, np.float32))
    d.__dlpack__(stream=1)
    assert "cuCtxSynchronize" not in fake.names()  # the legacy default stream: jitop's own, ordered already
    d.__dlpack__(stream=0x7000)
    assert "cuCtxSynchronize" in fake.names()
    with pytest.raises(BufferError, match=r"device \(2, 0\), not \(1, 0\)"):
        d.__dlpack__(dl_device=(1, 0))
    with pytest.raises(BufferError, match="in place only"):
        d.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="complex64 has no DLPack code"):
        memory.empty((2,), np.complex64).__dlpack__()


def test_events_time_through_the_driver(fake):
    start, end = driver.Event.create(), driver.Event.create()
    start.record()
    end.record(driver.Stream.create())
    assert driver.Event.elapsed_ms(start, end) == 0.0
    assert {"cuEventCreate", "cuEventRecord", "cuEventSynchronize", "cuStreamCreate"} <= set(fake.names())


# ** on a GPU **
PTX = """.version {version}
.target {arch}
.address_size 64

.visible .global .align 4 .s32 jitop_flag;

// out[i] = a[i] * alpha + b[i] for i < n
.visible .entry scaled_add(.param .u64 a, .param .u64 b, .param .u64 out, .param .f32 alpha, .param .u64 n)
{{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<12>;
    .reg .f32 %f<5>;
    ld.param.u64 %rd1, [a];
    ld.param.u64 %rd2, [b];
    ld.param.u64 %rd3, [out];
    ld.param.f32 %f4, [alpha];
    ld.param.u64 %rd4, [n];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mul.wide.u32 %rd5, %r1, %r2;
    cvt.u64.u32 %rd6, %r3;
    add.u64 %rd5, %rd5, %rd6;
    setp.ge.u64 %p1, %rd5, %rd4;
    @%p1 bra DONE;
    shl.b64 %rd7, %rd5, 2;
    cvta.to.global.u64 %rd8, %rd1;
    add.u64 %rd8, %rd8, %rd7;
    cvta.to.global.u64 %rd9, %rd2;
    add.u64 %rd9, %rd9, %rd7;
    cvta.to.global.u64 %rd10, %rd3;
    add.u64 %rd10, %rd10, %rd7;
    ld.global.f32 %f1, [%rd8];
    ld.global.f32 %f2, [%rd9];
    fma.rn.f32 %f3, %f1, %f4, %f2;
    st.global.f32 [%rd10], %f3;
DONE:
    ret;
}}

// out32[0] = v; out64[0] = x (checks i32 and f64 parameters)
.visible .entry store_scalars(.param .u64 out32, .param .u64 out64, .param .s32 v, .param .f64 x)
{{
    .reg .b32 %r<2>;
    .reg .b64 %rd<5>;
    .reg .f64 %fd<2>;
    ld.param.u64 %rd1, [out32];
    ld.param.u64 %rd2, [out64];
    ld.param.s32 %r1, [v];
    ld.param.f64 %fd1, [x];
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    st.global.s32 [%rd3], %r1;
    st.global.f64 [%rd4], %fd1;
    ret;
}}
"""
_PTX_VERSION = {"sm_100": "8.6", "sm_101": "8.6", "sm_120": "8.7"}  # sm_70 .. sm_90 all take PTX 8.0


def _ptx() -> str:
    arch = driver.device_attributes()["arch"]
    return PTX.format(version=_PTX_VERSION.get(arch, "8.0"), arch=arch)


@pytest.fixture(scope="module")
def kernels():
    return driver.Module.load(driver.link_ptx(_ptx()))


def _scaled_add(module, n, stream=None):
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    da, db, out = memory.to_device(a), memory.to_device(b), memory.empty(n, np.float32)
    module.function("scaled_add").launch(((n + 255) // 256, 1, 1), (256, 1, 1), [da, db, out, 0.5, n],
                                         ["ptr", "ptr", "ptr", "f32", "i64"], stream=stream)
    return out, a * np.float32(0.5) + b


@requires_gpu
def test_gpu_attributes():
    attrs = driver.device_attributes()
    assert attrs["arch"].startswith("sm_") and attrs["sm_count"] > 0 and attrs["warp_size"] == 32
    assert attrs["max_threads_per_block"] >= 1024 and attrs["shared_per_block_optin"] >= attrs["shared_per_block"]
    assert 0 < driver.mem_get_info()[0] <= attrs["total_memory"] and driver.driver_version() >= 12000


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint16", "int32", "int64", "bool", "float16"])
@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (13, 17), (2, 0, 3), (1009,), (3, 5, 257)])
def test_gpu_round_trip(dtype, shape):
    a = (np.arange(int(np.prod(shape))) % 7).reshape(shape).astype(dtype)
    np.testing.assert_array_equal(memory.to_device(a).get(), a)
    np.testing.assert_array_equal(memory.zeros(shape, dtype).get(), np.zeros(shape, dtype))


@requires_gpu
@pytest.mark.parametrize("n", [1, 255, 256, 1000, 100_003])
def test_gpu_linked_kernel_matches_numpy(kernels, n):
    out, expected = _scaled_add(kernels, n)
    np.testing.assert_allclose(out.get(), expected, rtol=1e-6, atol=1e-6)


@requires_gpu
def test_gpu_ptx_text_loads_and_scalars_pass(kernels):
    module = driver.Module.load(_ptx().encode())
    out32, out64 = memory.zeros(1, np.int32), memory.zeros(1, np.float64)
    module.function("store_scalars").launch((1, 1, 1), (1, 1, 1), [out32, out64, -7, 0.1], ["ptr", "ptr", "i32", "f64"])
    assert out32.get()[0] == -7 and out64.get()[0] == 0.1
    assert kernels.read_global_i32("jitop_flag") == 0
    kernels.write_global_i32("jitop_flag", 3)
    assert kernels.read_global_i32("jitop_flag") == 3
    kernels.write_global_i32("jitop_flag", 0)


@requires_gpu
def test_gpu_events_streams_and_threads(kernels):
    stream = driver.Stream.create()
    start, end = driver.Event.create(), driver.Event.create()
    start.record(stream)
    out, expected = _scaled_add(kernels, 1 << 22, stream=stream)
    end.record(stream)
    assert driver.Event.elapsed_ms(start, end) > 0
    stream.synchronize()
    np.testing.assert_allclose(out.get(), expected, rtol=1e-6, atol=1e-6)
    results = []
    worker = threading.Thread(target=lambda: results.append(_scaled_add(kernels, 999)))
    worker.start()
    worker.join()
    np.testing.assert_allclose(results[0][0].get(), results[0][1], rtol=1e-6, atol=1e-6)
    driver.synchronize()


@requires_gpu
def test_gpu_errors_are_python_exceptions(kernels):
    f = kernels.function("scaled_add")
    with pytest.raises(ValueError, match="block of 2048 threads"):
        f.launch((1, 1, 1), (2048, 1, 1), [0, 0, 0, 1.0, 0], ["ptr", "ptr", "ptr", "f32", "i64"])
    with pytest.raises(driver.CudaError, match="(?s)CUDA_ERROR_INVALID_PTX.*JIT log") as info:
        driver.link_ptx(f".version 8.0\n.target {driver.device_attributes()['arch']}\n.address_size 64\nbogus;\n")
    assert info.value.call in ("cuLinkAddData_v2", "cuLinkComplete")
    with pytest.raises(driver.CudaError, match="CUDA_ERROR_NOT_FOUND.*'missing'"):
        kernels.function("missing")
    with pytest.raises(driver.CudaError, match="CUDA_ERROR_OUT_OF_MEMORY.*asked for 1125899906842624 bytes"):
        memory.empty(1 << 50, np.uint8)
    np.testing.assert_array_equal(memory.to_device(np.arange(3)).get(), np.arange(3))  # the context survived


@requires_gpu
def test_gpu_torch_interop(kernels):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    a, b = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    out = torch.empty(1000, device="cuda")
    args = [memory.as_device_array(a), memory.from_dlpack(b), out]
    kernels.function("scaled_add").launch((4, 1, 1), (256, 1, 1), [*args, 2.0, 1000], ["ptr", "ptr", "ptr", "f32", "i64"])
    torch.cuda.synchronize()
    np.testing.assert_allclose(out.cpu().numpy(), (a * 2 + b).cpu().numpy(), rtol=1e-6, atol=1e-6)
    mine = memory.to_device(np.arange(6, dtype=np.float32).reshape(2, 3))
    for seen in (torch.from_dlpack(mine), torch.as_tensor(mine, device="cuda")):  # DLPack, then the CAI
        assert seen.data_ptr() == mine.ptr
        np.testing.assert_array_equal(seen.cpu().numpy(), mine.get())
    d = memory.to_device(np.arange(12, dtype=np.float32).reshape(3, 4))
    np.testing.assert_array_equal(torch.as_tensor(d, device="cuda").cpu().numpy(), d.get())  # ours, read by torch
    with pytest.raises(ValueError, match="C-contiguous"):
        memory.as_device_array(torch.zeros(4, 4, device="cuda").t())


def test_pool_keeps_blocks_up_to_its_limit(fake, monkeypatch):
    monkeypatch.setattr(memory, "POOL", memory.BlockPool(limit=1024))
    a, b = memory.empty(100, np.float32), memory.empty(100, np.float32)  # 400 bytes: 512-byte blocks
    pa, pb = a.ptr, b.ptr
    c = memory.empty(300, np.float32)  # 1200 bytes: a 1536-byte block, over the limit once pooled
    pc = c.ptr
    del a, b, c
    gc.collect()
    assert fake.freed == [pc] and memory.POOL.held == 1024
    again = [memory.empty(128, np.float32), memory.empty(101, np.float32)]  # both held: two blocks
    assert {x.ptr for x in again} == {pa, pb}


def test_an_array_growing_a_row_per_call_reuses_its_predecessors_blocks(fake):
    """A decode loop's cache, one 768-float row longer per call, its predecessor collected after each: an exact
    size per block made every call allocate (and the pool fill with blocks no later call could take)."""
    cache = memory.empty((16, 768), np.float32)
    for rows in range(17, 517):
        cache = memory.empty((rows, 768), np.float32)
    gc.collect()
    allocated = [args[0] for name, args in fake.calls if name == "cuMemAlloc_v2"]
    classes = {memory.BlockPool.rounded(rows * 768 * 4) for rows in range(16, 517)}
    assert len(allocated) <= 2 * len(classes) < 100  # two blocks per class at most: the array and its predecessor
    assert all(rows * 768 * 4 <= memory.BlockPool.rounded(rows * 768 * 4) <= rows * 768 * 4 * 9 / 8
               for rows in range(1, 517))
    assert fake.freed == []


def test_a_full_pool_frees_the_blocks_given_back_longest_ago(fake, monkeypatch):
    monkeypatch.setattr(memory, "POOL", memory.BlockPool(limit=2048))
    arrays = [memory.empty(128 * (k + 1), np.float32) for k in range(3)]  # 512, 1024, 1536 bytes
    ptrs = [a.ptr for a in arrays]
    for k in range(3):
        arrays[k] = None  # given back in order: the third overflows the pool
        gc.collect()
    assert fake.freed == [ptrs[0], ptrs[1]] and memory.POOL.held == 1536
    assert memory.empty(384, np.float32).ptr == ptrs[2]  # of the third's class; given back again when collected
    memory.POOL.drain()
    assert fake.freed == ptrs and memory.POOL.held == 0


def test_memory_info_counts_live_and_pooled_blocks_and_empty_cache_frees_the_pooled(fake):
    import jitop
    a, b = memory.empty(100, np.float32), memory.empty(300, np.float32)  # 512- and 1536-byte blocks
    view = a[10:20]  # a view holds its base's block, not one of its own
    assert jitop.cuda.memory_info() == {"in_use": 2048, "pooled": 0, "pool_limit": 1 << 30}
    pb = b.ptr
    del b
    gc.collect()
    assert jitop.cuda.memory_info()["in_use"] == 512 and jitop.cuda.memory_info()["pooled"] == 1536
    jitop.cuda.empty_cache()
    assert fake.freed == [pb] and jitop.cuda.memory_info() == {"in_use": 512, "pooled": 0, "pool_limit": 1 << 30}
    del a, view
    gc.collect()
    assert jitop.cuda.memory_info()["in_use"] == 0 and jitop.cuda.memory_info()["pooled"] == 512


def test_a_lower_pool_limit_frees_the_oldest_blocks_now_and_zero_keeps_none(fake):
    import jitop
    arrays = [memory.empty(128 * (k + 1), np.float32) for k in range(3)]  # 512, 1024, 1536 bytes
    ptrs = [x.ptr for x in arrays]
    for k in range(3):
        arrays[k] = None  # given back in order
    gc.collect()
    jitop.cuda.set_pool_limit(2000)
    assert fake.freed == ptrs[:2] and jitop.cuda.memory_info()["pooled"] == 1536
    jitop.cuda.set_pool_limit(0)
    c = memory.empty(10, np.float32)
    pc = c.ptr
    del c
    gc.collect()
    assert fake.freed == [*ptrs, pc] and jitop.cuda.memory_info() == {"in_use": 0, "pooled": 0, "pool_limit": 0}
    with pytest.raises(ValueError, match="number of bytes >= 0"):
        jitop.cuda.set_pool_limit(-1)


def test_the_pool_limit_comes_from_the_environment_and_a_bad_value_is_ignored_with_a_warning(monkeypatch):
    from jitop import config
    monkeypatch.setenv("JITOP_CUDA_POOL_LIMIT", "256MB")
    assert config.cuda_pool_limit() == 256 << 20
    monkeypatch.setenv("JITOP_CUDA_POOL_LIMIT", "lots")
    with pytest.warns(RuntimeWarning, match="JITOP_CUDA_POOL_LIMIT='lots' must be a size"):
        assert config.cuda_pool_limit() == 1 << 30
    script = "import jitop.runtime.cuda.memory as m; print(m.POOL.limit)"
    env = {**os.environ, "JITOP_CUDA_POOL_LIMIT": "0"}
    assert subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "0"


def test_a_block_given_back_while_its_thread_holds_the_pool_s_lock_does_not_deadlock(fake):
    """A garbage collection can run inside the pool's locked regions (any allocation may start one) and collect
    a device array there, whose block comes back to the same pool from the same thread."""
    arrays = [memory.empty(100, np.float32)]
    done = threading.Event()

    def collect_under_the_lock():
        with memory.POOL.lock:
            arrays.clear()  # the array's last reference: collected here
        done.set()
    worker = threading.Thread(target=collect_under_the_lock, daemon=True)
    worker.start()
    worker.join(10)
    assert done.is_set() and memory.POOL.held == 512


def test_an_array_kept_until_exit_is_collected_quietly(tmp_path):
    """A device array in a module's global is collected at interpreter exit, after that module's globals were set
    to None: its block's return to the pool printed "Exception ignored ... 'NoneType' object has no attribute
    'is_finalizing'" on every such program's exit."""
    script = tmp_path / "kept.py"
    script.write_text("import numpy as np\nfrom fake_driver import FakeDriver\nfrom jitop.runtime.cuda import driver\n"
                      "fake = FakeDriver()\ndriver.lib = lambda: fake\nimport jitop\n"
                      "kept = jitop.cuda.to_device(np.ones(10, np.float32))\n")
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
