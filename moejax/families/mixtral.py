"""Mixtral (mistralai/Mixtral-8x7B): softmax top-k renormalised over the chosen experts."""

from moejax.families.family import Family, common_fields, hf_int, rope_from_hf, uniform_window
from moejax.model_config import ModelConfig


def config_from_hf(hf: dict) -> ModelConfig:
    c = common_fields(hf)
    return ModelConfig(
        family="mixtral", **c,
        num_experts=hf_int(hf, "num_local_experts"),
        top_k=hf_int(hf, "num_experts_per_tok"),
        expert_intermediate_size=hf_int(hf, "intermediate_size"),
        moe_layers=tuple(range(c["num_layers"])),
        norm="rms", norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        router="softmax_topk", norm_topk_prob=True,
        rope=rope_from_hf(hf, default_theta=1e6),
        sliding_window=uniform_window(hf, c["num_layers"]))


PRESETS = {
    # mistralai/Mixtral-8x7B-v0.1 config.json
    "mixtral-8x7b": dict(model_type="mixtral", vocab_size=32000, hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                         max_position_embeddings=32768, rms_norm_eps=1e-5,
                         rope_parameters=dict(rope_type="default", rope_theta=1e6),
                         bos_token_id=1, eos_token_id=2, dtype="bfloat16"),
    "tiny": dict(model_type="mixtral", vocab_size=256, hidden_size=64, intermediate_size=96,
                 num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=512,
                 rope_parameters=dict(rope_type="default", rope_theta=1e6), dtype="float32"),
}

FAMILY = Family(name="mixtral", hf_model_types=("mixtral",), moe_prefix="block_sparse_moe",
                expert_proj_names=("w1", "w3", "w2"),
                config_from_hf=config_from_hf, presets=PRESETS)
