"""What a cache configuration costs the model's output, measured against the reference model
(the same model, every expert resident at native precision): per-token divergence of the
next-token distributions (`metrics`) and greedy drift (`drift`); the quality job
(`moejax/jobs/quality.py`) runs both."""

from moejax.quality import drift, metrics
from moejax.quality.metrics import TokenComparison, compare

__all__ = ["TokenComparison", "compare", "drift", "metrics"]
