"""Records scored routing traces of a model on held-out prompts of each corpus domain.

For every domain (prose, code, math) and prompt: prefill `trace.prompt_tokens` tokens of
held-out text, then `run.max_new_tokens` decode steps, recording every MoE layer's ids, weights,
router probabilities and speculative next-layer scores (`moejax/traces/format.py`). With
`trace.teacher_forced` (default) each decode step consumes the next held-out token rather than
the model's argmax: real text, so greedy loops of a small model do not inflate locality.

The held-out text becomes token ids through the model's tokenizer: the bytes themselves for a
byte-level model (the embedded model, and every family's `tiny` preset, whose vocabulary is 256
ids), the checkpoint's own `tokenizer.json` otherwise. A model with neither (a vocabulary under
256 ids and no tokenizer) is a `ConfigError`.

Each trace is written to `WORKDIR/{domain}_{i}.npz`, or `WORKDIR/{domain}.npz` when
`tracing.prompts_per_domain` is 1; `WORKDIR/results.json` lists them with each one's
`bits_per_token` (and `bits_per_byte` for a byte-level model). A progress bar over every
trace's prompt and decode steps (`log.progress`), a line per trace written, and where the
results went are printed.
"""

from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from moejax.errors import ConfigError
from moejax.jobs.cache_report import announce_results, progress
from moejax.jobs.common import make_decoder
from moejax.jobs.specs import resolve
from moejax.model_source import load_model_for
from moejax.models import ResidentExperts
from moejax.results import write_json_atomic
from moejax.run_spec import RunSpec
from moejax.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from moejax.traces import TraceRecorder
from moejax.train import corpus

# Bytes of held-out text read per token wanted, for a subword tokenizer (a token of English
# prose or Python source is 3-5 bytes; too little text is an error naming the shortfall).
_BYTES_PER_TOKEN = 8


def _prompt_starts(data: np.ndarray, count: int, length: int, seed: int) -> list[int]:
    """Deterministic starts at line beginnings, spread over the split."""
    rng = np.random.default_rng(seed)
    starts = []
    for chunk in np.array_split(np.arange(len(data) - length - 1), count):
        s = int(rng.integers(chunk[0], chunk[-1]))
        newline = np.flatnonzero(data[s:s + 512] == ord("\n"))
        starts.append(min(s + int(newline[0]) + 1 if len(newline) else s,
                          len(data) - length - 1))
    return starts


def text_window_bytes(tokenizer: Tokenizer, tokens: int) -> int:
    """Bytes of held-out text to read for `tokens` token ids."""
    return tokens if isinstance(tokenizer, ByteTokenizer) else _BYTES_PER_TOKEN * tokens


def check_tokenizer(tokenizer: Tokenizer, vocab_size: int) -> None:
    """`ConfigError` unless the model can read text: byte-level with >= 256 ids, or a
    `tokenizer.json`."""
    if isinstance(tokenizer, ByteTokenizer) and vocab_size >= 256:
        return
    if isinstance(tokenizer, HFTokenizer):
        return
    raise ConfigError(
        f"record_traces feeds held-out text, but the model's tokenizer is {tokenizer.name!r} "
        f"and its vocabulary ({vocab_size} ids) is too small for bytes: convert the checkpoint "
        "with its tokenizer.json, or use a model whose vocabulary has >= 256 ids")


def token_ids(tokenizer: Tokenizer, window: np.ndarray, tokens: int, vocab_size: int,
              where: str = "held-out text") -> np.ndarray:
    """The first `tokens` token ids of the byte `window` (`[tokens]` int32): the bytes
    themselves for a byte-level model, else the window decoded as UTF-8 and encoded by the
    model's `tokenizer.json`."""
    check_tokenizer(tokenizer, vocab_size)
    if isinstance(tokenizer, ByteTokenizer):
        ids = np.asarray(window[:tokens], np.int32)
    else:
        text = bytes(np.asarray(window, np.uint8).tolist()).decode("utf-8", "replace")
        ids = np.asarray(tokenizer.encode(text), np.int32)[:tokens]
    if len(ids) < tokens:
        raise ConfigError(f"{where}: {len(window)} bytes give {len(ids)} tokens, "
                          f"{tokens} are needed")
    if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ConfigError(f"{where}: token ids outside the vocabulary 0..{vocab_size - 1}")
    return ids


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    t = config.tracing
    steps = config.run.max_new_tokens
    if t.prompts_per_domain < 1 or t.prompt_tokens < 1 or steps < 1:
        raise ConfigError("tracing.prompts_per_domain, tracing.prompt_tokens and "
                          "run.max_new_tokens must be >= 1")
    spec = resolve(config)
    loaded = load_model_for(spec)
    cfg, tok = loaded.cfg, loaded.tokenizer
    total = t.prompt_tokens + steps
    if total > cfg.max_position_embeddings:
        raise ConfigError(f"tracing.prompt_tokens + run.max_new_tokens = {total} exceeds "
                          f"max_position_embeddings={cfg.max_position_embeddings}")
    check_tokenizer(tok, cfg.vocab_size)
    os.makedirs(workdir, exist_ok=True)
    heldout = corpus.load_splits(True)
    experts = ResidentExperts.from_host(*loaded.experts_at("native"))
    window = text_window_bytes(tok, total)
    written = []
    with progress(config.log.progress, len(corpus.DOMAINS) * t.prompts_per_domain * steps,
                  "record_traces", unit="step") as bar:
        for domain in corpus.DOMAINS:
            written += _record_domain(config, spec, loaded, experts, heldout[domain].data, domain,
                                      window, workdir, bar)
    results = {"job": "record_traces", "model": loaded.source, "traces": written,
               "config": config.to_dict()}
    path = os.path.join(workdir, "results.json")
    write_json_atomic(path, results)
    announce_results(path)
    return results


def _record_domain(config: ml_collections.ConfigDict, spec: RunSpec, loaded,
                   experts: ResidentExperts, data: np.ndarray, domain: str, window: int, workdir: str, bar) -> list[dict]:
    """The traces of one domain's held-out text, each written as it is done; what results.json
    lists of each. `bar`: the progress bar (None when off), one step per decode step."""
    t, steps = config.tracing, config.run.max_new_tokens
    cfg, tok = loaded.cfg, loaded.tokenizer
    byte_level = isinstance(tok, ByteTokenizer)
    total = t.prompt_tokens + steps
    say = bar.write if bar is not None else print  # a line above the bar, not through it
    if len(data) < window + 2:
        raise ConfigError(f"held-out {domain} has {len(data)} bytes, {window + 2} needed")
    written = []
    for i, start in enumerate(_prompt_starts(data, t.prompts_per_domain, window, config.seed)):
        # `total` ids: the prompt, then the target of each decode step.
        text = token_ids(tok, data[start:start + window + 1], total, cfg.vocab_size,
                         f"held-out {domain} at byte {start}")
        info = {"domain": domain, "heldout_offset": start, "teacher_forced": t.teacher_forced,
                "prompt_tokens": t.prompt_tokens, "tokenizer": tok.name,
                "prompt": tok.decode(text[:t.prompt_tokens].tolist())}
        rec = TraceRecorder(cfg, config.model.lookahead, loaded.source, info,
                            score_dtype=np.float16)  # committed test data: keep it small
        dec = make_decoder(spec, loaded, experts, max_len=total,
                           gate_observers=(rec.on_gate,), pass_observers=(rec.end_pass,))
        logits = dec.forward(text[None, :t.prompt_tokens])
        nll, generated = [], []
        for step in range(steps):
            pos = t.prompt_tokens + step
            logp = jax.nn.log_softmax(logits[0, -1])
            nll.append(-float(logp[text[pos]]))
            nxt = int(text[pos]) if t.teacher_forced else int(jnp.argmax(logp))
            generated.append(nxt)
            if step < steps - 1:
                logits = dec.forward(np.asarray([[nxt]], np.int32))
            if bar is not None:
                bar.update(1)
        bits = float(np.mean(nll) / math.log(2))
        rec.meta["info"]["bits_per_token"] = bits
        if byte_level:
            rec.meta["info"]["bits_per_byte"] = bits
        rec.meta["info"]["continuation"] = tok.decode(generated)
        name = domain if t.prompts_per_domain == 1 else f"{domain}_{i}"
        path = os.path.join(workdir, f"{name}.npz")
        rec.trace().save(path)
        written.append({"path": path, **{k: v for k, v in rec.meta["info"].items()
                                         if k != "continuation"}})
        say(f"{path}: {domain}, {total} tokens, bits/{'byte' if byte_level else 'token'} "
            f"{bits:.3f}")
    return written
