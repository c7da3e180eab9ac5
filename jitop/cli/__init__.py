"""The `jitop` command (also `python -m jitop`):

    jitop tune [--script prog.py [args...]] [--budget 10m | --trials N] [--tasks FILTER] [--tuner xgb]
    jitop cache info | list | clear | export FILE | import FILE
    jitop explain prog.py [args...]
    jitop demo

Every command exits 0 on success, 1 when its work failed (a script raised, invalid records lines), 2 on
bad usage (a missing file, an unknown task filter), with one clear message on stderr.

>>> main(["cache", "info"])   # doctest: +SKIP
"""
from __future__ import annotations

import argparse
import sys

from jitop.cli.common import CommandError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jitop", description="jitop: a numpy-compatible JIT for tensor operators")
    sub = parser.add_subparsers(dest="command", required=True)
    from jitop.cli import cache, demo, explain, tune
    tune.add_parser(sub)
    cache.add_parser(sub)
    explain.add_parser(sub)
    p_demo = sub.add_parser("demo", help="build a fused elementwise kernel and compare its speed with numpy")
    p_demo.add_argument("--n", type=int, default=1 << 24, help="number of float32 elements (default 2**24)")
    p_demo.set_defaults(run=lambda args: demo.demo(args.n))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns (and, from the console script, exits with) its status."""
    args = build_parser().parse_args(argv)
    try:
        status = args.run(args)
    except CommandError as err:
        print(f"jitop {args.command}: {err}", file=sys.stderr)
        return err.status
    return int(status or 0)
