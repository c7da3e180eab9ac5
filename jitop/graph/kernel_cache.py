"""Compiled kernels in the persistent cache: memory -> disk -> compile -> save.

The dispatcher still traces a new signature in a warm process (~1-10 ms): the trace gives the graph key
(a content hash, so a changed global constant or a changed function body changes it), the captured arrays
the kernel must read where they live now, and the result's structure. What a warm process skips is the
expensive half: lowering, LLVM optimisation and code generation. The key is explicit (cache/keys.py):

    schema, kind, function, graph, configs (each task's chosen config), target (its key holds the build
    options), jitop (version + a digest of its own source), llvm (llvmlite + LLVM versions)

An entry is the Executable's bytes without its constants (checksummed; no pickle); beside it, its key parts
and how it was verified. A corrupt, truncated or foreign entry is a miss and is removed.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from jitop.cache import keys
from jitop.cache.keys import Key, nearest
from jitop.cache.store import DiskStore, NullStore
from jitop.cachedir import INFO, KERNEL, store
from jitop.cachedir import NULL as _NULL
from jitop.codegen.target import llvm_version
from jitop.errors import TargetMismatchError
from jitop.graph.capture import LiveArray
from jitop.graph.compile import Prepared, build, constant_array, constant_nodes
from jitop.graph.ir import toposort
from jitop.runtime.executable import Executable

@dataclass
class Lookup:
    """What the cache did for one signature: status "hit" (loaded, no LLVM), "miss" (compiled and saved),
    "off" (JITOP_CACHE=0, or the directory refused/unusable), "uncacheable" (the graph has no stable key)."""

    status: str
    key: Key | None = None
    reason: str = ""
    seconds: float = 0.0

    def describe(self) -> str:
        """What happened and why, then the key's parts (for explain)."""
        head = {"hit": "disk cache hit (object code loaded, LLVM not run)",
                "miss": "disk cache miss (compiled and saved)",
                "off": "disk cache off", "uncacheable": "not cached"}[self.status]
        lines = [f"{head}{': ' + self.reason if self.reason else ''}"]
        if self.key is not None:
            lines += [f"  key {self.key.digest[:16]}, parts:", self.key.describe()]
        return "\n".join(lines)


# ** keys **
def graph_key(prep: Prepared) -> str | None:
    """Content hash of the traced graph and how arguments reach it; None if a node has no stable value
    (an object whose repr is its address). A captured array counts by position, shape and dtype (the kernel
    reads it in place, whatever it holds); a frozen constant by its bytes."""
    order = toposort(prep.unique)
    index = {n: k for k, n in enumerate(order)}
    h = hashlib.sha256(json.dumps([prep.name, prep.input_names, repr(prep.input_plan)]).encode())
    # every argument's shape and dtype, used or not (the native entry checks them all)
    h.update(repr([(n.prim, n.shape, str(n.dtype), n.weak, n.params) for n in prep.inputs]).encode())
    live = 0
    for n in order:
        params = []
        for name, v in n.params:
            if isinstance(v, LiveArray):
                v, live = f"live#{live}", live + 1
            elif isinstance(v, (bytes, bytearray)):
                v = "sha256:" + hashlib.sha256(v).hexdigest()
            else:
                v = repr(v)
                if " at 0x" in v or " object at " in v:
                    return None
            params.append((name, v))
        h.update(f"{n.prim}|{n.shape}|{n.dtype}|{n.weak}|{params}|{[index[s] for s in n.src]}\n".encode())
    h.update(repr([index[o] for o in prep.outputs]).encode())
    return h.hexdigest()


def kernel_key(prep: Prepared, function: str) -> Key | None:
    """The cache key of the kernel `prep` compiles to, or None if its graph has no stable key."""
    graph = graph_key(prep)
    if graph is None:
        return None
    configs = [[task.template, task.key, choice.config.as_dict()] for task, choice in prep.choices.values()]
    return Key.of(schema=keys.SCHEMA_VERSION, kind="kernel", function=function, graph=graph, configs=configs,
                  target=prep.target.key, jitop=code_version(), llvm=llvm_version())


_code_version: str | None = None
CODE_DIGEST = "meta/code-digest/"  # + the source roots' hash: the last digest and the file stamps it was made of
_SETTLED_NS = 5_000_000_000  # a file changed less than 5 s ago may change again within its timestamp's tick
_PACKAGES = ("jitop", "jitop.topi", "jitop.tuner", "jitop.cache")  # whose .py files the digest covers


def code_version() -> str:
    """jitop's version and a digest of its own source files: an edited or upgraded jitop never loads what
    another one compiled (a version number alone misses local edits).

    Hashing the sources costs ~1.5 ms per process; the store keeps the last digest with the files' stamps (path,
    size, mtime, ctime, inode, device of every .py file: any write to a file changes its ctime, which no tool
    can set back) and a process whose stamps are the same reuses it. A digest made while a file had changed
    within the last seconds is not kept (a second edit in the same timestamp tick could leave the stamps
    alike), and one that does not read back intact is computed again."""
    global _code_version
    if _code_version is None:
        from jitop import __version__
        files = _source_files()
        st = store()
        stamp = _stamp(files)
        memo_key = CODE_DIGEST + hashlib.sha256(json.dumps(sorted({f[0] for f in files})).encode()).hexdigest()[:16]
        digest = _memoised_digest(st, memo_key, stamp) if stamp is not None else None
        if digest is None:
            digest = _source_digest(files)
            if stamp is not None and _settled(files):
                st.put(memo_key, json.dumps({"stamp": stamp, "digest": digest}).encode())
        _code_version = f"{__version__}+{digest[:12]}"
    return _code_version


def _source_files() -> list[tuple[str, str, str, os.stat_result | None]]:
    """(package root, path relative to it, full path, stat or None) of every .py file of jitop's packages, in
    hash order (os.walk's, top-down, names sorted; __pycache__ and symlinked directories not entered)."""
    found: list[tuple[str, str, str, os.stat_result | None]] = []

    def walk(root: str, rel: str) -> None:
        try:
            with os.scandir(os.path.join(root, rel) if rel else root) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:  # as os.walk: an unreadable directory is skipped
            return
        subdirs = []
        for e in entries:
            if e.is_dir():
                if e.name != "__pycache__" and not e.is_symlink():
                    subdirs.append(e.name)
            elif e.name.endswith(".py"):
                try:
                    st = e.stat()
                except OSError:
                    st = None
                found.append((root, os.path.join(rel, e.name) if rel else e.name, e.path, st))
        for d in subdirs:
            walk(root, os.path.join(rel, d) if rel else d)

    for package in _PACKAGES:
        spec = importlib.util.find_spec(package)
        for root in list(spec.submodule_search_locations or []) if spec else []:
            walk(root, "")
    return found


def _source_digest(files: list[tuple[str, str, str, os.stat_result | None]]) -> str:
    """sha256 of every file's relative path and bytes (the digest code_version shows the first 12 digits of)."""
    h = hashlib.sha256()
    for _, rel, path, _ in files:
        h.update(rel.encode())
        with open(path, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


def _stamp(files: list[tuple[str, str, str, os.stat_result | None]]) -> str | None:
    """sha256 of every file's path and stat stamp (taken before the files are read, so a stored stamp is never
    newer than the bytes its digest was made of); None if a file could not be inspected."""
    if any(st is None for *_, st in files):
        return None
    rows = [[path, s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino, s.st_dev] for _, _, path, s in files]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def _settled(files: list[tuple[str, str, str, os.stat_result | None]]) -> bool:
    """Whether every file's last change (as stamped) is a few seconds old (racy-git's rule)."""
    now = time.time_ns()
    return all(s is not None and now - max(s.st_mtime_ns, s.st_ctime_ns) > _SETTLED_NS for *_, s in files)


def _memoised_digest(st: DiskStore | NullStore, memo_key: str, stamp: str) -> str | None:
    """The stored digest if it was made of files with exactly these stamps, else None."""
    blob = st.get(memo_key)
    if blob is None:
        return None
    try:
        memo = json.loads(blob)
        digest = memo["digest"]
        ok = memo["stamp"] == stamp and isinstance(digest, str) and len(digest) == 64 and all(
            c in "0123456789abcdef" for c in digest)
    except (ValueError, KeyError, TypeError):
        return None
    return digest if ok else None


# ** load or build **
def load_or_build(prep: Prepared, function: str) -> tuple[Executable, Lookup]:
    """The Executable for `prep`: from the disk cache if an entry with its key loads, else compiled (and
    saved). Never raises because of the cache."""
    t0 = time.perf_counter()
    st = store()
    key = kernel_key(prep, function) if st is not _NULL else None
    if st is _NULL or key is None:
        lookup = Lookup("off" if st is _NULL else "uncacheable",
                        reason="JITOP_CACHE=0" if st is _NULL else "the graph holds an object with no stable value")
        return build(prep), lookup
    exe, reason = _load(st, key, prep)
    if exe is not None:
        return exe, Lookup("hit", key, seconds=time.perf_counter() - t0)
    if not st.usable:
        return build(prep), Lookup("off", key, f"cache directory {st.directory} "
                                   f"{st.refused or 'could not be opened'}")
    exe = build(prep)
    save(st, key, exe, verified=_verification(prep))
    return exe, Lookup("miss", key, reason, time.perf_counter() - t0)


def _verification(prep: Prepared) -> str:
    """How a new kernel's configs were checked: tuned ones by the tuner (each candidate's output against the
    default config's), transferred or default ones not beyond the template's own tests."""
    sources = {choice.source for _, choice in prep.choices.values()}
    if "tuned" in sources:
        return "tuned configs output-checked by the tuner"
    return "transferred config, not checked" if "transferred" in sources else "none"


def _load(st: DiskStore, key: Key, prep: Prepared) -> tuple[Executable | None, str]:
    blob = st.get(KERNEL + key.digest)
    if blob is None:
        return None, "no entry with this key" + _nearest_reason(st, key)
    try:
        exe = Executable.from_bytes(blob, constants=[constant_array(n) for n in constant_nodes(prep.unique)])
    except (ValueError, TargetMismatchError) as err:  # damaged, or not for this machine: never loaded
        st.delete(KERNEL + key.digest)
        st.delete(_info_key(key))
        return None, f"the stored entry was unusable and was removed ({err})"
    from jitop.graph.fusion import groups as fusion_groups
    from jitop.graph.to_te import choice_line
    exe.groups = fusion_groups(prep.unique, prep.why)
    exe.templates = [choice_line(f"{task.template}{k}", task, choice, prep.target)
                     for k, (task, choice) in enumerate(prep.choices.values())]
    exe.decisions = ["loaded from the disk cache (operand and row fusion decided when it was compiled)"]
    return exe, ""


def save(st: DiskStore | NullStore, key: Key, exe: Executable, verified: str) -> None:
    """Store a compiled kernel and, beside it, its key parts and how it was verified."""
    try:
        blob = exe.to_bytes(constants=False)
    except ValueError:  # something the format cannot hold: it stays in memory only
        return
    info = {"key": json.loads(key.to_json()), "verified": verified, "created": time.time(), "bytes": len(blob)}
    st.put(KERNEL + key.digest, blob)
    st.put(_info_key(key), json.dumps(info).encode())


def forget(key: Key) -> None:
    """Remove a stored kernel (one that failed verification)."""
    st = store()
    st.delete(KERNEL + key.digest)
    st.delete(_info_key(key))


def mark_verified(key: Key, how: str) -> None:
    """Record how a stored kernel was verified (e.g. "numpy": checked against numpy before first use)."""
    def change(old: bytes | None) -> bytes | None:
        if old is None:
            return None
        info = json.loads(old)
        info["verified"] = how
        return json.dumps(info).encode()
    store().update(_info_key(key), change)


def _info_key(key: Key) -> str:
    """Where a kernel's info lives: grouped by function, so a miss compares only with that function's entries."""
    function = hashlib.sha256(str(key.get("function")).encode()).hexdigest()[:16]
    return f"{INFO}{function}/{key.digest}"


def stored_keys(st: DiskStore | NullStore, like: Key | None = None) -> list[tuple[Key, dict]]:
    """The key and info of every stored kernel (of `like`'s function only, if given)."""
    found = []
    prefix = INFO if like is None else _info_key(like).rsplit("/", 1)[0] + "/"
    for _, payload in st.items(prefix):
        try:
            info = json.loads(payload)
            found.append((Key.from_json(json.dumps(info["key"])), info))
        except (ValueError, KeyError, TypeError):
            continue
    return found


def _nearest_reason(st: DiskStore, key: Key) -> str:
    """Which parts differ from the nearest stored kernel of the same function (only if one exists)."""
    stored = [k for k, _ in stored_keys(st, like=key)]
    if any(k.digest == key.digest for k in stored):  # its info outlived it (evicted, or removed as damaged)
        st.delete(_info_key(key))
        return "; the entry with this key was removed (evicted by the size limit, or damaged)"
    near, differ = nearest(key, stored)
    if near is None:
        return ""
    return "; nearest stored entry differs in " + ", ".join(
        f"{name} ({_short(near, name)} -> {_short(key, name)})" for name in differ)


def _short(key: Key, name: str) -> str:
    try:
        v = key.get(name)
    except KeyError:
        return "absent"
    text = v if isinstance(v, str) else json.dumps(v)
    return text if len(text) <= 24 else text[:10] + "..." + text[-8:]


class ComponentStore:
    """The object code of a runtime component (the thread pool, the native call entry) under the same named
    key parts as kernels: its own content key (IR, target, LLVM), the schema and jitop's code version."""

    def __init__(self, kind: str):
        self.kind = kind

    def _key(self, content: str) -> str:
        key = Key.of(schema=keys.SCHEMA_VERSION, kind=self.kind, content=content, jitop=code_version())
        return f"{self.kind}/{key.digest}"

    def get(self, content: str) -> bytes | None:
        """The object code stored for this content key, or None."""
        st = store()
        return None if st is _NULL else st.get(self._key(content))

    def put(self, content: str, value: bytes) -> None:
        """Store object code under this content key."""
        st = store()
        if st is not _NULL:
            st.put(self._key(content), value)
