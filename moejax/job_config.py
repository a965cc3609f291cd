"""The one declared shape of every job config (ml_collections). Config files in `configs/`
start from `base_config()` and override fields; a field not declared here is an error, so a
typo such as `--config.run.max_new_token=8` fails instead of being ignored."""

from __future__ import annotations

import ml_collections

JOBS = ("generate", "perplexity", "record_traces")


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.job = "generate"
    c.seed = 0

    c.model = ml_collections.ConfigDict()
    c.model.checkpoint = ""  # a converted moejax checkpoint directory
    # Without a checkpoint: "embedded" is the small MoE moejax trained and ships (OLMoE family,
    # byte-level); any other name is a preset of `family` with random weights drawn from `seed`.
    c.model.preset = "embedded"
    c.model.family = "olmoe"
    c.model.gmm_impl = "tiled"  # grouped matmul: "tiled" or "ragged_dot"
    c.model.lookahead = 1  # MoE layers ahead whose gates score this layer's hidden state

    c.run = ml_collections.ConfigDict()
    c.run.prompt = "The expert cache"
    # Comma-separated token ids, used instead of `prompt` when set (checkpoints without a
    # tokenizer, or exact prompts for comparisons).
    c.run.prompt_ids = ""
    c.run.max_new_tokens = 32
    c.run.batch_size = 1
    c.run.stop_at_eos = True
    # Run the prefill and one decode step once before the timed run, so TTFT and tok/s measure
    # execution rather than XLA compilation.
    c.run.warmup = True

    c.log = ml_collections.ConfigDict()
    c.log.progress = True  # a progress bar over decode steps

    # The perplexity job: bits per byte of the model on `text_file`, in windows of `eval.window`
    # tokens advanced by `eval.stride` (each token scored once, with >= window-stride context).
    c.text_file = ""
    c.eval = ml_collections.ConfigDict()
    c.eval.window = 256
    c.eval.stride = 128
    c.eval.max_tokens = 0  # score at most this many tokens of the file (0: all)

    # Routing traces (moejax/traces/format.py). `record` makes the generate job write
    # WORKDIR/trace.npz; the record_traces job writes one trace per held-out prompt and domain.
    c.trace = ml_collections.ConfigDict()
    c.trace.record = False
    c.trace.prompts_per_domain = 2
    c.trace.prompt_tokens = 64
    c.trace.teacher_forced = True  # decode steps consume the held-out text, not the argmax

    c.profile = ml_collections.ConfigDict()
    c.profile.enabled = False
    return c
