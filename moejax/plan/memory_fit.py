"""What a device's memory holds of a model, before any cache policy is chosen: the planner's
first question (a device budget "for expert slots, after the dense weights and the KV cache
for [a context's] tokens are counted").

Bytes as moejax's live runtime allocates them, not an estimate of another runtime's:

* dense weights: every parameter outside the routed experts at the model's dtype
  (`ModelConfig.dense_param_count`, which `tests/test_precision_cache.py` holds to the
  decoder's own abstract shapes);
* the KV cache: keys and values of every layer for `context` positions of `batch` sequences at
  the model's dtype, as `moejax.models.attention.KVCache.zeros` allocates it (every layer at the
  full length, a sliding window included: the runtime keeps the whole cache);
* an expert slot: one routed expert at a precision (`capacity.precision_bytes_of`: native, or
  the packed int8 / int4 / int2 copy with its scales).

The slots a budget gives at a precision are what is left after the dense weights and the KV
cache, in whole experts, at most every routed expert; a budget fits when it holds one token's
experts of a layer (top-k slots: fewer cannot serve a decode step, `capacity.py`). Activations
and the compiled programs' scratch are not counted (named in the fit's `not_counted`).
"""

from __future__ import annotations

import dataclasses

from moejax.cache import precision_bytes_of
from moejax.model_config import ModelConfig, dtype_bytes

GB = 1e9  # the budgets are decimal gigabytes, as device specifications state them
NOT_COUNTED = "activations and compiled programs' scratch space"


def kv_cache_bytes(cfg: ModelConfig, context: int, batch: int = 1) -> int:
    """Keys and values of every layer for `context` positions of `batch` sequences."""
    per_position = 2 * cfg.num_kv_heads * cfg.head_dim * dtype_bytes(cfg.dtype)
    return cfg.num_layers * batch * context * per_position


def dense_bytes(cfg: ModelConfig) -> int:
    """The weights outside the routed experts, at the model's dtype."""
    return cfg.dense_param_count * dtype_bytes(cfg.dtype)


@dataclasses.dataclass(frozen=True)
class Fit:
    """A device budget against one model at one precision of its expert slots."""

    budget_bytes: int
    dense_bytes: int
    kv_bytes: int
    expert_bytes: int  # one slot at `precision`
    precision: str
    total_experts: int
    top_k: int

    @property
    def free_bytes(self) -> int:
        """What the dense weights and the KV cache leave for expert slots (< 0: too little)."""
        return self.budget_bytes - self.dense_bytes - self.kv_bytes

    @property
    def slots(self) -> int:
        """Expert slots the budget holds: whole experts, at most every routed one."""
        return max(0, min(self.total_experts, self.free_bytes // self.expert_bytes))

    @property
    def fits(self) -> bool:
        return self.slots >= self.top_k

    @property
    def shortfall_bytes(self) -> int:
        """What the budget lacks for top-k slots (0 when it fits)."""
        need = self.dense_bytes + self.kv_bytes + self.top_k * self.expert_bytes
        return max(0, need - self.budget_bytes)

    @property
    def share_of_experts(self) -> float:
        return self.slots / self.total_experts

    def to_dict(self) -> dict:
        return {"budget_bytes": self.budget_bytes, "dense_bytes": self.dense_bytes,
                "kv_bytes": self.kv_bytes, "expert_bytes": self.expert_bytes,
                "precision": self.precision, "free_bytes": self.free_bytes,
                "slots": self.slots, "share_of_experts": self.share_of_experts,
                "fits": self.fits, "shortfall_bytes": self.shortfall_bytes,
                "not_counted": NOT_COUNTED}

    def line(self) -> str:
        """One line: what the budget holds, or what it lacks."""
        head = (f"{self.budget_bytes / GB:.2f} GB: dense {self.dense_bytes / GB:.2f} GB, KV "
                f"cache {self.kv_bytes / GB:.2f} GB")
        if not self.fits:
            return (f"{head}: does not fit; {self.shortfall_bytes / GB:.2f} GB short of "
                    f"{self.top_k} {self.precision} expert slots ({NOT_COUNTED} not counted)")
        return (f"{head}, {self.slots:,} {self.precision} expert slots of "
                f"{self.expert_bytes / 1e6:.2f} MB ({self.share_of_experts:.1%} of the "
                f"{self.total_experts:,} routed experts; {NOT_COUNTED} not counted)")


def fit(cfg: ModelConfig, device_gb: float, context: int, precision: str = "native",
        batch: int = 1, group_size: int | None = None) -> Fit:
    """`device_gb` (decimal GB) against `cfg` with a KV cache of `context` positions of `batch`
    sequences and expert slots at `precision`."""
    if device_gb <= 0:
        raise ValueError(f"device_gb={device_gb} must be > 0")
    if context < 1 or batch < 1:
        raise ValueError(f"context={context} and batch={batch} must be >= 1")
    per_precision = (precision_bytes_of(cfg) if group_size is None
                     else precision_bytes_of(cfg, group_size))
    if precision not in per_precision:
        raise ValueError(f"precision={precision!r} is not one of {sorted(per_precision)}")
    return Fit(int(device_gb * GB), dense_bytes(cfg), kv_cache_bytes(cfg, context, batch),
               per_precision[precision], precision,
               cfg.num_experts * cfg.num_moe_layers, cfg.top_k)
