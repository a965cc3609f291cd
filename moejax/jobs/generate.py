"""The generate job: text in, greedy text out, `WORKDIR/results.json` with ids and timings."""

from __future__ import annotations

import contextlib
import os
import time

import jax
import ml_collections
import numpy as np

from moejax.cache import report
from moejax.config import ConfigError
from moejax.jobs.common import (
    cache_header,
    cache_of,
    configured_decoder,
    experts_precision,
    report_cache,
)
from moejax.model_source import load_model
from moejax.results import write_json_atomic
from moejax.tokenizer import parse_ids
from moejax.traces.recorder import TraceRecorder


def validate(config: ml_collections.ConfigDict) -> None:
    r = config.run
    if r.max_new_tokens < 1:
        raise ConfigError(f"run.max_new_tokens={r.max_new_tokens} must be >= 1")
    if r.batch_size < 1:
        raise ConfigError(f"run.batch_size={r.batch_size} must be >= 1")
    if not r.prompt and not r.prompt_ids:
        raise ConfigError("run.prompt and run.prompt_ids are both empty")


def _progress(enabled: bool, total: int):
    if not enabled:
        return contextlib.nullcontext(None)
    from tqdm import tqdm

    return tqdm(total=total, desc="decode", unit="tok", leave=False)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    validate(config)
    os.makedirs(workdir, exist_ok=True)
    t0 = time.perf_counter()
    loaded = load_model(config.model, config.seed)
    cfg = loaded.cfg
    load_s = time.perf_counter() - t0

    if config.run.prompt_ids:
        prompt_ids = parse_ids(config.run.prompt_ids, cfg.vocab_size)
        prompt_text = loaded.tokenizer.decode(prompt_ids)
    else:
        prompt_ids = loaded.tokenizer.encode(config.run.prompt)
        prompt_text = config.run.prompt
    if not prompt_ids:
        raise ConfigError(f"run.prompt={config.run.prompt!r} encodes to no tokens")
    max_len = len(prompt_ids) + config.run.max_new_tokens
    if max_len > cfg.max_position_embeddings:
        raise ConfigError(
            f"prompt ({len(prompt_ids)} tokens) + run.max_new_tokens ({config.run.max_new_tokens})"
            f" = {max_len} exceeds the model's max_position_embeddings ({cfg.max_position_embeddings})")
    batch = config.run.batch_size
    experts, decoder = configured_decoder(config, loaded, max_len=max_len, batch=batch)
    recorder = None
    prompt = np.tile(np.asarray(prompt_ids, np.int32)[None], (batch, 1))
    eos = cfg.eos_token_id if config.run.stop_at_eos else None

    if config.run.warmup:  # compile every step shape on a throwaway cache
        _, warmup = configured_decoder(config, loaded, max_len=max_len, batch=batch)
        warmup.generate(prompt, min(2, config.run.max_new_tokens))
        del warmup  # nothing keeps it (or its KV caches) alive after this

    if config.tracing.record:  # attached after warm-up, so the trace holds the timed run only
        recorder = TraceRecorder(cfg, config.model.lookahead, loaded.source,
                                 {"prompt": prompt_text})
        decoder.gate_observers.append(recorder.on_gate)
        decoder.pass_observers.append(recorder.end_pass)

    profile_dir = os.path.join(workdir, "profile")
    tracing = (jax.profiler.trace(profile_dir) if config.profile.enabled
               else contextlib.nullcontext())
    cache = cache_of(experts)
    if config.profile.enabled:
        decoder.annotate = jax.profiler.TraceAnnotation
        if cache is not None:
            cache.annotate = jax.profiler.TraceAnnotation
    with tracing, _progress(config.log.progress, config.run.max_new_tokens) as bar:
        gen = decoder.generate(prompt, config.run.max_new_tokens, eos_id=eos,
                               on_token=(lambda _: bar.update(1)) if bar is not None else None)
    generated = gen.generated_ids[0]
    text = loaded.tokenizer.decode(generated)
    n_decode = max(0, len(generated) - 1)  # the first token comes from prefill
    results = {
        "job": "generate",
        "model": {"source": loaded.source, "family": cfg.family, "config": cfg.to_dict(),
                  "precision": experts_precision(config, experts)},
        "tokenizer": loaded.tokenizer.name,
        "prompt": prompt_text,
        "prompt_ids": prompt_ids,
        "generated_token_ids": generated,
        "generated_text": text,
        "timings": {
            "load_s": load_s,
            "ttft_s": gen.prefill_s,
            "decode_s": gen.decode_s,
            "decode_tok_per_s": (n_decode / gen.decode_s) if gen.decode_s > 0 else None,
        },
        "config": config.to_dict(),
    }
    if cache is not None:
        results["cache"] = report_cache(config, cache, workdir)
        results["timings"]["cache_clock"] = cache.metrics.timing()
    if config.profile.enabled:
        results["profile_dir"] = profile_dir
    if recorder is not None:
        results["trace"] = os.path.join(workdir, "trace.npz")
        recorder.trace().save(results["trace"])
    write_json_atomic(os.path.join(workdir, "results.json"), results)
    print(f"{prompt_text}{text}")
    if cache is not None:
        print(report.table(cache.metrics, cache_header(config, cache)))
    print(f"[{cfg.family} from {loaded.source}] {len(generated)} tokens, "
          f"TTFT {gen.prefill_s * 1e3:.1f} ms, "
          f"decode {results['timings']['decode_tok_per_s'] or 0:.1f} tok/s -> "
          f"{os.path.join(workdir, 'results.json')}")
    return results
