"""Reusable page-aligned buffers for expert reads: a read lands in a buffer that an earlier
read's expert has let go of, instead of a fresh allocation.

Why: a fresh `np.empty` of an expert's record per read costs the kernel a page fault and a
page of zeroing per 4 KiB on first touch, on the reader's threads, for every read
(`benchmarks/reader_cpu.py` measures it). A buffer taken again has its pages mapped already.

A buffer goes back to its pool when nothing refers to it any more: not the reader's result,
not the host tier's entry, and not JAX — on the CPU backend `jax.device_put` to pinned host
memory aliases a 64-byte-aligned numpy array instead of copying it, and keeps the array alive
for as long as the JAX buffer (and any computation still reading it) lives. So reuse cannot
overwrite bytes anything still reads: the pool watches each buffer with `weakref.finalize` on
the array it hands out, whose views (the expert's parts, `packed.Record.weights`) all keep it
alive. A buffer is never taken back by force; when every buffer is in use, `take` allocates
another. `limit` caps what the pool keeps: a returned buffer is kept for reuse only while the
buffers alive and kept stay within it, otherwise it is freed — so idle buffers never hold more
than `limit` buffers' memory (the host tier's bound), while buffers JAX still reads (a device
load in flight) may take the count above it for as long as they are read (`peak_alive`).

Each buffer is a page-aligned slice of an over-allocated array the pool owns; the array handed
out is a non-owning `np.frombuffer` over it, so the finalizer fires when the last view of that
handed-out array dies, not when the pool's own reference would.
"""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np

PAGE = 4096  # O_DIRECT's alignment of buffer addresses, offsets and lengths


def page_aligned(nbytes: int) -> np.ndarray:
    """A uint8 buffer of `nbytes` starting on a page boundary (what `O_DIRECT` needs)."""
    raw = np.empty(nbytes + PAGE, np.uint8)
    skip = -raw.ctypes.data % PAGE
    return raw[skip:skip + nbytes]


class ReadBuffers:
    """Page-aligned buffers of `nbytes` each, reused once everything reading one lets it go.
    Thread-safe."""

    def __init__(self, nbytes: int, limit: int | None = None):
        self.nbytes, self.limit = nbytes, limit
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()
        self.allocated = 0  # buffers made
        self.taken = 0  # buffers handed out (reads)
        self.alive = 0  # handed out and not yet let go
        self.peak_alive = 0

    def take(self) -> np.ndarray:
        """A writable uint8 buffer of `nbytes`, page-aligned; its memory returns to the pool
        when the returned array and every view of it are gone."""
        if self.limit is not None and self.alive >= self.limit and not self._free:
            # An entry the host tier let go of can still be held by a young reference cycle
            # (a future and the arrays made from its result) until the cyclic collector runs;
            # a generation-0 collection (tens of microseconds) returns it before a buffer is
            # made beyond the bound (measured: 26 buffers for a bound of 19 without it).
            gc.collect(0)
        with self._lock:
            self.taken += 1
            self.alive += 1
            self.peak_alive = max(self.peak_alive, self.alive)
            if self._free:
                memory = self._free.pop()
            else:
                memory = page_aligned(self.nbytes)
                self.allocated += 1
        buffer = np.frombuffer(memoryview(memory), np.uint8)
        buffer.flags.writeable = True
        weakref.finalize(buffer, self._give_back, memory)
        return buffer

    def _give_back(self, memory: np.ndarray) -> None:
        with self._lock:
            self.alive -= 1
            if self.limit is None or self.alive + len(self._free) < self.limit:
                self._free.append(memory)

    @property
    def reused(self) -> int:
        """Reads that landed in a buffer an earlier read had used."""
        return self.taken - self.allocated

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)
