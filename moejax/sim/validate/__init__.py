"""`python -m moejax.sim.validate`: the old name of `python -m moejax.calibration.validate`, kept
for scripts outside the project. A package, so that the file that runs is `__main__.py` and no
module of moejax shares its name with `moejax/calibration/validate.py`."""

from moejax.calibration.validate import main

__all__ = ["main"]
