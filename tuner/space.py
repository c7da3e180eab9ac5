"""Tuning spaces as plain data (AutoTVM's ConfigSpace): knobs, and a Config that is one point of them.

A template defines its knobs on a ConfigSpace; a Config is a JSON-serialisable choice of every knob.
Points are numbered in mixed radix, so `space.get(index)` and `space.index_of(config)` convert.

>>> space = ConfigSpace()
>>> space.define_split("tile_x", 1024, num_outputs=2)
>>> space.define_knob("unroll", [1, 2, 4])
>>> cfg = space.get(5)
>>> space.index_of(cfg)
5
>>> Config.from_json(cfg.to_json()) == cfg
True
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence


def _factorizations(n: int, parts: int, max_factor: int | None) -> list[tuple[int, ...]]:
    """Ordered tuples of `parts` factors whose product is n (the outermost factor absorbs the rest)."""
    if parts == 1:
        return [(n,)]
    divisors = [d for d in range(1, n + 1) if n % d == 0 and (max_factor is None or d <= max_factor)]
    out = []
    for d in divisors:
        for rest in _factorizations(n // d, parts - 1, max_factor):
            out.append(rest + (d,))
    return out


@dataclass(frozen=True)
class Knob:
    """One tunable choice: a name, a kind and the list of candidate values (JSON-serialisable)."""

    name: str
    kind: str                       # "split" | "reorder" | "annotate" | "knob"
    candidates: tuple[Any, ...]

    def __len__(self) -> int:
        return len(self.candidates)


@dataclass(frozen=True)
class Config:
    """A point of a ConfigSpace: knob name -> chosen value. Plain data: hashable, comparable, JSON."""

    values: tuple[tuple[str, Any], ...]

    def __getitem__(self, name: str) -> Any:
        for k, v in self.values:
            if k == name:
                return v
        raise KeyError(f"config has no knob '{name}'; knobs: {[k for k, _ in self.values]}")

    @staticmethod
    def of(**values: Any) -> "Config":
        """Config.of(tile_m=(4, 8), order="panel_outer")."""
        return Config(tuple((k, _freeze(v)) for k, v in sorted(values.items())))

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in self.values}, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Config":
        data = json.loads(text)
        return Config(tuple((k, _freeze(v)) for k, v in sorted(data.items())))

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)


def _freeze(v: Any) -> Any:
    return tuple(_freeze(x) for x in v) if isinstance(v, list) else v


@dataclass
class ConfigSpace:
    """The knobs of one template; `len(space)` points, numbered 0 .. len(space) - 1."""

    knobs: list[Knob] = field(default_factory=list)

    def _add(self, knob: Knob) -> None:
        if any(k.name == knob.name for k in self.knobs):
            raise ValueError(f"knob '{knob.name}' is defined twice in this space")
        if not knob.candidates:
            raise ValueError(f"knob '{knob.name}' has no candidates")
        self.knobs.append(knob)

    def define_split(self, name: str, extent: int, num_outputs: int = 2, max_factor: int | None = None,
                     candidates: Sequence[Sequence[int]] | None = None) -> None:
        """Split an axis of `extent` into `num_outputs` nested factors (outer first); non-divisible
        splits can be listed explicitly in `candidates` (the outermost factor is then ceil-divided)."""
        cands = [tuple(c) for c in candidates] if candidates is not None else \
            _factorizations(extent, num_outputs, max_factor)
        self._add(Knob(name, "split", tuple(sorted(cands))))

    def define_reorder(self, name: str, axes: Sequence[str], candidates: Sequence[Sequence[int]] | None = None) -> None:
        """A loop order: permutations of the axis positions (all of them by default)."""
        cands = [tuple(c) for c in candidates] if candidates is not None else list(itertools.permutations(range(len(axes))))
        self._add(Knob(name, "reorder", tuple(cands)))

    def define_annotate(self, name: str, options: Sequence[str]) -> None:
        """An annotation choice, e.g. ["none", "unroll", "vectorize"]."""
        self._add(Knob(name, "annotate", tuple(options)))

    def define_knob(self, name: str, candidates: Sequence[Any]) -> None:
        """Any other choice from a list of JSON-serialisable values."""
        self._add(Knob(name, "knob", tuple(_freeze(list(c)) if isinstance(c, list) else c for c in candidates)))

    def __len__(self) -> int:
        return math.prod(len(k) for k in self.knobs)

    def get(self, index: int) -> Config:
        """The point with this index (mixed radix, first knob fastest)."""
        if not 0 <= index < len(self):
            raise IndexError(f"config index {index} is outside the space of {len(self)} points")
        values = []
        for k in self.knobs:
            index, r = divmod(index, len(k))
            values.append((k.name, k.candidates[r]))
        return Config(tuple(sorted(values)))

    def index_of(self, cfg: Config) -> int:
        index, scale = 0, 1
        for k in self.knobs:
            try:
                pos = k.candidates.index(cfg[k.name])
            except ValueError:
                raise ValueError(f"config value {cfg[k.name]!r} is not a candidate of knob '{k.name}'") from None
            index += pos * scale
            scale *= len(k)
        return index

    def knob_vector(self, cfg: Config) -> list[int]:
        """The candidate position of each knob (the cost model's simplest features)."""
        return [k.candidates.index(cfg[k.name]) for k in self.knobs]

    def __iter__(self) -> Iterator[Config]:
        return (self.get(i) for i in range(len(self)))

    def __repr__(self) -> str:
        return f"ConfigSpace({len(self)} points: " + ", ".join(f"{k.name}[{len(k)}]" for k in self.knobs) + ")"
