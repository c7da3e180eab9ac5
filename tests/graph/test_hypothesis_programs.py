"""Property test: random straight-line numpy programs compile with @jitop.kernel(fallback=False)
and give numpy's answer.

A program is 3-8 operations over 1-3 input arrays (float32 / float64 / int32, shapes with size-1
and size-0 dimensions that broadcast against each other): elementwise ufuncs, broadcasting with
reshaped operands, reductions with random axis/keepdims, transposes, slicing, where and clip. Each
step is evaluated with numpy while it is drawn, so only valid programs are generated; the program
is then written out as Python source, exec'd, decorated and compared with plain numpy.

Exactness is tracked per value: operations that are correctly rounded in IEEE arithmetic (+ - * /
sqrt, max/min, abs, clip, where, shape ops) keep a value "exact", anything else (transcendentals,
summation order) makes it approximate. Comparisons, where-conditions, floor, argmax and int casts
are only applied to exact values, so a 1-ulp difference never flips a branch; exact results are
compared bit for bit, approximate ones with a tolerance relative to the program's magnitude.
"""
from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, note, settings, strategies as st
from hypothesis.extra import numpy as hnp

import jitop

DTYPES = ["float32", "float64", "int32"]
RTOL = {np.dtype("float32"): 1e-4, np.dtype("float64"): 1e-10}


def _input_array(draw, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == "int32":
        elements = st.integers(-50, 50)
    else:
        width = 32 if dtype == "float32" else 64
        elements = st.one_of(st.floats(-5, 5, width=width), st.sampled_from([0.0, -0.0, 1.0, 0.5, np.nan, np.inf]))
    return draw(hnp.arrays(np.dtype(dtype), shape, elements=elements))


class Var:
    def __init__(self, name: str, value: np.ndarray, exact: bool):
        self.name, self.value, self.exact = name, value, exact


# op name -> (arity, template, keeps exactness, needs exact operands, allowed on dtypes kinds)
UNARY = {
    "neg": ("-{x}", True, False),
    "abs": ("np.abs({x})", True, False),
    "square": ("np.square({x})", True, False),
    "sqrt_abs": ("np.sqrt(np.abs({x}))", True, False),
    "exp": ("np.exp({x})", False, False),
    "tanh": ("np.tanh({x})", False, False),
    "sin": ("np.sin({x})", False, False),
    "log1p_abs": ("np.log1p(np.abs({x}))", False, False),
    "floor": ("np.floor({x})", True, True),
    "clip": ("np.clip({x}, -1.5, 2)", True, False),
    "scale": ("{x} * 0.5 + 1", True, False),
    "to_f32": ("{x}.astype(np.float32)", True, False),
    "to_f64": ("{x}.astype(np.float64)", True, False),
    "to_i32": ("np.clip({x}, -1000, 1000).astype(np.int32)", True, True),
    "transpose": (".T", True, False),
    "reverse": ("{x}[::-1]", True, False),
    "step": ("{x}[..., ::2]", True, False),
    "drop_first": ("{x}[1:]", True, False),
    "newaxis": ("{x}[..., None]", True, False),
    "expand0": ("np.expand_dims({x}, 0)", True, False),
    "ravel": ("{x}.reshape(-1)", True, False),
    "is_pos": ("{x} > 0", True, True),
    "center": ("{x} - {x}.mean(axis=-1, keepdims=True)", False, False),
    "softmax": ("np.exp({x} - {x}.max(axis=0, keepdims=True)) / np.exp({x} - {x}.max(axis=0, keepdims=True)).sum(axis=0)",
                False, False),
    "concat": ("np.concatenate([{x}, {x} * 2], axis=-1)", True, False),
    "stack": ("np.stack([{x}, -{x}], axis=0)", True, False),
}
BINARY = {
    "add": ("{x} + {y}", True),
    "sub": ("{x} - {y}", True),
    "mul": ("{x} * {y}", True),
    "div": ("{x} / {y}", True),
    # + 0 turns -0.0 into +0.0: which zero max(+0, -0) returns is unspecified (numpy's own loops differ)
    "maximum": ("np.maximum({x}, {y}) + 0", True),
    "minimum": ("np.minimum({x}, {y}) + 0", True),
    "arctan2": ("np.arctan2({x}, {y})", False),
    "where": ("np.where({x} > {y}, {x}, {y})", True),  # the condition needs exact operands
    "floordiv": ("{x} // {y}", True),                  # floats: exact operands only
}
REDUCE = ["sum", "mean", "max", "min", "std", "argmax"]


def _try(expr: str, env: dict):
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return eval(expr, {"np": np}, env)
        except (ValueError, TypeError, IndexError, np.exceptions.AxisError):
            return None


@st.composite
def programs(draw):
    ndim = draw(st.integers(0, 3))
    base = tuple(draw(st.lists(st.sampled_from([0, 1, 2, 3, 5]), min_size=ndim, max_size=ndim)))
    n_inputs = draw(st.integers(1, 3))
    vars_: list[Var] = []
    for i in range(n_inputs):
        drop = draw(st.integers(0, ndim))
        shape = tuple(1 if draw(st.booleans()) and draw(st.booleans()) else d for d in base[drop:])
        dtype = draw(st.sampled_from(DTYPES))
        vars_.append(Var(f"a{i}", _input_array(draw, dtype, shape), True))
    n_inputs_ = len(vars_)
    lines: list[str] = []
    steps = draw(st.integers(3, 8))
    attempts = 0
    while len(lines) < steps and attempts < 40:
        attempts += 1
        env = {v.name: v.value for v in vars_}
        kind = draw(st.sampled_from(["unary", "unary", "binary", "binary", "reduce"]))
        x = draw(st.sampled_from(vars_))
        if kind == "unary":
            op = draw(st.sampled_from(sorted(UNARY)))
            template, keeps, needs_exact = UNARY[op]
            if needs_exact and not x.exact:
                continue
            if op == "to_i32" and x.value.dtype.kind == "f" and not np.isfinite(x.value).all():
                continue  # casting NaN/inf to int is undefined
            expr = (f"{x.name}.T" if op == "transpose" else template.format(x=x.name))
            exact = x.exact and keeps
        elif kind == "binary":
            op = draw(st.sampled_from(sorted(BINARY)))
            template, keeps = BINARY[op]
            y = draw(st.sampled_from(vars_))
            floaty = x.value.dtype.kind == "f" or y.value.dtype.kind == "f"
            if op == "where" and not (x.exact and y.exact):
                continue
            if op == "floordiv" and floaty and not (x.exact and y.exact):
                continue
            expr = template.format(x=x.name, y=y.name)
            exact = x.exact and y.exact and keeps
            # float division results feed later ops; + - * / of exact values stay exact
        else:
            op = draw(st.sampled_from(REDUCE))
            if x.value.ndim == 0:
                continue
            axis = draw(st.one_of(st.none(), st.integers(-x.value.ndim, x.value.ndim - 1)))
            keep = draw(st.booleans())
            if op == "argmax":
                if not x.exact:
                    continue
                expr = f"np.argmax({x.name}, axis={axis})" if axis is not None else f"np.argmax({x.name})"
                exact = True
            else:
                expr = f"{x.name}.{op}(axis={axis}, keepdims={keep})"
                exact = x.exact and (op in ("max", "min") or x.value.dtype.kind in "iu" and op == "sum")
        value = _try(expr, env)
        if value is None:
            continue
        if np.asarray(value).dtype.name not in ("bool", "int32", "int64", "float32", "float64"):
            continue  # e.g. np.tanh(bool) is float16, which jitop does not have
        name = f"v{len(lines)}"
        lines.append(f"{name} = {expr}")
        vars_.append(Var(name, value, exact))
    assume(len(lines) >= 3)
    outs = [vars_[-1]]
    extra = draw(st.sampled_from(vars_[n_inputs_:]))
    if extra is not outs[0]:
        outs.append(extra)
    params = ", ".join(v.name for v in vars_[:n_inputs_])
    ret = ", ".join(v.name for v in outs)
    src = f"def program({params}):\n" + "".join(f"    {ln}\n" for ln in lines) + f"    return ({ret},)\n"
    return src, [v.value for v in vars_[:n_inputs_]], [v.exact for v in outs], [v.value for v in vars_]


def _compare(got, expected, exact: bool, scale: float, rtol: float) -> None:
    assert type(got) is type(expected), (type(got), type(expected))  # numpy scalar vs 0-d array included
    g, e = np.asarray(got), np.asarray(expected)
    assert g.dtype == e.dtype, (g.dtype, e.dtype)
    assert g.shape == e.shape, (g.shape, e.shape)
    if exact or e.dtype.kind not in "f":
        np.testing.assert_array_equal(g, e, strict=True)
        return
    np.testing.assert_array_equal(np.isnan(g), np.isnan(e), err_msg="NaN positions differ")
    np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol * scale, equal_nan=True)


@settings(max_examples=int(os.environ.get("JITOP_HYPO_EXAMPLES", 40)), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                                  HealthCheck.data_too_large])
@given(programs())
def test_random_program_matches_numpy(prog) -> None:
    check_program(prog, lambda fn: jitop.kernel(fn, fallback=False))


def check_program(prog, compiled) -> None:
    """Run a drawn program with numpy and as `compiled(fn)` (a kernel of it), and compare the results."""
    src, inputs, exact, all_values = prog
    note(src)
    note(f"inputs: {[(a.dtype, a.shape) for a in inputs]}")
    namespace: dict = {"np": np}
    exec(compile(src, "<random program>", "exec"), namespace)
    fn = namespace["program"]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = fn(*[a.copy() for a in inputs])
        got = compiled(fn)(*inputs)
    all_values = [np.asarray(v) for v in all_values]
    finite = [float(np.abs(v[np.isfinite(v)].astype(np.float64)).max()) for v in all_values
              if v.dtype.kind == "f" and v.size and np.isfinite(v).any()]
    scale = 1.0 + (max(finite) if finite else 0.0)
    # an approximate float32 value anywhere in the program limits the accuracy of everything after it
    rtol = max(RTOL.get(v.dtype, 0.0) for v in all_values) or RTOL[np.dtype("float64")]
    assert isinstance(got, tuple) and len(got) == len(expected)
    for g, e, ex in zip(got, expected, exact):
        _compare(g, e, ex, min(scale, 1e300), rtol)


# ** fixed regressions found by the generator **

def test_float_to_int_cast_of_finite_values() -> None:
    @jitop.kernel(fallback=False)
    def f(a):
        return np.clip(a, -1000, 1000).astype(np.int32), a.astype(np.int64), a.astype(np.uint8)
    a = np.array([-2.5, -0.5, 0.0, 0.7, 1.5, 254.9, 999.99, -999.5])
    with np.errstate(all="ignore"):
        for g, e in zip(f(a), f.fn(a)):
            assert g.dtype == e.dtype
            if e.dtype == np.uint8:  # negative floats to unsigned are undefined in C: only the non-negative ones
                np.testing.assert_array_equal(g[a >= 0], e[a >= 0])
            else:
                np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_where_on_broadcast_reshaped_operands(dtype: str) -> None:
    @jitop.kernel(fallback=False)
    def f(a, b):
        c = a.reshape(a.shape + (1,))
        d = np.where(c > b, c, b)
        return d.sum(axis=-1, keepdims=True).T, np.clip(d[..., ::-1], 0, 1).max(axis=0)
    a = np.linspace(-2, 2, 6, dtype=dtype).reshape(2, 3)
    b = np.linspace(-1, 1, 4, dtype=dtype)
    # the sums of 4 terms of |d| <= 2 cancel to ~0 in places: any summation order is within 4 eps of sum |d|
    atol = 4 * np.finfo(dtype).eps * 4 * 2
    for g, e in zip(f(a, b), f.fn(a, b)):
        np.testing.assert_allclose(g, e, rtol=RTOL[np.dtype(dtype)], atol=atol)
        assert g.dtype == e.dtype and g.shape == e.shape


def test_program_source_round_trips() -> None:
    # the generator's output is plain Python that numpy runs: a sanity check of the harness itself
    src = "def program(a0):\n    v0 = a0 * 2\n    v1 = v0.sum(axis=None, keepdims=False)\n    return (v1,)\n"
    ns: dict = {"np": np}
    exec(src, ns)
    assert math.isclose(float(ns["program"](np.arange(3.0))[0]), 6.0)
