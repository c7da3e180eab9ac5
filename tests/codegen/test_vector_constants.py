"""Vector constants are one object per distinct constant (jitop.codegen.ops.vector_constant: llvmlite prints a
constant's text once per object), told apart by their values' bits."""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from jitop.codegen import ops

F32, I32 = ir.FloatType(), ir.IntType(32)


def test_equal_constants_are_one_object_and_others_are_not():
    assert ops.vector_constant(I32, range(8)) is ops.vector_constant(I32, list(range(8)))
    assert ops.splat_constant(F32, 2.0, 16) is ops.splat_constant(F32, 2.0, 16)
    assert ops.splat_constant(F32, 2.0, 16) is not ops.splat_constant(F32, 2.0, 8)
    assert ops.splat_constant(F32, 2.0, 8) is not ops.splat_constant(ir.DoubleType(), 2.0, 8)
    assert ops.splat_constant(I32, 3, None).type == I32  # a scalar is a scalar constant


def test_floats_are_keyed_by_their_bits():
    zero, minus_zero = ops.splat_constant(F32, 0.0, 4), ops.splat_constant(F32, -0.0, 4)
    assert zero is not minus_zero and str(zero) != str(minus_zero)
    half = ops.splat_constant(F32, np.float32(1.5), 4)  # a numpy float32 is not truncated to 1
    assert half is not ops.splat_constant(F32, 1.0, 4) and str(half) == str(ops.splat_constant(F32, 1.5, 4))
    nan = ops.splat_constant(F32, math.nan, 4)
    assert nan is ops.splat_constant(F32, math.nan, 4)  # (nan != nan: keyed by bits, not by equality)
