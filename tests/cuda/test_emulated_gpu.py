"""The code the NVPTX back end emitted, run on this CPU by the emulated GPU (tests/emulated_gpu.py: one OS thread
per GPU thread, NVVM intrinsics as small runtime functions) against numpy.

The simulated GPU (tests/sim_gpu.py) runs the loop IR the emitter receives; this runs what it made of it, and so
checks what nothing else here can without a GPU: the tensor cores' register fragments and operand rounding (the
simulator refuses an mma), the kernels' own bounds checks and the error flag the runtime reads after them, warp
shuffles as the emitted code addresses them, and a split build's modules linked. The whole GPU suite runs this
way with JITOP_TEST_GPU=emulated; here is a cross-section of it, and the emulator's own parts.
"""
from __future__ import annotations

import ctypes
import os
import random

import numpy as np
import pytest

import emulated_gpu
import gpu_cases
import jitop
import nvvm_emulator
from jitop import te
from jitop.codegen import mma, nvptx
from jitop.topi import cuda, cuda_mma
from jitop.topi.cuda_templates import CudaConv2dWorkload, CudaMatmulWorkload
from jitop.tuner._measure_worker import _compare
from jitop.tuner.task import Task

import test_gpu_dynamic_shapes
import test_gpu_graph_conv
import test_gpu_graph_matmul
import test_gpu_sim
import test_gpu_rows
import test_gpu_run
import test_ptx_shares
from test_ptx_shares import forking  # noqa: F401  (a fixture of the split build's test)


EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture(autouse=True)
def gpu(monkeypatch):
    """The emulated GPU, for these tests and for those that ask `sim_gpu.gpu_or_simulated` for one."""
    monkeypatch.setenv("JITOP_TEST_GPU", "emulated")
    return emulated_gpu.install(monkeypatch)


def _tc_matmul(mode: str, m: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(result, numpy's product in float64, the product of the operands rounded to the mode's type)."""
    target = jitop.driver.cuda_target()
    A, B = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
    C = cuda.matmul(A, B, tc=mode)
    f = jitop.build(cuda.schedule_matmul(C, {"tc": mode}, target), [A, B, C], target=target)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    c = np.full((m, n), np.nan, np.float32)
    f(a, b, c)
    exact = mma.round_operand(a, mode).astype(np.float64) @ mma.round_operand(b, mode)
    return c, a.astype(np.float64) @ b, exact


@pytest.mark.parametrize("mode,sizes", [("tf32", (127, 61, 253)), ("bf16", (127, 61, 253)), ("bf16", (1, 300, 77))],
                         ids=str)
def test_the_tensor_core_matmul_equals_numpy(mode, sizes, gpu) -> None:
    c, ref, exact = _tc_matmul(mode, *sizes)
    assert _compare([c], [ref.astype(np.float32)], cuda_mma.tc_tolerance(mode, sizes[2])) == ""
    # the operands rounded as the emitted code rounds them: what is left is the float32 sums' rounding
    assert _compare([c], [exact.astype(np.float32)], (1e-4, 1e-4)) == ""
    assert gpu.launched


def test_bf16_halves_packed_the_wrong_way_round_are_caught(monkeypatch) -> None:
    # the emulator multiplies the fragments the PTX ISA's way: registers packed (hi, lo) instead give other sums
    pack = nvptx.pack_bf16x2
    monkeypatch.setattr(nvptx, "pack_bf16x2", lambda b, lo, hi: pack(b, hi, lo))
    c, _, exact = _tc_matmul("bf16", 16, 8, 16)
    assert _compare([c], [exact.astype(np.float32)], (1e-4, 1e-4)) != ""


def test_an_out_of_bounds_gather_raises_from_the_kernels_own_check_and_touches_nothing() -> None:
    s, tensors, ref = gpu_cases.gather(100, 37)
    f = jitop.build(s, tensors, target="cuda")
    x, idx = np.random.default_rng(0).standard_normal(100).astype(np.float32), np.arange(37, dtype=np.int64)
    np.testing.assert_array_equal(f(x, idx), ref(x, idx))
    idx[5] = 100
    out = np.full(37, -1.0, np.float32)
    with pytest.raises(IndexError, match=r"read of X\[.*\] with shape \(100,\)"):
        f(x, idx, out)
    assert out[5] == -1.0  # the failed read stored nothing
    idx[5] = 3
    np.testing.assert_array_equal(f(x, idx), ref(x, idx))  # the runtime reset the flag


# ** the emulator's own parts **

# the rounding intrinsics as emitted code calls them (a <2 x bfloat> comes back in a vector register: bitcast)
_ROUNDINGS = nvvm_emulator.Program("""
define i32 @"tf32"(float %x) {
  %r = call i32 @"llvm.nvvm.f2tf32.rna"(float %x)
  ret i32 %r
}
define i32 @"bf16x2"(float %hi, float %lo) {
  %v = call <2 x bfloat> @"llvm.nvvm.ff2bf16x2.rn"(float %hi, float %lo)
  %r = bitcast <2 x bfloat> %v to i32
  ret i32 %r
}
declare i32 @"llvm.nvvm.f2tf32.rna"(float)
declare <2 x bfloat> @"llvm.nvvm.ff2bf16x2.rn"(float, float)
""", [])


def _rounding(name: str, *argtypes):
    return ctypes.CFUNCTYPE(ctypes.c_uint32, *argtypes)(_ROUNDINGS.engine.get_function_address(name))


def _special_floats(n: int) -> np.ndarray:
    """float32 values around the rounding ties of TF32 and BF16, with signs, infinities, NaN and subnormals."""
    bits = np.random.default_rng(1).integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    bits[: n // 2] = (bits[: n // 2] & ~np.uint32(0xFFFF)) | np.uint32(0x8000)  # BF16 ties
    bits[n // 2: n // 2 + 64] = (bits[n // 2: n // 2 + 64] & ~np.uint32(0x1FFF)) | np.uint32(0x1000)  # TF32 ties
    bits = bits[~np.isnan(bits.view(np.float32))]  # (ctypes passes a float through a double: it quiets a NaN)
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, 3.4e38], np.float32).view(np.uint32)
    return np.concatenate([bits, special]).view(np.float32)


def test_the_emulated_roundings_are_the_numpy_models_of_cvt() -> None:
    tf32, bf16x2 = _rounding("tf32", ctypes.c_float), _rounding("bf16x2", ctypes.c_float, ctypes.c_float)
    x = _special_floats(4000)
    got = np.array([tf32(float(v)) for v in x], np.uint32)
    np.testing.assert_array_equal(got, mma.to_tf32(x).view(np.uint32))
    pairs = [bf16x2(float(hi), float(lo)) for hi, lo in zip(x, x[::-1])]
    hi = mma.to_bf16(x).view(np.uint32) >> 16
    lo = mma.to_bf16(x[::-1]).view(np.uint32) >> 16
    np.testing.assert_array_equal(np.array(pairs, np.uint32), (hi << 16) | lo)


# each thread: shared[tid] = tid; barrier; out[block, tid] = shared[ntid - 1 - tid] * 1000 + shfl_bfly(tid, offset)
_THREADS_KERNEL = """
@"tile" = internal addrspace(3) global [64 x i32] undef, align 16
define ptx_kernel void @"k"(ptr addrspace(1) %out, i64 %offset) {
entry:
  %t = call i32 @"llvm.nvvm.read.ptx.sreg.tid.x"()
  %b = call i32 @"llvm.nvvm.read.ptx.sreg.ctaid.x"()
  %n = call i32 @"llvm.nvvm.read.ptx.sreg.ntid.x"()
  %mine = getelementptr [64 x i32], ptr addrspace(3) @"tile", i32 0, i32 %t
  store i32 %t, ptr addrspace(3) %mine
  call void @"llvm.nvvm.barrier0"()
  %r = sub i32 %n, 1
  %u = sub i32 %r, %t
  %theirs = getelementptr [64 x i32], ptr addrspace(3) @"tile", i32 0, i32 %u
  %read = load i32, ptr addrspace(3) %theirs
  %o = trunc i64 %offset to i32
  %v = call i32 @"llvm.nvvm.shfl.sync.bfly.i32"(i32 -1, i32 %t, i32 %o, i32 31)
  %scaled = mul i32 %read, 1000
  %value = add i32 %scaled, %v
  %row = mul i32 %b, %n
  %at = add i32 %row, %t
  %p = getelementptr i32, ptr addrspace(1) %out, i32 %at
  store i32 %value, ptr addrspace(1) %p
  ret void
}
declare i32 @"llvm.nvvm.read.ptx.sreg.tid.x"()
declare i32 @"llvm.nvvm.read.ptx.sreg.ctaid.x"()
declare i32 @"llvm.nvvm.read.ptx.sreg.ntid.x"()
declare void @"llvm.nvvm.barrier0"()
declare i32 @"llvm.nvvm.shfl.sync.bfly.i32"(i32, i32, i32, i32)
"""


@pytest.mark.parametrize("blocks,threads,offset", [(3, 64, 1), (2, 32, 16), (1, 64, 5)])
def test_threads_barriers_and_shuffles_of_a_handwritten_kernel(blocks, threads, offset) -> None:
    program = nvvm_emulator.Program(_THREADS_KERNEL, ["k"])
    out = np.full((blocks, threads), -1, np.int32)
    values = (ctypes.c_uint64 * 2)(out.ctypes.data, offset)
    params = (ctypes.c_void_p * 2)(ctypes.addressof(values), ctypes.addressof(values) + 8)
    program.launch("k", (blocks, 1, 1), (threads, 1, 1), ctypes.addressof(params))
    t = np.arange(threads)
    want = (threads - 1 - t) * 1000 + (t ^ offset)
    np.testing.assert_array_equal(out, np.broadcast_to(want, out.shape))
    program.launch("k", (0, 1, 1), (threads, 1, 1), ctypes.addressof(params))  # no blocks: nothing runs
    np.testing.assert_array_equal(out, np.broadcast_to(want, out.shape))


# ** programs of the GPU suite, run on the emulated GPU (the fixture above makes it theirs) **

@pytest.mark.parametrize("m,n,threads", [(5, 300, 128), (3, 17, 16), (2, 5000, 1024)])
def test_cross_thread_sums(m, n, threads) -> None:
    test_gpu_run.test_cross_thread_sum(m, n, threads)


@pytest.mark.parametrize("m,n,k", [(37, 53, 19), (130, 1, 5)])
def test_shared_memory_matmul_tiles(m, n, k) -> None:
    test_gpu_run.test_matmul_shared_tiles(m, n, k)


@pytest.mark.parametrize("n", [0, 255, 100_003])
def test_a_symbolic_size(n) -> None:
    test_gpu_run.test_symbolic_size_serves_every_n(n)


@pytest.mark.parametrize("fn", [test_gpu_rows.layer_norm, test_gpu_rows.softmax], ids=lambda f: f.__name__)
@pytest.mark.parametrize("shape", [(9, 129), (1, 1), (4, 2049)], ids=str)
def test_a_row_operator(fn, shape, monkeypatch) -> None:
    test_gpu_rows.test_a_row_operator_is_one_kernel_equal_to_numpy(fn, shape, monkeypatch)


@pytest.mark.parametrize("m,k,n", [(129, 7, 131), (50, 40, 1)], ids=str)
def test_the_double_buffered_sgemm(m, k, n, monkeypatch) -> None:
    test_gpu_graph_matmul.test_the_sgemm_equals_numpy(m, k, n, monkeypatch)


def test_a_convolution_with_its_epilogue() -> None:
    test_gpu_graph_conv.test_bias_relu_and_a_residual_run_on_the_convolutions_register_tile()


@pytest.mark.parametrize("fn, shape", [(test_gpu_dynamic_shapes.softmax, (None, 33)),
                                       (test_gpu_dynamic_shapes.mlp, (6, None))], ids=["softmax-rows", "mlp-k"])
def test_a_dim_that_varies(fn, shape, monkeypatch) -> None:
    test_gpu_dynamic_shapes.test_a_dim_that_varies_becomes_symbolic_and_later_sizes_trace_nothing(fn, shape,
                                                                                                   monkeypatch)


def test_a_split_build(forking, monkeypatch) -> None:
    test_ptx_shares.test_a_traced_function_built_by_several_processes_runs_to_numpy_s_results(forking, monkeypatch)


# ** points of the GPU tuning spaces: what a tuner on a GPU would try, each run against numpy **

def _sampled(task: Task, count: int, **fixed) -> list:
    """`count` points (JITOP_EMULATED_POINTS, if set) of the task's space with the `fixed` knob values, spread
    deterministically."""
    points = [c for c in task.config_space() if all(c[k] == v for k, v in fixed.items())]
    count = int(os.environ.get("JITOP_EMULATED_POINTS", count))
    return random.Random(task.key).sample(points, min(count, len(points)))


@pytest.mark.parametrize("precision", ["float32", "tf32", "bf16"])
def test_sampled_matmul_points_equal_numpy(precision) -> None:
    wl = CudaMatmulWorkload(100, 70, 33, precision=precision)
    task = Task("cuda.matmul", wl, jitop.driver.cuda_target())
    fixed = {} if precision == "float32" else {"tc": precision}
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((100, 33), np.float32), rng.standard_normal((33, 70), np.float32)
    for config in _sampled(task, 2, **fixed):
        s, tensors = task.build(config)
        c = np.full((100, 70), np.nan, np.float32)
        jitop.build(s, tensors, target=task.target)(a, b, c)
        if precision == "float32":
            test_gpu_sim.assert_gemm(c, a, b)
        else:  # the products of the rounded operands are exact: what is left is the float32 sum's rounding
            test_gpu_sim.assert_gemm(c, mma.round_operand(a, precision), mma.round_operand(b, precision))


def test_sampled_conv2d_points_equal_numpy() -> None:
    wl = CudaConv2dWorkload(1, 8, 10, 10, 16, 3, 3, padding=(1, 1))
    task = Task("cuda.conv2d", wl, jitop.driver.cuda_target())
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((1, 8, 10, 10), np.float32), rng.standard_normal((16, 8, 3, 3), np.float32)
    exact, mag = test_gpu_sim.conv2d_exact(x, w, 1, 1)
    for config in _sampled(task, 2):
        s, tensors = task.build(config)
        y = np.full(exact.shape, np.nan, np.float32)
        jitop.build(s, tensors, target=task.target)(x, w, y)
        test_gpu_sim.assert_within(y, exact, 8 * 9 * EPS32 * mag)


_PAST_THE_END = """
define ptx_kernel void @"store_at"(ptr addrspace(1) %out, i64 %at) {
  %p = getelementptr i32, ptr addrspace(1) %out, i64 %at
  store i32 7, ptr addrspace(1) %p
  ret void
}
"""


@pytest.mark.parametrize("at,fails", [(15, False), (16, True), (-1, True)])
def test_a_write_outside_an_allocation_fails_as_an_illegal_address(at, fails) -> None:
    fake = emulated_gpu.EmulatedGpu()
    out, handle = ctypes.c_uint64(), ctypes.c_uint64()
    fake.cuMemAlloc_v2(ctypes.byref(out), 64)  # 16 int32
    fake.programs["store_at"] = nvvm_emulator.Program(_PAST_THE_END, ["store_at"])
    fake.cuModuleGetFunction(ctypes.byref(handle), None, b"store_at")
    values = (ctypes.c_int64 * 2)(out.value, at)
    params = (ctypes.c_void_p * 2)(ctypes.addressof(values), ctypes.addressof(values) + 8)
    rc = fake.cuLaunchKernel(handle.value, 1, 1, 1, 1, 1, 1, 0, None, params, None)
    assert rc == (emulated_gpu.ILLEGAL_ADDRESS if fails else 0)
    assert fake.overruns == ([("store_at", out.value, 64)] if fails else [])


_DIVERGENT_BARRIER = """
define ptx_kernel void @"divergent"() {
entry:
  %t = call i32 @"llvm.nvvm.read.ptx.sreg.tid.x"()
  %first = icmp eq i32 %t, 0
  br i1 %first, label %wait, label %done
wait:
  call void @"llvm.nvvm.barrier0"()
  br label %done
done:
  ret void
}
declare i32 @"llvm.nvvm.read.ptx.sreg.tid.x"()
declare void @"llvm.nvvm.barrier0"()
"""


def test_a_barrier_only_some_threads_reach_is_a_timeout_not_a_hang(monkeypatch) -> None:
    monkeypatch.setattr(nvvm_emulator, "LAUNCH_TIMEOUT_S", 1)
    program = nvvm_emulator.Program(_DIVERGENT_BARRIER, ["divergent"])
    with pytest.raises(TimeoutError, match="divergent did not finish"):
        program.launch("divergent", (1, 1, 1), (2, 1, 1), 0)  # thread 0 is left waiting (for good)
