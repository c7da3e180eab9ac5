"""The `jitop` command (also `python -m jitop`):

    jitop tune [--budget 10m | --trials N] [--tasks FILTER] [--tuner xgb] [--out FILE] [--target cuda]
               [--script prog.py] [-- ARGS]
    jitop tune model.onnx [--shape NAME=D0,D1,...] [the same options]
    jitop cache info | list | clear | export FILE | import FILE
    jitop explain prog.py [-- ARGS]
    jitop explain model.onnx|model.jitop [--shape NAME=D0,D1,...] [--full] [--no-profile]
    jitop compile model.onnx [-o model.jitop] [--shape NAME=D0,D1,...]
    jitop run model.onnx|model.jitop --input NAME=FILE.npy|random|zeros [--shape ...] [--output F.npz] [--repeat N]
    jitop demo

jitop's own options may stand anywhere on the line, before or after the script's path; the script's own
arguments follow `--`. An option jitop does not know, or a stray argument, before `--` is a usage error that
says so (it is never handed to the script, nor silently dropped).

Every command exits 0 on success, 1 when its work failed (a script raised, invalid records lines), 2 on
bad usage (a missing file, an unknown task filter, an unknown option), with one clear message on stderr.

>>> main(["cache", "info"])   # doctest: +SKIP
"""
from __future__ import annotations

import argparse
import sys

from jitop.cli.common import CommandError


class UsageError(CommandError):
    """Bad usage found while parsing the command line; `command` names the subcommand when known."""

    def __init__(self, message: str, command: str | None = None):
        super().__init__(message, status=2)
        self.command = command


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is raised (and printed by `main` as `jitop <command>: ...`), not exited."""

    def error(self, message: str):  # type: ignore[override]
        command = self.prog.split()[1] if len(self.prog.split()) > 1 else None
        raise UsageError(f"{message} (see `{self.prog} --help`)", command)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jitop", description="jitop: a numpy-compatible JIT for tensor operators")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    from jitop.cli import cache, demo, explain, models, tune
    tune.add_parser(sub)
    cache.add_parser(sub)
    explain.add_parser(sub)
    models.add_parsers(sub)
    p_demo = sub.add_parser("demo", help="build a fused elementwise kernel and compare its speed with numpy")
    p_demo.add_argument("--n", type=int, default=1 << 24, help="number of float32 elements (default 2**24)")
    p_demo.set_defaults(run=lambda args: demo.demo(args.n))
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line as a Namespace: jitop's options anywhere before `--`, the script's arguments after it
    (`args.script_args`). Raises UsageError for an unknown option or a stray argument before `--`, and for
    `--` given to a command that runs no script."""
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    ours, theirs = argv[:split], argv[split + 1:]
    args, unknown = build_parser().parse_known_args(ours)
    takes = getattr(args, "takes_script_args", False)
    if args.command == "tune" and args.model is not None and args.script is not None:
        if args.model.endswith((".onnx", ".jitop")):
            raise UsageError(f"give a model ({args.model}) or --script {args.script}, not both", "tune")
        # with --script, a positional is a stray argument (meant for the script), told apart as before
        unknown = [a for a in ours[1:] if a == args.model or a in unknown]
    if unknown:
        what = "option" if unknown[0].startswith("-") else "argument"
        hint = (f"; put the script's own arguments after --, e.g. {_example(args.command, unknown)}" if takes else "")
        raise UsageError(f"unknown {what} {' '.join(unknown)!r}{hint}", args.command)
    if split < len(argv):
        if not takes:
            raise UsageError(f"`--` and what follows it ({' '.join(theirs) or 'nothing'}) are for a script's "
                             f"arguments; jitop {args.command} runs no script", args.command)
        if args.command == "tune" and getattr(args, "script", None) is None:
            raise UsageError(f"arguments after -- ({' '.join(theirs) or 'nothing'}) are the script's: give the "
                             "script with --script prog.py", args.command)
        args.script_args = theirs
    return args


def _example(command: str, unknown: list[str]) -> str:
    script = "--script prog.py" if command == "tune" else "prog.py"
    return f"`jitop {command} {script} -- {' '.join(unknown)}`"


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns (and, from the console script, exits with) its status."""
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except UsageError as err:
        print(f"jitop{' ' + err.command if err.command else ''}: {err}", file=sys.stderr)
        return err.status
    try:
        status = args.run(args)
    except CommandError as err:
        print(f"jitop {args.command}: {err}", file=sys.stderr)
        return err.status
    return int(status or 0)
