"""SpecMD's numbers and claims as data: the study's, never the library's.

SpecMD (the paper this study re-implements) states each claim below in a sentence
(docs/DESIGN.md, "Claims and their verdicts", quotes them; studies/specmd/README.md too):
`CLAIMS` holds each with its stable id, what it states and the rule its verdict follows; the
bands hold the paper's numbers (`verdicts.Band`: a range, or a point ±25%), `DROPIN_PAPER`
its drop-in table, `STATED` what each row's "source" column prints. The rules that read them
are studies/specmd/rules.py.
"""

from __future__ import annotations

from moejax.analysis import verdicts as V
from moejax.analysis.claim_rows import Claim

CLAIMS = {c.number: c for c in (
    Claim(1, "specmd.least_stale", "Least-Stale's collisions, and what they buy",
          "collisions, hit rate, warm TTFT or decode time (vs LRU; collisions vs SB too); "
          "LS's collision rate against 1.6–1.9%",
          "reproduced: LS has fewer collision misses than LRU (and SB where run), a higher "
          "hit rate and a shorter warm TTFT (decode time where a trace is one request: a cold "
          "prefill cannot tell evictions apart) — the "
          "paper's \"with such gains, we achieve over 88% hit rates with up to 34.7% TTFT "
          "reduction\"; partly where one of them ties, or its collision rate is above the "
          "paper's 1.6–1.9% at 5%; refuted on the metric that goes the other way"),
    Claim(2, "specmd.collision_reduction", "collision reduction vs LRU (and Score-Based)",
          "LRU ÷ LS collisions against the band; hit rate, warm TTFT or decode time",
          "the factor LRU ÷ LS (SB ÷ LS) within / exceeds / falls short of the paper's band "
          "(2.6–8.6× at 5%; up to 85× at 1%: 1–85×; 58–91× vs SB), once LS has fewer "
          "collisions, a higher hit rate and a shorter warm TTFT (or decode time) — \"the collision "
          "reduction translates directly to TTFT gains\"; partly where one of them ties; "
          "else refuted on the metric that goes the other way"),
    Claim(3, "specmd.hit_rate", "88–92% hit rate at 5% (OLMoE)",
          "hit rate (ready + late) against 88–92%; the ready share beside it",
          "OLMoE only: the best causal predictor's hit rate within / exceeds / falls short of "
          "88–92%; a hit rate whose ready hits are below half its hits says so"),
    Claim(4, "specmd.dropin", "Least-Stale as a drop-in: TTFT",
          "warm TTFT change against the paper's per preset (±25%)",
          "on warm TTFT (requests after the first; a cold prefill finds an empty cache "
          "whatever the eviction): refuted on TTFT if it does not fall; else the change "
          "within / exceeds / falls short of the paper's number ±25%"),
    Claim(5, "specmd.score_prefetch", "score-percentile prefetch beats top-k",
          "hit rate, stall, prediction precision (vs each top-k)",
          "reproduced: score-percentile's hit rate higher, stall lower and prediction "
          "precision lower than each top-k's; refuted on the metric that goes the other way "
          "(Mixtral: the paper expects top-k competitive)"),
    Claim(6, "specmd.fld", "FLD only slightly better than LRU",
          "collisions, hit rate (vs LRU); the reduction of LRU's collisions against 0–50%",
          "FLD's collision reduction (1 − FLD ÷ LRU) within (0, 50%] (\"slightly\"), exceeds "
          "(much better), once FLD has fewer collisions and a hit rate not lower (equal is "
          "enough); tie where both are equal; refuted on the metric that goes the other way"),
    Claim(7, "moejax.least_stale_order", "Least-Stale's queue order (moejax's finding)",
          "collisions, hit rate, early evictions per order",
          "no paper number: the order with the fewest collision misses on each trace (ties "
          "joined by =)"),
    Claim(8, "specmd.miss_policies", "miss policies' trade-offs",
          "decode speed vs fetch (replay measures speed only)",
          "fetch_priority: decode tok/s change vs fetch within / exceeds / falls short of "
          "OLMoE's +20–30%; drop(keep=2): reproduced if the fastest miss policy; the others' "
          "claims are about quality: not testable here"),
)}

# Claim 2 read against Score-Based: its own id in claims.json.
SB_CLAIM_ID = "specmd.collision_reduction_vs_score"
CLAIM_OF_ID = {c.id: c.number for c in CLAIMS.values()}

# SpecMD's drop-in table: TTFT change (drop-in - original) / original, percent.
DROPIN_PAPER = {
    "OLMoE": {"specmd_1": -10.7, "specmd_2": -34.7, "specmd_3": -17.7, "specmd_4": -13.8},
    "Mixtral": {"specmd_1": -17.8, "specmd_2": -9.8, "specmd_3": -25.7, "specmd_4": -17.5},
    "Phi": {"specmd_1": -14.8, "specmd_2": 4.3, "specmd_3": -44.1, "specmd_4": -24.6},
    "Qwen": {"specmd_1": -7.8, "specmd_2": -4.3, "specmd_3": -18.4, "specmd_4": -23.0},
}
# The source of each drop-in preset's configuration.
PRESET_SOURCE = {"specmd_1": "Eliseev '23", "specmd_2": "Zhu et al. '25",
                 "specmd_3": "HOBBIT '24", "specmd_4": "MixtureCache '25"}

# Claim 1: Least-Stale's collision rate at 5% (§5.1).
LS_BAND = V.Band("LS collisions", 0.016, 0.019, True, "LS 1.6–1.9% (5%)")
# Claim 2's factor bands: (claim 2 rule, LRU or SB) -> Band.
RATIO_BANDS = {
    "2": V.Band("LRU ÷ LS collisions", 2.6, 8.6, False, "2.6–8.6× (5%)"),
    "2 at 1%": V.Band("LRU ÷ LS collisions", 1.0, 85.0, False,
                      "up to 85× (1%; the paper gives only the maximum)"),
    "2 vs SB": V.Band("SB ÷ LS collisions", 58.0, 91.0, False, "58–91× (5%)"),
}
# Claim 3: the hit rate at 5%, OLMoE's.
HIT_BAND = V.Band("hit rate", 0.88, 0.92, False, "88–92% (OLMoE, 5%)")
HIT_MODEL = "OLMoE"
# Claim 6: "only slightly better than LRU".
FLD_BAND = V.Band("FLD's collision reduction", 0.0, 0.5, False,
                  "slightly better: a reduction of LRU's collisions in (0, 50%]")
# Claim 8: fetch_priority's speed on OLMoE at 4 bits.
PRIORITY_BAND = V.Band("decode tok/s change vs fetch", 20.0, 30.0, False,
                       "+20–30% (OLMoE, 4-bit)")

# What each row's "source" column prints (the paper's number or words).
STATED = {
    1: "LS 1.6–1.9% · LRU 4.5–12.6% · SB 42.6–60.9% (5%); hit rate and TTFT improve",
    "3 other model": "the paper states 88–92% for OLMoE",
    4: "−10.7% to −34.7% (OLMoE, 5%)",
    5: "score-percentile: higher hit rate, lower stall",
    "5 sp": "higher hit rate, lower stall than top-k; lower precision",
    "5 topk1.0": "highest prediction precision and recall",
    6: "slightly better than LRU (no number)",
    7: "§4: stale queue first, FIFO by layer (no order ablation)",
}
# Claim 8, per miss policy (§5.3).
MISS_STATED = {"fetch": "the baseline",
               "drop(keep=2)": "fastest; −5 to −15% quality (OLMoE)",
               "substitute(tol=0.05)": "fails on quality everywhere",
               "fetch_priority": "Pareto frontier; OLMoE 4-bit +20–30% speed, 0–5% quality loss",
               "fetch_lowest_bit": "inconsistent across models"}
