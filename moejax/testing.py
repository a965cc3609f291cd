"""Tiny models for tests and demos: Hugging Face reference models and moejax models.

Importing the Hugging Face half needs the test extra (torch, transformers).
"""

from __future__ import annotations

import json
import os

import jax

from moejax.models import MoEDecoder, ResidentExperts, SteppedDecoder, random_experts, random_model  # noqa: F401 (re-export)
from moejax.traces import random_scored_trace  # noqa: F401 (re-export: tests and demos)


def config_from_flags(config_file: str, *flags: str):
    """`config_file`'s config with `--config.FIELD=VALUE` flags applied, parsed exactly as
    `python -m moejax.main` parses its command line (types checked, fields declared)."""
    from absl import flags as absl_flags
    from ml_collections import config_flags

    argv = ["moejax", f"--config={config_file}", *flags]
    values = absl_flags.FlagValues()
    holder = config_flags.DEFINE_config_file("config", flag_values=values, sys_argv=argv)
    values(argv)
    return holder.value


def with_fields(config, **fields):
    """`config` with dotted fields set in place and returned: `with_fields(c, **{"cache.slots":
    4})`."""
    for path, value in fields.items():
        *groups, leaf = path.split(".")
        node = config
        for group in groups:
            node = node[group]
        node[leaf] = value
    return config


def resident_decoder(model: MoEDecoder, gate_up, down, max_len: int, **kw) -> SteppedDecoder:
    experts = ResidentExperts({l: jax.numpy.asarray(v) for l, v in gate_up.items()},
                              {l: jax.numpy.asarray(v) for l, v in down.items()})
    return SteppedDecoder(model, experts, max_len=max_len, **kw)


# --- Hugging Face reference models -----------------------------------------------------------


def hf_model_from_config_file(path: str, seed: int = 0):
    """A transformers model built from a config JSON (with a `model_type` key), with weights
    drawn at a scale that gives decisive routing and logits of order one."""
    import torch
    import transformers

    with open(path) as f:
        spec = json.load(f)
    model_type = spec.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **spec)
    torch.manual_seed(seed)
    # The eager paths are the plain reference loops (the grouped-mm kernel also needs
    # 16-byte-aligned strides, which the awkward sizes here deliberately break).
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", experts_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            else:  # [out, in] (or fused [E, out, in]): unit-variance outputs
                p.normal_(0.0, p.shape[-1] ** -0.5)
    return model


def save_hf_model(model, directory: str, max_shard_size: str | None = None) -> str:
    os.makedirs(directory, exist_ok=True)
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kw)
    return directory
