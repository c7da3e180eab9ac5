"""Conformance of @jitop.kernel shape functions, indexing, creation, matmul/einsum and result containers.

Each case is a function of one array, run on float64 and int32 inputs and compared with numpy on
values, dtype, shape and result structure (tuple / list / dict / numpy scalar).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import jitop
from kernel_checks import batched


# ** helpers **

def assert_same(got, expected, rtol: float | None = None) -> None:
    """Same structure (tuple/list/dict/array/numpy scalar/Python value), dtype, shape and values."""
    assert type(got) is type(expected), (type(got), type(expected))
    if isinstance(expected, dict):
        assert list(got) == list(expected)
        for k in expected:
            assert_same(got[k], expected[k], rtol)
        return
    if isinstance(expected, (tuple, list)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_same(g, e, rtol)
        return
    if not isinstance(expected, (np.ndarray, np.generic)):
        assert got == expected
        return
    g, e = np.asarray(got), np.asarray(expected)
    assert g.dtype == e.dtype, (g.dtype, e.dtype)
    assert g.shape == e.shape, (g.shape, e.shape)
    if rtol is None or e.dtype.kind != "f":
        np.testing.assert_array_equal(g, e, strict=True)
    else:
        np.testing.assert_allclose(g, e, rtol=rtol, atol=1e-12, equal_nan=True, strict=True)


def numpy_ref(fn, *args):
    with np.errstate(all="ignore"):
        return fn(*args)


def jit_call(k, *args, **kwargs):
    """Call a kernel; a fallback warning is an error (it would make the comparison vacuous)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("error", jitop.JitopFallbackWarning)
        return k(*args, **kwargs)


# ** one-array cases, by group (each group is one batch kernel per dtype) **

CASES = {
    "reshape": {
        "reshape(-1)": lambda a: a.reshape(-1),
        "reshape(4,-1)": lambda a: a.reshape(4, -1),
        "reshape(-1,2,2)": lambda a: a.reshape(-1, 2, 2),
        "np.reshape(a,(3,8))": lambda a: np.reshape(a, (3, 8)),
        "reshape((6,4))": lambda a: a.reshape((6, 4)),
        "reshape(1,24,1)": lambda a: a.reshape(1, 24, 1),
        "np.ravel": lambda a: np.ravel(a),
        "a.ravel()": lambda a: a.ravel(),
        "a.flatten()": lambda a: a.flatten(),
        "ravel of transpose": lambda a: a.T.ravel(),
        "reshape of slice": lambda a: a[:, 1:].reshape(-1, 4),
    },
    "transpose": {
        "a.T": lambda a: a.T,
        "np.transpose(a,(1,0,2))": lambda a: np.transpose(a, (1, 0, 2)),
        "a.transpose(2,0,1)": lambda a: a.transpose(2, 0, 1),
        "a.transpose((1,2,0))": lambda a: a.transpose((1, 2, 0)),
        "np.transpose negative axes": lambda a: np.transpose(a, (-1, 0, 1)),
        "np.swapaxes(a,0,2)": lambda a: np.swapaxes(a, 0, 2),
        "a.swapaxes(-1,1)": lambda a: a.swapaxes(-1, 1),
        "np.moveaxis(a,0,-1)": lambda a: np.moveaxis(a, 0, -1),
        "np.moveaxis(a,[0,1],[-1,0])": lambda a: np.moveaxis(a, [0, 1], [-1, 0]),
        "T of 2-d slice + 1": lambda a: a[0].T + 1,
    },
    "dims": {
        "expand_dims(a,1)": lambda a: np.expand_dims(a, 1),
        "expand_dims(a,-1)": lambda a: np.expand_dims(a, -1),
        "expand_dims(a,(0,4))": lambda a: np.expand_dims(a, (0, 4)),
        "squeeze()": lambda a: np.squeeze(a[:, :1, :]),
        "squeeze(axis=2)": lambda a: np.squeeze(a[:1, :, :1], axis=2),
        "a.squeeze(0)": lambda a: a[:1].squeeze(0),
        "squeeze to 0-d": lambda a: a[:1, :1, :1].squeeze(),
        "broadcast_to": lambda a: np.broadcast_to(a[:, :1, :], (5, 2, 3, 4)),
        "broadcast_to + 0": lambda a: np.broadcast_to(a[0, 0], (3, 4)) + a[1],
        "atleast_2d": lambda a: np.atleast_2d(a[0, 0]),
    },
    "join": {
        "concatenate axis=1": lambda a: np.concatenate([a, a * 2], axis=1),
        "concatenate axis=-1": lambda a: np.concatenate((a, a), axis=-1),
        "concatenate axis=None": lambda a: np.concatenate([a, a[0]], axis=None),
        "concatenate 3 parts": lambda a: np.concatenate([a[:, :1], a, a[:, 2:]], axis=1),
        "concatenate empty part": lambda a: np.concatenate([a[:, :0], a], axis=1),
        "stack": lambda a: np.stack([a, a + 1]),
        "stack axis=-1": lambda a: np.stack([a, a + 1, a], axis=-1),
        "hstack": lambda a: np.hstack([a, a]),
        "vstack": lambda a: np.vstack([a, a]),
        "hstack 1-d": lambda a: np.hstack([a.ravel(), a[0, 0]]),
        "vstack 1-d": lambda a: np.vstack([a[0, 0], a[1, 1]]),
        "split(a,2)": lambda a: np.split(a, 2),
        "split(a,[1,3],axis=2)": lambda a: np.split(a, [1, 3], axis=2),
        "split(a,3,axis=1)": lambda a: np.split(a, 3, axis=1),
    },
    "flip": {
        "flip": lambda a: np.flip(a),
        "flip(a,1)": lambda a: np.flip(a, 1),
        "flip(a,(0,2))": lambda a: np.flip(a, (0, 2)),
        "flip(a,-1)": lambda a: np.flip(a, -1),
    },
    "index": {
        "a[1]": lambda a: a[1],
        "a[-1,-2]": lambda a: a[-1, -2],
        "a[:,1:3]": lambda a: a[:, 1:3],
        "a[...,::2]": lambda a: a[..., ::2],
        "a[None,:,None]": lambda a: a[None, :, None],
        "a[...,1]": lambda a: a[..., 1],
        "a[0,...,None]": lambda a: a[0, ..., None],
        "a[1,2,3] (numpy scalar)": lambda a: a[1, 2, 3],
        "a[-1,-1,-1]": lambda a: a[-1, -1, -1],
        "a[:,5:10] (empty)": lambda a: a[:, 5:10],
        "a[:,-2:]": lambda a: a[:, -2:],
        "a[:,-1:0:-1]": lambda a: a[:, -1:0:-1],
        "a[:,2:1] (empty)": lambda a: a[:, 2:1],
        "a[::-1]": lambda a: a[::-1],
        "a[:,::-2]": lambda a: a[:, ::-2],
        "a[:,::-1,::-1]": lambda a: a[:, ::-1, ::-1],
        "a[::-1,:,1:]": lambda a: a[::-1, :, 1:],
        "a[1:,::-2,::3]": lambda a: a[1:, ::-2, ::3],
        "a[::-1,::-2]": lambda a: a[::-1, ::-2],  # constants -1, -2 hash alike: fell back until 49c8327
        "a[np.int64(1)]": lambda a: a[np.int64(1)],
        "a[...]": lambda a: a[...],
        "a[:, 1][None]": lambda a: a[:, 1][None],
        "a[0][1:][::-1]": lambda a: a[0][1:][::-1],
        "len and iter": lambda a: a[len(a) - 1] + sum(r for r in a),
    },
    "astype": {
        "astype(float32)": lambda a: a.astype(np.float32),
        "astype(int8) wraps": lambda a: (a * 13).astype(np.int8),
        "astype(bool)": lambda a: (a - 3).astype(bool),
        "astype(uint8) of non-negative": lambda a: (a * 11).astype("uint8"),
        "astype(int64)": lambda a: (a / 7).astype(np.int64),
        "astype(same) copy": lambda a: a.astype(a.dtype),
        "np.copy": lambda a: np.copy(a),
        "a.copy()": lambda a: a.copy(),
    },
    "where_clip": {
        "where(a>5,a,-a)": lambda a: np.where(a > 5, a, -a),
        "where(a>5,a,0)": lambda a: np.where(a > 5, a, 0),
        "where(a>5,1.5,0)": lambda a: np.where(a > 5, 1.5, 0),
        "where(a>5,1,0)": lambda a: np.where(a > 5, 1, 0),
        "where broadcast": lambda a: np.where(a[:, :1] > 5, a[0], a[1, 0]),
        "clip(a,3,10)": lambda a: np.clip(a, 3, 10),
        "a.clip(2.5,None)": lambda a: a.clip(2.5, None),
        "clip(a,None,7)": lambda a: np.clip(a, None, 7),
        "clip(a,a[0],9)": lambda a: np.clip(a, a[0], 9),
        "clip(a,2.5,7.5)": lambda a: np.clip(a, 2.5, 7.5),
    },
    "round": {
        "round(a/7)": lambda a: np.round(a / 7),
        "round(a/7,2)": lambda a: np.round(a / 7, 2),
        "round(a*3.3,-1)": lambda a: np.round(a * 3.3, -1),
        "around(a/3,1)": lambda a: np.around(a / 3, 1),
        "(a/7).round(2)": lambda a: (a / 7).round(2),
        "round(a,-1)": lambda a: np.round(a * 5, -1),
        "round(a+0.5) half to even": lambda a: np.round(a + 0.5),
        "round(a*0.125+0.0625, 3) half": lambda a: np.round(a * 0.125 + 0.0625, 3),
    },
    "like": {
        "zeros_like": lambda a: np.zeros_like(a),
        "ones_like(dtype=int32)": lambda a: np.ones_like(a, dtype=np.int32),
        "full_like(a,7)": lambda a: np.full_like(a, 7),
        "full_like(a,2.5)": lambda a: np.full_like(a, 2.5),
        "empty_like(a).shape": lambda a: np.empty_like(a).shape,
        "zeros_like(shape=)": lambda a: np.zeros_like(a, shape=(2, 2)),
        "tril": lambda a: np.tril(a[0]),
        "triu(k=1)": lambda a: np.triu(a[0], 1),
        "tril(k=-1)": lambda a: np.tril(a[0], -1),
        "tril of 3-d": lambda a: np.tril(a),
    },
    "linalg": {
        "a @ a.T batched": lambda a: a @ a.transpose(0, 2, 1),
        "matmul 1-d @ 2-d": lambda a: np.matmul(a[0, 0], a[0].T),
        "matmul 2-d @ 1-d": lambda a: a[0] @ a[1, 1],
        "matmul 1-d @ 1-d": lambda a: a[0, 0] @ a[1, 1],
        "matmul broadcast batch": lambda a: a[:1] @ a[1].T,
        "matmul batch (2,1,3,4)@(1,4,3)": lambda a: a[:, None] @ a[:1].transpose(0, 2, 1),
        "dot 2-d": lambda a: np.dot(a[0], a[1].T),
        "dot 1-d": lambda a: np.dot(a[0, 0], a[1, 1]),
        "a.dot": lambda a: a[0].dot(a[0, 0]),
        "dot with scalar": lambda a: np.dot(a[0], 2),
        "dot 3-d, 2-d": lambda a: np.dot(a, a[0].T),
        "dot 3-d, 3-d": lambda a: np.dot(a, a.transpose(0, 2, 1)),
        "dot 3-d, 1-d": lambda a: np.dot(a, a[0, 0]),
        "dot 1-d, 3-d": lambda a: np.dot(a[0, :, 0], a),
        "dot 3-d, float32 2-d": lambda a: np.dot(a, a[0].T.astype(np.float32)),
        "einsum ij,jk->ik": lambda a: np.einsum("ij,jk->ik", a[0], a[1].T),
        "einsum bij,bjk->bik": lambda a: np.einsum("bij,bjk->bik", a, a.transpose(0, 2, 1)),
        "einsum ij->ji": lambda a: np.einsum("ij->ji", a[0]),
        "einsum ij,jk (implicit)": lambda a: np.einsum("ij,jk", a[0], a[1].T),
        "einsum i,j->ij": lambda a: np.einsum("i,j->ij", a[0, 0], a[1, 1]),
        "einsum ...ij,...jk->...ik": lambda a: np.einsum("...ij,...jk->...ik", a, a.transpose(0, 2, 1)),
        "einsum ...ij,jk (implicit)": lambda a: np.einsum("...ij,jk", a, a[0].T),
        "einsum ij...,j...->i...": lambda a: np.einsum("ij...,j...->i...", a.transpose(1, 2, 0), a[0].T[:, :2]),
        "einsum ...ji": lambda a: np.einsum("...ji", a),
        "einsum a... (implicit)": lambda a: np.einsum("a...", a),
        "einsum ...ii->...i": lambda a: np.einsum("...ii->...i", a[:, :, :3]),
        "einsum ...,...": lambda a: np.einsum("...,...", a[0], a[1, 0]),
    },
    "einsum_sum": {
        "einsum ij->": lambda a: np.einsum("ij->", a[0]),
        "einsum i,i->": lambda a: np.einsum("i,i->", a[0, 0], a[1, 1]),
        "einsum ij->i": lambda a: np.einsum("ij->i", a[0]),
    },
    "results": {
        "tuple": lambda a: (a + 1, a.sum()),
        "list": lambda a: [a, a * 2],
        "dict": lambda a: {"x": a.max(), "y": a.T},
        "nested": lambda a: {"p": (a, [a.min()]), "q": [(a[0],)]},
        "Python constant in tuple": lambda a: (a + 1, 3, "label"),
        "None in tuple": lambda a: (a + 1, None),
        "shape and size": lambda a: (a.reshape(a.shape[0], -1) * a.size + a.ndim, a.shape, a.dtype),
        "same array twice": lambda a: (a + 1, a + 1),
        "input returned": lambda a: (a, a.T),
    },
}
DTYPES = ["float64", "int32"]
KNOWN_BUGS: dict[tuple[str, str, str], str] = {}  # all fixed in 2888c19 (0-d results, round, dot, einsum dtypes)
RTOL_GROUPS = {"linalg": 1e-12, "einsum_sum": 1e-12, "round": None}


def _cases():
    for group, fns in CASES.items():
        for name in fns:
            for dt in DTYPES:
                reason = KNOWN_BUGS.get((group, name, dt))
                marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                yield pytest.param(group, name, dt, marks=marks, id=f"{group}-{name}-{dt}")


def _input(dtype: str) -> np.ndarray:
    return np.arange(24).reshape(2, 3, 4).astype(dtype)


@pytest.mark.parametrize("group, name, dtype", list(_cases()))
def test_shape_case(group: str, name: str, dtype: str) -> None:
    x = _input(dtype)
    fn = CASES[group][name]
    expected = numpy_ref(fn, x)
    bugs = {n for (g, n, d) in KNOWN_BUGS if g == group and d == dtype}
    batch = batched(group, {n: f for n, f in CASES[group].items() if n not in bugs}, jit_call, x)
    got = batch[name] if batch is not None and name not in bugs else jit_call(jitop.kernel(fn), x)
    assert_same(got, expected, RTOL_GROUPS.get(group))


@pytest.mark.parametrize("shape", [(0, 3), (1, 1), (5, 1), (1, 7), (0,), (3, 0, 2)], ids=str)
def test_shape_functions_on_empty_and_size_one(shape) -> None:
    @jitop.kernel
    def f(a):
        return (a.T, a.reshape(-1), np.flip(a), np.concatenate([a, a + 1], axis=-1) if a.shape[-1] else a,
                np.stack([a, a], axis=0),
                a[::-1], np.expand_dims(a, 0), np.squeeze(a[:0]), np.where(a > 1, a, 0), np.clip(a, 1, 2),
                np.moveaxis(a, 0, -1), np.broadcast_to(a, (2,) + a.shape))
    x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    assert_same(jit_call(f, x), numpy_ref(f.fn, x))


def test_concatenate_of_empty_reduction_results() -> None:
    @jitop.kernel(fallback=False)
    def f(a):
        return np.concatenate([a - a.mean(axis=-1, keepdims=True)] * 2, axis=-1)
    a = np.zeros((0, 0), np.float32)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert_same(f(a), f.fn(a))


def test_concatenate_of_empty_arrays() -> None:
    @jitop.kernel
    def f(a):
        return np.concatenate([a, a], axis=-1)
    a = np.zeros(0)
    assert_same(jit_call(f, a), f.fn(a))


@pytest.mark.parametrize("shapes", [((0, 4), (4, 3)), ((3, 0), (0, 2)), ((1, 1), (1, 1)), ((5, 1), (1, 6)),
                                    ((2, 0, 3), (3, 4))], ids=str)
def test_matmul_empty_and_size_one(shapes) -> None:
    @jitop.kernel
    def f(a, b):
        return a @ b
    a = np.arange(int(np.prod(shapes[0])), dtype=np.float64).reshape(shapes[0])
    b = np.arange(int(np.prod(shapes[1])), dtype=np.float64).reshape(shapes[1])
    assert_same(jit_call(f, a, b), a @ b)


@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8", "bool"])
def test_matmul_dtypes(dtype: str) -> None:
    @jitop.kernel
    def f(a, b):
        return a @ b, np.dot(a, b[:, 0]), np.einsum("ij,jk->ik", a, b)
    a = (np.arange(35) % 5).astype(dtype).reshape(5, 7)
    b = (np.arange(28) % 3).astype(dtype).reshape(7, 4)
    assert_same(jit_call(f, a, b), numpy_ref(f.fn, a, b), 1e-6 if dtype == "float32" else None)


@pytest.mark.parametrize("second", [
    "y + 1",          # fell back (matmul inlined into an epilogue although an output) until 2888c19
    "np.tanh(y)",
    "a[:, :3] * 2",
    "y.sum(axis=1)",
    "y.T",
])
def test_matmul_result_returned_with_another_output(second: str) -> None:
    def fn(a, b):
        y = a @ b
        return y, eval(second)
    f = jitop.kernel(fn)
    a, b = np.arange(12.0).reshape(3, 4), np.arange(12.0).reshape(4, 3) / 5
    assert_same(jit_call(f, a, b), fn(a, b), 1e-12)


def test_matmul_dtype_keyword() -> None:
    @jitop.kernel
    def f(a, b):
        return np.matmul(a, b, dtype=np.float32), np.matmul(a.astype(np.int32), b.astype(np.int32), dtype=np.float64)
    a, b = np.arange(6.0).reshape(2, 3), np.arange(6.0).reshape(3, 2)
    assert_same(jit_call(f, a, b), f.fn(a, b), 1e-6)


def test_matmul_larger_than_one_tile() -> None:
    @jitop.kernel
    def f(a, b):
        return a @ b
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((67, 129)), rng.standard_normal((129, 33))
    assert_same(jit_call(f, a, b), a @ b, 1e-12)


def test_matmul_core_dimension_mismatch_raises_value_error() -> None:
    @jitop.kernel
    def f(a, b):
        return a @ b
    with pytest.raises(ValueError):
        f.fn(np.ones((2, 3)), np.ones((4, 2)))
    with pytest.raises(ValueError):
        jit_call(f, np.ones((2, 3)), np.ones((4, 2)))


@pytest.mark.parametrize("expr", ["a.reshape(5, -1)", "a.reshape(-1, -1)", "np.squeeze(a, axis=0)",
                                  "np.concatenate([a, a.T])", "np.split(a, 5)", "a[3]", "a[0, 0, 0]",
                                  "np.broadcast_to(a, (4,))", "np.transpose(a, (0, 0))"])
def test_invalid_shape_operations_raise_like_numpy(expr: str) -> None:
    fn = eval(f"lambda a: {expr}")
    f = jitop.kernel(fn)
    a = np.arange(6.0).reshape(2, 3)
    with pytest.raises(Exception) as numpy_err:
        fn(a)
    with pytest.raises(type(numpy_err.value)):
        jit_call(f, a)


# ** creation functions with static arguments **

@pytest.mark.parametrize("n", [3, 1, 0])
def test_creation_functions_with_static_size(n: int) -> None:
    def fn(a, n):
        return (a[:n] + np.zeros((n, 4)), a[:n] * np.ones((n, 1), dtype=np.int8), a + np.full((3, 1), 2.5),
                a[:, :n] * np.arange(n), a + np.arange(0.0, 2.0, 0.5), np.tri(n, 4) * a[:n], a[:, :n] + np.tri(3, n, k=-1, dtype=np.int8), np.empty((n, 4)).shape, a + n)
    a = np.arange(12.0).reshape(3, 4)
    f = jitop.kernel(fn, static_argnums=(1,))
    assert_same(jit_call(f, a, n), numpy_ref(fn, a, n))
    g = jitop.kernel(fn, static_argnames=("n",))
    assert_same(jit_call(g, a, n=n), numpy_ref(fn, a, n))


@pytest.mark.parametrize("dtype", ["float64", "int32", "bool"])
def test_tril_triu_offsets(dtype: str) -> None:
    @jitop.kernel
    def f(a):
        return [np.tril(a, k) for k in (-5, -1, 0, 2, 7)] + [np.triu(a, k) for k in (-2, 0, 1, 9)]
    a = (np.arange(4 * 6) % 3).astype(dtype).reshape(4, 6)
    assert_same(jit_call(f, a), numpy_ref(f.fn, a))


def test_returning_only_a_constant_array_gives_numpy_answer() -> None:
    # a result that does not depend on the arguments is outside what jitop compiles: plain numpy, one warning
    def fn(a, n):
        return a + 1, np.zeros(n), np.arange(n)
    f = jitop.kernel(fn, static_argnums=(1,))
    a = np.arange(3.0)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = f(a, 4)
    assert_same(got, fn(a, 4))
    assert len([x for x in w if issubclass(x.category, jitop.JitopFallbackWarning)]) <= 1


# ** results are numpy's kinds of object **

ZERO_D_CASES = {
    "a.astype": lambda a, b: a.astype(np.float64),
    "np.clip(a)": lambda a, b: np.clip(a, 0, 1),
    "-a": lambda a, b: -a,
    "a.T": lambda a, b: a.T,
    "a[...]": lambda a, b: a[...],
    "np.copy(a)": lambda a, b: np.copy(a),
    "np.expand_dims(np.abs(a), 0)": lambda a, b: np.expand_dims(np.abs(a), 0),
    "b.mean()": lambda a, b: b.mean(),
    "b @ b": lambda a, b: b @ b,
    "b[0]": lambda a, b: b[0],
    "np.abs(a).astype": lambda a, b: np.abs(a).astype(np.float64),
    "np.abs(a).reshape(())": lambda a, b: np.abs(a).reshape(()),
    "a[()]": lambda a, b: a[()],
    "np.abs(a)[...]": lambda a, b: np.abs(a)[...],
    "b.sum().astype": lambda a, b: b.sum().astype(np.float32),
    "np.where(a > 1, a, 0)": lambda a, b: np.where(a > 1, a, 0),
    "np.abs(a).T": lambda a, b: np.abs(a).T,
    "np.abs(a).copy()": lambda a, b: np.abs(a).copy(),
}


@pytest.mark.parametrize("case", list(ZERO_D_CASES))
def test_zero_d_result_kind(case: str) -> None:
    """numpy returns a numpy scalar from ufuncs, reductions and scalar methods, a 0-d ndarray from array methods."""
    fn = ZERO_D_CASES[case]
    a, b = np.array(1.5, np.float32), np.arange(3.0)
    assert_same(jit_call(jitop.kernel(fn), a, b), fn(a, b))


# a 0-d value's kind after each form, for a 0-d array and for a numpy scalar argument (numpy's rules: shape
# methods keep the kind, np.copy/np.where/x[...]/*_like make arrays, x[()] and computations make scalars)
ZERO_D_FORMS = {
    "astype": lambda x: x.astype(np.float64), "reshape(())": lambda x: x.reshape(()), ".T": lambda x: x.T,
    ".copy()": lambda x: x.copy(), "np.copy": lambda x: np.copy(x), "x[()]": lambda x: x[()], "x[...]": lambda x: x[...],
    "np.where": lambda x: np.where(x > 1, x, 0), "np.reshape": lambda x: np.reshape(x, ()),
    "np.transpose": lambda x: np.transpose(x), ".transpose()": lambda x: x.transpose(), "np.squeeze": lambda x: np.squeeze(x),
    "squeeze(axis=-1)": lambda x: np.squeeze(x, axis=-1), "np.broadcast_to": lambda x: np.broadcast_to(x, ()),
    "np.round": lambda x: np.round(x), "np.clip": lambda x: np.clip(x, 0, 1), "np.flip": lambda x: np.flip(x),
    "zeros_like": lambda x: np.zeros_like(x), "full_like": lambda x: np.full_like(x, 2), "np.sum": lambda x: np.sum(x),
    "np.std": lambda x: np.std(x), "np.argmax": lambda x: np.argmax(x), "max keepdims": lambda x: np.max(x, keepdims=True),
    "mean keepdims": lambda x: np.mean(x, keepdims=True), "np.moveaxis": lambda x: np.moveaxis(x, [], []),
    "x + 0": lambda x: x + 0, "np.dot": lambda x: np.dot(x, x), "einsum": lambda x: np.einsum(",->", x, x),
    "np.around": lambda x: np.around(x, 1), "ravel()[0]": lambda x: np.ravel(x)[0], "x ** 2": lambda x: x ** 2,
    "atleast_2d[0, 0]": lambda x: np.atleast_2d(x)[0, 0], "expand_dims[0, ...]": lambda x: np.expand_dims(x, 0)[0, ...],
    "sum axis=()": lambda x: np.sum(x, axis=()), "astype.reshape": lambda x: x.astype(np.int32).reshape(()).T,
}


@pytest.mark.parametrize("kind", ["0-d array", "numpy scalar"])
@pytest.mark.parametrize("form", list(ZERO_D_FORMS))
def test_zero_d_kind_by_form(form: str, kind: str) -> None:
    fn = ZERO_D_FORMS[form]
    x = np.array(1.5, np.float32) if kind == "0-d array" else np.float32(1.5)
    assert_same(jit_call(jitop.kernel(fn), x), fn(x))


def test_zero_dim_results_are_numpy_scalars_and_arrays_stay_arrays() -> None:
    @jitop.kernel
    def f(a):
        return a.sum(), a[0], a[:1], a.reshape(1, 3)[0, 1:2], np.float64(2.0) * a.max()
    a = np.arange(3.0)
    got = jit_call(f, a)
    assert_same(got, f.fn(a))
    assert isinstance(got[0], np.float64) and isinstance(got[2], np.ndarray)
