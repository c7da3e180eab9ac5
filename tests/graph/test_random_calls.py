"""Property test: a fixed set of numpy functions, each called with random arguments through @jitop.kernel,
gives exactly what calling it directly gives.

Arguments are drawn per call: arrays of many dtypes (bool, signed/unsigned ints, float32/64, and ones jitop
does not compile: float16, complex, object, which must fall back with a JitopFallbackWarning), shapes with
0, 1, primes and broadcasting (and now and then a shape that does not broadcast), layouts (contiguous,
strided, transposed, read-only, big-endian), special values (NaN, inf, -0.0), Python scalars (bool, int,
float, ints beyond int64), numpy scalars, lists, tuples and None. The kernel is called twice with the same
signature and different values: first in a fresh kernel, then in one kept per function across examples (so
served among other signatures, by the native entry, or by keyword through the Python path), with a captured
module array changed in place in between.

Compared with numpy: the result's type (numpy scalar vs 0-d array vs Python scalar, tuple/list/dict),
dtype, shape, values (bit for bit unless the function is marked approximate: transcendental functions and
sums), what the call did to array arguments (in-place changes), and when numpy raises, jitop raises the
same exception type. JITOP_RANDOM_CALLS sets the number of examples (default 400, a few seconds).
"""
from __future__ import annotations

import math
import os
import warnings
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings, strategies as st

import jitop

EXACT, APPROX = "exact", "approx"

# name -> (function, number of arguments, exactness)
FUNCS: dict[str, tuple[Callable, int, str]] = {
    # Python operators: numpy's meaning on arrays, Python's on Python scalars, lists and tuples
    "add": (lambda a, b: a + b, 2, EXACT),
    "sub": (lambda a, b: a - b, 2, EXACT),
    "mul": (lambda a, b: a * b, 2, EXACT),
    "truediv": (lambda a, b: a / b, 2, EXACT),
    "floordiv": (lambda a, b: a // b, 2, EXACT),
    "mod": (lambda a, b: a % b, 2, EXACT),
    "pow": (lambda a, b: a ** (3 if type(b) is int and abs(b) > 1000 else b), 2, APPROX),  # 3 ** 2**64 never ends
    "pow2": (lambda a, b: a ** 2 + b, 2, EXACT),
    "neg abs": (lambda a, b: -a + abs(b), 2, EXACT),
    "invert": (lambda a, b: ~a, 1, EXACT),
    "bitwise": (lambda a, b: (a & b) | (a ^ b), 2, EXACT),
    "shift": (lambda a, b: a << b, 2, EXACT),
    "compare": (lambda a, b: (a < b, a == b, a >= b), 2, EXACT),
    "scalar chain": (lambda a, b: (a + 1) * (b - 2) / 4, 2, EXACT),
    "reflected": (lambda a, b: 3 - a * 2.5 + b, 2, EXACT),
    "in place": (lambda a, b: _iadd(a, b), 2, EXACT),
    # ufuncs
    "tanh mul": (lambda a, b: np.tanh(a) * b, 2, APPROX),
    "exp": (lambda a, b: np.exp(a) - b, 2, APPROX),
    "sqrt abs": (lambda a, b: np.sqrt(np.abs(a)), 1, EXACT),
    "log1p": (lambda a, b: np.log1p(np.abs(a)) + b, 2, APPROX),
    "maximum": (lambda a, b: np.maximum(a, b) + 0, 2, EXACT),
    "fmin": (lambda a, b: np.fmin(a, b) + 0, 2, EXACT),
    "where": (lambda a, b: np.where(a > b, a, b), 2, EXACT),
    "where scalar": (lambda a, b: np.where(a, b, 0), 2, EXACT),
    "clip": (lambda a, b: np.clip(a, -1, 2), 1, EXACT),
    "clip by b": (lambda a, b: np.clip(a, b, 3), 2, EXACT),
    "arctan2": (lambda a, b: np.arctan2(a, b), 2, APPROX),
    "sign floor": (lambda a, b: (np.sign(a), np.floor(a), np.rint(a)), 1, EXACT),
    "isnan": (lambda a, b: np.isnan(a) | np.isinf(b), 2, EXACT),
    "logical": (lambda a, b: np.logical_and(a, b), 2, EXACT),
    "np.power": (lambda a, b: np.power(a, 2), 1, EXACT),
    "true_divide ufunc": (lambda a, b: np.true_divide(a, b), 2, EXACT),
    # reductions
    "sum": (lambda a, b: a.sum(), 1, APPROX),
    "sum axis": (lambda a, b: np.sum(a, axis=-1), 1, APPROX),
    "sum keepdims": (lambda a, b: a.sum(axis=0, keepdims=True), 1, APPROX),
    "mean": (lambda a, b: np.mean(a, axis=0), 1, APPROX),
    "std": (lambda a, b: np.std(a), 1, APPROX),
    "var ddof": (lambda a, b: np.var(a, axis=-1, ddof=1), 1, APPROX),
    "prod": (lambda a, b: np.prod(a, axis=-1), 1, APPROX),
    "max": (lambda a, b: np.max(a, axis=0), 1, EXACT),
    "min": (lambda a, b: a.min(), 1, EXACT),
    "argmax": (lambda a, b: np.argmax(a), 1, EXACT),
    "argmin axis": (lambda a, b: np.argmin(a, axis=-1), 1, EXACT),
    "any all": (lambda a, b: (np.any(a > 0, axis=0), np.all(a)), 1, EXACT),
    # shapes and indexing
    "reshape": (lambda a, b: a.reshape(-1), 1, EXACT),
    "T": (lambda a, b: a.T, 1, EXACT),
    "expand": (lambda a, b: a[None, ..., None], 1, EXACT),
    "squeeze": (lambda a, b: np.squeeze(a), 1, EXACT),
    "slices": (lambda a, b: (a[::2], a[..., ::-1], a[1:]), 1, EXACT),
    "index": (lambda a, b: (a[0], a[-1, ...], a[()]), 1, EXACT),
    "concatenate": (lambda a, b: np.concatenate([a, b]), 2, EXACT),
    "concatenate last": (lambda a, b: np.concatenate([a, b], axis=-1), 2, EXACT),
    "stack": (lambda a, b: np.stack([a, b]), 2, EXACT),
    "broadcast_to": (lambda a, b: np.broadcast_to(a, (2,) + np.shape(a)), 1, EXACT),
    "flip moveaxis": (lambda a, b: (np.flip(a), np.moveaxis(a, 0, -1)), 1, EXACT),
    "astype": (lambda a, b: (a.astype(np.float32), a.astype(bool)), 1, EXACT),
    "copy like": (lambda a, b: (a.copy(), np.zeros_like(a), np.full_like(a, 2)), 1, EXACT),
    # (into a float array: a negative or NaN float into an integer array is undefined in C, numpy's value
    # depends on the machine)
    "full_like b": (lambda a, b: np.full_like(a.astype(np.float64), b), 2, EXACT),
    # products
    "matmul": (lambda a, b: a @ b, 2, APPROX),
    "dot": (lambda a, b: np.dot(a, b), 2, APPROX),
    "einsum": (lambda a, b: np.einsum("...i,...i->...", a, b), 2, APPROX),
    "einsum ij": (lambda a, b: np.einsum("ij->j", a), 1, APPROX),
    "matmul T": (lambda a, b: a @ a.T, 1, APPROX),
    # more numpy functions
    "round": (lambda a, b: np.round(a, 1), 1, EXACT),
    "split": (lambda a, b: np.split(a, 1), 1, EXACT),
    "mean dtype": (lambda a, b: np.mean(a, dtype=np.float32), 1, APPROX),
    "where python": (lambda a, b: np.where(a > 0, 1.5, b), 2, EXACT),
    "argmax keepdims": (lambda a, b: np.argmax(a, axis=0, keepdims=True), 1, EXACT),
    "swapaxes tril": (lambda a, b: (np.swapaxes(a, 0, -1), np.tril(a)), 1, EXACT),
    "vstack": (lambda a, b: np.vstack([a, b]), 2, EXACT),
    "clip none": (lambda a, b: np.clip(a, b, None), 2, EXACT),
    "to int": (lambda a, b: np.where(np.isfinite(a), a, 0).astype(np.int32), 1, EXACT),
    "sort": (lambda a, b: np.sort(a), 1, EXACT),  # not compiled: falls back
    # Python control flow and conversions (static facts compile, values fall back)
    "if ndim": (lambda a, b: a.sum(axis=0) if np.ndim(a) > 1 else a * 2, 1, APPROX),
    "if value": (lambda a, b: a * 2 if b > 0 else a, 2, EXACT),
    "float()": (lambda a, b: float(b) * a, 2, EXACT),
    "tolist": (lambda a, b: a.tolist(), 1, EXACT),
    "shape arithmetic": (lambda a, b: a.reshape(np.size(a), 1) * b, 2, EXACT),
    "mutate": (lambda a, b: _mutate(a, b), 2, EXACT),
    # data captured from the module: _CAPTURED changes in place between the calls
    "captured": (lambda a, b: a * _CAPTURED + _CAPTURED.sum(), 1, APPROX),
    # what a function returns
    "structure": (lambda a, b: {"s": (a + b, [a.sum(), b]), "n": None, "k": 3}, 2, APPROX),
    "python values": (lambda a, b: (b, b * 2, a.shape, a.ndim), 2, EXACT),
    "len": (lambda a, b: a[: len(a) // 2] * b, 2, EXACT),
}


_CAPTURED = np.array([1.5, -2.0, 3.0])


def _iadd(a, b):
    c = a * 1
    c += b
    return c


def _mutate(a, b):
    a += b  # an array argument is changed in place (falls back: the caller sees the change)
    return a


# ** arguments **

DIMS = [0, 1, 2, 3, 5, 7]
COMMON = ["float64", "float32", "int64", "int32", "int16", "int8", "uint8", "uint64", "bool"]
UNUSUAL = ["float16", "complex128", "object", ">f8", ">i4"]  # the first three must fall back
LAYOUTS = ["contiguous"] * 6 + ["strided", "transposed", "read-only", "fortran"]
SPECIAL = [0.0, -0.0, np.nan, np.inf, -np.inf, 0.5, 1.0]
PY_INTS = [0, 1, 2, 3, -1, -4, 7, 127, 300, 2 ** 63, -2 ** 63 - 1, 2 ** 64]
PY_FLOATS = [0.5, -1.5, 0.0, -0.0, 2.25, 3.0, np.nan, np.inf, 1e300]
NP_SCALARS = ["float32", "float64", "int8", "int64", "uint8", "bool", "float16"]
# (not [] : numpy's np.dot(float32 0-d, []) is float32 where np.multiply and np.dot(x, np.array([])) are float64)
SEQUENCES = [[1, 2], [1.5, -2.0, 3.0], (1, 2, 3), [[1, 2], [3, 4]], (2.5,), [True, False]]


@st.composite
def signatures(draw):
    """The structure of a call's arguments (kinds, dtypes, shapes, layouts), without values."""
    ndim = draw(st.integers(0, 3))
    base = tuple(draw(st.lists(st.sampled_from(DIMS), min_size=ndim, max_size=ndim)))
    if draw(st.integers(0, 19)) == 0:  # now and then big enough for whole vectors, chunks and threads
        base = draw(st.sampled_from([(1031,), (67, 67), (3, 257)]))
    name = draw(st.sampled_from(sorted(FUNCS)))
    args = []
    for _ in range(FUNCS[name][1]):
        kind = draw(st.sampled_from(["array"] * 14 + ["py"] * 3 + ["npscalar"] * 2 + ["sequence", "none"]))
        if kind == "array":
            dtype = draw(st.sampled_from(COMMON)) if draw(st.integers(0, 9)) else draw(st.sampled_from(UNUSUAL))
            if draw(st.integers(0, 9)):  # broadcastable against the base shape
                drop = draw(st.integers(0, len(base)))
                shape = tuple(1 if draw(st.integers(0, 3)) == 0 else d for d in base[drop:])
            else:
                shape = tuple(draw(st.lists(st.sampled_from(DIMS), max_size=3)))
            args.append(("array", dtype, shape, draw(st.sampled_from(LAYOUTS)), draw(st.booleans())))
        elif kind == "py":
            args.append(("py", draw(st.sampled_from(["bool", "int", "int", "float", "float", "bigint"]))))
        elif kind == "npscalar":
            args.append(("npscalar", draw(st.sampled_from(NP_SCALARS))))
        elif kind == "sequence":
            args.append(("sequence", draw(st.integers(0, len(SEQUENCES) - 1))))
        else:
            args.append(("none",))
    return name, args


def _values(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...], special: bool) -> np.ndarray:
    kind = dtype.kind
    if kind == "b":
        return np.asarray(rng.random(shape) < 0.5)
    if kind in "iu":
        lo = 0 if kind == "u" else -20
        return np.asarray(rng.integers(lo, 21, shape)).astype(dtype)
    x = np.asarray(np.round(rng.uniform(-10, 10, shape) * 8) / 8)  # multiples of 1/8: sums of a few are exact
    if special and x.size:
        mask = rng.random(shape) < 0.25
        x[mask] = rng.choice(np.array(SPECIAL), int(mask.sum()))
    if kind == "c":
        return np.asarray(x + 1j * x[::-1] if x.ndim else x + 0.5j).astype(dtype)
    return x.astype(dtype)


# products go through BLAS in numpy, whose handling of NaN/inf times 0 is the library's (OpenBLAS' scal with 0
# gives 0 for NaN): no special values there
NO_SPECIAL = {"dot", "matmul", "matmul T", "einsum", "einsum ij", "structure"}


def make_args(sig: list, seed: int, specials: bool = True) -> list[Any]:
    rng = np.random.default_rng(seed)
    out = []
    for a in sig:
        if a[0] == "array":
            _, dtype, shape, layout, special = a
            special = special and specials
            dt = np.dtype(dtype)
            if dt == object:
                v = np.empty(shape, object)
                v[...] = _values(rng, np.dtype("int64"), shape, special).astype(object) if shape else 3
                out.append(v)
                continue
            if layout == "strided" and shape:
                v = _values(rng, dt.newbyteorder("="), shape[:-1] + (2 * shape[-1],), special)[..., ::2]
            elif layout == "transposed":
                v = _values(rng, dt.newbyteorder("="), shape[::-1], special).T
            elif layout == "fortran":
                v = np.asfortranarray(_values(rng, dt.newbyteorder("="), shape, special))
            else:
                v = _values(rng, dt.newbyteorder("="), shape, special)
            if not dt.isnative:
                v = v.astype(dt)
            if layout == "read-only":
                v.flags.writeable = False
            out.append(v)
        elif a[0] == "py":
            kind = a[1]
            if kind == "bool":
                out.append(bool(rng.integers(0, 2)))
            elif kind == "int":
                out.append(int(rng.choice(PY_INTS[:9])))
            elif kind == "bigint":
                out.append(int(PY_INTS[9 + int(rng.integers(0, 3))]))
            else:
                out.append(float(rng.choice(np.array(PY_FLOATS))))
        elif a[0] == "npscalar":
            dt = np.dtype(a[1])
            if dt.kind == "f" and rng.integers(0, 3) == 0:
                out.append(dt.type(rng.choice(np.array(SPECIAL))))
            else:
                out.append(dt.type(rng.integers(-3, 4) if a[1] != "bool" else rng.integers(0, 2)))
        elif a[0] == "sequence":
            out.append(SEQUENCES[a[1]])
        else:
            out.append(None)
    return out


def falls_back(sig: list) -> bool:
    """An argument jitop does not compile: the call must run as numpy, with one JitopFallbackWarning."""
    return any((a[0] == "array" and np.dtype(a[1]).kind in "cO" or a[0] == "array" and a[1] == "float16")
               or (a[0] == "npscalar" and a[1] == "float16") for a in sig)


# ** comparison **

RTOL = {"e": 1e-2, "f": 1e-4, "d": 1e-10}


def _scale(args: list[Any]) -> float:
    biggest = 1.0
    for a in args:
        if isinstance(a, (np.ndarray, np.generic)) and a.dtype.kind in "biuf":
            v = np.abs(np.asarray(a, dtype=np.float64))
            v = v[np.isfinite(v)]
            if v.size:
                biggest = max(biggest, float(v.max()) + 1, float(v.size))
        elif isinstance(a, (int, float)) and math.isfinite(a) and abs(a) < 1e20:
            biggest = max(biggest, abs(float(a)) + 1)
    return biggest


def check_same(got: Any, expected: Any, approx: bool, scale: float, where: str = "result",
               rtol: float = 0.0) -> None:
    if isinstance(expected, np.generic):  # np.ulonglong and np.uint64 are two types of one dtype
        assert isinstance(got, np.generic), f"{where}: type {type(got).__name__}, numpy {type(expected).__name__}"
    else:
        assert type(got) is type(expected), f"{where}: type {type(got).__name__}, numpy {type(expected).__name__}"
    if isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), f"{where}: length"
        for k, (g, e) in enumerate(zip(got, expected)):
            check_same(g, e, approx, scale, f"{where}[{k}]", rtol)
        return
    if isinstance(expected, dict):
        assert list(got) == list(expected), f"{where}: keys"
        for k in expected:
            check_same(got[k], expected[k], approx, scale, f"{where}[{k!r}]", rtol)
        return
    if not isinstance(expected, (np.ndarray, np.generic)):
        if isinstance(expected, complex) and expected != expected:  # NaN parts: compare part by part
            check_same(got.real, expected.real, approx, scale, where, rtol)
            check_same(got.imag, expected.imag, approx, scale, where, rtol)
        elif isinstance(expected, float) and math.isnan(expected):
            assert math.isnan(got), f"{where}: {got!r}, numpy nan"
        elif isinstance(expected, float) and approx:
            tol = max(rtol, 1e-10)
            assert math.isclose(got, expected, rel_tol=tol, abs_tol=tol * scale), f"{where}: {got!r} vs {expected!r}"
        else:
            assert got == expected, f"{where}: {got!r}, numpy {expected!r}"
        return
    g, e = np.asarray(got), np.asarray(expected)
    assert g.dtype == e.dtype, f"{where}: dtype {g.dtype}, numpy {e.dtype}"
    assert g.shape == e.shape, f"{where}: shape {g.shape}, numpy {e.shape}"
    if e.dtype == object:
        same = [x == y or (x != x and y != y) for x, y in zip(g.ravel().tolist(), e.ravel().tolist())]
        assert all(same), where
    elif not approx or e.dtype.kind not in "fc":
        np.testing.assert_array_equal(g, e, err_msg=where, strict=True)
        if e.dtype.kind == "f":  # -0.0 and 0.0 are equal, but not the same result (a NaN's sign means nothing)
            zeros = e == 0
            np.testing.assert_array_equal(np.signbit(g[zeros]), np.signbit(e[zeros]), err_msg=f"{where}: sign of zero")
    else:
        rtol = max(rtol, RTOL.get(e.dtype.char.lower() if e.dtype.kind == "c" else e.dtype.char, 1e-10))
        if e.dtype.kind == "c" and e.dtype.itemsize == 8:
            rtol = max(rtol, RTOL["f"])
        np.testing.assert_array_equal(np.isnan(g), np.isnan(e), err_msg=f"{where}: NaN positions")
        np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol * scale * scale, equal_nan=True, err_msg=where)


def outcome(fn: Callable, args: list[Any]) -> tuple[Any, BaseException | None, list[str]]:
    """fn(*args), or the exception it raised, and the JitopFallbackWarnings it gave."""
    with np.errstate(all="ignore"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result, error = fn(*args), None
        except Exception as err:  # noqa: BLE001 - the exception is the outcome to compare
            result, error = None, err
    return result, error, [str(w.message) for w in caught if issubclass(w.category, jitop.JitopFallbackWarning)]


def copies(args: list[Any]) -> list[Any]:
    out = []
    for a in args:
        if isinstance(a, np.ndarray):
            c = a.copy(order="K")
            c.flags.writeable = a.flags.writeable
            out.append(c)
        else:
            out.append(a)
    return out


_SHARED: dict[str, Any] = {}  # one kernel per function across examples: many signatures, native entry


def check_call(name: str, sig: list, seeds: tuple[int, ...]) -> None:
    fn, _, exactness = FUNCS[name]
    fresh = jitop.kernel(fn)
    shared = _SHARED.setdefault(name, jitop.kernel(fn))
    for call, seed in enumerate(seeds):
        # the first call compiles (or falls back, warning) in a fresh kernel; later ones go to a kernel that
        # has served other signatures, now and then by keyword (the slow path)
        kernel = fresh if call == 0 else shared
        if call and seed % 3 == 0:
            kernel = (lambda k: lambda a, b: k(a=a, b=b))(shared)
        _CAPTURED[:] = np.random.default_rng(seed).integers(-4, 5, 3)  # read by "captured"
        args = make_args(sig, seed, specials=name not in NO_SPECIAL)
        args += [None] * (2 - len(args))  # every function takes (a, b); a one-argument one ignores b
        note(f"call {call}: {name}{tuple(_describe(a) for a in args)}")
        numpy_args = copies(args)
        expected, numpy_error, _ = outcome(fn, numpy_args)
        got, error, fallbacks = outcome(kernel, args)
        for k, (mine, theirs) in enumerate(zip(args, numpy_args)):  # what the call did to its arguments
            if isinstance(theirs, np.ndarray):
                check_same(mine, theirs, False, 1.0, f"argument {k} after the call")
        if numpy_error is not None:
            assert type(error) is type(numpy_error), \
                f"numpy raises {type(numpy_error).__name__}: {numpy_error}; jitop: {error!r} / {got!r}"
            continue
        assert error is None, f"numpy returns {expected!r}; jitop raises {type(error).__name__}: {error}"
        if call == 0 and falls_back(sig):
            assert fallbacks, "an argument jitop does not compile ran without a JitopFallbackWarning"
        check_same(got, expected, exactness == APPROX, _scale(args), rtol=_rtol(args))


def _rtol(args: list[Any]) -> float:
    """An approximate function's tolerance: that of the least precise float among its arguments (a float32
    exp promoted to float64 keeps float32's error), at least float64's."""
    rtol = RTOL["d"]
    for a in args:
        if isinstance(a, (np.ndarray, np.generic)) and a.dtype.kind in "biu" and a.dtype.itemsize <= 2:
            rtol = max(rtol, RTOL["f"])  # np.exp(int16) is float32 (of int8 float16, which falls back)
        if isinstance(a, (np.ndarray, np.generic)) and a.dtype.kind in "fc":
            rtol = max(rtol, RTOL.get(a.dtype.char.lower() if a.dtype.kind == "c" else a.dtype.char, 1e-10))
            if a.dtype.kind == "c" and a.dtype.itemsize == 8:
                rtol = max(rtol, RTOL["f"])
    return rtol


def _describe(a: Any) -> str:
    if isinstance(a, np.ndarray):
        layout = "C" if a.flags.c_contiguous else ("F" if a.flags.f_contiguous else "strided")
        return f"{a.dtype.str}{list(a.shape)}{layout}{'' if a.flags.writeable else ' read-only'}: {a.tolist()!r}"[:200]
    return repr(a)


@settings(max_examples=int(os.environ.get("JITOP_RANDOM_CALLS", 400)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(signatures(), st.integers(0, 2 ** 32 - 1), st.integers(0, 2 ** 32 - 1))
def test_random_call_matches_numpy(signature, seed1: int, seed2: int) -> None:
    name, sig = signature
    check_call(name, sig, (seed1, seed2))


# ** every function compiles on ordinary arguments (so the property test exercises compiled code) **

# in-place operators, unsupported functions, conversions to Python values and control flow on values run as numpy
MAY_FALL_BACK = {"in place", "mutate", "sort", "if value", "float()", "tolist"}


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_each_function_compiles_on_plain_arrays(name: str) -> None:
    fn, nargs, exactness = FUNCS[name]
    args = [np.arange(1.0, 7.0).reshape(2, 3), np.linspace(0.5, 2.0, 6).reshape(2, 3)][:nargs]
    if name in ("matmul", "dot"):
        args[1] = np.linspace(0.5, 2.0, 3)
    if name in ("invert", "bitwise", "shift"):
        args = [np.arange(6).reshape(2, 3), np.arange(3)][:nargs]
    if name in ("if value", "float()", "shape arithmetic"):
        args[1] = 2.0
    args += [None] * (2 - nargs)
    kernel = jitop.kernel(fn, fallback=name in MAY_FALL_BACK)
    expected, numpy_error, _ = outcome(fn, copies(args))
    got, error, _ = outcome(kernel, args)
    assert numpy_error is None and error is None, (numpy_error, error)
    check_same(got, expected, exactness == APPROX, _scale(args))


# ** regressions the random calls found **

def test_python_operators_on_lists_keep_pythons_meaning() -> None:
    @jitop.kernel
    def f(a, b):
        return a * b
    for a, b in [([1, 2], 2), ((1, 2), np.int64(2)), ((1, 2), np.array(2)), (np.arange(2), [1, 2]),
                 ([1.5], np.float32(2.0))]:
        expected, numpy_error, _ = outcome(f.fn, [a, b])
        got, error, _ = outcome(f, [a, b])
        assert type(error) is type(numpy_error)
        if numpy_error is None:
            check_same(got, expected, False, 1.0)
    for a, b in [([1, 2], 2.5), (None, 2.0), ([1], None)]:
        with pytest.raises(TypeError):
            f.fn(a, b)
        with pytest.raises(TypeError):
            f(a, b)


def test_ufunc_of_python_float_is_a_float64_scalar() -> None:
    @jitop.kernel(fallback=False)
    def f(a, b):
        return np.tanh(a) * b, np.exp(a) + b, (a + 1) * b, np.sqrt(a)
    b = np.ones(3, np.float32)
    for g, e in zip(f(0.5, b), f.fn(0.5, b)):
        check_same(g, e, True, 1.0)


def test_python_scalar_arithmetic_is_pythons() -> None:
    @jitop.kernel(fallback=False)
    def f(a, s, t):
        return a * (s + t), s + t, s / t, s // t, s % t, -s, s < t, s ** 2
    a = np.arange(3.0)
    for s, t in [(True, True), (3, 2), (-7, 2), (2.5, -1.0), (True, 3.5)]:
        check_same(f(a, s, t), f.fn(a, s, t), False, 1.0)
    for s, t in [(1, 0), (1.5, 0.0), (False, False)]:
        with pytest.raises(ZeroDivisionError):
            f.fn(a, s, t)
        with pytest.raises(ZeroDivisionError):
            f(a, s, t)


def test_python_scalar_has_no_array_attributes() -> None:
    @jitop.kernel
    def f(a, s):
        return a * s.shape[0]
    with pytest.raises(AttributeError):
        f.fn(np.ones(2), 2.0)
    with pytest.raises(AttributeError):
        f(np.ones(2), 2.0)


def _same_outcome(f, *args) -> None:
    """f (a kernel) called with args gives f.fn's result, or raises its exception type."""
    expected, numpy_error, _ = outcome(f.fn, copies(list(args)))
    got, error, _ = outcome(f, list(args))
    assert type(error) is type(numpy_error), (error, numpy_error)
    if numpy_error is None:
        check_same(got, expected, False, 1.0)


def test_numpy_scalar_operators_with_sequences() -> None:
    # numpy scalar * list repeats the list for integer scalars and is a TypeError for float ones; a 0-d
    # array multiplies elementwise; numpy scalars have no @
    @jitop.kernel
    def f(a, b):
        return a * b
    for a, b in [(np.int64(2), [1, 2]), (np.float32(2), [1, 2]), (np.array(2), [1, 2]), ([1.5], np.int8(3)),
                 (np.bool_(True), (1, 2))]:
        _same_outcome(f, a, b)
    g = jitop.kernel(lambda a, b: a @ b)
    for a, b in [(np.float64(1), np.float64(2)), (np.float64(1), np.array([2.0])), (np.array(1.0), 2.0)]:
        _same_outcome(g, a, b)


def test_array_power_two_is_square() -> None:
    @jitop.kernel(fallback=False)
    def f(a):
        return a ** 2, np.power(a, 2), a[0] ** 2
    a = np.array([True, False])
    check_same(f(a), f.fn(a), False, 1.0)  # bool ** 2 is int8 (np.square), np.power's int64


def test_big_ints_in_array_functions_are_converted_like_np_asarray() -> None:
    f = jitop.kernel(lambda a, s: (np.stack([a, s]), np.dot(a, s), np.clip(s, a, None), np.hstack([a, s])))
    for a, s in [(np.float64(2.0), 2 ** 64), (np.array(3, np.int32), 7), (np.array(-5), 2 ** 63),
                 (np.array(1, np.int8), 300)]:
        _same_outcome(f, a, s)


def test_views_of_byte_swapped_arrays_keep_numpys_dtype() -> None:
    f = jitop.kernel(lambda a: (a.T, a.copy(), np.zeros_like(a), a + 1, a[0]))
    a = np.arange(6.0).reshape(2, 3).astype(">f8")
    _same_outcome(f, a)
    g = jitop.kernel(lambda a: (a + 1, a.sum(), a[0, 1], a.astype(np.float32)), fallback=False)
    _same_outcome(g, a)  # computed results are native: compiled


def test_python_int_arithmetic_beyond_int64_runs_as_numpy() -> None:
    @jitop.kernel
    def f(a, s, t):
        return a * (s + t), s * t, -s, s ** 3, s << 3
    a = np.ones(2)
    for s, t in [(3, 4), (2 ** 62, 2 ** 62), (2 ** 40, 2 ** 30), (-2 ** 63, -1), (True, 2 ** 62)]:
        _same_outcome(f, a, s, t)
    g = jitop.kernel(lambda s, t: (s // t, s % t))
    for s, t in [(-2 ** 63, -1), (7, -2), (-7, 0)]:
        _same_outcome(g, s, t)


def test_python_int_checks_run_for_empty_arrays() -> None:
    # numpy checks a Python int against the array's dtype (and Python divides) whatever the array's size
    f = jitop.kernel(lambda a, s, t: (-s + a, a * (s // t)))
    for a, s, t in [(np.zeros((1, 0), np.uint64), True, 1), (np.zeros(0, np.int8), 200, 1),
                    (np.zeros(0), 1, 0), (np.zeros(3, np.int16), 5, 2)]:
        _same_outcome(f, a, s, t)


def test_python_int_checks_run_where_the_result_is_dropped() -> None:
    """numpy checks a Python int at the operation: also for an in-place update of an empty array (the graph keeps
    no update of nothing) and for a result nobody uses."""
    def in_place(a, b):
        c = a * 1
        c += b
        return c

    def unused(a, b):
        _ = a + b
        return a * 1
    for fn in (in_place, unused):
        f = jitop.kernel(fn)
        for a, b in [(np.zeros((1, 0), np.uint8), -1), (np.zeros((2, 2), np.uint8), -1), (np.zeros(0, np.int8), 5)]:
            _same_outcome(f, a, b)


def test_static_keys_distinguish_types_and_signed_zeros() -> None:
    f = jitop.kernel(lambda a, s: (a * s, 1 / s if s else s), static_argnums=(1,))
    a = np.ones(2, np.float32)
    for s in [1, 1.0, True, 0.0, -0.0, [1], (1,)]:
        if isinstance(s, (list, tuple)):
            _same_outcome(f, a, s)
        else:
            check_same(f(a, s), f.fn(a, s), False, 1.0)


def test_mixed_dtype_hstack_of_0d_arrays_compiles() -> None:
    # the guarded select of a concatenation mixed a vector and a scalar branch (LLVM: does not dominate)
    f = jitop.kernel(lambda a, b: (np.hstack([a, b]), np.vstack([a, b])), fallback=False)
    for a, b in [(np.array(1.5), np.array(2)), (np.arange(3.0), np.arange(3, dtype=np.int8))]:
        check_same(f(a, b), f.fn(a, b), False, 1.0)


def test_numpy_scalar_power_is_c_pow_and_array_power_is_sqrt() -> None:
    # numpy: np.float64(-0.0) ** 0.5 is C's pow (0.0; inf for -inf), an array's ** 0.5 is np.sqrt (-0.0; nan)
    f = jitop.kernel(lambda a: a ** 0.5, fallback=False)
    for a in [np.float64(-0.0), np.float32(-np.inf), np.array(-0.0), np.array([-0.0, -np.inf, 4.0])]:
        got, expected = f(a), f.fn(a)
        check_same(got, expected, False, 1.0)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))
