"""The packed expert layout (Flash-MoE style): one file per MoE layer and precision,

    experts/layer_LLL/{precision}.packed          precision in native, int8, int4, int2

holding the layer's experts one after another, each one *record* at a fixed stride that is a
multiple of the 4096-byte page. A record is the expert's parts in a fixed order — native:
`gate_up [H, 2I]` then `down [I, H]`; quantized: `gate_up` values, scale, zero, then `down`
values, scale, zero (`moejax.quant.formats`) — as raw little-endian bytes, each part at a
64-byte-aligned offset, zero bytes between the parts and after the last one up to the stride.

Why: fetching an expert on a cache miss is then one page-aligned range read at `expert *
stride` with nothing to decode, which a pool of threads can cut into page-aligned pieces
(`moejax.checkpoint.expert_reader`); the zarr layout (`expert_store`) needs two reads per
native expert and six per quantized one, each with a codec pipeline behind it. There is no
compression: it would make records variable-length and reads non-aligned.

The index is in config.json under "expert_layout" (written by `moejax.checkpoint.meta`)::

    {"kind": "packed", "page_bytes": 4096, "precisions": {"int4": {
        "stride": 8192,
        "parts": [{"kind": "gate_up", "part": "values", "offset": 0, "nbytes": 2048,
                   "shape": [32, 64], "dtype": "uint8"}, ...],
        "checksums": {"0": [crc of expert 0, ...], "1": [...], ...}}, ...}}

Native parts are named `"weights"`. A checksum is `zlib.crc32` of the record's meaningful
bytes — from its start to the end of its last part (the zero bytes between parts included, the
padding to the stride not) — so a flipped byte fails that one expert, named by file, layer,
expert and precision. (crc32c, the zarr layout's codec, has no implementation in Python's
standard library or our dependencies; zlib.crc32 runs at 3-4 GB/s a core, releases the GIL, and
`crc32_combine` lets the pieces of a split read be checksummed in parallel.)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import zlib

import ml_dtypes
import numpy as np

from moejax.checkpoint import expert_store
from moejax.errors import CheckpointError
from moejax.model_config import ModelConfig
from moejax.quant import BITS, SCALE_DTYPE, QuantizedWeights

KIND = "packed"
PAGE_BYTES = 4096
# Parts start on cache-line boundaries, so every array viewed out of a record is aligned.
PART_ALIGN = 64
NATIVE_PART = "weights"


def file_path(root: str, layer: int, precision: str) -> str:
    return os.path.join(root, "experts", f"layer_{layer:03d}", f"{precision}.packed")


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype named `name` ("bfloat16" comes from ml_dtypes, as TensorStore's do)."""
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


@dataclasses.dataclass(frozen=True)
class Part:
    """One array of an expert inside its record."""

    kind: str  # "gate_up" | "down"
    part: str  # "weights" (native) | "values" | "scale" | "zero"
    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: str

    def view(self, record: np.ndarray) -> np.ndarray:
        """This part of one record (uint8 `[stride]`) or of many (`[E, stride]`: `[E, *shape]`),
        as a view of the record bytes."""
        raw = record[..., self.offset:self.offset + self.nbytes]
        return raw.view(numpy_dtype(self.dtype)).reshape(*record.shape[:-1], *self.shape)

    def to_json(self) -> dict:
        return {"kind": self.kind, "part": self.part, "offset": self.offset,
                "nbytes": self.nbytes, "shape": list(self.shape), "dtype": self.dtype}


@dataclasses.dataclass(frozen=True)
class Record:
    """Where one precision's parts lie in every expert's record, and the record stride."""

    precision: str
    parts: tuple[Part, ...]
    stride: int

    @property
    def used(self) -> int:
        """The meaningful bytes: up to the end of the last part (what the checksum covers)."""
        return max(p.offset + p.nbytes for p in self.parts)

    def weights(self, records: np.ndarray):
        """`(gate_up, down)` viewed out of one record `[stride]` or many `[E, stride]`: native
        arrays, or `QuantizedWeights` of numpy arrays (`bits` from the precision)."""
        by_kind = {}
        for p in self.parts:
            by_kind.setdefault(p.kind, {})[p.part] = p.view(records)
        if self.precision == "native":
            return tuple(by_kind[k][NATIVE_PART] for k in expert_store.KINDS)
        return tuple(QuantizedWeights(*(by_kind[k][part] for part in expert_store.PARTS),
                                      BITS[self.precision]) for k in expert_store.KINDS)

    def ranges(self, split: int, page_bytes: int = PAGE_BYTES) -> list[tuple[int, int]]:
        """`[start, stop)` byte ranges of the record, page-aligned, covering the whole stride in
        at most `split` pieces of whole pages (fewer when the record has fewer pages)."""
        pages = self.stride // page_bytes
        per = math.ceil(pages / split) * page_bytes
        return [(a, min(a + per, self.stride)) for a in range(0, self.stride, per)]


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def record_for(cfg: ModelConfig, precision: str, groups: dict[str, int] | None = None,
               page_bytes: int = PAGE_BYTES) -> Record:
    """The record `cfg`'s experts have at `precision`; `groups` (group length per kind, as in
    config.json's "precisions") for a quantized one."""
    h, i = cfg.hidden_size, cfg.expert_intermediate_size
    shapes = {"gate_up": (h, 2 * i), "down": (i, h)}
    parts, offset = [], 0
    for kind in expert_store.KINDS:
        if precision == "native":
            arrays = [(NATIVE_PART, shapes[kind], cfg.dtype)]
        else:
            q = expert_store.quantized_shapes((1, *shapes[kind]), BITS[precision], groups[kind])
            arrays = [(part, q[part][1:], "uint8" if part == "values" else
                       np.dtype(SCALE_DTYPE).name) for part in expert_store.PARTS]
        for part, shape, dtype in arrays:
            nbytes = math.prod(shape) * numpy_dtype(dtype).itemsize
            parts.append(Part(kind, part, offset, nbytes, tuple(shape), dtype))
            offset = _round_up(offset + nbytes, PART_ALIGN)
    used = max(p.offset + p.nbytes for p in parts)
    return Record(precision, tuple(parts), _round_up(used, page_bytes))


# -- checksums ------------------------------------------------------------------------------


def checksum(data) -> int:
    """A record's checksum (of its meaningful bytes, `data[:Record.used]`)."""
    return zlib.crc32(data)


def _apply(matrix: tuple[int, ...], vector: int) -> int:
    out, i = 0, 0
    while vector:
        if vector & 1:
            out ^= matrix[i]
        vector >>= 1
        i += 1
    return out


@functools.lru_cache(maxsize=256)
def _shift(nbytes: int) -> tuple[int, ...]:
    """The GF(2)-linear map taking crc32(A) to its contribution to crc32(A + B) when `len(B)
    == nbytes`, as 32 columns (crc32(A + B) = shift(crc32(A)) ^ crc32(B)); built by squaring
    the one-byte map, so it costs a few thousand XORs whatever `nbytes` is."""
    one = tuple(zlib.crc32(b"\0", 1 << b) ^ zlib.crc32(b"\0", 0) for b in range(32))
    result = tuple(1 << b for b in range(32))  # identity
    power = one
    while nbytes:
        if nbytes & 1:
            result = tuple(_apply(power, c) for c in result)
        nbytes >>= 1
        if nbytes:
            power = tuple(_apply(power, c) for c in power)
    return result


def crc32_combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """crc32 of `A + B` from crc32(A), crc32(B) and len(B) (zlib's crc32_combine, which
    Python's zlib does not expose)."""
    return _apply(_shift(len_b), crc_a) ^ crc_b


# -- writing and reading whole layers -------------------------------------------------------


def _arrays(record: Record, weights) -> list[np.ndarray]:
    """The arrays `[E, ...]` of `weights` (`(gate_up, down)`, native arrays or
    QuantizedWeights) in the record's part order."""
    by_kind = dict(zip(expert_store.KINDS, weights))
    out = []
    for p in record.parts:
        w = by_kind[p.kind]
        out.append(np.asarray(w if p.part == NATIVE_PART else getattr(w, p.part)))
    return out


def write_layer(root: str, layer: int, record: Record, weights) -> list[int]:
    """Writes one layer's experts at `record.precision` (`weights`: `(gate_up, down)`, native
    numpy arrays `[E, K, N]` or `QuantizedWeights` of numpy arrays); returns each expert's
    checksum, for the index."""
    if sys.byteorder != "little":
        raise NotImplementedError("the packed layout is little-endian; this host is not")
    arrays = _arrays(record, weights)
    experts = arrays[0].shape[0]
    for p, a in zip(record.parts, arrays):
        if a.shape != (experts, *p.shape) or a.dtype != numpy_dtype(p.dtype):
            raise ValueError(f"layer {layer} {p.kind} {p.part} ({record.precision}) is "
                             f"{a.shape} {a.dtype}, the record expects "
                             f"{(experts, *p.shape)} {p.dtype}")
    path = file_path(root, layer, record.precision)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    buf = np.zeros(record.stride, np.uint8)
    sums = []
    with open(path, "wb") as f:
        for e in range(experts):
            for p, a in zip(record.parts, arrays):
                buf[p.offset:p.offset + p.nbytes] = np.ascontiguousarray(a[e]).view(
                    np.uint8).reshape(-1)
            sums.append(checksum(buf[:record.used]))
            f.write(buf)
    return sums


def read_layer(root: str, layer: int, record: Record, checksums: list[int]):
    """All experts of one layer at `record.precision`, checksums verified: `(gate_up, down)`
    with a leading expert axis, as `Record.weights` gives them (contiguous copies)."""
    path = file_path(root, layer, record.precision)
    experts = len(checksums)
    what = f"layer {layer} ({record.precision})"
    try:
        size = os.path.getsize(path)
    except OSError:
        raise CheckpointError(f"{path}: the packed experts of {what} are missing") from None
    want = experts * record.stride
    if size != want:
        first = size // record.stride
        tail = (f"truncated: layer {layer} expert {first} ({record.precision}) onward is "
                "missing" if size < want else "longer than the index says")
        raise CheckpointError(f"{path}: {size} bytes, the index implies {experts} experts x "
                              f"stride {record.stride} = {want}; {tail}")
    records = np.empty((experts, record.stride), np.uint8)
    with open(path, "rb") as f:
        got = f.readinto(memoryview(records).cast("B"))
    if got != want:
        raise CheckpointError(f"{path}: short read of {what}: {got} of {want} bytes")
    for e in range(experts):
        found = checksum(records[e, :record.used])
        if found != checksums[e]:
            raise CheckpointError(f"{path}: corrupt record of layer {layer} expert {e} "
                                  f"({record.precision}): crc32 {found:#010x}, the index says "
                                  f"{checksums[e]:#010x}")
    gate_up, down = record.weights(records)
    if record.precision == "native":
        return np.ascontiguousarray(gate_up), np.ascontiguousarray(down)
    return gate_up.map(np.ascontiguousarray), down.map(np.ascontiguousarray)


# -- the index in config.json ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Index:
    """The packed layout's index: per precision its record and each layer's checksums."""

    records: dict[str, Record]
    checksums: dict[str, dict[int, tuple[int, ...]]]  # precision -> layer -> per expert
    page_bytes: int = PAGE_BYTES

    def to_json(self) -> dict:
        return {"kind": KIND, "page_bytes": self.page_bytes, "precisions": {
            p: {"stride": r.stride, "parts": [part.to_json() for part in r.parts],
                "checksums": {str(layer): list(s) for layer, s in self.checksums[p].items()}}
            for p, r in self.records.items()}}

    def without(self, precisions) -> "Index":
        keep = [p for p in self.records if p not in precisions]
        return Index({p: self.records[p] for p in keep}, {p: self.checksums[p] for p in keep},
                     self.page_bytes)

    def merged(self, other: "Index") -> "Index":
        """This index with `other`'s precisions added (replacing any of the same name)."""
        if other.page_bytes != self.page_bytes:
            raise ValueError(f"page_bytes {other.page_bytes} != {self.page_bytes}")
        return Index({**self.records, **other.records}, {**self.checksums, **other.checksums},
                     self.page_bytes)


def parse_index(d, cfg: ModelConfig, groups: dict[str, dict[str, int] | None],
                where: str) -> Index:
    """The index `d` (config.json's "expert_layout" of kind "packed"), checked against what
    `cfg` and the precisions' `groups` imply (None for native); `where` prefixes messages."""
    bad = f"{where}: invalid packed expert index"
    if not isinstance(d, dict) or not isinstance(d.get("precisions"), dict):
        raise CheckpointError(f"{bad}: expected {{'kind': 'packed', 'page_bytes': N, "
                              f"'precisions': {{...}}}}")
    page = d.get("page_bytes")
    if not isinstance(page, int) or page < 1:
        raise CheckpointError(f"{bad}: page_bytes={page!r} must be a positive integer")
    entries = d["precisions"]
    if set(entries) != set(groups):
        raise CheckpointError(f"{bad}: it lists precisions {sorted(entries)}, the checkpoint "
                              f"has {sorted(groups)}")
    layers = {str(layer) for layer in cfg.moe_layers}
    records, sums = {}, {}
    for p, g in groups.items():
        e = entries[p]
        want = record_for(cfg, p, g, page)
        try:
            parts = tuple(Part(x["kind"], x["part"], x["offset"], x["nbytes"],
                               tuple(x["shape"]), x["dtype"]) for x in e["parts"])
            stride = e["stride"]
            checks = e["checksums"]
        except (TypeError, KeyError) as err:
            raise CheckpointError(f"{bad} for {p}: {err!r} in {e!r:.200}") from None
        layout_of = [(x.kind, x.part, x.shape, x.dtype, x.nbytes) for x in parts]
        if layout_of != [(x.kind, x.part, x.shape, x.dtype, x.nbytes) for x in want.parts]:
            raise CheckpointError(f"{bad} for {p}: parts {[x.to_json() for x in parts]}, the "
                                  f"config implies {[x.to_json() for x in want.parts]}")
        # Where each part lies is the format's too (`record_for`): an index that moves a part
        # (e.g. swaps two of one size, a scale and a zero point) would compute with the wrong
        # bytes, which the checksums (of the bytes, not of where they are) cannot see.
        for x, w in zip(parts, want.parts):
            if x.offset != w.offset:
                raise CheckpointError(
                    f"{bad} for {p}: part {x.kind}.{x.part} at offset {x.offset!r}, the format "
                    f"puts it at {w.offset} (the record layout `record_for` gives)")
        if stride != want.stride:
            raise CheckpointError(f"{bad} for {p}: stride {stride!r}, the format's record for "
                                  f"this precision is {want.stride} bytes")
        record = Record(p, parts, stride)
        offsets = [x.offset for x in parts]
        ends = sorted((x.offset, x.offset + x.nbytes) for x in parts
                      if isinstance(x.offset, int))
        if not (all(isinstance(o, int) and o >= 0 for o in offsets) and
                isinstance(stride, int) and stride % page == 0 and record.used <= stride and
                all(end <= start for (_, end), (start, _) in zip(ends, ends[1:]))):
            raise CheckpointError(f"{bad} for {p}: stride {stride!r} is not a multiple of "
                                  f"{page} holding parts at non-overlapping offsets {offsets}")
        if not isinstance(checks, dict) or set(checks) != layers or not all(
                isinstance(s, list) and len(s) == cfg.num_experts and
                all(isinstance(c, int) for c in s) for s in checks.values()):
            raise CheckpointError(f"{bad} for {p}: checksums must list {cfg.num_experts} "
                                  f"integers for each MoE layer {sorted(layers, key=int)}")
        records[p] = record
        sums[p] = {int(layer): tuple(s) for layer, s in checks.items()}
    return Index(records, sums, page)
