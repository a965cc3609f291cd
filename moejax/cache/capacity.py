"""The cache's dimensions (`CacheShape`), its byte budget and its per-precision slot pools.

* **Capacity** `C` in bytes (`cache.capacity_frac`, `cache.capacity_of`):
  `capacity_of="experts"` (the default): a fraction of all routed experts' bytes at native
  precision; `"model"`: a fraction of the whole model's native bytes, dense weights included
  (SpecMD's meaning: "5% or 0.6 GB" of OLMoE-1B-7B). `ModelConfig.model_bytes` computes the
  latter from the model's shapes alone (no weights are allocated): OLMoE-1B-7B comes to
  6.92e9 parameters, 12.89 GiB in bfloat16, Mixtral-8x7B to 86.99 GiB (SpecMD's model table).
* **Pools**: one per precision in use (the miss policy's `levels`, high to low), sharing `C`:
  pool P gets the byte share `s_P` (`cache.precision_shares`; "" = equal shares) and
  `slots_P = floor(s_P * C / bytes_P)` slots of `bytes_P` (one expert at P), at most one per
  routed expert, floored at `cache.min_slots`; each must hold at least top-k slots. Slots are
  numbered globally, pool after pool (`PoolSpec.offset`).
* `cache.slots=N` (absolute) is the slot count of the single pool, 1 to the routed expert
  count (0, the default: `capacity_frac` sizes the cache); with several pools it is an error
  (give a capacity fraction). `cache.min_slots` is at most the routed expert count too.

With `cache.min_slots` lifting a pool above its share, the budget the cache keeps is the
slots' bytes (`capacity_bytes = max(C, sum of slots_P * bytes_P)`).
"""

from __future__ import annotations

import dataclasses
import math

from moejax.errors import ConfigError
from moejax.model_config import ModelConfig, dtype_bytes
from moejax.quant import formats

CAPACITY_OF = ("experts", "model")


@dataclasses.dataclass(frozen=True)
class PoolSpec:
    """The slots of one precision: global slots `[offset, offset + num_slots)`."""

    precision: str
    expert_bytes: int  # one expert at this precision (values, scales and zero points)
    num_slots: int
    offset: int
    share: float = 1.0  # of the byte budget


def precision_bytes_of(cfg: ModelConfig, group_size: int = formats.DEFAULT_GROUP_SIZE
                       ) -> dict[str, int]:
    """Bytes of one routed expert at every precision, from the model's shapes (replay, where
    no checkpoint says what its quantized copies weigh). Native is `cfg.expert_bytes`."""
    itemsize = dtype_bytes(cfg.dtype)
    out = {"native": cfg.expert_bytes}
    for p in formats.QUANTIZED:
        out[p] = formats.expert_bytes(cfg.hidden_size, cfg.expert_intermediate_size, p,
                                      group_size, itemsize)
    return out


def parse_shares(text: str, in_use: tuple[str, ...]) -> dict[str, float]:
    """`cache.precision_shares`: "" -> equal byte shares over `in_use`; else
    `"int8=0.5,int4=0.3,int2=0.2"`: every precision in use, known, positive, summing to 1."""
    if not text or not text.strip():
        return {p: 1.0 / len(in_use) for p in in_use}
    shares: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        name = name.strip()
        if not sep:
            raise ConfigError(f"cache.precision_shares={text!r}: expected precision=share items "
                              "joined by ',', e.g. 'int8=0.5,int4=0.3,int2=0.2'")
        formats.check(name, "cache.precision_shares")
        if name not in in_use:
            raise ConfigError(f"cache.precision_shares={text!r}: {name} is not a precision in "
                              f"use (the pools are {list(in_use)})")
        if name in shares:
            raise ConfigError(f"cache.precision_shares={text!r}: {name} given twice")
        try:
            share = float(value)
        except ValueError:
            raise ConfigError(f"cache.precision_shares={text!r}: {value!r} is not a number")
        if not share > 0:
            raise ConfigError(f"cache.precision_shares={text!r}: the share of {name} must be > 0")
        shares[name] = share
    missing = [p for p in in_use if p not in shares]
    if missing:
        raise ConfigError(f"cache.precision_shares={text!r} gives no share to {missing} (the "
                          f"pools are {list(in_use)})")
    if abs(sum(shares.values()) - 1.0) > 1e-6:
        raise ConfigError(f"cache.precision_shares={text!r}: shares sum to "
                          f"{sum(shares.values()):g}, not 1")
    return {p: shares[p] for p in in_use}


@dataclasses.dataclass(frozen=True)
class Budget:
    """The pools and the numbers results.json reports about them."""

    pools: tuple[PoolSpec, ...]
    capacity_bytes: float  # the budget the pools share (lifted to the slots' bytes by min_slots)
    capacity_of: str
    expert_native_bytes: int  # all routed experts at native precision
    model_bytes: int | None  # the whole model, when known


def pools_for(*, in_use: tuple[str, ...], precision_bytes: dict[str, int], total_experts: int,
              top_k: int, capacity_frac: float | None, slots: int | None, min_slots: int = 0,
              capacity_of: str = "experts", model_bytes: int | None = None,
              shares: str = "") -> Budget:
    """The slot pools of the precisions `in_use` (high to low). Exactly one of
    `capacity_frac` (of `capacity_of`'s bytes) and `slots` (absolute, one pool only)."""
    if capacity_of not in CAPACITY_OF:
        raise ConfigError(f"cache.capacity_of={capacity_of!r} is not one of {CAPACITY_OF}")
    if (capacity_frac is None) == (slots is None):
        raise ConfigError("set exactly one of cache.capacity_frac and cache.slots")
    if min_slots < 0:
        raise ConfigError(f"cache.min_slots={min_slots} must be >= 0")
    # A pool holds at most every routed expert once: a count above that is no cache size (it
    # would be cut to the expert count, and results.json would report the count given as the
    # capacity, above 100% of the experts).
    if slots is not None and slots > total_experts:
        raise ConfigError(f"cache.slots={slots} is not a slot count of this model: it takes 1 "
                          f"to {total_experts} (its routed experts; {total_experts}: every "
                          "expert resident), or 0 (the schema's default: cache.capacity_frac "
                          "sizes the cache)")
    if min_slots > total_experts:
        raise ConfigError(f"cache.min_slots={min_slots} is above this model's {total_experts} "
                          f"routed experts: it takes 0 (the default: no floor) to "
                          f"{total_experts}")
    for p in in_use:
        if p not in precision_bytes:
            raise ConfigError(f"precision {p} is not available: this source has "
                              f"{[q for q in formats.PRECISIONS if q in precision_bytes]} "
                              "(set cache.precision / the miss policy's levels to those)")
    native_total = precision_bytes.get("native", 0) * total_experts
    share_of = parse_shares(shares, in_use)
    several = len(in_use) > 1
    counts: dict[str, tuple[int, str]] = {}
    if slots is not None:
        if several:
            raise ConfigError(f"cache.slots={slots} is one pool's slot count, but the miss "
                              f"policy uses {len(in_use)} precisions {list(in_use)}: give "
                              "cache.capacity_frac (and cache.capacity_of) instead")
        n = max(int(slots), min_slots)
        counts[in_use[0]] = (n, f"cache.slots={slots}")
        capacity = float(n * precision_bytes[in_use[0]])
    else:
        if not 0 < capacity_frac <= 1:
            raise ConfigError(f"cache.capacity_frac={capacity_frac} must be in (0, 1]")
        if capacity_of == "model":
            if model_bytes is None:
                raise ConfigError("cache.capacity_of='model' needs the model's size: name the "
                                  "model (--config.model.family=F --config.model.preset=P) or "
                                  "use cache.capacity_of='experts'")
            reference = model_bytes
        else:
            reference = native_total
        capacity = capacity_frac * reference
        for p in in_use:
            b = precision_bytes[p]
            # reference / b is exactly the expert count for native experts: no slot lost to
            # rounding (slots = floor(frac * experts), as before pools existed).
            n = int(math.floor(share_of[p] * capacity_frac * (reference / b) + 1e-9))
            what = (f"cache.capacity_frac={capacity_frac} ({n} slots of {b} bytes out of "
                    f"{total_experts} experts)")
            if several:
                what = (f"the {p} pool of cache.capacity_frac={capacity_frac} "
                        f"(capacity_of={capacity_of}): {n} slots of {b} bytes at a share of "
                        f"{share_of[p]:g}")
            counts[p] = (max(n, min_slots), what)
    pools, offset = [], 0
    for p in in_use:
        n, what = counts[p]
        if n < top_k:
            fix = ("raise cache.capacity_frac or this precision's share in "
                   "cache.precision_shares" if several else "raise the capacity")
            raise ConfigError(f"{what} is below what one decode layer needs: top-k = {top_k} "
                              f"experts at once ({fix}, or set cache.min_slots)")
        n = min(n, total_experts)
        pools.append(PoolSpec(p, precision_bytes[p], n, offset, share_of[p]))
        offset += n
    used = sum(q.num_slots * q.expert_bytes for q in pools)
    return Budget(tuple(pools), max(capacity, float(used)) if min_slots else capacity,
                  capacity_of, native_total, model_bytes)


@dataclasses.dataclass(frozen=True)
class CacheShape:
    """The cache's dimensions. `expert_bytes` is one expert at the plain precision (the first
    pool's), `num_slots` all slots; `pools` (one native pool of every slot when not given) the
    per-precision pools, high to low, their slots consecutive. `capacity` (the byte budget and
    what it is a fraction of) and `precision_bytes` (bytes of one expert at each precision the
    source has) are what results.json reports; None / () when the shape was given directly."""

    layers: tuple[int, ...]  # MoE layer indices in pass order
    num_layers: int  # all decoder layers (dense ones included), for the cost model
    num_experts: int
    top_k: int
    expert_bytes: int
    num_slots: int
    pools: tuple[PoolSpec, ...] = ()
    capacity: object = None  # Budget
    precision_bytes: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        if not self.pools:
            object.__setattr__(self, "pools", (PoolSpec("native", self.expert_bytes,
                                                        self.num_slots, 0),))
        offset = 0
        for p in self.pools:
            if p.offset != offset or p.num_slots < 1:
                raise ValueError(f"pools {self.pools} are not consecutive non-empty slot ranges")
            offset += p.num_slots
        if offset != self.num_slots or self.pools[0].expert_bytes != self.expert_bytes:
            raise ValueError(f"pools {self.pools} disagree with num_slots={self.num_slots} / "
                             f"expert_bytes={self.expert_bytes} (the first pool's)")

    @classmethod
    def with_pools(cls, layers, num_layers: int, num_experts: int, top_k: int,
                   pools: tuple[PoolSpec, ...], capacity=None,
                   precision_bytes: dict[str, int] | None = None) -> "CacheShape":
        return cls(tuple(layers), num_layers, num_experts, top_k, pools[0].expert_bytes,
                   sum(p.num_slots for p in pools), tuple(pools), capacity,
                   tuple((precision_bytes or {}).items()))

    @property
    def total_experts(self) -> int:
        return self.num_experts * len(self.layers)

    @property
    def precision(self) -> str:
        """The plain precision: what a plain fetch and a prefetch move (the first pool's)."""
        return self.pools[0].precision

    @property
    def precisions(self) -> tuple[str, ...]:
        return tuple(p.precision for p in self.pools)

    @property
    def capacity_bytes(self) -> float:
        """The byte budget the pools share (their slots' bytes when not given)."""
        if self.capacity is not None:
            return self.capacity.capacity_bytes
        return float(sum(p.num_slots * p.expert_bytes for p in self.pools))


def slots_for(shape_experts: int, top_k: int, expert_bytes: int, capacity_frac: float | None,
              slots: int | None) -> int:
    """Slot count of one native pool from `cache.capacity_frac` (of all routed-expert bytes) or
    `cache.slots` (`pools_for` sizes the precision pools in general)."""
    if (capacity_frac is None) == (slots is None):
        raise ConfigError("set exactly one of cache.capacity_frac and cache.slots")
    if slots is not None:
        n = int(slots)
        what = f"cache.slots={slots}"
    else:
        if not 0 < capacity_frac <= 1:
            raise ConfigError(f"cache.capacity_frac={capacity_frac} must be in (0, 1]")
        n = int(math.floor(capacity_frac * shape_experts + 1e-9))  # no slot lost to rounding
        what = (f"cache.capacity_frac={capacity_frac} ({n} slots of {expert_bytes} bytes out of "
                f"{shape_experts} experts)")
    if n < top_k:
        raise ConfigError(f"{what} is below what one decode layer needs: top-k = {top_k} "
                          f"experts at once")
    return min(n, shape_experts)
