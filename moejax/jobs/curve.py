"""The curve job: a replay's capacity curve — each eviction's hits, late hits, misses and
collision misses at every cache size, in slots, from top-k (the smallest cache the cache
accepts) up to where nothing more is gained.

    python -m moejax.main --config=configs/curve.py \\
        --config.replay.trace=moejax/assets/captures/olmoe_code.jsonl \\
        --config.model.family=olmoe --config.model.preset=olmoe-1b-7b --workdir=W

Every setting but the size and the eviction is the replay's of the same config (the trace,
`replay.*`, the cache's pin scope and precision, the other three policies, the clock):
`moejax.jobs.replay.load` reads them and `build` makes each size's cache, as the replay job
does. `curve.policies` names the evictions, one curve each. Global LRU's whole curve comes from
one pass over the requests (stack distances, `moejax/replay/stack_curve.py`, exact in moejax's own
semantics; docs/DESIGN.md "Capacity curves in one pass"); the sizes and evictions where that
rule does not hold are replayed one by one (`replay.engine`), and each row says which
(`method`). `curve.checks` sizes of each curve are then replayed again, each through a fresh
cache, and the run is refused if any counter differs.

Writes `W/results.json` (`curve`: `{eviction: [{"slots", "hits", "late_hits", "misses",
"collision_misses", "requests", "miss_ratio", "share_of_experts", "share_of_model",
"method"}, ...]}`; `curve_methods`: how each curve was made and checked) and `W/curve.png`
(hit rate against the share of the experts and of the model's bytes, SpecMD's 1%, 5% and
25% marked), and prints one table per eviction.
"""

from __future__ import annotations

import os
import time

import ml_collections
import numpy as np

from moejax.cache import summary
from moejax.errors import CheckFailed, ConfigError
from moejax.jobs import replay as replay_job
from moejax.jobs.cache_report import announce_results, progress
from moejax.policies import check as check_policy
from moejax.replay import stack_curve as curve_lib
from moejax.results import write_json_atomic

PLOT = "curve.png"
# SpecMD's cache sizes (shares of the model's bytes), marked on the plot.
PAPER_SHARES = (0.01, 0.05, 0.25)


def policy_list(text: str) -> list[str]:
    """`curve.policies` split at its top-level commas (a spec's own arguments keep theirs)."""
    out, depth, part = [], 0, []
    for ch in text:
        if ch == "," and depth == 0:
            out.append("".join(part).strip())
            part = []
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        part.append(ch)
    out.append("".join(part).strip())
    return out


def _policies(config: ml_collections.ConfigDict) -> list[str]:
    text = config.curve.policies
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"curve.policies={text!r} must name one eviction policy or more, "
                          "comma-separated (e.g. 'lru,lru_per_layer')")
    specs = policy_list(text)
    for spec in specs:
        if not spec:
            raise ConfigError(f"curve.policies={text!r} has an empty entry")
        try:
            check_policy("eviction", spec)
        except ConfigError as e:
            raise ConfigError(f"curve.policies: {e}") from e
    twice = sorted({s for s in specs if specs.count(s) > 1})
    if twice:
        raise ConfigError(f"curve.policies={text!r} names {twice[0]!r} twice")
    return specs


def _count(config: ml_collections.ConfigDict, field: str, meaning: str) -> int:
    value = config.curve[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"curve.{field}={value!r} must be {meaning}")
    return value


def validate(config: ml_collections.ConfigDict) -> None:
    """The curve's own fields, before anything loads (`moejax.jobs.check`)."""
    _policies(config)
    _count(config, "max_slots", "an integer >= 0 (the largest cache size in slots; 0: where "
           "nothing more is gained)")
    _count(config, "checks", "an integer >= 0 (sizes of each curve replayed again and "
           "compared)")


def _saturation(loaded: replay_job.Loaded, specs: dict[str, str],
                requests: curve_lib.Requests, total: int) -> int:
    """The size from which this eviction gains nothing more: the distinct experts the trace
    asks for (from there nothing is ever evicted), or for a strict per-layer quota the first
    size whose quotas hold each layer's distinct experts. With a prefetcher, routing other than
    the trace's, or experts placed before the first pass, the cache may hold experts the trace
    never asks for: every expert."""
    probe = replay_job.build(loaded, specs, slots=total)
    if (probe.prefetch.name != "none" or probe.routing.name != "standard"
            or not probe.untouched or probe.options.full_layers):
        return total
    distinct = requests.distinct()
    if curve_lib.stack_form(probe)[0] != curve_lib.PER_LAYER:
        return distinct
    need = requests.distinct_per_layer()
    for c in range(distinct, total + 1):
        quota = np.asarray(replay_job.build(loaded, specs, slots=c).eviction.quota)
        if (quota >= need).all():
            return c
    return total


def _check_sizes(rows: list[dict], n: int, seed: int) -> list[int]:
    """The sizes replayed again: the smallest and the largest stack-distance size, then sizes
    drawn (by `seed`) among the stack-distance ones, then among the replayed ones."""
    stack = [r["slots"] for r in rows if r["method"] == curve_lib.STACK]
    others = [r["slots"] for r in rows if r["method"] != curve_lib.STACK]
    chosen: list[int] = []
    for c in ((min(stack), max(stack)) if stack else ()):
        if c not in chosen and len(chosen) < n:
            chosen.append(c)
    rng = np.random.default_rng(seed)
    for pool in (stack, others):
        rest = [c for c in pool if c not in chosen]
        take = min(n - len(chosen), len(rest))
        if take > 0:
            chosen += sorted(int(c) for c in rng.choice(rest, take, replace=False))
    return chosen


def _check(make, loaded, engine: str, spec: str, rows: list[dict], sizes: list[int],
           on_load=None) -> None:
    """Each of `sizes` replayed again through a fresh cache; `CheckFailed` if a counter
    differs from the curve's row."""
    by_size = {r["slots"]: r for r in rows}
    for c in sizes:
        again = curve_lib.replayed(make, c, loaded.traces, loaded.context, engine, on_load)
        row = by_size[c]
        differ = [f"{k} {row[k]} ({row['method']}) != {again[k]} (replay)"
                  for k in curve_lib.COUNTED if row[k] != again[k]]
        if differ:
            raise CheckFailed(f"capacity curve of eviction {spec!r} at {c} slots differs from "
                              f"an independent replay there: {'; '.join(differ)}")


def _pct(x: float | None) -> str:
    return "-" if x is None else (f"{100 * x:.2f}%" if x < 0.1 else f"{100 * x:.1f}%")


def table(spec: str, rows: list[dict]) -> str:
    """One eviction's curve: a row per size."""
    out = [f"{'slots':>6} {'experts':>8} {'model':>8} {'hits':>10} {'late':>6} {'misses':>10} "
           f"{'coll':>8} {'miss ratio':>10}  method"]
    for r in rows:
        out.append(f"{r['slots']:>6} {_pct(r['share_of_experts']):>8} "
                   f"{_pct(r['share_of_model']):>8} {r['hits']:>10,} {r['late_hits']:>6,} "
                   f"{r['misses']:>10,} {r['collision_misses']:>8,} "
                   f"{100 * r['miss_ratio']:>9.2f}%  {r['method']}")
    return "\n".join(out)


def plot(curves: dict[str, list[dict]], path: str, title: str) -> str:
    """Hit rate ((hits + late hits) / requests) against the cache's share of the experts and
    of the model's bytes, one line per eviction, SpecMD's 1%, 5% and 25% marked. Agg, no
    display."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, key, label in ((axes[0], "share_of_experts", "share of the routed experts"),
                           (axes[1], "share_of_model", "share of the model's bytes")):
        drawn = False
        for spec, rows in curves.items():
            xs = [r[key] for r in rows if r[key] is not None]
            if not xs:
                continue
            ys = [(r["hits"] + r["late_hits"]) / r["requests"] if r["requests"] else 0.0
                  for r in rows if r[key] is not None]
            ax.plot([100 * x for x in xs], [100 * y for y in ys], label=spec, lw=1.4)
            drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "the model's bytes are unknown:\nname the model "
                    "(model.family, model.preset)", ha="center", va="center",
                    transform=ax.transAxes)
            ax.set_xticks([])
        else:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}%"))
            for share in PAPER_SHARES:
                ax.axvline(100 * share, color="0.5", ls="--", lw=0.8)
                ax.text(100 * share, 101, f"{100 * share:g}%", ha="center", va="bottom",
                        fontsize=8, color="0.35")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_xlabel(f"cache size: {label}")
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("hit rate, ready + late (%)")
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=110)
    return path


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    specs_list = _policies(config)
    loaded = replay_job.load(config, by_slots=True)
    rp, cc = config.replay, config.curve
    first = loaded.first
    n_layers, n_experts, top_k = len(first.layers), first.num_experts, first.top_k
    total = n_layers * n_experts
    if cc.max_slots and not top_k <= cc.max_slots <= total:
        raise ConfigError(f"curve.max_slots={cc.max_slots} is not a cache size of this trace: "
                          f"it takes {top_k} (top-k, the smallest cache) to {total} (every "
                          "expert), or 0 (where nothing more is gained)")
    t0 = time.perf_counter()
    depth_load_s = curve_lib.load_depths()
    requests = curve_lib.requests_of(loaded.traces, n_experts)
    read_s = time.perf_counter() - t0 - depth_load_s
    policy_specs = {spec: {**loaded.specs, "eviction": spec} for spec in specs_list}
    ends = {spec: cc.max_slots or _saturation(loaded, s, requests, total)
            for spec, s in policy_specs.items()}
    probe = replay_job.build(loaded, policy_specs[specs_list[0]], slots=top_k)
    expert_bytes = probe.shape.expert_bytes if loaded.bytes_known else None
    budget = probe.shape.capacity
    model_bytes = budget.model_bytes if (budget is not None and loaded.bytes_known) else None

    curves, methods = {}, {}
    sizes_total = sum(end - top_k + 1 for end in ends.values())
    with progress(config.log.progress, sizes_total, "curve", unit="size") as bar:
        load_s = [0.0]

        def on_load(make, held: bool):
            """The replay kernel's load (`moejax.replay.replay`'s `on_load`): said on a line of
            its own while it runs (the first time on a machine numba compiles it), its time
            kept apart from the replays'; the bar keeps its count."""
            t0 = time.perf_counter()
            if not held:
                if bar is not None:
                    bar.clear()
                print("replay engine: loading its numba kernel (compiled once per machine, "
                      "then read from numba's disk cache) ...", end=" ", flush=True)
            done = make()
            if not held:
                print(f"{done.how}, {done.seconds:.2f} s, {summary.WALL_CLOCK}; apart from the "
                      "curve's times", flush=True)
                if bar is not None:
                    bar.refresh()
            load_s[0] += time.perf_counter() - t0
            return done
        for spec, specs in policy_specs.items():
            def make(slots, specs=specs):
                return replay_job.build(loaded, specs, slots=slots)

            capacities = list(range(top_k, ends[spec] + 1))
            loads = load_s[0]
            made = curve_lib.capacity_curve(
                make, loaded.traces, loaded.context, capacities, engine=rp.engine,
                requests=requests, on_load=on_load,
                on_row=(lambda c, m: bar.update(1)) if bar is not None else None)
            made.replay_s -= load_s[0] - loads  # (the kernel's one-time load: apart)
            t1, loads = time.perf_counter(), load_s[0]
            checked = _check_sizes(made.rows, cc.checks, config.seed)
            if bar is not None:
                bar.set_description(f"curve: checking {spec}")
            _check(make, loaded, rp.engine, spec, made.rows, checked, on_load)
            if bar is not None:
                bar.set_description("curve")
            check_s = time.perf_counter() - t1 - (load_s[0] - loads)
            for r in made.rows:
                r["miss_ratio"] = r["misses"] / r["requests"] if r["requests"] else None
                r["share_of_experts"] = r["slots"] / total
                r["share_of_model"] = (r["slots"] * expert_bytes / model_bytes
                                       if model_bytes else None)
            curves[spec] = made.rows
            methods[spec] = {"form": made.form, "why": made.why, "stack_from": made.stack_from,
                             "sizes": len(made.rows), "replays": made.replays,
                             "min_slots": top_k, "max_slots": ends[spec],
                             "checked": checked, "checks_equal": True,
                             "stack_s": made.stack_s, "replay_s": made.replay_s,
                             "check_s": check_s}
    results = {
        "job": "curve",
        "trace": replay_job.trace_section(config, loaded),
        "capacity": {"total_experts": total, "top_k": top_k,
                     "widest_pass_layer": requests.widest,
                     "distinct_experts": requests.distinct(),
                     "requests": int(len(requests.keys)),
                     "precision": probe.shape.precision, "expert_bytes": expert_bytes,
                     "model_bytes": model_bytes, "pin_scope": probe.pin_scope,
                     "policies": {k: v for k, v in loaded.specs.items() if k != "eviction"}},
        "curve": curves,
        "curve_methods": methods,
        "plot": PLOT,
        "timings": {"clock": "wall", "read_s": read_s, "stack_setup_s": depth_load_s,
                    "replay_setup_s": load_s[0]},
        "config": config.to_dict(),
    }
    name = os.path.basename(rp.trace)
    plot(curves, os.path.join(workdir, PLOT),
         f"{name}: {len(requests.keys):,} requests, {n_layers} MoE layers x {n_experts} "
         f"experts, top-{top_k}; pin_scope={probe.pin_scope}, "
         f"prefetch {loaded.specs['prefetch']}")
    path = os.path.join(workdir, "results.json")
    write_json_atomic(path, results)
    _print(config, loaded, results, requests)
    announce_results(path)
    print(f"plot -> {os.path.join(workdir, PLOT)}")
    return results


def _print(config, loaded, results, requests) -> None:
    cap, rp = results["capacity"], config.replay
    others = ", ".join(f"{k} {v}" for k, v in cap["policies"].items())
    size = (f"one slot holds one expert at {cap['precision']} ({cap['expert_bytes']:,} bytes)"
            if cap["expert_bytes"] else "expert bytes unknown (name the model for the model's "
            "share: model.family, model.preset)")
    print(f"capacity curve of {rp.trace}: {cap['requests']:,} requests "
          f"({results['trace']['passes']:,} passes x {len(loaded.first.layers)} MoE layers, "
          f"top-{cap['top_k']} of {loaded.first.num_experts} experts), "
          f"{cap['distinct_experts']:,} distinct experts, widest pass-layer "
          f"{cap['widest_pass_layer']}; pin_scope={cap['pin_scope']}, {others}; {size}; "
          "experts, model: the cache's share of the routed experts and of the model's bytes; "
          "hits are ready hits, late the late ones")
    lines = []
    for spec, rows in results["curve"].items():
        m = results["curve_methods"][spec]
        how = (f"{m['why']} from {m['stack_from']} slots"
               if m["stack_from"] is not None else f"replayed at every size ({m['why']})")
        if m["stack_from"] is not None and m["replays"]:
            how += f", replayed below ({m['replays']} sizes: waves, resident experts first)"
        checked = (f"replayed again independently at {', '.join(map(str, m['checked']))} "
                   "slots: equal" if m["checked"] else "not checked (curve.checks=0)")
        print(f"\neviction {spec}: {m['sizes']} sizes, {m['min_slots']} to {m['max_slots']} "
              f"slots; {how}; {checked}")
        print(table(spec, rows))
        lines.append(f"{spec} {m['sizes']} sizes in {m['stack_s'] + m['replay_s']:.3f} s ("
                     + (f"stack distances {m['stack_s']:.3f} s" if m["stack_from"] is not None
                        else "") + (", " if m["stack_from"] is not None and m["replays"] else "")
                     + (f"{m['replays']} replays {m['replay_s']:.3f} s" if m["replays"] else "")
                     + f"), checks {m['check_s']:.3f} s")
    t = results["timings"]
    loads = [f"{what} {t[k]:.2f} s" for k, what in (("stack_setup_s", "the stack kernel"),
                                                    ("replay_setup_s", "the replay kernel"))
             if t[k] >= 0.01]
    print(f"\n{summary.WALL_CLOCK}: " + "; ".join(lines)
          + (f"; apart, loading {' and '.join(loads)} (numba, once per process)"
             if loads else ""))
