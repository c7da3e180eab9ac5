"""Compiled kernels in the persistent cache: memory -> disk -> compile -> save.

The dispatcher still traces a new signature in a warm process (~1-10 ms): the trace gives the graph key
(a content hash, so a changed global constant or a changed function body changes it), the captured arrays
the kernel must read where they live now, and the result's structure. What a warm process skips is the
expensive half: lowering, LLVM optimisation and code generation. The key is explicit (cache/keys.py):

    schema, kind, function, graph, configs (each task's chosen config), target (its key holds the build
    options), jitop (version + a digest of its own source), llvm (llvmlite + LLVM versions)

An entry is a small JSON header (the full key it was stored under and the signature it was built for: every
argument's and constant's shape and dtype, the outputs' shapes and dtypes) followed by the Executable's bytes
without its constants (checksummed; no pickle); beside it, its key parts and how it was verified. A corrupt,
truncated or foreign entry is a miss and is removed, and so is one whose header or kernel parameters do not
match the key looked up and the traced signature (an entry copied under another key), before anything of it
is linked in or called. The check runs once per load (per signature per process), never per call.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import struct
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from jitop.cache import keys
from jitop.cache.keys import Key, nearest
from jitop.cache.store import DiskStore, NullStore
from jitop.cachedir import INFO, KERNEL, store
from jitop.cachedir import NULL as _NULL
from jitop.codegen.target import llvm_version
from jitop.errors import TargetMismatchError
from jitop.driver import printed_dim
from jitop.graph.capture import LiveArray
from jitop.graph.compile import Prepared, build, kernel_constants
from jitop.graph.ir import ConstData, data_key, digest_all, toposort
from jitop.runtime.args import ParamSpec
from jitop.runtime.executable import Executable, Plan
from jitop.te.expr import Expr

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
    digest_all(v for n in order for _, v in n.params if isinstance(v, ConstData))
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
            elif isinstance(v, ConstData):
                v = data_key(v)
            else:
                v = repr(v)
                if " at 0x" in v or " object at " in v:
                    return None
            params.append((name, v))
        h.update(f"{n.prim}|{n.shape}|{n.dtype}|{n.weak}|{params}|{[index[s] for s in n.src]}\n".encode())
    h.update(repr([index[o] for o in prep.outputs]).encode())
    if prep.guards or prep.bounds:  # a symbolic kernel serves only calls its guards admit; lowering relied on them
        h.update(repr((prep.guards, sorted(prep.bounds.items()))).encode())
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
    built_for = signature(prep)
    if executable_signature(exe.module.params, exe.plan) == built_for:  # else it could never load: not stored
        save(st, key, exe, verified=_verification(prep), built_for=built_for)
    return exe, Lookup("miss", key, reason, time.perf_counter() - t0)


def _verification(prep: Prepared) -> str:
    """How a new kernel's configs were checked: tuned ones by the tuner (each candidate's output against the
    default config's), transferred or default ones not beyond the template's own tests; a config from an
    imported record (`jitop cache import`) was checked nowhere here, whatever the others were."""
    sources = {choice.source for _, choice in prep.choices.values()}
    if "imported tuned" in sources:
        return "imported config, not checked here"
    if "tuned" in sources:
        return "tuned configs output-checked by the tuner"
    return "transferred config, not checked" if "transferred" in sources else "none"


def _load(st: DiskStore, key: Key, prep: Prepared) -> tuple[Executable | None, str]:
    blob = st.get(KERNEL + key.digest)
    if blob is None:
        return None, "no entry with this key" + _nearest_reason(st, key)
    try:
        exe = _entry_executable(blob, key, signature(prep), kernel_constants(prep))
    except _OtherEntry as other:  # a valid entry, copied or moved under this key: never called
        _remove(st, key)
        return None, f"the stored entry was built for another {other} and was removed"
    except (ValueError, TargetMismatchError) as err:  # damaged, or not for this machine: never loaded
        _remove(st, key)
        return None, f"the stored entry was unusable and was removed ({err})"
    from jitop.graph.fusion import groups as fusion_groups
    from jitop.graph.to_te import choice_line
    exe.groups = fusion_groups(prep.unique, prep.why)
    exe.templates = [choice_line(f"{task.template}{k}", task, choice, prep.target)
                     for k, (task, choice) in enumerate(prep.choices.values())]
    exe.decisions = ["loaded from the disk cache (operand and row fusion decided when it was compiled)"]
    return exe, ""


def _entry_executable(blob: bytes, key: Key, expected: list, constants: list[np.ndarray]) -> Executable:
    """The Executable of a stored entry, checked to be stored under `key` and built for the signature `expected`
    (`signature`'s data) before its object code is linked in: _OtherEntry if it is not, ValueError (or
    TargetMismatchError) if it is damaged or not for this machine."""
    def built_for_this(params: list[ParamSpec], plan: Plan) -> None:
        if executable_signature(params, plan) != expected:
            raise _OtherEntry("signature")

    head, body = parse_entry(blob)
    if head["key"] != key.to_json():
        raise _OtherEntry("key")
    if head["signature"] != expected:
        raise _OtherEntry("signature")
    return Executable.from_bytes(body, constants=constants, expect=built_for_this)


def load_named(key_json: str, built_for: str, constants: list[np.ndarray]) -> Executable | None:
    """The stored kernel a warm record names (jitop.graph.warm), or None: its entry must be stored under that key
    and built for that signature (`built_for`: `signature`'s JSON); `constants`: the arrays it reads after its
    arguments (the record keeps them). Never raises because of the cache."""
    st = store()
    if st is _NULL:
        return None
    try:
        key = Key.from_json(key_json)
        blob = st.get(KERNEL + key.digest)
        return None if blob is None else _entry_executable(blob, key, json.loads(built_for), constants)
    except (_OtherEntry, ValueError, TypeError, KeyError, TargetMismatchError):
        return None


def _remove(st: DiskStore | NullStore, key: Key) -> None:
    st.delete(KERNEL + key.digest)
    st.delete(_info_key(key))


class _OtherEntry(Exception):
    """A well-formed entry that was not built for the key or signature looked up (str: which of the two)."""


# ** the entry: header (key, signature) + Executable bytes **
ENTRY_MAGIC = b"JITOPKCE"
_ENTRY_HEAD = struct.Struct("<8sI")  # magic, length of the JSON header that follows
MAX_ENTRY_HEADER = 16 << 20


def entry_bytes(key: Key, built_for: list, exe_blob: bytes) -> bytes:
    """A stored kernel: the key it is stored under and the signature it was built for (`signature`), as a
    length-prefixed JSON header, then the Executable's bytes."""
    head = json.dumps({"key": key.to_json(), "signature": built_for}, separators=(",", ":")).encode()
    return _ENTRY_HEAD.pack(ENTRY_MAGIC, len(head)) + head + exe_blob


def parse_entry(blob: bytes) -> tuple[dict, bytes]:
    """(header, Executable bytes) of a stored kernel; ValueError unless it is one (header: {"key": the key's
    JSON, "signature": as `signature` gives it})."""
    if len(blob) < _ENTRY_HEAD.size:
        raise ValueError(f"not a kernel cache entry: {len(blob)} bytes is shorter than its header")
    magic, n = _ENTRY_HEAD.unpack_from(blob)
    if magic != ENTRY_MAGIC:
        raise ValueError("not a kernel cache entry (bad magic bytes)")
    if n > min(MAX_ENTRY_HEADER, len(blob) - _ENTRY_HEAD.size):
        raise ValueError(f"kernel cache entry header of {n} bytes runs past the entry (truncated?)")
    try:
        head = json.loads(blob[_ENTRY_HEAD.size:_ENTRY_HEAD.size + n])
    except (ValueError, RecursionError) as err:
        raise ValueError(f"kernel cache entry header is not JSON ({err})") from None
    if not (isinstance(head, dict) and isinstance(head.get("key"), str) and isinstance(head.get("signature"), list)):
        raise ValueError("kernel cache entry header lacks its key or signature")
    return head, blob[_ENTRY_HEAD.size + n:]


def signature(prep: Prepared) -> list:
    """The signature the kernel of `prep` must have, as JSON data: each kernel input in order (each argument as
    the trace reads it: kind, position, shape, dtype; then each array constant's shape and dtype), then each
    output buffer's shape and dtype and which of them the function returns, in order."""
    inputs = [_input(kind, what, n.shape, n.dtype.np) for (kind, what), n in zip(prep.input_plan, prep.inputs)]
    if len(prep.input_plan) != len(prep.inputs):
        inputs.append(["unpaired", len(prep.input_plan), len(prep.inputs)])
    inputs += [_input("const", None, c.shape, c.dtype) for c in kernel_constants(prep)]
    outputs = [[_shape(n.shape), np.dtype(n.dtype.np).str] for n in prep.unique]
    index = {n: k for k, n in enumerate(prep.unique)}
    return [inputs, outputs, [index[o] for o in prep.outputs]]


def executable_signature(params: list[ParamSpec], plan: Plan) -> list:
    """The signature (as `signature` gives it) of a kernel with these parameters and this plan."""
    inputs = [_input(kind, what, p.shape, p.dtype) for (kind, what), p in zip(plan.inputs, params)]
    if len(params) < len(plan.inputs):
        inputs.append(["unpaired", len(plan.inputs), len(params)])
    n_real = len(plan.outputs) - plan.n_scratch
    outputs = [[_shape(shape), np.dtype(dt).str] for shape, dt in plan.outputs[:n_real]]
    return [inputs, outputs, list(plan.result_slots)]


def _input(kind: str, what: Any, shape: tuple[int, ...], dtype: Any) -> list:
    row = [kind, _shape(shape), np.dtype(dtype).str]
    if kind == "arg":
        row.append(int(what))
    elif kind in ("arg_swapped", "scalar"):
        row += [int(what[0]), np.dtype(what[1]).str, [str(t) for t in what[2]] if len(what) > 2 else []]
    return row


def _shape(shape: tuple[int | str | Expr, ...]) -> list[int | str]:
    """Dims as JSON: ints, and symbolic dims as the kernel prints them ("x_0 * 2")."""
    return [d if isinstance(d, str) else printed_dim(d) if isinstance(d, Expr) else int(d) for d in shape]


def save(st: DiskStore | NullStore, key: Key, exe: Executable, verified: str, built_for: list | None = None) -> None:
    """Store a compiled kernel (with its key and the signature it was built for: `built_for`, the traced
    `signature`, default the Executable's own) and, beside it, its key parts and how it was verified."""
    try:
        blob = exe.to_bytes(constants=False)
    except ValueError:  # something the format cannot hold: it stays in memory only
        return
    blob = entry_bytes(key, built_for if built_for is not None else
                       executable_signature(exe.module.params, exe.plan), blob)
    info = {"key": json.loads(key.to_json()), "verified": verified, "created": time.time(), "bytes": len(blob)}
    st.put(KERNEL + key.digest, blob)
    st.put(_info_key(key), json.dumps(info).encode())


def forget(key: Key) -> None:
    """Remove a stored kernel (one that failed verification)."""
    _remove(store(), key)


# ** the dims a function traces as symbols (jitop.shape_policy), kept across processes **
DYNAMIC = "dynamic/"


def _dynamic_key(function: str, struct: Any) -> str | None:
    text = repr(struct)
    if " at 0x" in text or " object at " in text:  # no stable name for this structure
        return None
    digest = hashlib.sha256(f"{function}\n{text}".encode()).hexdigest()
    return f"{DYNAMIC}{digest}"


def load_dynamic(function: str, struct: Any) -> list[tuple[int, int]] | None:
    """The (leaf, dim) pairs an earlier run of `function` made symbolic for calls of `struct`, or None. A record
    that is not exactly a list of two non-negative ints each is ignored (it only ever decides what to trace)."""
    key = _dynamic_key(function, struct)
    if key is None:
        return None
    try:
        raw = store().get(key)
        dims = json.loads(raw) if raw is not None else None
    except (ValueError, OSError):
        return None
    if not (isinstance(dims, list) and all(isinstance(p, list) and len(p) == 2 and
                                             all(type(x) is int and 0 <= x < 1 << 16 for x in p) for p in dims)):
        return None
    return [(k, d) for k, d in dims]


def save_dynamic(function: str, struct: Any, dims: list[tuple[int, int]]) -> None:
    """Keep the symbolic dims of `function`'s calls of `struct` for the next process (never fails a call)."""
    key = _dynamic_key(function, struct)
    if key is None:
        return
    try:
        store().put(key, json.dumps([[k, d] for k, d in dims]).encode())
    except OSError:
        pass


# ** the parameters a function's calls made static on use (jitop.kernel), kept across processes **
STATIC = "static/"


def _static_key(function: str, code: str, prefix: str = STATIC) -> str:
    return prefix + hashlib.sha256(f"{function}\n{code}".encode()).hexdigest()


def load_static(function: str, code: str) -> list[str]:
    """The parameters an earlier run of `function` (its code's digest `code`) made static because a Python scalar
    argument was used as a size ([] if none, or if the record is not a list of identifiers: it only ever decides
    what is traced as a constant)."""
    try:
        raw = store().get(_static_key(function, code))
        names = json.loads(raw) if raw is not None else []
    except (ValueError, OSError):
        return []
    if not isinstance(names, list) or not all(isinstance(n, str) and n.isidentifier() for n in names):
        return []
    return names


def save_static(function: str, code: str, names: list[str]) -> None:
    """Keep the parameters `function`'s calls made static for the next process (never fails a call)."""
    try:
        store().put(_static_key(function, code), json.dumps(sorted(names)).encode())
    except OSError:
        pass


# ** the Python int parameters a function's calls made size symbols (jitop.shape_policy.IntPolicy) **
INTS = "ints/"


def load_int_sizes(function: str, code: str) -> tuple[list[str], dict[str, str]]:
    """(symbolic, demoted) as an earlier run of `function` (its code's digest `code`) left them; empty if none or
    if the record is not exactly that shape (it only ever decides what is traced as a symbol)."""
    try:
        raw = store().get(_static_key(function, code, INTS))
        record = json.loads(raw) if raw is not None else {}
    except (ValueError, OSError):
        return [], {}
    if not isinstance(record, dict):
        return [], {}
    symbolic, demoted = record.get("symbolic", []), record.get("demoted", {})
    if not (isinstance(symbolic, list) and all(isinstance(n, str) and n.isidentifier() for n in symbolic)
            and isinstance(demoted, dict) and all(isinstance(n, str) and n.isidentifier() and isinstance(w, str)
                                                  for n, w in demoted.items())):
        return [], {}
    return symbolic, demoted


def save_int_sizes(function: str, code: str, symbolic: list[str], demoted: dict[str, str]) -> None:
    """Keep `function`'s size-symbol decisions for the next process (never fails a call)."""
    try:
        record = {"symbolic": sorted(symbolic), "demoted": demoted}
        store().put(_static_key(function, code, INTS), json.dumps(record).encode())
    except OSError:
        pass


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
    key parts as kernels: its own content key (IR, target, LLVM), the schema and jitop's code version.

    A stored value carries the full key it was stored under (a length-prefixed JSON header, as a kernel's): a
    value copied or moved under another key is a miss and is removed. The component's loader deletes an object
    that passes this check but does not load (`delete`) and builds it afresh."""

    def __init__(self, kind: str):
        self.kind = kind

    def _key(self, content: str) -> Key:
        return Key.of(schema=keys.SCHEMA_VERSION, kind=self.kind, content=content, jitop=code_version())

    def get(self, content: str) -> bytes | None:
        """The object code stored for this content key, or None (a value stored under another key is removed)."""
        st = store()
        if st is _NULL:
            return None
        key = self._key(content)
        blob = st.get(f"{self.kind}/{key.digest}")
        if blob is None:
            return None
        try:
            head, obj = parse_entry(blob)
            ok = head["key"] == key.to_json()
        except ValueError:
            ok = False
        if not ok:
            st.delete(f"{self.kind}/{key.digest}")
            return None
        return obj

    def put(self, content: str, value: bytes) -> None:
        """Store object code under this content key."""
        st = store()
        if st is not _NULL:
            key = self._key(content)
            st.put(f"{self.kind}/{key.digest}", entry_bytes(key, [], value))

    def delete(self, content: str) -> None:
        """Remove the object code stored under this content key (one that did not load)."""
        st = store()
        if st is not _NULL:
            st.delete(f"{self.kind}/{self._key(content).digest}")
