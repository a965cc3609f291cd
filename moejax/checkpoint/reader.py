"""Reads a checkpoint into host memory (`load`): the dense model, and each MoE layer's experts
at native precision or, on demand, at a quantized one (`Checkpoint.experts_at`), in the
platform's host memory kind (`pinned_host` where it exists)."""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
from flax import nnx

from moejax.checkpoint import dense, expert_store, packed
from moejax.checkpoint.meta import ADD_PRECISIONS_HINT, read_expert_index, read_meta
from moejax.checkpoint.params import flat_params, load_flat_params
from moejax.errors import CheckpointError
from moejax.model_config import ModelConfig
from moejax.models import MoEDecoder, abstract_decoder
from moejax.quant import QuantizedWeights, formats


@dataclasses.dataclass
class Checkpoint:
    """A loaded checkpoint: the dense model and each MoE layer's experts in host memory
    (native; quantized copies are read on demand by `experts_at`)."""

    path: str
    cfg: ModelConfig
    model: MoEDecoder
    # None when loaded with `read_experts=False` (until `experts_at("native")` reads them).
    host_gate_up: dict[int, jax.Array] | None
    host_down: dict[int, jax.Array] | None
    tokenizer_dir: str | None
    # Precision -> its config.json entry; always has "native".
    precisions: dict[str, dict] = dataclasses.field(default_factory=dict)
    # The packed layout's index; None in the zarr layout.
    expert_index: packed.Index | None = dataclasses.field(default=None, repr=False)
    _quantized: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def experts_at(self, precision: str) -> tuple[dict[int, jax.Array | QuantizedWeights],
                                                  dict[int, jax.Array | QuantizedWeights]]:
        """`(gate_up, down)` per MoE layer at `precision`, in host memory: the native arrays
        for "native"; for a quantized precision, `QuantizedWeights` of host jax arrays, read
        from disk on first use and kept."""
        formats.check(precision)
        if precision == "native":
            if self.host_gate_up is None:
                self.host_gate_up, self.host_down = read_native_experts(
                    self.path, self.cfg, self.expert_index)
            return self.host_gate_up, self.host_down
        if precision not in self.precisions:
            present = [p for p in formats.PRECISIONS if p in self.precisions] or ["native"]
            raise CheckpointError(
                f"{os.path.join(self.path, 'config.json')}: the checkpoint has no {precision} "
                f"experts (precisions present: {present}); " +
                ADD_PRECISIONS_HINT.format(path=self.path, wanted=precision))
        if precision not in self._quantized:
            self._quantized[precision] = read_quantized_experts(
                self.path, self.cfg, precision, self.precisions[precision], self.expert_index)
        return self._quantized[precision]

    def forget_experts(self, precision: str) -> None:
        """Drops this checkpoint's host copy of the experts at `precision`; `experts_at` reads
        them from disk again when asked. (A slot pool that keeps its own copy in another form
        takes them over: `LoadedModel.take_experts`.)"""
        formats.check(precision)
        if precision == "native":
            self.host_gate_up = self.host_down = None
        else:
            self._quantized.pop(precision, None)


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


def read_quantized_experts(path: str, cfg: ModelConfig, precision: str, entry: dict,
                           index: packed.Index | None = None):
    """One precision's quantized experts of every MoE layer, in host memory. `index`: the
    packed layout's (`read_expert_index`; read from config.json when not given)."""
    if index is None:
        index = read_expert_index(path)
    h, i, e = cfg.hidden_size, cfg.expert_intermediate_size, cfg.num_experts
    shapes = {"gate_up": (e, h, 2 * i), "down": (e, i, h)}
    out = {"gate_up": {}, "down": {}}
    for layer in cfg.moe_layers:
        if index is not None:
            qs = dict(zip(expert_store.KINDS, packed.read_layer(
                path, layer, index.records[precision], index.checksums[precision][layer])))
        else:
            qs = {kind: expert_store.read_quantized(path, layer, kind, precision, shapes[kind],
                                                    entry["groups"][kind])
                  for kind in expert_store.KINDS}
        for kind, q in qs.items():
            out[kind][layer] = q.map(to_host)
    return out["gate_up"], out["down"]


def read_native_layer(path: str, cfg: ModelConfig, layer: int,
                 index: packed.Index | None) -> tuple[np.ndarray, np.ndarray]:
    """One layer's native `(gate_up [E, H, 2I], down [E, I, H])`, in either layout."""
    if index is not None:
        return packed.read_layer(path, layer, index.records["native"],
                                 index.checksums["native"][layer])
    h, i, e = cfg.hidden_size, cfg.expert_intermediate_size, cfg.num_experts
    return (expert_store.read_kind(path, layer, "gate_up", (e, h, 2 * i), cfg.dtype),
            expert_store.read_kind(path, layer, "down", (e, i, h), cfg.dtype))


def read_native_experts(path: str, cfg: ModelConfig, index: packed.Index | None = None):
    """The native experts of every MoE layer, in host memory: `(gate_up, down)` per layer.
    `index`: the packed layout's (read from config.json when not given)."""
    if index is None:
        index = read_expert_index(path)
    gate_up, down = {}, {}
    for layer in cfg.moe_layers:
        g, d = read_native_layer(path, cfg, layer, index)
        gate_up[layer], down[layer] = to_host(g), to_host(d)
    return gate_up, down


def load(path: str, read_experts: bool = True) -> Checkpoint:
    """The checkpoint at `path`: dense model and, unless `read_experts=False` (a disk tier
    reads them one at a time, `moejax.checkpoint.expert_reader`), the native experts of every
    MoE layer in host memory."""
    cfg, precisions, index = read_meta(path)
    model = nnx.merge(*nnx.split(abstract_decoder(cfg)))
    abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in flat_params(model).items()}
    load_flat_params(model, dense.restore(os.path.join(path, "dense"), abstract))
    gate_up, down = read_native_experts(path, cfg, index) if read_experts else (None, None)
    tok = os.path.join(path, "tokenizer")
    return Checkpoint(path, cfg, model, gate_up, down, tok if os.path.isdir(tok) else None,
                      precisions, index)
