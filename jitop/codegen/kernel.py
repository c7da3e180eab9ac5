"""Loop IR -> LLVM IR (llvmlite.ir).

Loops marked vectorized are emitted as explicit SIMD code with as many lanes as the loop's extent
(TVM's meaning): contiguous accesses become vector loads/stores, others gathers/scatters, guards
become lane masks. Unrolled loops are substituted per iteration so register tiles have constant
indices (LLVM's SROA then keeps them in registers). Parallel loops are outlined into a function
that the runtime's thread pool calls with [begin, end) chunks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from jitop import dtypes
from jitop.errors import LoweringError
from jitop.codegen import ops
from jitop.codegen.emitter import LoopEmitter, flatten, ident
from jitop.codegen.instances import Shared, find_shared
from jitop.te.expr import Expr, Op, binary, const, free_vars, substitute, walk
from jitop.te.printer import expr_str
from jitop.tir.nodes import Allocate, Buffer, For, ForKind, IfThenElse, PrimFunc, Seq, Stmt, Store, VALUE, walk_stmts
from jitop.tir.simplify import Lin, from_lin, simplify, to_lin
from jitop.target import Target

I64 = ir.IntType(64)
PTR = ir.PointerType()
MAX_LANES = 64          # wider vectorized loops are strip-mined into chunks of one vector register (`_chunk_lanes`)
MAX_UNROLL = 256
STRIDED_LOADS = (2, 3, 4)  # lane strides read by one contiguous masked load and a shuffle, not a gather
MAX_ALLOC_BYTES = 1 << 48  # a symbolic allocation's limit (beyond any machine's memory; keeps sizes from wrapping)
STACK_LIMIT = 1 << 16   # bigger allocations go to the heap
ARRAY_DATA_OFFSET = 16  # PyArrayObject: PyObject_HEAD (refcount, type), then `char *data`
ARRAY_DIMS_OFFSET = 32  # PyArrayObject: ... `char *data`, `int nd` (padded to 8), then `npy_intp *dimensions`
# an error entry of `checked` that is not an access: "<exception type>: <message>", raised as that type
NEGATIVE_POWER = "ValueError: Integers to negative integer powers are not allowed."
# LLVM's optimiser takes time growing faster than linearly with one function's size (a 200-layer MLP in one
# function: 66k instructions, 2.8x the time of half as many). A deep program's top-level loop nests are
# emitted this many at a time into internal functions, so compile time stays linear in the program's length.
NESTS_PER_FUNCTION = 16
RAISE_IF = "raise_if:"  # te.call(RAISE_IF + "<Type>: <message>", value, bad): see KernelCodegen._call


@dataclass(frozen=True)
class Split:
    """A kernel built as several modules, linked before emitting object code (jitop.codegen.forked): this
    module defines the bodies of `parts` (indices into `kernel_parts`) and declares the others."""

    parts: frozenset[int]
    kernel: bool = True            # this module holds the kernel, its trampoline and globals
    error_base: str | None = None  # a module of parts only: the external i32 its error codes are offset by


def top_level_nests(body: Stmt) -> tuple[Stmt, ...]:
    """A kernel body's top-level loop nests, in order."""
    return body.stmts if isinstance(body, Seq) else (body,)


def kernel_parts(n_nests: int) -> list[range]:
    """The nests (by position) of each `<symbol>.partP` function of a kernel with `n_nests` top-level nests;
    [] when the kernel holds them itself (see NESTS_PER_FUNCTION).

    >>> kernel_parts(3), kernel_parts(40)
    ([], [range(0, 16), range(16, 32), range(32, 40)])
    """
    if n_nests <= NESTS_PER_FUNCTION:
        return []
    return [range(k, min(k + NESTS_PER_FUNCTION, n_nests)) for k in range(0, n_nests, NESTS_PER_FUNCTION)]


@dataclass
class Vec:
    """The vectorized loop being emitted: its variable, lane count, lane-index vector and active-lane mask."""

    var: Expr
    lanes: int
    index: ir.Value
    mask: ir.Value | None = None


class FunctionState:
    """What code emission needs for the function being built (swapped when outlining a parallel body)."""

    def __init__(self, fn: ir.Function):
        self.fn = fn
        self.entry = fn.append_basic_block("entry")
        self.body = fn.append_basic_block("body")
        self.builder = ir.IRBuilder(self.body)
        self.env: dict[Expr, ir.Value] = {}      # loop var -> i64 value
        self.ptrs: dict[Buffer, ir.Value] = {}   # buffer -> base pointer
        self.frees: list[ir.Value] = []
        self.in_parallel = False

    def finish(self) -> None:
        ir.IRBuilder(self.entry).branch(self.body)
        for p in self.frees:
            self.builder.call(_libc(self.fn.module, "free", ir.VoidType(), [PTR]), [p])
        self.builder.ret_void()


def _libc(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    fn = module.globals.get(name)
    return fn if fn is not None else ir.Function(module, ir.FunctionType(ret, args), name)


class KernelCodegen(LoopEmitter):
    """Builds one LLVM module with the kernel `func.name`: one pointer argument per buffer, and, when the
    function has symbols, one more pointing to an int64 array of their values (in `func.symbols` order)."""

    def __init__(self, func: PrimFunc, symbol: str, target: Target, signature: str | None = None,
                 split: Split | None = None):
        """`signature`: the JSON of the kernel's parameter specs (jitop.runtime.module.signature_json); the
        object code carries it as `<symbol>_signature`, so a loader can check its metadata against the code.
        `split`: this module holds only some of the kernel's parts (jitop.codegen.forked builds the rest)."""
        super().__init__(ir.Module(name=symbol), symbol, func.attrs.get("ranges", {}))
        self.func, self.target, self.signature = func, target, signature
        self.split = split
        self.avx512 = "avx512f" in target.required_features  # the math library may use AVX-512 instructions
        self.symbol_sources = func.symbol_sources() if func.symbols else ()  # a symbol read from no input: error
        n_args = len(func.params) + bool(func.symbols)
        self.fn_type = ir.FunctionType(ir.VoidType(), [PTR] * n_args)  # the kernel's, and each part's
        self.st: FunctionState | None = None  # None in a module of parts only (no kernel function)
        if self.holds_kernel:
            self.st = self._function_state(ir.Function(self.module, self.fn_type, symbol))
        self.vec: Vec | None = None
        self.n_outlined = 0
        self.uses_parallel = False
        self.error_flag: ir.GlobalVariable | None = None
        self.error_base: ir.GlobalVariable | None = None
        self.profile_stages: list[str] | None = None  # a profiling build: what each top-level nest writes
        self.shared: dict[int, Shared] = {}  # top-level nest -> its group of identical nests

    def _function_state(self, fn: ir.Function) -> FunctionState:
        """The state for emitting into `fn`, a function with the kernel's arguments (the kernel or a part)."""
        saved, self.st = self.st, FunctionState(fn)
        for buf, arg in zip(self.func.params, fn.args):
            arg.name = ident(buf.name)
            arg.add_attribute("noalias")
            self.st.ptrs[buf] = arg
        self._point_into_arena()
        self._bind_symbols()
        state, self.st = self.st, saved
        return state

    def _point_into_arena(self) -> None:
        """Intermediates planned into the arena parameter (jitop.tir.storage) are pointers into it: derived
        from one argument, LLVM never takes two of them for distinct memory (two may share bytes)."""
        arena = self.func.attrs.get("arena")
        if arena is None:
            return
        entry = ir.IRBuilder(self.st.entry)
        base = self.st.ptrs[self.func.params[arena.param]]
        for buf, offset in arena.offsets.items():
            self.st.ptrs[buf] = entry.gep(base, [ir.Constant(I64, offset)], source_etype=ir.IntType(8),
                                          name=ident(buf.name))

    @property
    def holds_kernel(self) -> bool:
        """This module defines the kernel function (and its error flag); else it holds parts only."""
        return self.split is None or self.split.kernel

    @property
    def b(self) -> ir.IRBuilder:
        return self.st.builder

    @property
    def env(self) -> dict[Expr, ir.Value]:
        return self.st.env

    def _bind_symbols(self) -> None:
        """Load the symbols' values from the function's last argument in its entry block (each function
        that takes that argument: the kernel and its parts; parallel bodies get them in their closure)."""
        if not self.func.symbols:
            return
        values = self.st.fn.args[-1]
        values.name = "symbols"
        entry = ir.IRBuilder(self.st.entry)
        for k, sym in enumerate(self.func.symbols):
            slot = entry.gep(values, [ir.Constant(I64, k)], source_etype=I64, inbounds=True)
            value = entry.load(slot, typ=I64, name=ident(sym.name))
            want = ops.llvm_type(sym.dtype)
            self.st.env[sym] = value if want == I64 else entry.trunc(value, want)

    def build(self) -> ir.Module:
        if self.func.attrs.get("profile"):
            self._profiled(self.func.body)
        else:
            self._top_level(self.func.body)
        if self.st is None:  # parts only: the kernel and its globals are another module's
            return self.module
        self.st.finish()
        self._object_trampoline()
        if self.signature is not None:
            self._signature_global(self.signature)
        return self.module

    def _top_level(self, body: Stmt) -> None:
        """The kernel's loop nests; a deep program's go NESTS_PER_FUNCTION at a time into functions that the
        kernel calls in turn (see NESTS_PER_FUNCTION). Identical nests (the heads of an attention) are
        generated once, as a function each instance calls (jitop.codegen.instances)."""
        nests = top_level_nests(body)
        self.shared = find_shared(nests, self.func.attrs.get("ranges", {}), frozenset(self.func.symbols))
        parts = kernel_parts(len(nests))
        if not parts:
            for k, nest in enumerate(nests):
                self._nest(k, nest)
            return
        for p, ks in enumerate(parts):
            ours = self.split is None or p in self.split.parts
            fn = self._part(p, [(k, nests[k]) for k in ks]) if ours else self._declare_part(p)
            if self.st is not None:  # the kernel calls each part in turn
                self.b.call(fn, self.st.fn.args)

    def _part(self, p: int, nests: list[tuple[int, Stmt]]) -> ir.Function:
        """`<symbol>.partP`: some top-level nests in a function of their own. Internal, unless another
        module's kernel calls it (a part a forked child builds)."""
        fn = ir.Function(self.module, self.fn_type, f"{self.symbol}.part{p}")
        if self.holds_kernel:
            fn.linkage = "internal"
        fn.attributes.add("noinline")  # else LLVM inlines it back: one huge function again
        saved, self.st = self.st, self._function_state(fn)
        for k, nest in nests:
            self._nest(k, nest)
        self.st.finish()
        self.st = saved
        return fn

    def _declare_part(self, p: int) -> ir.Function:
        """A part another module defines (linked in before object code is emitted)."""
        return ir.Function(self.module, self.fn_type, f"{self.symbol}.part{p}")

    def _nest(self, k: int, nest: Stmt) -> None:
        """Top-level nest number k: in place, or a call of its group's shared function."""
        group = self.shared.get(k)
        if group is None:
            return self.stmt(nest)
        if group.name is None:
            group.name = self._shared_function(group)
        fn = self.module.globals[group.name]
        inst = group.instances[k]
        args = [self.b.gep(self.st.ptrs[buf], [ir.Constant(I64, off)], source_etype=ops.memory_type(buf.dtype))
                if off else self.st.ptrs[buf] for buf, off in zip(inst.buffers, inst.offsets)]
        if self.func.symbols:  # the symbols' array: the caller's (the kernel's or its part's) last argument
            args.append(self.st.fn.args[-1])
        self.b.call(fn, args)

    def _shared_function(self, group: Shared) -> str:
        """`<symbol>.sharedN(slot pointers...)`: a group's representative nest, its slots as arguments."""
        params = [PTR] * (len(group.slots) + bool(self.func.symbols))  # + the symbols' array
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), params),
                         f"{self.symbol}.shared{sum(1 for g in self.module.globals if '.shared' in g)}")
        fn.linkage = "internal"
        fn.attributes.add("noinline")  # one copy, called per instance
        saved, self.st = self.st, FunctionState(fn)
        for buf, arg in zip(group.slots, fn.args):
            arg.name = ident(buf.name)
            arg.add_attribute("noalias")  # the slots of an instance are distinct parameters of the kernel
            self.st.ptrs[buf] = arg
        self._bind_symbols()
        self.stmt(group.body)
        self.st.finish()
        self.st = saved
        return fn.name

    def _profiled(self, body: Stmt) -> None:
        """Each top-level loop nest between two reads of the cycle counter, its ticks added to
        `<symbol>_profile[k]` (a profiling build; `profile_stages` names what each nest writes)."""
        nests = top_level_nests(body)
        ticks = self.module.declare_intrinsic("llvm.readcyclecounter", fnty=ir.FunctionType(I64, []))
        counters = ir.GlobalVariable(self.module, ir.ArrayType(I64, len(nests)), f"{self.symbol}_profile")
        counters.initializer = ir.Constant(counters.value_type, [0] * len(nests))
        self.profile_stages = [", ".join(dict.fromkeys(_written(s))) or "?" for s in nests]
        for k, nest in enumerate(nests):
            start = self.b.call(ticks, [])
            self.stmt(nest)
            spent = self.b.sub(self.b.call(ticks, []), start)
            slot = self.b.gep(counters, [ir.Constant(I64, 0), ir.Constant(I64, k)], inbounds=True)
            self.b.store(self.b.add(self.b.load(slot, typ=I64), spent), slot)

    def _signature_global(self, text: str) -> None:
        """`<symbol>_signature`: constant, NUL-terminated bytes of `text`. The loader compares it with the
        metadata shipped beside the object code, so edited metadata cannot make the kernel's buffers look
        bigger (or of another type) than the code indexes them as."""
        data = bytearray(text.encode() + b"\0")
        g = ir.GlobalVariable(self.module, ir.ArrayType(ir.IntType(8), len(data)), f"{self.symbol}_signature")
        g.initializer = ir.Constant(g.value_type, data)
        g.global_constant = True

    def _object_trampoline(self) -> None:
        """`<symbol>_objects(PyArrayObject*...)`: reads each array's data pointer (the field after
        PyObject_HEAD) and calls the kernel, so callers skip ctypes' slow pointer extraction. A kernel with
        symbols gets their values from the arrays' dimensions (`symbol_sources`)."""
        kernel = self.st.fn
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [PTR] * len(self.func.params)),
                         f"{self.symbol}_objects")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        data = [b.load(b.gep(obj, [ir.Constant(I64, ARRAY_DATA_OFFSET)], source_etype=ir.IntType(8)), typ=PTR)
                for obj in fn.args]
        if self.func.symbols:
            data.append(self._symbols_from_dims(b, fn.args))
        b.call(kernel, data)
        b.ret_void()

    def _symbols_from_dims(self, b: ir.IRBuilder, arrays: list[ir.Argument]) -> ir.Value:
        """An i64[k] of the symbols' values, each read from its array's `dimensions` (npy_intp*)."""
        values = b.alloca(ir.ArrayType(I64, len(self.symbol_sources)), name="symbols")
        values.type = PTR
        for k, (param, dim) in enumerate(self.symbol_sources):
            if dim == VALUE:  # the value of a 0-d int64 input (te.size_param)
                field = b.gep(arrays[param], [ir.Constant(I64, ARRAY_DATA_OFFSET)], source_etype=ir.IntType(8))
                size = b.load(b.load(field, typ=PTR), typ=I64)
            else:
                field = b.gep(arrays[param], [ir.Constant(I64, ARRAY_DIMS_OFFSET)], source_etype=ir.IntType(8))
                dims = b.load(field, typ=PTR)
                size = b.load(b.gep(dims, [ir.Constant(I64, dim)], source_etype=I64), typ=I64)
            b.store(size, b.gep(values, [ir.Constant(I64, k)], source_etype=I64))
        return values

    # ** statements **
    def allocate(self, s: Allocate) -> None:
        buf = s.buffer
        if buf.symbolic:
            return self._heap_allocate(s)
        nbytes = max(buf.size * buf.dtype.itemsize, 1)
        elem = ops.memory_type(buf.dtype)
        if nbytes <= STACK_LIMIT:
            entry = ir.IRBuilder(self.st.entry)
            ptr = entry.alloca(ir.ArrayType(elem, max(buf.size, 1)), name=ident(buf.name))
            ptr.align = 64
            ptr.type = PTR  # opaque pointer like every other buffer (llvmlite types allocas)
            self._in_scope(buf, ptr, s.body)
            return
        malloc = _libc(self.module, "malloc", PTR, [I64])
        ptr = self.b.call(malloc, [ir.Constant(I64, nbytes)], name=ident(buf.name))
        self._in_scope(buf, ptr, s.body)
        self.b.call(_libc(self.module, "free", ir.VoidType(), [PTR]), [ptr])

    def _in_scope(self, buf: Buffer, ptr: ir.Value, body: Stmt) -> None:
        """`body` with `buf` at `ptr`; out of its scope the buffer is forgotten (a parallel loop after it packs
        every known pointer into its closure: a malloc'd one would not dominate it)."""
        self.st.ptrs[buf] = ptr
        self.stmt(body)
        del self.st.ptrs[buf]

    def _heap_allocate(self, s: Allocate) -> None:
        """An allocation whose size is known at run time: malloc'd where it stands, freed after its body. A
        size malloc cannot give (or past MAX_ALLOC_BYTES) runs nothing and raises MemoryError after the call."""
        buf, b = s.buffer, self.b
        count = self._scalar(_clamp0(buf.size))
        nbytes = b.mul(count, ir.Constant(I64, buf.dtype.itemsize))
        nbytes = b.select(b.icmp_signed("<", nbytes, ir.Constant(I64, 1)), ir.Constant(I64, 1), nbytes)
        too_big = b.icmp_unsigned(">", count, ir.Constant(I64, MAX_ALLOC_BYTES // buf.dtype.itemsize))
        size = b.select(too_big, ir.Constant(I64, 1), nbytes)  # never ask malloc for a wrapped-around size
        ptr = b.call(_libc(self.module, "malloc", PTR, [I64]), [size], name=ident(buf.name))
        failed = b.or_(too_big, b.icmp_unsigned("==", ptr, ir.Constant(PTR, None)))
        self._flag_if(failed, f"MemoryError: cannot allocate {buf.name} ({buf.dtype}{list(buf.shape)}) "
                              "for these sizes")
        with b.if_then(b.not_(failed), likely=True):
            self._in_scope(buf, ptr, s.body)
        b.call(_libc(self.module, "free", ir.VoidType(), [PTR]), [ptr])

    def _conditional(self, s: IfThenElse, cond: ir.Value) -> None:
        if self.vec is not None and isinstance(cond.type, ir.VectorType):
            return self._masked_if(s, cond)
        super()._conditional(s, cond)

    def _masked_if(self, s: IfThenElse, cond: ir.Value) -> None:
        """Both sides run, each under the lanes for which it holds (a vector condition has no one branch)."""
        outer = self.vec.mask
        self.vec.mask = cond if outer is None else self.b.and_(outer, cond)
        self._under(s.cond, True, lambda: self.stmt(s.then))
        if s.else_ is not None:
            notc = self.b.not_(cond)
            self.vec.mask = notc if outer is None else self.b.and_(outer, notc)
            self._under(s.cond, False, lambda: self.stmt(s.else_))
        self.vec.mask = outer

    # ** loops **
    def loop(self, s: For) -> None:
        if s.extent.op is not Op.CONST:
            return self._symbolic_loop(s)
        extent = int(s.extent.value)
        if s.kind is ForKind.UNROLLED and extent <= MAX_UNROLL:
            return self._unrolled(s, extent)
        if s.kind is ForKind.VECTORIZED and self.vec is None and _vectorizable(s):
            return self._vectorized(s, extent)
        if s.kind is ForKind.PARALLEL and not self.st.in_parallel and self.vec is None:
            work = _iterations(s)
            if isinstance(work, Expr):  # a symbolic loop inside: decide at run time
                return self._parallel(s, ir.Constant(I64, extent), work)
            if work >= self.target.parallel_min_work:
                return self._parallel(s, ir.Constant(I64, extent))
        self._serial(s.var, ir.Constant(I64, 0), ir.Constant(I64, extent), lambda: self.stmt(s.body))

    def _symbolic_loop(self, s: For) -> None:
        """A loop whose trip count is known at run time: unrolled runs serially; vectorized runs whole
        vectors and one masked vector; parallel launches threads when the work is worth them."""
        if s.kind is ForKind.VECTORIZED and self.vec is None and _vectorizable(s):
            return self._vectorized_symbolic(s)
        if self.vec is not None and self.vec.var in free_vars(s.extent):  # lane 0's trip count is not every lane's
            raise LoweringError(f"loop '{s.var.name}' runs {expr_str(s.extent)} times, a count that differs between "
                                f"the lanes of the vectorized loop '{self.vec.var.name}' around it: vectorize an inner "
                                "loop instead")
        end = self._scalar(s.extent)
        if s.kind is ForKind.PARALLEL and not self.st.in_parallel and self.vec is None:
            return self._parallel(s, end, _iterations(s))
        self._serial(s.var, ir.Constant(I64, 0), end, lambda: self.stmt(s.body))

    def _vectorized(self, s: For, extent: int) -> None:
        if extent <= MAX_LANES:
            return self._vector_chunk(s, ir.Constant(I64, 0), extent, extent)
        lanes = self._chunk_lanes(s)
        chunks = math.ceil(extent / lanes)
        chunk = Expr(Op.VAR, dtypes.INDEX, (), (f"{s.var.name}.chunk", id(s)))
        self._serial(chunk, ir.Constant(I64, 0), ir.Constant(I64, chunks),
                     lambda: self._vector_chunk(s, self.b.mul(self.st.env[chunk], ir.Constant(I64, lanes)),
                                                lanes, extent))

    def _chunk_lanes(self, s: For) -> int:
        """Lanes per chunk of a vectorized loop too long to emit at once: one vector register of the
        widest element the body moves or computes with (16 float32 with AVX-512, 8 with AVX2, 4 float64
        with AVX2), so each chunk's arithmetic is whole registers, none split or half empty. The lanes
        are independent (`_vectorizable`), so how they are grouped never changes a result."""
        return self.target.lanes(_widest_itemsize(s.body))

    def _vectorized_symbolic(self, s: For) -> None:
        """extent // lanes unmasked vectors, then one masked vector when lanes do not divide the extent. An
        extent of at most a constant (min(8, n - 8*i)) takes that many lanes: one vector, masked or not."""
        b = self.b
        lanes = _constant_bound(s.extent) or self._chunk_lanes(s)
        end = self._scalar(s.extent)
        whole = b.sdiv(end, ir.Constant(I64, lanes))  # <= 0 for an extent <= 0: no vector runs
        chunk = Expr(Op.VAR, dtypes.INDEX, (), (f"{s.var.name}.chunk", id(s)))
        self._serial(chunk, ir.Constant(I64, 0), whole,
                     lambda: self._vector_chunk(s, self.b.mul(self.st.env[chunk], ir.Constant(I64, lanes)), lanes))
        start = b.mul(whole, ir.Constant(I64, lanes))
        with b.if_then(b.icmp_signed("<", start, end)):
            self._vector_chunk(s, start, lanes, end)

    def _vector_chunk(self, s: For, start: ir.Value, lanes: int, extent: int | ir.Value | None = None) -> None:
        """Lanes start, start+1, ... of loop `s`; those at or past `extent` (an int: only when lanes do not
        divide it) are masked off."""
        b = self.b
        iota = ops.vector_constant(I64, range(lanes))
        index = b.add(ops.splat(b, start, lanes), iota)
        mask = None
        if isinstance(extent, ir.Value):
            mask = b.icmp_signed("<", index, ops.splat(b, extent, lanes))
        elif extent is not None and extent % lanes:
            mask = b.icmp_signed("<", index, ops.splat(b, ir.Constant(I64, extent), lanes))
        self.vec = Vec(s.var, lanes, index, mask)
        self.st.env[s.var] = start  # lane 0's value, for uniform parts of addresses
        self.stmt(s.body)
        self.vec = None
        del self.st.env[s.var]

    def _parallel(self, s: For, extent: ir.Value, work: Expr | None = None) -> None:
        """Outline the body and run it on the pool over [0, extent). With symbolic `work` (innermost
        iterations in all), only when that reaches the target's min work at run time: else the outlined
        body runs the whole range in this thread (one copy of the body either way)."""
        self.uses_parallel = True
        env, ptrs = list(self.st.env.items()), list(self.st.ptrs.items())
        closure_ty = ir.LiteralStructType([v.type for _, v in env] + [PTR] * len(ptrs))
        entry = ir.IRBuilder(self.st.entry)
        closure = entry.alloca(closure_ty, name="closure")
        closure.type = PTR
        for k, (_, v) in enumerate(env + ptrs):
            self.b.store(v, self.b.gep(closure, [ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), k)],
                                       source_etype=closure_ty))
        worth = None if work is None else self._scalar(self._known_at_launch(work) >= self.target.parallel_min_work)
        memo = self._memo  # outlining emits the body into another function: its values are not ours
        body_fn = self._outline(s, env, ptrs, closure_ty)
        self._memo = memo
        launch = _libc(self.module, "jitop_parallel_for", ir.VoidType(), [PTR, PTR, I64])
        if worth is None:
            self.b.call(launch, [body_fn, closure, extent])
            return
        with self.b.if_else(worth) as (threads, alone):
            with threads:
                self.b.call(launch, [body_fn, closure, extent])
            with alone:
                self.b.call(body_fn, [ir.Constant(I64, 0), extent, closure])

    def _known_at_launch(self, work: Expr) -> Expr:
        """`work` with the variables of loops inside the parallel one (not bound before it) at 0: an
        estimate of the work from the launch point, e.g. min(8, n - 8*i) counts as min(8, n)."""
        inner = [v for v in free_vars(work) if v not in self.st.env]
        return simplify(substitute(work, {v: const(0, v.dtype) for v in inner})) if inner else work

    def _outline(self, s: For, env, ptrs, closure_ty) -> ir.Function:
        self.n_outlined += 1
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [I64, I64, PTR]),
                         f"{self.symbol}.par{self.n_outlined}")
        fn.linkage = "internal"
        saved, self.st = self.st, FunctionState(fn)
        self.st.in_parallel = True
        begin, end, clo = fn.args
        for k, (key, _) in enumerate(env + ptrs):
            slot = self.b.gep(clo, [ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), k)],
                              source_etype=closure_ty)
            value = self.b.load(slot, typ=closure_ty.elements[k])
            (self.st.env if k < len(env) else self.st.ptrs)[key] = value
        self._serial(s.var, begin, end, lambda: self.stmt(s.body))
        self.st.finish()
        self.st = saved
        return fn

    # ** memory **
    def _address(self, buf: Buffer, indices: tuple[Expr, ...], strided: bool = False
                 ) -> tuple[ir.Value, ir.Value | str | int | None]:
        """(scalar pointer at lane 0, per-lane pointer vector or None when lanes are contiguous/uniform); with
        `strided`, lanes a small constant stride apart give (pointer at lane 0, the stride)."""
        flat = self.flat_index(buf, indices)
        elem = ops.memory_type(buf.dtype)
        base_ptr = self.st.ptrs[buf]
        if self.vec is None:
            return self.b.gep(base_ptr, [self._scalar(flat)], source_etype=elem), None
        stride, rest = _split_lane(flat, self.vec.var)
        if strided and stride in STRIDED_LOADS and stride * self.vec.lanes <= MAX_LANES:
            return self.b.gep(base_ptr, [self._scalar(flat)], source_etype=elem), stride
        if stride is None or stride not in (0, 1):
            lane_idx = self.expr(flat)
            return None, _vector_gep(self.b, base_ptr, ops.splat(self.b, lane_idx, self.vec.lanes), elem)
        base = self._scalar(rest if stride == 0 else flat)  # the loop var reads as lane 0's value here
        ptr = self.b.gep(base_ptr, [base], source_etype=elem)
        if stride == 0:
            return ptr, "uniform"
        return ptr, None

    def load(self, e: Expr) -> ir.Value:
        buf = e.arg
        if not self.bounds.proves(buf, e.src):
            return self._checked_load(e)
        elem = ops.memory_type(buf.dtype)
        ptr, lanes_ptr = self._address(buf, e.src, strided=True)
        v = self.vec
        if v is None:
            return ops.from_memory(self.b, buf.dtype, self.b.load(ptr, typ=elem))
        if isinstance(lanes_ptr, int):
            return ops.from_memory(self.b, buf.dtype, self._strided_load(buf, ptr, lanes_ptr))
        if lanes_ptr == "uniform" and (v.mask is None or _nonempty(buf)):
            if v.mask is not None:  # one scalar load, redirected to element 0 when no lane is active
                ptr = self.b.select(self._any(v.mask), ptr, self.st.ptrs[buf])
            return ops.from_memory(self.b, buf.dtype, self.b.load(ptr, typ=elem))
        if lanes_ptr == "uniform":  # an empty buffer has no element 0: a gather masked off entirely
            lanes_ptr = ops.splat(self.b, ptr, v.lanes)
        vt = ir.VectorType(elem, v.lanes)
        if lanes_ptr is None:
            if v.mask is None:
                out = self.b.load(ptr, typ=vt)
                out.align = buf.dtype.itemsize
            else:
                out = self._masked_intrinsic("llvm.masked.load", vt, [ptr, ir.Constant(ir.IntType(32), buf.dtype.itemsize), v.mask, ir.Constant(vt, ir.Undefined)])
        else:
            mask = v.mask if v.mask is not None else _all_true(v.lanes)
            out = self._masked_intrinsic("llvm.masked.gather", vt, [lanes_ptr, ir.Constant(ir.IntType(32), buf.dtype.itemsize), mask, ir.Constant(vt, ir.Undefined)])
        return ops.from_memory(self.b, buf.dtype, out)

    def _strided_load(self, buf: Buffer, ptr: ir.Value, stride: int) -> ir.Value:
        """Lanes `stride` elements apart (a stride-2 convolution's or pooling's reads, x[::2]): one masked load
        of the span from lane 0 on and a shuffle, where a gather costs about a cycle per lane. Only the span's
        elements up to the last lane's are enabled (those in between lie inside the buffer, since both ends
        do), and with an active-lane mask only the active lanes' elements."""
        b, v = self.b, self.vec
        elem = ops.memory_type(buf.dtype)
        wide, i32 = stride * v.lanes, ir.IntType(32)
        wide_t = ir.VectorType(elem, wide)
        if v.mask is None:
            mask = ir.Constant(ir.VectorType(ir.IntType(1), wide), [k <= stride * (v.lanes - 1) for k in range(wide)])
        else:
            off = ir.Constant(v.mask.type, [0] * v.lanes)
            picks = [k // stride if k % stride == 0 else v.lanes for k in range(wide)]  # lanes..: all false
            mask = b.shuffle_vector(v.mask, off, ir.Constant(ir.VectorType(i32, wide), picks))
        span = self._masked_intrinsic("llvm.masked.load", wide_t, [ptr, ir.Constant(i32, buf.dtype.itemsize), mask,
                                                                  ir.Constant(wide_t, ir.Undefined)])
        return b.shuffle_vector(span, ir.Constant(wide_t, ir.Undefined),
                                ops.vector_constant(i32, [stride * k for k in range(v.lanes)]))

    def _any(self, mask: ir.Value) -> ir.Value:
        fn = ops.declare_intrinsic(self.module, "llvm.vector.reduce.or", [mask.type],
                                   ir.FunctionType(ir.IntType(1), [mask.type]))
        return self.b.call(fn, [mask])

    def _masked_intrinsic(self, name: str, vt: ir.VectorType, args: list[ir.Value]) -> ir.Value:
        ptr_ty = args[0].type
        fn = ops.declare_intrinsic(self.module, name, [vt, ptr_ty], ir.FunctionType(vt, [a.type for a in args]))
        return self.b.call(fn, args)

    def store(self, s: Store) -> None:
        value = self._stored_value(s)
        buf = s.buffer
        if not self.bounds.proves(buf, s.indices):
            return self._checked_store(s, value)
        ptr, lanes_ptr = self._address(buf, s.indices)
        v = self.vec
        if v is None or (lanes_ptr == "uniform" and v.mask is None and not isinstance(value.type, ir.VectorType)):
            st = self.b.store(ops.to_memory(self.b, buf.dtype, value), ptr)
            st.align = buf.dtype.itemsize
            return
        value = ops.to_memory(self.b, buf.dtype, ops.splat(self.b, value, v.lanes))
        if lanes_ptr == "uniform":
            lanes_ptr = ops.splat(self.b, ptr, v.lanes)
        i32 = ir.IntType(32)
        if lanes_ptr is None and v.mask is None:
            self.b.store(value, ptr).align = buf.dtype.itemsize
        elif lanes_ptr is None:
            self._void_intrinsic("llvm.masked.store", [value, ptr, ir.Constant(i32, buf.dtype.itemsize), v.mask])
        else:
            mask = v.mask if v.mask is not None else _all_true(v.lanes)
            self._void_intrinsic("llvm.masked.scatter", [value, lanes_ptr, ir.Constant(i32, buf.dtype.itemsize), mask])

    # ** accesses the prover could not bound: check each one, flag errors, never touch memory outside **
    def _in_bounds(self, buf: Buffer, indices: tuple[Expr, ...], what: str) -> ir.Value:
        """i1 (per lane in vector code) 'inside the buffer'; sets the error flag for active lanes outside."""
        b = self.b
        ok = None
        for idx, dim in zip(indices, buf.shape):
            v = self.expr(idx)
            lanes = ops.lanes_of(v)
            inside = b.and_(b.icmp_signed(">=", v, ops.splat(b, ir.Constant(I64, 0), lanes)),
                            b.icmp_signed("<", v, ops.splat(b, self._dim(dim), lanes)))
            ok = inside if ok is None else b.and_(*[ops.splat(b, x, ops.lanes_of(inside) or ops.lanes_of(ok)) for x in (ok, inside)])
        if ok is None:
            ok = ir.Constant(ir.IntType(1), 1)
        bad = b.not_(ok)
        lanes = ops.lanes_of(bad)
        if lanes is not None:
            if self.vec.mask is not None:
                bad = b.and_(bad, self.vec.mask)
            bad = b.icmp_unsigned("!=", b.bitcast(bad, ir.IntType(lanes)), ir.Constant(ir.IntType(lanes), 0))
        code = self._check_entry(what, buf, indices)
        with b.if_then(bad, likely=False):
            b.store(self._error_code(code), self._error_flag())
        return ok

    def _dim(self, dim: int | Expr) -> ir.Value:
        return ir.Constant(I64, dim) if isinstance(dim, int) else self._scalar(dim)

    def _flag_if(self, bad: ir.Value, message: str) -> None:
        """Set the error flag to `message`'s entry of `checked` where `bad` holds (in an active lane)."""
        b = self.b
        if self.vec is not None and self.vec.mask is not None:  # inactive lanes hold no element
            bad = b.and_(ops.splat(b, bad, ops.lanes_of(self.vec.mask)), self.vec.mask)
        lanes = ops.lanes_of(bad)
        if lanes is not None:
            bad = b.icmp_unsigned("!=", b.bitcast(bad, ir.IntType(lanes)), ir.Constant(ir.IntType(lanes), 0))
        code = self._value_error_code(message)
        with b.if_then(bad, likely=False):
            b.store(self._error_code(code), self._error_flag())

    def _error_flag(self) -> ir.GlobalVariable:
        if self.error_flag is None:
            g = ir.GlobalVariable(self.module, ir.IntType(32), f"{self.symbol}_error")
            if self.holds_kernel:  # one flag once linked: the kernel's module defines it, parts declare it
                g.initializer = ir.Constant(ir.IntType(32), 0)
            self.error_flag = g
        return self.error_flag

    def _error_code(self, code: int) -> ir.Value:
        """What the error flag is set to for entry `code` (1-based) of `checked`. A split's module of parts
        cannot know how many entries precede its own: it adds `split.error_base`, an i32 the kernel's
        module defines once all are known (loaded on the error path only)."""
        i32 = ir.IntType(32)
        if self.split is None or self.split.error_base is None:
            return ir.Constant(i32, code)
        if self.error_base is None:
            self.error_base = ir.GlobalVariable(self.module, i32, self.split.error_base)
        return self.b.add(self.b.load(self.error_base, typ=i32), ir.Constant(i32, code))

    def _lane_pointers(self, buf: Buffer, indices: tuple[Expr, ...], ok: ir.Value) -> ir.Value:
        flat = self.expr(self.flat_index(buf, indices))
        lanes = ops.lanes_of(ok) or self.vec.lanes
        flat = self.b.select(ok, ops.splat(self.b, flat, lanes), ops.splat(self.b, ir.Constant(I64, 0), lanes))
        return _vector_gep(self.b, self.st.ptrs[buf], flat, ops.memory_type(buf.dtype))

    def _checked_load(self, e: Expr) -> ir.Value:
        buf, b = e.arg, self.b
        ok = self._in_bounds(buf, e.src, "read of")
        elem = ops.memory_type(buf.dtype)
        if self.vec is None:
            # the address is computed before the branch: values the memo keeps must dominate every later use
            flat = self._scalar(self.flat_index(buf, e.src))
            value = self._load_or_zero(ok, lambda: b.gep(self.st.ptrs[buf], [flat], source_etype=elem), elem)
            return ops.from_memory(b, buf.dtype, value)
        ok = ops.splat(b, ok, self.vec.lanes)
        mask = ok if self.vec.mask is None else b.and_(ok, self.vec.mask)
        vt = ir.VectorType(elem, self.vec.lanes)
        out = self._masked_intrinsic("llvm.masked.gather", vt, [self._lane_pointers(buf, e.src, ok), ir.Constant(ir.IntType(32), buf.dtype.itemsize), mask, ir.Constant(vt, ir.Undefined)])
        return ops.from_memory(b, buf.dtype, out)

    def _checked_store(self, s: Store, value: ir.Value) -> None:
        buf, b = s.buffer, self.b
        ok = self._in_bounds(buf, s.indices, "write to")
        if self.vec is None:
            flat = self._scalar(self.flat_index(buf, s.indices))  # before the branch, as in _checked_load
            with b.if_then(ok):
                ptr = b.gep(self.st.ptrs[buf], [flat], source_etype=ops.memory_type(buf.dtype))
                b.store(ops.to_memory(b, buf.dtype, value), ptr)
            return
        ok = ops.splat(b, ok, self.vec.lanes)
        mask = ok if self.vec.mask is None else b.and_(ok, self.vec.mask)
        value = ops.to_memory(b, buf.dtype, ops.splat(b, value, self.vec.lanes))
        self._void_intrinsic("llvm.masked.scatter", [value, self._lane_pointers(buf, s.indices, ok), ir.Constant(ir.IntType(32), buf.dtype.itemsize), mask])

    def _void_intrinsic(self, name: str, args: list[ir.Value]) -> None:
        fn = ops.declare_intrinsic(self.module, name, [args[0].type, args[1].type],
                                   ir.FunctionType(ir.VoidType(), [a.type for a in args]))
        self.b.call(fn, args)

    # ** expressions **
    def _scalar(self, e: Expr) -> ir.Value:
        saved, self.vec = self.vec, None
        try:
            return self.expr(e)
        finally:
            self.vec = saved

    def expr(self, e: Expr) -> ir.Value:
        # keyed by the lanes too; and unlike the base, the value goes into the memo of before `e`, so a value
        # made around a guarded select is not reused after it (reusing it would change the generated code)
        memo = self._memo
        key = (e, id(self.vec), id(self.vec.mask) if self.vec else 0)
        if key not in memo:
            memo[key] = self._expr(e)
        return memo[key]

    def _var(self, e: Expr) -> ir.Value:
        if self.vec is not None and e is self.vec.var:
            return self.vec.index
        return self.st.env[e]

    def _operands(self, src: tuple[Expr, ...]) -> list[ir.Value]:
        """Scalars among vector operands are broadcast to the vector's lanes."""
        args = [self.expr(x) for x in src]
        lanes = max((ops.lanes_of(a) or 0 for a in args), default=0) or None
        return [ops.splat(self.b, a, lanes) for a in args]

    def _guarded_select(self, e: Expr, cond: ir.Value) -> ir.Value:
        """With a vector condition each side's loads run under the lanes it selects, not in a branch."""
        if self.vec is None or not isinstance(cond.type, ir.VectorType):
            return super()._guarded_select(e, cond)
        outer = self.vec.mask
        self.vec.mask = cond if outer is None else self.b.and_(outer, cond)
        yes = self._under(e.src[0], True, lambda: self.expr(e.src[1]))
        notc = self.b.not_(cond)
        self.vec.mask = notc if outer is None else self.b.and_(outer, notc)
        no = self._under(e.src[0], False, lambda: self.expr(e.src[2]))
        self.vec.mask = outer
        return ops.select(self.b, cond, yes, no)

    def _call(self, e: Expr) -> ir.Value:
        from jitop.codegen.math import emit_call
        args = self._operands(e.src)
        lanes = ops.lanes_of(args[0])  # the operands' common lane count
        if e.arg == "ipow" and e.src[1].dtype.is_signed:
            # numpy refuses any negative integer exponent at run time; the call raises its ValueError
            zero = ops.constant(e.src[1].dtype, 0, lanes)
            self._flag_if(self.b.icmp_signed("<", args[1], zero), NEGATIVE_POWER)
        if e.arg.startswith(RAISE_IF):
            # call("raise_if:<Type>: <message>", value, bad): the value, and the call raises where bad holds
            self._flag_if(args[1], e.arg[len(RAISE_IF):])
            return args[0]
        return emit_call(self.b, e.arg, e.src[0].dtype, args, avx512=self.avx512)


def _written(s: Stmt) -> list[str]:
    """Names of the function's buffers (not local allocations) that statement `s` stores to, in order."""
    if isinstance(s, Store):
        return [f"{s.buffer.name} {s.buffer.dtype}{list(s.buffer.shape)}"] if s.buffer.scope == "param" else []
    if isinstance(s, Seq):
        return [n for x in s.stmts for n in _written(x)]
    if isinstance(s, IfThenElse):
        return _written(s.then) + (_written(s.else_) if s.else_ is not None else [])
    return _written(s.body)  # For, Allocate


def _vector_gep(b: ir.IRBuilder, base: ir.Value, index: ir.Value, elem: ir.Type) -> ir.Value:
    """One pointer per lane (llvmlite types a vector-indexed GEP as a scalar pointer; correct it)."""
    ptrs = b.gep(base, [index], source_etype=elem)
    ptrs.type = ir.VectorType(PTR, index.type.count)
    return ptrs


def _all_true(lanes: int) -> ir.Value:
    return ops.splat_constant(ir.IntType(1), 1, lanes)


def _split_lane(flat: Expr, var: Expr) -> tuple[int | None, Expr]:
    """flat == stride * var + rest with rest independent of var; stride None if var is not linear in flat."""
    lin = to_lin(flat, {})
    stride = lin.terms.get(var, 0)
    rest = Lin({a: c for a, c in lin.terms.items() if a is not var}, lin.const)
    if any(var in free_vars(a) for a in rest.terms):
        return None, flat
    return stride, from_lin(rest, dtypes.INDEX)


def _vectorizable(s: For) -> bool:
    """Lanes must be independent: no store whose address is the same for all lanes but whose value is not."""
    for node in walk_stmts(s.body):
        if isinstance(node, Store):
            flat = flatten(node.buffer, node.indices)
            addr_varies = s.var in free_vars(flat)
            if not addr_varies and s.var in free_vars(node.value):
                return False
        if isinstance(node, Allocate):
            return False
    return True


def _widest_itemsize(body: Stmt) -> int:
    """Bytes of the widest element `body` loads, stores or computes in floating point (index arithmetic,
    int64 everywhere, does not count: it is not what fills the vectors)."""
    widest = 1
    for node in walk_stmts(body):
        exprs = (node.value,) if isinstance(node, Store) else (node.cond,) if isinstance(node, IfThenElse) else ()
        if isinstance(node, Store):
            widest = max(widest, node.buffer.dtype.itemsize)
        for e in exprs:
            for n in walk(e):
                if n.op is Op.LOAD or n.dtype.is_float:
                    widest = max(widest, n.dtype.itemsize)
    return widest


def _iterations(s: Stmt) -> int | Expr:
    """Statements executed by `s`: a loop's extent times its body's, a sequence's parts summed (sibling
    loops add up; they do not multiply). An int64 Expr where a loop's extent is symbolic."""
    if isinstance(s, For):
        extent = int(s.extent.value) if s.extent.op is Op.CONST else s.extent
        return _max(extent, 1) * _iterations(s.body)
    if isinstance(s, Seq):
        return sum(_iterations(x) for x in s.stmts)
    if isinstance(s, IfThenElse):
        return _max(_iterations(s.then), _iterations(s.else_) if s.else_ is not None else 0)
    if isinstance(s, Allocate):
        return _iterations(s.body)
    return 1


def _max(a: int | Expr, b: int | Expr) -> int | Expr:
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else binary(Op.MAX, a, b)


def _clamp0(e: int | Expr) -> Expr:
    return binary(Op.MAX, e, 0)


def _nonempty(buf: Buffer) -> bool:
    """Whether the buffer surely has an element 0 (a symbolic one may be empty)."""
    return not buf.symbolic and buf.size > 0


def _constant_bound(extent: Expr) -> int | None:
    """c for an extent min(c, e) or min(e, c) with 1 <= c <= MAX_LANES (a loop's tail trip count), else None."""
    if extent.op is Op.MIN:
        for e in extent.src:
            if e.op is Op.CONST and 1 <= e.value <= MAX_LANES:
                return int(e.value)
    return None
