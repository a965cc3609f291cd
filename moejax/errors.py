"""The errors a user's mistake can raise, and the warning a library module gives: errors end a
run with one or two lines naming the input at fault (the entry points, `moejax.cli.guarded`,
print them without a traceback); a warning is one line on stderr, formatted by the entry point
that runs (`moejax.cli` installs its `prog: warning: ...` format with `set_warning_printer`).
Library code raises and warns through this module and never formats for a terminal itself."""

import sys
from typing import Callable


class ConfigError(ValueError):
    """A configuration value (a job config field, a policy spec, a command-line flag, a model
    configuration) is missing, unknown or inconsistent."""


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, corrupt, or does not match the model's configuration.

    The message always names the file (and the tensor, layer or expert) at fault."""


class CheckFailed(RuntimeError):
    """A result a run checks against an independent computation of the same thing differs
    from it: the run refuses to report it (the message names both values)."""


class UsageError(ConfigError):
    """What was typed or pointed at is wrong (exit status 2)."""


def _default_printer(message: str) -> None:
    print(f"moejax: warning: {message}", file=sys.stderr)


_printer: Callable[[str], None] = _default_printer


def set_warning_printer(printer: Callable[[str], None]) -> None:
    """How `warn` shows a warning: an entry point's format (`moejax.cli.warn`)."""
    global _printer
    _printer = printer


def warn(message: str) -> None:
    """One warning line for the user (a setting that does not apply, a value kept)."""
    _printer(message)
