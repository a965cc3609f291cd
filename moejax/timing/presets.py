"""A named profile with a user's overrides: what `hardware.get` and `storage.get` share."""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from moejax.errors import ConfigError

Profile = TypeVar("Profile")


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
