"""The native entry's LLVM IR, built with llvmlite.ir: `jitop_fastcall(self, args, nargs)`, CPython's
METH_FASTCALL function that jitop.runtime.fastcall compiles once per machine, and the functions it calls.

The entry reads `self`'s table and its specs as int64 words (jitop.runtime.entry_words) and, for the first spec
whose inputs the call's arguments fit (`match`; a symbolic spec's dim program holding: jitop.runtime.dimprog_ir),
makes the spec's copies into arguments (jitop.runtime.copy_in), allocates the outputs (`output`), calls the
kernel with the GIL released or held (`run`, `invoke`) and builds the result; otherwise it returns the table's
sentinel (MISS) and the caller takes its slow path.

>>> mod = entry_module()
>>> mod.get_global("jitop_fastcall").linkage, mod.get_global("match").linkage
('', 'internal')
"""
from __future__ import annotations

from llvmlite import ir

from jitop.runtime.copy_in import add_copy_in
from jitop.runtime.dimprog import MAX_ODIMS, MAX_SLOTS
from jitop.runtime.dimprog_ir import add_dimprog, add_dims_bind
from jitop.runtime.entry_words import (
    ALIGNED, C_CONTIGUOUS, GIL_FROM_PROGRAM, IN_ARRAY, IN_BOOL, IN_CONST, IN_FLOAT, IN_INT, IN_SIZE, MAX_PARAMS,
    OFFSETS, R_ARRAY, R_SCALAR, RELEASE_GIL_BYTES, S_CALLS, S_CHECK, S_COPIES, S_FLAG, S_GIL, S_KERNEL, S_KIND,
    S_NARGS, S_NIN, S_NOUT, S_OUTREC, S_POST, S_PROG, S_RECORDS, S_SLOT, T_ARRAY, T_BOOL, T_EMPTY, T_FLOAT, T_HITS,
    T_LONG, T_NEW, T_NSPECS, T_SENTINEL, T_SPECS, T_TRUE, WRITEABLE)
from jitop.runtime.ir_words import (
    I1, I8, I32, I64, PTR, CodePointer, answer, call_named, counted, function, i64_variable, index_loop, pointer_word,
    require, stack_array, stack_slot, word)

__all__ = ["PY_API", "entry_module"]

VOID, DOUBLE, NULL = ir.VoidType(), ir.DoubleType(), ir.Constant(PTR, None)

# the C API functions the entry calls (fastcall registers their addresses with LLVM before loading it)
PY_API = {"Py_IncRef": (VOID, [PTR]), "Py_DecRef": (VOID, [PTR]), "PyEval_SaveThread": (PTR, []),
          "PyEval_RestoreThread": (VOID, [PTR]), "PyObject_CallNoArgs": (PTR, [PTR]),
          "PyObject_GetItem": (PTR, [PTR, PTR]), "PyObject_Vectorcall": (PTR, [PTR, PTR, I64, PTR]),
          "PyFloat_AsDouble": (DOUBLE, [PTR]), "PyLong_AsLongLongAndOverflow": (I64, [PTR, PTR])}
# PyArray_NewFromDescr(subtype, descr, nd, dims, strides, data, flags, obj), called through numpy's API table
_NEW_FROM_DESCR = ir.FunctionType(PTR, [PTR, PTR, I32, PTR, PTR, PTR, I32, PTR])


def entry_module() -> ir.Module:
    """The entry's module: `jitop_fastcall` and the internal functions it calls."""
    mod = ir.Module("jitop_fastcall")
    for name, (ret, params) in PY_API.items():
        ir.Function(mod, ir.FunctionType(ret, params), name)
    _dims_equal(mod)
    add_dims_bind(mod)
    add_dimprog(mod)
    add_copy_in(mod, OFFSETS["flags"], WRITEABLE)
    _match(mod)
    _output(mod)
    _release(mod)
    _invoke(mod)
    _run(mod)
    _fastcall(mod)
    return mod


# ** reading objects and words **
def _field(b: ir.IRBuilder, obj: ir.Value, name: str, typ: ir.Type = PTR) -> ir.Value:
    """An object's field at its C offset (OFFSETS)."""
    return b.load(b.gep(obj, [I64(OFFSETS[name])], source_etype=I8), typ=typ, name=name)


def _argument(b: ir.IRBuilder, args: ir.Value, k: ir.Value) -> ir.Value:
    """args[k] of the call's PyObject *const *args."""
    return b.load(b.gep(args, [k], source_etype=PTR), typ=PTR, name="arg")


def _is(b: ir.IRBuilder, a: ir.Value, c: ir.Value) -> ir.Value:
    return b.icmp_unsigned("==", a, c)


# ** the entry's functions **
def _dims_equal(mod: ir.Module) -> None:
    """@dims_equal(have, want, n): the first n words of two i64 arrays are equal."""
    fn, bb = function(mod, "dims_equal", I1, [("have", PTR), ("want", PTR), ("n", I64)],
                      ["entry", "loop", "cmp", "yes", "no"])
    have, want, n = fn.args
    b = ir.IRBuilder(bb["entry"])
    d = index_loop(b, bb, n)
    equal = b.icmp_signed("==", word(b, have, d, "x"), word(b, want, d, "y"))
    d.add_incoming(b.add(d, I64(1), "d1"), bb["cmp"])
    b.cbranch(equal, bb["loop"], bb["no"])
    answer(b, bb)


class _Record:
    """The input record at word `at` of a spec, as `match` reads it: kind, its three words, and where the call's
    value goes (the kernel's parameter k, a scalar's cell)."""

    def __init__(self, b: ir.IRBuilder, spec: ir.Value, at: ir.Value, k: ir.Value, ptrs: ir.Value,
                 scal: ir.Value):
        self.spec, self.at = spec, at
        self.kind = word(b, spec, at, "kind")
        self.a, self.b, self.c = (word(b, spec, b.add(at, I64(i)), name) for i, name in ((1, "a"), (2, "b"), (3, "c")))
        self.at4 = b.add(at, I64(4), "at4")
        self.param = b.gep(ptrs, [k], source_etype=PTR, name="param")
        self.cell = b.gep(scal, [k], source_etype=I64, name="cell")


def _match(mod: ir.Module) -> None:
    """@match(table, spec, args, ptrs, scal, slots): whether `args` fit the spec's inputs; fills ptrs[k] with
    input k's data (a scalar's value goes to scal[k], ptrs[k] points to it). A symbolic spec (slots not null)
    binds and ties its dims in `slots` (its program checks the rest)."""
    fn, bb = function(mod, "match", I1, [(p, PTR) for p in ("table", "spec", "args", "ptrs", "scal", "slots")],
                      ["entry", "loop", "body", "next", "yes", "no"])
    table, spec, args, ptrs, scal, slots = fn.args
    b = ir.IRBuilder(bb["entry"])
    overflow = stack_slot(b, I32, "overflow")
    nin = word(b, spec, S_NIN, "nin")
    b.branch(bb["loop"])
    b.position_at_end(bb["loop"])
    k, at = b.phi(I64, "k"), b.phi(I64, "at")
    k.add_incoming(I64(0), bb["entry"])
    at.add_incoming(I64(S_RECORDS), bb["entry"])
    b.cbranch(b.icmp_signed("==", k, nin), bb["yes"], bb["body"])
    b.position_at_end(bb["body"])
    r = _Record(b, spec, at, k, ptrs, scal)
    switch = b.switch(r.kind, bb["no"])
    ends: list[tuple[ir.Value, ir.Block]] = []  # (the next record's word, the block that goes on with it)

    def matched(next_at: ir.Value) -> None:
        ends.append((next_at, b.block))
        b.branch(bb["next"])

    kinds = ((IN_ARRAY, lambda: _match_array(b, r, table, args, slots, bb["no"], matched)),
             (IN_CONST, lambda: _match_const(b, r, matched)),
             (IN_FLOAT, lambda: _match_float(b, r, table, args, bb["no"], matched)),
             ((IN_INT, IN_SIZE), lambda: _match_int(b, r, table, args, slots, overflow, bb["no"], matched)),
             (IN_BOOL, lambda: _match_bool(b, r, table, args, bb["no"], matched)))
    for kind, build in kinds:
        block = fn.append_basic_block("kind")
        for value in kind if isinstance(kind, tuple) else (kind,):
            switch.add_case(I64(value), block)
        b.position_at_end(block)
        build()
    b.position_at_end(bb["next"])
    next_at = b.phi(I64, "at1")
    for value, block in ends:
        next_at.add_incoming(value, block)
    k.add_incoming(b.add(k, I64(1), "k1"), bb["next"])
    at.add_incoming(next_at, bb["next"])
    b.branch(bb["loop"])
    answer(b, bb)


def _match_array(b: ir.IRBuilder, r: _Record, table: ir.Value, args: ir.Value, slots: ir.Value, no: ir.Block,
                 matched) -> None:
    """An exact ndarray (record: position, descriptor, ndim, dims) with the spec's descriptor, ndim and dims,
    C-contiguous and aligned."""
    array = _argument(b, args, r.a)
    require(b, _is(b, _field(b, array, "ob_type"), pointer_word(b, table, T_ARRAY)), no)
    require(b, _is(b, b.ptrtoint(_field(b, array, "descr"), I64), r.b), no)
    require(b, _is(b, b.sext(_field(b, array, "nd", I32), I64), r.c), no)
    flags = b.and_(_field(b, array, "flags", I32), I32(C_CONTIGUOUS | ALIGNED))
    require(b, _is(b, flags, I32(C_CONTIGUOUS | ALIGNED)), no)
    dims, want = _field(b, array, "dimensions"), b.gep(r.spec, [r.at4], source_etype=I64, name="want")
    with b.if_else(b.icmp_unsigned("!=", slots, NULL)) as (symbolic, static):
        with symbolic:  # binds its symbols: a call with side effects, so a branch rather than a select
            bound = call_named(b, "dims_bind", [dims, want, r.c, slots])
            bound_in = b.block
        with static:
            equal = call_named(b, "dims_equal", [dims, want, r.c])
            equal_in = b.block
    fits = b.phi(I1, "fits")
    fits.add_incoming(bound, bound_in)
    fits.add_incoming(equal, equal_in)
    require(b, fits, no)
    b.store(_field(b, array, "data"), r.param, align=8)
    matched(b.add(r.at4, r.c))


def _match_const(b: ir.IRBuilder, r: _Record, matched) -> None:
    """A constant array: its data's address is the record's word, passed as is."""
    b.store(b.inttoptr(r.a, PTR), r.param, align=8)
    matched(r.at4)


def _exact_type(b: ir.IRBuilder, obj: ir.Value, table: ir.Value, which: int, no: ir.Block) -> None:
    require(b, _is(b, _field(b, obj, "ob_type"), pointer_word(b, table, which)), no)


def _pass_cell(b: ir.IRBuilder, r: _Record, value: ir.Value) -> None:
    """A scalar's value into its cell, the cell's address into the kernel's parameter."""
    b.store(value, r.cell, align=8)
    b.store(r.cell, r.param, align=8)


def _match_float(b: ir.IRBuilder, r: _Record, table: ir.Value, args: ir.Value, no: ir.Block, matched) -> None:
    """An exact Python float, passed as a double."""
    obj = _argument(b, args, r.a)
    _exact_type(b, obj, table, T_FLOAT, no)
    _pass_cell(b, r, call_named(b, "PyFloat_AsDouble", [obj]))
    matched(r.at4)


def _match_int(b: ir.IRBuilder, r: _Record, table: ir.Value, args: ir.Value, slots: ir.Value,
               overflow: ir.Value, no: ir.Block, matched) -> None:
    """An exact Python int in [lo, hi] (the record's words b and c), passed as an int64; a size's int (IN_SIZE,
    a symbolic spec) is also its symbol's value, stored into the slot its record's fifth word names."""
    obj = _argument(b, args, r.a)
    _exact_type(b, obj, table, T_LONG, no)
    b.store(I32(0), overflow, align=4)
    value = call_named(b, "PyLong_AsLongLongAndOverflow", [obj, overflow])
    fits = b.and_(b.and_(b.icmp_signed(">=", value, r.b), b.icmp_signed("<=", value, r.c)),
                  _is(b, b.load(overflow, typ=I32, align=4), I32(0)))
    require(b, fits, no)
    _pass_cell(b, r, value)
    is_size = _is(b, r.kind, I64(IN_SIZE))
    with b.if_then(is_size):
        b.store(value, b.gep(slots, [word(b, r.spec, r.at4, "slot")], source_etype=I64), align=8)
    matched(b.select(is_size, b.add(r.at, I64(5)), r.at4))


def _match_bool(b: ir.IRBuilder, r: _Record, table: ir.Value, args: ir.Value, no: ir.Block, matched) -> None:
    """An exact Python bool, passed as an int64 0 or 1."""
    obj = _argument(b, args, r.a)
    _exact_type(b, obj, table, T_BOOL, no)
    _pass_cell(b, r, b.zext(_is(b, obj, pointer_word(b, table, T_TRUE)), I64))
    matched(r.at4)


def _output(mod: ir.Module) -> None:
    """@output(table, descr, nd, dims, recycle, slotp, sym): a new reference to a fresh C-contiguous output, or
    NULL (an exception is set). A recycled output reuses the spare array of the previous call (held in *slotp)
    when nothing else references it (its pages are mapped already) and, for a symbolic signature (sym), its
    dims are the new ones."""
    fn, bb = function(mod, "output", PTR, [("table", PTR), ("descr", PTR), ("nd", I64), ("dims", PTR),
                                           ("recycle", I64), ("slotp", PTR), ("sym", I1)],
                      ["entry", "reuse", "fresh", "keep", "fail"])
    table, descr, nd, dims, recycle, slotp, sym = fn.args
    b = ir.IRBuilder(bb["entry"])
    recycled = b.icmp_signed("!=", recycle, I64(0), "recycled")
    require(b, recycled, bb["fresh"])
    spare = b.load(slotp, typ=PTR, align=8, name="spare")
    require(b, b.icmp_unsigned("!=", spare, NULL), bb["fresh"])
    require(b, _is(b, b.load(spare, typ=I64, align=8, name="refcnt"), I64(1)), bb["fresh"])
    with b.if_then(sym):
        require(b, call_named(b, "dims_equal", [_field(b, spare, "dimensions"), dims, nd]), bb["fresh"])
    b.branch(bb["reuse"])
    b.position_at_end(bb["reuse"])
    call_named(b, "Py_IncRef", [spare])
    b.ret(spare)
    b.position_at_end(bb["fresh"])
    call_named(b, "Py_IncRef", [descr])  # PyArray_NewFromDescr steals it
    new = pointer_word(b, table, T_NEW, "new", typ=CodePointer(_NEW_FROM_DESCR))
    array = b.call(new, [pointer_word(b, table, T_ARRAY), descr, b.trunc(nd, I32), dims, NULL, NULL, I32(0), NULL])
    b.cbranch(_is(b, array, NULL), bb["fail"], bb["keep"])
    b.position_at_end(bb["keep"])
    with b.if_then(recycled):  # the new array is the next call's spare; the old one is still referenced elsewhere
        old = b.load(slotp, typ=PTR, align=8, name="old")
        call_named(b, "Py_IncRef", [array])
        b.store(array, slotp, align=8)
        with b.if_then(b.icmp_unsigned("!=", old, NULL)):
            call_named(b, "Py_DecRef", [old])  # never freed here: something else holds it
    b.ret(array)
    b.position_at_end(bb["fail"])
    b.ret(NULL)


def _release(mod: ir.Module) -> None:
    """@release(outs, n): drops the references outs[0..n)."""
    fn, bb = function(mod, "release", VOID, [("outs", PTR), ("n", I64)])
    outs, n = fn.args
    b = ir.IRBuilder(bb["entry"])
    with counted(b, i64_variable(b, "j"), n) as j:
        call_named(b, "Py_DecRef", [b.load(b.gep(outs, [j], source_etype=PTR), typ=PTR, align=8)])
    b.ret_void()


def _invoke(mod: ir.Module) -> None:
    """@invoke(spec, ptrs, n): calls the spec's kernel with its n pointer parameters ptrs[0..n): one call per
    arity, as the kernel's C signature has one pointer per parameter."""
    fn, bb = function(mod, "invoke", VOID, [("spec", PTR), ("ptrs", PTR), ("n", I64)], ["entry", "out"])
    spec, ptrs, n = fn.args
    b = ir.IRBuilder(bb["entry"])
    switch = b.switch(n, bb["out"])
    for arity in range(1, MAX_PARAMS + 1):
        case = fn.append_basic_block(f"arity{arity}")
        switch.add_case(I64(arity), case)
        b.position_at_end(case)
        params = [b.load(b.gep(ptrs, [I64(k)], source_etype=PTR), typ=PTR) for k in range(arity)]
        kernel = CodePointer(ir.FunctionType(VOID, [PTR] * arity))
        b.call(pointer_word(b, spec, S_KERNEL, "kernel", typ=kernel), params)
        b.branch(bb["out"])
    b.position_at_end(bb["out"])
    b.ret_void()


def _run(mod: ir.Module) -> None:
    """@run(table, spec, ptrs, slots, odims, gil, args, scal): allocates the outputs and calls the kernel; a
    symbolic spec passes its slots (the kernel's symbols, its last argument) and odims (its outputs' dims);
    gil: whether to release the GIL around the kernel. Once the kernel has run without error, the spec's copies
    after it are made (jitop.runtime.copy_in: args and scal) and the result built. NULL: an exception is set."""
    fn, bb = function(mod, "run", PTR, [("table", PTR), ("spec", PTR), ("ptrs", PTR), ("slots", PTR),
                                        ("odims", PTR), ("gil", I64), ("args", PTR), ("scal", PTR)],
                      ["entry", "alloc", "allocate", "allocated", "fail", "call"])
    table, spec, ptrs, slots, odims, gil, args, scal = fn.args
    b = ir.IRBuilder(bb["entry"])
    outs = stack_array(b, PTR, MAX_PARAMS, "outs")
    nin, nout = word(b, spec, S_NIN, "nin"), word(b, spec, S_NOUT, "nout")
    _run_outputs(b, bb, table, spec, ptrs, odims, outs, nin, nout)
    b.position_at_end(bb["call"])
    _run_kernel(b, spec, ptrs, slots, odims, gil, nin, nout)
    _count_call(b, table, spec)
    _raise_kernel_error(b, spec, outs, nout)
    with b.if_then(b.icmp_signed("!=", word(b, spec, S_COPIES), I64(0))):
        call_named(b, "copy_in", [b.gep(spec, [word(b, spec, S_COPIES)], source_etype=I64), args, ptrs, scal, I64(1)])
    result = _result(b, table, spec, outs, nout)
    call_named(b, "release", [outs, nout])
    b.ret(result)


def _run_outputs(b: ir.IRBuilder, bb: dict[str, ir.Block], table: ir.Value, spec: ir.Value, ptrs: ir.Value,
                 odims: ir.Value, outs: ir.Value, nin: ir.Value, nout: ir.Value) -> None:
    """@run's output loop: output j into outs[j] and its data into ptrs[nin + j]; on a failed allocation the
    outputs made so far are released and @run returns NULL. Goes on to block "call"."""
    sym = b.icmp_unsigned("!=", odims, NULL, "sym")
    first = word(b, spec, S_OUTREC, "at0")
    b.branch(bb["alloc"])
    b.position_at_end(bb["alloc"])
    j, at, od = b.phi(I64, "j"), b.phi(I64, "at"), b.phi(I64, "od")  # output, its record, its first odim
    for phi, start in ((j, I64(0)), (at, first), (od, I64(0))):
        phi.add_incoming(start, bb["entry"])
    b.cbranch(_is(b, j, nout), bb["call"], bb["allocate"])
    b.position_at_end(bb["allocate"])
    record = lambda k: b.add(at, I64(k))  # noqa: E731 - word k of output j's record
    nd = word(b, spec, record(1), "nd")
    dims = b.select(sym, b.gep(odims, [od], source_etype=I64), b.gep(spec, [record(4)], source_etype=I64), "dims")
    out = call_named(b, "output", [table, pointer_word(b, spec, at, "descr"), nd, dims, word(b, spec, record(2), "rec"),
                                   b.gep(spec, [record(3)], source_etype=I64, name="spare"), sym])
    b.cbranch(_is(b, out, NULL), bb["fail"], bb["allocated"])
    b.position_at_end(bb["allocated"])
    b.store(out, b.gep(outs, [j], source_etype=PTR), align=8)
    b.store(_field(b, out, "data"), b.gep(ptrs, [b.add(nin, j)], source_etype=PTR), align=8)
    j.add_incoming(b.add(j, I64(1)), bb["allocated"])
    at.add_incoming(b.add(record(4), nd), bb["allocated"])
    od.add_incoming(b.add(od, nd), bb["allocated"])
    b.branch(bb["alloc"])
    b.position_at_end(bb["fail"])
    call_named(b, "release", [outs, j])
    b.ret(NULL)


def _run_kernel(b: ir.IRBuilder, spec: ir.Value, ptrs: ir.Value, slots: ir.Value, odims: ir.Value, gil: ir.Value,
                nin: ir.Value, nout: ir.Value) -> None:
    """The kernel's call: the symbols as its last parameter (unused by a static kernel), with the GIL released
    if `gil`."""
    params = b.add(nin, nout, "params")
    b.store(slots, b.gep(ptrs, [params], source_etype=PTR), align=8)
    n = b.add(params, b.zext(b.icmp_unsigned("!=", odims, NULL), I64), "n")
    unlock = b.icmp_signed("!=", gil, I64(0), "unlock")
    before = b.block
    with b.if_then(unlock):
        saved = call_named(b, "PyEval_SaveThread", [])
        saved_in = b.block
    thread_state = b.phi(PTR, "thread_state")
    thread_state.add_incoming(NULL, before)
    thread_state.add_incoming(saved, saved_in)
    call_named(b, "invoke", [spec, ptrs, n])
    with b.if_then(unlock):
        call_named(b, "PyEval_RestoreThread", [thread_state])


def _count_call(b: ir.IRBuilder, table: ir.Value, spec: ir.Value) -> None:
    """One more hit for the table, one more call for the spec (the workload log reads them)."""
    for counter in (pointer_word(b, table, T_HITS, "hits"), b.gep(spec, [I64(S_CALLS)], source_etype=I64)):
        b.store(b.add(b.load(counter, typ=I64, align=8), I64(1)), counter, align=8)


def _raise_kernel_error(b: ir.IRBuilder, spec: ir.Value, outs: ir.Value, nout: ir.Value) -> None:
    """A checked kernel that set its error flag: the module's own check raises the IndexError (and clears the
    flag), exactly as the slow path does; @run then releases the outputs and returns NULL."""
    flag = pointer_word(b, spec, S_FLAG, "flag")
    with b.if_then(b.icmp_unsigned("!=", flag, NULL)):
        with b.if_then(b.icmp_signed("!=", b.load_atomic(flag, "monotonic", 4, typ=I32), I32(0))):
            raised = call_named(b, "PyObject_CallNoArgs", [pointer_word(b, spec, S_CHECK, "check")])
            with b.if_else(_is(b, raised, NULL)) as (error, fine):
                with error:
                    call_named(b, "release", [outs, nout])
                    b.ret(NULL)
                with fine:
                    call_named(b, "Py_DecRef", [raised])


def _result(b: ir.IRBuilder, table: ir.Value, spec: ir.Value, outs: ir.Value, nout: ir.Value) -> ir.Value:
    """The call's result, a new reference: the output at spec[S_SLOT], that 0-d output as a scalar (o[()]), or
    post(*outputs)."""
    fn = b.function
    single, scalar, post, done = (fn.append_basic_block(name) for name in ("single", "scalar", "post", "done"))
    out = b.load(b.gep(outs, [word(b, spec, S_SLOT)], source_etype=PTR), typ=PTR, align=8, name="out")
    switch = b.switch(word(b, spec, S_KIND, "kind"), post)
    switch.add_case(I64(R_ARRAY), single)
    switch.add_case(I64(R_SCALAR), scalar)
    b.position_at_end(single)
    call_named(b, "Py_IncRef", [out])
    b.branch(done)
    b.position_at_end(scalar)
    item = call_named(b, "PyObject_GetItem", [out, pointer_word(b, table, T_EMPTY)])
    b.branch(done)
    b.position_at_end(post)
    built = call_named(b, "PyObject_Vectorcall", [pointer_word(b, spec, S_POST), outs, nout, NULL])
    b.branch(done)
    b.position_at_end(done)
    result = b.phi(PTR, "result")
    for value, block in ((out, single), (item, scalar), (built, post)):
        result.add_incoming(value, block)
    return result


def _fastcall(mod: ir.Module) -> None:
    """jitop_fastcall(self, args, nargs), METH_FASTCALL's PyObject *(PyObject *self, PyObject *const *args,
    Py_ssize_t nargs): runs the first spec of self's table that takes the call, else returns the sentinel."""
    fn, bb = function(mod, "jitop_fastcall", PTR, [("self", PTR), ("args", PTR), ("nargs", I64)],
                      ["entry", "loop", "try", "next", "hit", "miss"], internal=False)
    self_, args, nargs = fn.args
    b = ir.IRBuilder(bb["entry"])
    ptrs = stack_array(b, PTR, MAX_PARAMS + 1, "ptrs")
    scal = stack_array(b, I64, MAX_PARAMS, "scal")
    slots = stack_array(b, I64, MAX_SLOTS, "slots")
    odims = stack_array(b, I64, MAX_ODIMS, "odims")
    nbytes = i64_variable(b, "nbytes")
    table = _field(b, self_, "b_ptr")
    n = word(b, table, T_NSPECS, "nspecs")
    b.branch(bb["loop"])
    b.position_at_end(bb["loop"])
    i = b.phi(I64, "i")
    i.add_incoming(I64(0), bb["entry"])
    b.cbranch(_is(b, i, n), bb["miss"], bb["try"])
    b.position_at_end(bb["try"])
    spec = pointer_word(b, table, b.add(i, I64(T_SPECS)), "spec")
    require(b, _is(b, word(b, spec, S_NARGS), nargs), bb["next"])
    program = word(b, spec, S_PROG, "program")
    sym = b.icmp_signed("!=", program, I64(0), "sym")
    require(b, call_named(b, "match", [table, spec, args, ptrs, scal, b.select(sym, slots, NULL)]), bb["next"])
    with b.if_then(sym):
        ran = call_named(b, "dimprog", [b.gep(spec, [program], source_etype=I64), slots, odims, nbytes])
        require(b, ran, bb["next"])
    copies = word(b, spec, S_COPIES, "copies")
    with b.if_then(b.icmp_signed("!=", copies, I64(0))):
        # copies into arguments first: a check that fails writes nothing, and the call misses
        copied = call_named(b, "copy_in", [b.gep(spec, [copies], source_etype=I64), args, ptrs, scal, I64(0)])
        require(b, copied, bb["next"])
    b.branch(bb["hit"])
    b.position_at_end(bb["next"])
    i.add_incoming(b.add(i, I64(1), "i1"), bb["next"])
    b.branch(bb["loop"])
    b.position_at_end(bb["hit"])
    b.ret(call_named(b, "run", [table, spec, ptrs, b.select(sym, slots, NULL), b.select(sym, odims, NULL),
                                _gil(b, spec, sym, nbytes), args, scal]))
    b.position_at_end(bb["miss"])
    sentinel = pointer_word(b, table, T_SENTINEL, "sentinel")
    call_named(b, "Py_IncRef", [sentinel])
    b.ret(sentinel)


def _gil(b: ir.IRBuilder, spec: ir.Value, sym: ir.Value, nbytes: ir.Value) -> ir.Value:
    """Whether the call releases the GIL: the spec's word, or for a symbolic spec whose word defers to its
    program, whether the call touches RELEASE_GIL_BYTES or more (the program's SET_GIL)."""
    gil = word(b, spec, S_GIL, "gil")
    big = b.zext(b.icmp_signed(">=", b.load(nbytes, typ=I64), I64(RELEASE_GIL_BYTES)), I64)
    deferred = b.and_(sym, _is(b, gil, I64(GIL_FROM_PROGRAM)))
    return b.select(deferred, big, gil, "release")
