"""Named policy combinations: SpecMD's Table 2 configurations (`policies.preset`), and the rule
that combines a preset with the four policy fields.

| preset | SpecMD | prefetch | eviction | miss | routing |
| --- | --- | --- | --- | --- | --- |
| specmd_1 | #1 Spec+LRU+Fetch (Eliseev & Mazur) | topk(1.0) | lru | fetch | standard |
| specmd_2 | #2 Score+ScoreEvict+Subs (Zhu et al.) | score_percentile(80) | score | substitute | standard |
| specmd_3 | #3 Spec+LHU+Cascade (HOBBIT) | topk(1.0) | lhu | fetch_priority | standard |
| specmd_4 | #4 NoPrefetch+LRU+Fetch+CacheAware (Skliar et al.) | none | lru | fetch | cache_aware(0.3) |
| specmd_5 | #5 Score+LS+Fetch (SpecMD's choice) | score_percentile(80) | least_stale | fetch | standard |

The rule: each of `policies.eviction` / `prefetch` / `miss` / `routing` that is given (not
`""`: set by a config file, a sweep override or `--config.policies.FIELD=...`) runs as given;
a field left `""` takes the preset's spec, or `DEFAULTS` when no preset is named. So
`--config.policies.preset=specmd_1 --config.policies.eviction=least_stale` runs specmd_1 with
Least-Stale eviction (SpecMD's drop-in experiment). `resolve` gives the four specs that run;
`report` what results.json records (`cache.policies`).

`specmd_3` runs the precision cascade over the pools of `cache.precision` and every lower
precision (`fetch_priority`'s default levels; SpecMD's int8:int4:int2 when `cache.precision`
is not given; SpecMD's Table 2 runs it at 4 bits: `--config.cache.precision=int4`, int4:int2).
"""

from __future__ import annotations

import logging

from moejax.errors import ConfigError

log = logging.getLogger(__name__)

FIELDS = ("eviction", "prefetch", "miss", "routing")

# With no preset, a field not given runs this: SpecMD's recommended combination (Table 2, #5).
DEFAULTS: dict[str, str] = dict(eviction="least_stale", prefetch="score_percentile(p=80)",
                                miss="fetch", routing="standard")

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

# Presets that are named but cannot run yet, and why (none at present).
UNAVAILABLE: dict[str, str] = {}


def _given(policies, field: str) -> str:
    """`policies.FIELD` as given ("" when not), `policies` a config group or a `PolicySpec`."""
    value = getattr(policies, field, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError(f"policies.{field}={value!r} must be a policy spec string")
    return value if value.strip() else ""


def _preset(policies) -> str:
    name = _given(policies, "preset")
    if not name:
        return ""
    if name in UNAVAILABLE:
        raise ConfigError(f"policies.preset={name!r}: {UNAVAILABLE[name]}")
    if name not in PRESETS:
        raise ConfigError(f"policies.preset={name!r} is not one of {sorted(PRESETS)}")
    return name


def sources(policies) -> dict[str, str]:
    """Where each of the four specs comes from: "explicit" (the field was given), "preset"
    (left "" with a preset named) or "default" (left "" without one)."""
    preset = _preset(policies)
    return {f: "explicit" if _given(policies, f) else ("preset" if preset else "default")
            for f in FIELDS}


def resolve(policies) -> dict[str, str]:
    """The four policy specs that run for a `policies` config group: each given field as
    given, each field left "" from the preset (or DEFAULTS when no preset is named)."""
    preset = _preset(policies)
    fallback = PRESETS[preset] if preset else DEFAULTS
    return {f: _given(policies, f) or fallback[f] for f in FIELDS}


def report(policies) -> dict:
    """What results files record (`cache.policies`): the four specs that ran, the preset's
    name ("" if none), and `source`: for each of the four, "explicit", "preset" or "default"."""
    return {**resolve(policies), "preset": _preset(policies), "source": sources(policies)}


def report_for_trace(policies, has_scores: bool, trace: str, warn: bool = True) -> dict:
    """`report` for a run that follows the trace named `trace` (a replay, or a live run driven
    by it: both run the same policies), with one adjustment: a trace without speculative
    scores cannot drive a score-based prefetcher, so when the prefetch policy was not chosen
    (the default combination's `score_percentile`) it becomes `none` and the report says why
    (`warn`: a warning too). A prefetcher given explicitly, or by a preset, still refuses such
    a trace by name."""
    from moejax.policies.registry import policy_class

    chosen = report(policies)
    if (not has_scores and chosen["source"]["prefetch"] == "default"
            and policy_class("prefetch", chosen["prefetch"]).needs_spec):
        if warn:
            log.warning("%s carries no speculative scores: the default prefetch %s cannot run "
                        "on it, so none runs (choose one with --config.policies.prefetch)",
                        trace, chosen["prefetch"])
        chosen["prefetch"] = "none"
        chosen["source"] = {**chosen["source"], "prefetch": "default (trace has no scores)"}
    return chosen
