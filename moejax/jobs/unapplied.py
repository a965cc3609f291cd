"""What a run does not apply of the settings it was given: each setting given (not the
schema's default) that this run does not use is one warning line on stderr, said once per
config, and kept in its results.json (`warned`: `warnings`). `moejax.jobs.check` says them
before a job starts."""

from __future__ import annotations

import weakref

import ml_collections

from moejax import errors
from moejax.jobs.declared import field_value
from moejax.jobs.specs import computes_on_host, host_work_from
from moejax.policies import presets
from moejax.timing import host as host_lib
from moejax.timing import storage as storage_lib


def warn_unapplied(config: ml_collections.ConfigDict, unapplied) -> None:
    """One warning for each `(field, why)`: `field=value does not apply: why`."""
    for field, why in unapplied:
        warn_once(config, f"{field}={_shown(config, field)} does not apply: {why}")


def say_unapplied(config: ml_collections.ConfigDict, live: bool | None,
                  defaults: ml_collections.ConfigDict) -> None:
    """A warning for each setting given (other than in `defaults`, the schema's) that this
    run does not use (`not_applying`); `live`: True for a run of the model, False for a
    replay, None when the caller does not know (only the warnings that hold either way)."""
    warn_unapplied(config, not_applying(config, live, defaults))


# Fields a run of the model does not read (replay sizes experts by them; its engine,
# `replay.engine`, is in the replay job's own section: `moejax.jobs.schema.READ_BY`).
REPLAY_ONLY = ("cache.group_size", "cache.expert_bytes")
HOST_TIER = ("cache.host_eviction",)
STORAGE = tuple(f"storage.{k}" for k in ("preset", *storage_lib.OVERRIDABLE))
HOST_CPU = tuple(f"host.{k}" for k in ("preset", *host_lib.OVERRIDABLE))
IO = ("io.split", "io.workers", "io.mode")


def not_applying(config: ml_collections.ConfigDict, live: bool | None,
                 defaults: ml_collections.ConfigDict):
    """`(field, why)` for each setting given (other than in `defaults`) that this run does not
    use. A field left at its default is not "given", even where a config file restated it."""
    def given(config, field):
        return field_value(config, field) != field_value(defaults, field)

    c = config.cache
    out = []
    if live and not c.enabled:
        why = "cache.enabled=False puts every expert on the device"
        fields = [f"cache.{k}" for k in c.keys() if k not in ("enabled", "precision")]
        fields += [f"policies.{k}" for k in config.policies.keys()]
        fields += list(STORAGE + IO + HOST_CPU)
        return [(f, why) for f in fields if given(config, f)]
    if not (c.host_bytes > 0 or c.host_capacity_frac < 1):  # (no host tier)
        why = (f"this run has no host tier (cache.host_capacity_frac="
               f"{_shown(config, 'cache.host_capacity_frac')}: every expert in host memory)")
        out += [(f, why) for f in HOST_TIER + STORAGE if given(config, f)]
        if live is not False:  # (a replay's io.* is said below)
            out += [(f, why + ", so no expert is read from storage") for f in IO
                    if given(config, f)]
    if live is False:
        out += [(f, "a replay reads no checkpoint (io.* sets the live runtime's expert reader)")
                for f in IO if given(config, f)]
        moved = ("cache.load_path", "cache.speculate_from_host") + (
            () if host_work_from(config) is not None else ("cache.speculate",))
        out += [(f, "a replay moves no expert bytes") for f in moved if given(config, f)]
    if live:
        out += [(f, "a run of the model takes its experts' sizes from the checkpoint and runs "
                    "no replay engine") for f in REPLAY_ONLY if given(config, f)]
    if given(config, "clock.host_work") and host_work_from(
            _with_host_work(config)) is None:
        out.append(("clock.host_work", "no hardware.file with a host_work section "
                    "(python -m moejax.calibration writes one): the device-only model runs"))
    if config.hardware.get("file", "") and given(config, "hardware.preset"):
        out.append(("hardware.preset",
                    f"hardware.file={config.hardware.file!r} gives the profile"))
    if (config.hardware.get("file", "") and given(config, "host.preset")
            and host_lib.from_file(config.hardware.file) is not None):
        out.append(("host.preset", f"hardware.file={config.hardware.file!r} gives the host "
                                   "profile (its host section)"))
    if not computes_on_host(config):
        why = (f"no expert is computed on the host (policies.miss="
               f"{presets.resolve(config.policies)['miss']}, cache.host_compute_layers=0)")
        out += [(f, why) for f in HOST_CPU if given(config, f)]
    if not c.get("speculate", True) and given(config, "cache.speculate_from_host"):
        out.append(("cache.speculate_from_host", "cache.speculate=False: no pass speculates"))
    if c.slots > 0:  # (with cache.capacity_frac given too: an error, `jobs.CONFLICTS`)
        out += [(f, f"cache.slots={c.slots} sets the slot count")
                for f in ("cache.capacity_of",) if given(config, f)]
    return out


def _with_host_work(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict(config.to_dict())
    c.clock.host_work = True
    return c


def _shown(config: ml_collections.ConfigDict, field: str) -> str:
    value = field_value(config, field)
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value) if isinstance(value, str) else str(value)


# Warnings already printed, per config object (id -> (weak reference, messages)): a job
# builds its cache more than once (generate's warm-up), but a warning is said once.
_WARNED: dict[int, tuple[weakref.ref, set[str]]] = {}


def warn_once(config: ml_collections.ConfigDict, message: str) -> None:
    entry = _WARNED.get(id(config))
    if entry is None or entry[0]() is not config:
        for key in [k for k, (ref, _) in _WARNED.items() if ref() is None]:
            del _WARNED[key]
        entry = _WARNED[id(config)] = (weakref.ref(config), set())
    if message not in entry[1]:
        entry[1].add(message)
        errors.warn(message)


def warned(config: ml_collections.ConfigDict) -> list[str]:
    """The warnings said for `config` (`warn_once`), sorted: results.json's `warnings`."""
    entry = _WARNED.get(id(config))
    return sorted(entry[1]) if entry is not None and entry[0]() is config else []
