"""Cache keys: an explicit, ordered list of named parts, hashed into one digest.

Every entry of the persistent cache is stored under the digest of its parts, and its parts are stored
beside it, so a miss can be explained: `diff` names the parts that differ from the nearest stored entry.
Nothing time- or place-dependent is a part (no mtimes, no paths): two identical programs get one key, and
anything that changes the generated code (graph, configs, Target with its build options, jitop's own
code, LLVM) changes it.

>>> k = Key.of(schema=1, kind="kernel", graph="ab12", target="znver3-avx2-t2")
>>> k.names()
['schema', 'kind', 'graph', 'target']
>>> k.digest == Key.of(schema=1, kind="kernel", graph="ab12", target="znver3-avx2-t2").digest
True
>>> diff(k, Key.of(schema=1, kind="kernel", graph="cd34", target="znver3-avx2-t2"))
['graph']
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 2  # bump to invalidate every stored kernel at once (tinygrad's table-name version)


@dataclass(frozen=True)
class Key:
    """Ordered (name, value) parts; values are JSON data (str, int, float, bool, None, lists, dicts)."""

    parts: tuple[tuple[str, Any], ...]

    @staticmethod
    def of(**parts: Any) -> "Key":
        """A key from keyword parts, in the order given."""
        return Key(tuple(parts.items()))

    def names(self) -> list[str]:
        """The part names, in order."""
        return [name for name, _ in self.parts]

    def get(self, name: str) -> Any:
        """The value of one part (KeyError if the key has no such part)."""
        for n, v in self.parts:
            if n == name:
                return v
        raise KeyError(name)

    @property
    def digest(self) -> str:
        """sha256 of the canonical JSON of the parts (their order counts)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def to_json(self) -> str:
        """The parts as canonical JSON: a list of [name, value] pairs."""
        return json.dumps([[n, v] for n, v in self.parts], sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> "Key":
        """The key `to_json` wrote; ValueError for anything else."""
        data = json.loads(text)
        if not isinstance(data, list) or not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
                                                 for p in data):
            raise ValueError("a cache key is a JSON list of [name, value] pairs")
        return Key(tuple((n, _frozen(v)) for n, v in data))

    def describe(self, width: int = 72) -> str:
        """One line per part, long values shortened."""
        lines = []
        for name, value in self.parts:
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            lines.append(f"  {name:<8} {text if len(text) <= width else text[:width - 3] + '...'}")
        return "\n".join(lines)


def _frozen(value: Any) -> Any:
    """JSON lists back as tuples, so a key read from disk equals the one built in memory."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return {k: _frozen(v) for k, v in value.items()}
    return value


def diff(a: Key, b: Key) -> list[str]:
    """Names of the parts whose values differ (a part present in only one key counts as differing)."""
    da, db = dict(a.parts), dict(b.parts)
    names = list(dict.fromkeys([*a.names(), *b.names()]))
    return [n for n in names if n not in da or n not in db or _canon(da[n]) != _canon(db[n])]


def nearest(key: Key, candidates: list[Key]) -> tuple[Key | None, list[str]]:
    """The candidate differing from `key` in the fewest parts (earlier parts weigh more on a tie), and those
    parts; (None, []) without candidates."""
    best, best_diff, best_score = None, [], None
    order = {n: i for i, n in enumerate(key.names())}
    for c in candidates:
        d = diff(key, c)
        score = (len(d), [-order.get(n, len(order)) for n in d])
        if best_score is None or score < best_score:
            best, best_diff, best_score = c, d, score
    return best, best_diff


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
