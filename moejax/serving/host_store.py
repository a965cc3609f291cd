"""The live host tier's memory: experts read from storage into pinned host memory, one entry
per expert the host tier (`moejax.cache.host_tier.HostTier`) holds.

The host tier decides; this store does what it says (`HostSink`): `read` submits the expert's
storage read (`moejax.checkpoint.expert_reader.ExpertReader`, asynchronous, on the reader's
pool: every read of a wave is in flight at once, up to the pool's threads), `drop` lets it go.
A device load asks for the entry with `get`, which waits for the read if it is still running
and moves the bytes into pinned host memory once; `landed` / `wait_any` let the runtime load
the experts whose reads have landed first. A read error or a checksum mismatch surfaces in
`get`, as the reader's `CheckpointError` naming the file, layer and expert: a partly read
expert is never computed with.

A dropped entry is kept until `release_dropped` (called once the loads the cache issued so
far are dispatched), because the cache may evict an expert from host memory after it booked
a device load from it that the runtime has queued but not yet dispatched (a prefetch). Those
buffers are host memory too: every buffer held — entries, reads in flight, dropped ones not
yet released — counts against the tier's bound (`capacity`). A read that would go over it
first has the runtime dispatch the loads that still need dropped entries (`reclaim`), then
releases them; `peak_held` is the most buffers held at once.
"""

from __future__ import annotations

import concurrent.futures
import time
from concurrent.futures import Future
from typing import Callable

import jax
import numpy as np

from moejax.model_config import ModelConfig
from moejax.quant import BITS, SCALE_DTYPE, QuantizedWeights
from moejax.seam import Key


class HostExperts:
    def __init__(self, reader, precision: str, to_host, capacity: int | None = None):
        """`reader`: an `ExpertReader`; `precision`: the precision read; `to_host(np.ndarray)`:
        puts an array in pinned host memory (`moejax.checkpoint.to_host`); `capacity`: the host
        tier's bound in experts (None: unbounded)."""
        self.reader, self.precision, self.to_host = reader, precision, to_host
        self.capacity = capacity
        if capacity is not None and hasattr(reader, "buffer_limit"):
            reader.buffer_limit = capacity  # idle read buffers stay within the bound
        self.pending: dict[Key, Future] = {}
        self.entries: dict[Key, tuple] = {}
        self.dropped: dict[Key, Future | tuple] = {}
        self.reads = 0
        self.read_log: list[Key] = []  # every read, in the order it was submitted
        # Set by the runtime: dispatches the queued loads that read dropped entries.
        self.reclaim: Callable[[], None] = lambda: None
        self.peak_held = 0
        self.max_reads_in_flight = 0
        self.storage_wait_s = 0.0  # wall time a device load waited for its read
        self.preload_s = 0.0  # wall time of the reads before the first token

    @property
    def held(self) -> int:
        """Host buffers held now: entries, reads in flight, dropped ones not yet released."""
        return len(self.entries) + len(self.pending) + len(self.dropped)

    def read(self, key: Key) -> None:
        self.dropped.pop(key, None)
        if self.capacity is not None and self.dropped and self.held >= self.capacity:
            self.reclaim()  # the loads that still read dropped entries go first
            self.release_dropped(wait=True)
        self.pending[key] = self.reader.submit(key[0], key[1], self.precision)
        self.reads += 1
        self.read_log.append(key)
        self.peak_held = max(self.peak_held, self.held)
        in_flight = sum(not f.done() for f in self.pending.values())
        self.max_reads_in_flight = max(self.max_reads_in_flight, in_flight)

    def drop(self, key: Key) -> None:
        if key in self.entries:
            self.dropped[key] = self.entries.pop(key)
        elif key in self.pending:
            self.dropped[key] = self.pending.pop(key)

    def _source(self, key: Key):
        source = self.entries.get(key)
        if source is None:
            source = self.pending.get(key)
        if source is None:
            source = self.dropped.get(key)
        return source

    def landed(self, key: Key) -> bool:
        """Whether `key`'s read is done (a `get` would not wait for storage)."""
        source = self._source(key)
        return not isinstance(source, Future) or source.done()

    def wait_any(self, keys) -> None:
        """Waits until one of `keys`' reads lands (the wait is counted as storage wait)."""
        futures = [f for f in map(self._source, keys) if isinstance(f, Future)]
        if futures:
            start = time.perf_counter()
            concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_COMPLETED)
            self.storage_wait_s += time.perf_counter() - start

    def get(self, key: Key) -> tuple:
        """`(gate_up, down)` of `key` in pinned host memory (each an array or packed
        `QuantizedWeights`), waiting for its read."""
        entry = self.entries.get(key)
        if entry is not None:
            return entry
        source = self.pending.pop(key, None)
        kept = source is not None
        if source is None:
            source = self.dropped.get(key)
            if source is None:
                raise AssertionError(f"expert {key} is not in host memory nor being read")
        if isinstance(source, Future):
            if not source.done():
                start = time.perf_counter()
                concurrent.futures.wait([source])
                self.storage_wait_s += time.perf_counter() - start
            source = jax.tree.map(self.to_host, source.result())  # CheckpointError surfaces here
        if kept:
            self.entries[key] = source
        else:
            self.dropped[key] = source
        return source

    def release_dropped(self, keep=(), wait: bool = False) -> None:
        """Lets the dropped entries go, but those in `keep` (loads still queued read them). A
        dropped read still in flight holds its buffer until it lands: it stays (counted as
        held) unless `wait`, which waits for it (a read that needs the room)."""
        keep = set(keep)
        for key in [k for k in self.dropped if k not in keep]:
            source = self.dropped[key]
            if isinstance(source, Future) and not source.done():
                if not wait:
                    continue
                concurrent.futures.wait([source])
            del self.dropped[key]

    def stats(self) -> dict:
        """What `HostTier.to_dict` reports of the live store."""
        buffers = self.reader.buffer_stats() if hasattr(self.reader, "buffer_stats") else {}
        return {"peak_held": self.peak_held, "reads": self.reads,
                "max_reads_in_flight": self.max_reads_in_flight,
                "storage_wait_s": self.storage_wait_s, "preload_s": self.preload_s,
                "read_buffers": buffers.get("peak_alive", 0),
                "read_buffer_bytes": buffers.get("peak_bytes", 0)}

    def __len__(self) -> int:
        return len(self.entries) + len(self.pending)


def expert_templates(cfg: ModelConfig, precision: str, groups: dict[str, int] | None):
    """Zero `(gate_up, down)` of one expert with a leading axis of 1, at `precision` (`groups`:
    the checkpoint's group length per kind for a quantized one): the shapes a slot pool is
    allocated from when no expert is in host memory yet."""
    from moejax.checkpoint import quantized_shapes

    h, i = cfg.hidden_size, cfg.expert_intermediate_size
    native = {"gate_up": (1, h, 2 * i), "down": (1, i, h)}
    if precision == "native":
        return tuple(np.zeros(native[k], np.dtype(cfg.dtype)) for k in ("gate_up", "down"))
    bits = BITS[precision]
    out = []
    for kind in ("gate_up", "down"):
        shapes = quantized_shapes(native[kind], bits, groups[kind])
        out.append(QuantizedWeights(np.zeros(shapes["values"], np.uint8),
                                    np.zeros(shapes["scale"], SCALE_DTYPE),
                                    np.zeros(shapes["zero"], SCALE_DTYPE), bits))
    return tuple(out)
