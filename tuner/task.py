"""Tasks and the schedule choice: `pick(task)` is the one question the compile pipeline asks.

A Task is one workload of one template for one Target; its key is a stable content hash (the unit of
tuning records and of the cache). `pick` answers with a Choice: the config and where it came from. Sources
are consulted in order (tuned records, transferred, ... registered by the tuner and the cache with
`add_source`); the template's default always answers last, so every workload has a schedule.

>>> import jitop
>>> from jitop.tuner.registry import get
>>> wl = get("matmul").workload_type(m=64, n=64, k=64, dtype="float32")
>>> task = Task("matmul", wl, jitop.Target.from_string("haswell"))
>>> choice = pick(task)
>>> choice.source
'default'
>>> get("matmul").config_space(wl, task.target).index_of(choice.config) >= 0
True
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from jitop.target import CudaTarget, Target
from jitop.tuner import registry
from jitop.tuner.space import Config, ConfigSpace


@dataclass(frozen=True)
class Task:
    """(template name, workload, target): what one tuned config is chosen for."""

    template: str
    workload: Any
    target: Target | CudaTarget
    # the second operand (weights) is a constant of the program, packed once by the graph (template.prepack)
    # and cold in the cache at each call: the tuner measures it so. Not part of the key: the same workload
    # picks the same record either way.
    constant_weights: bool = dataclasses.field(default=False, compare=False)

    @functools.cached_property  # frozen fields: computed once (the search asks for it per config and step)
    def key(self) -> str:
        """Stable content hash of the template, workload and target key."""
        text = json.dumps([self.template, registry.workload_to_json(self.workload), self.target.key])
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    @property
    def flops(self) -> int:
        """Floating-point operations of one run of the workload."""
        return int(self.workload.flops)

    @property
    def sizes(self) -> dict[str, int]:
        """A symbolic workload's symbols at their representative sizes ("s0~8" -> {"s0": 8}): where it is
        measured and tuned. Empty for a concrete one.

        >>> import jitop
        >>> from jitop.tuner.registry import get
        >>> wl = get("matmul").workload_type(m="s0~8", n=64, k=64, dtype="float32")
        >>> Task("matmul", wl, jitop.Target.from_string("haswell")).sizes
        {'s0': 8}
        """
        return {name: rep for name, rep in self._symbolic_fields().values()}

    def concrete(self, sizes: dict[str, int] | None = None) -> Any:
        """The workload with each symbolic field at `sizes` (default: its representative size, "s0~8" -> 8):
        what the cost model featurises for a symbolic task, and its flops at a call's sizes."""
        fields = {f: (sizes or {}).get(name, rep) for f, (name, rep) in self._symbolic_fields().items()}
        return dataclasses.replace(self.workload, **fields) if fields else self.workload

    def _symbolic_fields(self) -> dict[str, tuple[str, int]]:
        """Workload field -> (symbol name, representative size) of each symbolic ("name~rep") field."""
        out = {}
        for f in dataclasses.fields(self.workload):
            v = getattr(self.workload, f.name)
            if isinstance(v, str) and "~" in v:
                name, _, rep = v.partition("~")
                out[f.name] = (name, int(rep))
        return out

    @property
    def kind(self) -> str:
        """The kind of computation (`Template.kind`): tuned records inform only workloads of the same kind."""
        return registry.get(self.template).kind(self.workload)

    def config_space(self) -> ConfigSpace:
        """The template's space of configs for this workload and Target."""
        return registry.get(self.template).config_space(self.workload, self.target)

    def build(self, config: Config, concrete: bool = False) -> tuple[Any, list]:
        """The template's standalone build of `config` as the tuner measures it (Schedule, [inputs..., output]):
        with constant weights, their packed arrays are inputs in their place, as the graph passes them.
        concrete: at the representative sizes of the symbolic fields (numbers for every loop extent)."""
        workload = self.concrete() if concrete else self.workload
        return registry.get(self.template).build(workload, config, self.target, prepacked=self.constant_weights)

    def to_json(self) -> str:
        """The task as JSON (template name, workload fields, full Target); `from_json` reads it back."""
        data = {"template": self.template, "workload": json.loads(registry.workload_to_json(self.workload)),
                "target": json.loads(self.target.to_json())}
        if self.constant_weights:  # absent otherwise: a record's line is as it always was
            data["constant_weights"] = True
        return json.dumps(data, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Task":
        """A Task from `to_json`'s text."""
        data = json.loads(text)
        template = registry.get(data["template"])
        return Task(data["template"], template.workload_from_json(data["workload"]), _target_from_json(data["target"]),
                    constant_weights=data.get("constant_weights") is True)

    def __str__(self) -> str:
        where = self.target.arch if isinstance(self.target, CudaTarget) else self.target.cpu
        return f"{self.template}{registry.workload_to_json(self.workload)} on {where}"


def _target_from_json(data: dict) -> Target | CudaTarget:
    """A task's Target from its JSON: a GPU's ("kind": "cuda") or a CPU's."""
    gpu = isinstance(data, dict) and data.get("kind") == "cuda"
    return CudaTarget.from_json(data) if gpu else Target.from_json(data)


@dataclass(frozen=True)
class Choice:
    """The config picked for a task and its source: "default" (today), "tuned", "transferred", ..."""

    config: Config
    source: str
    note: str = ""


Source = Callable[[Task], "Choice | None"]
_SOURCES: list[Source] = []
_LISTENERS: list[Callable[[], None]] = []


def add_source(source: Source, first: bool = False) -> None:
    """Consult `source(task)` before the template's default (tuned records, transfer, prediction); `first`:
    before every other source too (records applied explicitly win over the cache's)."""
    if source not in _SOURCES:
        _SOURCES.insert(0 if first else len(_SOURCES), source)
        _changed()


def remove_source(source: Source) -> None:
    """Stop consulting `source`."""
    if source in _SOURCES:
        _SOURCES.remove(source)
        _changed()


def on_sources_changed(listener: Callable[[], None]) -> None:
    """Call `listener()` whenever a source is added or removed (the dispatcher drops compiled kernels whose
    configs may no longer be the ones `pick` would choose)."""
    if listener not in _LISTENERS:
        _LISTENERS.append(listener)


def _changed() -> None:
    for listener in list(_LISTENERS):
        listener()


def pick(task: Task) -> Choice:
    """The config to build `task` with: the first source that answers with a valid point of the task's
    space, else the template's default for the task's Target. A source that fails or answers with a
    config outside the space is skipped with one warning: a record never makes a compile fail."""
    template = registry.get(task.template)
    for source in list(_SOURCES):
        try:
            choice = source(task)
        except Exception as err:  # noqa: BLE001 - a broken source must not break the user's call
            _warn_once(source, f"failed ({type(err).__name__}: {err})")
            continue
        if choice is None:
            continue
        if _valid(task, choice.config):
            return choice
        _warn_once(source, f"answered {choice.config.to_json()}, which is not a point of the space of {task}")
    return Choice(template.default_config(task.workload, task.target), "default")


_WARNED: set[tuple[str, str]] = set()


def _warn_once(source: Source, what: str) -> None:
    name = getattr(source, "__qualname__", repr(source))
    if (name, what.split(" ")[0]) not in _WARNED:
        _WARNED.add((name, what.split(" ")[0]))
        warnings.warn(f"jitop: schedule source {name} {what}; using the next source", RuntimeWarning, stacklevel=3)


def _valid(task: Task, config: Config) -> bool:
    try:
        task.config_space().index_of(config)
    except (KeyError, ValueError):
        return False
    return True
