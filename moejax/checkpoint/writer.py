"""Writes a checkpoint (`save`, `save_model`) and adds quantized copies to one
(`add_precisions`); config.json goes last, atomically, so a checkpoint that has one is complete.
"""

from __future__ import annotations

import os
import shutil
from typing import Iterable

import numpy as np

from moejax.checkpoint import dense, expert_store, packed
from moejax.checkpoint.meta import precision_entries, read_meta, read_precisions, write_config
from moejax.checkpoint.options import (
    check_expert_layout,
    check_group_size,
    parse_precisions,
    resolve_calibrations,
)
from moejax.checkpoint.params import flat_params
from moejax.checkpoint.reader import load, read_native_layer
from moejax.errors import CheckpointError, ConfigError
from moejax.model_config import ModelConfig
from moejax.models import MoEDecoder
from moejax.quant import DEFAULT_GROUP_SIZE, QUANTIZED, quantize

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "generation_config.json")


def _quantized_copies(arrays: dict[str, np.ndarray], calibrations: dict[str, str],
                      group_size: int):
    """`(precision, {kind: QuantizedWeights})` for each precision, one at a time."""
    for precision, cal in calibrations.items():
        yield precision, {kind: quantize(np.asarray(w), precision, group_size, cal)
                          for kind, w in arrays.items()}


class ExpertWriter:
    """Writes each layer's experts, one precision at a time, in one expert layout; for the
    packed one it collects the index (records and checksums) to put in config.json."""

    def __init__(self, out: str, cfg: ModelConfig, expert_layout: str,
                 groups: dict[str, dict[str, int] | None]):
        self.out, self.expert_layout = out, expert_layout
        self.records = ({p: packed.record_for(cfg, p, g) for p, g in groups.items()}
                        if expert_layout == "packed" else {})
        self.checksums = {p: {} for p in self.records}

    def write(self, layer: int, precision: str, weights: dict, compression: str | None) -> None:
        """`weights`: `{kind: [E, K, N] array}` (native) or `{kind: QuantizedWeights}`."""
        if self.expert_layout == "packed":
            self.checksums[precision][layer] = packed.write_layer(
                self.out, layer, self.records[precision],
                tuple(weights[k] for k in expert_store.KINDS))
        elif precision == "native":
            for kind, w in weights.items():
                expert_store.write_kind(self.out, layer, kind, w, compression)
        else:
            for kind, q in weights.items():
                expert_store.write_quantized(self.out, layer, kind, precision, q, compression)

    def index(self) -> packed.Index | None:
        if self.expert_layout != "packed":
            return None
        return packed.Index(self.records, {p: {layer: tuple(s) for layer, s in sorted(c.items())}
                                           for p, c in self.checksums.items()})


def save(out: str, cfg: ModelConfig, dense_params: dict[str, np.ndarray],
         layer_experts: Iterable[tuple[int, np.ndarray, np.ndarray]],
         tokenizer_dir: str | None = None, compression: str | None = None,
         precisions=(), group_size: int = DEFAULT_GROUP_SIZE, calibration=None,
         expert_layout: str = "zarr") -> None:
    """Writes a checkpoint. `layer_experts` yields `(layer, gate_up, down)` one layer at a time
    so a large model never holds all its experts in memory. `precisions` (e.g. `("int8",
    "int4")`) are quantized copies written beside each layer's native experts, in groups of
    `group_size` rows, with `calibration` (None: each precision's default; a name; or a dict
    precision -> name). `expert_layout`: "zarr" (zarr3 arrays, optionally compressed) or
    "packed" (one file of page-aligned records per layer and precision)."""
    precisions = parse_precisions(precisions, "precisions")
    group_size = check_group_size(group_size, "group_size")
    calibrations = resolve_calibrations(precisions, calibration, "calibration")
    expert_layout = check_expert_layout(expert_layout, compression, "expert_layout")
    entries = precision_entries(cfg, calibrations, group_size)
    os.makedirs(out, exist_ok=True)
    # An old config.json would make a half-overwritten directory look complete.
    marker = os.path.join(out, "config.json")
    if os.path.exists(marker):
        os.remove(marker)
    writer = ExpertWriter(out, cfg, expert_layout,
                           {"native": None, **{p: e["groups"] for p, e in entries.items()}})
    written = set()
    for layer, gate_up, down in layer_experts:
        arrays = {"gate_up": gate_up, "down": down}
        writer.write(layer, "native", arrays, compression)
        for precision, copies in _quantized_copies(arrays, calibrations, group_size):
            writer.write(layer, precision, copies, compression)
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
    write_config(out, cfg, entries, writer.index())


def save_model(out: str, model: MoEDecoder, gate_up: dict[int, np.ndarray],
               down: dict[int, np.ndarray], compression: str | None = None,
               precisions=(), group_size: int = DEFAULT_GROUP_SIZE, calibration=None,
               expert_layout: str = "zarr") -> None:
    """Saves an in-memory model (tests, training) in the checkpoint layout."""
    params = {k: np.asarray(v) for k, v in flat_params(model).items()}
    save(out, model.cfg, params, ((l, np.asarray(gate_up[l]), np.asarray(down[l]))
                                  for l in model.cfg.moe_layers), compression=compression,
         precisions=precisions, group_size=group_size, calibration=calibration,
         expert_layout=expert_layout)


def copy_in_layout(src: str, out: str, expert_layout: str, precisions=(),
                   group_size: int = DEFAULT_GROUP_SIZE, calibration=None) -> None:
    """A copy of the checkpoint at `src` with its native experts written in `expert_layout`
    (and `precisions` quantized from them): e.g. the shipped embedded model in the packed
    layout, for the disk tier's live benchmarks."""
    ck = load(src)
    save_model(out, ck.model, {l: np.asarray(v) for l, v in ck.host_gate_up.items()},
               {l: np.asarray(v) for l, v in ck.host_down.items()}, precisions=precisions,
               group_size=group_size, calibration=calibration, expert_layout=expert_layout)


# Inside a checkpoint, the quantized copies `add_precisions` is writing, until all are complete.
STAGING = ".add_precisions.tmp"


def add_precisions(path: str, precisions, group_size: int = DEFAULT_GROUP_SIZE,
                   calibration=None) -> dict[str, dict]:
    """Quantizes an existing checkpoint's native experts and writes the copies beside them, in
    the checkpoint's expert layout (zarr: with the native arrays' compression); returns the
    precisions now present. Copies of a precision already present are replaced.

    Nothing the checkpoint holds changes until every new copy is complete: the copies are
    written into `PATH/.add_precisions.tmp/`, then moved into place, then config.json is
    rewritten (atomically) to list them. A failure before the move (a quantizer error, a full
    disk, Ctrl-C) leaves config.json and every file it lists as they were, and removes the
    staged copies. Replacing a precision already present, config.json is rewritten without
    it just before the move, so no config.json ever lists a copy that is half old, half new."""
    precisions = parse_precisions(precisions, "precisions")
    if not precisions:
        raise ConfigError(f"precisions={precisions!r}: nothing to add; expected a subset of "
                          f"{QUANTIZED}")
    group_size = check_group_size(group_size, "group_size")
    calibrations = resolve_calibrations(precisions, calibration, "calibration")
    cfg, present, index = read_meta(path)
    layout = "zarr" if index is None else "packed"
    entries = precision_entries(cfg, calibrations, group_size)
    stage = os.path.join(path, STAGING)
    shutil.rmtree(stage, ignore_errors=True)  # left by a run that was killed
    writer = ExpertWriter(stage, cfg, layout, {p: e["groups"] for p, e in entries.items()})
    try:
        for layer in cfg.moe_layers:
            gate_up, down = read_native_layer(path, cfg, layer, index)
            compression = (expert_store.compression_of(path, layer, "gate_up")
                           if index is None else None)
            for precision, copies in _quantized_copies({"gate_up": gate_up, "down": down},
                                                       calibrations, group_size):
                writer.write(layer, precision, copies, compression)
        kept = {p: v for p, v in present.items() if p != "native" and p not in precisions}
        kept_index = index.without(precisions) if index is not None else None
        if any(p in present for p in precisions):
            write_config(path, cfg, kept, kept_index)
        _move_into_place(stage, path, cfg, entries, layout)
        new_index = kept_index.merged(writer.index()) if index is not None else None
        write_config(path, cfg, {**kept, **entries}, new_index)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return read_precisions(path)


def _move_into_place(stage: str, path: str, cfg: ModelConfig, precisions,
                     layout: str) -> None:
    """Renames the staged copies of `precisions` over the checkpoint's; a copy being replaced
    goes into the staging directory first (removed with it)."""
    old = os.path.join(stage, "replaced")
    for layer in cfg.moe_layers:
        for precision in precisions:
            if layout == "packed":
                os.replace(packed.file_path(stage, layer, precision),
                           packed.file_path(path, layer, precision))
                continue
            for kind in expert_store.KINDS:
                src, dst = (os.path.dirname(expert_store.quant_path(root, layer, kind,
                                                                    precision, "values"))
                            for root in (stage, path))
                if os.path.lexists(dst):
                    os.makedirs(old, exist_ok=True)
                    os.rename(dst, os.path.join(old, f"{layer}.{kind}.{precision}"))
                os.rename(src, dst)
