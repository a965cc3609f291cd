"""Reading results: a sweep's cells (`sweep_cells.py`) and what is made of them — the
SpecMD-style report and figures (`report.py`, `report_figures.py`; `python -m
moejax.analysis.report`), SpecMD's claims one by one (`claims.py`), policy tables
(`compare.py`), the quality–speed frontier (`frontier.py`), the disk tier's tables
(`disk_tier.py`) — and routing statistics of traces (`routing_stats.py`)."""

from moejax.analysis import claims, compare, frontier, routing_stats, sweep_cells

__all__ = ["claims", "compare", "frontier", "routing_stats", "sweep_cells"]
