"""`python -m moejax.calibration --workdir=W [--quick] [--host-only] ...`: the calibration
(`moejax.calibration.calibrate`), this machine measured into `W/hardware.json`."""

import sys

from moejax.calibration.calibrate import main

if __name__ == "__main__":
    sys.exit(main())
