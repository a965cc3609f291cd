"""studies/specmd/grid_quality.py, the quality–speed frontier grid: the parts and models make the
documented cells, every cell is a valid config whose cache can be built for its model, and
the names tell the cells apart."""

from __future__ import annotations

import collections
import os

import pytest

from launch import cells as cells_lib
from moejax import bundled
from moejax.families import preset
from moejax.jobs.specs import resolve
from moejax.model_source import embedded_config
from tests.sweep_fixtures import grid_config

GRID = os.path.join(os.path.dirname(os.path.dirname(__file__)), "studies", "specmd", "grid_quality.py")


def _module():
    return cells_lib.load_config_module(GRID)


def _cells(arg: str | None = None) -> list[dict]:
    return cells_lib.collect(_module().sweep, arg)


def _config(overrides: dict, arg: str | None = None):
    return grid_config(GRID, overrides, arg)


def _model(o: dict) -> str:
    return "embedded" if o["model.preset"] == "embedded" else o["model.family"]


def test_the_config():
    c = _config({})
    assert c.job == "quality" and c.clock.kind == "virtual"
    assert (c.log.tensorboard, c.log.progress) == (False, False)
    assert c.cache.capacity_of == "model" and c.hardware.preset == "a100_specmd"
    assert c.quality.text_file == bundled.heldout_path("prose")
    assert os.path.isfile(c.quality.text_file)
    assert c.quality.teacher_forcing == "decode"
    assert 0 < c.quality.max_tokens <= 512 and 2 <= c.quality.drift_prompts <= 4
    assert _config({}, "text=unseen").quality.text_file == bundled.heldout_path("unseen")
    with pytest.raises(ValueError):
        _config({}, "text=poetry")
    with pytest.raises(ValueError, match="config argument"):
        _config({}, "nothing=1")


def test_top_k_floors_match_the_models():
    grid = _module()
    assert grid.TOP_K["embedded"] == embedded_config().top_k
    for family in grid.FAMILIES:
        assert grid.TOP_K[family] == preset(family, "tiny").top_k
    for o in _cells():
        assert o["cache.min_slots"] == grid.TOP_K[_model(o)]


def test_parts_and_counts():
    grid = _module()
    all_cells = _cells()
    assert len(all_cells) == 150
    assert len(_cells("models=embedded")) == 46
    assert len(_cells("models=families")) == 104
    assert len(_cells("parts=miss")) == 5 * 6 * 2
    assert len(_cells("parts=routing")) == 5 * 5 * 2
    assert len(_cells("parts=precision")) == 5 * 4 * 2
    assert len(_cells("parts=cross")) == 6 * 5
    assert len(_cells("parts=miss+routing")) == 5 * (6 + 4) * 2  # the baseline once
    with pytest.raises(cells_lib.SweepError, match="no cells"):  # cross: embedded only
        _cells("models=families,parts=cross")
    with pytest.raises(ValueError, match="parts="):
        _cells("parts=nothing")
    with pytest.raises(ValueError, match="models="):
        _cells("models=mixtral")

    per_model = collections.Counter(_model(o) for o in all_cells)
    assert per_model == {"embedded": 46, "mixtral": 26, "olmoe": 26, "phimoe": 26,
                         "qwen2_moe": 26}
    for o in _cells("parts=miss"):
        assert o["policies.routing"] == "standard" and "cache.precision" not in o
    assert {o["policies.miss"] for o in all_cells} == set(grid.MISSES)
    assert {o["policies.routing"] for o in all_cells} == set(grid.ROUTINGS)
    assert {o.get("cache.precision", "native") for o in all_cells} == set(grid.PRECISIONS)
    assert {o["cache.capacity_frac"] for o in all_cells} == set(grid.CAPACITIES)
    for o in _cells("parts=precision"):
        assert (o["policies.miss"], o["policies.routing"]) == ("fetch", "standard")
    cross = _cells("parts=cross")
    assert {(o["policies.miss"], o["policies.routing"]) for o in cross} == {
        (m, r) for m in grid.MISSES for r in grid.ROUTINGS}
    assert {(_model(o), o["cache.capacity_frac"]) for o in cross} == {
        ("embedded", grid.CROSS_CAPACITY)}
    # Every (model, capacity) has its baseline: plain fetch, standard routing, native.
    for model in per_model:
        for cap in grid.CAPACITIES:
            assert any(_model(o) == model and o["cache.capacity_frac"] == cap
                       and o["policies.miss"] == "fetch"
                       and o["policies.routing"] == "standard" and "cache.precision" not in o
                       for o in all_cells)


def test_names_are_unique_and_readable():
    cells = cells_lib.make_cells(_cells())  # also rejects two cells with the same overrides
    names = [c.name for c in cells]
    assert len({n.lower() for n in names}) == len(names) == 150
    for n in names:
        assert cells_lib.NAME_RE.match(n) and "-h" not in n  # no hash: readable as is
        assert "preset=" in n and "miss=" in n and "routing=" in n


def test_every_cell_builds_its_cache():
    """Each cell's overrides are declared fields and its policy specs, precision levels and
    pools are valid for its model: the cache is built as the quality job builds it (weights
    of the random presets drawn once per model; no forward pass)."""
    from moejax.cache import build_cache_for
    from moejax.model_source import load_model

    loaded = {}
    for o in _cells():
        c = _config(o)
        key = (c.model.family, c.model.preset)
        if key not in loaded:
            loaded[key] = load_model(resolve(c).model)
        m = loaded[key]
        cache = build_cache_for(resolve(c), m.cfg, m.precision_bytes(), m.cfg.norm_topk_prob)
        assert all(p.num_slots >= m.cfg.top_k for p in cache.shape.pools)
        levels = [p.precision for p in cache.shape.pools]
        miss = o["policies.miss"]
        if miss == "fetch_priority":
            assert levels == ["int8", "int4", "int2"]
        elif miss == "fetch_lowest_bit":
            assert levels == ["int8", "int4"]
        else:
            assert levels == [o.get("cache.precision", "native")]
    assert len(loaded) == 5
