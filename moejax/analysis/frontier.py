"""The quality–speed frontier of a sweep's quality cells (SpecMD Fig. 5 / Fig. 7): pure
functions over `sweep_cells.cell_row` rows, used by the report's frontier section and figure.

* `pareto_front(points)`: the non-dominated points of `(speed, loss)` pairs — speed is
  maximised, loss minimised;
* `frontier_rows(rows)`: the quality rows grouped by model, capacity and bandwidth (one
  frontier each: a larger cache is both faster and closer to the reference, so across
  capacities the frontier would only say "more memory"), with the frontier marked and each
  row's baseline — plain `fetch` with `standard` routing, all else equal, at native
  precision, or for a policy at a lower precision (fetch_priority's int8 first pool) at that
  precision when the sweep has that cell (`baseline_of`);
* `summary(group)`: a textual account of one group.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from moejax.analysis.sweep_cells import EMBEDDED_MODEL, field_value, identity_keys, spec_base

BASE_MISS = "fetch"
BASE_ROUTING = "standard"
# Besides the miss policy, precision and routing, what may tell a group's configurations apart.
_OTHER_KEYS = ("eviction", "prefetch", "queue")


def _finite(x) -> bool:
    return x is not None and not isinstance(x, bool) and math.isfinite(float(x))


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """`a` is at least as fast and at most as lossy as `b`, and strictly better in one."""
    return a[0] >= b[0] and a[1] <= b[1] and (a[0] > b[0] or a[1] < b[1])


def pareto_front(points: Sequence[tuple[float | None, float | None]]) -> list[int]:
    """Indices of the non-dominated `(speed, loss)` points, in speed order (slowest first;
    equal speeds by loss, then index). Points equal to each other dominate none of the others:
    all of them are on the front when one is. A point whose speed or loss is None or not finite
    is never on the front (and dominates nothing)."""
    valid = [(float(p[0]), float(p[1]), i) for i, p in enumerate(points)
             if _finite(p[0]) and _finite(p[1])]
    # Fastest first; among equal speeds the lowest loss first. A point is on the front iff
    # its loss is below every faster point's, and at most its equal-speed predecessors'.
    valid.sort(key=lambda t: (-t[0], t[1], t[2]))
    front = []
    best_faster = math.inf  # the lowest loss among strictly faster points
    k = 0
    while k < len(valid):
        j = k
        while j < len(valid) and valid[j][0] == valid[k][0]:
            j += 1
        block = valid[k:j]  # one speed, by loss
        low = block[0][1]
        if low < best_faster:
            front += [t for t in block if t[1] == low]
        best_faster = min(best_faster, low)
        k = j
    front.sort(key=lambda t: (t[0], t[1], t[2]))
    return [t[2] for t in front]


def _norm(spec: str) -> str:
    s = str(spec).replace(" ", "").replace('"', "").replace("'", "")
    return s[:-2] if s.endswith("()") else s


def is_base_policy(row: dict) -> bool:
    """Plain fetch (at whatever single precision) with standard routing."""
    return _norm(row["miss"]) == BASE_MISS and _norm(row["routing"]) == BASE_ROUTING


def precision_label(row: dict) -> str:
    """The experts' precision: the pools of a precision-aware miss policy
    ("int8:int4:int2"), else the plain precision ("native" when not known)."""
    pools = row.get("pools")
    if pools and ":" in pools:
        return pools
    return str(row.get("precision") or "native")


def config_label(row: dict, other: Sequence[str] = ()) -> str:
    """`fetch_priority [int8:int4:int2] · cache_aware(lam=0.3)`: the miss policy, its precision
    when not native, the routing when not standard, and the `other` keys' values."""
    prec = precision_label(row)
    label = str(row["miss"])
    if ":" in prec:
        label += f" [{prec}]"
    elif prec != "native":
        label += f" @{prec}"
    if _norm(row["routing"]) != BASE_ROUTING:
        label += f" · {row['routing']}"
    return " · ".join([label, *(field_value(row, k) for k in other)])


def model_order(model) -> tuple:
    return (model != EMBEDDED_MODEL, str(model))


@dataclasses.dataclass
class FrontierGroup:
    """The quality rows of one model at one capacity and bandwidth."""

    model: str
    capacity: str
    capacity_key: tuple
    h2d_gbps: float | None
    rows: list[dict]  # fastest first (rows without a speed last)
    on_front: list[bool]  # per row
    front: list[int]  # indices into rows, slowest first (the step line's order)
    baselines: list[dict | None]  # per row: its baseline row (itself for a baseline)
    other: tuple[str, ...]  # the keys besides miss / precision / routing that vary
    speed: str
    loss: str

    def label(self, i: int) -> str:
        return config_label(self.rows[i], self.other)

    @property
    def front_rows(self) -> list[dict]:
        return [self.rows[i] for i in self.front]


def _setup_key(row: dict, keys: Sequence[str]) -> tuple:
    return tuple(str(row.get(k)) for k in keys)


def baseline_of(row: dict, rows: list[dict], other: Sequence[str] = ()) -> dict | None:
    """The row's baseline among `rows` (the same `other` keys): plain fetch + standard routing
    at native precision for plain fetch at any precision (what uniform quantization trades)
    and for native rows; for the rest at the row's own precision when that cell is there,
    else at native. A cell of several precision pools compares with its first pool's
    precision (fetch_priority's int8:int4:int2 with fetch at int8). None when there is no
    such cell; the first by cell name when several."""
    same = [r for r in rows if is_base_policy(r) and _setup_key(r, other) ==
            _setup_key(row, other) and ":" not in precision_label(r)]
    wanted = ["native"]
    own = str(row.get("precision") or "native")
    if not is_base_policy(row) and own != "native":
        wanted.insert(0, own)
    for precision in wanted:
        found = sorted((r for r in same if precision_label(r) == precision),
                       key=lambda r: r["name"])
        if found:
            return found[0]
    return None


def _has(row: dict, key: str) -> bool:
    return _finite(row.get(key))


def frontier_rows(rows: list[dict], speed: str = "decode_tok_per_s",
                  loss: str = "kl_mean") -> list[FrontierGroup]:
    """The rows with a `loss` value (quality cells), one group per model, capacity and
    bandwidth; groups by model (the embedded model first), capacity, bandwidth."""
    quality = [r for r in rows if r.get(loss) is not None]
    groups: dict[tuple, list[dict]] = {}
    for r in quality:
        bw = r.get("h2d_gbps")
        key = (str(r.get("model")), r["capacity_key"], r["capacity"],
               -1.0 if bw is None else float(bw))
        groups.setdefault(key, []).append(r)
    out = []
    for (model, cap_key, cap, bw), members in sorted(
            groups.items(), key=lambda kv: (model_order(kv[0][0]), kv[0][1], kv[0][3])):
        members = sorted(members, key=lambda r: (
            not _has(r, speed), -float(r[speed]) if _has(r, speed) else 0.0,
            float(r[loss]) if _has(r, loss) else math.inf, r["name"]))
        other = tuple(k for k in _OTHER_KEYS if len({str(r.get(k)) for r in members}) > 1)
        # Any further field telling two configurations apart (a config field) joins the
        # label: two rows of one table never read alike.
        other += tuple(identity_keys(members, ("miss", "routing", "precision", "pools",
                                               *other)))
        front = pareto_front([(r.get(speed), r.get(loss)) for r in members])
        marks = [False] * len(members)
        for i in front:
            marks[i] = True
        out.append(FrontierGroup(model, cap, cap_key, None if bw < 0 else bw, members, marks,
                                 front, [baseline_of(r, members, other) for r in members],
                                 other, speed, loss))
    return out


def relative(row: dict, base: dict | None, speed: str = "decode_tok_per_s",
             loss: str = "kl_mean") -> tuple[float | None, float | None]:
    """(loss - the baseline's, speed / the baseline's); None where unknown."""
    if base is None:
        return None, None
    d_loss = (float(row[loss]) - float(base[loss])
              if _has(row, loss) and _has(base, loss) else None)
    ratio = (float(row[speed]) / float(base[speed])
             if _has(row, speed) and _has(base, speed) and float(base[speed]) else None)
    return d_loss, ratio


def _num(x, fmt: str = ".3g") -> str:
    return "?" if x is None else format(float(x), fmt)


def _kl(x) -> str:
    if x is None:
        return "?"
    return "0 (exact)" if float(x) == 0 else f"{float(x):.3g}"


def summary(group: FrontierGroup, per_config: bool = True) -> list[str]:
    """Sentences about one group: the frontier's configurations (slowest first), the
    baseline(s), and (`per_config`) per miss policy, precision and routing the loss and speed
    relative to its baseline."""
    sp, ls = group.speed, group.loss
    lines = []
    front = [f"{group.label(i)} ({_num(group.rows[i][sp], '.4g')} tok/s, {ls} "
             f"{_kl(group.rows[i][ls])})" for i in group.front]
    lines.append("On the frontier (slowest first): " + ("; ".join(front) if front else
                                                        "none (no cell has both numbers)") + ".")
    bases = [i for i, r in enumerate(group.rows) if group.baselines[i] is r]
    for i in bases:
        r = group.rows[i]
        lines.append(f"Baseline {group.label(i)}: {_num(r[sp], '.4g')} tok/s, {ls} "
                     f"{_kl(r[ls])}{' (on the frontier)' if group.on_front[i] else ''}.")
    for i, r in enumerate(group.rows if per_config else ()):
        base = group.baselines[i]
        if base is None or base is r:
            continue
        d_loss, ratio = relative(r, base, sp, ls)
        lines.append(
            f"{group.label(i)}: {ls} {_kl(r[ls])} ({_signed(d_loss)} vs "
            f"{config_label(base, group.other)}), speed "
            f"{'?' if ratio is None else f'{ratio:.2f}x'}"
            f"{' — on the frontier' if group.on_front[i] else ''}.")
    if not bases:
        lines.append("No plain fetch + standard routing cell here: nothing to compare with.")
    return lines


def _signed(x) -> str:
    return "?" if x is None else f"{x:+.3g}"


def policy_family(row: dict) -> str:
    """What the figure colours by: the miss policy's name, with the plain precision for plain
    fetch ("fetch @int4")."""
    base = spec_base(str(row["miss"]))
    prec = precision_label(row)
    if base == BASE_MISS and prec != "native" and ":" not in prec:
        return f"fetch @{prec}"
    return _norm(str(row["miss"]))
