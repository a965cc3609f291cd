"""Scored routing traces on held-out prose, code and math (moejax/assets/traces/README.md).

    # the six short traces of the embedded model: 64-token prompt, 192 decode steps, two
    # prompts per domain -> W/{prose,code,math}_{0,1}.npz (moejax/assets/traces/*.npz)
    python -m moejax.main --config=configs/record_traces.py --workdir=W
    # one trace per domain as long as the embedded model's context (max_position_embeddings,
    # 1024): 64-token prompt, 960 decode steps -> W/{prose,code,math}.npz (traces/long/)
    python -m moejax.main --config=configs/record_traces.py:long --workdir=W
    # a family's `tiny` preset with random weights drawn from `seed`, as long as its context
    # (512): 64-token prompt, 448 decode steps -> W/{prose,code,math}.npz (traces/families/)
    python -m moejax.main --config=configs/record_traces.py:family=mixtral --workdir=W

`family` is one of moejax.families.FAMILIES (mixtral, olmoe, phimoe, qwen2_moe).
"""

from moejax.jobs.schema import base_config, parse_args

PROMPT_TOKENS = 64


def get_config(arg: str | None = None):
    c = base_config()
    c.job = "record_traces"
    c.run.max_new_tokens = 192
    c.tracing.prompts_per_domain = 2
    c.tracing.prompt_tokens = PROMPT_TOKENS
    if arg == "long":
        from moejax.model_source import embedded_config

        c.tracing.prompts_per_domain = 1
        c.run.max_new_tokens = embedded_config().max_position_embeddings - PROMPT_TOKENS
        return c
    family = parse_args(arg, {"family": ""})["family"]
    if family:
        from moejax.families import FAMILIES, preset

        if family not in FAMILIES:
            raise ValueError(f"family={family!r} is not one of {sorted(FAMILIES)}")
        c.model.family, c.model.preset = family, "tiny"
        c.tracing.prompts_per_domain = 1
        c.run.max_new_tokens = preset(family, "tiny").max_position_embeddings - PROMPT_TOKENS
    return c
