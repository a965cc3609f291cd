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

What a budget is of (`budget_of`):
* "device" (the whole device): the slots are what is left after the dense weights and the KV
  cache;
* "experts" (the expert slots only, the plan job's `plan.device_gb`): the slots take the whole
  budget, and the dense weights and the KV cache are counted beside it (`device_bytes`: what
  the device then holds in all).

Either way the slots are whole experts, at most every routed expert, and a budget fits when it
holds one token's experts of a layer (top-k slots: fewer cannot serve a decode step,
`capacity.py`). Activations and the compiled programs' scratch are not counted (named in the
fit's `not_counted`).
"""

from __future__ import annotations

import dataclasses

from moejax.cache import precision_bytes_of
from moejax.model_config import ModelConfig, dtype_bytes

GB = 1e9  # the budgets are decimal gigabytes, as device specifications state them
BUDGETS_OF = ("device", "experts")
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
    budget_of: str = "device"  # BUDGETS_OF (the module docstring)

    @property
    def free_bytes(self) -> int:
        """The bytes for expert slots: the whole budget of "experts"; of the "device", what the
        dense weights and the KV cache leave (< 0: too little)."""
        if self.budget_of == "experts":
            return self.budget_bytes
        return self.budget_bytes - self.dense_bytes - self.kv_bytes

    @property
    def slot_bytes(self) -> int:
        """What the slots take."""
        return self.slots * self.expert_bytes

    @property
    def device_bytes(self) -> int:
        """The device's whole holding: dense weights, KV cache, expert slots."""
        return self.dense_bytes + self.kv_bytes + self.slot_bytes

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
        need = self.top_k * self.expert_bytes
        if self.budget_of == "device":
            need += self.dense_bytes + self.kv_bytes
        return max(0, need - self.budget_bytes)

    @property
    def share_of_experts(self) -> float:
        return self.slots / self.total_experts

    def to_dict(self) -> dict:
        return {"budget_bytes": self.budget_bytes, "dense_bytes": self.dense_bytes,
                "kv_bytes": self.kv_bytes, "expert_bytes": self.expert_bytes,
                "precision": self.precision, "budget_of": self.budget_of,
                "free_bytes": self.free_bytes, "slots": self.slots,
                "slot_bytes": self.slot_bytes, "device_bytes": self.device_bytes, "share_of_experts": self.share_of_experts,
                "fits": self.fits, "shortfall_bytes": self.shortfall_bytes,
                "not_counted": NOT_COUNTED}

    def line(self) -> str:
        """One line: what the budget holds, or what it lacks."""
        if self.budget_of == "experts":
            return self._experts_line()
        head = (f"{self.budget_bytes / GB:.2f} GB: dense {self.dense_bytes / GB:.2f} GB, KV "
                f"cache {self.kv_bytes / GB:.2f} GB")
        if not self.fits:
            return (f"{head}: does not fit; {self.shortfall_bytes / GB:.2f} GB short of "
                    f"{self.top_k} {self.precision} expert slots ({NOT_COUNTED} not counted)")
        return (f"{head}, {self.slots:,} {self.precision} expert slots of "
                f"{self.expert_bytes / 1e6:.2f} MB ({self.share_of_experts:.1%} of the "
                f"{self.total_experts:,} routed experts; {NOT_COUNTED} not counted)")


    def _experts_line(self) -> str:
        budget = size_text(self.budget_bytes)
        beside = (f"beside them dense {size_text(self.dense_bytes)}, KV cache {size_text(self.kv_bytes)}"
                  f" ({NOT_COUNTED} not counted)")
        if not self.fits:
            return (f"{budget} for expert slots: does not fit; {size_text(self.shortfall_bytes)} "
                    f"short of {self.top_k} {self.precision} expert slots of "
                    f"{size_text(self.expert_bytes)}; {beside}")
        return (f"{budget} for expert slots: {self.slots:,} {self.precision} slots of "
                f"{size_text(self.expert_bytes)} ({self.share_of_experts:.1%} of the "
                f"{self.total_experts:,} routed experts); {beside}: "
                f"{size_text(self.device_bytes)} on the device in all")


def size_text(n: int) -> str:
    """Bytes in the unit that reads best: GB, MB or kB (decimal)."""
    for unit, scale in (("GB", GB), ("MB", 1e6)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n / 1e3:.1f} kB"


def fit(cfg: ModelConfig, device_gb: float, context: int, precision: str = "native",
        batch: int = 1, group_size: int | None = None, budget_of: str = "device") -> Fit:
    """`device_gb` (decimal GB) against `cfg` with a KV cache of `context` positions of `batch`
    sequences and expert slots at `precision`; `budget_of`: the whole "device" or the
    "experts" slots only (the module docstring)."""
    if device_gb <= 0:
        raise ValueError(f"device_gb={device_gb} must be > 0")
    if budget_of not in BUDGETS_OF:
        raise ValueError(f"budget_of={budget_of!r} is not one of {BUDGETS_OF}")
    if context < 1 or batch < 1:
        raise ValueError(f"context={context} and batch={batch} must be >= 1")
    per_precision = (precision_bytes_of(cfg) if group_size is None
                     else precision_bytes_of(cfg, group_size))
    if precision not in per_precision:
        raise ValueError(f"precision={precision!r} is not one of {sorted(per_precision)}")
    return Fit(int(device_gb * GB), dense_bytes(cfg), kv_cache_bytes(cfg, context, batch),
               per_precision[precision], precision,
               cfg.num_experts * cfg.num_moe_layers, cfg.top_k, budget_of)
