"""`jitop cache info | list | clear | export FILE | import FILE`: look into and manage the persistent cache.

Tuned records travel as JSON lines (the tuner's record format, never pickle); importing validates every
line (schema version, task and config this jitop can read, the task key matching its task) and reports an
invalid one with its line number."""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from jitop.cli.common import CommandError, table

KINDS = {"kernels": ("kernel/", "kernel-info/", "warm/"), "tuned": ("tuned/",), "workloads": ("workload/",),
         "runtime": ("pool/", "fastcall/"), "peaks": ("machine/peak/",)}
LISTED = ("kernels", "tuned", "workloads", "peaks")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `jitop cache` and its actions."""
    p = sub.add_parser("cache", help="show, list, clear, export or import the persistent cache",
                       description="The persistent cache: compiled kernels, tuned records, the workload log.")
    actions = p.add_subparsers(dest="action", required=True)
    actions.add_parser("info", help="where the cache is, its size and what it holds").set_defaults(run=info)
    p_list = actions.add_parser("list", help="list entries")
    p_list.add_argument("--kind", choices=LISTED, default=None,
                        help="only this kind (default: all four; peaks: the FP32 peak and memory bandwidth measured "
                             "per Target, what %%peak divides by)")
    p_list.set_defaults(run=list_entries)
    p_clear = actions.add_parser("clear", help="remove entries (everything by default)")
    p_clear.add_argument("--kind", choices=tuple(KINDS), default=None, help="only this kind")
    p_clear.set_defaults(run=clear)
    p_export = actions.add_parser("export", help="write the tuned records as JSON lines")
    p_export.add_argument("file", help="output file (.jsonl); '-' for stdout")
    p_export.set_defaults(run=export)
    p_import = actions.add_parser("import", help="read tuned records (JSON lines) into the cache")
    p_import.add_argument("file", help="a records file written by `jitop cache export` or jitop.tune")
    p_import.set_defaults(run=import_records)


def _store() -> Any:
    """The usable cache store, else a failure saying why (disabled, refused, unopenable)."""
    from jitop.cachedir import store
    st = store()
    if st.directory is None:
        raise CommandError("the persistent cache is disabled (JITOP_CACHE=0)", status=1)
    if not st.usable:
        why = f"the directory {st.refused}" if st.refused else (
            f"it could not be opened ({st.failure}); `jitop cache clear` resets it")
        raise CommandError(f"the cache at {st.directory} is not used: {why}; nothing was read or written", status=1)
    return st


def info(args: argparse.Namespace) -> int:
    """`jitop cache info`: where the cache is, its size and limit, what it holds."""
    from jitop import config
    from jitop.graph.kernel_cache import code_version
    st = _store()
    print(f"directory   {st.directory}")
    # a kernel is two entries (object code and info): count the first; the runtime's two kinds both count
    counts = {kind: sum(len(st.keys(p)) for p in (prefixes if kind == "runtime" else prefixes[:1]))
              for kind, prefixes in KINDS.items()}
    print(f"size        {st.volume() / 2**20:.1f} MiB of {config.cache_size() / 2**20:.0f} MiB (JITOP_CACHE_SIZE; "
          "least recently used entries are evicted beyond it)")
    print(f"entries     {counts['kernels']} kernels, {counts['tuned']} tuned records, "
          f"{counts['workloads']} logged workloads, {counts['runtime']} runtime objects")
    print(f"jitop       {code_version()} (kernels of another jitop are never loaded)")
    return 0


def list_entries(args: argparse.Namespace) -> int:
    """`jitop cache list`: kernels, tuned records and logged workloads as tables."""
    st = _store()
    kinds = [args.kind] if args.kind else list(LISTED)
    for kind in kinds:
        rows, header = {"kernels": _kernel_rows, "tuned": _tuned_rows, "workloads": _workload_rows,
                        "peaks": _peak_rows}[kind](st)
        print(f"{kind} ({len(rows)}):")
        print(table(rows, header) if rows else "  (none)")
        if kind == "tuned" and rows:
            print("%peak: of the FP32 peak measured on this machine for the record's Target (--kind peaks); "
                  "-: not measured yet (jitop tune and jitop explain measure it)")
        print()
    return 0


def _kernel_rows(st: Any) -> tuple[list, list]:
    from jitop.graph.kernel_cache import stored_keys
    rows = []
    for key, meta in sorted(stored_keys(st), key=lambda k: -k[1].get("created", 0)):
        rows.append([key.get("function"), key.digest[:12], len(key.get("configs")), key.get("target"),
                     f"{meta.get('bytes', 0) / 1024:.0f} KiB", meta.get("verified", "?"), _when(meta.get("created"))])
    return rows, ["function", "key", "tasks", "target", "size", "verified", "created"]


def _tuned_rows(st: Any) -> tuple[list, list]:
    from jitop.tuner.cached import tuned_store, valid_record
    rows = []
    for text in tuned_store().records():
        try:  # a record this jitop cannot use or trust (another jitop's, planted) is not listed
            rows.append(_tuned_row(valid_record(text)))
        except Exception:  # noqa: BLE001
            continue
    return rows, ["task", "key", "GFLOP/s", "%peak", "target", "origin", "measured"]


def _tuned_row(rec: Any) -> list:
    """One row of `cache list --kind tuned`: an imported record says so (its speed is a claim)."""
    from jitop.tuner.peak import stored_peak
    from jitop.tuner.report import describe_task
    # % of the peak measured for the record's Target (stored by tune/explain; listing measures nothing)
    peak = stored_peak(rec.task.target.key)
    gflops = peak.per_thread(rec.task.target.threads) if peak else None
    origin = (f"imported, not measured here ({os.path.basename(rec.origin.where) or '?'} {_when(rec.origin.when)})"
              if rec.origin.imported else "measured here")
    return [describe_task(rec.task), rec.task.key[:12], f"{rec.gflops:.1f}",
            f"{100 * rec.gflops / gflops:.0f}%" if gflops else "-", rec.task.target.key, origin,
            _when(rec.result.timestamp)]


def _peak_rows(st: Any) -> tuple[list, list]:
    from jitop.tuner.peak import stored_peaks
    rows = [[p.target_key, f"{p.gflops_1:.0f}" if p.gflops_1 else "-", f"{p.gflops_all:.0f}" if p.gflops_all else "-",
             str(p.threads), f"{p.bandwidth_gbs:.1f}" if p.bandwidth_gbs else "-", _when(p.measured_at)]
            for p in stored_peaks()]
    return rows, ["target", "GFLOP/s 1 thread", "GFLOP/s all", "threads", "triad GB/s", "measured"]


def _workload_rows(st: Any) -> tuple[list, list]:
    from jitop import workloads
    from jitop.tuner.report import describe_task
    rows = [[describe_task(w.task), w.task.key[:12], w.calls, f"{w.seconds * 1e3:.1f}", ", ".join(w.functions[:3])]
            for w in workloads.logged()]
    return rows, ["task", "key", "calls", "ms", "functions"]


def clear(args: argparse.Namespace) -> int:
    """`jitop cache clear`: remove every entry, or those of one kind; a cache whose database cannot be opened
    (damaged, not a database) is reset."""
    from jitop.cachedir import store
    st = store()
    if st.directory is not None and not st.usable and not st.refused:
        return _reset(st)
    st = _store()
    prefixes = KINDS[args.kind] if args.kind else ("",)
    removed = sum(st.clear(p) for p in prefixes)
    from jitop.tuner.cached import forget
    forget()
    print(f"removed {removed} entries from {st.directory}")
    return 0


def _reset(st: Any) -> int:
    """Empty a cache directory whose database cannot be opened (only jitop's own files are removed)."""
    why = st.failure
    try:
        removed = st.reset()
    except (ValueError, OSError) as err:
        raise CommandError(f"the cache at {st.directory} could not be opened ({why}) and was not reset: {err}",
                           status=1) from None
    print(f"the cache at {st.directory} could not be opened ({why}); reset it: removed {removed} files")
    return 0


def export(args: argparse.Namespace) -> int:
    """`jitop cache export FILE`: the tuned records this jitop can use, as JSON lines."""
    from jitop.tuner.cached import tuned_store, valid_record
    _store()
    lines = []
    for text in tuned_store().records():
        try:
            lines.append(valid_record(text).to_json())  # only what this jitop can read back
        except Exception:  # noqa: BLE001
            continue
    out = "".join(line + "\n" for line in lines)
    if args.file == "-":
        sys.stdout.write(out)
    else:
        tmp = f"{args.file}.tmp-{os.getpid()}"
        try:
            with open(tmp, "w") as f:
                f.write(out)
            os.replace(tmp, args.file)  # a reader never sees half a file
        except OSError as err:
            raise CommandError(f"cannot write {args.file!r}: {err.strerror or err}") from None
    print(f"exported {len(lines)} tuned records to {args.file}", file=sys.stderr)
    return 0


def import_records(args: argparse.Namespace) -> int:
    """`jitop cache import FILE`: validated records into the cache, each kept as an imported claim (never
    replacing a measurement made here); an invalid line is reported by its number and skipped, the rest
    still imported (exit 1 if a line was invalid)."""
    from jitop.tuner.cached import forget, tuned_store
    _store()
    text = _read_records_file(args.file)
    ts, origin = tuned_store(), _import_origin(args.file)
    counts = {"stored": 0, "bad": 0, "failed": 0, "slower": 0, "local": 0}
    total = 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            total += 1
            outcome = _import_line(ts, line, origin)
            counts[outcome if isinstance(outcome, str) else "bad"] += 1
            if not isinstance(outcome, str):
                print(f"{args.file}:{number}: skipped, not a valid jitop tuning record ({type(outcome).__name__}: "
                      f"{str(outcome)[:200]})", file=sys.stderr)
    forget()
    if total == 0:
        raise CommandError(f"records file {args.file!r} holds no records (expected JSON lines from `jitop cache "
                           "export` or jitop.tune)", status=1)
    print(f"imported {counts['stored']} of {total} records ({counts['bad']} invalid, {counts['failed']} failed "
          f"trials, {counts['slower']} no faster than the cached ones, {counts['local']} for tasks measured here; "
          "imported records are claims, not measured here: jitop tune replaces them)")
    if counts["bad"]:
        raise CommandError(f"{counts['bad']} invalid line(s) in {args.file!r} were skipped", status=1)
    return 0


def _read_records_file(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        raise CommandError(f"records file {path!r} not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CommandError(f"cannot read records file {path!r}: {err}") from None


def _import_origin(path: str) -> Any:
    from jitop.tuner.records import IMPORTED, Origin
    return Origin(IMPORTED, os.path.abspath(path), time.time())


def _import_line(ts: Any, line: str, origin: Any) -> str | Exception:
    """Store one line as an imported record: "stored", "failed" (a failed trial), "slower" (an imported
    record at least as fast is stored), "local" (a record measured here is stored), or the error that makes
    the line invalid."""
    import dataclasses

    from jitop.tuner.cached import usable_json, valid_record
    try:
        rec = dataclasses.replace(valid_record(line), origin=origin)
    except Exception as err:  # noqa: BLE001 - any line this jitop cannot use or trust is reported and skipped
        return err
    if not rec.result.ok:
        return "failed"
    t = rec.task
    if ts.put(t.target.key, t.template, t.key, rec.to_json(), rec.result.cost, usable_json, imported=True):
        return "stored"
    return "local" if ts.origin(t.target.key, t.template, t.key) == "measured" else "slower"


def _when(timestamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp)) if timestamp else "?"


