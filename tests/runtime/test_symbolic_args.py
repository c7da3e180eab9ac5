"""Argument checks of kernels with symbolic shapes: the dim language, binding, tied-dim errors (no LLVM)."""
import numpy as np
import pytest

from jitop.runtime.args import ParamSpec, ShapeBinder, SymbolSpec, check_array, compile_dim, dim_names
from jitop.runtime.module import check_meta, signature_json

F4 = np.dtype("float32")


@pytest.mark.parametrize("text, env, value", [
    ("n", {"n": 5}, 5), ("n * 2", {"n": 5}, 10), ("(n + 7) // 8", {"n": 9}, 2), ("n % 8", {"n": 9}, 1),
    ("min(8, n - m * 8)", {"n": 20, "m": 2}, 4), ("max(n, 1)", {"n": 0}, 1), ("-n + 3", {"n": 1}, 2),
    ("(n - 8) // 8 + 1", {"n": 3}, 0),
])
def test_compile_dim_evaluates_like_python(text, env, value):
    assert compile_dim(text)(env) == value


@pytest.mark.parametrize("text", ["__import__('os')", "n.real", "n ** 2", "n / 2", "[n]", "abs(n)", "n if n else 1",
                                  "min(n)", "max(n, key=1)", "1.5", "'a'", "n +", "x" * 5000])
def test_compile_dim_refuses_anything_else(text):
    with pytest.raises(ValueError):
        compile_dim(text)


def test_dim_names():
    assert dim_names("min(n, m * 2) + k") == {"n", "m", "k"}


def _binder():
    specs = [ParamSpec("A", F4, ("n", 4), False), ParamSpec("B", F4, ("n",), False),
             ParamSpec("C", F4, ("n * 2", 4), True)]
    return ShapeBinder(specs, [SymbolSpec("n", 0, 0)]), specs


def test_binder_binds_and_checks():
    binder, _ = _binder()
    assert binder.bind([np.zeros((3, 4), F4), np.zeros(3, F4), np.zeros((6, 4), F4)]) == [3]
    assert binder.bind([np.zeros((0, 4), F4), np.zeros(0, F4)]) == [0]
    assert binder.shape(2, [3]) == (6, 4)


def test_tied_dim_mismatch_names_both_arguments():
    binder, _ = _binder()
    with pytest.raises(ValueError, match=r"argument 'B' \(position 1\) dimension 0 is 5, but it must equal "
                                         r"argument 'A' \(position 0\) dimension 0 \(n = 4\)"):
        binder.bind([np.zeros((4, 4), F4), np.zeros(5, F4), np.zeros((8, 4), F4)])


def test_expression_dim_mismatch_says_the_expression():
    binder, _ = _binder()
    with pytest.raises(ValueError, match=r"argument 'C' \(position 2\) dimension 0 is 7, but it must be n \* 2 = 8 "
                                         r"\(n = 4 from argument 'A' \(position 0\) dimension 0\)"):
        binder.bind([np.zeros((4, 4), F4), np.zeros(4, F4), np.zeros((7, 4), F4)])


def test_negative_output_dim_is_refused():
    specs = [ParamSpec("A", F4, ("n",), False), ParamSpec("B", F4, ("n - 1",), True)]
    with pytest.raises(ValueError, match="negative"):
        ShapeBinder(specs, [SymbolSpec("n", 0, 0)]).shape(1, [0])


def test_check_array_checks_rank_and_constant_dims_of_a_symbolic_spec():
    spec = ParamSpec("A", F4, ("n", 4), False)
    check_array(spec, 0, np.zeros((7, 4), F4))
    with pytest.raises(ValueError, match=r"must have shape \(n, 4\), got \(7, 5\)"):
        check_array(spec, 0, np.zeros((7, 5), F4))
    with pytest.raises(ValueError, match=r"must have shape \(n, 4\), got \(7,\)"):
        check_array(spec, 0, np.zeros(7, F4))


@pytest.mark.parametrize("symbols, match", [
    ([], "not a symbol"),                                            # n is never bound
    ([{"name": "n", "param": 1, "dim": 0}], "input dimension"),       # bound from an output
    ([{"name": "n", "param": 0, "dim": 3}], "does not exist"),
    ([{"name": "n", "param": 0, "dim": 0}, {"name": "n", "param": 0, "dim": 0}], "not distinct"),
    ([{"name": "n", "param": 0, "dim": 0, "dtype": "float32"}], "int64 or int32"),
])
def test_check_meta_refuses_malformed_symbols(symbols, match):
    meta = {"symbol": "k", "name": "k", "symbols": symbols,
            "params": [ParamSpec("A", F4, ("n",), False).to_json(), ParamSpec("B", F4, ("n",), True).to_json()]}
    with pytest.raises(ValueError, match=match):
        check_meta(meta)


def test_check_meta_refuses_a_dim_outside_the_language():
    meta = {"symbol": "k", "name": "k", "symbols": [{"name": "n", "param": 0, "dim": 0}],
            "params": [ParamSpec("A", F4, ("n",), False).to_json(), ParamSpec("B", F4, ("n ** 2",), True).to_json()]}
    with pytest.raises(ValueError, match="not allowed"):
        check_meta(meta)


def test_signature_covers_symbols_only_when_there_are_some():
    params = [ParamSpec("A", F4, (3,), False).to_json()]
    assert signature_json(params) == signature_json(params, []) == '[{"dtype":"float32","is_output":false,"name":"A","shape":[3]}]'
    sym = [SymbolSpec("n", 0, 0).to_json()]
    assert signature_json(params, sym) != signature_json(params)
    assert '"symbols"' in signature_json(params, sym)


def test_a_symbol_beyond_what_the_kernel_was_proved_for_is_refused():
    """numpy allows a zero-size array of shape (2**50, 0); the compiler proved the kernel's accesses for symbols
    up to SYMBOL_MAX only: such a call is a ValueError on the Python path, a miss of the native entry."""
    import jitop
    from jitop import te
    from jitop.tir.simplify import SYMBOL_MAX
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n, m), name="A")
    B = te.compute((n, m), lambda i, j: A[i, j] * 2, name="B")
    f = jitop.build(jitop.create_schedule(B.op), [A, B])
    assert f(np.ones((3, 2), np.float32)).shape == (3, 2)
    huge = np.empty((SYMBOL_MAX + 1, 0), np.float32)
    with pytest.raises(ValueError, match="too large for symbol n"):
        f(huge)
    np.testing.assert_array_equal(f(np.empty((SYMBOL_MAX, 0), np.float32)), np.empty((SYMBOL_MAX, 0)))
