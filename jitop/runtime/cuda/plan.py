"""Call plans of a GPU function: what a call on device arrays of given shapes allocates and launches.

A function's `Planner` works out once what no call changes (each kernel's buffers, its argument types, the grid
and block sizes that are constants, the workspaces' layout in one arena); a plan for the symbols' values of a
call then only evaluates the sizes that depend on them. A decode loop, whose cache is one row longer per call,
makes a plan per call: that is why a plan is cheap to make.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from jitop.codegen.nvptx import Launch
from jitop.runtime.args import DimFn
from jitop.runtime.cuda import driver
from jitop.runtime.cuda.memory import BlockPool, DeviceArray

GRID_HINT = "bind a larger factor to threadIdx, or the loop to blockIdx.x (up to 2**31 - 1 blocks)"
MAX_QUEUES = 64  # prepared launches a template keeps (the oldest go first)
ARENA_ALIGN = 256  # bytes between workspaces in the arena: what cuMemAlloc aligns an allocation to
_UINT8 = np.dtype(np.uint8)

Sizer = Callable[[dict], tuple]


class CallPlan:
    """A call on device arrays of given shapes, worked out: the outputs it allocates (shape, dtype, elements),
    one arena for its workspaces (bytes, each workspace's offset) and its launches (a prepared kernel launch, the
    indices of the buffers it takes: parameters then workspaces, and the symbols' values passed after them)."""

    __slots__ = ("outputs", "arena_bytes", "offsets", "launches", "error_symbol", "_no_arena")

    def __init__(self, outputs: list, arena_bytes: int, offsets: list[int], launches: list,
                 error_symbol: str | None):
        self.outputs = outputs  # `output_spec`s
        self.arena_bytes, self.offsets = arena_bytes, offsets
        self.launches, self.error_symbol = launches, error_symbol
        self._no_arena = [0] * len(offsets)  # the workspaces' addresses when all are empty

    def run(self, raise_if_flagged: Callable[[], None], args: Sequence[DeviceArray]) -> Any:
        """Launch on `args` (inputs, or inputs then outputs); the outputs allocated (device arrays), or None
        when they were given. The arena is freed when it returns: its block is reused in stream order."""
        outs = [DeviceArray.allocate_exact(*spec) for spec in self.outputs]
        buffers = [a.ptr for a in args] + [o.ptr for o in outs]
        if self.arena_bytes:
            arena = self.allocate_arena()
            self.queue(buffers + self.workspace_pointers(arena))
        else:
            self.queue(buffers + self._no_arena)
        if self.error_symbol:
            raise_if_flagged()
        if not self.outputs:
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)

    def allocate_arena(self) -> DeviceArray:
        """The workspaces' memory (a 0-byte array, holding no memory, when they need none)."""
        return DeviceArray.allocate_exact((self.arena_bytes,), _UINT8, self.arena_bytes)

    def workspace_pointers(self, arena: DeviceArray) -> list[int]:
        return [arena.ptr + at for at in self.offsets]

    def queue(self, buffers: Sequence[int]) -> None:
        """Queue the launches on the addresses of every buffer: parameters, then workspaces."""
        for launch, taken, values in self.launches:
            launch([buffers[k] for k in taken] + values)


class LaunchTemplate:
    """One kernel's launch with what no call changes worked out: the loaded kernel, the buffers it takes, its
    argument types, its grid and block as functions of the symbols' values (constants where they are)."""

    __slots__ = ("kernel", "launch", "taken", "arg_types", "grid", "block", "constant", "fixed", "_queues")

    def __init__(self, kernel: driver.Function, launch: Launch, n_buffers: int, n_symbols: int,
                 dims: dict[str, DimFn]):
        self.kernel, self.launch = kernel, launch
        self.taken = launch.pointers(range(n_buffers))
        self.arg_types = ["ptr"] * len(self.taken) + ["i64"] * n_symbols
        self.grid, self.block = sizer(launch.grid, dims), sizer(launch.block, dims)
        self.constant = all(type(d) is int for d in (*launch.grid, *launch.block))  # no symbol changes the launch
        # prepared launches by (grid, block): a decode step's new cache length changes few kernels' launch shapes
        self._queues: dict[tuple, Callable[[Sequence[int]], None]] = {}
        self.fixed: tuple = ()  # a constant launch's one prepared launch (or None), once made

    def prepared(self, env: dict[str, int]) -> Callable[[Sequence[int]], None] | None:
        """The launch at the symbols' values `env`, checked; None for an empty grid (nothing to launch)."""
        grid, block = self.grid(env), self.block(env)
        queue = self._queues.get((grid, block))
        if queue is None:
            if 0 in grid:
                return None
            queue = self.kernel.prepared(grid, block, self.arg_types,
                                         grid_hint=f"in kernel {self.launch.name}, {GRID_HINT}")
            if len(self._queues) >= MAX_QUEUES:
                del self._queues[next(iter(self._queues))]
            self._queues[grid, block] = queue
        if self.constant:
            self.fixed = (queue,)
        return queue


class Planner:
    """Makes a GPU function's call plans. Its parameters are `n_inputs` inputs, then `outputs` (dtype, declared
    shape: ints and symbolic sizes); `output_shape(k, values)` is parameter k's shape at the symbols' values
    (checked: no negative size); `workspaces` are the build's (name, dtype, shape)."""

    def __init__(self, templates: list[LaunchTemplate], symbol_names: list[str], n_inputs: int,
                 outputs: list[tuple[np.dtype, tuple]], output_shape: Callable[[int, Sequence[int]], tuple[int, ...]],
                 workspaces: Sequence[tuple], dims: dict[str, DimFn], error_symbol: str | None):
        self.templates, self.symbol_names, self.n_inputs = templates, symbol_names, n_inputs
        self.output_shape = output_shape
        # per output (dtype, its shape, elements, pool size class) where the shape is constant, else its dtype
        self.outputs = [output_spec(shape, dtype) if all(type(d) is int for d in shape) else dtype
                        for dtype, shape in outputs]
        # per workspace its bytes in the arena (a multiple of ARENA_ALIGN), or where a symbol sizes it, a function
        # of the symbols' values giving them
        self.workspaces = [_arena_bytes(np.dtype(dt).itemsize, shape, dims) for _, dt, shape in workspaces]
        self._arena = None if any(map(callable, self.workspaces)) else _layout(self.workspaces)
        self.error_symbol = error_symbol

    def plan(self, values: Sequence[int], n_args: int) -> CallPlan:
        """The plan of a call with `n_args` arguments (the inputs alone, or all parameters) whose shapes gave the
        symbols `values` (already checked against every parameter)."""
        env = dict(zip(self.symbol_names, values))
        outputs = []
        if n_args == self.n_inputs:  # else the outputs were given
            for k, spec in enumerate(self.outputs, start=n_args):
                outputs.append(spec if type(spec) is tuple else output_spec(self.output_shape(k, values), spec))
        offsets, end = self._arena or _layout([b(env) if callable(b) else b for b in self.workspaces])
        values = list(values)  # passed after the buffers to every launch (never changed)
        launches = []
        for template in self.templates:
            queue = template.fixed[0] if template.fixed else template.prepared(env)
            if queue is not None:
                launches.append((queue, template.taken, values))
        return CallPlan(outputs, end, offsets, launches, self.error_symbol)


def output_spec(shape: tuple[int, ...], dtype: np.dtype) -> tuple:
    """What a call plan allocates for an output: (shape, dtype, elements, the pool's size class of its bytes), the
    arguments of `DeviceArray.allocate_exact`."""
    n = math.prod(shape)
    return shape, dtype, n, BlockPool.rounded(n * dtype.itemsize)


def _arena_bytes(itemsize: int, shape: Sequence[int | str], dims: dict[str, DimFn]) -> int | Callable[[dict], int]:
    """A workspace's bytes in the arena, rounded up to ARENA_ALIGN: an int, or for a symbolic shape a function
    of the symbols' values."""
    size = sizer(shape, dims)
    if all(type(d) is int for d in shape):
        return _aligned(math.prod(size({})) * itemsize)
    return lambda env: _aligned(math.prod(size(env)) * itemsize)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ARENA_ALIGN) * ARENA_ALIGN


def _layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Each workspace's offset in the arena, and the arena's bytes."""
    offsets, end = [], 0
    for nbytes in sizes:
        offsets.append(end)
        end += nbytes
    return offsets, end


def sizer(dims: Sequence[int | str], compiled: dict[str, DimFn]) -> Sizer:
    """A function of the symbols' values giving `dims` (ints, or symbolic sizes compiled in `compiled`), each
    at least 0; a constant's function returns one tuple."""
    if all(type(d) is int for d in dims):
        fixed = tuple(dims)
        return lambda env: fixed
    parts = [d if type(d) is int else compiled[d] for d in dims]
    return lambda env: tuple(d if type(d) is int else max(0, d(env)) for d in parts)
