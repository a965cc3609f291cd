"""The figures of a sweep report (SpecMD-style): misses by eviction policy (Fig. 4),
per-layer collision misses (Fig. 5), prefetch precision/recall and hit rate vs stall (Fig. 6),
TTFT and decode speed per configuration. Called by `moejax.analysis.report.write_report`."""

from __future__ import annotations

import math

import numpy as np

from moejax.analysis.sweep_cells import (
    EVICTION_ORDER,
    PREFETCH_ORDER,
    baseline,
    capacities,
    gbps_label,
    mean,
    nan_if_none,
    order_names,
)

DPI = 120
_OTHER_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink",
                 "tab:gray", "tab:olive", "tab:cyan")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _figure(nrows: int, ncols: int, w: float = 4.4, h: float = 3.4):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6.4, w * ncols), h * nrows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)  # Agg without pyplot: no display, no global figure state
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _title(fig, title: str, note: str) -> None:
    fig.suptitle(f"{title}\n({note})", fontsize=11)


def _empty(path: str, what: str) -> None:
    fig, axes = _figure(1, 1)
    axes[0, 0].text(0.5, 0.5, f"no data for {what}", ha="center", va="center")
    axes[0, 0].set_axis_off()
    fig.savefig(path, dpi=DPI)


def _eviction_colors(evictions: list[str]) -> dict[str, str]:
    others = iter(_OTHER_COLORS * 4)
    return {e: "tab:red" if e.startswith("least_stale") else next(others) for e in evictions}


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


def fig4(rows: list[dict], path: str) -> None:
    base, fixed = baseline(rows, prefetch="none", miss="fetch", routing="standard")
    if not base:
        return _empty(path, "Fig. 4")
    evictions, caps, facets = order_names({r["eviction"] for r in base}, EVICTION_ORDER), \
        capacities(base), _facets(base)
    fig, axes = _figure(len(facets), len(caps), w=max(4.4, 0.9 * len(evictions) + 1.5))
    x = np.arange(len(evictions))
    for i, (facet, frows) in enumerate(facets):
        for j, cap in enumerate(caps):
            ax, sel = axes[i, j], [r for r in frows if r["capacity"] == cap]
            miss = [100 * _trace_mean([r for r in sel if r["eviction"] == e], "miss_rate")
                    for e in evictions]
            coll = [100 * _trace_mean([r for r in sel if r["eviction"] == e],
                                      "collision_miss_rate") for e in evictions]
            ax.bar(x - 0.2, miss, 0.4, color="0.6", label="total misses")
            ax.bar(x + 0.2, coll, 0.4, color="tab:red", label="collision misses")
            for k, (m, c) in enumerate(zip(miss, coll)):
                if math.isnan(m) and math.isnan(c):
                    ax.text(k, 0, "n/a", ha="center", va="bottom", fontsize=8)
            ax.set_xticks(x, evictions, rotation=30, ha="right")
            ax.set_xlabel("eviction policy")
            ax.set_ylabel("misses, % of requests")
            ax.set_title(f"{facet} — capacity {cap}", fontsize=10)
            ax.set_ylim(bottom=0)
            ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    _title(fig, "Total and collision misses by eviction policy", _fixed_note(fixed))
    fig.savefig(path, dpi=DPI)


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


def fig5(rows: list[dict], path: str) -> None:
    from matplotlib.ticker import MaxNLocator

    base, fixed = baseline(rows, prefetch="none", miss="fetch", routing="standard")
    if not base or not any(r["layer_collision_miss_rate"] for r in base):
        return _empty(path, "Fig. 5 (no per-layer rows)")
    evictions, caps, facets = order_names({r["eviction"] for r in base}, EVICTION_ORDER), \
        capacities(base), _facets(base)
    colors = _eviction_colors(evictions)
    fig, axes = _figure(len(facets), len(caps))
    for i, (facet, frows) in enumerate(facets):
        for j, cap in enumerate(caps):
            ax = axes[i, j]
            for e in evictions:
                curve = _layer_curve([r for r in frows if r["capacity"] == cap
                                      and r["eviction"] == e])
                if curve.size and not np.all(np.isnan(curve)):
                    ax.plot(np.arange(curve.size), 100 * curve, marker="o", markersize=3,
                            color=colors[e], label=e, lw=2 if colors[e] == "tab:red" else 1.2)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("MoE layer (position)")
            ax.set_ylabel("collision misses, % of requests")
            ax.set_title(f"{facet} — capacity {cap}", fontsize=10)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    _title(fig, "Per-layer collision-miss rate by eviction policy", _fixed_note(fixed))
    fig.savefig(path, dpi=DPI)


def fig6(rows: list[dict], path: str) -> None:
    from matplotlib.lines import Line2D

    base, fixed = baseline(rows, eviction="least_stale", miss="fetch", routing="standard")
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
        if r["hit_rate"] is not None and r["stall_s"] is not None:
            right.scatter(1e3 * r["stall_s"], 100 * r["hit_rate"], color=c, marker=m, s=36,
                          alpha=0.85)
    if not left.collections:
        left.text(0.5, 0.5, "no prefetch predictions in these cells", ha="center",
                  va="center", transform=left.transAxes)
    left.set_xlabel("prefetch recall, % of requests in predicted layers")
    left.set_ylabel("prefetch precision, % of prefetched used")
    left.set_title("Precision vs recall per prefetch policy", fontsize=10)
    right.set_xlabel("stall (synchronous overhead), ms")
    right.set_ylabel("hit rate, % of requests")
    right.set_title("Hit rate vs stall per prefetch policy", fontsize=10)
    left.set_xlim(0, 102)
    left.set_ylim(0, 102)
    right.set_xlim(left=0)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=colors[p], marker="o", ls="", label=p) for p in prefetches]
    handles += [Line2D([], [], color="0.3", marker=markers[c], ls="", label=f"capacity {c}")
                for c in caps]
    right.legend(handles=handles, fontsize=7, loc="best")
    n_traces = len({r["trace"] for r in base})
    _title(fig, "Prefetch strategies", f"{_fixed_note(fixed)}; one point per cell, "
           f"{n_traces} trace{'s' if n_traces != 1 else ''}")
    fig.savefig(path, dpi=DPI)


def fig_ttft_decode(rows: list[dict], path: str) -> None:
    base, fixed = baseline(rows, miss="fetch", routing="standard")
    if not base:
        return _empty(path, "TTFT / decode")
    evictions = order_names({r["eviction"] for r in base}, EVICTION_ORDER)
    prefetches, caps = order_names({r["prefetch"] for r in base}, PREFETCH_ORDER), capacities(base)
    colors = dict(zip(prefetches, _OTHER_COLORS * 4))
    traces = sorted({r["trace"] for r in base})
    over = traces[0] if len(traces) == 1 else f"mean of {len(traces)} traces"
    fig, axes = _figure(2, len(caps), w=max(4.4, 0.5 * len(evictions) * len(prefetches) + 1.5))
    x, width = np.arange(len(evictions)), 0.8 / len(prefetches)
    for j, cap in enumerate(caps):
        sel = [r for r in base if r["capacity"] == cap]
        for i, (key, scale, label) in enumerate((("ttft_s", 1e3, "TTFT, ms"),
                                                 ("decode_tok_per_s", 1.0, "decode, tok/s"))):
            ax = axes[i, j]
            for k, pf in enumerate(prefetches):
                vals = [scale * _trace_mean([r for r in sel if r["eviction"] == e
                                             and r["prefetch"] == pf], key) for e in evictions]
                ax.bar(x - 0.4 + (k + 0.5) * width, vals, width, color=colors[pf], label=pf)
            ax.set_xticks(x, evictions, rotation=30, ha="right")
            ax.set_xlabel("eviction policy")
            ax.set_ylabel(label)
            ax.set_title(f"{label.split(',')[0]} — capacity {cap} ({over})", fontsize=10)
            ax.set_ylim(bottom=0)
            ax.grid(axis="y", alpha=0.3)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside lower center",
               ncols=min(4, len(prefetches)), title="prefetch policy", fontsize=8)
    _title(fig, "TTFT and decode throughput per configuration", _fixed_note(fixed))
    fig.savefig(path, dpi=DPI)


# -- entry points ----------------------------------------------------------------------------
