"""The template registry: operator templates register here once; the graph and the tuner look them up by
name, so neither imports `jitop.topi` by name.

A template is plain functions over a frozen, JSON-serialisable workload:

- `config_space(workload, target)` -> ConfigSpace, every point of which builds correct code;
- `default_config(workload, target)` -> Config, a point of that space derived from the Target;
- `compute(workload, config, target, readers, name)` -> the template's stages (`.out` is the result), its
  operands read through `readers` (so a graph can fuse cheap producers into them);
- `schedule(s, stages, workload, config, target, epilogue=None)` applies the config; with `epilogue` (an
  elementwise consumer of `.out`) the epilogue is computed from the register tile;
- `build(workload, config, target, prepacked=False)` -> (Schedule, [input placeholders..., output]) standalone,
  for tuning; prepacked: the arrays `prepack` makes of the second operand are inputs in its place;
- `operand_reads(workload, config, target)` -> how many times the template evaluates each element of each
  operand (a packed operand once, an operand streamed per panel once per panel), so the graph fuses into
  an operand only what is free to recompute that often;
- `prepack(workload, config, target, operand)` (optional) -> the arrays the template would make of its second
  operand (weights) on every call, made once from its value when it is a constant: `compute(..., packed=)`
  then reads them as inputs ([]: it reads that operand in place);
- `kind_fields`: the workload fields that name the kind of computation (a convolution's kernel size, the
  layout, the dtype): tuned records of one workload inform another (transfer, predicted configs) only when
  these are equal: a 3x3 convolution's best schedule says little about a 1x1's.

>>> from jitop.tuner import registry
>>> import jitop   # importing jitop registers its templates
>>> sorted(registry.names())
['conv2d', 'cuda.conv2d', 'cuda.gemv', 'cuda.matmul', 'matmul']
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable

from jitop.errors import TemplateNotFoundError


@dataclass(frozen=True)
class Template:
    """One operator template: its workload type and the functions described in this module's docstring."""

    name: str
    workload_type: type
    config_space: Callable
    default_config: Callable
    compute: Callable
    schedule: Callable
    build: Callable
    operand_reads: Callable
    kind_fields: tuple[str, ...] = ()
    prepack: Callable | None = None

    def kind(self, workload: Any) -> str:
        """The values of `kind_fields` of `workload` as canonical JSON (equal kinds: comparable workloads)."""
        return json.dumps([_lists(getattr(workload, f)) for f in self.kind_fields])

    def workload_from_json(self, text: str | dict) -> Any:
        """Rebuild a workload from `workload_to_json`'s output (lists become tuples again)."""
        data = json.loads(text) if isinstance(text, str) else dict(text)
        fields = {f.name for f in dataclasses.fields(self.workload_type)}
        if set(data) != fields:
            raise ValueError(f"template '{self.name}': workload fields {sorted(data)} differ from "
                             f"{sorted(fields)}; the record was written by another jitop version")
        return self.workload_type(**{k: _tuples(v) for k, v in data.items()})


_TEMPLATES: dict[str, Template] = {}


def register(template: Template) -> Template:
    """Add a template (once per name; registering the same name twice is a programming error)."""
    if template.name in _TEMPLATES and _TEMPLATES[template.name] is not template:
        raise ValueError(f"a template named '{template.name}' is already registered")
    _TEMPLATES[template.name] = template
    return template


def get(name: str) -> Template:
    """The template registered under `name`."""
    try:
        return _TEMPLATES[name]
    except KeyError:
        raise TemplateNotFoundError(f"no operator template '{name}' is registered; registered: {sorted(_TEMPLATES)} "
                       "(templates register when jitop is imported)") from None


def names() -> list[str]:
    """Names of the registered templates, in registration order."""
    return list(_TEMPLATES)


def workload_to_json(workload: Any) -> str:
    """A workload (a frozen dataclass of ints, strings and tuples) as canonical JSON."""
    return json.dumps(dataclasses.asdict(workload), sort_keys=True, separators=(",", ":"))


def _lists(v: Any) -> Any:
    return [_lists(x) for x in v] if isinstance(v, tuple) else v


def _tuples(v: Any) -> Any:
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v
