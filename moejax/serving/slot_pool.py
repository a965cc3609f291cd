"""Device slot pools: fixed device arrays of S expert slots per precision, written in place
by loads from the host tier (`SlotPool`), numbered consecutively across precisions
(`SlotPools`). What to load where is the cache's; when is the runtime's
(`moejax.serving.runtime`).

A load moves an expert's bytes from host memory (`pinned_host`) into a slot, exactly the
packed bytes at a quantized precision, along one of two paths (`cache.load_path`):

* **fused**: one compiled step per load slices the expert out of the host table, moves it to
  the device and writes it into the slot in place (the pool is donated): on the CPU backend
  one copy. On a GPU the step is a computation on the compute stream, so it queues behind
  (or in front of) the experts step instead of overlapping it (measured on an H200: overlap
  0.18, CHANGELOG.md).
* **copy_stream**: `jax.device_put` moves the experts to device memory — a runtime buffer
  copy, not a computation, which PjRt issues on a transfer stream, so it runs while the
  compute stream runs the steps dispatched before it — and a placement step (`_place`, one
  per load: a device-local copy) writes each into its slot when a step is about to read the
  slot (`SlotPools.arrays`), not when the load is issued: the compute stream waits for a
  transfer only at the first step that reads what it brings. Each array moved has a fixed
  cost in the runtime (25 µs on the CPU backend here), so the host tier also holds each
  expert as one record (`_records`: its leaves' bytes back to back, which the placement
  reinterprets); the disk tier's entries move as their leaves.

"auto" takes copy_stream on an accelerator and fused on the CPU backend, where there is no
separate copy stream and copy_stream copies the bytes twice (`benchmarks/slot_loads.py`).

A wave's loads go together (`SlotPools.load_many`): copy_stream moves them in one batched
`device_put` (one call into the runtime, every copy in flight at once); a load superseded in
the same call by a later one into its slot is not moved. The writes stay one step per load:
into 64 slots of 3 MiB experts on the CPU backend, 8 single-update steps took 2.6 ms, where
one step writing the 8 took 41 ms as a chain of updates and 109 ms as a loop over them, and
a scatter 200 ms for one expert (they rewrite the pool), each also compiled per load count.

A slot write goes through an unsigned-integer view of the pool (`_write`): the bytes are
copied, never converted, and on the CPU backend a bfloat16 update is otherwise computed in
float32 over the whole pool (one load into a 64-slot pool of 3 MiB experts took 26 ms
instead of 0.4).

Loads are dispatched asynchronously; the experts step that reads the pool is ordered after
them by data dependency, so a slot is never read before its load lands, and a load into a
slot is ordered after the earlier steps that read it (no use-after-evict). Loads into one
slot land in the order given: the last one wins.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
from typing import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from moejax.cache import LOAD_PATHS
from moejax.errors import ConfigError
from moejax.models import ExpertPool
from moejax.quant import QuantizedWeights
from moejax.seam import Key

# copy_stream: the most experts moved in one `device_put`, and held on the device unplaced per
# pool; past it the pool's pending loads are placed and waited for (a wave into every slot,
# or a warm start's every expert, would otherwise hold the pool's size again on the device).
STAGED = 32


def resolve_load_path(load_path: str, platform: str | None = None) -> str:
    """"fused" or "copy_stream" for `cache.load_path` on `platform` (the default device's when
    None): "auto" is copy_stream on an accelerator, fused on the CPU backend."""
    if load_path not in LOAD_PATHS:
        raise ConfigError(f"cache.load_path={load_path!r} is not one of {LOAD_PATHS}")
    if load_path != "auto":
        return load_path
    platform = platform or jax.devices()[0].platform
    return "fused" if platform == "cpu" else "copy_stream"


def _bits(dtype) -> jnp.dtype:
    """The unsigned integer type of `dtype`'s width for a floating dtype, else `dtype`."""
    dtype = jnp.dtype(dtype)
    return jnp.dtype(f"uint{8 * dtype.itemsize}") if jnp.issubdtype(dtype, jnp.floating) \
        else dtype


def _as(x, dtype):
    """`x` reinterpreted as `dtype` of the same width (a no-op when it is already)."""
    return x if x.dtype == dtype else jax.lax.bitcast_convert_type(x, dtype)


def _write(pool_leaf, leaf, slot):
    """`pool_leaf` with `leaf` written into `slot`, in place, through an integer view."""
    bits = _bits(pool_leaf.dtype)
    out = jax.lax.dynamic_update_index_in_dim(_as(pool_leaf, bits), _as(leaf, bits), slot, 0)
    return _as(out, pool_leaf.dtype)


@functools.partial(jax.jit, donate_argnums=(0,))
def _load_slot(pool, host, expert, slot):
    """Writes expert `expert` of the host tables `host` into `slot` of the device `pool` (both
    `(gate_up, down)`, each an array or packed `QuantizedWeights`: every leaf is copied)."""

    def one(pool_leaf, host_leaf):
        moved = jax.device_put(jax.lax.dynamic_index_in_dim(host_leaf, expert, keepdims=False),
                               jax.memory.Space.Device)
        return _write(pool_leaf, moved, slot)

    with jax.named_scope("cache/load"):
        return jax.tree.map(one, pool, host)


@functools.partial(jax.jit, donate_argnums=(0,))
def _load_slot_from_entry(pool, entry, slot):
    """Writes one expert held alone in host memory (`entry`: `(gate_up, down)` without the
    expert axis, as the disk tier's host store keeps them) into `slot` of the device `pool`."""

    def one(pool_leaf, leaf):
        return _write(pool_leaf, jax.device_put(leaf, jax.memory.Space.Device), slot)

    with jax.named_scope("cache/load"):
        return jax.tree.map(one, pool, entry)


@functools.partial(jax.jit, donate_argnums=(0,), static_argnames=("layout",))
def _place(pool, moved, slot, layout=None):
    """copy_stream's placement: writes one expert `moved`, on the device already, into `slot`
    of the device `pool` (a device-local copy). `moved` is a record (`layout`:
    `_Layout.parts`, the byte range, shape and dtype of each pool leaf in it) or, without a
    layout, `(gate_up, down)` as the pool without its slot axis (a disk-tier entry)."""
    pool_leaves, treedef = jax.tree.flatten(pool)
    if layout is None:
        parts = jax.tree.leaves(moved)
    else:
        parts = [_from_record(moved[start:stop], shape, dtype)
                 for start, stop, shape, dtype in layout]
    with jax.named_scope("cache/place"):
        return jax.tree.unflatten(treedef, [_write(p, v, slot)
                                            for p, v in zip(pool_leaves, parts, strict=True)])


def _from_record(data, shape: tuple, dtype: str):
    """A leaf's bytes (uint8) as `shape` of `dtype`'s width, reinterpreted, not converted:
    `_write` views the pool the same way."""
    width = jnp.dtype(dtype).itemsize
    if width > 1:
        data = _as(data.reshape(-1, width), _bits(dtype))
    return data.reshape(shape)


def _last_per_slot(loads: Sequence[tuple[Key, int]]) -> list[tuple[Key, int]]:
    """`loads` without those a later load into the same slot supersedes, in order."""
    last = {slot: i for i, (_, slot) in enumerate(loads)}
    return [load for i, load in enumerate(loads) if last[load[1]] == i]


@functools.cache
def _on_device():
    return jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="device")


def _empty_slots(template, num_slots: int):
    """Zeroed device slots shaped like one layer's host table `template` (`[E, ...]` leaves)."""
    return jax.tree.map(lambda a: jax.device_put(jnp.zeros((num_slots, *a.shape[1:]), a.dtype),
                                                 _on_device()), template)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where each leaf of one expert (`(gate_up, down)` without the expert axis, in tree leaf
    order) lies in its record: `(start, stop, shape, dtype)` byte ranges, back to back."""

    parts: tuple[tuple[int, int, tuple[int, ...], str], ...]

    @classmethod
    def of(cls, table) -> "_Layout":
        parts, start = [], 0
        for leaf in jax.tree.leaves(table):
            stop = start + int(np.prod(leaf.shape[1:])) * np.dtype(leaf.dtype).itemsize
            parts.append((start, stop, tuple(leaf.shape[1:]), np.dtype(leaf.dtype).name))
            start = stop
        return cls(tuple(parts))


@dataclasses.dataclass(frozen=True)
class HostRecords:
    """copy_stream's host form of one precision's experts: per MoE layer, each expert as one
    record (`_records`) in host memory, where each leaf lies in a record (`layout`), and zeros
    shaped like one expert (`templates`: `(gate_up, down)`, `[1, ...]` leaves) to shape a pool
    from. Read only: every pool built from one model may share them."""

    layout: _Layout
    records: dict[int, list]
    templates: tuple

    @classmethod
    def of(cls, gate_up: dict, down: dict, consume: bool) -> "HostRecords":
        """The records of the host tables `gate_up` / `down` (per MoE layer). `consume`: the
        tables are handed over (`LoadedModel.take_experts`) and each layer's is taken out of
        the dicts once its records are made, so that, held nowhere else, it goes then: the
        experts are held twice only for the layer being copied."""
        first = next(iter(gate_up))
        layout = _Layout.of((gate_up[first], down[first]))
        templates = (_template(gate_up[first]), _template(down[first]))
        records = {}
        for layer in list(gate_up):
            table = (gate_up.pop(layer), down.pop(layer)) if consume else \
                (gate_up[layer], down[layer])
            records[layer] = _records(table, layout)
            del table
        return cls(layout, records, templates)

    def tables(self) -> tuple[dict, dict]:
        """The templates as one-layer tables, as a pool reads its shapes."""
        first = next(iter(self.records))
        return {first: self.templates[0]}, {first: self.templates[1]}


def _template(table):
    """Zeros shaped like one expert of a layer's table (`[1, ...]` leaves, in numpy): the
    shapes a pool is built from, with no computation on host memory."""
    return jax.tree.map(lambda leaf: np.zeros((1, *leaf.shape[1:]), leaf.dtype), table)


def _records(table, layout: _Layout) -> list:
    """One layer's host table (`(gate_up, down)`, `[E, ...]` leaves) as E records in host
    memory (the table's memory kind): each expert's bytes, its leaves back to back, one array
    that one `device_put` source moves whole (a packed int4 wave of 8 OLMoE experts as 48
    arrays took 4x the time of 8 records of the same bytes here). A copy of the table."""
    from moejax.checkpoint import host_memory_kind

    leaves = jax.tree.leaves(table)
    kind = getattr(getattr(leaves[0], "sharding", None), "memory_kind", None) or \
        host_memory_kind()
    host = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind=kind)
    rows = np.concatenate([np.asarray(leaf).reshape(leaf.shape[0], -1).view(np.uint8)
                           for leaf in leaves], axis=1)
    assert rows.shape[1] == layout.parts[-1][1]
    return jax.device_put(list(rows), host)


class SlotPool:
    """Fixed device arrays of S expert slots of one precision, written in place. The host
    tables are per MoE layer: native arrays, or packed `QuantizedWeights` (their packed bytes
    are what a load moves).

    copy_stream places a load when a step is about to read its slot (`arrays`, or reading
    `gate_up` / `down`), not when it is issued: until then its moved copy is held on the
    device (`pending`), and a prefetch's transfer runs behind every step dispatched before."""

    def __init__(self, num_slots: int, host_gate_up: dict[int, ExpertPool] | None,
                 host_down: dict[int, ExpertPool] | None, host_store=None,
                 load_path: str = "auto", records: HostRecords | None = None):
        """`host_store`: with the disk tier, a `moejax.cache.host_store.HostExperts` the loads
        read from; then `host_gate_up` / `host_down` are only shape templates (`[1, ...]`
        leaves) and hold no experts. `load_path`: `cache.load_path` (`resolve_load_path`).
        `records`: copy_stream's host form of the experts, built before (`HostRecords`,
        shared by every pool built from one model: `moejax.serving.build`); then the tables
        are not given (None) and `host_gate_up` / `host_down` are the records' templates.
        Without it, copy_stream builds records of its own from the tables, which stay."""
        self.host_store = host_store
        self.load_path = resolve_load_path(load_path)
        if records is not None:
            if self.load_path != "copy_stream" or host_store is not None:
                raise ValueError("records are copy_stream's host form, without a host store")
            host_gate_up, host_down = records.tables()
        first = next(iter(host_gate_up))
        self.num_slots = num_slots
        self._gate_up = _empty_slots(host_gate_up[first], num_slots)
        self._down = _empty_slots(host_down[first], num_slots)
        self.host_gate_up, self.host_down = host_gate_up, host_down
        self.loads = 0
        # copy_stream: moved experts not yet placed, local slot -> the last one into it.
        self.pending: dict[int, object] = {}
        if self.load_path == "copy_stream" and host_store is None and records is None:
            records = HostRecords.of(host_gate_up, host_down, consume=False)
        # copy_stream from host memory: each expert's record, per layer, and their layout.
        self._records: dict[int, list] = {} if records is None else records.records
        self._layout: _Layout | None = None if records is None else records.layout

    @property
    def gate_up(self) -> ExpertPool:
        """The device slots of `gate_up`, every load issued placed."""
        self.place_pending()
        return self._gate_up

    @property
    def down(self) -> ExpertPool:
        self.place_pending()
        return self._down

    def load(self, key: Key, slot: int) -> None:
        self.load_many([(key, slot)])

    def load_many(self, loads: Sequence[tuple[Key, int]]) -> None:
        """Loads expert `key` into local slot `slot` for each `(key, slot)`, in order:
        copy_stream moves them in one transfer (`moved`), fused runs one step each."""
        if self.load_path == "copy_stream":
            kept = _last_per_slot(loads)
            superseded = len(loads) - len(kept)
            for start in range(0, len(kept), STAGED):
                part = kept[start:start + STAGED]
                moved = jax.device_put(self.host_entries([k for k, _ in part]), _on_device())
                self.moved(moved, [s for _, s in part], superseded if start == 0 else 0)
            return
        for (layer, expert), slot in loads:
            if self.host_store is not None:
                self._gate_up, self._down = _load_slot_from_entry(
                    (self._gate_up, self._down), self.host_store.get((layer, expert)),
                    np.int32(slot))
            else:
                self._gate_up, self._down = _load_slot(
                    (self._gate_up, self._down),
                    (self.host_gate_up[layer], self.host_down[layer]),
                    np.int32(expert), np.int32(slot))
            self.loads += 1

    def host_entries(self, keys: Sequence[Key]) -> list:
        """What copy_stream moves of each key, in host memory: its record (`_records`), or with
        the disk tier the store's entry, `(gate_up, down)` without the expert axis (waiting for
        its read)."""
        if self.host_store is not None:
            return [self.host_store.get(key) for key in keys]
        return [self._records[layer][expert] for layer, expert in keys]

    def moved(self, experts: list, slots: Sequence[int], superseded: int = 0) -> None:
        """Takes experts moved to the device for local slots `slots` (distinct), to be placed
        before the pool is read; `superseded`: loads of the same call not moved because a
        later one took their slot (counted as loads all the same). Past `STAGED` pending
        loads they are placed and waited for: what is held unplaced stays bounded."""
        for expert, slot in zip(experts, slots, strict=True):
            self.pending[slot] = expert  # a later load into a slot replaces a pending one
        self.loads += len(experts) + superseded
        if len(self.pending) > STAGED:
            self.place_pending()
            jax.block_until_ready((self._gate_up, self._down))

    def place_pending(self, slots: Iterable[int] | None = None) -> None:
        """Places the pending loads into `slots` (None: all), one `_place` step each."""
        if not self.pending:
            return
        chosen = list(self.pending) if slots is None else \
            [s for s in dict.fromkeys(slots) if s in self.pending]
        layout = None if self._layout is None else self._layout.parts
        for slot in chosen:
            self._gate_up, self._down = _place((self._gate_up, self._down),
                                               self.pending.pop(slot), np.int32(slot),
                                               layout=layout)

    def arrays(self, slots: Iterable[int] | None = None) -> tuple:
        """`(gate_up, down)` as the experts step reads them (a quantized pool as a one-pool
        tuple, `moejax.models.experts.ExpertPools`), the pending loads into `slots` (None:
        all) placed first: a step that reads no other slot need not wait for the others."""
        gate_up, down = self.placed(slots)
        if isinstance(gate_up, QuantizedWeights):
            return (gate_up,), (down,)
        return gate_up, down

    def placed(self, slots: Iterable[int] | None = None) -> tuple:
        """`(gate_up, down)` as held (arrays, or packed `QuantizedWeights`), the pending loads
        into `slots` (None: all) placed first."""
        self.place_pending(slots)
        return self._gate_up, self._down


class SlotPools:
    """The cache's per-precision pools (`CacheShape.pools`), slots numbered consecutively: a
    global slot is `offset + local slot` of the pool it lies in."""

    def __init__(self, pools: list[SlotPool]):
        self.pools = list(pools)
        self.offsets = np.cumsum([0] + [p.num_slots for p in self.pools])[:-1].tolist()

    @classmethod
    def for_shape(cls, shape, experts_at: Callable[[str], tuple[dict, dict]],
                  load_path: str = "auto") -> "SlotPools":
        """One `SlotPool` per `shape.pools` entry, fed from `experts_at(precision)`: the host
        tables (gate_up, down per MoE layer) at that precision, loaded along `load_path`."""
        return cls([SlotPool(p.num_slots, *experts_at(p.precision), load_path=load_path)
                    for p in shape.pools])

    @classmethod
    def from_records(cls, shape, records_at: Callable[[str], HostRecords]) -> "SlotPools":
        """One copy_stream `SlotPool` per `shape.pools` entry, fed from `records_at(precision)`
        (`HostRecords`)."""
        return cls([SlotPool(p.num_slots, None, None, load_path="copy_stream",
                             records=records_at(p.precision)) for p in shape.pools])

    @property
    def loads(self) -> int:
        return sum(p.loads for p in self.pools)

    def _by_pool(self, pairs) -> dict[int, list]:
        """`(item, global slot)` pairs grouped per pool as `(item, local slot)`, in order."""
        out: dict[int, list] = collections.defaultdict(list)
        for item, slot in pairs:
            i = bisect.bisect_right(self.offsets, slot) - 1
            out[i].append((item, slot - self.offsets[i]))
        return out

    def load(self, key: Key, slot: int) -> None:
        self.load_many([(key, slot)])

    def load_many(self, loads: Sequence[tuple[Key, int]]) -> None:
        """Loads expert `key` into global slot `slot` for each `(key, slot)` (into one slot in
        the order given): the copy_stream pools' experts in one batched `device_put` (placed
        when read: `arrays`), a fused pool's one step each."""
        by_pool = self._by_pool(loads)
        copied = {i: _last_per_slot(pool_loads) for i, pool_loads in by_pool.items()
                  if self.pools[i].load_path == "copy_stream"}
        if sum(map(len, copied.values())) > STAGED:  # in `STAGED` pieces, pool by pool
            for i in copied:
                self.pools[i].load_many(by_pool[i])
        elif copied:
            host = [self.pools[i].host_entries([k for k, _ in kept]) for i, kept in copied.items()]
            for (i, kept), moved in zip(copied.items(), jax.device_put(host, _on_device())):
                self.pools[i].moved(moved, [s for _, s in kept],
                                    superseded=len(by_pool[i]) - len(kept))
        for i, pool_loads in by_pool.items():
            if i not in copied:
                self.pools[i].load_many(pool_loads)

    def arrays(self, slots: Iterable[int] | None = None) -> tuple:
        """`(gate_up, down)` as the experts step reads them: one native pool as its arrays
        (the step compiled for the resident model), else tuples of pools. The pending loads
        into `slots` (global; None: all) are placed first (`SlotPool.arrays`)."""
        local = None if slots is None else self._by_pool((None, s) for s in slots)
        held = [p.placed(None if local is None else [s for _, s in local.get(i, ())])
                for i, p in enumerate(self.pools)]
        if len(held) == 1 and not isinstance(held[0][0], QuantizedWeights):
            return held[0]
        return tuple(gate_up for gate_up, _ in held), tuple(down for _, down in held)
