"""A claims table's rows: a claim (`Claim`: a stable id, what the source states, the metrics a
verdict reads, the rule in words), and one row's numbers — each trace's, with its verdict and
capacity, and the group's means over the traces that have every compared cell (`fill`). A
study brings its claims and the rules that describe each row (studies/<study>/, e.g.
studies/specmd/: the paper's numbers are the study's data, never the library's);
claims_output.py prints and records them."""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Callable, Iterable, Mapping

from moejax.analysis import verdicts as V
from moejax.analysis.claim_cells import at_capacity, capacity_passes, capacity_text, norm
from moejax.analysis.sweep_cells import mean
from moejax.errors import UsageError

NOT_IN_SWEEP = "not in this sweep"
WITHOUT_PREFETCH = "without prefetch"


@dataclasses.dataclass(frozen=True)
class Claim:
    """One claim: its stable id (claims.json, DESIGN), what the source states, the metrics
    the verdict reads, and the rule in words."""

    number: int
    id: str
    title: str
    metrics: str
    rule: str




@dataclasses.dataclass
class TraceResult:
    """One trace's numbers in a row, as text, its verdict and its condition."""

    values: dict
    shown: str
    verdict: V.Verdict | None = None  # None: a row with no rule
    condition: dict = dataclasses.field(default_factory=dict)  # slots, capacity_passes
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def suggestion(self) -> str:
        return self.verdict.word if self.verdict else ""


@dataclasses.dataclass
class Finding:
    group: str
    claim: int
    measure: str  # what moejax measured
    paper: str  # the source's number
    queue: str
    capacity: str
    prefetch: str = ""  # the condition's prefetch, as text ("without prefetch", "with ...")
    eviction: str = ""  # the eviction the row's number is about, where there is one
    claim_id: str = ""  # a stable id (the study's claims', or one a rule names apart)
    # The key of `values` the row's result rests on: where that is structural, so is the row.
    headline: str = ""
    shown: str = ""  # the group's means, as text
    suggestion: str = ""  # across the traces ("" where a row has no rule)
    values: dict = dataclasses.field(default_factory=dict)  # the group's means
    traces: int = 0  # traces in the means
    condition: dict = dataclasses.field(default_factory=dict)  # what every cell shares
    capacity_key: tuple = ()
    per_trace: dict[str, TraceResult] = dataclasses.field(default_factory=dict)
    missing: dict[str, str] = dataclasses.field(default_factory=dict)  # trace -> what it lacks
    # Key of `values` -> why it is zero on every trace by construction (`claims.Structural`).
    structural: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def h2d_gbps(self):
        return self.condition.get("h2d_gbps")


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


def ready_note(m: dict) -> str | None:
    """"ready hits below half of hits" where they are: most hits were transfers in flight,
    which buy little speed (printed beside every hit rate a trace's row holds)."""
    h, r = m.get("hit_rate"), m.get("ready_hit_rate")
    if h and r is not None and r < h / 2:
        return f"ready hits below half of hits ({pct(r)} of {pct(h)})"
    return None


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


# -- per trace and across traces ---------------------------------------------------------------
# A row's numbers from its raw numbers (configuration label -> field -> value, one trace's or
# the group's means) and the trace's condition: (values, shown, verdict or None); a "notes"
# list among the values goes to the trace's notes.
Describe = Callable[[dict, dict], tuple[dict, str, "V.Verdict | None"]]


@dataclasses.dataclass
class Group:
    """One trace group under one condition: what every row of it shares."""

    name: str
    model: str | None  # the paper's model column
    traces: list[str]  # the group's traces run under this condition
    has_scores: bool
    synthetic: bool
    condition: dict  # the named condition (`claim_cells.condition_of`) and `other`
    rows: list[dict]
    claims: Mapping[int, Claim] = dataclasses.field(default_factory=dict)  # the study's

    @property
    def queue(self) -> str:
        return str(self.condition.get("queue"))

    def finding(self, claim: int, cap: tuple, measure: str, paper: str, prefetch: str = "",
                claim_id: str = "", **more) -> Finding:
        return Finding(self.name, claim, measure, paper, self.queue, capacity_text(cap),
                       prefetch=prefetch, claim_id=claim_id or self.claims[claim].id,
                       condition=dict(self.condition), capacity_key=cap, **more)

    def trace_condition(self, cap: tuple, rows: list[dict]) -> dict[str, dict]:
        """trace -> its capacity at `cap`: slots, capacity in passes."""
        out = {}
        for r in at_capacity(rows, cap):
            ident = r["identity"]
            out.setdefault(r["trace"], {
                "slots": r["slots"],
                "capacity_passes": capacity_passes(r["slots"], ident),
                "pass_experts": ident.pass_experts})
        return out


def with_prefetch(spec: str) -> str:
    return WITHOUT_PREFETCH if norm(spec) == "none" else f"with {spec} prefetch"


def by_trace(configs: dict[str, list[dict]], fields: Iterable[str]) -> dict[str, dict]:
    """trace -> configuration label -> each field of the trace's cell of it (a trace without a
    cell of a configuration lacks its label). Cells of one condition are one per trace and
    configuration (`findings` splits every other difference): a repeat (a sweep read twice)
    must give the same numbers, or it is an error naming both cells — two runs of one
    configuration that disagree (sweeps of different code) are never averaged."""
    fields = tuple(fields)
    out: dict[str, dict] = collections.defaultdict(dict)
    for label, rows in configs.items():
        cells = collections.defaultdict(list)
        for r in rows:
            cells[r["trace"]].append(r)
        for trace, rs in cells.items():
            first = rs[0]
            for r in rs[1:]:
                differ = [f for f in fields if r.get(f) != first.get(f)]
                if differ:
                    raise UsageError(
                        f"{first['sweep']}/cells/{first['name']} and {r['sweep']}/cells/"
                        f"{r['name']} run one configuration with different {differ[0]}: give "
                        "the sweeps of one code version (their numbers are never averaged)")
            out[trace][label] = {f: first.get(f) for f in fields}
    return out


def _mean_raw(raws: list[dict]) -> dict:
    """The traces' raw numbers averaged, each label over the traces that have it."""
    out = {}
    for label in dict.fromkeys(k for raw in raws for k in raw):
        have = [raw[label] for raw in raws if label in raw]
        out[label] = {f: mean(h[f] for h in have) for f in have[0]}
    return out


def fill(f: Finding, g: Group, raw: dict, needed: Iterable[str], describe: Describe,
         conditions: dict[str, dict] | None = None) -> Finding:
    """`f`'s numbers: each trace's (`raw`: `by_trace`'s shape) where it has every `needed`
    label, else the trace is missing; the group's from the means over those traces."""
    needed = tuple(needed)
    conditions = conditions if conditions is not None else g.trace_condition(
        f.capacity_key, g.rows)
    complete = {}
    for t in g.traces:
        lacks = [k for k in needed if k not in raw.get(t, {})]
        if lacks or not raw.get(t):
            f.missing[t] = f"no {', '.join(lacks) or 'matching'} cells"
        else:
            complete[t] = raw[t]
    f.per_trace = {}
    for t, r in complete.items():
        cond = conditions.get(t, {})
        values, shown, verdict = describe(r, cond)
        notes = [n for n in (ready_note(values), *values.pop("notes", ())) if n]
        f.per_trace[t] = TraceResult(values, shown, verdict, cond, notes)
    if not complete:
        lacking = dict.fromkeys(k for k in needed if not any(k in r for r in raw.values()))
        f.shown = f"{NOT_IN_SWEEP} (no {', '.join(lacking) or 'matching'} cells)"
        f.suggestion = NOT_IN_SWEEP
        return f
    f.values, f.shown, _ = describe(_mean_raw(list(complete.values())), {})
    f.values.pop("notes", None)
    f.traces = len(complete)
    return f
