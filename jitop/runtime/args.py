"""Argument checks against a compiled signature: a mismatch is a clear error, never a crash."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ParamSpec:
    """One array parameter of a compiled function."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    is_output: bool

    def describe(self) -> str:
        return f"{self.dtype.name} array of shape {self.shape}"

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype.name, "shape": list(self.shape), "is_output": self.is_output}

    @staticmethod
    def from_json(d: dict) -> "ParamSpec":
        return ParamSpec(d["name"], np.dtype(d["dtype"]), tuple(d["shape"]), d["is_output"])


def check_array(spec: ParamSpec, position: int, a: object) -> int:
    """The data pointer of `a` after checking it matches `spec`."""
    where = f"argument '{spec.name}' (position {position})"
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{where} must be a numpy.ndarray ({spec.describe()}), got {type(a).__name__}")
    if a.dtype != spec.dtype:
        if a.dtype.newbyteorder("=") == spec.dtype:
            raise TypeError(f"{where} must be a native-byte-order {spec.dtype.name} array, got byte order "
                            f"{a.dtype.str!r}; convert with .astype(np.{spec.dtype.name})")
        raise TypeError(f"{where} must have dtype {spec.dtype.name}, got {a.dtype.name}; "
                        f"convert with .astype(np.{spec.dtype.name}) or rebuild for {a.dtype.name}")
    if a.shape != spec.shape:
        raise ValueError(f"{where} must have shape {spec.shape}, got {a.shape}; the function was compiled for that shape")
    flags = a.flags
    if not flags.c_contiguous:
        raise ValueError(f"{where} must be C-contiguous; pass np.ascontiguousarray({spec.name})")
    if not flags.aligned:
        raise ValueError(f"{where} is not aligned to its dtype; pass a copy (np.array({spec.name}))")
    if spec.is_output and not flags.writeable:
        raise ValueError(f"{where} is an output but read-only; pass a writeable array")
    return a.ctypes.data


def check_no_overlap(specs: list[ParamSpec], arrays: list[np.ndarray]) -> None:
    """Outputs must not share memory with any other argument (kernels assume no aliasing)."""
    for k, (spec, a) in enumerate(zip(specs, arrays)):
        if not spec.is_output or a.size == 0:
            continue
        for j, b in enumerate(arrays):
            if j != k and b.size and np.may_share_memory(a, b):
                raise ValueError(f"output '{spec.name}' shares memory with argument '{specs[j].name}'; "
                                 "jitop kernels need separate output arrays (pass a fresh np.empty_like)")
