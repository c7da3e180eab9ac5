"""Scalar dtypes of jitop and numpy's promotion rules (NEP 50: Python scalars are weak)."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class DType:
    """A scalar type: `kind` is numpy's kind letter ('b', 'i', 'u', 'f'), `bits` its width."""

    name: str
    kind: str
    bits: int

    @property
    def np(self) -> np.dtype:
        return np.dtype(self.name)

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in "iu"

    @property
    def is_bool(self) -> bool:
        return self.kind == "b"

    @property
    def is_signed(self) -> bool:
        return self.kind in "if"

    @property
    def itemsize(self) -> int:
        return max(self.bits // 8, 1)

    def __repr__(self) -> str:
        return self.name


_NAMES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64"]
DTYPES: dict[str, DType] = {n: DType(n, np.dtype(n).kind, 1 if n == "bool" else np.dtype(n).itemsize * 8) for n in _NAMES}
bool_, int8, int16, int32, int64 = (DTYPES[n] for n in _NAMES[:5])
uint8, uint16, uint32, uint64, float32, float64 = (DTYPES[n] for n in _NAMES[5:])
INDEX = int64  # loop variables and tensor indices


def as_dtype(x: Any) -> DType:
    """Convert a name, numpy dtype, numpy scalar type or DType to a jitop DType.

    >>> as_dtype("float32") is as_dtype(np.float32)
    True
    """
    if isinstance(x, DType):
        return x
    try:
        name = np.dtype(x).name
    except TypeError as e:
        raise TypeError(f"{x!r} is not a dtype; expected one of {', '.join(_NAMES)}") from e
    if name not in DTYPES:
        raise TypeError(f"dtype {name} is not supported by jitop; supported: {', '.join(_NAMES)}")
    return DTYPES[name]


@functools.lru_cache(maxsize=None)
def promote(a: DType, b: DType) -> DType:
    """numpy's promote_types for two dtypes (memoized: expression building asks it for every operation)."""
    return as_dtype(np.promote_types(a.np, b.np))


def promote_scalar(a: DType, value: bool | int | float) -> DType:
    """Result dtype of `a` combined with a weak Python scalar (NEP 50), e.g. int32 + 1.5 -> float64. Under NEP 50
    it depends on the scalar's type alone, not its value (an int out of range is refused elsewhere)."""
    kind = bool if isinstance(value, bool) else int if isinstance(value, int) else float
    return _promote_weak(a, kind)


@functools.lru_cache(maxsize=None)
def _promote_weak(a: DType, kind: type) -> DType:
    return as_dtype(np.result_type(a.np, kind(0)))


def scalar_dtype(value: Any) -> DType:
    """The dtype a Python or numpy scalar takes on its own (Python int -> int64, float -> float64)."""
    if isinstance(value, np.generic):
        return as_dtype(value.dtype)
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        return int64
    if isinstance(value, float):
        return float64
    raise TypeError(f"cannot use {type(value).__name__} {value!r} as a scalar; expected bool, int or float")
