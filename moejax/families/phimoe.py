"""Phi-3.5-MoE: sparsemixer top-2 routing, LayerNorm with bias, attention and lm-head biases,
longrope scaling."""

from moejax.families.family import Family, common_fields, hf_int, rope_from_hf, uniform_window
from moejax.model_config import ModelConfig


def config_from_hf(hf: dict) -> ModelConfig:
    c = common_fields(hf)
    bias = bool(hf.get("attention_bias", False))
    return ModelConfig(
        family="phimoe", **c,
        num_experts=hf_int(hf, "num_local_experts"),
        top_k=hf_int(hf, "num_experts_per_tok", 2),
        expert_intermediate_size=hf_int(hf, "intermediate_size"),
        moe_layers=tuple(range(c["num_layers"])),
        norm="layer", norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        qkv_bias=bias, o_bias=bias, lm_head_bias=bool(hf.get("lm_head_bias", False)),
        router="sparsemixer", router_jitter_eps=float(hf.get("router_jitter_noise", 0.01)),
        # transformers' PhimoeRotaryEmbedding uses short_factor frequencies at every length
        # (only the mscale follows the length): match the reference implementation.
        rope=rope_from_hf(hf, long_factor_frequencies=False),
        sliding_window=uniform_window(hf, c["num_layers"]))


_HALF_HEAD = 64  # 4096 / 32 heads / 2
PRESETS = {
    # microsoft/Phi-3.5-MoE-instruct config.json dimensions. The longrope factor lists here are
    # neutral placeholders (the preset sizes runs; converted checkpoints carry the real factors).
    "phi-3.5-moe": dict(model_type="phimoe", vocab_size=32064, hidden_size=4096,
                        intermediate_size=6400, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=8, num_local_experts=16, num_experts_per_tok=2,
                        max_position_embeddings=131072, rms_norm_eps=1e-5, attention_bias=True,
                        lm_head_bias=True, router_jitter_noise=0.01, sliding_window=131072,
                        rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                             short_factor=[1.0] * _HALF_HEAD,
                                             long_factor=[1.0] * _HALF_HEAD,
                                             short_mscale=1.243163121016122,
                                             long_mscale=1.243163121016122,
                                             original_max_position_embeddings=4096),
                        bos_token_id=1, eos_token_id=32000, dtype="bfloat16"),
    "tiny": dict(model_type="phimoe", vocab_size=256, hidden_size=64, intermediate_size=96,
                 num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=512,
                 attention_bias=True, lm_head_bias=True,
                 rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                      short_factor=[1.0] * 8, long_factor=[1.5] * 8,
                                      short_mscale=1.0, long_mscale=1.1,
                                      original_max_position_embeddings=128),
                 dtype="float32"),
}

FAMILY = Family(name="phimoe", hf_model_types=("phimoe",), moe_prefix="block_sparse_moe",
                expert_proj_names=("w1", "w3", "w2"),
                config_from_hf=config_from_hf, presets=PRESETS)
