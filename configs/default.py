"""Greedy generation with the embedded default model.

python -m moejax.main --config=configs/default.py --workdir=/tmp/moejax-default
python -m moejax.main --config=configs/default.py --workdir=W --config.model.checkpoint=CKPT
"""

from moejax.jobs.schema import base_config


def get_config(arg: str | None = None):
    if arg:  # (`:scale=tiny` belongs to the family configs, configs/olmoe_5pct.py ...)
        raise ValueError(f"configs/default.py takes no argument (got {arg!r})")
    return base_config()
