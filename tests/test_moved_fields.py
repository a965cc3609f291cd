"""Each job's fields in its own section: the replay job's `replay.*` (was `trace`,
`trace_num_experts`, ..., `cache.replay_engine`), the perplexity job's `perplexity.*` (was
`text_file` and `eval.window/stride/max_tokens`), the quality job's `quality.text_file`, the
train job's `train.*` (was a config of its own: `model.*`, `data.gsm8k_path`, `log.every`,
`export.dtype`, ...). An old name is refused wherever it is set — the command line, a config
file, a sweep cell — in one line naming the new field (`schema.MOVED`); the train job goes
through the one check every job goes through, and its door's mistakes are one line too."""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import subprocess
import sys

import ml_collections
import pytest
from absl import flags as absl_flags
from ml_collections import config_flags

from launch.worker import OverrideError, apply_overrides
from moejax import bundled, cli, jobs
from moejax.errors import ConfigError
from moejax.jobs.declared import field_value
from moejax.jobs.schema import MOVED, MOVED_FOR_JOB, base_config, current_config
from moejax.jobs.unapplied import say_unapplied

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPLAY = os.path.join(ROOT, "configs", "replay.py")
TRAIN = os.path.join(ROOT, "configs", "train_small.py")
DOTTED = re.compile(r"\b[a-z_]+(?:\.[a-z_0-9]+)+")


def _command(module: str, *args: str, cwd: str = ROOT):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def _one_line(done, prog: str) -> str:
    """The run's one error line, without its `prog: error: ` (status 2, nothing else said)."""
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), done.stderr
    return lines[0].removeprefix(f"{prog}: error: ")


def _train_config(arg: str | None = None) -> ml_collections.ConfigDict:
    spec = importlib.util.spec_from_file_location("train_small", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


# -- the table ------------------------------------------------------------------------------

@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_name_is_undeclared_and_every_new_one_declared(old):
    schema = base_config()
    with pytest.raises(KeyError):
        field_value(schema, old)
    named = DOTTED.findall(MOVED[old])
    assert named, MOVED[old]
    for new in named:
        field_value(schema, new)  # declared


# -- on the command line --------------------------------------------------------------------

@pytest.mark.parametrize("flag, message", [
    ("--config.trace=x.npz", "--config.trace: moved to --config.replay.trace"),
    ("--config.text_file=README.md",
     "--config.text_file: moved to --config.perplexity.text_file (the perplexity job) or "
     "--config.quality.text_file (the quality job)"),
])
def test_an_old_name_on_the_command_line_is_one_line_naming_the_new(tmp_path, flag, message):
    done = _command("moejax.main", f"--config={REPLAY}", flag, f"--workdir={tmp_path / 'w'}")
    assert _one_line(done, "moejax.main") == message
    assert not (tmp_path / "w").exists()


def _parse_error(config: str, *args: str) -> str:
    """The UsageError message `python -m moejax.main`'s flag parsing gives for `args` (the
    table of moved fields given to `moejax.cli` as `moejax.main` gives it)."""
    argv = ["moejax.main", f"--config={config}", *args]
    values = absl_flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv,
                                    lock_config=True)
    sys.modules.pop("config_config", None)  # config_flags' module of the config file
    with pytest.raises(cli.UsageError) as info:
        cli.parse_flags(argv, values)
    return str(info.value)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_name_as_a_flag_names_the_new_flag(old, monkeypatch):
    monkeypatch.setattr(cli, "MOVED_FIELDS", dict(MOVED))  # as moejax.main sets it
    message = _parse_error(REPLAY, f"--config.{old}=1")
    assert message.startswith(f"--config.{old}: moved to --config."), message
    assert "\n" not in message
    for new in DOTTED.findall(MOVED[old]):
        assert f"--config.{new}" in message, (new, message)


# -- in a config file, a grid's base config, a sweep cell -----------------------------------

def _with_old(old: str, value=1) -> ml_collections.ConfigDict:
    """The schema's config with the old field `old` set, as an unlocked config file sets it."""
    c = base_config().to_dict()
    *sections, leaf = old.split(".")
    node = c
    for section in sections:
        node = node.setdefault(section, {})
    node[leaf] = value
    return ml_collections.ConfigDict(c)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_name_in_a_config_is_refused_naming_the_new(old):
    with pytest.raises(ConfigError) as e:
        jobs.check(_with_old(old), warn=False)
    assert str(e.value) == f"{old} moved to {MOVED[old]}"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_name_in_a_sweep_cell_is_refused_naming_the_new(old):
    with pytest.raises(OverrideError) as e:
        apply_overrides(base_config(), {old: 1})
    assert str(e.value) == f"{old} moved to {MOVED[old]}"


def test_a_config_file_setting_an_old_name_is_one_line(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("from moejax.jobs.schema import base_config\n\n\n"
                    "def get_config():\n    c = base_config()\n    c.job = 'replay'\n"
                    "    c.trace_request_tokens = 128\n    return c\n")
    done = _command("moejax.main", f"--config={path}", f"--workdir={tmp_path / 'w'}")
    assert _one_line(done, "moejax.main") == (
        "trace_request_tokens moved to replay.request_tokens")
    assert not (tmp_path / "w").exists()


# The train config as it was written before the train job had its section in the schema.
OLD_TRAIN_CONFIG = '''
import ml_collections


def get_config(arg=None):
    c = ml_collections.ConfigDict()
    c.job = "train"
    c.seed = 0
    c.model = ml_collections.ConfigDict(dict(hidden_size=32, num_layers=2))
    c.train = ml_collections.ConfigDict(dict(steps=6, batch_size=2))
    c.data = ml_collections.ConfigDict(dict(gsm8k_path=""))
    c.log = ml_collections.ConfigDict(dict(every=2, checkpoint_every=3))
    c.export = ml_collections.ConfigDict(dict(dtype="bfloat16"))
    return c
'''


def test_an_old_shaped_train_config_is_one_line_at_its_door(tmp_path):
    path = tmp_path / "old_train.py"
    path.write_text(OLD_TRAIN_CONFIG)
    done = _command("moejax.train", f"--config={path}", f"--workdir={tmp_path / 'w'}")
    # (A ConfigDict's fields in name order: `data` comes first, a section that is gone.)
    assert _one_line(done, "moejax.train") == "data.gsm8k_path moved to train.gsm8k_path"
    assert not (tmp_path / "w").exists()
    c = ml_collections.ConfigDict({**base_config().to_dict(), "job": "train",
                                   "model": {"hidden_size": 32, "checkpoint": ""}})
    with pytest.raises(ConfigError, match="^model.hidden_size moved to train.model.hidden_size$"):
        jobs.check(c, warn=False)


# -- the perplexity job's window: its own section, the eval job's fields stay ----------------

@pytest.mark.parametrize("old, new", sorted(MOVED_FOR_JOB["perplexity"].items()))
def test_the_eval_jobs_window_given_to_the_perplexity_job_names_its_own(old, new):
    c = base_config()
    c.job = "perplexity"
    section, leaf = old.split(".")
    c[section][leaf] = 300 if leaf != "stride" else 64  # each a value the eval job takes
    with pytest.raises(ConfigError) as e:
        jobs.check(c, warn=False)
    assert str(e.value) == (f"{old}={c[section][leaf]} is not read by the perplexity job: it "
                            f"moved to {new}")
    c.job = "eval"  # the eval job's heldout task still reads it
    c.eval.task = "heldout"
    jobs.check(c, warn=False)


# -- the train job: the one check, the one error path ---------------------------------------

def test_the_train_config_passes_the_one_check_without_a_warning(capsys):
    for arg in (None, "smoke"):
        c = _train_config(arg)
        assert c.job == "train" and set(c.keys()) == set(base_config().keys())
        jobs.check(c)
        say_unapplied(c, True, base_config())  # its cache fields: defaults
    assert capsys.readouterr().err == ""
    smoke = _train_config("smoke")
    assert (smoke.train.steps, smoke.train.model.hidden_size, smoke.train.log_every) == (6, 32, 2)
    full = _train_config()
    assert (full.train.steps, full.train.model.hidden_size, full.train.export_dtype) == (
        900, 96, "bfloat16")


def test_a_train_run_says_what_it_does_not_read(capsys):
    c = _train_config("smoke")
    c.cache.slots, c.replay.trace, c.run.prompt = 4, "t.npz", "hi"
    jobs.check(c)
    err = capsys.readouterr().err
    for said in ("cache.slots=4 does not apply: read only by the jobs that run the model and the "
                 "replay job; this is a train run",
                 "replay.trace='t.npz' does not apply: its section is read only by the replay, "
                 "curve and plan jobs; this is a train run",
                 "run.prompt='hi' does not apply: read only by the generate job; this is a "
                 "train run"):
        assert err.count(said) == 1, (said, err)


@pytest.mark.parametrize("flag, message", [
    ("--config.train.steps=-1", "train.steps=-1 must be positive"),
    ("--config.model.hidden_size=64",
     "--config.model.hidden_size: moved to --config.train.model.hidden_size"),
])
def test_a_mistake_at_the_train_door_is_one_line(tmp_path, flag, message):
    done = _command("moejax.train", f"--config={TRAIN}:smoke", flag, cwd=str(tmp_path))
    assert _one_line(done, "moejax.train") == message
    assert not (tmp_path / "runs").exists()  # refused before a workdir was named or made


# -- a trace-driven generate run reads the replay section's trace options -------------------

def test_a_trace_driven_run_is_not_told_its_trace_options_do_not_apply(capsys):
    c = base_config()
    c.policies.routing = f"trace(path={bundled.capture_path('olmoe_code')!r})"
    c.replay.request_tokens, c.replay.prefill_tokens, c.replay.num_experts = 128, 32, 64
    c.replay.engine = "reference"  # this one only a replay reads
    jobs.check(c)
    err = capsys.readouterr().err
    assert "replay.engine='reference' does not apply" in err
    assert "request_tokens" not in err and "prefill_tokens" not in err, err
    assert "num_experts" not in err, err


# -- results written before the move read by the new names ----------------------------------

def _as_written_before(config: dict) -> dict:
    """`config` (a results.json `config`) as moejax wrote it before fields moved."""
    old = copy.deepcopy(config)
    replay, ppl = old.pop("replay"), old.pop("perplexity")
    text = old["quality"].pop("text_file") or ppl["text_file"]
    del old["train"]
    old.update(trace=replay["trace"], trace_num_experts=replay["num_experts"],
               trace_strict=replay["strict"], trace_request_tokens=replay["request_tokens"],
               trace_prefill_tokens=replay["prefill_tokens"], text_file=text)
    old["cache"]["replay_engine"] = replay["engine"]
    if old["job"] == "perplexity":
        old["eval"].update(window=ppl["window"], stride=ppl["stride"],
                           max_tokens=ppl["max_tokens"])
    return old


@pytest.mark.parametrize("job", ["replay", "perplexity", "quality"])
def test_a_results_config_written_before_the_move_reads_as_one_written_now(job):
    c = base_config()
    c.job, c.cache.slots = job, 8
    if job == "replay":
        c.replay.trace, c.replay.request_tokens, c.replay.engine = "t.npz", 128, "reference"
    elif job == "perplexity":
        c.perplexity.text_file, c.perplexity.window = "a.txt", 64
    else:
        c.quality.text_file = "b.txt"
    now = c.to_dict()
    before = _as_written_before(now)
    assert "replay" not in before and "trace" in before
    assert current_config(before) == now
    assert current_config(now) is now
    # A field the old config lacks under its old name stays absent (not made up as a default).
    sparse = current_config({"job": "replay", "trace": "t.npz", "cache": {"slots": 8}})
    assert sparse["replay"] == {"trace": "t.npz"} and sparse["train"] == now["train"]


def test_a_cell_run_before_the_move_reads_as_one_run_now():
    """The analysis rows of a sweep cell: results.json's `config` by the current names, so a
    cell run before fields moved and one run since agree field for field (`setup`), its
    request cut and trace among them."""
    from moejax.analysis import claim_cells, host_compute, sweep_cells
    from tests.sweep_fixtures import synthetic_results

    c = base_config()
    c.job, c.replay.trace, c.replay.request_tokens, c.replay.prefill_tokens = (
        "replay", "/traces/x.npz", 128, 32)
    now = synthetic_results("x", 0.05, "lru", "none", seed=0)
    now["config"] = {**c.to_dict(), "policies": now["config"]["policies"]}
    before = {**now, "config": _as_written_before(now["config"])}
    rows = [sweep_cells.cell_row("cell", r) for r in (now, before)]
    assert rows[0]["setup"] == rows[1]["setup"] and rows[0]["trace"] == rows[1]["trace"] == "x"
    assert rows[0]["setup"]["replay.request_tokens"] == "128"
    assert all(k != "replay.trace" for k, _ in claim_cells.other_of(rows[1]["setup"]))
    cell = host_compute.cell_of({**rows[1], "miss": "fetch", "decode_tok_per_s": 10.0})
    assert (cell.request_tokens, cell.prefill_tokens) == (128, 32)
    # A row built before (its setup by the old names) still gives its request cut.
    old_setup = {"trace_request_tokens": "64", "trace_prefill_tokens": "16"}
    cell = host_compute.cell_of({**rows[1], "setup": old_setup, "miss": "fetch",
                                 "decode_tok_per_s": 10.0})
    assert (cell.request_tokens, cell.prefill_tokens) == (64, 16)
