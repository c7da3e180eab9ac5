"""The arrays a candidate runs on in the measuring runner (the child side of `jitop.tuner.measure`).

Random operands, the same for every candidate of a task (seeded by the task key). A task whose weights are a
constant of the program (`Task.constant_weights`) is measured as the graph runs it:

- the weights are packed for the candidate's config by the template's `prepack` and passed in their place
  (the graph packs them once at compile time; packing them inside the kernel on every call, as the standalone
  build does, would time work the program never does);
- they are cold: each timed run reads another copy of them, enough copies to overflow the last-level cache,
  as a model reads each layer's weights once per call with every other layer's in between. The input stays
  warm, as the producer that just wrote it leaves it.
"""
from __future__ import annotations

from typing import Any

import numpy as np

FLUSH_CAP = 256 << 20   # some VMs report a huge L3: more than this buys nothing but time
MAX_COPIES = 1024       # small weights: a few MiB of copies already leave the private caches
_ALIGN = 64             # each copy starts on a cache line (and a vector register's width)


def cold_bytes(module: Any) -> int:
    """How much memory to stream through to leave the caches cold: twice the last-level cache, capped."""
    return min(2 * module.target.l3_bytes, FLUSH_CAP)


class Operands:
    """One task's input arrays: per module parameter (`logical` is None), or the template's logical operands
    (input, weights) from which each candidate's packed weights are made."""

    def __init__(self, arrays: list[np.ndarray], task: Any = None):
        self.arrays = arrays
        self.task = task

    @staticmethod
    def for_task(request: dict, module: Any, sizes: dict[str, int]) -> "Operands":
        """Random, deterministic per task; a request with "task" (constant weights) gets the logical operands."""
        rng = np.random.default_rng(int(request["task_key"][:16], 16))
        if request.get("task") is None:
            return Operands([random_array(rng, shape_at(p.shape, sizes), p.dtype) for p in module.params
                             if not p.is_output])
        from jitop.tuner.task import Task
        task = Task.from_json(request["task"])
        return Operands([random_array(rng, shape, dtype) for shape, dtype in _logical_inputs(task)], task)

    def inputs(self, module: Any, request: dict) -> list[np.ndarray]:
        """The arrays this candidate's kernel takes before its outputs."""
        if self.task is None:
            return self.arrays
        from jitop.tuner import registry
        from jitop.tuner.space import Config
        template, task = registry.get(self.task.template), self.task
        config = (Config.from_json(request["config"]) if request.get("config") is not None
                  else template.default_config(task.workload, task.target))
        packed = template.prepack(task.workload, config, task.target, self.arrays[1])
        inputs = [self.arrays[0], *packed] if packed else list(self.arrays)
        expected = sum(not p.is_output for p in module.params)
        if len(inputs) != expected:
            raise ValueError(f"the kernel takes {expected} inputs, but {len(inputs)} were made for a task with "
                             f"constant weights (the build and prepack disagree on what is packed)")
        return inputs

    @property
    def constant_weights(self) -> bool:
        return self.task is not None


def _logical_inputs(task: Any) -> list[tuple[tuple[int, ...], np.dtype]]:
    """The template's standalone input shapes at the task's representative sizes (its default config's build,
    unpacked: (input, weights))."""
    from jitop.tuner import registry
    template, workload = registry.get(task.template), task.concrete()
    _, tensors = template.build(workload, template.default_config(workload, task.target), task.target)
    return [(tuple(int(d) for d in t.shape), np.dtype(t.dtype.np)) for t in tensors[:-1]]


class ColdCopies:
    """Copies of a candidate's weights laid end to end in one buffer (allocated once, refilled only when the
    packed weights change), so consecutive timed runs read weights that are not in any cache."""

    def __init__(self) -> None:
        self.buffer: np.ndarray | None = None
        self.copies: list[list[np.ndarray]] = []

    def rotation(self, inputs: list[np.ndarray], outs: list[np.ndarray], total: int) -> list[list[np.ndarray]]:
        """Argument lists to cycle through: the input, one copy of the weights (inputs[1:]) each, the outputs."""
        weights = inputs[1:]
        size = sum(_aligned(w.nbytes) for w in weights)
        count = min(MAX_COPIES, total // max(size, 1))
        if count < 2 or size == 0:
            return [inputs + outs]
        if not self._holds(weights, count):
            self._fill(weights, count, size)
        return [[inputs[0], *copy, *outs] for copy in self.copies]

    def _holds(self, weights: list[np.ndarray], count: int) -> bool:
        first = self.copies[0] if self.copies else []
        return (len(self.copies) == count and len(first) == len(weights)
                and all(a.shape == w.shape and a.dtype == w.dtype and np.array_equal(a, w)
                        for a, w in zip(first, weights)))

    def _fill(self, weights: list[np.ndarray], count: int, size: int) -> None:
        need = count * size + _ALIGN
        if self.buffer is None or self.buffer.nbytes < need:
            self.buffer = np.empty(need, np.uint8)
        start = -self.buffer.ctypes.data % _ALIGN
        self.copies = []
        for k in range(count):
            offset = start + k * size
            copy = []
            for w in weights:
                view = self.buffer[offset:offset + w.nbytes].view(w.dtype).reshape(w.shape)
                np.copyto(view, w)
                copy.append(view)
                offset += _aligned(w.nbytes)
            self.copies.append(copy)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def shape_at(dims: tuple, sizes: dict[str, int]) -> tuple[int, ...]:
    """A parameter's shape with its symbolic dims ("s0", "(s0 + 7) // 8") evaluated at `sizes`."""
    from jitop.runtime.args import compile_dim
    return tuple(d if isinstance(d, int) else compile_dim(d)(sizes) for d in dims)


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    low = 0 if dtype.kind == "u" else -3  # small ints: products and sums of them do not overflow
    return rng.integers(low, 4, shape).astype(dtype)
