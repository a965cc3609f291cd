"""Reads routing traces of other tools, detected from the file's content:

* moejax `.npz` traces (`format.py`);
* capture JSONL (../shared/data/traces): line 1 `{"meta": {...layers, top_k, n_experts...}}`,
  then `{"step": i, "routed": {"<layer>": [ids...]}}` per decode step (ids only);
* vLLM routing-logger JSONL: one row per token and layer,
  `{"problem_id", "layer", "experts", "gating_probs", "token_idx"}`, several problems per file,
  each problem a separate sequence.

Every malformed or truncated line is an error naming the file and line; nothing is skipped.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np

from moejax.traces.format import FORMAT, Trace, TraceError, load


def sniff(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith(b"PK"):
        return "moejax"
    with open(path, encoding="utf-8", errors="replace") as f:
        first = f.readline()
    try:
        row = json.loads(first)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}:1: not JSON and not a moejax .npz trace ({e.msg})") from e
    if not isinstance(row, dict):
        raise TraceError(f"{path}:1: unrecognised trace format (a JSON {type(row).__name__}, "
                         "not an object)")
    if "meta" in row:
        return "capture"
    if {"layer", "experts"} <= set(row):
        return "vllm"
    raise TraceError(f"{path}:1: unrecognised trace format (keys {sorted(row)[:8]})")


def load_traces(path: str) -> list[Trace]:
    """All sequences in the file, each as a `Trace`."""
    kind = sniff(path)
    if kind == "moejax":
        return [load(path)]
    if kind == "capture":
        return [_load_capture(path)]
    return _load_vllm(path)


def _rows(path: str):
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                raise TraceError(f"{path}:{n}: empty line")
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceError(f"{path}:{n}: malformed or truncated JSON ({e.msg})") from e


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_field(path, n, row, key):
    if not _is_int(row[key]):
        raise TraceError(f"{path}:{n}: {key!r} must be an integer, got {row[key]!r}")
    return row[key]


def _ids_row(path, n, ids, top_k, num_experts, what):
    if not isinstance(ids, list) or len(ids) != top_k:
        raise TraceError(f"{path}:{n}: {what} has {len(ids) if isinstance(ids, list) else ids!r}"
                         f" experts, expected top_k={top_k}")
    if any(not _is_int(i) or not 0 <= i < num_experts for i in ids):
        raise TraceError(f"{path}:{n}: {what} has expert ids outside 0..{num_experts - 1}: {ids}")
    if len(set(ids)) != len(ids):
        raise TraceError(f"{path}:{n}: {what} routes to the same expert twice: {ids}")
    return ids


def _load_capture(path: str) -> Trace:
    rows = _rows(path)
    _, head = next(rows)
    meta = head["meta"]
    try:
        layers, top_k, num_experts = int(meta["layers"]), int(meta["top_k"]), int(meta["n_experts"])
    except (KeyError, TypeError, ValueError) as e:
        raise TraceError(f"{path}:1: meta lacks layers/top_k/n_experts ({e})") from e
    steps = []
    for n, row in rows:
        if not isinstance(row, dict) or "routed" not in row or "step" not in row:
            raise TraceError(f"{path}:{n}: expected {{'step', 'routed'}}")
        if row["step"] != len(steps):
            raise TraceError(f"{path}:{n}: step {row['step']} out of order (expected {len(steps)})")
        routed = row["routed"]
        if not isinstance(routed, dict):
            raise TraceError(f"{path}:{n}: 'routed' must be an object of layer -> ids")
        if set(routed) != {str(l) for l in range(layers)}:
            raise TraceError(f"{path}:{n}: step {row['step']} routes layers {sorted(routed)}, "
                             f"expected 0..{layers - 1}")
        steps.append([_ids_row(path, n, routed[str(l)], top_k, num_experts, f"layer {l}")
                      for l in range(layers)])
    if "steps" in meta and len(steps) != int(meta["steps"]):
        raise TraceError(f"{path}: truncated: {len(steps)} steps, meta says {meta['steps']}")
    if not steps:
        raise TraceError(f"{path}: no steps")
    ids = np.asarray(steps, np.int64)[:, :, :]
    trace = Trace({"format": FORMAT, "model": {"name": meta.get("model")},
                   "layers": list(range(layers)), "num_experts": num_experts, "top_k": top_k,
                   "expert_bytes": None, "lookahead": 0, "prefill_passes": 0, "source": path,
                   "info": meta},
                  np.arange(len(steps) + 1, dtype=np.int64), np.full(len(steps), -1, np.int32),
                  ids)
    trace.validate(path)
    return trace


def _load_vllm(path: str) -> list[Trace]:
    per_problem: dict = defaultdict(lambda: defaultdict(dict))
    top_k = None
    max_expert = 0
    layers_seen = set()
    for n, row in _rows(path):
        if not isinstance(row, dict):
            raise TraceError(f"{path}:{n}: expected a JSON object per row")
        missing = {"problem_id", "layer", "experts", "token_idx"} - set(row)
        if missing:
            raise TraceError(f"{path}:{n}: row lacks {sorted(missing)}")
        ids = row["experts"]
        if not isinstance(ids, list) or not ids:
            raise TraceError(f"{path}:{n}: 'experts' must be a non-empty list")
        top_k = top_k or len(ids)
        _ids_row(path, n, ids, top_k, 1 << 30, "row")
        max_expert = max(max_expert, max(ids))
        layer, tok = _int_field(path, n, row, "layer"), _int_field(path, n, row, "token_idx")
        layers_seen.add(layer)
        slot = per_problem[row["problem_id"]][tok]
        if layer in slot:
            raise TraceError(f"{path}:{n}: duplicate row for problem {row['problem_id']!r}, "
                             f"token {tok}, layer {layer}")
        slot[layer] = (ids, row.get("gating_probs"))
    if not per_problem:
        raise TraceError(f"{path}: no rows")
    layers = sorted(layers_seen)
    num_experts = max_expert + 1
    traces = []
    for problem, tokens in per_problem.items():
        order = sorted(tokens)
        if order != list(range(order[0], order[0] + len(order))):
            raise TraceError(f"{path}: problem {problem!r} has gaps in token_idx")
        ids = np.empty((len(order), len(layers), top_k), np.int64)
        weights = np.empty((len(order), len(layers), top_k), np.float32)
        have_weights = True
        for r, tok in enumerate(order):
            if set(tokens[tok]) != set(layers):
                raise TraceError(f"{path}: problem {problem!r} token {tok} lacks layers "
                                 f"{sorted(set(layers) - set(tokens[tok]))}")
            for i, l in enumerate(layers):
                e, g = tokens[tok][l]
                ids[r, i] = e
                if isinstance(g, list) and len(g) == top_k:
                    weights[r, i] = g
                else:
                    have_weights = False
        trace = Trace({"format": FORMAT, "model": {"name": None}, "layers": layers,
                       "num_experts": num_experts, "top_k": top_k, "expert_bytes": None,
                       "lookahead": 0, "prefill_passes": 0, "source": path,
                       "info": {"problem_id": problem}},
                      np.arange(len(order) + 1, dtype=np.int64), np.full(len(order), -1, np.int32),
                      ids, weights if have_weights else None)
        trace.validate(path)
        traces.append(trace)
    return traces
