"""A stored entry is loaded only if it is the kernel it claims to be (issue 22, finding 1).

Every entry is copied or moved under another key through the store's own API (`store().get(key_a)` then
`store().put(key_b, ...)`): the store frames it afresh under its new key, so whatever the store checks, the
layer above (jitop/graph/kernel_cache.py) must notice. A kernel entry carries the full key it was stored under
and the signature it was built for, both checked against the lookup before anything is linked in or called; a
mismatch is a miss, the entry is removed and the kernel compiled again. A runtime component (the thread pool,
the native call entry) whose stored object code does not load is removed and built afresh in the same process:
matmul never stays on numpy's path from one run to the next.

Every test uses its own cache directory under tmp_path; anything that crashed before the checks existed runs
in a child process, so a regression fails the test instead of killing the test run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import jitop
from jitop.cachedir import KERNEL, store
from jitop.codegen.loader import check_object
from jitop.graph import kernel_cache
from jitop.graph.kernel_cache import ComponentStore, entry_bytes, parse_entry


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JITOP_CACHE_DIR", str(tmp_path / "cache"))


def add(a, b):
    return a + b


def ew(a, b):
    return a * 2 - b


def only(k):
    (entry,) = k.cache.values()
    return entry


def keyed(k):
    """The cache key of each signature `k` compiled, in call order."""
    return [e.lookup.key for e in k.cache.values()]


def swap_in(src, dst) -> None:
    """The stored value of key `src` copied under key `dst` (through the store, which frames it afresh)."""
    st = store()
    st.put(KERNEL + dst.digest, st.get(KERNEL + src.digest))


def assert_replaced(key) -> None:
    """The entry under `key` is one built for it again (its header names this key)."""
    head, _ = parse_entry(store().get(KERNEL + key.digest))
    assert head["key"] == key.to_json()


# ** (i) a larger kernel's entry under a smaller one's key **
def test_larger_kernel_under_a_smaller_ones_key_is_a_miss(tmp_path):
    """add compiled for n = 1024 and n = 4; the n = 1024 entry copied over the n = 4 one: a fresh kernel called
    with n = 4 misses (the entry was built for another key), returns a + b of shape (4,), and stores a kernel
    for n = 4 again, which the next kernel object hits."""
    big, small = np.linspace(0, 1, 1024, dtype=np.float32), np.arange(4, dtype=np.float32)
    k = jitop.kernel(add, fallback=False)
    k(big, big)
    k(small, small)
    key_big, key_small = keyed(k)
    swap_in(key_big, key_small)

    k2 = jitop.kernel(add, fallback=False)
    out = k2(small, small)
    assert out.shape == (4,)
    np.testing.assert_array_equal(out, small + small)
    e = only(k2)
    assert e.lookup.status == "miss" and "built for another" in e.lookup.reason and "removed" in e.lookup.reason, \
        e.lookup.reason
    assert_replaced(key_small)
    k3 = jitop.kernel(add, fallback=False)
    np.testing.assert_array_equal(k3(small, small), small + small)
    assert only(k3).lookup.status == "hit"


# ** (ii) another signature's kernel under this key **
@pytest.mark.parametrize("how", ["copied", "header-names-this-key", "header-names-this-key-and-signature"])
def test_another_signatures_kernel_is_a_miss(how):
    """ew compiled for (7, 13) and (1, 1000); the (7, 13) kernel stored under the (1, 1000) key: as copied, or
    rewrapped with a header claiming this key (and this signature): ew(1, 1000) misses and returns shape
    (1, 1000) with numpy's values. The last case passes every header check: the kernel's own parameters are
    what refuse it, before its object code is linked in."""
    a1, b1 = np.ones((7, 13), np.float32), np.full((7, 13), 3, np.float32)
    a2 = np.linspace(-1, 1, 1000, dtype=np.float32).reshape(1, 1000)
    b2 = np.linspace(2, 3, 1000, dtype=np.float32).reshape(1, 1000)
    k = jitop.kernel(ew, fallback=False)
    k(a1, b1)
    k(a2, b2)
    key_a, key_b = keyed(k)
    if how == "copied":
        swap_in(key_a, key_b)
    else:
        st = store()
        head_a, body_a = parse_entry(st.get(KERNEL + key_a.digest))
        head_b, _ = parse_entry(st.get(KERNEL + key_b.digest))
        assert head_a["signature"] != head_b["signature"]
        sig = head_b["signature"] if how.endswith("signature") else head_a["signature"]
        st.put(KERNEL + key_b.digest, entry_bytes(key_b, sig, body_a))

    k2 = jitop.kernel(ew, fallback=False)
    out = k2(a2, b2)
    assert out.shape == (1, 1000)
    np.testing.assert_allclose(out, a2 * 2 - b2, rtol=1e-6)
    e = only(k2)
    assert e.lookup.status == "miss", e.lookup.reason
    expected = {"copied": "another key", "header-names-this-key": "another signature",
                "header-names-this-key-and-signature": "another signature"}[how]
    assert expected in e.lookup.reason and "removed" in e.lookup.reason, e.lookup.reason
    assert_replaced(key_b)
    k3 = jitop.kernel(ew, fallback=False)
    np.testing.assert_allclose(k3(a2, b2), a2 * 2 - b2, rtol=1e-6)
    assert only(k3).lookup.status == "hit"


def test_every_kind_of_signature_still_hits():
    """The check never refuses an entry for its own signature: scalar arguments (float, int), a byte-swapped
    array, a captured constant, several outputs, a repeated output and a returned argument all load again."""
    const = np.arange(6, dtype=np.float64)

    def many(a, b, s, n):
        c = a * s + n + const
        return c, c.sum(), b + 1, c, a

    args = (np.ones(6), np.arange(6, dtype=">i4"), 2.5, 3)
    want = many(*args)
    k = jitop.kernel(many, fallback=False)
    k(*args)
    assert only(k).lookup.status == "miss"
    k2 = jitop.kernel(many, fallback=False)
    got = k2(*args)
    assert only(k2).lookup.status == "hit", only(k2).lookup.reason
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w)


# ** (iii) a kernel of the same signature, of another function **
MATMUL_SEED = """
import json, sys
import numpy as np
import jitop
from jitop.ops import linalg


@jitop.kernel(fallback=False)
def mm_relu(a, b):
    return np.maximum(a @ b, 0)


rng = np.random.default_rng(0)
a, b = rng.standard_normal((48, 32), np.float32), rng.standard_normal((32, 40), np.float32)
mm_relu(a, b)
jitop.matmul(a, b)
keys = [e.lookup.key.to_json() for k in (mm_relu, linalg._matmul) for e in k.cache.values()]
print(json.dumps({"keys": keys}))
"""

MATMUL_AGAIN = """
import json, sys, warnings
import numpy as np
import jitop
from jitop.ops import linalg

rng = np.random.default_rng(0)
a, b = rng.standard_normal((48, 32), np.float32), rng.standard_normal((32, 40), np.float32)
with warnings.catch_warnings():
    warnings.simplefilter("error")
    outs = [jitop.matmul(a, b) for _ in range(3)]
ok = all(np.allclose(o, a @ b, rtol=1e-4, atol=1e-4) for o in outs)
print(json.dumps({"ok": ok, "lookups": [[e.lookup.status, e.lookup.reason] for e in linalg._matmul.cache.values()]}))
"""


def run_child(tmp_path, name: str, body: str, *args, env: dict | None = None) -> tuple[dict, subprocess.CompletedProcess]:
    """Run `body` as a script with this test's JITOP_CACHE_DIR; its last stdout line parsed as JSON."""
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(body))
    proc = subprocess.run([sys.executable, str(script), *map(str, args)], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"child {name} failed with {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc


def test_same_signature_kernel_of_another_function_is_a_miss(tmp_path):
    """`a @ b` then ReLU and jitop.matmul take and give the same arrays; the ReLU kernel stored under
    jitop.matmul's key: every later run's matmul would silently drop the negative values. The entry names the
    key it was stored under: the next run misses, computes a @ b and stores matmul's own kernel again."""
    from jitop.cache.keys import Key
    seeded, _ = run_child(tmp_path, "seed", MATMUL_SEED)
    key_relu, key_mm = (Key.from_json(k) for k in seeded["keys"])
    swap_in(key_relu, key_mm)

    first, _ = run_child(tmp_path, "again", MATMUL_AGAIN)
    assert first["ok"]
    ((status, reason),) = first["lookups"]
    assert status == "miss" and "another key" in reason, reason
    assert_replaced(key_mm)
    second, _ = run_child(tmp_path, "again", MATMUL_AGAIN)
    assert second["ok"] and [s for s, _ in second["lookups"]] == ["hit"]


# ** (iv) the runtime components' object code swapped **
COMPONENTS = """
import json, sys, warnings
import numpy as np
import jitop
from jitop.codegen.target import compile_count
from jitop.graph.kernel_cache import ComponentStore
from jitop.dispatch import Overload
from jitop.ops import linalg
from jitop.runtime import fastcall, parallel

seen = {}


class Recording(ComponentStore):  # notes the content key each component asks for
    def get(self, content):
        seen[self.kind] = content
        return super().get(content)


parallel.use_object_store(lambda: Recording("pool"))
fastcall.use_object_store(lambda: Recording("fastcall"))
rng = np.random.default_rng(1)
a, b = rng.standard_normal((384, 256), np.float32), rng.standard_normal((256, 320), np.float32)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ok = all(np.allclose(jitop.matmul(a, b), a @ b, rtol=1e-3, atol=1e-3) for _ in range(3))
entries = list(linalg._matmul.cache.values())
print(json.dumps({
    "ok": ok, "compiled": [isinstance(e, Overload) for e in entries],
    "status": [e.lookup.status for e in entries if isinstance(e, Overload)],
    "pool": parallel._pool is not None, "fastcall": bool(fastcall._state),
    "warnings": [str(w.message) for w in caught], "compiles": compile_count(), "seen": seen}))
"""


def _swap_values(st, p: str, f: str) -> None:
    vp, vf = st.get(p), st.get(f)
    assert vp is not None and vf is not None
    st.put(p, vf)
    st.put(f, vp)


@pytest.mark.parametrize("how", ["store-values", "object-code"])
def test_swapped_runtime_components_are_rebuilt(tmp_path, how):
    """A run of jitop.matmul stores the thread pool's and the native entry's object code; they are swapped:
    as stored values (each now under the other's key) or as object code rewrapped under its own key (so only
    loading it can tell). The next run loads the pool and the entry natively (no fallback to numpy, no
    warning), having removed and rebuilt them; the run after that compiles nothing at all."""
    seeded, _ = run_child(tmp_path, "components", COMPONENTS)
    assert seeded["ok"] and seeded["pool"] and seeded["fastcall"] and seeded["compiled"] == [True], seeded
    cp, cf = seeded["seen"]["pool"], seeded["seen"]["fastcall"]
    pool, fast = ComponentStore("pool"), ComponentStore("fastcall")
    assert check_object(pool.get(cp)).sizes.get("jitop_parallel_for") is not None
    if how == "store-values":
        st = store()
        (p,), (f,) = st.keys("pool/"), st.keys("fastcall/")
        _swap_values(st, p, f)
    else:
        obj_p, obj_f = pool.get(cp), fast.get(cf)
        pool.put(cp, obj_f)
        fast.put(cf, obj_p)
        assert pool.get(cp) == obj_f  # passes the header's key check: only loading it can refuse it

    after, _ = run_child(tmp_path, "components", COMPONENTS)
    assert after["ok"] and after["compiled"] == [True] and after["status"] == ["hit"], after
    assert after["pool"] and after["fastcall"], after
    assert not any("plain numpy" in w or "does not define" in w for w in after["warnings"]), after["warnings"]
    assert "jitop_parallel_for" in check_object(pool.get(cp)).sizes
    assert "jitop_fastcall" in check_object(fast.get(cf)).sizes

    warm, _ = run_child(tmp_path, "components", COMPONENTS)
    assert warm["ok"] and warm["pool"] and warm["fastcall"] and warm["status"] == ["hit"], warm
    assert warm["compiles"] == 0, warm  # both components loaded from the cache, as rebuilt


# ** (v) the issue's own case, in a child process: a crash is a failed test **
ADD_CHILD = """
import json, sys
import numpy as np
import jitop


def add(a, b):
    return a + b


k = jitop.kernel(add, fallback=False)
arrays = [np.arange(int(n), dtype=np.float32) for n in sys.argv[1:]]
outs = [k(x, x) for x in arrays]
ok = all(o.shape == x.shape and np.array_equal(o, x + x) for o, x in zip(outs, arrays))
print(json.dumps({"ok": ok, "keys": [e.lookup.key.to_json() for e in k.cache.values()],
                  "lookups": [[e.lookup.status, e.lookup.reason] for e in k.cache.values()]}))
"""


@pytest.mark.parametrize("verify", ["0", "1"])
def test_issue_case_in_a_child_process(tmp_path, verify):
    """add compiled for n = 2**24 copied over the entry for n = 4 (the issue's segmentation fault, with
    JITOP_VERIFY=1 too): the next process calling add with n = 4 exits normally with a + b, after a miss."""
    from jitop.cache.keys import Key
    seeded, _ = run_child(tmp_path, "add", ADD_CHILD, 1 << 24, 4)
    key_big, key_small = (Key.from_json(k) for k in seeded["keys"])
    swap_in(key_big, key_small)
    again, _ = run_child(tmp_path, "add", ADD_CHILD, 4, env={"JITOP_VERIFY": verify})
    assert again["ok"]
    ((status, reason),) = again["lookups"]
    assert status == "miss" and "removed" in reason, reason
    assert_replaced(key_small)


def test_the_check_runs_once_per_signature_not_per_call(monkeypatch):
    """The entry is checked when it is loaded (once per signature per process, whether a warm record named it or
    a trace found it); calls never repeat it."""
    a = np.ones(16, np.float32)
    jitop.kernel(add, fallback=False)(a, a)  # stored
    calls = []
    real = kernel_cache.executable_signature
    monkeypatch.setattr(kernel_cache, "executable_signature", lambda *args: calls.append(1) or real(*args))
    k = jitop.kernel(add, fallback=False)
    for _ in range(50):
        k(a, a)
    assert only(k).lookup.status == "hit" and len(calls) == 1
