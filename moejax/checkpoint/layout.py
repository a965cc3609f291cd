"""The moejax checkpoint directory (DESIGN.md, "Checkpoint layout")::

    OUT/config.json                       ModelConfig (family, dimensions, dtypes)
    OUT/dense/                            Orbax checkpoint of the dense parameters
    OUT/experts/layer_LLL/{gate_up,down}  TensorStore zarr3, one expert per chunk, crc32c
    OUT/tokenizer/                        the source checkpoint's tokenizer files, if any
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Iterable

import jax
import numpy as np
from flax import nnx

from moejax.checkpoint import dense, expert_store
from moejax.checkpoint.errors import CheckpointError
from moejax.checkpoint.params import flat_params, load_flat_params
from moejax.config import ConfigError, ModelConfig
from moejax.models.decoder import MoEDecoder, abstract_decoder

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "generation_config.json")


def save(out: str, cfg: ModelConfig, dense_params: dict[str, np.ndarray],
         layer_experts: Iterable[tuple[int, np.ndarray, np.ndarray]],
         tokenizer_dir: str | None = None, compression: str | None = None) -> None:
    """Writes a checkpoint. `layer_experts` yields `(layer, gate_up, down)` one layer at a time
    so a large model never holds all its experts in memory."""
    os.makedirs(out, exist_ok=True)
    # An old config.json would make a half-overwritten directory look complete.
    marker = os.path.join(out, "config.json")
    if os.path.exists(marker):
        os.remove(marker)
    written = set()
    for layer, gate_up, down in layer_experts:
        expert_store.write_kind(out, layer, "gate_up", gate_up, compression)
        expert_store.write_kind(out, layer, "down", down, compression)
        written.add(layer)
    if written != set(cfg.moe_layers):
        raise CheckpointError(f"{out}: experts written for layers {sorted(written)}, "
                              f"config has MoE layers {list(cfg.moe_layers)}")
    dense.save(os.path.join(out, "dense"), dense_params)
    if tokenizer_dir:
        copied = [f for f in TOKENIZER_FILES if os.path.exists(os.path.join(tokenizer_dir, f))]
        if copied:
            os.makedirs(os.path.join(out, "tokenizer"), exist_ok=True)
            for f in copied:
                shutil.copy2(os.path.join(tokenizer_dir, f), os.path.join(out, "tokenizer", f))
    # config.json last, atomically: its presence marks a complete checkpoint.
    tmp = marker + ".tmp"
    with open(tmp, "w") as f:
        f.write(cfg.to_json())
    os.replace(tmp, marker)


def save_model(out: str, model: MoEDecoder, gate_up: dict[int, np.ndarray],
               down: dict[int, np.ndarray], compression: str | None = None) -> None:
    """Saves an in-memory model (tests, training) in the checkpoint layout."""
    params = {k: np.asarray(v) for k, v in flat_params(model).items()}
    save(out, model.cfg, params, ((l, np.asarray(gate_up[l]), np.asarray(down[l]))
                                  for l in model.cfg.moe_layers), compression=compression)


def read_config(path: str) -> ModelConfig:
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise CheckpointError(f"{cfg_path}: missing (not a moejax checkpoint, or incomplete)")
    try:
        with open(cfg_path) as f:
            return ModelConfig.from_dict(json.load(f))
    except (json.JSONDecodeError, ConfigError, TypeError) as e:
        raise CheckpointError(f"{cfg_path}: invalid moejax config: {e}") from e


@dataclasses.dataclass
class Checkpoint:
    """A loaded checkpoint: the dense model and each MoE layer's experts in host memory."""

    path: str
    cfg: ModelConfig
    model: MoEDecoder
    host_gate_up: dict[int, jax.Array]
    host_down: dict[int, jax.Array]
    tokenizer_dir: str | None


def host_memory_kind(device: jax.Device | None = None) -> str:
    """`pinned_host` where the platform has it (GPU and CPU backends do), else the next best."""
    device = device or jax.devices()[0]
    kinds = {m.kind for m in device.addressable_memories()}
    for kind in ("pinned_host", "unpinned_host"):
        if kind in kinds:
            return kind
    return device.default_memory().kind


def to_host(array: np.ndarray, device: jax.Device | None = None) -> jax.Array:
    device = device or jax.devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(device, memory_kind=host_memory_kind(device))
    return jax.device_put(array, sharding)


def load(path: str) -> Checkpoint:
    cfg = read_config(path)
    model = nnx.merge(*nnx.split(abstract_decoder(cfg)))
    abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in flat_params(model).items()}
    load_flat_params(model, dense.restore(os.path.join(path, "dense"), abstract))
    h, i, e = cfg.hidden_size, cfg.expert_intermediate_size, cfg.num_experts
    gate_up, down = {}, {}
    for layer in cfg.moe_layers:
        gate_up[layer] = to_host(expert_store.read_kind(path, layer, "gate_up", (e, h, 2 * i),
                                                        cfg.dtype))
        down[layer] = to_host(expert_store.read_kind(path, layer, "down", (e, i, h), cfg.dtype))
    tok = os.path.join(path, "tokenizer")
    return Checkpoint(path, cfg, model, gate_up, down, tok if os.path.isdir(tok) else None)
