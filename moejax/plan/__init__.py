"""The planner: for a model on a machine, what fits and what to run (the plan job,
`moejax/jobs/plan.py`; docs/DESIGN.md "The planner").

`memory_fit.py`: what a device budget holds of a model (the dense weights, the KV cache for a
context, the expert slots at each precision, or what it lacks). `search.py`: the candidate
configurations, stage by stage, and the whole space they are drawn from. `forecast.py`: a
candidate replayed on the virtual clock, and the band the clock's validation puts around it.
`verify.py`: the recommendation run live against its band.
"""

from moejax.plan.memory_fit import GB, Fit, dense_bytes, fit, kv_cache_bytes

__all__ = ["GB", "Fit", "dense_bytes", "fit", "kv_cache_bytes"]
