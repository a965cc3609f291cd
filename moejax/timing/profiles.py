"""A named profile with a user's overrides: what `hardware.get`, `storage.get` and `host.get`
share; and a measured profile read from a hardware.json (`hardware.from_file`,
`host.from_file`)."""

from __future__ import annotations

import dataclasses
import json
import numbers
from typing import TypeVar

from moejax.errors import ConfigError

Profile = TypeVar("Profile")


def _finite(v) -> bool:
    return v - v == 0  # False for inf and nan


# A field's rule: (type, the test its value passes, what that is in words). An infinite
# bandwidth or latency describes no machine: its transfers would take no time (or forever) and
# every number derived from them would be meaningless.
POSITIVE = (numbers.Real, lambda v: _finite(v) and v > 0, "a finite number > 0")
NON_NEGATIVE = (numbers.Real, lambda v: _finite(v) and v >= 0, "a finite number >= 0")
AT_LEAST_ONE = (numbers.Integral, lambda v: v >= 1, "an integer >= 1")


def check_fields(profile, group: str, rules: dict, unset: tuple[str, ...] = ()) -> None:
    """Each field of `profile` named in `rules` of its rule's type and passing its test, else
    a ConfigError naming `group.field`; a field in `unset` may be None (a value derived from
    the others)."""
    for field, (kind, ok, what) in rules.items():
        v = getattr(profile, field)
        if v is None and field in unset:
            continue
        if isinstance(v, bool) or not isinstance(v, kind):
            noun = "an integer" if kind is numbers.Integral else "a number"
            raise ConfigError(f"{group}.{field}={v!r} must be {noun}")
        if not ok(v):  # `not (v > 0)`: nan fails too
            raise ConfigError(f"{group}.{field}={v} must be {what}")


def with_overrides(group: str, presets: dict[str, Profile], name: str, overrides: dict,
                   overridable: tuple[str, ...]) -> Profile:
    """Preset `name` of config group `group` with `overrides` applied: a None override keeps
    the preset's value, any other value (0 included) replaces it; the result is validated
    (errors name the field)."""
    if name not in presets:
        raise ConfigError(f"{group}.preset={name!r} is not one of {sorted(presets)}")
    unknown = sorted(set(overrides) - set(overridable))
    if unknown:
        raise ConfigError(f"{group}: no field {unknown[0]!r}; overridable: {list(overridable)}")
    profile = dataclasses.replace(presets[name],
                                  **{k: v for k, v in overrides.items() if v is not None})
    profile.validate()
    return profile


def read_json(path: str, where: str):
    """The JSON document at `path` (a hardware.json); a missing, unreadable or non-JSON file
    is a `ConfigError` starting with `where` (the config field that named it)."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file (python -m moejax.calibration "
                          "--workdir=W writes W/hardware.json)") from None
    except IsADirectoryError:
        raise ConfigError(f"{where} is a directory; name its hardware.json") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: cannot be read ({getattr(e, 'strerror', None) or e})"
                          ) from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{where} is not JSON ({e})") from None


def measured_profile(cls: type[Profile], profile, group: str, fields: tuple[str, ...],
                     overrides: dict, overridable: tuple[str, ...], where: str,
                     what: str) -> Profile:
    """`profile` (a hardware.json's object `what`, every one of `fields`) as a `cls`, checked,
    with `overrides` applied as to a preset. A missing or unknown field, a bad name and a value
    out of range are `ConfigError`s starting with `where`; a given override's own error names
    the override."""
    if not isinstance(profile, dict):
        raise ConfigError(f"{where} has no {what} object (python -m moejax.calibration "
                          f"writes one with the fields {list(fields)})")
    missing = [k for k in fields if k not in profile]
    if missing:
        raise ConfigError(f"{where}: its {what} object has no field {missing[0]!r} "
                          f"(it takes {list(fields)})")
    unknown = sorted(set(profile) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: its {what} object has a field {unknown[0]!r} "
                          f"that no profile has (it takes {list(fields)})")
    if not isinstance(profile["name"], str) or not profile["name"]:
        raise ConfigError(f"{where}: its {what} profile's name={profile['name']!r} must be a "
                          "non-empty string")
    measured = cls(**profile)
    try:
        measured.validate()
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    return with_overrides(group, {measured.name: measured}, measured.name, overrides,
                          overridable)
