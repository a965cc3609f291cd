"""Hotlists: the experts a routing trace used most, ranked, to seed the expert cache's
priorities (the `priority` eviction policy) the way ds4 seeds its GPU cache from per-model
compiled hotlists.

A hotlist ranks `(layer, expert)` keys hottest first by how often the trace routed to them;
rank r of n becomes the cache priority `priority(r, n)`, 32 for the hottest down to about 1
for the coldest, and experts off the list keep priority 0. Priorities order eviction, they do
not pin: a hot expert can still be evicted, only after everything colder.

`cache.seed` names the hotlist a run seeds from:

* `""` or `none`: no seeding;
* `hotlist(trace=PATH)` or `hotlist(trace=PATH, top=N)`: the hottest N keys (all without
  `top`) of the trace at PATH. PATH is a trace file in any format `load_traces` reads, or the
  work directory of an earlier generate run made with `--config.tracing.record=True` (its
  `trace.npz`). Several traces, their counts summed: PATH is the paths joined by `,`
  (`hotlist(trace=a.npz,b.jsonl, top=64)`). Arguments are split only at a `,` that starts
  the next `name=`, so a path may hold `,` (not followed by `name=`), `(`, `)` and spaces;
  surrounding quotes are optional (the shell strips them anyway).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence

import numpy as np

from moejax.errors import ConfigError
from moejax.traces import Trace, TraceError, import_traces

__all__ = ["Hotlist", "MAX_PRIORITY", "from_trace", "from_traces", "parse_seed", "priority"]

# `moejax.seam.Key`, restated: this module reads traces with numpy alone, without importing JAX.
Key = tuple[int, int]

MAX_PRIORITY = 32  # ds4's range: 1 + 31 * remaining / total spans 1..32
WORKDIR_TRACE = "trace.npz"  # what a generate run with tracing.record writes in its work dir
SEED_FORMS = "'' or 'none' (no seeding), 'hotlist(trace=PATH)' or 'hotlist(trace=PATH, top=N)'"


def priority(rank: int, total: int) -> int:
    """ds4's cache priority of hotlist rank `rank` (0 = hottest) of `total`:
    `1 + 31 * remaining / total` with `remaining = total - rank`, in integer arithmetic
    (rounded down: the dossier gives ds4's formula, not its rounding): 32 for rank 0, then
    down in steps of 31/total to `1 + 31 // total` for the last (1 once total > 31). Always
    in 1..32, so every listed key outranks the unlisted ones (priority 0)."""
    if total < 1 or not 0 <= rank < total:
        raise ValueError(f"rank {rank} out of range for a hotlist of {total}")
    return 1 + (MAX_PRIORITY - 1) * (total - rank) // total


@dataclasses.dataclass
class Hotlist:
    """Keys ranked hottest first, their request counts, and where they came from.

    `layers` (MoE layer indices) and `num_experts` are the shape of the traces it was counted
    on, for `check_against`; `num_experts_inferred`: no trace stated its expert count (an
    id-only capture), so it is only the largest id seen + 1."""

    keys: list[Key]
    counts: dict[Key, int]
    source: str
    layers: list[int] = dataclasses.field(default_factory=list)
    num_experts: int = 0
    num_experts_inferred: bool = False

    def top(self, n: int) -> Hotlist:
        """The hottest `n` keys (all of them when there are fewer)."""
        if n < 0:
            raise ValueError(f"top needs n >= 0, got {n}")
        keys = self.keys[:n]
        return dataclasses.replace(self, keys=keys, counts={k: self.counts[k] for k in keys})

    def priorities(self) -> dict[Key, int]:
        """`{key: priority(rank, len(keys))}` over the keys (what `Priority.set_priorities`
        takes); ranks are relative to this list, so a `top(n)` list spans 1..32 itself."""
        total = len(self.keys)
        return {key: priority(rank, total) for rank, key in enumerate(self.keys)}

    def check_against(self, layers: int | Sequence[int], num_experts: int) -> None:
        """Raises ConfigError (naming both shapes) unless the traces come from a model with
        these MoE `layers` (their indices, or just their count) and `num_experts`: a hotlist
        of another model would seed priorities for keys that mean different experts."""
        mine = f"the hotlist traces ({self.source}) have layers {self.layers}"
        if isinstance(layers, int):
            if len(self.layers) != layers:
                raise ConfigError(f"cache.seed: {mine} ({len(self.layers)} MoE layers), the "
                                  f"model has {layers}")
        elif list(self.layers) != [int(l) for l in layers]:
            raise ConfigError(f"cache.seed: {mine}, the model's MoE layers are {list(layers)}")
        if self.num_experts_inferred:
            # The count is only a lower bound: the ids seen must fit the model.
            if self.num_experts > num_experts:
                raise ConfigError(f"cache.seed: the hotlist traces ({self.source}) route to "
                                  f"expert {self.num_experts - 1}, the model has "
                                  f"num_experts={num_experts}")
        elif self.num_experts != num_experts:
            raise ConfigError(f"cache.seed: the hotlist traces ({self.source}) have "
                              f"num_experts={self.num_experts}, the model has "
                              f"num_experts={num_experts}")


def _counts(trace: Trace, decode_only: bool) -> dict[Key, int]:
    """Per-(layer, expert) requests of one sequence: every token row routes to top_k experts
    of every layer, each one request."""
    ids = trace.ids
    if decode_only:
        ids = ids[int(trace.pass_offsets[trace.prefill_passes]):]
    L, E = len(trace.layers), trace.num_experts
    flat = (ids + (np.arange(L) * E)[None, :, None]).ravel()
    per = np.bincount(flat, minlength=L * E).reshape(L, E)
    return {(int(trace.layers[i]), int(e)): int(per[i, e]) for i, e in zip(*np.nonzero(per))}


def from_traces(traces: Sequence[Trace], *, source: str = "",
                decode_only: bool = False) -> Hotlist:
    """The hotlist of in-memory traces (all of one model): request counts over all their
    sequences (the decode passes only with `decode_only`), ranked by count, ties in
    (layer, expert) order so the same traces always give the same list. Keys never routed to
    are not listed."""
    if not traces:
        raise ValueError("a hotlist needs at least one trace")
    first = traces[0]
    counts: dict[Key, int] = {}
    for trace in traces:
        if trace.layers != first.layers:
            raise ConfigError(f"cache.seed: the hotlist traces disagree on their layers "
                              f"({first.layers} and {trace.layers})")
        for key, n in _counts(trace, decode_only).items():
            counts[key] = counts.get(key, 0) + n
    keys = sorted(counts, key=lambda k: (-counts[k], k))
    return Hotlist(keys, {k: counts[k] for k in keys}, source, list(first.layers),
                   max(t.num_experts for t in traces))


def _resolve(path: str) -> str:
    """A trace file, or an earlier run's work directory's trace.npz."""
    if os.path.isdir(path):
        inner = os.path.join(path, WORKDIR_TRACE)
        if not os.path.isfile(inner):
            raise ConfigError(f"cache.seed: {path} is a work directory without {WORKDIR_TRACE}; "
                              "repeat that run with --config.tracing.record=True to record "
                              "its routing trace")
        return inner
    if not os.path.isfile(path):
        raise ConfigError(f"cache.seed: trace file {path} does not exist")
    return path


def from_trace(path: str, *, num_experts: int | None = None,
               decode_only: bool = False) -> Hotlist:
    """The hotlist of the trace file(s) at `path`: any format `load_traces` reads, or a work
    directory holding a recorded `trace.npz`; several paths joined by `,` have their counts
    summed. `num_experts` states the model's expert count for files that do not (id-only
    captures and vLLM logs), as the replay job's `replay.num_experts` does.

    Errors are ConfigErrors naming `cache.seed`: a missing file, a work directory without a
    recorded trace, a malformed trace, traces of different models."""
    paths = [p.strip() for p in path.split(",") if p.strip()]
    if not paths:
        raise ConfigError(f"cache.seed: no trace path in {path!r}")
    traces: list[Trace] = []
    stated: set[int] = set()
    inferred = True
    for p in paths:
        file = _resolve(p)
        try:
            imported = import_traces(file, num_experts=num_experts)
        except TraceError as e:
            raise ConfigError(f"cache.seed: {e}") from e
        if not imported.notes.num_experts_inferred:
            inferred = False
            stated.add(imported.notes.num_experts)
        traces.extend(imported.traces)
    if len(stated) > 1:
        raise ConfigError(f"cache.seed: the hotlist traces {paths} disagree on num_experts "
                          f"({sorted(stated)})")
    hot = from_traces(traces, source=",".join(paths), decode_only=decode_only)
    if stated:
        # An inferred count (largest id + 1) must fit under the one a file states.
        (n,) = stated
        if hot.num_experts > n:
            raise ConfigError(f"cache.seed: the hotlist traces {paths} route to expert "
                              f"{hot.num_experts - 1}, but one states num_experts={n}")
        hot.num_experts = n
    hot.num_experts_inferred = inferred
    return hot


_SEED = re.compile(r"\s*hotlist\s*\((?P<args>.*)\)\s*", re.DOTALL)
# A `,` that starts the next argument, `name=...` (any name, so a misspelt one is an error
# rather than part of the path before it); every other `,` belongs to a path.
_ARG_SPLIT = re.compile(r",\s*(?=[A-Za-z_]\w*\s*=)")


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def parse_seed(spec: str, field: str = "cache.seed") -> dict | None:
    """A `cache.seed` value (or `field`'s, e.g. `cache.warm_start`): None for no seeding (`""`,
    `none`), else `{"kind": "hotlist", "trace": PATH, "top": N or None}` (see the module
    docstring for the syntax). Anything else is a ConfigError naming `field` and the accepted
    forms."""
    text = (spec or "").strip()
    if text.lower() in ("", "none"):
        return None
    m = _SEED.fullmatch(text)
    if m is None:
        raise ConfigError(f"{field}={spec!r} is not understood; accepted: {SEED_FORMS}")
    args: dict[str, str] = {}
    inner = m["args"].strip()
    for part in _ARG_SPLIT.split(inner) if inner else []:
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or name not in ("trace", "top"):
            raise ConfigError(f"{field}={spec!r}: unknown argument {part.strip()!r}; "
                              f"accepted: {SEED_FORMS}")
        if name in args:
            raise ConfigError(f"{field}={spec!r}: {name!r} given twice")
        args[name] = _unquote(value)
    if not args.get("trace"):
        raise ConfigError(f"{field}={spec!r}: hotlist needs trace=PATH; accepted: "
                          f"{SEED_FORMS}")
    top = None
    if "top" in args:
        try:
            top = int(args["top"])
        except ValueError:
            top = 0
        if top < 1:
            raise ConfigError(f"{field}={spec!r}: top must be a positive integer, got "
                              f"{args['top']!r}")
    return {"kind": "hotlist", "trace": args["trace"], "top": top}
