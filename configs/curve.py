"""A replay's capacity curve: each eviction's hits, late hits, misses and collision misses at
every cache size, from top-k slots to where nothing more is gained (no model runs).

python -m moejax.main --config=configs/curve.py \
    --config.replay.trace=moejax/assets/captures/olmoe_code.jsonl \
    --config.model.family=olmoe --config.model.preset=olmoe-1b-7b --workdir=W

`curve.policies` (default "lru,lru_per_layer") names the evictions, one curve each;
`curve.max_slots` the largest size (0: where nothing more is gained); `curve.checks` how many
sizes of each curve are replayed again and compared (the run is refused if one differs).
Every other setting is a replay's of the same config (configs/replay.py: the trace, replay.*,
cache.pin_scope, the prefetch, miss and routing policies, the clock). Global LRU's curve comes
from one pass over the requests (stack distances, exact: docs/DESIGN.md "Capacity curves in one
pass"), the rest by replaying each size; each row says which. Writes W/results.json (`curve`)
and W/curve.png.
"""

from moejax.jobs.schema import base_config


def get_config(arg: str | None = None):
    if arg:
        raise ValueError(f"configs/curve.py takes no argument (got {arg!r})")
    c = base_config()
    c.job = "curve"
    c.model.preset = ""  # the trace's own model config, or a family preset named here
    c.clock.kind = "virtual"
    # No prefetch (the default combination's score_percentile would run on a scored trace):
    # the stack rule holds without one.
    c.policies.prefetch = "none"
    return c
