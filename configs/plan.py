"""The planner: for a model on a machine, every cache configuration forecast on the virtual
clock, ranked, and the best recommended as a command line (moejax/jobs/plan.py).

python -m moejax.main --config=configs/plan.py --config.model.preset=olmoe-1b-7b \
    --config.model.width=32 --config.replay.trace=moejax/assets/captures/olmoe_code.jsonl \
    --config.hardware.file=W/hardware.json --config.plan.device_gb=0.0015 --workdir=D

python -m moejax.main --config=configs/plan.py --config.model.hf_config=PATH/config.json \
    --config.plan.device_gb=24 --workdir=D

`plan.device_gb` is what the expert slots may take (`plan.budget_of=device`: the whole device,
the dense weights and the KV cache of `plan.context` tokens taken first). Add
`--config.plan.verify=True` to run the recommendation live and compare it with its band.
"""

from moejax.jobs.schema import base_config


def get_config(arg: str | None = None):
    if arg:
        raise ValueError(f"configs/plan.py takes no argument (got {arg!r})")
    c = base_config()
    c.job = "plan"
    c.model.preset = ""  # the model: model.hf_config, model.checkpoint or a family preset
    c.clock.kind = "virtual"
    return c
