"""Calibration: this machine measured, and the virtual clock checked against it.
`python -m moejax.sim.calibrate --workdir=W` (`calibrate.py`) times host->device transfers by
size and the model's compiled steps (`measure.py`), fits the virtual clock's transfer and
roofline models to them (`fit.py`), writes the profile they give as `W/hardware.json`
(`profile.py`; a run uses it with `--config.hardware.file`) with the host CPU's own profile
(`host.py`: one expert computed on the host, the host latency model fitted), and runs live cells on the wall
clock next to the virtual clock's prediction of each (`cells.py`)."""

import importlib

__all__ = ["calibrate", "cells", "fit", "host", "measure", "profile"]


def __getattr__(name: str):
    """The submodules load when first used, not with the package: `python -m
    moejax.sim.calibrate` must not find its module already imported (runpy warns that it "may
    result in unpredictable behaviour"), and the fits need no JAX."""
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
