"""Policy presets and explicit fields (moejax/policies/presets.py): a field given (config file,
sweep override, command line) wins over the preset's; a field left "" takes the preset's spec,
or the default combination when no preset is named. `resolve` is what runs, `report` what
results.json records."""

from __future__ import annotations

import os

import pytest

from moejax.errors import ConfigError
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.policies import presets
from moejax.testing import config_from_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# SpecMD's Table 2, written out (moejax/policies/presets.py's docstring), in the specs'
# canonical spelling: preset -> (prefetch, eviction, miss, routing).
TABLE_2 = {
    "specmd_1": ("topk(overfetch=1.0)", "lru", "fetch", "standard"),  # Eliseev & Mazur
    "specmd_2": ("score_percentile(p=80)", "score", "substitute(tol=0.05)", "standard"),  # Zhu
    "specmd_3": ("topk(overfetch=1.0)", "lhu", "fetch_priority", "standard"),  # HOBBIT
    "specmd_4": ("none", "lru", "fetch", "cache_aware(lam=0.3)"),  # Skliar et al.
    "specmd_5": ("score_percentile(p=80)", "least_stale", "fetch", "standard"),  # SpecMD's own
}


def _table(name: str) -> dict:
    return dict(zip(("prefetch", "eviction", "miss", "routing"), TABLE_2[name]))


def _flags_config(*flags: str):
    """configs/default.py with `--config.FIELD=VALUE` flags, parsed as moejax.main does."""
    return config_from_flags(os.path.join(ROOT, "configs", "default.py"), *flags)


def test_defaults_without_a_preset():
    c = base_config()
    assert presets.resolve(c.policies) == presets.DEFAULTS == {
        "eviction": "least_stale", "prefetch": "score_percentile(p=80)", "miss": "fetch",
        "routing": "standard"}
    assert presets.DEFAULTS == _table("specmd_5")  # SpecMD's recommended combination
    assert presets.report(c.policies) == {**presets.DEFAULTS, "preset": "",
                                          "source": dict.fromkeys(presets.FIELDS, "default")}


def test_explicit_fields_without_a_preset():
    c = base_config()
    c.policies.eviction, c.policies.routing = "lru", "cache_aware(lam=0.3)"
    assert presets.resolve(c.policies) == {**presets.DEFAULTS, "eviction": "lru",
                                           "routing": "cache_aware(lam=0.3)"}
    assert presets.report(c.policies)["source"] == {
        "eviction": "explicit", "prefetch": "default", "miss": "default",
        "routing": "explicit"}


def test_the_presets_are_table_2():
    assert sorted(presets.PRESETS) == sorted(TABLE_2)
    for name in TABLE_2:
        assert presets.PRESETS[name] == _table(name), name


@pytest.mark.parametrize("name", sorted(TABLE_2))
def test_a_preset_alone_runs_its_four_specs(name):
    c = base_config()
    c.policies.preset = name
    assert presets.resolve(c.policies) == _table(name)
    r = presets.report(c.policies)
    assert r["preset"] == name and r["source"] == dict.fromkeys(presets.FIELDS, "preset")


def test_an_explicit_field_wins_over_the_preset_on_the_command_line():
    """SpecMD's drop-in experiment as one flag: specmd_1 with Least-Stale eviction."""
    c = _flags_config("--config.policies.preset=specmd_1",
                      "--config.policies.eviction=least_stale")
    assert presets.resolve(c.policies) == {"eviction": "least_stale",
                                           "prefetch": "topk(overfetch=1.0)", "miss": "fetch",
                                           "routing": "standard"}
    assert presets.report(c.policies) == {
        **presets.resolve(c.policies), "preset": "specmd_1",
        "source": {"eviction": "explicit", "prefetch": "preset", "miss": "preset",
                   "routing": "preset"}}
    # An explicit field equal to the preset's still counts as given.
    c = _flags_config("--config.policies.preset=specmd_4", "--config.policies.prefetch=none",
                      "--config.policies.miss=drop(keep=2)")
    assert presets.resolve(c.policies) == {"prefetch": "none", "eviction": "lru",
                                           "miss": "drop(keep=2)",
                                           "routing": "cache_aware(lam=0.3)"}
    assert presets.report(c.policies)["source"]["prefetch"] == "explicit"


def test_sweep_overrides_follow_the_same_rule():
    from launch.worker import apply_overrides

    c = base_config()
    apply_overrides(c, {"policies.preset": "specmd_2", "policies.miss": "fetch"})
    assert presets.resolve(c.policies) == {"prefetch": "score_percentile(p=80)",
                                           "eviction": "score", "miss": "fetch",
                                           "routing": "standard"}
    assert presets.report(c.policies)["source"] == {
        "eviction": "preset", "prefetch": "preset", "miss": "explicit", "routing": "preset"}


def test_the_cache_builds_the_resolved_policies():
    from moejax.cache import CacheShape, build_policies

    shape = CacheShape((0, 1), 2, 8, 2, 1000, 6)
    c = base_config()
    c.policies.preset, c.policies.eviction = "specmd_1", "least_stale"
    eviction, prefetch, miss, routing = build_policies(resolve(c), shape, False)
    assert (eviction.name, prefetch.name, miss.name, routing.name) == (
        "least_stale", "topk", "fetch", "standard")


def test_the_analysis_reads_the_policies_that_ran(tmp_path):
    """A sweep report shows the specs that ran (results' cache.policies), not the config's
    raw fields ("" where the preset filled them)."""
    import json

    from moejax.analysis import report

    c = base_config()
    c.policies.preset, c.policies.eviction = "specmd_1", "least_stale"
    cell = tmp_path / "cells" / "eviction=least_stale,preset=specmd_1"
    cell.mkdir(parents=True)
    (cell / "results.json").write_text(json.dumps({"config": c.to_dict(), "cache": {
        "total": {"requests": 1}, "policies": presets.report(c.policies)}}))
    sweep = report.scan(str(tmp_path))
    assert not sweep.failed and len(sweep.rows) == 1
    row = sweep.rows[0]
    assert (row["eviction"], row["prefetch"], row["miss"], row["routing"]) == (
        "least_stale", "topk(overfetch=1.0)", "fetch", "standard")


def test_specmd_3_runs_and_unknown_presets_are_clear_errors():
    c = base_config()
    c.policies.preset = "specmd_3"  # LHU + the precision cascade: built with the pools
    assert presets.resolve(c.policies) == {
        "prefetch": "topk(overfetch=1.0)", "eviction": "lhu", "miss": "fetch_priority",
        "routing": "standard"}
    assert not presets.UNAVAILABLE
    c.policies.preset = "specmd_9"
    with pytest.raises(ConfigError, match=r"policies.preset='specmd_9' is not one of"):
        presets.resolve(c.policies)
