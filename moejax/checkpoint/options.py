"""Validation of the checkpoint-writing options a user gives (`python -m moejax.convert`'s
flags, `save`'s arguments): each bad value is a `ConfigError` naming the flag and what it takes.
"""

from __future__ import annotations

import numpy as np

from moejax.checkpoint.meta import LAYOUTS
from moejax.errors import ConfigError
from moejax.quant import CALIBRATIONS, QUANTIZED, check_calibration


def parse_precisions(precisions, what: str = "--precisions") -> tuple[str, ...]:
    """`"int8,int4"` (or a sequence) -> `("int8", "int4")`: quantized precisions, no repeats,
    in the order of `formats.PRECISIONS`."""
    if precisions is None:
        return ()
    items = [p.strip() for p in precisions.split(",")] if isinstance(precisions, str) \
        else [str(p) for p in precisions]
    items = [p for p in items if p]
    bad = [p for p in items if p not in QUANTIZED]
    if bad:
        raise ConfigError(f"{what}={precisions!r}: {bad} not quantized precisions; expected a "
                          f"comma-separated subset of {QUANTIZED}")
    if len(set(items)) != len(items):
        raise ConfigError(f"{what}={precisions!r} repeats a precision")
    return tuple(p for p in QUANTIZED if p in items)


def resolve_calibrations(precisions: tuple[str, ...], calibration,
                         what: str = "--calibration") -> dict[str, str]:
    """The calibration of each precision: `calibration` is None (each precision's default), one
    name for all, `"int4=hqq,int2=search"`, or a dict."""
    if isinstance(calibration, str) and "=" in calibration:
        d = {}
        for item in calibration.split(","):
            p, _, c = item.partition("=")
            if not c:
                raise ConfigError(f"{what}={calibration!r}: expected NAME or "
                                  "PRECISION=NAME,... e.g. 'int2=search'")
            d[p.strip()] = c.strip()
        calibration = d
    if isinstance(calibration, dict):
        extra = sorted(set(calibration) - set(precisions))
        if extra:
            raise ConfigError(f"{what}: calibration given for {extra}, which are not among the "
                              f"precisions written {list(precisions)}")
        return {p: check_calibration(p, calibration.get(p), what) for p in precisions}
    if calibration is not None and calibration not in CALIBRATIONS:
        raise ConfigError(f"{what}={calibration!r} is not one of {CALIBRATIONS}")
    return {p: check_calibration(p, calibration, what) for p in precisions}


def check_group_size(group_size, what: str = "--group_size") -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) \
            or group_size < 1:
        raise ConfigError(f"{what}={group_size!r} must be a positive integer")
    return int(group_size)


def check_expert_layout(expert_layout, compression=None, what: str = "--layout") -> str:
    """`expert_layout` validated (ConfigError naming `what`); the packed layout stores raw bytes,
    so it takes no compression."""
    if expert_layout not in LAYOUTS:
        raise ConfigError(f"{what}={expert_layout!r} is not one of {LAYOUTS}")
    if expert_layout == "packed" and compression is not None:
        raise ConfigError(f"{what}=packed stores raw bytes: compression={compression!r} applies "
                          "to the zarr layout only")
    return expert_layout
