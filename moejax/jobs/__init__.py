"""The jobs `python -m moejax.main` runs, by `config.job` (each a library function
`run(config, workdir)`): generate, perplexity, quality, eval, record_traces, replay, curve
(a replay's capacity curve), plan (a configuration recommended for a model on a machine) and
train.
`schema.py` declares every field a job config has (`base_config`); `specs.py` checks a config
and resolves it, once per job, into the typed specs the layers below take (`moejax.run_spec`);
`unapplied.py` says each setting given that a run does not use; `common.py` is what the jobs
share (the decoder over the run's expert source, the cache report).

`run` is the one door every job goes through (`python -m moejax.main`, a sweep's cells): it
claims the workdir (`moejax.workdir`: checked before anything is written, one run at a time,
removed again if the run created it and wrote nothing) around the job. Ctrl-C during a job
ends it with `cli.Interrupted`, whose message says what the run left in the workdir."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Callable

import ml_collections

from moejax import workdir as workdir_lib
from moejax.cli import Interrupted
from moejax.errors import ConfigError
from moejax.jobs.declared import check_declared, unread_by_job
from moejax.jobs.schema import (
    EVERY_JOB,
    JOBS,
    LIVE,
    MOVED,
    MOVED_FOR_JOB,
    READ_BY,
    REPLAYS,
    TRACE_DRIVEN_READS,
    base_config,
    declared_defaults,
)

__all__ = ["JOBS", "base_config", "check", "run"]


def run(config: ml_collections.ConfigDict, workdir: str,
        claim: workdir_lib.Claim | None = None, checked: bool = False) -> dict:
    """Runs `config.job` into `workdir`. `claim`: the workdir already claimed by the caller (a
    sweep's worker claims a cell's directory before it empties it), released here however the
    run ends, as the claim `run` takes itself is. `checked`: the caller ran `check(config)`
    already (`moejax.main`, before it names a fresh workdir)."""
    try:
        if not checked:
            check(config)  # before the model loads or W exists
        if claim is None:  # a workdir the run cannot use fails before the job loads
            workdir_lib.check(workdir)
        job = runner_of(config.job)  # a missing extra fails here, before the workdir is made
        if claim is None:
            claim = workdir_lib.claim(workdir)
    except BaseException:
        if claim is not None:
            claim.release()
        raise
    try:
        # Training resumes from its own checkpoints in its workdir: only the other jobs'
        # results are the user's to keep.
        aside = None if config.job == "train" else workdir_lib.earlier_run(
            workdir, bool(config.run.overwrite))
        if aside is not None:
            print(f"note: --workdir={workdir}: the earlier run's files moved to {aside}",
                  file=sys.stderr)
        results = job(config, workdir)
        _record_run_notes(config, workdir, results)
        return results
    except Interrupted:  # the job said what it kept
        raise
    except KeyboardInterrupt:
        claim.release()
        raise Interrupted(claim.kept()) from None
    finally:
        claim.release()


def _policy_modules(config: ml_collections.ConfigDict) -> str:
    """`policies.modules`; "" for a config without a policies section (the train job's)."""
    return (config.get("policies") or {}).get("modules", "")


def load_policy_modules(config: ml_collections.ConfigDict) -> list:
    """Imports the modules `policies.modules` names and the `moejax.policies` entry points
    (`moejax/policies/user_modules.py`); what was loaded."""
    from moejax.policies import user_modules

    return user_modules.load(_policy_modules(config))


def _record_run_notes(config: ml_collections.ConfigDict, workdir: str, results) -> None:
    """Kept in the run's results.json: every warning said for its settings (`warnings`: a
    setting accepted and not applied is never only a line on a terminal), and the policy
    modules from outside the package it loaded (`policy_modules`: path, SHA-256, what each
    registered)."""
    if not isinstance(results, dict):
        return
    from moejax.jobs.unapplied import warned
    from moejax.policies import user_modules
    from moejax.results import write_json_atomic

    notes = {}
    said = warned(config)
    if said:
        notes["warnings"] = said
    modules = user_modules.records(user_modules.loaded(_policy_modules(config)))
    if modules:
        notes["policy_modules"] = modules
    path = os.path.join(workdir, "results.json")
    if notes and os.path.exists(path):
        results.update(notes)
        write_json_atomic(path, results)


# Fields that cannot both be given (each away from its default): the run would have to drop
# one without a word.
CONFLICTS = (("cache.slots", "cache.capacity_frac", "a slot count or a fraction of "
              "cache.capacity_of"),
             ("run.prompt_ids", "run.prompt", "the prompt's token ids or its text"))


def _check_conflicts(config: ml_collections.ConfigDict,
                     defaults: ml_collections.ConfigDict) -> None:
    from moejax.jobs.declared import field_value as value

    for a, b, what in CONFLICTS:
        if value(config, a) != value(defaults, a) and value(config, b) != value(defaults, b):
            raise ConfigError(f"{a}={value(config, a)!r} and {b}={value(config, b)!r} are both "
                              f"given: the run takes one ({what}); drop one")


def check(config: ml_collections.ConfigDict, warn: bool = True) -> None:
    """What a run checks before its job starts: every field declared (a field that moved into
    its job's section, `schema.MOVED`, named with where it went); `config.job`; the cache,
    clock, storage, io and policy fields (`specs.check_settings`) and the model's
    (`specs.check_model`); with `warn`, one line on stderr for each setting given that does not
    apply (`unapplied`); the job's own fields (its module's `validate`, where it has one). A
    value outside a field is a ConfigError naming it. The sweep launcher checks every cell with
    it before the first one runs (`launch/preflight.py`)."""
    from moejax.jobs.declared import field_value as value
    from moejax.jobs.specs import check_model, check_settings, trace_driven
    from moejax.jobs.unapplied import say_unapplied, warn_unapplied

    schema = declared_defaults()  # (read only)
    check_declared(config, schema, moved=MOVED)
    # A user's policies are registered before any spec is checked (a worker's check loads them
    # in its own process).
    load_policy_modules(config)
    if config.job not in JOBS:
        raise ConfigError(f"config.job={config.job!r} is not one of {JOBS}")
    for old, new in MOVED_FOR_JOB.get(config.job, {}).items():
        if value(config, old) != value(schema, old):
            raise ConfigError(f"{old}={value(config, old)!r} is not read by the {config.job} "
                              f"job: it moved to {new}")
    # Each value against its field first, then the pairs that cannot both be given. The
    # train job runs no cache: what it does not read is said below, by `unread_by_job`.
    check_model(config)
    check_settings(config)
    _check_conflicts(config, schema)
    if warn:
        if config.job in (*LIVE, *REPLAYS):
            say_unapplied(config, config.job not in REPLAYS, schema)
        unread = unread_by_job(config, schema, READ_BY, LIVE, unnamed=(*LIVE, *REPLAYS),
                               every_job=EVERY_JOB)
        if config.job == "generate" and trace_driven(config):
            unread = [(f, why) for f, why in unread if f not in TRACE_DRIVEN_READS]
        warn_unapplied(config, unread)
    validate = getattr(importlib.import_module(_RUNNERS[config.job][0]), "validate", None)
    if validate is not None:
        validate(config)


# Each job's module and function: imported only when it runs (their imports are heavy, and
# the eval job's need the `eval` extra; its seqio loads in a worker process).
_RUNNERS = {"generate": ("moejax.jobs.generate", "run"),
            "perplexity": ("moejax.jobs.perplexity", "run"),
            "quality": ("moejax.jobs.quality", "run"),
            "eval": ("moejax.jobs.evaluate", "run"),
            "record_traces": ("moejax.jobs.record_traces", "run"),
            "replay": ("moejax.jobs.replay", "run"),
            "curve": ("moejax.jobs.curve", "run"),
            "plan": ("moejax.jobs.plan", "run"),
            "train": ("moejax.train.loop", "train")}


def runner_of(name: str) -> Callable[[ml_collections.ConfigDict, str], dict]:
    """The job's `run(config, workdir)`, imported now (`_RUNNERS`)."""
    module, function = _RUNNERS[name]
    return getattr(importlib.import_module(module), function)
