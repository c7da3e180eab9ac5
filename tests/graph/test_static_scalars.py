"""A Python scalar argument is a run-time value of the kernel (a new value does not recompile), unless its value
is needed while tracing: as a size (np.split's sections, a reshape, range()), an index, int(). Then its parameter
becomes static, as torch.compile specialises an int used as a size (JAX asks for static_argnames): the call is
traced again with the value, one compile per value, later values keyed by it. Where the scalar is not a whole
parameter (inside a list, a *args tuple), the error says to mark it static."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import jitop

# each test's own persistent cache: a parameter made static on use is remembered there for the next process
pytestmark = pytest.mark.usefixtures("private_cache")


def heads(x, n_head):
    return np.hstack([np.tanh(h).sum(axis=-1, keepdims=True) for h in np.split(x, n_head, axis=-1)])


def rows(x, n):
    return x.reshape(n, -1) * 2


def first(x, n):
    return sum(x[i] for i in range(n))


def along(x, axis):
    return x.sum(axis=axis)


@pytest.mark.parametrize("fn, values", [(heads, (4, 2, 4, 3)), (rows, (2, 8, 2, 4)), (first, (3, 1, 3, 2)),
                                        (along, (0, 1, 1, -1))])
def test_a_scalar_used_as_a_size_is_made_static_and_keyed_by_value(fn, values):
    x = np.random.default_rng(0).standard_normal((4, 24)).astype(np.float32)
    kf = jitop.kernel(fn, fallback=False)
    seen = set()
    for n in values:
        before = kf.traces
        got, want = kf(x, n), fn(x, n)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * 24)
        # a new value traces (the first call twice: as a run-time value, then static); a seen one does not, unless
        # the parameter became a size symbol since (jitop.shape_policy.IntPolicy: then keyed anew, once)
        assert kf.traces - before == (0 if n in seen else 2 if not seen else 1) or \
            n in seen and kf.traces - before == 1 and kf.int_sizes.demoted
        seen.add(n)
    names = list(kf.signature.parameters)
    assert kf.static == {names[1]}


def test_a_scalar_only_read_as_a_value_stays_a_run_time_argument():
    kf = jitop.kernel(lambda x, s: x * s, fallback=False)
    x = np.ones(5, np.float32)
    for s in (2, 3, 7):
        np.testing.assert_array_equal(kf(x, s), x * s)
    assert kf.traces == 1 and not kf.static


def test_a_scalar_that_is_not_a_whole_parameter_says_to_mark_it_static():
    """Inside a *args tuple the scalar has no parameter of its own to make static: the error names the fix."""
    def star(*args):
        return heads(*args)
    x = np.ones((3, 24), np.float32)
    with pytest.raises(jitop.FallbackError, match=r"np.split's indices_or_sections of a Python scalar.*static_argn"):
        jitop.kernel(star, fallback=False)(x, 4)
    with pytest.warns(jitop.JitopFallbackWarning, match="static_argnames"):
        np.testing.assert_allclose(jitop.kernel(star)(x, 4), heads(x, 4))


def test_a_parameter_made_static_is_remembered_for_the_next_process():
    """A new KernelFunction of the same code (a new process) makes it static before its first trace: one trace
    per value from the first call on. Another version of the code does not inherit it."""
    x = np.random.default_rng(1).standard_normal((4, 24)).astype(np.float32)
    first = jitop.kernel(heads, fallback=False)
    first(x, 4)
    assert first.traces == 2 and first.static == {"n_head"}
    again = jitop.kernel(heads, fallback=False)
    np.testing.assert_allclose(again(x, 3), heads(x, 3), rtol=1e-6, atol=1e-6 * 24)
    assert again.traces == 1 and again.static == {"n_head"}

    def edited(x, n_head):  # the same function edited: its record does not apply
        return np.hstack([np.cos(h).sum(axis=-1, keepdims=True) for h in np.split(x, n_head, axis=-1)])
    edited.__qualname__, edited.__module__ = heads.__qualname__, heads.__module__
    other = jitop.kernel(edited, fallback=False)
    assert other.qualified_name == first.qualified_name
    np.testing.assert_allclose(other(x, 2), edited(x, 2), rtol=1e-6, atol=1e-6 * 24)
    assert other.traces == 2


def test_a_damaged_record_of_static_parameters_is_ignored(private_cache):
    """What was stored is only ever a list of parameter names; anything else is read as nothing learned."""
    from jitop.graph import kernel_cache
    kf = jitop.kernel(rows, fallback=False)
    for bad in (b"not json", b'{"n": 1}', b'["n", 3]', b'["os.system"]'):
        kernel_cache.store().put(kernel_cache._static_key(kf.qualified_name, kf._code_digest()), bad)
        assert kernel_cache.load_static(kf.qualified_name, kf._code_digest()) == []
    x = np.ones((4, 6), np.float32)
    np.testing.assert_array_equal(jitop.kernel(rows, fallback=False)(x, 2), rows(x, 2))


def sum_or_scale(x, n):
    return x.sum(axis=n) if np.ndim(n) == 0 else x * n  # a scalar is an axis, an array a factor


def test_an_array_passed_to_a_parameter_made_static_is_still_traced():
    """Static on use is for the Python scalars that were used as sizes: an array later passed to the same parameter
    is traced and compiled as ever (not keyed by identity and traced anew on every call), in this kernel and in a
    new one that learned the parameter from the persistent cache."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    kf = jitop.kernel(sum_or_scale, fallback=False)
    np.testing.assert_array_equal(kf(x, 1), x.sum(axis=1))
    assert kf.static == {"n"}
    for k in range(3):
        before = kf.traces
        factor = np.full(4, k, np.float32)
        np.testing.assert_array_equal(kf(x, factor), x * factor)
        assert kf.traces - before == (1 if k == 0 else 0)
    again = jitop.kernel(sum_or_scale, fallback=False)
    factor = np.float32(3) * np.ones(4, np.float32)
    np.testing.assert_array_equal(again(x, factor), x * factor)
    np.testing.assert_array_equal(again(x, factor + 1), x * (factor + 1))
    assert again.traces == 0  # (a warm record names the kernel the first one built: jitop.graph.warm)
    np.testing.assert_array_equal(again(x, 0), x.sum(axis=0))  # a scalar is still keyed by its value


def test_an_array_jitop_does_not_compile_falls_back_after_its_parameter_was_made_static():
    """The order the random-call test once met: a Python scalar made `a` static on use (`.tolist()` of it), then
    a new kernel of the same code got a float16 array for `a`: it runs as numpy, with the warning."""
    def listed(a, b):
        return a.tolist()
    first = jitop.kernel(listed)
    with pytest.raises(AttributeError):
        first(3, None)  # numpy's error too: an int has no .tolist()
    assert first.static == {"a"}
    fresh = jitop.kernel(listed)
    with pytest.warns(jitop.JitopFallbackWarning):
        assert fresh(np.array(2.75, np.float16), None) == 2.75


def test_a_static_value_that_changes_every_call_warns_once_with_what_to_do_instead():
    """`range(t)` in the kernel needs t as a Python int: a compile per t. Past the recompile limit, one
    JitopRecompileWarning names t, the line that keeps it static and what to do."""
    f = jitop.kernel(lambda cache, t: sum(cache[i] for i in range(t + 1)))
    cache = np.arange(40.0).reshape(20, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in range(12):
            np.testing.assert_array_equal(f(cache, t), cache[:t + 1].sum(axis=0))
    said = [str(w.message) for w in caught if issubclass(w.category, jitop.JitopRecompileWarning)]
    assert len(said) == 1 and "static parameter(s) t" in said[0] and "range(" in said[0], said
    g = jitop.kernel(lambda x: x[:-1].sum(axis=0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in range(2, 14):
            np.testing.assert_array_equal(g(cache[:t]), cache[:t - 1].sum(axis=0))  # the slice passed: symbolic
    assert not [w for w in caught if issubclass(w.category, jitop.JitopRecompileWarning)] and g.traces <= 2


def test_warn_recompiles_false_is_silent_and_warnings_as_errors_raise_the_warning():
    """A function meant to compile per value (warn_recompiles=False, as the operator library's per-geometry
    kernels) never warns; with warnings made errors, the warning itself reaches the caller (it is not taken for
    a jitop failure and run as numpy with a second warning)."""
    cache = np.arange(40.0).reshape(20, 2)
    quiet = jitop.kernel(lambda cache, t: sum(cache[i] for i in range(t + 1)), warn_recompiles=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in range(12):
            np.testing.assert_array_equal(quiet(cache, t), cache[:t + 1].sum(axis=0))
    assert not [w for w in caught if issubclass(w.category, (jitop.JitopRecompileWarning, jitop.JitopFallbackWarning))]
    strict = jitop.kernel(lambda cache, t: sum(cache[i] for i in range(t + 1)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in range(8):
            strict(cache, t)
        with pytest.raises(jitop.JitopRecompileWarning, match="static parameter"):
            strict(cache, 8)


def test_the_operator_library_never_warns_of_recompiles_per_layer():
    """A network calls conv2d and max_pool2d with many layer geometries: one kernel each, by design, no warning."""
    rng = np.random.default_rng(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for c in range(1, 11):
            x = rng.standard_normal((1, c, 5, 5)).astype(np.float32)
            w = rng.standard_normal((2, c, 3, 3)).astype(np.float32)
            assert jitop.conv2d(x, w, padding=1).shape == (1, 2, 5, 5)
            assert jitop.max_pool2d(x, 2, stride=1 + c % 2).shape[:2] == (1, c)
    assert not [w for w in caught if issubclass(w.category, (jitop.JitopRecompileWarning, jitop.JitopFallbackWarning))]
