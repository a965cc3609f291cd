"""studies/fiddler/grid_host.py and its tables (moejax/analysis/host_compute.py; Fiddler's claims:
studies/fiddler/claims.py): the grid's cells are
its axes and every one is a valid config, a few cells run end to end into the tables and the
claims.json records, and the comparisons (best caching configuration, latency_aware's
exceptions, Fiddler's claims against each baseline) on hand-made cells with their answers
worked by hand."""

from __future__ import annotations

import collections
import dataclasses
import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launch import cells as cells_lib
from moejax import jobs
from moejax.analysis import host_compute as hc
from moejax.analysis import sweep_cells, verdicts
from moejax.analysis.host_compute import Cell
from studies.fiddler import claims as fiddler
from studies.specmd import claims
from tests.sweep_fixtures import grid_config

GRID = os.path.join(os.path.dirname(os.path.dirname(__file__)), "studies", "fiddler", "grid_host.py")


def _module():
    return cells_lib.load_config_module(GRID)


def _config(overrides: dict):
    return grid_config(GRID, overrides)


def test_the_cells_and_their_axes():
    grid = _module()
    cells = cells_lib.collect(grid.sweep, None)
    keys = [tuple(sorted(c.items())) for c in cells]
    assert len(keys) == len(set(keys))
    # 10 traces (4 captures + 6 embedded) x 3 capacities x 3 links x (2 caching misses x 2
    # prefetches + 3 hosts x (2 host policies + 4 layer splits)).
    assert len(cells) == 10 * 3 * 3 * (2 * 2 + 3 * (2 + 4)) == 1980
    assert len(cells_lib.collect(grid.sweep, "traces=captures")) == 4 * 198
    assert len(cells_lib.collect(grid.sweep, "traces=embedded")) == 6 * 198
    assert {c["cache.capacity_frac"] for c in cells} == {0.01, 0.05, 0.25}
    assert {c["hardware.h2d_gbps"] for c in cells} == {5.0, 16.0, 32.0}
    assert collections.Counter(c["policies.miss"] for c in cells) == {
        "fetch": 90 * (2 + 3 * 4), "fetch_priority": 180, "host_compute": 270,
        "latency_aware": 270}
    splits = collections.defaultdict(set)
    for c in cells:
        split = c.get("cache.host_compute_layers", 0)
        host_policy = c["policies.miss"] in ("host_compute", "latency_aware") or split
        # The caching cells move weights: the host does not enter, they run once.
        assert ("host.preset" in c) == bool(host_policy), c
        assert "cache.precision" not in c  # int4, the base config's
        if host_policy:
            assert c["policies.prefetch"] == "none"
            assert c["host.preset"] in ("desktop_ddr5", "server_ddr5", "this_vm")
        if split:
            assert c["policies.miss"] == "fetch"
            splits[os.path.basename(c["replay.trace"])].add(split)
        capture = c["replay.trace"].endswith(".jsonl")
        assert c["policies.prefetch"] in (
            "none", "temporal" if capture else "score_percentile(p=80)")
        if capture:  # id-only: the model named, cut into requests with a prefill
            assert c["model.family"] in ("olmoe", "qwen2_moe")
            assert c["replay.request_tokens"] == 128 and c["replay.prefill_tokens"] == 32
        _config(c)
    # The layer split at each quarter of the model's MoE layers (OLMoE 16, Qwen 24, the
    # embedded model 8).
    assert splits["olmoe_code.jsonl"] == {4, 8, 12, 16}
    assert splits["qwen_prose.jsonl"] == {6, 12, 18, 24}
    assert splits["code_0.npz"] == {2, 4, 6, 8}
    c = _config({})
    assert (c.cache.capacity_of, c.cache.precision, c.policies.eviction) == (
        "model", "int4", "least_stale")
    cpu = cells_lib.collect(grid.sweep, "traces=captures,this_machine=cpu")
    assert {c.get("host.preset") for c in cpu} == {None, "desktop_ddr5", "server_ddr5", "cpu"}
    native = cells_lib.collect(grid.sweep, "traces=captures,precisions=native")
    assert {c["cache.precision"] for c in native} == {"native"}
    # Less the cascade at 1% of OLMoE, which the config refuses at native (its native pool
    # holds 2 experts, below top-8): 2 traces x 3 links x 2 prefetches.
    assert len(native) == 4 * 198 - 12
    assert not [c for c in native if c["policies.miss"] == "fetch_priority"
                and c["model.family"] == "olmoe" and c["cache.capacity_frac"] == 0.01]
    both = cells_lib.collect(grid.sweep, "precisions=int4+native")
    assert len(both) == 1980 + 6 * 198 + 4 * 198 - 12
    assert _config(native[0]).cache.precision == "native"
    with pytest.raises(ValueError, match="traces='long'"):
        cells_lib.collect(grid.sweep, "traces=long")
    with pytest.raises(ValueError, match="precisions='int8'"):
        cells_lib.collect(grid.sweep, "precisions=int8")


def test_cells_run_into_the_tables(tmp_path, capsys):
    cells = cells_lib.collect(_module().sweep, "traces=embedded")
    wanted = [c for c in cells if c["replay.trace"].endswith("prose_0.npz")
              and c["cache.capacity_frac"] == 0.05 and c["hardware.h2d_gbps"] == 16.0
              and c.get("host.preset", "desktop_ddr5") == "desktop_ddr5"
              and c["policies.miss"] != "fetch_priority"
              and c.get("cache.host_compute_layers", 4) == 4]
    assert len(wanted) == 5  # fetch, fetch + SP, host_compute, latency_aware, split N=4
    for i, c in enumerate(wanted):
        results = jobs.run(_config(c), str(tmp_path / "cells" / f"cell{i}"))
        if c["policies.miss"] == "host_compute" or c.get("cache.host_compute_layers"):
            assert results["cache"]["total"]["host_computed"] > 0
    assert fiddler.main(["--sweep_dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for heading in ("### prose_0 (int4): decode ms/token", "### prose_0 (int4): TTFT ms",
                    "## latency_aware against the better of fetch and host_compute",
                    "## Fiddler's claims, against each baseline apart",
                    "| prose_0 | int4 | desktop_ddr5 |",
                    "### fiddler.decode (1.26×): prose_0 (int4), decode ms/token",
                    "| desktop_ddr5 | 60 | 2.3 | 16 | 20 |"):  # the preset's, as it ran
        assert heading in out, heading
    assert "| 5% / 16 GB/s |" in out  # the capacity as configured, of the model
    assert "of 1 conditions" in out  # one latency_aware cell against fetch and host_compute
    # The records, as the claims tool reads them: one per claim x baseline here.
    records = fiddler.fiddler_records(sweep_cells.load_cells(str(tmp_path)), str(tmp_path))
    assert sorted((r["claim"], r["baseline"]) for r in records) == sorted(
        (claim, kind) for claim in ("fiddler.decode", "fiddler.prefill")
        for kind in ("layer_split", "lossless_fetch", "best_caching"))
    for r in records:
        assert set(r) == {"claim", "baseline", "trace", "condition", "metrics", "verdict",
                          "failing_metric", "rule"}
        assert r["trace"] == "prose_0"
        cond = r["condition"]
        assert set(cond) == {"queue", "prefetch", "capacity_frac", "capacity_of", "slots",
                             "capacity_passes", "precision", "h2d_gbps", "hardware",
                             "request_tokens", "prefill_tokens", "host"}
        # The embedded model: 8 MoE layers x top-4 a pass; the trace replayed as recorded.
        assert cond["capacity_passes"] == pytest.approx(cond["slots"] / (8 * 4))
        assert (cond["capacity_frac"], cond["capacity_of"], cond["precision"], cond["host"],
                cond["hardware"], cond["queue"], cond["prefetch"], cond["h2d_gbps"]) == (
            0.05, "model", "int4", "desktop_ddr5", "a100_specmd", "immediate", "none", 16.0)
        assert cond["request_tokens"] is None and cond["prefill_tokens"] is None
        m = r["metrics"]
        assert m["speedup"] == pytest.approx(m["baseline_ms"] / m["claimed_ms"])
        assert verdicts.first_word(r["verdict"]) in (verdicts.WITHIN, verdicts.EXCEEDS,
                                                     verdicts.FALLS_SHORT)
        assert (r["failing_metric"] == "speedup") == (r["verdict"] == verdicts.FALLS_SHORT)
    split = [r for r in records if r["baseline"] == "layer_split"]
    assert {r["metrics"]["baseline_cell"] for r in split} <= {
        "fetch", "fetch + host_compute_layers=4"}
    json.dumps(records)  # claims.json holds them as they are
    # ... and the claims tool puts them there, beside SpecMD's.
    assert claims.main([f"--sweep_dir={tmp_path}"]) == 0
    capsys.readouterr()
    with open(tmp_path / "claims.json") as f:
        data = json.load(f)
    assert [r for r in data["records"] if r["claim"].startswith("fiddler.")] == records


def test_a_sweep_without_host_compute_is_named(tmp_path, capsys):
    (tmp_path / "cells").mkdir()
    assert fiddler.main(["--sweep_dir", str(tmp_path)]) == 2
    assert "none of its 0 finished cells computed on the host" in capsys.readouterr().err


def _cell(miss, decode, ttft=None, prefetch="none", host=None, capacity=0.05, gbps=5.0,
          trace="t", **kw):
    return Cell(trace, capacity, gbps, miss, prefetch, host, decode,
                decode if ttft is None else ttft, **kw)


# One condition worked by hand. Caching: fetch 10 ms, fetch + temporal 8, fetch_priority 9
# -> the best is fetch + temporal, 8 ms. TTFT: fetch 50, fetch + temporal 60, priority 55 ->
# the best is fetch, 50 ms.
HAND = [_cell("fetch", 10.0, 50.0), _cell("fetch", 8.0, 60.0, prefetch="temporal"),
        _cell("fetch_priority", 9.0, 55.0),
        _cell("host_compute", 4.0, 100.0, host="a"), _cell("latency_aware", 5.0, 40.0, host="a"),
        _cell("host_compute", 12.0, 50.0, host="b"), _cell("latency_aware", 10.0, 50.0, host="b")]


def test_the_best_caching_configuration_by_hand():
    at = HAND[0].condition
    assert hc.best_caching(HAND, at, "decode").label == "fetch + temporal"
    assert hc.best_caching(HAND, at, "ttft").label == "fetch"
    assert hc.best_caching(HAND, _cell("fetch", 1.0, capacity=0.25).condition, "decode") is None
    # Another precision is another condition: never a baseline of this one.
    native = _cell("fetch", 1.0, precision="native")
    assert hc.best_caching([*HAND, native], at, "decode").label == "fetch + temporal"
    got = {(c.miss, c.host): (ref.label, round(s, 6), v)
           for c, ref, s, v in hc.against_best(HAND, "decode")}
    assert got == {("host_compute", "a"): ("fetch + temporal", 2.0, "beats"),  # 8 / 4
                   ("latency_aware", "a"): ("fetch + temporal", 1.6, "beats"),  # 8 / 5
                   ("host_compute", "b"): ("fetch + temporal", 0.666667, "loses"),  # 8 / 12
                   ("latency_aware", "b"): ("fetch + temporal", 0.8, "loses")}  # 8 / 10
    ttft = {(c.miss, c.host): v for c, _, _, v in hc.against_best(HAND, "ttft")}
    assert ttft == {("host_compute", "a"): "loses", ("latency_aware", "a"): "beats",
                    ("host_compute", "b"): "ties", ("latency_aware", "b"): "ties"}


def test_latency_aware_exceptions_by_hand():
    # Host a: fetch 10, host_compute 4 -> better 4; latency_aware 5 is above: an exception.
    # Host b: fetch 10, host_compute 12 -> better 10; latency_aware 10 ties: none.
    compared, exceptions = hc.latency_aware_exceptions(HAND, "decode")
    assert compared == 2
    assert [(c.host, tf, th) for c, tf, th in exceptions] == [("a", 10.0, 4.0)]
    # TTFT: a: min(50, 100) = 50 against 40; b: min(50, 50) = 50 against 50: none.
    assert hc.latency_aware_exceptions(HAND, "ttft") == (2, [])
    # The fetch compared is the one without prefetch, even when a prefetcher's is faster.
    only_prefetched = [c for c in HAND if not (c.miss == "fetch" and c.prefetch == "none")]
    assert hc.latency_aware_exceptions(only_prefetched, "decode") == (0, [])


# Fiddler's baselines, one condition worked by hand (decode ms/token). latency_aware 10 ms
# on host a. Layer split on host a: N=0 (plain fetch) 20, N=4 11, N=8 14 -> N=4, 11 ms,
# x1.10: within 1.26x +-25% (0.945-1.575). On host b only N=8 ran, 30 ms, which is not
# a's. Lossless fetch: fetch 20, fetch + temporal 16 -> 16 ms, x1.60: exceeds. Best caching:
# fetch_priority 8 (lossy) -> x0.80: latency_aware is slower, refuted on decode time (the
# band's 0.945 reaches below 1x, but Fiddler states "faster").
FIDDLER = [_cell("latency_aware", 10.0, host="a"),
           _cell("fetch", 20.0), _cell("fetch", 16.0, prefetch="temporal"),
           _cell("fetch_priority", 8.0),
           _cell("fetch", 11.0, host="a", split=4), _cell("fetch", 14.0, host="a", split=8),
           _cell("fetch", 3.0, host="b", split=8),
           _cell("fetch", 1.0, precision="native")]  # another condition: never used


def test_fiddlers_baselines_by_hand():
    la = FIDDLER[0]
    assert fiddler.baseline_cell(FIDDLER, "layer_split", la, "decode").label == \
        "fetch + host_compute_layers=4"
    assert fiddler.baseline_cell(FIDDLER, "lossless_fetch", la, "decode").label == \
        "fetch + temporal"
    assert fiddler.baseline_cell(FIDDLER, "best_caching", la, "decode").label == "fetch_priority"
    # N = 0 is one of the split's N: the best when every N > 0 is slower.
    slow = [c if not c.split else dataclasses.replace(c, decode_ms=50.0) for c in FIDDLER]
    assert fiddler.baseline_cell(slow, "layer_split", la, "decode").label == "fetch"
    # No N > 0 on this host: no layer-split baseline (not plain fetch relabelled).
    other = dataclasses.replace(la, host="c")
    assert fiddler.baseline_cell(FIDDLER, "layer_split", other, "decode") is None
    with pytest.raises(ValueError, match="baseline 'llama'"):
        fiddler.baseline_cell(FIDDLER, "llama", la, "decode")
    rows = {(r.claim, r.baseline): r for r in fiddler.fiddler_rows(FIDDLER)}
    assert len(rows) == 2 * 3
    got = {k: (round(r.speedup, 6), r.verdict.word, r.verdict.failing_metric)
           for k, r in rows.items() if k[0] == "fiddler.decode"}
    assert got == {("fiddler.decode", "layer_split"): (1.1, "within", None),
                   ("fiddler.decode", "lossless_fetch"): (1.6, "exceeds", None),
                   ("fiddler.decode", "best_caching"): (0.8, "refuted on decode time",
                                                        "decode time")}
    assert "fetch + host_compute_layers=4 11 ms / latency_aware 10 ms" in \
        rows[("fiddler.decode", "layer_split")].verdict.rule
    assert "0.945" in rows[("fiddler.decode", "layer_split")].verdict.rule  # the band
    # Prefill's band is 1.30x +-25% (0.975-1.625): the same x1.60 is within it.
    assert rows[("fiddler.prefill", "lossless_fetch")].verdict.word == "within"
    lonely = fiddler.fiddler_rows([dataclasses.replace(la, host="c"), *FIDDLER[1:]])
    split = next(r for r in lonely if r.baseline == "layer_split")
    assert split.speedup is None and split.verdict.word.startswith("not testable")
    assert split.verdict.rule == "no layer_split cell at this condition and host"


def test_the_bands_are_the_sources_number_plus_or_minus_a_quarter():
    decode, prefill = fiddler.fiddler_band("fiddler.decode"), fiddler.fiddler_band("fiddler.prefill")
    assert (decode.low, decode.high) == pytest.approx((1.26 * 0.75, 1.26 * 1.25))
    assert (prefill.low, prefill.high) == pytest.approx((1.30 * 0.75, 1.30 * 1.25))
    assert not decode.lower_is_better


@given(st.lists(st.floats(0.1, 100.0), min_size=1, max_size=6),
       st.sampled_from(("beats", "ties", "loses")), st.floats(0.01, 0.9))
def test_the_reference_is_the_fastest_caching_cell(caching, side, by):
    """Whatever the caching cells' times, the reference is the lowest, and a host cell's
    verdict says which side of it the host cell is on: the side is drawn, and the host cell's
    time put there (1-90% below or above the fastest caching cell's, or equal to it)."""
    cells = [_cell("fetch" if i % 2 else "fetch_priority", t, prefetch=f"p{i}")
             for i, t in enumerate(caching)]
    host_time = min(caching) * {"beats": 1 - by, "ties": 1.0, "loses": 1 + by}[side]
    cells.append(_cell("host_compute", host_time, host="a"))
    [(c, ref, speedup, v)] = hc.against_best(cells, "decode")
    assert ref.decode_ms == min(caching)
    assert speedup == pytest.approx(min(caching) / host_time)
    assert v == side
