"""The sweep report over a synthetic sweep: loading, report.md's tables, the figures."""

from __future__ import annotations

import json
import os

import pytest

from moejax.analysis import report, sweep_cells
from moejax.results import write_json_atomic
from tests.sweep_fixtures import (
    EVICTIONS,
    LAYERS,
    TOTAL_EXPERTS,
    assert_png,
    cell_name,
    synthetic_results,
    synthetic_sweep,
)


def test_load_cells_skips_unfinished_and_corrupt(tmp_path):
    cells = synthetic_sweep(str(tmp_path))
    rows = sweep_cells.load_cells(str(tmp_path))
    assert len(rows) == 24 == len(cells)
    sweep = sweep_cells.scan(str(tmp_path))
    assert sweep.unfinished == ["unfinished_cell"]
    assert sorted(sweep.failed) == ["corrupt_cell", "crashed_cell"]
    assert sweep.failed["crashed_cell"] == "ConfigError: slots < top_k"
    assert sweep.failed["corrupt_cell"].startswith("JSONDecodeError")

    name = cell_name("code_0", 0.05, "least_stale", "score_percentile(p=80)")
    row = next(r for r in rows if r["name"] == name)
    total = cells[name]["cache"]["total"]
    assert (row["trace"], row["capacity"], row["eviction"], row["prefetch"]) == (
        "code_0", "5%", "least_stale", "score_percentile(p=80)")
    assert row["h2d_gbps"] == 5.0  # the effective value, not the config's 0
    assert row["capacity_frac"] == pytest.approx(6 / TOTAL_EXPERTS)
    assert row["hit_rate"] == pytest.approx(
        (total["hits"] + total["late_hits"]) / total["requests"])
    assert row["requests"] == LAYERS * 200
    assert row["ttft_s"] == cells[name]["cache"]["timing"]["ttft_s"]
    assert row["decode_tok_per_s"] == pytest.approx(100.0)  # 2 tokens in 20 ms
    per_layer = cells[name]["cache"]["per_layer"]
    assert row["layers"] == [1, 2, 3, 4]
    assert row["layer_collision_miss_rate"] == pytest.approx(
        [p["collision_misses"] / p["requests"] for p in per_layer])
    assert row["layer_miss_rate"] == pytest.approx(
        [p["misses"] / p["requests"] for p in per_layer])


def test_trace_name_falls_back_to_the_config_path(tmp_path):
    r = synthetic_results("math_1", 0.05, "lru", "none", 0)
    del r["trace"]
    write_json_atomic(str(tmp_path / "cells" / "a" / "results.json"), r)
    r = synthetic_results("x", 0.05, "lru", "none", 1)
    del r["trace"], r["config"]["trace"]
    write_json_atomic(str(tmp_path / "cells" / "b" / "results.json"), r)
    assert [row["trace"] for row in sweep_cells.load_cells(str(tmp_path))] == ["math_1", "live"]


def test_write_report(tmp_path):
    cells = synthetic_sweep(str(tmp_path))
    path = report.write_report(str(tmp_path))
    assert path == os.path.join(str(tmp_path), "report.md")
    text = open(path).read()
    assert "24 finished cells of 27 cell directories (1 unfinished, 2 failed)" in text
    assert "Unfinished: unfinished_cell." in text
    assert "Failed: `crashed_cell` — ConfigError: slots < top_k" in text
    # One table per trace and capacity, a row per eviction policy in each.
    assert text.count("**capacity 5%**") == 2 and text.count("**capacity 25%**") == 2
    for ev in EVICTIONS:
        assert text.count(f"\n| {ev} | ") == 4
    assert "| eviction \\ prefetch | none | score_percentile(p=80) |" in text

    name = cell_name("prose_0", 0.25, "fld", "none")
    t = cells[name]["cache"]["total"]
    ready = 100 * t["hits"] / t["requests"]
    late = 100 * t["late_hits"] / t["requests"]
    coll = 100 * t["collision_misses"] / t["requests"]
    ttft_ms = 1e3 * cells[name]["cache"]["timing"]["ttft_s"]
    entry = f"{ready:.1f}%+{late:.1f}% / {coll:.1f}% / {ttft_ms:.1f} ms"
    section = text.split("### prose_0")[1].split("**capacity 25%**")[1]
    fld_row = next(line for line in section.splitlines() if line.startswith("| fld |"))
    assert fld_row.split(" | ")[1] == entry
    # Ready and late are shown apart, and together they are the hit rate.
    shown_ready, shown_late = (float(x.rstrip("%")) for x in entry.split(" / ")[0].split("+"))
    assert shown_ready + shown_late == pytest.approx(100 * t["hit_rate"], abs=0.11)
    assert t["late_hits"] > 0 and shown_late > 0

    # The best-by-TTFT entry for (prose_0, 5%) is the cell with the smallest TTFT there.
    group = {n: c for n, c in cells.items() if n.startswith("trace=prose_0,cap=0.05,")}
    best = min(group, key=lambda n: group[n]["cache"]["timing"]["ttft_s"])
    pol = group[best]["cache"]["policies"]
    best_line = next(line for line in text.splitlines() if line.startswith("| prose_0 | 5% |"))
    assert f"| {pol['eviction']} · {pol['prefetch']} |" in best_line
    # The best hit rate is shown as ready + late of the cell with the highest hit rate.
    best_hit = max(group, key=lambda n: group[n]["cache"]["total"]["hit_rate"])
    bt = group[best_hit]["cache"]["total"]
    assert best_line.endswith(f"| {100 * bt['ready_hit_rate']:.1f}% + "
                              f"{100 * bt['late_hit_rate']:.1f}% |")
    assert "hit rate (ready + late)" in text
    assert report.DROPIN_FIGURE not in text and "drop-in" not in text  # no preset cells
    assert not os.path.exists(os.path.join(str(tmp_path), report.DROPIN_FIGURE))

    for fig in report.FIGURES:
        assert_png(os.path.join(str(tmp_path), fig))
    assert len(open(os.path.join(str(tmp_path), "cells.csv")).read().splitlines()) == 25


def test_single_trace_single_capacity_and_partial_values(tmp_path):
    cells = synthetic_sweep(str(tmp_path), traces=("math_0",), capacities=(0.05,), bad_cells=False)
    # A cell without timing or prefetch numbers, and a policy only it uses.
    r = next(iter(cells.values()))
    r["cache"]["timing"]["ttft_s"] = None
    r["cache"]["timing"]["decode_tok_per_s"] = None
    r["cache"]["policies"]["eviction"] = r["config"]["policies"]["eviction"] = "lfu"
    r["cache"]["per_layer"][0]["collision_miss_rate"] = None
    write_json_atomic(str(tmp_path / "cells" / "lfu" / "results.json"), r)
    path = report.write_report(str(tmp_path))
    text = open(path).read()
    assert "7 finished cells of 7 cell directories" in text
    lfu_row = next(line for line in text.splitlines() if line.startswith("| lfu |"))
    assert lfu_row.split(" | ")[1].endswith("% / –")  # no TTFT; no score_percentile cell
    assert lfu_row.endswith("|  |")
    for fig in report.FIGURES:
        assert_png(os.path.join(str(tmp_path), fig))


def test_empty_sweep_and_cli(tmp_path, capsys):
    os.makedirs(tmp_path / "cells")  # a sweep whose cells have not started
    assert report.main([f"--sweep_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == os.path.join(str(tmp_path), "report.md")
    assert "No finished cells" in open(out).read()
    for fig in report.FIGURES:
        assert os.path.getsize(os.path.join(str(tmp_path), fig)) > 0


def test_json_roundtrip_of_none_rates(tmp_path):
    """A cell with zero requests (all rates None) loads and renders."""
    r = synthetic_results("prose_0", 0.05, "lru", "none", 3)
    for key in ("hit_rate", "ready_hit_rate", "late_hit_rate", "miss_rate",
                "collision_miss_rate"):
        r["cache"]["total"][key] = None
    os.makedirs(tmp_path / "cells" / "z")
    (tmp_path / "cells" / "z" / "results.json").write_text(json.dumps(r))
    report.write_report(str(tmp_path))
    assert "| lru | – / – / " in open(tmp_path / "report.md").read()


def test_varying_miss_policy_and_bandwidth(tmp_path):
    """Tables stay at the lowest bandwidth; a varying miss policy joins the row label."""
    for i, (miss, gbps) in enumerate([("fetch", 5.0), ("drop(keep=2)", 5.0), ("fetch", 25.0)]):
        for ev in ("least_stale", "lru"):
            r = synthetic_results("prose_0", 0.05, ev, "none", 10 * i + len(ev), h2d_gbps=gbps)
            r["cache"]["policies"]["miss"] = r["config"]["policies"]["miss"] = miss
            write_json_atomic(str(tmp_path / "cells" / f"{i}{ev}" / "results.json"), r)
    text = open(report.write_report(str(tmp_path))).read()
    assert "## By trace, at H2D 5 GB/s (the lowest present)" in text
    assert "| eviction · miss \\ prefetch | none |" in text
    labels = [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| l")]
    assert labels == ["| lru · drop(keep=2)", "| lru · fetch", "| least_stale · drop(keep=2)",
                      "| least_stale · fetch"]
    best = [line for line in text.splitlines() if line.startswith("| prose_0 | 5% |")]
    assert [line.split(" | ")[2] for line in best] == ["5", "25"]
    for fig in report.FIGURES:
        assert_png(os.path.join(str(tmp_path), fig))


def test_new_fields_and_older_results(tmp_path):
    """The fields of the ready / late split, prediction and warm TTFT load; an older
    results.json without them still reports (ready from its counters, the rest None)."""
    new = synthetic_results("prose_0", 0.05, "lru", "topk(overfetch=1.0)", 5)
    new["cache"]["total"]["prefetch_dropped"] = 3
    new["cache"]["timing"].update(ttft_per_request_s=[0.02, 0.01, 0.012], cold_ttft_s=0.02,
                                  warm_ttft_s=0.011)
    write_json_atomic(str(tmp_path / "cells" / "new" / "results.json"), new)
    old = synthetic_results("prose_0", 0.05, "fld", "none", 6)
    for key in ("ready_hit_rate", "collision_share_of_misses", "prediction_precision",
                "prediction_recall", "evicted_before_use", "prefetch_dropped"):
        old["cache"]["total"].pop(key, None)
    for key in ("ttft_per_request_s", "cold_ttft_s", "warm_ttft_s"):
        old["cache"]["timing"].pop(key, None)
    write_json_atomic(str(tmp_path / "cells" / "old" / "results.json"), old)
    rows = {r["name"]: r for r in sweep_cells.load_cells(str(tmp_path))}
    n, o = rows["new"], rows["old"]
    t = new["cache"]["total"]
    assert n["ready_hit_rate"] == t["hits"] / t["requests"]
    assert n["ready_hit_rate"] + n["late_hit_rate"] == pytest.approx(n["hit_rate"])
    assert n["prefetch_dropped"] == 3 and n["warm_ttft_s"] == 0.011
    assert n["ttft_per_request_s"] == [0.02, 0.01, 0.012] and n["cold_ttft_s"] == 0.02
    assert n["collision_share_of_misses"] == t["collision_misses"] / t["misses"]
    ot = old["cache"]["total"]
    assert o["ready_hit_rate"] == ot["hits"] / ot["requests"]  # from the counters
    assert o["ready_hit_rate"] + o["late_hit_rate"] == pytest.approx(o["hit_rate"])
    for key in ("prefetch_dropped", "prediction_precision", "evicted_before_use",
                "collision_share_of_misses", "warm_ttft_s", "cold_ttft_s"):
        assert o[key] is None, key
    assert o["preset"] == "" and n["preset"] == ""
    text = open(report.write_report(str(tmp_path))).read()
    assert f"{100 * o['ready_hit_rate']:.1f}%+{100 * o['late_hit_rate']:.1f}% / " in text
    header = open(tmp_path / "cells.csv").readline().strip().split(",")
    for col in ("ready_hit_rate", "late_hit_rate", "hit_rate", "prefetch_dropped",
                "warm_ttft_s", "preset"):
        assert col in header


def test_compare_shows_ready_and_late(tmp_path, capsys):
    from moejax.analysis import compare

    cells = synthetic_sweep(str(tmp_path), traces=("math_0",), capacities=(0.05,), bad_cells=False)
    compare.main([f"--sweep_dir={tmp_path}", "--evictions=lru,least_stale"])
    out = capsys.readouterr().out
    assert "| trace | capacity | lru hit ready + late / coll | least_stale hit ready + late" in out
    t = cells[cell_name("math_0", 0.05, "lru", "none")]["cache"]["total"]
    row = next(line for line in out.splitlines() if line.startswith("| math_0 |"))
    assert row.split(" | ")[2] == (f"{100 * t['ready_hit_rate']:.1f}% + "
                                   f"{100 * t['late_hit_rate']:.1f}% / "
                                   f"{100 * t['collision_miss_rate']:.2f}%")
