"""Compute cost model of the virtual clock: each compiled step takes
`max(FLOPs / peak, bytes / HBM bandwidth) + launch` (a roofline, `timeline.roofline`), from the
model's shapes. The experts step's terms (`experts_terms`) are what the compiled replay kernel
charges with the same `timeline.experts_step`."""

from __future__ import annotations

import functools
import json

import numpy as np

from moejax.model_config import ModelConfig, dtype_bytes
from moejax.timing import timeline
from moejax.timing.hardware import Hardware


class CostModel:
    @staticmethod
    def shared(cfg: ModelConfig, hw: Hardware) -> CostModel:
        """One `CostModel` per model and hardware in a process, its memos with it: a grid's
        cells of one model build a cache each, and the cost model's calls per distinct
        (tokens, context) were about half of a short replay's preparation. (It holds nothing
        but pure functions of its two arguments and their memos.) Keyed by the model's JSON:
        a config's fields need not be hashable."""
        return _shared(cfg.to_json(), hw)

    @staticmethod
    def forget_shared() -> None:
        """Drops the shared cost models (a benchmark timing a cold preparation)."""
        _shared.cache_clear()

    def __init__(self, cfg: ModelConfig, hw: Hardware):
        self.cfg, self.hw = cfg, hw
        self.b = dtype_bytes(cfg.dtype)
        h, hd = cfg.hidden_size, cfg.head_dim
        self.attn_params = h * hd * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
        self.router_params = h * cfg.num_experts
        self.peak_flops = hw.peak_tflops * 1e12
        self.hbm_bps = hw.hbm_gbps * 1e9
        self.per_expert = cfg.expert_param_count
        self.shared_params = 3 * cfg.hidden_size * cfg.shared_expert_intermediate_size
        # Pure functions of their arguments, asked every layer of every pass with few distinct
        # arguments (the live runtime decides on the host between device steps): memoised per
        # instance.
        for name in ("attention_router", "dense_layer", "experts", "embed_and_logits"):
            setattr(self, name, functools.lru_cache(maxsize=4096)(getattr(self, name)))

    def _step(self, flops: float, nbytes: float) -> float:
        return timeline.roofline(flops, nbytes, self.peak_flops, self.hbm_bps, self.hw.launch_s)

    def experts_terms(self) -> tuple[int, int, float, float, float, float]:
        """`(per_expert, shared_params, dtype_bytes, peak_flops, hbm_bps, launch_s)`: what
        `timeline.experts_step` takes besides a wave's counts."""
        return (self.per_expert, self.shared_params, self.b, self.peak_flops, self.hbm_bps,
                self.hw.launch_s)

    def attention_router(self, tokens: int, context: int, lookahead: int) -> float:
        return self._step(*self._attention_router_terms(tokens, context, lookahead))

    def dense_layer(self, tokens: int, context: int) -> float:
        return self._step(*self._dense_layer_terms(tokens, context))

    # A step's (FLOPs, bytes), written once for a Python int (the calls above) and for int64
    # arrays (`pass_times`): the same integer arithmetic, the roofline's division after.
    def _attention_router_terms(self, tokens, context, lookahead: int):
        cfg = self.cfg
        attn_scores = 4 * tokens * context * cfg.num_heads * cfg.head_dim
        params = self.attn_params + self.router_params * (1 + lookahead)
        flops = 2 * tokens * params + attn_scores
        kv = 2 * context * cfg.num_kv_heads * cfg.head_dim
        return flops, (params + kv) * self.b + 4 * tokens * cfg.hidden_size * self.b

    def _dense_layer_terms(self, tokens, context):
        cfg = self.cfg
        mlp = 3 * cfg.hidden_size * cfg.dense_intermediate_size
        attn_scores = 4 * tokens * context * cfg.num_heads * cfg.head_dim
        kv = 2 * context * cfg.num_kv_heads * cfg.head_dim
        flops = 2 * tokens * (self.attn_params + mlp) + attn_scores
        return flops, (self.attn_params + mlp + kv) * self.b

    def _embed_and_logits_terms(self, tokens):
        head = self.cfg.hidden_size * self.cfg.vocab_size
        return 2 * tokens * head, head * self.b

    def pass_times(self, tokens: np.ndarray, context: np.ndarray, lookahead: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """`dense_layer`, `attention_router` and half of `embed_and_logits` for each pass's
        `tokens` and `context` (int64 arrays) at once, bit for bit the calls' (the same
        integer arithmetic in int64, converted to float where Python converts the int, for the
        division). None where a term could pass 2**62 (the calls' Python ints do not
        overflow): the caller calls instead."""
        if len(tokens) == 0:
            return np.zeros(0), np.zeros(0), np.zeros(0)
        t, c = int(tokens.max()), int(context.max())
        if min(int(tokens.min()), int(context.min())) < 0 or max(
                max(self._attention_router_terms(t, c, lookahead)),
                max(self._dense_layer_terms(t, c)),
                max(self._embed_and_logits_terms(t))) >= 2 ** 62:
            return None
        tokens, context = tokens.astype(np.int64), context.astype(np.int64)
        peak, hbm, launch = self.peak_flops, self.hbm_bps, self.hw.launch_s
        dense = timeline.roofline_of_arrays(*self._dense_layer_terms(tokens, context), peak,
                                            hbm, launch)
        attn = timeline.roofline_of_arrays(
            *self._attention_router_terms(tokens, context, lookahead), peak, hbm, launch)
        flops, nbytes = self._embed_and_logits_terms(tokens)
        half = (timeline.roofline_of_arrays(flops, np.broadcast_to(np.int64(nbytes), flops.shape),
                                            peak, hbm, launch) + launch) / 2
        return dense, attn, half

    def experts(self, token_expert_pairs: int, unique_experts: int, tokens: int,
                shared: bool) -> float:
        return timeline.experts_step(token_expert_pairs, unique_experts, tokens,
                                     self.per_expert, self.shared_params if shared else 0,
                                     self.b, self.peak_flops, self.hbm_bps, self.hw.launch_s)

    def embed_and_logits(self, tokens: int) -> float:
        return self._step(*self._embed_and_logits_terms(tokens)) + self.hw.launch_s


@functools.lru_cache(maxsize=16)
def _shared(cfg_json: str, hw: Hardware) -> CostModel:
    return CostModel(ModelConfig.from_dict(json.loads(cfg_json)), hw)
