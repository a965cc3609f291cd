"""The typed specs a job resolves its config into (`moejax/run_spec.py`,
`moejax.jobs.specs.resolve`): each has exactly its config section's fields, no defaults of its
own, is frozen, carries the config's values, and exists only checked. Below the jobs nothing
reads a ConfigDict (`test_only_the_jobs_and_entry_points_read_a_config`)."""

from __future__ import annotations

import ast
import dataclasses
import glob
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moejax import jobs
from moejax.errors import ConfigError
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.run_spec import (
    CacheSpec,
    IOSpec,
    ModelSpec,
    PolicySpec,
    RunSpec,
    TraceReading,
)
from moejax.testing import with_fields
from moejax.timing import hardware as hw_lib
from moejax.timing import storage as storage_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each spec and the section whose fields it has (less the job's own, more what it adds).
SECTIONS = [(ModelSpec, "model", ("hf_config",), ("seed",)), (CacheSpec, "cache", (), ()),
            (PolicySpec, "policies", (), ()), (IOSpec, "io", (), ()),
            (TraceReading, "replay", ("trace", "engine"), ())]


def _names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("cls, section, left, added", SECTIONS,
                         ids=[s[1] for s in SECTIONS])
def test_each_spec_has_its_sections_fields_and_no_defaults(cls, section, left, added):
    schema = set(base_config()[section].keys())
    assert _names(cls) == (schema - set(left)) | set(added)
    assert all(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
               for f in dataclasses.fields(cls))  # the schema's defaults are the only ones


def test_a_resolved_run_carries_the_configs_values_and_is_frozen():
    config = with_fields(base_config(), seed=7, **{
        "cache.slots": 12, "cache.precision": "int4", "policies.eviction": "lfu",
        "model.lookahead": 3, "io.workers": 2, "replay.request_tokens": 64,
        "hardware.preset": "h200", "hardware.h2d_gbps": 9.5, "storage.preset": "hdd",
        "clock.kind": "virtual", "run.batch_size": 2})
    run = resolve(config)
    assert isinstance(run, RunSpec) and run.job == "generate" and run.seed == 7
    assert (run.cache.slots, run.cache.precision, run.cache.given_slots) == (12, "int4", 12)
    assert run.policies == PolicySpec(preset="", eviction="lfu", prefetch="", miss="",
                                      routing="", modules="")
    assert (run.model.lookahead, run.model.seed) == (3, 7)
    assert run.hardware.io == IOSpec(split=1, workers=2, mode="pread")
    assert run.trace.request_tokens == 64 and run.batch_size == 2
    assert run.hardware.device == hw_lib.get("h200", h2d_gbps=9.5)
    assert run.hardware.storage == storage_lib.get("hdd")
    assert run.hardware.clock == "virtual" and not run.trace_driven
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.cache.slots = 4  # type: ignore[misc]


@given(frac=st.floats(min_value=0.01, max_value=1.0), host_bytes=st.integers(0, 10**9),
       host_frac=st.sampled_from([0.25, 0.5, 1.0]))
def test_the_host_tier_is_on_exactly_when_a_bound_is_given(frac, host_bytes, host_frac):
    config = with_fields(base_config(), **{"cache.capacity_frac": frac,
                                           "cache.host_bytes": host_bytes,
                                           "cache.host_capacity_frac": host_frac})
    cache = resolve(config).cache
    assert cache.host_tier == (host_bytes > 0 or host_frac < 1)
    assert cache.given_slots is None and cache.capacity_frac == frac


@pytest.mark.parametrize("field, value, says", [
    ("cache.capacity_frac", 1.5, "cache.capacity_frac=1.5 must be in (0, 1]"),
    ("cache.precision", "int3", "cache.precision"),
    ("model.gmm_impl", "dense", "model.gmm_impl='dense' is not one of"),
    ("model.preset", "nope", "model.preset='nope' is not a preset of olmoe"),
    ("replay.num_experts", -1, "replay.num_experts=-1 must be an integer >= 0"),
    ("policies.eviction", "lru(x=1)", "lru"),
])
def test_a_config_resolves_only_checked(field, value, says):
    with pytest.raises(ConfigError) as info:
        resolve(with_fields(base_config(), **{field: value}))
    assert says in str(info.value)


@pytest.mark.parametrize("fields, says", [
    ({"model.preset": "nope"}, "model.preset='nope' is not a preset of olmoe"),
    ({"model.checkpoint": "/nonexistent/ckpt"}, "model.checkpoint='/nonexistent/ckpt' is not a "
                                                "directory"),
    ({"model.width": 64}, "model.width=64 draws a family preset at another width, and "
                          "model.preset='embedded'"),
])
def test_the_check_before_a_job_refuses_a_bad_model(fields, says):
    """`jobs.check` (what `moejax.main` and a sweep's launch run on every cell) refuses the
    model before any job loads it."""
    with pytest.raises(ConfigError) as info:
        jobs.check(with_fields(base_config(), **fields), warn=False)
    assert says in str(info.value)


def test_a_replay_may_leave_the_model_to_its_trace():
    """`model.preset=""` is the trace's own model config in a replay, and no preset elsewhere."""
    config = with_fields(base_config(), job="replay", **{"model.preset": ""})
    assert resolve(config).model.preset == ""
    config.job = "generate"
    with pytest.raises(ConfigError, match="model.preset='' is not a preset of olmoe"):
        resolve(config)


# Modules outside the jobs and entry points that name a parameter `config` for something
# other than a job config: a results.json's recorded config (a dict), a config file's path.
NOT_A_JOB_CONFIG = {("moejax/analysis/sweep_cells.py", "trace_name"),
                    ("moejax/analysis/sweep_cells.py", "flatten"),
                    ("moejax/analysis/sweep_cells.py", "model_label"),
                    ("moejax/analysis/sweep_cells.py", "_disk_columns"),
                    ("moejax/workdir.py", "fresh")}
# The calibration and the planner compose jobs (live runs, replays): they read configs too.
READ_A_CONFIG = ("moejax/jobs/", "moejax/calibration/", "moejax/plan/", "moejax/train/",
                 "moejax/cli.py", "moejax/main.py", "moejax/testing.py")


def test_only_the_jobs_and_entry_points_read_a_config():
    """Below the jobs nothing imports ml_collections or takes a `config` parameter: the model
    loader, the cache, the live runtime, the traces and the clocks take the run's specs."""
    imports, params = [], []
    for path in sorted(glob.glob(os.path.join(ROOT, "moejax", "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
        if rel.startswith(READ_A_CONFIG):
            continue
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name == "ml_collections"
                                                    for a in node.names):
                imports.append(rel)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "ml_collections"):
                imports.append(rel)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in node.args.args + node.args.kwonlyargs]
                if "config" in names and (rel, node.name) not in NOT_A_JOB_CONFIG:
                    params.append(f"{rel}:{node.name}")
    assert imports == [] and params == []
