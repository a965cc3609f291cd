"""Device slot pools: fixed device arrays of S expert slots per precision, written in place
by loads from the host tier (`SlotPool`), numbered consecutively across precisions
(`SlotPools`). What to load where is the cache's; when is the runtime's
(`moejax.serving.runtime`).

A slot load is one compiled step: slice the expert out of the host table, move it to the
device, write it into the slot in place (the pool is donated); at a quantized precision it
moves exactly the packed bytes. XLA fuses the slice and the update into a single copy (0.1 ms
against 1.1 ms for a plain `device_put` of 4 MiB here). Loads are dispatched asynchronously;
the experts step that reads the pool is ordered after them by data dependency, so a slot is
never read before its load lands, and a load into a slot is ordered after the earlier steps
that read it (no use-after-evict).
"""

from __future__ import annotations

import bisect
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from moejax.models.experts import ExpertPool
from moejax.quant.weights import QuantizedWeights
from moejax.seam import Key


@functools.partial(jax.jit, donate_argnums=(0,))
def _load_slot(pool, host, expert, slot):
    """Writes expert `expert` of the host tables `host` into `slot` of the device `pool` (both
    `(gate_up, down)`, each an array or packed `QuantizedWeights`: every leaf is copied)."""

    def one(pool_leaf, host_leaf):
        moved = jax.device_put(jax.lax.dynamic_index_in_dim(host_leaf, expert, keepdims=False),
                               jax.memory.Space.Device)
        return jax.lax.dynamic_update_index_in_dim(pool_leaf, moved, slot, 0)

    with jax.named_scope("cache/load"):
        return jax.tree.map(one, pool, host)


@functools.partial(jax.jit, donate_argnums=(0,))
def _load_slot_from_entry(pool, entry, slot):
    """Writes one expert held alone in host memory (`entry`: `(gate_up, down)` without the
    expert axis, as the disk tier's host store keeps them) into `slot` of the device `pool`."""

    def one(pool_leaf, leaf):
        moved = jax.device_put(leaf, jax.memory.Space.Device)
        return jax.lax.dynamic_update_index_in_dim(pool_leaf, moved, slot, 0)

    with jax.named_scope("cache/load"):
        return jax.tree.map(one, pool, entry)


def _empty_slots(template, num_slots: int):
    """Zeroed device slots shaped like one layer's host table `template` (`[E, ...]` leaves)."""
    on_device = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="device")
    return jax.tree.map(lambda a: jax.device_put(jnp.zeros((num_slots, *a.shape[1:]), a.dtype),
                                                 on_device), template)


class SlotPool:
    """Fixed device arrays of S expert slots of one precision, written in place. The host
    tables are per MoE layer: native arrays, or packed `QuantizedWeights` (their packed bytes
    are what a load moves)."""

    def __init__(self, num_slots: int, host_gate_up: dict[int, ExpertPool],
                 host_down: dict[int, ExpertPool], host_store=None):
        """`host_store`: with the disk tier, a `moejax.cache.host_store.HostExperts` the loads
        read from; then `host_gate_up` / `host_down` are only shape templates (`[1, ...]`
        leaves) and hold no experts."""
        self.host_gate_up, self.host_down = host_gate_up, host_down
        self.host_store = host_store
        first = next(iter(host_gate_up))
        self.num_slots = num_slots
        self.gate_up = _empty_slots(host_gate_up[first], num_slots)
        self.down = _empty_slots(host_down[first], num_slots)
        self.loads = 0

    def load(self, key: Key, slot: int) -> None:
        layer, expert = key
        if self.host_store is not None:
            self.gate_up, self.down = _load_slot_from_entry(
                (self.gate_up, self.down), self.host_store.get(key), np.int32(slot))
        else:
            self.gate_up, self.down = _load_slot(
                (self.gate_up, self.down), (self.host_gate_up[layer], self.host_down[layer]),
                np.int32(expert), np.int32(slot))
        self.loads += 1

    def arrays(self) -> tuple:
        """`(gate_up, down)` as the experts step reads them (a quantized pool as a one-pool
        tuple, `moejax.models.experts.ExpertPools`)."""
        if isinstance(self.gate_up, QuantizedWeights):
            return (self.gate_up,), (self.down,)
        return self.gate_up, self.down


class SlotPools:
    """The cache's per-precision pools (`CacheShape.pools`), slots numbered consecutively: a
    global slot is `offset + local slot` of the pool it lies in."""

    def __init__(self, pools: list[SlotPool]):
        self.pools = list(pools)
        self.offsets = np.cumsum([0] + [p.num_slots for p in self.pools])[:-1].tolist()

    @classmethod
    def for_shape(cls, shape, experts_at: Callable[[str], tuple[dict, dict]]) -> "SlotPools":
        """One `SlotPool` per `shape.pools` entry, fed from `experts_at(precision)`: the host
        tables (gate_up, down per MoE layer) at that precision."""
        return cls([SlotPool(p.num_slots, *experts_at(p.precision)) for p in shape.pools])

    @property
    def loads(self) -> int:
        return sum(p.loads for p in self.pools)

    def load(self, key: Key, slot: int) -> None:
        i = bisect.bisect_right(self.offsets, slot) - 1
        self.pools[i].load(key, slot - self.offsets[i])

    def arrays(self) -> tuple:
        """`(gate_up, down)` as the experts step reads them: one native pool as its arrays
        (the step compiled for the resident model), else tuples of pools."""
        if len(self.pools) == 1 and not isinstance(self.pools[0].gate_up, QuantizedWeights):
            return self.pools[0].gate_up, self.pools[0].down
        return (tuple(p.gate_up for p in self.pools), tuple(p.down for p in self.pools))
