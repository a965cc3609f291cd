"""Records scored routing traces of a model on held-out prompts of each corpus domain.

For every domain (prose, code, math) and prompt: prefill `trace.prompt_tokens` bytes of held-out
text, then `run.max_new_tokens` decode steps, recording every MoE layer's ids, weights, router
probabilities and speculative next-layer scores (`moejax/traces/format.py`). With
`trace.teacher_forced` (default) each decode step consumes the next held-out byte rather than
the model's argmax: real text, so greedy loops of a small model do not inflate locality.
"""

from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from moejax.config import ConfigError
from moejax.jobs.common import make_decoder
from moejax.model_source import load_model
from moejax.models.stepped import ResidentExperts
from moejax.results import write_json_atomic
from moejax.tokenizer import ByteTokenizer
from moejax.traces.recorder import TraceRecorder
from moejax.train import corpus


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


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    t = config.tracing
    steps = config.run.max_new_tokens
    if t.prompts_per_domain < 1 or t.prompt_tokens < 1 or steps < 1:
        raise ConfigError("tracing.prompts_per_domain, tracing.prompt_tokens and "
                          "run.max_new_tokens must be >= 1")
    loaded = load_model(config.model, config.seed)
    if not isinstance(loaded.tokenizer, ByteTokenizer):
        raise ConfigError("record_traces feeds held-out bytes: it needs a byte-level model")
    total = t.prompt_tokens + steps
    if total > loaded.cfg.max_position_embeddings:
        raise ConfigError(f"tracing.prompt_tokens + run.max_new_tokens = {total} exceeds "
                          f"max_position_embeddings={loaded.cfg.max_position_embeddings}")
    os.makedirs(workdir, exist_ok=True)
    heldout = corpus.load_splits(True)
    experts = ResidentExperts.from_host(loaded.host_gate_up, loaded.host_down)
    written = []
    for domain in corpus.DOMAINS:
        data = heldout[domain].data
        for i, start in enumerate(_prompt_starts(data, t.prompts_per_domain, total, config.seed)):
            text = data[start:start + total + 1].astype(np.int32)
            info = {"domain": domain, "heldout_offset": start, "teacher_forced": t.teacher_forced,
                    "prompt": bytes(text[:t.prompt_tokens].tolist()).decode("utf-8", "replace")}
            rec = TraceRecorder(loaded.cfg, config.model.lookahead, loaded.source, info,
                                score_dtype=np.float16)  # committed test data: keep it small
            dec = make_decoder(config, loaded, experts, max_len=total,
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
            rec.meta["info"]["bits_per_byte"] = float(np.mean(nll) / math.log(2))
            rec.meta["info"]["continuation"] = bytes(generated).decode("utf-8", "replace")
            path = os.path.join(workdir, f"{domain}_{i}.npz")
            rec.trace().save(path)
            written.append({"path": path, **{k: v for k, v in rec.meta["info"].items()
                                             if k != "continuation"}})
            print(f"{path}: {domain}, bits/byte {rec.meta['info']['bits_per_byte']:.3f}")
    results = {"job": "record_traces", "traces": written, "config": config.to_dict()}
    write_json_atomic(os.path.join(workdir, "results.json"), results)
    return results
