"""Re-cutting a recorded sequence into requests: a prefill pass, then one decode pass per token.

A trace records one sequence as passes (a prefill of the prompt, then decode steps). Replay's
per-request TTFT needs several requests, each starting with a prefill; the shipped captures
have one decode-only sequence and no prefill at all. Because a causal model routes each token
from its own prefix, a token's routing is the same whether it ran inside a prefill or as a
decode step (up to float rounding), so the token rows of a batch-1 sequence can be regrouped
into passes freely: `as_requests` cuts the rows into consecutive requests of `request_tokens`
rows whose first `prefill_tokens` rows form one prefill pass. What this does not reproduce:
request k > 1 continues the text of request k-1 (its routing is that of a continuation, not of
a fresh prompt), and its attention context restarts at 0 on the cost model.
"""

from __future__ import annotations

import numpy as np

from moejax.errors import ConfigError
from moejax.traces.format import Trace


def as_requests(trace: Trace, request_tokens: int, prefill_tokens: int,
                name: str = "<trace>") -> list[Trace]:
    """`trace` (one batch-1 sequence) as consecutive requests of `request_tokens` token rows (0:
    one request of all rows; a shorter last one keeps the rest), each one prefill pass of its
    first `prefill_tokens` rows followed by one decode pass per row. `(0, 0)`: unchanged."""
    if request_tokens < 0 or prefill_tokens < 0:
        raise ConfigError(f"replay.request_tokens={request_tokens} and replay.prefill_tokens="
                          f"{prefill_tokens} must be >= 0")
    if request_tokens == 0 and prefill_tokens == 0:
        return [trace]
    if prefill_tokens < 1:
        raise ConfigError(f"replay.request_tokens={request_tokens} needs replay.prefill_tokens "
                          ">= 1: a request starts with a prefill pass")
    if request_tokens and prefill_tokens >= request_tokens:
        raise ConfigError(f"replay.prefill_tokens={prefill_tokens} must be below "
                          f"replay.request_tokens={request_tokens} (a request decodes after it)")
    sizes = np.diff(trace.pass_offsets)
    if np.any(sizes[trace.prefill_passes:] != 1):
        raise ConfigError(f"{name}: decode passes of several rows (a batch > 1): its token rows "
                          "are not one sequence and cannot be re-cut into requests")
    rows = int(trace.pass_offsets[-1])
    if prefill_tokens >= rows:
        raise ConfigError(f"replay.prefill_tokens={prefill_tokens} is not below the "
                          f"{rows} token rows of {name}")
    length = request_tokens or rows
    out = []
    for start in range(0, rows, length):
        stop = min(start + length, rows)
        prefill = min(prefill_tokens, stop - start)
        offsets = np.concatenate([[0], np.arange(prefill, stop - start + 1)]).astype(np.int64)
        meta = {**trace.meta, "prefill_passes": 1,
                "info": {**trace.meta.get("info", {}),
                         "request": {"index": len(out), "first_row": start,
                                     "rows": stop - start, "prefill_tokens": prefill}}}
        cut = slice(start, stop)
        out.append(Trace(meta, offsets, trace.tokens[cut], trace.ids[cut],
                         None if trace.weights is None else trace.weights[cut],
                         None if trace.probs is None else trace.probs[cut],
                         None if trace.spec is None else trace.spec[cut]))
    return out
