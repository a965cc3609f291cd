"""SpecMD's drop-in experiment in the sweep report and in compare: which cells pair, the
TTFT change, the ready / late hit split, and silence when a sweep has no such pairs.

The cells are real: the replay job run on bundled scored traces (as a sweep's worker runs a
cell: the config's overrides applied to the replay config), each writing its results.json
into a sweep's `cells/<name>/`. Tests that check arithmetic patch TTFTs to round numbers."""

from __future__ import annotations

import json
import os
import shutil

import matplotlib.image
import pytest

from launch.cells import readable_name
from moejax import bundled
from moejax.analysis import compare, report, sweep_cells
from moejax.results import write_json_atomic
from tests.replay_cells import run_replay_cell

TRACES = ("code_0", "prose_0")
SLOTS = 8


def _trace(name: str) -> str:
    return os.path.join(bundled.SCORED_TRACES_DIR, f"{name}.npz")


def _cell(trace: str, preset: str = "", eviction: str = "", **more) -> dict:
    o = {"replay.trace": _trace(trace), "cache.slots": SLOTS}
    if preset:
        o["policies.preset"] = preset
    if eviction:
        o["policies.eviction"] = eviction
    return {**o, **more}


# name -> overrides; names are what launch.sweep would call them.
CELLS = {}
for _t in TRACES:
    for _o in (
        _cell(_t, "specmd_1"),  # baseline: the preset's own eviction (lru)
        _cell(_t, "specmd_1", "least_stale"),
        _cell(_t, "specmd_1", 'least_stale(order="left_first")'),
        _cell(_t, "specmd_4"),  # baseline: lru, no prefetch, cache-aware routing
        _cell(_t, "specmd_4", "least_stale"),
    ):
        CELLS[readable_name(_o)] = _o
# Cells that must not pair: a drop-in without a baseline at its capacity or bandwidth, the
# same policies without a preset, and a preset with another explicit eviction.
UNPAIRED = {
    "no_base_cap": _cell("code_0", "specmd_1", "least_stale", **{"cache.slots": 16}),
    "no_base_bw": _cell("code_0", "specmd_1", "least_stale", **{"hardware.h2d_gbps": 32.0}),
    "no_preset": _cell("code_0", "", "least_stale", **{"policies.prefetch":
                                                       "topk(overfetch=1.0)"}),
    "other_eviction": _cell("code_0", "specmd_1", "fld"),
    "base_only": _cell("code_0", "specmd_5"),
}
# The same pairs once more with another pin scope: a varying setup, never crossed.
PIN = {readable_name(o): o for o in (
    _cell("code_0", "specmd_1", **{"cache.pin_scope": "request"}),
    _cell("code_0", "specmd_1", "least_stale", **{"cache.pin_scope": "request"}),
)}


def _run(workdir: str, overrides: dict) -> dict:
    run_replay_cell(workdir, overrides)
    with open(os.path.join(workdir, "results.json")) as f:  # as the report reads it
        return json.load(f)


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> str:
    """Every cell above, run once: `ran/cells/<name>/results.json`."""
    root = str(tmp_path_factory.mktemp("ran"))
    for name, o in {**CELLS, **UNPAIRED, **PIN}.items():
        _run(os.path.join(root, "cells", name), o)
    return root


def _sweep(ran: str, dest, names) -> str:
    for n in names:
        shutil.copytree(os.path.join(ran, "cells", n), os.path.join(str(dest), "cells", n))
    return str(dest)


def _results(sweep: str, name: str) -> dict:
    with open(os.path.join(sweep, "cells", name, "results.json")) as f:
        return json.load(f)


def _set_ttft(sweep: str, name: str, ttft_s: float) -> None:
    r = _results(sweep, name)
    r["cache"]["timing"]["ttft_s"] = ttft_s
    write_json_atomic(os.path.join(sweep, "cells", name, "results.json"), r)


def _name(trace, preset="", eviction="", **more) -> str:
    return readable_name(_cell(trace, preset, eviction, **more))


def _line(text: str, *starts: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith("| " + " | ".join(starts) + " |")]
    return line


def test_pairs_are_the_preset_cells_with_only_the_eviction_replaced(ran, tmp_path):
    sweep = _sweep(ran, tmp_path, [*CELLS, *UNPAIRED])
    rows = sweep_cells.load_cells(sweep)
    pairs = sweep_cells.dropin_pairs(rows)
    got = sorted((p.base["name"], p.dropin["name"], p.label) for p in pairs)
    want = sorted(
        [(_name(t, "specmd_1"), _name(t, "specmd_1", "least_stale"), "+Least-Stale")
         for t in TRACES]
        + [(_name(t, "specmd_1"), _name(t, "specmd_1", 'least_stale(order="left_first")'),
            "+Least-Stale (order=left_first)") for t in TRACES]
        + [(_name(t, "specmd_4"), _name(t, "specmd_4", "least_stale"), "+Least-Stale")
           for t in TRACES])
    assert got == want
    for p in pairs:
        b, d = p.base, p.dropin
        assert b["preset"] == d["preset"] == p.preset
        assert (b["trace"], b["capacity"], b["h2d_gbps"]) == (d["trace"], d["capacity"],
                                                              d["h2d_gbps"])
        assert (b["prefetch"], b["miss"], b["routing"]) == (d["prefetch"], d["miss"],
                                                            d["routing"])
        assert b["eviction"] == "lru" and d["eviction"].startswith("least_stale")
        assert b["eviction_source"] == "preset" and d["eviction_source"] == "explicit"
        assert p.other == ()
    # The real runs differ where Least-Stale decides: not every pair is a copy of its baseline.
    assert any(p.base["collision_miss_rate"] != p.dropin["collision_miss_rate"] for p in pairs)


def test_a_baseline_given_explicitly_and_a_varying_setup(ran, tmp_path):
    """`eviction=lru` given with specmd_1 is still its baseline; cells differing in another
    config field (cache.pin_scope) pair only among themselves, and the field is shown."""
    sweep = _sweep(ran, tmp_path, [_name("code_0", "specmd_1", "least_stale"), *PIN])
    explicit = _run(os.path.join(sweep, "cells", "explicit_lru"),
                    _cell("code_0", "specmd_1", "lru"))
    assert explicit["cache"]["policies"]["source"]["eviction"] == "explicit"
    pairs = sweep_cells.dropin_pairs(sweep_cells.load_cells(sweep))
    assert sorted((p.base["name"], p.dropin["name"], p.other) for p in pairs) == [
        ("explicit_lru", _name("code_0", "specmd_1", "least_stale"),
         (("cache.pin_scope", "layer"),)),
        (_name("code_0", "specmd_1", **{"cache.pin_scope": "request"}),
         _name("code_0", "specmd_1", "least_stale", **{"cache.pin_scope": "request"}),
         (("cache.pin_scope", "request"),)),
    ]
    text = open(report.write_report(sweep)).read()
    assert "| preset | cache.pin_scope | baseline eviction | drop-in |" in text
    assert os.path.exists(os.path.join(sweep, report.DROPIN_FIGURE))


def test_dropin_table_ttft_change_and_hit_split(ran, tmp_path, capsys):
    sweep = _sweep(ran, tmp_path, CELLS)
    # Round TTFTs: specmd_1 on code_0 10 ms -> 8 ms (-20%), on prose_0 4 ms -> 5 ms (+25%).
    for trace, base, drop in (("code_0", 0.010, 0.008), ("prose_0", 0.004, 0.005)):
        _set_ttft(sweep, _name(trace, "specmd_1"), base)
        _set_ttft(sweep, _name(trace, "specmd_1", "least_stale"), drop)
    text = open(report.write_report(sweep)).read()
    assert "## SpecMD drop-in: each preset with Least-Stale eviction" in text

    head = ("| trace | capacity | H2D GB/s | preset | baseline eviction | drop-in | "
            "TTFT baseline → drop-in | ΔTTFT | hit rate ready + late, baseline → drop-in | "
            "collision misses, baseline → drop-in |")
    assert head in text
    code = _line(text, "code_0", f"{SLOTS} slots", "5", "specmd_1", "lru", "+Least-Stale")
    prose = _line(text, "prose_0", f"{SLOTS} slots", "5", "specmd_1", "lru", "+Least-Stale")
    assert code.split(" | ")[6:8] == ["10.0 ms → 8.00 ms", "-20.0%"]
    assert prose.split(" | ")[6:8] == ["4.00 ms → 5.00 ms", "+25.0%"]

    # Hit rates: ready + late of each real cell, adding up to its hit rate; collisions too.
    b = _results(sweep, _name("code_0", "specmd_1"))["cache"]["total"]
    d = _results(sweep, _name("code_0", "specmd_1", "least_stale"))["cache"]["total"]
    for t in (b, d):
        assert t["ready_hit_rate"] + t["late_hit_rate"] == pytest.approx(t["hit_rate"])
    hits, coll = code.split(" | ")[8:10]
    assert hits == (f"{100 * b['ready_hit_rate']:.1f}% + {100 * b['late_hit_rate']:.1f}% → "
                    f"{100 * d['ready_hit_rate']:.1f}% + {100 * d['late_hit_rate']:.1f}%")
    assert coll.rstrip(" |") == (f"{100 * b['collision_miss_rate']:.1f}% → "
                                 f"{100 * d['collision_miss_rate']:.1f}%")
    assert b["late_hits"] > 0  # the late part is really there to show

    # The per-preset summary: means over the two traces; ΔTTFT the mean of -20% and +25%.
    summary = _line(text, "specmd_1", "lru", "+Least-Stale", "2")
    assert summary.split(" | ")[4:6] == ["7.00 ms → 6.50 ms", "+2.5%"]
    assert _line(text, "specmd_1", "lru", "+Least-Stale (order=left_first)", "2")
    assert _line(text, "specmd_4", "lru", "+Least-Stale", "2")

    # compare --dropin prints the same tables.
    compare.main([f"--sweep_dir={sweep}", "--dropin"])
    out = capsys.readouterr().out
    assert head in out and code in out and summary in out
    # A bandwidth no cell ran at is a mistake in what was typed: the ones there are named.
    assert compare.main([f"--sweep_dir={sweep}", "--dropin", "--h2d_gbps=32"]) == 2
    err = capsys.readouterr().err
    assert "--h2d_gbps=32: no cell has it; they have: 5" in err and "Traceback" not in err

    path = os.path.join(sweep, report.DROPIN_FIGURE)
    img = matplotlib.image.imread(path)
    assert os.path.getsize(path) > 1000 and img.ndim == 3
    assert 200 < img.shape[0] < 4000 and 300 < img.shape[1] < 6000


def test_no_preset_cells_no_dropin(ran, tmp_path, capsys):
    """Cells without presets (or a preset without its Least-Stale twin) give no drop-in
    figure or section, and a stale figure from an earlier report goes."""
    sweep = _sweep(ran, tmp_path, ["no_preset", "base_only", "other_eviction"])
    stale = os.path.join(sweep, report.DROPIN_FIGURE)
    with open(stale, "wb") as f:
        f.write(b"old")
    assert sweep_cells.dropin_pairs(sweep_cells.load_cells(sweep)) == []
    text = open(report.write_report(sweep)).read()
    assert "drop-in" not in text and report.DROPIN_FIGURE not in text
    assert not os.path.exists(stale)
    for fig in report.FIGURES:
        assert os.path.getsize(os.path.join(sweep, fig)) > 1000
    compare.main([f"--sweep_dir={sweep}", "--dropin"])
    assert capsys.readouterr().out.startswith("no drop-in pairs (all bandwidths)")


def test_labels_and_change():
    assert sweep_cells.dropin_label("least_stale") == "+Least-Stale"
    assert sweep_cells.dropin_label("least_stale()") == "+Least-Stale"
    assert (sweep_cells.dropin_label('least_stale(order="left_first")')
            == "+Least-Stale (order=left_first)")
    assert sweep_cells.ttft_change_pct(0.010, 0.008) == pytest.approx(-20.0)
    assert sweep_cells.ttft_change_pct(0.004, 0.005) == pytest.approx(25.0)
    assert sweep_cells.ttft_change_pct(None, 0.005) is None
    assert sweep_cells.ttft_change_pct(0.0, 0.005) is None
