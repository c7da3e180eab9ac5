"""The words the native entry reads (jitop.runtime.fastcall writes them, jitop.runtime.entry_ir reads them): the
C layouts of the objects it inspects, and the layout of a Table's and a Spec's int64 words.

>>> OFFSETS["ob_type"], S_RECORDS, IN_SIZE
(8, 15, 5)
"""
from __future__ import annotations

__all__ = ["OFFSETS", "C_CONTIGUOUS", "ALIGNED", "WRITEABLE", "MAX_PARAMS", "RELEASE_GIL_BYTES", "GIL_FROM_PROGRAM",
           "T_NSPECS", "T_SENTINEL", "T_HITS", "T_NEW", "T_ARRAY", "T_EMPTY", "T_FLOAT", "T_LONG", "T_BOOL",
           "T_TRUE", "T_SPECS", "S_NARGS", "S_NIN", "S_NOUT", "S_KERNEL", "S_GIL", "S_FLAG", "S_CHECK", "S_KIND",
           "S_SLOT", "S_POST", "S_OUTREC", "S_CALLS", "S_NSYM", "S_PROG", "S_COPIES", "S_RECORDS", "IN_ARRAY",
           "IN_CONST", "IN_FLOAT", "IN_INT", "IN_BOOL", "IN_SIZE", "R_ARRAY", "R_SCALAR", "R_POST"]

MAX_PARAMS = 32               # kernels with more parameters take the slow path (the entry calls by arity)
RELEASE_GIL_BYTES = 1 << 15   # kernels touching this many bytes run with the GIL released, as ctypes did

# ** the C layouts the entry reads (verified against live objects by fastcall's `_layout_ok` before any use) **
OFFSETS = {"ob_refcnt": 0, "ob_type": 8,                                        # PyObject
           "data": 16, "nd": 24, "dimensions": 32, "strides": 40, "base": 48,   # PyArrayObject_fields
           "descr": 56, "flags": 64,
           "b_ptr": 16}                                                         # ctypes' CDataObject
C_CONTIGUOUS, ALIGNED, WRITEABLE = 0x1, 0x100, 0x400

# ** table words **
T_NSPECS, T_SENTINEL, T_HITS, T_NEW, T_ARRAY, T_EMPTY, T_FLOAT, T_LONG, T_BOOL, T_TRUE, T_SPECS = range(11)

# ** spec words **, then the input records from S_RECORDS, then the output records from word spec[S_OUTREC]
# (S_CALLS: calls this signature served, for the workload log)
# (S_NSYM: the kernel's symbols, its last parameter an i64[S_NSYM] of their values; S_PROG: where the dim program
# starts, 0 for a static signature)
# (S_COPIES: where the regions copied into arguments start (jitop.runtime.copy_in), 0 for none)
S_NARGS, S_NIN, S_NOUT, S_KERNEL, S_GIL, S_FLAG, S_CHECK, S_KIND, S_SLOT, S_POST, S_OUTREC, S_CALLS, S_NSYM, S_PROG, \
    S_COPIES, S_RECORDS = range(16)
GIL_FROM_PROGRAM = 2  # S_GIL of a symbolic signature: the program's SET_GIL decides

# input record: [kind, position | data address, descr | lo, ndim | hi, dims...] (dims: dimprog's dim words)
# (IN_SIZE: an int that is a symbol's value, [kind, position, lo, hi, slot]: bound into its slot too)
IN_ARRAY, IN_CONST, IN_FLOAT, IN_INT, IN_BOOL, IN_SIZE = range(6)

# output record: [descr, ndim, recycle, spare array (a strong reference, or 0), dims...] (a symbolic signature's
# output dims come from the program's odims, outputs' dims concatenated)
# result kinds: the output at spec[S_SLOT]; that 0-d output as a scalar (o[()]); post(*outputs)
R_ARRAY, R_SCALAR, R_POST = range(3)
