"""The old name of `moejax.calibration`, kept only so that scripts outside the project still run:
`python -m moejax.sim.calibrate` is `python -m moejax.calibration` and `python -m
moejax.sim.validate` is `python -m moejax.calibration.validate` (same flags, same output).
Nothing inside moejax imports this package (`tests/test_package_layout.py`); new code and docs
name `moejax.calibration`."""

import importlib

__all__ = ["calibrate", "validate"]


def __getattr__(name: str):
    """The two aliases load when first used, not with the package: `python -m
    moejax.sim.calibrate` imports only what it runs."""
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
