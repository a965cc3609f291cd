"""SpecMD's claims table (moejax/analysis/claims.py) trace by trace, on tiny synthetic sweeps
whose numbers the tests choose: a claim is "reproduced" only where every trace reproduces it,
else "mixed" with its exceptions; a trace without a needed cell is listed as missing; a zero
by construction is labelled structural, any other zero is measured; every queue in the sweep
is reported; the CSV has a line per trace; the markdown carries its command line.

Cells are `sweep_fixtures.synthetic_results` with the counters a claim reads overwritten by the
test. Every expected number and string is written by hand."""

from __future__ import annotations

import copy
import csv
import io
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax.analysis import claims
from moejax.results import write_json_atomic
from tests.fuzzing import examples
from tests.sweep_fixtures import synthetic_results

SP80 = "score_percentile(p=80)"
WITH_SP80 = "with score_percentile(p=80) prefetch"
LEFT_FIRST_BUILT = ("every policy and option has a compiled form (eviction "
                    "least_stale(order='left_first', prefetch_current='pass'), prefetch none(), "
                    "miss fetch(), routing standard())")


def write_cell(root, trace, eviction, prefetch, *, folder="traces", queue="immediate",
               frac=0.05, built="", timing=None, policies=None, arguments=None,
               **total) -> None:
    """One finished cell of `trace` (in `/data/<folder>/`) with `total`'s counters; `built`:
    the replay's engine_reason; `policies`: the policies config group (a preset's cell);
    `arguments`: `cache.policies.arguments`, the policies' arguments as built."""
    r = synthetic_results(trace, frac, eviction, prefetch, seed=0)
    path = f"/data/{folder}/{trace}.npz"
    r["trace"]["path"] = r["config"]["trace"] = path
    r["config"]["cache"]["prefetch_queue"] = queue
    r["cache"]["total"].update(total)
    r["cache"]["timing"].update(timing or {})
    if policies is not None:
        r["config"]["policies"] = policies
        r["cache"]["policies"] = {**r["cache"]["policies"], **copy.deepcopy(policies)}
    if built:
        r["replay"] = {"engine": "compiled", "engine_reason": built}
    if arguments is not None:
        r["cache"]["policies"] = {**r["cache"]["policies"], "arguments": arguments}
    name = f"{folder}-{trace}-{eviction}-{prefetch}-{queue}-{frac}".replace("/", "_")
    write_json_atomic(os.path.join(root, "cells", name, "results.json"), r)


def run(root, **kw) -> list[claims.Finding]:
    return claims.findings(claims.load([str(root)]).rows, **kw)


def find(found, claim, measure="", queue="immediate", prefetch=WITH_SP80) -> claims.Finding:
    (f,) = [f for f in found if f.claim == claim and measure in f.measure and f.queue == queue
            and f.prefetch == prefetch]
    return f


def claim1_sweep(root, ls_lru: dict, queues=("immediate",)) -> None:
    """Least-Stale and LRU cells under score_percentile: trace -> (LS, LRU) collision-miss
    rates (None: no cell)."""
    for q in queues:
        for trace, (ls, lru) in ls_lru.items():
            for eviction, rate in (("least_stale", ls), ("lru", lru)):
                if rate is not None:
                    write_cell(root, trace, eviction, SP80, queue=q, collision_miss_rate=rate)


def test_a_claim_that_fails_on_one_trace_is_mixed_with_the_exception(tmp_path):
    claim1_sweep(tmp_path, {"t_a": (0.010, 0.050), "t_b": (0.015, 0.040),
                            "t_c": (0.050, 0.040)})
    f = find(run(tmp_path), 1)
    assert {t: r.suggestion for t, r in f.per_trace.items()} == {
        "t_a": "reproduced", "t_b": "reproduced", "t_c": "refuted"}
    assert f.suggestion == ("mixed: reproduced on 2 of 3 traces; exceptions: t_c (refuted, "
                            "LS 5.00% · LRU 4.00%)")
    # The group's means (LS 2.5%, LRU 4.33%) would suggest "partly": not the verdict.
    assert f.values["least_stale"] == pytest.approx(0.025)
    assert f.values["lru"] == pytest.approx(0.13 / 3)
    assert f.shown == "LS 2.50% · LRU 4.33%"
    assert f.per_trace["t_b"].shown == "LS 1.50% · LRU 4.00%"


def test_a_claim_that_holds_on_every_trace_is_reproduced(tmp_path):
    claim1_sweep(tmp_path, {"t_a": (0.010, 0.050), "t_b": (0.015, 0.040),
                            "t_c": (0.012, 0.040)})
    found = run(tmp_path)
    f = find(found, 1)
    assert f.suggestion == "reproduced" and f.traces == 3 and f.missing == {}
    assert f.values["least_stale"] == pytest.approx(0.037 / 3)
    # The same claim without prefetch is its own row; this sweep has no such cells.
    n = find(found, 1, prefetch="without prefetch")
    assert n.suggestion == "not in this sweep"
    assert n.shown == "not in this sweep (no least_stale(order=two_queue), lru cells)"


def test_a_trace_without_a_needed_cell_is_listed_as_missing(tmp_path):
    claim1_sweep(tmp_path, {"t_a": (0.010, 0.050), "t_b": (0.015, 0.040),
                            "t_c": (0.012, None)})
    found = run(tmp_path)
    f = find(found, 1)
    assert f.missing == {"t_c": "no lru cells"} and sorted(f.per_trace) == ["t_a", "t_b"]
    assert f.suggestion == "reproduced on 2 of 3 traces; missing: t_c"
    assert f.values["least_stale"] == pytest.approx(0.0125)  # the two complete traces
    out = claims.markdown(found, [], claims.load([str(tmp_path)]).rows)
    assert "|  |  |  | ↳ t_c |  | missing: no lru cells | missing |" in out
    assert "|  |  |  | ↳ t_a |  | LS 1.00% · LRU 5.00% | reproduced |" in out


def order_cells(root, trace, left_first_none: float, early_none: int = 0) -> None:
    """Claim 7's cells of one trace: the three readings with and without prefetch."""
    for eviction, prefetch, rate, early in (
            ("least_stale(order=left_first)", "none", left_first_none, early_none),
            ("least_stale(order=two_queue)", "none", 0.0, early_none),
            ("least_stale(order=cyclic)", "none", 0.002, early_none),
            ("least_stale(order=left_first)", SP80, 0.0, 3),
            ("least_stale(order=two_queue)", SP80, 0.01, 3),
            ("least_stale(order=cyclic)", SP80, 0.004, 3)):
        write_cell(root, trace, eviction, prefetch, collision_miss_rate=rate,
                   evicted_before_use=early, hit_rate=0.5, ready_hit_rate=0.3,
                   late_hit_rate=0.2)


def test_a_structural_zero_is_labelled_and_a_measured_zero_is_not(tmp_path):
    for trace in ("t_a", "t_b"):
        order_cells(tmp_path, trace, left_first_none=0.0)
    found = run(tmp_path)
    left = find(found, 7, "order=left_first", prefetch="without prefetch")
    assert left.suggestion == (
        "structural: collision misses 0 on every trace (left_first evicts an expert of a layer "
        "still to run only when every expert of the layers already run is pinned, and without "
        "prefetch none of them is; zero on every trace means no wave pinned the whole left "
        "side (decode-only traces never do))")
    assert {r.suggestion for r in left.per_trace.values()} == {"structural"}
    assert left.structural["evicted_before_use"] == (
        "early evictions 0 on every trace (nothing is prefetched, so no prefetched expert is "
        "evicted before its use)")
    # two_queue's zero without prefetch: STRUCTURAL gives no reason for it, so it is measured.
    two = find(found, 7, "order=two_queue", prefetch="without prefetch")
    assert list(two.structural) == ["evicted_before_use"] and two.suggestion == ""
    assert two.shown == "collisions 0.00% · hit 50.0% (30.0% + 20.0%) · early evictions 0"
    # left_first's zero with prefetch: the table's condition does not hold, so it is measured.
    assert find(found, 7, "order=left_first").structural == {}
    md = claims.markdown(found, [], [])
    assert "| structural: early evictions 0 on every trace (nothing is prefetched" in md


def test_a_zero_on_only_some_traces_is_measured(tmp_path):
    order_cells(tmp_path, "t_a", left_first_none=0.0)
    order_cells(tmp_path, "t_b", left_first_none=0.001, early_none=0)
    left = find(run(tmp_path), 7, "order=left_first", prefetch="without prefetch")
    assert "collision_miss_rate" not in left.structural and left.suggestion == ""
    assert left.per_trace["t_a"].values["collision_miss_rate"] == 0


def test_claims_1_2_on_a_left_first_only_sweep_are_structural_without_prefetch(tmp_path):
    """An older sweep: its bare least_stale ran left_first, and it has no other reading."""
    for trace in ("t_a", "t_b"):
        write_cell(tmp_path, trace, "least_stale", "none", built=LEFT_FIRST_BUILT,
                   collision_miss_rate=0.0)
        write_cell(tmp_path, trace, "lru", "none", collision_miss_rate=0.04)
    found = run(tmp_path)
    one = find(found, 1, prefetch="without prefetch")
    two = find(found, 2, "LRU ÷ LS order=left_first", prefetch="without prefetch")
    for f in (one, two):
        assert f.suggestion.startswith("structural: LS collision misses 0 on every trace "
                                       "(left_first evicts an expert of a layer still to run")
    assert two.shown == "∞ (LS has 0) (LRU 4.00% / LS 0.00%)"


def test_claim7_names_the_order_with_fewest_collisions_per_trace(tmp_path):
    order_cells(tmp_path, "t_a", left_first_none=0.001)
    order_cells(tmp_path, "t_b", left_first_none=0.003)
    found = run(tmp_path)
    fewest = find(found, 7, "fewest", prefetch="without prefetch")
    assert {t: r.suggestion for t, r in fewest.per_trace.items()} == {
        "t_a": "two_queue", "t_b": "two_queue"}
    # Without prefetch two_queue has 0 on both traces; with it, left_first has.
    assert fewest.per_trace["t_a"].shown == "two_queue 0.00% · left_first 0.10% · cyclic 0.20%"
    assert find(found, 7, "fewest").suggestion == "left_first"


def test_every_queue_in_the_sweep_is_reported_in_order(tmp_path, capsys):
    claim1_sweep(tmp_path, {"t_a": (0.010, 0.050)},
                 queues=("watchdog_idle", "watchdog", "immediate", "a_custom_queue"))
    found = run(tmp_path)
    assert [f.queue for f in found if f.claim == 1 and f.prefetch == WITH_SP80] == [
        "immediate", "watchdog", "a_custom_queue", "watchdog_idle"]
    assert find(found, 1, queue="watchdog_idle").suggestion == "reproduced"
    claims.main([f"--sweep_dir={tmp_path}", "--queue=watchdog_idle"])
    out = capsys.readouterr().out
    assert "| watchdog_idle queue · with score_percentile(p=80) prefetch · 5% · 5 GB/s |" in out
    assert "| immediate queue ·" not in out
    assert claims.main([f"--sweep_dir={tmp_path}", "--queue=watchdog_busy"]) == 2
    assert capsys.readouterr().err == (
        "python -m moejax.analysis.claims: error: --queue=watchdog_busy is not in the sweep; "
        "its queues: immediate, watchdog, a_custom_queue, watchdog_idle\n")


def test_csv_has_the_group_line_and_one_line_per_trace(tmp_path, capsys):
    claim1_sweep(tmp_path, {"t_a": (0.010, 0.050), "t_b": (0.050, 0.040),
                            "t_c": (0.012, None)})
    claims.main([f"--sweep_dir={tmp_path}", "--format=csv"])
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    got = [(r["level"], r["trace"], r["moejax"], r["suggestion"]) for r in rows
           if r["claim"] == "1" and r["prefetch"] == WITH_SP80]
    assert got == [
        ("group", "", "LS 3.00% · LRU 4.50%",
         "mixed: reproduced on 1 of 3 traces; exceptions: t_b (refuted, LS 5.00% · LRU 4.00%)"
         "; missing: t_c"),
        ("trace", "t_a", "LS 1.00% · LRU 5.00%", "reproduced"),
        ("trace", "t_b", "LS 5.00% · LRU 4.00%", "refuted"),
        ("trace", "t_c", "missing: no lru cells", "missing")]
    (group,) = [r for r in rows if r["claim"] == "1" and r["level"] == "group"
                and r["prefetch"] == WITH_SP80]
    assert (group["queue"], group["capacity"], group["h2d_gbps"], group["traces"]) == (
        "immediate", "5%", "5.0", "2")


def test_the_markdown_ends_with_its_command_line(tmp_path, capsys):
    claim1_sweep(tmp_path, {"t_a": (0.010, 0.050)})
    claims.main([f"--sweep_dir={tmp_path}", "--capacity=5%", "--h2d_gbps=5"])
    out = capsys.readouterr().out
    assert out.endswith(f"Produced by: `python -m moejax.analysis.claims --sweep_dir={tmp_path} "
                        "--capacity=5% --h2d_gbps=5`\n")


def test_verdicts_without_prefetch_are_rows_of_their_own(tmp_path):
    for trace in ("t_a", "t_b"):
        for eviction, prefetch, rate in (("fld", SP80, 0.04), ("lru", SP80, 0.05),
                                         ("fld", "none", 0.06), ("lru", "none", 0.05)):
            write_cell(tmp_path, trace, eviction, prefetch, collision_miss_rate=rate)
    found = run(tmp_path)
    assert find(found, 6).suggestion == "reproduced"
    assert find(found, 6, prefetch="without prefetch").suggestion == "refuted (FLD worse)"


def test_a_synthetic_group_says_so(tmp_path):
    write_cell(tmp_path, "prose", "least_stale", SP80, folder="families/mixtral",
               collision_miss_rate=0.01)
    write_cell(tmp_path, "prose", "lru", SP80, folder="families/mixtral",
               collision_miss_rate=0.05)
    loaded = claims.load([str(tmp_path)])
    found = claims.findings(loaded.rows)
    f = find(found, 1)
    assert f.group == "families · mixtral"
    assert f.suggestion == "reproduced (synthetic traces: random weights)"
    assert ("1 synthetic (random weights: architecture only) trace: prose; H2D 5 GB/s"
            in claims.markdown(found, loaded.summary, loaded.rows))


def test_hit_rates_per_trace_keep_ready_and_late_apart(tmp_path):
    for trace, (ready, late) in (("olmoe_a", (0.60, 0.30)), ("olmoe_b", (0.224, 0.259))):
        write_cell(tmp_path, trace, "least_stale", SP80, folder="captures",
                   hit_rate=ready + late, ready_hit_rate=ready, late_hit_rate=late)
    f = find(run(tmp_path), 3, "(ready + late)",
             prefetch="the best prefetch on each trace but the oracles")
    assert f.group == "captures · OLMoE-1B-7B"
    assert f.per_trace["olmoe_b"].shown == "48.3% (22.4% + 25.9%) (score_percentile(p=80))"
    assert f.suggestion == ("mixed: reproduced on 1 of 2 traces; exceptions: olmoe_b (refuted, "
                            "48.3% (22.4% + 25.9%) (score_percentile(p=80)))")


def test_a_bare_least_stale_reads_as_the_order_its_cell_records():
    spec = claims.least_stale_spec
    assert spec("least_stale") == "least_stale(order=two_queue)"
    assert spec("least_stale", LEFT_FIRST_BUILT) == "least_stale(order=left_first)"
    assert spec('least_stale(order="cyclic")', LEFT_FIRST_BUILT) == "least_stale(order=cyclic)"
    assert spec("least_stale(cyclic)") == "least_stale(order=cyclic)"
    assert spec("least_stale(prefetch_current=until_target)") == (
        "least_stale(order=two_queue,prefetch_current=until_target)")
    # A reason that names another policy only: the default.
    assert spec("least_stale", "prefetch oracle(lookahead=1) has no compiled form") == (
        "least_stale(order=two_queue)")
    assert spec("lru", LEFT_FIRST_BUILT) == "lru"


def test_claim7_reads_the_recorded_order_of_a_bare_least_stale(tmp_path):
    write_cell(tmp_path, "t_a", "least_stale", "none", built=LEFT_FIRST_BUILT,
               collision_miss_rate=0.007)
    write_cell(tmp_path, "t_a", "least_stale", SP80, collision_miss_rate=0.009)
    found = run(tmp_path)
    assert find(found, 7, "order=left_first", prefetch="without prefetch").values[
        "collision_miss_rate"] == 0.007
    assert find(found, 7, "order=two_queue").values["collision_miss_rate"] == 0.009


def test_the_recorded_arguments_say_what_a_bare_least_stale_ran(tmp_path):
    # results.json's `cache.policies.arguments` (every cell since issue 21) wins over the
    # engine's reason (older sweeps) and the default.
    cyclic = {"eviction": {"order": "cyclic", "prefetch_current": "pass"}}
    write_cell(tmp_path, "t_a", "least_stale", "none", built=LEFT_FIRST_BUILT,
               arguments=cyclic, collision_miss_rate=0.003)
    write_cell(tmp_path, "t_a", "least_stale", SP80, arguments={"eviction": {}},
               collision_miss_rate=0.009)  # no order recorded: the default
    found = run(tmp_path)
    assert find(found, 7, "order=cyclic", prefetch="without prefetch").values[
        "collision_miss_rate"] == 0.003
    assert find(found, 7, "order=two_queue").values["collision_miss_rate"] == 0.009


def dropin_cells(root, trace, cold, warm) -> None:
    """specmd_1 as it is and with Least-Stale: (base, drop-in) cold and warm TTFT."""
    for i, eviction in enumerate(("lru", "least_stale")):
        source = {"eviction": "preset" if i == 0 else "explicit", "prefetch": "preset",
                  "miss": "preset", "routing": "preset"}
        policies = {"preset": "specmd_1", "source": source}
        if i:
            policies["eviction"] = "least_stale"
        write_cell(root, trace, eviction, "topk(overfetch=1.0)", policies=policies,
                   timing={"cold_ttft_s": cold[i], "warm_ttft_s": warm[i]})


def test_an_unchanged_cold_ttft_is_structural_and_a_changed_one_is_not(tmp_path):
    for trace in ("t_a", "t_b"):
        dropin_cells(tmp_path / "same", trace, cold=(0.5, 0.5), warm=(1.0, 0.8))
    (f,) = [f for f in run(tmp_path / "same") if f.claim == 4]
    assert f.per_trace["t_a"].shown == "cold +0.0% · warm -20.0% · decode tok/s +0.0%"
    assert f.suggestion == "reproduced"  # warm -20% vs the paper's -10.7%
    assert f.structural == {"cold_pct": "cold ΔTTFT 0 on every trace (a first request's "
                                        "prefill finds an empty cache whatever the eviction)"}
    dropin_cells(tmp_path / "changed", "t_a", cold=(0.5, 0.5), warm=(1.0, 0.8))
    dropin_cells(tmp_path / "changed", "t_b", cold=(0.5, 0.4), warm=(1.0, 0.8))
    (f,) = [f for f in run(tmp_path / "changed") if f.claim == 4]
    assert f.structural == {} and f.values["cold_pct"] == pytest.approx(-10.0)


def test_bad_sweep_directories_are_one_line_errors(tmp_path, capsys):
    prog = "python -m moejax.analysis.claims: error: "
    assert claims.main([f"--sweep_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err.startswith(
        f"{prog}--sweep_dir={tmp_path}: not a sweep directory (it has no cells/ folder")
    os.makedirs(tmp_path / "cells" / "unfinished_cell")
    assert claims.main([f"--sweep_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err == (f"{prog}no finished cells to read ({tmp_path}: "
                                       "0 finished cells, 1 unfinished, 0 failed)\n")


SUGGESTIONS = ("reproduced", "partly", "refuted", "not in this sweep")


@settings(max_examples=examples(60))
@given(st.lists(st.sampled_from(SUGGESTIONS), min_size=1, max_size=5), st.booleans())
def test_the_group_gets_a_rule_word_only_where_every_trace_does(suggestions, synthetic):
    per = {f"t{i}": claims.TraceResult({}, f"n{i}", s) for i, s in enumerate(suggestions)}
    got = claims.across(per, [], synthetic)
    tested = [s for s in suggestions if s != "not in this sweep"]
    if not tested:
        assert got == "not in this sweep"
    elif len(set(suggestions)) == 1:
        assert got == suggestions[0] + (" (synthetic traces: random weights)" * synthetic)
    else:
        assert got not in SUGGESTIONS
        # The leading suggestion is a most common one; every trace that differs is named.
        lead = got.removeprefix("mixed: ").split(" on ")[0]
        assert tested.count(lead) == max(tested.count(s) for s in tested)
        assert got.startswith("mixed: ") == (len(set(tested)) > 1)
        for i, s in enumerate(suggestions):
            if s == "not in this sweep":
                assert f"t{i}" in got.split("missing: ")[1]
            elif s != lead:
                assert f"t{i} ({s}, n{i})" in got
