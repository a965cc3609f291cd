"""The training loop: optax AdamW, Orbax checkpoints every `train.checkpoint_every` steps
(resumed from the latest on restart), TensorBoard scalars, and an export of the final model in
the moejax checkpoint layout (the embedded default model ships from that export). Its config
is the schema's `train` section (`moejax/jobs/schema.py`; configs/train_small.py)."""

from __future__ import annotations

import dataclasses
import os
import time

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import logging
from flax import nnx

from moejax import checkpoint
from moejax.checkpoint import flat_params
from moejax.errors import ConfigError
from moejax.families import get_family
from moejax.metrics_writer import MetricsWriter
from moejax.models import MoEDecoder
from moejax.results import write_json_atomic
from moejax.train import corpus
from moejax.train.model import TrainableMoE, loss_fn


def model_config(config: ml_collections.ConfigDict):
    m = config.train.model
    hf = dict(model_type="olmoe", vocab_size=256, hidden_size=m.hidden_size,
              intermediate_size=m.expert_intermediate_size, num_hidden_layers=m.num_layers,
              num_attention_heads=m.num_heads, num_key_value_heads=m.num_kv_heads,
              num_experts=m.num_experts, num_experts_per_tok=m.top_k,
              max_position_embeddings=m.max_position_embeddings, dtype="float32",
              rope_parameters=dict(rope_type="default", rope_theta=10000.0))
    return get_family("olmoe").config_from_hf(hf)


def validate(config: ml_collections.ConfigDict) -> None:
    t, m = config.train, config.train.model
    checks = [
        (t.steps > 0, f"train.steps={t.steps} must be positive"),
        (t.batch_size > 0, f"train.batch_size={t.batch_size} must be positive"),
        (0 < t.seq_len <= m.max_position_embeddings,
         f"train.seq_len={t.seq_len} must be in 1..train.model.max_position_embeddings="
         f"{m.max_position_embeddings}"),
        (t.learning_rate > 0, f"train.learning_rate={t.learning_rate} must be positive"),
        (0 <= t.warmup_steps < t.steps, f"train.warmup_steps={t.warmup_steps} must be in "
                                        f"0..train.steps-1={t.steps - 1}"),
        (t.export_dtype in ("float32", "bfloat16"),
         f"train.export_dtype={t.export_dtype!r} must be float32 or bfloat16"),
    ]
    for field in ("log_every", "eval_every", "eval_batches", "checkpoint_every"):
        checks.append((t[field] > 0, f"train.{field}={t[field]} must be positive"))
    for ok, msg in checks:
        if not ok:
            raise ConfigError(msg)


def _schedule(t: ml_collections.ConfigDict):
    return optax.warmup_cosine_decay_schedule(
        0.0, t.learning_rate, t.warmup_steps, t.steps, end_value=t.learning_rate * t.final_lr_frac)


def evaluate(model: TrainableMoE, heldout: dict[str, corpus.Split], seq_len: int, batches: int,
             batch_size: int, seed: int = 1234) -> dict[str, float]:
    """Held-out bits per byte per domain, on fixed windows (same windows every evaluation)."""
    out = {}
    eval_step = nnx.jit(lambda mdl, b: loss_fn(mdl, b, 0.0, 0.0)[1]["loss/bits_per_byte"])
    for domain, split in heldout.items():
        rng = np.random.default_rng(seed)
        vals = []
        for _ in range(batches):
            rows = np.stack([split.data[s:s + seq_len + 1] for s in
                             rng.integers(0, len(split.data) - seq_len - 1, batch_size)])
            vals.append(float(eval_step(model, jnp.asarray(rows, jnp.int32))))
        out[f"eval/{domain}_bits_per_byte"] = float(np.mean(vals))
    return out


def export(model: TrainableMoE, out: str, dtype: str, compression: str | None = None) -> None:
    """Writes the model in the moejax checkpoint layout at `dtype`."""
    cfg = dataclasses.replace(model.cfg, dtype=dtype)
    target = np.dtype(dtype) if dtype != "bfloat16" else jnp.bfloat16
    params = {k: np.asarray(v).astype(target) for k, v in flat_params(model.decoder).items()}
    gate_up, down = np.asarray(model.gate_up[...]), np.asarray(model.down[...])
    experts = ((l, gate_up[i].astype(target), down[i].astype(target))
               for i, l in enumerate(cfg.moe_layers))
    checkpoint.save(out, cfg, params, experts, compression=compression)


def _train_state(model: TrainableMoE, optimizer: nnx.Optimizer) -> dict:
    # The optimizer does not own the model (flax >= 0.11): save both.
    return {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}


def train(config: ml_collections.ConfigDict, workdir: str) -> dict:
    validate(config)
    t = config.train
    cfg = model_config(config)
    os.makedirs(workdir, exist_ok=True)
    gsm8k = t.gsm8k_path or corpus.DEFAULT_GSM8K
    train_splits = corpus.load_splits(False, gsm8k)
    heldout = corpus.load_splits(True, gsm8k)

    model = TrainableMoE(cfg, nnx.Rngs(config.seed))
    tx = optax.chain(optax.clip_by_global_norm(t.grad_clip),
                     optax.adamw(_schedule(t), b1=0.9, b2=0.95, weight_decay=t.weight_decay))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    manager = ocp.CheckpointManager(
        os.path.abspath(os.path.join(workdir, "checkpoints")),
        options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True))
    start = 0
    if manager.latest_step() is not None:
        start = manager.latest_step()
        restored = manager.restore(start, args=ocp.args.StandardRestore(_train_state(model, optimizer)))
        nnx.update(model, restored["model"])
        nnx.update(optimizer, restored["optimizer"])
        logging.info("resumed from step %d", start)
        print(f"resuming from step {start}")

    @nnx.jit
    def train_step(model, optimizer, batch):
        (_, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(
            model, batch, t.aux_loss_coef, t.z_loss_coef)
        optimizer.update(model, grads)
        return metrics

    writer = MetricsWriter(workdir)
    t0, tokens = time.perf_counter(), 0
    metrics = {}
    for step in range(start + 1, t.steps + 1):
        rng = np.random.default_rng([config.seed, step])  # resumable: data depends on step only
        batch = jnp.asarray(corpus.sample_batch(train_splits, t.batch_size, t.seq_len, rng))
        metrics = train_step(model, optimizer, batch)
        tokens += t.batch_size * t.seq_len
        if step % t.log_every == 0 or step == t.steps:
            scalars = {k: float(v) for k, v in metrics.items()}
            scalars["train/learning_rate"] = float(_schedule(t)(step))
            scalars["perf/tokens_per_s"] = tokens / (time.perf_counter() - t0)
            writer.scalars(step, scalars)
            print(f"step {step}/{t.steps} bpb {scalars['loss/bits_per_byte']:.3f} "
                  f"lb {scalars['loss/load_balance']:.3f} "
                  f"{scalars['perf/tokens_per_s']:.0f} tok/s", flush=True)
        if step % t.eval_every == 0 or step == t.steps:
            scores = evaluate(model, heldout, t.seq_len, t.eval_batches, t.batch_size)
            writer.scalars(step, scores)
            print("  " + " ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in scores.items()),
                  flush=True)
        if step % t.checkpoint_every == 0 or step == t.steps:
            manager.save(step, args=ocp.args.StandardSave(_train_state(model, optimizer)))
    manager.wait_until_finished()
    writer.close()

    final = evaluate(model, heldout, t.seq_len, t.eval_batches, t.batch_size)
    export_dir = os.path.join(workdir, "export")
    export(model, export_dir, t.export_dtype, t.export_compression or None)
    unigram = {d: corpus.unigram_bits_per_byte(train_splits[d].data, heldout[d].data)
               for d in corpus.DOMAINS}
    results = {"job": "train", "steps": t.steps, "model": cfg.to_dict(), "heldout": final,
               "unigram_bits_per_byte": unigram, "export": export_dir,
               "train_seconds_this_run": time.perf_counter() - t0,
               "last_train_metrics": {k: float(v) for k, v in metrics.items()}}
    write_json_atomic(os.path.join(workdir, "results.json"), results)
    print(f"done: held-out {final}; unigram {unigram}; exported to {export_dir}")
    return results


__all__ = ["train", "export", "evaluate", "model_config", "MoEDecoder"]
