"""Scalar tensor expressions: hash-consing, numpy 2 (NEP 50) promotion, constant folding, keys, errors.

No kernel is compiled here: these tests exercise jitop.te only.
"""
from __future__ import annotations

import itertools
import operator
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from jitop import te
from jitop.te.expr import Op

REPO = Path(__file__).resolve().parents[2]
DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64"]
PAIRS = list(itertools.product(DTYPES, DTYPES))


def np_dtype(fn, *args) -> str:
    """The dtype numpy gives `fn` on these operands (arrays of one element or Python scalars)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return np.asarray(fn(*args)).dtype.name


def arr(dt: str) -> np.ndarray:
    return np.ones(1, dt)


# ---------------------------------------------------------------------------------------------
# hash-consing
# ---------------------------------------------------------------------------------------------

def test_same_expression_built_twice_is_the_same_object():
    A = te.placeholder((4, 5), "float32", "A")
    i, j = te.var("i"), te.var("j")
    e1 = te.exp(A[i, j] * 2.0 + 1) / (A[j, i] - 3)
    e2 = te.exp(A[i, j] * 2.0 + 1) / (A[j, i] - 3)
    assert e1 is e2
    assert hash(e1) == hash(e2)
    assert e1.key == e2.key


def test_shared_subexpressions_are_shared_nodes():
    x = te.var("x", "float32")
    s = te.tanh(x * x)
    e = s + s * 2.0
    assert e.src[0] is e.src[1].src[0]


def test_distinct_constants_never_merge():
    # 1 == 1.0 == True in Python, 0.0 == -0.0: they must stay different nodes
    assert te.const(1) is not te.const(1.0)
    assert te.const(1) is not te.const(True)
    assert te.const(0.0) is not te.const(-0.0)
    assert te.const(1, "int32") is not te.const(1, "int64")
    assert te.const(np.nan) is te.const(np.nan)
    assert te.const(2.5, "float32") is te.const(2.5, "float32")


def test_variables_are_distinct_even_with_the_same_name():
    a, b = te.var("x"), te.var("x")
    assert a is not b
    assert (a + 1) is not (b + 1)


def test_expr_nodes_are_immutable_and_not_picklable():
    import pickle
    x = te.var("x")
    with pytest.raises(AttributeError):
        x.op = Op.ADD
    with pytest.raises(TypeError, match="key"):
        pickle.dumps(x + 1)


# ---------------------------------------------------------------------------------------------
# dtype promotion: numpy 2 / NEP 50
# ---------------------------------------------------------------------------------------------

_ARITH = {"+": operator.add, "*": operator.mul, "-": operator.sub}


@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_binary_promotion_matches_numpy_for_every_pair(a, b):
    x, y = te.var("x", a), te.var("y", b)
    for sym, fn in _ARITH.items():
        if sym == "-" and a == b == "bool":
            continue  # numpy refuses bool - bool; see test_bool_minus_bool_is_an_error
        assert fn(x, y).dtype.name == np.result_type(np.dtype(a), np.dtype(b)).name, sym
        assert fn(x, y).dtype.name == np_dtype(fn, arr(a), arr(b)), sym
    # true division: integers (and bool) give float64, floats keep numpy's promotion
    assert (x / y).dtype.name == np_dtype(operator.truediv, arr(a), arr(b))
    # comparisons give bool
    for fn in (operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne):
        assert fn(x, y).dtype.name == "bool"
    # elementwise te.max/te.min promote like np.maximum/np.minimum
    assert te.max(x, y).dtype.name == np_dtype(np.maximum, arr(a), arr(b))
    assert te.min(x, y).dtype.name == np_dtype(np.minimum, arr(a), arr(b))


@pytest.mark.parametrize("a,b", [p for p in PAIRS if "bool" not in p and "float32" not in p and "float64" not in p],
                         ids=lambda p: p)
def test_integer_only_operators_promote_like_numpy(a, b):
    x, y = te.var("x", a), te.var("y", b)
    for fn in (operator.floordiv, operator.mod, operator.and_, operator.or_, operator.xor,
               operator.lshift, operator.rshift):
        if np.result_type(np.dtype(a), np.dtype(b)).kind == "f":
            continue  # signed with uint64 promotes to float64: see test_bitwise_operators_on_floats_raise
        assert fn(x, y).dtype.name == np_dtype(fn, arr(a), arr(b)), fn.__name__
    if np.result_type(np.dtype(a), np.dtype(b)).kind == "f":
        assert (x // y).dtype.name == np_dtype(operator.floordiv, arr(a), arr(b)) == "float64"


def test_true_division_of_integers_is_float64():
    for dt in ["bool", "int8", "uint8", "int32", "int64", "uint64"]:
        assert (te.var("x", dt) / te.var("y", dt)).dtype.name == "float64"
    assert (te.var("x", "int32") / 2).dtype.name == "float64"
    assert (7 / te.var("y", "uint16")).dtype.name == "float64"
    assert (te.var("x", "float32") / te.var("y", "int8")).dtype.name == "float32"
    assert (te.var("x", "float32") / 2).dtype.name == "float32"


SCALARS = [0, 1, -1, 100, 2.5, -0.0, True, False]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("scalar", SCALARS, ids=repr)
def test_python_scalars_are_weak(dt, scalar):
    x = te.var("x", dt)
    fits = not (np.dtype(dt).kind == "u" and scalar == -1 and not isinstance(scalar, float))
    for sym, fn in _ARITH.items():
        try:
            expected = np_dtype(fn, arr(dt), scalar)
        except (TypeError, OverflowError):
            continue  # numpy refuses (e.g. uint8 + -1, bool - True); covered elsewhere
        assert fn(x, scalar).dtype.name == expected, (sym, "right")
        assert fn(scalar, x).dtype.name == np_dtype(fn, scalar, arr(dt)), (sym, "left")
        if not isinstance(scalar, bool):
            assert fn(x, scalar).dtype.name == np.result_type(np.dtype(dt), scalar).name
    if fits:  # out-of-range comparisons: test_out_of_range_python_int_in_comparison_and_true_division
        assert (x < scalar).dtype.name == "bool"
        assert (x / scalar).dtype.name == np_dtype(operator.truediv, arr(dt), scalar)


def test_weak_scalar_examples():
    assert (te.var("x", "int8") + 1).dtype.name == "int8"
    assert (te.var("x", "uint8") * 2).dtype.name == "uint8"
    assert (te.var("x", "float32") * 2.0).dtype.name == "float32"
    assert (te.var("x", "int32") + 1.5).dtype.name == "float64"
    assert (te.var("x", "int16") + 1.5).dtype.name == "float64"
    assert (te.var("x", "bool") + 1).dtype.name == "int64"
    assert (te.var("x", "bool") + 1.0).dtype.name == "float64"
    # numpy scalars are strong
    assert (te.var("x", "float32") * np.float64(2.0)).dtype.name == "float64"
    assert (te.var("x", "int8") + np.int32(1)).dtype.name == "int32"


def test_python_int_out_of_range_for_the_dtype_raises_like_numpy():
    with pytest.raises(OverflowError):
        np.ones(1, "uint8") + 300
    with pytest.raises(OverflowError, match="300"):
        te.var("x", "uint8") + 300
    with pytest.raises(OverflowError):
        te.var("x", "int8") * -200


def test_out_of_range_python_int_in_comparison_and_true_division():
    x = te.var("x", "uint8")
    assert (x < -1).dtype.name == "bool"
    assert (x == 300).dtype.name == "bool"
    assert (x / 300).dtype.name == "float64"


def test_bool_minus_bool_is_an_error():
    with pytest.raises(TypeError):
        np.ones(1, bool) - np.ones(1, bool)
    with pytest.raises(TypeError):
        te.var("a", "bool") - te.var("b", "bool")


def test_bool_integer_operators_promote_to_int8():
    a, b = te.var("a", "bool"), te.var("b", "bool")
    for fn in (operator.floordiv, operator.mod, operator.lshift, operator.rshift):
        assert fn(a, b).dtype.name == np_dtype(fn, arr("bool"), arr("bool")) == "int8", fn.__name__


def test_bitwise_operators_on_floats_raise():
    x = te.var("x", "float32")
    for fn in (operator.and_, operator.or_, operator.xor):
        with pytest.raises(TypeError):
            fn(x, x)
    # int64 & uint64 promotes to float64 in numpy, which has no bitwise and
    with pytest.raises(TypeError):
        np.ones(1, "int64") & np.ones(1, "uint64")
    with pytest.raises(TypeError):
        te.var("a", "int64") & te.var("b", "uint64")


def test_shifts_on_floats_raise():
    x = te.var("x", "float64")
    with pytest.raises(TypeError, match="float64"):
        x << 1
    with pytest.raises(TypeError):
        x >> te.var("y", "int32")


def test_intrinsics_turn_integers_into_float64_and_keep_float32():
    assert te.exp(te.var("x", "float32")).dtype.name == "float32"
    assert te.exp(te.var("x", "int32")).dtype.name == "float64"
    assert te.sqrt(te.var("x", "int64")).dtype.name == "float64"
    assert te.pow(te.var("x", "float32"), 2).dtype.name == "float32"
    assert te.isnan(te.var("x", "float32")).dtype.name == "bool"
    assert te.floor(te.var("x", "int32")).dtype.name == "int32"


def test_select_promotes_both_branches():
    c = te.var("c", "bool")
    assert te.if_then_else(c, te.var("a", "int8"), te.var("b", "int16")).dtype.name == "int16"
    assert te.if_then_else(c, te.var("a", "int8"), 1.5).dtype.name == "float64"
    assert te.if_then_else(c, te.var("a", "float32"), 0.0).dtype.name == "float32"


def test_cast_and_astype():
    x = te.var("x", "float64")
    assert te.cast(x, "int8").dtype.name == "int8"
    assert x.astype(np.float32).dtype.name == "float32"
    assert te.cast(x, "float64") is x
    # constant casts fold with numpy's semantics (wrap-around for integers)
    assert te.cast(te.const(300), "uint8").value == 44
    assert te.cast(te.const(-1), "uint16").value == 65535
    assert te.cast(te.const(2.75), "int32").value == 2
    with pytest.raises(TypeError, match="float16"):
        te.cast(x, "float16")


# ---------------------------------------------------------------------------------------------
# constant folding
# ---------------------------------------------------------------------------------------------

def test_constant_arithmetic_folds():
    e = te.const(2) + 3
    assert e.op is Op.CONST and e.value == 5 and e.dtype.name == "int64"
    assert (te.const(-7) // 2).value == -4
    assert (te.const(-7) % 2).value == 1
    assert (te.const(7) % -2).value == -1
    assert (te.const(2.0) * 3).value == 6.0
    c = te.const(3) < te.const(4)
    assert c.op is Op.CONST and c.value is True and c.dtype.name == "bool"
    f = te.const(2.5, "float32") * 2
    assert f.op is Op.CONST and f.dtype.name == "float32" and f.value == 5.0


def test_constant_folding_wraps_like_numpy():
    assert (te.const(127, "int8") + te.const(1, "int8")).value == -128
    assert (te.const(200, "uint8") * te.const(2, "uint8")).value == 144
    assert (te.const(3, "uint8") - 5).value == 254
    assert (te.const(-128, "int8") // te.const(-1, "int8")).value == -128


def test_constant_folding_wraps_64_bit():
    assert (te.const(2 ** 62) * 4).value == 0
    assert (te.const(-2 ** 63) - 1).value == 2 ** 63 - 1
    assert (te.const(2 ** 63 + 5, "uint64") * te.const(3, "uint64")).value == (3 * (2 ** 63 + 5)) % 2 ** 64


def test_division_by_zero_is_not_folded_and_does_not_crash():
    e = te.const(5) // 0
    assert e.op is Op.FLOORDIV
    assert (te.const(5) % 0).op is Op.FLOORMOD


def test_nan_comparisons_are_not_folded_to_python_answers():
    # Python's min/max/== with NaN depend on operand order; jitop must leave them to the kernel
    n = te.const(np.nan)
    assert (n == n).op is Op.EQ
    assert te.min(te.const(1.0), n).op is not Op.CONST or np.isnan(te.min(te.const(1.0), n).value)


def test_integer_identities_fold_away():
    i = te.var("i")
    assert i * 1 is i and 1 * i is i
    assert i + 0 is i and 0 + i is i
    assert i - 0 is i
    assert i // 1 is i
    zero = i * 0
    assert zero.op is Op.CONST and zero.value == 0


def test_float_identities_that_are_not_identities_stay():
    x = te.var("x", "float32")
    assert (x + 0.0).op is Op.ADD   # -0.0 + 0.0 is +0.0
    assert (x * 0.0).op is Op.MUL   # nan * 0 is nan


def test_more_constant_folding():
    assert (te.const(7.0) / 2).op is Op.CONST
    assert te.max(te.const(3), 5).op is Op.CONST


# ---------------------------------------------------------------------------------------------
# stable keys
# ---------------------------------------------------------------------------------------------

def _key_expr():
    A = te.placeholder((4, 5), "float32", "A")
    i, j = te.var("i"), te.var("j")
    return te.exp(A[i, j] * 2.0 + 1) - te.if_then_else(i < j, A[j, i], 0.5)


def test_key_is_a_stable_sha256():
    k1, k2 = _key_expr().key, _key_expr().key
    assert k1 == k2
    assert len(k1) == 64 and int(k1, 16) >= 0


def test_key_is_stable_across_processes():
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(REPO)!r})
        import importlib.util
        spec = importlib.util.spec_from_file_location("t", {str(Path(__file__))!r})
        t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t)
        print(t._key_expr().key)
    """)
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == _key_expr().key


def test_key_differs_for_different_expressions():
    x = te.var("x", "float32")
    i = te.var("i")
    exprs = [x + 1, x + 2, x * 1.0, x - 1, 1 - x, te.const(1), te.const(1.0), te.const(True),
             te.const(0.0), te.const(-0.0), te.var("x", "float64") + 1, te.exp(x), te.log(x),
             i + 1, i + te.const(1, "int64"), te.cast(i, "int32"), i < 3, i <= 3]
    keys = [e.key for e in exprs]
    # i + 1 and i + const(1, int64) are the same expression
    assert keys[13] == keys[14]
    del keys[14]
    assert len(set(keys)) == len(keys)


def test_key_of_loads_depends_on_the_tensor_not_just_its_name():
    A3 = te.placeholder((3,), "float32", "A")
    A4 = te.placeholder((4,), "float32", "A")
    i = te.var("i")
    assert A3[i].key != A4[i].key
    c1 = te.compute((3,), lambda k: A3[k] + 1.0)
    c2 = te.compute((3,), lambda k: A3[k] * 2.0)
    assert c1[i].key != c2[i].key


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------

def test_bool_of_symbolic_expression_raises_helpful_typeerror():
    i = te.var("i")
    A = te.placeholder((8,), "float32", "A")
    for e in (i < 3, A[i] > 0.0, A[i] + 1.0, te.logical_and(i > 0, i < 5)):
        with pytest.raises(TypeError) as info:
            bool(e)
        msg = str(info.value)
        assert "if_then_else" in msg and "unknown until the kernel runs" in msg
    with pytest.raises(TypeError, match="if_then_else"):
        if i > 0:  # noqa: SIM108 - this is the mistake under test
            pass
    with pytest.raises(TypeError):
        te.compute((8,), lambda k: A[k] if k > 0 else 0.0)


def test_python_equality_test_on_symbolic_indices_raises():
    with pytest.raises(TypeError, match="if_then_else"):
        te.compute((3, 3), lambda i, j: 1.0 if i == j else 0.0, name="eye")


def test_indexing_with_wrong_number_of_indices():
    A = te.placeholder((4, 5), "float32", "A")
    i = te.var("i")
    with pytest.raises(IndexError) as info:
        A[i]
    msg = str(info.value)
    assert "'A'" in msg and "2" in msg and "(4, 5)" in msg and "1" in msg
    with pytest.raises(IndexError):
        A[i, i, i]
    with pytest.raises(IndexError):
        te.compute((4,), lambda k: A[k], name="B")


def test_float_index_raises_typeerror():
    A = te.placeholder((4, 5), "float32", "A")
    i = te.var("i")
    with pytest.raises(TypeError, match="integer"):
        A[i, 1.5]
    with pytest.raises(TypeError, match="integer"):
        A[i, te.var("f", "float32")]


def test_integer_like_indices_are_accepted():
    A = te.placeholder((4, 5), "float32", "A")
    i = te.var("i", "int32")
    e = A[i, np.int64(2)]
    assert e.op is Op.LOAD and e.dtype.name == "float32"
    assert all(s.dtype.name == "int64" for s in e.src)


def test_non_numbers_in_expressions_raise():
    x = te.var("x", "float32")
    with pytest.raises(TypeError, match="str"):
        x + "1"
    with pytest.raises(TypeError, match="float16|not supported"):
        te.placeholder((3,), "float16", "H")
    with pytest.raises(ValueError, match="shape"):
        te.placeholder((3, -1), "float32", "N")


def test_fcompute_arity_mismatch():
    A = te.placeholder((4, 5), "float32", "A")
    with pytest.raises(TypeError, match="2 dimensions"):
        te.compute((4, 5), lambda i: A[i, 0])


def test_reduction_must_be_the_whole_body():
    A = te.placeholder((4, 5), "float32", "A")
    k = te.reduce_axis((0, 5), "k")
    with pytest.raises(ValueError, match="whole body"):
        te.compute((4,), lambda i: te.sum(A[i, k], axis=k) + 1.0)
    with pytest.raises(TypeError, match="reduce_axis"):
        te.compute((4,), lambda i: te.sum(A[i, 0], axis=[te.var("j")]))
