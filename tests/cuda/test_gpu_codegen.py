"""GPU schedules -> loop IR -> PTX, checked without a GPU: the lowering's structure (bound loops, shared tiles
covering the block, barriers, cross-thread reductions), ptxas's verdict on the PTX, and the errors a bad
schedule gets."""
from __future__ import annotations

import os

import pytest

import gpu_cases
import jitop
from jitop import te
from jitop.codegen.nvptx import build_ptx, check_ptx, ptxas_path
from jitop.errors import ScheduleError
from jitop.target import CudaTarget, Target
from jitop.tir.nodes import Allocate, Barrier, For, ForKind, ThreadReduce, walk_stmts
from jitop.tir.passes import guards_off_barriers

SM90 = CudaTarget()
needs_ptxas = pytest.mark.skipif(ptxas_path() is None and os.environ.get("JITOP_REQUIRE_PTXAS") != "1",
                                 reason="ptxas not installed (pip install nvidia-cuda-nvcc, or jitop[cuda-test])")


def assembled(func, arch: str = "sm_90") -> str:
    """The PTX of `func` after ptxas accepted it (ptxas must be there when JITOP_REQUIRE_PTXAS=1)."""
    target = Target.from_string(f"cuda -arch={arch}")
    ptx = build_ptx(func, "k", target).ptx
    check_ptx(ptx, arch)
    return ptx


def lowered(case, *args, **kw):
    s, tensors, _ = case(*args, **kw)
    return jitop.lower(s, tensors)


# ** lowering **

def test_bound_loops_print_their_index():
    text = str(lowered(gpu_cases.elementwise, 1000))
    assert "in blockIdx.x(8)" in text and "in threadIdx.x(128)" in text
    assert "< 1000" in text  # the tail block is guarded


def test_shared_tile_covers_the_block_and_is_fenced():
    func = lowered(gpu_cases.matmul_shared, 64, 48, 40)
    shared = [s.buffer for s in walk_stmts(func.body) if isinstance(s, Allocate) and s.buffer.scope == "shared"]
    assert {b.name for b in shared} == {"A.shared", "B.shared"}  # twice: 40 = 2 x 16 + a partitioned tail
    assert all(b.shape == (16, 16) for b in shared)  # the whole block's rows/columns, not one thread's
    barriers = [s for s in walk_stmts(func.body) if isinstance(s, Barrier)]
    assert len(barriers) == len(shared)  # one before and one after each pair of fills


def test_guards_move_off_barriers():
    """A tail guard of the output (i < 40) must not enclose the barriers, nor the shared fills."""
    func = lowered(gpu_cases.matmul_shared, 40, 40, 40)
    body = guards_off_barriers(func.body)
    from jitop.tir.nodes import IfThenElse
    for s in walk_stmts(body):
        if isinstance(s, IfThenElse):
            assert not any(isinstance(x, (Barrier, ThreadReduce)) for x in walk_stmts(s.then))


def test_cross_thread_reduction_lowers_to_a_thread_reduce():
    func = lowered(gpu_cases.row_reduce, 5, 300)
    reduces = [s for s in walk_stmts(func.body) if isinstance(s, ThreadReduce)]
    assert len(reduces) == 1 and reduces[0].extent == 128 and reduces[0].kind is ForKind.THREAD_X
    assert "thread_reduce(sum" in str(func)


def test_cross_thread_reduction_needs_a_power_of_two():
    s, tensors, _ = gpu_cases.row_reduce(5, 300, threads=96)
    with pytest.raises(jitop.errors.LoweringError, match="power of two"):
        jitop.lower(s, tensors)


def test_bind_errors_teach():
    A = te.placeholder((64,), name="A")
    B = te.compute((64,), lambda i: A[i] + 1, name="B")
    s = jitop.create_schedule(B)
    o, i = s[B].split(B.op.axis[0], factor=8)
    s[B].bind(o, te.thread_axis("threadIdx.x"))
    with pytest.raises(ScheduleError, match="already bound to loop 'i.outer'"):
        s[B].bind(i, te.thread_axis("threadIdx.x"))
    with pytest.raises(ValueError, match="unknown tag"):
        te.thread_axis("threadIdx.w")
    with pytest.raises(TypeError, match="thread_axis"):
        s[B].bind(i, "threadIdx.y")
    r = te.reduce_axis((0, 64), "r")
    S = te.compute((1,), lambda _: te.sum(A[r], axis=r), name="S")
    s2 = jitop.create_schedule(S)
    with pytest.raises(ScheduleError, match="reduction axis"):
        s2[S].bind(r, te.thread_axis("blockIdx.x"))


def test_shared_stage_at_root_is_an_error():
    A = te.placeholder((64,), name="A")
    B = te.compute((64,), lambda i: A[i] + 1, name="B")
    s = jitop.create_schedule(B)
    s.cache_read(A, "shared", [B])
    with pytest.raises(jitop.errors.LoweringError, match="shared memory"):
        jitop.lower(s, [A, B])


# ** code generation errors **

def test_block_over_the_thread_limit():
    s, tensors, _ = gpu_cases.elementwise(1 << 14, threads=2048)
    with pytest.raises(ScheduleError, match="2048 threads exceeds the 1024"):
        build_ptx(jitop.lower(s, tensors), "k", SM90)


def test_unbound_loop_over_many_iterations():
    A = te.placeholder((1 << 20,), name="A")
    B = te.compute((1 << 20,), lambda i: A[i] * 2, name="B")
    s = jitop.create_schedule(B)
    with pytest.raises(ScheduleError, match="binds no loop.*1048576 iterations"):
        build_ptx(jitop.lower(s, [A, B]), "k", SM90)


def test_shared_memory_over_the_limit():
    s, tensors, _ = gpu_cases.matmul_shared(256, 256, 256, tile=32)  # 2 x 32 x 32 floats = 8 KiB: fits
    build_ptx(jitop.lower(s, tensors), "k", SM90)
    small = CudaTarget(shared_per_block=4 << 10)
    with pytest.raises(ScheduleError, match="8192 bytes of shared memory"):
        build_ptx(jitop.lower(s, tensors), "k", small)


def test_parallel_is_refused_on_the_gpu():
    A = te.placeholder((4096,), name="A")
    B = te.compute((4096,), lambda i: A[i] * 2, name="B")
    s = jitop.create_schedule(B)
    o, i = s[B].split(B.op.axis[0], factor=64)
    s[B].bind(o, te.thread_axis("blockIdx.x"))
    s[B].parallel(i)
    with pytest.raises(ScheduleError, match="parallel"):
        build_ptx(jitop.lower(s, [A, B]), "k", SM90)


def test_cpu_build_of_a_gpu_schedule_says_which_target():
    s, tensors, _ = gpu_cases.elementwise(100)
    with pytest.raises(ValueError, match="target='cuda'"):
        jitop.build(s, tensors)


def test_target_strings():
    t = Target.from_string("cuda -arch=sm_80")
    assert (t.arch, t.ptx_features) == ("sm_80", "+ptx70")
    assert CudaTarget.from_json(t.to_json()) == t
    with pytest.raises(ValueError, match="-arch"):
        Target.from_string("cuda -arch=90")
    with pytest.raises(jitop.errors.TargetMismatchError, match="built for sm_80"):
        t.check_runs_on("sm_90")


def test_launch_shapes():
    n = te.size_var("n")
    s, tensors, _ = gpu_cases.elementwise(n, threads=256)
    f = jitop.build(s, tensors, target="cuda -arch=sm_90")
    (launch,) = f.built.kernels
    assert launch.grid == ("(n + 255) // 256", 1, 1) and launch.block == (256, 1, 1)
    assert ".entry" in f.get_source("ptx") and "ptx_kernel" in f.get_source("ll")
    s, tensors, _ = gpu_cases.matmul_shared(50, 70, 30)
    (launch,) = build_ptx(jitop.lower(s, tensors), "k", SM90).kernels
    assert launch.grid == (5, 4, 1) and launch.block == (16, 16, 1) and launch.shared_bytes == 2 * 16 * 16 * 4


# ** ptxas accepts what we emit **

@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("case,args", [
    (gpu_cases.elementwise, (1000,)),
    (gpu_cases.elementwise, (te.size_var("n"),)),
    (gpu_cases.elementwise, (77, 32, "float64")),
    (gpu_cases.matmul_shared, (64, 64, 64)),
    (gpu_cases.matmul_shared, (37, 53, 19)),
    (gpu_cases.row_reduce, (7, 1000)),
    (gpu_cases.row_reduce, (3, 17, te.max, 16)),
    (gpu_cases.row_reduce, (3, 999, te.min, 512, "int64")),
    (gpu_cases.row_reduce, (3, 999, te.sum, 64, "float64")),
    (gpu_cases.row_reduce, (3, 99, te.sum, 32, "int8")),
    (gpu_cases.rows_per_block_reduce, (10, 100)),
    (gpu_cases.gather, (100, 37)),
])
def test_ptxas_accepts(case, args, arch):
    ptx = assembled(lowered(case, *args), arch)
    assert f".target {arch}" in ptx


@needs_ptxas
def test_ptxas_report_and_refusal():
    s, tensors, _ = gpu_cases.matmul_shared(64, 64, 64)
    report = check_ptx(build_ptx(jitop.lower(s, tensors), "k", SM90).ptx)
    assert "registers" in report
    with pytest.raises(RuntimeError, match="refused"):
        check_ptx(".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k() { bogus; }")


def test_checked_access_sets_an_error_flag():
    s, tensors, _ = gpu_cases.gather(100, 37)
    built = build_ptx(jitop.lower(s, tensors), "k", SM90)
    assert built.error_symbol == "k_error" and any("read of X" in c for c in built.checked)
    s, tensors, _ = gpu_cases.elementwise(1000)
    assert build_ptx(jitop.lower(s, tensors), "k", SM90).checked == ()  # proved in bounds: no checks


def test_save_and_load_round_trip(tmp_path):
    from jitop.runtime.cuda.function import load_gpu_function
    s, tensors, _ = gpu_cases.matmul_shared(37, 53, 19)
    f = jitop.build(s, tensors, target="cuda -arch=sm_90")
    path = tmp_path / "mm.jitopgpu"
    f.save(path)
    g = load_gpu_function(path)
    assert g.built == f.built and g.meta == f.meta and g.cubin is None
    data = path.read_bytes()
    for bad, why in ((data[:-3] + b"xyz", "checksum"), (b"PK" + data, "not a saved"),
                     (data.replace(b'"schema": 1', b'"schema": 9'), "schema 9")):
        path.write_bytes(bad)
        with pytest.raises(ValueError, match=why):
            load_gpu_function(path)


def test_a_stage_reading_shared_memory_waits_for_the_fill():
    """Two stages attached at one loop, the second reading the first's shared tile: a barrier between them."""
    A = te.placeholder((8, 128), name="A")
    r = te.reduce_axis((0, 128), "r")
    S = te.compute((8,), lambda i: te.sum(A[i, 127 - r], axis=r), name="S")
    C = te.compute((8, 128), lambda i, j: A[i, j] - S[i], name="C")
    s = jitop.create_schedule(C)
    AS = s.cache_read(A, "shared", [S, C])
    s[C].bind(C.op.axis[0], gpu_cases.BX)
    s[C].bind(C.op.axis[1], gpu_cases.TX)
    s[AS].compute_at(s[C], C.op.axis[0])
    s[AS].bind(s[AS].op.axis[1], gpu_cases.TX)
    s[S].compute_at(s[C], C.op.axis[0])
    _, inner = s[S].split(r, factor=128)
    s[S].bind(inner, gpu_cases.TX)
    order = [type(x).__name__ for x in walk_stmts(jitop.lower(s, [A, C]).body) if isinstance(x, (Barrier, ThreadReduce))
             or (isinstance(x, For) and x.var.name == "r.inner")]
    assert order == ["Barrier", "Barrier", "For", "ThreadReduce"]
