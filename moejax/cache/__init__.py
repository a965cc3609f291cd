"""The expert cache, numpy only: which experts occupy the device slots and why.

`ExpertCache` (`expert_cache.py`) runs the four policies layer by layer, for the live runtime
(`moejax.serving`) and for trace replay (`moejax.replay`) alike, built from its shape, its
policies and one `CacheOptions` (`cache_options.py`); a layer runs as a pipeline of stages,
each its own module: `waves.py` (requests into waves), `admission.py` (hits, demand fetches, immediate
prefetch), `watchdog_queue.py`, `precision_pools.py`, `host_stage.py` (host compute) and
`placement.py` (full layers, seed); `staging.py` keeps the prefetch staging share
(`cache.prefetch_share`). `metrics.py` counts what DESIGN.md defines; `capacity.py`
holds the cache's shape and turns a byte budget into per-precision slot pools;
`host_tier.py` is the bounded host tier in front of storage; `host_path.py` the host path
of experts computed on the host and the planner a miss policy reads to choose it;
`hotlist.py` the placement a trace's request counts give; `from_spec.py` builds a run's cache
from its specs (`moejax.run_spec`); `summary.py` prints its table, writes its TensorBoard
series and its results.json section.
"""

from moejax.cache import hotlist, summary
from moejax.cache.cache_options import PIN_SCOPES, PREFETCH_QUEUES, CacheOptions
from moejax.cache.capacity import (
    CAPACITY_OF,
    Budget,
    CacheShape,
    PoolSpec,
    parse_shares,
    pools_for,
    precision_bytes_of,
    slots_for,
)
from moejax.cache.expert_cache import ExpertCache, SlotSink
from moejax.cache.from_spec import (
    CLOCKS,
    LOAD_PATHS,
    WARM_STARTS,
    build_cache,
    build_cache_for,
    build_host_tier,
    build_policies,
    clock_kind,
    model_bytes_of,
    policy_context,
    seed_cache,
)
from moejax.cache.host_path import HostPath, HostSpan, LayerPlan, LayerPlanner
from moejax.cache.host_tier import HostTier
from moejax.cache.metrics import (
    BYTES,
    COUNTERS,
    HOST_BYTES,
    HOST_COUNTERS,
    HOST_SECONDS,
    SECONDS,
    CacheMetrics,
    PassTiming,
    WaveOutcome,
)
from moejax.cache.speculation import SpeculationSchedule
from moejax.cache.staging import PREFETCH_SHARE_USES
from moejax.cache.staging import check as check_prefetch_share
from moejax.cache.summary import WALL_CLOCK, host_work_section, model_words

__all__ = [
    "BYTES", "CAPACITY_OF", "CLOCKS", "COUNTERS", "HOST_BYTES", "HOST_COUNTERS", "HOST_SECONDS",
    "LOAD_PATHS", "PIN_SCOPES", "PREFETCH_QUEUES", "PREFETCH_SHARE_USES", "SECONDS",
    "WALL_CLOCK", "WARM_STARTS",
    "Budget", "CacheMetrics", "CacheOptions", "CacheShape", "ExpertCache", "HostPath",
    "HostSpan", "HostTier", "LayerPlan", "LayerPlanner", "PassTiming", "PoolSpec", "SlotSink",
    "SpeculationSchedule", "WaveOutcome", "build_cache", "check_prefetch_share", "build_cache_for", "build_host_tier",
    "build_policies", "clock_kind", "host_work_section", "hotlist", "model_bytes_of",
    "model_words", "parse_shares", "policy_context", "pools_for",
    "precision_bytes_of", "seed_cache", "slots_for", "summary",
]
