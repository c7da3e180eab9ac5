"""The command line of `jitop tune` and `jitop explain`: jitop's own options anywhere before `--`, the script's
arguments after it, and a usage error naming `--` for an option jitop does not know (issue 21, part 4).

Parsing is tested in process (fast); one end-to-end `tune` with a tiny budget checks that options after
`--script prog.py` reach jitop (the budget holds, the records file is written) and the arguments after `--`
reach the script.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jitop.cli import UsageError, main, parse


# ---------------------------------------------------------------------------------------------
# parsing
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["tune", "--script", "prog.py", "--budget", "40s", "--out", "r.jsonl"],   # after the script
    ["tune", "--budget", "40s", "--out", "r.jsonl", "--script", "prog.py"],   # before it
    ["tune", "--budget", "40s", "--script", "prog.py", "--out", "r.jsonl"],   # both
    ["tune", "--budget=40s", "--script=prog.py", "--out=r.jsonl", "--"],      # `=` forms, an empty `--`
])
def test_tune_options_count_wherever_they_stand(argv: list[str]) -> None:
    args = parse(argv)
    assert (args.command, args.script, args.budget, args.out, args.script_args) == \
        ("tune", "prog.py", "40s", "r.jsonl", [])


def test_tune_passes_what_follows_dashes_to_the_script() -> None:
    args = parse(["tune", "--budget", "40s", "--script", "prog.py", "--", "--my-flag", "--budget", "1s", "x", "--"])
    assert args.budget == "40s" and args.script == "prog.py"
    assert args.script_args == ["--my-flag", "--budget", "1s", "x", "--"]  # after the first --: all the script's


@pytest.mark.parametrize("argv, expected", [
    (["tune", "--script", "prog.py", "--my-flag"], "unknown option '--my-flag'"),
    (["tune", "--script", "prog.py", "--epochs", "3"], "unknown option '--epochs 3'"),
    (["tune", "--my-flag", "--script", "prog.py"], "unknown option '--my-flag'"),
    (["tune", "--script", "prog.py", "48"], "unknown argument '48'"),
])
def test_tune_refuses_what_it_does_not_know_and_names_dashes(argv: list[str], expected: str) -> None:
    with pytest.raises(UsageError) as err:
        parse(argv)
    message = str(err.value)
    assert expected in message and "after --" in message, message
    assert f"jitop tune --script prog.py -- {' '.join(argv[3:]) if argv[1] == '--script' else '--my-flag'}" in message
    assert err.value.command == "tune" and err.value.status == 2


def test_dashes_without_a_script_are_a_usage_error() -> None:
    with pytest.raises(UsageError, match="give the script with --script"):
        parse(["tune", "--budget", "1m", "--", "48"])
    with pytest.raises(UsageError, match="runs no script"):
        parse(["cache", "list", "--", "x"])


def test_explain_takes_the_scripts_arguments_after_dashes() -> None:
    args = parse(["explain", "prog.py", "--", "--epochs", "3"])
    assert (args.script, args.script_args) == ("prog.py", ["--epochs", "3"])
    assert parse(["explain", "prog.py"]).script_args == []
    for argv, bad in ((["explain", "prog.py", "--epochs", "3"], "unknown option '--epochs 3'"),
                      (["explain", "prog.py", "48"], "unknown argument '48'")):
        with pytest.raises(UsageError) as err:
            parse(argv)
        assert bad in str(err.value) and "jitop explain prog.py -- " in str(err.value), str(err.value)


def test_argparse_errors_are_usage_errors_with_the_command_named(capsys) -> None:
    assert main(["tune", "--script"]) == 2
    assert main(["tune", "--script", "prog.py", "--my-flag"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("jitop tune: argument --script: expected one argument"), err
    assert err[1].startswith("jitop tune: unknown option '--my-flag'; put the script's own arguments after --"), err


def test_help_texts_say_where_the_scripts_arguments_go(capsys) -> None:
    for command in ("tune", "explain"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "[-- SCRIPT_ARGS ...]" in out and " -- " in out, out


# ---------------------------------------------------------------------------------------------
# end to end: the budget and --out after --script hold, the script gets what follows --
# ---------------------------------------------------------------------------------------------

PROG = textwrap.dedent('''\
    import sys

    import numpy as np

    import jitop


    @jitop.kernel
    def mm(a, b):
        return a @ b


    if __name__ == "__main__":
        a = np.ones((24, 32), np.float32)
        mm(a, a.T)
        print(f"PROG args={sys.argv[1:]}")
''')


@pytest.mark.slow
def test_tune_with_options_after_the_script_keeps_its_budget_and_writes_records(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(PROG)
    env = {**__import__("os").environ, "JITOP_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("JITOP_CACHE", None)
    # with the budget swallowed, the default 10 minutes would run into the timeout
    r = subprocess.run([sys.executable, "-m", "jitop", "tune", "--script", "prog.py", "--budget", "3s",
                        "--out", "r.jsonl", "--tuner", "random", "--no-progress", "--", "--my-flag", "7"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PROG args=['--my-flag', '7']" in r.stdout, r.stdout
    records = (tmp_path / "r.jsonl").read_text().splitlines()
    assert records and "every record appended to r.jsonl" in r.stdout, r.stdout
