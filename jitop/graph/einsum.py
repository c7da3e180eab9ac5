"""np.einsum for contractions expressible as (batched) matmul, plus transposes, sums and diagonals of one operand;
an ellipsis (`...ij,...jk->...ik`) stands for letters of its own.

Symbolic sizes (jitop.graph.shapes) flow through np.shape as SymInts; the sizes of one index are tied."""
from __future__ import annotations

import math
import string
from typing import Any

import numpy as np

from jitop.graph import shapes as sh
from jitop.graph.tracer import Unsupported


def _parse(subscripts: str, ndims: list[int]) -> tuple[list[str], str]:
    """The operands' terms and the output's, an ellipsis spelled out as letters the subscripts do not use."""
    spec = subscripts.replace(" ", "")
    ins, arrow, out = spec.partition("->")
    terms = ins.split(",")
    if len(terms) != len(ndims):
        raise ValueError(f"einsum: {len(terms)} subscript terms for {len(ndims)} operands")
    letters = _ellipsis_letters(spec, terms, out, ndims) if "." in spec else ""
    terms = [t.replace("...", letters[len(letters) - _span(t, d):]) for t, d in zip(terms, ndims)]
    if arrow:
        return terms, out.replace("...", letters)
    counts = {c: "".join(terms).count(c) for c in set("".join(terms)) if c not in letters}
    return terms, letters + "".join(sorted(c for c, k in counts.items() if k == 1))  # numpy's implicit output


def _span(term: str, ndim: int) -> int:
    """How many dimensions a term's ellipsis stands for (0 without one)."""
    return max(ndim - len(term.replace("...", "")), 0) if "..." in term else 0


def _ellipsis_letters(spec: str, terms: list[str], out: str, ndims: list[int]) -> str:
    """Letters for the broadcast dimensions an ellipsis stands for (the longest span; shorter ones take its last
    letters, as broadcasting aligns the trailing dimensions); numpy's errors for a bad ellipsis."""
    for t in terms + [out]:
        if t.count("...") > 1 or "." in t.replace("...", ""):
            raise ValueError("einstein sum subscripts string contains a '.' that is not part of an ellipsis ('...')")
    width = max(_span(t, d) for t, d in zip(terms, ndims))
    if width and "->" in spec and "..." not in out:
        raise ValueError("output has more dimensions than subscripts given in einstein sum, but no '...' ellipsis "
                         "provided to broadcast the extra dimensions.")
    unused = [c for c in string.ascii_uppercase + string.ascii_lowercase if c not in spec]
    return "".join(unused[:width])


def _diagonals(x: Any, term: str, k: int) -> tuple[Any, str]:
    """An operand whose term repeats an index (`ii`, `iij`): its diagonal over each repeated pair, the index once
    (np.diagonal puts it last); numpy's error where the pair's lengths differ."""
    from jitop.graph.composites import diagonal  # (composites builds on numpy_api, which imports this module)
    while (c := next((c for c in term if term.count(c) > 1), None)) is not None:
        i, j = term.index(c), term.index(c, term.index(c) + 1)
        n, m = np.shape(x)[i], np.shape(x)[j]
        if not sh.require_eq(n, m, f"einsum index {c!r}"):
            raise ValueError(f"dimensions in operand {k} for collapsing index '{c}' don't match ({n} != {m})")
        x = diagonal(x, 0, i, j)
        term = term[:i] + term[i + 1:j] + term[j + 1:] + c
    return x, term


def _check_shapes(terms: list[str], out: str, shapes: list[tuple[int, ...]]) -> None:
    """numpy's errors for subscripts that do not fit the operands."""
    size: dict[str, int] = {}
    for t, shape in zip(terms, shapes):  # (too many subscripts: found before the diagonals, by einsum)
        if len(t) < len(shape):
            raise ValueError("operand has more dimensions than subscripts given in einstein sum, but no '...' "
                             "ellipsis provided to broadcast the extra dimensions.")
        for c, d in zip(t, shape):
            # a symbolic size: equal sizes of one index are tied (or guarded), as in broadcasting
            if c in size and not sh.require_eq(size[c], d, f"einsum index {c!r}"):
                if sh.is_one(size[c]) or sh.is_one(d):
                    raise Unsupported("np.einsum broadcasting an index of length 1")
                raise ValueError(f"operands could not be broadcast together with remapped shapes "
                                 f"[original->remapped]: {' '.join(sh.show(s) for s in shapes)}")
            size[c] = d
    for c in out:
        if c not in size:
            raise ValueError(f"einstein sum subscripts string included output subscript '{c}' which never "
                             "appeared in an input")
    if len(set(out)) != len(out):
        raise ValueError("einstein sum subscripts string includes output subscript multiple times")


def _sum_out(x: Any, term: str, keep: set[str]) -> tuple[Any, str]:
    """Sum away the indices of `term` not in `keep`."""
    axes = tuple(i for i, c in enumerate(term) if c not in keep)
    if axes:
        x = np.sum(x, axis=axes, dtype=x.dtype)  # einsum keeps the operand dtype
    return x, "".join(c for c in term if c in keep)


def _to_order(x: Any, term: str, order: str) -> Any:
    return np.transpose(x, [term.index(c) for c in order]) if term != order else x


def einsum(subscripts: str, *operands: Any, **kwargs: Any) -> Any:
    if kwargs.get("out") is not None or len(operands) not in (1, 2):
        raise Unsupported("np.einsum with out= or more than two operands")
    terms, out = _parse(subscripts, [len(np.shape(op)) for op in operands])
    for k, t in enumerate(terms):
        if len(t) > len(np.shape(operands[k])):
            raise ValueError(f"einstein sum subscripts string contains too many subscripts for operand {k}")
    operands, terms = map(list, zip(*(_diagonals(op, t, k) for k, (op, t) in enumerate(zip(operands, terms)))))
    _check_shapes(terms, out, [np.shape(op) for op in operands])
    if len(operands) == 1:
        x, term = _sum_out(operands[0], terms[0], set(out))
        return _to_order(x, term, out)
    (a, ta), (b, tb) = (_sum_out(op, t, set(out) | set(other))
                        for op, t, other in ((operands[0], terms[0], terms[1]), (operands[1], terms[1], terms[0])))
    batch = [c for c in ta if c in tb and c in out]
    contract = [c for c in ta if c in tb and c not in out]
    free_a = [c for c in ta if c not in tb]
    free_b = [c for c in tb if c not in ta]
    size = {c: d for t, x in ((ta, a), (tb, b)) for c, d in zip(t, np.shape(x))}
    a3 = np.reshape(_to_order(a, ta, "".join(batch + free_a + contract)),
                    [size[c] for c in batch] + [math.prod(size[c] for c in free_a), math.prod(size[c] for c in contract)])
    b3 = np.reshape(_to_order(b, tb, "".join(batch + contract + free_b)),
                    [size[c] for c in batch] + [math.prod(size[c] for c in contract), math.prod(size[c] for c in free_b)])
    r = np.matmul(a3, b3)
    r = np.reshape(r, [size[c] for c in batch + free_a + free_b])
    return _to_order(r, "".join(batch + free_a + free_b), out)
