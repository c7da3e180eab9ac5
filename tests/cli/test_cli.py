"""The `jitop` command end to end, each command in a subprocess (`python -m jitop ...`) with a cache
directory of the test's own, so the real console behaviour is tested: exit codes, stdout and stderr, and
what one process leaves in the cache for the next (tuned configs, the workload log, kernels).

One tuning run (`tune --script`, 4 random trials) is shared by the module; tests that change a cache work on
a copy of it. Every program the tests write keeps the `if __name__ == "__main__":` guard: the tuner's
measurement workers are spawned processes.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from jitop.tuner import records as rec_io

TUNE = ["tune", "--trials", "4", "--tuner", "random", "--no-progress"]

PROG = textwrap.dedent('''\
    import sys

    import numpy as np

    import jitop


    @jitop.kernel
    def mlp(x, w1, w2):
        return np.maximum(x @ w1, 0) @ w2


    if __name__ == "__main__":
        m = int(sys.argv[1]) if len(sys.argv) > 1 else 48
        rng = np.random.default_rng(0)
        x = rng.standard_normal((m, 40)).astype(np.float32)
        w1 = rng.standard_normal((40, 40)).astype(np.float32)
        w2 = rng.standard_normal((40, 40)).astype(np.float32)
        for _ in range(3):
            y = mlp(x, w1, w2)
        np.testing.assert_allclose(y, np.maximum(x @ w1, 0) @ w2, rtol=1e-4, atol=1e-4)
        print(f"PROG ran m={m} args={sys.argv[1:]}")
        print("TEMPLATES", list(mlp.cache.values())[0].exe.templates)
''')


def env_for(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "JITOP_CACHE"}
    return {**env, "JITOP_CACHE_DIR": str(cache), **extra}


def run(cwd: Path, cache: Path, *args: str, timeout: float = 120, python: bool = False,
        **extra_env: str) -> subprocess.CompletedProcess:
    """`python -m jitop args...` (or `python args...` with python=True) in `cwd` with cache directory `cache`."""
    cmd = [sys.executable, *args] if python else [sys.executable, "-m", "jitop", *args]
    return subprocess.run(cmd, cwd=cwd, env=env_for(cache, **extra_env), capture_output=True, text=True,
                          timeout=timeout)


def show(r: subprocess.CompletedProcess) -> str:
    return f"exit {r.returncode}\n--- stdout:\n{r.stdout}\n--- stderr:\n{r.stderr}"


def write_prog(where: Path) -> Path:
    path = where / "prog.py"
    path.write_text(PROG)
    return path


def info_counts(r: subprocess.CompletedProcess) -> dict[str, int]:
    m = re.search(r"entries\s+(\d+) kernels, (\d+) tuned records, (\d+) logged workloads", r.stdout)
    assert m, show(r)
    return dict(zip(("kernels", "tuned", "workloads"), map(int, m.groups())))


def listed_keys(r: subprocess.CompletedProcess) -> set[str]:
    """The 12-digit task keys in `cache list --kind tuned`'s table."""
    assert r.returncode == 0, show(r)
    return set(re.findall(r"(?<![0-9a-f])[0-9a-f]{12}(?![0-9a-f])", r.stdout))


def templates_of(r: subprocess.CompletedProcess) -> str:
    """The program's printed template choices (it ran, with its own stdout)."""
    assert r.returncode == 0, show(r)
    lines = [line for line in r.stdout.splitlines() if line.startswith("TEMPLATES")]
    assert len(lines) == 1, show(r)
    return lines[0]


@dataclass
class Tuned:
    """The module's one tuning run: `tune --script prog.py <options> -- 48 marker` on a fresh cache."""

    dir: Path
    cache: Path
    result: subprocess.CompletedProcess
    out: Path
    tuned_list: subprocess.CompletedProcess   # `cache list --kind tuned` right after the run

    def copy(self, to: Path) -> Path:
        """A copy of the tuned cache (for tests that change it) and prog.py beside it; the new cache."""
        shutil.copytree(self.cache, to / "cache")
        write_prog(to)
        return to / "cache"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Tuned:
    where = tmp_path_factory.mktemp("tuned")
    write_prog(where)
    cache = where / "cache"
    # jitop's options after --script (they are jitop's, not the script's: --trials 4 and --out f.jsonl are
    # checked below), the script's own arguments after --
    result = run(where, cache, "tune", "--script", "prog.py", *TUNE[1:], "--out", "f.jsonl", "--", "48", "marker",
                 timeout=600)
    listing = run(where, cache, "cache", "list", "--kind", "tuned")
    return Tuned(where, cache, result, where / "f.jsonl", listing)


# 1. tune --script end to end


def test_tune_script_runs_the_program_tunes_and_prints_the_table(tuned: Tuned) -> None:
    r = tuned.result
    assert r.returncode == 0, show(r)
    assert "PROG ran m=48 args=['48', 'marker']" in r.stdout  # the script ran with its own arguments
    lines = r.stdout.splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.split()[:4] == ["task", "calls", "default", "tuned"]]
    table = "\n".join(lines[start:])
    assert "matmul 48x40x40" in table and "program (tuned tasks)" in table
    assert "saved in the cache" in r.stdout and "f.jsonl" in r.stdout
    assert "FP32 FMA peak measured on this machine" in r.stdout, show(r)  # %peak: of the measured peak
    # the plan goes to stderr; --no-progress: no per-batch progress lines
    assert "tuning these workloads" in r.stderr and "__main__.mlp" in r.stderr, show(r)
    assert "trials |" not in r.stderr, show(r)


def test_tune_script_saves_the_task_in_the_cache(tuned: Tuned) -> None:
    listing = tuned.tuned_list
    assert listing.returncode == 0, show(listing)
    assert "tuned (1):" in listing.stdout and "matmul 48x40x40 float32" in listing.stdout, show(listing)
    info = run(tuned.dir, tuned.cache, "cache", "info")
    assert info.returncode == 0, show(info)
    assert f"directory   {tuned.cache}" in info.stdout
    counts = info_counts(info)
    assert counts["tuned"] >= 1 and counts["workloads"] >= 1, show(info)
    workloads = run(tuned.dir, tuned.cache, "cache", "list", "--kind", "workloads")
    assert workloads.returncode == 0 and "matmul 48x40x40" in workloads.stdout and "__main__.mlp" in workloads.stdout


def test_tune_out_writes_valid_records_and_the_cache_keeps_the_best(tuned: Tuned) -> None:
    recs = rec_io.load(tuned.out)
    assert len(recs) == 4 and len(tuned.out.read_text().splitlines()) == 4
    assert {(r.task.template, r.task.workload.m, r.task.workload.n, r.task.workload.k) for r in recs} \
        == {("matmul", 48, 40, 40)}
    best = rec_io.best(recs)
    assert len(best) == 1
    (key, fastest), = best.items()
    assert key[:12] in listed_keys(tuned.tuned_list)
    # `cache export -` writes the stored record to stdout: the fastest of the run
    exported = run(tuned.dir, tuned.cache, "cache", "export", "-")
    assert exported.returncode == 0, show(exported)
    assert "exported 1 tuned records to -" in exported.stderr
    (stored,) = [rec_io.Record.from_json(line) for line in exported.stdout.splitlines() if line.strip()]
    assert stored.task.key == key and stored.config == fastest.config


# 2. a new process picks the tuned config with no code change


def test_a_new_process_compiles_with_the_tuned_config(tuned: Tuned, tmp_path: Path) -> None:
    cache = tuned.copy(tmp_path)
    r = run(tmp_path, cache, "prog.py", "48", python=True)
    line = templates_of(r)
    assert "tuned config" in line and "from the cache" in line, line
    assert "default config" not in line, line


# 3. tune with no arguments: the workload log


@pytest.mark.slow
def test_tune_without_arguments_tunes_the_logged_workloads(tmp_path: Path) -> None:
    write_prog(tmp_path)
    cache = tmp_path / "cache"
    plain = run(tmp_path, cache, "prog.py", "32", python=True)  # the log is flushed at exit
    assert "default config" in templates_of(plain)
    r = run(tmp_path, cache, *TUNE, timeout=600)
    assert r.returncode == 0, show(r)
    assert "tuning these workloads" in r.stderr and "__main__.mlp" in r.stderr, show(r)
    assert r.stdout.splitlines()[0].split()[:4] == ["task", "calls", "default", "tuned"], show(r)
    assert "matmul 32x40x40" in r.stdout, show(r)
    after = run(tmp_path, cache, "cache", "list", "--kind", "tuned")
    assert "matmul 32x40x40" in after.stdout, show(after)


@pytest.mark.slow
def test_tune_on_a_local_dask_cluster_writes_the_usual_records(tuned: Tuned, tmp_path: Path) -> None:
    cache = tuned.copy(tmp_path)
    # one worker: the flag's wiring is under test here (tests/tuner/test_dask.py runs a cluster of two)
    r = run(tmp_path, cache, *TUNE, "--cluster", "local:1", "--out", "c.jsonl", timeout=600)
    assert r.returncode == 0, show(r)
    recs = rec_io.load(tmp_path / "c.jsonl")
    assert len(recs) == 4 and all(rec.result.ok for rec in recs), show(r)
    assert "matmul 48x40x40" in r.stdout, show(r)


# 4. export -> clear -> import


@pytest.mark.slow
def test_export_clear_import_restores_the_tuned_choices(tuned: Tuned, tmp_path: Path) -> None:
    cache = tuned.copy(tmp_path)
    before = listed_keys(run(tmp_path, cache, "cache", "list", "--kind", "tuned"))
    assert before
    exported = run(tmp_path, cache, "cache", "export", "ex.jsonl")
    assert exported.returncode == 0 and "exported 1 tuned records" in exported.stderr, show(exported)
    assert len(rec_io.load(tmp_path / "ex.jsonl")) == 1

    cleared = run(tmp_path, cache, "cache", "clear")
    assert cleared.returncode == 0 and "removed" in cleared.stdout, show(cleared)
    assert info_counts(run(tmp_path, cache, "cache", "info")) == {"kernels": 0, "tuned": 0, "workloads": 0}
    assert "default config" in templates_of(run(tmp_path, cache, "prog.py", "48", python=True))

    imported = run(tmp_path, cache, "cache", "import", "ex.jsonl")
    assert imported.returncode == 0, show(imported)
    assert "imported 1 of 1 records" in imported.stdout, show(imported)
    assert listed_keys(run(tmp_path, cache, "cache", "list", "--kind", "tuned")) == before
    line = templates_of(run(tmp_path, cache, "prog.py", "48", python=True))
    assert "tuned config" in line and "default config" not in line, line


# 5. bad input: a clear message and the right exit status


BOOM = 'if __name__ == "__main__":\n    raise RuntimeError("boom from the script")\n'
EXIT3 = 'import sys\nif __name__ == "__main__":\n    sys.exit(3)\n'


@pytest.mark.parametrize("args, files, status, expected", [
    (["tune", "--script", "missing.py"], {}, 2, ["jitop tune: ", "'missing.py' not found"]),
    (["tune", "--script"], {}, 2, ["jitop tune: ", "argument --script: expected one argument"]),
    (["tune", "--script", "prog.py", "--my-flag"], {}, 2, ["jitop tune: ", "unknown option '--my-flag'",
                                                          "after --", "--script prog.py -- --my-flag"]),
    (["explain", "prog.py", "48"], {}, 2, ["jitop explain: ", "unknown argument '48'", "jitop explain prog.py -- 48"]),
    (["tune", "--trials", "1", "--script", "boom.py"], {"boom.py": BOOM}, 1,
     ["Traceback (most recent call last)", "RuntimeError: boom from the script",
      "jitop tune: script 'boom.py' raised an exception"]),
    (["tune", "--trials", "1", "--script", "exit3.py"], {"exit3.py": EXIT3}, 1,
     ["jitop tune: script 'exit3.py' exited with status 3"]),
    (["tune", "--trials", "1"], {}, 1, ["jitop tune: ", "no tunable workload"]),
    (["tune", "--trials", "0"], {}, 2, ["jitop tune: ", "--trials must be a positive number, got 0"]),
    (["cache", "import", "missing.jsonl"], {}, 2, ["jitop cache: ", "'missing.jsonl' not found"]),
    (["cache", "import", "empty.jsonl"], {"empty.jsonl": ""}, 1, ["jitop cache: ", "holds no records"]),
    (["explain", "missing.py"], {}, 2, ["jitop explain: ", "'missing.py' not found"]),
    (["frobnicate"], {}, 2, ["invalid choice: 'frobnicate'"]),
    (["tune", "--trials", "2", "--budget", "1m"], {}, 2, ["not allowed with argument"]),
    (["tune", "--trials", "1", "--cluster", "local:0"], {}, 2, ["--cluster 'local:0': expected tcp://host:port or local:N"]),
    (["tune", "--trials", "1", "--cluster", "local:two"], {}, 2, ["--cluster 'local:two': expected"]),
], ids=["missing-script", "script-without-path", "unknown-option-before-dashes", "stray-argument-before-dashes",
        "script-raises", "script-exits-3", "empty-cache",
        "zero-trials", "import-missing", "import-empty", "explain-missing", "unknown-command",
        "trials-and-budget", "cluster-of-none", "cluster-not-a-number"])
def test_bad_input_exits_non_zero_with_a_message(tmp_path: Path, args: list[str], files: dict[str, str],
                                                 status: int, expected: list[str]) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    r = run(tmp_path, tmp_path / "cache", *args)
    assert r.returncode == status, show(r)
    for text in expected:
        assert text in r.stderr, show(r)
    assert "Traceback" not in r.stderr or "boom" in r.stderr, show(r)  # only the script's own traceback


def test_tune_with_an_unknown_tasks_filter_lists_the_workloads(tuned: Tuned) -> None:
    r = run(tuned.dir, tuned.cache, "tune", "--trials", "1", "--tasks", "nonexistent")
    assert r.returncode == 2, show(r)
    assert "jitop tune: --tasks filter 'nonexistent' matches none" in r.stderr, show(r)
    assert "matmul 48x40x40 float32" in r.stderr, show(r)  # the available workloads
    assert "Traceback" not in r.stderr


def test_tune_with_a_malformed_budget_is_a_usage_error(tuned: Tuned) -> None:
    r = run(tuned.dir, tuned.cache, "tune", "--budget", "soon", "--no-progress")
    assert r.returncode == 2, show(r)
    assert "jitop tune: " in r.stderr and "'soon'" in r.stderr and "Traceback" not in r.stderr, show(r)


def valid_record_line(tuned: Tuned) -> str:
    for line in tuned.out.read_text().splitlines():
        if line.strip() and rec_io.Record.from_json(line).result.ok:
            return line
    raise AssertionError("the tuning run measured no successful record")


def test_import_reports_invalid_lines_by_number_and_imports_the_valid_one(tuned: Tuned, tmp_path: Path) -> None:
    line = valid_record_line(tuned)
    (tmp_path / "mixed.jsonl").write_text(line + "\n" + '{"schema": 1, "bogus": true}\n' + "not json at all\n")
    cache = tmp_path / "cache"
    r = run(tmp_path, cache, "cache", "import", "mixed.jsonl")
    assert r.returncode == 1, show(r)
    assert "mixed.jsonl:2: skipped" in r.stderr and "mixed.jsonl:3: skipped" in r.stderr, show(r)
    assert "mixed.jsonl:1:" not in r.stderr, show(r)
    assert "jitop cache: 2 invalid line(s)" in r.stderr and "Traceback" not in r.stderr, show(r)
    assert "imported 1 of 3 records (2 invalid" in r.stdout, show(r)
    listing = run(tmp_path, cache, "cache", "list", "--kind", "tuned")
    assert "matmul 48x40x40 float32" in listing.stdout, show(listing)
    assert listed_keys(listing) == {rec_io.Record.from_json(line).task.key[:12]}


def test_import_reports_a_record_of_an_unknown_template_as_an_invalid_line(tuned: Tuned, tmp_path: Path) -> None:
    """A line naming a template this jitop does not have is a record it cannot read: reported by its
    number like any invalid line (exit 1), never a crash."""
    line = valid_record_line(tuned)
    data = json.loads(line)
    data["task"]["template"] = "no_such_template"
    (tmp_path / "foreign.jsonl").write_text(line + "\n" + json.dumps(data) + "\n")
    r = run(tmp_path, tmp_path / "cache", "cache", "import", "foreign.jsonl")
    assert "Traceback" not in r.stderr, show(r)
    assert r.returncode == 1 and "foreign.jsonl:2: skipped" in r.stderr, show(r)
    assert "imported 1 of 2 records (1 invalid" in r.stdout, show(r)


def test_import_refuses_a_config_outside_the_tasks_space(tuned: Tuned, tmp_path: Path) -> None:
    """A config that is no point of its task's space is a record this jitop cannot use: importing it would
    store it (with its low cost it then blocks every real tuned record of that task) and every later
    compile would warn and fall back to the default."""
    data = json.loads(valid_record_line(tuned))
    data["config"] = {"tile_m": "x"}
    (tmp_path / "badcfg.jsonl").write_text(json.dumps(data) + "\n")
    r = run(tmp_path, tmp_path / "cache", "cache", "import", "badcfg.jsonl")
    assert r.returncode == 1 and "badcfg.jsonl:1: skipped" in r.stderr, show(r)
    listing = run(tmp_path, tmp_path / "cache", "cache", "list", "--kind", "tuned")
    assert "tuned (0):" in listing.stdout, show(listing)


# 6. explain


def seed_peak(cache: Path) -> None:
    """Store a peak for this machine's Target in `cache`, as an earlier `jitop explain` would have: the
    subprocess reuses it instead of measuring (the triad's page faults cost seconds on small VMs;
    tests/tuner/test_peak.py measures for real)."""
    from jitop.cache.store import DiskStore
    from jitop.target import Target
    from jitop.tuner.peak import Peak, key
    t = Target.current()
    p = Peak(target_key=t.key, target=t.describe(), isa=t.isa, lanes=t.lanes(4), accumulators=12, threads=t.threads,
             gflops_1=1e5, gflops_all=1e5 * t.threads, bandwidth_gbs=1e4, triad_bytes=128 << 20, measured_at=1.0)
    DiskStore(str(cache)).put(key(t), p.to_json().encode())


def test_explain_reports_function_signature_template_cache_and_speed(tmp_path: Path) -> None:
    write_prog(tmp_path)
    cache = tmp_path / "cache"
    seed_peak(cache)
    first = run(tmp_path, cache, "explain", "prog.py", "--", "48", "marker")
    assert first.returncode == 0, show(first)
    out = first.stdout
    assert "PROG ran m=48 args=['48', 'marker']" in out  # the program ran with its arguments
    assert "__main__.mlp(float32[48, 40], float32[40, 40], float32[40, 40])" in out, show(first)
    assert "template matmul" in out and "disk cache miss" in out, show(first)
    assert re.search(r"\d+(\.\d+)? GFLOP/s", out), show(first)
    # the time is a median of several calls; peak and bandwidth are measured on this machine (and cached)
    assert re.search(r"time \d+\.\d+ ms \(median of \d+ calls\)", out), show(first)
    assert "roofline: peak" in out and "measured on this machine" in out and "STREAM triad" in out, show(first)
    assert "GB/s (STREAM triad on" in out and "= 0% of memory bandwidth" in out, show(first)  # the stored figures
    second = run(tmp_path, cache, "explain", "prog.py", "--", "48")
    assert second.returncode == 0, show(second)
    assert "disk cache hit" in second.stdout and "disk cache miss" not in second.stdout, show(second)


# 7. clearing one kind; a disabled cache


@pytest.mark.slow
def test_clear_kernels_keeps_the_tuned_records(tuned: Tuned, tmp_path: Path) -> None:
    cache = tuned.copy(tmp_path)
    templates_of(run(tmp_path, cache, "prog.py", "48", python=True))  # compiles and stores a kernel
    before = info_counts(run(tmp_path, cache, "cache", "info"))
    assert before["kernels"] >= 1 and before["tuned"] >= 1, before
    r = run(tmp_path, cache, "cache", "clear", "--kind", "kernels")
    assert r.returncode == 0, show(r)
    removed = re.search(r"removed (\d+) entries", r.stdout)
    assert removed and int(removed.group(1)) >= 2, show(r)  # object code and info of each kernel
    after = info_counts(run(tmp_path, cache, "cache", "info"))
    assert after == {**before, "kernels": 0}, (before, after)
    assert listed_keys(run(tmp_path, cache, "cache", "list", "--kind", "tuned")) == listed_keys(tuned.tuned_list)
    # the kernel is compiled again, with the tuned config still
    line = templates_of(run(tmp_path, cache, "prog.py", "48", python=True))
    assert "tuned config" in line, line


@pytest.mark.parametrize("args", [["cache", "info"], ["cache", "list"]])
def test_a_disabled_cache_is_reported(tmp_path: Path, args: list[str]) -> None:
    r = run(tmp_path, tmp_path / "cache", *args, JITOP_CACHE="0")
    assert r.returncode == 1, show(r)
    assert "jitop cache: the persistent cache is disabled (JITOP_CACHE=0)" in r.stderr, show(r)
    assert not (tmp_path / "cache").exists()


# 8. demo


def test_demo_runs(tmp_path: Path) -> None:
    r = run(tmp_path, tmp_path / "cache", "demo", "--n", "4096")
    assert r.returncode == 0, show(r)
    assert "target:" in r.stdout and "speed-up" in r.stdout and "max abs difference" in r.stdout, show(r)


@pytest.mark.parametrize("args", [["cache", "clear"], ["cache", "info"], ["tune", "--trials", "2"]])
def test_a_refused_cache_directory_is_a_failure_not_a_silent_success(tmp_path: Path, args: list[str]) -> None:
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)  # writable by others: refused
    r = run(tmp_path, cache, *args)
    assert r.returncode == 1, show(r)
    assert str(cache) in r.stderr and "writable by" in r.stderr, show(r)
    assert list(cache.iterdir()) == []


def test_export_to_an_unwritable_path_is_a_clear_error(tuned: Tuned, tmp_path: Path) -> None:
    r = run(tmp_path, tuned.cache, "cache", "export", str(tmp_path / "no" / "such" / "dir.jsonl"))
    assert r.returncode == 2 and "cannot write" in r.stderr and "Traceback" not in r.stderr, show(r)
