"""SpecMD's claims (and Fiddler's) judged trace by trace, each on every metric its source
states, under conditions named in full.

    python -m moejax.analysis.claims --sweep_dir=D [--sweep_dir=D2 ...] [--capacity=0.05]
        [--queue=all|immediate|watchdog|...] [--h2d_gbps=5] [--format=markdown|csv]
        [--json=PATH]
    python -m moejax.analysis.claims --traces=GLOB [GLOB ...] --workdir=W [...]

A claim is its whole statement (`CLAIMS`: a stable id, what the source states, which metrics):
each trace's verdict is the conjunction of every stated metric (`verdicts.judge`), "refuted on
hit rate" naming the metric that fails. The words are defined once (moejax/analysis/
verdicts.py; docs/DESIGN.md, "Claims and their verdicts"), a group's word needs every trace
("mixed" otherwise, never headed by one side).

Cells come from `claim_cells.load`: traces grouped by their own metadata (model, layers,
experts, top-k), and cells of different conditions (queue, capacity, precision, bandwidth,
hardware, request cut, any other differing field) never averaged: each condition is its own
set of rows. Rates are of requests; hit rates are ready + late (SpecMD counts an expert whose
transfer was issued as a hit), always shown apart.

Structural results (`structural_rule`, `STRUCTURAL`): a comparison that is equal by
construction under the row's condition — Least-Stale's §4 order and LRU without prefetch when
the cache holds less than one pass (slots < layers × top-k: both evict in access order) — or a
number zero by construction, is labelled "structural" with the rule, never a finding.

`--traces` runs the claims' cells (`claims_run.cells_for`) on any importable traces without a
grid config, into `--workdir`. Every run writes `claims.json` (`claims_output.records`: one
record per claim × trace × condition; a sweep that ran latency_aware adds Fiddler's,
`host_compute.fiddler_records`) and prints its path.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import shlex
import sys
from typing import Callable, Iterable

from moejax import cli
from moejax.analysis import claims_output, claims_run, host_compute
from moejax.analysis import verdicts as V
from moejax.analysis.claim_cells import (
    LS_DEFAULT_ORDER,
    at_capacity,
    capacity_text,
    conditions,
    load,
    norm,
    parse_capacity,
    queue_order,
    same_capacity,
    select,
)
from moejax.analysis.claim_rows import (
    NOT_IN_SWEEP,
    SB_CLAIM_ID,
    WITHOUT_PREFETCH,
    Describe,
    Finding,
    Group,
    by_trace,
    fill,
    hits,
    pct,
    ratio,
    ratio_text,
    seconds,
    signed_pct,
    with_prefetch,
)
from moejax.analysis.sweep_cells import (
    dropin_pairs,
    load_cells,
    mean,
    open_sweep,
    ttft_change_pct,
)
from moejax.cli import UsageError, guarded

NO_SCORES = "not testable (the traces record expert ids only: no gate scores)"
SP80 = "score_percentile(p=80)"
TOPK = ("topk(overfetch=1.0)", "topk(overfetch=1.5)")
# Least-Stale's readings, the default first (`moejax/policies/eviction.py`, LeastStale).
LS_ORDERS = ("least_stale(order=two_queue)", "least_stale(order=left_first)",
             "least_stale(order=cyclic)")
MISSES = ("fetch", "drop(keep=2)", "substitute(tol=0.05)", "fetch_priority", "fetch_lowest_bit")
# SpecMD's drop-in table: TTFT change (drop-in - original) / original, percent.
DROPIN_PAPER = {
    "OLMoE": {"specmd_1": -10.7, "specmd_2": -34.7, "specmd_3": -17.7, "specmd_4": -13.8},
    "Mixtral": {"specmd_1": -17.8, "specmd_2": -9.8, "specmd_3": -25.7, "specmd_4": -17.5},
    "Phi": {"specmd_1": -14.8, "specmd_2": 4.3, "specmd_3": -44.1, "specmd_4": -24.6},
    "Qwen": {"specmd_1": -7.8, "specmd_2": -4.3, "specmd_3": -18.4, "specmd_4": -23.0},
}
PRESET_SOURCE = {"specmd_1": "Eliseev '23", "specmd_2": "Zhu et al. '25",
                 "specmd_3": "HOBBIT '24", "specmd_4": "MixtureCache '25"}


@dataclasses.dataclass(frozen=True)
class Structural:
    """A value that is zero by construction under a condition, and why."""

    claim: int
    key: str  # of `Finding.values` and each `TraceResult.values`
    label: str  # what the table calls it
    applies: Callable[[Finding], bool]
    reason: str


def _left_first_without_prefetch(f: Finding) -> bool:
    return f.eviction == "least_stale(order=left_first)" and f.prefetch == WITHOUT_PREFETCH


_LEFT_FIRST = ("left_first evicts an expert of a layer still to run only when every expert of "
               "the layers already run is pinned, and without prefetch none of them is; zero "
               "on every trace means no wave pinned the whole left side (decode-only traces "
               "never do)")
STRUCTURAL = (
    Structural(7, "evicted_before_use", "early evictions",
               lambda f: f.prefetch == WITHOUT_PREFETCH,
               "nothing is prefetched, so no prefetched expert is evicted before its use"),
    Structural(7, "collision_miss_rate", "collision misses", _left_first_without_prefetch,
               _LEFT_FIRST),
    Structural(1, "least_stale", "LS collision misses", _left_first_without_prefetch,
               _LEFT_FIRST),
    Structural(2, "least_stale", "LS collision misses", _left_first_without_prefetch,
               _LEFT_FIRST),
    Structural(4, "cold_pct", "cold ΔTTFT", lambda f: True,
               "a first request's prefill finds an empty cache whatever the eviction"),
)


def structural_rule(eviction: str, prefetch: str, slots: int | None,
                    pass_experts: int | None) -> str | None:
    """Why Least-Stale `eviction` and LRU make the same choices by construction, or None.

    §4's order (two_queue) without prefetch, when the cache holds fewer slots than the fewest
    distinct experts a pass requests (layers × top-k): each pass then evicts every expert not
    used in it before it ends, so the residents are from the running pass or the one before,
    the stale queue is the last pass's experts in layer order and the current queue this
    pass's in layer order — LRU's order (tests/test_claims_structural.py checks it on random
    traces)."""
    if (norm(eviction) != norm(f"least_stale(order={LS_DEFAULT_ORDER})")
            or norm(prefetch) != "none" or slots is None or not pass_experts
            or slots >= pass_experts):
        return None
    return (f"capacity below one pass: {slots} slots < {pass_experts} experts a pass requests "
            "(layers × top-k); without prefetch Least-Stale's stale-then-current queues and "
            "LRU evict in the same order")


HIT_FIELDS = ("hit_rate", "ready_hit_rate", "late_hit_rate")
# What every comparison of policies reads: collisions, hits and speed.
COMPARED = ("collision_miss_rate", *HIT_FIELDS, "requests", "ttft_s", "warm_ttft_s",
            "decode_s", "decode_tok_per_s", "stall_s")


def speed_checks(claimed: dict, base: dict) -> list[V.Check]:
    """The speed a policy comparison states: the warm TTFT (requests after the first) where
    the cells have one; else the decode time per token — a first request's TTFT is a cold
    prefill, which finds an empty cache whatever the eviction (`STRUCTURAL`), so it cannot
    tell two evictions apart."""
    if claimed.get("warm_ttft_s") is not None and base.get("warm_ttft_s") is not None:
        return [V.Check("warm TTFT", claimed["warm_ttft_s"], base["warm_ttft_s"], True)]
    return [V.Check("decode time", _per_token(claimed), _per_token(base), True)]


def _per_token(m: dict):
    s = m.get("decode_tok_per_s")
    return 1.0 / s if s else None


def rate_check(metric: str, key: str, claimed: dict, base: dict, lower: bool,
               must_improve: bool = True) -> V.Check:
    a, b = claimed.get(key), base.get(key)
    n = claimed.get("requests")
    noise = max(V.rate_noise(a, n), V.rate_noise(b, base.get("requests")))
    return V.Check(metric, a, b, lower, noise, must_improve)


def policy_checks(claimed: dict, base: dict) -> list[V.Check]:
    """Collisions, hit rate and speed of `claimed` against `base` (claims 1, 2, 6)."""
    return [rate_check("collisions", "collision_miss_rate", claimed, base, True),
            rate_check("hit rate", "hit_rate", claimed, base, False),
            *speed_checks(claimed, base)]


def speed_text(m: dict) -> str:
    if m.get("warm_ttft_s") is not None:
        return f"warm TTFT {m['warm_ttft_s'] * 1e3:.4g} ms"
    s = m.get("decode_tok_per_s")
    return "decode –" if not s else f"decode {1e3 / s:.4g} ms/token"


def label_structural(f: Finding) -> None:
    """Marks each of `f`'s values that `STRUCTURAL` explains and that is exactly zero on every
    trace with numbers."""
    for s in STRUCTURAL:
        if (s.claim == f.claim and f.per_trace and s.applies(f)
                and all(r.values.get(s.key) == 0 for r in f.per_trace.values())):
            f.structural[s.key] = f"{s.label} 0 on every trace ({s.reason})"


def conclude(f: Finding, g: Group) -> None:
    """`f`'s word across its traces (`verdicts.across`), or "structural" where its headline
    number is zero by construction on every trace."""
    label_structural(f)
    if f.headline in f.structural:
        f.suggestion = f"{V.STRUCTURAL}: {f.structural[f.headline]}"
        for r in f.per_trace.values():
            r.verdict = V.Verdict(V.STRUCTURAL, None, f.structural[f.headline])
        return
    ruled = {t: r.suggestion for t, r in f.per_trace.items() if r.verdict is not None}
    if not ruled:
        return
    word = V.across(ruled, f.missing)
    if g.synthetic and word:
        word += " (synthetic traces: random weights)"
    f.suggestion = word


# -- the claims ------------------------------------------------------------------------------
def group_prefetch(rows: list[dict]) -> str:
    """The paper's prefetch for a group: score_percentile(p=80) on scored traces, temporal on
    ids-only ones (captures), else none."""
    present = {norm(r["prefetch"]) for r in rows}
    for p in (SP80, "temporal"):
        if norm(p) in present:
            return p
    return "none"


def _has_scores(rows: list[dict]) -> bool:
    return any(r.get("has_scores") is not False for r in rows) if rows else True


def ls_reading(here: list[dict], wanted: Iterable[dict]) -> str:
    """The Least-Stale reading a claim reads: the one with the most of the claim's
    configurations (`wanted`: `select`'s arguments but the eviction) among `here`, the default
    on a tie. (A sweep from before the default changed has its miss-policy cells in left_first
    only.)"""
    wanted = list(wanted)
    return max(LS_ORDERS, key=lambda e: (sum(bool(select(here, e, **w)) for w in wanted),
                                         -LS_ORDERS.index(e)))


def ls_short(spec: str) -> str:
    """`least_stale(order=two_queue)` -> `LS order=two_queue`."""
    return "LS " + norm(spec)[len("least_stale("):-1] if "(" in spec else "LS"


def _no_scores(f: Finding) -> Finding:
    f.shown, f.suggestion = NO_SCORES, NO_SCORES
    return f


def _same_choices(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("collision_miss_rate", "hit_rate"))


def _structural_or(ls: str, prefetch: str, r: dict, base: str, cond: dict) -> str | None:
    """The structural rule where it applies and the numbers agree with it."""
    rule = structural_rule(ls, prefetch, cond.get("slots"), cond.get("pass_experts"))
    return rule if rule and base == "lru" and _same_choices(r[ls], r["lru"]) else None


LS_BAND = V.Band("LS collisions", 0.016, 0.019, True, "LS 1.6–1.9% (5%)")


def _describe1(ls: str, prefetch: str, at_5pct: bool) -> Describe:
    def describe(r, cond):
        c = {k: r[label]["collision_miss_rate"] if label in r else None
             for k, label in (("least_stale", ls), ("lru", "lru"), ("score", "score"))}
        shown = " · ".join(f"{short} {pct(c[k], 2)}" for k, short in
                           (("least_stale", "LS"), ("lru", "LRU"), ("score", "SB"))
                           if c[k] is not None)
        m, base = r[ls], r["lru"]
        shown += (f" · hit LS {hits(m)} vs LRU {hits(base)} · LS {speed_text(m)} vs LRU "
                  f"{speed_text(base)}")
        checks = policy_checks(m, base)
        if "score" in r:
            checks.insert(1, rate_check("collisions vs SB", "collision_miss_rate", m,
                                        r["score"], True))
        values = {**c, "hit_rate": m["hit_rate"], "lru_hit_rate": base["hit_rate"],
                  "ready_hit_rate": m["ready_hit_rate"], "warm_ttft_s": m["warm_ttft_s"],
                  "lru_warm_ttft_s": base["warm_ttft_s"],
                  "decode_tok_per_s": m["decode_tok_per_s"],
                  "lru_decode_tok_per_s": base["decode_tok_per_s"]}
        verdict = V.judge(checks, LS_BAND if at_5pct else None,
                          c["least_stale"] if at_5pct else None,
                          structural=_structural_or(ls, prefetch, r, "lru", cond))
        return values, shown, verdict
    return describe


# The paper's factor bands: (claim 2 rule, LRU or SB) -> Band.
RATIO_BANDS = {
    "2": V.Band("LRU ÷ LS collisions", 2.6, 8.6, False, "2.6–8.6× (5%)"),
    "2 at 1%": V.Band("LRU ÷ LS collisions", 1.0, 85.0, False,
                      "up to 85× (1%; the paper gives only the maximum)"),
    "2 vs SB": V.Band("SB ÷ LS collisions", 58.0, 91.0, False, "58–91× (5%)"),
}


def _describe2(ls: str, other: str, rule: str, prefetch: str) -> Describe:
    name = "SB" if other == "score" else "LRU"

    def describe(r, cond):
        o, s = r[other]["collision_miss_rate"], r[ls]["collision_miss_rate"]
        v = {other: o, "least_stale": s, "ratio": ratio(o, s),
             "hit_rate": r[ls]["hit_rate"], f"{other}_hit_rate": r[other]["hit_rate"]}
        shown = (f"{ratio_text(v['ratio'], o, s)} ({name} {pct(o, 2)} / LS {pct(s, 2)}) · "
                 f"hit LS {hits(r[ls])} vs {name} {hits(r[other])} · LS {speed_text(r[ls])} "
                 f"vs {name} {speed_text(r[other])}")
        verdict = V.judge(policy_checks(r[ls], r[other]), RATIO_BANDS[rule], v["ratio"],
                          numeric=True,
                          structural=_structural_or(ls, prefetch, r, other, cond))
        return v, shown, verdict
    return describe


def _claim1_2(g: Group, cap: tuple, pf: str) -> list[Finding]:
    one = (0, 0.01)
    plan = [(cap, ("1", "2 at 1%" if same_capacity(cap, one) else "2", "2 vs SB"))]
    if not same_capacity(cap, one):
        plan.append((one, ("2 at 1%",)))
    out = []
    for p in dict.fromkeys((pf, "none")):  # the verdict can flip without prefetch
        for claim_cap, rules in plan:
            here = at_capacity(g.rows, claim_cap)
            ls = ls_reading(here, [{"prefetch": p}])
            raw = by_trace({k: select(here, k, p) for k in (ls, "lru", "score")}, COMPARED)
            at_5pct = same_capacity(claim_cap, (0, 0.05))
            for rule in rules:
                if rule == "1":
                    f = g.finding(1, claim_cap, f"{ls_short(ls)} vs LRU · SB: collision-miss "
                                                "rate · hit rate · warm TTFT (or decode time)",
                                  "LS 1.6–1.9% · LRU 4.5–12.6% · SB 42.6–60.9% (5%); hit "
                                  "rate and TTFT improve", with_prefetch(p), eviction=ls,
                                  headline="least_stale")
                    out.append(fill(f, g, raw, (ls, "lru"), _describe1(ls, p, at_5pct)))
                    continue
                other = "score" if rule == "2 vs SB" else "lru"
                f = g.finding(2, claim_cap, f"{'SB' if other == 'score' else 'LRU'} ÷ "
                                            f"{ls_short(ls)} collision-miss rate · hit rate · "
                                            "warm TTFT (or decode time)",
                              RATIO_BANDS[rule].text, with_prefetch(p), eviction=ls,
                              headline="least_stale",
                              claim_id=SB_CLAIM_ID if other == "score" else "")
                out.append(_no_scores(f) if other == "score" and not g.has_scores
                           else fill(f, g, raw, (ls, other),
                                     _describe2(ls, other, rule, p)))
    return out


HIT_BAND = V.Band("hit rate", 0.88, 0.92, False, "88–92% (OLMoE, 5%)")


def _hit_verdict(m: dict, model: str | None) -> V.Verdict:
    if model != "OLMoE":
        return V.Verdict(f"{V.NOT_TESTABLE} (the paper's number is OLMoE's)", None,
                         "the paper states 88–92% for OLMoE")
    return V.judge([], HIT_BAND, m.get("hit_rate"), numeric=True)


def _describe_best(model: str | None) -> Describe:
    def describe(r, cond):
        best = max(r, key=lambda p: r[p]["hit_rate"] or 0.0)
        return ({**r[best], "prefetch": best}, f"{hits(r[best])} ({best})",
                _hit_verdict(r[best], model))
    return describe


def _describe_hits(p: str) -> Describe:
    return lambda r, cond: (dict(r[p]), hits(r[p]), None)


def _claim3(g: Group, cap: tuple) -> list[Finding]:
    here = at_capacity(g.rows, cap)
    ls = ls_reading(here, [{"prefetch": None}])
    cells = select(here, ls, None)
    prefetches = sorted({r["prefetch"] for r in cells})
    raw = by_trace({p: select(cells, ls, p) for p in prefetches}, (*HIT_FIELDS, "requests"))
    # The replay-only oracles know the future: not what a deployed predictor can reach.
    ordinary = {t: {p: v for p, v in r.items() if "oracle" not in norm(p)}
                for t, r in raw.items()}
    f = g.finding(3, cap, f"{ls_short(ls)} hit rate (ready + late)", HIT_BAND.text,
                  "the best prefetch on each trace but the oracles", eviction=ls,
                  headline="hit_rate")
    out = [fill(f, g, ordinary, (), _describe_best(g.model))]
    # A predictor of a chosen precision (between the two), then the ceiling.
    oracles = [p for p in prefetches if norm(p).startswith("noisy_oracle")] + ["oracle"]
    for p in oracles:
        f = g.finding(3, cap, f"{ls_short(ls)} hit rate"
                              + (" (the ceiling)" if p == "oracle" else ""), "–",
                      with_prefetch(p), eviction=ls)
        label = next((q for q in prefetches if norm(q) == norm(p)), p)
        out.append(fill(f, g, raw, (label,), _describe_hits(label)))
    return out


def _pair_changes(pairs: list) -> dict:
    """The changes, percent, of a trace's drop-in pair (one per trace and condition)."""
    def change(key):
        return mean(ttft_change_pct(p.base[key], p.dropin[key]) for p in pairs)
    # Not the paper's measure, shown beside it: the decode speed's change.
    return {"cold_pct": change("cold_ttft"), "warm_pct": change("warm_ttft_s"),
            "decode_tok_s_pct": change("decode_tok_per_s"), "pairs": len(pairs)}


def _describe4(paper: float | None) -> Describe:
    band = V.point("warm ΔTTFT", paper, True, f"{paper:+.1f}%") if paper is not None else None

    def describe(r, cond):
        v = {**r["drop-in pair"], "paper_pct": paper}
        shown = (f"cold {signed_pct(v['cold_pct'])}"
                 + (f" · warm {signed_pct(v['warm_pct'])}" if v["warm_pct"] is not None else "")
                 + (f" · decode tok/s {signed_pct(v['decode_tok_s_pct'])}"
                    if v["decode_tok_s_pct"] is not None else ""))
        if v["warm_pct"] is None:
            verdict = V.Verdict(f"{V.NOT_TESTABLE} (one request per trace: a cold prefill)",
                                "warm TTFT", "a cold prefill finds an empty cache whatever "
                                "the eviction")
        elif band is None:
            verdict = V.Verdict(f"{V.NOT_TESTABLE} (no paper number for this preset)", None,
                                "the paper's drop-in table has no such preset")
        else:
            # The change against no change: a fall is the stated way where the paper states
            # one (Phi's specmd_2 is +4.3%: there the band alone).
            checks = [V.Check("TTFT", v["warm_pct"], 0.0, True)] if paper < 0 else []
            verdict = V.judge(checks, band, v["warm_pct"], numeric=True)
        return v, shown, verdict
    return describe


def _claim4(g: Group, cap: tuple) -> list[Finding]:
    by = collections.defaultdict(list)
    for p in dropin_pairs(at_capacity(g.rows, cap)):
        by[(p.preset, p.label, p.other_label, p.dropin["eviction"])].append(p)
    if not by:
        f = g.finding(4, cap, "ΔTTFT, preset → preset + Least-Stale eviction",
                      "−10.7% to −34.7% (OLMoE, 5%)", "the preset's prefetch")
        if not g.has_scores:  # the presets' prefetchers and routing read gate scores
            return [_no_scores(f)]
        f.shown, f.suggestion = f"{NOT_IN_SWEEP} (no drop-in pairs)", NOT_IN_SWEEP
        return [f]
    paper_model = g.model if g.model in DROPIN_PAPER else "OLMoE"
    out = []
    for (preset, label, other, eviction), ps in sorted(by.items()):
        paper = DROPIN_PAPER[paper_model].get(preset)
        source = PRESET_SOURCE.get(preset, "")
        per = collections.defaultdict(list)
        for p in ps:
            per[p.base["trace"]].append(p)
        f = g.finding(4, cap, f"ΔTTFT {preset}{f' ({source})' if source else ''} → {label}"
                              + (f" [{other}]" if other else ""),
                      f"{signed_pct(paper)} ±25% ({paper_model}, 5%)" if paper is not None
                      else "–", "the preset's prefetch", eviction=eviction,
                      headline="warm_pct")
        raw = {t: {"drop-in pair": _pair_changes(tps)} for t, tps in per.items()}
        out.append(fill(f, g, raw, ("drop-in pair",), _describe4(paper)))
    return out


def _checks5(v: dict, model: str | None) -> list[V.Check]:
    """Score-percentile against each top-k: hit rate higher, stall lower, precision lower
    (the paper: "despite lower precision metrics")."""
    out = []
    for k in ("topk1.0", "topk1.5"):
        if v.get(f"{k}_hit") is None:
            continue
        tag = f" vs {k.replace('topk', 'top-k ')}"
        out += [V.Check("hit rate" + tag, v["sp_hit"], v[f"{k}_hit"], False),
                V.Check("stall" + tag, v["sp_stall"], v[f"{k}_stall"], True)]
        if k == "topk1.0":
            out.append(V.Check("prediction precision" + tag, v.get("sp_precision"),
                               v.get(f"{k}_precision"), True))
    return out


def score_prefetch_verdict(v: dict, model: str | None) -> V.Verdict:
    checks = _checks5(v, model)
    if not checks:
        return V.Verdict(f"{V.NOT_TESTABLE} (no top-k cell)", None, "no top-k cell")
    verdict = V.judge(checks)
    if model != "Mixtral":
        return verdict
    # The paper's exception: on Mixtral top-k is competitive, so score-percentile winning on
    # both hit rate and stall against every top-k refutes it.
    wins = all(c.outcome == "better" for c in checks if not c.metric.startswith("prediction"))
    return (V.Verdict(f"{V.REFUTED} on hit rate and stall (top-k not competitive)", "hit rate",
                      verdict.rule) if wins
            else V.Verdict(f"{V.REPRODUCED} (top-k competitive)", None, verdict.rule))


def _describe5(p: str, labels: dict[str, str], model: str | None) -> Describe:
    def describe(r, cond):
        m = r[p]
        shown = (f"{hits(m)} · stall {seconds(m['stall_s'])} · precision "
                 f"{pct(m['prediction_precision'])}")
        if p != SP80:
            return dict(m), shown, None
        v = {"sp_hit": m["hit_rate"], "sp_stall": m["stall_s"],
             "sp_precision": m["prediction_precision"]}
        for q, k in labels.items():
            if q in r and q != SP80:
                v.update({f"{k}_hit": r[q]["hit_rate"], f"{k}_stall": r[q]["stall_s"],
                          f"{k}_precision": r[q]["prediction_precision"]})
        note = _slower_than_none(r, labels)
        return ({**m, **v, **({"notes": [note]} if note else {})}, shown,
                score_prefetch_verdict(v, model))
    return describe


def _slower_than_none(r: dict, labels: dict[str, str]) -> str | None:
    """Hit rates that buy nothing: where every prefetcher decodes slower than no prefetch
    (Mixtral at 1–5%: every hit late), the claim's "top-k competitive" hides it."""
    none = (r.get("none") or {}).get("decode_tok_per_s")
    speeds = [r[q]["decode_tok_per_s"] for q in labels if q in r]
    if not none or not speeds or None in speeds or max(speeds) >= none:
        return None
    return (f"every prefetcher decodes slower than none ({max(speeds):.4g} vs {none:.4g} "
            "tok/s)")


def _claim5(g: Group, cap: tuple) -> list[Finding]:
    here = at_capacity(g.rows, cap)
    labels = {SP80: "sp", TOPK[0]: "topk1.0", TOPK[1]: "topk1.5"}
    ls = ls_reading(here, [{"prefetch": p} for p in labels])
    configs = {p: select(here, ls, p) for p in labels}
    if not g.has_scores and not configs[SP80]:
        return [_no_scores(g.finding(5, cap, "score-percentile vs top-k prefetch",
                                     "score-percentile: higher hit rate, lower stall"))]
    raw = by_trace({**configs, "none": select(here, ls, "none")},
                   (*HIT_FIELDS, "stall_s", "prediction_precision", "prediction_recall",
                    "requests", "decode_tok_per_s"))
    mixtral = " (Mixtral: top-k competitive)" if g.model == "Mixtral" else ""
    papers = {SP80: "higher hit rate, lower stall than top-k; lower precision" + mixtral,
              TOPK[0]: "highest prediction precision and recall", TOPK[1]: "–"}
    return [fill(g.finding(5, cap, f"{ls_short(ls)}: hit rate · stall · prediction precision",
                           papers[p], with_prefetch(p), eviction=ls,
                           headline="hit_rate" if p == SP80 else ""),
                 g, raw, (p,), _describe5(p, labels, g.model)) for p in labels]


FLD_BAND = V.Band("FLD's collision reduction", 0.0, 0.5, False,
                  "slightly better: a reduction of LRU's collisions in (0, 50%]")


def _describe6(r: dict, cond: dict) -> tuple[dict, str, V.Verdict]:
    fld, lru = r["fld"], r["lru"]
    v = {"fld_collision": fld["collision_miss_rate"], "lru_collision": lru["collision_miss_rate"],
         "fld_hit": fld["hit_rate"], "lru_hit": lru["hit_rate"]}
    v["reduction"] = (1 - v["fld_collision"] / v["lru_collision"]
                      if v["lru_collision"] else None)
    shown = (f"collisions FLD {pct(v['fld_collision'], 2)} vs LRU {pct(v['lru_collision'], 2)}"
             f" · hit FLD {hits(fld)} vs LRU {hits(lru)}")
    checks = [rate_check("collisions", "collision_miss_rate", fld, lru, True),
              rate_check("hit rate", "hit_rate", fld, lru, False, must_improve=False)]
    if v["lru_collision"] == 0 and v["fld_collision"] == 0:
        return v, shown, V.Verdict(f"{V.NOT_TESTABLE} (neither has collision misses)",
                                   "collisions", "LRU and FLD have no collision misses")
    return v, shown, V.judge(checks, FLD_BAND, v["reduction"], numeric=True)


def _claim6(g: Group, cap: tuple, pf: str) -> list[Finding]:
    here = at_capacity(g.rows, cap)
    out = []
    for p in dict.fromkeys((pf, "none")):
        raw = by_trace({e: select(here, e, p) for e in ("fld", "lru")}, COMPARED)
        f = g.finding(6, cap, "FLD vs LRU: collision-miss rate · hit rate",
                      "slightly better than LRU (no number)", with_prefetch(p),
                      eviction="fld", headline="fld_collision")
        out.append(fill(f, g, raw, ("fld", "lru"), _describe6))
    return out


def _describe7(order: str) -> Describe:
    def describe(r, cond):
        m = r[order]
        early = "–" if m["evicted_before_use"] is None else f"{m['evicted_before_use']:.4g}"
        return dict(m), (f"collisions {pct(m['collision_miss_rate'], 2)} · hit {hits(m)} · "
                         f"early evictions {early}"), None
    return describe


def _fewest(r: dict, cond: dict) -> tuple[dict, str, V.Verdict | None]:
    """The order(s) with the fewest collision misses among those present."""
    rates = {norm(e)[len("least_stale(order="):-1]: m["collision_miss_rate"]
             for e, m in r.items() if m["collision_miss_rate"] is not None}
    shown = " · ".join(f"{o} {pct(x, 2)}" for o, x in rates.items())
    low = min(rates.values(), default=None)
    best = " = ".join(o for o, x in rates.items() if x == low)
    return {"fewest": best, **rates}, shown, (
        V.Verdict(best, None, "the order with the fewest collision misses")
        if len(rates) > 1 else None)


def _claim7(g: Group, cap: tuple, pf: str) -> list[Finding]:
    here = at_capacity(g.rows, cap)
    paper = "§4: stale queue first, FIFO by layer (no order ablation)"
    out = []
    for p in dict.fromkeys((pf, "none")):
        raw = by_trace({e: select(here, e, p) for e in LS_ORDERS},
                       ("collision_miss_rate", "evicted_before_use", *HIT_FIELDS))
        for e in LS_ORDERS:
            default = " (the default)" if e == LS_ORDERS[0] else ""
            f = g.finding(7, cap, f"{ls_short(e)}{default}: collisions · hit · early evictions",
                          paper, with_prefetch(p), eviction=e, headline="collision_miss_rate")
            out.append(fill(f, g, raw, (e,), _describe7(e)))
        f = g.finding(7, cap, "the order with the fewest collision misses", "–",
                      with_prefetch(p), headline="fewest")
        out.append(fill(f, g, raw, (), _fewest))
    return out


PRIORITY_BAND = V.Band("decode tok/s change vs fetch", 20.0, 30.0, False,
                       "+20–30% (OLMoE, 4-bit)")


def _verdict8(name: str, v: dict) -> V.Verdict | None:
    s = v.get("tok_s_change_pct")
    if name == "fetch" or s is None:
        return None
    speed = V.Check("decode speed vs fetch", s, 0.0, False)
    if name == "fetch_priority":
        return V.judge([speed], PRIORITY_BAND, s, numeric=True)
    if name == "drop(keep=2)":
        return (V.Verdict(V.REPRODUCED, None, "the fastest miss policy (decode tok/s)")
                if v.get("fastest") else
                V.Verdict(f"{V.REFUTED} on decode speed (not the fastest)", "decode speed",
                          "not the fastest miss policy (decode tok/s)"))
    return V.Verdict(f"{V.NOT_TESTABLE} (a quality claim)", "quality",
                     "replay measures speed only")


def _describe8(mp: str) -> Describe:
    def describe(r, cond):
        def change(m, key):
            if "fetch" not in r or m not in r:
                return None
            return ttft_change_pct(r["fetch"][key], r[m][key])

        speeds = {m: change(m, "decode_tok_per_s") for m in r}
        fastest = max((m for m in speeds if speeds[m] is not None), default=None,
                      key=lambda m: speeds[m])
        x = r[mp]
        v = {**x, "miss": mp, "tok_s_change_pct": speeds[mp],
             "ttft_change_pct": change(mp, "ttft_s"), "stall_change_pct": change(mp, "stall_s"),
             "fastest": mp == fastest}
        tok_s = "–" if x["decode_tok_per_s"] is None else f"{x['decode_tok_per_s']:.4g}"
        h2d = "–" if x["h2d_bytes"] is None else f"{x['h2d_bytes'] / 1e9:.3g} GB"
        vs = "" if mp == "fetch" or "fetch" not in r else (
            f" (tok/s {signed_pct(speeds[mp])}, TTFT {signed_pct(v['ttft_change_pct'])} vs "
            "fetch)")
        shown = (f"stall {seconds(x['stall_s'])} · hit {hits(x)} · dropped "
                 f"{pct(x['dropped_share'])} · substituted {pct(x['substituted_share'])}"
                 f" · H2D {h2d} · {tok_s} tok/s{vs}")
        return v, shown, _verdict8(mp, v)
    return describe


def _claim8(g: Group, cap: tuple) -> list[Finding]:
    here = at_capacity(g.rows, cap)
    ls = ls_reading(here, [{"prefetch": SP80, "miss": mp} for mp in MISSES])
    configs = {mp: select(here, ls, SP80, miss=mp) for mp in MISSES}
    if not g.has_scores and not any(configs.values()):
        return [_no_scores(g.finding(8, cap, "miss policies", "–"))]
    raw = by_trace(configs, (*HIT_FIELDS, "stall_s", "dropped_share", "substituted_share",
                             "h2d_bytes", "decode_tok_per_s", "ttft_s"))
    papers = {"fetch": "the baseline",
              "drop(keep=2)": "fastest; −5 to −15% quality (OLMoE)",
              "substitute(tol=0.05)": "fails on quality everywhere",
              "fetch_priority": "Pareto frontier; OLMoE 4-bit +20–30% speed, 0–5% quality loss",
              "fetch_lowest_bit": "inconsistent across models"}
    return [fill(g.finding(8, cap, f"miss {mp} ({ls_short(ls)}): stall · hit · dropped · "
                                   "substituted · H2D · decode tok/s", papers[mp],
                           with_prefetch(SP80), eviction=ls, headline="tok_s_change_pct"),
                 g, raw, (mp,), _describe8(mp)) for mp in MISSES]


def findings(rows: list[dict], capacity="0.05", queue: str = "all",
             h2d_gbps: float | None = None) -> list[Finding]:
    """Every claim's rows per trace group and condition, at `capacity` (a fraction, or
    "N slots"; claim 2 also at 1%), at `h2d_gbps` (None: every bandwidth, each apart)."""
    cap = parse_capacity(capacity) if not isinstance(capacity, tuple) else capacity
    out: list[Finding] = []
    groups = collections.defaultdict(list)
    for r in rows:
        if queue != "all" and r["queue"] != queue:
            continue
        if h2d_gbps is not None and not (r["h2d_gbps"] is not None and math.isclose(
                float(r["h2d_gbps"]), float(h2d_gbps))):
            continue
        groups[r["group"]].append(r)
    for name in sorted(groups):
        for cond, crows in conditions(groups[name]):
            # The traces run under this condition: one without a row's cells is listed as
            # missing, never dropped.
            g = Group(name, crows[0]["paper_model"], sorted({r["trace"] for r in crows}),
                      _has_scores(crows), any(r["synthetic"] for r in crows), cond, crows)
            pf = group_prefetch(crows)
            for f in (*_claim1_2(g, cap, pf), *_claim3(g, cap), *_claim4(g, cap),
                      *_claim5(g, cap), *_claim6(g, cap, pf), *_claim7(g, cap, pf),
                      *_claim8(g, cap)):
                conclude(f, g)
                out.append(f)
    return out


def fiddler(rows: list[dict], sweep_dirs: list[str]) -> list[dict]:
    """Fiddler's records (`host_compute.fiddler_records`: one per claim × baseline × trace ×
    condition) of each sweep that ran latency_aware, Fiddler's per-expert choice; its tables
    are `python -m moejax.analysis.host_compute`'s."""
    out = []
    for d in sweep_dirs:
        if any(norm(r["miss"]).startswith("latency_aware") for r in rows if r["sweep"] == d):
            out += host_compute.fiddler_records(load_cells(d), d)
    return out


# -- the command -----------------------------------------------------------------------------
PROG = "python -m moejax.analysis.claims"
DEFAULT_CAPACITY = "0.05"


def _capacity_arg(text: str) -> tuple:
    try:
        return parse_capacity(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = cli.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--sweep_dir", action="append",
                     help="a sweep directory (repeat for several)")
    src.add_argument("--traces", nargs="+", metavar="GLOB",
                     help="trace files (globs; any importable format): run the claims' "
                          "cells on them into --workdir, then judge")
    ap.add_argument("--capacity", default=None, type=_capacity_arg,
                    help="the capacity the claims are read at: a fraction (0.05), a "
                         "percentage (5%%) or N slots ('8slots'); claim 2 also at 1%% "
                         f"(default: {DEFAULT_CAPACITY})")
    ap.add_argument("--queue", default="all",
                    help="all, or one prefetch queue of the sweep (immediate, watchdog, ...)")
    ap.add_argument("--h2d_gbps", type=float, default=None,
                    help="bandwidth of the cells read (default: every bandwidth, apart)")
    ap.add_argument("--format", default="markdown", choices=("markdown", "csv"))
    ap.add_argument("--json", default=None, metavar="PATH",
                    help="where claims.json goes (default: beside the first sweep, or in "
                         "--workdir)")
    claims_run.add_arguments(ap)
    a = ap.parse_args(argv)
    return guarded(PROG, lambda: _main(a, argv))


def _main(a: argparse.Namespace, argv: list[str]) -> None:
    if a.traces:
        sweep_dirs = [claims_run.run(a)]
    else:
        claims_run.refuse_run_options(a)
        sweep_dirs = a.sweep_dir
        for d in sweep_dirs:
            open_sweep(d)  # a directory with cells/, every results.json parses
    loaded = load(sweep_dirs)
    if not loaded.rows:
        raise UsageError(f"no finished cells to read ({'; '.join(loaded.summary)})")
    queues = queue_order(r["queue"] for r in loaded.rows)
    if a.queue != "all" and a.queue not in queues:
        raise UsageError(f"--queue={a.queue} is not in the sweep; its queues: "
                         f"{', '.join(queues)}")
    # A capacity typed that no cell has is a mistake; the default (5%, SpecMD's) is read
    # whatever the sweep holds: its rows then say "not in this sweep".
    given = a.capacity is not None
    a.capacity = a.capacity or parse_capacity(DEFAULT_CAPACITY)
    if given and not at_capacity(loaded.rows, a.capacity):
        caps = sorted({tuple(r["capacity_key"]) for r in loaded.rows})
        raise UsageError(f"--capacity={capacity_text(a.capacity)}: no cell at that capacity; "
                         f"the sweep's: {', '.join(capacity_text(c) for c in caps)}")
    bws = sorted({float(r["h2d_gbps"]) for r in loaded.rows if r["h2d_gbps"] is not None})
    if a.h2d_gbps is not None and not any(math.isclose(a.h2d_gbps, b) for b in bws):
        raise UsageError(f"--h2d_gbps={a.h2d_gbps:g}: no cell at that bandwidth; the sweep's: "
                         f"{', '.join(f'{b:g}' for b in bws) or 'none recorded'} GB/s")
    found = findings(loaded.rows, a.capacity, a.queue, a.h2d_gbps)
    command = shlex.join(["python", "-m", "moejax.analysis.claims", *argv])
    path = a.json or claims_output.default_json(sweep_dirs[0])
    try:
        claims_output.write_json(found, path, command, fiddler(loaded.rows, sweep_dirs))
    except OSError as e:  # nothing was written: the temporary file is removed
        raise UsageError(f"--json={path}: cannot be written ({e.strerror})") from None
    sys.stdout.write(claims_output.to_csv(found) if a.format == "csv"
                     else claims_output.markdown(found, loaded.summary, loaded.rows, command))
    print(f"claims.json ({len(claims_output.records(found))} records) -> {path}",
          file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
