"""The cells of a sweep as flat rows: loading each `cells/<cell>/results.json`, the grouping and
baseline helpers the report's tables (`report.py`) and figures (`report_figures.py`) share, and
the pairing of SpecMD's drop-in experiment (`dropin_pairs`).

Hits are always carried apart: `ready_hit_rate` (resident and ready) and `late_hit_rate` (in
flight when needed); `hit_rate` is their sum (DESIGN.md). Fields a cell's results.json does
not have (older sweeps) are None, except `ready_hit_rate`, which an older cell's counters
give (`hits / requests`, its definition)."""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import os
from typing import Any, Iterable

from moejax.jobs.schema import current_config

# Known policies in the paper's order (Fig. 4: FLD, SB, LRU, LS); unknown ones follow by name.
EVICTION_ORDER = ("fld", "score", "lru", "lru_per_layer", "lfu", "lhu", "least_stale", "belady")
PREFETCH_ORDER = ("none", "topk", "score_percentile", "oracle")
SCALARS = ("requests", "hits", "late_hits", "misses", "collision_misses", "hit_rate",
           "ready_hit_rate", "late_hit_rate", "miss_rate", "collision_miss_rate",
           "collision_share_of_misses", "prefetch_precision", "prefetch_recall",
           "prediction_precision", "prediction_recall", "evicted_before_use", "prefetch_dropped",
           "stall_s", "h2d_bytes", "demand_bytes", "prefetch_bytes", "wasted_prefetch_bytes")
TIMING = ("ttft_s", "cold_ttft_s", "warm_ttft_s", "decode_tok_per_s")
# A quality job's (moejax/jobs/quality.py) comparison with its reference: None in rows of
# other jobs. `drift_*` come from its `quality.drift` section.
QUALITY = ("kl_mean", "kl_p99", "top1_agreement", "bits_per_byte", "reference_bits_per_byte",
           "bits_per_byte_delta", "drift_identical_share", "drift_mean_tokens_to_divergence")
# The host tier's counters (moejax/cache/host_tier.py), as `host_<name>` columns.
DISK = ("requests", "hit_rate", "ready_hit_rate", "misses", "demand_misses", "read_ahead",
        "storage_reads", "storage_bytes", "storage_stall_s")
# The label `model_label` gives the model moejax ships.
EMBEDDED_MODEL = "embedded"
# The eviction SpecMD's drop-in experiment puts into each preset.
DROPIN_EVICTION = "least_stale"
# Config fields the drop-in pairing ignores: the eviction itself (what the pair differs in)
# and the policy fields, which enter resolved (`eviction`, `prefetch`, ... of the row).
# The bandwidth enters as the effective one (the hardware preset's when not given).
_PAIR_IGNORED_PREFIXES = ("policies.", "hardware.h2d_gbps")

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Sweep:
    rows: list[dict]  # one per finished cell, sorted by name
    unfinished: list[str]  # cell directories without results.json
    failed: dict[str, str]  # cell name -> why its results.json could not be used
    # cell name -> why its results.json does not parse (also in `failed`): jobs write it
    # atomically, so such a file was written by something else, or damaged
    corrupt: dict[str, str] = dataclasses.field(default_factory=dict)


# -- loading ---------------------------------------------------------------------------------
def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path.rstrip("/")))[0]


def trace_name(results: dict, config: dict) -> str:
    t = results.get("trace")  # replay: {"path", "name"}; a live recording's is a bare path
    if isinstance(t, dict):
        if t.get("name"):
            return str(t["name"])
        if t.get("path"):
            return _stem(str(t["path"]))
    c = (config.get("replay") or {}).get("trace") or config.get("trace")  # (the old name)
    if isinstance(c, dict):
        c = c.get("path")
    return _stem(c) if isinstance(c, str) and c else "live"


def capacity_label(cache_cfg: dict, effective: float | None) -> tuple[str, tuple]:
    """The configured capacity as a label and a sort key (fractions before slot counts)."""
    slots = int(cache_cfg.get("slots") or 0)
    if slots > 0:
        return f"{slots} slots", (1, slots)
    frac = cache_cfg.get("capacity_frac", effective)
    if frac is None:
        return "?", (2, 0)
    of = " of the model" if cache_cfg.get("capacity_of") == "model" else ""
    return f"{100 * float(frac):.3g}%{of}", (0, float(frac))


def flatten(config: Any, prefix: str = "") -> dict[str, str]:
    """A nested config as `{"cache.slots": "8", ...}`, each value as canonical JSON."""
    if not isinstance(config, dict):
        return {prefix.rstrip("."): json.dumps(config, sort_keys=True, default=str)}
    out = {}
    for k, v in config.items():
        out.update(flatten(v, f"{prefix}{k}.") if isinstance(v, dict)
                   else {f"{prefix}{k}": json.dumps(v, sort_keys=True, default=str)})
    return out


def _ready_hit_rate(total: dict):
    if "ready_hit_rate" in total:  # None when the cache could not tell (sizes unknown)
        return total["ready_hit_rate"]
    hits, requests = total.get("hits"), total.get("requests")  # an older results.json
    return hits / requests if hits is not None and requests else None


def model_label(results: dict, config: dict) -> str | None:
    """A short name of the model a cell ran: "embedded" (the model moejax ships),
    "family/preset" of a random-weight preset (source "preset:mixtral/tiny"), else the
    checkpoint directory's name; None when results.json names no model (replay)."""
    model = results.get("model")
    if not isinstance(model, dict):
        return None
    source = str(model.get("source") or "")
    cfg = config.get("model") or {}
    if source.startswith("preset:"):
        return source[len("preset:"):]
    if (not cfg.get("checkpoint") and cfg.get("preset") == "embedded") or \
            source.replace("\\", "/").rstrip("/").endswith("assets/small_moe"):
        return EMBEDDED_MODEL
    return os.path.basename(source.rstrip("/")) or None


def _quality_columns(results: dict) -> dict:
    q = results.get("quality")
    if not isinstance(q, dict):
        return dict.fromkeys(QUALITY)
    drift = q.get("drift") or {}
    out = {k: q.get(k) for k in QUALITY if not k.startswith("drift_")}
    out["drift_identical_share"] = drift.get("identical_share")
    out["drift_mean_tokens_to_divergence"] = drift.get("mean_tokens_to_divergence")
    return out


def _disk_columns(cache: dict, config: dict) -> dict:
    """The disk tier's columns (None without a host tier): its size and policy, the storage,
    its counters, and the placement (`cache.seed`, `cache.full_layers`)."""
    host = cache.get("host") or {}
    total, storage = host.get("total") or {}, host.get("storage") or {}
    cfg = config.get("cache") or {}
    return {"host_capacity_frac": cfg.get("host_capacity_frac") if host else None,
            "host_experts": host.get("capacity_experts"),
            "host_eviction": host.get("eviction"),
            "storage": storage.get("preset"), "storage_read_gbps": storage.get("read_gbps"),
            **{f"host_{k}": total.get(k) for k in DISK}, "seed": str(cfg.get("seed") or ""),
            "full_layers": int(cfg.get("full_layers") or 0)}


def cell_row(name: str, results: Any) -> dict:
    if not isinstance(results, dict):
        raise TypeError("results.json does not hold an object")
    if results.get("error"):
        raise ValueError(f"the job reported an error: {results['error']}")
    if not isinstance(results.get("cache"), dict):
        raise KeyError("no 'cache' section (was the cache enabled?)")
    # A cell run before fields moved into their job's section (`trace` is `replay.trace`
    # now) reads as one run since: every field below by its current name.
    cache, config = results["cache"], current_config(results.get("config") or {})
    total, timing = cache["total"], cache.get("timing") or {}
    # The resolved policies the cache ran (a preset expands to four) win over the config fields.
    policies = {**(config.get("policies") or {}), **(cache.get("policies") or {})}
    hw = {**(config.get("hardware") or {}), **(cache.get("hardware") or {})}
    capacity, capacity_key = capacity_label(config.get("cache") or {}, cache.get("capacity_frac"))
    per_layer = cache.get("per_layer") or []
    timings = results.get("timings") or {}
    row = {
        "name": name, "trace": trace_name(results, config),
        "capacity": capacity, "capacity_key": capacity_key,
        "capacity_frac": cache.get("capacity_frac"), "slots": cache.get("slots"),
        "h2d_gbps": hw.get("h2d_gbps") or None,
        **{k: str(policies.get(k, "?")) for k in ("eviction", "prefetch", "miss", "routing")},
        # How predictions became transfers (results before the watchdog: immediate).
        "queue": str((config.get("cache") or {}).get("prefetch_queue") or "immediate"),
        **{k: total.get(k) for k in SCALARS},
        "ready_hit_rate": _ready_hit_rate(total),
        **{k: timing.get(k, timings.get(k)) for k in TIMING},
        "ttft_per_request_s": timing.get("ttft_per_request_s"),
        # The preset the cell named ("" if none) and where its eviction came from ("preset":
        # the preset's own, "explicit": policies.eviction given; None in older results).
        "preset": str(policies.get("preset") or ""),
        "eviction_source": (policies.get("source") or {}).get("eviction"),
        "eviction_given": str((config.get("policies") or {}).get("eviction") or ""),
        # Every config field but the policies (resolved above): what a drop-in pair shares.
        "setup": {k: v for k, v in flatten(config).items()
                  if not k.startswith(_PAIR_IGNORED_PREFIXES)},
        "layers": [p.get("layer", i) for i, p in enumerate(per_layer)],
        "layer_collision_miss_rate": [p.get("collision_miss_rate") for p in per_layer],
        "layer_miss_rate": [p.get("miss_rate") for p in per_layer],
    }
    if row["hit_rate"] is None and row["requests"] is None:
        raise KeyError("cache.total has no requests or hit_rate")
    model = results.get("model") if isinstance(results.get("model"), dict) else {}
    row["model"] = model_label(results, config)
    row["precision"] = model.get("precision") or cache.get("precision")
    # The precision pools the cache ran ("int8:int4:int2" for the cascade; None in older
    # results).
    pools = cache.get("pools")
    row["pools"] = ":".join(pools) if isinstance(pools, dict) and pools else None
    row.update(_quality_columns(results))
    row.update(_disk_columns(cache, config))
    if isinstance(results.get("quality"), dict):
        # A quality job's speed is its served (drift) requests' (`speed`), not the cache's
        # whole run, which includes the teacher-forced scoring; the workload is the model.
        speed = results.get("speed") or {}
        row.update({k: speed.get(k) for k in (*TIMING, "stall_s")})
        row["ttft_per_request_s"] = speed.get("ttft_per_request_s")
        text = (results.get("text_file") or (config.get("quality") or {}).get("text_file")
                or config.get("text_file"))
        task = results.get("task")
        workload = _stem(str(text)) if text else (str(task) if task else "")
        row["trace"] = f"{row['model']} · {workload}" if workload else str(row["model"])
    return row


def _last_line(path: str) -> str:
    with open(path, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[-1] if lines else "error.txt (empty)"


def scan(sweep_dir: str) -> Sweep:
    """Every cell of a sweep: finished rows, unfinished and failed cell names."""
    cells_dir = os.path.join(sweep_dir, "cells")
    names = sorted(n for n in os.listdir(cells_dir)
                   if os.path.isdir(os.path.join(cells_dir, n))) if os.path.isdir(cells_dir) else []
    sweep = Sweep([], [], {})
    for name in names:
        path = os.path.join(cells_dir, name, "results.json")
        if not os.path.exists(path):
            error = os.path.join(cells_dir, name, "error.txt")  # launch/worker.py's failure
            if os.path.exists(error):
                sweep.failed[name] = _last_line(error)
            else:
                sweep.unfinished.append(name)
            continue
        try:
            with open(path) as f:
                results = json.load(f)
        except (OSError, ValueError) as e:
            sweep.failed[name] = sweep.corrupt[name] = f"{type(e).__name__}: {e}"
            continue
        try:
            sweep.rows.append(cell_row(name, results))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            sweep.failed[name] = f"{type(e).__name__}: {e}"
    return sweep


# What to do about a results.json that does not parse (jobs write it whole: something else did).
CORRUPT_HINT = ("does not parse as JSON: re-run the sweep (launch.sweep re-runs such a cell) or "
                "delete it")


def check_sweep_dir(sweep_dir: str, flag: str = "--sweep_dir") -> None:
    """`sweep_dir` is a sweep directory (a directory with cells/), or a usage error naming
    `flag`. The analysis tools check this before they read or write anything."""
    from moejax.errors import UsageError

    where = f"{flag}={sweep_dir}"
    if not os.path.exists(sweep_dir):
        raise UsageError(f"{where}: no such directory")
    if not os.path.isdir(sweep_dir):
        raise UsageError(f"{where}: is a file, not a sweep directory")
    if not os.path.isdir(os.path.join(sweep_dir, "cells")):
        raise UsageError(f"{where}: not a sweep directory (it has no cells/ folder; "
                         f"launch.sweep writes DIR/cells/<cell>/results.json)")


def open_sweep(sweep_dir: str, flag: str = "--sweep_dir") -> Sweep:
    """`scan` for a command line: the directory checked (`check_sweep_dir`), and a
    results.json that does not parse a usage error naming it (the numbers of a sweep with
    such a cell would be published without it)."""
    from moejax.errors import UsageError

    check_sweep_dir(sweep_dir, flag)
    sweep = scan(sweep_dir)
    if sweep.corrupt:
        names = sorted(sweep.corrupt)
        first = os.path.join(sweep_dir, "cells", names[0], "results.json")
        more = f" (and {len(names) - 1} more: {', '.join(names[1:4])}" \
               f"{', ...' if len(names) > 4 else ''})" if len(names) > 1 else ""
        raise UsageError(f"{first}{more}: {CORRUPT_HINT} ({sweep.corrupt[names[0]]})")
    return sweep


def report_main(prog: str, doc: str, report, argv: list[str] | None = None) -> int:
    """The command line of a report over one sweep (`prog --sweep_dir=D`, described by `doc`'s
    first paragraph): `report(sweep_dir, rows)` over the sweep's finished cells (`open_sweep`,
    `load_cells`), every error one line and an exit status (`moejax.cli.guarded`)."""
    from moejax import cli

    ap = cli.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    ap.add_argument("--sweep_dir", required=True)
    args = ap.parse_args(argv)
    return cli.guarded(prog, lambda: report(args.sweep_dir,
                                            load_cells(args.sweep_dir,
                                                       open_sweep(args.sweep_dir))))


def load_cells(sweep_dir: str, sweep: Sweep | None = None) -> list[dict]:
    """One flat row per finished cell (of `sweep`, `scan(sweep_dir)` by default); unfinished
    and failed cells are skipped and logged."""
    sweep = scan(sweep_dir) if sweep is None else sweep
    if sweep.unfinished or sweep.failed:
        log.warning("%s: skipped %d unfinished and %d failed cells (%s)", sweep_dir,
                    len(sweep.unfinished), len(sweep.failed),
                    ", ".join(sweep.unfinished + sorted(sweep.failed)))
    return sweep.rows


# -- grouping --------------------------------------------------------------------------------
def order_names(names: Iterable[str], known: tuple[str, ...]) -> list[str]:
    def key(s):
        base = s.split(" · ")[0].split("(")[0].strip()  # a row label "lru · drop(keep=2)"
        return (known.index(base) if base in known else len(known), s)
    return sorted(set(names), key=key)


def capacities(rows: list[dict]) -> list[str]:
    keys = {r["capacity"]: r["capacity_key"] for r in rows}
    return sorted(keys, key=keys.get)


def prefer(rows: list[dict], key: str, preferred: str | None = None):
    values = collections.Counter(r[key] for r in rows)
    if preferred is not None:
        for v in values:  # a spec with arguments still counts: "none" matches "none()"
            if v.split("(")[0].strip() == preferred:
                return v
    return min(values, key=lambda v: (-values[v], str(v))) if values else None


def lowest_bandwidth(rows: list[dict]):
    bws = [r["h2d_gbps"] for r in rows if r["h2d_gbps"] is not None]
    return min(bws) if bws else None


def baseline(rows: list[dict], **preferred) -> tuple[list[dict], dict]:
    """Rows at the lowest bandwidth with each named dimension fixed to its preferred value."""
    bw = lowest_bandwidth(rows)
    rows = [r for r in rows if r["h2d_gbps"] == bw]
    fixed = {"h2d_gbps": bw}
    for key, pref in preferred.items():
        fixed[key] = prefer(rows, key, pref)
        rows = [r for r in rows if r[key] == fixed[key]]
    return rows, fixed


def mean(values: Iterable) -> float | None:
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return sum(vals) / len(vals) if vals else None


def nan_if_none(x) -> float:
    return float("nan") if x is None else float(x)


def varying(rows: list[dict], keys: Iterable[str]) -> list[str]:
    return [k for k in keys if len({r[k] for r in rows}) > 1]


# Row fields that may tell two cells of one trace, capacity, bandwidth and policy apart, in
# the order a label names them; config fields (`row["setup"]`) by name come after them.
IDENTITY_FIELDS = ("miss", "routing", "queue", "precision", "pools")
# The row fields a caller may name as shown; any other key is a config field.
ROW_FIELDS = (*IDENTITY_FIELDS, "trace", "capacity", "capacity_key", "h2d_gbps", "eviction",
              "prefetch", "model")


def field_value(row: dict, key: str) -> str:
    """A row field (`ROW_FIELDS`) or config field of a row, as shown in a label ("–": none)."""
    value = (row.get(key) if key in ROW_FIELDS
             else _shown((row.get("setup") or {}).get(key, "null")))
    return "–" if value in (None, "null", "None") else str(value)


def field_name(key: str) -> str:
    """How a table header names a field: a config field by its last component."""
    return key.rsplit(".", 1)[-1]


def identity_keys(rows: list[dict], shown: Iterable[str]) -> list[str]:
    """The fields beyond `shown` that a label must name so that no two cells differing in
    their configuration share one (and get averaged into one number or bar): greedily, in
    order (`IDENTITY_FIELDS`, then config fields by name), each field that still takes two
    values among rows agreeing on `shown` and the fields taken before it. Cells equal in
    every field (repeats of one configuration) still share a label."""
    shown = list(shown)
    candidates = [k for k in IDENTITY_FIELDS if k not in shown]
    candidates += sorted({k for r in rows for k in r.get("setup") or {}} - set(ROW_FIELDS))
    column = {k: [field_value(r, k) for r in rows] for k in shown}
    where = [tuple(v) for v in zip(*column.values())] if shown else [()] * len(rows)
    keys: list[str] = []
    for key in candidates:
        values = [field_value(r, key) for r in rows]
        seen: dict[tuple, str] = {}
        if any(seen.setdefault(w, v) != v for w, v in zip(where, values)):
            keys.append(key)
            where = [(*w, v) for w, v in zip(where, values)]
    return keys


def gbps_label(x) -> str:
    return "?" if x is None else f"{x:g}"


def hit_parts(row: dict) -> tuple[float | None, float | None]:
    """(ready, late) hit rate of a row; both None when the split is not known."""
    ready, late = row.get("ready_hit_rate"), row.get("late_hit_rate")
    if ready is None or late is None:
        return None, None
    return ready, late


# -- SpecMD's drop-in experiment ---------------------------------------------------------------
def spec_base(spec: str) -> str:
    return spec.split("(")[0].strip()


def _norm_spec(spec: str) -> str:
    s = spec.replace(" ", "").replace('"', "").replace("'", "")
    return s[:-2] if s.endswith("()") else s


def dropin_label(eviction: str) -> str:
    """`least_stale` -> `+Least-Stale`; `least_stale(order="left_first")` ->
    `+Least-Stale (order=left_first)`."""
    args = _norm_spec(eviction)[len(spec_base(eviction)):].strip("()").replace(",", ", ")
    return "+Least-Stale" + (f" ({args})" if args else "")


def _preset_eviction(preset: str) -> str | None:
    try:  # moejax.policies imports JAX: only for cells that name their eviction and a preset
        from moejax.policies.presets import PRESETS
    except ImportError:  # pragma: no cover
        return None
    return (PRESETS.get(preset) or {}).get("eviction")


def is_preset_baseline(row: dict) -> bool:
    """A preset cell running the preset's own eviction: left to the preset, or given equal
    to it (`preset=specmd_1 eviction=lru`)."""
    if not row["preset"]:
        return False
    if row["eviction_source"] == "preset" or (row["eviction_source"] is None
                                              and not row["eviction_given"]):
        return True
    own = _preset_eviction(row["preset"])
    return own is not None and _norm_spec(own) == _norm_spec(row["eviction"])


def is_dropin(row: dict) -> bool:
    """A preset cell whose eviction was replaced by Least-Stale (any arguments)."""
    return (bool(row["preset"]) and spec_base(row["eviction"]) == DROPIN_EVICTION
            and not is_preset_baseline(row))


@dataclasses.dataclass
class DropInPair:
    """One preset run twice, with its own eviction (`base`) and with Least-Stale (`dropin`),
    everything else equal."""

    base: dict
    dropin: dict
    other: tuple[tuple[str, str], ...] = ()  # varying setup beyond trace, capacity, bandwidth

    @property
    def preset(self) -> str:
        return self.base["preset"]

    @property
    def label(self) -> str:
        return dropin_label(self.dropin["eviction"])

    @property
    def other_label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.other)


def ttft_change_pct(base, dropin) -> float | None:
    """100 * (drop-in - baseline) / baseline; None when either is unknown or baseline is 0."""
    if base is None or dropin is None or not base:
        return None
    return 100.0 * (float(dropin) - float(base)) / float(base)


def _pair_key(row: dict) -> tuple:
    bw = -1.0 if row["h2d_gbps"] is None else float(row["h2d_gbps"])
    return (row["trace"], row["capacity_key"], bw, row["preset"], row["prefetch"], row["miss"],
            row["routing"], tuple(sorted(row["setup"].items())))


def _shown(value: str) -> str:
    try:
        v = json.loads(value)
    except ValueError:
        return value
    return v if isinstance(v, str) else value


def dropin_pairs(rows: list[dict]) -> list[DropInPair]:
    """SpecMD's drop-in pairs of a sweep: per preset cell running its own eviction (the
    baseline), every cell of the same preset with `policies.eviction=least_stale[(...)]` and
    all else equal — trace, capacity, effective bandwidth, resolved prefetch / miss / routing
    and every other config field (`row["setup"]`). A group with several baselines (the
    preset's eviction left out and given) pairs with the first by cell name; one drop-in cell
    per distinct Least-Stale spec. Sorted by preset, trace, capacity, bandwidth."""
    groups: dict[tuple, dict[str, list[dict]]] = collections.defaultdict(
        lambda: {"base": [], "dropin": []})
    for r in rows:
        if not r.get("preset"):
            continue
        if is_preset_baseline(r):
            groups[_pair_key(r)]["base"].append(r)
        elif is_dropin(r):
            groups[_pair_key(r)]["dropin"].append(r)
    found = []
    for key, g in groups.items():
        if not g["base"] or not g["dropin"]:
            continue
        base = min(g["base"], key=lambda r: r["name"])
        seen = set()
        for d in sorted(g["dropin"], key=lambda r: r["name"]):
            if _norm_spec(d["eviction"]) not in seen:
                seen.add(_norm_spec(d["eviction"]))
                found.append(DropInPair(base, d))
    if not found:
        return []
    # What else varies between pairs, beyond what trace, capacity, bandwidth and preset decide
    # (a model preset follows its trace, the prefetcher its preset): shown in the label.
    fields = {k for p in found for k in p.base["setup"]} | {"prefetch", "miss", "routing"}

    def value(p, k):
        return p.base[k] if k in ("prefetch", "miss", "routing") else p.base["setup"].get(k)

    other = []
    for k in sorted(fields):
        if len({value(p, k) for p in found}) < 2:
            continue
        by_place = collections.defaultdict(set)
        for p in found:
            by_place[_pair_key(p.base)[:4]].add(value(p, k))
        if any(len(v) > 1 for v in by_place.values()):
            other.append(k)
    for p in found:
        p.other = tuple((k, str(_shown(value(p, k)) if k in p.base["setup"] else value(p, k)))
                        for k in other)
    return sorted(found, key=lambda p: (p.preset, p.other, p.base["trace"],
                                        p.base["capacity_key"],
                                        _pair_key(p.base)[2], p.label))
