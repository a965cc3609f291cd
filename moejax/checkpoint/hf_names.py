"""Where each moejax parameter comes from in a Hugging Face checkpoint.

Dense parameters are addressed by flat dotted paths of the NNX state ("layers.3.attn.q.kernel").
HF linear weights are `[out, in]`; NNX kernels are `[in, out]`, hence the transposes.
"""

from __future__ import annotations

import numpy as np

from moejax.checkpoint.safetensors_dir import SafetensorsDir
from moejax.errors import CheckpointError
from moejax.families import get_family
from moejax.model_config import ModelConfig


def dense_sources(cfg: ModelConfig) -> dict[str, tuple[str, bool]]:
    """moejax path -> (HF tensor name, transpose?)."""
    fam = get_family(cfg.family)
    src: dict[str, tuple[str, bool]] = {"embed.embedding": ("model.embed_tokens.weight", False)}

    def norm(path: str, hf: str):
        src[f"{path}.scale"] = (f"{hf}.weight", False)
        if cfg.norm == "layer":
            src[f"{path}.bias"] = (f"{hf}.bias", False)

    def lin(path: str, hf: str, bias: bool):
        src[f"{path}.kernel"] = (f"{hf}.weight", True)
        if bias:
            src[f"{path}.bias"] = (f"{hf}.bias", False)

    for i in range(cfg.num_layers):
        p, hp = f"layers.{i}", f"model.layers.{i}"
        norm(f"{p}.input_norm", f"{hp}.input_layernorm")
        norm(f"{p}.post_norm", f"{hp}.post_attention_layernorm")
        for proj in "qkv":
            lin(f"{p}.attn.{proj}", f"{hp}.self_attn.{proj}_proj", cfg.qkv_bias)
        lin(f"{p}.attn.o", f"{hp}.self_attn.o_proj", cfg.o_bias)
        if cfg.qk_norm:
            src[f"{p}.attn.q_norm.scale"] = (f"{hp}.self_attn.q_norm.weight", False)
            src[f"{p}.attn.k_norm.scale"] = (f"{hp}.self_attn.k_norm.weight", False)
        if cfg.is_moe_layer(i):
            lin(f"{p}.router.proj", f"{hp}.{fam.moe_prefix}.gate", False)
            if cfg.shared_expert_intermediate_size:
                for part in ("gate", "up", "down"):
                    lin(f"{p}.shared.{part}", f"{hp}.mlp.shared_expert.{part}_proj", False)
                lin(f"{p}.shared_gate", f"{hp}.mlp.shared_expert_gate", False)
        else:
            for part in ("gate", "up", "down"):
                lin(f"{p}.mlp.{part}", f"{hp}.mlp.{part}_proj", False)
    norm("final_norm", "model.norm")
    if not cfg.tie_word_embeddings:
        lin("lm_head", "lm_head", cfg.lm_head_bias)
    return src


def read_layer_experts(st: SafetensorsDir, cfg: ModelConfig,
                       layer: int) -> tuple[np.ndarray, np.ndarray]:
    """One layer's routed experts as `(gate_up [E, H, 2I], down [E, I, H])`.

    Accepts both the per-expert names `save_pretrained` writes and transformers' fused
    in-memory form (`experts.gate_up_proj [E, 2I, H]`, `experts.down_proj [E, H, I]`)."""
    fam = get_family(cfg.family)
    base = f"model.layers.{layer}.{fam.moe_prefix}.experts"
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.expert_intermediate_size
    if f"{base}.gate_up_proj" in st:
        gu = np.asarray(st.get(f"{base}.gate_up_proj"))
        dn = np.asarray(st.get(f"{base}.down_proj"))
        _check(gu.shape, (e, 2 * i, h), f"{base}.gate_up_proj", st)
        _check(dn.shape, (e, h, i), f"{base}.down_proj", st)
        return np.ascontiguousarray(gu.transpose(0, 2, 1)), np.ascontiguousarray(
            dn.transpose(0, 2, 1))
    g_name, u_name, d_name = fam.expert_proj_names
    gate_up = None
    down = None
    for x in range(e):
        g = st.get(f"{base}.{x}.{g_name}.weight")
        u = st.get(f"{base}.{x}.{u_name}.weight")
        d = st.get(f"{base}.{x}.{d_name}.weight")
        _check(g.shape, (i, h), f"{base}.{x}.{g_name}.weight", st)
        _check(u.shape, (i, h), f"{base}.{x}.{u_name}.weight", st)
        _check(d.shape, (h, i), f"{base}.{x}.{d_name}.weight", st)
        if gate_up is None:
            gate_up = np.empty((e, h, 2 * i), g.dtype)
            down = np.empty((e, i, h), d.dtype)
        gate_up[x, :, :i] = g.T
        gate_up[x, :, i:] = u.T
        down[x] = d.T
    return gate_up, down


def _check(got, want, name: str, st: SafetensorsDir) -> None:
    if tuple(got) != tuple(want):
        raise CheckpointError(
            f"{st.directory}: tensor {name!r} has shape {tuple(got)}, the config implies {want}")
