"""SpecMD's claim rules: which cells each claim reads and how its verdict is reached, on the
paper's numbers (studies/specmd/paper.py). `rows(g, cap)` gives every claim's rows of one
trace group under one condition (`claim_rows.Group`), at a capacity; the claims tool
(`moejax.analysis.claims`) judges them across traces.

Structural results (`structural_rule`, `STRUCTURAL`): a comparison that is equal by
construction under the row's condition — Least-Stale's §4 order and LRU without prefetch when
the cache holds less than one pass (slots < layers × top-k: both evict in access order) — or a
number zero by construction, is labelled "structural" with the rule, never a finding.
Hit rates are ready + late: SpecMD counts an expert whose transfer was issued as a hit.
"""

from __future__ import annotations

import collections
from typing import Iterable

from moejax.analysis import verdicts as V
from moejax.analysis.claim_cells import (
    LS_DEFAULT_ORDER,
    at_capacity,
    norm,
    same_capacity,
    select,
)
from moejax.analysis.claim_rows import (
    NOT_IN_SWEEP,
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
from moejax.analysis.claims import (
    COMPARED,
    HIT_FIELDS,
    Structural,
    policy_checks,
    rate_check,
    speed_text,
)
from moejax.analysis.sweep_cells import dropin_pairs, mean, ttft_change_pct
from studies.specmd.paper import (
    DROPIN_PAPER,
    FLD_BAND,
    HIT_BAND,
    HIT_MODEL,
    LS_BAND,
    MISS_STATED,
    PRESET_SOURCE,
    PRIORITY_BAND,
    RATIO_BANDS,
    SB_CLAIM_ID,
    STATED,
)

NO_SCORES = "not testable (the traces record expert ids only: no gate scores)"
SP80 = "score_percentile(p=80)"
TOPK = ("topk(overfetch=1.0)", "topk(overfetch=1.5)")
# Least-Stale's readings, the default first (`moejax/policies/eviction.py`, LeastStale).
LS_ORDERS = ("least_stale(order=two_queue)", "least_stale(order=left_first)",
             "least_stale(order=cyclic)")
MISSES = ("fetch", "drop(keep=2)", "substitute(tol=0.05)", "fetch_priority", "fetch_lowest_bit")


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


# -- the claims ------------------------------------------------------------------------------
def group_prefetch(rows: list[dict]) -> str:
    """The paper's prefetch for a group: score_percentile(p=80) on scored traces, temporal on
    ids-only ones (captures), else none."""
    present = {norm(r["prefetch"]) for r in rows}
    for p in (SP80, "temporal"):
        if norm(p) in present:
            return p
    return "none"


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
                                  STATED[1], with_prefetch(p), eviction=ls,
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


def _hit_verdict(m: dict, model: str | None) -> V.Verdict:
    if model != HIT_MODEL:
        return V.Verdict(f"{V.NOT_TESTABLE} (the paper's number is {HIT_MODEL}'s)", None,
                         STATED["3 other model"])
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
                      STATED[4], "the preset's prefetch")
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
                                     STATED[5]))]
    raw = by_trace({**configs, "none": select(here, ls, "none")},
                   (*HIT_FIELDS, "stall_s", "prediction_precision", "prediction_recall",
                    "requests", "decode_tok_per_s"))
    mixtral = " (Mixtral: top-k competitive)" if g.model == "Mixtral" else ""
    papers = {SP80: STATED["5 sp"] + mixtral, TOPK[0]: STATED["5 topk1.0"], TOPK[1]: "–"}
    return [fill(g.finding(5, cap, f"{ls_short(ls)}: hit rate · stall · prediction precision",
                           papers[p], with_prefetch(p), eviction=ls,
                           headline="hit_rate" if p == SP80 else ""),
                 g, raw, (p,), _describe5(p, labels, g.model)) for p in labels]


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
                      STATED[6], with_prefetch(p),
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
    paper = STATED[7]
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
    papers = MISS_STATED
    return [fill(g.finding(8, cap, f"miss {mp} ({ls_short(ls)}): stall · hit · dropped · "
                                   "substituted · H2D · decode tok/s", papers[mp],
                           with_prefetch(SP80), eviction=ls, headline="tok_s_change_pct"),
                 g, raw, (mp,), _describe8(mp)) for mp in MISSES]


def rows(g: Group, cap: tuple) -> list[Finding]:
    """Every claim's rows of group `g` (one trace group under one condition) at `cap`: claims
    1–8 in order, claims 1, 2, 6 and 7 with the group's prefetch (`group_prefetch`) and
    without."""
    pf = group_prefetch(g.rows)
    return [*_claim1_2(g, cap, pf), *_claim3(g, cap), *_claim4(g, cap), *_claim5(g, cap),
            *_claim6(g, cap, pf), *_claim7(g, cap, pf), *_claim8(g, cap)]
