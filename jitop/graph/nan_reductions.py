"""numpy's NaN-ignoring reductions (nansum, nanprod, nanmax, nanmin, nanmean, nanvar, nanstd), np.ptp and
np.nan_to_num, written with the primitives the tracer already has, as numpy writes them (its _nanfunctions_impl):
NaN replaced by the reduction's identity, counts of the other elements, an all-NaN slice NaN (numpy also warns
there; a kernel does not). Integer and bool arrays hold no NaN: their nan-reductions are the plain ones.

>>> import jitop
>>> f = jitop.kernel(lambda x: (np.nansum(x, axis=1), np.nanmax(x, axis=1), np.nanmean(x, axis=1)))
>>> f(np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, np.nan]]))
(array([4., 0.]), array([ 3., nan]), array([ 2., nan]))
"""
from __future__ import annotations

from typing import Any

import numpy as np

from jitop.graph.numpy_api import _cast, array_node, implements, max_, mean, min_, prod, std, sum_, var
from jitop.graph.tracer import Tracer, Unsupported

__all__ = ["nanmax", "nanmean", "nanmin", "nanprod", "nanstd", "nansum", "nanvar", "nan_to_num", "ptp"]


def _floating(a: Any) -> bool:
    return array_node(a).dtype.is_float


def _no_out_or_where(name: str, out: Any, where: Any = True) -> None:
    if out is not None:
        raise Unsupported(f"np.{name} with out=")
    if where is not True:
        raise Unsupported(f"np.{name} with where=")


def _as_reduced(t: Any) -> Any:
    """A 0-d result as numpy's reductions give it, a scalar (np.where's own 0-d result is an array)."""
    return t[()] if np.ndim(t) == 0 else t


def _replaced(a: Any, value: float) -> Tracer:
    """a with each NaN replaced by `value` (in a's dtype)."""
    return np.where(np.isnan(a), value, a)


@implements(np.nansum)
def nansum(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=True):
    _no_out_or_where("nansum", out, where)
    source = _replaced(a, 0) if _floating(a) else a
    return sum_(source, axis, dtype, None, keepdims, initial)


@implements(np.nanprod)
def nanprod(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=True):
    _no_out_or_where("nanprod", out, where)
    source = _replaced(a, 1) if _floating(a) else a
    return prod(source, axis, dtype, None, keepdims, initial)


def _nan_extreme(a: Any, axis: Any, keepdims: bool, initial: Any, largest: bool) -> Any:
    """numpy's fmax/fmin reduction: NaN ignored; a slice of NaN alone is NaN (unless `initial` is given)."""
    reduce = max_ if largest else min_
    if not _floating(a):
        return reduce(a, axis, None, keepdims, initial)
    result = reduce(_replaced(a, -np.inf if largest else np.inf), axis, None, keepdims, initial)
    if initial is not None:
        return result
    all_nan = np.all(np.isnan(a), axis=axis, keepdims=keepdims)
    return _as_reduced(np.where(all_nan, np.nan, result).astype(array_node(a).dtype.np))


@implements(np.nanmax)
def nanmax(a, axis=None, out=None, keepdims=False, initial=None, where=True):
    _no_out_or_where("nanmax", out, where)
    return _nan_extreme(a, axis, keepdims, initial, largest=True)


@implements(np.nanmin)
def nanmin(a, axis=None, out=None, keepdims=False, initial=None, where=True):
    _no_out_or_where("nanmin", out, where)
    return _nan_extreme(a, axis, keepdims, initial, largest=False)


def _count(a: Any, axis: Any, keepdims: bool) -> Tracer:
    """The non-NaN elements of each slice (intp, as numpy counts them)."""
    return sum_(np.logical_not(np.isnan(a)), axis, np.intp, None, keepdims)


def _divided(total: Any, count: Any) -> Tracer:
    """total / count in total's dtype: numpy divides by the count unsafely, into the total's own dtype."""
    return _cast(np.true_divide(total, count), array_node(total).dtype.np)


@implements(np.nanmean)
def nanmean(a, axis=None, dtype=None, out=None, keepdims=False, *, where=True):
    _no_out_or_where("nanmean", out, where)
    if not _floating(a):
        return mean(a, axis, dtype, None, keepdims)
    total = sum_(_replaced(a, 0), axis, dtype, None, keepdims)
    return _divided(total, _count(a, axis, keepdims))


@implements(np.nanvar)
def nanvar(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=True, mean=None,
           correction=None):
    _no_out_or_where("nanvar", out, where)
    if mean is not None:
        raise Unsupported("np.nanvar/np.nanstd with mean=")
    if correction is not None:
        if ddof != 0:
            raise ValueError("ddof and correction can't be provided simultaneously.")
        ddof = correction
    if not _floating(a):
        return var(a, axis, dtype, None, ddof, keepdims)
    nan = np.isnan(a)
    zeroed = np.where(nan, 0, a)
    count = _count(a, axis, True)
    centered = np.where(nan, 0, np.subtract(zeroed, _divided(sum_(zeroed, axis, dtype, None, True), count)))
    total = sum_(np.multiply(centered, centered), axis, dtype, None, keepdims)
    dof = np.subtract(_count(a, axis, keepdims), ddof)
    return _as_reduced(np.where(np.less_equal(dof, 0), np.nan, _divided(total, dof)).astype(array_node(total).dtype.np))


@implements(np.nanstd)
def nanstd(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=True, mean=None,
           correction=None):
    if not _floating(a):
        return std(a, axis, dtype, out, ddof, keepdims, where=where, mean=mean, correction=correction)
    return np.sqrt(nanvar(a, axis, dtype, out, ddof, keepdims, where=where, mean=mean, correction=correction))


@implements(np.ptp)
def ptp(a, axis=None, out=None, keepdims=False):
    _no_out_or_where("ptp", out)
    return np.subtract(max_(a, axis, None, keepdims), min_(a, axis, None, keepdims))


@implements(np.nan_to_num)
def nan_to_num(x, copy=True, nan=0.0, posinf=None, neginf=None):
    """numpy's: with copy=False, x itself changed in place (an assignment); a 0-d x gives a scalar."""
    n = array_node(x)
    if not n.dtype.is_float:
        out = x if not copy and isinstance(x, Tracer) else x.copy() if isinstance(x, Tracer) else np.copy(x)
        return out[()] if n.ndim == 0 else out
    info = np.finfo(n.dtype.np)
    big = info.max if posinf is None else posinf
    small = info.min if neginf is None else neginf
    out = np.where(np.isnan(x), nan, x)
    infinite = np.isinf(x)
    out = np.where(np.logical_and(infinite, np.greater(x, 0)), big, out)
    out = np.where(np.logical_and(infinite, np.less(x, 0)), small, out).astype(n.dtype.np)
    if not copy and isinstance(x, Tracer):
        x[...] = out
        out = x
    return out[()] if n.ndim == 0 else out
