"""moejax checkpoints: Hugging Face safetensors in, TensorStore experts + Orbax dense out."""

from moejax.checkpoint.errors import CheckpointError

__all__ = ["CheckpointError"]
