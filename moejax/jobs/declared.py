"""Every field a config holds is one its job declares (`moejax/jobs/schema.py`), whatever set
it: a config file, a grid's base config, a sweep cell or the command line. The command line
and sweep cells set fields on a locked config, which refuses an undeclared name; a config
file builds its ConfigDict unlocked, so a misspelled field or section
(`c.cache.capacity_fraction = 0.1`, `c.polices = ...`) would be added beside the real one and
the default would run. `check_declared` walks the config against the schema before anything
loads: an undeclared field or section is a ConfigError naming it and the closest declared
name, a value of the wrong kind names the field and what it takes.

A field that moved into its job's section (`schema.MOVED`: `trace` is `replay.trace` now) is
declared no more: set anywhere, it is refused in one line naming the new field (`moved_to`;
the command line's message is `moejax.cli`'s, given the table by `moejax.main`, a sweep
cell's `launch.worker`'s).

`unread_by_job` is the other half: a field that is declared but that this job does not read
(`schema.READ_BY`, the table of which jobs read which field), given anyway."""

from __future__ import annotations

import difflib

import ml_collections

from moejax.errors import ConfigError


def field_value(config, field: str):
    """The value of dotted `field` (`cache.slots`) in `config` (a ConfigDict or a dict)."""
    for part in field.split("."):
        config = config[part]
    return config


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


def moved_to(name: str, moved: dict, flag: str = "") -> str | None:
    """Where the old field `name` went (`moved`: `schema.MOVED`), as a config names it
    (`replay.trace`) or, given `flag` (`--config`), as the command line does
    (`--config.replay.trace`); None for a name that did not move."""
    from moejax.cli import as_flags

    new = moved.get(name)
    return as_flags(new, flag) if new is not None and flag else new


def _moved_inside(name: str, value, moved: dict) -> tuple[str, str] | None:
    """(old name, new name) for `name`, or for the first field inside it when it is a section
    that is gone (a train config's `data.gsm8k_path`), that moved; None when none did."""
    if name in moved:
        return name, moved[name]
    if isinstance(value, (dict, ml_collections.ConfigDict)):
        for key in value.keys():
            found = _moved_inside(f"{name}.{key}", value[key], moved)
            if found is not None:
                return found
    return None


def check_declared(config: ml_collections.ConfigDict, schema: ml_collections.ConfigDict,
                   where: str = "", moved: dict | None = None) -> None:
    """`config` holds only `schema`'s fields and sections, each of the kind it declares; a
    field that moved (`moved`: `schema.MOVED`) is refused naming where it went."""
    for key in config.keys():
        name = f"{where}{key}"
        if key not in schema:
            found = _moved_inside(name, config[key], moved or {})
            if found is not None:
                raise ConfigError(f"{found[0]} moved to {found[1]}")
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
                           else value, declared, f"{name}.", moved)
            continue
        kind = _kind(schema, key)
        if kind is not None and not _fits(value, kind):
            raise ConfigError(f"{name}={value!r}: {name} takes a {kind.__name__} "
                              f"(got a {type(value).__name__})")


def leaves(config: ml_collections.ConfigDict, where: str = "") -> list[str]:
    """The dotted name of every field of `config`, its sections' fields included."""
    out = []
    for key in config.keys():
        value = config[key]
        if isinstance(value, ml_collections.ConfigDict) and value.keys():
            out += leaves(value, f"{where}{key}.")
        else:
            out.append(f"{where}{key}")
    return out


def unread_by_job(config: ml_collections.ConfigDict, defaults: ml_collections.ConfigDict,
                  read_by: tuple, live: tuple, unnamed: tuple = (),
                  every_job: tuple = ()) -> list[tuple[str, str]]:
    """`(field, why)` for each field given (away from `defaults`) that `config.job` does not
    read, by `read_by` (`schema.READ_BY`: a field, or a section with a trailing dot -> the
    jobs that read it; `live`: the jobs that run the model). A field `read_by` does not name is
    read by the jobs `unnamed` (`live` and the replay jobs), `every_job`'s by every job."""
    job, out, named = config.job, [], set(every_job)

    def given(f):
        return field_value(config, f) != field_value(defaults, f)

    for name, jobs in read_by:
        section = name.endswith(".")
        fields = leaves(config[name.rstrip(".")], name) if section else [name]
        named.update(fields)
        if job in jobs:
            continue
        readers = ("the jobs that run the model" if set(jobs) == set(live)
                   else "the jobs that run the model and the replay job"
                   if set(jobs) == {*live, "replay"}
                   else f"the {_listed(jobs)} job{'s' if len(jobs) > 1 else ''}")
        why = f"{'its section is ' if section else ''}read only by {readers}; this is a {job} run"
        out += [(f, why) for f in fields if given(f)]
    if unnamed and job not in unnamed:
        readers = ("the jobs that run the model or a replay"
                   if set(unnamed) - set(live) <= {"replay", "curve", "plan"}
                   else f"the {_listed(unnamed)} jobs")
        why = f"read only by {readers}; this is a {job} run"
        out += [(f, why) for f in leaves(config) if f not in named and given(f)]
    return out


def _listed(names) -> str:
    """"a", "a and b", "a, b and c"."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def listing(schema: ml_collections.ConfigDict, read_by: tuple, where: str = "") -> list[str]:
    """Every field of `schema`, one line each: its dotted name, the type it takes, its default
    and, where only some jobs read it (`read_by`), which (`python -m moejax.main --fields`)."""
    readers = dict(read_by)
    lines = []
    for key in schema.keys():
        name, value = f"{where}{key}", schema[key]
        if isinstance(value, ml_collections.ConfigDict) and value.keys():
            lines += listing(value, read_by, f"{name}.")
            continue
        kind = _kind(schema, key)
        sections = [".".join(name.split(".")[:i]) + "." for i in
                    range(name.count("."), 0, -1)]  # the innermost first
        jobs = readers.get(name) or next((readers[s] for s in sections if s in readers), None)
        shown = "None (not given)" if value is None else repr(value)
        lines.append(f"{name:38} {kind.__name__ if kind else 'any':6} {shown}"
                     + (f"  [{', '.join(jobs)}]" if jobs else ""))
    return lines


def _typed(argv: list[str], prefix: str = "--config.") -> list[tuple[str, str]]:
    """(field, value as typed) for each `--config.FIELD=VALUE` / `--config.FIELD VALUE`."""
    out = []
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        for dash in (prefix, prefix[1:]):
            if arg.startswith(dash):
                field, sep, value = arg[len(dash):].partition("=")
                if not sep and i + 1 < len(argv):
                    value = argv[i + 1]
                out.append((field, value))
                break
    return out


def check_typed(argv: list[str], config: ml_collections.ConfigDict, not_given: dict) -> None:
    """What the command line set that parses but cannot be what its user meant: a field's "not
    given" (`not_given`: field -> (that value, what the field takes)), which would run as if
    the flag were absent; a `run.prompts` item that is not a quoted string or a list of them
    (`--config.run.prompts='not json'` would otherwise be one prompt, the text `not json`)."""
    import ast

    for field, typed in _typed(argv):
        flag = f"--config.{field}={typed}"
        if field == "run.prompts":
            try:
                value = ast.literal_eval(typed)
            except (ValueError, SyntaxError):
                value = None
            items = value if isinstance(value, (list, tuple)) else [value]
            if not all(isinstance(v, str) for v in items):
                raise ConfigError(
                    f"{flag}: takes a list of quoted prompts, --config.run.prompts='[\"first\", "
                    "\"second\"]', or one quoted prompt per flag, "
                    "--config.run.prompts='\"first\"'")
        if field in not_given:
            empty, takes = not_given[field]
            value = field_value(config, field)
            if (tuple(value or ()) == empty if isinstance(empty, tuple) else value == empty):
                raise ConfigError(f"{flag}: {typed or 'empty'} is the field's \"not given\" (the "
                                  f"run would go on as if the flag were absent); it takes "
                                  f"{takes}")
