"""@jitop.kernel dispatch: what recompiles (misses) and what reuses a compiled signature (hits),
argument layouts, threads, and the freshness of results."""
from __future__ import annotations

import concurrent.futures as cf
import warnings

import numpy as np
import pytest

import jitop


def jit_call(k, *args, **kwargs):
    """Call a kernel; a fallback warning is an error (it would make the test vacuous)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", jitop.JitopFallbackWarning)
        return k(*args, **kwargs)


def assert_same(got, expected, rtol: float | None = None) -> None:
    assert type(got) is type(expected), (type(got), type(expected))
    if isinstance(expected, (tuple, list)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_same(g, e, rtol)
        return
    g, e = np.asarray(got), np.asarray(expected)
    assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, e.dtype, g.shape, e.shape)
    if rtol is None:
        np.testing.assert_array_equal(g, e, strict=True)
    else:
        np.testing.assert_allclose(g, e, rtol=rtol, strict=True)


# ** Python scalars are runtime values **

def test_new_float_value_does_not_recompile() -> None:
    @jitop.kernel
    def f(a, s):
        return a * s + 1
    a = np.arange(7, dtype=np.float32)
    for s in (2.0, -3.5, 0.0, 1e30, float("nan"), float("inf")):
        with np.errstate(all="ignore"):
            assert_same(jit_call(f, a, s), a * s + 1)
    assert f.misses == 1 and f.hits == 5


def test_new_int_value_does_not_recompile_but_int_vs_float_does() -> None:
    @jitop.kernel
    def f(a, s):
        return a + s
    a = np.arange(5, dtype=np.int32)
    assert_same(jit_call(f, a, 1), a + 1)
    assert_same(jit_call(f, a, -70000), a + -70000)
    assert (f.misses, f.hits) == (1, 1)
    assert_same(jit_call(f, a, 2.5), a + 2.5)  # float: a float64 result, a new signature
    assert f.misses == 2
    assert_same(jit_call(f, a, True), a + True)
    assert_same(jit_call(f, a, np.int32(3)), a + np.int32(3))  # a numpy scalar is strongly typed
    assert_same(jit_call(f, a, np.int64(3)), a + np.int64(3))
    assert f.misses == 5
    assert_same(jit_call(f, a, np.int64(-9)), a + np.int64(-9))
    assert f.misses == 5


@pytest.mark.usefixtures("private_cache")  # (a parameter made static on use is remembered in the cache)
def test_scalar_argument_used_in_shape_logic_is_static() -> None:
    # a runtime scalar cannot decide a shape: static_argnums makes it a compile-time value, and without it the
    # parameter is made static on the first call that needs its value (tests/graph/test_static_scalars.py)
    def fn(a, n):
        return a[:n] * 2

    f = jitop.kernel(fn, static_argnums=(1,))
    a = np.arange(6.0)
    assert_same(jit_call(f, a, 2), a[:2] * 2)
    assert_same(jit_call(f, a, 4), a[:4] * 2)
    assert_same(jit_call(f, a, 4), a[:4] * 2)
    assert (f.misses, f.hits) == (2, 1)

    g = jitop.kernel(fn, fallback=False)
    assert_same(g(a, 3), a[:3] * 2)
    assert_same(g(a, 5), a[:5] * 2)
    assert g.static == {"n"} and g.traces == 3  # the first call traced twice: n a run-time value, then static


def test_huge_python_int_argument() -> None:
    @jitop.kernel
    def f(a, s):
        return a + s
    u, x = np.arange(3, dtype=np.uint64), np.arange(3.0)
    assert_same(jit_call(f, u, 2 ** 63), u + 2 ** 63)
    assert_same(jit_call(f, x, 2 ** 64), x + 2 ** 64)
    assert_same(jit_call(f, u, 2 ** 64 - 1), u + (2 ** 64 - 1))
    assert_same(jit_call(f, x, -2 ** 70), x + -2 ** 70)


_HUGE_FORMS = {
    "add": lambda a, s: a + s, "rsub": lambda a, s: s - a, "less": lambda a, s: a < s, "equal": lambda a, s: s == a,
    "maximum": lambda a, s: np.maximum(a, s), "where": lambda a, s: np.where(a > 1, a, s),
    "clip": lambda a, s: np.clip(a, 0, s), "full_like": lambda a, s: np.full_like(a, s),
    "asarray": lambda a, s: a + np.asarray(s), "shift": lambda a, s: a << s,
}
_HUGE_VALUES = [2 ** 63, 2 ** 64 - 1, 2 ** 64, -2 ** 63 - 1, -2 ** 70, 2 ** 1100, 300, -1]


@pytest.mark.parametrize("form", sorted(_HUGE_FORMS))
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int64", "uint64", "float32", "float64", "bool"])
def test_python_int_argument_of_any_size_is_numpys(form: str, dtype: str) -> None:
    """A Python int argument as numpy 2 (NEP 50) treats it: the array's dtype, uint64, float, an object array
    (which falls back), an exact comparison, or the OverflowError numpy raises."""
    fn = _HUGE_FORMS[form]
    a = np.array([0, 1, 2]).astype(dtype)
    for v in _HUGE_VALUES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                expected, error = fn(a, v), None
            except Exception as err:  # noqa: BLE001 - numpy's own error is the expected outcome
                expected, error = None, err
            f = jitop.kernel(fn)
            warnings.simplefilter("ignore", jitop.JitopFallbackWarning)  # object arrays run as numpy
            if error is not None:
                with pytest.raises(type(error)):
                    f(a, v)
            else:
                assert_same(f(a, v), expected)


def test_python_int_argument_compared_with_uint64_is_exact() -> None:
    @jitop.kernel
    def f(a, s):
        return a < s, a == s, s >= a, s != a
    u = np.array([0, 5, 2 ** 63 + 5, 2 ** 64 - 1], np.uint64)
    for s in [-1, -2 ** 63, 0, 5, 2 ** 63 - 1]:
        assert_same(jit_call(f, u, s), f.fn(u, s))
    assert f.misses == 1


def test_huge_python_int_constant() -> None:
    @jitop.kernel
    def f(a):
        return a + 2 ** 63, a.astype(np.float32) + 2 ** 70
    x = np.arange(3.0)
    assert_same(jit_call(f, x), f.fn(x))


# ** values captured from the enclosing scope **

_WEIGHTS = np.ones(3)
_SCALE = 2.0


def test_captured_globals_are_read_at_call_time() -> None:
    global _WEIGHTS, _SCALE

    @jitop.kernel
    def f(a):
        return a * _WEIGHTS * _SCALE
    x = np.arange(3.0)
    saved = (_WEIGHTS, _SCALE)
    try:
        assert_same(jit_call(f, x), f.fn(x))
        _WEIGHTS[:] = 5.0          # in-place update of a captured array
        assert_same(jit_call(f, x), f.fn(x))
        _WEIGHTS = np.full(3, 7.0)  # rebinding the global
        _SCALE = 3.0
        assert_same(jit_call(f, x), f.fn(x))
    finally:
        _WEIGHTS, _SCALE = np.ones(3), saved[1]


def test_captured_array_is_read_in_place_and_derived_values_follow_it() -> None:
    w = np.linspace(0, 1, 4)

    @jitop.kernel
    def f(a):
        return a @ w + w.sum() + w.T[0], w[1:].max()
    x = np.arange(8.0).reshape(2, 4)
    assert_same(jit_call(f, x), f.fn(x), 1e-14)
    w[:] = [3.0, -1.0, 2.0, 0.5]   # in place: no retrace, the kernel reads the array's memory
    assert_same(jit_call(f, x), f.fn(x), 1e-14)
    assert f.misses == 1


def test_captured_closure_rebinding_and_containers() -> None:
    scale, weights, sizes = 2.0, [np.ones(3), np.arange(3.0)], (1, 2)

    def make():
        @jitop.kernel
        def f(a):
            return a * scale + weights[1] * sizes[0] + weights[0].sum()
        return f
    f = make()
    x = np.arange(3.0)
    assert_same(jit_call(f, x), f.fn(x))
    scale = 5.0  # noqa: F841 - rebinding the closure variable f reads
    assert_same(jit_call(f, x), f.fn(x))
    weights[1][:] = 7.0
    assert_same(jit_call(f, x), f.fn(x))
    weights[0] = np.full(3, 4.0)
    sizes = (3, 2)  # noqa: F841
    assert_same(jit_call(f, x), f.fn(x))


_ROWS = np.arange(6.0).reshape(2, 3)
_ROW0, _ROW1 = _ROWS[0], _ROWS[1]  # two views of one buffer: two different arrays
_ZERO_D = np.array(5.0)


def test_captured_views_of_one_buffer_and_0d_arrays_are_live() -> None:
    @jitop.kernel
    def f(a):
        return a * _ROW0 + _ROW1, a * _ZERO_D
    x = np.ones(3)
    saved = _ROWS.copy(), _ZERO_D.copy()
    try:
        assert_same(jit_call(f, x), f.fn(x))
        _ROWS[:] = [[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0]]
        _ZERO_D[()] = -2.0
        assert_same(jit_call(f, x), f.fn(x))
        assert f.misses == 1
    finally:
        _ROWS[:], _ZERO_D[()] = saved


_FLAG = True
_OFFSETS = np.array([1.0, 2.0, 3.0])[::-1]  # not contiguous: compared by contents


def test_captured_values_used_in_control_flow_and_strided_arrays() -> None:
    global _FLAG

    @jitop.kernel
    def f(a):
        if _FLAG:
            return a + _OFFSETS
        return a - _OFFSETS
    x = np.arange(3.0)
    saved = _FLAG
    try:
        assert_same(jit_call(f, x), f.fn(x))
        _FLAG = False
        assert_same(jit_call(f, x), f.fn(x))
        _OFFSETS[:] = 9.0
        assert_same(jit_call(f, x), f.fn(x))
    finally:
        _FLAG = saved


_TOTAL = np.zeros(3)


def test_a_function_assigning_a_global_runs_as_numpy() -> None:
    @jitop.kernel
    def f(a):
        global _TOTAL
        _TOTAL = _TOTAL + a
        return _TOTAL * 2
    x = np.arange(3.0)
    with pytest.warns(jitop.JitopFallbackWarning, match="global"):
        first = f(x)
    second = f(x)
    assert_same(first, x * 2)
    assert_same(second, x * 4)


def test_closure_array_used_as_a_constant_gives_numpy_answer() -> None:
    w = np.linspace(0, 1, 4)

    @jitop.kernel
    def f(a):
        return a @ w + w.sum()
    x = np.arange(8.0).reshape(2, 4)
    assert_same(jit_call(f, x), f.fn(x), 1e-14)


# ** static arguments **

def test_static_argnums_new_value_recompiles() -> None:
    def fn(a, axis, scale):
        return a.sum(axis=axis) * scale

    f = jitop.kernel(fn, static_argnums=(1,))
    a = np.arange(12.0).reshape(3, 4)
    assert_same(jit_call(f, a, 0, 2.0), fn(a, 0, 2.0))
    assert_same(jit_call(f, a, 0, 3.0), fn(a, 0, 3.0))  # scale is a runtime value: a hit
    assert (f.misses, f.hits) == (1, 1)
    assert_same(jit_call(f, a, 1, 3.0), fn(a, 1, 3.0))
    assert_same(jit_call(f, a, -1, 3.0), fn(a, -1, 3.0))
    assert f.misses == 3
    assert_same(jit_call(f, a, 1, 5.0), fn(a, 1, 5.0))
    assert f.misses == 3


def test_static_argnames_by_keyword() -> None:
    def fn(a, mode="sum", keep=False):
        return a.sum(axis=0, keepdims=keep) if mode == "sum" else a.max(axis=0, keepdims=keep)

    f = jitop.kernel(fn, static_argnames=("mode", "keep"))
    a = np.arange(12.0).reshape(3, 4)
    assert_same(jit_call(f, a), fn(a))
    assert_same(jit_call(f, a, mode="max"), fn(a, mode="max"))
    assert_same(jit_call(f, a, mode="max", keep=True), fn(a, mode="max", keep=True))
    assert_same(jit_call(f, a, mode="max", keep=True), fn(a, mode="max", keep=True))
    assert (f.misses, f.hits) == (3, 1)


def test_static_argnames_positional_parameter() -> None:
    def fn(a, axis):
        return a.max(axis=axis)

    f = jitop.kernel(fn, static_argnames=("axis",))
    a = np.arange(12.0).reshape(3, 4)
    assert_same(jit_call(f, a, 1), fn(a, 1))
    assert_same(jit_call(f, a, axis=1), fn(a, 1))
    assert_same(jit_call(f, a, axis=0), fn(a, 0))
    assert f.misses == 2 or f.misses == 3  # positional and keyword spellings may or may not share an entry


def test_static_unhashable_value_works() -> None:
    def fn(a, axes):
        return a.sum(axis=tuple(axes))

    f = jitop.kernel(fn, static_argnums=(1,))
    a = np.arange(24.0).reshape(2, 3, 4)
    assert_same(jit_call(f, a, [0, 2]), fn(a, [0, 2]))
    assert_same(jit_call(f, a, [1]), fn(a, [1]))


def test_keyword_only_parameters_compile() -> None:
    # fell back as an internal error ('takes 1 positional argument but 2 were given') until 2888c19
    def kw(a, *, scale=2.0):
        return a * scale

    k = jitop.kernel(kw)
    a = np.arange(4.0)
    assert_same(jit_call(k, a), kw(a))
    assert_same(jit_call(k, a, scale=3.0), kw(a, scale=3.0))
    assert k.misses == 1


def test_var_positional_parameters_give_numpy_answer() -> None:
    def var(*arrays):
        return arrays[0] + arrays[1] + arrays[2]

    a = np.arange(4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jitop.JitopFallbackWarning)  # *args: compiled or a named fallback
        assert_same(jitop.kernel(var)(a, a, a), var(a, a, a))


def test_default_scalar_argument_gives_numpy_answer() -> None:
    # a defaulted Python scalar is a runtime value like any other scalar argument
    def fn(a, axis=-1, eps=1e-5):
        return a / (a.sum(axis=axis, keepdims=True) + eps)

    a = np.arange(1.0, 13.0).reshape(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jitop.JitopFallbackWarning)
        assert_same(jitop.kernel(fn)(a), fn(a), 1e-15)
    f = jitop.kernel(fn, static_argnames=("axis",))
    assert_same(jit_call(f, a), fn(a), 1e-15)
    assert_same(jit_call(f, a, eps=0.5), fn(a, eps=0.5), 1e-15)
    assert_same(jit_call(f, a, 0, 0.5), fn(a, 0, 0.5), 1e-15)


# ** shapes and dtypes are separate signatures **

def test_different_shapes_and_dtypes_compile_separately() -> None:
    @jitop.kernel
    def f(a):
        return np.exp(a) - a.mean(axis=0)
    arrays = [np.ones((3, 4)), np.ones((4, 3)), np.ones((3, 4), np.float32), np.ones((12,)), np.ones((3, 4)) * 2,
              np.arange(12).reshape(3, 4), np.ones((1, 4))]
    for x in arrays:
        assert_same(jit_call(f, x), f.fn(x), 1e-6)
    assert f.misses == 6 and f.hits == 1
    for x in arrays:  # every signature is still cached
        assert_same(jit_call(f, x), f.fn(x), 1e-6)
    assert f.misses == 6


# ** argument layouts **

def _layouts():
    base = np.arange(120.0).reshape(10, 12)
    ro = base.copy()
    ro.setflags(write=False)
    raw = np.zeros(8 * 13 + 1, np.uint8)
    unaligned = np.frombuffer(raw.data, dtype=np.float64, count=12, offset=1).reshape(3, 4)
    unaligned_b = np.frombuffer(raw.data, dtype=np.float64, count=12, offset=1).reshape(3, 4)
    return {
        "step slices": (base[::3, ::3][:3], base[1::2, ::3][:4]),
        "transposes": (base[:4, :3].T, base[:4, :4].T),
        "negative strides": (base[::-3, ::-3][:3], base[::-2, ::-3][:4]),
        "fortran order": (np.asfortranarray(base[:3, :4]), np.asfortranarray(base[:4, :4])),
        "broadcast views (zero strides)": (np.broadcast_to(np.arange(4.0), (3, 4)),
                                           np.broadcast_to(np.arange(4.0)[:, None], (4, 4))),
        "read-only": (ro[:3, :4], ro[:4, :4]),
        "unaligned": (unaligned, np.vstack([unaligned_b, unaligned_b[:1]])),
        "0-d views": (base[0, :4][None, :].repeat(3, axis=0), base[:4, 0][:, None] * np.ones(4)),
    }


@pytest.mark.parametrize("layout", list(_layouts()))
def test_non_contiguous_and_read_only_inputs(layout: str) -> None:
    @jitop.kernel
    def f(a, b):
        return a * 2 + b.sum(axis=0), (b @ a.T).T
    a, b = _layouts()[layout]
    before = (a.copy(), b.copy())
    assert_same(jit_call(f, a, b), f.fn(a, b), 1e-13)
    np.testing.assert_array_equal(a, before[0])  # inputs are not written
    np.testing.assert_array_equal(b, before[1])


def test_layouts_share_one_signature() -> None:
    @jitop.kernel
    def f(a):
        return a + 1
    base = np.arange(24.0).reshape(4, 6)
    for x in (base[:, :3], base[:, ::2], base[:, 3:].copy(), np.asfortranarray(base[:, :3]), base.T[:3].T):
        assert_same(jit_call(f, x), x + 1)
    assert f.misses == 1


def test_non_native_byte_order_input() -> None:  # a WRONG ANSWER until 2888c19
    @jitop.kernel
    def f(a, b):
        return a * 2 + b
    x = np.arange(5.0).astype(">f8")
    i = np.arange(5).astype(">i4")
    assert_same(f(x, 1.0), f.fn(x, 1.0))
    assert_same(f(i, 1), f.fn(i, 1))


def test_masked_array_input_gives_numpy_answer() -> None:
    # was a WRONG ANSWER (mask dropped) until 2888c19; now an ndarray subclass runs as numpy, with a warning
    @jitop.kernel
    def f(a):
        return a * 2 + 1
    m = np.ma.masked_array(np.arange(5.0), mask=[0, 1, 0, 0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jitop.JitopFallbackWarning)
        got = f(m)
    expected = f.fn(m)
    assert type(got) is type(expected)
    np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(expected))


def test_ndarray_subclass_result_type() -> None:
    @jitop.kernel
    def f(a):
        return a * 2 + 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        warnings.simplefilter("ignore", jitop.JitopFallbackWarning)
        m = np.matrix([[1.0, 2.0], [3.0, 4.0]])
        assert type(f(m)) is type(f.fn(m))


# ** threads **

def test_eight_threads_at_once_give_correct_results() -> None:
    @jitop.kernel
    def f(a, s):
        return np.sqrt(a * s) + a.sum(axis=-1, keepdims=True)
    rng = np.random.default_rng(0)
    big = [rng.random((260, 520)) for _ in range(4)]   # > 1 MB outputs: the recycled-buffer path
    small = [rng.random((7, 9)) for _ in range(4)]

    def work(i: int):
        out = []
        for k in range(6):
            a = (big if (i + k) % 2 else small)[(i + k) % 4]
            out.append((a, float(i), f(a, float(i))))
        return out

    with cf.ThreadPoolExecutor(8) as ex:
        results = [r for chunk in ex.map(work, range(16)) for r in chunk]
    for a, s, got in results:  # checked only after every thread finished: a recycled buffer would show
        np.testing.assert_allclose(got, f.fn(a, s), rtol=1e-14)
    assert f.misses == 2


def test_threads_compiling_different_signatures_at_once() -> None:
    @jitop.kernel(dynamic=False)  # a kernel per shape
    def f(a):
        return (a * 3).sum(axis=0) - a.min()
    shapes = [(n, 5) for n in range(1, 9)]

    def work(n: int):
        a = np.arange(n * 5, dtype=np.float64).reshape(n, 5)
        return a, f(a)

    with cf.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(work, [s[0] for s in shapes] * 3))
    for a, got in results:
        assert_same(got, f.fn(a))
    assert f.misses == len(shapes)


def test_threads_with_a_falling_back_function() -> None:
    @jitop.kernel
    def f(a):
        return a[a > 2] * 2

    def work(i: int):
        a = np.arange(float(i % 5 + 3))
        return a, f(a)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jitop.JitopFallbackWarning)
        with cf.ThreadPoolExecutor(8) as ex:
            results = list(ex.map(work, range(24)))
    for a, got in results:
        assert_same(got, f.fn(a))


# ** results are fresh arrays **

@pytest.mark.parametrize("shape", [(5,), (600, 500)], ids=["small", "over-1MB"])
def test_mutating_a_result_does_not_affect_the_next_call(shape) -> None:
    @jitop.kernel
    def f(a):
        return a * 2, a.sum(axis=0, keepdims=True)
    a = np.ones(shape)
    r1 = f(a)
    r1[0][...] = -1
    r1[1][...] = -1
    r2 = f(a)
    assert_same(r2, f.fn(a))
    del r1
    r3 = f(a)
    assert_same(r3, f.fn(a))


@pytest.mark.parametrize("shape", [(5,), (600, 500)], ids=["small", "over-1MB"])
def test_held_result_is_not_overwritten_by_the_next_call(shape) -> None:
    @jitop.kernel
    def f(a):
        return a * 2
    a, b = np.ones(shape), np.full(shape, 5.0)
    r1 = f(a)
    r2 = f(b)
    assert r1 is not r2 and not np.shares_memory(r1, r2)
    assert (r1 == 2).all() and (r2 == 10).all()
    view = f(a)[1:]            # only a view of the result is held
    in_dict = {"r": f(a)}      # the result is held in a container
    in_tuple = (f(a),)
    mem = memoryview(f(a))     # a buffer export holds it too
    for _ in range(3):
        f(b)
    assert (view == 2).all() and (in_dict["r"] == 2).all() and (in_tuple[0] == 2).all()
    assert (np.asarray(mem) == 2).all()


def test_result_that_is_an_input_is_a_copy() -> None:
    @jitop.kernel
    def f(a, b):
        return a, b.T, a.reshape(-1)
    a, b = np.arange(6.0).reshape(2, 3), np.arange(4.0).reshape(2, 2)
    r = jit_call(f, a, b)
    assert_same(r, f.fn(a, b))
    for x in r:
        assert not np.shares_memory(x, a) and not np.shares_memory(x, b)
    r[0][0, 0] = 100
    assert a[0, 0] == 0


def test_equal_results_are_independent_arrays() -> None:
    @jitop.kernel
    def f(a):
        return a + 1, a + 1
    r = jit_call(f, np.arange(3.0))
    assert r[0] is not r[1]
    r[0][0] = 99
    assert r[1][0] == 1


def test_same_result_object_returned_twice_is_fine() -> None:
    @jitop.kernel
    def f(a):
        y = a + 1
        return y, y
    r = jit_call(f, np.arange(3.0))
    assert_same(r, (np.arange(3.0) + 1,) * 2)


def test_explain_prints_and_does_not_disturb_dispatch(capsys) -> None:
    @jitop.kernel
    def f(a, b):
        return np.tanh(a @ b + 1).sum(axis=0)
    a, b = np.ones((3, 4)), np.ones((4, 5))
    text = f.explain(a, b)
    assert isinstance(text, str) and text and text in capsys.readouterr().out
    assert_same(jit_call(f, a, b), f.fn(a, b), 1e-14)
    assert f.misses == 1
    assert isinstance(jitop.explain(f, a, b), str)


@jitop.kernel
def _inner(x):
    return np.tanh(x) * 2


def test_kernel_called_inside_a_kernel_gives_numpy_answer() -> None:
    @jitop.kernel
    def outer(a, b):
        return _inner(a) + _inner(b).sum()
    a, b = np.arange(3.0), np.ones(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jitop.JitopFallbackWarning)
        assert_same(outer(a, b), np.tanh(a) * 2 + (np.tanh(b) * 2).sum(), 1e-14)


def test_kernel_called_inside_a_kernel_compiles_without_warning() -> None:
    @jitop.kernel
    def _inner2(x):
        return np.tanh(x) * 2

    @jitop.kernel
    def outer(a):
        return _inner2(a) + 1
    a = np.arange(3.0)
    assert_same(jit_call(outer, a), np.tanh(a) * 2 + 1, 1e-14)


def test_explain_of_a_falling_back_signature() -> None:
    @jitop.kernel
    def f(a):
        return np.sort(a)
    with pytest.warns(jitop.JitopFallbackWarning):
        text = f.explain(np.ones(3))
    assert "numpy" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error", jitop.JitopFallbackWarning)  # warned once already
        assert_same(f(np.array([3.0, 1.0])), np.array([1.0, 3.0]))


def test_keyword_arguments_bind_by_name() -> None:
    @jitop.kernel
    def f(a, b):
        return a - 2 * b
    x, y = np.arange(3.0), np.ones(3)
    assert_same(jit_call(f, b=y, a=x), x - 2 * y)
    assert_same(jit_call(f, x, b=y), x - 2 * y)
    assert_same(jit_call(f, x, y), x - 2 * y)


def test_wrong_number_of_arguments_raises_type_error() -> None:
    @jitop.kernel
    def f(a, b):
        return a + b
    with pytest.raises(TypeError):
        f(np.ones(3))
    with pytest.raises(TypeError):
        f(np.ones(3), np.ones(3), np.ones(3))


def test_a_parameter_learned_static_by_an_earlier_process_takes_an_array(private_cache) -> None:
    """An earlier process's call used a Python scalar for `a` as a size, so `a` is static on use from the first
    call here: for Python scalars only. An array given for it is traced and compiled (once for its shape), not
    keyed by identity; the recompile after loading the learned parameters once crashed on that key (a TypeError:
    unhashable type 'numpy.ndarray')."""
    from jitop.graph import kernel_cache

    def fn(a, b):
        return a * b

    f = jitop.kernel(fn)
    kernel_cache.save_static(f.qualified_name, f._code_digest(), ["a"])
    a, b = np.arange(6.0).reshape(2, 3), np.float64(2.0)
    g = jitop.kernel(fn)
    assert_same(jit_call(g, a, b), fn(a, b))
    assert_same(jit_call(g, a + 1, b), fn(a + 1, b))
    assert g.static == {"a"} and g.traces == 1
    assert_same(jit_call(g, 3, b), fn(3, b))  # a Python scalar: keyed by its value
