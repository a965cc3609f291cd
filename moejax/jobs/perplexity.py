"""The perplexity job: bits per byte (and per token) of a model on a text file.

Runs through the same layer-stepped decoder and `ExpertSource` as generation, so the quality
cost of a cache configuration is measured by the same code. Prints a progress bar over the
scored tokens (`log.progress`), the cache's table as generate prints it, the score, and where
the results went. A file that is mostly not text (`common.check_text_file`) is refused.
"""

from __future__ import annotations

import math
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from moejax.cache.summary import WALL_CLOCK
from moejax.errors import ConfigError
from moejax.jobs.common import (
    announce_results,
    cache_of,
    cache_table,
    check_text_file,
    configured_decoder,
    experts_precision,
    progress,
    report_cache,
    scored_bytes,
)
from moejax.model_source import load_model_for
from moejax.models.stepped import SteppedDecoder
from moejax.results import write_json_atomic


def validate(config: ml_collections.ConfigDict) -> None:
    e = config.eval
    if not config.text_file:
        raise ConfigError("text_file is empty: pass --config.text_file=PATH")
    if not os.path.isfile(config.text_file):
        raise ConfigError(f"text_file={config.text_file!r} is not a file")
    if e.window < 2:
        raise ConfigError(f"eval.window={e.window} must be >= 2")
    if not 1 <= e.stride <= e.window - 1:
        raise ConfigError(f"eval.stride={e.stride} must be in 1..eval.window-1={e.window - 1}")
    if e.max_tokens < 0:
        raise ConfigError(f"eval.max_tokens={e.max_tokens} must be >= 0")
    check_text_file(config.text_file)


@jax.jit
def _nll(logits: jax.Array, targets: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits[0], axis=-1)
    return -jnp.take_along_axis(logp, targets[:, None], axis=-1)[:, 0]


def score(decoder: SteppedDecoder, ids: np.ndarray, window: int, stride: int,
          on_scored=None) -> np.ndarray:
    """Negative log-likelihood (nats) of tokens 1..n-1, each scored once: window k covers
    [s, s+window) and scores the tokens no earlier window scored. `on_scored(n)`: after each
    window, with the tokens it scored (a progress bar's update)."""
    n = len(ids)
    nll = np.full(n, np.nan)
    starts = list(range(0, max(1, n - window + 1), stride))
    if starts[-1] + window < n:
        starts.append(n - window)
    scored_to = 1  # next unscored position
    for s in starts:
        e = min(n, s + window)
        decoder.reset()
        chunk = ids[s:e]
        logits = decoder.forward(chunk[None])
        values = np.asarray(_nll(logits[:, :-1], jnp.asarray(chunk[1:])))
        first = max(scored_to, s + 1)
        nll[first:e] = values[first - s - 1:]
        scored_to = e
        if on_scored is not None:
            on_scored(e - first)
    return nll[1:]


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    validate(config)
    os.makedirs(workdir, exist_ok=True)
    loaded = load_model_for(config)
    with open(config.text_file, encoding="utf-8", errors="replace") as f:
        text = f.read()
    ids = np.asarray(loaded.tokenizer.encode(text), np.int32)
    if config.eval.max_tokens:
        ids = ids[: config.eval.max_tokens]
    if len(ids) < 2:
        raise ConfigError(f"text_file={config.text_file!r} has fewer than 2 tokens")
    window = min(config.eval.window, len(ids), loaded.cfg.max_position_embeddings)
    stride = min(config.eval.stride, window - 1)
    # Under the configured cache: drop, substitution and cache-aware routing change quality.
    experts, decoder = configured_decoder(config, loaded, max_len=window)
    t0 = time.perf_counter()
    with progress(config.log.progress, len(ids) - 1, "perplexity") as bar:
        nll = score(decoder, ids, window, stride, bar.update if bar is not None else None)
    elapsed = time.perf_counter() - t0
    bits = float(nll.sum() / math.log(2))
    # Bytes of the scored tokens: everything after the first token.
    n_bytes = scored_bytes(loaded.tokenizer, ids)
    results = {
        "job": "perplexity",
        "model": {"source": loaded.source, "family": loaded.cfg.family,
                  "precision": experts_precision(config, experts)},
        "tokenizer": loaded.tokenizer.name,
        "text_file": os.path.abspath(config.text_file),
        "tokens_scored": int(len(nll)),
        "bytes_scored": int(n_bytes),
        "bits_per_byte": bits / n_bytes,
        "bits_per_token": bits / len(nll),
        "window": window, "stride": stride,
        "eval_s": elapsed,
        "config": config.to_dict(),
    }
    cache = cache_of(experts)
    if cache is not None:
        results["cache"] = report_cache(config, cache, workdir, passes=False)
    path = os.path.join(workdir, "results.json")
    write_json_atomic(path, results)
    if cache is not None:
        print(cache_table(config, cache))
    print(f"{config.text_file}: {results['bits_per_byte']:.4f} bits/byte, "
          f"{results['bits_per_token']:.4f} bits/token over {len(nll)} tokens "
          f"[{loaded.source}, experts at {results['model']['precision']}]; {WALL_CLOCK}: "
          f"scored in {elapsed:.1f} s ({len(nll) / elapsed if elapsed > 0 else 0:.1f} tok/s)")
    announce_results(path)
    return results
