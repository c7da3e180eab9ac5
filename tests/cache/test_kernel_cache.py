"""The persistent kernel cache (jitop/graph/kernel_cache.py over cache/store.py and cache/keys.py): a second
process loads what the first compiled without running LLVM, damaged or foreign entries are misses that are
removed, unsafe or read-only directories never break a call, many processes share one directory, the size
limit holds, JITOP_CACHE=0 writes nothing, captured globals stay correct across processes, and a miss names
the key part that differs.

Every test uses its own cache directory under tmp_path (never the user's cache); child processes get it
through JITOP_CACHE_DIR and report JSON on their last line of output.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings

import diskcache
import numpy as np
import pytest

import jitop
from jitop.cache.keys import Key, diff, nearest
from jitop.cache.store import DiskStore, frame, unframe
from jitop.codegen.target import compile_count
from jitop.graph import kernel_cache
from jitop.graph.compile import build, prepare
from jitop.runtime.executable import Executable
from jitop.target import KNOWN_CPUS, Target

SCHEMA_MARK = "meta/kernel-schema"  # where the store records the key schema its kernels were written under


# ** kernels (module level, for the in-process tests) **
def elementwise(a, b):
    return np.tanh(a * b) + 1


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ** child processes **
HEADER = """\
import json, os, sys, time, warnings
import numpy as np
import jitop
from jitop.codegen.target import compile_count


def statuses(*kernels):
    return [e.lookup.status for k in kernels for e in k.cache.values()]


def reasons(*kernels):
    return [e.lookup.reason for k in kernels for e in k.cache.values()]


def digests(*kernels):
    return [e.lookup.key.digest for k in kernels for e in k.cache.values()]
"""

# three kernels (elementwise, matmul, softmax); argv: npz path for inputs and results [, barrier directory]
THREE_KERNELS = """
def elementwise(a, b):
    return np.tanh(a * b) + 1


def matmul(a, b):
    return a @ b


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


rng = np.random.default_rng(0)
inputs = {"x": rng.standard_normal((1000, 100)).astype(np.float32),
          "y": rng.standard_normal((1000, 100)).astype(np.float32),
          "a": rng.standard_normal((37, 61)).astype(np.float32),
          "b": rng.standard_normal((61, 29)).astype(np.float32),
          "s": (4 * rng.standard_normal((64, 33))).astype(np.float32)}
kernels = [jitop.kernel(f, fallback=False) for f in (elementwise, matmul, softmax)]
if len(sys.argv) > 2:  # start together: say ready, then wait for the go file
    open(os.path.join(sys.argv[2], f"ready-{os.getpid()}"), "w").close()
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(sys.argv[2], "go")) and time.time() < deadline:
        time.sleep(0.005)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    outs = {"elementwise": kernels[0](inputs["x"], inputs["y"]), "matmul": kernels[1](inputs["a"], inputs["b"]),
            "softmax": kernels[2](inputs["s"])}
np.savez(sys.argv[1], **inputs, **{"out_" + k: v for k, v in outs.items()})
print(json.dumps({"status": statuses(*kernels), "reasons": reasons(*kernels), "compiles": compile_count(),
                  "warnings": [str(w.message) for w in caught]}))
"""


def run_child(tmp_path, name: str, body: str, cache_dir, *args, env: dict | None = None,
              check: bool = True) -> tuple[dict, subprocess.CompletedProcess]:
    """Run HEADER + body as a script with JITOP_CACHE_DIR=cache_dir; its last stdout line parsed as JSON."""
    script = tmp_path / f"{name}.py"
    if not script.exists():
        script.write_text(HEADER + textwrap.dedent(body))
    proc = subprocess.run([sys.executable, str(script), *map(str, args)],
                          env={**os.environ, "JITOP_CACHE_DIR": str(cache_dir), **(env or {})},
                          capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, f"child {name} failed:\n{proc.stdout}\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    return (json.loads(lines[-1]) if lines else {}), proc


def check_three(npz_path) -> None:
    """The three kernels' results (saved by THREE_KERNELS) equal numpy's on the same inputs."""
    d = np.load(npz_path)
    np.testing.assert_allclose(d["out_elementwise"], elementwise(d["x"], d["y"]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(d["out_matmul"], d["a"] @ d["b"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(d["out_softmax"], softmax(d["s"]), rtol=1e-5, atol=1e-7)


def kernel_entries(cache_dir) -> list[str]:
    """The digests of the kernels stored in cache_dir (read with diskcache directly, not through jitop)."""
    with diskcache.Cache(str(cache_dir)) as c:
        return [k[len("kernel/"):] for k in c.iterkeys() if isinstance(k, str) and k.startswith("kernel/")]


def tree(path) -> dict[str, tuple[int, int]]:
    """Every file under `path` with its size and mtime (to prove nothing was written)."""
    found = {}
    for dirpath, _, filenames in os.walk(path):
        for f in filenames:
            st = os.stat(os.path.join(dirpath, f))
            found[os.path.relpath(os.path.join(dirpath, f), path)] = (st.st_size, st.st_mtime_ns)
    return found


# ** 1. a second process hits **
def test_second_process_loads_every_kernel_without_llvm(tmp_path):
    """The first process compiles and saves (three misses); a second one loads all three (elementwise, a
    matmul, a softmax reduction) from the cache with LLVM never run, and both compute numpy's results."""
    cache = tmp_path / "cache"
    first, _ = run_child(tmp_path, "three", THREE_KERNELS, cache, tmp_path / "first.npz")
    second, _ = run_child(tmp_path, "three", THREE_KERNELS, cache, tmp_path / "second.npz")
    assert first["status"] == ["miss"] * 3 and first["compiles"] > 0
    # the reasons name any differing key part (e.g. "jitop" if its source was edited between the two runs)
    assert second["status"] == ["hit"] * 3, second["reasons"]
    assert second["compiles"] == 0
    check_three(tmp_path / "first.npz")
    check_three(tmp_path / "second.npz")


# ** 2. damaged, foreign and outdated entries **
def _foreign_target() -> Target | None:
    """A known CPU with a feature this machine lacks (code built for it must never be loaded here)."""
    host = Target.host()
    return next((t for t in map(Target.from_string, KNOWN_CPUS) if t.missing_on(host)), None)


def _foreign_blob(a, b) -> bytes:
    """elementwise(a, b) compiled for a CPU this machine is not, as the cache stores it."""
    foreign = _foreign_target()
    if foreign is None:
        pytest.skip("every known CPU's features are present on this machine: no foreign target to build for")
    k = jitop.kernel(elementwise, fallback=False)
    tr = k.trace([a, b])
    prep = prepare(k.__name__, tr.inputs, tr.names, tr.plan, tr.results, target=foreign)
    blob = build(prep).to_bytes(constants=False)
    with pytest.raises(jitop.TargetMismatchError):
        Executable.from_bytes(blob, constants=[])
    return blob


DAMAGE = {
    "garbage": lambda name, blob, a, b: b"junk",                              # not a frame at all
    "truncated": lambda name, blob, a, b: frame(name, blob[:len(blob) // 2]),  # a valid frame, half an Executable
    "foreign-target": lambda name, blob, a, b: frame(name, _as_entry_of(blob, _foreign_blob(a, b))),  # for another CPU
}


def _as_entry_of(entry: bytes, exe_blob: bytes) -> bytes:
    """`exe_blob` as a kernel entry with `entry`'s header (the key and signature it claims)."""
    head, _ = kernel_cache.parse_entry(entry)
    return kernel_cache.entry_bytes(Key.from_json(head["key"]), head["signature"], exe_blob)


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_entry_is_a_miss_and_is_removed(tmp_path, monkeypatch, damage):
    """A stored kernel replaced by garbage, by a checksummed but truncated Executable, or by one built for a CPU
    this machine lacks is never loaded: the call is a miss computing numpy's result, the entry is removed
    (seen with saving switched off), and once saved again the next lookup hits."""
    monkeypatch.setenv("JITOP_CACHE_DIR", str(tmp_path / "cache"))
    a = np.linspace(-2, 2, 1000, dtype=np.float32)
    b = np.linspace(1, 3, 1000, dtype=np.float32)
    want = elementwise(a, b)
    k = jitop.kernel(elementwise, fallback=False)
    k(a, b)
    (entry,) = k.cache.values()
    assert entry.lookup.status == "miss"
    name = "kernel/" + entry.lookup.key.digest
    blob = DiskStore(str(tmp_path / "cache")).get(name)
    assert blob is not None
    bad = DAMAGE[damage](name, blob, a, b)
    with diskcache.Cache(str(tmp_path / "cache")) as c:
        c.set(name, bad)

    monkeypatch.setattr(kernel_cache, "save", lambda *args, **kwargs: None)
    k2 = jitop.kernel(elementwise, fallback=False)
    np.testing.assert_allclose(k2(a, b), want, rtol=1e-5, atol=1e-6)
    (entry2,) = k2.cache.values()
    assert entry2.lookup.status == "miss"
    assert entry2.lookup.key.digest == entry.lookup.key.digest
    if damage != "garbage":  # it passed the store's checksum: the Executable loader refused it
        assert "removed" in entry2.lookup.reason, entry2.lookup.reason
    if damage == "foreign-target":
        assert "lacks" in entry2.lookup.reason, entry2.lookup.reason
    assert entry.lookup.key.digest not in kernel_entries(tmp_path / "cache")

    monkeypatch.undo()
    monkeypatch.setenv("JITOP_CACHE_DIR", str(tmp_path / "cache"))
    for expected in ("miss", "hit"):
        k3 = jitop.kernel(elementwise, fallback=False)
        np.testing.assert_allclose(k3(a, b), want, rtol=1e-5, atol=1e-6)
        assert [e.lookup.status for e in k3.cache.values()] == [expected]


def test_damaged_entry_miss_reason_is_not_empty(tmp_path, monkeypatch):
    """The reason of a miss caused by a corrupt entry does not claim a nearest entry differing in nothing."""
    monkeypatch.setenv("JITOP_CACHE_DIR", str(tmp_path / "cache"))
    a = np.linspace(-2, 2, 100, dtype=np.float32)
    k = jitop.kernel(elementwise, fallback=False)
    k(a, a)
    (entry,) = k.cache.values()
    with diskcache.Cache(str(tmp_path / "cache")) as c:
        c.set("kernel/" + entry.lookup.key.digest, b"junk")
    k2 = jitop.kernel(elementwise, fallback=False)
    k2(a, a)
    (entry2,) = k2.cache.values()
    assert entry2.lookup.status == "miss"
    assert not entry2.lookup.reason.rstrip().endswith("differs in"), entry2.lookup.reason


SCHEMA_BUMP = """
import jitop.cache.keys
from jitop.graph import kernel_cache

if sys.argv[1] == "bump":  # a jitop whose key schema is one newer, before anything opens the store
    jitop.cache.keys.SCHEMA_VERSION += 1
    if hasattr(kernel_cache, "SCHEMA_VERSION"):
        kernel_cache.SCHEMA_VERSION = jitop.cache.keys.SCHEMA_VERSION


def f(a):
    return np.sqrt(a) * 3 - a


a = np.linspace(0, 4, 500, dtype=np.float32)
k = jitop.kernel(f, fallback=False)
out = k(a)
np.testing.assert_allclose(out, np.sqrt(a) * 3 - a, rtol=1e-5, atol=1e-6)
print(json.dumps({"status": statuses(k), "digest": digests(k)[0], "schema": jitop.cache.keys.SCHEMA_VERSION}))
"""


def test_schema_bump_removes_old_kernels(tmp_path):
    """A jitop with a newer key schema opening a store written under the old one removes the old kernels and
    their info (they could never be hit again), records its own schema, and its call is a correct miss."""
    cache = tmp_path / "cache"
    old, _ = run_child(tmp_path, "schema", SCHEMA_BUMP, cache, "same")
    assert old["status"] == ["miss"]
    with diskcache.Cache(str(cache)) as c:
        assert unframe(SCHEMA_MARK, c.get(SCHEMA_MARK)) == str(old["schema"]).encode()
    assert kernel_entries(cache) == [old["digest"]]

    new, _ = run_child(tmp_path, "schema", SCHEMA_BUMP, cache, "bump")
    assert new["schema"] == old["schema"] + 1
    assert new["status"] == ["miss"] and new["digest"] != old["digest"]
    assert kernel_entries(cache) == [new["digest"]]
    with diskcache.Cache(str(cache)) as c:
        assert unframe(SCHEMA_MARK, c.get(SCHEMA_MARK)) == str(new["schema"]).encode()
        infos = [k for k in c.iterkeys() if k.startswith("kernel-info/")]
    assert len(infos) == 1 and infos[0].endswith(new["digest"])


# ** 3. refused directories **
@pytest.mark.parametrize("unsafe", ["world-writable", "group-writable", "other-owner"])
def test_unsafe_directory_is_refused(tmp_path, monkeypatch, unsafe):
    """A cache directory that others may write (0o777), its group may write (0o770) or another user owns is
    refused with exactly one RuntimeWarning naming it: calls compile in memory and are correct, statuses are
    "off", and nothing is written into the directory."""
    d = tmp_path / "shared"
    d.mkdir()
    if unsafe == "world-writable":
        os.chmod(d, 0o777)
    elif unsafe == "group-writable":
        os.chmod(d, 0o770)
    else:
        os.chmod(d, 0o700)
        if os.geteuid() == 0:
            os.chown(d, 65534, 65534)  # root can give it away: a real foreign owner
        else:
            real = os.geteuid()
            monkeypatch.setattr(os, "geteuid", lambda: real + 1)
    monkeypatch.setenv("JITOP_CACHE_DIR", str(d))
    before = compile_count()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        k = jitop.kernel(elementwise, fallback=False)
        for n in (300, 301):
            a = np.linspace(-1, 1, n, dtype=np.float32)
            np.testing.assert_allclose(k(a, a), elementwise(a, a), rtol=1e-5, atol=1e-6)
        s = jitop.kernel(softmax, fallback=False)
        x = np.linspace(-3, 3, 40, dtype=np.float32).reshape(5, 8)
        np.testing.assert_allclose(s(x), softmax(x), rtol=1e-5, atol=1e-7)
    cache_warnings = [w for w in caught if issubclass(w.category, RuntimeWarning) and str(d) in str(w.message)]
    assert len(cache_warnings) == 1, [str(w.message) for w in caught]
    assert [e.lookup.status for kk in (k, s) for e in kk.cache.values()] == ["off"] * 3
    assert all(str(d) in e.lookup.reason for kk in (k, s) for e in kk.cache.values())
    assert compile_count() >= before + 3
    assert os.listdir(d) == []


# ** 4. many processes at once **
PROCS = 4


@pytest.mark.slow
def test_four_processes_share_a_fresh_directory(tmp_path):
    """Four processes (twice the cores of a small CI machine) started together on one directory that does not
    exist yet, each compiling three kernels: all succeed with nothing on stderr and numpy's results, the
    directory ends up holding the three kernels once, and a fifth process then hits all three."""
    cache = tmp_path / "fresh" / "cache"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    script = tmp_path / "three.py"
    script.write_text(HEADER + textwrap.dedent(THREE_KERNELS))
    env = {**os.environ, "JITOP_CACHE_DIR": str(cache)}
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / f"out{i}.npz"), str(barrier)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(PROCS)]
    try:
        deadline = time.time() + 60
        while len(list(barrier.glob("ready-*"))) < PROCS and time.time() < deadline:
            time.sleep(0.01)
        (barrier / "go").touch()
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
        assert "Traceback" not in err and "Warning" not in err, err
        report = json.loads(out.strip().splitlines()[-1])
        assert report["warnings"] == []
        assert set(report["status"]) <= {"hit", "miss"} and len(report["status"]) == 3
    assert len(list(barrier.glob("ready-*"))) == PROCS
    for i in range(PROCS):
        check_three(tmp_path / f"out{i}.npz")
    assert len(kernel_entries(cache)) == 3
    fifth, _ = run_child(tmp_path, "three", THREE_KERNELS, cache, tmp_path / "fifth.npz")
    assert fifth["status"] == ["hit"] * 3 and fifth["compiles"] == 0, fifth["reasons"]
    check_three(tmp_path / "fifth.npz")


# ** 5. eviction **
EVICTION = """
from jitop.cache.store import frame
from jitop.graph import kernel_cache


def f(a):
    return np.tanh(a) * 2 + 1


k = jitop.kernel(f, fallback=False, dynamic=False)  # a kernel per shape
steps = []
for n in range(1, 16):
    a = np.linspace(-1, 1, n * (7 + n), dtype=np.float32).reshape(n, 7 + n)
    np.testing.assert_allclose(k(a), np.tanh(a) * 2 + 1, rtol=1e-5, atol=1e-6)
    (status,), (digest,) = statuses(k)[-1:], digests(k)[-1:]
    st = kernel_cache.store()  # read without get(): a get would refresh the entries' LRU times
    e = k.cache[next(reversed(k.cache))]  # its entry as stored: header (key, signature), then the Executable
    entry = kernel_cache.entry_bytes(e.lookup.key, kernel_cache.executable_signature(e.exe.module.params, e.exe.plan),
                                     e.exe.to_bytes(constants=False))
    steps.append({"status": status, "digest": digest, "volume": st.volume(),
                  "stored": "kernel/" + digest in st.keys("kernel/"), "bytes": len(frame("kernel/" + digest, entry))})
print(json.dumps({"steps": steps, "limit": st.size_limit}))
"""

NEWEST = """
def f(a):
    return np.tanh(a) * 2 + 1


n = 15
a = np.linspace(-1, 1, n * (7 + n), dtype=np.float32).reshape(n, 7 + n)
k = jitop.kernel(f, fallback=False)
np.testing.assert_allclose(k(a), np.tanh(a) * 2 + 1, rtol=1e-5, atol=1e-6)
print(json.dumps({"status": statuses(k)}))
"""


@pytest.fixture(scope="module")
def eviction_run(tmp_path_factory):
    """One child process compiling 15 distinct kernels (shapes) into a 200 KB cache."""
    tmp = tmp_path_factory.mktemp("eviction")
    report, _ = run_child(tmp, "evict", EVICTION, tmp / "cache", env={"JITOP_CACHE_SIZE": "200KB"})
    return tmp, report


def test_eviction_keeps_the_cache_near_its_limit(eviction_run):
    """With JITOP_CACHE_SIZE=200KB, fifteen ~30 KB kernels do not all stay: the oldest are evicted and the
    directory's volume never exceeds the limit by more than one entry and two SQLite pages. (diskcache checks
    the volume after each insert and, at or above the limit, culls up to cull_limit=16 least-recently-used
    entries in the same transaction; only the entry just inserted can be above the limit when it does.)"""
    tmp, report = eviction_run
    limit, steps = report["limit"], report["steps"]
    assert limit == 200 << 10
    assert [s["status"] for s in steps] == ["miss"] * 15
    largest = max(s["bytes"] for s in steps)
    assert 0 < largest < limit
    for s in steps:
        assert s["volume"] <= limit + largest + 2 * 4096, s
    stored = kernel_entries(tmp / "cache")
    assert 0 < len(stored) < 15
    assert steps[0]["digest"] not in stored
    assert DiskStore(str(tmp / "cache")).volume() <= limit + largest + 2 * 4096


def test_eviction_keeps_the_newest_entry(eviction_run, tmp_path):
    """Every kernel is still stored right after it was compiled (eviction removes least-recently-used entries,
    never the one just written), and a new process hits the newest one."""
    tmp, report = eviction_run
    assert all(s["stored"] for s in report["steps"]), [s["stored"] for s in report["steps"]]
    newest, _ = run_child(tmp_path, "newest", NEWEST, tmp / "cache", env={"JITOP_CACHE_SIZE": "200KB"})
    assert newest["status"] == ["hit"]


# ** 6. JITOP_CACHE=0 **
OFF = """
def f(a, b):
    return np.tanh(a * b) + 1


a = np.linspace(-1, 1, 777, dtype=np.float32)
k = jitop.kernel(f, fallback=False)
np.testing.assert_allclose(k(a, a), np.tanh(a * a) + 1, rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(k(a[:5], a[:5]), np.tanh(a[:5] * a[:5]) + 1, rtol=1e-5, atol=1e-6)
print(json.dumps({"status": statuses(k), "compiles": compile_count()}))
"""


def test_cache_off_writes_nothing(tmp_path):
    """JITOP_CACHE=0: a fresh process compiles everything in memory (statuses "off"), computes numpy's results,
    and never creates the cache directory (no kernels, no thread-pool or call-entry code)."""
    cache = tmp_path / "cache"
    report, proc = run_child(tmp_path, "off", OFF, cache, env={"JITOP_CACHE": "0"})
    assert report["status"] == ["off", "off"]
    assert report["compiles"] >= 2
    assert not cache.exists()
    assert proc.stderr == ""


# ** 7. read-only directory **
READ_ONLY = """
def f(a):
    return np.tanh(a) * 2 + 1


def g(a):
    return np.exp(a) - a


a = np.linspace(-1, 1, 300, dtype=np.float32)
kernels = [jitop.kernel(f, fallback=False)]
if sys.argv[1] == "both":
    kernels.append(jitop.kernel(g, fallback=False))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    np.testing.assert_allclose(kernels[0](a), np.tanh(a) * 2 + 1, rtol=1e-5, atol=1e-6)
    if len(kernels) > 1:
        np.testing.assert_allclose(kernels[1](a), np.exp(a) - a, rtol=1e-5, atol=1e-6)
print(json.dumps({"status": statuses(*kernels), "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}))
"""


def test_read_only_directory_never_breaks_a_call(tmp_path):
    """A cache directory that became read-only after a first process filled it: a second process's calls (one
    stored kernel, one new) are correct, warn at most once (naming the directory), and write nothing there.
    As root, permission bits do not stop writes, so the directory is made immutable (chattr +i) instead."""
    cache = tmp_path / "cache"
    first, _ = run_child(tmp_path, "ro", READ_ONLY, cache, "one")
    assert first["status"] == ["miss"]
    before = tree(cache)
    root = os.geteuid() == 0
    if root:
        made = subprocess.run(["chattr", "+i", str(cache)], capture_output=True, text=True) \
            if shutil.which("chattr") else None
        if made is None or made.returncode != 0:
            pytest.skip("running as root and the directory cannot be made immutable (chattr +i): root writes "
                        "through any permission bits, so there is no read-only directory to test")
    else:
        os.chmod(cache, 0o500)
    try:
        second, _ = run_child(tmp_path, "ro", READ_ONLY, cache, "both")
    finally:
        if root:
            subprocess.run(["chattr", "-i", str(cache)], check=True)
        else:
            os.chmod(cache, 0o700)
    assert second["status"][0] in ("hit", "off"), second
    assert second["status"][1] in ("miss", "off"), second
    assert len(second["warnings"]) <= 1, second["warnings"]
    assert all(w.startswith("RuntimeWarning") and str(cache) in w for w in second["warnings"])
    assert tree(cache) == before


# ** 8. captured globals across processes **
CAPTURED = """
W = np.full(5, float(sys.argv[1]), np.float32)
EPS = float(sys.argv[2])


def f(a):
    return a * W + EPS


a = np.arange(5, dtype=np.float32) - 2
k = jitop.kernel(f, fallback=False)
out = k(a)
print(json.dumps({"status": statuses(k), "out": out.tolist(), "want": (a * W + EPS).tolist()}))
"""


def test_captured_globals_across_processes(tmp_path):
    """A module-level array is read where it lives and a module-level scalar is part of the key: across
    processes, a changed array hits the stored kernel yet computes with the new values, a changed scalar is a
    miss with the new result, and an identical rerun hits."""
    cache = tmp_path / "cache"
    runs = [("2", "0.5", "miss"), ("3", "0.5", "hit"), ("2", "0.25", "miss"), ("2", "0.5", "hit")]
    for w, eps, expected in runs:
        report, _ = run_child(tmp_path, "captured", CAPTURED, cache, w, eps)
        a = np.arange(5, dtype=np.float32) - 2
        want = a * np.float32(w) + float(eps)
        np.testing.assert_allclose(report["want"], want, rtol=1e-6)
        np.testing.assert_allclose(report["out"], want, rtol=1e-6, err_msg=f"W={w} EPS={eps}")
        assert report["status"] == [expected], (w, eps, report)


# ** 9. keys and miss reasons **
def test_key_digest_depends_on_values_types_and_order():
    """A key's digest is the same for the same parts, and differs for another value, another JSON type of the
    same value, or the same parts in another order."""
    k = Key.of(schema=1, kind="kernel", graph="ab12")
    assert k.digest == Key.of(schema=1, kind="kernel", graph="ab12").digest
    assert len(k.digest) == 64 and int(k.digest, 16) >= 0
    assert k.digest != Key.of(schema=1, kind="kernel", graph="ab13").digest
    assert k.digest != Key.of(schema="1", kind="kernel", graph="ab12").digest
    assert k.digest != Key.of(kind="kernel", schema=1, graph="ab12").digest
    assert k.names() == ["schema", "kind", "graph"] and k.get("graph") == "ab12"
    with pytest.raises(KeyError):
        k.get("target")


def test_key_json_round_trip():
    """to_json/from_json give back an equal key with the same digest (nested lists included), and anything
    that is not a list of [name, value] pairs is a ValueError."""
    k = Key.of(schema=1, configs=[["matmul", "w", {"tile": [4, 8]}]], target="t", flag=True, none=None)
    back = Key.from_json(k.to_json())
    assert back == Key.from_json(back.to_json())
    assert back.digest == k.digest and back.names() == k.names()
    assert diff(k, back) == []
    for bad in ('{"schema": 1}', "[[1, 2]]", '[["a", 1, 2]]', '"key"'):
        with pytest.raises(ValueError):
            Key.from_json(bad)


def test_diff_and_nearest():
    """diff names the parts that differ (a part only one key has counts); nearest picks the candidate with
    the fewest differing parts, and on a tie the one differing in a later part (earlier parts weigh more)."""
    k = Key.of(schema=1, graph="g", target="t", llvm="18")
    assert diff(k, Key.of(schema=1, graph="g", target="u", llvm="18")) == ["target"]
    assert diff(k, Key.of(schema=1, graph="g", target="t")) == ["llvm"]
    assert diff(k, Key.of(schema=1, graph="h", target="t", llvm="18", extra=0)) == ["graph", "extra"]
    far = Key.of(schema=2, graph="x", target="t", llvm="18")
    graph_only = Key.of(schema=1, graph="x", target="t", llvm="18")
    llvm_only = Key.of(schema=1, graph="g", target="t", llvm="19")
    assert nearest(k, [far, graph_only]) == (graph_only, ["graph"])
    assert nearest(k, [graph_only, llvm_only]) == (llvm_only, ["llvm"])
    assert nearest(k, [llvm_only, graph_only]) == (llvm_only, ["llvm"])
    assert nearest(k, []) == (None, [])


def test_store_frames_are_checked(tmp_path):
    """A stored value is framed with its key's digest and its checksum: a flipped byte, a cut frame or a value
    framed for another key reads as a miss, is counted as corrupt and is removed; a good value round-trips."""
    assert unframe("bad", frame("bad", b"payload")) == b"payload"
    assert unframe("good", frame("bad", b"payload")) is None
    bad = bytearray(frame("bad", b"payload"))
    bad[-1] ^= 1
    assert unframe("bad", bytes(bad)) is None and unframe("bad", frame("bad", b"payload")[:-1]) is None
    assert unframe("bad", b"x") is None
    st = DiskStore(str(tmp_path / "store"))
    st.put("good", b"value")
    with diskcache.Cache(str(tmp_path / "store")) as c:
        c.set("bad", bytes(bad))
    assert st.get("good") == b"value"
    assert st.get("bad") is None and st.stats["corrupt"] == 1
    assert st.keys() == ["good"]


MISS_REASON = """
def f(a):
    return np.tanh(a) * 2 + 1


a = np.linspace(-1, 1, int(sys.argv[1]), dtype=np.float32)
k = jitop.kernel(f, fallback=False)
np.testing.assert_allclose(k(a), np.tanh(a) * 2 + 1, rtol=1e-5, atol=1e-6)
print(json.dumps({"status": statuses(k), "reason": reasons(k)[0]}))
"""


def test_miss_reason_names_the_differing_part(tmp_path):
    """After a process stored f for float32 (1000,), a new process calling f on (999,) misses with a reason
    naming the graph, one with JITOP_OPT_LEVEL=2 misses naming the target, and the original call hits."""
    cache = tmp_path / "cache"
    first, _ = run_child(tmp_path, "reason", MISS_REASON, cache, 1000)
    assert first["status"] == ["miss"]
    shape, _ = run_child(tmp_path, "reason", MISS_REASON, cache, 999)
    assert shape["status"] == ["miss"]
    assert "differs in graph" in shape["reason"] and "target" not in shape["reason"], shape["reason"]
    opt, _ = run_child(tmp_path, "reason", MISS_REASON, cache, 1000, env={"JITOP_OPT_LEVEL": "2"})
    assert opt["status"] == ["miss"]
    assert "differs in target" in opt["reason"] and "graph" not in opt["reason"], opt["reason"]
    again, _ = run_child(tmp_path, "reason", MISS_REASON, cache, 1000)
    assert again["status"] == ["hit"]
