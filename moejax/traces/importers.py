"""Reads routing traces of other tools, detected from the file's content:

* moejax `.npz` traces (`format.py`);
* capture JSONL (`moejax/assets/captures`): line 1 `{"meta": {...layers, top_k, n_experts...}}`,
  then `{"step": i, "routed": {"<layer>": [ids...]}}` per decode step (ids only);
* vLLM routing-logger JSONL: one row per token and layer,
  `{"problem_id", "layer", "experts", "gating_probs", "token_idx"}`, several problems per file,
  each problem a separate sequence.

`import_traces(path, num_experts=None, strict=False)` returns the traces and `ImportNotes`
(what the import had to infer or skip, for results.json); `load_traces(path)` is the same
import returning the traces only.

Every malformed or truncated line is an error naming the file and line. Two things real logs
lack are filled in or skipped, and always reported (`ImportNotes`, and a warning on the
`moejax.traces.importers` logger, which `python -m moejax.main` prints on stderr):

* **Expert count.** A capture header with `"n_experts": null` (or none) and every vLLM log:
  the count is the largest id in the file + 1 (`num_experts_source="inferred"`; a model whose
  highest experts were never routed to is undercounted). `num_experts=N` states it instead
  (`"config"`): an id >= N is an error naming file, line and id, and so is an N that differs
  from the count a header states (`"header"`).
* **Incomplete vLLM tokens** (rows of some layers missing: logging stopped mid-token at the end
  of a generation). The layers of the file are the union of all rows' layers. Only *trailing*
  incomplete tokens are skipped: those after the last complete token of their problem. An
  incomplete token followed by a complete one (a gap in the middle) is always an error: the
  tokens after it would be replayed with a wrong cache context (requests that happened never
  reach the cache), so counts would be silently wrong. A problem none of whose tokens is
  complete is skipped whole; a file with no complete token is an error. `strict=True` makes
  every incomplete token an error. Expert ids of skipped rows still count for the inferred
  expert count (they are valid routing decisions of the same model).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import defaultdict

import numpy as np

from moejax.traces.format import FORMAT, Trace, TraceError, load

log = logging.getLogger(__name__)

# Skipped tokens named one warning line each, up to this many per file; then one summary line
# (results.json lists them all).
MAX_WARNED_TOKENS = 20


@dataclasses.dataclass
class ImportNotes:
    """What an import inferred or skipped (results.json's `trace` section reports it)."""

    kind: str  # "moejax", "capture" or "vllm"
    num_experts: int
    # "header": stated by the file; "config": given as num_experts (replay.num_experts);
    # "inferred": the largest expert id in the file + 1.
    num_experts_source: str
    max_expert_id: int
    # Incomplete trailing tokens left out: {"problem", "token", "missing_layers"}.
    skipped_tokens: list[dict] = dataclasses.field(default_factory=list)
    # Problems left out whole (no complete token): {"problem", "tokens"}.
    skipped_problems: list[dict] = dataclasses.field(default_factory=list)

    @property
    def num_experts_inferred(self) -> bool:
        return self.num_experts_source == "inferred"

    def to_dict(self) -> dict:
        return {"format": self.kind, "num_experts_source": self.num_experts_source,
                "num_experts_inferred": self.num_experts_inferred,
                "max_expert_id": self.max_expert_id,
                "skipped_token_count": len(self.skipped_tokens),
                "skipped_tokens": list(self.skipped_tokens),
                "skipped_problems": list(self.skipped_problems)}


@dataclasses.dataclass
class ImportedTraces:
    traces: list[Trace]
    notes: ImportNotes


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


def import_traces(path: str, *, num_experts: int | None = None,
                  strict: bool = False) -> ImportedTraces:
    """All sequences in the file, each as a `Trace`, and the notes of the import.

    `num_experts`: the model's expert count when the file does not state it (the replay job's
    `replay.num_experts`); `strict`: incomplete vLLM tokens are errors instead of skipped."""
    if num_experts is not None and (not _is_int(num_experts) or num_experts < 1):
        raise TraceError(f"{path}: replay.num_experts must be a positive integer, "
                         f"got {num_experts!r}")
    kind = sniff(path)
    if kind == "moejax":
        trace = load(path)
        if num_experts is not None and num_experts != trace.num_experts:
            raise TraceError(f"{path}: the trace records num_experts={trace.num_experts}, "
                             f"but replay.num_experts={num_experts}")
        return ImportedTraces([trace], ImportNotes(kind, trace.num_experts, "header",
                                                   int(trace.ids.max())))
    if kind == "capture":
        trace, notes = _load_capture(path, num_experts)
        return ImportedTraces([trace], notes)
    traces, notes = _load_vllm(path, num_experts, strict)
    return ImportedTraces(traces, notes)


def load_traces(path: str, *, num_experts: int | None = None,
                strict: bool = False) -> list[Trace]:
    """All sequences in the file, each as a `Trace` (`import_traces` without the notes)."""
    return import_traces(path, num_experts=num_experts, strict=strict).traces


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
    # The common case in one pass (a capture has tens of thousands of rows); anything else
    # goes through the checks below, which name what is wrong.
    if type(ids) is list and len(ids) == top_k and all(type(i) is int for i in ids) and \
            0 <= min(ids) and max(ids) < num_experts and len(set(ids)) == top_k:
        return ids
    if not isinstance(ids, list) or len(ids) != top_k:
        raise TraceError(f"{path}:{n}: {what} has {len(ids) if isinstance(ids, list) else ids!r}"
                         f" experts, expected top_k={top_k}")
    if any(not _is_int(i) or not 0 <= i < num_experts for i in ids):
        top = "E-1" if num_experts == _ANY else num_experts - 1  # E: not known yet
        raise TraceError(f"{path}:{n}: {what} has expert ids outside 0..{top}: {ids}")
    if len(set(ids)) != len(ids):
        raise TraceError(f"{path}:{n}: {what} routes to the same expert twice: {ids}")
    return ids


_ANY = 1 << 30  # no upper bound known while parsing: ids are checked against the count after


def _within_given(path, n, ids, num_experts, what):
    """Ids against an expert count the caller stated (replay.num_experts)."""
    if num_experts is not None:
        bad = max(ids)
        if bad >= num_experts:
            raise TraceError(f"{path}:{n}: {what} routes to expert {bad}, but "
                             f"replay.num_experts={num_experts} allows ids 0..{num_experts - 1}")


def _settle_num_experts(max_id: int, stated: int | None,
                        given: int | None) -> tuple[int, str]:
    if stated is not None:
        return stated, "header"
    if given is not None:
        return given, "config"
    return max_id + 1, "inferred"


def _load_capture(path: str, given: int | None) -> tuple[Trace, ImportNotes]:
    rows = _rows(path)
    _, head = next(rows)
    meta = head["meta"]
    if not isinstance(meta, dict):
        raise TraceError(f"{path}:1: 'meta' must be an object")
    try:
        layers, top_k = int(meta["layers"]), int(meta["top_k"])
    except (KeyError, TypeError, ValueError) as e:
        raise TraceError(f"{path}:1: meta lacks layers/top_k ({e!r})") from e
    stated = meta.get("n_experts")
    if stated is not None:
        if not _is_int(stated) or stated < 1:
            raise TraceError(f"{path}:1: meta n_experts={stated!r} is not a positive integer "
                             "(null when unknown)")
        if given is not None and given != stated:
            raise TraceError(f"{path}:1: the header says n_experts={stated}, but "
                             f"replay.num_experts={given}")
    bound = stated if stated is not None else _ANY
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
        step = []
        for l in range(layers):
            ids = _ids_row(path, n, routed[str(l)], top_k, bound, f"layer {l}")
            _within_given(path, n, ids, given, f"layer {l}")
            step.append(ids)
        steps.append(step)
    if "steps" in meta and len(steps) != int(meta["steps"]):
        raise TraceError(f"{path}: truncated: {len(steps)} steps, meta says {meta['steps']}")
    if not steps:
        raise TraceError(f"{path}: no steps")
    ids = np.asarray(steps, np.int64)
    num_experts, source = _settle_num_experts(int(ids.max()), stated, given)
    notes = ImportNotes("capture", num_experts, source, int(ids.max()))
    if source == "inferred":
        log.warning("%s: the header states no n_experts: inferred %d from the largest expert "
                    "id (give --config.replay.num_experts=N to state it)", path, num_experts)
    trace = Trace({"format": FORMAT, "model": {"name": meta.get("model")},
                   "layers": list(range(layers)), "num_experts": num_experts, "top_k": top_k,
                   "expert_bytes": None, "lookahead": 0, "prefill_passes": 0, "source": path,
                   "info": {**meta, "num_experts_source": source}},
                  np.arange(len(steps) + 1, dtype=np.int64), np.full(len(steps), -1, np.int32),
                  ids)
    trace.validate(path)
    return trace, notes


def _load_vllm(path: str, given: int | None, strict: bool) -> tuple[list[Trace], ImportNotes]:
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
        _ids_row(path, n, ids, top_k, _ANY, "row")
        _within_given(path, n, ids, given, "row")
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
    num_experts, source = _settle_num_experts(max_expert, None, given)
    notes = ImportNotes("vllm", num_experts, source, max_expert)
    traces = []
    for problem, tokens in per_problem.items():
        order = sorted(tokens)
        if order != list(range(order[0], order[0] + len(order))):
            raise TraceError(f"{path}: problem {problem!r} has gaps in token_idx")
        order = _complete_prefix(path, problem, tokens, order, layers, strict, notes)
        if not order:
            continue
        ids = np.empty((len(order), len(layers), top_k), np.int64)
        weights = np.empty((len(order), len(layers), top_k), np.float32)
        have_weights = True
        for r, tok in enumerate(order):
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
                       "info": {"problem_id": problem, "num_experts_source": source}},
                      np.arange(len(order) + 1, dtype=np.int64), np.full(len(order), -1, np.int32),
                      ids, weights if have_weights else None)
        trace.validate(path)
        traces.append(trace)
    _warn_skipped(path, notes, len(layers))
    if not traces:
        raise TraceError(f"{path}: no problem has a token with rows for all {len(layers)} "
                         f"layers {layers}: nothing complete to replay")
    return traces, notes


def _complete_prefix(path, problem, tokens, order, layers, strict, notes) -> list:
    """The tokens of `order` up to the problem's last complete one; the incomplete ones after
    it are recorded in `notes` as skipped. Incomplete tokens before it (or any, when `strict`)
    are errors."""
    want = set(layers)
    complete = [tok for tok in order if set(tokens[tok]) == want]
    last = complete[-1] if complete else None
    for tok in order:
        lacks = sorted(want - set(tokens[tok]))
        if not lacks:
            continue
        where = f"{path}: problem {problem!r} token {tok} lacks layers {lacks}"
        if last is not None and tok < last:
            raise TraceError(f"{where}, in the middle of its sequence (token {last} is "
                             "complete): the tokens after it would replay with a wrong cache "
                             "context; only trailing incomplete tokens are skipped")
        if strict:
            raise TraceError(f"{where} (replay.strict: incomplete tokens are errors; without it "
                             "trailing ones are skipped)")
        notes.skipped_tokens.append({"problem": problem, "token": tok, "missing_layers": lacks})
    if last is None:
        notes.skipped_problems.append({"problem": problem, "tokens": len(order)})
        return []
    return [tok for tok in order if tok <= last]


def _warn_skipped(path: str, notes: ImportNotes, num_layers: int) -> None:
    skipped = notes.skipped_tokens
    for s in skipped[:MAX_WARNED_TOKENS]:
        log.warning("%s: problem %r token %d lacks layers %s: skipped (trailing)", path,
                    s["problem"], s["token"], s["missing_layers"])
    for p in notes.skipped_problems:
        log.warning("%s: problem %r: none of its %d tokens has all %d layers: problem skipped",
                    path, p["problem"], p["tokens"], num_layers)
    if skipped:
        more = len(skipped) - MAX_WARNED_TOKENS
        log.warning("%s: skipped %d incomplete trailing token(s)%s%s; --config.replay.strict=True "
                    "makes them errors", path, len(skipped),
                    f" ({more} more not named here)" if more > 0 else "",
                    f" and {len(notes.skipped_problems)} problem(s) with no complete token"
                    if notes.skipped_problems else "")
