"""np.select, np.roll, np.repeat, np.tile, np.linalg.norm, np.diagonal, np.trace, np.diag, einsum's diagonals
(`ii`), np.average and np.count_nonzero under @jitop.kernel against numpy: values, dtype
(numpy's promotion, Python scalars weak), shape, numpy's errors; one kernel for every size of a varying dim."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import jitop
from kernel_checks import assert_close

CALLS = [
    "np.select([x > 0, x < -2], [x, -x])", "np.select([x > 0], [x], 1.5)", "np.select([x > 1, x > 0], [1, 2], x)",
    "np.select([x > 0, x[:1] < -1], [x, 2], default=x[0])", "np.select([x > 0], [x])",
    "np.roll(x, 1)", "np.roll(x, -7)", "np.roll(x, 2, axis=-1)", "np.roll(x, (1, 2), axis=(0, -1))", "np.roll(x, 0)",
    "np.repeat(x, 2)", "np.repeat(x, 3, axis=0)", "np.repeat(x, 0, axis=-1)", "np.repeat(x, [2], axis=0)",
    "np.repeat(x, -1)", "np.tile(x, 2)", "np.tile(x, (2, 1))", "np.tile(x, (2, 1, 3))", "np.tile(x, 0)",
    "np.linalg.norm(x)", "np.linalg.norm(x, axis=-1)", "np.linalg.norm(x, 1, axis=0)",
    "np.linalg.norm(x, np.inf, axis=-1)", "np.linalg.norm(x, -np.inf, axis=0, keepdims=True)",
    "np.linalg.norm(x, 0, axis=-1)", "np.linalg.norm(x, 3, axis=-1)", "np.linalg.norm(x, 0.5, axis=-1)",
    "np.linalg.norm(x, 'fro')", "np.linalg.norm(x, 1)", "np.linalg.norm(x, np.inf)", "np.linalg.norm(x, -1, keepdims=True)",
    "np.linalg.norm(x, keepdims=True)", "np.linalg.norm(x, 'bad')",
    "np.diagonal(x)", "np.diagonal(x, 1)", "np.diagonal(x, -1)", "np.diagonal(x, 5)", "x.diagonal(-2)",
    "np.diagonal(x, 0, 1, 0)", "np.trace(x)", "x.trace(1)", "np.trace(x, dtype=np.float32)", "np.diag(x)",
    "np.diag(x[0])", "np.diag(x[0], 2)", "np.diag(x[-1], -1)", "np.diag(x[0, 0])",
    "np.einsum('ii', x[:3, :3])", "np.einsum('ii->i', x[:3, :3])", "np.einsum('ii,ij->j', x[:3, :3], x)",
    "np.einsum('ij,jj->i', x[:3, :3].T, x[:3, :3])", "np.einsum('ii', x)", "np.einsum('ijk->i', x)",
    "np.einsum('iij->j', x)",
    "np.average(x)", "np.average(x, axis=0)", "np.average(x, axis=-1, keepdims=True)", "np.count_nonzero(x, axis=0)",
    "np.count_nonzero(x, axis=(0, -1))", "np.count_nonzero(x > 1, axis=-1, keepdims=True)",
    "np.count_nonzero(x, keepdims=True)",
    "np.linalg.norm(x, np.float64(3), axis=0)", "np.repeat(x, 2.0)", "np.repeat(x, True, axis=0)",
    "x.repeat(2, axis=-1)",
    "np.average(x, weights=np.abs(x) + 1)", "np.average(x, axis=0, weights=np.arange(3.0) + 1, returned=True)[1]",
    "np.average(x, axis=-1, weights=np.ones(x.shape[-1], np.float32), keepdims=True)",
    "np.average(x, returned=True)[1]",
    "np.average(x, weights=np.ones(3))",
]
ARRAYS = {
    "float64": np.arange(12.0).reshape(3, 4) - 5, "float32": (np.arange(12.0).reshape(3, 4) - 5).astype(np.float32),
    "int64": np.arange(12).reshape(3, 4) - 5, "uint8": np.arange(12, dtype=np.uint8).reshape(3, 4),
    "bool": np.arange(12).reshape(3, 4) % 3 == 0, "vector": np.arange(5.0) - 2,
}


def _numpy(fn, x):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(x)


@pytest.mark.parametrize("array", list(ARRAYS))
@pytest.mark.parametrize("call", CALLS)
def test_composites_match_numpy(call: str, array: str) -> None:
    _compare(call, ARRAYS[array])


@pytest.mark.parametrize("call", ["np.linalg.norm(x.ravel(), np.inf)", "np.linalg.norm(x.T, 1)",
                                  "np.linalg.norm(x, np.inf, axis=0)", "np.linalg.norm(x, np.inf)", "np.diag(x[0], 2)",
                                  "np.diag(x[0], -1)", "np.tile(x.ravel(), -1)", "np.tile(x, (-1, 1))",
                                  "np.tile(x, (2, -1))"])
def test_empty_arrays_are_numpys(call: str) -> None:
    """numpy's norm of nothing is 0 (its max starts there), an empty vector's diagonal matrix a square of zeros,
    and a negative count tiles an empty array (an error only where the result's shape would be negative)."""
    _compare(call, np.zeros((1, 0), np.float32) if "x[0]" in call else np.zeros((0, 3), np.float32))


def _compare(call: str, x: np.ndarray) -> None:
    """The call compiled and as numpy: equal values, dtype and shape, or the same error type."""
    fn = eval(f"lambda x: {call}")  # noqa: S307 - the calls above
    try:
        expected = _numpy(fn, x.copy())
    except (ValueError, TypeError, IndexError) as err:
        with pytest.raises(type(err)):
            jitop.kernel(fn, fallback=False)(x.copy())
        return
    got = jitop.kernel(fn, fallback=False)(x.copy())
    rtol = {np.dtype("float32"): 1e-6, np.dtype("float64"): 1e-14}.get(np.asarray(expected).dtype, 0.0)
    assert_close(got, expected, rtol=rtol, atol=rtol)


def test_weights_that_sum_to_zero_raise_numpys_error_when_the_kernel_runs() -> None:
    f = jitop.kernel(lambda x, w: np.average(x, axis=-1, weights=w), fallback=False)
    x = np.arange(6.0).reshape(2, 3)
    assert_close(f(x, np.array([1.0, 2.0, 3.0])), np.average(x, axis=-1, weights=np.array([1.0, 2.0, 3.0])))
    for fn in (f, f.fn):
        with pytest.raises(ZeroDivisionError, match="Weights sum to zero"):
            fn(x, np.array([1.0, -1.0, 0.0]))


def test_one_kernel_for_every_row_length() -> None:
    def fn(x):
        return (np.repeat(x, 2, axis=0), np.tile(x, (1, 2)), np.linalg.norm(x, axis=-1), np.select([x > 0], [x], -1.0),
                np.roll(x, 3, axis=0))
    f = jitop.kernel(fn, fallback=False)
    for n in (5, 9, 2, 17, 100, 3):
        x = np.random.default_rng(n).standard_normal((4, n))
        for got, expected in zip(f(x), fn(x)):
            assert_close(got, expected, rtol=1e-14, atol=1e-14)
    assert f.traces <= 2


@pytest.mark.parametrize("call,what", [("np.roll(x, int(x.shape[0] > 0) * s)", "shift computed by the kernel"),

                                       ("np.count_nonzero(x)", "without axis="),
                                       ("np.repeat(x, [1, 2, 1], axis=0)", "a count per element"),
                                       ("np.linalg.norm(x, 2)", "singular values")])
def test_what_the_data_decides_runs_as_numpy_with_a_warning(call: str, what: str) -> None:
    fn = eval(f"lambda x, s: {call}")  # noqa: S307 - the calls above
    x = np.arange(9.0).reshape(3, 3)
    with pytest.warns(jitop.JitopFallbackWarning, match=what):
        got = jitop.kernel(fn)(x, np.int64(1))
    np.testing.assert_allclose(got, fn(x, np.int64(1)))


def test_a_three_operand_diagonal_and_a_symbolic_matrix() -> None:
    """einsum's `iij` and `iii` on a cube; the diagonal and trace of square matrices whose size varies."""
    cube = np.arange(27.0).reshape(3, 3, 3)
    for spec in ("iij->j", "iii->i", "iji->j"):
        assert_close(jitop.kernel(lambda x, spec=spec: np.einsum(spec, x), fallback=False)(cube), np.einsum(spec, cube))
    f = jitop.kernel(lambda x: (np.diagonal(x, 1), np.trace(x)), fallback=False)
    for n in (4, 7, 2, 9):
        x = np.random.default_rng(n).standard_normal((n, n))
        for got, expected in zip(f(x), (np.diagonal(x, 1), np.trace(x))):
            assert_close(got, expected, rtol=1e-14, atol=1e-14)
    assert f.traces <= 3
