class CheckpointError(RuntimeError):
    """A checkpoint file is missing, corrupt, or does not match the model's configuration.

    The message always names the file (and the tensor, layer or expert) at fault."""
