"""Reads a Hugging Face safetensors directory (single file or sharded with an index) lazily.

A small reader of our own rather than the `safetensors` package: it memory-maps the files so a
90 GB checkpoint converts layer by layer, reads bfloat16 into numpy via ml_dtypes without torch,
and names the file and tensor in every error.
"""

from __future__ import annotations

import json
import os
import struct

import ml_dtypes
import numpy as np

from moejax.errors import CheckpointError

_DTYPES = {
    "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


class SafetensorsDir:
    def __init__(self, directory: str):
        self.directory = directory
        index = os.path.join(directory, INDEX_NAME)
        single = os.path.join(directory, SINGLE_NAME)
        if os.path.exists(index):
            try:
                with open(index) as f:
                    weight_map = json.load(f)["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise CheckpointError(f"{index}: not a safetensors index ({e})") from e
            self._file_of = {name: os.path.join(directory, fn) for name, fn in weight_map.items()}
        elif os.path.exists(single):
            self._file_of = {name: single for name in self._header(single)[0]}
        else:
            raise CheckpointError(
                f"{directory}: no {SINGLE_NAME} or {INDEX_NAME} (a Hugging Face safetensors "
                "checkpoint directory is expected)")
        self._headers: dict[str, tuple[dict, int]] = {}

    @staticmethod
    def _header(path: str) -> tuple[dict, int]:
        if not os.path.exists(path):
            raise CheckpointError(f"{path}: safetensors file named by the index is missing")
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file (no header)")
            (n,) = struct.unpack("<Q", raw)
            if n > size - 8:
                raise CheckpointError(f"{path}: truncated safetensors header ({n} bytes claimed)")
            try:
                header = json.loads(f.read(n))
            except json.JSONDecodeError as e:
                raise CheckpointError(f"{path}: corrupt safetensors header ({e})") from e
        header.pop("__metadata__", None)
        return header, 8 + n

    def names(self) -> set[str]:
        return set(self._file_of)

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def get(self, name: str) -> np.ndarray:
        """The tensor as a read-only memory-mapped numpy array."""
        if name not in self._file_of:
            raise CheckpointError(f"{self.directory}: tensor {name!r} is missing from the checkpoint")
        path = self._file_of[name]
        if path not in self._headers:
            self._headers[path] = self._header(path)
        header, offset = self._headers[path]
        if name not in header:
            raise CheckpointError(f"{path}: tensor {name!r} listed in the index but not in the file")
        info = header[name]
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if offset + end > os.path.getsize(path):
            raise CheckpointError(f"{path}: truncated; tensor {name!r} ends past the file")
        count = int(np.prod(shape)) if shape else 1
        if (end - begin) != count * np.dtype(dtype).itemsize:
            raise CheckpointError(f"{path}: tensor {name!r} byte size does not match shape {shape}")
        return np.memmap(path, dtype=dtype, mode="r", offset=offset + begin, shape=shape)
