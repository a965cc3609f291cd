"""OLMoE (allenai/OLMoE-1B-7B): q/k RMSNorm, softmax top-k, no renormalisation by default."""

from moejax.families.family import Family, common_fields, hf_int, rope_from_hf
from moejax.model_config import ModelConfig


def config_from_hf(hf: dict) -> ModelConfig:
    c = common_fields(hf)
    return ModelConfig(
        family="olmoe", **c,
        num_experts=hf_int(hf, "num_experts", hf.get("num_local_experts")),
        top_k=hf_int(hf, "num_experts_per_tok"),
        expert_intermediate_size=hf_int(hf, "intermediate_size"),
        moe_layers=tuple(range(c["num_layers"])),
        norm="rms", norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        qk_norm=True, clip_qkv=hf.get("clip_qkv"),
        qkv_bias=bool(hf.get("attention_bias", False)),
        o_bias=bool(hf.get("attention_bias", False)),
        router="softmax_topk", norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        rope=rope_from_hf(hf))


PRESETS = {
    # allenai/OLMoE-1B-7B-0924 config.json
    "olmoe-1b-7b": dict(model_type="olmoe", vocab_size=50304, hidden_size=2048,
                        intermediate_size=1024, num_hidden_layers=16, num_attention_heads=16,
                        num_key_value_heads=16, num_experts=64, num_experts_per_tok=8,
                        max_position_embeddings=4096, rms_norm_eps=1e-5, norm_topk_prob=False,
                        rope_parameters=dict(rope_type="default", rope_theta=10000.0),
                        pad_token_id=1, eos_token_id=50279, dtype="bfloat16"),
    "tiny": dict(model_type="olmoe", vocab_size=256, hidden_size=64, intermediate_size=32,
                 num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 num_experts=16, num_experts_per_tok=4, max_position_embeddings=512,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0),
                 dtype="float32"),
}

FAMILY = Family(name="olmoe", hf_model_types=("olmoe",), moe_prefix="mlp",
                expert_proj_names=("gate_proj", "up_proj", "down_proj"),
                config_from_hf=config_from_hf, presets=PRESETS)
