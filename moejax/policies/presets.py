"""Named policy combinations: SpecMD's Table 2 configurations (`policies.preset`).

| preset | SpecMD | prefetch | eviction | miss | routing |
| --- | --- | --- | --- | --- | --- |
| specmd_1 | #1 Spec+LRU+Fetch (Eliseev & Mazur) | topk(1.0) | lru | fetch | standard |
| specmd_2 | #2 Score+ScoreEvict+Subs (Zhu et al.) | score_percentile(80) | score | substitute | standard |
| specmd_3 | #3 Spec+LHU+Cascade (HOBBIT) | topk(1.0) | lhu | fetch_priority | standard |
| specmd_4 | #4 NoPrefetch+LRU+Fetch+CacheAware (Skliar et al.) | none | lru | fetch | cache_aware(0.3) |
| specmd_5 | #5 Score+LS+Fetch (SpecMD's choice) | score_percentile(80) | least_stale | fetch | standard |

`specmd_3` needs quantized expert tiers (LHU, precision cascade): asking for it is a clear error
until they exist.
"""

from __future__ import annotations

from moejax.config import ConfigError

PRESETS: dict[str, dict[str, str]] = {
    "specmd_1": dict(prefetch="topk(overfetch=1.0)", eviction="lru", miss="fetch",
                     routing="standard"),
    "specmd_2": dict(prefetch="score_percentile(p=80)", eviction="score",
                     miss="substitute(tol=0.05)", routing="standard"),
    "specmd_3": dict(prefetch="topk(overfetch=1.0)", eviction="lhu", miss="fetch_priority",
                     routing="standard"),
    "specmd_4": dict(prefetch="none", eviction="lru", miss="fetch",
                     routing="cache_aware(lam=0.3)"),
    "specmd_5": dict(prefetch="score_percentile(p=80)", eviction="least_stale", miss="fetch",
                     routing="standard"),
}


def resolve(policies) -> dict[str, str]:
    """The four policy specs of a `policies` config group: its preset's when one is named
    (the preset sets all four), else the group's own fields."""
    name = policies.preset
    if not name:
        return {k: policies[k] for k in ("eviction", "prefetch", "miss", "routing")}
    if name not in PRESETS:
        raise ConfigError(f"policies.preset={name!r} is not one of {sorted(PRESETS)}")
    return dict(PRESETS[name])


def report(policies) -> dict[str, str]:
    """What results files record: the four specs that ran, and the preset's name if any."""
    return {**resolve(policies), "preset": policies.preset}
