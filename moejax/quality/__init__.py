"""What a cache configuration costs the model's output, measured against the reference model
(the same model, every expert resident at native precision): per-token divergence of the
next-token distributions (`token_comparison`) and greedy drift (`drift`); the quality job
(`moejax/jobs/quality.py`) runs both."""

from moejax.quality import drift, token_comparison
from moejax.quality.token_comparison import TokenComparison, compare

__all__ = ["TokenComparison", "compare", "drift", "token_comparison"]
