"""Replays a routing trace through the expert cache (no model runs).

python -m moejax.main --config=configs/replay.py --config.replay.trace=PATH --config.cache.slots=N \
    --config.policies.eviction=lru --config.policies.prefetch=none --config.policies.miss=fetch \
    --workdir=W

Traces: moejax .npz (live runs with `tracing.record`, moejax/assets/traces), capture JSONL
(moejax/assets/captures), vLLM routing-logger JSONL. Id-only traces need the model named for
expert sizes: --config.model.family=olmoe --config.model.preset=olmoe-1b-7b.

Quantized experts are sized from that model config (no weights are loaded), e.g. SpecMD's 5% of
OLMoE-1B-7B at four bits (0.64 GiB, 195 slots), or the precision cascade over int4 and int2:

    --config.cache.capacity_frac=0.05 --config.cache.capacity_of=model \
    --config.cache.precision=int4 [--config.policies.preset=specmd_3]
"""

from moejax.jobs.schema import base_config


def get_config(arg: str | None = None):
    if arg:  # (`:scale=tiny` belongs to the family configs, configs/olmoe_5pct.py ...)
        raise ValueError(f"configs/replay.py takes no argument (got {arg!r})")
    c = base_config()
    c.job = "replay"
    c.model.preset = ""  # the trace's own model config, or a family preset named here
    c.clock.kind = "virtual"
    return c
