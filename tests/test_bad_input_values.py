"""Issue 23 (part C): a config value outside what its field means is an error naming
`field=value` and what the field takes, never silently accepted or answered with an
interpreter's message; a setting given that does not apply to the run gets one warning line.

Most cases call the checks in-process (`check_settings`, `jobs.run` on a tiny replay); three
run `python -m moejax.main` to show the exit status and that no traceback is printed."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest

from moejax import bundled, jobs
from moejax.cache import build_cache_for
from moejax.errors import ConfigError
from moejax.jobs.schema import base_config
from moejax.jobs.specs import check_settings, resolve
from moejax.jobs.unapplied import say_unapplied
from moejax.policies import build, declare
from moejax.policies.base import KINDS
from moejax.policies.registry import names, policy_class, spec_arguments
from moejax.testing import with_fields

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The tiny Mixtral trace: 4 MoE layers of 8 experts (32 routed experts), top-2.
TRACE = bundled.family_trace_path("mixtral")
TOTAL = 32
CTX = dict(num_layers=4, num_experts=8, top_k=2, num_slots=8, seed=0, renormalize=True)


def _replay(**fields):
    c = base_config()
    c.job, c.replay.trace, c.model.preset, c.clock.kind = "replay", TRACE, "", "virtual"
    c.log.progress = c.log.tensorboard = False
    c.policies.prefetch = "none"
    return with_fields(c, **fields)


# -- item 1: counts and fractions outside their range ----------------------------------------

def test_a_negative_slot_count_is_an_error_not_unset(tmp_path):
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"cache\.slots=-3 must be a slot count >= 1, or 0 "
                                          r"\(the schema's default: cache\.capacity_frac"):
        jobs.run(_replay(**{"cache.slots": -3}), str(workdir))
    assert not workdir.exists()  # checked before anything is written


def test_a_slot_count_above_the_models_experts_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=rf"cache\.slots={TOTAL + 1} is not a slot count of "
                                          rf"this model: it takes 1 to {TOTAL}"):
        jobs.run(_replay(**{"cache.slots": TOTAL + 1}), str(tmp_path / "over"))
    assert not (tmp_path / "over").exists()
    # Every expert is the largest count, and results.json reports it as given.
    results = jobs.run(_replay(**{"cache.slots": TOTAL}), str(tmp_path / "all"))
    assert results["cache"]["slots"] == TOTAL
    assert results["cache"]["capacity_frac_of_experts"] == pytest.approx(1.0)


def test_a_slot_floor_above_the_models_experts_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=rf"cache\.min_slots={TOTAL + 1} is above this "
                                          rf"model's {TOTAL} routed experts"):
        jobs.run(_replay(**{"cache.min_slots": TOTAL + 1}), str(tmp_path))


@pytest.mark.parametrize("field, value, message", [
    ("cache.slots", -1, r"cache\.slots=-1 must be a slot count >= 1, or 0"),
    ("cache.capacity_frac", 0.0, r"cache\.capacity_frac=0\.0 must be in \(0, 1\]"),
    ("cache.capacity_frac", 1.5, r"cache\.capacity_frac=1\.5 must be in \(0, 1\]"),
    ("cache.capacity_frac", float("nan"), r"cache\.capacity_frac=nan must be in \(0, 1\]"),
    ("cache.min_slots", -2, r"cache\.min_slots=-2 must be an integer >= 0"),
    ("cache.host_capacity_frac", 0.0, r"cache\.host_capacity_frac=0\.0 must be in \(0, 1\]"),
    ("cache.host_capacity_frac", 1.5, r"cache\.host_capacity_frac=1\.5 must be in \(0, 1\]"),
    ("cache.host_bytes", -1, r"cache\.host_bytes=-1 must be an integer >= 0"),
    ("cache.group_size", 0, r"cache\.group_size=0 must be an integer >= 1"),
    ("cache.expert_bytes", -5, r"cache\.expert_bytes=-5 must be an integer >= 0"),
    ("cache.capacity_of", "layer", r"cache\.capacity_of='layer' is not one of"),
    ("clock.kind", "sundial", r"clock\.kind='sundial' is not one of"),
    # item 2: bandwidths finite and positive, latencies finite and >= 0
    ("hardware.h2d_gbps", float("inf"), r"hardware\.h2d_gbps=inf must be a finite number > 0"),
    ("hardware.link_gbps", float("inf"), r"hardware\.link_gbps=inf must be a finite number"),
    ("hardware.hbm_gbps", float("nan"), r"hardware\.hbm_gbps=nan must be a finite number"),
    ("hardware.peak_tflops", float("inf"), r"hardware\.peak_tflops=inf must be a finite"),
    ("hardware.h2d_latency_s", float("inf"),
     r"hardware\.h2d_latency_s=inf must be a finite number >= 0"),
    ("hardware.launch_s", -1.0, r"hardware\.launch_s=-1\.0 must be a finite number >= 0"),
    ("storage.read_gbps", float("inf"), r"storage\.read_gbps=inf must be a finite number > 0"),
    ("storage.read_gbps", 0.0, r"storage\.read_gbps=0\.0 must be a finite number > 0"),
    ("storage.read_latency_s", float("inf"),
     r"storage\.read_latency_s=inf must be a finite number >= 0"),
    ("storage.queue_depth", 0, r"storage\.queue_depth=0 must be an integer >= 1"),
    # item 3: io.* checked where no reader is built (no host tier here)
    ("io.mode", "bogus", r"io\.mode='bogus' is not one of \('pread', 'mmap', 'direct'\)"),
    ("io.split", 9, r"io\.split=9 must be an integer from 1 to 8"),
    ("io.workers", 0, r"io\.workers=0 must be a positive integer"),
    ("policies.eviction", "lru2", r"unknown eviction policy 'lru2'"),
    ("cache.host_eviction", "lru2", r"cache\.host_eviction: unknown eviction policy 'lru2'"),
])
def test_values_outside_a_field_are_errors_naming_it(field, value, message):
    with pytest.raises(ConfigError, match=message):
        check_settings(_replay(**{field: value}))


def test_a_host_tier_above_every_expert_is_an_error():
    config = _replay(**{"cache.slots": 4, "cache.host_bytes": TOTAL * 100 + 1})
    with pytest.raises(ConfigError, match=rf"cache\.host_bytes={TOTAL * 100 + 1} is more than "
                                          rf"all {TOTAL} experts take \({TOTAL * 100} bytes"):
        build_cache_for(resolve(config), None, {"native": 100}, True, layers=(0, 1, 2, 3),
                        num_layers=4, num_experts=8, top_k=2)
    # Exactly every expert's bytes is a host tier of every expert, read on demand.
    config = _replay(**{"cache.slots": 4, "cache.host_bytes": TOTAL * 100})
    cache = build_cache_for(resolve(config), None, {"native": 100}, True, layers=(0, 1, 2, 3),
                            num_layers=4, num_experts=8, top_k=2)
    assert cache.host.capacity == TOTAL


def test_an_invalid_io_mode_is_an_error_in_a_replay_too(tmp_path):
    with pytest.raises(ConfigError, match=r"io\.mode='bogus' is not one of"):
        jobs.run(_replay(**{"io.mode": "bogus"}), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


# -- item 3: settings that do not apply are said, once ---------------------------------------

DEFAULTS = base_config()  # what `jobs.run` compares with (the schema's defaults)

def _warnings(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ": warning: " in ln]


def test_storage_without_a_host_tier_is_warned_about_once(capsys):
    config = _replay(**{"storage.read_gbps": 2.0, "storage.preset": "hdd"})
    say_unapplied(config, False, DEFAULTS)
    # A job builds its cache twice (generate's warm-up): said once.
    say_unapplied(config, False, DEFAULTS)
    lines = _warnings(capsys)
    assert len(lines) == 2, lines
    assert lines[0].endswith("warning: storage.preset='hdd' does not apply: this run has no "
                             "host tier (cache.host_capacity_frac=1: every expert in host "
                             "memory)")
    assert "warning: storage.read_gbps=2 does not apply: this run has no host tier" in lines[1]


def test_settings_left_at_their_default_or_that_apply_are_not_warned_about(capsys):
    say_unapplied(_replay(), False, DEFAULTS)
    say_unapplied(_replay(**{"cache.host_capacity_frac": 0.5, "storage.read_gbps": 2.0,
                             "cache.host_eviction": "fifo"}), False, DEFAULTS)
    say_unapplied(with_fields(base_config(), **{"cache.host_capacity_frac": 0.5, "io.split": 4,
                                                "io.mode": "mmap"}), True, DEFAULTS)
    # A config file that restates a default has not "given" it.
    say_unapplied(_replay(**{"storage.preset": "nvme_gen4", "io.workers": 8}), False, DEFAULTS)
    assert _warnings(capsys) == []


@pytest.mark.parametrize("fields, live, expected", [
    ({"io.split": 4}, False,
     "io.split=4 does not apply: a replay reads no checkpoint (io.* sets the live runtime's"),
    ({"io.mode": "mmap", "cache.host_capacity_frac": 0.5}, False,
     "io.mode='mmap' does not apply: a replay reads no checkpoint"),
    ({"io.workers": 2}, True, "io.workers=2 does not apply: this run has no host tier "
                              "(cache.host_capacity_frac=1: every expert in host memory), so "
                              "no expert is read from storage"),
    ({"cache.host_eviction": "fifo"}, None,
     "cache.host_eviction='fifo' does not apply: this run has no host tier"),
    # (with cache.capacity_frac given too it is an error: tests/test_declared_fields.py)
    ({"cache.slots": 8, "cache.capacity_of": "model"}, None,
     "cache.capacity_of='model' does not apply: cache.slots=8 sets the slot count"),
    ({"cache.group_size": 32}, True, "cache.group_size=32 does not apply: a run of the model"),
    ({"cache.speculate": False, "cache.speculate_from_host": False}, True,
     "cache.speculate_from_host=False does not apply: cache.speculate=False: no pass "
     "speculates"),
    ({"cache.speculate_from_host": False}, False,
     "cache.speculate_from_host=False does not apply: a replay moves no expert bytes"),
    ({"cache.enabled": False, "policies.eviction": "lru"}, True,
     "policies.eviction='lru' does not apply: cache.enabled=False puts every expert on the "
     "device"),
])
def test_each_setting_that_does_not_apply_gets_one_line(fields, live, expected, capsys):
    config = with_fields(base_config(), job="replay" if live is False else "generate", **fields)
    say_unapplied(config, live, DEFAULTS)
    lines = _warnings(capsys)
    assert len(lines) == 1 and expected in lines[0], lines


def test_a_replay_job_warns_before_it_runs(tmp_path, capsys):
    results = jobs.run(_replay(**{"storage.read_gbps": 2.0, "cache.slots": 8}),
                       str(tmp_path))
    err = capsys.readouterr().err
    assert err.count("warning: storage.read_gbps=2 does not apply") == 1, err
    assert results["cache"]["slots"] == 8


# -- item 4: a policy argument of the wrong kind, for every declared argument -----------------

# Values of several kinds; each argument must refuse those of a kind its declared values
# (`ARGS`) are not: a number argument takes an int, not a bool, nor inf.
OTHER_KINDS = ("x", 3, 2.5, [1, 2], True, 1e999)


def _of_its_kind(domain: declare.Domain, value) -> bool:
    if isinstance(domain, declare.Floats):
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and value - value == 0)
    if isinstance(domain, declare.Ints):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(domain, declare.Choice):
        return any(type(value) is type(v) for v in domain.values)
    assert isinstance(domain, declare.Levels), domain
    return isinstance(value, str)


def test_every_declared_argument_refuses_a_value_of_the_wrong_kind_by_name():
    checked = 0
    for kind in KINDS:
        for name in names(kind):
            cls = policy_class(kind, name)
            for arg in spec_arguments(cls):
                for value in OTHER_KINDS:
                    if _of_its_kind(cls.ARGS[arg], value):
                        continue
                    # (1e999: the literal a spec gives for inf; a bare `inf` is a string)
                    spec = f"{name}({arg}={'1e999' if value == 1e999 else repr(value)})"
                    with pytest.raises(ConfigError) as e:
                        build(kind, spec, **CTX)
                    message = str(e.value)
                    shown = repr(value)  # (repr(1e999) is inf)
                    assert message.startswith(f"{kind} policy {spec!r}: {arg}={shown} must be "
                                              ), message
                    assert "not supported" not in message and "NoneType" not in message
                    checked += 1
    assert checked >= 60


@pytest.mark.parametrize("kind, spec, message", [
    ("eviction", "least_stale(order=3)",
     r"order=3 must be one of 'two_queue', 'left_first', 'cyclic'"),
    ("miss", "fetch_priority(percentile='x')", r"percentile='x' must be a number in \[0, 100\]"),
    ("prefetch", "score_percentile(p=x)", r"p='x' must be a number in \[0, 100\)"),
    ("prefetch", "topk(overfetch=x)", r"overfetch='x' must be a number > 0"),
    ("miss", "fetch_priority(upgrade=1)", r"upgrade=1 must be one of False, True"),
    ("miss", "drop(keep=1.5)", r"keep=1\.5 must be an integer >= 1"),
    ("miss", "fetch_lowest_bit(levels=4)", r"levels=4 must be precisions from high to low"),
])
def test_named_wrong_kinds(kind, spec, message):
    with pytest.raises(ConfigError, match=message):
        build(kind, spec, **CTX)


def test_values_of_the_right_kind_still_reach_the_constructor():
    # Outside the fuzzed range but inside the argument's meaning: built.
    assert build("prefetch", "topk(overfetch=8)", **CTX).count == 8
    assert build("miss", "fetch_priority(levels='int8:4')", **CTX).levels == ("int8", "int4")


def _outside(domain: declare.Floats) -> list[float]:
    """Values just past each bound the argument declares as its meaning."""
    out = []
    for bound, step in ((domain.at_least, -1e-6), (domain.above, 0.0),
                        (domain.at_most, 1e-6), (domain.below, 0.0)):
        if bound is not None:
            out.append(bound + step)
    return out


def test_a_declared_range_is_refused_without_the_cache_and_by_the_constructor():
    """Each number argument's meaning (`Floats.at_least` ...) is refused by `check`, which has
    no model (a sweep's launch checks every cell with it), and the constructor refuses the
    same value when built by hand: the two never disagree."""
    from moejax.policies import check

    refused = 0
    for kind in KINDS:
        for name in names(kind):
            cls = policy_class(kind, name)
            for arg in spec_arguments(cls):
                domain = cls.ARGS[arg]
                if not isinstance(domain, declare.Floats):
                    continue
                for value in _outside(domain):
                    spec = f"{name}({arg}={value!r})"
                    with pytest.raises(ConfigError, match=rf"{arg}=.* must be a number"):
                        check(kind, spec)
                    ctor_args = {k: v for k, v in CTX.items()
                                 if k in inspect.signature(cls).parameters}
                    with pytest.raises((ValueError, TypeError)):
                        cls(**{arg: value}, **ctor_args)
                    refused += 1
    assert refused >= 8  # p, percentile x2 (two bounds each), overfetch, lam, tol, precision


@pytest.mark.parametrize("kind, spec", [
    ("prefetch", "score_percentile(p=150)"), ("prefetch", "score_percentile(p=100)"),
    ("prefetch", "score_percentile(p=-1)"), ("prefetch", "topk(overfetch=0)"),
    ("miss", "fetch_priority(percentile=101)"), ("miss", "substitute(tol=-0.1)"),
    ("routing", "cache_aware(lam=-1)")])
def test_named_ranges_are_refused_before_any_model(kind, spec):
    from moejax.policies import check

    with pytest.raises(ConfigError, match="must be a number"):
        check(kind, spec)


# -- through the door: exit status 2, one line, no traceback ---------------------------------

def _main(*flags: str, workdir: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moejax.main", f"--workdir={workdir}", *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("flag, message", [
    ("--config.cache.slots=-3", "cache.slots=-3 must be a slot count >= 1, or 0"),
    ("--config.policies.eviction=least_stale(order=3)",
     "eviction policy 'least_stale(order=3)': order=3 must be one of"),
])
def test_the_command_line_says_the_field_and_exits_2(flag, message, tmp_path):
    workdir = tmp_path / "run"
    done = _main("--config=configs/replay.py", f"--config.replay.trace={TRACE}",
                 "--config.cache.capacity_frac=0.25", flag, workdir=str(workdir))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert f"moejax.main: error: {message}" in done.stderr, done.stderr
    assert not workdir.exists()


def test_an_infinite_bandwidth_in_a_live_run_overwrites_nothing(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    kept = {"kept": True}
    (workdir / "results.json").write_text(json.dumps(kept))
    done = _main("--config=configs/default.py", "--config.hardware.h2d_gbps=inf",
                 "--config.run.max_new_tokens=2", workdir=str(workdir))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "moejax.main: error: hardware.h2d_gbps=inf must be a finite number > 0" in \
        done.stderr, done.stderr
    assert json.loads((workdir / "results.json").read_text()) == kept
