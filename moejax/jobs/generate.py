"""The generate job: text in, greedy text out, `WORKDIR/results.json` with ids and timings.

One prompt (`run.prompt` or `run.prompt_ids`) is one request; `run.prompts` is several, run one
after another through the same expert cache and the same compiled steps, each a fresh sequence
(the decoder's KV caches reset). The first request meets a cold cache, the later ones what the
earlier ones left: results.json reports TTFT per request, cold and warm, on the host wall clock
(`timings`) and on the cache's clock (`timings.cache_clock`).

Trace-driven (`policies.routing='trace(path=T)'`, `moejax/traces/driven.py`): the requests are
T's sequences, not prompts. Each is a prompt of its first pass's tokens (T's token ids, or zeros
when T records none), then one decoded token per remaining pass, without stopping at EOS, so
the run's passes are T's. `run.max_new_tokens` left at its default follows every pass of T;
given, it generates that many tokens per request (at most the passes of T's shortest sequence:
more is an error), so a run can follow the first passes of a long trace."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import time

import jax
import ml_collections
import numpy as np

from moejax import cli
from moejax.cache import WALL_CLOCK
from moejax.errors import ConfigError
from moejax.jobs import clocks
from moejax.jobs.cache_report import (
    announce_results,
    cache_clock_words,
    cache_table,
    progress,
    report_cache,
)
from moejax.jobs.common import cache_of, configured_decoder, experts_precision
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.model_source import LoadedModel, load_model_for
from moejax.results import write_json_atomic
from moejax.run_spec import RunSpec
from moejax.tokenizer import parse_ids
from moejax.traces import TraceRecorder, driven


@dataclasses.dataclass
class Request:
    field: str  # the config field it came from, for errors: "run.prompt", "run.prompts[1]"
    text: str
    ids: list[int]
    new_tokens: int = 0  # tokens to generate (0: run.max_new_tokens)
    sequence: int = -1  # a trace-driven run: the sequence of the trace it follows


def validate(config: ml_collections.ConfigDict) -> None:
    r = config.run
    if r.max_new_tokens < 1:
        raise ConfigError(f"run.max_new_tokens={r.max_new_tokens} must be >= 1")
    if r.batch_size < 1:
        raise ConfigError(f"run.batch_size={r.batch_size} must be >= 1")
    prompts = tuple(r.prompts or ())
    if prompts and r.prompt_ids:
        raise ConfigError(f"run.prompts={list(prompts)!r} and run.prompt_ids="
                          f"{r.prompt_ids!r} are both given: use one")
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise ConfigError(f"run.prompts[{i}]={p!r} is not a string (pass the list as "
                              f"--config.run.prompts='[\"first prompt\", \"second\"]')")
        if not p:
            raise ConfigError(f"run.prompts[{i}] is empty")
    if len(prompts) > 1 and config.tracing.record:
        raise ConfigError(f"tracing.record writes one sequence's trace, and run.prompts has "
                          f"{len(prompts)} prompts: record one prompt (or use the "
                          f"record_traces job)")
    if not prompts and not r.prompt and not r.prompt_ids:
        raise ConfigError("run.prompt and run.prompt_ids are both empty")


def requests_of(config: ml_collections.ConfigDict, loaded: LoadedModel) -> list[Request]:
    """The run's requests, tokenized and checked against the model's context length."""
    r, cfg = config.run, loaded.cfg
    if r.prompts:
        reqs = [Request(f"run.prompts[{i}]", p, loaded.tokenizer.encode(p))
                for i, p in enumerate(r.prompts)]
    elif r.prompt_ids:
        ids = parse_ids(r.prompt_ids, cfg.vocab_size)
        reqs = [Request("run.prompt_ids", loaded.tokenizer.decode(ids), ids)]
    else:
        reqs = [Request("run.prompt", r.prompt, loaded.tokenizer.encode(r.prompt))]
    for q in reqs:
        if not q.ids:
            raise ConfigError(f"{q.field}={q.text!r} encodes to no tokens")
        total = len(q.ids) + r.max_new_tokens
        if total > cfg.max_position_embeddings:
            raise ConfigError(
                f"{q.field}: prompt ({len(q.ids)} tokens) + run.max_new_tokens "
                f"({r.max_new_tokens}) = {total} exceeds the model's max_position_embeddings "
                f"({cfg.max_position_embeddings})")
    return reqs


# The run fields a trace-driven run does not read (its prompts and length are the trace's).
_DRIVEN_IGNORES = ("run.prompt", "run.prompt_ids", "run.prompts", "run.stop_at_eos")


def driven_requests(config: ml_collections.ConfigDict, loaded: LoadedModel,
                    driving: driven.DrivingTrace) -> list[Request]:
    """A trace-driven run's requests: one per sequence of the trace (module docstring)."""
    cfg, r, defaults = loaded.cfg, config.run, base_config().run
    for field in _DRIVEN_IGNORES:
        name = field.split(".")[1]
        if r[name] != defaults[name]:
            cli.warn(f"{field}={r[name]!r} does not apply: a trace-driven run's requests are "
                     f"the sequences of {driving.path}")
    passes = [t.num_passes for t in driving.sequences]
    limit = None if r.max_new_tokens == defaults.max_new_tokens else r.max_new_tokens
    if limit is not None and limit > min(passes):
        which = f" (its shortest of {len(passes)} sequences)" if len(passes) > 1 else ""
        raise ConfigError(f"run.max_new_tokens={limit}: {driving.path} has {min(passes)} "
                          f"passes{which}, and a trace-driven run generates one token per pass "
                          "(leave run.max_new_tokens unset to follow every pass)")
    reqs = []
    for i, trace in enumerate(driving.sequences):
        ids, _ = driven.prompt_of(trace, cfg.vocab_size)
        q = Request(f"{driving.path}" + (f" sequence {i}" if len(passes) > 1 else ""),
                    loaded.tokenizer.decode(ids), ids, limit or trace.num_passes, i)
        total = len(q.ids) + q.new_tokens
        if total > cfg.max_position_embeddings:
            raise ConfigError(f"{q.field}: its prompt ({len(q.ids)} tokens) and "
                              f"{q.new_tokens} passes after it ({total} positions) exceed the "
                              f"model's max_position_embeddings ({cfg.max_position_embeddings})")
        reqs.append(q)
    return reqs


def _new_tokens(config: ml_collections.ConfigDict, q: Request) -> int:
    return q.new_tokens or config.run.max_new_tokens


def _batch(ids: list[int], batch: int) -> np.ndarray:
    return np.tile(np.asarray(ids, np.int32)[None], (batch, 1))


def warm_up(config: ml_collections.ConfigDict, run: RunSpec, loaded: LoadedModel,
            reqs: list[Request], *, max_len: int, batch: int) -> None:
    """Compiles every step shape the timed requests use on a throwaway cache and decoder (same
    `max_len`, so the same KV cache shapes): the prefill of each distinct prompt length, and
    one decode step. Wall TTFT of every request is then free of compile time. Trace-driven, the
    throwaway runtime has a trace driver of its own, started at each request's sequence: the
    warm-up walks its own copy of the trace's first passes, not the timed run's."""
    experts, warmup = configured_decoder(run, loaded, max_len=max_len, batch=batch)
    driver = driven.driver_of(experts)
    seen: set[int] = set()
    for q in reqs:
        if len(q.ids) in seen:
            continue
        if driver is not None:
            driver.start(q.sequence)
        # The first length also runs a decode step (decode shapes do not depend on the prompt).
        warmup.generate(_batch(q.ids, batch), min(2, _new_tokens(config, q)) if not seen
                        else 1)
        seen.add(len(q.ids))
    del warmup  # nothing keeps it (or its KV caches) alive after this


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    validate(config)
    spec = resolve(config)
    driving = None
    path = driven.trace_path(spec.policies)
    if path is not None:  # checked before the model loads
        driven.check_run(spec)
        driving = driven.load(spec.trace, path)
    os.makedirs(workdir, exist_ok=True)
    t0 = time.perf_counter()
    loaded = load_model_for(spec)
    cfg = loaded.cfg
    load_s = time.perf_counter() - t0

    if driving is not None:
        driven.check_model(cfg, driving)
        reqs = driven_requests(config, loaded, driving)
        policies = driven.policies_for(spec.policies, driving, warn=True)
    else:
        reqs, policies = requests_of(config, loaded), None
    # One decoder (KV caches of the longest request) serves every request.
    max_len = max(len(q.ids) + _new_tokens(config, q) for q in reqs)
    batch = config.run.batch_size
    experts, decoder = configured_decoder(spec, loaded, max_len=max_len, batch=batch)
    driver = driven.driver_of(experts)
    recorder = None
    eos = cfg.eos_token_id if config.run.stop_at_eos and driving is None else None

    compile_s = None
    if config.run.warmup:  # compile every step shape on a throwaway cache
        print("generate: compiling its steps (each prompt length's prefill and a decode step, "
              "untimed, on a throwaway cache) ...", end=" ", flush=True)
        t0 = time.perf_counter()
        warm_up(config, spec, loaded, reqs, max_len=max_len, batch=batch)
        compile_s = time.perf_counter() - t0
        print(f"done in {compile_s:.1f} s, {WALL_CLOCK}", flush=True)

    if config.tracing.record:  # attached after warm-up, so the trace holds the timed run only
        recorder = TraceRecorder(cfg, config.model.lookahead, loaded.source,
                                 {"prompt": reqs[0].text})
        decoder.gate_observers.append(recorder.on_gate)
        decoder.pass_observers.append(recorder.end_pass)

    profile_dir = os.path.join(workdir, "profile")
    tracing = (jax.profiler.trace(profile_dir) if config.profile.enabled
               else contextlib.nullcontext())
    cache = cache_of(experts)
    routing = clocks.routing_recorder(spec, loaded, decoder, experts, cache)
    if config.profile.enabled:
        decoder.annotate = jax.profiler.TraceAnnotation
        if cache is not None:
            cache.annotate = jax.profiler.TraceAnnotation
    gens = []
    with tracing, progress(config.log.progress, sum(_new_tokens(config, q) for q in reqs),
                           "decode") as bar:
        for q in reqs:  # `generate` starts each request with a fresh sequence (KV caches reset)
            if driver is not None:
                driver.start(q.sequence)
            gens.append(decoder.generate(
                _batch(q.ids, batch), _new_tokens(config, q), eos_id=eos,
                on_token=(lambda _: bar.update(1)) if bar is not None else None))

    requests = []
    for q, gen in zip(reqs, gens):
        generated = gen.generated_ids[0]
        n_decode = max(0, len(generated) - 1)  # the first token comes from prefill
        requests.append({
            "prompt": q.text,
            "prompt_ids": q.ids,
            "generated_token_ids": generated,
            "generated_text": loaded.tokenizer.decode(generated),
            "ttft_s": gen.prefill_s,
            "decode_s": gen.decode_s,
            "decode_tok_per_s": (n_decode / gen.decode_s) if gen.decode_s > 0 else None,
        })
    first, ttfts = requests[0], [g.prefill_s for g in gens]
    results = {
        "job": "generate",
        "model": {"source": loaded.source, "family": cfg.family, "config": cfg.to_dict(),
                  "precision": experts_precision(spec, experts)},
        "tokenizer": loaded.tokenizer.name,
        # The first request, as a single-prompt run reports it; `requests` has them all.
        "prompt": first["prompt"],
        "prompt_ids": first["prompt_ids"],
        "generated_token_ids": first["generated_token_ids"],
        "generated_text": first["generated_text"],
        "requests": requests,
        "timings": {
            # This host's wall clock, whatever the cache's clock (`cache_clock` below, with
            # its own `clock`; TensorBoard's `perf/<clock>/...`).
            "clock": "wall",
            "load_s": load_s,
            # The warm-up's XLA compiles (None: run.warmup=False, and the times below
            # include them).
            "compile_s": compile_s,
            "ttft_s": first["ttft_s"],
            "decode_s": first["decode_s"],
            "decode_tok_per_s": first["decode_tok_per_s"],
            # Host wall clock per request; warm: the mean of the requests after the first.
            "ttft_per_request_s": ttfts,
            "cold_ttft_s": ttfts[0],
            "warm_ttft_s": _mean(ttfts[1:]),
        },
        "config": config.to_dict(),
    }
    if cache is not None:
        results["cache"] = report_cache(config, cache, workdir, policies=policies)
        results["timings"]["cache_clock"] = {"clock": cache.clock.kind,
                                             **cache.metrics.timing()}
    if hasattr(experts, "speculation_report"):  # the live cache's runtime
        results["speculation"] = experts.speculation_report()
    results["clocks"] = clocks.section(spec, loaded, gens, cache, routing,
                                        warmup=bool(config.run.warmup))
    if driving is not None:
        results["trace_driven"] = _driven_section(driving, driver, cfg.vocab_size)
    if config.profile.enabled:
        results["profile_dir"] = profile_dir
    if recorder is not None:
        results["trace"] = os.path.join(workdir, "trace.npz")
        recorder.trace().save(results["trace"])
    path = os.path.join(workdir, "results.json")
    write_json_atomic(path, results)
    if driving is not None:  # (the text of a model computing on another's routing)
        print(_driven_line(results["trace_driven"]))
    else:
        for q, r in zip(reqs, requests):
            print(generated_line(q.field, r))
    if cache is not None:
        print(cache_table(config, cache, policies=policies))
    if "speculation" in results:
        print(speculation_line(results["speculation"]))
    print(summary_line(cfg.family, loaded.source, results,
                       cache_clock_words(cache) if cache is not None else None))
    print(clocks.line(results["clocks"]))
    if config.profile.enabled:
        print(profile_line(profile_dir))
    announce_results(path)
    return results


def generated_line(field: str, request: dict) -> str:
    """A request's text, labelled: where its prompt came from and how many tokens followed it
    (the prompt, then the generated text, as one block)."""
    n = len(request["generated_token_ids"])
    return (f"generated ({field} + {n} token{'' if n == 1 else 's'}): "
            f"{request['prompt']}{request['generated_text']}")


def profile_line(profile_dir: str) -> str:
    """Where `profile.enabled` wrote its XProf trace (jax.profiler.trace writes
    `DIR/plugins/profile/<time>/<host>.xplane.pb`), and the command that opens it."""
    found = sorted(glob.glob(os.path.join(profile_dir, "plugins", "profile", "*", "*.xplane.pb")),
                   key=os.path.getmtime)
    where = found[-1] if found else f"{profile_dir} (no .xplane.pb found in it)"
    logdir = os.path.abspath(profile_dir)
    return (f"profile (XProf trace of the timed requests): {where}; open it with: "
            f"pip install xprof; xprof --logdir={logdir} --port=8791 (then http://localhost:8791)")


def _driven_section(driving: driven.DrivingTrace, driver: driven.TraceDriver,
                    vocab_size: int) -> dict:
    """results.json's `trace_driven`: the trace followed, and what the run took of it."""
    first = driving.first
    return {"path": os.path.abspath(driving.path), "format": driving.notes.kind,
            "sequences": len(driving.sequences),
            "passes_in_trace": sum(t.num_passes for t in driving.sequences),
            "passes_run": driver.passes_run,
            "layers": first.layers, "num_experts": first.num_experts, "top_k": first.top_k,
            "has_scores": first.has_scores, "has_spec": first.spec is not None,
            "weights": ("the trace's" if driving.has_weights
                        else "1/top_k each (the trace records ids only)"),
            "prompt": driven.prompt_of(first, vocab_size)[1],
            **{k: v for k, v in driving.notes.to_dict().items() if k != "format"}}


def _driven_line(section: dict) -> str:
    return (f"trace-driven: {section['passes_run']} of the {section['passes_in_trace']} passes "
            f"of {section['path']} ({section['sequences']} sequence(s)); experts weighted by "
            f"{section['weights']}; prompt: {section['prompt']}")


def _decode_rate(tokens: int, seconds: float) -> str:
    if tokens == 0:
        return "decode n/a (one token: it came from prefill)"
    return f"decode {tokens / seconds:.1f} tok/s" if seconds > 0 else "decode n/a (no time)"


def speculation_line(report: dict) -> str:
    """How the live runtime ran its passes (results.json's `speculation`), in words: which of
    them speculated (DESIGN "Speculative passes"), how many of their checks failed and made a
    layer run again, and the complete cache's passes decided after them."""
    failed = report["failed_checks"]
    why = (f": {report['failed_in_flight']} for an expert still in flight, "
           f"{report['failed_mid_pass']} found mid-pass" if failed else "")
    copies = report.get("host_copy_reads", 0)
    read = f", {copies} expert reads from the host copy" if copies else ""
    return (f"live runtime: {report['speculative_passes']} speculative passes "
            f"({report['checked_mid_pass']} checked mid-pass{read}), {failed} failed "
            f"check{'' if failed == 1 else 's'} whose layer ran again{why}; "
            f"{report['complete_cache_passes']} passes over a complete cache decided after them")


def summary_line(family: str, source: str, results: dict, cache_clock: str | None) -> str:
    """The final line: tokens, then the host's wall clock (TTFT, cold and warm with several
    requests, decode tok/s: what this machine took) and, with several requests through a cache,
    the cache's clock's TTFT (`cache_clock`: its words; the table above has its decode rate)."""
    t, requests = results["timings"], results["requests"]
    head = f"[{family} from {source}]"
    decode_s = sum(r["decode_s"] for r in requests)
    decode_tokens = sum(max(0, len(r["generated_token_ids"]) - 1) for r in requests)
    decode = _decode_rate(decode_tokens, decode_s)
    if len(requests) == 1:
        return (f"{head} {len(requests[0]['generated_token_ids'])} tokens; {WALL_CLOCK}: "
                f"TTFT {t['ttft_s'] * 1e3:.1f} ms, {decode}")
    tokens = sum(len(r["generated_token_ids"]) for r in requests)
    line = (f"{head} {len(requests)} requests, {tokens} tokens; {WALL_CLOCK}: TTFT cold "
            f"{t['cold_ttft_s'] * 1e3:.1f} ms, warm {t['warm_ttft_s'] * 1e3:.1f} ms, {decode}")
    if cache_clock is not None:
        cc = t["cache_clock"]
        line += (f"; {cache_clock}: TTFT cold {cc['cold_ttft_s'] * 1e3:.3f} ms, "
                 f"warm {cc['warm_ttft_s'] * 1e3:.3f} ms")
    return line
