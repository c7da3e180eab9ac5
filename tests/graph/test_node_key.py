"""Node.key: a stable content hash, computed once per node (linear in the graph, no deep recursion). No LLVM."""
from __future__ import annotations

import hashlib

import pytest

from jitop.dtypes import as_dtype
from jitop.graph import ir

F32 = as_dtype("float32")


def _reference_key(n: ir.Node) -> str:
    """The definition, recursively and without memo (exponential on shared graphs: small graphs only)."""
    h = hashlib.sha256(f"{n.prim}|{n.shape}|{n.dtype}|{n.weak}|{ir._stable(n.params)}".encode())
    for s in n.src:
        h.update(_reference_key(s).encode())
    return h.hexdigest()


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[ir.Node]:
    """The nodes whose key gets computed, in order."""
    seen: list[ir.Node] = []
    inner = ir._content_key

    def counting(n: ir.Node) -> str:
        seen.append(n)
        return inner(n)
    monkeypatch.setattr(ir, "_content_key", counting)
    return seen


def _doubling(levels: int, shape: tuple[int, ...]) -> list[ir.Node]:
    """x, x + x, (x + x) + (x + x), ...: 2**levels paths to the input through levels + 1 nodes."""
    chain = [ir.node("arg", shape, F32, index=0)]
    for _ in range(levels):
        chain.append(ir.node("add", shape, F32, (chain[-1], chain[-1])))
    return chain


def test_key_of_a_deep_shared_graph_hashes_each_node_once(counted):
    chain = _doubling(40, (3, 5, 7))  # 2**40 paths: unmemoized, this never finishes
    key = chain[-1].key
    assert sorted(map(id, counted)) == sorted(map(id, chain))
    assert chain[-1].key == key and chain[20].key and len(counted) == len(chain)  # later reads: no hashing


def test_keys_read_one_after_another_stay_linear(counted, monkeypatch: pytest.MonkeyPatch):
    walked: list[int] = []
    inner = ir.toposort

    def counting(*args, **kwargs):
        order = inner(*args, **kwargs)
        walked.append(len(order))
        return order
    monkeypatch.setattr(ir, "toposort", counting)
    chain = _doubling(200, (2, 9))
    for n in chain:
        assert n.key
    # each read walks only the nodes without a key yet, not the whole graph again
    assert len(counted) == len(chain) and sum(walked) == len(chain)


def test_very_deep_chain_does_not_recurse():
    x = ir.node("arg", (4,), F32, index=0)
    for k in range(20_000):
        x = ir.node("mul", (4,), F32, (x, ir.node("const", (), F32, value=float(k))))
    assert len(x.key) == 64


def test_key_matches_the_definition_and_is_structural():
    a = ir.node("arg", (3,), F32, index=0)
    b = ir.node("scalar_arg", (), F32, weak=True, index=1)
    y = ir.node("mul", (3,), F32, (ir.node("add", (3,), F32, (a, b)), a), axis=(0,), data=b"\x00\x01")
    assert y.key == _reference_key(y)
    assert ir.node("add", (3,), F32, (a, b)).key != ir.node("add", (3,), F32, (b, a)).key
    assert ir.node("arg", (3,), F32, index=1).key != a.key


def test_array_constants_intern_by_content_even_where_the_hash_sample_agrees():
    """ConstData hashes a sample of its bytes: constants that differ only between the sampled bytes hash
    alike but are still two nodes with two keys, and equal bytes are one node."""
    import numpy as np
    from jitop.graph.tracer import array_const

    a = np.zeros(100_000, np.float32)
    b = a.copy()
    b[1] = 1.0  # byte 4..7: between the sampled bytes (every len // 256-th)
    assert hash(ir.ConstData.of(a)) == hash(ir.ConstData.of(b)) and ir.ConstData.of(a) != ir.ConstData.of(b)
    na, nb = array_const(a), array_const(b)
    assert na is not nb and na.key != nb.key
    assert array_const(a.copy()) is na
    assert na.param("data").digest == hashlib.sha256(a.tobytes()).hexdigest()


def test_a_constant_is_a_private_copy_unless_its_owner_hands_the_array_over():
    """array_const snapshots what the trace saw (a later write to the array changes nothing); inside
    `adopted`, the owner's own array is taken as it is, read-only, and not copied."""
    import numpy as np
    from jitop.graph.tracer import array_const

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    data = array_const(a).param("data")
    a[0, 0] = 99
    assert data.array[0, 0] == 0 and not data.array.flags.writeable and data.array is not a
    w = np.arange(6, dtype=np.float64) + 0.5
    owned = ir.adopt(w)
    assert owned is not None and not w.flags.writeable
    with ir.adopted([owned]):
        assert array_const(w).param("data") is owned  # the array itself: no copy
        assert array_const(w[::2]).param("data").array is not w  # a view of it is copied
    outside = ir.ConstData.of(w)  # the hand-over ends with the block
    assert outside == owned and outside.array is not w
    assert ir.adopt(np.ones((3, 3)).T) is None  # not C-contiguous: copied when traced


def test_digest_all_hashes_on_several_threads_and_leaves_none_running(monkeypatch: pytest.MonkeyPatch):
    """Large constants are hashed side by side (hashlib releases the GIL); the digests are sha256's, and no
    thread outlives the call (a forked compile needs this process to have one thread)."""
    import threading

    import numpy as np
    monkeypatch.setattr(ir, "PARALLEL_DIGEST_BYTES", 0)
    before = threading.active_count()
    datas = [ir.ConstData.of(np.full(1000 + k, k, np.uint8)) for k in range(6)]
    ir.digest_all(datas + datas[:2])
    assert all("digest" in d.__dict__ for d in datas)  # computed by digest_all, not lazily below
    assert [d.digest for d in datas] == [hashlib.sha256(d.array.tobytes()).hexdigest() for d in datas]
    assert threading.active_count() == before
