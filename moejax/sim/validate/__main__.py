"""`python -m moejax.sim.validate ...` runs `python -m moejax.calibration.validate ...`."""

import sys

from moejax.calibration.validate import main

if __name__ == "__main__":
    sys.exit(main())
