"""Run the benchmarks and write benchmarks/RESULTS.md (the figures, the commands, the machine).

    python benchmarks/run_all.py              # every benchmark
    python benchmarks/run_all.py chain gemm   # re-run only these sections, keep the others
    python benchmarks/run_all.py --quick      # smoke test: small sizes, printed only, RESULTS.md untouched
    JITOP_CPU=haswell OPENBLAS_CORETYPE=Haswell python benchmarks/run_all.py gemm ops   # the AVX2 sections

The code is built for jitop.Target.current(): the host, or the CPU JITOP_CPU names. The FP32 peak of that
Target is measured once here (benchmarks/peak.py) and handed to every script through JITOP_BENCH_PEAK (a
script whose Target differs, e.g. another thread count, measures its own). With JITOP_CPU set, the sections
are titled with it ("... [JITOP_CPU=haswell]") and written next to the host's sections, which are kept.
"""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# (title, script and arguments, arguments of a --quick run)
BENCHES = [("GEMM walk-through (issue 2)", ["bench_gemm.py", "--sizes", "1024", "2048"],
            ["bench_gemm.py", "--sizes", "256", "--skip-slow"]),
           ("Elementwise chain (issue 2)", ["bench_chain.py"], ["bench_chain.py", "--n", "1048576"]),
           ("Compile and load time (issue 2)", ["bench_compile.py"], ["bench_compile.py"]),
           ("Parallel launch overhead (issue 2)", ["bench_launch.py"], ["bench_launch.py"]),
           ("@jitop.kernel targets (issue 3)", ["bench_kernel.py"],
            ["bench_kernel.py", "--n", "1048576", "--rows", "512", "--cols", "256"]),
           ("Operator library, default configs (issue 4)", ["bench_ops.py"], ["bench_ops.py", "--quick"]),
           ("Models: GPT-2 block, decode step, MLP, ResNet block (issue 10)", ["bench_models.py"],
            ["bench_models.py", "--quick"]),
           ("Auto-tuning (issue 11)", ["bench_tune.py"], ["bench_tune.py", "--quick"]),
           ("Persistent kernel cache: cold vs warm processes (issue 12)", ["bench_cache.py"],
            ["bench_cache.py", "--quick"]),
           ("Background tuning with hot swap (issue 13)", ["bench_background.py"], ["bench_background.py", "--quick"]),
           ("Calls during a background rebuild (issue 13)", ["bench_swap.py"], ["bench_swap.py", "--runs", "1"]),
           ("Predicted configs on unseen convolutions (issue 13)", ["bench_predict.py"],
            ["bench_predict.py", "--quick"]),
           ("Tuning on a Dask cluster: local pool vs LocalCluster (issue 13)", ["bench_dask.py"],
            ["bench_dask.py", "--quick"]),
           ("Programs whose shapes change (issue 23)", ["bench_shapes.py"], ["bench_shapes.py", "--quick"]),
           ("Symbolic vs specialised kernels (issue 23)", ["bench_symbolic.py"], ["bench_symbolic.py", "--quick"]),
           ("One-row matmuls (issue 23)", ["bench_gemv.py"], ["bench_gemv.py"]),
           ("In-place assignment compiled", ["bench_assignment.py"], ["bench_assignment.py", "--quick"]),
           ("ONNX models: jitop.onnx vs onnxruntime and torch", ["bench_onnx.py"], ["bench_onnx.py", "--quick"])]
PREAMBLE = ("# Benchmark results\n\nWritten by `python benchmarks/run_all.py [names]` (see benchmarks/README.md). "
            "Each section is one command's output, run in one go, with the date it ran; figures of different "
            "sections were measured at different times. Each header states the jitop Target the code was built "
            "for and the FP32 peak measured at the start of that run; sections titled [JITOP_CPU=...] were built "
            "for that CPU (e.g. AVX2 code on an AVX-512 machine).\n")


def _old_sections(path: pathlib.Path) -> dict[str, str]:
    if not path.exists():
        return {}
    chunks = path.read_text().split("\n## ")[1:]
    return {c.split("\n", 1)[0]: "## " + c.rstrip() + "\n" for c in chunks}


def _title(title: str) -> str:
    cpu = os.environ.get("JITOP_CPU")
    return f"{title} [JITOP_CPU={cpu}]" if cpu else title


def _env_prefix() -> str:
    return "".join(f"{var}={os.environ[var]} " for var in ("JITOP_CPU", "OPENBLAS_CORETYPE") if os.environ.get(var))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help="run only benchmarks whose script name contains one of these")
    p.add_argument("--quick", action="store_true",
                   help="small sizes, output printed only (RESULTS.md is not written unless --out is given)")
    p.add_argument("--out", type=pathlib.Path, default=None,
                   help="file to write (default benchmarks/RESULTS.md; none with --quick)")
    args = p.parse_args()
    out_path = args.out or (None if args.quick else HERE / "RESULTS.md")

    from jitop import Target
    from peak import export_env, peak
    print(f"Target: {Target.current().describe()}\n{peak().describe()}", flush=True)
    export_env()  # the scripts reuse this measurement

    old = _old_sections(out_path) if out_path else {}
    sections = dict(old)  # sections not re-run are kept, in their order
    failed: list[str] = []
    for title, argv, quick_argv in BENCHES:
        argv = quick_argv if args.quick else argv
        if args.names and not any(o in argv[0] for o in args.names):
            continue
        cmd = f"{_env_prefix()}python benchmarks/{' '.join(argv)}"
        print(f"running {cmd}", flush=True)
        proc = subprocess.run([sys.executable, str(HERE / argv[0]), *argv[1:]], capture_output=True, text=True,
                              cwd=HERE.parent)
        if proc.returncode != 0:  # report it, keep the section's old figures, go on with the others
            print(proc.stdout + proc.stderr, file=sys.stderr)
            print(f"FAILED: {cmd} (exit {proc.returncode}); its section is not updated", file=sys.stderr, flush=True)
            failed.append(cmd)
            continue
        if args.quick:
            print(proc.stdout, flush=True)
        sections[_title(title)] = (f"## {_title(title)}\n\nCommand: `{cmd}` (run {datetime.date.today().isoformat()})"
                                   f"\n\n{proc.stdout.strip()}\n")
    if out_path:
        out_path.write_text("\n".join([PREAMBLE, *sections.values()]))
        print(f"wrote {out_path}")
    if failed:
        raise SystemExit(f"{len(failed)} benchmark(s) failed: {'; '.join(failed)}")


if __name__ == "__main__":
    main()
