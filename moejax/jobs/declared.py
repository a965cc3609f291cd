"""Every field a config holds is one its job declares (`moejax/jobs/schema.py`), whatever set
it: a config file, a grid's base config, a sweep cell or the command line. The command line
and sweep cells set fields on a locked config, which refuses an undeclared name; a config
file builds its ConfigDict unlocked, so a misspelled field or section
(`c.cache.capacity_fraction = 0.1`, `c.polices = ...`) would be added beside the real one and
the default would run. `check_declared` walks the config against the schema before anything
loads: an undeclared field or section is a ConfigError naming it and the closest declared
name, a value of the wrong kind names the field and what it takes.

The train job builds its own config (`configs/train_small.py`): it is checked against nothing
here."""

from __future__ import annotations

import difflib

import ml_collections

from moejax.errors import ConfigError


def _kind(schema: ml_collections.ConfigDict, key: str) -> type | None:
    """The type a schema field takes (a placeholder's declared type), or None for any."""
    try:
        kind = schema.get_type(key)
    except (AttributeError, KeyError, TypeError):
        kind = type(schema[key])
    return None if kind is type(None) else kind


def _fits(value, kind: type) -> bool:
    if value is None:
        return True  # a placeholder left unset
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in (dict, ml_collections.ConfigDict):
        return isinstance(value, (dict, ml_collections.ConfigDict))
    if kind in (list, tuple):
        return isinstance(value, (list, tuple))
    return isinstance(value, kind)


def check_declared(config: ml_collections.ConfigDict, schema: ml_collections.ConfigDict,
                   where: str = "") -> None:
    """`config` holds only `schema`'s fields and sections, each of the kind it declares."""
    for key in config.keys():
        name = f"{where}{key}"
        if key not in schema:
            close = difflib.get_close_matches(key, list(schema.keys()), n=1)
            hint = f" (did you mean {where}{close[0]}?)" if close else ""
            section = where.rstrip(".") or "the config"
            raise ConfigError(f"{name} is not a declared field: {section} has no field "
                              f"{key!r}{hint} (the fields are declared in "
                              "moejax/jobs/schema.py)")
        value, declared = config[key], schema[key]
        if isinstance(declared, ml_collections.ConfigDict) and declared.keys():
            if not isinstance(value, (ml_collections.ConfigDict, dict)):
                raise ConfigError(f"{name}={value!r}: {name} is a section of fields "
                                  f"({', '.join(sorted(declared.keys())[:6])}, ...), not a "
                                  "value")
            check_declared(ml_collections.ConfigDict(value) if isinstance(value, dict)
                           else value, declared, f"{name}.")
            continue
        kind = _kind(schema, key)
        if kind is not None and not _fits(value, kind):
            raise ConfigError(f"{name}={value!r}: {name} takes a {kind.__name__} "
                              f"(got a {type(value).__name__})")
