"""Qwen1.5-MoE / Qwen2-MoE: q/k/v biases, a sigmoid-gated shared expert, dense layers between
MoE layers (`mlp_only_layers`, `decoder_sparse_step`), optional top-k renormalisation."""

from moejax.families.family import Family, common_fields, hf_int, rope_from_hf
from moejax.model_config import ModelConfig


def _moe_layers(hf: dict, num_layers: int) -> tuple[int, ...]:
    mlp_only = set(hf.get("mlp_only_layers") or [])
    step = int(hf.get("decoder_sparse_step", 1) or 1)
    n_exp = int(hf.get("num_experts", 0) or 0)
    return tuple(i for i in range(num_layers)
                 if i not in mlp_only and n_exp > 0 and (i + 1) % step == 0)


def _windows(hf: dict, num_layers: int) -> tuple[int | None, ...]:
    if not hf.get("use_sliding_window"):
        return (None,) * num_layers
    window = int(hf["sliding_window"])
    types = hf.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 and i < int(hf.get("max_window_layers", 28))
        else "full_attention" for i in range(num_layers)]
    return tuple(window if t == "sliding_attention" else None for t in types)


def config_from_hf(hf: dict) -> ModelConfig:
    c = common_fields(hf)
    n = c["num_layers"]
    return ModelConfig(
        family="qwen2_moe", **c,
        num_experts=hf_int(hf, "num_experts"),
        top_k=hf_int(hf, "num_experts_per_tok"),
        expert_intermediate_size=hf_int(hf, "moe_intermediate_size"),
        moe_layers=_moe_layers(hf, n),
        dense_intermediate_size=int(hf.get("intermediate_size", 0) or 0),
        shared_expert_intermediate_size=int(hf.get("shared_expert_intermediate_size", 0) or 0),
        norm="rms", norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qkv_bias=bool(hf.get("qkv_bias", True)),
        router="softmax_topk", norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        rope=rope_from_hf(hf),
        sliding_window=_windows(hf, n))


PRESETS = {
    # Qwen/Qwen1.5-MoE-A2.7B config.json
    "qwen1.5-moe-a2.7b": dict(model_type="qwen2_moe", vocab_size=151936, hidden_size=2048,
                              intermediate_size=5632, moe_intermediate_size=1408,
                              shared_expert_intermediate_size=5632, num_hidden_layers=24,
                              num_attention_heads=16, num_key_value_heads=16, num_experts=60,
                              num_experts_per_tok=4, norm_topk_prob=False, decoder_sparse_step=1,
                              max_position_embeddings=8192, rms_norm_eps=1e-6,
                              rope_parameters=dict(rope_type="default", rope_theta=1e6),
                              bos_token_id=151643, eos_token_id=151643, dtype="bfloat16"),
    "tiny": dict(model_type="qwen2_moe", vocab_size=256, hidden_size=64, intermediate_size=128,
                 moe_intermediate_size=32, shared_expert_intermediate_size=64,
                 num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                 num_experts=15, num_experts_per_tok=4, max_position_embeddings=512,
                 rope_parameters=dict(rope_type="default", rope_theta=1e6), dtype="float32"),
}

FAMILY = Family(name="qwen2_moe", hf_model_types=("qwen2_moe",), moe_prefix="mlp",
                expert_proj_names=("gate_proj", "up_proj", "down_proj"),
                config_from_hf=config_from_hf, presets=PRESETS)
