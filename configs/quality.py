"""What a cache configuration costs the model's output: the configured cache against the same
model with every expert resident at native precision, on the same tokens (KL, top-1
agreement, bits per byte of both, greedy drift) — moejax/jobs/quality.py.

python -m moejax.main --config=configs/quality.py --config.quality.text_file=README.md --workdir=W
python -m moejax.main --config=configs/quality.py --config.quality.text_file=README.md --workdir=W \
    --config.policies.miss='drop(keep=1)'
python -m moejax.main --config=configs/quality.py --config.quality.text_file=README.md --workdir=W \
    --config.cache.precision=int2
python -m moejax.main --config=configs/quality.py --config.eval.task=gsm8k \
    --config.eval.max_examples=8 --workdir=W
"""

from moejax.jobs.schema import base_config


def get_config(arg: str | None = None):
    if arg:  # (`:scale=tiny` belongs to the family configs, configs/olmoe_5pct.py ...)
        raise ValueError(f"configs/quality.py takes no argument (got {arg!r})")
    c = base_config()
    c.job = "quality"
    return c
