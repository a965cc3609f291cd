"""Reading results: a sweep's cells (`sweep_cells.py`) and what is made of them — the
SpecMD-style report and figures (`report.py`, `report_figures.py`; `python -m
moejax.analysis.report`), the claims tool a study runs to judge its claims trace by trace
(`claims.py`: the cells it reads in `claim_cells.py`, its rows in `claim_rows.py`, the verdict
words in `verdicts.py`, its table and claims.json in `claims_output.py`, `--traces` in
`claims_run.py`; the studies — SpecMD's, Fiddler's, their numbers — are studies/, which
nothing here imports), a host-compute sweep's tables (`host_compute.py`), policy tables
(`compare.py`), the quality–speed frontier (`frontier.py`), the disk tier's tables
(`disk_tier.py`) — and routing statistics of traces (`routing_stats.py`)."""

import importlib

__all__ = ["claims", "compare", "frontier", "routing_stats", "sweep_cells"]


def __getattr__(name: str):
    """The submodules load when first used, not with the package: `python -m
    moejax.analysis.compare` (or any of them) must not find its module already imported (runpy
    warns that it "may result in unpredictable behaviour")."""
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
