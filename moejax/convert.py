"""Converts a Hugging Face safetensors MoE checkpoint into the moejax layout.

    python -m moejax.convert --hf_dir=DIR --out=OUT [--dtype=bfloat16] [--layout=zarr|packed]
        [--precisions=int8,int4,int2 [--group_size=64] [--calibration=search|int2=hqq,...]]
    python -m moejax.convert --out=OUT --add_precisions --precisions=int4   # to an existing one

`--layout=packed` stores each layer's experts as one file of page-aligned records per
precision (`moejax.checkpoint.packed`) instead of zarr3 arrays; `--add_precisions` writes in
the layout the checkpoint already has.

Families: OLMoE, Mixtral, Qwen1.5/Qwen2-MoE, Phi-3.5-MoE (see `moejax.families`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterator

import numpy as np
from absl import app, flags, logging

from moejax import checkpoint, workdir
from moejax.checkpoint.hf_names import dense_sources, read_layer_experts
from moejax.checkpoint.params import flat_params
from moejax.checkpoint.safetensors_dir import SafetensorsDir
from moejax.cli import UsageError
from moejax.errors import CheckpointError, ConfigError
from moejax.families import config_from_hf
from moejax.model_config import DTYPES, ModelConfig
from moejax.models.decoder import abstract_decoder
from moejax.quant.formats import CALIBRATIONS, DEFAULT_CALIBRATION, DEFAULT_GROUP_SIZE, QUANTIZED


def read_hf_config(hf_dir: str) -> dict:
    path = os.path.join(hf_dir, "config.json")
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: missing (a Hugging Face checkpoint directory is expected)")
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: invalid JSON: {e}") from e


def check_quant_flags(precisions, group_size, calibration) -> tuple[str, ...]:
    """Validates --precisions / --group_size / --calibration (ConfigError naming the flag);
    returns the precisions."""
    wanted = checkpoint.parse_precisions(precisions, "--precisions")
    checkpoint.check_group_size(group_size, "--group_size")
    if calibration is not None and not wanted:
        raise ConfigError(f"--calibration={calibration!r} needs --precisions (one or more of "
                          f"{QUANTIZED})")
    checkpoint.resolve_calibrations(wanted, calibration, "--calibration")
    return wanted


def convert(hf_dir: str, out: str, dtype: str | None = None,
            compression: str | None = None, precisions=(),
            group_size: int = DEFAULT_GROUP_SIZE, calibration=None,
            expert_layout: str = "zarr") -> ModelConfig:
    """Converts `hf_dir` into `out`; returns the model config written. `dtype` overrides the
    stored precision (default: the checkpoint's own). `precisions` (e.g. "int8,int4") adds
    quantized expert copies (`checkpoint.save`); `expert_layout` is "zarr" or "packed"."""
    precisions = check_quant_flags(precisions, group_size, calibration)
    checkpoint.check_expert_layout(expert_layout, compression, "--layout")
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

    checkpoint.save(out, cfg, dense, experts(), tokenizer_dir=hf_dir, compression=compression,
                precisions=precisions, group_size=group_size, calibration=calibration,
                expert_layout=expert_layout)
    return cfg


def add_precisions(out: str, precisions, group_size: int = DEFAULT_GROUP_SIZE,
                   calibration=None) -> dict[str, dict]:
    """Adds quantized copies to the already converted checkpoint `out`."""
    wanted = check_quant_flags(precisions, group_size, calibration)
    if not wanted:
        raise ConfigError(f"--add_precisions needs --precisions (one or more of {QUANTIZED})")
    return checkpoint.add_precisions(out, wanted, group_size, calibration)


FLAGS = flags.FLAGS
flags.DEFINE_string("hf_dir", None,
                    "Hugging Face checkpoint directory (config.json + safetensors).")
flags.DEFINE_string("out", None, "Output moejax checkpoint directory.")
flags.DEFINE_string("dtype", None, f"Stored precision, one of {DTYPES} (default: the source's).")
flags.DEFINE_enum("compression", None, ["blosc"],
                  "Compress expert chunks (smaller files, slower reads); default: none.")
flags.DEFINE_string("precisions", None,
                    f"Quantized expert copies to write beside the native ones, comma-separated "
                    f"subset of {QUANTIZED} (default: none).")
flags.DEFINE_integer("group_size", DEFAULT_GROUP_SIZE,
                     "Rows of the contraction axis sharing one scale / zero point (shrunk to "
                     "the largest divisor of the axis).")
flags.DEFINE_string("calibration", None,
                    f"Quantization calibration, one of {CALIBRATIONS} for all precisions, or "
                    f"PRECISION=NAME,... (default: {DEFAULT_CALIBRATION}).")
flags.DEFINE_enum("layout", "zarr", list(checkpoint.LAYOUTS),
                  "How experts are stored: zarr (zarr3 arrays, one chunk per expert) or packed "
                  "(one file of page-aligned records per layer and precision, for per-expert "
                  "reads from disk). --add_precisions keeps the checkpoint's own layout.")
flags.DEFINE_bool("add_precisions", False,
                  "Add --precisions to the checkpoint already at --out (no --hf_dir).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if FLAGS.add_precisions:
        if FLAGS.hf_dir or not FLAGS.out:
            raise app.UsageError("--add_precisions takes --out (an existing moejax checkpoint) "
                                 "and no --hf_dir")
        if not check_quant_flags(FLAGS.precisions, FLAGS.group_size, FLAGS.calibration):
            raise UsageError(f"--add_precisions needs --precisions (one or more of "
                             f"{QUANTIZED})")
        if not os.path.isdir(FLAGS.out):
            what = "is a file" if os.path.exists(FLAGS.out) else "no such directory"
            raise UsageError(f"--out={FLAGS.out}: {what} (--add_precisions adds to an existing "
                             f"moejax checkpoint)")
        # add_precisions changes nothing until its copies are complete; the claim keeps a
        # second convert out of the checkpoint meanwhile.
        with workdir.claimed(FLAGS.out, "--out"):
            present = add_precisions(FLAGS.out, FLAGS.precisions, FLAGS.group_size,
                                     FLAGS.calibration)
        print(f"{FLAGS.out}: precisions {list(present)}")
        return
    if not FLAGS.hf_dir or not FLAGS.out:
        raise app.UsageError("--hf_dir and --out are required")
    check_quant_flags(FLAGS.precisions, FLAGS.group_size, FLAGS.calibration)
    checkpoint.check_expert_layout(FLAGS.layout, FLAGS.compression, "--layout")
    if not os.path.isdir(FLAGS.hf_dir):
        raise UsageError(f"--hf_dir={FLAGS.hf_dir}: " + ("is a file, not a directory"
                         if os.path.exists(FLAGS.hf_dir) else "no such directory"))
    if not os.path.exists(os.path.join(FLAGS.hf_dir, "config.json")):
        raise UsageError(f"--hf_dir={FLAGS.hf_dir}: has no config.json (a Hugging Face "
                         f"checkpoint directory is expected)")
    if os.path.exists(os.path.join(FLAGS.out, "config.json")):
        raise UsageError(f"--out={FLAGS.out}: holds a moejax checkpoint already; choose another "
                         f"--out, or remove it first (--add_precisions adds copies to it)")
    claim = workdir.claim(FLAGS.out, "--out")
    try:
        cfg = convert(FLAGS.hf_dir, FLAGS.out, FLAGS.dtype, FLAGS.compression,
                      FLAGS.precisions, FLAGS.group_size, FLAGS.calibration, FLAGS.layout)
    except BaseException:
        # A checkpoint without config.json is incomplete: one this run started in a
        # directory of its own goes; files in a directory that was there are left.
        claim.discard()
        raise
    claim.release()
    print(f"converted {cfg.family}: {cfg.num_layers} layers, {cfg.num_moe_layers} MoE layers x "
          f"{cfg.num_experts} experts (top-{cfg.top_k}), expert {cfg.expert_bytes} bytes, "
          f"{FLAGS.layout} layout -> {FLAGS.out}")


def run():
    """`moejax-convert` and `python -m moejax.convert`: one error path (`moejax.cli`)."""
    from moejax.cli import run_absl

    run_absl("moejax.convert", main, kept=_kept)


def _kept() -> str:
    if FLAGS.add_precisions:
        return f"{FLAGS.out} is as it was (no copy is listed until all are complete)"
    if FLAGS.out and not os.path.exists(os.path.join(FLAGS.out, "config.json")):
        left = os.path.isdir(FLAGS.out) and any(n != workdir.LOCK_NAME
                                                for n in os.listdir(FLAGS.out))
        return (f"{FLAGS.out} holds an incomplete checkpoint (no config.json)" if left
                else f"nothing written to {FLAGS.out}")
    return ""


if __name__ == "__main__":
    run()
