"""Bits per byte (and per token) of the default model, or of a converted checkpoint, on a file.

python -m moejax.main --config=configs/perplexity.py --config.perplexity.text_file=PATH \
    --workdir=/tmp/ppl
python -m moejax.main --config=configs/perplexity.py --config.perplexity.text_file=PATH \
    --workdir=W --config.model.checkpoint=CKPT [--config.perplexity.window=512]
"""

from moejax.jobs.schema import base_config


def get_config(arg: str | None = None):
    if arg:  # (`:scale=tiny` belongs to the family configs, configs/olmoe_5pct.py ...)
        raise ValueError(f"configs/perplexity.py takes no argument (got {arg!r})")
    c = base_config()
    c.job = "perplexity"
    return c
