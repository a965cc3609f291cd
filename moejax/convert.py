"""Converts a Hugging Face safetensors MoE checkpoint into the moejax layout.

    python -m moejax.convert --hf_dir=DIR --out=OUT [--dtype=bfloat16] [--layout=zarr|packed]
        [--precisions=int8,int4,int2 [--group_size=64] [--calibration=search|int2=hqq,...]]
    python -m moejax.convert --out=OUT --add_precisions --precisions=int4   # to an existing one

`--layout=packed` stores each layer's experts as one file of page-aligned records per
precision (`moejax.checkpoint.packed`) instead of zarr3 arrays; `--add_precisions` writes in
the layout the checkpoint already has.

`--out` takes an empty or absent directory (`check_out`, before any weight is read); a
conversion that fails or is interrupted removes what it wrote. Third-party INFO logging (absl,
orbax, jax) is off unless `--verbosity` (`-v`) is given (`quiet_logs`).

Families: OLMoE, Mixtral, Qwen1.5/Qwen2-MoE, Phi-3.5-MoE (see `moejax.families`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Iterator

import numpy as np
from absl import app, flags, logging

from moejax import checkpoint, workdir
from moejax.checkpoint import (
    SafetensorsDir,
    dense_sources,
    flat_params,
    hugging_face_message,
    is_hugging_face_dir,
    read_layer_experts,
)
from moejax.cli import UsageError
from moejax.errors import CheckpointError, ConfigError
from moejax.families import config_from_hf
from moejax.model_config import DTYPES, ModelConfig
from moejax.models import abstract_decoder
from moejax.quant import CALIBRATIONS, DEFAULT_CALIBRATION, DEFAULT_GROUP_SIZE, QUANTIZED


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
    quiet_logs()
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
        if is_hugging_face_dir(FLAGS.out):
            raise UsageError(f"--out={hugging_face_message(FLAGS.out)}")
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
    if not workdir.held(FLAGS.out):  # held by a running convert: the claim below names it
        check_out(FLAGS.out, FLAGS.hf_dir)
    claim = workdir.claim(FLAGS.out, "--out")
    try:
        check_out(FLAGS.out, FLAGS.hf_dir)  # again under the lock: nothing got in meanwhile
    except BaseException:
        claim.release()
        raise
    _run["claimed"] = True  # from here on, what --out holds is this run's
    try:
        cfg = convert(FLAGS.hf_dir, FLAGS.out, FLAGS.dtype, FLAGS.compression,
                      FLAGS.precisions, FLAGS.group_size, FLAGS.calibration, FLAGS.layout)
    except BaseException:
        # A checkpoint without config.json is incomplete: what this run wrote goes. --out was
        # empty or absent (check_out, under the lock), so all of it is this run's; a
        # directory that was there stays, empty, and one this run created goes too.
        _remove_entries(FLAGS.out)
        claim.discard()
        raise
    claim.release()
    _run["converted"] = True
    print(f"converted {cfg.family}: {cfg.num_layers} layers, {cfg.num_moe_layers} MoE layers x "
          f"{cfg.num_experts} experts (top-{cfg.top_k}), expert {cfg.expert_bytes} bytes, "
          f"{FLAGS.layout} layout -> {FLAGS.out}")


def check_out(out: str, hf_dir: str) -> None:
    """Refuses, before any weight is read, an `--out` that is not an empty or absent
    directory: a UsageError, one line naming --out and what it found there (a file, the
    --hf_dir itself, a moejax checkpoint, or the first entries of a directory that is neither).
    The lock file of a claim (`workdir.LOCK_NAME`) does not count as an entry.

    An --out inside --hf_dir (e.g. `--hf_dir=m --out=m/moejax`) is taken: the new
    directory holds only this run's files, the source's files are read by name (the
    safetensors index, `writer.TOKENIZER_FILES`), never by listing the directory, so nothing
    of the source is written, replaced or read twice."""
    if os.path.lexists(out) and not os.path.isdir(out):
        what = ("is a file, not a directory" if os.path.isfile(out) else
                "is a broken symbolic link" if os.path.islink(out) else "is not a directory")
        raise UsageError(f"--out={out}: {what} (--out takes an empty or absent directory)")
    if not os.path.isdir(out):
        return  # absent: workdir.claim checks that it can be created
    if os.path.realpath(out) == os.path.realpath(hf_dir):
        raise UsageError(f"--out={out}: is the same directory as --hf_dir={hf_dir}; the "
                         f"converted checkpoint goes into a directory of its own (e.g. "
                         f"--out={hf_dir.rstrip(os.sep) or hf_dir}-moejax)")
    try:
        entries = sorted(n for n in os.listdir(out) if n != workdir.LOCK_NAME)
    except OSError as e:
        raise UsageError(f"--out={out}: cannot be listed ({e.strerror})") from None
    if not entries:
        return
    if _is_moejax_checkpoint(out):
        raise UsageError(f"--out={out}: holds a moejax checkpoint already; choose another "
                         f"--out, or remove it first (--add_precisions adds copies to it)")
    shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
    count = f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"
    raise UsageError(f"--out={out}: holds {count} ({shown}); --out takes an empty or absent "
                     f"directory")


def _is_moejax_checkpoint(path: str) -> bool:
    """Whether `path` holds a complete moejax checkpoint: a config.json that reads as one
    (`checkpoint.read_config`; the file is written last, so its presence marks completion)."""
    try:
        checkpoint.read_config(path)
    except (CheckpointError, ConfigError, OSError):
        return False
    return True


def _remove_entries(out: str) -> None:
    """Removes everything in `out` but the claim's lock file (after a failed conversion into
    a directory that was empty)."""
    try:
        names = os.listdir(out)
    except OSError:
        return
    for name in names:
        if name == workdir.LOCK_NAME:
            continue
        path = os.path.join(out, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except OSError:
                pass


def quiet_logs() -> None:
    """Keeps the INFO lines of absl, orbax and jax (about 30 per conversion: orbax's save
    steps, jax's backend probing) off stderr: the absl verbosity, which sets the root logger's
    level that jax's and orbax's loggers follow, goes to WARNING, unless the command line gave
    --verbosity (-v), which stands (`cli.parse_flags` keeps it)."""
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


def run():
    """`moejax-convert` and `python -m moejax.convert`: one error path (`moejax.cli`)."""
    from moejax.cli import run_absl

    run_absl("moejax.convert", main, kept=_kept)


# What the conversion has done so far, for `_kept` (Ctrl-C's line).
_run = {"claimed": False, "converted": False}


def _kept() -> str:
    if FLAGS.add_precisions:
        return f"{FLAGS.out} is as it was (no copy is listed until all are complete)"
    if not FLAGS.out:
        return ""
    if _run["converted"]:
        return f"{FLAGS.out} holds the converted checkpoint"
    # A failed or interrupted conversion removes what it wrote (main): anything left is what
    # could not be removed.
    left = (_run["claimed"] and os.path.isdir(FLAGS.out)
            and any(n != workdir.LOCK_NAME for n in os.listdir(FLAGS.out)))
    return (f"{FLAGS.out} holds an incomplete checkpoint (no config.json)" if left
            else f"nothing written to {FLAGS.out}")


if __name__ == "__main__":
    run()
