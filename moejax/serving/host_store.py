"""The live host tier's memory: experts read from storage into pinned host memory, one entry
per expert the host tier (`moejax.cache.host_tier.HostTier`) holds.

The host tier decides; this store does what it says (`HostSink`): `read` submits the expert's
storage read (`moejax.checkpoint.expert_reader.ExpertReader`, asynchronous), `drop` lets it go.
A device load asks for the entry with `get`, which waits for the read if it is still running
and moves the bytes into pinned host memory once. A read error or a checksum mismatch surfaces
there, as the reader's `CheckpointError` naming the file, layer and expert: a partly read
expert is never computed with.

A dropped entry is kept until `release_dropped` (called once the loads the cache issued so
far are dispatched), because the cache may evict an expert from host memory after it booked
a device load from it that the runtime has queued but not yet dispatched (a prefetch).
"""

from __future__ import annotations

from concurrent.futures import Future

import jax
import numpy as np

from moejax.model_config import ModelConfig
from moejax.quant.formats import BITS, SCALE_DTYPE
from moejax.quant.weights import QuantizedWeights
from moejax.seam import Key


class HostExperts:
    def __init__(self, reader, precision: str, to_host):
        """`reader`: an `ExpertReader`; `precision`: the precision read; `to_host(np.ndarray)`:
        puts an array in pinned host memory (`moejax.checkpoint.to_host`)."""
        self.reader, self.precision, self.to_host = reader, precision, to_host
        self.pending: dict[Key, Future] = {}
        self.entries: dict[Key, tuple] = {}
        self.dropped: dict[Key, Future | tuple] = {}
        self.reads = 0

    def read(self, key: Key) -> None:
        self.dropped.pop(key, None)
        self.pending[key] = self.reader.submit(key[0], key[1], self.precision)
        self.reads += 1

    def drop(self, key: Key) -> None:
        if key in self.entries:
            self.dropped[key] = self.entries.pop(key)
        elif key in self.pending:
            self.dropped[key] = self.pending.pop(key)

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
            source = jax.tree.map(self.to_host, source.result())  # CheckpointError surfaces here
        if kept:
            self.entries[key] = source
        else:
            self.dropped[key] = source
        return source

    def release_dropped(self) -> None:
        self.dropped.clear()

    def __len__(self) -> int:
        return len(self.entries) + len(self.pending)


def expert_templates(cfg: ModelConfig, precision: str, groups: dict[str, int] | None):
    """Zero `(gate_up, down)` of one expert with a leading axis of 1, at `precision` (`groups`:
    the checkpoint's group length per kind for a quantized one): the shapes a slot pool is
    allocated from when no expert is in host memory yet."""
    from moejax.checkpoint.expert_store import quantized_shapes

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
