"""Routed experts on disk: per layer and weight kind, a TensorStore zarr3 array `[E, ...]`
chunked one expert per chunk with a crc32c checksum codec.

One expert is one contiguous read, and a flipped byte fails that read with a digest mismatch
that we turn into an error naming the layer, expert and chunk file. A missing chunk file would
read back as zeros (zarr's fill value), so presence is checked explicitly.

Quantized copies (`moejax.quant.weights.QuantizedWeights`) sit beside the native arrays, three
arrays per layer, kind and precision::

    experts/layer_LLL/{kind}.{precision}/values   uint8   [E, K * bits / 8, N]
    experts/layer_LLL/{kind}.{precision}/scale    float16 [E, K / g, N]
    experts/layer_LLL/{kind}.{precision}/zero     float16 [E, K / g, N]

Their chunks are small (an int2 `scale` of the embedded model is 384 bytes an expert), so each
array is one file: zarr3's sharding codec (`sharding_indexed`) packs all its experts into one
shard, `.../{part}/c/0/0/0`, whose inner chunks are still one expert each with their own crc32c,
followed by an index (offset and length per expert) with a crc32c of its own. One expert is
still one inner-chunk read (plus the small index); a flipped byte in an inner chunk fails that
expert's read, one in the index fails every read of the shard, and either becomes an error
naming the shard file, layer, expert (for an inner chunk), kind, precision and part. A missing
shard file is checked for explicitly; a missing inner chunk is an error too
(`fill_missing_data_reads: false`), never zeros, and every inner chunk is written even when it
equals the fill value. (`values`, `scale` and `zero` stay three arrays: zarr stores each array
in its own files, and three files per copy are already few.)
"""

from __future__ import annotations

import json
import os

import numpy as np
import tensorstore as ts

from moejax.errors import CheckpointError
from moejax.quant import BITS, SCALE_DTYPE, QuantizedWeights

KINDS = ("gate_up", "down")
PARTS = ("values", "scale", "zero")


def kind_path(root: str, layer: int, kind: str) -> str:
    return os.path.join(root, "experts", f"layer_{layer:03d}", kind)


def chunk_path(root: str, layer: int, kind: str, expert: int, ndim: int) -> str:
    return _chunk(kind_path(root, layer, kind), expert, ndim)


def quant_path(root: str, layer: int, kind: str, precision: str, part: str) -> str:
    """The array of one part (`values`, `scale`, `zero`) of a quantized copy."""
    return os.path.join(root, "experts", f"layer_{layer:03d}", f"{kind}.{precision}", part)


def quant_shard_path(root: str, layer: int, kind: str, precision: str, part: str) -> str:
    """The one shard file holding every expert of one part of a quantized copy."""
    return _shard(quant_path(root, layer, kind, precision, part))


def _shard(array_path: str) -> str:
    # One shard covers the whole [E, R, N] array: its key is c/0/0/0.
    return os.path.join(array_path, "c", "0", "0", "0")


# An index entry: little-endian uint64 offset and length; absent chunks are all ones.
_INDEX_ENTRY = np.dtype([("offset", "<u8"), ("nbytes", "<u8")])
_INDEX_CHECKSUM_BYTES = 4


def shard_entry(shard: str, expert: int, experts: int) -> tuple[int, int]:
    """`(offset, nbytes)` of `expert`'s inner chunk in a shard of `experts` (read from the
    shard's index, without checking its crc32c: diagnostics and tests)."""
    size = experts * _INDEX_ENTRY.itemsize + _INDEX_CHECKSUM_BYTES
    with open(shard, "rb") as f:
        f.seek(-size, os.SEEK_END)
        index = np.frombuffer(f.read(size)[:-_INDEX_CHECKSUM_BYTES], _INDEX_ENTRY)
    return int(index[expert]["offset"]), int(index[expert]["nbytes"])


def _chunk(array_path: str, expert: int, ndim: int) -> str:
    # zarr3 default chunk key encoding: c/<i>/<j>/<k> under the array directory.
    return os.path.join(array_path, "c", str(expert), *(["0"] * (ndim - 1)))


def compression_of(root: str, layer: int, kind: str) -> str | None:
    """The compression the native `kind` array of `layer` was written with (None or "blosc")."""
    path = os.path.join(kind_path(root, layer, kind), "zarr.json")
    try:
        with open(path) as f:
            codecs = json.load(f)["codecs"]
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{path}: cannot read the expert array metadata: {e}") from e
    names = {c.get("name") for c in codecs}
    return "blosc" if "blosc" in names else None


# Optional chunk compression (the checksum covers the stored bytes either way). Off by default:
# an uncompressed chunk is a plain read; "blosc" (zstd, bit-shuffled) saves ~28% on bf16
# weights, which keeps the shipped embedded model small.
COMPRESSIONS = {
    None: [],
    "blosc": [{"name": "blosc", "configuration": {"cname": "zstd", "clevel": 9,
                                                   "shuffle": "bitshuffle"}}],
}


_BYTES = {"name": "bytes", "configuration": {"endian": "little"}}
_CRC32C = {"name": "crc32c"}


def _chunk_codecs(dtype: str, compression: str | None) -> list[dict]:
    """One expert's chunk: raw little-endian bytes, optionally compressed, then a crc32c."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression={compression!r} is not one of {list(COMPRESSIONS)}")
    codecs = [_BYTES]
    for codec in COMPRESSIONS[compression]:
        codecs.append({**codec, "configuration": {**codec["configuration"],
                                                  "typesize": np.dtype(dtype).itemsize}})
    return codecs + [_CRC32C]


def _spec(path: str, shape=None, dtype: str | None = None, compression: str | None = None) -> dict:
    """A native expert array: one chunk file per expert."""
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": path}}
    if shape is not None:
        spec["metadata"] = {
            "shape": list(shape),
            "data_type": dtype,
            "chunk_grid": {"name": "regular",
                           "configuration": {"chunk_shape": [1, *shape[1:]]}},
            "codecs": _chunk_codecs(dtype, compression),
        }
    return spec


def _sharded_spec(path: str, shape=None, dtype: str | None = None,
                  compression: str | None = None) -> dict:
    """A quantized part: one shard file holding every expert, one inner chunk each. Reads of
    a missing inner chunk fail instead of returning the fill value."""
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": path},
            "fill_missing_data_reads": False}
    if shape is not None:
        spec["store_data_equal_to_fill_value"] = True  # every expert gets its inner chunk
        spec["metadata"] = {
            "shape": list(shape),
            "data_type": dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(shape)}},
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": [1, *shape[1:]],
                "codecs": _chunk_codecs(dtype, compression),
                "index_codecs": [_BYTES, _CRC32C],
                "index_location": "end",
            }}],
        }
    return spec


def _write(path: str, array: np.ndarray, compression: str | None, spec=_spec) -> None:
    dtype = np.dtype(array.dtype).name  # "float32", "bfloat16", "float16", "uint8"
    store = ts.open(spec(path, array.shape, dtype, compression),
                    create=True, delete_existing=True).result()
    store.write(array).result()


def write_kind(root: str, layer: int, kind: str, array: np.ndarray,
               compression: str | None = None) -> None:
    _write(kind_path(root, layer, kind), array, compression)


def _read(path: str, layer: int, label: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """All experts of one array, checked against the expected shape and dtype; `label` names
    the array in messages (the kind, and for a quantized copy its precision and part)."""
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: expert array for layer {layer} ({label}) is missing")
    try:
        store = ts.open(_spec(path), open=True).result()
    except Exception as e:  # tensorstore raises ValueError subclasses with status text
        raise CheckpointError(f"{path}: cannot open expert array for layer {layer} ({label}): {e}")
    if tuple(store.shape) != tuple(shape) or store.dtype.name != dtype:
        raise CheckpointError(
            f"{path}: layer {layer} {label} experts are {tuple(store.shape)} "
            f"{store.dtype.name}, the config implies {tuple(shape)} {dtype}")
    for e in range(shape[0]):
        chunk = _chunk(path, e, len(shape))
        if not os.path.exists(chunk):
            raise CheckpointError(f"{chunk}: chunk of layer {layer} expert {e} ({label}) is missing")
    return _read_naming_the_expert(
        store, shape[0], f"{path}: reading layer {layer} ({label}) failed",
        lambda e, err: CheckpointError(f"{_chunk(path, e, len(shape))}: corrupt chunk of layer "
                                       f"{layer} expert {e} ({label}): {err}"))


def _read_naming_the_expert(store, experts: int, failed: str, expert_error) -> np.ndarray:
    """The whole array; when that read fails, the expert at fault is found by re-reading
    expert by expert and named (`expert_error(e, error)` -> the CheckpointError to raise)."""
    try:
        return store.read().result()
    except Exception as first_error:
        for e in range(experts):
            try:
                store[e].read().result()
            except Exception as e_err:
                raise expert_error(e, e_err) from e_err
        raise CheckpointError(f"{failed}: {first_error}")


def _read_one(path: str, layer: int, label: str, expert: int) -> np.ndarray:
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: expert array for layer {layer} ({label}) is missing")
    try:
        store = ts.open(_spec(path), open=True).result()
    except Exception as e:
        raise CheckpointError(f"{path}: cannot open expert array for layer {layer} ({label}): {e}")
    if not 0 <= expert < store.shape[0]:
        raise CheckpointError(f"{path}: layer {layer} ({label}) has {store.shape[0]} experts, "
                              f"no expert {expert}")
    chunk = _chunk(path, expert, store.rank)
    if not os.path.exists(chunk):
        raise CheckpointError(f"{chunk}: chunk of layer {layer} expert {expert} ({label}) is "
                              "missing")
    try:
        return store[expert].read().result()
    except Exception as e:
        raise CheckpointError(f"{chunk}: corrupt chunk of layer {layer} expert {expert} "
                              f"({label}): {e}") from e


def read_kind(root: str, layer: int, kind: str, shape: tuple[int, ...],
              dtype: str) -> np.ndarray:
    """All experts of one layer and kind, checked against the expected shape and dtype."""
    return _read(kind_path(root, layer, kind), layer, kind, shape, dtype)


def read_expert(root: str, layer: int, kind: str, expert: int) -> np.ndarray:
    """One expert's weights of one kind (a single chunk read)."""
    return _read_one(kind_path(root, layer, kind), layer, kind, expert)


# -- quantized copies (sharded) -------------------------------------------------------------


def _open_sharded(path: str, layer: int, label: str):
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: expert array for layer {layer} ({label}) is missing")
    try:
        return ts.open(_sharded_spec(path), open=True).result()
    except Exception as e:
        raise CheckpointError(f"{path}: cannot open expert array for layer {layer} ({label}): {e}")


def _check_shard(path: str, layer: int, label: str, experts: int) -> str:
    shard = _shard(path)
    if not os.path.exists(shard):
        raise CheckpointError(f"{shard}: shard of layer {layer} ({label}) holding its "
                              f"{experts} experts is missing")
    return shard


def _expert_error(shard: str, layer: int, label: str, expert: int,
                  err: Exception) -> CheckpointError:
    """What went wrong reading `expert` from `shard`, from TensorStore's status text."""
    text = str(err)
    if "shard index" in text:
        return CheckpointError(f"{shard}: corrupt shard index of layer {layer} ({label}); no "
                               f"expert can be read (expert {expert} failed first): {err}")
    if text.startswith("NOT_FOUND"):
        return CheckpointError(f"{shard}: the chunk of layer {layer} expert {expert} ({label}) "
                               f"is missing from the shard: {err}")
    return CheckpointError(f"{shard}: corrupt chunk of layer {layer} expert {expert} ({label}) "
                           f"in the shard: {err}")


def _read_sharded(path: str, layer: int, label: str, shape: tuple[int, ...],
                  dtype: str) -> np.ndarray:
    """All experts of one quantized part, checked against the expected shape and dtype."""
    store = _open_sharded(path, layer, label)
    if tuple(store.shape) != tuple(shape) or store.dtype.name != dtype:
        raise CheckpointError(
            f"{path}: layer {layer} {label} experts are {tuple(store.shape)} "
            f"{store.dtype.name}, the config implies {tuple(shape)} {dtype}")
    shard = _check_shard(path, layer, label, shape[0])
    return _read_naming_the_expert(
        store, shape[0], f"{shard}: reading layer {layer} ({label}) failed",
        lambda e, err: _expert_error(shard, layer, label, e, err))


def _read_one_sharded(path: str, layer: int, label: str, expert: int) -> np.ndarray:
    store = _open_sharded(path, layer, label)
    if not 0 <= expert < store.shape[0]:
        raise CheckpointError(f"{path}: layer {layer} ({label}) has {store.shape[0]} experts, "
                              f"no expert {expert}")
    shard = _check_shard(path, layer, label, store.shape[0])
    try:
        return store[expert].read().result()
    except Exception as e:
        raise _expert_error(shard, layer, label, expert, e) from e


def write_quantized(root: str, layer: int, kind: str, precision: str, q: QuantizedWeights,
                    compression: str | None = None) -> None:
    """Writes one layer's quantized `kind` experts (`q` of numpy arrays `[E, ...]`)."""
    if q.bits != BITS[precision]:
        raise ValueError(f"{precision} weights must have {BITS[precision]} bits, got {q.bits}")
    for part in PARTS:
        array = np.asarray(getattr(q, part))
        want = np.uint8 if part == "values" else SCALE_DTYPE
        if array.dtype != want:
            raise TypeError(f"{kind}.{precision} {part} must be {np.dtype(want).name}, "
                            f"got {array.dtype}")
        _write(quant_path(root, layer, kind, precision, part), array, compression,
               _sharded_spec)


def quantized_shapes(shape: tuple[int, int, int], bits: int,
                     group: int) -> dict[str, tuple[int, int, int]]:
    """Shapes of the three parts of native experts `shape = (E, K, N)` at `bits`, group `group`."""
    e, k, n = shape
    if (k * bits) % 8 or k % group:
        raise CheckpointError(f"experts {shape} cannot be stored at {bits} bits in groups of "
                              f"{group}")
    return {"values": (e, k * bits // 8, n), "scale": (e, k // group, n),
            "zero": (e, k // group, n)}


def read_quantized(root: str, layer: int, kind: str, precision: str,
                   shape: tuple[int, int, int], group: int) -> QuantizedWeights:
    """All experts of one layer's quantized `kind` copy, as numpy `QuantizedWeights`; `shape` is
    the native `(E, K, N)`, `group` the group length recorded in config.json."""
    bits = BITS[precision]
    shapes = quantized_shapes(shape, bits, group)
    parts = {}
    for part in PARTS:
        dtype = "uint8" if part == "values" else np.dtype(SCALE_DTYPE).name
        parts[part] = _read_sharded(quant_path(root, layer, kind, precision, part), layer,
                                    f"{kind}, {precision} {part}", shapes[part], dtype)
    return QuantizedWeights(parts["values"], parts["scale"], parts["zero"], bits)


def read_quantized_expert(root: str, layer: int, kind: str, precision: str,
                          expert: int) -> QuantizedWeights:
    """One expert's quantized `kind` weights (three inner-chunk reads, one per part)."""
    parts = [_read_one_sharded(quant_path(root, layer, kind, precision, part), layer,
                               f"{kind}, {precision} {part}", expert) for part in PARTS]
    return QuantizedWeights(*parts, BITS[precision])
