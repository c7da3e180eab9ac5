"""The GPU schedules of jitop.topi.cuda (injective, SGEMM, softmax / layer norm, conv2d as an implicit GEMM):
for several shapes (1, primes, tiles that do not divide, the benchmark sizes) each is lowered (the loop IR has the
expected bound loops, shared tiles, register tiles, cross-thread reductions and guards), compiled to PTX for
sm_90, and assembled by ptxas where it is installed (no spills for the default SGEMM and conv2d tiles).
Without ptxas those checks skip, unless JITOP_REQUIRE_PTXAS=1 (CI), where they fail.

The tests marked `requires_gpu` run the built functions on a GPU against numpy (float64 references, tolerances
from the accumulation length); they skip where there is no CUDA driver (benchmarks/gpu_check.sh runs them on a
GPU machine)."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

import jitop
from jitop import te
from jitop.tir.nodes import Allocate, Barrier, For, ForKind, IfThenElse, ThreadReduce, walk_stmts
from jitop.topi import cuda

SM90 = "cuda -arch=sm_90"
EPS32 = float(np.finfo(np.float32).eps)


# ** helpers: the loop IR, PTX and ptxas **

def ptxas() -> str | None:
    """ptxas on PATH or in the `nvidia-cuda-nvcc` wheel (jitop.codegen.nvptx.ptxas_path)."""
    from jitop.codegen.nvptx import ptxas_path
    return ptxas_path()


def assemble(ptx: str, arch: str = "sm_90") -> dict[str, int]:
    """ptxas -v on `ptx`: {'registers', 'spill_stores', 'spill_loads', 'smem'} of its (last) kernel. Skips the
    test when ptxas is absent, unless JITOP_REQUIRE_PTXAS=1."""
    exe = ptxas()
    if exe is None:
        if os.environ.get("JITOP_REQUIRE_PTXAS") == "1":
            pytest.fail("JITOP_REQUIRE_PTXAS=1 but ptxas is not installed (pip install nvidia-cuda-nvcc)")
        pytest.skip("ptxas not installed (pip install nvidia-cuda-nvcc)")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        done = subprocess.run([exe, f"-arch={arch}", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"ptxas refused the PTX:\n{done.stderr}"
    return parse_ptxas(done.stderr)


def parse_ptxas(report: str) -> dict[str, int]:
    import re
    out = {"registers": 0, "spill_stores": 0, "spill_loads": 0, "smem": 0}
    for key, pattern in (("registers", r"Used (\d+) registers"), ("spill_stores", r"(\d+) bytes spill stores"),
                         ("spill_loads", r"(\d+) bytes spill loads"), ("smem", r"(\d+) bytes smem")):
        found = [int(x) for x in re.findall(pattern, report)]
        out[key] = max(found) if found else 0
    return out


def test_parse_ptxas():
    report = ("ptxas info    : Function properties for k\n    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill "
              "loads\nptxas info    : Used 119 registers, used 1 barriers, 8192 bytes smem\n")
    assert parse_ptxas(report) == {"registers": 119, "spill_stores": 8, "spill_loads": 4, "smem": 8192}


def bound(func) -> dict[str, list]:
    """{'blockIdx.x': [extents...], ...}: the loops bound to GPU indices, in IR order (ints, or printed exprs)."""
    out: dict[str, list] = {}
    for s in walk_stmts(func.body):
        if isinstance(s, For) and s.kind.is_gpu_index:
            e = s.extent
            out.setdefault(s.kind.value, []).append(int(e.value) if e.op.name == "CONST" else str(e))
    return out


def allocations(func, scope: str) -> dict[str, tuple]:
    return {s.buffer.name: tuple(s.buffer.shape) for s in walk_stmts(func.body)
            if isinstance(s, Allocate) and s.buffer.scope == scope}


def count(func, kind: type) -> int:
    return sum(isinstance(s, kind) for s in walk_stmts(func.body))


def loops_of_kind(func, kind: ForKind) -> list[For]:
    return [s for s in walk_stmts(func.body) if isinstance(s, For) and s.kind is kind]


def build(s, args):
    f = jitop.build(s, args, target=SM90)
    assert ".target sm_90" in f.get_source("ptx")
    return f


def sym_or_int(d):
    return te.size_var(d) if isinstance(d, str) else d


# ** the computations the tests build **

def chain(shape):
    """C = exp(A) * B + c (c broadcast along the last axis), with exp as a separate (inlined) stage."""
    shape = tuple(sym_or_int(d) for d in shape)
    A, B = te.placeholder(shape, name="A"), te.placeholder(shape, name="B")
    c = te.placeholder(shape[-1:], name="c")
    E = te.compute(shape, lambda *i: te.exp(A[i]), name="E")
    C = te.compute(shape, lambda *i: E[i] * B[i] + c[i[-1]], name="C")
    return [A, B, c, C], lambda a, b, cc: np.exp(a.astype(np.float64)) * b + cc


def mm(m, n, k):
    m, n, k = (sym_or_int(d) for d in (m, n, k))
    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    return A, B, cuda.matmul(A, B)


def rows_op(kind: str, m, n):
    X = te.placeholder((m, n), name="X")
    if kind == "softmax":
        return [X, cuda.softmax(X)]
    g, b = te.placeholder((n,), name="g"), te.placeholder((n,), name="b")
    return [X, g, b, cuda.layer_norm(X, g, b, eps=1e-5)]


# ** injective **

@pytest.mark.parametrize("shape,blocks,threads,inner", [
    ((1,), None, 32, None),                      # one warp, guarded
    ((7, 3), None, 32, None),
    ((1000, 37), 145, 256, None),                # 37000 elements: one per thread
    ((4099, 4099), 16409, 256, "unrolled"),      # large, not a multiple of 4: 4 per thread, strided (coalesced)
    ((4096, 4096), 16384, 256, "vectorized"),    # large, a multiple of 4: 4 contiguous per thread (vector access)
    (("n",), "(n + 255) // 256", 256, None),     # symbolic
])
def test_injective(shape, blocks, threads, inner):
    args, _ = chain(shape)
    s = cuda.schedule_injective(args[-1])
    func = jitop.lower(s, args)
    text = str(func)
    b = bound(func)
    assert b.get("threadIdx.x") == [threads]
    if blocks is None:
        assert "blockIdx.x" not in b or b["blockIdx.x"] == [1]
    else:
        assert b["blockIdx.x"] == [blocks]
    assert "E[" not in text and "exp(A[" in text  # the producer is inlined
    total = np.prod([d if isinstance(d, int) else 2 for d in shape])
    if total % 256 or isinstance(shape[0], str):
        assert count(func, IfThenElse) >= 1  # the tail is guarded
    if inner == "vectorized":
        (v,) = loops_of_kind(func, ForKind.VECTORIZED)
        assert int(v.extent.value) == 4
    elif inner == "unrolled":
        (u,) = loops_of_kind(func, ForKind.UNROLLED)
        assert int(u.extent.value) == 4 and u.body.kind is ForKind.THREAD_X  # threadIdx.x innermost: coalesced
    f = build(s, args)
    (launch,) = f.built.kernels
    assert launch.block == (threads, 1, 1)
    ptx = f.get_source("ptx")
    if inner == "vectorized":
        assert "ld.global.nc.v4" in ptx and "st.global.v4" in ptx
    assemble(ptx)


def test_injective_knobs_and_several_outputs():
    A = te.placeholder((100_000,), name="A")
    B = te.compute((100_000,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((100_000,), lambda i: A[i] + 1.0, name="C")
    s = cuda.schedule_injective([B, C], threads=128, per_thread=2)
    func = jitop.lower(s, [A, B, C])
    assert bound(func)["threadIdx.x"] == [128, 128]
    assert bound(func)["blockIdx.x"] == [391, 391]  # ceil(100000 / 256): 2 per thread
    f = build(s, [A, B, C])
    assert len(f.built.kernels) == 2
    with pytest.raises(ValueError, match="1 to 1024"):
        cuda.schedule_injective(B, threads=2048)


def test_injective_with_a_reduction_producer():
    """A reduction feeding an injective output cannot be inlined: it gets a kernel of its own, one thread a row."""
    X = te.placeholder((300, 50), name="X")
    k = te.reduce_axis((0, 50), "k")
    S = te.compute((300,), lambda i: te.sum(X[i, k], axis=k), name="S")
    Y = te.compute((300, 50), lambda i, j: X[i, j] - S[i] * 0.02, name="Y")
    s = cuda.schedule_injective(Y)
    f = build(s, [X, Y])
    assert len(f.built.kernels) == 2 and f.built.workspaces[0][0] == "S"
    assemble(f.get_source("ptx"))


# ** SGEMM **

def check_matmul_ir(func, m, n, k, cfg):
    bm, bn, bk, tm, tn = (cfg[x] for x in cuda.MATMUL_KEYS)
    b = bound(func)
    nty, ntx = bm // tm, bn // tn
    if isinstance(m, int) and isinstance(n, int):
        assert b.get("blockIdx.y") == [-(-m // bm)] or (m <= bm and "blockIdx.y" not in b)
        assert b.get("blockIdx.x") == [-(-n // bn)] or (n <= bn and "blockIdx.x" not in b)
    assert set(b["threadIdx.y"]) == {nty} and set(b["threadIdx.x"]) == {ntx}
    shared = allocations(func, "shared")
    assert set(shared) == {"A.T.shared", "B.shared"}
    if all(isinstance(d, int) and d >= 128 for d in (m, n, k)):
        assert shared["A.T.shared"] == (bk, bm) and shared["B.shared"] == (bk, bn)  # k-major tiles
    local = allocations(func, "local")
    if all(isinstance(d, int) and d >= 128 for d in (m, n)):
        assert local["matmul.local"] == (tm, tn)
    assert count(func, Barrier) >= 2 and count(func, Barrier) % 2 == 0
    text = str(func)
    for d, tile in ((m, bm), (n, bn), (k, bk)):
        if isinstance(d, int) and d % tile:
            assert f"< {d}" in text, f"no guard against the size {d} in\n{text}"


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (17, 13, 5), (1000, 999, 77), (64, 64, 64), (129, 257, 131),
                                   (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192)])
def test_matmul_default_config(m, n, k):
    A, B, C = mm(m, n, k)
    cfg = cuda.default_matmul_config(m, n, k)
    s = cuda.schedule_matmul(C)
    func = jitop.lower(s, [A, B, C])
    check_matmul_ir(func, m, n, k, cfg)
    f = build(s, [A, B, C])
    (launch,) = f.built.kernels
    assert launch.block == (cfg["bn"] // cfg["tn"], cfg["bm"] // cfg["tm"], 1)
    ptx = f.get_source("ptx")
    if m % cfg["bm"] == 0 and n % cfg["bn"] == 0 and k % cfg["bk"] == 0 and k % 4 == 0 and n % 4 == 0:
        assert ptx.count("ld.shared.v4") >= (cfg["tm"] + cfg["tn"]) // 4 * cfg["bk"]  # register fragments
        assert "ld.global.nc.v4" in ptx and "st.global.v4" in ptx
    report = assemble(ptx)
    if min(m, n, k) >= 1024:
        # the benchmark sizes: no spills, and few enough registers for two blocks of 256 threads per SM
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report
        assert report["registers"] <= 65536 // (2 * 256), report


@pytest.mark.parametrize("cfg", [
    {"bm": 128, "bn": 128, "bk": 16, "tm": 8, "tn": 8},
    {"bm": 128, "bn": 64, "bk": 8, "tm": 8, "tn": 4},
    {"bm": 64, "bn": 128, "bk": 8, "tm": 4, "tn": 8},
    {"bm": 32, "bn": 32, "bk": 4, "tm": 2, "tn": 2},
    {"bm": 64, "bn": 64, "bk": 16, "tm": 4, "tn": 4},
])
@pytest.mark.parametrize("shape", [(512, 512, 512), (300, 200, 100)])
def test_matmul_configs(cfg, shape):
    A, B, C = mm(*shape)
    s = cuda.schedule_matmul(C, cfg)
    func = jitop.lower(s, [A, B, C])
    check_matmul_ir(func, *shape, cfg)
    f = build(s, [A, B, C])
    report = assemble(f.get_source("ptx"))
    assert report["spill_stores"] == 0 or shape != (512, 512, 512), report


def test_matmul_symbolic():
    A, B, C = mm("m", "n", "k")
    s = cuda.schedule_matmul(C, {"bm": 64, "bn": 64, "bk": 8, "tm": 4, "tn": 4})
    func = jitop.lower(s, [A, B, C])
    check_matmul_ir(func, "m", "n", "k", {"bm": 64, "bn": 64, "bk": 8, "tm": 4, "tn": 4})
    f = build(s, [A, B, C])
    (launch,) = f.built.kernels
    assert launch.grid == ("(n + 63) // 64", "(m + 63) // 64", 1) and launch.block == (16, 16, 1)
    assemble(f.get_source("ptx"))


def test_matmul_of_a_plain_compute():
    """A matmul written directly (A read row-major, no transposed view) gets the same schedule, A's tile bm x bk."""
    A, B = te.placeholder((200, 64), name="A"), te.placeholder((64, 300), name="B")
    r = te.reduce_axis((0, 64), "r")
    C = te.compute((200, 300), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    s = cuda.schedule_matmul(C, {"bm": 64, "bn": 64, "bk": 8, "tm": 4, "tn": 4})
    func = jitop.lower(s, [A, B, C])
    assert allocations(func, "shared") == {"A.shared": (64, 8), "B.shared": (8, 64)}
    assemble(build(s, [A, B, C]).get_source("ptx"))


def test_matmul_config_errors():
    A, B, C = mm(256, 256, 256)
    with pytest.raises(ValueError, match="multiples of tm"):
        cuda.schedule_matmul(C, {"tm": 3})
    with pytest.raises(ValueError, match="threads per block"):
        cuda.schedule_matmul(C, {"bm": 256, "bn": 256, "tm": 4, "tn": 4})
    with pytest.raises(ValueError, match="unknown config keys"):
        cuda.schedule_matmul(C, {"block": 64})
    with pytest.raises(ValueError, match="shared memory|bytes"):
        cuda.schedule_matmul(C, {"bm": 256, "bn": 256, "bk": 32, "tm": 16, "tn": 8})
    with pytest.raises(ValueError, match="A's columns"):
        cuda.matmul(te.placeholder((4, 5), name="A"), te.placeholder((6, 4), name="B"))


def test_default_matmul_config_fills_the_gpu():
    for size in (1024, 2048, 4096, 8192):
        cfg = cuda.default_matmul_config(size, size, size)
        blocks = -(-size // cfg["bm"]) * -(-size // cfg["bn"])
        assert blocks >= 132 or (cfg["bm"], cfg["bn"]) == (64, 64), (size, cfg)  # a block for every SM
        assert (cfg["bm"] // cfg["tm"]) * (cfg["bn"] // cfg["tn"]) >= 64


# ** double-buffered shared tiles (stages = 2) **

def k_loops(func) -> list[For]:
    """The serial loops that hold a barrier: the K loops of a GEMM (one per loop-partitioned piece)."""
    return [s for s in loops_of_kind(func, ForKind.SERIAL) if any(isinstance(x, Barrier) for x in walk_stmts(s))]


def staged_order(loop: For) -> list[str]:
    """What a K loop's body does, in order: 'load' (a store into a register stage), 'shared' (a store into a
    shared tile), 'compute' (a load from a shared tile), 'barrier'."""
    from jitop.te.expr import Op, walk
    from jitop.tir.nodes import Store
    out = []
    for s in walk_stmts(loop.body):
        if isinstance(s, Barrier):
            out.append("barrier")
        elif isinstance(s, Store):
            reads_shared = any(n.op is Op.LOAD and n.arg.scope == "shared" for n in walk(s.value))
            what = ("load" if ".staged" in s.buffer.name else "shared" if s.buffer.scope == "shared"
                    else "compute" if reads_shared else None)
            if what and (not out or out[-1] != what):
                out.append(what)
    return out


@pytest.mark.parametrize("cfg", [{"bm": 128, "bn": 128, "bk": 16, "tm": 8, "tn": 8},
                                 {"bm": 64, "bn": 64, "bk": 8, "tm": 4, "tn": 4},
                                 {"bm": 32, "bn": 32, "bk": 4, "tm": 2, "tn": 2}])
@pytest.mark.parametrize("shape", [(512, 512, 512), (300, 200, 100), (17, 13, 5)])
def test_double_buffered_matmul(cfg, shape):
    """stages=2: two copies of each shared tile, the K loop loads the next step into registers, computes this one,
    stores the registers into the other copy, then waits at its only barrier; ptxas takes it without spills."""
    A, B, C = mm(*shape)
    s = cuda.schedule_matmul(C, {**cfg, "stages": 2})
    func = jitop.lower(s, [A, B, C])
    shared = allocations(func, "shared")
    assert shared["A.T.shared"][0] == 2 and shared["B.shared"][0] == 2
    assert {n for n in allocations(func, "local") if ".staged" in n} == {"A.T.shared.staged0", "B.shared.staged1"}
    loops = k_loops(func)
    assert loops or -(-shape[2] // cfg["bk"]) <= 2  # a loop of one or two steps is unrolled by loop partitioning
    assert all(count(loop, Barrier) == 1 for loop in loops)
    assert all(staged_order(loop) == ["load", "compute", "shared", "barrier"] for loop in loops), \
        [staged_order(loop) for loop in loops]
    f = build(s, [A, B, C])
    assert f.built.kernels[0].shared_bytes == sum(4 * np.prod(shape) for shape in shared.values())
    ptx = f.get_source("ptx")
    if shape == (512, 512, 512) and not f.built.checked:  # (a checked access is guarded: scalar)
        # the staged loads stay 4-vectors (their alignment stated: nvptx._alignment)
        assert "ld.global.nc.v4" in ptx and "ld.global.nc.b32" not in ptx and "ld.global.nc.f32" not in ptx
    report = assemble(ptx)
    assert report["spill_stores"] == 0 or shape != (512, 512, 512), report


def test_double_buffered_conv2d():
    """The implicit GEMM's scalar im2col fill (zero padding computed in it) is staged through registers too."""
    X, W, Y = conv(2, 20, 15, 15, 40, 3, 3, 2, 1)
    cfg = {"bm": 32, "bn": 64, "bk": 8, "tm": 4, "tn": 4, "stages": 2}
    s = cuda.schedule_conv2d(Y, cfg)
    func = jitop.lower(s, [X, W, Y])
    assert all(shape[0] == 2 for shape in allocations(func, "shared").values())
    assert all(staged_order(loop) == ["load", "compute", "shared", "barrier"] for loop in k_loops(func))
    report = assemble(build(s, [X, W, Y]).get_source("ptx"))
    assert report["spill_stores"] == 0, report


def test_double_buffer_errors():
    A, B, C = mm(256, 256, 256)
    with pytest.raises(ValueError, match="stages=3"):
        cuda.schedule_matmul(C, {"stages": 3})
    with pytest.raises(ValueError, match="shared tiles take 65536 bytes"):
        cuda.schedule_matmul(C, {"bm": 128, "bn": 128, "bk": 32, "tm": 8, "tn": 8, "stages": 2})
    from jitop.errors import LoweringError, ScheduleError
    X = te.placeholder((64, 64), name="X")
    r = te.reduce_axis((0, 64), "r")
    S = te.compute((64,), lambda i: te.sum(X[i, r], axis=r), name="S")
    s = jitop.create_schedule(S)
    local = s.cache_read(X, "local", [S])
    with pytest.raises(ScheduleError, match="only a shared-memory stage"):
        s[local].double_buffer()
    s = jitop.create_schedule(S)
    XS = s.cache_read(X, "shared", [S])
    ro, ri = s[S].split(s[S].op.reduce_axis[0], factor=16)
    s[S].unroll(ro)
    s[XS].compute_at(s[S], ro)
    s[XS].double_buffer()
    with pytest.raises(LoweringError, match="which is unrolled"):
        jitop.lower(s, [X, S])


def test_a_fill_that_cannot_be_staged_stores_into_the_other_copy_before_the_arithmetic():
    """A fill over a loop of symbolic extent has no register stage: the next step's tile is stored straight into
    the other copy, ahead of this step's arithmetic, still with one barrier per step."""
    from jitop.dtypes import as_dtype
    from jitop.te.expr import const, var
    from jitop.tir.double_buffer import pipeline
    from jitop.tir.nodes import Buffer, Store
    f32 = as_dtype("float32")
    n, ko, i = te.size_var("n"), var("ko"), var("i")
    src = Buffer("src", f32, (n * 4,), "param")
    tile = Buffer("tile", f32, (n,), "shared")
    fill = For(i, n, ForKind.SERIAL, Store(tile, (i,), src.load((ko * n + i,))))
    body = Store(src, (ko,), tile.load((const(0),)))
    out = pipeline(ko, const(4), [fill], [tile], body)
    loop = next(s for s in walk_stmts(out) if isinstance(s, For) and s.var is ko)
    assert staged_order(loop) == ["shared", "compute", "barrier"]
    assert allocations(type("F", (), {"body": out}), "shared") == {"tile": (2, n)}


# ** softmax and layer norm **

@pytest.mark.parametrize("kind", ["softmax", "layer_norm"])
@pytest.mark.parametrize("m,n", [(1, 1), (3, 17), (33, 100), (5, 4099), (64, 4096), (4096, 4096), (3, 20000)])
def test_row_reduce(kind, m, n):
    args = rows_op(kind, m, n)
    s = cuda.schedule_row_reduce(args[-1])
    func = jitop.lower(s, args)
    text = str(func)
    threads = cuda.default_row_threads(n, 4 if n % 4 == 0 else 1)
    b = bound(func)
    assert set(b["threadIdx.x"]) == {threads}
    reduces = [x for x in walk_stmts(func.body) if isinstance(x, ThreadReduce)]
    assert len(reduces) == 2 and {r.extent for r in reduces} == {threads}
    assert ("thread_reduce(max" in text) == (kind == "softmax")
    shared = allocations(func, "shared")
    cached = n * 4 <= 40 << 10
    if cached:
        (rows, length), = shared.values()
        assert length == n and set(shared) == {"X.shared"}
        # a barrier before the fill and one after it, before the reductions read the row
        first_reduce = text.index("thread_reduce")
        assert text.count("barrier()", 0, first_reduce) == 2
    else:
        assert shared == {}
    rows = b.get("threadIdx.y", [1])[0]
    assert b.get("blockIdx.x") == [-(-m // rows)] or (m <= rows and "blockIdx.x" not in b)
    f = build(s, args)
    (launch,) = f.built.kernels
    assert launch.block == (threads, rows, 1)
    report = assemble(f.get_source("ptx"))
    assert report["spill_stores"] == 0, report


def test_row_reduce_knobs():
    X, Y = rows_op("softmax", 64, 1024)
    s = cuda.schedule_row_reduce(Y, threads=128, rows=2, vec=1, cache_row=False)
    func = jitop.lower(s, [X, Y])
    assert bound(func)["threadIdx.x"][0] == 128 and bound(func)["threadIdx.y"][0] == 2
    assert allocations(func, "shared") == {} and not loops_of_kind(func, ForKind.VECTORIZED)
    assemble(build(s, [X, Y]).get_source("ptx"))
    with pytest.raises(ValueError, match="power of two"):
        cuda.schedule_row_reduce(Y, threads=96)
    with pytest.raises(ValueError, match="not a block"):
        cuda.schedule_row_reduce(Y, threads=512, rows=4)
    with pytest.raises(ValueError, match="do not fit"):
        cuda.schedule_row_reduce(rows_op("softmax", 4, 40000)[1], cache_row=True)
    with pytest.raises(ValueError, match="2-D"):
        cuda.softmax(te.placeholder((4,), name="v"))


# ** on a GPU: results against numpy **

def _gpu() -> bool:
    try:
        from jitop.runtime.cuda import driver
    except ImportError:
        return False
    try:
        return bool(driver.available())
    except Exception:  # a driver that fails to initialise is no GPU to test on
        return False


requires_gpu = pytest.mark.skipif(not _gpu(), reason="no NVIDIA GPU here (jitop.runtime.cuda.driver unavailable)")


def rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@requires_gpu
@pytest.mark.parametrize("shape", [(1,), (7, 3), (1000, 37), (4099, 4099), (4096, 4096)])
def test_gpu_injective(shape):
    args, ref = chain(shape)
    f = jitop.build(cuda.schedule_injective(args[-1]), args, target="cuda")
    a, b, c = rand(shape), rand(shape, 1), rand(shape[-1:], 2)
    got = f(a, b, c)
    want = ref(a, b, c)
    np.testing.assert_allclose(got, want, rtol=8 * EPS32, atol=8 * EPS32)


@requires_gpu
@pytest.mark.parametrize("n", [0, 1, 1000, 100_003])
def test_gpu_injective_symbolic(n):
    args, ref = chain(("n",))
    f = jitop.build(cuda.schedule_injective(args[-1]), args, target="cuda")
    a, b, c = rand(n), rand(n, 1), rand(n, 2)
    np.testing.assert_allclose(f(a, b, c), ref(a, b, c), rtol=8 * EPS32, atol=8 * EPS32)


def matmul_bound(a, b):
    """|error| <= K * eps * sum_k |a_ik| |b_kj| (plus a tiny absolute term)."""
    k = a.shape[1]
    return (k + 2) * EPS32 * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)) + 1e-30


@requires_gpu
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (17, 13, 5), (1000, 999, 77), (64, 64, 64), (129, 257, 131),
                                   (1024, 1024, 1024)])
def test_gpu_matmul(m, n, k):
    A, B, C = mm(m, n, k)
    f = jitop.build(cuda.schedule_matmul(C), [A, B, C], target="cuda")
    a, b = rand((m, k)), rand((k, n), 1)
    got = f(a, b)
    err = np.abs(got - a.astype(np.float64) @ b)
    assert np.all(err <= matmul_bound(a, b)), err.max()


@requires_gpu
@pytest.mark.parametrize("cfg", [{"bm": 128, "bn": 128, "bk": 16, "tm": 8, "tn": 8},
                                 {"bm": 128, "bn": 64, "bk": 8, "tm": 8, "tn": 4},
                                 {"bm": 32, "bn": 32, "bk": 4, "tm": 2, "tn": 2},
                                 {"bm": 128, "bn": 128, "bk": 16, "tm": 8, "tn": 8, "stages": 2},
                                 {"bm": 32, "bn": 32, "bk": 4, "tm": 2, "tn": 2, "stages": 2}])
def test_gpu_matmul_configs(cfg):
    A, B, C = mm(300, 200, 100)
    f = jitop.build(cuda.schedule_matmul(C, cfg), [A, B, C], target="cuda")
    a, b = rand((300, 100)), rand((100, 200), 1)
    assert np.all(np.abs(f(a, b) - a.astype(np.float64) @ b) <= matmul_bound(a, b))


@requires_gpu
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (100, 70, 33), (2000, 3000, 500)])
def test_gpu_matmul_symbolic(m, n, k):
    A, B, C = mm("m", "n", "k")
    f = jitop.build(cuda.schedule_matmul(C, {"bm": 64, "bn": 64, "bk": 8, "tm": 4, "tn": 4}), [A, B, C],
                    target="cuda")
    a, b = rand((m, k)), rand((k, n), 1)
    assert np.all(np.abs(f(a, b) - a.astype(np.float64) @ b) <= matmul_bound(a, b))


@requires_gpu
def test_gpu_matmul_device_arrays():
    from jitop.runtime.cuda import memory
    A, B, C = mm(512, 256, 128)
    f = jitop.build(cuda.schedule_matmul(C), [A, B, C], target="cuda")
    a, b = rand((512, 128)), rand((128, 256), 1)
    out = f(memory.to_device(a), memory.to_device(b))
    assert np.all(np.abs(out.get() - a.astype(np.float64) @ b) <= matmul_bound(a, b))


def softmax_ref(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def layer_norm_ref(x, g, b, eps=1e-5):
    x = x.astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * g + b


@requires_gpu
@pytest.mark.parametrize("m,n", [(1, 1), (3, 17), (33, 100), (5, 4099), (64, 4096), (3, 20000)])
def test_gpu_softmax(m, n):
    X, Y = rows_op("softmax", m, n)
    f = jitop.build(cuda.schedule_row_reduce(Y), [X, Y], target="cuda")
    x = rand((m, n)) * 3
    want = softmax_ref(x)
    # the sum has n terms (n eps relative error), each exp a few ulps
    assert np.all(np.abs(f(x) - want) <= (n + 16) * EPS32 * want + 1e-30)


@requires_gpu
@pytest.mark.parametrize("m,n", [(1, 1), (3, 17), (33, 100), (5, 4099), (64, 4096), (3, 20000)])
def test_gpu_layer_norm(m, n):
    X, g, b, Y = rows_op("layer_norm", m, n)
    f = jitop.build(cuda.schedule_row_reduce(Y), [X, g, b, Y], target="cuda")
    x, gv, bv = rand((m, n)) + 2, rand(n, 1), rand(n, 2)
    want = layer_norm_ref(x, gv, bv)
    xhat = layer_norm_ref(x, np.ones(n), np.zeros(n))
    # mean and variance are sums of n terms: n eps relative to the row's scale, through 1/std to x-hat
    scale = np.abs(x).max(axis=1, keepdims=True) / np.sqrt(x.astype(np.float64).var(axis=1, keepdims=True) + 1e-5)
    bound = 4 * (n + 16) * EPS32 * (np.abs(xhat) + scale) * np.abs(gv) + 4 * EPS32 * np.abs(bv)
    assert np.all(np.abs(f(x, gv, bv) - want) <= bound + 1e-6)


# ** conv2d as an implicit GEMM **

# ResNet-50's conv layers (C, H, K, R, stride, pad), as benchmarks/bench_gpu.py measures them at batch 8 and 32
RESNET50_CONVS = [(64, 56, 64, 1, 1, 0), (64, 56, 64, 3, 1, 1), (64, 56, 256, 1, 1, 0), (128, 28, 128, 3, 1, 1),
                  (256, 14, 256, 3, 1, 1), (512, 7, 512, 3, 1, 1), (1024, 14, 256, 1, 1, 0), (3, 224, 64, 7, 2, 3)]

# (N, C, H, W, K, R, S, stride, pad, dilation): odd shapes (1x1, stride 2, padding, a 7x7 stem on C=3, sizes that
# no tile divides, N=1, a rectangular image and filter, dilation)
CONV_SHAPES = [
    (1, 3, 9, 9, 5, 3, 3, 1, 1, 1),
    (2, 16, 14, 14, 32, 1, 1, 1, 0, 1),
    (1, 3, 32, 32, 64, 7, 7, 2, 3, 1),
    (3, 17, 13, 11, 19, 3, 3, 2, 1, 1),
    (2, 8, 15, 15, 24, 3, 5, 1, (1, 2), 1),
    (1, 5, 12, 12, 7, 3, 3, 1, 2, 2),
    (1, 64, 7, 7, 96, 3, 3, 1, 1, 1),
]


def conv(n, c, h, w, k, r, s, stride=1, pad=0, dil=1):
    X = te.placeholder((n, c, h, w), name="X")
    W = te.placeholder((k, c, r, s), name="W")
    return X, W, cuda.conv2d_nchw(X, W, stride, pad, dil)


def conv_ref(x, w, stride, pad, dil):
    """float64 cross-correlation (torch's conv2d), and the bound C*R*S * eps * sum|x||w| of a float32 result."""
    (sh, sw), (ph, pw), (dh, dw) = ((v, v) if isinstance(v, int) else v for v in (stride, pad, dil))
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    p, q = (h + 2 * ph - dh * (r - 1) - 1) // sh + 1, (wd + 2 * pw - dw * (s - 1) - 1) // sw + 1
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    y, mag = np.zeros((n, k, p, q)), np.zeros((n, k, p, q))
    for i in range(r):
        for j in range(s):
            patch = xp[:, :, i * dh: i * dh + sh * (p - 1) + 1: sh, j * dw: j * dw + sw * (q - 1) + 1: sw]
            tap = w[:, :, i, j].astype(np.float64)
            y += np.einsum("nchw,kc->nkhw", patch, tap)
            mag += np.einsum("nchw,kc->nkhw", np.abs(patch), np.abs(tap))
    return y, (c * r * s + 2) * EPS32 * mag + 1e-30


def conv_gemm_sizes(Y):
    g = Y.op.input_tensors[0]
    return g.shape[0], g.shape[1], g.op.reduce_axis[0].extent


def check_conv_ir(func, Y, cfg):
    k, npq, crs = conv_gemm_sizes(Y)
    bm, bn, bk, tm, tn = (cfg[x] for x in cuda.MATMUL_KEYS)
    b = bound(func)
    assert b.get("blockIdx.y") == [-(-k // bm)] or (k <= bm and "blockIdx.y" not in b)
    assert b.get("blockIdx.x") == [-(-npq // bn)] or (npq <= bn and "blockIdx.x" not in b)
    assert set(b["threadIdx.y"]) == {bm // tm} and set(b["threadIdx.x"]) == {bn // tn}
    shared = allocations(func, "shared")
    assert set(shared) == {"W.T.shared", "X.col.shared"}  # the views are inlined into the tiles, never stored
    if k >= bm and npq >= bn and crs >= bk:
        assert shared["W.T.shared"] == (bk, bm) and shared["X.col.shared"] == (bk, bn)
    local = allocations(func, "local")
    assert set(local) >= {"conv2d.gemm.local"}
    if k >= bm and npq >= bn:
        assert local["conv2d.gemm.local"] == (tm, tn)
    assert count(func, Barrier) >= 2 and count(func, Barrier) % 2 == 0
    text = str(func)
    assert "conv2d.gemm[" not in text and "X.col[" not in text and "W.T[" not in text  # nothing else in memory
    for d, tile in ((k, bm), (npq, bn), (crs, bk)):
        if d % tile:
            assert f"< {d}" in text, f"no guard against the size {d} in\n{text}"


def test_conv2d_nchw_compute():
    """The computation itself (default CPU schedule) against the float64 reference."""
    for shape in CONV_SHAPES[:4]:
        n, c, h, w, k, r, s, stride, pad, dil = shape
        X, W, Y = conv(*shape)
        f = jitop.build(jitop.create_schedule(Y), [X, W, Y])
        x, wt = rand((n, c, h, w)), rand((k, c, r, s), 1)
        got = np.zeros(Y.shape, np.float32)
        f(x, wt, got)
        want, tol = conv_ref(x, wt, stride, pad, dil)
        assert np.all(np.abs(got - want) <= tol), shape


def test_conv2d_nchw_shapes_and_errors():
    X, W, Y = conv(2, 3, 224, 224, 64, 7, 7, 2, 3)
    assert Y.shape == (2, 64, 112, 112) and conv_gemm_sizes(Y) == (64, 2 * 112 * 112, 3 * 49)
    assert conv(1, 4, 10, 12, 8, 3, 5, (2, 1), (0, 2), 2)[2].shape == (1, 8, 3, 8)
    with pytest.raises(ValueError, match="channels"):
        cuda.conv2d_nchw(te.placeholder((1, 3, 8, 8), name="X"), te.placeholder((4, 2, 3, 3), name="W"))
    with pytest.raises(ValueError, match="does not fit"):
        cuda.conv2d_nchw(te.placeholder((1, 3, 2, 2), name="X"), te.placeholder((4, 3, 3, 3), name="W"))
    x8, w3 = te.placeholder((1, 3, 8, 8), name="X"), te.placeholder((4, 3, 3, 3), name="W")
    with pytest.raises(TypeError, match="conv2d_nchw: 'stride' must be an int or a pair of ints, got 1.5"):
        cuda.conv2d_nchw(x8, w3, stride=1.5)
    with pytest.raises(ValueError, match=r"conv2d_nchw: 'dilation' must be >= 1, got \(1, 0\)"):
        cuda.conv2d_nchw(x8, w3, dilation=(1, 0))
    with pytest.raises(ValueError, match="conv2d_nchw: 'padding' must be >= 0, got -1"):
        cuda.conv2d_nchw(x8, w3, padding=-1)
    with pytest.raises(ValueError, match="not a conv2d_nchw"):
        cuda.schedule_conv2d(mm(8, 8, 8)[2])
    with pytest.raises(ValueError, match="multiples"):
        cuda.schedule_conv2d(Y, {"bm": 64, "bn": 64, "bk": 8, "tm": 3, "tn": 4})


@pytest.mark.parametrize("shape", CONV_SHAPES)
def test_conv2d_odd_shapes(shape):
    X, W, Y = conv(*shape)
    cfg = cuda.default_conv2d_config(*conv_gemm_sizes(Y))
    s = cuda.schedule_conv2d(Y)
    func = jitop.lower(s, [X, W, Y])
    check_conv_ir(func, Y, cfg)
    if shape[8] != 0:
        assert "select(" in str(func)  # the padding: out-of-image taps read 0
    f = build(s, [X, W, Y])
    assert len(f.built.kernels) == 1
    assemble(f.get_source("ptx"))


@pytest.mark.parametrize("cfg", [{"bm": 128, "bn": 128, "bk": 16, "tm": 8, "tn": 8},
                                 {"bm": 32, "bn": 64, "bk": 8, "tm": 4, "tn": 4},
                                 {"bm": 32, "bn": 32, "bk": 4, "tm": 2, "tn": 2}])
def test_conv2d_configs(cfg):
    X, W, Y = conv(2, 20, 15, 15, 40, 3, 3, 1, 1)
    s = cuda.schedule_conv2d(Y, cfg)
    check_conv_ir(jitop.lower(s, [X, W, Y]), Y, cfg)
    (launch,) = build(s, [X, W, Y]).built.kernels
    assert launch.block == (cfg["bn"] // cfg["tn"], cfg["bm"] // cfg["tm"], 1)


def test_default_conv2d_config_fills_the_gpu():
    for batch in (8, 32):
        for c, h, k, r, stride, pad in RESNET50_CONVS:
            Y = conv(batch, c, h, h, k, r, r, stride, pad)[2]
            k_, npq, crs = conv_gemm_sizes(Y)
            cfg = cuda.default_conv2d_config(k_, npq, crs)
            blocks = -(-k_ // cfg["bm"]) * -(-npq // cfg["bn"])
            assert blocks >= cuda.DEFAULT_TARGET.sm_count or (cfg["bm"], cfg["bn"]) == (32, 32), (batch, c, cfg)
            assert cfg["bm"] <= max(32, k_)


@pytest.mark.parametrize("batch", [8, 32])
@pytest.mark.parametrize("layer", RESNET50_CONVS)
def test_conv2d_resnet50_no_spills(layer, batch):
    """The default tiles of every benchmarked layer assemble without spills, in at most 128 registers (two
    blocks of 256 threads, or four of 128, per SM)."""
    c, h, k, r, stride, pad = layer
    X, W, Y = conv(batch, c, h, h, k, r, r, stride, pad)
    s = cuda.schedule_conv2d(Y)
    f = build(s, [X, W, Y])
    report = assemble(f.get_source("ptx"))
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report
    assert report["registers"] <= 128, report


@requires_gpu
@pytest.mark.parametrize("shape", CONV_SHAPES)
def test_gpu_conv2d(shape):
    n, c, h, w, k, r, s, stride, pad, dil = shape
    X, W, Y = conv(*shape)
    f = jitop.build(cuda.schedule_conv2d(Y), [X, W, Y], target="cuda")
    x, wt = rand((n, c, h, w)), rand((k, c, r, s), 1)
    want, tol = conv_ref(x, wt, stride, pad, dil)
    err = np.abs(f(x, wt) - want)
    assert np.all(err <= tol), (err.max(), shape)


@requires_gpu
@pytest.mark.parametrize("layer", [RESNET50_CONVS[1], RESNET50_CONVS[5], RESNET50_CONVS[6], RESNET50_CONVS[7]])
def test_gpu_conv2d_resnet50(layer):
    c, h, k, r, stride, pad = layer
    n = 2
    X, W, Y = conv(n, c, h, h, k, r, r, stride, pad)
    f = jitop.build(cuda.schedule_conv2d(Y), [X, W, Y], target="cuda")
    x, wt = rand((n, c, h, h)), rand((k, c, r, r), 1)
    want, tol = conv_ref(x, wt, stride, pad, 1)
    err = np.abs(f(x, wt) - want)
    assert np.all(err <= tol), err.max()


@requires_gpu
@pytest.mark.parametrize("cfg", [{"bm": 128, "bn": 128, "bk": 16, "tm": 8, "tn": 8},
                                 {"bm": 32, "bn": 32, "bk": 4, "tm": 2, "tn": 2},
                                 {"bm": 64, "bn": 64, "bk": 8, "tm": 4, "tn": 4, "stages": 2}])
def test_gpu_conv2d_configs(cfg):
    X, W, Y = conv(2, 20, 15, 15, 40, 3, 3, 2, 1)
    f = jitop.build(cuda.schedule_conv2d(Y, cfg), [X, W, Y], target="cuda")
    x, wt = rand((2, 20, 15, 15)), rand((40, 20, 3, 3), 1)
    want, tol = conv_ref(x, wt, 2, 1, 1)
    assert np.all(np.abs(f(x, wt) - want) <= tol)
