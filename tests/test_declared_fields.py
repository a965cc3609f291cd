"""Every field a config holds is declared, whatever set it (issue 39, part 1): a config file
that sets an undeclared field, a misspelled section or a value of the wrong kind is refused
with one line naming it before anything loads; a grid whose base config has a typo is refused
at launch; and, as a property, any declared field set to another kind of value in a config
file is refused by the run's check."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax import jobs
from moejax.errors import ConfigError
from moejax.jobs.schema import base_config
from tests.fuzzing import examples

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config_file(tmp_path, body: str, name: str = "mine.py") -> str:
    path = tmp_path / name
    path.write_text("from moejax.jobs.schema import base_config\n\n\n"
                    "def get_config():\n    c = base_config()\n"
                    + "".join(f"    {line}\n" for line in body.splitlines())
                    + "    return c\n")
    return str(path)


def _main(*args):
    return subprocess.run([sys.executable, "-m", "moejax.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("body, named", [
    ("c.cache.capacity_fraction = 0.1",
     "cache.capacity_fraction is not a declared field: cache has no field "
     "'capacity_fraction' (did you mean cache.capacity_frac?)"),
    ("c.polices = {'eviction': 'lru'}",
     "polices is not a declared field: the config has no field 'polices' (did you mean "
     "policies?)"),
    # ml_collections refuses this assignment itself, naming no field: the file's line does.
    ("c.cache.capacity_frac = '0.5'",
     "cannot be casted to type <class 'float'> (at mine.py:6: c.cache.capacity_frac = '0.5')"),
    ("c.policies = 'lru'", "(at mine.py:6: c.policies = 'lru')"),
])
def test_a_config_file_mistake_is_one_line_before_anything_loads(tmp_path, body, named):
    done = _main(f"--config={_config_file(tmp_path, body)}", f"--workdir={tmp_path / 'w'}")
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("moejax.main: ") and named in lines[0], lines[0]
    assert not os.path.exists(tmp_path / "w")  # refused before the workdir was made


def test_a_grid_whose_base_config_has_a_typo_is_refused_at_launch(tmp_path):
    grid = tmp_path / "grid.py"
    grid.write_text(
        "from moejax.jobs.schema import replay_grid_config\n\n\n"
        "def get_config():\n    c = replay_grid_config()\n"
        "    c.cache.capacty_frac = 0.25\n    return c\n\n\n"
        "def sweep(add):\n    for s in (8, 16):\n"
        "        add(**{'replay.trace': 'moejax/assets/traces/code_0.npz', 'cache.slots': s})\n")
    done = subprocess.run([sys.executable, "-m", "launch.sweep", f"--config={grid}",
                           f"--sweep_dir={tmp_path / 's'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "cache.capacty_frac is not a declared field" in done.stderr
    assert "did you mean cache.capacity_frac?" in done.stderr
    assert not os.path.exists(tmp_path / "s" / "cells")  # nothing ran


def _leaves(config, where=""):
    for key in config.keys():
        value = config[key]
        if hasattr(value, "keys") and value.keys():
            yield from _leaves(value, f"{where}{key}.")
        else:
            yield f"{where}{key}", config.get_type(key)


LEAVES = [(name, kind) for name, kind in _leaves(base_config())
          if kind in (int, float, str, bool)]
# A value of each other kind: for a float field a str, for a str field an int, and so on.
OTHER = {int: ["3", 2.5, [1]], float: ["0.5", [0.5], {"a": 1}], str: [3, 0.5, [""]],
         bool: ["True", 2, [True]]}


@settings(max_examples=examples(150))
@given(st.sampled_from(LEAVES), st.data())
def test_any_declared_field_of_another_kind_in_a_config_file_is_refused(leaf, data):
    """A config file builds its ConfigDict unlocked and may swap a field's value for another
    kind (`c.cache.unlock()`; a dict assigned whole): the run's check names the field."""
    name, kind = leaf
    value = data.draw(st.sampled_from(OTHER[kind]), label="value")
    c = base_config().to_dict()
    node = c
    *path, last = name.split(".")
    for part in path:
        node = node[part]
    node[last] = value
    import ml_collections

    config = ml_collections.ConfigDict(c, type_safe=False)
    with pytest.raises(ConfigError, match=f"^{name.replace('.', '[.]')}="):
        jobs.check(config, warn=False)


def test_a_section_given_a_value_names_the_section():
    import ml_collections

    c = base_config().to_dict()
    c["policies"] = "lru"
    with pytest.raises(ConfigError, match=r"^policies='lru': policies is a section of fields "
                                          r"\(eviction, miss, modules, prefetch, preset, routing"):
        jobs.check(ml_collections.ConfigDict(c, type_safe=False), warn=False)


@pytest.mark.parametrize("returns, what", [("{'job': 'replay'}", "a dict"),
                                           ("None", "None (no return statement?)")])
def test_get_config_returning_anything_but_a_configdict_is_one_line(tmp_path, returns, what):
    path = tmp_path / "odd.py"
    path.write_text(f"def get_config():\n    return {returns}\n")
    done = _main(f"--config={path}", f"--workdir={tmp_path / 'w'}")
    assert done.returncode == 2
    assert done.stderr == (f"moejax.main: error: --config={path}: get_config() returned {what}, "
                           "not an ml_collections.ConfigDict (start from "
                           "moejax.jobs.schema.base_config() and return it)\n")


def test_settings_a_run_does_not_apply_are_said_and_kept_in_results(tmp_path, capsys):
    """The issue's `io.split=4` without a host tier and `profile.enabled=True` on a replay:
    each one warning line, and both in results.json's `warnings`."""
    c = base_config()
    c.job, c.replay.trace, c.log.progress, c.log.tensorboard = "replay", os.path.join(
        ROOT, "moejax", "assets", "traces", "code_0.npz"), False, False
    c.profile.enabled, c.io.split = True, 4
    results = jobs.run(c, str(tmp_path))
    want = ["io.split=4 does not apply: a replay reads no checkpoint (io.* sets the live "
            "runtime's expert reader)",
            "profile.enabled=True does not apply: its section is read only by the generate job; "
            "this is a replay run"]
    err = capsys.readouterr().err
    for w in want:
        assert f"warning: {w}" in err
    import json

    with open(tmp_path / "results.json") as f:
        assert json.load(f)["warnings"] == want == results["warnings"]


@pytest.mark.parametrize("fields, message", [
    ({"cache.slots": 8, "cache.capacity_frac": 0.5},
     "cache.slots=8 and cache.capacity_frac=0.5 are both given: the run takes one (a slot "
     "count or a fraction of cache.capacity_of); drop one"),
    ({"run.prompt": "hello", "run.prompt_ids": "1,2"},
     "run.prompt_ids='1,2' and run.prompt='hello' are both given: the run takes one (the "
     "prompt's token ids or its text); drop one"),
])
def test_conflicting_fields_are_refused_naming_both(fields, message):
    c = base_config()
    for field, value in fields.items():
        section, name = field.split(".")
        setattr(c[section], name, value)
    with pytest.raises(ConfigError) as e:
        jobs.check(c, warn=False)
    assert str(e.value) == message
    # Either alone is fine.
    for field in fields:
        one = base_config()
        section, name = field.split(".")
        setattr(one[section], name, fields[field])
        jobs.check(one, warn=False)


@pytest.mark.parametrize("name", ["default", "eval", "perplexity", "quality", "replay"])
def test_a_config_that_takes_no_argument_refuses_one(tmp_path, name):
    done = _main(f"--config=configs/{name}.py:scale=tiny", f"--workdir={tmp_path / 'w'}")
    assert done.returncode == 2
    assert done.stderr == (f"moejax.main: error: --config=configs/{name}.py:scale=tiny: "
                           f"configs/{name}.py takes no argument (got 'scale=tiny')\n")
