"""`python -m moejax.sim.calibrate`: the old name of `python -m moejax.calibration`, kept for
scripts outside the project. A package, so that the file that runs is `__main__.py` and no
module of moejax shares its name with `moejax/calibration/calibrate.py`."""

from moejax.calibration.calibrate import main

__all__ = ["main"]
