"""SpecMD's claims against a finished (or partial) sweep, trace by trace: for each claim, the
paper's number beside moejax's — the trace group's mean and each trace's own number — with a
rule's suggestion per trace and across the group, for a human to judge.

    python -m moejax.analysis.claims --sweep_dir=D [--sweep_dir=D2 ...] [--capacity=0.05]
        [--queue=all|immediate|watchdog|<any queue in the sweep>] [--h2d_gbps=5]
        [--format=markdown|csv]

Cells come from `sweep_cells.scan` (`cells/<cell>/results.json`; unfinished and failed cells
are counted and skipped). A trace group is derived from the trace's path: the real captures
per model (`captures · OLMoE-1B-7B`, `captures · Qwen1.5-MoE-A2.7B`), the embedded model's
short scored traces (`scored · embedded`) and long traces (`long · embedded`) — real model
routing — the families' random-weight traces (`families · <family>`: synthetic, architecture
only) and any other folder by name. A trace is named by its file's stem (`olmoe_prose`).

Per trace, then across traces. Every row (`Finding`) holds each trace's numbers and its rule's
suggestion (`Finding.per_trace`) and the group's means over the traces that have every cell
the row compares (`Finding.values`). The group's suggestion is a rule's ("reproduced",
"partly", "refuted") only where every trace of the group gets that same one; otherwise it reads
"mixed: reproduced on N of M traces; exceptions: <trace> (<its suggestion>, <its number>)",
led by the most common suggestion. A trace without a cell the row needs is listed as missing,
never dropped. A families group's suggestion says its traces are synthetic. Rates are of
requests; hit rates are ready + late (SpecMD counts an expert whose transfer was issued as a
hit), always shown apart: "48.3% (22.4% + 25.9%)".

Conditions. Every row names its prefetch queue (each queue in the sweep: immediate, watchdog,
then the others by name), its prefetch, capacity and bandwidth. Claims 1, 2, 6 and 7 are read
both with the group's stand-in for the paper's prefetch (`group_prefetch`) and without
prefetch: a verdict can flip between the two.

Least-Stale's readings (`LS_ORDERS`): a cell's `least_stale` without an order is the order its
results.json records as built (`cache.policies.arguments`; in sweeps older than that record,
the compiled engine's `replay.engine_reason`, `eviction least_stale(order='left_first', ...)`),
else the default, `order=two_queue` (sweeps before issue 21 ran left_first).
Claim 7 compares the readings; the other claims read the one with the most of their cells in
the sweep (the default on a tie) and name it.

Structural results. A number that is zero by construction (without prefetch no prefetched
expert is evicted before use) is no finding: where it is exactly zero on every trace and
`STRUCTURAL` gives a reason for its claim and condition, the row says "structural" and why
instead of a rule's suggestion. A zero the table gives no reason for is reported as measured.

The claims (SpecMD's section in brackets):
1. Least-Stale's collision-miss rate at 5% (§5.1 Least-Stale effectiveness);
2. the collision reduction LRU / Least-Stale: up to 85x at 1%, 2.6-8.6x at 5%, 58-91x vs
   Score-Based (§5.1 speed impact);
3. 88-92% hit rate at 5% on OLMoE (abstract, contributions);
4. Least-Stale as a drop-in eviction: TTFT -10.7% to -34.7% on OLMoE (drop-in table);
5. score-percentile prefetch beats top-k on hit rate and stall despite lower prediction
   precision, Mixtral the exception (§5.2 understanding the mismatch);
6. FLD only slightly better than LRU (§5.1);
7. Least-Stale's queue orders (moejax's own finding: SpecMD gives no number);
8. the miss policies' trade-offs (§5.3 quality-speed trade-offs; replay measures speed only).

A suggestion is not a verdict: each rule is a simple stated threshold (printed under the
table; `RULES`), such as "reproduced: within the paper's range or better". The markdown ends
with the command line that produced it. `findings(rows, ...)` returns the rows.
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import io
import json
import math
import os
import re
import shlex
import sys
from typing import Callable, Iterable

from moejax import cli
from moejax.analysis.sweep_cells import (
    dropin_pairs,
    lowest_bandwidth,
    mean,
    open_sweep,
    scan,
    ttft_change_pct,
)
from moejax.cli import UsageError, guarded

# Shown first, in this order; any other queue in the sweep (`watchdog_idle`) follows by name.
QUEUES = ("immediate", "watchdog")
NOT_IN_SWEEP = "not in this sweep"
NO_SCORES = "not testable here (the traces record expert ids only: no gate scores)"
NOT_TESTABLE_SCORES = "not testable here (no gate scores)"
WITHOUT_PREFETCH = "without prefetch"
SP80 = "score_percentile(p=80)"
TOPK = ("topk(overfetch=1.0)", "topk(overfetch=1.5)")
# Least-Stale's readings, the default first (`moejax/policies/eviction.py`, LeastStale).
LS_ORDERS = ("least_stale(order=two_queue)", "least_stale(order=left_first)",
             "least_stale(order=cyclic)")
LS_DEFAULT_ORDER = "two_queue"
LS_POSITIONAL = ("order", "prefetch_current")  # LeastStale's arguments, in their order
# The compiled engine's record of the eviction it built (`replay.engine_reason`).
_BUILT_LS = re.compile(r"\beviction least_stale\(([^)]*)\)")
MISSES = ("fetch", "drop(keep=2)", "substitute(tol=0.05)", "fetch_priority", "fetch_lowest_bit")
# Real models by a preset's or capture's name prefix: (shown name, the paper's column).
MODELS = (("olmoe", "OLMoE-1B-7B", "OLMoE"), ("qwen", "Qwen1.5-MoE-A2.7B", "Qwen"),
          ("mixtral", "Mixtral-8x7B", "Mixtral"), ("phi", "Phi-3.5-MoE", "Phi"))
# SpecMD's drop-in table: TTFT change (drop-in - original) / original, percent.
DROPIN_PAPER = {
    "OLMoE": {"specmd_1": -10.7, "specmd_2": -34.7, "specmd_3": -17.7, "specmd_4": -13.8},
    "Mixtral": {"specmd_1": -17.8, "specmd_2": -9.8, "specmd_3": -25.7, "specmd_4": -17.5},
    "Phi": {"specmd_1": -14.8, "specmd_2": 4.3, "specmd_3": -44.1, "specmd_4": -24.6},
    "Qwen": {"specmd_1": -7.8, "specmd_2": -4.3, "specmd_3": -18.4, "specmd_4": -23.0},
}
PRESET_SOURCE = {"specmd_1": "Eliseev '23", "specmd_2": "Zhu et al. '25",
                 "specmd_3": "HOBBIT '24", "specmd_4": "MixtureCache '25"}
CLAIMS = {
    1: "Least-Stale's collision-miss rate",
    2: "collision reduction vs LRU (and Score-Based)",
    3: "88–92% hit rate at 5% (OLMoE)",
    4: "Least-Stale as a drop-in: TTFT",
    5: "score-percentile prefetch beats top-k",
    6: "FLD only slightly better than LRU",
    7: "Least-Stale's queue order (moejax's finding)",
    8: "miss policies' trade-offs",
}
RULES = {
    "1": "reproduced: LS ≤ 1.9% (within the paper's range or better) and below LRU (and SB "
         "where present); partly: below them but above 1.9%; refuted: LS ≥ LRU",
    "2 at 1%": "the paper gives only a maximum (85×): reproduced: LRU/LS ≥ 2.6× (the paper's "
            "smallest 5% factor); partly: 1–2.6×; refuted: ≤ 1×",
    "2": "reproduced: LRU/LS ≥ 2.6× (within 2.6–8.6× or better); partly: 1–2.6×; "
         "refuted: ≤ 1×",
    "2 vs SB": "reproduced: SB/LS ≥ 58× (within 58–91× or better); partly: 1–58×; "
               "refuted: ≤ 1×",
    "3": "OLMoE groups only: reproduced: hit rate (ready + late) ≥ 88%; refuted: below",
    "4": "on warm TTFT (requests after the first): reproduced: ΔTTFT ≤ the paper's change for "
         "the preset (as large a reduction or larger); partly: a smaller reduction; refuted: "
         "no reduction. With one request per trace only the cold TTFT exists, and a cold "
         "prefill finds an empty cache whatever the eviction: not testable (the decode tok/s "
         "change is shown beside it, outside the rule)",
    "5": "reproduced: score-percentile's hit rate ≥ and stall ≤ each top-k's; refuted: both "
         "worse than each; partly: otherwise (Mixtral: top-k's expected competitive)",
    "6": "reproduced: FLD's collision-miss rate ≤ LRU's by at most half of LRU's (better, "
         "slightly); refuted: FLD worse, or better by more than half",
    "7": "no paper number: the \"fewest collision misses\" row names, on each trace, the order "
         "with the fewest collision misses (ties joined by =)",
    "8": "speed only (replay does not measure quality): fetch_priority: reproduced if decode "
         "tok/s ≥ +20% over fetch (OLMoE's 20–30%), partly if faster, refuted if not; drop: "
         "reproduced if it is the fastest miss policy; the others' claims are about quality",
}


@dataclasses.dataclass
class TraceResult:
    """One trace's numbers in a row, as text, and its rule's suggestion."""

    values: dict
    shown: str
    suggestion: str


@dataclasses.dataclass
class Finding:
    group: str
    claim: int
    measure: str  # what moejax measured
    paper: str  # SpecMD's number
    queue: str
    capacity: str
    prefetch: str = ""  # the condition's prefetch, as text ("without prefetch", "with ...")
    eviction: str = ""  # the eviction the row's number is about, where there is one
    # The key of `values` the row's result rests on (its rule's number, or for a ratio the
    # denominator): where that is structural, so is the row.
    headline: str = ""
    shown: str = ""  # the group's means, as text
    suggestion: str = ""  # across the traces ("" where a row has no rule)
    values: dict = dataclasses.field(default_factory=dict)  # the group's means
    traces: int = 0  # traces in the means
    h2d_gbps: float | None = None  # the bandwidth of the cells read
    per_trace: dict[str, TraceResult] = dataclasses.field(default_factory=dict)
    missing: dict[str, str] = dataclasses.field(default_factory=dict)  # trace -> what it lacks
    # Key of `values` -> why it is zero on every trace by construction (`STRUCTURAL`).
    structural: dict[str, str] = dataclasses.field(default_factory=dict)


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
    # Claims 1 and 2 read left_first where a sweep has no other reading (an older sweep).
    Structural(1, "least_stale", "LS collision misses", _left_first_without_prefetch,
               _LEFT_FIRST),
    Structural(2, "least_stale", "LS collision misses", _left_first_without_prefetch,
               _LEFT_FIRST),
    Structural(4, "cold_pct", "cold ΔTTFT", lambda f: True,
               "a first request's prefill finds an empty cache whatever the eviction"),
)


# -- loading ---------------------------------------------------------------------------------
def _json(value, default=None):
    if value is None:
        return default
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value


def trace_group(path: str, model_preset: str = "", family: str = "") -> tuple[str, str | None]:
    """(group label, the paper's model column or None) of a trace, from its path."""
    if not path:
        return "live", None
    parts = os.path.normpath(path).split(os.sep)
    stem = os.path.splitext(parts[-1])[0]
    parent = parts[-2] if len(parts) > 1 else ""
    grand = parts[-3] if len(parts) > 2 else ""

    def real(name: str):
        low = name.lower()
        for prefix, shown, paper in MODELS:
            if low.startswith(prefix):
                return shown, paper
        return None

    if parent == "captures":
        found = real(model_preset or stem) or real(stem)
        return (f"captures · {found[0]}", found[1]) if found else (
            f"captures · {model_preset or stem.split('_')[0]}", None)
    if grand == "families":  # tiny presets with random weights: architecture only
        return f"families · {parent}", None
    if parent == "long" and grand == "traces":
        return "long · embedded", None
    if parent == "traces":
        return "scored · embedded", None
    found = real(model_preset) if model_preset else None
    if found:
        return f"{parent or 'trace'} · {found[0]}", found[1]
    return f"{parent or 'trace'} · {model_preset or family or stem}", None


def _extras(row: dict, results: dict) -> dict:
    setup, total = row["setup"], results["cache"]["total"]
    t = results.get("trace") if isinstance(results.get("trace"), dict) else {}
    path = t.get("path") or _json(setup.get("trace"), "") or ""
    group, model = trace_group(str(path), str(_json(setup.get("model.preset"), "") or ""),
                               str(_json(setup.get("model.family"), "") or ""))
    requests = total.get("requests")

    def share(key):
        return total[key] / requests if requests and total.get(key) is not None else None

    built = _built_eviction(results)
    return {"group": group, "paper_model": model, "trace_path": str(path) or row["trace"],
            "eviction": least_stale_spec(row["eviction"], built),
            "queue": str(_json(setup.get("cache.prefetch_queue"), "immediate")),
            "has_scores": t.get("has_scores"), "dropped": total.get("dropped"),
            "substituted": total.get("substituted"), "dropped_share": share("dropped"),
            "substituted_share": share("substituted"),
            "cold_ttft": row["cold_ttft_s"] if row["cold_ttft_s"] is not None
            else row["ttft_s"]}


@dataclasses.dataclass
class Loaded:
    rows: list[dict]
    summary: list[str]  # one line per sweep: finished, unfinished and failed cells


def load(sweep_dirs: Iterable[str]) -> Loaded:
    """The finished cells of every sweep as `sweep_cells.cell_row` rows, plus their trace
    group, prefetch queue and the counters cell_row leaves out (dropped, substituted); a
    Least-Stale eviction with its order spelled out (`least_stale_spec`)."""
    rows, summary = [], []
    for d in sweep_dirs:
        sweep = scan(d)
        n = 0
        for row in sweep.rows:
            try:
                with open(os.path.join(d, "cells", row["name"], "results.json")) as f:
                    results = json.load(f)
                rows.append({**row, **_extras(row, results), "sweep": d})
                n += 1
            except (OSError, ValueError, KeyError, TypeError) as e:
                sweep.failed[row["name"]] = f"{type(e).__name__}: {e}"
        summary.append(f"{d}: {n} finished cells, {len(sweep.unfinished)} unfinished, "
                       f"{len(sweep.failed)} failed")
    return Loaded(rows, summary)


# -- selecting and averaging -----------------------------------------------------------------
def norm(spec: str) -> str:
    """A spec without spaces, quotes or empty parentheses: `none()` is `none`."""
    s = str(spec).replace(" ", "").replace('"', "").replace("'", "")
    return s[:-2] if s.endswith("()") else s


def _built_eviction(results: dict) -> str:
    """The eviction policy a cell built, as text `eviction least_stale(order=...)`: from
    `cache.policies.arguments` (results.json records each policy's arguments as built), else
    from the compiled engine's `replay.engine_reason` (sweeps run before that record)."""
    policies = (results.get("cache") or {}).get("policies") or {}
    args = (policies.get("arguments") or {}).get("eviction")
    if args is not None and "order" in args:
        return f"eviction least_stale(order={args['order']})"
    return str((results.get("replay") or {}).get("engine_reason") or "")


def least_stale_spec(spec: str, built: str = "") -> str:
    """A Least-Stale spec with its order spelled out (other specs as they are): the order
    given, else the one `built` names (`_built_eviction`: what the cell recorded it built),
    else the default. So `least_stale` of a sweep run before the default changed reads as
    `least_stale(order=left_first)`, and of a later one as `least_stale(order=two_queue)`."""
    name, _, rest = norm(spec).partition("(")
    if name != "least_stale":
        return spec
    args = dict(a.split("=", 1) if "=" in a else (LS_POSITIONAL[i], a)
                for i, a in enumerate(rest.rstrip(")").split(",")) if a)
    if "order" not in args:
        found = _BUILT_LS.search(built)
        order = re.search(r"order=(\w+)", norm(found.group(1))) if found else None
        args = {"order": order.group(1) if order else LS_DEFAULT_ORDER, **args}
    return "least_stale(" + ",".join(f"{k}={v}" for k, v in args.items()) + ")"


def parse_capacity(text: str) -> tuple:
    """`0.05` -> (0, 0.05) (a fraction); `5%` -> (0, 0.05); `8slots`, `8 slots`, `slots=8` ->
    (1, 8). Anything else is a ValueError saying what it takes."""
    t = str(text).strip().lower().replace(" ", "")
    m = re.fullmatch(r"(?:slots=)?(\d+)slots?|slots=(\d+)", t)
    if m:
        return (1, int(m.group(1) or m.group(2)))
    try:
        v = float(t.rstrip("%")) / (100 if t.endswith("%") else 1)
    except ValueError:
        v = math.nan
    if not 0 < v <= 1:
        raise ValueError(f"{text!r} is not a capacity: a fraction (0.05), a percentage (5%) "
                         f"or a slot count (8slots)")
    return (0, v)


def capacity_text(key: tuple) -> str:
    return f"{key[1]} slots" if key[0] == 1 else f"{100 * key[1]:.3g}%"


def _same_cap(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and math.isclose(float(a[1]), float(b[1]), rel_tol=1e-9)


def at_capacity(rows: list[dict], key: tuple) -> list[dict]:
    return [r for r in rows if _same_cap(tuple(r["capacity_key"]), key)]


def select(rows: list[dict], eviction: str | None = None, prefetch: str | None = None,
           miss: str | None = "fetch", routing: str | None = "standard",
           preset: str | None = "") -> list[dict]:
    """Rows running the given specs (None: any); by default plain cells (no preset) with the
    fetch miss policy and standard routing."""
    want = {"eviction": eviction, "prefetch": prefetch, "miss": miss, "routing": routing}
    return [r for r in rows if (preset is None or r["preset"] == preset)
            and all(v is None or norm(r[k]) == norm(v) for k, v in want.items())]


# -- formatting ------------------------------------------------------------------------------
def pct(x, digits: int = 1) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f}%"


def signed_pct(x) -> str:
    return "–" if x is None else f"{x:+.1f}%"


def seconds(x) -> str:
    return "–" if x is None else f"{x:.3g} s"


def hits(m: dict) -> str:
    if m.get("ready_hit_rate") is None or m.get("late_hit_rate") is None:
        return f"{pct(m.get('hit_rate'))} (split ?)"
    return f"{pct(m['hit_rate'])} ({pct(m['ready_hit_rate'])} + {pct(m['late_hit_rate'])})"


def ratio(num, den) -> float | None:
    """num / den; inf when only den is 0; None when unknown or both 0."""
    if num is None or den is None:
        return None
    if den == 0:
        return math.inf if num > 0 else None
    return num / den


def ratio_text(r, num, den) -> str:
    if r is None:
        return "– (both 0)" if num == 0 and den == 0 else "–"
    return "∞ (LS has 0)" if math.isinf(r) else f"{r:.2f}×"


HIT_FIELDS = ("hit_rate", "ready_hit_rate", "late_hit_rate")


# -- the rules -------------------------------------------------------------------------------
def verdict(rule: str, v: dict, model: str | None = None) -> str:
    """The suggestion of rule `rule` (a key of RULES) for the numbers `v` of a finding."""
    if rule == "1":
        ls, lru, sb = v.get("least_stale"), v.get("lru"), v.get("score")
        if ls is None or lru is None:
            return NOT_IN_SWEEP
        others = [x for x in (lru, sb) if x is not None]
        if ls >= lru:
            return "refuted"
        if all(ls < x for x in others):
            return "reproduced" if ls <= 0.019 else "partly (LS above the paper's 1.9%)"
        return "partly (SB below LS)"
    if rule in ("2", "2 at 1%", "2 vs SB"):
        r = v.get("ratio")
        if r is None:
            return NOT_IN_SWEEP if v.get("least_stale") is None else "not testable here"
        low = 58.0 if rule == "2 vs SB" else 2.6
        return "reproduced" if r >= low else "partly" if r > 1 else "refuted"
    if rule == "3":
        if model != "OLMoE":
            return "not testable here (the paper's number is OLMoE's)"
        h = v.get("hit_rate")
        return NOT_IN_SWEEP if h is None else "reproduced" if h >= 0.88 else "refuted"
    if rule == "4":
        d, p = v.get("warm_pct"), v.get("paper_pct")
        if d is None:
            return (NOT_IN_SWEEP if v.get("cold_pct") is None else
                    "not testable here (one request per trace: a cold prefill)")
        return ("reproduced" if p is not None and d <= p else "partly" if d < 0
                else "refuted")
    if rule == "5":
        sp = (v.get("sp_hit"), v.get("sp_stall"))
        tks = [(v.get(f"{k}_hit"), v.get(f"{k}_stall")) for k in ("topk1.0", "topk1.5")]
        tks = [t for t in tks if t[0] is not None and t[1] is not None]
        if None in sp or not tks:
            return NOT_IN_SWEEP
        better = all(sp[0] >= h and sp[1] <= s for h, s in tks)
        worse = all(sp[0] < h and sp[1] > s for h, s in tks)
        if model == "Mixtral":  # the paper's exception: top-k competitive
            return "reproduced (top-k competitive)" if not better else "refuted"
        if better:
            prec = v.get("sp_precision"), v.get("topk1.0_precision")
            lower = None not in prec and prec[0] < prec[1]
            return "reproduced" + ("" if lower else " (precision not lower)")
        return "refuted" if worse else "partly"
    if rule == "6":
        fld, lru = v.get("fld_collision"), v.get("lru_collision")
        if fld is None or lru is None:
            return NOT_IN_SWEEP
        if lru == 0:
            return "not testable here (LRU has no collision misses)"
        rel = (lru - fld) / lru
        return ("reproduced" if 0 <= rel <= 0.5 else "refuted (FLD worse)" if rel < 0
                else "refuted (FLD much better)")
    if rule == "8":
        name, s = v.get("miss"), v.get("tok_s_change_pct")
        if s is None:
            return NOT_IN_SWEEP if v.get("stall_s") is None else ""
        if name == "fetch_priority":
            return ("speed part reproduced" if s >= 20 else "partly (faster, < +20%)" if s > 0
                    else "refuted (not faster)")
        if name == "drop(keep=2)":
            return "speed part reproduced" if v.get("fastest") else "refuted (not the fastest)"
        if name in ("substitute(tol=0.05)", "fetch_lowest_bit"):
            return "not testable here (a quality claim)"
        return ""
    return ""


# -- per trace and across traces ---------------------------------------------------------------
# A row's numbers from its raw numbers (configuration label -> field -> value, one trace's or
# the group's means): (values, shown, the rule's suggestion).
Describe = Callable[[dict], tuple[dict, str, str]]


@dataclasses.dataclass
class Group:
    """One trace group read in one prefetch queue: what every row of it shares."""

    name: str
    model: str | None  # the paper's model column
    traces: list[str]  # every trace of the group at the bandwidth read, in any queue
    has_scores: bool
    queue: str
    rows: list[dict]  # the group's cells in this queue

    @property
    def synthetic(self) -> bool:
        return self.name.startswith("families")

    def finding(self, claim: int, cap: tuple, measure: str, paper: str, prefetch: str = "",
                **more) -> Finding:
        return Finding(self.name, claim, measure, paper, self.queue, capacity_text(cap),
                       prefetch=prefetch, **more)


def with_prefetch(spec: str) -> str:
    return WITHOUT_PREFETCH if norm(spec) == "none" else f"with {spec} prefetch"


def by_trace(configs: dict[str, list[dict]], fields: Iterable[str]) -> dict[str, dict]:
    """trace -> configuration label -> each field's mean over the trace's cells of it (a
    trace without cells of a configuration lacks its label)."""
    out: dict[str, dict] = collections.defaultdict(dict)
    for label, rows in configs.items():
        cells = collections.defaultdict(list)
        for r in rows:
            cells[r["trace"]].append(r)
        for trace, rs in cells.items():
            out[trace][label] = {f: mean(r[f] for r in rs) for f in fields}
    return out


def _mean_raw(raws: list[dict]) -> dict:
    """The traces' raw numbers averaged, each label over the traces that have it."""
    out = {}
    for label in dict.fromkeys(k for raw in raws for k in raw):
        have = [raw[label] for raw in raws if label in raw]
        out[label] = {f: mean(h[f] for h in have) for f in have[0]}
    return out


def fill(f: Finding, g: Group, raw: dict, needed: Iterable[str], describe: Describe) -> Finding:
    """`f`'s numbers: each trace's (`raw`: `by_trace`'s shape) where it has every `needed`
    label, else the trace is missing; the group's from the means over those traces."""
    needed = tuple(needed)
    complete = {}
    for t in g.traces:
        lacks = [k for k in needed if k not in raw.get(t, {})]
        if lacks or not raw.get(t):
            f.missing[t] = f"no {', '.join(lacks) or 'matching'} cells"
        else:
            complete[t] = raw[t]
    f.per_trace = {t: TraceResult(*describe(r)) for t, r in complete.items()}
    if not complete:
        lacking = dict.fromkeys(k for k in needed if not any(k in r for r in raw.values()))
        f.shown = f"{NOT_IN_SWEEP} (no {', '.join(lacking) or 'matching'} cells)"
        f.suggestion = NOT_IN_SWEEP
        return f
    f.values, f.shown, _ = describe(_mean_raw(list(complete.values())))
    f.traces = len(complete)
    return f


def _rank(suggestion: str) -> int:
    """Ties between suggestions go to the claim's side: reproduced, partly, refuted, others."""
    first = suggestion.split(" ")[0]
    order = ("reproduced", "partly", "refuted")
    return order.index(first) if first in order else len(order)


def across(per: dict[str, TraceResult], missing: Iterable[str], synthetic: bool) -> str:
    """The group's suggestion: the traces' one where they all agree and none is missing, else
    "mixed: <the most common> on N of M traces; exceptions: <trace> (<its suggestion>, <its
    number>)" and the missing traces."""
    tested = {t: r for t, r in per.items() if r.suggestion != NOT_IN_SWEEP}
    gone = sorted({*missing, *(t for t in per if t not in tested)})
    counts = collections.Counter(r.suggestion for r in tested.values())
    if not counts:
        return NOT_IN_SWEEP
    top = max(counts, key=lambda s: (counts[s], -_rank(s)))
    if len(counts) == 1 and (not gone or not top):
        text = top  # a row without a rule lists its missing traces in its own lines
    else:
        text = f"{top or '–'} on {counts[top]} of {len(tested) + len(gone)} traces"
        if len(counts) > 1:
            text = "mixed: " + text + "; exceptions: " + ", ".join(
                f"{t} ({r.suggestion or '–'}, {r.shown})" for t, r in tested.items()
                if r.suggestion != top)
        if gone:
            text += f"; missing: {', '.join(gone)}"
    return f"{text} (synthetic traces: random weights)" if synthetic and text else text


def label_structural(f: Finding) -> None:
    """Marks each of `f`'s values that `STRUCTURAL` explains and that is exactly zero on every
    trace with numbers."""
    for s in STRUCTURAL:
        if (s.claim == f.claim and f.per_trace and s.applies(f)
                and all(r.values.get(s.key) == 0 for r in f.per_trace.values())):
            f.structural[s.key] = f"{s.label} 0 on every trace ({s.reason})"


def conclude(f: Finding, g: Group) -> None:
    """`f`'s suggestion across its traces, or "structural" where its headline number is."""
    label_structural(f)
    if f.headline in f.structural:
        f.suggestion = f"structural: {f.structural[f.headline]}"
        for r in f.per_trace.values():
            r.suggestion = "structural"
    elif f.per_trace:
        f.suggestion = across(f.per_trace, f.missing, g.synthetic)


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
    f.shown, f.suggestion = NO_SCORES, NOT_TESTABLE_SCORES
    return f


def _describe1(ls: str) -> Describe:
    def describe(r):
        c = {k: r[label]["collision_miss_rate"] if label in r else None
             for k, label in (("least_stale", ls), ("lru", "lru"), ("score", "score"))}
        shown = " · ".join(f"{short} {pct(c[k], 2)}" for k, short in
                           (("least_stale", "LS"), ("lru", "LRU"), ("score", "SB"))
                           if c[k] is not None)
        return c, shown, verdict("1", c)
    return describe


def _describe2(ls: str, other: str, rule: str) -> Describe:
    name = "SB" if other == "score" else "LRU"

    def describe(r):
        o, s = r[other]["collision_miss_rate"], r[ls]["collision_miss_rate"]
        v = {other: o, "least_stale": s, "ratio": ratio(o, s)}
        return v, (f"{ratio_text(v['ratio'], o, s)} ({name} {pct(o, 2)} / LS "
                   f"{pct(s, 2)})"), verdict(rule, v)
    return describe


def _claim1_2(g: Group, cap: tuple, pf: str) -> list[Finding]:
    one = (0, 0.01)
    plan = [(cap, ("1", "2 at 1%" if _same_cap(cap, one) else "2", "2 vs SB"))]
    if not _same_cap(cap, one):
        plan.append((one, ("2 at 1%",)))
    papers = {"2 at 1%": "up to 85× (1%)", "2": "2.6–8.6× (5%)", "2 vs SB": "58–91× (5%)"}
    out = []
    for p in dict.fromkeys((pf, "none")):  # the verdict can flip without prefetch
        for claim_cap, rules in plan:
            here = at_capacity(g.rows, claim_cap)
            ls = ls_reading(here, [{"prefetch": p}])
            raw = by_trace({k: select(here, k, p) for k in (ls, "lru", "score")},
                           ("collision_miss_rate",))
            for rule in rules:
                if rule == "1":
                    f = g.finding(1, claim_cap, f"collision-miss rate: {ls_short(ls)} · LRU · SB",
                                  "LS 1.6–1.9% · LRU 4.5–12.6% · SB 42.6–60.9% (5%)",
                                  with_prefetch(p), eviction=ls, headline="least_stale")
                    out.append(fill(f, g, raw, (ls, "lru"), _describe1(ls)))
                    continue
                other = "score" if rule == "2 vs SB" else "lru"
                f = g.finding(2, claim_cap, f"{'SB' if other == 'score' else 'LRU'} ÷ "
                                            f"{ls_short(ls)} collision-miss rate",
                              papers[rule], with_prefetch(p), eviction=ls,
                              headline="least_stale")
                out.append(_no_scores(f) if other == "score" and not g.has_scores
                           else fill(f, g, raw, (ls, other), _describe2(ls, other, rule)))
    return out


def _describe_best(model: str | None) -> Describe:
    def describe(r):
        best = max(r, key=lambda p: r[p]["hit_rate"] or 0.0)
        return {**r[best], "prefetch": best}, f"{hits(r[best])} ({best})", verdict(
            "3", r[best], model)
    return describe


def _describe_hits(p: str) -> Describe:
    return lambda r: (dict(r[p]), hits(r[p]), "")


def _claim3(g: Group, cap: tuple) -> list[Finding]:
    here = at_capacity(g.rows, cap)
    ls = ls_reading(here, [{"prefetch": None}])
    cells = select(here, ls, None)
    prefetches = sorted({r["prefetch"] for r in cells})
    raw = by_trace({p: select(cells, ls, p) for p in prefetches}, HIT_FIELDS)
    # The replay-only oracles know the future: not what a deployed predictor can reach.
    ordinary = {t: {p: v for p, v in r.items() if "oracle" not in norm(p)}
                for t, r in raw.items()}
    f = g.finding(3, cap, f"{ls_short(ls)} hit rate (ready + late)", "88–92% (OLMoE, 5%)",
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
    """The mean changes, percent, of a trace's drop-in pairs."""
    def change(key):
        return mean(ttft_change_pct(p.base[key], p.dropin[key]) for p in pairs)
    # Not the paper's measure, shown beside it: the decode speed's change.
    return {"cold_pct": change("cold_ttft"), "warm_pct": change("warm_ttft_s"),
            "decode_tok_s_pct": change("decode_tok_per_s"), "pairs": len(pairs)}


def _describe4(paper: float | None) -> Describe:
    def describe(r):
        v = {**r["drop-in pair"], "paper_pct": paper}
        shown = (f"cold {signed_pct(v['cold_pct'])}"
                 + (f" · warm {signed_pct(v['warm_pct'])}" if v["warm_pct"] is not None else "")
                 + (f" · decode tok/s {signed_pct(v['decode_tok_s_pct'])}"
                    if v["decode_tok_s_pct"] is not None else ""))
        return v, shown, verdict("4", v)
    return describe


def _claim4(g: Group, cap: tuple) -> list[Finding]:
    by = collections.defaultdict(list)
    for p in dropin_pairs(at_capacity(g.rows, cap)):
        by[(p.preset, p.label, p.other_label, p.dropin["eviction"])].append(p)
    if not by:
        f = g.finding(4, cap, "ΔTTFT, preset → preset + Least-Stale eviction",
                      "−10.7% to −34.7% (OLMoE, 5%)", "the preset's prefetch")
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
                      f"{signed_pct(paper)} ({paper_model}, 5%)" if paper is not None else "–",
                      "the preset's prefetch", eviction=eviction, headline="warm_pct")
        raw = {t: {"drop-in pair": _pair_changes(tps)} for t, tps in per.items()}
        out.append(fill(f, g, raw, ("drop-in pair",), _describe4(paper)))
    return out


def _describe5(p: str, labels: dict[str, str], model: str | None) -> Describe:
    def describe(r):
        m = r[p]
        shown = (f"{hits(m)} · stall {seconds(m['stall_s'])} · precision "
                 f"{pct(m['prediction_precision'])}")
        if p != SP80:
            return dict(m), shown, ""
        v = {}
        for q, k in labels.items():
            if q in r:
                v.update({f"{k}_hit": r[q]["hit_rate"], f"{k}_stall": r[q]["stall_s"],
                          f"{k}_precision": r[q]["prediction_precision"]})
        return {**m, **v}, shown, verdict("5", v, model)
    return describe


def _claim5(g: Group, cap: tuple) -> list[Finding]:
    here = at_capacity(g.rows, cap)
    labels = {SP80: "sp", TOPK[0]: "topk1.0", TOPK[1]: "topk1.5"}
    ls = ls_reading(here, [{"prefetch": p} for p in labels])
    configs = {p: select(here, ls, p) for p in labels}
    if not g.has_scores and not configs[SP80]:
        return [_no_scores(g.finding(5, cap, "score-percentile vs top-k prefetch",
                                     "score-percentile: higher hit rate, lower stall"))]
    raw = by_trace(configs, (*HIT_FIELDS, "stall_s", "prediction_precision",
                                 "prediction_recall"))
    mixtral = " (Mixtral: top-k competitive)" if g.model == "Mixtral" else ""
    papers = {SP80: "higher hit rate, lower stall than top-k; lower precision" + mixtral,
              TOPK[0]: "highest prediction precision and recall", TOPK[1]: "–"}
    return [fill(g.finding(5, cap, f"{ls_short(ls)}: hit rate · stall · prediction precision",
                           papers[p], with_prefetch(p), eviction=ls,
                           headline="hit_rate" if p == SP80 else ""),
                 g, raw, (p,), _describe5(p, labels, g.model)) for p in labels]


def _describe6(r: dict) -> tuple[dict, str, str]:
    v = {"fld_collision": r["fld"]["collision_miss_rate"],
         "lru_collision": r["lru"]["collision_miss_rate"],
         "fld_hit": r["fld"]["hit_rate"], "lru_hit": r["lru"]["hit_rate"]}
    shown = (f"collisions FLD {pct(v['fld_collision'], 2)} vs LRU {pct(v['lru_collision'], 2)}"
             f" · hit FLD {hits(r['fld'])} vs LRU {hits(r['lru'])}")
    return v, shown, verdict("6", v)


def _claim6(g: Group, cap: tuple, pf: str) -> list[Finding]:
    here = at_capacity(g.rows, cap)
    out = []
    for p in dict.fromkeys((pf, "none")):
        raw = by_trace({e: select(here, e, p) for e in ("fld", "lru")},
                       ("collision_miss_rate", *HIT_FIELDS))
        f = g.finding(6, cap, "FLD vs LRU: collision-miss rate · hit rate",
                      "slightly better than LRU (no number)", with_prefetch(p),
                      eviction="fld", headline="fld_collision")
        out.append(fill(f, g, raw, ("fld", "lru"), _describe6))
    return out


def _describe7(order: str) -> Describe:
    def describe(r):
        m = r[order]
        early = "–" if m["evicted_before_use"] is None else f"{m['evicted_before_use']:.4g}"
        return dict(m), (f"collisions {pct(m['collision_miss_rate'], 2)} · hit {hits(m)} · "
                         f"early evictions {early}"), ""
    return describe


def _fewest(r: dict) -> tuple[dict, str, str]:
    """The order(s) with the fewest collision misses among those present."""
    rates = {norm(e)[len("least_stale(order="):-1]: m["collision_miss_rate"]
             for e, m in r.items() if m["collision_miss_rate"] is not None}
    shown = " · ".join(f"{o} {pct(x, 2)}" for o, x in rates.items())
    low = min(rates.values(), default=None)
    best = " = ".join(o for o, x in rates.items() if x == low)
    return {"fewest": best, **rates}, shown, best if len(rates) > 1 else ""


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


def _describe8(mp: str) -> Describe:
    def describe(r):
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
        return v, shown, verdict("8", v) if mp != "fetch" else ""
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


def queue_order(queues: Iterable[str]) -> list[str]:
    """immediate, watchdog, then any other queue by name."""
    return sorted(set(queues), key=lambda q: (QUEUES.index(q) if q in QUEUES else len(QUEUES),
                                              q))


def findings(rows: list[dict], capacity="0.05", queue: str = "all",
             h2d_gbps: float | None = None) -> list[Finding]:
    """Every claim's rows per trace group and prefetch queue, at `capacity` (a fraction, or
    "N slots"; claim 2 also at 1%), at `h2d_gbps` (None: each group's lowest bandwidth)."""
    cap = parse_capacity(capacity) if not isinstance(capacity, tuple) else capacity
    out: list[Finding] = []
    groups = collections.defaultdict(list)
    for r in rows:
        groups[r["group"]].append(r)
    for name in sorted(groups):
        grows = groups[name]
        bw = h2d_gbps if h2d_gbps is not None else lowest_bandwidth(grows)
        if bw is not None:
            grows = [r for r in grows if r["h2d_gbps"] is not None
                     and math.isclose(float(r["h2d_gbps"]), float(bw))]
        model = grows[0]["paper_model"] if grows else None
        traces = sorted({r["trace"] for r in grows})
        pf = group_prefetch(grows)
        for q in queue_order(r["queue"] for r in grows) if queue == "all" else [queue]:
            g = Group(name, model, traces, _has_scores(grows), q,
                      [r for r in grows if r["queue"] == q])
            for f in (*_claim1_2(g, cap, pf), *_claim3(g, cap), *_claim4(g, cap),
                      *_claim5(g, cap), *_claim6(g, cap, pf), *_claim7(g, cap, pf),
                      *_claim8(g, cap)):
                f.h2d_gbps = bw
                conclude(f, g)
                out.append(f)
    order = {c: i for i, c in enumerate(CLAIMS)}
    return sorted(out, key=lambda f: (f.group, order[f.claim]))  # stable: queues keep order


# -- output ----------------------------------------------------------------------------------
def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def condition(f: Finding) -> str:
    """`immediate queue · without prefetch · 5% · 5 GB/s`."""
    bw = "? GB/s" if f.h2d_gbps is None else f"{f.h2d_gbps:g} GB/s"
    return " · ".join(x for x in (f"{f.queue} queue", f.prefetch, f.capacity, bw) if x)


def suggestion_text(f: Finding) -> str:
    """The row's suggestion, then its other values that are zero by construction."""
    notes = [f"structural: {why}" for k, why in f.structural.items() if k != f.headline]
    return " · ".join(x for x in (f.suggestion, *notes) if x)


def _group_line(name: str, traces: list[str], bw) -> str:
    kind = ("synthetic (random weights: architecture only)" if name.startswith("families")
            else "real model routing" if name.startswith(("captures", "scored", "long"))
            else "")
    n = f"{len(traces)} {kind + ' ' if kind else ''}trace{'s' * (len(traces) != 1)}"
    return f"{n}: {', '.join(traces)}; H2D {'?' if bw is None else f'{bw:g}'} GB/s"


def _table_lines(fs: list[Finding]) -> list[str]:
    head = ["#", "claim", "condition", "measured", "SpecMD", "moejax", "rule suggests"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * len(head)) + " |"]
    last = None
    for f in fs:
        mean_of = f"mean of {f.traces}: " if f.traces > 1 else ""
        cells = [str(f.claim) if f.claim != last else "",
                 CLAIMS[f.claim] if f.claim != last else "", condition(f), f.measure, f.paper,
                 mean_of + f.shown, suggestion_text(f)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        # Each trace's own number below the group's; none where no trace has one.
        subs = {t: (r.shown, r.suggestion) for t, r in f.per_trace.items()}
        if subs:
            subs.update({t: (f"missing: {why}", "missing") for t, why in f.missing.items()})
        for t in sorted(subs):
            cells = ["", "", "", f"↳ {t}", "", *subs[t]]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        last = f.claim
    return lines


def markdown(found: list[Finding], summary: list[str], rows: list[dict],
             command: str = "") -> str:
    lines = ["# SpecMD's claims vs moejax", ""]
    lines += [f"* {s}" for s in summary]
    lines += ["", "Each row's first line is the group's mean over its traces that have every "
              "compared cell; the ↳ lines are each trace's own number and its rule's "
              "suggestion. Rates are of requests; hit rates are ready + late (resident / in "
              "flight when needed), shown apart. **The last column is a rule's suggestion, "
              "not a verdict**: each rule is a simple stated threshold (below), applied to "
              "each trace; the group gets a rule's word only where every trace gets it "
              "(else \"mixed\", with the exceptions). \"structural\": zero by construction "
              "under the row's condition, no finding. The verdict is left to a human.", ""]
    by_group = collections.defaultdict(list)
    for f in found:
        by_group[f.group].append(f)
    traces = collections.defaultdict(set)
    for r in rows:
        traces[r["group"]].add(r["trace"])
    for g, fs in by_group.items():
        lines += [f"## {g}", "", _group_line(g, sorted(traces[g]), fs[0].h2d_gbps), ""]
        lines += [*_table_lines(fs), ""]
    if not found:
        lines += ["No finished cells.", ""]
    lines += ["## Rules behind the suggestions", ""]
    lines += [f"* claim {k}: {v}" for k, v in RULES.items()]
    lines += ["", "Miss policies: replay measures speed only. The quality cost of dropping or "
              "substituting an expert (or serving a lower precision) changes the model's "
              "output, which a replayed trace cannot see: those claims are not measured here.",
              ""]
    if command:
        lines += [f"Produced by: `{command}`", ""]
    return "\n".join(lines)


CSV_COLUMNS = ("group", "claim", "level", "trace", "queue", "prefetch", "capacity", "h2d_gbps",
               "measure", "paper", "moejax", "suggestion", "structural", "traces", "values")


def to_csv(found: list[Finding]) -> str:
    """One line per row for the group (`level` group: means and the suggestion across traces),
    then one per trace of it (`level` trace; a missing trace's `moejax` says what it lacks)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_COLUMNS)
    for f in found:
        head = [f.group, f.claim]
        where = [f.queue, f.prefetch, f.capacity, f.h2d_gbps, f.measure, f.paper]
        w.writerow([*head, "group", "", *where, f.shown, f.suggestion,
                    json.dumps(f.structural, sort_keys=True), f.traces,
                    json.dumps(f.values, sort_keys=True, default=str)])
        lines = {t: (r.shown, r.suggestion, r.values) for t, r in f.per_trace.items()}
        if lines:
            lines.update({t: (f"missing: {why}", "missing", {}) for t, why in f.missing.items()})
        for t in sorted(lines):
            shown, suggestion, values = lines[t]
            w.writerow([*head, "trace", t, *where, shown, suggestion, "", "",
                        json.dumps(values, sort_keys=True, default=str)])
    return buf.getvalue()


PROG = "python -m moejax.analysis.claims"
DEFAULT_CAPACITY = "0.05"


def _capacity_arg(text: str) -> tuple:
    try:
        return parse_capacity(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = cli.ArgumentParser(prog=PROG,
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep_dir", action="append", required=True,
                    help="a sweep directory (repeat for several)")
    ap.add_argument("--capacity", default=None, type=_capacity_arg,
                    help="the capacity the claims are read at: a fraction (0.05), a "
                         "percentage (5%%) or N slots ('8slots'); claim 2 also at 1%% "
                         f"(default: {DEFAULT_CAPACITY})")
    ap.add_argument("--queue", default="all",
                    help="all, or one prefetch queue of the sweep (immediate, watchdog, ...)")
    ap.add_argument("--h2d_gbps", type=float, default=None,
                    help="bandwidth of the cells used (default: each group's lowest)")
    ap.add_argument("--format", default="markdown", choices=("markdown", "csv"))
    a = ap.parse_args(argv)
    return guarded(PROG, lambda: _main(a, argv))


def _main(a: argparse.Namespace, argv: list[str]) -> None:
    for d in a.sweep_dir:
        open_sweep(d)  # a directory with cells/, every results.json parses
    loaded = load(a.sweep_dir)
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
    sys.stdout.write(to_csv(found) if a.format == "csv"
                     else markdown(found, loaded.summary, loaded.rows, command))


if __name__ == "__main__":
    sys.exit(main())
