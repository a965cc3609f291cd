"""The figures of a sweep report (SpecMD-style): misses by eviction policy (Fig. 4),
per-layer collision misses (Fig. 5), prefetch precision/recall and ready / late hit rate vs
stall (Fig. 6), TTFT and decode speed per configuration, SpecMD's drop-in (each preset
with its own eviction vs with Least-Stale) and the quality–speed frontier of quality cells
(Fig. 5 / 7). Hit rates are drawn as ready and late apart.

Panels of one quantity share one y scale (a capacity whose numbers are 25x smaller looks 25x
smaller), and a panel whose numbers are all zero says so, and why where that is known. A bar
or line is one configuration: fields that tell two cells of a panel apart (the precision, the
queue, ...: `sweep_cells.identity_keys`) join its label, never averaged together. Each drawing
function returns its Figure (tests read its axes). Called by
`moejax.analysis.report.write_report`."""

from __future__ import annotations

import math

import numpy as np

from moejax.analysis.sweep_cells import (
    EVICTION_ORDER,
    PREFETCH_ORDER,
    DropInPair,
    baseline,
    capacities,
    field_name,
    field_value,
    gbps_label,
    hit_parts,
    identity_keys,
    mean,
    nan_if_none,
    order_names,
    ttft_change_pct,
)

DPI = 120
_OTHER_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink",
                 "tab:gray", "tab:olive", "tab:cyan")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


# Least-Stale's configurations in reds, each its own; the others in the qualitative colours.
_LEAST_STALE_COLORS = ("tab:red", "darkred", "salmon", "firebrick", "lightcoral")
# Baseline queue of the figures that fix it (SpecMD's default: prefetches issued at once).
BASE_QUEUE = "immediate"
SHARED_Y = "one y scale for every panel"


def _figure(nrows: int, ncols: int, w: float = 4.4, h: float = 3.4, sharey: bool | str = False):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6.4, w * ncols), h * nrows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)  # Agg without pyplot: no display, no global figure state
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=sharey)
    if sharey:  # every panel keeps its own tick labels: each is read on its own too
        for ax in axes.flat:
            ax.yaxis.set_tick_params(labelleft=True)
    return fig, axes


def _title(fig, title: str, note: str) -> None:
    fig.suptitle(f"{title}\n({note})", fontsize=11)


def _empty(path: str, what: str):
    fig, axes = _figure(1, 1)
    axes[0, 0].text(0.5, 0.5, f"no data for {what}", ha="center", va="center")
    axes[0, 0].set_axis_off()
    fig.savefig(path, dpi=DPI)
    return fig


def all_zero(values) -> bool:
    """Every known value is exactly 0 (and there is at least one)."""
    known = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return bool(known) and all(v == 0 for v in known)


def _note_all_zero(ax, values, why: str) -> None:
    """A panel whose every value is 0 draws nothing visible: it says so, and why."""
    if all_zero(values):
        ax.text(0.5, 0.5, f"all zero: {why}", ha="center", va="center", fontsize=9,
                color="0.25", transform=ax.transAxes, wrap=True,
                bbox={"facecolor": "white", "edgecolor": "0.7", "boxstyle": "round"})


def _eviction_colors(labels: list[str]) -> dict[str, str]:
    reds, others = iter(_LEAST_STALE_COLORS * 4), iter(_OTHER_COLORS * 4)
    return {e: next(reds) if e.startswith("least_stale") else next(others) for e in labels}


def _configurations(rows: list[dict], shown: tuple[str, ...]
                    ) -> tuple[list[str], dict[int, str], str]:
    """The x categories of a panel's bars or lines: each row's eviction joined by the fields
    that tell its configuration apart from another's at the same `shown` fields; (labels in
    the paper's eviction order, {id(row): label}, the axis's name of them)."""
    keys = identity_keys(rows, shown)
    label = {id(r): " · ".join([r["eviction"], *(field_value(r, k) for k in keys)])
             for r in rows}
    name = " · ".join(["eviction policy", *(field_name(k) for k in keys)])
    return order_names(set(label.values()), EVICTION_ORDER), label, name


def _facets(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """One facet per trace when there are few (<= 3), else one averaged over all of them."""
    traces = sorted({r["trace"] for r in rows})
    if len(traces) <= 3:
        return [(t, [r for r in rows if r["trace"] == t]) for t in traces]
    return [(f"mean of {len(traces)} traces", rows)]


def _fixed_note(fixed: dict) -> str:
    return ", ".join(f"H2D {gbps_label(v)} GB/s" if k == "h2d_gbps" else f"{k} {v}"
                     for k, v in fixed.items())


def _trace_mean(rows: list[dict], key: str) -> float:
    """Mean over traces of each trace's mean: every trace weighs the same."""
    per_trace = [mean(r[key] for r in rows if r["trace"] == t) for t in {r["trace"] for r in rows}]
    return nan_if_none(mean(per_trace))


def fig4(rows: list[dict], path: str):
    base, fixed = baseline(rows, prefetch="none", miss="fetch", routing="standard",
                           queue=BASE_QUEUE)
    if not base:
        return _empty(path, "Fig. 4")
    configs, label, xname = _configurations(base, ("trace", "capacity", "eviction"))
    caps, facets = capacities(base), _facets(base)
    fig, axes = _figure(len(facets), len(caps), w=max(4.4, 0.9 * len(configs) + 1.5),
                        sharey=True)
    x = np.arange(len(configs))
    for i, (facet, frows) in enumerate(facets):
        for j, cap in enumerate(caps):
            ax, sel = axes[i, j], [r for r in frows if r["capacity"] == cap]
            miss = [100 * _trace_mean([r for r in sel if label[id(r)] == e], "miss_rate")
                    for e in configs]
            coll = [100 * _trace_mean([r for r in sel if label[id(r)] == e],
                                      "collision_miss_rate") for e in configs]
            ax.bar(x - 0.2, miss, 0.4, color="0.6", label="total misses")
            ax.bar(x + 0.2, coll, 0.4, color="tab:red", label="collision misses")
            for k, (m, c) in enumerate(zip(miss, coll)):
                if math.isnan(m) and math.isnan(c):
                    ax.text(k, 0, "n/a", ha="center", va="bottom", fontsize=8)
                else:  # a bar of height 0 is invisible: its number says it is there
                    for dx, v in ((-0.2, m), (0.2, c)):
                        if v == 0:
                            ax.text(k + dx, 0, "0", ha="center", va="bottom", fontsize=7)
            _note_all_zero(ax, miss + coll, "no misses in these cells (every request a hit)")
            ax.set_xticks(x, configs, rotation=30, ha="right")
            ax.set_xlabel(xname)
            ax.set_ylabel("misses, % of requests")
            ax.set_title(f"{facet} — capacity {cap}", fontsize=10)
            ax.set_ylim(bottom=0)
            ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    _title(fig, "Total and collision misses by eviction policy",
           f"{_fixed_note(fixed)}; {SHARED_Y}")
    fig.savefig(path, dpi=DPI)
    return fig


def _layer_curve(rows: list[dict]) -> np.ndarray:
    """Mean per-layer collision-miss rate over traces (NaN where no cell has the layer)."""
    per_trace = []
    for t in sorted({r["trace"] for r in rows}):
        arrays = [[nan_if_none(v) for v in r["layer_collision_miss_rate"]]
                  for r in rows if r["trace"] == t]
        per_trace.extend(arrays)
    n = max((len(a) for a in per_trace), default=0)
    if n == 0:
        return np.zeros(0)
    stack = np.full((len(per_trace), n), np.nan)
    for k, a in enumerate(per_trace):
        stack[k, :len(a)] = a
    counts = np.sum(~np.isnan(stack), axis=0)
    sums = np.nansum(stack, axis=0)
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def fig5(rows: list[dict], path: str):
    from matplotlib.ticker import MaxNLocator

    base, fixed = baseline(rows, prefetch="none", miss="fetch", routing="standard",
                           queue=BASE_QUEUE)
    if not base or not any(r["layer_collision_miss_rate"] for r in base):
        return _empty(path, "Fig. 5 (no per-layer rows)")
    configs, label, _ = _configurations(base, ("trace", "capacity", "eviction"))
    caps, facets = capacities(base), _facets(base)
    colors = _eviction_colors(configs)
    markers = dict(zip(configs, _MARKERS * 8))
    fig, axes = _figure(len(facets), len(caps), sharey=True)
    for i, (facet, frows) in enumerate(facets):
        for j, cap in enumerate(caps):
            ax = axes[i, j]
            drawn = []
            for e in configs:
                curve = _layer_curve([r for r in frows if r["capacity"] == cap
                                      and label[id(r)] == e])
                if curve.size and not np.all(np.isnan(curve)):
                    ax.plot(np.arange(curve.size), 100 * curve, marker=markers[e],
                            markersize=3.5, color=colors[e], label=e,
                            lw=2 if e.startswith("least_stale") else 1.2)
                    drawn += list(curve)
            _note_all_zero(ax, drawn, "no collision misses in these cells")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("MoE layer (position)")
            ax.set_ylabel("collision misses, % of requests")
            ax.set_title(f"{facet} — capacity {cap}", fontsize=10)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    _title(fig, "Per-layer collision-miss rate by eviction policy",
           f"{_fixed_note(fixed)}; {SHARED_Y}")
    fig.savefig(path, dpi=DPI)
    return fig


# The marker of fig6's ready / ready + late legend: a shape no capacity is drawn with.
HIT_MARKER = "h"


def fig6(rows: list[dict], path: str):
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    base, fixed = baseline(rows, eviction="least_stale", miss="fetch", routing="standard",
                           queue=BASE_QUEUE)
    if not base:
        return _empty(path, "Fig. 6")
    prefetches, caps = order_names({r["prefetch"] for r in base}, PREFETCH_ORDER), capacities(base)
    colors = dict(zip(prefetches, _OTHER_COLORS * 4))
    markers = dict(zip(caps, _MARKERS * 4))
    fig, axes = _figure(1, 2, w=5.2, h=4.2)
    left, right = axes[0, 0], axes[0, 1]
    for r in base:
        c, m = colors[r["prefetch"]], markers[r["capacity"]]
        if r["prefetch_precision"] is not None and r["prefetch_recall"] is not None:
            left.scatter(100 * r["prefetch_recall"], 100 * r["prefetch_precision"], color=c,
                         marker=m, s=36, alpha=0.85)
        if r["stall_s"] is None:
            continue
        ready, late = hit_parts(r)
        x = 1e3 * r["stall_s"]
        if ready is not None:  # filled: ready hits; hollow above it: ready + late hits
            right.plot([x, x], [100 * ready, 100 * (ready + late)], color=c, lw=0.8,
                       alpha=0.6)
            right.scatter(x, 100 * ready, color=c, marker=m, s=36, alpha=0.85)
            right.scatter(x, 100 * (ready + late), facecolors="none", edgecolors=c, marker=m,
                          s=36, alpha=0.85)
        elif r["hit_rate"] is not None:  # the split unknown: a cross-hatched total
            right.scatter(x, 100 * r["hit_rate"], color=c, marker="x", s=36, alpha=0.85)
    if not left.collections:
        why = ("no prefetch in these cells (prefetch none)"
               if all(r["prefetch"].split("(")[0] == "none" for r in base)
               else "no prefetch precision or recall in these cells (nothing prefetched)")
        left.text(0.5, 0.5, why, ha="center", va="center", transform=left.transAxes,
                  wrap=True)
    else:
        pairs = [(r["prefetch_precision"], r["prefetch_recall"]) for r in base
                 if r["prefetch_precision"] is not None and r["prefetch_recall"] is not None]
        _note_all_zero(left, [v for p in pairs for v in p],
                       "no prefetched expert was used (precision and recall 0)")
    left.set_xlabel("prefetch recall, % of requests in predicted layers")
    left.set_ylabel("prefetch precision, % of prefetched used")
    left.set_title("Precision vs recall per prefetch policy", fontsize=10)
    right.set_xlabel("stall (synchronous overhead), ms")
    right.set_ylabel("hit rate, % of requests")
    right.set_title("Ready (filled) and ready + late (hollow) hit rate vs stall", fontsize=10)
    left.set_xlim(0, 102)
    left.set_ylim(0, 102)
    right.set_xlim(left=0)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    # Three legends, one per encoding, so no two entries look alike: colour (a patch) is the
    # prefetch policy, the marker's shape the capacity, its fill ready vs ready + late.
    colour = [Patch(facecolor=colors[p], label=p) for p in prefetches]
    shape = [Line2D([], [], color="black", marker=markers[c], ls="", label=f"capacity {c}")
             for c in caps]
    fill = [Line2D([], [], color="0.3", marker=HIT_MARKER, ls="", markersize=8,
                   label="ready hits (filled)"),
            Line2D([], [], color="0.3", marker=HIT_MARKER, ls="", markersize=8,
                   markerfacecolor="none", label="ready + late hits (hollow)")]
    for handles, title, where in ((colour, "prefetch (colour)", "outside lower left"),
                                  (shape, "capacity (marker)", "outside lower center"),
                                  (fill, "hit rate (fill)", "outside lower right")):
        fig.legend(handles=handles, title=title, loc=where, fontsize=7, title_fontsize=7,
                   ncols=2 if len(handles) > 3 else 1)
    n_traces = len({r["trace"] for r in base})
    _title(fig, "Prefetch strategies", f"{_fixed_note(fixed)}; one point per cell, "
           f"{n_traces} trace{'s' if n_traces != 1 else ''}")
    fig.savefig(path, dpi=DPI)
    return fig


def fig_ttft_decode(rows: list[dict], path: str):
    base, fixed = baseline(rows, miss="fetch", routing="standard", queue=BASE_QUEUE)
    if not base:
        return _empty(path, "TTFT / decode")
    configs, label, xname = _configurations(base, ("trace", "capacity", "eviction", "prefetch"))
    prefetches, caps = order_names({r["prefetch"] for r in base}, PREFETCH_ORDER), capacities(base)
    colors = dict(zip(prefetches, _OTHER_COLORS * 4))
    traces = sorted({r["trace"] for r in base})
    over = traces[0] if len(traces) == 1 else f"mean of {len(traces)} traces"
    fig, axes = _figure(2, len(caps), w=max(4.4, 0.5 * len(configs) * len(prefetches) + 1.5),
                        sharey="row")
    x, width = np.arange(len(configs)), 0.8 / len(prefetches)
    for j, cap in enumerate(caps):
        sel = [r for r in base if r["capacity"] == cap]
        for i, (key, scale, ylabel) in enumerate((("ttft_s", 1e3, "TTFT, ms"),
                                                  ("decode_tok_per_s", 1.0, "decode, tok/s"))):
            ax = axes[i, j]
            drawn = []
            for k, pf in enumerate(prefetches):
                vals = [scale * _trace_mean([r for r in sel if label[id(r)] == e
                                             and r["prefetch"] == pf], key) for e in configs]
                ax.bar(x - 0.4 + (k + 0.5) * width, vals, width, color=colors[pf], label=pf)
                drawn += vals
            _note_all_zero(ax, drawn, f"every cell recorded {ylabel.split(',')[0]} 0")
            ax.set_xticks(x, configs, rotation=30, ha="right")
            ax.set_xlabel(xname)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{ylabel.split(',')[0]} — capacity {cap} ({over})", fontsize=10)
            ax.set_ylim(bottom=0)
            ax.grid(axis="y", alpha=0.3)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside lower center",
               ncols=min(4, len(prefetches)), title="prefetch policy", fontsize=8)
    _title(fig, "TTFT and decode throughput per configuration",
           f"{_fixed_note(fixed)}; one y scale per row")
    fig.savefig(path, dpi=DPI)
    return fig


# -- SpecMD's drop-in ------------------------------------------------------------------------
_DROPIN_COLORS = ("tab:red", "tab:orange", "tab:purple", "tab:brown", "tab:pink")
_BASE_COLOR = "0.55"


def _dropin_groups(pairs: list[DropInPair]) -> tuple[list[tuple], list[str]]:
    """The x groups (preset and other varying setup) and the drop-in labels, in order."""
    groups = sorted({(p.preset, p.other) for p in pairs})
    labels = sorted({p.label for p in pairs}, key=lambda s: (s != "+Least-Stale", s))
    return groups, labels


def _group_name(group: tuple) -> str:
    preset, other = group  # the other keys are named in the title
    return "\n".join([preset, *(v for _, v in other)])


def _points(ax, xc: float, values: list, color: str = "black") -> None:
    """The per-trace values behind a bar, spread a little so equal ones stay visible."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if len(vals) < 2:
        return
    off = np.linspace(-0.07, 0.07, len(vals))
    ax.scatter(xc + off, vals, s=9, color=color, zorder=3, alpha=0.8, linewidths=0)


def fig_dropin(pairs: list[DropInPair], path: str):
    """Per preset: baseline vs +Least-Stale. Rows: TTFT change, ready / late (hatched) hit
    rate, collision-miss rate; one column per capacity, at the lowest bandwidth of the pairs.
    Bars are means over traces; dots the traces' own values."""
    from matplotlib.patches import Patch

    bws = [p.base["h2d_gbps"] for p in pairs if p.base["h2d_gbps"] is not None]
    bw = min(bws) if bws else None
    pairs = [p for p in pairs if p.base["h2d_gbps"] == bw]
    groups, labels = _dropin_groups(pairs)
    caps = capacities([p.base for p in pairs])
    colors = dict(zip(labels, _DROPIN_COLORS * 4))
    series = [("baseline", _BASE_COLOR)] + [(lab, colors[lab]) for lab in labels]
    width = 0.8 / len(series)
    fig, axes = _figure(3, len(caps), w=max(4.4, 0.4 * len(groups) * len(series) + 1.6),
                        h=3.2, sharey="row")
    x = np.arange(len(groups))
    for i, cap in enumerate(caps):
        at_cap = [p for p in pairs if p.base["capacity"] == cap]
        ax_t, ax_h, ax_c = axes[:, i]
        drawn = {"ttft": [], "hits": [], "coll": []}
        for k, (lab, color) in enumerate(series):
            xs = x - 0.4 + (k + 0.5) * width
            for j, g in enumerate(groups):
                sel = [p for p in at_cap if (p.preset, p.other) == g
                       and (lab == "baseline" or p.label == lab)]
                if lab == "baseline":  # one baseline per trace, whatever the drop-in
                    rows = list({p.base["name"]: p.base for p in sel}.values())
                else:
                    rows = [p.dropin for p in sel]
                if not rows:
                    continue
                traces = sorted({r["trace"] for r in rows})
                by_trace = {t: [r for r in rows if r["trace"] == t] for t in traces}
                # Hit rate: ready solid, late hatched on top.
                parts = [hit_parts(r) for r in rows]
                if all(p[0] is not None for p in parts):
                    ready = [mean(hit_parts(r)[0] for r in by_trace[t]) for t in traces]
                    late = [mean(hit_parts(r)[1] for r in by_trace[t]) for t in traces]
                    rm, lm = 100 * nan_if_none(mean(ready)), 100 * nan_if_none(mean(late))
                    ax_h.bar(xs[j], rm, width, color=color, edgecolor="black", lw=0.4)
                    ax_h.bar(xs[j], lm, width, bottom=rm, color=color, alpha=0.45,
                             hatch="///", edgecolor="black", lw=0.4)
                    drawn["hits"] += [rm, lm]
                    _points(ax_h, xs[j], [100 * (a + b) for a, b in zip(ready, late)])
                else:  # split unknown: the total, cross-hatched
                    tot = [mean(r["hit_rate"] for r in by_trace[t]) for t in traces]
                    ax_h.bar(xs[j], 100 * nan_if_none(mean(tot)), width, color="white",
                             hatch="xx", edgecolor=color, lw=0.8)
                    drawn["hits"].append(100 * nan_if_none(mean(tot)))
                coll = [mean(r["collision_miss_rate"] for r in by_trace[t]) for t in traces]
                ax_c.bar(xs[j], 100 * nan_if_none(mean(coll)), width, color=color,
                         edgecolor="black", lw=0.4)
                drawn["coll"].append(100 * nan_if_none(mean(coll)))
                _points(ax_c, xs[j], [None if v is None else 100 * v for v in coll])
        # TTFT change: one bar per drop-in spec, the mean over traces of each pair's change.
        tw = 0.8 / len(labels)
        for k, lab in enumerate(labels):
            xs = x - 0.4 + (k + 0.5) * tw
            for j, g in enumerate(groups):
                sel = [p for p in at_cap if (p.preset, p.other) == g and p.label == lab]
                if not sel:
                    continue
                traces = sorted({p.base["trace"] for p in sel})
                ch = [mean(ttft_change_pct(p.base["ttft_s"], p.dropin["ttft_s"])
                           for p in sel if p.base["trace"] == t) for t in traces]
                m = nan_if_none(mean(ch))
                ax_t.bar(xs[j], m, tw, color=colors[lab], edgecolor="black", lw=0.4)
                drawn["ttft"].append(m)
                if math.isnan(m):
                    ax_t.text(xs[j], 0, "n/a", ha="center", va="bottom", fontsize=7)
                _points(ax_t, xs[j], ch)
        ax_t.axhline(0, color="black", lw=0.8)
        _note_all_zero(ax_t, drawn["ttft"], "no pair's TTFT changes (TTFT: the first "
                                            "request's, from an empty cache)")
        _note_all_zero(ax_h, drawn["hits"], "no hits in these cells")
        _note_all_zero(ax_c, drawn["coll"], "no collision misses in these cells")
        names = [_group_name(g) for g in groups]
        for ax, ylabel, title in (
                (ax_t, "TTFT change vs baseline, %", "TTFT change (drop-in vs baseline)"),
                (ax_h, "hit rate, % of requests", "Hit rate: ready (solid) + late (hatched)"),
                (ax_c, "collision misses, % of requests", "Collision-miss rate")):
            ax.set_xticks(x, names, fontsize=8)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{title} — capacity {cap}", fontsize=10)
            ax.grid(axis="y", alpha=0.3)
        ax_h.set_ylim(bottom=0)
        ax_c.set_ylim(bottom=0)
    handles = [Patch(facecolor=c, edgecolor="black", lw=0.4, label=lab) for lab, c in series]
    handles.append(Patch(facecolor="white", hatch="///", edgecolor="black", lw=0.4,
                         label="late hits"))
    fig.legend(handles=handles, loc="outside lower center", ncols=min(5, len(handles)),
               fontsize=8)
    n_traces = len({p.base["trace"] for p in pairs})
    other = [k for k, _ in pairs[0].other]
    _title(fig, "SpecMD drop-in: each preset with its own eviction vs Least-Stale",
           (f"x: preset / {' / '.join(other)}; " if other else "")
           + f"H2D {gbps_label(bw)} GB/s; bars: mean over {n_traces} trace"
           f"{'s' if n_traces != 1 else ''}, dots: each trace; one y scale per row")
    fig.savefig(path, dpi=DPI)
    return fig


# -- the quality–speed frontier --------------------------------------------------------------
_ROUTING_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
# One colour per miss-policy family (plain fetch at each precision its own), in
# `_family_order`: a qualitative palette whose neighbours differ in hue, not in shade.
FAMILY_COLORS = ("black", "tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple",
                 "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "navy", "magenta", "lime",
                 "tab:gray")


def _policy_colors(families: list[str]) -> dict[str, str]:
    """Each family its own colour of FAMILY_COLORS, in order (plain fetch first: black); past
    its end the colours repeat (the legend still names every family)."""
    return {f: FAMILY_COLORS[i % len(FAMILY_COLORS)] for i, f in enumerate(families)}


def _family_order(f: str) -> tuple:
    known = ("fetch", "fetch @int8", "fetch @int4", "fetch @int2", "fetch_priority",
             "fetch_lowest_bit")
    return (known.index(f) if f in known else len(known), f)


def fig_quality_frontier(groups, path: str):
    """SpecMD-style quality–speed frontier: one panel per model (rows) and capacity (columns);
    x decode tok/s (cache clock), y KL mean (log; KL 0 drawn on an "exact" floor line); colour:
    miss policy (plain fetch by precision), marker: routing; the Pareto frontier as a step
    line, its points ringed. `groups`: `moejax.analysis.frontier.frontier_rows` output."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from moejax.analysis import frontier as fr

    models = sorted({g.model for g in groups}, key=fr.model_order)
    columns = sorted({(g.capacity_key, g.capacity, -1.0 if g.h2d_gbps is None else g.h2d_gbps)
                      for g in groups})
    several_bw = len({c[2] for c in columns}) > 1
    rows = [r for g in groups for r in g.rows]
    families = sorted({fr.policy_family(r) for r in rows}, key=_family_order)
    colors = _policy_colors(families)
    routings = order_names({str(r["routing"]) for r in rows}, ("standard", "cache_aware"))
    markers = dict(zip(routings, _ROUTING_MARKERS * 4))
    speed, loss = groups[0].speed, groups[0].loss
    positive = [float(r[loss]) for r in rows if r.get(loss) is not None and r[loss] > 0]
    floor = 10 ** math.floor(math.log10(min(positive))) / 10 if positive else 1e-6
    top = max(positive) * 3 if positive else floor * 100
    fig, axes = _figure(len(models), len(columns), w=5.0, h=3.6)
    for i, model in enumerate(models):
        for j, (cap_key, cap, bw) in enumerate(columns):
            ax = axes[i, j]
            sel = [g for g in groups if g.model == model and g.capacity_key == cap_key
                   and (-1.0 if g.h2d_gbps is None else g.h2d_gbps) == bw]
            title = f"{model} — capacity {cap}" + (f", H2D {gbps_label(bw)} GB/s"
                                                   if several_bw else "")
            ax.set_title(title, fontsize=10)
            if not sel:
                ax.text(0.5, 0.5, "no cells", ha="center", va="center", transform=ax.transAxes)
                ax.set_axis_off()
                continue
            g = sel[0]
            for r in g.rows:
                if r.get(speed) is None or r.get(loss) is None:
                    continue
                y = max(float(r[loss]), floor)
                ax.scatter(float(r[speed]), y, color=colors[fr.policy_family(r)],
                           marker=markers[str(r["routing"])], s=34, alpha=0.85, zorder=3,
                           linewidths=0)
            front = g.front_rows
            if front:
                xs = [float(r[speed]) for r in front]
                ys = [max(float(r[loss]), floor) for r in front]
                ax.step(xs, ys, where="pre", color="0.25", lw=1.2, zorder=2)
                ax.scatter(xs, ys, facecolors="none", edgecolors="black", s=110, lw=0.9,
                           zorder=4)
            ax.set_yscale("log")
            ax.set_ylim(floor / 3, top)
            ax.axhline(floor, color="0.5", ls="--", lw=0.8, zorder=1)
            ax.text(0.99, floor, "exact (KL = 0)", transform=ax.get_yaxis_transform(),
                    ha="right", va="bottom", fontsize=7, color="0.35")
            ax.set_xlabel("decode tok/s (cache clock)")
            ax.set_ylabel("KL(reference ‖ cached), nats/token")
            ax.grid(alpha=0.3, which="major")
    # One legend per encoding, so no entry looks like another: colour (a patch) is the miss
    # policy, the marker's shape (hollow) the routing; the ring the frontier.
    colour = [Patch(facecolor=colors[f], label=f) for f in families]
    shape = [Line2D([], [], color="black", marker=markers[r], markerfacecolor="none", ls="",
                    label=r) for r in routings]
    shape.append(Line2D([], [], color="0.25", marker="o", markerfacecolor="none",
                        markeredgecolor="black", markersize=9, label="Pareto frontier"))
    fig.legend(handles=colour, title="miss policy (colour)", loc="outside lower left",
               ncols=min(3, len(colour)), fontsize=8, title_fontsize=8)
    fig.legend(handles=shape, title="routing (marker)", loc="outside lower right",
               ncols=min(2, len(shape)), fontsize=8, title_fontsize=8)
    _title(fig, "Quality–speed frontier", "colour: miss policy (plain fetch by precision); "
           "marker: routing; lower right is better;\none KL scale in every panel, tok/s per "
           "panel")
    fig.savefig(path, dpi=DPI)
    return fig


# -- entry points ----------------------------------------------------------------------------
