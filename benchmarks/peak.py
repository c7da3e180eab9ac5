"""The float32 FMA peak of the machine the benchmarks build for, measured at the start of a run.

A short loop built with jitop's own code generator for `jitop.Target.current()` (the host, or the CPU named
by JITOP_CPU: under JITOP_CPU=haswell it measures the AVX2 peak of an AVX-512 machine): `accumulators`
independent FMA chains `acc = fma(acc, x, y)` on full vector registers (<lanes x float>, lanes from the
Target), unrolled `unroll` times, all operands in registers, no loads or stores in the hot loop. Enough
independent chains hide the FMA latency (latency x FMA units, about 8 on current x86 cores; we use up to 12,
and at most the Target's vector registers minus 4, so nothing spills), so the loop runs at the FMA units'
throughput. It is compiled to object code with `jitop.codegen.target.compile_ir` for the Target, loaded
with `jitop.codegen.loader.load_object`, run on one thread (a direct call) and on `target.threads` threads
(one chain set per thread through jitop's own thread pool, `jitop_parallel_for`); each figure is the best of
several calls of ~20 ms. `check_asm` verifies the hot loop is what we meant (vfmadd on ymm/zmm, no memory
operand, no spill).

    python benchmarks/peak.py            # print the Target, the peak and the checks of the loop's assembly
    python benchmarks/peak.py --asm      # and the hot loop's assembly

A run of several scripts measures once: `export_env()` puts the figures in JITOP_BENCH_PEAK, and `peak()` in
a child process reuses them when the child's Target key (CPU, features, threads, ...) is the same.
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import functools
import json
import os
import re
import time

import numpy as np

from jitop.target import Target

ENV = "JITOP_BENCH_PEAK"
UNROLL = 4           # FMAs per chain per loop iteration (loop overhead well under 1 %)
CALL_SECONDS = 0.02  # length of one timed call
REPEAT = 5           # timed calls; the best counts


@dataclasses.dataclass(frozen=True)
class Peak:
    """Measured float32 FMA throughput of `target`; gflops_* is None where the code cannot run here."""

    target_key: str
    target: str                 # target.describe()
    isa: str
    lanes: int
    accumulators: int
    threads: int
    gflops_1: float | None      # one thread
    gflops_all: float | None    # `threads` threads
    asm_problems: tuple[str, ...] = ()
    note: str = ""
    op: str = "fma"             # "mul+add" on a CPU without FMA

    def per_thread(self, threads: int) -> float | None:
        """Peak for `threads` threads: the all-thread figure when that is what was measured, else scaled."""
        if self.gflops_1 is None or self.gflops_all is None:
            return None
        return self.gflops_all if threads == self.threads else self.gflops_1 * threads

    def describe(self) -> str:
        """One line for a benchmark header."""
        if self.gflops_1 is None:
            return f"FMA peak not measured ({self.note})"
        check = "" if not self.asm_problems else f" (WARNING: {'; '.join(self.asm_problems)})"
        if self.threads > 1 and self.gflops_all < 0.9 * self.threads * self.gflops_1:
            check += (f" (WARNING: the {self.threads}-thread figure is below {self.threads} x the 1-thread one: "
                      "other processes were using the CPU, so % of peak is overstated)")
        return (f"measured FP32 peak {self.gflops_1:.0f} GFLOP/s on 1 thread, {self.gflops_all:.0f} GFLOP/s on "
                f"{self.threads} threads ({self.accumulators} chains of <{self.lanes} x float> {self.op}){check}")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @staticmethod
    def from_json(text: str) -> "Peak":
        data = json.loads(text)
        data["asm_problems"] = tuple(data.get("asm_problems", ()))
        return Peak(**data)


def accumulators_for(target: Target) -> int:
    """Independent FMA chains: enough to hide latency x units (~8), leaving registers for x, y and spare."""
    return max(4, min(12, target.vector_registers - 4))


def fma_loop_ir(lanes: int, accumulators: int, unroll: int = UNROLL, fma: bool = True) -> str:
    """LLVM IR of `fma_body(i64 begin, i64 end, ptr closure)`, a `jitop_parallel_for` body (fma=False: a
    separate multiply and add per step, for CPUs without FMA, where llvm.fma would be a libm call).

    closure -> { i64 iters, ptr xy (2 vectors: x, y), ptr init (accumulators vectors), ptr out }. Task t in
    [begin, end) starts every chain from its own `init` vector (different memory: LLVM cannot merge the
    chains), runs `iters` x `unroll` fmas per chain and stores the chains' sum to out[t]."""
    vt = f"<{lanes} x float>"
    lines = [
        f"declare {vt} @llvm.fma.v{lanes}f32({vt}, {vt}, {vt})",
        "",
        "define void @fma_body(i64 %begin, i64 %end, ptr %closure) nounwind {",
        "entry:",
        "  %iters = load i64, ptr %closure",
        "  %xyp.a = getelementptr i8, ptr %closure, i64 8",
        "  %xyp = load ptr, ptr %xyp.a",
        "  %initp.a = getelementptr i8, ptr %closure, i64 16",
        "  %initp = load ptr, ptr %initp.a",
        "  %outp.a = getelementptr i8, ptr %closure, i64 24",
        "  %outp = load ptr, ptr %outp.a",
        f"  %x = load {vt}, ptr %xyp, align 4",
        f"  %yp = getelementptr {vt}, ptr %xyp, i64 1",
        f"  %y = load {vt}, ptr %yp, align 4",
        "  %any = icmp slt i64 %begin, %end",
        "  br i1 %any, label %task, label %done",
        "task:",
        "  %t = phi i64 [ %begin, %entry ], [ %t.next, %task.end ]",
    ]
    for j in range(accumulators):
        lines += [f"  %ip{j} = getelementptr {vt}, ptr %initp, i64 {j}",
                  f"  %init{j} = load {vt}, ptr %ip{j}, align 4"]
    lines += ["  br label %loop", "loop:", "  %i = phi i64 [ 0, %task ], [ %i.next, %loop ]"]
    for j in range(accumulators):
        lines.append(f"  %a{j}.0 = phi {vt} [ %init{j}, %task ], [ %a{j}.{unroll}, %loop ]")
    for u in range(unroll):
        for j in range(accumulators):  # chains interleaved: consecutive fmas are independent
            if fma:
                lines.append(f"  %a{j}.{u + 1} = call {vt} @llvm.fma.v{lanes}f32({vt} %a{j}.{u}, {vt} %x, {vt} %y)")
            else:  # no fast-math flags: LLVM keeps the multiply and the add
                lines += [f"  %m{j}.{u} = fmul {vt} %a{j}.{u}, %x", f"  %a{j}.{u + 1} = fadd {vt} %m{j}.{u}, %y"]
    lines += ["  %i.next = add i64 %i, 1",
              "  %more = icmp slt i64 %i.next, %iters",
              "  br i1 %more, label %loop, label %task.end",
              "task.end:"]
    total = f"%a0.{unroll}"
    for j in range(1, accumulators):
        lines.append(f"  %s{j} = fadd {vt} {total}, %a{j}.{unroll}")
        total = f"%s{j}"
    lines += [f"  %op = getelementptr {vt}, ptr %outp, i64 %t",
              f"  store {vt} {total}, ptr %op, align 4",
              "  %t.next = add i64 %t, 1",
              "  %last = icmp eq i64 %t.next, %end",
              "  br i1 %last, label %done, label %task",
              "done:",
              "  ret void",
              "}"]
    return "\n".join(lines) + "\n"


def has_fma(target: Target) -> bool:
    return "fma" in target.required_features


def _arith(target: Target) -> str:
    """The instruction the hot loop should be made of."""
    return "vfmadd" if has_fma(target) else "mulps"


def hot_loop(asm: str, op: str = "vfmadd") -> str:
    """The assembly of the block with the most `op` instructions (the measured loop)."""
    blocks = re.split(r"\n(?=\.LBB|\S+:)", asm)
    return max(blocks, key=lambda b: b.count(op), default="")


def check_asm(asm: str, target: Target, accumulators: int, unroll: int = UNROLL) -> list[str]:
    """What is wrong with the measured loop's machine code (empty: FMA-bound as intended)."""
    op = _arith(target)
    loop = hot_loop(asm, op)
    reg = {64: "zmm", 32: "ymm"}.get(target.vector_bytes, "xmm")
    fmas = [line for line in loop.splitlines() if op in line]
    problems = []
    if len(fmas) < accumulators * unroll:
        problems.append(f"hot loop has {len(fmas)} {op}, expected {accumulators * unroll}")
    wrong = [f for f in fmas if f"%{reg}" not in f]
    if wrong:
        problems.append(f"{len(wrong)} {op} not on {reg} registers")
    if any("(" in f for f in fmas):
        problems.append(f"{op} with a memory operand in the hot loop")
    if re.search(r"\(%rsp\)|\(%rbp\)", loop):
        problems.append("stack access in the hot loop (spills)")
    return problems


@functools.cache
def _compiled(target: Target) -> tuple[str, bytes, int, int]:
    """(assembly, object code, lanes, accumulators) of the FMA loop for `target`."""
    from jitop.codegen.target import compile_ir, target_machine

    lanes, acc = target.lanes(4), accumulators_for(target)
    mod, obj = compile_ir(fma_loop_ir(lanes, acc, fma=has_fma(target)), target)
    return target_machine(target).emit_assembly(mod), obj, lanes, acc


class _Closure(ctypes.Structure):
    _fields_ = [("iters", ctypes.c_int64), ("xy", ctypes.c_void_p), ("init", ctypes.c_void_p),
                ("out", ctypes.c_void_p)]


def measure(target: Target | None = None, call_seconds: float = CALL_SECONDS, repeat: int = REPEAT) -> Peak:
    """Build the FMA loop for `target` (default: Target.current()) and time it on 1 and target.threads threads."""
    from jitop.codegen.loader import load_object
    from jitop.errors import TargetMismatchError
    from jitop.runtime import parallel

    target = target or Target.current()
    asm, obj, lanes, acc = _compiled(target)
    problems = tuple(check_asm(asm, target, acc))
    fields = dict(target_key=target.key, target=target.describe(), isa=target.isa, lanes=lanes, accumulators=acc,
                  threads=target.threads, asm_problems=problems,
                  op="fma" if has_fma(target) else "mul+add")
    try:
        target.check_runs_on(what="the FMA peak loop")
    except TargetMismatchError as e:
        return Peak(gflops_1=None, gflops_all=None, note=str(e).split(";")[0], **fields)

    body_addr = load_object(obj, ["fma_body"])["fma_body"]
    body = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)(body_addr)
    threads = target.threads
    xy = np.concatenate([np.full(lanes, 0.999, np.float32), np.full(lanes, 1e-3, np.float32)])  # acc -> ~1
    init = np.arange(acc * lanes, dtype=np.float32) / (acc * lanes)
    out = np.zeros((max(threads, 1), lanes), np.float32)
    closure = _Closure(1, xy.ctypes.data, init.ctypes.data, out.ctypes.data)
    flops_per_iter = 2.0 * lanes * acc * UNROLL

    def call(tasks: int) -> float:
        t0 = time.perf_counter()
        if tasks == 1:
            body(0, 1, ctypes.addressof(closure))
        else:
            parallel.run_parallel(body_addr, ctypes.addressof(closure), tasks)
        return time.perf_counter() - t0

    def best(tasks: int) -> float:
        closure.iters = 1 << 12  # calibrate one call to ~call_seconds
        call(tasks)
        while (t := call(tasks)) < call_seconds / 8:
            closure.iters *= 4
        closure.iters = max(1, int(closure.iters * call_seconds / t))
        secs = min(call(tasks) for _ in range(repeat))
        if not np.isfinite(out[:tasks]).all():
            raise RuntimeError("the FMA peak loop produced non-finite values")
        return flops_per_iter * closure.iters * tasks / secs / 1e9

    old_threads = parallel.get_num_threads()
    try:
        g1 = best(1)
        if threads > 1:
            parallel.set_num_threads(threads)
            gall = best(threads)
        else:
            gall = g1
    finally:
        parallel.set_num_threads(old_threads)
    return Peak(gflops_1=g1, gflops_all=gall, **fields)


@functools.cache
def _peak_for(key: str) -> Peak:
    env = os.environ.get(ENV)
    if env:
        try:
            p = Peak.from_json(env)
            if p.target_key == key:
                return p
        except (ValueError, TypeError, KeyError):
            pass
    return measure()


def peak() -> Peak:
    """The peak of Target.current(), measured once per process (or taken from JITOP_BENCH_PEAK when a parent
    process measured it for the same Target)."""
    return _peak_for(Target.current().key)


def export_env(p: Peak | None = None) -> None:
    """Hand the peak to child processes (they reuse it when their Target key is the same)."""
    os.environ[ENV] = (p or peak()).to_json()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--asm", action="store_true", help="print the hot loop's assembly")
    args = ap.parse_args()
    target = Target.current()
    p = measure(target)
    print(f"Target: {target.describe()} [{target.key}]")
    print(p.describe())
    print("hot loop check: " + (f"{_arith(target)} on registers only, no memory operands, no spills"
                                if not p.asm_problems else "; ".join(p.asm_problems)))
    if args.asm:
        print(hot_loop(_compiled(target)[0], _arith(target)))


if __name__ == "__main__":
    main()
