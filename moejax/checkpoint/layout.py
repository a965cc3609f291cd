"""The moejax checkpoint directory (DESIGN.md, "Checkpoint layout")::

    OUT/config.json                       ModelConfig (family, dimensions, dtypes)
    OUT/dense/                            Orbax checkpoint of the dense parameters
    OUT/experts/layer_LLL/{gate_up,down}  TensorStore zarr3, one expert per chunk, crc32c
    OUT/experts/layer_LLL/{gate_up,down}.{int8,int4,int2}/{values,scale,zero}
                                          quantized copies (optional): one zarr3 shard file
                                          per part, one expert per inner chunk, crc32c
    OUT/tokenizer/                        the source checkpoint's tokenizer files, if any

or, in the packed expert layout (`save(..., expert_layout="packed")`, `moejax.checkpoint.packed`),
instead of the zarr arrays::

    OUT/experts/layer_LLL/{native,int8,int4,int2}.packed
                                          one file per layer and precision, each expert one
                                          page-aligned record at a fixed stride

config.json holds the ModelConfig and, under "precisions", the quantized copies present:
`{"int4": {"group_size": 64, "calibration": "search", "groups": {"gate_up": 48, "down": 48}}}`
(`groups`: the group length actually used along each kind's contraction axis); a packed
checkpoint also has, under "expert_layout", the index of its records (`packed.Index`). No
"expert_layout" key (or `{"kind": "zarr"}`) is the zarr layout, which every checkpoint written
before the packed one has.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from typing import Iterable

import jax
import numpy as np
from flax import nnx

from moejax.checkpoint import dense, expert_store, packed
from moejax.checkpoint.errors import CheckpointError
from moejax.checkpoint.params import flat_params, load_flat_params
from moejax.config import ConfigError, ModelConfig
from moejax.models.decoder import MoEDecoder, abstract_decoder
from moejax.quant import formats
from moejax.quant.formats import DEFAULT_GROUP_SIZE, QUANTIZED, QuantizedWeights

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "generation_config.json")


PRECISIONS_KEY = "precisions"
EXPERT_LAYOUT_KEY = "expert_layout"
# The ways experts are stored: zarr3 arrays (`expert_store`) or packed records (`packed`).
LAYOUTS = ("zarr", "packed")
ADD_PRECISIONS_HINT = ("add them with: python -m moejax.convert --out={path} --add_precisions "
                       "--precisions={wanted}")


def parse_precisions(precisions, what: str = "--precisions") -> tuple[str, ...]:
    """`"int8,int4"` (or a sequence) -> `("int8", "int4")`: quantized precisions, no repeats,
    in the order of `formats.PRECISIONS`."""
    if precisions is None:
        return ()
    items = [p.strip() for p in precisions.split(",")] if isinstance(precisions, str) \
        else [str(p) for p in precisions]
    items = [p for p in items if p]
    bad = [p for p in items if p not in QUANTIZED]
    if bad:
        raise ConfigError(f"{what}={precisions!r}: {bad} not quantized precisions; expected a "
                          f"comma-separated subset of {QUANTIZED}")
    if len(set(items)) != len(items):
        raise ConfigError(f"{what}={precisions!r} repeats a precision")
    return tuple(p for p in QUANTIZED if p in items)


def resolve_calibrations(precisions: tuple[str, ...], calibration,
                         what: str = "--calibration") -> dict[str, str]:
    """The calibration of each precision: `calibration` is None (each precision's default), one
    name for all, `"int4=hqq,int2=search"`, or a dict."""
    from moejax.quant.quantize import CALIBRATIONS, check_calibration
    if isinstance(calibration, str) and "=" in calibration:
        d = {}
        for item in calibration.split(","):
            p, _, c = item.partition("=")
            if not c:
                raise ConfigError(f"{what}={calibration!r}: expected NAME or "
                                  "PRECISION=NAME,... e.g. 'int2=search'")
            d[p.strip()] = c.strip()
        calibration = d
    if isinstance(calibration, dict):
        extra = sorted(set(calibration) - set(precisions))
        if extra:
            raise ConfigError(f"{what}: calibration given for {extra}, which are not among the "
                              f"precisions written {list(precisions)}")
        return {p: check_calibration(p, calibration.get(p), what) for p in precisions}
    if calibration is not None and calibration not in CALIBRATIONS:
        raise ConfigError(f"{what}={calibration!r} is not one of {CALIBRATIONS}")
    return {p: check_calibration(p, calibration, what) for p in precisions}


def check_group_size(group_size, what: str = "--group_size") -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) \
            or group_size < 1:
        raise ConfigError(f"{what}={group_size!r} must be a positive integer")
    return int(group_size)


def check_expert_layout(expert_layout, compression=None, what: str = "--layout") -> str:
    """`expert_layout` validated (ConfigError naming `what`); the packed layout stores raw bytes,
    so it takes no compression."""
    if expert_layout not in LAYOUTS:
        raise ConfigError(f"{what}={expert_layout!r} is not one of {LAYOUTS}")
    if expert_layout == "packed" and compression is not None:
        raise ConfigError(f"{what}=packed stores raw bytes: compression={compression!r} applies "
                          "to the zarr layout only")
    return expert_layout


def _quantized_copies(arrays: dict[str, np.ndarray], calibrations: dict[str, str],
                      group_size: int):
    """`(precision, {kind: QuantizedWeights})` for each precision, one at a time."""
    from moejax.quant.quantize import quantize
    for precision, cal in calibrations.items():
        yield precision, {kind: quantize(np.asarray(w), precision, group_size, cal)
                          for kind, w in arrays.items()}


class _ExpertWriter:
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


def _precision_entries(cfg: ModelConfig, calibrations: dict[str, str],
                       group_size: int) -> dict[str, dict]:
    h, i = cfg.hidden_size, cfg.expert_intermediate_size
    groups = {"gate_up": formats.group_size_for(h, group_size),
              "down": formats.group_size_for(i, group_size)}
    return {p: {"group_size": group_size, "calibration": c, "groups": dict(groups)}
            for p, c in calibrations.items()}


def _write_config(out: str, cfg: ModelConfig, precisions: dict[str, dict],
                  index: packed.Index | None = None) -> None:
    """config.json, atomically: its presence marks a complete checkpoint. `index`: the packed
    layout's (None: the zarr layout, which has no key, as before the packed one existed)."""
    d = json.loads(cfg.to_json())
    quantized = {p: precisions[p] for p in QUANTIZED if p in precisions}
    if quantized:
        d[PRECISIONS_KEY] = quantized
    if index is not None:
        d[EXPERT_LAYOUT_KEY] = index.to_json()
    marker = os.path.join(out, "config.json")
    tmp = marker + ".tmp"
    with open(tmp, "w") as f:
        f.write(_INT_LIST.sub(_one_line, json.dumps(d, indent=2, sort_keys=True)))
    os.replace(tmp, marker)


# A list of integers on one line: a packed index has one checksum per expert and layer, which
# would otherwise take a line each and bury the model config in thousands of lines.
_INT_LIST = re.compile(r"\[[\d,\s]+\]")


def _one_line(match: re.Match) -> str:
    return "[" + ", ".join(n.strip() for n in match.group(0)[1:-1].split(",")) + "]"


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
    entries = _precision_entries(cfg, calibrations, group_size)
    os.makedirs(out, exist_ok=True)
    # An old config.json would make a half-overwritten directory look complete.
    marker = os.path.join(out, "config.json")
    if os.path.exists(marker):
        os.remove(marker)
    writer = _ExpertWriter(out, cfg, expert_layout,
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
    _write_config(out, cfg, entries, writer.index())


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


def _read_config_dict(path: str) -> tuple[str, dict]:
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise CheckpointError(f"{cfg_path}: missing (not a moejax checkpoint, or incomplete)")
    try:
        with open(cfg_path) as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_path}: invalid moejax config: {e}") from e
    if not isinstance(d, dict):
        raise CheckpointError(f"{cfg_path}: invalid moejax config: not a JSON object")
    return cfg_path, d


def _config_from(cfg_path: str, d: dict) -> ModelConfig:
    d = {k: v for k, v in d.items() if k not in (PRECISIONS_KEY, EXPERT_LAYOUT_KEY)}
    try:
        return ModelConfig.from_dict(d)
    except (ConfigError, TypeError) as e:
        raise CheckpointError(f"{cfg_path}: invalid moejax config: {e}") from e


def _precisions_from(cfg_path: str, d: dict, cfg: ModelConfig) -> dict[str, dict]:
    entries = d.get(PRECISIONS_KEY, {})
    bad = f"{cfg_path}: invalid {PRECISIONS_KEY!r} entry"
    if not isinstance(entries, dict):
        raise CheckpointError(f"{bad}: expected an object keyed by precision")
    unknown = sorted(set(entries) - set(QUANTIZED))
    if unknown:
        raise CheckpointError(f"{bad}: unknown precisions {unknown}; known: {list(QUANTIZED)}")
    out = {"native": {"dtype": cfg.dtype}}
    for p in QUANTIZED:
        if p not in entries:
            continue
        e = entries[p]
        groups = e.get("groups") if isinstance(e, dict) else None
        if not (isinstance(groups, dict) and set(groups) == set(expert_store.KINDS) and
                all(isinstance(v, int) and v >= 1 for v in groups.values())):
            raise CheckpointError(f"{bad} for {p}: expected {{'groups': {{'gate_up': G, "
                                  f"'down': G}}, ...}}, got {e!r}")
        out[p] = dict(e)
    return out


def _layout_from(cfg_path: str, d: dict) -> str:
    entry = d.get(EXPERT_LAYOUT_KEY)
    if entry is None:
        return "zarr"
    kind = entry.get("kind") if isinstance(entry, dict) else None
    if kind not in LAYOUTS:
        raise CheckpointError(f"{cfg_path}: invalid {EXPERT_LAYOUT_KEY!r} entry: kind {kind!r} "
                              f"is not one of {LAYOUTS}")
    return kind


def _read_meta(path: str) -> tuple[ModelConfig, dict[str, dict], packed.Index | None]:
    """config.json's model config, precisions and packed index (None in the zarr layout), all
    validated: a malformed index fails here, before any expert is read."""
    cfg_path, d = _read_config_dict(path)
    cfg = _config_from(cfg_path, d)
    precisions = _precisions_from(cfg_path, d, cfg)
    if _layout_from(cfg_path, d) != "packed":
        return cfg, precisions, None
    groups = {p: e.get("groups") for p, e in precisions.items()}  # native: None
    return cfg, precisions, packed.parse_index(d[EXPERT_LAYOUT_KEY], cfg, groups, cfg_path)


def read_config(path: str) -> ModelConfig:
    cfg_path, d = _read_config_dict(path)
    return _config_from(cfg_path, d)


def read_precisions(path: str) -> dict[str, dict]:
    """The precisions a checkpoint holds: `{"native": {"dtype": ...}, "int4": {"group_size":
    64, "calibration": "search", "groups": {"gate_up": 48, "down": 48}}, ...}`, highest first."""
    return _read_meta(path)[1]


def expert_layout(path: str) -> str:
    """How the checkpoint at `path` stores its experts: "zarr" or "packed"."""
    return _layout_from(*_read_config_dict(path))


def read_expert_index(path: str) -> packed.Index | None:
    """The packed layout's index (records and checksums), checked against the config; None for
    a zarr checkpoint."""
    return _read_meta(path)[2]


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


def _read_native(path: str, cfg: ModelConfig, layer: int,
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
        g, d = _read_native(path, cfg, layer, index)
        gate_up[layer], down[layer] = to_host(g), to_host(d)
    return gate_up, down


def add_precisions(path: str, precisions, group_size: int = DEFAULT_GROUP_SIZE,
                   calibration=None) -> dict[str, dict]:
    """Quantizes an existing checkpoint's native experts and writes the copies beside them, in
    the checkpoint's expert layout (zarr: with the native arrays' compression); returns the
    precisions now present. Copies of a precision already present are replaced. config.json is
    rewritten atomically, first without the precisions being written (so an interrupted run
    never lists a half-written copy), and last with them."""
    precisions = parse_precisions(precisions, "precisions")
    if not precisions:
        raise ConfigError(f"precisions={precisions!r}: nothing to add; expected a subset of "
                          f"{QUANTIZED}")
    group_size = check_group_size(group_size, "group_size")
    calibrations = resolve_calibrations(precisions, calibration, "calibration")
    cfg, present, index = _read_meta(path)
    kept = {p: v for p, v in present.items() if p != "native" and p not in precisions}
    kept_index = index.without(precisions) if index is not None else None
    _write_config(path, cfg, kept, kept_index)
    entries = _precision_entries(cfg, calibrations, group_size)
    writer = _ExpertWriter(path, cfg, "zarr" if index is None else "packed",
                           {p: e["groups"] for p, e in entries.items()})
    for layer in cfg.moe_layers:
        gate_up, down = _read_native(path, cfg, layer, index)
        compression = (expert_store.compression_of(path, layer, "gate_up") if index is None
                       else None)
        for precision, copies in _quantized_copies({"gate_up": gate_up, "down": down},
                                                   calibrations, group_size):
            writer.write(layer, precision, copies, compression)
    new_index = kept_index.merged(writer.index()) if index is not None else None
    _write_config(path, cfg, {**kept, **entries}, new_index)
    return read_precisions(path)


def load(path: str, read_experts: bool = True) -> Checkpoint:
    """The checkpoint at `path`: dense model and, unless `read_experts=False` (a disk tier
    reads them one at a time, `moejax.checkpoint.expert_reader`), the native experts of every
    MoE layer in host memory."""
    cfg, precisions, index = _read_meta(path)
    model = nnx.merge(*nnx.split(abstract_decoder(cfg)))
    abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in flat_params(model).items()}
    load_flat_params(model, dense.restore(os.path.join(path, "dense"), abstract))
    gate_up, down = read_native_experts(path, cfg, index) if read_experts else (None, None)
    tok = os.path.join(path, "tokenizer")
    return Checkpoint(path, cfg, model, gate_up, down, tok if os.path.isdir(tok) else None,
                      precisions, index)
