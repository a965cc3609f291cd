"""The model families moejax converts and runs (OLMoE, Mixtral, Qwen1.5/Qwen2-MoE, Phi-3.5-MoE):
each maps a Hugging Face config to a `ModelConfig` and has presets of published (and tiny)
dimensions. `get_family(name)`, `family_for_hf(hf_config)`, `preset(family, name, width=0)` (a
preset at another width: `model.width`, `family.at_width`)."""

from __future__ import annotations

from typing import Any

from moejax.errors import ConfigError
from moejax.families import mixtral, olmoe, phimoe, qwen_moe
from moejax.families.family import WIDTH_STEP, Family, at_width
from moejax.model_config import ModelConfig

__all__ = ["FAMILIES", "WIDTH_STEP", "Family", "config_from_hf", "family_for_hf", "get_family",
           "preset"]

FAMILIES: dict[str, Family] = {
    f.name: f for f in (olmoe.FAMILY, mixtral.FAMILY, qwen_moe.FAMILY, phimoe.FAMILY)}


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise ConfigError(f"unknown model family {name!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[name]


def family_for_hf(hf: dict[str, Any]) -> Family:
    model_type = hf.get("model_type")
    for fam in FAMILIES.values():
        if model_type in fam.hf_model_types:
            return fam
    known = sorted(t for f in FAMILIES.values() for t in f.hf_model_types)
    raise ConfigError(f"unknown Hugging Face model_type {model_type!r}; moejax converts {known}")


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    return family_for_hf(hf).config_from_hf(hf)


def preset(family: str, name: str, width: int = 0) -> ModelConfig:
    """A `ModelConfig` from a family's published (or tiny) dimensions; `width` N > 0: the same
    preset with hidden and MLP widths N (`family.at_width`, the rule; a positive multiple of
    `WIDTH_STEP`)."""
    fam = get_family(family)
    if name not in fam.presets:
        raise ConfigError(f"unknown preset {name!r} for {family}; known: {sorted(fam.presets)}")
    hf = fam.presets[name]
    if width:
        if isinstance(width, bool) or not isinstance(width, int) or width < WIDTH_STEP \
                or width % WIDTH_STEP:
            raise ConfigError(f"model.width={width!r} must be a multiple of {WIDTH_STEP} (at "
                              f"least {WIDTH_STEP}: each attention head keeps 8 dimensions, "
                              "and int4 / int2 codes fill whole bytes), or 0 (the preset's own)")
        hf = at_width(hf, width)
    return fam.config_from_hf(hf)
