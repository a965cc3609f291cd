"""The planner (in progress): for a model on a machine, what fits and what to run.

Built so far: `memory_fit.py`, what a device budget holds of a model — the dense weights, the
KV cache for a context, and the expert slots left at each precision, or what it lacks.
"""

from moejax.plan.memory_fit import GB, Fit, dense_bytes, fit, kv_cache_bytes

__all__ = ["GB", "Fit", "dense_bytes", "fit", "kv_cache_bytes"]
