"""The code the NVPTX back end emitted, run on this CPU by the emulated GPU (tests/emulated_gpu.py: one OS thread
per GPU thread, NVVM intrinsics as small runtime functions) against numpy.

The simulated GPU (tests/sim_gpu.py) runs the loop IR the emitter receives; this runs what it made of it, and so
checks what nothing else here can without a GPU: the tensor cores' register fragments and operand rounding (the
simulator refuses an mma), the kernels' own bounds checks and the error flag the runtime reads after them, warp
shuffles as the emitted code addresses them. Here: the tensor cores and the checks, and the emulator's own parts;
tests/cuda/test_emulated_programs.py runs a cross-section of the GPU suite this way (all of it runs so with
JITOP_TEST_GPU=emulated).
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

import emulated_gpu
import gpu_cases
import jitop
import nvvm_emulator
from jitop.codegen import mma, nvptx
from jitop.topi import cuda_mma
from jitop.tuner._measure_worker import _compare


@pytest.fixture(autouse=True)
def gpu(monkeypatch):
    """The emulated GPU, for these tests and for those that ask `sim_gpu.gpu_or_simulated` for one."""
    return emulated_gpu.install(monkeypatch)


@pytest.mark.parametrize("mode,sizes", [("tf32", (127, 61, 253)), ("bf16", (127, 61, 253)), ("bf16", (1, 300, 77))],
                         ids=str)
def test_the_tensor_core_matmul_equals_numpy(mode, sizes, gpu) -> None:
    c, ref, exact = gpu_cases.run_tc_matmul(mode, *sizes)
    assert _compare([c], [ref.astype(np.float32)], cuda_mma.tc_tolerance(mode, sizes[2])) == ""
    # the operands rounded as the emitted code rounds them: what is left is the float32 sums' rounding
    assert _compare([c], [exact.astype(np.float32)], (1e-4, 1e-4)) == ""
    assert gpu.launched


def test_bf16_halves_packed_the_wrong_way_round_are_caught(monkeypatch) -> None:
    # the emulator multiplies the fragments the PTX ISA's way: registers packed (hi, lo) instead give other sums
    pack = nvptx.pack_bf16x2
    monkeypatch.setattr(nvptx, "pack_bf16x2", lambda b, lo, hi: pack(b, hi, lo))
    c, _, exact = gpu_cases.run_tc_matmul("bf16", 16, 8, 16)
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

def _kernel_params(*values: int) -> ctypes.Array:
    """cuLaunchKernel's `void**` for 64-bit `values` (the array keeps the values alive)."""
    held = (ctypes.c_int64 * len(values))(*values)
    params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(held) + 8 * k for k in range(len(values))))
    params.held = held
    return params


# the rounding intrinsics as emitted code calls them (a <2 x bfloat> comes back in a vector register: bitcast)
_ROUNDINGS = """
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
"""


def _rounding(program: nvvm_emulator.Program, name: str, *argtypes):
    """A function of `program` returning an i32, callable while the program lives."""
    return ctypes.CFUNCTYPE(ctypes.c_uint32, *argtypes)(program.engine.get_function_address(name))


def _special_floats(n: int) -> np.ndarray:
    """float32 values around the rounding ties of TF32 and BF16, with signs, infinities, NaN and subnormals."""
    bits = np.random.default_rng(1).integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    bits[: n // 2] = (bits[: n // 2] & ~np.uint32(0xFFFF)) | np.uint32(0x8000)  # BF16 ties
    bits[n // 2: n // 2 + 64] = (bits[n // 2: n // 2 + 64] & ~np.uint32(0x1FFF)) | np.uint32(0x1000)  # TF32 ties
    bits = bits[~np.isnan(bits.view(np.float32))]  # (ctypes passes a float through a double: it quiets a NaN)
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, 3.4e38], np.float32).view(np.uint32)
    return np.concatenate([bits, special]).view(np.float32)


def test_the_emulated_roundings_are_the_numpy_models_of_cvt() -> None:
    program = nvvm_emulator.Program(_ROUNDINGS, [])
    tf32 = _rounding(program, "tf32", ctypes.c_float)
    bf16x2 = _rounding(program, "bf16x2", ctypes.c_float, ctypes.c_float)
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
    params = _kernel_params(out.ctypes.data, offset)
    program.launch("k", (blocks, 1, 1), (threads, 1, 1), ctypes.addressof(params))
    t = np.arange(threads)
    want = (threads - 1 - t) * 1000 + (t ^ offset)
    np.testing.assert_array_equal(out, np.broadcast_to(want, out.shape))
    program.launch("k", (0, 1, 1), (threads, 1, 1), ctypes.addressof(params))  # no blocks: nothing runs
    np.testing.assert_array_equal(out, np.broadcast_to(want, out.shape))


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
    params = _kernel_params(out.value, at)
    rc = fake.cuLaunchKernel(handle.value, 1, 1, 1, 1, 1, 1, 0, None, params, None)
    assert rc == (emulated_gpu.ILLEGAL_ADDRESS if fails else 0)
    assert fake.overruns == ([("store_at", out.value, 64)] if fails else [])
    inside = _kernel_params(out.value, 0)  # a later launch is judged by its own writes
    assert fake.cuLaunchKernel(handle.value, 1, 1, 1, 1, 1, 1, 0, None, inside, None) == 0
    assert len(fake.overruns) == fails


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


def test_a_barrier_only_some_threads_reach_is_a_timeout_not_a_hang() -> None:
    # in a process of its own: the thread left waiting (for good) goes with it
    script = ("import nvvm_emulator, sys\n"
              "nvvm_emulator.LAUNCH_TIMEOUT_S = 1\n"
              "program = nvvm_emulator.Program(sys.stdin.read(), ['divergent'])\n"
              "try:\n    program.launch('divergent', (1, 1, 1), (2, 1, 1), 0)\n"
              "except TimeoutError as err:\n    print(err)\n")
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join([tests, os.path.dirname(tests), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", script], input=_DIVERGENT_BARRIER, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": path})
    assert "emulated kernel divergent did not finish in 1 s" in done.stdout, done.stderr


def test_an_intrinsic_the_emulator_lacks_is_named_not_left_unresolved() -> None:
    text = ('define ptx_kernel void @"k"() {\n  call void @"llvm.nvvm.bar.warp.sync"(i32 -1)\n  ret void\n}\n'
            'declare void @"llvm.nvvm.bar.warp.sync"(i32)\n')
    with pytest.raises(NotImplementedError, match=r"has no emu\.nvvm\.bar\.warp\.sync"):
        nvvm_emulator.Program(text, ["k"])


@pytest.mark.parametrize("mode", ["tf32", "bf16"])
def test_the_tensor_core_matmul_optimised_as_for_the_gpu_equals_numpy(mode, monkeypatch) -> None:
    # LLVM's O3 takes the emitted code at its word (noalias, alignment, nsw): a false claim would show here
    monkeypatch.setenv("JITOP_EMULATED_OPT", "3")
    c, _, exact = gpu_cases.run_tc_matmul(mode, 61, 37, 45)
    assert _compare([c], [exact.astype(np.float32)], (1e-4, 1e-4)) == ""
