"""The perplexity job: bits per byte (and per token) of a model on a text file.

Runs through the same layer-stepped decoder and `ExpertSource` as generation, so the quality
cost of a cache configuration is measured by the same code. Prints a progress bar over the
scored tokens (`log.progress`), the cache's table as generate prints it, the score, and where
the results went. A file that is mostly not text (`common.check_text_file`) is refused.

Two phases on this machine's wall clock (results.json `timings`, `clock: "wall"`): first each
distinct window length runs once, untimed and unscored (`compile_steps`: its XLA compiles, on a
throwaway cache so the scored run's cache starts as cold as it would have), then the scored
pass, whose time alone gives the tokens per second. An XLA compile that still falls inside the
scored pass (a shape the first phase did not meet) is counted from jax's own events and said.
"""

from __future__ import annotations

import math
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from moejax.cache import WALL_CLOCK
from moejax.errors import ConfigError
from moejax.jobs.cache_report import announce_results, cache_table, progress, report_cache
from moejax.jobs.common import (
    cache_of,
    check_text_file,
    check_windows,
    configured_decoder,
    experts_precision,
    scored_bytes,
    xla_compiles,
)
from moejax.jobs.specs import resolve
from moejax.model_source import LoadedModel, load_model_for
from moejax.models import SteppedDecoder
from moejax.results import write_json_atomic
from moejax.run_spec import RunSpec
from moejax.seam import ExpertSource


def validate(config: ml_collections.ConfigDict) -> None:
    p = config.perplexity
    if not p.text_file:
        raise ConfigError("perplexity.text_file is empty: pass "
                          "--config.perplexity.text_file=PATH")
    if not os.path.isfile(p.text_file):
        raise ConfigError(f"perplexity.text_file={p.text_file!r} is not a file")
    check_windows("perplexity", p.window, p.stride, p.max_tokens)
    check_text_file(p.text_file, "perplexity.text_file")


@jax.jit
def _nll(logits: jax.Array, targets: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits[0], axis=-1)
    return -jnp.take_along_axis(logp, targets[:, None], axis=-1)[:, 0]


def windows(n: int, window: int, stride: int) -> list[tuple[int, int]]:
    """The windows `[s, e)` that score tokens 1..n-1 of `n` (`score`)."""
    starts = list(range(0, max(1, n - window + 1), stride))
    if starts[-1] + window < n:
        starts.append(n - window)
    return [(s, min(n, s + window)) for s in starts]


def score(decoder: SteppedDecoder, ids: np.ndarray, window: int, stride: int,
          on_scored=None) -> np.ndarray:
    """Negative log-likelihood (nats) of tokens 1..n-1, each scored once: window k covers
    [s, s+window) and scores the tokens no earlier window scored. `on_scored(n)`: after each
    window, with the tokens it scored (a progress bar's update)."""
    n = len(ids)
    nll = np.full(n, np.nan)
    scored_to = 1  # next unscored position
    for s, e in windows(n, window, stride):
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


def compile_steps(run: RunSpec, loaded: LoadedModel, experts: ExpertSource,
                  decoder: SteppedDecoder, ids: np.ndarray, window: int, stride: int) -> int:
    """Runs the first window of each distinct length once, scored by nobody: the XLA compiles
    of its steps, before the scored pass is timed. Through a cache, on a throwaway cache and
    decoder (the scored run's cache must start cold and count only the scored pass); with every
    expert resident, on `decoder` itself (no state outlives `reset`, and a second copy of every
    expert could not fit where one barely does). Returns the windows run."""
    if cache_of(experts) is not None:
        _, decoder = configured_decoder(run, loaded, max_len=window)
    lengths = {}
    for s, e in windows(len(ids), window, stride):
        lengths.setdefault(e - s, (s, e))
    for s, e in lengths.values():
        decoder.reset()
        chunk = ids[s:e]
        logits = decoder.forward(chunk[None])
        np.asarray(_nll(logits[:, :-1], jnp.asarray(chunk[1:])))
    decoder.reset()
    return len(lengths)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    validate(config)
    spec = resolve(config)
    os.makedirs(workdir, exist_ok=True)
    loaded = load_model_for(spec)
    p = config.perplexity
    with open(p.text_file, encoding="utf-8", errors="replace") as f:
        text = f.read()
    ids = np.asarray(loaded.tokenizer.encode(text), np.int32)
    if p.max_tokens:
        ids = ids[: p.max_tokens]
    if len(ids) < 2:
        raise ConfigError(f"perplexity.text_file={p.text_file!r} has fewer than 2 tokens")
    window = min(p.window, len(ids), loaded.cfg.max_position_embeddings)
    stride = min(p.stride, window - 1)
    # Under the configured cache: drop, substitution and cache-aware routing change quality.
    experts, decoder = configured_decoder(spec, loaded, max_len=window)
    where = " on a throwaway cache" if cache_of(experts) is not None else ""
    print(f"perplexity: compiling its steps (one untimed, unscored window of {window} tokens"
          f"{where}) ...", end=" ", flush=True)
    t0 = time.perf_counter()
    compile_steps(spec, loaded, experts, decoder, ids, window, stride)
    compile_s = time.perf_counter() - t0
    print(f"done in {compile_s:.1f} s, {WALL_CLOCK}", flush=True)
    with xla_compiles() as late, \
            progress(config.log.progress, len(ids) - 1, "perplexity") as bar:
        t0 = time.perf_counter()
        nll = score(decoder, ids, window, stride, bar.update if bar is not None else None)
        score_s = time.perf_counter() - t0
    bits = float(nll.sum() / math.log(2))
    # Bytes of the scored tokens: everything after the first token.
    n_bytes = scored_bytes(loaded.tokenizer, ids)
    results = {
        "job": "perplexity",
        "model": {"source": loaded.source, "family": loaded.cfg.family,
                  "precision": experts_precision(spec, experts)},
        "tokenizer": loaded.tokenizer.name,
        "text_file": os.path.abspath(p.text_file),
        "tokens_scored": int(len(nll)),
        "bytes_scored": int(n_bytes),
        "bits_per_byte": bits / n_bytes,
        "bits_per_token": bits / len(nll),
        "window": window, "stride": stride,
        "timings": {
            "clock": "wall",
            # The untimed first phase: each distinct window length run once (its compiles).
            "compile_s": compile_s,
            # The scored pass alone, and its rate: tokens_scored / score_s.
            "score_s": score_s,
            "tokens_per_s": len(nll) / score_s if score_s > 0 else None,
            # XLA compiles inside the scored pass all the same (jax's events): 0 when the
            # first phase met every shape.
            "xla_compiles_in_score": late.count,
            "xla_compile_in_score_s": late.seconds,
        },
        "config": config.to_dict(),
    }
    cache = cache_of(experts)
    if cache is not None:
        results["cache"] = report_cache(config, cache, workdir, passes=False)
    path = os.path.join(workdir, "results.json")
    write_json_atomic(path, results)
    if cache is not None:
        print(cache_table(config, cache))
    print(f"{p.text_file}: {results['bits_per_byte']:.4f} bits/byte, "
          f"{results['bits_per_token']:.4f} bits/token over {len(nll)} tokens "
          f"[{loaded.source}, experts at {results['model']['precision']}]; {WALL_CLOCK}: "
          f"{rate_words(results['timings'], len(nll))}")
    announce_results(path)
    return results


def rate_words(t: dict, tokens: int) -> str:
    """The scored pass's time and rate (results.json `timings`), the compile phase apart, and
    any compile that fell inside the scored pass all the same."""
    rate = f"{t['tokens_per_s']:.1f} tok/s" if t["tokens_per_s"] else "too fast to time"
    if t["xla_compiles_in_score"]:
        inside = (f"including {t['xla_compiles_in_score']} XLA compiles "
                  f"({t['xla_compile_in_score_s']:.1f} s) of shapes the compile phase did "
                  "not meet")
    else:
        inside = "no XLA compile inside"
    return (f"scored in {t['score_s']:.2f} s ({tokens} tokens, {rate}; {inside}), after "
            f"{t['compile_s']:.1f} s compiling (untimed, apart)")
