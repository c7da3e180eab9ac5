"""A compiled GPU function: its PTX, kernels and parameter signature, called like a CPU Module.

numpy arrays given to it are copied to the GPU and its results copied back (results are numpy arrays, as JAX
does); device arrays (`jitop.cuda.DeviceArray`, or anything with `__cuda_array_interface__`: CuPy, torch,
numba) are used in place, and then the results are device arrays. The PTX is linked to a cubin for this GPU
on the first call (`cubin` keeps it, so a cache can store it and a warm process skip the PTX JIT).
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable, Sequence

import numpy as np

from jitop.codegen.nvptx import ALLOC_ALIGN, GpuBuild, Launch
from jitop.runtime.args import VALUE, ParamSpec, ShapeBinder, SymbolSpec, compile_dim, fits_constant_dims, shape_str
from jitop.runtime.cuda import driver, memory
from jitop.runtime.cuda.memory import DeviceArray
from jitop.runtime.cuda.plan import CallPlan, LaunchTemplate, Planner
from jitop.runtime.module import flagged_error
from jitop.target import CudaTarget

MAX_PLANS = 64  # call plans kept per function (a decode loop makes one per sequence length)


class _NoBuffer:
    """What a size parameter (te.size_param) passes as its buffer: no kernel reads it (reading it is its
    symbol), so its value stays on the host and no copy is made."""

    ptr = 0


_NO_BUFFER = _NoBuffer()


class GpuFunction:
    """A GPU function built by `jitop.build(..., target="cuda")`: call it with inputs (outputs are allocated and
    returned) or with inputs and outputs.

    >>> f = jitop.build(s, [A, B], target="cuda")   # doctest: +SKIP
    >>> b = f(a)                                    # doctest: +SKIP
    """

    def __init__(self, meta: dict, built: GpuBuild, cubin: bytes | None = None):
        self.meta, self.built, self.cubin = meta, built, cubin
        self.target = CudaTarget.from_json(meta["target"])
        self.params = [ParamSpec.from_json(p) for p in meta["params"]]
        self.symbols = [SymbolSpec.from_json(s) for s in meta.get("symbols", [])]
        self.binder = ShapeBinder(self.params, self.symbols)
        # each parameter's shape where it is constant (compared as a tuple), else None (its constant dims checked)
        self._constant_shapes = [p.shape if all(type(d) is int for d in p.shape) else None for p in self.params]
        # the size parameters (te.size_param): passed as ints (or 0-d integer arrays), read on the host
        self.sizes = {s.param: s.name for s in self.symbols if s.dim == VALUE}
        self.n_inputs = sum(not p.is_output for p in self.params)
        sized = [d for k in built.kernels for d in (*k.grid, *k.block)] + [d for *_, s in built.workspaces for d in s]
        self._dims = {d: compile_dim(d) for d in sized if isinstance(d, str)}
        self._loaded: tuple[Any, Planner] | None = None
        self._plans: dict[tuple, CallPlan] = {}  # the arguments' shapes and dtypes -> what such a call launches
        self._last_checked: tuple[tuple, list[int]] = ((), [])  # the shapes `symbol_values` checked last

    @property
    def name(self) -> str:
        return self.meta["name"]

    def get_source(self, fmt: str = "ptx") -> str:
        """The generated code: "ptx" (what the driver loads) or "ll" (the LLVM IR before optimisation)."""
        if fmt == "ptx":
            return self.built.ptx
        if fmt == "ll":
            return self.built.ll
        raise ValueError(f"get_source(fmt={fmt!r}): a GPU function has 'ptx' and 'll'")

    def __repr__(self) -> str:
        sig = ", ".join(f"{p.name}: {p.dtype.name}{shape_str(p.shape)}" for p in self.params)
        return f"<jitop GPU function {self.name}({sig}) for {self.target.arch}, {len(self.built.kernels)} kernel(s)>"

    # ** loading **
    def _load(self) -> tuple[Any, Planner]:
        """The loaded module and the planner of this function's calls (linked and loaded on the first call)."""
        if self._loaded is None:
            driver.context()
            attrs = driver.device_attributes()
            self.target.check_runs_on(attrs["arch"], f"GPU function '{self.name}'")
            if self.cubin is None:
                self.cubin = driver.link_ptx(self.built.ptx, self.target.arch)
            module = driver.Module.load(self.cubin)
            n_buffers = len(self.params) + len(self.built.workspaces)
            templates = [LaunchTemplate(module.function(k.name), k, n_buffers, len(self.symbols), self._dims)
                         for k in self.built.kernels]
            planner = Planner(templates, [s.name for s in self.symbols], self.n_inputs,
                              [(p.dtype, p.shape) for p in self.params[self.n_inputs:]], self.binder.shape,
                              self.built.workspaces, self._dims, self.built.error_symbol)
            self._loaded = module, planner
        return self._loaded

    # ** calling **
    def __call__(self, *args: Any) -> Any:
        if self.sizes:
            args = self._size_values(args)
        if len(args) in (self.n_inputs, len(self.params)):
            key = self._plan_key(args)
            if key is not None:
                return self._run_planned(args, key)
        return self._call(args)

    def _run_planned(self, args: Sequence[DeviceArray], key: tuple) -> Any:
        """Launch on device arrays `args` through the call plan of `key` (theirs: `_plan_key`), made and checked
        on the first call of those shapes."""
        plan = self._plans.get(key) or self._plan(args, key)
        return plan.run(self.raise_if_flagged, self._buffers(args) if self.sizes else args)

    def _size_values(self, args: Sequence[Any]) -> tuple:
        """`args` with each size parameter's argument as a Python int: an int, a numpy integer or 0-d integer
        array, or a 0-d jitop device array (read back: a copy that waits for the GPU); a TypeError names any
        other."""
        args = list(args)
        for k, name in self.sizes.items():
            if k >= len(args) or type(args[k]) is int:
                continue
            a = args[k].get() if type(args[k]) is DeviceArray else args[k]
            if not (isinstance(a, (np.integer, np.ndarray)) and np.ndim(a) == 0 and np.asarray(a).dtype.kind in "iu"):
                raise TypeError(f"argument '{self.params[k].name}' (position {k}) is the size {name}: an int, got "
                                f"{type(args[k]).__name__}{'' if np.ndim(a) == 0 else f' of shape {np.shape(a)}'}")
            args[k] = int(a)
        return tuple(args)

    def _buffers(self, args: Sequence[Any]) -> list[Any]:
        """The call's buffers: its arguments, a size parameter's value replaced by no buffer."""
        return [_NO_BUFFER if k in self.sizes else a for k, a in enumerate(args)]

    def _plan_key(self, args: Sequence[Any]) -> tuple | None:
        """For a call whose every argument is a jitop DeviceArray (the hot path of device-resident code), or an
        int for a size parameter, the key of its call plan: the arrays' shapes and dtypes and the sizes' values;
        None for any other call."""
        key = []
        for k, a in enumerate(args):
            if type(a) is int and k in self.sizes:  # a size parameter's value (`_size_values`)
                key.append(a)
            elif type(a) is not DeviceArray or a.ptr % ALLOC_ALIGN:
                return None
            else:
                key.append((a.shape, a.dtype))
        return tuple(key)

    def symbol_values(self, arrays: Sequence[DeviceArray | np.ndarray]) -> list[int]:
        """The symbols' values of a call on `arrays` (inputs, or inputs then outputs: jitop device arrays, or numpy
        arrays standing for theirs), their dtypes and shapes checked as a call checks them: a TypeError or
        ValueError naming the argument that does not fit. Needs no GPU. What a dispatcher asks before it serves a
        new size with this function; the call that follows finds the shapes checked (the last shapes checked are
        remembered; a device array's address is the call's to check).

        >>> f.symbol_values([np.zeros(1000, np.float32)])   # doctest: +SKIP
        [1000]
        """
        if len(arrays) not in (self.n_inputs, len(self.params)):
            raise TypeError(f"{self.name}() takes its {self.n_inputs} inputs, or all {len(self.params)} arguments "
                            f"(inputs then outputs); got {len(arrays)}")
        if self.sizes:
            arrays = self._size_values(arrays)
        key = tuple([a if k in self.sizes else (a.shape, a.dtype) for k, a in enumerate(arrays)])
        checked_key, values = self._last_checked
        if key != checked_key:
            for k, (a, p, shape) in enumerate(zip(arrays, self.params, self._constant_shapes)):
                if k in self.sizes:
                    continue
                if a.dtype != p.dtype or (a.shape != shape if shape is not None else
                                          not fits_constant_dims(p.shape, a.shape)):
                    self._argument(k, a, a)  # raises the error that names what does not fit
            values = self.binder.bind(arrays)
            self._last_checked = key, values
        return values

    def _plan(self, args: Sequence[DeviceArray], key: tuple | None) -> CallPlan:
        """The call plan of the device arrays `args`, checked here as `_call` checks them (a bad call raises its
        error)."""
        for k, a in enumerate(args):
            if k not in self.sizes and a.ptr % ALLOC_ALIGN:
                self._argument(k, a, a)  # raises: an address the kernels' vector loads cannot start at
        return self._plan_checked(self.symbol_values(args), len(args), key)

    def _plan_checked(self, values: list[int], n_args: int, key: tuple | None) -> CallPlan:
        """The call plan of `n_args` arguments already checked, whose shapes gave the symbols `values`, kept under
        `key` (unless None) for later calls of the same shapes; the oldest plans go first once MAX_PLANS are
        held."""
        plan = self._load()[1].plan(values, n_args)
        if key is not None:
            if len(self._plans) >= MAX_PLANS:
                del self._plans[next(iter(self._plans))]
            self._plans[key] = plan
        return plan

    def _call(self, args: Sequence[Any]) -> Any:
        """A call with numpy arrays, foreign device arrays (torch, CuPy) or a mix: numpy inputs copied in, the
        outputs allocated (numpy results copied back), then launched through the call plan of their shapes."""
        if len(args) == self.n_inputs < len(self.params) and self._copies_in_plainly(args):
            device = [memory.to_device(a) if type(a) is np.ndarray else a for a in args]  # (sizes stay ints)
            key = self._plan_key(device)
            if key is not None:  # as a call on device arrays (checked when its plan is made), then results copied
                outs = self._run_planned(device, key)
                if DeviceArray in map(type, args):
                    return outs
                return outs.get() if type(outs) is DeviceArray else tuple(o.get() for o in outs)
        if len(args) not in (self.n_inputs, len(self.params)):
            raise TypeError(f"{self.name}() takes its {self.n_inputs} inputs, or all {len(self.params)} arguments "
                            f"(inputs then outputs); got {len(args)}")
        given = [memory.as_device_array(a) for a in args]  # once each: a foreign array's view may synchronize
        on_device = any(dev is not None for dev in given)
        arrays = [self._argument(k, a, dev) for k, (a, dev) in enumerate(zip(args, given))]
        values = self.binder.bind(arrays)
        if len(args) == self.n_inputs:
            arrays += [None] * (len(self.params) - self.n_inputs)
        device = [self._to_device(k, a, values) for k, a in enumerate(arrays)]
        key = tuple(args[k] if k in self.sizes else (d.shape, d.dtype) for k, d in enumerate(device))
        plan = self._plans.get(key) or self._plan_checked(values, len(device), key)
        plan.run(self.raise_if_flagged, self._buffers(device) if self.sizes else device)
        return self._results(args, arrays, device, on_device)

    def _copies_in_plainly(self, args: Sequence[Any]) -> bool:
        """Whether every input is a jitop device array or a numpy array of its parameter's dtype (copied in as it
        is, then checked with the device arrays' call plan: the errors name the same argument)."""
        return all(type(a) is DeviceArray or type(a) is np.ndarray and a.dtype == p.dtype
                   or type(a) is int and k in self.sizes for k, (a, p) in enumerate(zip(args, self.params)))

    def launcher(self, args: Sequence[Any]) -> Callable[[], None]:
        """A function that only queues this function's kernels on `args` (every argument, inputs then outputs, a
        device array; checked here, once): no checks per call, no read of the out-of-bounds flag (call
        `raise_if_flagged()` afterwards), no synchronisation. For timing loops (the GPU tuner's runner), where a
        call's flag read would wait for each kernel.

        >>> launch = f.launcher([a_dev, b_dev, c_dev])   # doctest: +SKIP
        >>> launch(); f.raise_if_flagged()                # doctest: +SKIP
        """
        if len(args) != len(self.params):
            raise TypeError(f"{self.name}.launcher() takes all {len(self.params)} arguments (inputs then outputs)")
        args = self._size_values(args) if self.sizes else args
        given = [a if k in self.sizes else memory.as_device_array(a) for k, a in enumerate(args)]
        if any(dev is None for dev in given):
            raise TypeError(f"{self.name}.launcher() takes device arrays only (jitop.cuda.to_device), and ints for "
                            "sizes")
        plan = self._plan(given, None)
        arena = plan.allocate_arena()  # it lives as long as the launcher
        buffers = [a.ptr for a in self._buffers(given)] + plan.workspace_pointers(arena)
        return lambda keep=(given, arena): plan.queue(buffers)

    def raise_if_flagged(self) -> None:
        """IndexError if a kernel launched since the last check flagged an out-of-bounds access (it waits for
        them); nothing for a function without run-time checks."""
        if self.built.error_symbol:
            module, _ = self._load()
            self._raise_if_flagged(module)

    def _argument(self, k: int, a: Any, dev: DeviceArray | None) -> Any:
        """Argument k, checked against its parameter: its device array `dev` (used in place) or, where `dev` is
        None, a numpy array."""
        spec = self.params[k]
        if dev is None:
            if not isinstance(a, np.ndarray):
                a = np.asarray(a) if not spec.is_output else a
            if not isinstance(a, np.ndarray):
                raise TypeError(f"argument '{spec.name}' (position {k}) must be a numpy array or a device array "
                                f"({spec.describe()}), got {type(a).__name__}")
            dev = a
        if np.dtype(dev.dtype) != spec.dtype:
            raise TypeError(f"argument '{spec.name}' (position {k}) must have dtype {spec.dtype.name}, got "
                            f"{np.dtype(dev.dtype).name}")
        if not fits_constant_dims(spec.shape, tuple(dev.shape)):
            raise ValueError(f"argument '{spec.name}' (position {k}) must have shape {shape_str(spec.shape)}, got "
                             f"{tuple(dev.shape)}")
        if not isinstance(dev, np.ndarray) and dev.ptr % ALLOC_ALIGN:
            raise ValueError(f"argument '{spec.name}' (position {k}) starts at a device address that is not a "
                             f"multiple of {ALLOC_ALIGN} bytes (a slice of another array?); GPU kernels load whole "
                             "vectors: pass a copy")
        return dev

    def _to_device(self, k: int, a: Any, values: list[int]) -> Any:
        spec = self.params[k]
        if k in self.sizes:
            return a  # its value: passed to the kernels as its symbol
        if a is None:
            return memory.empty(self.binder.shape(k, values), spec.dtype)
        if isinstance(a, np.ndarray):
            return memory.to_device(a) if not spec.is_output else memory.empty(a.shape, a.dtype)
        return a

    def _results(self, args: Sequence[Any], arrays: list[Any], device: list[Any], on_device: bool) -> Any:
        outs = []
        for k, (spec, given) in enumerate(zip(self.params, arrays)):
            if not spec.is_output:
                continue
            if isinstance(given, np.ndarray):
                given[...] = device[k].get()  # a numpy output given: filled in place
                outs.append(given)
            else:
                outs.append(device[k] if on_device or given is not None else device[k].get())
        if len(args) == len(self.params):
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _raise_if_flagged(self, module: Any) -> None:
        flag = module.read_global_i32(self.built.error_symbol)
        if flag:  # an access out of bounds (skipped: nothing outside the arrays was touched) or a refused value
            module.write_global_i32(self.built.error_symbol, 0)
            raise flagged_error(self.name, self.built.checked, flag)


    # ** saving: one file (header JSON + PTX + cubin), checksummed, no pickle **
    def to_bytes(self) -> bytes:
        """This function as bytes: its PTX, and its cubin once it was linked on a GPU (so a process that loads
        it skips the PTX JIT). `from_bytes` reads them back."""
        ptx, cubin = self.built.ptx.encode(), self.cubin or b""
        header = {"schema": FILE_SCHEMA, "meta": self.meta, "ll": self.built.ll,
                  "kernels": [k.to_json() for k in self.built.kernels],
                  "workspaces": [[n, dt, list(shape)] for n, dt, shape in self.built.workspaces],
                  "checked": list(self.built.checked), "error_symbol": self.built.error_symbol,
                  "ptx": [len(ptx), hashlib.sha256(ptx).hexdigest()],
                  "cubin": [len(cubin), hashlib.sha256(cubin).hexdigest()]}
        return FILE_MAGIC + json.dumps(header).encode() + b"\n" + ptx + cubin

    def save(self, path: str | os.PathLike) -> None:
        """Write `to_bytes()` to `path` atomically; `load_gpu_function(path)` reads it back.

        >>> f.save("scale.jitopgpu")   # doctest: +SKIP
        """
        tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(self.to_bytes())
        os.replace(tmp, path)  # a reader sees the old file or the whole new one

    @staticmethod
    def from_bytes(data: bytes, where: str = "data") -> "GpuFunction":
        """A GpuFunction from `to_bytes`; ValueError naming `where` for bytes that are not one, are damaged
        (their checksums), or were written by another version of this format."""
        if not data.startswith(FILE_MAGIC):
            raise ValueError(f"{where}: not a saved jitop GPU function")
        head, _, body = data[len(FILE_MAGIC):].partition(b"\n")
        try:
            header = json.loads(head)
            if header.get("schema") != FILE_SCHEMA:
                raise ValueError(f"schema {header.get('schema')!r}, this jitop reads {FILE_SCHEMA}")
            (n_ptx, ptx_sum), (n_cubin, cubin_sum) = header["ptx"], header["cubin"]
            ptx, cubin = body[:n_ptx], body[n_ptx:]
            if len(cubin) != n_cubin or hashlib.sha256(ptx).hexdigest() != ptx_sum \
                    or hashlib.sha256(cubin).hexdigest() != cubin_sum:
                raise ValueError("checksum mismatch: the data is damaged")
            built = GpuBuild(ptx.decode(), header["ll"], tuple(Launch.from_json(k) for k in header["kernels"]),
                             tuple((n, dt, tuple(shape)) for n, dt, shape in header["workspaces"]),
                             tuple(header["checked"]), header["error_symbol"])
            return GpuFunction(header["meta"], built, cubin or None)
        except (KeyError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{where}: damaged jitop GPU function data ({type(err).__name__}: {err})") from None
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None

    def link(self) -> bytes:
        """Link the PTX for this machine's GPU now (if not done yet) and return the cubin."""
        self._load()
        return self.cubin


def load_gpu_function(path: str | os.PathLike) -> GpuFunction:
    """A GpuFunction saved by `GpuFunction.save`; ValueError for a file that is not one, is damaged (its
    checksums), or was written by another version of this format.

    >>> f = load_gpu_function("scale.jitopgpu")   # doctest: +SKIP
    """
    with open(path, "rb") as f:
        return GpuFunction.from_bytes(f.read(), os.fspath(path))


FILE_MAGIC = b"JITOPGPU\n"
FILE_SCHEMA = 1


def function_meta(name: str, params: list[dict], symbols: list[dict], target: CudaTarget) -> dict:
    """The metadata a GpuFunction is made from (JSON-ready)."""
    meta = {"name": name, "params": params, "target": target.to_json()}
    if symbols:
        meta["symbols"] = symbols
    return meta


def ptx_digest(ptx: str, target: CudaTarget) -> str:
    """A key for the cubin of `ptx` on `target`'s GPU."""
    return hashlib.sha256(f"{target.key}|{ptx}".encode()).hexdigest()[:32]
