"""config.json, the file that describes a moejax checkpoint and marks it complete (DESIGN.md,
"Checkpoint layout"). The directory::

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

import json
import os
import re
import shlex

from moejax.checkpoint import expert_store, packed
from moejax.errors import CheckpointError, ConfigError
from moejax.model_config import ModelConfig
from moejax.quant import QUANTIZED, formats
from moejax.results import write_text_atomic

PRECISIONS_KEY = "precisions"


EXPERT_LAYOUT_KEY = "expert_layout"


# The ways experts are stored: zarr3 arrays (`expert_store`) or packed records (`packed`).
LAYOUTS = ("zarr", "packed")


ADD_PRECISIONS_HINT = ("add them with: python -m moejax.convert --out={path} --add_precisions "
                       "--precisions={wanted}")


def precision_entries(cfg: ModelConfig, calibrations: dict[str, str],
                       group_size: int) -> dict[str, dict]:
    h, i = cfg.hidden_size, cfg.expert_intermediate_size
    groups = {"gate_up": formats.group_size_for(h, group_size),
              "down": formats.group_size_for(i, group_size)}
    return {p: {"group_size": group_size, "calibration": c, "groups": dict(groups)}
            for p, c in calibrations.items()}


def write_config(out: str, cfg: ModelConfig, precisions: dict[str, dict],
                  index: packed.Index | None = None) -> None:
    """config.json, atomically: its presence marks a complete checkpoint. `index`: the packed
    layout's (None: the zarr layout, which has no key, as before the packed one existed)."""
    d = json.loads(cfg.to_json())
    quantized = {p: precisions[p] for p in QUANTIZED if p in precisions}
    if quantized:
        d[PRECISIONS_KEY] = quantized
    if index is not None:
        d[EXPERT_LAYOUT_KEY] = index.to_json()
    # A uniquely named, synced temporary renamed over it: a failed or concurrent write never
    # leaves a partial config.json (nor one writer's temporary file under another's).
    write_text_atomic(os.path.join(out, "config.json"),
                      _INT_LIST.sub(_one_line, json.dumps(d, indent=2, sort_keys=True)))


# A list of integers on one line: a packed index has one checksum per expert and layer, which
# would otherwise take a line each and bury the model config in thousands of lines.
_INT_LIST = re.compile(r"\[[\d,\s]+\]")


def _one_line(match: re.Match) -> str:
    return "[" + ", ".join(n.strip() for n in match.group(0)[1:-1].split(",")) + "]"


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
    if _is_hugging_face_config(d):
        raise CheckpointError(hugging_face_message(path))
    return cfg_path, d


def _is_hugging_face_config(d: dict) -> bool:
    """A Hugging Face config.json: it has `model_type` or `architectures` (transformers
    writes both), which a moejax config never has, and no moejax `family`."""
    return "family" not in d and ("model_type" in d or "architectures" in d)


def is_hugging_face_dir(path: str) -> bool:
    """Whether `path` holds an unconverted Hugging Face checkpoint (its config.json is one)."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and _is_hugging_face_config(d)


def hugging_face_message(path: str) -> str:
    """`PATH is a Hugging Face checkpoint, not a converted moejax one: convert it first: ...`"""
    out = (path.rstrip(os.sep) or path) + "-moejax"
    return (f"{path} is a Hugging Face checkpoint, not a converted moejax one: convert it "
            f"first: python -m moejax.convert --hf_dir={shlex.quote(path)} "
            f"--out={shlex.quote(out)}")


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


def read_meta(path: str) -> tuple[ModelConfig, dict[str, dict], packed.Index | None]:
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
    return read_meta(path)[1]


def expert_layout(path: str) -> str:
    """How the checkpoint at `path` stores its experts: "zarr" or "packed"."""
    return _layout_from(*_read_config_dict(path))


def read_expert_index(path: str) -> packed.Index | None:
    """The packed layout's index (records and checksums), checked against the config; None for
    a zarr checkpoint."""
    return read_meta(path)[2]
