"""The quality job: what a cache configuration costs the model's output.

Two decoders of the same model run side by side in one process: the **reference** (every
expert resident at native precision) and the **configured** expert source (the cache with its
policies, or every expert resident at `cache.precision` when `cache.enabled` is False). They
see the same tokens:

1. **Greedy drift** (first, on the cold cache, served as the generate job serves a request:
   the prompt as one prefill, then greedy decode steps): `quality.drift_prompts` prompts
   spread over the text (a task's inputs), each continued `quality.drift_new_tokens` tokens by
   both. The cache's clock over these requests is the configuration's speed (`speed`).
2. **Teacher forcing**: the text (or each task example's inputs + targets) in segments of
   `quality.segment_tokens`, each a fresh sequence, every token after a segment's first scored
   by both: KL(reference ‖ cached), top-1 agreement, and bits per byte of each
   (`moejax/quality/token_comparison.py`). `teacher_forcing="decode"` feeds one token per forward,
   as a served model consumes generated tokens (the cache sees the traffic of decoding);
   `"prefill"` feeds a segment in one forward (faster; the cache sees prefill traffic, with
   layers served in waves). Either way standard routing + plain fetch at native precision
   gives KL exactly 0 and agreement 1 at every capacity (DESIGN.md invariant 1: the cached
   model's logits are the resident model's bit for bit, waves included).

results.json: `quality` (summary and `drift`), `speed` (cache clock on the drift requests),
`cache` (the whole run), per-token values in `quality_tokens.npz`.
"""

from __future__ import annotations

import os
import time

import jax.numpy as jnp
import ml_collections
import numpy as np

from moejax.cache import summary
from moejax.errors import ConfigError
from moejax.jobs.cache_report import announce_results, cache_table, progress, report_cache, settle
from moejax.jobs.common import (
    cache_of,
    check_text_file,
    configured_decoder,
    experts_precision,
    make_decoder,
    scored_bytes,
)
from moejax.jobs.specs import resolve
from moejax.metrics_writer import MetricsWriter
from moejax.model_source import LoadedModel, load_model_for
from moejax.models import ResidentExperts, SteppedDecoder
from moejax.quality import drift as drift_lib
from moejax.quality import token_comparison
from moejax.results import write_json_atomic

TEACHER_FORCING = ("decode", "prefill")


def validate(config: ml_collections.ConfigDict) -> None:
    q = config.quality
    if bool(q.text_file) == bool(config.eval.task):
        raise ConfigError("give one text: --config.quality.text_file=PATH or "
                          "--config.eval.task=NAME (quality.text_file="
                          f"{q.text_file!r}, eval.task={config.eval.task!r})")
    if q.text_file and not os.path.isfile(q.text_file):
        raise ConfigError(f"quality.text_file={q.text_file!r} is not a file")
    if q.text_file:
        check_text_file(q.text_file, "quality.text_file")
    if q.teacher_forcing not in TEACHER_FORCING:
        raise ConfigError(f"quality.teacher_forcing={q.teacher_forcing!r} is not one of "
                          f"{TEACHER_FORCING}")
    if q.segment_tokens < 2:
        raise ConfigError(f"quality.segment_tokens={q.segment_tokens} must be >= 2 (a "
                          "segment's first token is context only)")
    for field in ("max_tokens", "drift_prompts"):
        if q[field] < 0:
            raise ConfigError(f"quality.{field}={q[field]} must be >= 0")
    for field in ("drift_prompt_tokens", "drift_new_tokens"):
        if q[field] < 1:
            raise ConfigError(f"quality.{field}={q[field]} must be >= 1")
    if config.eval.max_examples < 0:
        raise ConfigError(f"eval.max_examples={config.eval.max_examples} must be >= 0")


# -- the texts -------------------------------------------------------------------------------
def _sequences(config: ml_collections.ConfigDict, loaded: LoadedModel
               ) -> tuple[list[np.ndarray], list[np.ndarray], dict]:
    """(sequences to teacher-force, drift prompts, the source's description). A text file is
    one sequence, its drift prompts `drift_prompt_tokens`-token windows spread over it; a
    task's examples are one sequence each (inputs + targets) and their inputs the prompts.
    `quality.max_tokens` caps the tokens taken in all."""
    q, tok = config.quality, loaded.tokenizer
    limit = q.max_tokens or None
    if q.text_file:
        with open(q.text_file, encoding="utf-8", errors="replace") as f:
            ids = np.asarray(tok.encode(f.read()), np.int32)[:limit]
        if len(ids) < 2:
            raise ConfigError(f"quality.text_file={q.text_file!r} has fewer than 2 tokens")
        p = min(q.drift_prompt_tokens, len(ids))
        starts = np.linspace(0, len(ids) - p, num=q.drift_prompts).astype(int) \
            if q.drift_prompts else []
        prompts = [ids[s:s + p] for s in sorted(set(int(s) for s in starts))]
        return [ids], prompts, {"text_file": os.path.abspath(q.text_file)}
    from moejax.eval.data import load_examples  # the plain reader: no seqio needed here

    e = config.eval
    examples = load_examples(e.task, data_file=e.data_file, max_examples=e.max_examples,
                             input_field=e.input_field, target_field=e.target_field)
    sequences, prompts, left = [], [], limit
    for ex in examples:
        if left is None or left > 0:
            ids = np.asarray(tok.encode(ex.inputs + ex.targets), np.int32)[:left]
            if len(ids) >= 2:
                sequences.append(ids)
            left = None if left is None else left - len(ids)
        if len(prompts) < q.drift_prompts:  # each example's inputs (its last tokens)
            inputs = np.asarray(tok.encode(ex.inputs), np.int32)
            if len(inputs):
                prompts.append(inputs[-q.drift_prompt_tokens:])
        if left is not None and left <= 0 and len(prompts) >= q.drift_prompts:
            break
    if not sequences:
        raise ConfigError(f"eval.task={config.eval.task!r} gave no example of >= 2 tokens")
    return sequences, prompts, {"task": config.eval.task, "examples": len(sequences)}


def _segments(sequences: list[np.ndarray], length: int) -> list[np.ndarray]:
    """Consecutive segments of at most `length` tokens (each scored from its second token);
    a trailing piece of one token has nothing to score and is left out."""
    out = []
    for ids in sequences:
        out += [ids[s:s + length] for s in range(0, len(ids), length) if len(ids) - s >= 2]
    return out


# -- running both models ---------------------------------------------------------------------
def _teacher_forced_logits(decoder: SteppedDecoder, segment: np.ndarray, mode: str):
    """Logits `[len-1, V]` predicting tokens 1.. of `segment`, from a fresh sequence."""
    decoder.reset()
    if mode == "prefill":
        return decoder.forward(segment[None, :-1])[0]
    return jnp.concatenate([decoder.forward(segment[None, i:i + 1])[0]
                            for i in range(len(segment) - 1)])


def greedy_drift(reference: SteppedDecoder, cached: SteppedDecoder, prompts: list[np.ndarray],
                 new_tokens: int) -> tuple[list[list[int]], list[list[int]]]:
    """Each prompt continued greedily by both (a fresh sequence each: the prompt as one
    prefill, then decode steps, as a request is served); (reference's, cached's)."""
    ref_out, cached_out = [], []
    for prompt in prompts:
        cached_out.append(cached.generate(prompt[None], new_tokens).generated_ids[0])
        ref_out.append(reference.generate(prompt[None], new_tokens).generated_ids[0])
    return ref_out, cached_out


def teacher_forced(reference: SteppedDecoder, cached: SteppedDecoder,
                   segments: list[np.ndarray], mode: str, on_segment=None
                   ) -> tuple[token_comparison.TokenComparison, np.ndarray]:
    """Every segment through both from a fresh sequence; the per-token comparison of tokens
    1.. of each, and the segment index of each scored token."""
    parts, segment_of = [], []
    for i, seg in enumerate(segments):
        parts.append(token_comparison.compare(_teacher_forced_logits(reference, seg, mode),
                                     _teacher_forced_logits(cached, seg, mode), seg[1:]))
        segment_of.append(np.full(len(seg) - 1, i, np.int32))
        if on_segment is not None:
            on_segment(len(seg) - 1)
    return (token_comparison.concat(parts),
            np.concatenate(segment_of) if segment_of else np.zeros(0, np.int32))


def _speed(cache) -> dict | None:
    """The cache clock over the drift requests (prefill + greedy decode, served)."""
    if cache is None:
        return None
    t = settle(cache).metrics.timing()
    return {"ttft_s": t["ttft_s"], "cold_ttft_s": t["cold_ttft_s"],
            "warm_ttft_s": t["warm_ttft_s"], "ttft_per_request_s": t["ttft_per_request_s"],
            "decode_tok_per_s": t["decode_tok_per_s"],
            "stall_s": t["prefill_stall_s"] + t["decode_stall_s"], "clock": cache.clock.kind}


def _save_tokens(path: str, tokens: token_comparison.TokenComparison,
                 segment_of: np.ndarray) -> None:
    tmp = path + ".tmp.npz"
    np.savez(tmp, targets=tokens.targets, kl=tokens.kl, agree=tokens.agree,
             nll_reference=tokens.nll_reference, nll_cached=tokens.nll_cached,
             segment=segment_of)
    os.replace(tmp, path)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    validate(config)
    os.makedirs(workdir, exist_ok=True)
    q = config.quality
    spec = resolve(config)
    loaded = load_model_for(spec)
    cfg = loaded.cfg
    sequences, prompts, source = _sequences(config, loaded)
    max_pos = cfg.max_position_embeddings
    segment_tokens = min(q.segment_tokens, max_pos)
    if prompts and q.drift_prompt_tokens + q.drift_new_tokens > max_pos:
        raise ConfigError(f"quality.drift_prompt_tokens ({q.drift_prompt_tokens}) + "
                          f"quality.drift_new_tokens ({q.drift_new_tokens}) exceeds the "
                          f"model's max_position_embeddings ({max_pos})")
    max_len = max(segment_tokens, max((len(p) for p in prompts), default=0) + q.drift_new_tokens)
    segments = _segments(sequences, segment_tokens)

    reference = make_decoder(spec, loaded,
                             ResidentExperts.from_host(*loaded.experts_at("native")),
                             max_len=max_len)
    experts, cached = configured_decoder(spec, loaded, max_len=max_len)
    cache = cache_of(experts)

    t0 = time.perf_counter()
    # The cold cache first: the drift requests are the configuration's speed measure.
    ref_out, cached_out = greedy_drift(reference, cached, prompts, q.drift_new_tokens)
    speed = _speed(cache)
    drift_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    with progress(config.log.progress, sum(len(s) - 1 for s in segments), "quality") as bar:
        tokens, segment_of = teacher_forced(reference, cached, segments, q.teacher_forcing,
                                            bar.update if bar is not None else None)
    teacher_s = time.perf_counter() - t0

    token_summary = token_comparison.summary(tokens, sum(scored_bytes(loaded.tokenizer, s)
                                                for s in segments))
    quality = {
        **token_summary,
        "teacher_forcing": q.teacher_forcing,
        "segments": len(segments),
        "segment_tokens": segment_tokens,
        "drift": drift_lib.summary(ref_out, cached_out, [len(p) for p in prompts],
                                   q.drift_new_tokens),
        "reference": {"experts": "resident", "precision": "native"},
        "per_token": "quality_tokens.npz",
    }
    if prompts:
        quality["drift"]["continuations"] = [
            {"prompt": loaded.tokenizer.decode(p.tolist()),
             "reference": loaded.tokenizer.decode(r), "cached": loaded.tokenizer.decode(c)}
            for p, r, c in zip(prompts, ref_out, cached_out)]
    _save_tokens(os.path.join(workdir, "quality_tokens.npz"), tokens, segment_of)
    results = {
        "job": "quality",
        "model": {"source": loaded.source, "family": cfg.family,
                  "precision": experts_precision(spec, experts)},
        "tokenizer": loaded.tokenizer.name,
        **source,
        "quality": quality,
        "speed": speed,
        # This host's wall clock, XLA compiles included (the speed figures are the cache
        # clock's, `speed`).
        "timings": {"clock": "wall", "compiles": "included", "drift_s": drift_s,
                    "teacher_forcing_s": teacher_s},
        "config": config.to_dict(),
    }
    if config.log.tensorboard:
        writer = MetricsWriter(workdir)
        writer.scalars(0, {f"quality/{k}": quality[k] for k in (
            "kl_mean", "kl_p99", "top1_agreement", "bits_per_byte", "reference_bits_per_byte",
            "bits_per_byte_delta")} | {
            "quality/drift_identical_share": quality["drift"]["identical_share"],
            "quality/drift_tokens_to_divergence": quality["drift"]["mean_tokens_to_divergence"]})
        writer.close()
    if cache is not None:
        results["cache"] = report_cache(config, cache, workdir)
    path = os.path.join(workdir, "results.json")
    write_json_atomic(path, results)
    if cache is not None:
        print(cache_table(config, cache))
    print(describe(results))
    announce_results(path)
    return results


def describe(results: dict) -> str:
    """The printed summary: divergence, bits per byte of both, drift, speed (on the cache's
    clock, named)."""
    q, d, s = results["quality"], results["quality"]["drift"], results["speed"]
    lines = [
        f"quality vs the reference ({results['model']['source']}, every expert resident at "
        f"native): experts at {results['model']['precision']}, teacher forcing "
        f"{q['teacher_forcing']} over {q['tokens']} tokens",
        f"KL(reference || cached) mean {q['kl_mean']:.6g} nats (p50 {q['kl_p50']:.3g}, "
        f"p99 {q['kl_p99']:.3g}, max {q['kl_max']:.3g}); top-1 agreement "
        f"{100 * q['top1_agreement']:.2f}%",
        f"bits/byte {q['bits_per_byte']:.4f} vs reference {q['reference_bits_per_byte']:.4f} "
        f"(delta {q['bits_per_byte_delta']:+.4f})",
    ]
    if d["prompts"]:
        lines.append(f"greedy drift: {round(d['identical_share'] * d['prompts'])}/{d['prompts']}"
                     f" continuations of {d['new_tokens']} tokens identical, mean "
                     f"{d['mean_tokens_to_divergence']:.1f} tokens to the first divergence")
    if s is not None:
        hw = results["cache"]["hardware"]
        modelled = results["cache"].get("host_work") or {}
        clock = summary.clock_words(s["clock"], hw["name"], hw["h2d_gbps"],
                                    modelled.get("words", ""))
        if s["ttft_s"] is None:
            lines.append(f"speed on the {clock}: n/a (no drift request ran: "
                         "quality.drift_prompts=0)")
        else:
            decode = s["decode_tok_per_s"]
            decode = f"{decode:.1f} tok/s" if decode is not None else "n/a (no decode pass ran)"
            lines.append(f"speed on the {clock}, drift requests: TTFT "
                         f"{1e3 * s['ttft_s']:.3f} ms, decode {decode}, stall "
                         f"{1e3 * s['stall_s']:.3f} ms")
    return "\n".join(lines)
