"""The two errors a user's mistake can raise: both end a run with one or two lines naming
the input at fault (`moejax.main` prints them without a traceback)."""


class ConfigError(ValueError):
    """A configuration value (a job config field, a policy spec, a command-line flag, a model
    configuration) is missing, unknown or inconsistent."""


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, corrupt, or does not match the model's configuration.

    The message always names the file (and the tensor, layer or expert) at fault."""
