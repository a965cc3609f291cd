"""configs/grid_host.py and its tables (moejax/analysis/host_compute.py): the grid's cells are
its axes and every one is a valid config, a few cells run end to end into the tables, and the
verdicts (best caching configuration, latency_aware's exceptions, Fiddler's claims) on
hand-made cells with their answers worked by hand."""

from __future__ import annotations

import collections
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launch import cells as cells_lib
from moejax import jobs
from moejax.analysis import host_compute as hc
from moejax.analysis.host_compute import Cell
from tests.sweep_fixtures import grid_config

GRID = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "grid_host.py")


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
    # prefetches + 2 host policies x 3 hosts).
    assert len(cells) == 10 * 3 * 3 * (2 * 2 + 2 * 3) == 900
    assert len(cells_lib.collect(grid.sweep, "traces=captures")) == 4 * 90
    assert len(cells_lib.collect(grid.sweep, "traces=embedded")) == 6 * 90
    assert {c["cache.capacity_frac"] for c in cells} == {0.01, 0.05, 0.25}
    assert {c["hardware.h2d_gbps"] for c in cells} == {5.0, 16.0, 32.0}
    assert collections.Counter(c["policies.miss"] for c in cells) == {
        "fetch": 180, "fetch_priority": 180, "host_compute": 270, "latency_aware": 270}
    for c in cells:
        host_policy = c["policies.miss"] in ("host_compute", "latency_aware")
        # The caching cells move weights: the host does not enter, they run once.
        assert ("host.preset" in c) == host_policy, c
        if host_policy:
            assert c["policies.prefetch"] == "none"
            assert c["host.preset"] in ("desktop_ddr5", "server_ddr5", "this_vm")
        capture = c["trace"].endswith(".jsonl")
        assert c["policies.prefetch"] in (
            "none", "temporal" if capture else "score_percentile(p=80)")
        if capture:  # id-only: the model named, cut into requests with a prefill
            assert c["model.family"] in ("olmoe", "qwen2_moe")
            assert c["trace_request_tokens"] == 128 and c["trace_prefill_tokens"] == 32
        _config(c)
    c = _config({})
    assert (c.cache.capacity_of, c.cache.precision, c.policies.eviction) == (
        "model", "int4", "least_stale")
    cpu = cells_lib.collect(grid.sweep, "traces=captures,this_machine=cpu")
    assert {c.get("host.preset") for c in cpu} == {None, "desktop_ddr5", "server_ddr5", "cpu"}
    with pytest.raises(ValueError, match="traces='long'"):
        cells_lib.collect(grid.sweep, "traces=long")


def test_cells_run_into_the_tables(tmp_path, capsys):
    cells = cells_lib.collect(_module().sweep, "traces=embedded")
    wanted = [c for c in cells if c["trace"].endswith("prose_0.npz")
              and c["cache.capacity_frac"] == 0.05 and c["hardware.h2d_gbps"] == 16.0
              and c.get("host.preset", "desktop_ddr5") == "desktop_ddr5"
              and c["policies.miss"] != "fetch_priority"]
    assert len(wanted) == 4  # fetch, fetch + SP, host_compute, latency_aware
    for i, c in enumerate(wanted):
        results = jobs.run(_config(c), str(tmp_path / "cells" / f"cell{i}"))
        if c["policies.miss"] == "host_compute":
            assert results["cache"]["total"]["host_computed"] > 0
    assert hc.main(["--sweep_dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for heading in ("### prose_0: decode ms/token", "### prose_0: TTFT ms",
                    "## latency_aware against the better of fetch and host_compute",
                    "## Fiddler's claims, in our model", "| prose_0 | desktop_ddr5 |",
                    "| desktop_ddr5 | 60 | 2.3 | 16 | 20 |"):  # the preset's, as it ran
        assert heading in out, heading
    assert "| 5% / 16 GB/s |" in out  # the capacity as configured, of the model
    assert "of 1 conditions" in out  # one latency_aware cell against fetch and host_compute


def test_a_sweep_without_host_compute_is_named(tmp_path, capsys):
    (tmp_path / "cells").mkdir()
    assert hc.main(["--sweep_dir", str(tmp_path)]) == 2
    assert "none of its 0 finished cells computed on the host" in capsys.readouterr().err


def _cell(miss, decode, ttft=None, prefetch="none", host=None, capacity=0.05, gbps=5.0,
          trace="t"):
    return Cell(trace, capacity, gbps, miss, prefetch, host, decode,
                decode if ttft is None else ttft)


# One condition worked by hand. Caching: fetch 10 ms, fetch + temporal 8, fetch_priority 9
# -> the best is fetch + temporal, 8 ms. TTFT: fetch 50, fetch + temporal 60, priority 55 ->
# the best is fetch, 50 ms.
HAND = [_cell("fetch", 10.0, 50.0), _cell("fetch", 8.0, 60.0, prefetch="temporal"),
        _cell("fetch_priority", 9.0, 55.0),
        _cell("host_compute", 4.0, 100.0, host="a"), _cell("latency_aware", 5.0, 40.0, host="a"),
        _cell("host_compute", 12.0, 50.0, host="b"), _cell("latency_aware", 10.0, 50.0, host="b")]


def test_the_best_caching_configuration_by_hand():
    assert hc.best_caching(HAND, ("t", 0.05, 5.0), "decode").label == "fetch + temporal"
    assert hc.best_caching(HAND, ("t", 0.05, 5.0), "ttft").label == "fetch"
    assert hc.best_caching(HAND, ("t", 0.25, 5.0), "decode") is None
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


def test_fiddler_verdict_by_hand():
    claim = 1.26
    assert hc.fiddler_verdict([1.3, 1.3, 1.0], claim) == \
        "reproduced (2 of 3 conditions reach 1.26x)"  # median 1.3
    assert hc.fiddler_verdict([1.26], claim).startswith("reproduced")  # reaching it counts
    assert hc.fiddler_verdict([1.3, 1.0, 1.1], claim) == \
        "partly (1 of 3 conditions reach 1.26x)"  # median 1.1
    assert hc.fiddler_verdict([1.1, 1.2], claim) == \
        "not reproduced (faster, short of the claim)"
    assert hc.fiddler_verdict([0.5, 1.0], claim) == "not reproduced (slower)"
    assert hc.fiddler_verdict([0.5, 1.1], claim) == \
        "not reproduced (faster in 1 of 2 conditions)"
    assert hc.fiddler_verdict([], claim) == "no cells"


@given(st.lists(st.floats(0.1, 100.0), min_size=1, max_size=6), st.floats(0.1, 100.0))
def test_the_reference_is_the_fastest_caching_cell(caching, host_time):
    """Whatever the caching cells' times, the reference is the lowest, and a host cell's
    verdict says which side of it the host cell is on."""
    cells = [_cell("fetch" if i % 2 else "fetch_priority", t, prefetch=f"p{i}")
             for i, t in enumerate(caching)]
    cells.append(_cell("host_compute", host_time, host="a"))
    [(c, ref, speedup, v)] = hc.against_best(cells, "decode")
    assert ref.decode_ms == min(caching)
    assert speedup == pytest.approx(min(caching) / host_time)
    if host_time < min(caching) * (1 - 1e-6):
        assert v == "beats"
    elif host_time > min(caching) * (1 + 1e-6):
        assert v == "loses"
