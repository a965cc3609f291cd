"""Calibration: this machine measured, and the virtual clock checked against it.

`python -m moejax.calibration --workdir=W` (`calibrate.py`; `__main__.py` runs it) times
host->device transfers by size and the model's compiled steps (`measure.py`), fits the virtual
clock's transfer and roofline models to them (`fit.py`), writes the profile they give as
`W/hardware.json` (`profile.py`; a run uses it with `--config.hardware.file`) with the host
CPU's own profile (`host_cpu.py`: one expert computed on the host, the host latency model
fitted), the step tables of the live runtime's compiled steps (`steps.py`) and its host work
fitted to live cells (`host_fit.py`, the cells of `matrix.py`, run by `cells.py`).
`python -m moejax.calibration.validate` checks the virtual clock against live cells it was not
fitted to (`validate.py`; the statistics, rankings and plot in `agreement.py`).

`python -m moejax.sim.calibrate` and `python -m moejax.sim.validate` (the package's old name,
`moejax/sim/`) still run the same two commands, for scripts outside the project."""

import importlib

__all__ = ["agreement", "calibrate", "cells", "fit", "host_cpu", "host_fit", "matrix", "measure",
           "profile", "steps", "validate"]


def __getattr__(name: str):
    """The submodules load when first used, not with the package: `python -m
    moejax.calibration.validate` must not find its module already imported (runpy warns that it
    "may result in unpredictable behaviour"), and the fits need no JAX."""
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
