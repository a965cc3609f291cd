"""SpecMD's claims (and Fiddler's, where a sweep ran latency_aware) judged trace by trace, each
on every metric its source states, under conditions named in full.

    python -m studies.specmd.claims --sweep_dir=D [--sweep_dir=D2 ...] [--capacity=0.05]
        [--queue=all|immediate|watchdog|...] [--h2d_gbps=5] [--format=markdown|csv]
        [--json=PATH]
    python -m studies.specmd.claims --traces=GLOB [GLOB ...] --workdir=W [...]

The study: the paper's claims and numbers (studies/specmd/paper.py), the rules that read them
(rules.py) and the cells `--traces` runs (cells.py). The tool that judges them — cells by
their traces' own metadata, conditions never averaged, the verdict words, the table, CSV and
claims.json — is the library's (`moejax.analysis.claims`; docs/DESIGN.md, "Claims and their
verdicts"). Every run writes `claims.json` (one record per claim × trace × condition; a sweep
that ran latency_aware adds Fiddler's, studies/fiddler/claims.py) and prints its path.
"""

from __future__ import annotations

import sys

from moejax.analysis import claims as tool
from moejax.analysis.claim_cells import norm
from moejax.analysis.claim_rows import Finding
from moejax.analysis.sweep_cells import load_cells
from studies.fiddler import claims as fiddler_study
from studies.specmd import cells, paper, rules

PROG = "python -m studies.specmd.claims"
DEFAULT_CAPACITY = "0.05"


def fiddler(rows: list[dict], sweep_dirs: list[str]) -> list[dict]:
    """Fiddler's records (`studies.fiddler.claims.fiddler_records`: one per claim × baseline
    × trace × condition) of each sweep that ran latency_aware, Fiddler's per-expert choice;
    its tables are `python -m studies.fiddler.claims`'s."""
    out = []
    for d in sweep_dirs:
        if any(norm(r["miss"]).startswith("latency_aware") for r in rows if r["sweep"] == d):
            out += fiddler_study.fiddler_records(load_cells(d), d)
    return out


STUDY = tool.Study(
    prog=PROG,
    description=__doc__.split("\n\n")[0],
    title="SpecMD's claims vs moejax",
    claims=paper.CLAIMS,
    rules=rules.rows,
    plan=cells.PLAN,
    structural=rules.STRUCTURAL,
    notes=("Miss policies: replay measures speed only. The quality cost of dropping or "
           "substituting an expert (or serving a lower precision) changes the model's "
           "output, which a replayed trace cannot see: those claims are not measured here.",),
    default_capacity=DEFAULT_CAPACITY,
    capacity_help="; claim 2 also at 1%%",
    more_records=fiddler,
)


def findings(rows: list[dict], capacity=DEFAULT_CAPACITY, queue: str = "all",
             h2d_gbps: float | None = None) -> list[Finding]:
    """Every claim's rows per trace group and condition, at `capacity` (a fraction, or
    "N slots"; claim 2 also at 1%), at `h2d_gbps` (None: every bandwidth, each apart)."""
    return tool.findings(STUDY, rows, capacity, queue, h2d_gbps)


def markdown(found: list[Finding], summary: list[str], rows: list[dict],
             command: str = "") -> str:
    """SpecMD's claims table (`claims_output.markdown` with the study's claims and notes)."""
    return tool.markdown(STUDY, found, summary, rows, command)


def main(argv: list[str] | None = None) -> int:
    return tool.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
