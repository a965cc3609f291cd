"""How well the virtual clock predicted live cells: what a reviewer asks of a simulator (numpy
and matplotlib only; the cells are `moejax.calibration.cells.run_entries`' rows).

* **Errors**: per cell, signed `(virtual - wall) / wall` of TTFT and of decode time; over the
  cells, the median, 90th percentile and largest |error| (`summary`).
* **Rankings**: within each condition (`matrix.condition`: a group, capacity, precision and
  tier), the policies ordered by the measured and by the predicted time; Kendall's tau-b
  between the two orders (`kendall_tau`, ties counted as ties), and tau over only the pairs
  whose measured spreads (the min-max of their live runs) do not overlap — the pairs the
  measurement itself tells apart — and that the model does not predict tied (`rankings`). A
  condition whose policies the model predicts tied is labelled so: there the policies make
  the same decisions (at 100% capacity nothing is evicted), a result that holds by
  construction. The predicted winner *holds* when the measured winner is among the predicted
  fastest or the spreads cannot tell it from one of them.
* **Goals**: median |error| <= 10% and 90th percentile <= 20%, for both; tau >= 0.8
  in every condition; no predicted winner that loses outside the spread.
"""

from __future__ import annotations

import math

import numpy as np

METRICS = ("ttft", "decode")
GOALS = {"median": 0.10, "p90": 0.20, "tau": 0.8}


def errors(rows: list[dict], metric: str) -> list[float]:
    return [r[f"{metric}_error"] for r in rows if r.get(f"{metric}_error") is not None]


def summary(rows: list[dict]) -> dict:
    """Per metric: cells, median / 90th percentile / largest |error|, the signed median, the
    signed errors' 5th and 95th percentiles (the central 90% of them: the planner's band,
    `moejax/plan/forecast.py`), and how many cells the virtual clock predicted above the wall
    clock."""
    out = {}
    for m in METRICS:
        e = np.asarray(errors(rows, m), np.float64)
        if not len(e):
            out[m] = {"cells": 0, "median": None, "p90": None, "max": None,
                      "signed_median": None, "signed_p5": None, "signed_p95": None,
                      "over": 0}
            continue
        a = np.abs(e)
        out[m] = {"cells": int(len(e)), "median": float(np.median(a)),
                  "p90": float(np.percentile(a, 90)), "max": float(a.max()),
                  "signed_median": float(np.median(e)),
                  "signed_p5": float(np.percentile(e, 5)),
                  "signed_p95": float(np.percentile(e, 95)), "over": int(np.sum(e > 0))}
    return out


def kendall_tau(x, y) -> float | None:
    """Kendall's tau-b of two orderings of the same items (ties in either are ties); None
    when either has every item tied (no order to compare) or fewer than two items."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    n = len(x)
    concordant = discordant = ties_x = ties_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif dx == dy:
                concordant += 1
            else:
                discordant += 1
    denominator = math.sqrt((concordant + discordant + ties_x)
                            * (concordant + discordant + ties_y))
    return None if denominator == 0 else (concordant - discordant) / denominator


def _spread(row: dict, metric: str) -> tuple[float, float]:
    runs = [r[f"{metric}_s"] for r in row["wall"]["runs"] if r[f"{metric}_s"] is not None]
    return min(runs), max(runs)


def _apart(a: dict, b: dict, metric: str) -> bool:
    """Whether the live runs of `a` and `b` tell them apart: their spreads do not overlap."""
    lo_a, hi_a = _spread(a, metric)
    lo_b, hi_b = _spread(b, metric)
    return hi_a < lo_b or hi_b < lo_a


# Predictions within this share of each other are a tie: the model says the policies take the
# same time (at 100% capacity no eviction runs, so every eviction policy is the same run).
TIE = 0.005


def _tied(a: float, b: float) -> bool:
    return abs(a - b) <= TIE * max(abs(a), abs(b))


def rankings(rows: list[dict], condition, policy) -> list[dict]:
    """Per condition with two policies or more, per metric: the measured and predicted order
    of its policies (fastest first); tau-b over all pairs; the pairs the live runs' spreads
    separate, and of them those the model orders (`decided`: tau over them) and those it
    predicts tied (`missed_ties`); and whether the predicted winner holds: the measured winner
    is among the predicted fastest (ties included) or not told apart from one of them by the
    spreads. `condition(row)` / `policy(row)` name a row's condition and policy."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(condition(r), []).append(r)
    out = []
    for name, group in by.items():
        if len(group) < 2:
            continue
        entry = {"condition": name, "policies": [policy(r) for r in group]}
        for m in METRICS:
            g = [r for r in group if r["wall"][f"{m}_s"] is not None
                 and r["virtual"][f"{m}_s"] is not None]
            if len(g) < 2:
                entry[m] = None
                continue
            wall = [r["wall"][f"{m}_s"] for r in g]
            virtual = [r["virtual"][f"{m}_s"] for r in g]
            pairs = [(i, j) for i in range(len(g)) for j in range(i + 1, len(g))]
            apart = [(i, j) for i, j in pairs if _apart(g[i], g[j], m)]
            decided = [(i, j) for i, j in apart if not _tied(virtual[i], virtual[j])]
            agree = sum(np.sign(wall[i] - wall[j]) == np.sign(virtual[i] - virtual[j])
                        for i, j in decided)
            fastest = min(virtual)
            predicted = [i for i in range(len(g)) if _tied(virtual[i], fastest)]
            measured = int(np.argmin(wall))
            holds = measured in predicted or any(not _apart(g[measured], g[i], m)
                                                 for i in predicted)
            entry[m] = {
                "measured_order": [policy(g[i]) for i in np.argsort(wall, kind="stable")],
                "predicted_order": [policy(g[i]) for i in np.argsort(virtual, kind="stable")],
                "tau": kendall_tau(wall, virtual), "pairs": len(pairs),
                "separated_pairs": len(apart), "decided_pairs": len(decided),
                "tau_decided": (2 * agree - len(decided)) / len(decided) if decided else None,
                "missed_ties": [f"{policy(g[i])} / {policy(g[j])}" for i, j in apart
                                if _tied(virtual[i], virtual[j])],
                "predicted_tie": all(_tied(v, fastest) for v in virtual),
                # (every cell of the condition counted the same misses: the policies made the
                # same choices, so the tie holds by construction)
                "structural": len({(r.get("misses"), r.get("requests")) for r in g}) == 1,
                "measured_winner": policy(g[measured]),
                "predicted_winners": [policy(g[i]) for i in predicted], "winner_holds": holds}
        out.append(entry)
    return out


def _each(ranks: list[dict]):
    """(condition, metric, its ranking) of every ranked condition and metric."""
    for r in ranks:
        for m in METRICS:
            if r.get(m):
                yield r["condition"], m, r[m]


def goals(summ: dict, ranks: list[dict]) -> dict:
    """Each goal of the module docstring, met or not, with its figure."""
    out = {}
    for m in METRICS:
        s = summ[m]
        out[f"{m}_median"] = {"value": s["median"], "goal": GOALS["median"],
                              "met": s["median"] is not None and s["median"] <= GOALS["median"]}
        out[f"{m}_p90"] = {"value": s["p90"], "goal": GOALS["p90"],
                           "met": s["p90"] is not None and s["p90"] <= GOALS["p90"]}
    # tau over the pairs the measurement separates and the model orders: a pair inside the
    # spread of its runs is no ranking to get right, and a predicted tie is counted apart.
    taus = [r[m]["tau_decided"] for r in ranks for m in METRICS
            if r.get(m) and r[m]["tau_decided"] is not None]
    low = [f"{r['condition']} ({m})" for r in ranks for m in METRICS
           if r.get(m) and r[m]["tau_decided"] is not None
           and r[m]["tau_decided"] < GOALS["tau"]]
    lost = [f"{r['condition']} ({m})" for r in ranks for m in METRICS
            if r.get(m) and not r[m]["winner_holds"]]
    out["tau"] = {"value": min(taus) if taus else None, "goal": GOALS["tau"],
                  "met": not low, "below": low}
    out["winners"] = {"value": len(lost), "goal": 0, "met": not lost, "lost": lost}
    return out


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:+.0f}%"


def _ms(x) -> str:
    return "n/a" if x is None else f"{1e3 * x:.2f}"


def _row_figures(row: dict) -> tuple:
    """A row's TTFT spread (min, max of its runs) and decode seconds per token, wall and
    virtual."""
    w, v = row["wall"], row["virtual"]
    lo, hi = _spread(row, "ttft")
    per_w = w["decode_s"] / w["decode_tokens"] if w["decode_tokens"] else None
    per_v = v["decode_s"] / v["decode_tokens"] if v["decode_tokens"] else None
    return lo, hi, per_w, per_v


def cell_table(rows: list[dict]) -> str:
    """Per cell: TTFT and decode time per token, wall (median, [min, max] of its runs) and
    virtual, and the signed error."""
    head = (f"{'group':14s} {'cell':44s} | {'TTFT ms wall':>12s} {'[min, max]':>15s} "
            f"{'virtual':>8s} {'error':>6s} | {'decode ms/tok wall':>18s} {'virtual':>8s} "
            f"{'error':>6s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        w, v = r["wall"], r["virtual"]
        lo, hi, per_w, per_v = _row_figures(r)
        lines.append(f"{r['group'][:14]:14s} {r['cell'][:44]:44s} | {_ms(w['ttft_s']):>12s} "
                     f"{'[' + _ms(lo) + ', ' + _ms(hi) + ']':>15s} {_ms(v['ttft_s']):>8s} "
                     f"{_pct(r['ttft_error']):>6s} | {_ms(per_w):>18s} {_ms(per_v):>8s} "
                     f"{_pct(r['decode_error']):>6s}")
    return "\n".join(lines)


def summary_text(summ: dict, ranks: list[dict], met: dict) -> str:
    lines = []
    for m in METRICS:
        s = summ[m]
        if not s["cells"]:
            continue
        lines.append(f"{m:6s}: {s['cells']} cells, |error| median {100 * s['median']:.1f}%, "
                     f"90th percentile {100 * s['p90']:.1f}%, max {100 * s['max']:.1f}%; "
                     f"signed median {100 * s['signed_median']:+.1f}%, virtual above wall in "
                     f"{s['over']}")
    lines.append("rankings within each condition (fastest first; tau-b over all pairs, and "
                 "over the pairs the live runs' spreads separate):")
    for condition, m, x in _each(ranks):
        tau = "n/a" if x["tau"] is None else f"{x['tau']:+.2f}"
        if x["predicted_tie"]:
            tau += " (predicted tie: structural)" if x["structural"] else " (predicted tie)"
        dec = ("-" if x["tau_decided"] is None else
               f"{x['tau_decided']:+.2f} over {x['decided_pairs']}")
        ties = f", {len(x['missed_ties'])} separated but predicted tied" if x[
            "missed_ties"] else ""
        win = "holds" if x["winner_holds"] else (
            f"LOST: predicted {'/'.join(x['predicted_winners'])}, measured "
            f"{x['measured_winner']}")
        lines.append(f"  {condition:36s} {m:6s} tau-b {tau:34s} separated "
                     f"{x['separated_pairs']}/{x['pairs']}, decided {dec}{ties}; winner {win}")
    lines.append("goals: " + "; ".join(
        f"{k} {'met' if g['met'] else 'MISSED'}"
        + ("" if g["value"] is None else
           f" ({g['value']:.3f}" + (f" <= {g['goal']}" if k != "tau" else f" >= {g['goal']}")
           + ")")
        for k, g in met.items()))
    return "\n".join(lines)


def plot(rows: list[dict], path: str, title: str) -> str:
    """Predicted against measured, log-log, TTFT and decode time per token side by side, the
    y = x line and +-10% bands; a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, m in zip(axes, METRICS):
        pts = []
        for r in rows:
            w, v = r["wall"][f"{m}_s"], r["virtual"][f"{m}_s"]
            if w is None or v is None:
                continue
            if m == "decode":
                w, v = w / r["wall"]["decode_tokens"], v / r["virtual"]["decode_tokens"]
            pts.append((1e3 * w, 1e3 * v, r["group"]))
        groups = sorted({g for _, _, g in pts})
        for g in groups:
            xs = [p[0] for p in pts if p[2] == g]
            ys = [p[1] for p in pts if p[2] == g]
            ax.scatter(xs, ys, s=18, label=g)
        if pts:
            lo = min(min(p[0], p[1]) for p in pts) / 1.3
            hi = max(max(p[0], p[1]) for p in pts) * 1.3
            line = np.geomspace(lo, hi, 50)
            ax.plot(line, line, "k-", lw=1, label="y = x")
            ax.fill_between(line, 0.9 * line, 1.1 * line, color="gray", alpha=0.2,
                            label="+-10%")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
        ax.set_xscale("log")
        ax.set_yscale("log")
        unit = "TTFT, ms" if m == "ttft" else "decode, ms per token"
        ax.set_xlabel(f"measured (wall clock) {unit}")
        ax.set_ylabel(f"predicted (virtual clock) {unit}")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def markdown(result: dict) -> str:
    """validation.json's tables as markdown (what docs/findings/clock_validation.md quotes):
    the summary by group, with the device-only clock's beside it, the rankings, the cells."""
    def pct(x):
        return "–" if x is None else f"{100 * x:.1f}%"

    lines = [f"`{result['command']}`, {result['date']}, {len(result['cells'])} cells x "
             f"{result['reps']} runs, load average {result['load_average']['before'][0]:.1f} "
             f"before / {result['load_average']['after'][0]:.1f} after", "",
             "| cells | TTFT median | TTFT p90 | TTFT max | decode median | decode p90 | "
             "decode max |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    rows = [("all, with the host's work", result["summary"]),
            ("all, device-only clock", result["device_only_summary"])]
    rows += [(g, s) for g, s in result["summary_by_group"].items()]
    for name, s in rows:
        t, d = s["ttft"], s["decode"]
        lines.append(f"| {name} ({t['cells']}) | {pct(t['median'])} | {pct(t['p90'])} | "
                     f"{pct(t['max'])} | {pct(d['median'])} | {pct(d['p90'])} | "
                     f"{pct(d['max'])} |")
    lines += ["", "| condition | metric | tau-b | separated / pairs | tau (separated, ordered) "
              "| predicted winner |", "| --- | --- | ---: | ---: | ---: | --- |"]
    for condition, m, x in _each(result["rankings"]):
        tau = "–" if x["tau"] is None else f"{x['tau']:+.2f}"
        if x["predicted_tie"]:
            tau += " (tie: structural)" if x["structural"] else " (tie)"
        dec = "–" if x["tau_decided"] is None else \
            f"{x['tau_decided']:+.2f} ({x['decided_pairs']})"
        win = "holds" if x["winner_holds"] else \
            f"lost ({'/'.join(x['predicted_winners'])} vs {x['measured_winner']})"
        lines.append(f"| {condition} | {m} | {tau} | {x['separated_pairs']} / {x['pairs']} | "
                     f"{dec} | {win} |")
    lines += ["", "| group | cell | TTFT wall ms [min, max] | virtual | error | device-only "
              "error | decode ms/tok wall | virtual | error | device-only error |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["cells"]:
        w, v, d = r["wall"], r["virtual"], r.get("device_only") or {}
        lo, hi, per_w, per_v = _row_figures(r)
        lines.append(f"| {r['group']} | {r['cell']} | {_ms(w['ttft_s'])} [{_ms(lo)}, {_ms(hi)}] "
                     f"| {_ms(v['ttft_s'])} | {_pct(r['ttft_error'])} | "
                     f"{_pct(d.get('ttft_error'))} | {_ms(per_w)} | {_ms(per_v)} | "
                     f"{_pct(r['decode_error'])} | {_pct(d.get('decode_error'))} |")
    return "\n".join(lines) + "\n"
