"""JITOP_VERIFY=1: a newly compiled kernel's first result is compared with numpy's before it is used.

Tolerances follow what fusion may legitimately change (reassociated sums, fused multiply-adds, the
vectorised math library): exact for integers and booleans, relative for floats scaled by the result's
magnitude; NaN where numpy has NaN, and the same shapes and dtypes everywhere.

>>> import numpy as np
>>> compare(np.float32([1, 2]), np.float32([1, 2])) is None
True
>>> compare(np.float32([1, 2]), np.float32([1, 3]))
'result[1]: max difference 1 (tolerance ...'
"""
from __future__ import annotations

from typing import Any

import numpy as np

_RTOL = {2: 1e-2, 4: 2e-3, 8: 1e-9}  # by float itemsize


def compare(ours: Any, reference: Any, where: str = "result") -> str | None:
    """Why `ours` is not numpy's `reference` (None if it is): structure, shape, dtype, values."""
    if isinstance(reference, (tuple, list)):
        if type(ours) is not type(reference) or len(ours) != len(reference):
            return f"{where}: a {type(ours).__name__} of {len(ours) if hasattr(ours, '__len__') else '?'}, numpy " \
                   f"returns a {type(reference).__name__} of {len(reference)}"
        return next((m for k, (a, b) in enumerate(zip(ours, reference)) if (m := compare(a, b, f"{where}[{k}]"))), None)
    if isinstance(reference, dict):
        if not isinstance(ours, dict) or list(ours) != list(reference):
            return f"{where}: keys differ from numpy's"
        return next((m for k in reference if (m := compare(ours[k], reference[k], f"{where}[{k!r}]"))), None)
    if not isinstance(reference, (np.ndarray, np.generic)):
        return None if ours == reference or (ours != ours and reference != reference) else \
            f"{where}: {ours!r}, numpy gives {reference!r}"
    a, b = np.asarray(ours), np.asarray(reference)
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{where}: {a.dtype}{list(a.shape)}, numpy gives {b.dtype}{list(b.shape)}"
    return _values(a, b, where)


def _values(a: np.ndarray, b: np.ndarray, where: str) -> str | None:
    if a.dtype.kind not in "fc":
        bad = a != b
        return f"{where}: {int(bad.sum())} element(s) differ (exact dtype {a.dtype})" if bad.any() else None
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if (nan_a != nan_b).any():
        return f"{where}: NaN at {int((nan_a != nan_b).sum())} position(s) where numpy has none, or the reverse"
    ok = ~nan_b
    x, y = a[ok].astype(np.float64), b[ok].astype(np.float64)
    same_inf = np.isinf(y) & (x == y)
    diff = np.where(same_inf, 0.0, np.abs(x - y))
    scale = np.abs(y[np.isfinite(y)]).max(initial=0.0)
    rtol = _RTOL.get(np.dtype(a.dtype.char.lower() if a.dtype.kind == "c" else a.dtype).itemsize, 2e-3)
    tol = rtol * (np.abs(y) + scale * 1e-2) + 1e-30
    worst = np.nanmax(diff - tol, initial=-1.0)
    if worst > 0 or np.isnan(diff).any():
        k = int(np.nanargmax(diff - tol))
        return f"{where}[{k}]: max difference {float(diff.max()):.3g} (tolerance {float(tol.flat[k]):.3g})"
    return None
