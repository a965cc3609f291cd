"""Nothing a user sets is accepted and ignored (issue 39, part 2), table-driven: each case of
the issue either exits 2 with one line naming the field, or warns in one line and keeps the
warning in results.json's `warnings`. Also the door's own help: `--fields` lists every
declared field, `--help` the jobs and config files, and a run given no `--workdir` writes to a
fresh `runs/<config>-<date-time>/`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_collections
import pytest

from moejax import cli, jobs
from moejax import workdir as workdir_lib
from moejax.jobs.declared import check_typed, unread_by_job
from moejax.jobs.declared import leaves as fields_of
from moejax.jobs.schema import JOBS, LIVE, NOT_GIVEN, READ_BY, base_config
from moejax.testing import with_fields

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE = os.path.join(ROOT, "moejax", "assets", "traces", "code_0.npz")


def _main(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "moejax.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


# -- refused: exit 2, one line naming the flag -----------------------------------------------

@pytest.mark.parametrize("flags, named", [
    (["--config.policies.eviction="], "--config.policies.eviction=: empty is the field's "
                                      "\"not given\""),
    (["--config.cache.slots=0"], "--config.cache.slots=0: 0 is the field's \"not given\" "
                                 "(the run would go on as if the flag were absent); it takes "
                                 "a slot count >= 1"),
    (["--config.run.prompts=not json"], "--config.run.prompts=not json: takes a list of "
                                        "quoted prompts"),
    (["--config.policies.prefetch=score_percentile(p=150)"],
     "prefetch policy 'score_percentile(p=150)': p=150 must be a number in [0, 100)"),
])
def test_a_setting_that_would_be_ignored_is_refused_in_one_line(tmp_path, flags, named):
    """Through the door (the conflicting pairs are test_declared_fields's)."""
    done = _main("--config=configs/default.py", f"--workdir={tmp_path / 'w'}", *flags)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("moejax.main: error: "), done.stderr
    assert named in lines[0], lines[0]
    assert not os.path.exists(tmp_path / "w")


@pytest.mark.parametrize("argv, value, named", [
    (["--config.policies.preset="], {"policies.preset": ""},
     "--config.policies.preset=: empty is the field's \"not given\""),
    (["--config.run.prompts=[]"], {"run.prompts": ()},
     "--config.run.prompts=[]: [] is the field's \"not given\""),
    (["--config.run.prompts=[1, 2]"], {"run.prompts": (1, 2)},
     "--config.run.prompts=[1, 2]: takes a list of quoted prompts"),
    (["--config.run.prompts", "hello"], {"run.prompts": ("hello",)},
     "--config.run.prompts=hello: takes a list of quoted prompts"),
])
def test_what_the_command_line_typed_is_checked(argv, value, named):
    with pytest.raises(cli.ConfigError) as e:
        check_typed(argv, with_fields(base_config(), **value), NOT_GIVEN)
    assert str(e.value).startswith(named), str(e.value)


def test_the_not_given_value_is_refused_only_when_it_is_what_the_flags_leave():
    c = base_config()
    check_typed(["--config.cache.slots=8"], with_fields(_copy(c), **{"cache.slots": 8}),
                NOT_GIVEN)
    # A later flag gives the field a value: the empty one before it is not what runs.
    check_typed(["--config.policies.eviction=", "--config.policies.eviction=lru"],
                with_fields(_copy(c), **{"policies.eviction": "lru"}), NOT_GIVEN)
    check_typed(['--config.run.prompts="a"'],
                with_fields(_copy(c), **{"run.prompts": ("a",)}), NOT_GIVEN)
    with pytest.raises(cli.ConfigError, match="--config.cache.slots=0: 0 is"):
        check_typed(["--config.cache.slots", "0"], c, NOT_GIVEN)


# -- warned and recorded ---------------------------------------------------------------------

def _copy(config):
    return ml_collections.ConfigDict(config.to_dict())


def _replay(**fields):
    c = base_config()
    c.job, c.replay.trace, c.model.preset, c.clock.kind = "replay", TRACE, "", "virtual"
    c.log.progress = c.log.tensorboard = False
    c.cache.slots = 16
    return with_fields(c, **fields)


WARNED = [
    ({"io.split": 4}, "io.split=4 does not apply: a replay reads no checkpoint"),
    ({"storage.read_gbps": 2.0}, "storage.read_gbps=2 does not apply: this run has no host "
                                 "tier"),
    ({"profile.enabled": True}, "profile.enabled=True does not apply: its section is read "
                                "only by the generate job; this is a replay run"),
    ({"run.prompt": "hello"}, "run.prompt='hello' does not apply: read only by the generate "
                              "job; this is a replay run"),
    ({"run.max_new_tokens": 5}, "run.max_new_tokens=5 does not apply: read only by the "
                                "generate and record_traces jobs"),
    ({"perplexity.text_file": "README.md"}, "perplexity.text_file='README.md' does not apply: "
                                            "its section is read only by the perplexity job"),
    ({"eval.window": 64}, "eval.window=64 does not apply: read only by the eval job"),
    ({"train.steps": 3}, "train.steps=3 does not apply: its section is read only by the train "
                         "job; this is a replay run"),
    ({"eval.shots": 2}, "eval.shots=2 does not apply: read only by the eval job"),
    ({"quality.max_tokens": 8}, "quality.max_tokens=8 does not apply: its section is read "
                                "only by the quality job"),
    ({"model.checkpoint": "/nowhere"}, "model.checkpoint='/nowhere' does not apply: read "
                                       "only by the jobs that run the model"),
    ({"tracing.record": True}, "tracing.record=True does not apply: read only by the "
                               "generate job"),
]


def test_every_setting_a_replay_ignores_is_said_once_and_kept_in_results(tmp_path, capsys):
    fields = {k: v for given, _ in WARNED for k, v in given.items()}
    results = jobs.run(_replay(**fields), str(tmp_path))
    err = capsys.readouterr().err
    with open(tmp_path / "results.json") as f:
        recorded = json.load(f)["warnings"]
    assert recorded == results["warnings"]
    for _, message in WARNED:
        assert err.count(message) == 1, (message, err)
        assert sum(message in w for w in recorded) == 1, (message, recorded)


def test_the_table_names_only_declared_fields_and_real_jobs():
    schema = base_config()
    for name, readers in READ_BY:
        node = schema
        for part in name.rstrip(".").split("."):
            assert part in node, name
            node = node[part]
        assert set(readers) <= set(JOBS), name


@pytest.mark.parametrize("job", JOBS)
def test_a_field_a_job_reads_is_never_said_not_to_apply(job):
    """Set every job-specific field to another value: the job's own fields are not named."""
    c = base_config()
    c.job = job
    changed = ml_collections.ConfigDict(c.to_dict())
    for name, _ in READ_BY:
        fields = fields_of(c[name.rstrip(".")], name) if name.endswith(".") else [name]
        for field in fields:
            *sections, leaf = field.split(".")
            node = changed
            for section in sections:
                node = node[section]
            value = node[leaf]
            node[leaf] = (not value if isinstance(value, bool) else value + 1
                          if isinstance(value, (int, float)) else ("x",)
                          if isinstance(value, tuple) else value + "x")
    said = {field for field, _ in unread_by_job(changed, c, READ_BY, LIVE)}
    readers = dict(READ_BY)
    for field in said:
        jobs_ = readers.get(field) or readers[field.split(".")[0] + "."]
        assert job not in jobs_, field
    assert said  # every job leaves some other job's fields unread


# -- the door's help, and a run given no workdir ---------------------------------------------

def test_fields_lists_every_declared_field_with_its_type_and_default():
    done = _main("--fields")
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0]: line for line in done.stdout.splitlines()[1:]}

    def leaves(config, where=""):
        for key in config.keys():
            value = config[key]
            if isinstance(value, ml_collections.ConfigDict) and value.keys():
                yield from leaves(value, f"{where}{key}.")
            else:
                yield f"{where}{key}"

    assert set(listed) == set(leaves(base_config()))
    assert listed["cache.capacity_frac"].split()[1:3] == ["float", "0.05"]
    assert listed["run.prompt"].endswith("[generate]")


def test_help_lists_the_jobs_the_config_files_and_where_fields_are_declared():
    done = _main("--help")
    assert done.returncode == 0, done.stderr
    for job in ("generate", "perplexity", "quality", "eval", "record_traces", "replay",
                "train"):
        assert job in done.stdout
    assert "mixtral_1pct.py" in done.stdout and "moejax/jobs/schema.py" in done.stdout
    assert "--fields" in done.stdout


def test_a_run_without_workdir_writes_a_fresh_one_and_says_where(tmp_path):
    done = _main(f"--config={ROOT}/configs/replay.py", f"--config.replay.trace={TRACE}",
                 "--config.cache.slots=16", "--config.log.progress=False", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    said = [ln for ln in done.stderr.splitlines() if ln.startswith("workdir: ")]
    assert len(said) == 1 and said[0].startswith("workdir: runs/replay-"), done.stderr
    assert os.path.isfile(tmp_path / said[0].split(": ", 1)[1] / "results.json")


def test_a_fresh_workdir_never_reuses_a_name(tmp_path):
    root = str(tmp_path / "runs")
    first = workdir_lib.fresh("configs/olmoe_1pct.py:scale=tiny", root, now=0)
    assert os.path.basename(first).startswith("olmoe_1pct-scale=tiny-19")
    os.makedirs(first)
    second = workdir_lib.fresh("configs/olmoe_1pct.py:scale=tiny", root, now=0)
    assert second == first + "-2"


def test_the_mixtral_preset_runs_as_written_and_stops_with_how_to_convert(tmp_path):
    """The design card's command, no --workdir: the clear line, and nothing left behind."""
    done = _main(f"--config={ROOT}/configs/mixtral_1pct.py", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "convert a checkpoint and pass --config.model.checkpoint" in done.stderr
    assert not os.path.exists(tmp_path / "runs")


def test_ctrl_c_while_an_extension_initialises_is_an_interruption():
    """Ctrl-C in the first seconds lands inside a C extension's import, which re-raises it as
    "ImportError: initialization failed": one line, status 130, not a traceback."""
    def body():
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise ImportError("initialization failed") from e

    assert cli.guarded("prog", body, kept=lambda: "nothing written") == cli.INTERRUPTED
