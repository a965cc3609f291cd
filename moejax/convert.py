"""Converts a Hugging Face safetensors MoE checkpoint into the moejax layout.

    python -m moejax.convert --hf_dir=DIR --out=OUT [--dtype=bfloat16]

Families: OLMoE, Mixtral, Qwen1.5/Qwen2-MoE, Phi-3.5-MoE (see `moejax.families`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterator

import numpy as np
from absl import app, flags, logging

from moejax.checkpoint import layout
from moejax.checkpoint.errors import CheckpointError
from moejax.checkpoint.hf_names import dense_sources, read_layer_experts
from moejax.checkpoint.params import flat_params
from moejax.checkpoint.safetensors_dir import SafetensorsDir
from moejax.config import DTYPES, ConfigError, ModelConfig
from moejax.families import config_from_hf
from moejax.models.decoder import abstract_decoder


def read_hf_config(hf_dir: str) -> dict:
    path = os.path.join(hf_dir, "config.json")
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: missing (a Hugging Face checkpoint directory is expected)")
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: invalid JSON: {e}") from e


def convert(hf_dir: str, out: str, dtype: str | None = None,
            compression: str | None = None) -> ModelConfig:
    """Converts `hf_dir` into `out`; returns the model config written. `dtype` overrides the
    stored precision (default: the checkpoint's own)."""
    hf = read_hf_config(hf_dir)
    try:
        cfg = config_from_hf(hf)
    except ConfigError as e:
        raise CheckpointError(f"{os.path.join(hf_dir, 'config.json')}: {e}") from e
    if dtype is not None:
        if dtype not in DTYPES:
            raise ConfigError(f"--dtype={dtype!r} is not one of {DTYPES}")
        cfg = dataclasses.replace(cfg, dtype=dtype)
    st = SafetensorsDir(hf_dir)
    target = np.dtype(cfg.dtype)

    expected = {k: v for k, v in flat_params(abstract_decoder(cfg)).items()}
    dense = {}
    for path, (name, transpose) in dense_sources(cfg).items():
        raw = np.asarray(st.get(name))
        want = tuple(expected[path].shape)
        want_hf = want[::-1] if transpose else want  # HF linear weights are [out, in]
        if raw.shape != want_hf:
            raise CheckpointError(f"{hf_dir}: tensor {name!r} has shape {raw.shape}, the "
                                  f"config implies {want_hf}")
        array = raw.T if transpose else raw
        dense[path] = np.ascontiguousarray(array.astype(target))
    missing = sorted(set(expected) - set(dense))
    if missing:  # a mapping bug, not user error: fail loudly rather than keep random weights
        raise CheckpointError(f"no Hugging Face source for moejax parameters {missing}")

    def experts() -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        for layer in cfg.moe_layers:
            gate_up, down = read_layer_experts(st, cfg, layer)
            logging.info("layer %d: %d experts", layer, cfg.num_experts)
            yield layer, gate_up.astype(target), down.astype(target)

    layout.save(out, cfg, dense, experts(), tokenizer_dir=hf_dir, compression=compression)
    return cfg


FLAGS = flags.FLAGS
flags.DEFINE_string("hf_dir", None, "Hugging Face checkpoint directory (config.json + safetensors).")
flags.DEFINE_string("out", None, "Output moejax checkpoint directory.")
flags.DEFINE_string("dtype", None, f"Stored precision, one of {DTYPES} (default: the source's).")
flags.DEFINE_enum("compression", None, ["blosc"],
                  "Compress expert chunks (smaller files, slower reads); default: none.")


def main(argv):
    del argv
    if not FLAGS.hf_dir or not FLAGS.out:
        raise app.UsageError("--hf_dir and --out are required")
    try:
        cfg = convert(FLAGS.hf_dir, FLAGS.out, FLAGS.dtype, FLAGS.compression)
    except (CheckpointError, ConfigError) as e:
        raise SystemExit(f"error: {e}")
    print(f"converted {cfg.family}: {cfg.num_layers} layers, {cfg.num_moe_layers} MoE layers x "
          f"{cfg.num_experts} experts (top-{cfg.top_k}), expert {cfg.expert_bytes} bytes -> "
          f"{FLAGS.out}")


def run():
    app.run(main)


if __name__ == "__main__":
    run()
