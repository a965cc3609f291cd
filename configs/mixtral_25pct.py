"""mixtral with 25% of its bytes in the device cache (the whole model at native precision,
as SpecMD counts: `cache.capacity_of="model"`).

python -m moejax.main --config=configs/mixtral_25pct.py --workdir=W --config.model.checkpoint=CKPT
python -m moejax.main --config=configs/mixtral_25pct.py:scale=tiny --workdir=W
"""

from moejax.jobs.schema import cache_experiment


def get_config(arg: str | None = None):
    return cache_experiment("mixtral", 0.25, arg)
