"""The eval job: a task's examples (a seqio Task, `moejax.eval.tasks`) run through the configured
expert cache, scored, and written to `WORKDIR/results.json`.

What runs depends on the task (`moejax.eval.data.KIND`):

* generation (gsm8k, jsonl, nq_open): each example is one request, a fresh sequence greedily
  decoded through the same cache (as the generate job serves `run.prompts`), for at most
  `eval.max_new_tokens` tokens, stopping at EOS or at the first stop sequence (the text is cut
  there). A prompt longer than `max_position_embeddings - eval.max_new_tokens` tokens keeps its
  last tokens (`truncated: true`). The output is postprocessed by the task's `postprocess_fn`
  and scored by its `metric_fns` (exact match; gsm8k also `flexible_match`). `ttft_s` is the
  host wall clock of each prefill, XLA compilation of a new prompt length included.
* choice (truthfulqa_mc): the log-likelihood of each choice after the question, teacher-forced
  through the cache (the sum of the log-probabilities of the choice's tokens, one forward of
  question + choice per distinct choice); MC1 and MC2.
* bits (heldout): bits per byte of each text, scored as the perplexity job scores a file
  (`eval.window`, `eval.stride`, at most `eval.max_tokens` tokens of each text).

seqio (and so TensorFlow) runs in a worker process of its own (`moejax.eval.tasks.load`),
never beside JAX: this process receives the examples as plain data, and postprocesses and
scores them with the Task's own functions (`moejax.eval.scoring`).

python -m moejax.main --config=configs/eval.py --config.eval.task=gsm8k \
    --config.eval.max_examples=3 --workdir=W
"""

from __future__ import annotations

import math
import os
import time

import ml_collections
import numpy as np

from moejax import bundled
from moejax.errors import ConfigError
from moejax.eval import data
from moejax.jobs.cache_report import announce_results, cache_table, progress, report_cache
from moejax.jobs.common import (
    cache_of,
    check_windows,
    configured_decoder,
    experts_precision,
    scored_bytes,
)
from moejax.jobs.perplexity import score
from moejax.jobs.specs import resolve
from moejax.model_source import LoadedModel, load_model_for
from moejax.results import write_json_atomic
from moejax.run_spec import RunSpec

# A record keeps a prompt up to this many characters; a longer one (few-shot prompts) keeps
# its length and its last INPUTS_TAIL characters (the evaluated question).
INPUTS_MAX = 2000
INPUTS_TAIL = 500


def validate(config: ml_collections.ConfigDict) -> None:
    e = config.eval
    if not e.task:
        raise ConfigError(f"eval.task is empty: pass --config.eval.task=NAME, one of "
                          f"{data.TASKS}")
    data.check_task(e.task, e.data_file)
    data.check_counts(e.task, e.shots, e.max_examples)
    if e.max_new_tokens < 1:
        raise ConfigError(f"eval.max_new_tokens={e.max_new_tokens} must be >= 1")
    stop = e.stop if isinstance(e.stop, (tuple, list)) else None
    if stop is None or any(not isinstance(s, str) or not s for s in stop):
        raise ConfigError(f"eval.stop={e.stop!r} must be a list of non-empty strings (from the "
                          f"shell: --config.eval.stop='[\"\\n\\n\", \"###\"]')")
    if data.KIND[e.task] == "bits":
        check_windows("eval", e.window, e.stride, e.max_tokens)


def stop_sequences(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    return tuple(config.eval.stop) or data.STOP.get(config.eval.task, ())


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    validate(config)
    e = config.eval
    from moejax.eval import tasks  # seqio and TensorFlow load in a worker process

    t0 = time.perf_counter()
    task_data = tasks.load(e.task, data_file=e.data_file, shots=e.shots,  # bad data fails
                           input_field=e.input_field, target_field=e.target_field,  # before
                           max_examples=e.max_examples)  # the model loads
    examples = task_data.examples
    data_s = time.perf_counter() - t0
    os.makedirs(workdir, exist_ok=True)
    t0 = time.perf_counter()
    spec = resolve(config)
    loaded = load_model_for(spec)
    load_s = time.perf_counter() - t0

    kind = data.KIND[e.task]
    runner = {"generate": _generate, "choice": _choices, "bits": _bits}[kind]
    t0 = time.perf_counter()
    experts, records, outputs, extra = runner(config, spec, loaded, examples)
    eval_s = time.perf_counter() - t0
    seqio_examples = [tasks.seqio_example(ex) for ex in examples]
    postprocess, metric_fns = tasks.POSTPROCESS[e.task], tasks.METRICS[e.task]
    targets = [postprocess(ex.targets, example=s, is_target=True)
               for ex, s in zip(examples, seqio_examples)]
    predictions = [postprocess(o, example=s, is_target=False)
                   for o, s in zip(outputs, seqio_examples)]
    if kind == "generate":
        for rec, p in zip(records, predictions):
            rec["extracted"] = p
    metrics: dict = {}
    for fn in metric_fns:
        metrics.update(fn(targets, predictions))
    if kind != "bits":  # each example's own scores, by the same metric functions
        for rec, t, p in zip(records, targets, predictions):
            for fn in metric_fns:
                rec.update(fn([t], [p]))
            rec["correct"] = bool(rec["exact_match" if kind == "generate" else "mc1"] == 1.0)

    cfg = loaded.cfg
    results = {
        "job": "eval",
        "model": {"source": loaded.source, "family": cfg.family,
                  "precision": experts_precision(spec, experts)},
        "tokenizer": loaded.tokenizer.name,
        "eval": {
            "task": e.task,
            "seqio_task": task_data.name,
            "data_file": _data_file(e.task, e.data_file),
            "split": task_data.split,
            "shots": e.shots,
            "examples": len(records),
            **metrics,
            "metrics": metrics,
            **extra,
            "records": records,
        },
        # This host's wall clock; the evaluation's time includes its XLA compiles (no rate
        # is made of it).
        "timings": {"clock": "wall", "compiles": "included", "data_s": data_s,
                    "load_s": load_s, "eval_s": eval_s},
        "config": config.to_dict(),
    }
    cache = cache_of(experts)
    if cache is not None:
        results["cache"] = report_cache(config, cache, workdir)
    path = os.path.join(workdir, "results.json")
    write_json_atomic(path, results)
    if cache is not None:
        print(cache_table(config, cache))
    print(_summary(results, path))
    announce_results(path)
    return results


def _data_file(task: str, data_file: str) -> str:
    """Where the examples came from: the given file, or the data moejax ships."""
    if data_file:
        return os.path.abspath(data_file)
    return bundled.GSM8K if task == "gsm8k" else bundled.HELDOUT_DIR


def _encode(loaded: LoadedModel, text: str, what: str, ex: data.Example) -> list[int]:
    ids = loaded.tokenizer.encode(text)
    if not ids:
        where = ", ".join(f"{k} {v}" for k, v in ex.meta.items() if k in ("line", "name", "id"))
        raise ConfigError(f"an example's {what} encodes to no tokens ({where or 'no line'}): "
                          f"{text!r}")
    return ids


def _where(ex: data.Example) -> dict:
    return {k: ex.meta[k] for k in ("line", "id", "name") if k in ex.meta}


def _inputs(text: str) -> dict:
    if len(text) <= INPUTS_MAX:
        return {"inputs": text}
    return {"inputs_chars": len(text), "inputs_tail": text[-INPUTS_TAIL:]}


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """`text` up to the first stop sequence, and whether there was one."""
    at = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text, False) if at < 0 else (text[:at], True)


def _generate(config: ml_collections.ConfigDict, spec: RunSpec, loaded: LoadedModel,
              examples: list[data.Example]):
    e, cfg, tok = config.eval, loaded.cfg, loaded.tokenizer
    limit = cfg.max_position_embeddings - e.max_new_tokens
    if limit < 1:
        raise ConfigError(f"eval.max_new_tokens={e.max_new_tokens} leaves no room for a prompt "
                          f"in the model's max_position_embeddings "
                          f"({cfg.max_position_embeddings})")
    prompts = []
    for ex in examples:
        ids = _encode(loaded, ex.inputs, "inputs", ex)
        prompts.append((ids[-limit:], len(ids) > limit))
    stops = stop_sequences(config)

    def stop(generated: list[int]) -> bool:
        return cut_at_stop(tok.decode(generated), stops)[1]

    max_len = max(len(ids) for ids, _ in prompts) + e.max_new_tokens
    experts, decoder = configured_decoder(spec, loaded, max_len=max_len)
    eos = cfg.eos_token_id
    records, outputs = [], []
    with progress(config.log.progress, len(examples), e.task, "example") as bar:
        for ex, (ids, truncated) in zip(examples, prompts):
            gen = decoder.generate(np.asarray(ids, np.int32)[None], e.max_new_tokens,
                                   eos_id=eos, stop=stop if stops else None)
            out = gen.generated_ids[0]
            hit_eos = eos is not None and bool(out) and out[-1] == eos
            text, stopped = cut_at_stop(tok.decode(out[:-1] if hit_eos else out), stops)
            outputs.append(text)
            records.append({
                **_where(ex), **_inputs(ex.inputs), "target": ex.targets, "prediction": text,
                "finish": "eos" if hit_eos else "stop" if stopped else "length",
                "prompt_tokens": len(ids), "truncated": truncated,
                "tokens_generated": len(out), "ttft_s": gen.prefill_s,
                "decode_s": gen.decode_s,
            })
            if bar is not None:
                bar.update(1)
    extra = {"truncated": sum(r["truncated"] for r in records),
             "tokens_generated": sum(r["tokens_generated"] for r in records),
             "max_new_tokens": e.max_new_tokens, "stop": list(stops)}
    return experts, records, outputs, extra


def fit_context(context: list[int], continuation: list[int], limit: int) -> tuple[list[int], int, bool]:
    """context + continuation in at most `limit` tokens (the context loses its first tokens,
    keeping at least one), the continuation's scored length, and whether anything was cut."""
    cont = continuation[: limit - 1]
    ctx = context[-(limit - len(cont)):]
    return ctx + cont, len(cont), len(ctx) < len(context) or len(cont) < len(continuation)


def _choices(config: ml_collections.ConfigDict, spec: RunSpec, loaded: LoadedModel,
             examples: list[data.Example]):
    limit = loaded.cfg.max_position_embeddings
    plans = []
    for ex in examples:
        ctx = _encode(loaded, ex.inputs, "inputs", ex)
        choices = list(dict.fromkeys(ex.meta["mc1"]["choices"] + ex.meta["mc2"]["choices"]))
        plans.append((ctx, {c: fit_context(ctx, _encode(loaded, data.choice_text(c), "choice", ex),
                                    limit) for c in choices}))
    max_len = max(len(ids) for _, fits in plans for ids, _, _ in fits.values())
    experts, decoder = configured_decoder(spec, loaded, max_len=max_len)
    records, outputs = [], []
    with progress(config.log.progress, len(examples), config.eval.task, "example") as bar:
        for ex, (ctx, fits) in zip(examples, plans):
            ll = {}
            for choice, (ids, n_cont, _) in fits.items():
                nll = score(decoder, np.asarray(ids, np.int32), len(ids), len(ids) - 1)
                ll[choice] = -float(nll[-n_cont:].sum())
            pred = {k: [ll[c] for c in ex.meta[k]["choices"]] for k in ("mc1", "mc2")}
            outputs.append(pred)
            mc1_choices = ex.meta["mc1"]["choices"]
            best = max(range(len(mc1_choices)), key=lambda i: pred["mc1"][i])
            records.append({
                **_where(ex), **_inputs(ex.inputs), "target": ex.targets,
                "prediction": data.choice_text(mc1_choices[best]),
                "loglikelihoods": pred, "context_tokens": len(ctx),
                "truncated": any(cut for _, _, cut in fits.values()),
            })
            if bar is not None:
                bar.update(1)
    extra = {"truncated": sum(r["truncated"] for r in records),
             "forwards": sum(len(fits) for _, fits in plans)}
    return experts, records, outputs, extra


def _bits(config: ml_collections.ConfigDict, spec: RunSpec, loaded: LoadedModel,
          examples: list[data.Example]):
    e, tok = config.eval, loaded.tokenizer
    texts = []
    for ex in examples:
        ids = np.asarray(_encode(loaded, ex.targets, "text", ex), np.int32)
        ids = ids[: e.max_tokens] if e.max_tokens else ids
        if len(ids) < 2:
            raise ConfigError(f"held-out text {ex.meta.get('name')!r} has fewer than 2 tokens "
                              f"(eval.max_tokens={e.max_tokens})")
        window = min(e.window, len(ids), loaded.cfg.max_position_embeddings)
        texts.append((ids, window, min(e.stride, window - 1)))
    experts, decoder = configured_decoder(spec, loaded, max_len=max(w for _, w, _ in texts))
    records, outputs = [], []
    with progress(config.log.progress, len(examples), e.task, "example") as bar:
        for ex, (ids, window, stride) in zip(examples, texts):
            nll = score(decoder, ids, window, stride)
            bits = float(nll.sum() / math.log(2))
            n_bytes = scored_bytes(tok, ids)
            outputs.append({"bits": bits, "bytes": n_bytes})
            records.append({**_where(ex), "tokens_scored": len(nll), "bytes_scored": n_bytes,
                            "bits_per_byte": bits / n_bytes, "bits_per_token": bits / len(nll),
                            "window": window, "stride": stride})
            if bar is not None:
                bar.update(1)
    return experts, records, outputs, {"window": e.window, "stride": e.stride,
                                           "max_tokens": e.max_tokens}


def _summary(results: dict, path: str) -> str:
    ev, m = results["eval"], results["model"]
    names = [k for k in ("exact_match", "flexible_match", "mc1", "mc2", "bits_per_byte")
             if k in ev["metrics"]]
    scores = ", ".join(f"{k} {ev['metrics'][k]:.4f}" for k in names)
    detail = f"{ev['examples']} examples"
    if "truncated" in ev:
        detail += f", {ev['truncated']} truncated"
    if "tokens_generated" in ev:
        detail += f", {ev['tokens_generated']} tokens generated"
    return (f"{ev['task']} [{ev['seqio_task']}]: {scores} over {detail} in "
            f"{results['timings']['eval_s']:.1f} s (wall clock, XLA compiles included) "
            f"[{m['family']} from {m['source']}, experts "
            f"at {m['precision']}] -> {path}")
