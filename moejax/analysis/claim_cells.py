"""The cells a claims table reads: each finished cell of a sweep as a row, with the trace it
replayed identified by its own metadata and the complete condition it ran under.

A trace's **identity** is what routed it, read from results.json's `trace` section (never from
the folder the file sits in): the model (`trace.model`: "embedded", "mixtral/tiny" for a
random-weight preset, a capture's checkpoint name), its MoE layers, experts and top-k. Traces
of one identity form a group (`OLMoE-1B-7B · 16 layers × 64 experts, top-8`). A trace is named
by its file's stem, and by `folder/stem` where two files of one group share a stem.

A cell's **condition** (`CONDITION`) is everything the claims do not compare but that changes
the numbers: the prefetch queue, the capacity's share and what it is a share of, precision,
bandwidth, hardware profile and the request cut; any other config field that differs between
cells of a group is kept too (`Row["other"]`). Cells that differ in any of these are never
averaged: the claims read them as separate rows. Per trace, the capacity in slots and in
passes: slots ÷ (MoE layers × top-k), the fewest distinct experts a pass requests (one decode
token's; a prefill pass requests at least as many).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
from typing import Iterable

from moejax.analysis.sweep_cells import EMBEDDED_MODEL, scan

# Real models by a word in a trace's model name: (shown name, the paper's model column,
# (MoE layers, experts, top-k) of the real model: a name alone does not make a trace real).
MODELS = (("olmoe", "OLMoE-1B-7B", "OLMoE", (16, 64, 8)),
          ("qwen", "Qwen1.5-MoE-A2.7B", "Qwen", (24, 60, 4)),
          ("mixtral", "Mixtral-8x7B", "Mixtral", (32, 8, 2)),
          ("phi", "Phi-3.5-MoE", "Phi", (32, 16, 2)))
# The condition of a cell, as claims.json names its fields: (field, the config key it reads).
CONDITION = (("queue", "cache.prefetch_queue"), ("capacity_of", "cache.capacity_of"),
             ("precision", "cache.precision"), ("h2d_gbps", "hardware.h2d_gbps"),
             ("hardware", "hardware.preset"), ("request_tokens", "replay.request_tokens"),
             ("prefill_tokens", "replay.prefill_tokens"))
# Config keys that are not a condition: what the claims compare (policies), the trace (the
# identity), the capacity (read per claim), and what does not change a number (the replay
# engine: both give the reference's numbers exactly; logging; the train job's section). Every
# other field is. (A cell's config reads by the current names: `sweep_cells.cell_row`.)
NOT_CONDITION = ("policies.", "cache.capacity_frac", "cache.slots", "replay.engine", "log.",
                 "train.")
TRACE_FIELD = "replay.trace"


def _json(value, default=None):
    if value is None:
        return default
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value


@dataclasses.dataclass(frozen=True)
class Identity:
    """What routed a trace, from its own metadata."""

    model: str  # the trace's model name ("embedded", "mixtral/tiny", "olmoe", ...)
    layers: int | None  # MoE layers
    experts: int | None
    top_k: int | None
    synthetic: bool  # a random-weight preset: architecture only

    @property
    def real(self) -> tuple[str, str] | None:
        """(shown name, the paper's column) of the real model this trace is from, if any."""
        low = self.model.lower()
        for prefix, shown, paper, shape in MODELS:
            if prefix in low and not self.synthetic and (
                    self.layers is None or (self.layers, self.experts, self.top_k) == shape):
                return shown, paper
        return None

    @property
    def paper_model(self) -> str | None:
        return self.real[1] if self.real else None

    @property
    def group(self) -> str:
        shown = self.real[0] if self.real else self.model
        if self.synthetic:
            shown += " (random weights)"
        if self.layers is None:
            return shown
        return f"{shown} · {self.layers} layers × {self.experts} experts, top-{self.top_k}"

    @property
    def pass_experts(self) -> int | None:
        """The fewest distinct experts a pass requests: one token's, layers × top-k."""
        return self.layers * self.top_k if self.layers and self.top_k else None


def identity(results: dict, setup: dict) -> Identity:
    """A cell's trace identity from results.json's `trace` section; for results written before
    it recorded the model, the cell's model config (`model.preset`, `model.family`)."""
    t = results.get("trace") if isinstance(results.get("trace"), dict) else {}
    model = t.get("model")
    synthetic = bool(t.get("synthetic"))
    if not model:  # an older results.json
        preset = str(_json(setup.get("model.preset"), "") or "")
        family = str(_json(setup.get("model.family"), "") or "")
        model = EMBEDDED_MODEL if preset == EMBEDDED_MODEL else (preset or family or "unknown")
    layers = t.get("layers")
    n_layers = len(layers) if isinstance(layers, list) else None
    return Identity(str(model), n_layers, t.get("num_experts"), t.get("top_k"), synthetic)


def condition_of(row: dict) -> dict:
    """The named condition of a cell (CONDITION's fields; None where unrecorded)."""
    setup = row["setup"]
    out = {name: _json(setup.get(key)) for name, key in CONDITION}
    out["queue"] = row["queue"]
    out["h2d_gbps"] = row["h2d_gbps"]
    out["precision"] = row.get("precision") or out["precision"]
    out["hardware"] = row.get("hardware") or out["hardware"]
    return out


def other_of(setup: dict) -> tuple:
    """Every config field not a condition and not in NOT_CONDITION, as sorted pairs."""
    named = {key for _, key in CONDITION}
    return tuple(sorted((k, v) for k, v in setup.items()
                        if k not in named and k != TRACE_FIELD
                        and not k.startswith(NOT_CONDITION)))


def capacity_passes(slots: int | None, ident: Identity) -> float | None:
    n = ident.pass_experts
    return slots / n if slots is not None and n else None


# Shown first, in this order; any other queue in the sweep (`watchdog_idle`) follows by name.
QUEUES = ("immediate", "watchdog")


def queue_order(queues: Iterable[str]) -> list[str]:
    """immediate, watchdog, then any other queue by name."""
    return sorted(set(queues), key=lambda q: (QUEUES.index(q) if q in QUEUES else len(QUEUES),
                                              q))


def _condition_key(r: dict) -> tuple:
    c = r["condition"]
    q = str(c.get("queue"))
    return ((QUEUES.index(q) if q in QUEUES else len(QUEUES), q),
            *(str(c.get(k)) for k in sorted(c) if k != "queue"), r["other"])


def conditions(rows: list[dict]) -> list[tuple[dict, list[dict]]]:
    """The rows split by condition (named and `other`), in a stable order; each condition's
    dict names the fields that differ from other conditions under `other`."""
    by = collections.defaultdict(list)
    for r in rows:
        by[_condition_key(r)].append(r)
    keys = sorted(by)
    varying = {k for k in dict.fromkeys(k for key in keys for k, _ in key[-1])
               if len({dict(key[-1]).get(k) for key in keys}) > 1}
    out = []
    for key in keys:
        first = by[key][0]
        cond = dict(first["condition"])
        other = {k: v for k, v in first["other"] if k in varying}
        if other:
            cond["other"] = other
        out.append((cond, by[key]))
    return out


# -- specs -----------------------------------------------------------------------------------
LS_DEFAULT_ORDER = "two_queue"
LS_POSITIONAL = ("order", "prefetch_current")  # LeastStale's arguments, in their order
# The compiled engine's record of the eviction it built (`replay.engine_reason`).
_BUILT_LS = re.compile(r"\beviction least_stale\(([^)]*)\)")


def norm(spec: str) -> str:
    """A spec without spaces, quotes or empty parentheses: `none()` is `none`."""
    s = str(spec).replace(" ", "").replace('"', "").replace("'", "")
    return s[:-2] if s.endswith("()") else s


def built_eviction(results: dict) -> str:
    """The eviction policy a cell built, as text `eviction least_stale(order=...)`: from
    `cache.policies.arguments` (results.json records each policy's arguments as built), else
    from the compiled engine's `replay.engine_reason` (sweeps run before that record)."""
    policies = (results.get("cache") or {}).get("policies") or {}
    args = (policies.get("arguments") or {}).get("eviction")
    if args is not None and "order" in args:
        return f"eviction least_stale(order={args['order']})"
    return str((results.get("replay") or {}).get("engine_reason") or "")


def least_stale_spec(spec: str, built: str = "") -> str:
    """A Least-Stale spec with its order spelled out (other specs as they are): the order
    given, else the one `built` names (`built_eviction`: what the cell recorded it built),
    else the default. So `least_stale` of a sweep run before the default changed reads as
    `least_stale(order=left_first)`, and of a later one as `least_stale(order=two_queue)`."""
    name, _, rest = norm(spec).partition("(")
    if name != "least_stale":
        return spec
    args = dict(a.split("=", 1) if "=" in a else (LS_POSITIONAL[i], a)
                for i, a in enumerate(rest.rstrip(")").split(",")) if a)
    if "order" not in args:
        found = _BUILT_LS.search(built)
        order = re.search(r"order=(\w+)", norm(found.group(1))) if found else None
        args = {"order": order.group(1) if order else LS_DEFAULT_ORDER, **args}
    return "least_stale(" + ",".join(f"{k}={v}" for k, v in args.items()) + ")"


# -- capacities ------------------------------------------------------------------------------
def parse_capacity(text: str) -> tuple:
    """`0.05` -> (0, 0.05) (a fraction); `5%` -> (0, 0.05); `8slots`, `8 slots`, `slots=8` ->
    (1, 8). Anything else is a ValueError saying what it takes."""
    t = str(text).strip().lower().replace(" ", "")
    m = re.fullmatch(r"(?:slots=)?(\d+)slots?|slots=(\d+)", t)
    if m:
        return (1, int(m.group(1) or m.group(2)))
    try:
        v = float(t.rstrip("%")) / (100 if t.endswith("%") else 1)
    except ValueError:
        v = math.nan
    if not 0 < v <= 1:
        raise ValueError(f"{text!r} is not a capacity: a fraction (0.05), a percentage (5%) "
                         f"or a slot count (8slots)")
    return (0, v)


def capacity_text(key: tuple) -> str:
    return f"{key[1]} slots" if key[0] == 1 else f"{100 * key[1]:.3g}%"


def same_capacity(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and math.isclose(float(a[1]), float(b[1]), rel_tol=1e-9)


def at_capacity(rows: list[dict], key: tuple) -> list[dict]:
    return [r for r in rows if same_capacity(tuple(r["capacity_key"]), key)]


def select(rows: list[dict], eviction: str | None = None, prefetch: str | None = None,
           miss: str | None = "fetch", routing: str | None = "standard",
           preset: str | None = "") -> list[dict]:
    """Rows running the given specs (None: any); by default plain cells (no preset) with the
    fetch miss policy and standard routing."""
    want = {"eviction": eviction, "prefetch": prefetch, "miss": miss, "routing": routing}
    return [r for r in rows if (preset is None or r["preset"] == preset)
            and all(v is None or norm(r[k]) == norm(v) for k, v in want.items())]


# -- loading ---------------------------------------------------------------------------------
def _extras(row: dict, results: dict) -> dict:
    setup, total = row["setup"], results["cache"]["total"]
    t = results.get("trace") if isinstance(results.get("trace"), dict) else {}
    ident = identity(results, setup)
    requests = total.get("requests")

    def share(key):
        return total[key] / requests if requests and total.get(key) is not None else None

    hardware = ((results.get("cache") or {}).get("hardware") or {}).get("name")
    return {"identity": ident, "group": ident.group, "paper_model": ident.paper_model,
            "synthetic": ident.synthetic,
            "trace_path": str(t.get("path") or _json(setup.get(TRACE_FIELD), "")
                              or row["trace"]),
            "eviction": least_stale_spec(row["eviction"], built_eviction(results)),
            "has_scores": t.get("has_scores"), "dropped": total.get("dropped"),
            "substituted": total.get("substituted"), "dropped_share": share("dropped"),
            "substituted_share": share("substituted"), "hardware": hardware,
            "decode_s": ((results["cache"].get("timing") or {}).get("decode_s")),
            "cold_ttft": row["cold_ttft_s"] if row["cold_ttft_s"] is not None
            else row["ttft_s"], "other": other_of(setup)}


@dataclasses.dataclass
class Loaded:
    rows: list[dict]
    summary: list[str]  # one line per sweep: finished, unfinished and failed cells


def load(sweep_dirs: Iterable[str]) -> Loaded:
    """The finished cells of every sweep as `sweep_cells.cell_row` rows, plus their trace's
    identity and group, condition (`condition_of`, `other`), a Least-Stale eviction with its
    order spelled out (`least_stale_spec`) and the counters cell_row leaves out."""
    rows, summary = [], []
    for d in sweep_dirs:
        sweep = scan(d)
        n = 0
        for row in sweep.rows:
            try:
                with open(os.path.join(d, "cells", row["name"], "results.json")) as f:
                    results = json.load(f)
                row = {**row, **_extras(row, results), "sweep": d}
                row["condition"] = condition_of(row)
                rows.append(row)
                n += 1
            except (OSError, ValueError, KeyError, TypeError) as e:
                sweep.failed[row["name"]] = f"{type(e).__name__}: {e}"
        summary.append(f"{d}: {n} finished cells, {len(sweep.unfinished)} unfinished, "
                       f"{len(sweep.failed)} failed")
    _unique_names(rows)
    return Loaded(rows, summary)


def _unique_names(rows: list[dict]) -> None:
    """Two files of one group with one stem are named `folder/stem` (never merged)."""
    paths: dict = {}
    for r in rows:
        paths.setdefault((r["group"], r["trace"]), set()).add(os.path.normpath(r["trace_path"]))
    for r in rows:
        if len(paths[(r["group"], r["trace"])]) > 1:
            parent = os.path.basename(os.path.dirname(os.path.normpath(r["trace_path"])))
            r["trace"] = f"{parent}/{r['trace']}"
