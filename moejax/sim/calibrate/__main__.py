"""`python -m moejax.sim.calibrate ...` runs `python -m moejax.calibration ...`."""

import sys

from moejax.calibration.calibrate import main

if __name__ == "__main__":
    sys.exit(main())
