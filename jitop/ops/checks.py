"""Argument checks shared by the operator library: clear errors that name the argument."""
from __future__ import annotations

from typing import Any

import numpy as np

from jitop.dtypes import DTYPES
from jitop.graph.tracer import Tracer
from jitop.topi.arguments import pair  # noqa: F401 - the library's checks, shared with topi.cuda

ArrayLike = Any


def array(x: ArrayLike, name: str, op: str) -> Any:
    """x as an ndarray (a tracer inside @jitop.kernel stays a tracer)."""
    if isinstance(x, (np.ndarray, Tracer)):
        return x
    try:
        return np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - say which argument, keep numpy's reason
        raise TypeError(f"{op}: argument '{name}' must be an array, got {type(x).__name__} ({exc})") from None


def ndim(x: Any, name: str, op: str, allowed: tuple[int, ...], what: str = "") -> None:
    if x.ndim not in allowed:
        want = " or ".join(map(str, allowed))
        raise ValueError(f"{op}: argument '{name}' must have {want} dimensions{what}, got shape {tuple(x.shape)}")


NATIVE = frozenset(np.dtype(name) for name in DTYPES)  # compiled dtypes, native byte order: a set lookup


def supported(x: Any, name: str, op: str) -> None:
    """jitop compiles bool, int8-64, uint8-64, float32 and float64; other dtypes get a clear error."""
    if x.dtype not in NATIVE and np.dtype(x.dtype).name not in DTYPES:  # (the set first: .name costs µs)
        raise TypeError(f"{op}: argument '{name}' has dtype {np.dtype(x.dtype)}, which jitop does not compile "
                        f"(it supports bool, int8-64, uint8-64, float32, float64); convert it, e.g. "
                        f"{name}.astype(np.float32)")


def floating(x: Any, name: str, op: str) -> None:
    if np.dtype(x.dtype).kind != "f":
        raise TypeError(f"{op}: argument '{name}' must be a floating-point array (float32 or float64), "
                        f"got {np.dtype(x.dtype)}")
    supported(x, name, op)


def numeric(x: Any, name: str, op: str) -> None:
    if np.dtype(x.dtype).kind not in "iuf":
        raise TypeError(f"{op}: argument '{name}' must be an integer or floating-point array, got {np.dtype(x.dtype)}")
    supported(x, name, op)


def real(value: Any, name: str, op: str) -> float:
    """A real number argument (eps) as a float; a clear error for anything else (a string, None, an array)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{op}: '{name}' must be a real number, got {shown(value)}")
    return float(value)


def flag(value: Any, name: str, op: str) -> bool:
    """A flag argument (ceil_mode): a bool, or an int 0 or 1, as torch takes it."""
    if isinstance(value, (bool, np.bool_)) or isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{op}: '{name}' must be True or False, got {shown(value)}")


def shown(value: Any) -> str:
    """A value as an error message shows it: an array by its dtype and shape (never its thousand elements)."""
    if isinstance(value, (np.ndarray, Tracer)):
        return f"a {np.dtype(value.dtype)} array of shape {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def layout(value: str, op: str) -> str:
    if value not in ("NCHW", "NHWC"):
        raise ValueError(f"{op}: layout must be 'NCHW' or 'NHWC', got {value!r}")
    return value
