"""Pytree arguments and results of @jitop.kernel: `*args`, `**kwargs` and (nested) lists, tuples and dicts of
arrays are traced leaf by leaf, keyed by structure + each leaf's shape/dtype; results come back with the
function's structure (jitop.pytree, jitop.kernel._flatten_params)."""
from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest

import jitop
from jitop.runtime.fastcall import MISS
from kernel_checks import assert_same

rng = np.random.default_rng(0)


def kernel(fn=None, **options):
    """jitop.kernel(fn, fallback=False): running as numpy would make these tests vacuous."""
    if fn is None:
        return lambda f: jitop.kernel(f, fallback=False, **options)
    return jitop.kernel(fn, fallback=False, **options)


def assert_tree(got, want, rtol: float = 1e-12) -> None:
    """Same containers (types, lengths, dict keys in order) and, at the leaves, numpy's kind/dtype/shape/values."""
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            assert_tree(got[k], want[k], rtol)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_tree(g, w, rtol)
    elif isinstance(want, (np.ndarray, np.generic)):
        assert_same(got, want, rtol)
    else:
        assert got == want


def mlp(x, params):
    """A chain of matmul + bias + relu over (w, b) pairs, flat: [w0, b0, w1, b1, ...]."""
    for w, b in zip(params[0::2], params[1::2]):
        x = np.maximum(x @ w + b, 0.0)
    return x


def scale_shift_chain(x, params):
    """mlp's shape with an elementwise scale for the matmul except in the first and last layers: 108 parameters
    compile in well under a second (54 matmul loop nests would take seconds), the argument passing is the same."""
    last = len(params) // 2 - 1
    for k, (w, b) in enumerate(zip(params[0::2], params[1::2])):
        x = np.maximum((x @ w if k in (0, last) else x * w[0]) + b, 0.0)
    return x


def layer_params(n_layers: int, width: int = 8) -> list[np.ndarray]:
    out = []
    for _ in range(n_layers):
        out += [rng.standard_normal((width, width)) / np.sqrt(width), rng.standard_normal(width) * 0.1]
    return out


X = rng.standard_normal((3, 8))
A, B, C = (rng.standard_normal((3, 8)) for _ in range(3))


# ** *args and **kwargs **

def test_var_positional_arrays() -> None:
    @kernel
    def f(x, *ps):
        return x * ps[0] + ps[1] - ps[-1]

    assert_tree(f(X, A, B, C), f.fn(X, A, B, C))
    assert_tree(f(X, B, A, C), f.fn(X, B, A, C))
    assert (f.misses, f.hits) == (1, 1)
    assert_tree(f(X, A, B), f.fn(X, A, B))  # another count of *args: another structure
    assert f.misses == 2


def test_var_keyword_arrays_and_scalars() -> None:
    @kernel
    def f(x, **kw):
        return x * kw["scale"] + kw["shift"]

    assert_tree(f(X, scale=2.0, shift=A), f.fn(X, scale=2.0, shift=A))
    assert_tree(f(X, scale=3.0, shift=B), f.fn(X, scale=3.0, shift=B))  # a float leaf is a runtime value
    assert (f.misses, f.hits) == (1, 1)
    assert_tree(f(X, shift=B, scale=3.0), f.fn(X, shift=B, scale=3.0))  # keyword order is part of the structure
    assert f.misses == 2


def test_var_positional_without_arrays_is_static() -> None:
    # *axes of ints holds no array: the tuple is a constant of the trace, as a tuple argument always was
    @kernel
    def f(x, *axes):
        return x.sum(axis=axes)

    a = rng.standard_normal((2, 3, 4))
    assert_tree(f(a, 0, 2), f.fn(a, 0, 2))
    assert_tree(f(a, 1), f.fn(a, 1))
    assert_tree(f(a), f.fn(a))
    assert f.misses == 3


def test_keyword_only_and_defaults_with_var_positional() -> None:
    @kernel
    def f(x, y=None, *rest, scale=2.0, **named):
        out = x * scale
        if y is not None:
            out = out + y
        for r in rest:
            out = out - r
        return out + sum(named.values()) if named else out

    for args, kwargs in [((X,), {}), ((X, A), {}), ((X, A, B, C), {}), ((X, A, B), {"scale": 0.5}),
                         ((X,), {"y": A, "bias": B})]:
        assert_tree(f(*args, **kwargs), f.fn(*args, **kwargs))


def test_binding_errors_are_pythons() -> None:
    @kernel
    def f(x, y, *, z):
        return x + y + z

    with pytest.raises(TypeError):
        f(X)
    with pytest.raises(TypeError):
        f(X, A)  # z is keyword-only without a default
    with pytest.raises(TypeError):
        f(X, A, B)


# ** nested containers **

def test_nested_list_tuple_dict_argument() -> None:
    @kernel
    def f(x, params):
        h = x @ params["layers"][0][0] + params["layers"][0][1]
        return np.tanh(h) @ params["layers"][1][0] * params["out"]["scale"] + params["out"]["shift"]

    params = {"layers": [(A.T @ B, C[0]), (B.T @ C, None)], "out": {"scale": 0.5, "shift": A[2]}}
    assert_tree(f(X, params), f.fn(X, params))
    params2 = {"layers": [(B.T @ A, A[1]), (C.T @ A, None)], "out": {"scale": 1.5, "shift": B[2]}}
    assert_tree(f(X, params2), f.fn(X, params2))
    assert (f.misses, f.hits) == (1, 1)
    # a container without arrays is a constant of the trace at any depth, keyed by value (as at the top level)
    g = kernel(lambda x, p: np.tanh(x @ p["layers"][0][0]) * p["out"]["scale"])
    for scale in (1.5, 1.5, 2.5):
        params3 = {**params2, "out": {"scale": scale}}
        assert_tree(g(X, params3), g.fn(X, params3))
    assert (g.misses, g.hits) == (2, 1)


def test_namedtuple_and_ordered_dict_arguments() -> None:
    Layer = collections.namedtuple("Layer", "w b")

    @kernel
    def f(x, layer):
        return x @ layer.w + layer.b

    layer = Layer(A.T @ B, C[0])
    assert_tree(f(X, layer), f.fn(X, layer))

    ordered = collections.OrderedDict(w=A.T @ B, b=C[0], settings=collections.OrderedDict(act="relu"))
    g = kernel(lambda x, p: np.maximum(x @ p["w"] + p["b"], 0) if p["settings"]["act"] == "relu" else x)
    assert_tree(g(X, ordered), g.fn(X, ordered))
    assert_tree(g(X, ordered), g.fn(X, ordered))
    assert (g.misses, g.hits) == (1, 1)


def test_same_structure_and_shapes_do_not_retrace() -> None:
    f = kernel(mlp)
    ps = layer_params(3)
    for _ in range(3):
        ps = [p + 1e-3 for p in ps]
        assert_tree(f(X, ps), mlp(X, ps))
    assert (f.misses, f.hits) == (1, 2)


@pytest.mark.parametrize("change", ["list to tuple", "longer", "shape", "dtype", "dict key", "leaf kind"])
def test_a_structure_change_retraces(change: str) -> None:
    @kernel
    def f(x, p):
        out = x
        for v in (p.values() if isinstance(p, dict) else p):
            out = out + v
        return out

    base = [A, B]
    changed = {"list to tuple": (A, B), "longer": [A, B, C], "shape": [A, B[:1]], "dtype": [A, B.astype(np.float32)],
               "dict key": {"a": A, "c": B}, "leaf kind": [A, 2.0]}[change]
    first = {"a": A, "b": B} if change == "dict key" else base
    assert_tree(f(X, first), f.fn(X, first))
    assert_tree(f(X, changed), f.fn(X, changed))
    assert_tree(f(X, first), f.fn(X, first))
    assert (f.misses, f.hits) == (2, 1)


def test_scalars_inside_containers_are_runtime_values() -> None:
    @kernel
    def f(x, cfg):
        return x * cfg["alpha"] + cfg["beta"][0] * cfg["beta"][1]

    for alpha, beta in [(2.0, 3), (0.5, -1), (1.0, np.float64(2.0))]:
        cfg = {"alpha": alpha, "beta": [beta, A]}
        assert_tree(f(X, cfg), f.fn(X, cfg))
    assert f.misses == 2  # a numpy float64 is a leaf of another kind than a Python int


def test_array_free_container_inside_is_static() -> None:
    # a shape tuple or a string inside a container of arrays is a constant of the trace, keyed by value
    @kernel
    def f(spec):
        y = spec["x"].reshape(spec["shape"])
        return y.sum(axis=0) if spec["mode"] == "sum" else y.max(axis=0)

    a = np.arange(12.0)
    for shape, mode in [((3, 4), "sum"), ((3, 4), "sum"), ((4, 3), "sum"), ((4, 3), "max")]:
        spec = {"x": a, "shape": shape, "mode": mode}
        assert_tree(f(spec), f.fn(spec))
    assert (f.misses, f.hits) == (3, 1)


def test_unsupported_leaf_falls_back_naming_it() -> None:
    class Config:
        scale = 2.0

    def fn(p):
        return p[0] * p[1].scale

    f = jitop.kernel(fn)
    with pytest.warns(jitop.JitopFallbackWarning, match=r"argument p\[1\] is a Config"):
        assert_tree(f([A, Config()]), fn([A, Config()]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning per construct; the signature runs as numpy from now on
        assert_tree(f([B, Config()]), fn([B, Config()]))
    assert f.misses == 1
    with pytest.raises(jitop.FallbackError, match=r"p\[1\]"):
        kernel(fn)([A, Config()])


# ** results **

def test_dict_tuple_list_results() -> None:
    @kernel
    def f(p):
        h = p["x"] @ p["w"]
        return {"h": h, "stats": (h.sum(), [h.max(axis=0), np.float64(2.0)]), "n": 3, "name": "out"}

    p = {"x": X, "w": A.T @ B}
    assert_tree(f(p), f.fn(p))
    assert_tree(f(p), f.fn(p))


def test_result_structure_follows_argument_structure() -> None:
    @kernel
    def double(tree):
        if isinstance(tree, dict):
            return {k: double.fn(v) for k, v in tree.items()}
        if isinstance(tree, (list, tuple)):
            return type(tree)(double.fn(v) for v in tree)
        return tree * 2

    tree = {"a": [A, (B, C)], "b": {"c": X}}
    assert_tree(double(tree), double.fn(tree))


# ** static arguments **

def test_static_argnames_with_pytree_arguments() -> None:
    @kernel(static_argnames=("act",))
    def f(x, params, act):
        h = mlp(x, params)
        return np.tanh(h) if act == "tanh" else h

    ps = layer_params(2)
    assert_tree(f(X, ps, "tanh"), f.fn(X, ps, "tanh"))
    assert_tree(f(X, ps, act="relu"), f.fn(X, ps, act="relu"))
    assert_tree(f(X, ps, "tanh"), f.fn(X, ps, "tanh"))
    assert f.misses == 2


def test_static_argnums_names_a_parameter_not_a_call_position() -> None:
    # static_argnums=(1,) is the *axes parameter: the whole tuple is static (no array may be in it)
    @kernel(static_argnums=(1,))
    def f(x, *axes):
        return x.sum(axis=axes) if axes else x * 1.0

    a = rng.standard_normal((2, 3, 4))
    assert_tree(f(a, 0, 2), f.fn(a, 0, 2))
    assert_tree(f(a, 1), f.fn(a, 1))
    assert f.misses == 2


# ** the native entry **

def test_flat_calls_still_take_the_native_entry() -> None:
    @kernel
    def plain(a, b):
        return a * b + 1.0

    @kernel
    def var(x, *ps):
        first = ps[0][0] if isinstance(ps[0], list) else ps[0]
        return x + first * ps[1]

    for f, args in [(plain, (A, B)), (var, (X, A, B))]:
        f(*args)
        f(*args)  # compiled, then learned by the native entry
        assert f.dispatcher.entry(*args) is not MISS, f.__name__
        assert_tree(f(*args), f.fn(*args))
    # a list in the same position: another structure, which the native entry must not serve
    assert var.dispatcher.entry(X, [A], B) is MISS
    assert_tree(var(X, [A], B), var.fn(X, [A], B))


def test_nested_calls_take_the_python_path_with_the_same_answer() -> None:
    f = kernel(mlp)
    ps = layer_params(2)
    f(X, ps)
    f(X, ps)
    assert f.dispatcher.entry(X, ps) is MISS
    assert_tree(f(X, ps), mlp(X, ps))
    assert f.hits == 2


# ** a 108-parameter model, as forward(x, *params) and forward(x, params_list) **

def test_108_parameters_as_var_positional_and_as_a_list() -> None:
    ps = layer_params(54)
    assert len(ps) == 108
    want = scale_shift_chain(X, ps)

    @kernel
    def forward_star(x, *params):
        return scale_shift_chain(x, params)

    @kernel
    def forward_list(x, params):
        return scale_shift_chain(x, params)

    for f, call in [(forward_star, lambda: forward_star(X, *ps)), (forward_list, lambda: forward_list(X, ps))]:
        assert_tree(call(), want, rtol=1e-10)
        assert_tree(call(), want, rtol=1e-10)
        assert (f.misses, f.hits) == (1, 1)
        (entry,) = f.cache.values()
        assert len(entry.trace.inputs) == 109  # one kernel reading x and every parameter


# ** tracing through, captured data, introspection **

def test_called_inside_another_kernel_with_a_list_of_tracers() -> None:
    @kernel
    def inner(ps):
        return ps[0] + ps[1]

    @kernel
    def outer(a, b):
        return inner([a, b * 2]) * 3

    assert_tree(outer(A, B), (A + B * 2) * 3)
    assert inner.misses == 0  # traced through, not compiled on tracers


def test_captured_global_changes_retrace_with_pytree_arguments() -> None:
    scale = np.array([2.0])

    @kernel
    def f(ps):
        return ps["a"] * scale + ps["b"]

    p = {"a": A, "b": B}
    assert_tree(f(p), A * 2.0 + B)
    scale = np.array([3.0])  # noqa: F841 - rebinds the closure cell f reads
    assert_tree(f(p), A * 3.0 + B)


def test_tuning_tasks_and_explain_accept_pytrees() -> None:
    f = kernel(mlp)
    ps = layer_params(2)
    assert len(f.tuning_tasks(X, ps)) == 2
    assert "params" in jitop.explain(f, X, ps)
