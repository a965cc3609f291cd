"""A study's findings as a markdown table, CSV, and claims.json: one record per claim ×
trace × condition, the machine-readable form other tools read (docs/DESIGN.md, "Claims and
their verdicts"). The claims (their ids, titles and rules) and the table's title are the
study's, passed in: nothing here is any paper's."""

from __future__ import annotations

import collections
import csv
import io
import json
import math
import os
from typing import Iterable, Mapping

from moejax.analysis import verdicts as V
from moejax.analysis.claim_rows import Claim, Finding
from moejax.results import write_json_atomic

# claims.json's condition fields, in this order (`condition` of a record).
CONDITION_FIELDS = ("queue", "prefetch", "capacity_frac", "capacity_of", "slots",
                    "capacity_passes", "precision", "h2d_gbps", "hardware", "request_tokens",
                    "prefill_tokens")
JSON_NAME = "claims.json"


def _is_verdict(word: str) -> bool:
    return V.first_word(word) in V.WORDS


def prefetch_spec(text: str) -> str:
    """A row's prefetch as a spec: "without prefetch" -> none, "with X prefetch" -> X; a
    row's description otherwise ("the preset's prefetch")."""
    if text == "without prefetch":
        return "none"
    if text.startswith("with ") and text.endswith(" prefetch"):
        return text[len("with "):-len(" prefetch")]
    return text


def condition_record(f: Finding, per_trace: dict) -> dict:
    """A record's condition: the row's (shared by its cells) and the trace's capacity."""
    c = f.condition
    prefetch = prefetch_spec(f.prefetch)
    out = {"queue": c.get("queue"), "prefetch": prefetch,
           # The share configured (of `capacity_of`), not the share of experts it came to.
           "capacity_frac": f.capacity_key[1] if f.capacity_key and f.capacity_key[0] == 0
           else None,
           "capacity_of": c.get("capacity_of"), "slots": per_trace.get("slots"),
           "capacity_passes": per_trace.get("capacity_passes"),
           "precision": c.get("precision"), "h2d_gbps": c.get("h2d_gbps"),
           "hardware": c.get("hardware"), "request_tokens": c.get("request_tokens"),
           "prefill_tokens": c.get("prefill_tokens")}
    if c.get("other"):
        out["other"] = c["other"]
    return out


def records(found: list[Finding]) -> list[dict]:
    """One record per claim × trace × condition with a verdict (rows that only show numbers,
    such as the oracle's ceiling or each Least-Stale order's, have `verdict` null), and one
    per trace a row lacks cells for ("not testable (no ... cells)")."""
    out = []
    for f in found:
        for t in sorted(f.per_trace):
            r = f.per_trace[t]
            v = r.verdict
            word = v.word if v is not None and _is_verdict(v.word) else None
            out.append({"claim": f.claim_id, "trace": t, "group": f.group,
                        "measure": f.measure, "source": f.paper, "eviction": f.eviction,
                        "condition": condition_record(f, r.condition),
                        "metrics": r.values, "verdict": word,
                        "failing_metric": v.failing_metric if word else None,
                        "rule": v.rule if v is not None else "", "notes": r.notes})
        for t in sorted(f.missing):
            out.append({"claim": f.claim_id, "trace": t, "group": f.group,
                        "measure": f.measure, "source": f.paper, "eviction": f.eviction,
                        "condition": condition_record(f, {}), "metrics": {},
                        "verdict": f"{V.NOT_TESTABLE} ({f.missing[t]})",
                        "failing_metric": None, "rule": f.missing[t], "notes": []})
    return out


def default_json(sweep_dir: str) -> str:
    return os.path.join(sweep_dir, JSON_NAME)


def write_json(found: list[Finding], path: str, command: str,
               more: list[dict] = (), *, claims: Mapping[int, Claim]) -> str:
    """claims.json at `path` (written whole or not at all): {"command", "claims": the study's
    claim ids with what they state, "verdict_words", "records": the findings' (`records`) and
    `more` (another source's records in the same schema, e.g. the Fiddler study's, which add
    "baseline")}."""
    stated = [{"id": c.id, "number": c.number, "title": c.title, "metrics": c.metrics,
               "rule": c.rule} for c in claims.values()]
    write_json_atomic(path, _finite({"command": command, "claims": stated,
                                     "verdict_words": list(V.WORDS),
                                     "records": records(found) + list(more)}))
    return path


def _finite(obj):
    """`obj` with every non-finite float as the string "inf", "-inf" or "nan": JSON has no
    such numbers (Python would write `Infinity`, which other readers refuse), and a factor
    LRU ÷ LS is infinite wherever Least-Stale has no collision miss."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


# -- markdown --------------------------------------------------------------------------------
def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def _span(values) -> str:
    vals = sorted({v for v in values if v is not None})
    if not vals:
        return "?"
    fmt = (lambda x: f"{x:.3g}") if isinstance(vals[0], float) else str
    return fmt(vals[0]) if len(vals) == 1 else f"{fmt(vals[0])}–{fmt(vals[-1])}"


def condition(f: Finding) -> str:
    """`immediate queue · without prefetch · 5% of the model (39 slots, 0.3 passes) · int4 ·
    5 GB/s · a100_specmd · requests 128/32`."""
    c = f.condition
    conds = [r.condition for r in f.per_trace.values()]
    slots = _span(x.get("slots") for x in conds)
    passes = _span(x.get("capacity_passes") for x in conds)
    of = f" of the {c['capacity_of']}" if c.get("capacity_of") else ""
    cap = f.capacity + of + (f" ({slots} slots, {passes} passes)" if conds else "")
    bw = "? GB/s" if c.get("h2d_gbps") is None else f"{c['h2d_gbps']:g} GB/s"
    cut = (f"requests {c['request_tokens']}/{c.get('prefill_tokens') or 0}"
           if c.get("request_tokens") else "the trace as recorded")
    other = ", ".join(f"{k}={v}" for k, v in (c.get("other") or {}).items())
    parts = (f"{c.get('queue')} queue", f.prefetch, cap, c.get("precision") or "native",
             bw, c.get("hardware") or "?", cut, other)
    return " · ".join(str(x) for x in parts if x)


def verdict_text(f: Finding) -> str:
    """The row's word, then its other values that are zero by construction."""
    notes = [f"structural: {why}" for k, why in f.structural.items() if k != f.headline]
    return " · ".join(x for x in (f.suggestion, *notes) if x)


def _trace_line(r) -> tuple[str, str]:
    c = r.condition
    cap = ""
    if c.get("slots") is not None:
        passes = c.get("capacity_passes")
        cap = f" [{c['slots']} slots" + (f", {passes:.2g} passes]" if passes else "]")
    word = r.suggestion
    if r.verdict is not None and r.verdict.word.startswith(V.STRUCTURAL):
        word += f": {r.verdict.rule}"
    return r.shown + cap, " · ".join(x for x in (word, *r.notes) if x)


def _table_lines(fs: list[Finding], claims: Mapping[int, Claim]) -> list[str]:
    head = ["#", "claim", "condition", "measured", "source", "moejax", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * len(head)) + " |"]
    last = None
    for f in fs:
        mean_of = f"mean of {f.traces}: " if f.traces > 1 else ""
        claim = claims[f.claim]
        cells = [str(f.claim) if f.claim != last else "",
                 f"{claim.title} (`{f.claim_id}`)" if f.claim != last else "",
                 condition(f), f.measure, f.paper, mean_of + f.shown, verdict_text(f)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        subs = {t: _trace_line(r) for t, r in f.per_trace.items()}
        if subs:
            subs.update({t: (f"missing: {why}", "missing") for t, why in f.missing.items()})
        for t in sorted(subs):
            cells = ["", "", "", f"↳ {t}", "", *subs[t]]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        last = f.claim
    return lines


def _group_line(name: str, traces: list[str], synthetic: bool) -> str:
    kind = "synthetic (random weights: architecture only)" if synthetic else ""
    n = f"{len(traces)} {kind + ' ' if kind else ''}trace{'s' * (len(traces) != 1)}"
    return f"{n}: {', '.join(traces)}"


def markdown(found: list[Finding], summary: list[str], rows: list[dict],
             command: str = "", *, claims: Mapping[int, Claim], title: str,
             notes: Iterable[str] = ()) -> str:
    """The table: `title` (the study's heading), the sweeps' `summary`, one section per trace
    group in `claims`' order, the claims and their rules, the verdict words, then the study's
    `notes` (paragraphs) and the command that produced it."""
    lines = [f"# {title}", ""]
    lines += [f"* {s}" for s in summary]
    lines += ["", "Each claim is judged on every metric its source states; a trace's verdict "
              "is their conjunction (\"refuted on hit rate\" names the metric that goes the "
              "other way). Each row's first line is the group's mean over its traces that "
              "have every compared cell, under the row's condition (cells of different "
              "conditions are never averaged); the ↳ lines are each trace's own numbers, its "
              "capacity in slots and in passes (slots ÷ layers × top-k), and its verdict. "
              "Rates are of requests; hit rates are ready + late, shown apart. A group's word "
              "needs every trace (\"mixed\" lists each word's count). \"structural\": equal "
              "or zero by construction under the row's condition, with the rule that makes "
              "it so: no finding.", ""]
    by_group = collections.defaultdict(list)
    for f in found:
        by_group[f.group].append(f)
    traces, synthetic = collections.defaultdict(set), collections.defaultdict(bool)
    for r in rows:
        traces[r["group"]].add(r["trace"])
        synthetic[r["group"]] |= bool(r.get("synthetic"))
    order = {c: i for i, c in enumerate(claims)}
    for g, fs in by_group.items():
        lines += [f"## {g}", "", _group_line(g, sorted(traces[g]), synthetic[g]), ""]
        fs = sorted(fs, key=lambda f: order[f.claim])  # stable: conditions keep their order
        lines += [*_table_lines(fs, claims), ""]
    if not found:
        lines += ["No finished cells.", ""]
    lines += ["## The claims and their rules", ""]
    lines += [f"* {c.number} `{c.id}` — {c.title}: reads {c.metrics}. {c.rule}."
              for c in claims.values()]
    lines += ["", f"Verdict words (docs/DESIGN.md): {', '.join(V.WORDS)}; \"mixed\" across "
              f"traces. Ties: rates within {V.RATE_NOISE_SE:g} binomial standard errors over "
              "the trace's requests, modelled times within a relative 1e-9."]
    for note in notes:
        lines += ["", note]
    lines += [""]
    if command:
        lines += [f"Produced by: `{command}`", ""]
    return "\n".join(lines)


CSV_COLUMNS = ("group", "claim", "claim_id", "level", "trace", "condition", "measure", "paper",
               "moejax", "verdict", "failing_metric", "structural", "traces", "values")


def to_csv(found: list[Finding]) -> str:
    """One line per row for the group (`level` group: means and the word across traces),
    then one per trace of it (`level` trace; a missing trace's `moejax` says what it lacks)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_COLUMNS)
    for f in found:
        head = [f.group, f.claim, f.claim_id]
        where = [f.measure, f.paper]
        cond = condition(f)
        w.writerow([*head, "group", "", cond, *where, f.shown, f.suggestion, "",
                    json.dumps(f.structural, sort_keys=True), f.traces,
                    json.dumps(f.values, sort_keys=True, default=str)])
        lines = {t: (r.shown, r.suggestion, r.verdict.failing_metric if r.verdict else "",
                     r.values) for t, r in f.per_trace.items()}
        if lines:
            lines.update({t: (f"missing: {why}", "missing", "", {})
                          for t, why in f.missing.items()})
        for t in sorted(lines):
            shown, word, failing, values = lines[t]
            w.writerow([*head, "trace", t, cond, *where, shown, word, failing or "", "", "",
                        json.dumps(values, sort_keys=True, default=str)])
    return buf.getvalue()
