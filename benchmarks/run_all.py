"""Run the benchmarks and write benchmarks/RESULTS.md (the figures, the commands, the machine).

    python benchmarks/run_all.py              # every benchmark
    python benchmarks/run_all.py chain gemm   # re-run only these sections, keep the others
"""
from __future__ import annotations

import datetime
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
BENCHES = [("GEMM walk-through (issue 2)", ["bench_gemm.py", "--sizes", "1024", "2048"]),
           ("Elementwise chain (issue 2)", ["bench_chain.py"]),
           ("Compile and load time (issue 2)", ["bench_compile.py"]),
           ("Parallel launch overhead (issue 2)", ["bench_launch.py"]),
           ("@jitop.kernel targets (issue 3)", ["bench_kernel.py"]),
           ("Operator library, default configs (issue 4)", ["bench_ops.py"])]


def _old_sections() -> dict[str, str]:
    path = HERE / "RESULTS.md"
    if not path.exists():
        return {}
    chunks = path.read_text().split("\n## ")[1:]
    return {c.split("\n", 1)[0]: "## " + c.rstrip() + "\n" for c in chunks}


def main() -> None:
    only = sys.argv[1:]
    old = _old_sections()
    parts = ["# Benchmark results\n\nWritten by `python benchmarks/run_all.py [names]`. Each section is one "
             "command's output, run in one go, with the date it ran; figures of different sections were measured "
             "at different times.\n"]
    for title, argv in BENCHES:
        if only and not any(o in argv[0] for o in only) and title in old:
            parts.append(old[title])
            continue
        cmd = ["python", f"benchmarks/{argv[0]}", *argv[1:]]
        print(f"running {' '.join(cmd)}", flush=True)
        out = subprocess.run([sys.executable, str(HERE / argv[0]), *argv[1:]], capture_output=True, text=True,
                             check=True, cwd=HERE.parent).stdout
        parts.append(f"## {title}\n\nCommand: `{' '.join(cmd)}` (run {datetime.date.today().isoformat()})\n\n"
                     f"{out.strip()}\n")
    (HERE / "RESULTS.md").write_text("\n".join(parts))
    print("wrote benchmarks/RESULTS.md")


if __name__ == "__main__":
    main()
