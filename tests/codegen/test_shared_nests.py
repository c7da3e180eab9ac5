"""Identical loop nests of one program are generated once (jitop.codegen.instances): the heads of a multi-head
attention become one function per nest, called once per head with its own slice of q, k and v. (The heads are
returned one by one here: joined by np.hstack they would be one batched computation, jitop.graph.batching.)"""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

import jitop
from jitop import te
import jitop.codegen.kernel as kernel_codegen
from jitop.graph.compile import build, prepare

HEADS, T, C = 12, 5, 96  # head width 8


def softmax(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def attention(qkv, mask):
    """bench_models' multi-head attention, a Python loop over the heads (each on its columns of q, k and v),
    each head's result returned on its own."""
    q, k, v = np.split(qkv, 3, axis=-1)
    d = C // HEADS
    heads = []
    for h in range(HEADS):
        qh, kh, vh = q[:, h * d:(h + 1) * d], k[:, h * d:(h + 1) * d], v[:, h * d:(h + 1) * d]
        heads.append(softmax(qh @ kh.T / np.sqrt(d) + mask) @ vh)
    return tuple(heads)


def compiled(fn, args: list, share: bool = True, dynamic: dict | None = None):
    """The Executable of fn(*args), with or without shared nests (`dynamic`: leaf -> dims traced as symbols),
    built in one process: a forked build (jitop.codegen.forked) generates a group's function once per process
    that holds one of its instances."""
    os.environ["JITOP_COMPILE_JOBS"] = "1"  # conftest puts the environment back after each test
    k = jitop.kernel(fn, fallback=False)
    tr = k.trace(args, None, dynamic)
    saved = kernel_codegen.find_shared
    if not share:
        kernel_codegen.find_shared = lambda nests, ranges, symbols=frozenset(): {}
    try:
        return build(prepare("prog", tr.inputs, tr.names, tr.plan, tr.results, guards=tr.shape_guards,
                             reps=tr.reps))
    finally:
        kernel_codegen.find_shared = saved


def decode_attention(q, k_cache, v_cache):
    """One new token's attention over a cache of any length (the cache's rows are a symbol)."""
    d = C // HEADS
    heads = []
    for h in range(HEADS):
        s = q[:, h * d:(h + 1) * d] @ k_cache[:, h * d:(h + 1) * d].T / np.sqrt(d)
        heads.append(softmax(s) @ v_cache[:, h * d:(h + 1) * d])
    return tuple(heads)


def test_heads_over_a_symbolic_cache_compile_once_and_match_the_unshared_build() -> None:
    rng = np.random.default_rng(1)
    make = lambda rows: [rng.standard_normal((r, C)).astype(np.float32) for r in (1, rows, rows)]  # noqa: E731
    dims = {1: (0,), 2: (0,)}
    shared, unshared = compiled(decode_attention, make(9), dynamic=dims), \
        compiled(decode_attention, make(9), share=False, dynamic=dims)
    assert shared.module.symbols and shared_functions(shared.module)[0] >= 2
    assert shared_functions(unshared.module) == (0, 0)
    for rows in (2, 9, 17, 64, 301):
        args = make(rows)
        got, plain = np.hstack(shared(*args)), np.hstack(unshared(*args))
        np.testing.assert_array_equal(got, plain)
        np.testing.assert_allclose(got, np.hstack(decode_attention(*args)), rtol=1e-5, atol=1e-6)


def shared_functions(module) -> tuple[int, int]:
    """(shared functions defined, calls of them from the kernel's function and its parts) in the LLVM IR of
    a compiled module (the object-code trampoline, which may inline the kernel, is left out)."""
    ll = module.get_source("ll")
    functions = re.split(r"^(?=define )", ll, flags=re.M)
    symbol = module.meta["symbol"]
    kernel = [f for f in functions if f.startswith("define") and re.match(
        rf"define [^@]*@\"?{re.escape(symbol)}(\.part\d+)?\"?\(", f)]
    return (sum(bool(re.match(r"define [^@]*@\S+\.shared\d+\(", f)) for f in functions),
            sum(len(re.findall(r"call [^@]*@\S+\.shared\d+\(", f)) for f in kernel))


@pytest.fixture(scope="module")
def attention_args() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((T, 3 * C)).astype(np.float32)
    mask = ((1 - np.tri(T, dtype=np.float32)) * -1e10).astype(np.float32)
    return [qkv, mask]


def test_heads_compile_once(attention_args) -> None:
    exe = compiled(attention, attention_args)
    groups = {id(g): g for g in kernel_codegen.find_shared(exe.func.body.stmts, exe.func.attrs["ranges"]).values()}
    assert groups and all(len(g.instances) == HEADS for g in groups.values())
    defined, calls = shared_functions(exe.module)
    assert defined == len(groups)
    assert calls == HEADS * len(groups)


def test_heads_match_numpy_and_the_unshared_build(attention_args) -> None:
    want = np.hstack(attention(*attention_args))
    got = np.hstack(compiled(attention, attention_args)(*attention_args))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    unshared = compiled(attention, attention_args, share=False)
    assert shared_functions(unshared.module) == (0, 0)
    np.testing.assert_array_equal(got, np.hstack(unshared(*attention_args)))


def test_same_nest_on_different_buffers() -> None:
    def three(a, b, c):
        return np.tanh(a) * 2 + 1, np.tanh(b) * 2 + 1, np.tanh(c) * 2 + 1
    rng = np.random.default_rng(1)
    args = [rng.standard_normal((7, 33)).astype(np.float32) for _ in range(3)]
    exe = compiled(three, args)
    assert shared_functions(exe.module) == (1, 3)
    for got, a in zip(exe(*args), args):
        np.testing.assert_allclose(got, np.tanh(a) * 2 + 1, rtol=1e-6, atol=1e-6)


def column_blocks(gather: bool):
    """Four outputs, each four columns of A (rows by I when `gather`: a read checked at run time)."""
    A = te.placeholder((4, 16), "float32", "A")
    I = te.placeholder((4,), "int64", "I")
    def block(h: int) -> te.Tensor:
        return te.compute((4, 4), lambda i, j: A[I[i] if gather else i, j + 4 * h] * 2.0, name=f"B{h}")
    outs = [block(h) for h in range(4)]
    return jitop.build(jitop.create_schedule([o.op for o in outs]), [A, I, *outs])


def test_checked_accesses_are_not_shared() -> None:
    """A gather by run-time indices is checked at run time: its nests stay in place, and a bad index still
    raises; the same nests reading rows 0..3 directly are shared."""
    a = np.arange(64, dtype=np.float32).reshape(4, 16)
    plain, gathered = column_blocks(False), column_blocks(True)
    assert shared_functions(plain) == (1, 4)
    assert shared_functions(gathered) == (0, 0)
    idx = np.array([2, 0, 1, 1])
    outs = [np.empty((4, 4), np.float32) for _ in range(4)]
    gathered(a, idx, *outs)
    for h, got in enumerate(outs):
        np.testing.assert_array_equal(got, a[idx, h * 4:(h + 1) * 4] * 2)
    with pytest.raises(IndexError):
        gathered(a, np.array([0, 4, 1, 1]), *outs)
