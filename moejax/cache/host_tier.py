"""The host tier: a bounded cache of experts in host memory, in front of storage.

With `cache.host_capacity_frac < 1` (or `cache.host_bytes`) experts live on storage and the
host holds at most `capacity` of them. The device tier's fetches go through it
(`ExpertCache.admit`): an expert whose bytes are in host memory is transferred at once (a
host hit), one still being read is transferred when its read lands (a late host hit), and
any other is read from storage first (a host miss), the host's eviction policy
(`cache.host_eviction`, any policy of the registry that does not need the future) choosing a
victim when the tier is full. The device tier's prefetch predictions also read their targets
ahead into host memory (`read_ahead`), so a later transfer finds them there.

The tiers are not inclusive: an expert may be on the device and not in host memory (its
device copy stays valid; evicted from the device it is read again). The host sees only the
device tier's fetches, never its hits, so its recency is that of fetches.

Time: reads are booked on a `moejax.timing.storage.StorageQueue`; a transfer waits for its read.
The tier protects the running wave's experts (the host holds at least one layer's experts, so
a victim always exists) and nothing else. Counting follows DESIGN.md "The disk tier".
"""

from __future__ import annotations

from typing import Callable, Protocol

from moejax.policies.base import EvictionPolicy
from moejax.seam import Key
from moejax.timing import StorageQueue

COUNTERS = ("requests", "hits", "late_hits", "misses", "demand_misses", "read_ahead",
            "storage_reads", "evictions", "preload_reads")
BYTES = ("storage_bytes",)
SECONDS = ("storage_stall_s",)
# What only a live run measures (the store's wall clock and reads), in `to_dict` beside the
# model's numbers: reads made, most reads in flight at once, wall time device loads waited for
# reads, wall time of the reads before the first token, and the reader's reusable buffers
# (`checkpoint.read_buffers`): how many it made (the most alive at once: the tier's, and those
# JAX still reads) and their bytes (0 with io.mode=mmap, which reads into no buffer).
LIVE_KEYS = ("reads", "max_reads_in_flight", "storage_wait_s", "preload_s", "read_buffers",
             "read_buffer_bytes")


class HostSink(Protocol):
    """What the live runtime does when the host tier changes (replay has no sink)."""

    def read(self, key: Key) -> None:
        """Start reading `key` from storage into host memory (asynchronously)."""

    def drop(self, key: Key) -> None:
        """`key` left host memory."""

    def stats(self) -> dict:
        """What the live store measured: `peak_held` (host buffers held at once, dropped ones
        awaiting their loads included) and `LIVE_KEYS`."""


class HostTier:
    """Residency of experts in `capacity` host slots, each filled by one storage read of
    `read_bytes`. `ready[key]` is when `key`'s bytes are (or will be) in host memory."""

    def __init__(self, capacity: int, read_bytes: int, policy: EvictionPolicy,
                 storage: StorageQueue, layers: list[int], spec: str = ""):
        self.capacity, self.read_bytes = capacity, read_bytes
        self.policy, self.storage = policy, storage
        self.spec = spec or policy.name
        self.layers = list(layers)
        self.pos_of = {l: p for p, l in enumerate(layers)}
        policy.set_layer_positions(self.pos_of)
        self.ready: dict[Key, float] = {}
        n = len(layers)
        self.c: dict[str, list] = {k: [0] * n for k in COUNTERS + BYTES}
        self.c.update({k: [0.0] * n for k in SECONDS})
        self.sink: HostSink | None = None
        self.seeded = 0
        self.peak_held = 0  # the most experts in host memory (or being read) at once
        self.preloaded = False

    # -- what the device tier asks -------------------------------------------------------------
    def bytes_ready(self, key: Key, pos: int, at: float, evictable: Callable[[Key], bool],
                    prefetch: bool) -> float | None:
        """The device tier transfers `key` at `at` (a demand fetch, or a prefetch when
        `prefetch`): when its bytes are in host memory (`at` on a host hit). None for a
        prefetch that finds no host slot it may take (a prefetch never blocks; not counted)."""
        c, p = self.c, self.pos_of[key[0]]
        ready = self.ready.get(key)
        if ready is None and not self._make_room(pos, evictable, key):
            if prefetch:
                return None
            raise AssertionError(f"no host slot for {key}: all {self.capacity} are protected")
        c["requests"][p] += 1
        if ready is not None:
            self.policy.on_access(key, pos)
            if ready > at:
                c["late_hits"][p] += 1
                return ready
            c["hits"][p] += 1
            return at
        c["misses"][p] += 1
        if not prefetch:
            c["demand_misses"][p] += 1
        end = self._read(key, pos, at, prefetch)
        self.policy.on_access(key, pos)
        return end

    def can_take(self, key: Key, pos: int, evictable: Callable[[Key], bool]) -> bool:
        """Whether `key` is in host memory or could be read in (a slot is free or a victim may
        go); changes nothing."""
        return (key in self.ready or len(self.ready) < self.capacity
                or self.policy.victim(pos, evictable, key) is not None)

    def read_ahead(self, key: Key, pos: int, at: float,
                   evictable: Callable[[Key], bool]) -> None:
        """A prediction for `key` (not on the device): read it into host memory now, unless it
        is there or no victim may go (a read-ahead never blocks)."""
        if key in self.ready:
            self.policy.on_touch(key, pos)
            return
        if not self._make_room(pos, evictable, key):
            return
        self.c["read_ahead"][self.pos_of[key[0]]] += 1
        self._read(key, pos, at, True)

    def count_stall(self, pos: int, seconds: float) -> None:
        self.c["storage_stall_s"][pos] += seconds

    # -- residency -----------------------------------------------------------------------------
    def _make_room(self, pos: int, evictable: Callable[[Key], bool], incoming: Key) -> bool:
        """Evicts a victim when the tier is full; False when none may go."""
        if len(self.ready) < self.capacity:
            return True
        victim = self.policy.victim(pos, evictable, incoming)
        if victim is None:
            return False
        if victim not in self.ready or not evictable(victim):
            raise AssertionError(f"host eviction policy {self.spec} chose {victim}, which is "
                                 "not in host memory or may not go")
        self._evict(victim)
        return True

    def _read(self, key: Key, pos: int, at: float, prefetch: bool) -> float:
        end = self.storage.read(self.read_bytes, at)
        self.ready[key] = end
        if len(self.ready) > self.peak_held:
            self.peak_held = len(self.ready)
        self.policy.on_admit(key, pos, prefetch)
        p = self.pos_of[key[0]]
        self.c["storage_reads"][p] += 1
        self.c["storage_bytes"][p] += self.read_bytes
        if self.sink is not None:
            self.sink.read(key)
        return end

    def _evict(self, key: Key) -> None:
        del self.ready[key]
        self.policy.on_evict(key)
        self.c["evictions"][self.pos_of[key[0]]] += 1
        if self.sink is not None:
            self.sink.drop(key)

    def seed(self, keys: list[Key]) -> None:
        """Fills free host slots with `keys` (hottest first) before the first pass: in host
        memory from the start (ready at time 0), not counted as requests or reads."""
        room = self.capacity - len(self.ready)
        chosen = [k for k in dict.fromkeys(keys) if k not in self.ready and
                  k[0] in self.pos_of][:max(room, 0)]
        for key in reversed(chosen):  # coldest first: the hottest is the most recent
            self.ready[key] = 0.0
            self.policy.on_admit(key, 0, False)
        self.seeded += len(chosen)

    def preload(self, device_keys: list[Key]) -> tuple[list[Key], list[Key]]:
        """The reads before the first token, counted once (`preload_reads`, `storage_bytes`)
        and returned in the order they are made: first every expert placed on the device
        before the first pass (full layers, a device seed) that the tier does not hold, read
        for its device load only, in groups of at most `capacity` (read, loaded, let go: the
        host holds no more than its bound), then every seeded host entry. They are not on the
        run's clock: the first token starts after them. The caller (the live runtime) does the
        reads; replay only counts them."""
        if self.preloaded:
            raise AssertionError("the host tier's preload reads were already counted")
        self.preloaded = True
        transient = [k for k in device_keys if k not in self.ready]
        seeded = list(self.ready)
        for key in [*transient, *seeded]:
            p = self.pos_of[key[0]]
            self.c["preload_reads"][p] += 1
            self.c["storage_bytes"][p] += self.read_bytes
        self.peak_held = max(self.peak_held, min(len(transient), self.capacity), len(seeded))
        return transient, seeded

    # -- summaries -----------------------------------------------------------------------------
    @staticmethod
    def _rates(c: dict) -> dict:
        req = c["requests"]
        return {"hit_rate": (c["hits"] + c["late_hits"]) / req if req else None,
                "ready_hit_rate": c["hits"] / req if req else None,
                "miss_rate": c["misses"] / req if req else None}

    def totals(self) -> dict:
        c = {k: sum(v) for k, v in self.c.items()}
        return {**c, **self._rates(c)}

    def to_dict(self) -> dict:
        per_layer = []
        for pos, layer in enumerate(self.layers):
            c = {k: v[pos] for k, v in self.c.items()}
            per_layer.append({"layer": layer, **c, **self._rates(c)})
        s = self.storage.storage
        # Replay: the most experts the tier held at once. Live: what the store measured (its
        # buffers, dropped ones still awaiting their loads included), and `LIVE_KEYS`.
        live = self.sink.stats() if self.sink is not None and hasattr(self.sink, "stats") \
            else None
        held = live["peak_held"] if live is not None else self.peak_held
        out = {"capacity_experts": self.capacity, "expert_read_bytes": self.read_bytes,
                "capacity_bytes": self.capacity * self.read_bytes,
                "peak_bytes": held * self.read_bytes,
                "eviction": self.spec, "seeded": self.seeded,
                "storage": {"preset": s.name, "read_gbps": s.read_gbps,
                            "read_latency_s": s.read_latency_s, "queue_depth": s.queue_depth},
                "total": self.totals(), "per_layer": per_layer}
        if live is not None:
            out.update({k: live[k] for k in LIVE_KEYS})
        return out

    def check_invariants(self) -> None:
        assert len(self.ready) <= self.capacity, "host tier over its capacity"
        c = self.totals()
        assert c["hits"] + c["late_hits"] + c["misses"] == c["requests"]
        assert c["storage_reads"] == c["misses"] + c["read_ahead"]
        assert self.peak_held <= self.capacity, "host tier over its bound"
