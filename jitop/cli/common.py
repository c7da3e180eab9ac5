"""What the commands share: a clear error with an exit status, and running a user's script in this process."""
from __future__ import annotations

import os
import runpy
import sys
import traceback


class CommandError(Exception):
    """A command's failure: the message is printed as `jitop <command>: <message>`, `status` is the exit code
    (1: the work failed, 2: bad usage or input)."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


def run_script(path: str, args: list[str], usage: str = "jitop tune --script prog.py") -> None:
    """Run `path` as `python path args...` would, in this process (so its kernels' counters and cache
    entries can be read afterwards). A missing file is a usage error; an exception in the script, or a
    non-zero sys.exit, is a failure (its traceback is printed)."""
    if not os.path.isfile(path):
        raise CommandError(f"script {path!r} not found (expected a Python file, e.g. {usage})")
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise CommandError(f"script {path!r} exited with status {exit_.code}", status=1) from None
    except Exception:  # noqa: BLE001 - the user's script failed: show where, exit non-zero
        traceback.print_exc()
        raise CommandError(f"script {path!r} raised an exception (traceback above)", status=1) from None
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def table(rows: list[list[str]], header: list[str]) -> str:
    """A plain text table with aligned columns."""
    cells = [header, *rows]
    widths = [max(len(str(r[k])) for r in cells) for k in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
