"""A native entry point for compiled kernels: checks the arguments, allocates the outputs and calls the kernel
without running any Python, in ~0.1 µs instead of the generated-Python runner's ~2 µs.

One generic entry, written in LLVM IR and compiled once per machine (its object code is cached like the
thread pool's), is exposed as built-in functions with CPython's METH_FASTCALL convention. Each built-in's
`self` is a `Table`: raw words naming the signatures (`Spec`s) it serves. A Spec is plain data an Executable
derives from its Plan: per argument the ndarray type, dtype descriptor, ndim and shape it needs (or the
Python scalar type), per output its descriptor and shape, the kernel's address and how to build the result.

A kernel with symbolic shapes has a symbolic Spec: its dims are printed expressions of the kernel's symbols.
The entry binds each symbol from an input's dim into a call-local slot (the slots are the i64[k] array the kernel
takes last), ties the other dims to them, and runs the spec's check-and-shape program (jitop.runtime.dimprog:
guards, output dims, the bytes that decide the GIL). A static Spec runs exactly the checks it always did.

A static Spec may also copy regions into its arguments, from other arguments before the kernel runs or from its
outputs after (`CopyIn`, jitop.runtime.copy_in: a decode step's `cache[t] = k`); when a copy's checks fail (a
position outside its axis, a read-only target, an argument sharing memory with a target written after the
kernel) the entry writes nothing and returns MISS.

The entry only ever accepts what the slow path would accept and compute identically: exact ndarrays with
the expected (native, singleton) dtype descriptor, shape, C-contiguous and aligned; exact Python float/int/bool
for scalar parameters. For anything else (a subclass, another dtype or shape, a strided view, a wrong argument
count, an int outside its range) it returns `MISS` and the caller takes its slow path, which raises today's
errors by construction.

>>> table = Table([spec])             # doctest: +SKIP
>>> fast = table.entry()              # doctest: +SKIP
>>> r = fast(a, b)                    # doctest: +SKIP
>>> r is MISS                         # doctest: +SKIP
False
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import llvmlite.binding as llvm
from llvmlite import ir
import numpy as np

from jitop.codegen.loader import load_object
from jitop.codegen.target import compile_ir, llvm_version
from jitop.runtime import dimprog
from jitop.runtime.copy_in import CopyIn, copy_in_ir, section
from jitop.runtime.dimprog import MAX_ODIMS, MAX_SLOTS, MAX_STACK, Op
from jitop.runtime.ir_words import I1, I64, PTR, word
from jitop.target import Target

__all__ = ["MISS", "MAX_PARAMS", "RELEASE_GIL_BYTES", "Output", "Scalar", "Array", "Const", "CopyIn", "Spec", "Table",
           "available", "use_object_store"]


class _Miss:
    """The value a fast entry returns when it does not handle the call: take the slow path."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "jitop.runtime.fastcall.MISS"


MISS = _Miss()
MAX_PARAMS = 32               # kernels with more parameters take the slow path (the entry calls by arity)
RELEASE_GIL_BYTES = 1 << 15   # kernels touching this many bytes run with the GIL released, as ctypes did
ENABLED = True                # False: `available()` says no (tests compare against the slow path)

# ** the C layouts the entry reads (verified against live objects by `_layout_ok` before any use) **
_OFF = {"ob_refcnt": 0, "ob_type": 8,                                         # PyObject
        "data": 16, "nd": 24, "dimensions": 32, "strides": 40, "base": 48,     # PyArrayObject_fields
        "descr": 56, "flags": 64,
        "b_ptr": 16}                                                           # ctypes' CDataObject
C_CONTIGUOUS, ALIGNED, WRITEABLE = 0x1, 0x100, 0x400
METH_FASTCALL = 0x80
_NEW_FROM_DESCR, _ARRAY_TYPE = 94, 2   # slots of numpy's C API table (__multiarray_api.h)

# table words
T_NSPECS, T_SENTINEL, T_HITS, T_NEW, T_ARRAY, T_EMPTY, T_FLOAT, T_LONG, T_BOOL, T_TRUE, T_SPECS = range(11)
# spec words, then the input records from S_RECORDS, then the output records from word spec[S_OUTREC]
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

_PY_SYMBOLS = ("Py_IncRef", "Py_DecRef", "PyEval_SaveThread", "PyEval_RestoreThread", "PyObject_CallNoArgs",
               "PyObject_GetItem", "PyObject_Vectorcall", "PyFloat_AsDouble", "PyLong_AsLongLongAndOverflow")


# ** the entry, in LLVM IR **
def _entry_ir() -> str:
    """The generic entry `jitop_fastcall(self, args, nargs)` and its helpers (see the module docstring)."""
    o = _OFF
    cases = " ".join(f"i64 {n}, label %c{n}" for n in range(1, MAX_PARAMS + 1))
    calls = []
    for n in range(1, MAX_PARAMS + 1):
        loads = [f"  %c{n}.p{k} = getelementptr ptr, ptr %ptrs, i64 {k}\n  %c{n}.v{k} = load ptr, ptr %c{n}.p{k}"
                 for k in range(n)]
        args = ", ".join(f"ptr %c{n}.v{k}" for k in range(n))
        calls.append(f"c{n}:\n" + "\n".join(loads) + f"\n  call void %fn({args})\n  br label %out")
    return f"""
declare void @Py_IncRef(ptr)
declare void @Py_DecRef(ptr)
declare ptr @PyEval_SaveThread()
declare void @PyEval_RestoreThread(ptr)
declare ptr @PyObject_CallNoArgs(ptr)
declare ptr @PyObject_GetItem(ptr, ptr)
declare ptr @PyObject_Vectorcall(ptr, ptr, i64, ptr)
declare double @PyFloat_AsDouble(ptr)
declare i64 @PyLong_AsLongLongAndOverflow(ptr, ptr)

attributes #0 = {{ alwaysinline }}

define internal i64 @w(ptr %base, i64 %i) #0 {{
  %p = getelementptr i64, ptr %base, i64 %i
  %v = load i64, ptr %p, align 8
  ret i64 %v
}}

define internal ptr @wp(ptr %base, i64 %i) #0 {{
  %p = getelementptr i64, ptr %base, i64 %i
  %v = load ptr, ptr %p, align 8
  ret ptr %v
}}

define internal ptr @at(ptr %obj, i64 %off) #0 {{
  %p = getelementptr i8, ptr %obj, i64 %off
  %v = load ptr, ptr %p, align 8
  ret ptr %v
}}

define internal i32 @at32(ptr %obj, i64 %off) #0 {{
  %p = getelementptr i8, ptr %obj, i64 %off
  %v = load i32, ptr %p, align 4
  ret i32 %v
}}

define internal ptr @arg(ptr %args, i64 %k) #0 {{
  %p = getelementptr ptr, ptr %args, i64 %k
  %v = load ptr, ptr %p, align 8
  ret ptr %v
}}

define internal i1 @dims_equal(ptr %have, ptr %want, i64 %n) {{
entry:
  br label %loop
loop:
  %d = phi i64 [ 0, %entry ], [ %d1, %cmp ]
  %end = icmp eq i64 %d, %n
  br i1 %end, label %yes, label %cmp
cmp:
  %x = call i64 @w(ptr %have, i64 %d)
  %y = call i64 @w(ptr %want, i64 %d)
  %eq = icmp eq i64 %x, %y
  %d1 = add i64 %d, 1
  br i1 %eq, label %loop, label %no
yes:
  ret i1 1
no:
  ret i1 0
}}

{_symbolic_ir()}

{copy_in_ir(o["flags"], WRITEABLE)}

; Whether `args` fit this spec's inputs; fills ptrs[k] with input k's data (scalars go to scal[k]). A symbolic
; spec (slots not null) binds and ties its dims in `slots` (the program checks the rest).
define internal i1 @match(ptr %table, ptr %spec, ptr %args, ptr %ptrs, ptr %scal, ptr %slots) {{
entry:
  %ovf = alloca i32, align 4
  %nin = call i64 @w(ptr %spec, i64 {S_NIN})
  br label %loop
loop:
  %k = phi i64 [ 0, %entry ], [ %k1, %next ]
  %at = phi i64 [ {S_RECORDS}, %entry ], [ %at1, %next ]
  %done = icmp eq i64 %k, %nin
  br i1 %done, label %yes, label %body
body:
  %kind = call i64 @w(ptr %spec, i64 %at)
  %at.a = add i64 %at, 1
  %a = call i64 @w(ptr %spec, i64 %at.a)
  %at.b = add i64 %at, 2
  %b = call i64 @w(ptr %spec, i64 %at.b)
  %at.c = add i64 %at, 3
  %c = call i64 @w(ptr %spec, i64 %at.c)
  %at4 = add i64 %at, 4
  %slot = getelementptr ptr, ptr %ptrs, i64 %k
  %cell = getelementptr i64, ptr %scal, i64 %k
  switch i64 %kind, label %no [ i64 {IN_ARRAY}, label %array
                                i64 {IN_CONST}, label %const
                                i64 {IN_FLOAT}, label %float
                                i64 {IN_INT}, label %int
                                i64 {IN_SIZE}, label %int
                                i64 {IN_BOOL}, label %bool ]
array:
  %ao = call ptr @arg(ptr %args, i64 %a)
  %atype = call ptr @at(ptr %ao, i64 {o["ob_type"]})
  %awant = call ptr @wp(ptr %table, i64 {T_ARRAY})
  %at.ok = icmp eq ptr %atype, %awant
  br i1 %at.ok, label %array.descr, label %no
array.descr:
  %descr = call ptr @at(ptr %ao, i64 {o["descr"]})
  %descr.i = ptrtoint ptr %descr to i64
  %descr.ok = icmp eq i64 %descr.i, %b
  br i1 %descr.ok, label %array.nd, label %no
array.nd:
  %nd = call i32 @at32(ptr %ao, i64 {o["nd"]})
  %nd64 = sext i32 %nd to i64
  %nd.ok = icmp eq i64 %nd64, %c
  br i1 %nd.ok, label %array.flags, label %no
array.flags:
  %flags = call i32 @at32(ptr %ao, i64 {o["flags"]})
  %fm = and i32 %flags, {C_CONTIGUOUS | ALIGNED}
  %flags.ok = icmp eq i32 %fm, {C_CONTIGUOUS | ALIGNED}
  br i1 %flags.ok, label %array.dims, label %no
array.dims:
  %dims = call ptr @at(ptr %ao, i64 {o["dimensions"]})
  %want.dims = getelementptr i64, ptr %spec, i64 %at4
  %symbolic = icmp ne ptr %slots, null
  br i1 %symbolic, label %array.bind, label %array.equal
array.equal:
  %dims.ok = call i1 @dims_equal(ptr %dims, ptr %want.dims, i64 %c)
  br i1 %dims.ok, label %array.ok, label %no
array.bind:
  %bound = call i1 @dims_bind(ptr %dims, ptr %want.dims, i64 %c, ptr %slots)
  br i1 %bound, label %array.ok, label %no
array.ok:
  %data = call ptr @at(ptr %ao, i64 {o["data"]})
  store ptr %data, ptr %slot, align 8
  %at.arr = add i64 %at4, %c
  br label %next
const:
  %cp = inttoptr i64 %a to ptr
  store ptr %cp, ptr %slot, align 8
  br label %next
float:
  %fo = call ptr @arg(ptr %args, i64 %a)
  %ftype = call ptr @at(ptr %fo, i64 {o["ob_type"]})
  %fwant = call ptr @wp(ptr %table, i64 {T_FLOAT})
  %ft.ok = icmp eq ptr %ftype, %fwant
  br i1 %ft.ok, label %float.ok, label %no
float.ok:
  %fv = call double @PyFloat_AsDouble(ptr %fo)
  store double %fv, ptr %cell, align 8
  store ptr %cell, ptr %slot, align 8
  br label %next
int:
  %io = call ptr @arg(ptr %args, i64 %a)
  %itype = call ptr @at(ptr %io, i64 {o["ob_type"]})
  %iwant = call ptr @wp(ptr %table, i64 {T_LONG})
  %it.ok = icmp eq ptr %itype, %iwant
  br i1 %it.ok, label %int.value, label %no
int.value:
  store i32 0, ptr %ovf, align 4
  %iv = call i64 @PyLong_AsLongLongAndOverflow(ptr %io, ptr %ovf)
  %over = load i32, ptr %ovf, align 4
  %lo.ok = icmp sge i64 %iv, %b
  %hi.ok = icmp sle i64 %iv, %c
  %fits = icmp eq i32 %over, 0
  %in1 = and i1 %lo.ok, %hi.ok
  %in = and i1 %in1, %fits
  br i1 %in, label %int.ok, label %no
int.ok:
  store i64 %iv, ptr %cell, align 8
  store ptr %cell, ptr %slot, align 8
  %is.size = icmp eq i64 %kind, {IN_SIZE}
  br i1 %is.size, label %size, label %next
size:  ; a symbol's value (a symbolic spec: %slots is not null)
  %size.slot = call i64 @w(ptr %spec, i64 %at4)
  %size.p = getelementptr i64, ptr %slots, i64 %size.slot
  store i64 %iv, ptr %size.p, align 8
  %at5 = add i64 %at, 5
  br label %next
bool:
  %bo = call ptr @arg(ptr %args, i64 %a)
  %btype = call ptr @at(ptr %bo, i64 {o["ob_type"]})
  %bwant = call ptr @wp(ptr %table, i64 {T_BOOL})
  %bt.ok = icmp eq ptr %btype, %bwant
  br i1 %bt.ok, label %bool.ok, label %no
bool.ok:
  %true = call ptr @wp(ptr %table, i64 {T_TRUE})
  %bv = icmp eq ptr %bo, %true
  %bz = zext i1 %bv to i64
  store i64 %bz, ptr %cell, align 8
  store ptr %cell, ptr %slot, align 8
  br label %next
next:
  %at1 = phi i64 [ %at.arr, %array.ok ], [ %at4, %const ], [ %at4, %float.ok ], [ %at4, %int.ok ],
                 [ %at5, %size ], [ %at4, %bool.ok ]
  %k1 = add i64 %k, 1
  br label %loop
yes:
  ret i1 1
no:
  ret i1 0
}}

; A new reference to a fresh C-contiguous output, or NULL (an exception is set). A recycled output reuses the
; spare array of the previous call when nothing else references it (its pages are mapped already) and, for a
; symbolic signature (%sym), its dims are the new ones.
define internal ptr @output(ptr %table, ptr %descr, i64 %nd, ptr %dims, i64 %recycle, ptr %slotp, i1 %sym) {{
entry:
  %rec = icmp ne i64 %recycle, 0
  br i1 %rec, label %spare, label %fresh
spare:
  %s = load ptr, ptr %slotp, align 8
  %has = icmp ne ptr %s, null
  br i1 %has, label %spare.rc, label %fresh
spare.rc:
  %rc = load i64, ptr %s, align 8
  %free = icmp eq i64 %rc, 1
  br i1 %free, label %spare.shape, label %fresh
spare.shape:
  br i1 %sym, label %spare.dims, label %reuse
spare.dims:
  %sdims = call ptr @at(ptr %s, i64 {o["dimensions"]})
  %same = call i1 @dims_equal(ptr %sdims, ptr %dims, i64 %nd)
  br i1 %same, label %reuse, label %fresh
reuse:
  call void @Py_IncRef(ptr %s)
  ret ptr %s
fresh:
  call void @Py_IncRef(ptr %descr)          ; PyArray_NewFromDescr steals it
  %new = call ptr @wp(ptr %table, i64 {T_NEW})
  %type = call ptr @wp(ptr %table, i64 {T_ARRAY})
  %nd32 = trunc i64 %nd to i32
  %o = call ptr %new(ptr %type, ptr %descr, i32 %nd32, ptr %dims, ptr null, ptr null, i32 0, ptr null)
  %failed = icmp eq ptr %o, null
  br i1 %failed, label %fail, label %made
made:
  br i1 %rec, label %keep, label %done
keep:
  %old = load ptr, ptr %slotp, align 8
  call void @Py_IncRef(ptr %o)
  store ptr %o, ptr %slotp, align 8
  %had = icmp ne ptr %old, null
  br i1 %had, label %drop, label %done
drop:
  call void @Py_DecRef(ptr %old)             ; still referenced elsewhere: never freed here
  br label %done
done:
  ret ptr %o
fail:
  ret ptr null
}}

define internal void @release(ptr %outs, i64 %n) {{
entry:
  br label %loop
loop:
  %j = phi i64 [ 0, %entry ], [ %j1, %body ]
  %end = icmp eq i64 %j, %n
  br i1 %end, label %out, label %body
body:
  %p = getelementptr ptr, ptr %outs, i64 %j
  %v = load ptr, ptr %p, align 8
  call void @Py_DecRef(ptr %v)
  %j1 = add i64 %j, 1
  br label %loop
out:
  ret void
}}

; The kernel takes one pointer per parameter: call it with the right arity.
define internal void @invoke(ptr %fn, ptr %ptrs, i64 %n) {{
entry:
  switch i64 %n, label %out [ {cases} ]
{chr(10).join(calls)}
out:
  ret void
}}

; Allocates the outputs and calls the kernel; a symbolic spec passes its slots (the kernel's symbols, its last
; argument) and odims (its outputs' dims); %gil: whether to release the GIL around the kernel. Once the kernel
; has run without error, the spec's copies after it are made (jitop.runtime.copy_in: %args and %scal).
define internal ptr @run(ptr %table, ptr %spec, ptr %ptrs, ptr %slots, ptr %odims, i64 %gil, ptr %args,
                         ptr %scal) {{
entry:
  %outs = alloca [{MAX_PARAMS} x ptr], align 16
  %sym = icmp ne ptr %odims, null
  %nin = call i64 @w(ptr %spec, i64 {S_NIN})
  %nout = call i64 @w(ptr %spec, i64 {S_NOUT})
  %at0 = call i64 @w(ptr %spec, i64 {S_OUTREC})
  br label %alloc
alloc:
  %j = phi i64 [ 0, %entry ], [ %j1, %alloc.ok ]
  %at = phi i64 [ %at0, %entry ], [ %at1, %alloc.ok ]
  %od = phi i64 [ 0, %entry ], [ %od1, %alloc.ok ]
  %adone = icmp eq i64 %j, %nout
  br i1 %adone, label %call, label %alloc.one
alloc.one:
  %descr = call ptr @wp(ptr %spec, i64 %at)
  %at.nd = add i64 %at, 1
  %nd = call i64 @w(ptr %spec, i64 %at.nd)
  %at.rec = add i64 %at, 2
  %rec = call i64 @w(ptr %spec, i64 %at.rec)
  %at.slot = add i64 %at, 3
  %slotp = getelementptr i64, ptr %spec, i64 %at.slot
  %at.dims = add i64 %at, 4
  %dims.s = getelementptr i64, ptr %spec, i64 %at.dims
  %dims.o = getelementptr i64, ptr %odims, i64 %od
  %dims = select i1 %sym, ptr %dims.o, ptr %dims.s
  %o = call ptr @output(ptr %table, ptr %descr, i64 %nd, ptr %dims, i64 %rec, ptr %slotp, i1 %sym)
  %o.null = icmp eq ptr %o, null
  br i1 %o.null, label %fail, label %alloc.ok
alloc.ok:
  %outp = getelementptr ptr, ptr %outs, i64 %j
  store ptr %o, ptr %outp, align 8
  %data = call ptr @at(ptr %o, i64 {o["data"]})
  %pk = add i64 %nin, %j
  %pp = getelementptr ptr, ptr %ptrs, i64 %pk
  store ptr %data, ptr %pp, align 8
  %at1 = add i64 %at.dims, %nd
  %od1 = add i64 %od, %nd
  %j1 = add i64 %j, 1
  br label %alloc
fail:
  call void @release(ptr %outs, i64 %j)
  ret ptr null
call:
  %io = add i64 %nin, %nout
  %symp = getelementptr ptr, ptr %ptrs, i64 %io
  store ptr %slots, ptr %symp, align 8        ; the symbols: the last parameter (unused by a static kernel)
  %nsym = zext i1 %sym to i64
  %n = add i64 %io, %nsym
  %unlock = icmp ne i64 %gil, 0
  br i1 %unlock, label %save, label %invoke
save:
  %ts = call ptr @PyEval_SaveThread()
  br label %invoke
invoke:
  %tsv = phi ptr [ null, %call ], [ %ts, %save ]
  %fn = call ptr @wp(ptr %spec, i64 {S_KERNEL})
  call void @invoke(ptr %fn, ptr %ptrs, i64 %n)
  br i1 %unlock, label %restore, label %count
restore:
  call void @PyEval_RestoreThread(ptr %tsv)
  br label %count
count:
  %hp = call ptr @wp(ptr %table, i64 {T_HITS})
  %h = load i64, ptr %hp, align 8
  %h1 = add i64 %h, 1
  store i64 %h1, ptr %hp, align 8
  %ncalls.p = getelementptr i64, ptr %spec, i64 {S_CALLS}
  %ncalls = load i64, ptr %ncalls.p, align 8
  %ncalls1 = add i64 %ncalls, 1
  store i64 %ncalls1, ptr %ncalls.p, align 8
  %flag = call ptr @wp(ptr %spec, i64 {S_FLAG})
  %checked = icmp ne ptr %flag, null
  br i1 %checked, label %flag.read, label %result
flag.read:
  %fv = load atomic i32, ptr %flag monotonic, align 4
  %set = icmp ne i32 %fv, 0
  br i1 %set, label %raise, label %result
raise:
  ; the module's own check raises the IndexError (and clears the flag), exactly as the slow path does
  %check = call ptr @wp(ptr %spec, i64 {S_CHECK})
  %r = call ptr @PyObject_CallNoArgs(ptr %check)
  %r.null = icmp eq ptr %r, null
  br i1 %r.null, label %error, label %raise.ok
raise.ok:
  call void @Py_DecRef(ptr %r)
  br label %result
error:
  call void @release(ptr %outs, i64 %nout)
  ret ptr null
result:
  %cw = call i64 @w(ptr %spec, i64 {S_COPIES})
  %copies = icmp ne i64 %cw, 0
  br i1 %copies, label %copy.after, label %build
copy.after:
  %sec = getelementptr i64, ptr %spec, i64 %cw
  %copied = call i1 @copy_in(ptr %sec, ptr %args, ptr %ptrs, ptr %scal, i64 1)
  br label %build
build:
  %kind = call i64 @w(ptr %spec, i64 {S_KIND})
  %rs = call i64 @w(ptr %spec, i64 {S_SLOT})
  %rp = getelementptr ptr, ptr %outs, i64 %rs
  %ro = load ptr, ptr %rp, align 8
  switch i64 %kind, label %post [ i64 {R_ARRAY}, label %single
                                  i64 {R_SCALAR}, label %scalar ]
single:
  call void @Py_IncRef(ptr %ro)
  br label %done
scalar:
  %empty = call ptr @wp(ptr %table, i64 {T_EMPTY})
  %sv = call ptr @PyObject_GetItem(ptr %ro, ptr %empty)
  br label %done
post:
  %pf = call ptr @wp(ptr %spec, i64 {S_POST})
  %pv = call ptr @PyObject_Vectorcall(ptr %pf, ptr %outs, i64 %nout, ptr null)
  br label %done
done:
  %res = phi ptr [ %ro, %single ], [ %sv, %scalar ], [ %pv, %post ]
  call void @release(ptr %outs, i64 %nout)
  ret ptr %res
}}

; METH_FASTCALL: PyObject *(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
define ptr @jitop_fastcall(ptr %self, ptr %args, i64 %nargs) {{
entry:
  %ptrs = alloca [{MAX_PARAMS + 1} x ptr], align 16
  %scal = alloca [{MAX_PARAMS} x i64], align 16
  %slots = alloca [{MAX_SLOTS} x i64], align 16
  %odims = alloca [{MAX_ODIMS} x i64], align 16
  %nbytes = alloca i64, align 8
  %table = call ptr @at(ptr %self, i64 {o["b_ptr"]})
  %n = call i64 @w(ptr %table, i64 {T_NSPECS})
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %next ]
  %end = icmp eq i64 %i, %n
  br i1 %end, label %miss, label %try
try:
  %si = add i64 %i, {T_SPECS}
  %spec = call ptr @wp(ptr %table, i64 %si)
  %na = call i64 @w(ptr %spec, i64 {S_NARGS})
  %na.ok = icmp eq i64 %na, %nargs
  br i1 %na.ok, label %try.match, label %next
try.match:
  %pw = call i64 @w(ptr %spec, i64 {S_PROG})
  %sym = icmp ne i64 %pw, 0
  %sl = select i1 %sym, ptr %slots, ptr null
  %m = call i1 @match(ptr %table, ptr %spec, ptr %args, ptr %ptrs, ptr %scal, ptr %sl)
  br i1 %m, label %matched, label %next
matched:
  br i1 %sym, label %program, label %hit
program:
  %prog = getelementptr i64, ptr %spec, i64 %pw
  %ok = call i1 @dimprog(ptr %prog, ptr %slots, ptr %odims, ptr %nbytes)
  br i1 %ok, label %hit, label %next
next:
  %i1 = add i64 %i, 1
  br label %loop
hit:
  %cw = call i64 @w(ptr %spec, i64 {S_COPIES})
  %copies = icmp ne i64 %cw, 0
  br i1 %copies, label %copy, label %hit.run
copy:  ; regions copied into arguments first: a check that fails writes nothing, and the call misses
  %sec = getelementptr i64, ptr %spec, i64 %cw
  %copied = call i1 @copy_in(ptr %sec, ptr %args, ptr %ptrs, ptr %scal, i64 0)
  br i1 %copied, label %hit.run, label %next
hit.run:
  br i1 %sym, label %hit.sym, label %hit.static
hit.static:
  %g = call i64 @w(ptr %spec, i64 {S_GIL})
  %r = call ptr @run(ptr %table, ptr %spec, ptr %ptrs, ptr null, ptr null, i64 %g, ptr %args, ptr %scal)
  ret ptr %r
hit.sym:
  %gw = call i64 @w(ptr %spec, i64 {S_GIL})
  %nb = load i64, ptr %nbytes, align 8
  %big = icmp sge i64 %nb, {RELEASE_GIL_BYTES}
  %bigw = zext i1 %big to i64
  %auto = icmp eq i64 %gw, {GIL_FROM_PROGRAM}
  %gs = select i1 %auto, i64 %bigw, i64 %gw
  %rs = call ptr @run(ptr %table, ptr %spec, ptr %ptrs, ptr %slots, ptr %odims, i64 %gs, ptr %args, ptr %scal)
  ret ptr %rs
miss:
  %s = call ptr @wp(ptr %table, i64 {T_SENTINEL})
  call void @Py_IncRef(ptr %s)
  ret ptr %s
}}
"""




# ** the symbolic parts of the entry, built with llvmlite.ir and printed into the entry's module **


def _symbolic_ir() -> str:
    """@dims_bind and @dimprog (with the intrinsics they declare), as LLVM IR text for `_entry_ir`."""
    mod = ir.Module("jitop_fastcall_symbolic")
    _dims_bind(mod)
    _dimprog(mod)
    return "\n".join(str(g) for g in mod.functions)


def _function(mod: ir.Module, name: str, params: list[str], blocks: list[str]) -> tuple[ir.Function, dict]:
    fn = ir.Function(mod, ir.FunctionType(I1, [PTR if p != "n" else I64 for p in params]), name)
    fn.linkage = "internal"
    for arg, p in zip(fn.args, params):
        arg.name = p
    return fn, {label: fn.append_basic_block(label) for label in blocks}


def _dims_bind(mod: ir.Module) -> None:
    """@dims_bind(have, want, n, slots): an input's dims against a symbolic record's dim words (dimprog):
    constants compared, binds stored into their slot, ties compared with their slot's value."""
    fn, bb = _function(mod, "dims_bind", ["have", "want", "n", "slots"],
                       ["entry", "loop", "cmp", "fixed", "symbolic", "bind", "tie", "next", "yes", "no"])
    have, want, n, slots = fn.args
    b = ir.IRBuilder(bb["entry"])
    b.branch(bb["loop"])
    b.position_at_end(bb["loop"])
    d = b.phi(I64, "d")
    d.add_incoming(I64(0), bb["entry"])
    b.cbranch(b.icmp_signed("==", d, n), bb["yes"], bb["cmp"])
    b.position_at_end(bb["cmp"])
    x, y = word(b, have, d, "x"), word(b, want, d, "y")
    d.add_incoming(b.add(d, I64(1), "d1"), bb["next"])
    b.cbranch(b.icmp_signed(">=", y, I64(0)), bb["fixed"], bb["symbolic"])
    b.position_at_end(bb["fixed"])
    b.cbranch(b.icmp_signed("==", x, y), bb["next"], bb["no"])
    b.position_at_end(bb["symbolic"])
    slot = b.sub(I64(-1), y, "slot")
    b.cbranch(b.icmp_signed("<", slot, I64(MAX_SLOTS)), bb["bind"], bb["tie"])
    b.position_at_end(bb["bind"])
    b.store(x, b.gep(slots, [slot], source_etype=I64))
    b.branch(bb["next"])
    b.position_at_end(bb["tie"])
    bound = word(b, slots, b.sub(slot, I64(MAX_SLOTS)), "bound")
    b.cbranch(b.icmp_signed("==", bound, x), bb["next"], bb["no"])
    b.position_at_end(bb["next"])
    b.branch(bb["loop"])
    for label, value in (("yes", 1), ("no", 0)):
        b.position_at_end(bb[label])
        b.ret(I1(value))


_ARITH = {Op.ADD: "sadd", Op.SUB: "ssub", Op.MUL: "smul"}
_COMPARE = {Op.ASSERT_EQ: "==", Op.ASSERT_NE: "!=", Op.ASSERT_GE: ">=", Op.ASSERT_GT: ">"}


def _dimprog(mod: ir.Module) -> None:
    """@dimprog(prog, slots, odims, nbytes): runs a symbolic signature's check-and-shape program
    (jitop.runtime.dimprog.Op): 1 if every check holds, with the output dims in odims and the bytes the call
    touches in nbytes; 0 on a failed assertion, a zero divisor, an int64 overflow or a negative output dim."""
    names = ["entry", "loop", "push.slot", "push.const", "push", "store", "store.ok", "gil", "operands",
             *(op.name.lower() for op in _ARITH), "divisor", "divide", "min", "max", "value",
             *(op.name.lower() for op in _COMPARE), "pop2", "done", "fail"]
    fn, bb = _function(mod, "dimprog", ["prog", "slots", "odims", "nbytes"], names)
    prog, slots, odims, nbytes = fn.args
    b = ir.IRBuilder(bb["entry"])
    stack = b.alloca(ir.ArrayType(I64, MAX_STACK), name="stack")
    stack.type = PTR  # opaque, like every other pointer here (llvmlite types allocas)
    b.branch(bb["loop"])
    b.position_at_end(bb["loop"])
    pc, sp = b.phi(I64, "pc"), b.phi(I64, "sp")
    for v in (pc, sp):
        v.add_incoming(I64(0), bb["entry"])
    r = _Regs(op=word(b, prog, pc, "op"), pc1=b.add(pc, I64(1), "pc1"), pc2=b.add(pc, I64(2), "pc2"),
              sp=sp, up=b.add(sp, I64(1), "up"), down=b.sub(sp, I64(1), "down"), down2=b.sub(sp, I64(2), "down2"))
    r.top = b.gep(stack, [r.down], source_etype=I64, name="top")
    r.below = b.gep(stack, [r.down2], source_etype=I64, name="below")
    sw = b.switch(r.op, bb["fail"])
    for op, label in ((Op.END, "done"), (Op.PUSH_SLOT, "push.slot"), (Op.PUSH_CONST, "push.const"),
                      (Op.STORE_OUT, "store"), (Op.SET_GIL, "gil")):
        sw.add_case(I64(int(op)), bb[label])
    for op in Op:
        if Op.ADD <= op <= Op.ASSERT_GT:
            sw.add_case(I64(int(op)), bb["operands"])
    _dimprog_push(b, bb, r, prog, slots, stack)
    _dimprog_store(b, bb, r, prog, odims, nbytes)
    _dimprog_operands(b, mod, bb, r)
    for label, value in (("done", 1), ("fail", 0)):
        b.position_at_end(bb[label])
        b.ret(I1(value))


class _Regs:
    """The interpreter loop's values: op, pc + 1, pc + 2, sp and its neighbours, the top two cells."""

    def __init__(self, **values: ir.Value):
        self.__dict__.update(values)


def _back(b: ir.IRBuilder, bb: dict, pc: ir.Value, sp: ir.Value) -> None:
    """Branch back to the loop with the next pc and sp."""
    pc_phi, sp_phi = bb["loop"].instructions[0], bb["loop"].instructions[1]
    pc_phi.add_incoming(pc, b.block)
    sp_phi.add_incoming(sp, b.block)
    b.branch(bb["loop"])


def _dimprog_push(b: ir.IRBuilder, bb: dict, r: _Regs, prog: ir.Value, slots: ir.Value, stack: ir.Value) -> None:
    b.position_at_end(bb["push.slot"])
    sv = word(b, slots, word(b, prog, r.pc1, "slot"), "sv")
    b.branch(bb["push"])
    b.position_at_end(bb["push.const"])
    cv = word(b, prog, r.pc1, "cv")
    b.branch(bb["push"])
    b.position_at_end(bb["push"])
    pv = b.phi(I64, "pv")
    pv.add_incoming(sv, bb["push.slot"])
    pv.add_incoming(cv, bb["push.const"])
    b.store(pv, b.gep(stack, [r.sp], source_etype=I64))
    _back(b, bb, r.pc2, r.up)


def _dimprog_store(b: ir.IRBuilder, bb: dict, r: _Regs, prog: ir.Value, odims: ir.Value,
                   nbytes: ir.Value) -> None:
    b.position_at_end(bb["store"])
    out = b.load(r.top, typ=I64, name="out")
    b.cbranch(b.icmp_signed("<", out, I64(0)), bb["fail"], bb["store.ok"])
    b.position_at_end(bb["store.ok"])
    b.store(out, b.gep(odims, [word(b, prog, r.pc1, "j")], source_etype=I64))
    _back(b, bb, r.pc2, r.down)
    b.position_at_end(bb["gil"])
    b.store(b.load(r.top, typ=I64), nbytes)
    _back(b, bb, r.pc1, r.down)


def _dimprog_operands(b: ir.IRBuilder, mod: ir.Module, bb: dict, r: _Regs) -> None:
    """The two-operand ops: arithmetic (checked), floor division and modulo, min, max and the assertions."""
    b.position_at_end(bb["operands"])
    rhs, lhs = b.load(r.top, typ=I64, name="b"), b.load(r.below, typ=I64, name="a")
    sw = b.switch(r.op, bb["fail"])
    for op in [*_ARITH, Op.MIN, Op.MAX, *_COMPARE]:
        sw.add_case(I64(int(op)), bb[op.name.lower()])
    for op in (Op.FLOORDIV, Op.FLOORMOD):
        sw.add_case(I64(int(op)), bb["divisor"])
    results = []
    for op, fn in _ARITH.items():
        b.position_at_end(bb[op.name.lower()])
        pair = b.call(_overflow_intrinsic(mod, fn), [lhs, rhs])
        results.append((b.extract_value(pair, 0), b.block))
        b.cbranch(b.extract_value(pair, 1), bb["fail"], bb["value"])
    results.append(_floor_divide(b, bb, r.op, lhs, rhs))
    for op, pred in ((Op.MIN, "<"), (Op.MAX, ">")):
        b.position_at_end(bb[op.name.lower()])
        results.append((b.select(b.icmp_signed(pred, lhs, rhs), lhs, rhs), b.block))
        b.branch(bb["value"])
    b.position_at_end(bb["value"])
    v = b.phi(I64, "v")
    for value, block in results:
        v.add_incoming(value, block)
    b.store(v, r.below)
    _back(b, bb, r.pc1, r.down)
    for op, pred in _COMPARE.items():
        b.position_at_end(bb[op.name.lower()])
        b.cbranch(b.icmp_signed(pred, lhs, rhs), bb["pop2"], bb["fail"])
    b.position_at_end(bb["pop2"])
    _back(b, bb, r.pc1, r.down2)


def _overflow_intrinsic(mod: ir.Module, fn: str) -> ir.Function:
    """llvm.<fn>.with.overflow.i64: {result, overflowed}."""
    name = f"llvm.{fn}.with.overflow.i64"
    return mod.globals.get(name) or ir.Function(mod, ir.FunctionType(ir.LiteralStructType([I64, I1]),
                                                                     [I64, I64]), name)


def _floor_divide(b: ir.IRBuilder, bb: dict, op: ir.Value, a: ir.Value, d: ir.Value) -> tuple[ir.Value, ir.Block]:
    """a // d or a % d (op) with Python's floor semantics; a zero divisor or INT64_MIN // -1 fails."""
    b.position_at_end(bb["divisor"])
    zero = b.icmp_signed("==", d, I64(0))
    overflow = b.and_(b.icmp_signed("==", d, I64(-1)), b.icmp_signed("==", a, I64(dimprog.I64_MIN)))
    b.cbranch(b.or_(zero, overflow), bb["fail"], bb["divide"])
    b.position_at_end(bb["divide"])
    q, rem = b.sdiv(a, d, "q"), b.srem(a, d, "rem")
    # the remainder's sign differs from the divisor's: floor, not truncation
    adjust = b.and_(b.icmp_signed("!=", rem, I64(0)), b.icmp_signed("<", b.xor(rem, d), I64(0)), "adjust")
    fq = b.sub(q, b.zext(adjust, I64))
    fr = b.select(adjust, b.add(rem, d), rem)
    result = b.select(b.icmp_signed("==", op, I64(int(Op.FLOORMOD))), fr, fq, "dv")
    b.branch(bb["value"])
    return result, b.block

# ** loading (once per process) **
class _MethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p), ("ml_flags", ctypes.c_int),
                ("ml_doc", ctypes.c_char_p)]


class _NoStore:
    def get(self, key: str) -> None:
        return None

    def put(self, key: str, value: bytes) -> None:
        pass

    def delete(self, key: str) -> None:
        pass


_object_store: Callable[[], Any] = _NoStore
_lock = threading.Lock()
_state: dict[str, Any] | None = None   # the loaded entry; {} when unavailable
_store_missed = False                  # a caller that may not compile found no cached object code


def use_object_store(make_store: Callable[[], Any]) -> None:
    """Where the entry keeps its object code between processes: `make_store()` (called when the entry is first
    needed) returns anything with get(key) -> bytes | None, put(key, bytes) and delete(key)."""
    global _object_store
    _object_store = make_store


def available(compile: bool = True) -> bool:
    """Whether the fast entry can be used in this process: the object layouts and numpy's C API it relies on
    check out against live objects (otherwise every call takes the slow path).

    compile=False: only if its object code is loaded already or in the object store (a process that only
    loads saved kernels never runs LLVM, not even for the entry).
    """
    return ENABLED and bool(_loaded(compile))


def _loaded(compile: bool = True) -> dict[str, Any]:
    global _state, _store_missed
    if _state is None and (compile or not _store_missed):
        with _lock:
            if _state is None:
                api = _numpy_api() if _layout_ok() else None
                loaded = _load_entry(api, compile) if api is not None else {}
                if loaded is None:
                    _store_missed = True  # not now: a later caller that may compile will
                    return {}
                _state = loaded
    return _state or {}


def _load_entry(api: tuple[int, int], compile: bool) -> dict[str, Any] | None:
    """The loaded entry; None if its object code is not cached and `compile` is False. A cached object that
    does not load (not an object file, or one without the entry's symbol: another component's) is a miss and is
    removed (the cache never makes a call fail, nor leaves the entry unavailable from one process to the next):
    compiled again if allowed, else None (a later caller that may compile builds and stores it)."""
    host = Target.host()
    key = "fastcall-" + hashlib.sha256(json.dumps([_entry_sources(), host.triple, host.cpu, host.features,
                                                   llvm_version()]).encode()).hexdigest()
    store = _object_store()
    obj = store.get(key)
    if obj is not None:
        try:
            return _load(api, obj)
        except (ValueError, RuntimeError):
            getattr(store, "delete", lambda _: None)(key)
    if not compile:
        return None
    _, obj = compile_ir(_entry_ir(), host)
    loaded = _load(api, obj)
    store.put(key, obj)
    return loaded


def _entry_sources() -> str:
    """A digest of the modules the entry's IR is generated from (this one, copy_in, dimprog, ir_words): its
    cache key, so a process that loads the stored entry never generates the IR (~8 ms)."""
    from jitop.runtime import copy_in, ir_words
    h = hashlib.sha256()
    for module in (sys.modules[__name__], copy_in, dimprog, ir_words):
        with open(module.__file__, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _pyapi(name: str, restype: Any, *argtypes: Any) -> Any:
    """A private prototype of a C API function (ctypes.pythonapi's own are shared with other code): called with
    the GIL held; an exception it sets is raised."""
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


def _load(api: tuple[int, int], obj: bytes) -> dict[str, Any]:
    for name in _PY_SYMBOLS:  # MCJIT resolves them through LLVM's table, which may not see the executable's
        llvm.add_symbol(name, ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value)
    addr = load_object(obj, ["jitop_fastcall"])["jitop_fastcall"]
    method = _MethodDef(b"jitop_fast_entry", addr, METH_FASTCALL, None)  # outlives every built-in made from it
    new = _pyapi("PyCFunction_NewEx", ctypes.py_object, ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p)
    return {"method": method, "new": new, "new_from_descr": api[0], "array_type": api[1], "empty": ()}


def _layout_ok() -> bool:
    """Whether the struct offsets the entry reads hold in this process (checked on live objects)."""
    try:
        return _check_layout()
    except (ValueError, OverflowError, AttributeError, TypeError):
        return False


def _check_layout() -> bool:
    if sys.maxsize != 2 ** 63 - 1:
        return False
    word = lambda obj, off: ctypes.c_ssize_t.from_address(id(obj) + off).value  # noqa: E731
    i32 = lambda obj, off: ctypes.c_int32.from_address(id(obj) + off).value     # noqa: E731
    base = np.arange(24.0).reshape(4, 6)
    views = [base, base[:, ::2], base[::-1], base.T, np.zeros((), np.float32), np.ones(3, np.int8)]
    ro = np.ones(5)
    ro.flags.writeable = False
    views.append(ro)
    views.append(np.frombuffer(bytearray(17), np.uint8)[1:].view(np.int32)[:3])  # misaligned
    for a in views:
        nd = a.ndim
        dims = ctypes.cast(word(a, _OFF["dimensions"]), ctypes.POINTER(ctypes.c_ssize_t))
        strides = ctypes.cast(word(a, _OFF["strides"]), ctypes.POINTER(ctypes.c_ssize_t))
        flags = i32(a, _OFF["flags"])
        ok = (word(a, _OFF["ob_type"]) == id(np.ndarray) and word(a, _OFF["data"]) == a.ctypes.data
              and i32(a, _OFF["nd"]) == nd and tuple(dims[k] for k in range(nd)) == a.shape
              and tuple(strides[k] for k in range(nd)) == a.strides
              and word(a, _OFF["base"]) == (0 if a.base is None else id(a.base))
              and word(a, _OFF["descr"]) == id(a.dtype)
              and bool(flags & C_CONTIGUOUS) == a.flags.c_contiguous and bool(flags & ALIGNED) == a.flags.aligned
              and bool(flags & WRITEABLE) == a.flags.writeable)
        if not ok:
            return False
    probe, held = object(), []
    counts = []
    for _ in range(3):  # the field moves with sys.getrefcount, one per reference taken
        counts.append((word(probe, _OFF["ob_refcnt"]), sys.getrefcount(probe)))
        held.append(probe)
    if not all(r - counts[0][0] == k and g - counts[0][1] == k for k, (r, g) in enumerate(counts)) \
            or not 0 < counts[0][0] <= counts[0][1] or word(1.5, _OFF["ob_type"]) != id(float):
        return False
    words = _words_type(2)()
    return word(words, _OFF["b_ptr"]) == ctypes.addressof(words)


def _numpy_api() -> tuple[int, int] | None:
    """(PyArray_NewFromDescr, &PyArray_Type) from numpy's C API table, after checking both on live objects;
    None if they do not check out."""
    try:
        from numpy._core import _multiarray_umath as mu
    except ImportError:  # numpy 1.x
        from numpy.core import _multiarray_umath as mu  # type: ignore[no-redef]
    get_name = _pyapi("PyCapsule_GetName", ctypes.c_char_p, ctypes.py_object)
    get_pointer = _pyapi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
    capsule = getattr(mu, "_ARRAY_API", None)
    if capsule is None or type(capsule).__name__ != "PyCapsule":
        return None
    table = get_pointer(capsule, get_name(capsule))
    if not table:
        return None
    slots = (ctypes.c_void_p * (_NEW_FROM_DESCR + 1)).from_address(table)
    if slots[_ARRAY_TYPE] != id(np.ndarray):
        return None
    new_from_descr = slots[_NEW_FROM_DESCR]
    return (new_from_descr, id(np.ndarray)) if _new_from_descr_ok(new_from_descr) else None


def _new_from_descr_ok(address: int) -> bool:
    """Whether `address` behaves as PyArray_NewFromDescr(&PyArray_Type, descr, nd, dims, NULL, NULL, 0, NULL)."""
    fn = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.py_object, ctypes.c_int,
                           ctypes.POINTER(ctypes.c_ssize_t), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                           ctypes.c_void_p)(address)
    incref = _pyapi("Py_IncRef", None, ctypes.py_object)
    for dt, shape in ((np.dtype(np.float32), (2, 3)), (np.dtype(np.int16), ()), (np.dtype(np.float64), (0, 4))):
        incref(dt)  # the function steals a reference to the descriptor
        a = fn(id(np.ndarray), dt, len(shape), (ctypes.c_ssize_t * max(1, len(shape)))(*shape), None, None, 0, None)
        if not (type(a) is np.ndarray and a.dtype is dt and a.shape == shape and a.flags.c_contiguous
                and a.flags.writeable and a.flags.aligned and a.base is None and sys.getrefcount(a) == 2):
            return False
    return True


# ** specs: plain data the entry reads **
Dim = int | str  # a dimension: an int, or (a signature with symbols) its printed expression over them


@dataclass(frozen=True)
class Array:
    """Input: argument `position`, an exact ndarray of `dtype` (the native descriptor) and `shape` (a symbolic
    spec's dims may be expressions of its symbols: "n", "n * 2")."""

    position: int
    dtype: np.dtype
    shape: tuple[Dim, ...]


@dataclass(frozen=True)
class Scalar:
    """Input: argument `position`, an exact Python `kind` (float, int or bool), as a 0-d float64/int64/bool;
    an int must lie in [lo, hi]. `symbol`: the spec's symbol whose value the int is (a Python int used as a
    size; it binds the symbol as an input's dim does)."""

    position: int
    kind: type
    lo: int = -2 ** 63
    hi: int = 2 ** 63 - 1
    symbol: str | None = None


@dataclass(frozen=True)
class Const:
    """Input: a constant array (C-contiguous and aligned), passed as is."""

    array: np.ndarray


@dataclass(frozen=True)
class Output:
    """A freshly allocated output of `shape` (dims as Array's); `recycle`: reuse the previous call's array when
    nothing else holds it (and, for a symbolic spec, it has the new shape)."""

    dtype: np.dtype
    shape: tuple[Dim, ...]
    recycle: bool = False


class Spec:
    """One compiled signature as the entry reads it: nargs exact positional arguments, `inputs` then
    `outputs` as the kernel's parameters, and the result: output `result` (an int), that 0-d output as a
    numpy scalar (`("scalar", k)`), or `post(*outputs)` (a callable).

    A kernel with `symbols` (its symbol names, in the order of its i64[k] last argument) has symbolic dims:
    the entry reads each symbol from the first input dim that is exactly its name, checks every other symbolic
    input dim and the `guards` ("n >= 2", "m != 1"), computes the output dims, and misses (the slow path runs)
    when any check fails (jitop.runtime.dimprog).

    `copies`: regions copied into arguments before or after the kernel (jitop.runtime.copy_in.CopyIn; the
    arrays they involve have int dims).

    >>> spec = Spec(2, address, [Array(0, f4, (10,)), Array(1, f4, (10,))], [Output(f4, (10,))], 0)  # doctest: +SKIP
    >>> spec = Spec(2, address, [Array(0, f4, ("n",)), Array(1, f4, ("n",))], [Output(f4, ("n",))], 0,
    ...             symbols=["n"], guards=["n >= 2"])                                                # doctest: +SKIP
    """

    def __init__(self, nargs: int, kernel_address: int, inputs: Sequence[Array | Scalar | Const],
                 outputs: Sequence[Output], result: int | tuple[str, int] | Callable[..., Any],
                 error_flag: int = 0, raise_error: Callable[[], None] | None = None, release_gil: bool | None = None,
                 symbols: Sequence[str] = (), guards: Sequence[str] = (), copies: Sequence[CopyIn] = ()):
        if len(inputs) + len(outputs) + bool(symbols) > MAX_PARAMS or not 0 < len(inputs) + len(outputs):
            raise ValueError(f"a fast entry calls kernels of 1 to {MAX_PARAMS} parameters (the symbols count one)")
        plan = self._plan(inputs, outputs, symbols, guards)
        words = [0] * S_RECORDS
        self._keep: list[Any] = []  # every object a word points to
        in_dims = iter(plan.inputs) if plan else None
        for i in inputs:
            words += self._input(i, next(in_dims) if in_dims and isinstance(i, Array) else None, list(symbols))
        out_at = len(words)
        slots = []
        for k, o in enumerate(outputs):
            dt = _native(o.dtype)
            self._keep.append(dt)
            slots.append(len(words) + 3)
            words += [id(dt), len(o.shape), int(o.recycle), 0, *(plan.outputs[k] if plan else o.shape)]
        prog_at = len(words) if plan else 0
        words += plan.program if plan else []
        copies_at = len(words) if copies else 0
        words += self._copies(copies, inputs, outputs) if copies else []
        gil = GIL_FROM_PROGRAM if plan and release_gil is None else \
            int(_nbytes(inputs, outputs) >= RELEASE_GIL_BYTES if release_gil is None else release_gil)
        words[:S_RECORDS] = self._head(nargs, inputs, outputs, kernel_address, gil, error_flag, raise_error,
                                       result, out_at) + [len(symbols), prog_at, copies_at]
        self.words = (ctypes.c_int64 * len(words))(*words)
        self.address = ctypes.addressof(self.words)
        self.nargs = nargs
        self.symbols = list(symbols)
        # the spare outputs are strong references held in the words: dropped with the spec
        weakref.finalize(self, _drop_spares, self.words, slots)

    @staticmethod
    def _copies(copies: Sequence[CopyIn], inputs: Sequence[Array | Scalar | Const],
                outputs: Sequence[Output]) -> list[int]:
        """The words of the regions copied into arguments (jitop.runtime.copy_in.section: ValueError where an
        array a copy involves has a symbolic dim)."""
        info = [("array", i.position, _native(i.dtype), i.shape) if isinstance(i, Array) else
                ("int", i.position) if isinstance(i, Scalar) and i.kind is int else ("other",) for i in inputs]
        return section(copies, info, [(_native(o.dtype), o.shape) for o in outputs])

    @staticmethod
    def _plan(inputs: Sequence[Array | Scalar | Const], outputs: Sequence[Output], symbols: Sequence[str],
              guards: Sequence[str]) -> "dimprog.DimPlan | None":
        """A symbolic spec's dim words and program (None for a static spec, whose dims must all be ints)."""
        arrays = [i for i in inputs if isinstance(i, Array)]
        if not symbols:
            if guards or any(isinstance(d, str) for a in [*arrays, *outputs] for d in a.shape):
                raise ValueError("a spec without symbols has int dims and no guards (give its symbols)")
            return None
        sized = [(_native(a.dtype).itemsize, a.shape) for a in [*arrays, *outputs]]
        const = sum(i.array.nbytes if isinstance(i, Const) else 8 for i in inputs if not isinstance(i, Array))
        held = [i.symbol for i in inputs if isinstance(i, Scalar) and i.symbol is not None]
        return dimprog.plan_dims(symbols, [a.shape for a in arrays], [o.shape for o in outputs], guards,
                                 sized, const, held)

    def _head(self, nargs: int, inputs: Sequence[Any], outputs: Sequence[Output], kernel_address: int, gil: int,
              error_flag: int, raise_error: Callable[[], None] | None,
              result: int | tuple[str, int] | Callable[..., Any], out_at: int) -> list[int]:
        """The spec's words up to S_NSYM."""
        kind, slot, post = (R_ARRAY, result, None) if isinstance(result, int) else \
            (R_SCALAR, result[1], None) if isinstance(result, tuple) else (R_POST, 0, result)
        if kind != R_POST and not 0 <= slot < len(outputs):
            raise ValueError(f"result slot {slot} is not one of the {len(outputs)} outputs")
        if error_flag and raise_error is None:
            raise ValueError("a kernel with an error flag needs the function that raises its error")
        self._keep += [post, raise_error]
        return [nargs, len(inputs), len(outputs), kernel_address, gil, error_flag,
                id(raise_error) if error_flag else 0, kind, slot, id(post) if post is not None else 0, out_at, 0]

    def _input(self, i: Array | Scalar | Const, dim_words: list[int] | None = None,
               symbols: Sequence[str] = ()) -> list[int]:
        if isinstance(i, Array):
            dt = _native(i.dtype)
            self._keep.append(dt)
            return [IN_ARRAY, i.position, id(dt), len(i.shape), *(i.shape if dim_words is None else dim_words)]
        if isinstance(i, Const):
            a = i.array
            if not (type(a) is np.ndarray and a.flags.c_contiguous and a.flags.aligned):
                raise ValueError("a constant input must be a C-contiguous, aligned ndarray")
            self._keep.append(a)
            return [IN_CONST, a.ctypes.data, 0, 0]
        kind = {float: IN_FLOAT, int: IN_INT, bool: IN_BOOL}.get(i.kind)
        if kind is None:
            raise ValueError(f"a scalar input must be a Python float, int or bool, not {i.kind.__name__}")
        words = [kind, i.position, max(i.lo, -2 ** 63), min(i.hi, 2 ** 63 - 1)]
        if i.symbol is None:
            return words
        if i.kind is not int or i.symbol not in symbols:
            raise ValueError(f"scalar input {i.position} holds symbol {i.symbol!r}: an int, and one of {symbols}")
        return [IN_SIZE, *words[1:], symbols.index(i.symbol)]

    @property
    def calls(self) -> int:
        """Calls the native entry served with this signature."""
        return int(self.words[S_CALLS])

    def spares(self) -> list[Any]:
        """The recycled outputs the spec holds (for tests)."""
        n_out, at = self.words[S_NOUT], self.words[S_OUTREC]
        found = []
        for _ in range(n_out):
            if self.words[at + 3]:
                found.append(ctypes.cast(self.words[at + 3], ctypes.py_object).value)
            at += 4 + self.words[at + 1]
        return found


def _drop_spares(words: Any, slots: list[int]) -> None:
    decref = _pyapi("Py_DecRef", None, ctypes.c_void_p)
    for s in slots:
        obj, words[s] = words[s], 0
        if obj:
            decref(obj)


def _native(dtype: Any) -> np.dtype:
    """numpy's own descriptor for a native numeric dtype: the one arrays of that dtype normally carry."""
    given = np.dtype(dtype)
    dt = np.dtype(given.name)
    if given != dt or dt.kind not in "biuf" or np.empty(0, dt).dtype is not dt:
        raise ValueError(f"dtype {dtype} has no canonical native descriptor")
    return dt


def _nbytes(inputs: Sequence[Array | Scalar | Const], outputs: Sequence[Output]) -> int:
    """The bytes a static signature's call touches (the GIL is released from RELEASE_GIL_BYTES)."""
    n = sum(i.array.nbytes if isinstance(i, Const) else
            _native(i.dtype).itemsize * _prod(i.shape) if isinstance(i, Array) else 8 for i in inputs)
    return n + sum(_native(o.dtype).itemsize * _prod(o.shape) for o in outputs)


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class Table:
    """The signatures one fast entry serves, tried in order. `entry()` is the built-in function: call it with
    the positional arguments; it returns the result, or MISS. `hits` counts the calls it served.

    >>> fast = Table([spec]).entry()     # doctest: +SKIP
    """

    def __init__(self, specs: Sequence[Spec], hits: ctypes.c_int64 | None = None):
        state = _loaded()
        if not state:
            raise RuntimeError("the fast entry is not available in this process (see available())")
        self.specs = list(specs)
        self.hits = hits if hits is not None else ctypes.c_int64(0)
        head = [0] * T_SPECS
        head[T_NSPECS], head[T_SENTINEL], head[T_HITS] = len(self.specs), id(MISS), ctypes.addressof(self.hits)
        head[T_NEW], head[T_ARRAY], head[T_EMPTY] = state["new_from_descr"], state["array_type"], id(state["empty"])
        head[T_FLOAT], head[T_LONG], head[T_BOOL], head[T_TRUE] = id(float), id(int), id(bool), id(True)
        words = [*head, *(s.address for s in self.specs)]
        mem = _words_type(len(words))(*words)
        mem.keep = (self.specs, self.hits, state["method"])  # the built-in holds `mem`; `mem` holds the rest
        self._entry = state["new"](ctypes.addressof(state["method"]), mem, None)

    def entry(self) -> Callable[..., Any]:
        """The built-in function: fast(*args) -> the result, or MISS."""
        return self._entry


_word_types: dict[int, type] = {}


def _words_type(n: int) -> type:
    """An int64 array type of n words whose instances have a __dict__: a Table's memory (the entry's `self`)
    keeps what its words point to alive there."""
    t = _word_types.get(n)
    if t is None:
        t = _word_types[n] = type(f"_Words{n}", (ctypes.Array,), {"_type_": ctypes.c_int64, "_length_": n})
    return t
