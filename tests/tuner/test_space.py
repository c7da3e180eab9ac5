"""Config spaces are plain data: index <-> config round trips, JSON round trips, sizes."""
from __future__ import annotations

import json

import pytest

from jitop.tuner.space import Config, ConfigSpace


def _space() -> ConfigSpace:
    s = ConfigSpace()
    s.define_split("tile_x", 64, num_outputs=2)
    s.define_split("tile_y", 12, num_outputs=3, max_factor=4)
    s.define_reorder("order", ["i", "j", "k"])
    s.define_annotate("ann", ["none", "unroll", "vectorize"])
    s.define_knob("panel_outer", [True, False])
    return s


def test_size_is_the_product_of_knob_sizes() -> None:
    s = _space()
    assert len(s) == 7 * len(s.knobs[1]) * 6 * 3 * 2
    assert all(a * b * c == 12 for a, b, c in s.knobs[1].candidates)
    assert all(max(f[1:]) <= 4 for f in s.knobs[1].candidates)


def test_every_index_round_trips_through_config_and_json() -> None:
    s = _space()
    seen = set()
    for i in range(len(s)):
        cfg = s.get(i)
        assert s.index_of(cfg) == i
        assert Config.from_json(cfg.to_json()) == cfg
        seen.add(cfg)
    assert len(seen) == len(s)
    json.loads(s.get(0).to_json())  # plain JSON


def test_errors_name_the_knob() -> None:
    s = _space()
    with pytest.raises(IndexError, match="outside the space"):
        s.get(len(s))
    with pytest.raises(KeyError, match="no knob 'missing'"):
        s.get(0)["missing"]
    with pytest.raises(ValueError, match="defined twice"):
        s.define_knob("ann", [1])
    bad = Config(tuple(sorted({**s.get(0).as_dict(), "ann": "bogus"}.items())))
    with pytest.raises(ValueError, match="'ann'"):
        s.index_of(bad)
