"""One expert at a time from a checkpoint on disk, asynchronously: the disk tier's fetch path.

`ExpertReader.submit(layer, expert, precision)` returns a `concurrent.futures.Future` of that
expert's `(gate_up, down)` — numpy arrays `[H, 2I]`, `[I, H]` in the model's dtype, or one
`QuantizedWeights` of numpy arrays each (no leading expert axis) — bit-identical to the
expert's slice of what `checkpoint.load` / `checkpoint.read_quantized_experts` return.

Packed layout (`moejax.checkpoint.packed`): an expert is one page-aligned range of its layer's
file. With `mode="pread"` (the default, `io.mode`) the read lands in one page-aligned buffer
taken for it up front from a pool of buffers that earlier reads' experts have let go of
(`read_buffers.ReadBuffers`: no fresh allocation per read, and no copy after the read — the
buffer's views are the expert's arrays); `split` cuts the range into that
many page-aligned pieces (whole pages each), read concurrently by a persistent pool of
`workers` threads — Anemll's `--cache-io-split` (page-aligned chunks over a pool of 8 I/O
workers), which keeps several requests in flight to the device where one large read may not.
Each piece is checksummed by the thread that read it and the pieces' crc32s are combined
(`packed.crc32_combine`), so verifying costs no serial pass over the expert; a checksum
mismatch or a short read fails the whole expert with a `CheckpointError` naming the file,
layer, expert and precision — a partly read expert is never returned.

The storage I/O is `os.preadv` on file descriptors kept open per file, not TensorStore: its
kvstore `read` (0.1.86, the installed version) does take a `byte_range`, but returns a new
`bytes` object per read, so it cannot fill a preallocated buffer (every expert would be copied
once more), and reading a warm 6.75 MB range through it measured ~0.7 GB/s against ~12 GB/s
for `os.preadv` on the same file (2-core development machine). `os.preadv` reads straight into
a slice of the expert's buffer and releases the GIL while it waits, as `zlib.crc32` does while
it checksums, so the pool's threads overlap.

`mode="mmap"` (`io.mode`; packed layout only) maps each layer file once, read-only
(`mmap.mmap(fd, 0, access=ACCESS_READ)`, kept until `close`), and returns the expert's arrays
as views of the mapping: zero copy, nothing allocated per read. The checks are pread's: a record
that runs past the end of the mapped file is a short read (`CheckpointError` naming the file,
layer, expert and precision; nothing of it is touched), and the crc32 of the record's
meaningful bytes must match before the future completes. `split` works as with pread: each
piece's pages are faulted in by the thread that checksums them (`zlib.crc32` releases the GIL
over the mapping, so the faults of a cold record overlap), and the pieces' crc32s are combined.
The padding after the last part is not touched — it lies in the record's last page, which the
meaningful bytes already fault in, so `expert_nbytes` (the stride) is what moves in both modes.
An mmap result differs from pread's in two ways only: its arrays are read-only, and they keep
the mapping alive — `close()` unmaps a file at once only when no array read from it is alive;
otherwise it drops its reference and the mapping goes with the last such array, so a result
stays valid after `close()`.

Where the page cache helps and where it doubles the memory held. Both modes read through the
page cache: after a read the file's pages stay cached (clean, reclaimable) whatever the mode,
so a re-read of a recently dropped expert is served from memory, not the disk, in both. pread
then copies the pages into a buffer of its own (the future's result, anonymous memory): while
they stay cached the expert is held twice. mmap's result *is* the cached pages — no buffer, no
copy. What the host tier keeps is what `checkpoint.to_host` (`jax.device_put` to pinned host
memory) makes of the result. On the CPU backend (jax 0.10.2, checked) it aliases any 64-byte
aligned numpy array instead of copying: mmap's views always are aligned, so the host tier's
entry is the page-cache page itself — one copy, but not pinned and not the tier's own: under
memory pressure the kernel may evict it and fault it back in from storage when a device load
next touches it (that load then waits on the disk), and dropping the entry frees no memory at
once (the pages stay cached until reclaimed). pread's buffer is page-aligned (`ReadBuffers`,
as `mode="direct"` needs), so it becomes the entry without a copy (and goes back to the pool
only when the entry, and every computation reading it, has let it go); the page cache and the entry
still hold two copies while the pages stay cached. `mode="direct"` is pread through `O_DIRECT`
descriptors: the page cache is bypassed (nothing cached, every read from the device), and the
entry is the one copy. On a GPU backend `device_put` copies into CUDA pinned memory in either mode (not
measured here; pinned memory cannot alias unregistered pages), so the expert is held twice
while its pages stay cached; mmap saves only pread's transient buffer and one memcpy.
mmap's hazard: the mapping sees the file as it is now, so a checkpoint file truncated while
mapped faults with SIGBUS (the process dies) instead of pread's short read; replace checkpoint
files by rename, never in place, while a reader is open.

zarr layout (`moejax.checkpoint.expert_store`): the same reads as `expert_store.read_expert` /
`read_quantized_expert` (one chunk per kind, or one inner chunk per kind and part, through
TensorStore), run on the pool; errors are theirs (file, layer, expert named). `split` is
accepted and ignored there: zarr chunks are not cut into ranges. `mode="mmap"` is refused
there (`ConfigError`): there is no record to map, only compressed or sharded chunks.
"""

from __future__ import annotations

import concurrent.futures
import errno
import mmap
import os
import threading

import numpy as np

from moejax.checkpoint import expert_store, packed
from moejax.checkpoint.meta import ADD_PRECISIONS_HINT, expert_layout, read_expert_index
from moejax.checkpoint.read_buffers import ReadBuffers, page_aligned
from moejax.errors import CheckpointError, ConfigError
from moejax.model_config import ModelConfig
from moejax.quant import formats
from moejax.run_spec import IO_MODES, check_io  # (`io.*`'s rule: the spec's)


def _pread_into(fd: int, view: memoryview, offset: int) -> int:
    """Reads `len(view)` bytes at `offset` into `view`; fewer only at the end of the file."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


class _PackedRead:
    """One packed expert's read in flight: the pieces still outstanding and their checksums;
    the thread finishing the last piece verifies and completes the future. `_load` and
    `_result` are the mode's (pread: `_PreadRead`, mmap: `_MappedRead`)."""

    def __init__(self, future: concurrent.futures.Future, path: str, layer: int, expert: int,
                 record: packed.Record, checksum: int, pieces: int, experts: int):
        self.future, self.path = future, path
        self.layer, self.expert, self.record, self.checksum = layer, expert, record, checksum
        self.experts = experts
        self.crcs: list[tuple[int, int] | None] = [None] * pieces
        self.error: BaseException | None = None
        self._left = pieces
        self._lock = threading.Lock()

    def _what(self) -> str:
        return f"layer {self.layer} expert {self.expert} ({self.record.precision})"

    def _short(self, got: int, start: int, stop: int, size: int) -> CheckpointError:
        offset = self.expert * self.record.stride + start
        want = self.experts * self.record.stride
        return CheckpointError(
            f"{self.path}: short read of {self._what()}: {got} of the {stop - start} bytes at "
            f"offset {offset}; the file is {size} bytes, the index implies {self.experts} "
            f"experts x stride {self.record.stride} = {want} (truncated?)")

    def _load(self, start: int, stop: int) -> np.ndarray:
        """Makes bytes `[start, stop)` of the record readable; returns the whole record."""
        raise NotImplementedError

    def _result(self) -> tuple:
        raise NotImplementedError

    def piece(self, i: int, start: int, stop: int) -> None:
        """Reads bytes `[start, stop)` of the record and checksums their meaningful part."""
        error = None
        try:
            record = self._load(start, stop)
            end = min(stop, self.record.used)
            meaningful = record[start:end] if start < end else b""
            self.crcs[i] = (packed.checksum(meaningful), len(meaningful))
        except OSError as e:
            error = CheckpointError(f"{self.path}: reading {self._what()} failed: {e}")
        except BaseException as e:  # CheckpointError, or anything else: never leave it pending
            error = e
        with self._lock:
            self.error = self.error or error
            self._left -= 1
            last = self._left == 0
        if last:
            self._finish()

    def _finish(self) -> None:
        if self.error is not None:
            self.future.set_exception(self.error)
            return
        crc, _ = self.crcs[0]
        for piece_crc, nbytes in self.crcs[1:]:
            crc = packed.crc32_combine(crc, piece_crc, nbytes)
        if crc != self.checksum:
            self.future.set_exception(CheckpointError(
                f"{self.path}: corrupt record of {self._what()}: crc32 {crc:#010x}, the index "
                f"says {self.checksum:#010x}"))
            return
        self.future.set_result(self._result())


class _PreadRead(_PackedRead):
    """`os.preadv` of each piece into one page-aligned buffer taken for the expert up front
    (`buffer`: from the reader's `ReadBuffers`, or fresh)."""

    def __init__(self, fd: int, buffer: np.ndarray, *args):
        super().__init__(*args)
        self.fd, self.buffer = fd, buffer

    def _load(self, start: int, stop: int) -> np.ndarray:
        offset = self.expert * self.record.stride + start
        got = _pread_into(self.fd, memoryview(self.buffer)[start:stop], offset)
        if got < stop - start:
            raise self._short(got, start, stop, os.fstat(self.fd).st_size)
        return self.buffer

    def _result(self) -> tuple:
        return self.record.weights(self.buffer)


class _MappedRead(_PackedRead):
    """The record viewed in its file's mapping (`mapped`: the whole file as read-only uint8);
    a piece checks it lies inside the mapping before its checksum touches the pages."""

    def __init__(self, mapped: np.ndarray, *args):
        super().__init__(*args)
        begin = self.expert * self.record.stride
        self.mapped = mapped
        self.view = mapped[begin:begin + self.record.stride]

    def _load(self, start: int, stop: int) -> np.ndarray:
        if len(self.view) < stop:  # the file ends inside (or before) this piece
            got = max(0, len(self.view) - start)
            raise self._short(got, start, stop, len(self.mapped))
        return self.view

    def _result(self) -> tuple:
        return self.record.weights(self.view)


class ExpertReader:
    """Reads single experts of the checkpoint at `path` (`cfg` its config, `precisions` what
    `checkpoint.read_precisions(path)` returns) on a persistent pool of `workers` threads; packed
    reads are cut into `split` page-aligned pieces. `mode` (`io.mode`): "pread" reads each
    expert into a buffer of its own; "mmap" (packed layout only) maps the layer files and
    returns read-only views of the mapping, checked alike (module docstring). Thread-safe: any
    thread may submit."""

    def __init__(self, path: str, cfg: ModelConfig, precisions: dict[str, dict], *,
                 split: int = 1, workers: int = 8, mode: str = "pread",
                 reuse_buffers: bool = True):
        self.split, self.workers = check_io(split, workers)
        if mode not in IO_MODES:
            raise ConfigError(f"io.mode={mode!r} is not one of {IO_MODES}")
        self.mode = mode
        self.path, self.cfg = path, cfg
        self.precisions = dict(precisions)
        self.layout: str = expert_layout(path)
        if mode in ("mmap", "direct") and self.layout != "packed":
            raise ConfigError(f"io.mode={mode!r} needs a packed checkpoint; {path} has the "
                              f"{self.layout} expert layout (use io.mode='pread', or convert "
                              "with --layout=packed)")
        self._index = read_expert_index(path) if self.layout == "packed" else None
        if mode == "direct":  # refused now, not at the first read, where the file system
            self._probe_direct(next(iter(self.precisions)))  # does not take it
        if self._index is not None:
            missing = [p for p in self.precisions if p not in self._index.records]
            if missing:
                raise CheckpointError(f"{os.path.join(path, 'config.json')}: the packed index "
                                      f"has no records for precisions {missing}")
            for p in self.precisions:  # the first read of each precision need not build them
                for _, nbytes in self._pieces(p):
                    packed.crc32_combine(0, 0, nbytes)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            self.workers, thread_name_prefix="expert-read")
        self._lock = threading.Lock()
        self._fds: dict[str, int] = {}
        self._maps: dict[str, mmap.mmap | None] = {}  # None: an empty file (nothing to map)
        self._mapped: dict[str, np.ndarray] = {}  # each mapping as uint8, the reads' base
        self._zarr_nbytes: dict[str, int] = {}
        # pread / direct: reads land in reusable page-aligned buffers, one pool per precision
        # (`reuse_buffers=False`: a fresh buffer per read, for benchmarks/reader_cpu.py).
        self.reuse_buffers = reuse_buffers
        self._buffers: dict[str, ReadBuffers] = {}
        self.buffer_limit: int | None = None  # buffers a pool keeps (the host tier's bound)
        self._closed = False

    # -- what a read moves -------------------------------------------------------------------

    def _pieces(self, precision: str) -> list[tuple[tuple[int, int], int]]:
        """Each piece's byte range in the record and its meaningful length."""
        record = self._index.records[precision]
        return [((a, b), max(0, min(b, record.used) - a))
                for a, b in record.ranges(self.split, self._index.page_bytes)]

    def expert_nbytes(self, precision: str) -> int:
        """Bytes one expert's read moves from storage at `precision`. Packed: the record's
        stride — the whole stride is read (its meaningful bytes rounded up to whole pages; the
        padding is under one page). zarr: the stored chunk bytes (payload and crc32c of each
        kind's chunk, or each kind and part's inner chunk; with compression, the mean over the
        first MoE layer's experts), not counting metadata or shard-index reads."""
        self._check_precision(precision)
        if self._index is not None:
            return self._index.records[precision].stride
        with self._lock:
            if precision not in self._zarr_nbytes:
                self._zarr_nbytes[precision] = self._stored_chunk_bytes(precision)
            return self._zarr_nbytes[precision]

    def _stored_chunk_bytes(self, precision: str) -> int:
        layer, experts = self.cfg.moe_layers[0], self.cfg.num_experts
        total = 0
        for kind in expert_store.KINDS:
            if precision == "native":
                total += sum(os.path.getsize(expert_store.chunk_path(self.path, layer, kind, e, 3))
                             for e in range(experts))
                continue
            for part in expert_store.PARTS:
                shard = expert_store.quant_shard_path(self.path, layer, kind, precision, part)
                total += sum(expert_store.shard_entry(shard, e, experts)[1]
                             for e in range(experts))
        return round(total / experts)

    # -- reads -------------------------------------------------------------------------------

    def _check_precision(self, precision: str) -> None:
        formats.check(precision)
        if precision not in self.precisions:
            present = [p for p in formats.PRECISIONS if p in self.precisions]
            raise CheckpointError(
                f"{os.path.join(self.path, 'config.json')}: the checkpoint has no {precision} "
                f"experts (precisions present: {present}); " +
                ADD_PRECISIONS_HINT.format(path=self.path, wanted=precision))

    def _check(self, layer: int, expert: int, precision: str) -> None:
        self._check_precision(precision)
        if not self.cfg.is_moe_layer(layer):
            raise ValueError(f"layer {layer} is not a MoE layer of {self.path} (MoE layers: "
                             f"{list(self.cfg.moe_layers)})")
        if not 0 <= expert < self.cfg.num_experts:
            raise ValueError(f"expert {expert} is out of range: {self.path} has "
                             f"{self.cfg.num_experts} experts per layer")

    def submit(self, layer: int, expert: int, precision: str) -> concurrent.futures.Future:
        """Starts reading one expert; the future's result is `(gate_up, down)`, its exception a
        `CheckpointError` naming the file, layer and expert at fault. A bad layer, expert or
        precision raises here. The future cannot be cancelled once submitted."""
        self._check(layer, expert, precision)
        with self._lock:  # against a concurrent close(): all of a read's pieces or none
            if self._closed:
                raise RuntimeError(f"ExpertReader of {self.path} is closed")
            if self._index is None:
                return self._pool.submit(self._read_zarr, layer, expert, precision)
            future = concurrent.futures.Future()
            future.set_running_or_notify_cancel()
            path = packed.file_path(self.path, layer, precision)
            try:
                source = (self._map(path, layer, expert, precision) if self.mode == "mmap"
                          else self._fd(path, layer, expert, precision))
            except CheckpointError as e:
                future.set_exception(e)
                return future
            pieces = self._pieces(precision)
            record = self._index.records[precision]
            args = (future, path, layer, expert, record,
                    self._index.checksums[precision][layer][expert], len(pieces),
                    self.cfg.num_experts)
            read = (_MappedRead(source, *args) if self.mode == "mmap"
                    else _PreadRead(source, self._buffer(precision, record.stride), *args))
            for i, ((start, stop), _) in enumerate(pieces):
                self._pool.submit(read.piece, i, start, stop)
        return future

    def read(self, layer: int, expert: int, precision: str) -> tuple:
        """`submit(...).result()`."""
        return self.submit(layer, expert, precision).result()

    def _buffer(self, precision: str, nbytes: int) -> np.ndarray:
        """A page-aligned buffer for one record (the caller holds `_lock`)."""
        if not self.reuse_buffers:
            return page_aligned(nbytes)
        if precision not in self._buffers:
            self._buffers[precision] = ReadBuffers(nbytes, self.buffer_limit)
        return self._buffers[precision].take()

    def buffer_stats(self) -> dict:
        """The read buffers over all precisions (pread / direct): `taken` (reads), `allocated`
        (buffers made; `taken - allocated` reads reused one), `peak_alive` (the most in use at
        once) and `peak_bytes` (their bytes)."""
        pools = list(self._buffers.values())
        return {"taken": sum(p.taken for p in pools),
                "allocated": sum(p.allocated for p in pools),
                "peak_alive": sum(p.peak_alive for p in pools),
                "peak_bytes": sum(p.peak_alive * p.nbytes for p in pools)}

    def _probe_direct(self, precision: str) -> None:
        """Opens one layer file with `O_DIRECT`: a ConfigError where the file system refuses
        it (tmpfs does); a missing file is left to the reads, which name it."""
        path = packed.file_path(self.path, self.cfg.moe_layers[0], precision)
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
        except OSError as e:
            if e.errno == errno.EINVAL:
                raise ConfigError(f"io.mode='direct': the file system of {path} does not "
                                  "support O_DIRECT (use io.mode='pread')") from None

    def _fd(self, path: str, layer: int, expert: int, precision: str) -> int:
        """The file's descriptor, opened on first use (the caller holds `_lock`)."""
        if path not in self._fds:
            flags = os.O_RDONLY | (os.O_DIRECT if self.mode == "direct" else 0)
            try:
                self._fds[path] = os.open(path, flags)
            except FileNotFoundError:
                raise CheckpointError(f"{path}: the packed experts of layer {layer} "
                                      f"({precision}) are missing (reading expert {expert})"
                                      ) from None
            except OSError as e:
                if self.mode == "direct" and e.errno == errno.EINVAL:
                    raise ConfigError(f"io.mode='direct': the file system of {path} does not "
                                      "support O_DIRECT (use io.mode='pread')") from None
                raise CheckpointError(f"{path}: cannot open the packed experts of layer "
                                      f"{layer} ({precision}) to read expert {expert}: {e}"
                                      ) from e
        return self._fds[path]

    def _map(self, path: str, layer: int, expert: int, precision: str) -> np.ndarray:
        """The file mapped read-only, as uint8, mapped on first use (the caller holds `_lock`).
        Our descriptor is closed at once (the mmap object keeps a duplicate of its own)."""
        if path not in self._mapped:
            fd = self._fd(path, layer, expert, precision)
            try:
                if os.fstat(fd).st_size == 0:  # mmap refuses empty files: every read is short
                    self._maps[path], self._mapped[path] = None, np.empty(0, np.uint8)
                else:
                    self._maps[path] = mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                    self._mapped[path] = np.frombuffer(mapping, np.uint8)
            except OSError as e:
                raise CheckpointError(f"{path}: cannot map the packed experts of layer {layer} "
                                      f"({precision}) to read expert {expert}: {e}") from e
            finally:
                os.close(self._fds.pop(path))
        return self._mapped[path]

    def _read_zarr(self, layer: int, expert: int, precision: str) -> tuple:
        if precision == "native":
            return tuple(expert_store.read_expert(self.path, layer, kind, expert)
                         for kind in expert_store.KINDS)
        return tuple(expert_store.read_quantized_expert(self.path, layer, kind, precision, expert)
                     for kind in expert_store.KINDS)

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Waits for the reads in flight, then stops the pool and closes the files. A mapping
        (mode "mmap") that arrays already returned still view is left to them: it is unmapped
        when the last of them is freed, so they stay valid."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.shutdown(wait=True)
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            self._mapped.clear()  # the reader's own view first: it holds the mapping's buffer
            for mapping in self._maps.values():
                if mapping is None:
                    continue
                try:
                    mapping.close()
                except BufferError:  # live arrays view it ("exported pointers exist")
                    pass
            self._maps.clear()

    def __enter__(self) -> "ExpertReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
