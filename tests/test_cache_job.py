"""The cache through the main job: results.json schema, TensorBoard events, the XProf trace,
the grid configs, and clear errors for bad cache settings."""

from __future__ import annotations

import glob
import gzip
import importlib.util
import json
import os

import pytest

from moejax import jobs
from moejax.errors import ConfigError
from moejax.jobs.schema import base_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRID = sorted(glob.glob(os.path.join(ROOT, "configs", "*pct.py")))


def _tiny(**cache):
    c = base_config()
    c.model.preset, c.model.family = "tiny", "mixtral"
    c.run.max_new_tokens = 5
    c.log.progress = False
    c.cache.capacity_frac = 0.25
    for k, v in cache.items():
        setattr(c.cache, k, v)
    return c


@pytest.mark.slow
def test_results_schema_and_tensorboard(tmp_path):
    results = jobs.run(_tiny(), str(tmp_path))
    on_disk = json.loads((tmp_path / "results.json").read_text())
    cache = on_disk["cache"]
    assert cache["slots"] == 8 and cache["clock"] == "virtual"
    total = cache["total"]
    for key in ("requests", "hits", "late_hits", "misses", "collision_misses", "hit_rate",
                "collision_miss_rate", "prefetch_precision", "prefetch_recall", "stall_s",
                "demand_bytes", "prefetch_bytes", "wasted_prefetch_bytes", "h2d_bytes"):
        assert key in total, key
    assert total["hits"] + total["late_hits"] + total["misses"] == total["requests"] > 0
    assert len(cache["per_layer"]) == 4 and cache["timing"]["ttft_s"] > 0
    assert on_disk["generated_token_ids"] == results["generated_token_ids"]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    # Every time series names the clock that made it (this run's cache: the virtual clock);
    # results.json's `timings` are the wall clock's and say so.
    for tag in ("cache/hit_rate", "cache/collision_miss_rate", "transfer/h2d_bytes",
                "perf/virtual/stall_s", "perf/virtual/ttft_s", "perf/virtual/decode_tok_per_s"):
        assert tag in tags, tag
    assert not [t for t in tags if t.startswith("perf/") and t.split("/")[1] != "virtual"]
    assert results["timings"]["clock"] == "wall"
    assert results["timings"]["cache_clock"]["clock"] == results["cache"]["clock"] == "virtual"
    hit = acc.Scalars("cache/hit_rate")
    assert len(hit) == 5  # one point per pass: prefill + 4 decode steps
    assert hit[-1].value == pytest.approx(total["hit_rate"])


@pytest.mark.slow
def test_profile_trace_holds_the_annotations(tmp_path):
    c = _tiny()
    c.profile.enabled = True
    jobs.run(c, str(tmp_path))
    traces = glob.glob(str(tmp_path / "profile" / "**" / "*.trace.json.gz"), recursive=True)
    assert traces, "no XProf trace written"
    names = {e.get("name") for e in json.load(gzip.open(traces[0]))["traceEvents"]}
    for name in ("cache/fetch", "cache/prefetch", "cache/evict", "attention/router",
                 "moe/experts"):
        assert name in names, name


@pytest.mark.slow
def test_full_capacity_generates_the_same_tokens(tmp_path):
    small = jobs.run(_tiny(capacity_frac=0.25), str(tmp_path / "a"))
    full = jobs.run(_tiny(capacity_frac=1.0), str(tmp_path / "b"))
    off = _tiny()
    off.cache.enabled = False
    resident = jobs.run(off, str(tmp_path / "c"))
    assert small["generated_token_ids"] == full["generated_token_ids"] == \
        resident["generated_token_ids"]
    assert full["cache"]["total"]["collision_misses"] == 0


@pytest.mark.parametrize("setting,message", [
    (dict(capacity_frac=0.05), "below what one decode layer needs: top-k = 2"),
    (dict(slots=1), "cache.slots=1 is below what one decode layer needs: top-k = 2"),
    (dict(capacity_frac=1.5), "cache.capacity_frac=1.5 must be in"),
])
def test_capacity_errors_name_both_numbers(setting, message, tmp_path):
    config = _tiny(**setting)
    if "slots" in setting:  # a slot count or a fraction, never both (jobs.CONFLICTS)
        config.cache.capacity_frac = base_config().cache.capacity_frac
    with pytest.raises(ConfigError, match=message):
        jobs.run(config, str(tmp_path))


@pytest.mark.parametrize("field,spec,message", [
    ("eviction", "lru2", "unknown eviction policy 'lru2'.*least_stale"),
    ("prefetch", "topk(overfetch=1.5, depth=2)", "unknown argument 'depth'"),
    ("miss", "drop(keep=0)", "keep=0"),
    ("routing", "cache_aware(lam=-1)", "lam=-1"),
    ("miss", 'fetch_priority(levels="int4:int8")', "from high to low precision"),
    ("miss", 'fetch_lowest_bit(levels="int8:fp8")', "fp8"),
])
def test_bad_policy_specs(field, spec, message, tmp_path):
    c = _tiny()
    setattr(c.policies, field, spec)
    with pytest.raises(ConfigError, match=message):
        jobs.run(c, str(tmp_path))


def _load(path):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grid_configs_cover_families_and_capacities():
    names = {os.path.basename(p)[:-3] for p in GRID}
    assert names == {f"{f}_{p}pct" for f in ("olmoe", "mixtral", "qwen", "phimoe")
                     for p in (1, 5, 25)}
    for path in GRID:
        full, tiny = _load(path).get_config(), _load(path).get_config("scale=tiny")
        pct = int(os.path.basename(path).split("_")[1][:-len("pct.py")])
        assert full.cache.capacity_frac == tiny.cache.capacity_frac == pct / 100
        assert tiny.cache.min_slots > 0 and full.cache.min_slots == 0
    with pytest.raises(ValueError, match="scale"):
        _load(GRID[0]).get_config("scale=huge")


def test_full_scale_without_checkpoint_is_a_clear_error(tmp_path):
    c = _load(os.path.join(ROOT, "configs", "mixtral_1pct.py")).get_config()
    with pytest.raises(ConfigError, match="--config.model.checkpoint"):
        jobs.run(c, str(tmp_path))


@pytest.mark.slow
def test_tiny_scale_grid_config_runs(tmp_path):
    c = _load(os.path.join(ROOT, "configs", "phimoe_1pct.py")).get_config("scale=tiny")
    c.run.max_new_tokens, c.log.progress = 3, False
    results = jobs.run(c, str(tmp_path))
    assert results["cache"]["slots"] == 2  # 1% of 32 experts, floored at top-k


def test_specmd_presets(tmp_path):
    from moejax.policies.presets import PRESETS

    assert set(PRESETS) == {f"specmd_{i}" for i in range(1, 6)}
    c = _tiny()
    c.policies.preset = "specmd_5"
    res = jobs.run(c, str(tmp_path / "a"))
    assert res["cache"]["policies"] == {"prefetch": "score_percentile(p=80)",
                                        "eviction": "least_stale", "miss": "fetch",
                                        "routing": "standard", "preset": "specmd_5",
                                        "source": dict.fromkeys(
                                            ("eviction", "prefetch", "miss", "routing"),
                                            "preset"),
                                        # as built, defaults included: what `least_stale` meant
                                        "arguments": {
                                            "eviction": {"order": "two_queue",
                                                         "prefetch_current": "pass"},
                                            "prefetch": {"p": 80, "lookahead": 1},
                                            "miss": {}, "routing": {}}}
    c.policies.preset = "specmd_3"  # LHU + the precision cascade, over quantized pools
    res = jobs.run(c, str(tmp_path / "b"))
    assert list(res["cache"]["pools"]) == ["int8", "int4", "int2"]  # SpecMD's cascade
    assert sum(res["cache"]["total"]["requests_by_precision"].values()) == \
        res["cache"]["total"]["requests"]
    c.policies.preset = "specmd_9"
    with pytest.raises(ConfigError, match="policies.preset='specmd_9'"):
        jobs.run(c, str(tmp_path / "c"))
