"""The claims tool: a study's claims judged trace by trace, each on every metric its source
states, under conditions named in full. The study (`Study`: its claims, the rules that read
them, its numbers) lives outside the library, in studies/<study>/ — SpecMD's is
`python -m studies.specmd.claims`; this module is what any study's command runs (`main`).

    python -m studies.<study>.claims --sweep_dir=D [--sweep_dir=D2 ...] [--capacity=0.05]
        [--queue=all|immediate|watchdog|...] [--h2d_gbps=5] [--format=markdown|csv]
        [--json=PATH]
    python -m studies.<study>.claims --traces=GLOB [GLOB ...] --workdir=W [...]

A claim is its whole statement (`claim_rows.Claim`: a stable id, what the source states,
which metrics): each trace's verdict is the conjunction of every stated metric
(`verdicts.judge`), "refuted on hit rate" naming the metric that fails. The words are defined
once (moejax/analysis/verdicts.py; docs/DESIGN.md, "Claims and their verdicts"), a group's
word needs every trace ("mixed" otherwise, never headed by one side).

Cells come from `claim_cells.load`: traces grouped by their own metadata (model, layers,
experts, top-k), and cells of different conditions (queue, capacity, precision, bandwidth,
hardware, request cut, any other differing field) never averaged: each condition is its own
`claim_rows.Group`, whose rows the study's rules read. Rates are of requests; hit rates are
ready + late, always shown apart.

Structural results (`Structural`): a number zero by construction under a row's condition is
labelled "structural" with the rule, never a finding (`conclude`).

`--traces` runs the study's cells (`claims_run`, the study's `Plan`) on any importable traces
without a grid config, into `--workdir`. Every run writes `claims.json`
(`claims_output.records`: one record per claim × trace × condition, and the study's
`more_records`) and prints its path.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import shlex
import sys
from typing import Callable, Iterable, Mapping

from moejax import cli
from moejax.analysis import claims_output, claims_run
from moejax.analysis import verdicts as V
from moejax.analysis.claim_cells import (
    at_capacity,
    capacity_text,
    conditions,
    load,
    parse_capacity,
    queue_order,
)
from moejax.analysis.claim_rows import Claim, Finding, Group
from moejax.analysis.sweep_cells import open_sweep
from moejax.cli import UsageError, guarded


@dataclasses.dataclass(frozen=True)
class Structural:
    """A value that is zero by construction under a condition, and why."""

    claim: int
    key: str  # of `Finding.values` and each `TraceResult.values`
    label: str  # what the table calls it
    applies: Callable[[Finding], bool]
    reason: str


@dataclasses.dataclass(frozen=True)
class Study:
    """What a study brings to the claims tool; the library holds none of it."""

    prog: str  # its command ("python -m studies.specmd.claims"): errors, "Produced by"
    description: str  # the command's one-line help
    title: str  # the table's heading
    claims: Mapping[int, Claim]  # in the order the table lists them
    # Every row of one trace group under one condition (`Group`) at a capacity key.
    rules: Callable[[Group, tuple], Iterable[Finding]]
    plan: claims_run.Plan  # the cells `--traces` runs
    structural: tuple[Structural, ...] = ()
    notes: tuple[str, ...] = ()  # paragraphs the markdown ends with
    default_capacity: str = "0.05"
    capacity_help: str = ""  # appended to --capacity's help
    # claims.json records of another source in the same schema: (rows, sweep dirs) -> records.
    more_records: Callable[[list[dict], list[str]], list[dict]] | None = None


HIT_FIELDS = ("hit_rate", "ready_hit_rate", "late_hit_rate")
# What every comparison of policies reads: collisions, hits and speed.
COMPARED = ("collision_miss_rate", *HIT_FIELDS, "requests", "ttft_s", "warm_ttft_s",
            "decode_s", "decode_tok_per_s", "stall_s")


def speed_checks(claimed: dict, base: dict) -> list[V.Check]:
    """The speed a policy comparison states: the warm TTFT (requests after the first) where
    the cells have one; else the decode time per token — a first request's TTFT is a cold
    prefill, which finds an empty cache whatever the eviction, so it cannot tell two
    evictions apart."""
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
    """Collisions, hit rate and speed of `claimed` against `base`."""
    return [rate_check("collisions", "collision_miss_rate", claimed, base, True),
            rate_check("hit rate", "hit_rate", claimed, base, False),
            *speed_checks(claimed, base)]


def speed_text(m: dict) -> str:
    if m.get("warm_ttft_s") is not None:
        return f"warm TTFT {m['warm_ttft_s'] * 1e3:.4g} ms"
    s = m.get("decode_tok_per_s")
    return "decode –" if not s else f"decode {1e3 / s:.4g} ms/token"


def label_structural(f: Finding, structural: Iterable[Structural]) -> None:
    """Marks each of `f`'s values that `structural` explains and that is exactly zero on every
    trace with numbers."""
    for s in structural:
        if (s.claim == f.claim and f.per_trace and s.applies(f)
                and all(r.values.get(s.key) == 0 for r in f.per_trace.values())):
            f.structural[s.key] = f"{s.label} 0 on every trace ({s.reason})"


def conclude(f: Finding, g: Group, structural: Iterable[Structural] = ()) -> None:
    """`f`'s word across its traces (`verdicts.across`), or "structural" where its headline
    number is zero by construction on every trace."""
    label_structural(f, structural)
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


def _has_scores(rows: list[dict]) -> bool:
    return any(r.get("has_scores") is not False for r in rows) if rows else True


def findings(study: Study, rows: list[dict], capacity=None, queue: str = "all",
             h2d_gbps: float | None = None) -> list[Finding]:
    """Every claim's rows per trace group and condition, at `capacity` (a fraction, or
    "N slots"; the study's default when None), at `h2d_gbps` (None: every bandwidth, each
    apart)."""
    capacity = study.default_capacity if capacity is None else capacity
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
                      _has_scores(crows), any(r["synthetic"] for r in crows), cond, crows,
                      claims=study.claims)
            for f in study.rules(g, cap):
                conclude(f, g, study.structural)
                out.append(f)
    return out


def markdown(study: Study, found: list[Finding], summary: list[str], rows: list[dict],
             command: str = "") -> str:
    """The study's table (`claims_output.markdown` with its claims, title and notes)."""
    return claims_output.markdown(found, summary, rows, command, claims=study.claims,
                                  title=study.title, notes=study.notes)


# -- the command -----------------------------------------------------------------------------
def _capacity_arg(text: str) -> tuple:
    try:
        return parse_capacity(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(study: Study, argv: list[str] | None = None) -> int:
    """The study's command: its claims over `--sweep_dir`s, or over `--traces` it runs."""
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = cli.ArgumentParser(prog=study.prog, description=study.description)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--sweep_dir", action="append",
                     help="a sweep directory (repeat for several)")
    src.add_argument("--traces", nargs="+", metavar="GLOB",
                     help="trace files (globs; any importable format): run the claims' "
                          "cells on them into --workdir, then judge")
    ap.add_argument("--capacity", default=None, type=_capacity_arg,
                    help="the capacity the claims are read at: a fraction (0.05), a "
                         "percentage (5%%) or N slots ('8slots')" + study.capacity_help
                         + f" (default: {study.default_capacity})")
    ap.add_argument("--queue", default="all",
                    help="all, or one prefetch queue of the sweep (immediate, watchdog, ...)")
    ap.add_argument("--h2d_gbps", type=float, default=None,
                    help="bandwidth of the cells read (default: every bandwidth, apart)")
    ap.add_argument("--format", default="markdown", choices=("markdown", "csv"))
    ap.add_argument("--json", default=None, metavar="PATH",
                    help="where claims.json goes (default: beside the first sweep, or in "
                         "--workdir)")
    claims_run.add_arguments(ap, study.plan.defaults)
    a = ap.parse_args(argv)
    return guarded(study.prog, lambda: _main(study, a, argv))


def _main(study: Study, a: argparse.Namespace, argv: list[str]) -> None:
    if a.traces:
        sweep_dirs = [claims_run.run(a, study.plan)]
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
    # A capacity typed that no cell has is a mistake; the default (the study's) is read
    # whatever the sweep holds: its rows then say "not in this sweep".
    given = a.capacity is not None
    a.capacity = a.capacity or parse_capacity(study.default_capacity)
    if given and not at_capacity(loaded.rows, a.capacity):
        caps = sorted({tuple(r["capacity_key"]) for r in loaded.rows})
        raise UsageError(f"--capacity={capacity_text(a.capacity)}: no cell at that capacity; "
                         f"the sweep's: {', '.join(capacity_text(c) for c in caps)}")
    bws = sorted({float(r["h2d_gbps"]) for r in loaded.rows if r["h2d_gbps"] is not None})
    if a.h2d_gbps is not None and not any(math.isclose(a.h2d_gbps, b) for b in bws):
        raise UsageError(f"--h2d_gbps={a.h2d_gbps:g}: no cell at that bandwidth; the sweep's: "
                         f"{', '.join(f'{b:g}' for b in bws) or 'none recorded'} GB/s")
    found = findings(study, loaded.rows, a.capacity, a.queue, a.h2d_gbps)
    command = shlex.join([*shlex.split(study.prog), *argv])
    path = a.json or claims_output.default_json(sweep_dirs[0])
    try:
        more = study.more_records(loaded.rows, sweep_dirs) if study.more_records else []
        claims_output.write_json(found, path, command, more, claims=study.claims)
    except OSError as e:  # nothing was written: the temporary file is removed
        raise UsageError(f"--json={path}: cannot be written ({e.strerror})") from None
    sys.stdout.write(claims_output.to_csv(found) if a.format == "csv"
                     else markdown(study, found, loaded.summary, loaded.rows, command))
    print(f"claims.json ({len(claims_output.records(found))} records) -> {path}",
          file=sys.stderr)


if __name__ == "__main__":
    sys.exit("moejax.analysis.claims is the claims tool's library, not a study: run a "
             "study's command, e.g. python -m studies.specmd.claims --sweep_dir=D "
             "(studies/README.md)")
