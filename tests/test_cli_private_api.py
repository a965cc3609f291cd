"""What `moejax/cli.py` reads of ml_collections' private config_flags classes (`cli.PRIVATE_API`)
is still there: an upgrade that moves any of it fails here, naming it, rather than turning a
user's one-line error into a traceback. pyproject pins absl-py and ml-collections to the minor
versions checked."""

from __future__ import annotations

import inspect
import os

import pytest
from absl import flags
from ml_collections.config_flags import config_flags as private

from moejax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The classes, by the names cli.py reads them by (None: moved).
CLASSES = {name: getattr(private, name, None) for name in cli.PRIVATE_API}


def _flags_with(*overrides: str):
    argv = ["prog", f"--config={ROOT}/configs/default.py", *overrides]
    values = flags.FlagValues()
    private.DEFINE_config_file("config", flag_values=values, sys_argv=argv, lock_config=True)
    values(argv)
    return values


@pytest.mark.parametrize("name", sorted(cli.PRIVATE_API))
def test_every_private_class_cli_reads_exists(name):
    assert inspect.isclass(CLASSES[name]), f"config_flags.{name} moved"


def test_the_file_parser_takes_a_path_and_keeps_its_flags_name():
    assert list(inspect.signature(private.ConfigFileFlagParser.parse).parameters) == [
        "self", "path"]
    assert private.ConfigFileFlagParser(name="config").name == "config"


def test_an_override_is_a_field_flag_with_a_name_and_a_parser():
    values = _flags_with("--config.seed=3", "--config.run.prompts='\"a\"'")
    assert isinstance(values["config"], CLASSES["_ConfigFlag"])
    assert values["config"].value.seed == 3
    field = values["config.seed"]
    assert isinstance(field, CLASSES["_ConfigFieldFlag"])
    assert field.name == "config.seed" and field.parser is not None
    assert isinstance(values["config.run.prompts"], CLASSES["_ConfigFieldMultiFlag"])


def test_a_config_file_that_does_not_load_leaves_an_error_config_holding_its_error(tmp_path):
    holder = CLASSES["_ErrorConfig"](OSError("Failed loading config file"))
    assert isinstance(vars(holder)["_error"], OSError)
    # What cli makes of it: the placeholder's error, as one line naming the file.
    missing = tmp_path / "nowhere.py"
    argv = ["prog", f"--config={missing}"]
    values = flags.FlagValues()
    private.DEFINE_config_file("config", flag_values=values, sys_argv=argv)
    with pytest.raises(cli.UsageError, match=f"--config={missing}: no such file"):
        cli.parse_flags(argv, values)
