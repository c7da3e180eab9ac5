"""Checks of the arguments the templates' user-facing builders share (jitop.ops and topi.cuda): errors that
name the argument and say what was expected."""
from __future__ import annotations

from typing import Any

import numpy as np


def pair(v: Any, name: str, op: str, minimum: int = 0) -> tuple[int, int]:
    """An int or a pair of ints (torch's convention for stride, padding, dilation, kernel_size), each at least
    `minimum`: TypeError for anything else, ValueError for a value below it.

    >>> pair(2, "stride", "conv2d", minimum=1), pair((1, 3), "padding", "conv2d")
    ((2, 2), (1, 3))
    """
    vals = (v, v) if isinstance(v, (int, np.integer)) else tuple(v) if isinstance(v, (tuple, list)) else None
    if vals is None or len(vals) != 2 or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                                                  for x in vals):
        raise TypeError(f"{op}: '{name}' must be an int or a pair of ints, got {v!r}")
    if any(x < minimum for x in vals):
        raise ValueError(f"{op}: '{name}' must be >= {minimum}, got {v!r}")
    return int(vals[0]), int(vals[1])
