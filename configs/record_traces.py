"""Scored routing traces of the default model on held-out prose, code and math.

python -m moejax.main --config=configs/record_traces.py --workdir=/tmp/traces

The committed traces in moejax/assets/traces/ were written by this command (see WORKSPACE.md).
"""

from moejax.job_config import base_config


def get_config(arg: str | None = None):
    del arg
    c = base_config()
    c.job = "record_traces"
    c.run.max_new_tokens = 192
    c.tracing.prompts_per_domain = 2
    c.tracing.prompt_tokens = 64
    c.log.progress = False
    return c
