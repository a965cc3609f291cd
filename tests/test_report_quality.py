"""The quality–speed frontier in the sweep report: rows of quality cells (the quality job's
results.json, built here by `quality_results` after its schema), report.md's frontier
section, the figure, cells.csv; and a replay-only sweep without any of them."""

from __future__ import annotations

import csv
import os

import matplotlib.image
import numpy as np
import pytest

from moejax.analysis import report, sweep_cells
from moejax.cache.metrics import CacheMetrics, PassTiming, WaveOutcome
from moejax.results import write_json_atomic
from tests.sweep_fixtures import assert_png, synthetic_results, synthetic_sweep

LAYERS = 4
QUALITY_SECTION = "## Quality–speed frontier"


def _cache_section(capacity: float, miss: str, routing: str, precision: str, pools: tuple,
                   seed: int) -> dict:
    """A cache section as every job writes it, counters through CacheMetrics; its timing is
    the whole run's (scoring included), which a quality row must not take."""
    rng = np.random.default_rng(seed)
    m = CacheMetrics(list(range(LAYERS)))
    for pos in range(LAYERS):
        hits = int(rng.integers(50, 150))
        misses = 200 - hits
        m.count_wave(pos, 200, WaveOutcome(hits=hits, late_hits=0, misses=misses,
                                           collisions=misses // 2, prefetch_used=0,
                                           stall=1e-3), had_prediction=False, expert_bytes=1000)
    m.passes = [PassTiming("prefill", 32, 0.0, 0.5, 0.4), PassTiming("decode", 1, 0.5, 0.9, 0.3)]
    policies = {"eviction": "least_stale", "prefetch": "score_percentile(p=80)", "miss": miss,
                "routing": routing, "preset": "",
                "source": {"eviction": "default", "prefetch": "default", "miss": "explicit",
                           "routing": "explicit"}}
    return {"slots": 14, "capacity_frac": capacity * 1.1, "precision": precision,
            "capacity_of": "model", "pools": {p: {"slots": 4, "expert_bytes": 1000, "share":
                                                  1 / len(pools)} for p in pools},
            "clock": "virtual", "hardware": {"name": "a100_specmd", "h2d_gbps": 5.0},
            "policies": policies, **m.to_dict()}


def quality_results(model: str = "embedded", capacity: float = 0.05, miss: str = "fetch",
                    routing: str = "standard", precision: str = "", *, kl_mean: float = 0.0,
                    top1: float = 1.0, bpb_delta: float = 0.0, identical: float = 1.0,
                    decode_tok_per_s: float = 100.0, ttft_s: float = 0.004,
                    seed: int = 0) -> dict:
    """A quality job's results.json (moejax/jobs/quality.py's schema). `model`: "embedded" or
    a family (its tiny preset); `precision` "" is the miss policy's own (native for fetch,
    int8:int4:int2 pools for fetch_priority)."""
    pools = {"fetch_priority": ("int8", "int4", "int2"),
             "fetch_lowest_bit": ("int8", "int4")}.get(miss, (precision or "native",))
    plain = pools[0]
    if model == "embedded":
        source, family, model_cfg = "/somewhere/moejax/assets/small_moe", "olmoe", {
            "checkpoint": "", "preset": "embedded", "family": "olmoe"}
    else:
        source, family, model_cfg = f"preset:{model}/tiny", model, {
            "checkpoint": "", "preset": "tiny", "family": model}
    reference_bpb = 2.5
    prompts, new = 3, 32
    divergence = [new if identical == 1.0 else 7] * prompts
    config = {"job": "quality", "model": model_cfg, "text_file": "/x/heldout/prose.txt",
              "cache": {"capacity_frac": capacity, "capacity_of": "model", "slots": 0,
                        "min_slots": 4, "precision": precision, "prefetch_queue": "immediate"},
              "hardware": {"preset": "a100_specmd", "h2d_gbps": None},
              "policies": {"eviction": "", "prefetch": "", "miss": miss, "routing": routing,
                           "preset": ""},
              "quality": {"teacher_forcing": "decode", "max_tokens": 256}}
    return {
        "job": "quality",
        "model": {"source": source, "family": family, "precision": plain},
        "text_file": "/x/heldout/prose.txt",
        "quality": {"tokens": 255, "bytes": 255, "teacher_forcing": "decode",
                    "kl_mean": kl_mean, "kl_p50": kl_mean / 2, "kl_p99": kl_mean * 5,
                    "kl_max": kl_mean * 10, "top1_agreement": top1,
                    "bits_per_byte": reference_bpb + bpb_delta,
                    "reference_bits_per_byte": reference_bpb, "bits_per_byte_delta": bpb_delta,
                    "drift": {"prompts": prompts, "prompt_tokens": 32, "new_tokens": new,
                              "identical_share": identical,
                              "mean_tokens_to_divergence": float(np.mean(divergence)),
                              "tokens_to_divergence": divergence}},
        "speed": {"ttft_s": ttft_s, "cold_ttft_s": ttft_s, "warm_ttft_s": ttft_s / 2,
                  "decode_tok_per_s": decode_tok_per_s, "stall_s": 0.0123},
        "cache": _cache_section(capacity, miss, routing, plain, pools, seed),
        "config": config,
    }


# name -> (overrides of quality_results, on the frontier of its model and capacity)
CELLS = {
    "emb5_fetch": (dict(decode_tok_per_s=100.0), True),
    "emb5_int8": (dict(precision="int8", kl_mean=0.002, top1=0.99, decode_tok_per_s=145.0),
                  True),
    "emb5_int4": (dict(precision="int4", kl_mean=0.02, top1=0.95, decode_tok_per_s=160.0),
                  False),  # fetch_priority is faster with less KL
    "emb5_int2": (dict(precision="int2", kl_mean=0.5, top1=0.6, bpb_delta=0.4,
                       identical=0.0, decode_tok_per_s=170.0), False),
    "emb5_prio": (dict(miss="fetch_priority", kl_mean=0.01, top1=0.97, bpb_delta=0.01,
                       identical=0.0, decode_tok_per_s=180.0), True),
    "emb5_drop": (dict(miss="drop(keep=1)", kl_mean=0.3, top1=0.8, bpb_delta=0.2,
                       identical=0.0, decode_tok_per_s=150.0), False),
    "emb5_subst": (dict(miss="substitute(tol=0.05)", kl_mean=0.2, top1=0.85,
                        decode_tok_per_s=105.0), False),
    "emb5_ca": (dict(routing="cache_aware(lam=0.3)", kl_mean=0.001, decode_tok_per_s=140.0),
                True),
    "emb25_fetch": (dict(capacity=0.25, decode_tok_per_s=300.0), True),
    "emb25_drop": (dict(capacity=0.25, miss="drop(keep=1)", kl_mean=0.1,
                        decode_tok_per_s=310.0), True),
    "mx5_fetch": (dict(model="mixtral", decode_tok_per_s=50.0), True),
    "mx5_ca": (dict(model="mixtral", routing="cache_aware(lam=1.0)", kl_mean=0.5,
                    decode_tok_per_s=45.0), False),
}


def _write(root, names=None) -> dict:
    out = {}
    for i, (name, (kw, _)) in enumerate(CELLS.items()):
        if names is None or name in names:
            out[name] = quality_results(seed=i, **kw)
            write_json_atomic(os.path.join(str(root), "cells", name, "results.json"),
                              out[name])
    return out


def _table_rows(text: str, heading: str) -> list[list[str]]:
    block = text.split(heading + "\n", 1)[1].split("\n### ", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()
            if line.startswith("| ") and not line.startswith(("| configuration", "| ---"))]


def test_quality_rows(tmp_path):
    results = _write(tmp_path)
    rows = {r["name"]: r for r in sweep_cells.load_cells(str(tmp_path))}
    r = rows["emb5_prio"]
    assert r["model"] == "embedded" and r["precision"] == "int8"
    assert r["pools"] == "int8:int4:int2"
    assert r["trace"] == "embedded · prose"
    assert (r["kl_mean"], r["kl_p99"], r["top1_agreement"]) == (0.01, 0.05, 0.97)
    assert r["bits_per_byte_delta"] == 0.01 and r["reference_bits_per_byte"] == 2.5
    assert r["bits_per_byte"] == pytest.approx(2.51)
    assert r["drift_identical_share"] == 0.0 and r["drift_mean_tokens_to_divergence"] == 7.0
    # Speed: the served drift requests', not the cache's whole run.
    assert results["emb5_prio"]["cache"]["timing"]["decode_tok_per_s"] != 180.0
    assert (r["decode_tok_per_s"], r["ttft_s"], r["warm_ttft_s"], r["stall_s"]) == (
        180.0, 0.004, 0.002, 0.0123)
    assert rows["mx5_fetch"]["model"] == "mixtral/tiny"
    assert rows["mx5_fetch"]["trace"] == "mixtral/tiny · prose"
    # A checkpoint elsewhere: its directory's name.
    ck = quality_results()
    ck["model"]["source"] = "/ckpts/olmoe-1b-7b-converted/"
    ck["config"]["model"]["checkpoint"] = "/ckpts/olmoe-1b-7b-converted/"
    assert sweep_cells.cell_row("ck", ck)["model"] == "olmoe-1b-7b-converted"
    # Rows of other jobs: no quality numbers.
    replay = sweep_cells.cell_row("r", synthetic_results("prose_0", 0.05, "lru", "none", 0))
    for key in (*sweep_cells.QUALITY, "model"):
        assert replay[key] is None, key


def test_frontier_section_and_figure(tmp_path):
    _write(tmp_path)
    text = open(report.write_report(str(tmp_path))).read()
    assert text.count(QUALITY_SECTION) == 1
    assert f"- `{report.QUALITY_FIGURE}`" in text
    headings = [line for line in text.splitlines() if line.startswith("### ")
                and "capacity" in line and "—" in line]
    assert headings == ["### embedded — capacity 5% of the model",
                        "### embedded — capacity 25% of the model",
                        "### mixtral/tiny — capacity 5% of the model"]
    section = text.split(QUALITY_SECTION, 1)[1]
    assert ("| configuration | KL mean | top-1 agreement | bpb Δ | drift identical | "
            "decode tok/s | TTFT | vs baseline: ΔKL / speed | frontier |") in section
    emb5 = _table_rows(section, "### embedded — capacity 5% of the model")
    labels = [r[0] for r in emb5]
    assert labels == ["fetch_priority [int8:int4:int2]", "fetch @int2", "fetch @int4",
                      "drop(keep=1)", "fetch @int8", "fetch · cache_aware(lam=0.3)",
                      "substitute(tol=0.05)", "fetch"]  # fastest first
    marks = {r[0]: r[-1] == report.FRONT_MARK for r in emb5}
    want = {n: on for n, (kw, on) in CELLS.items() if n.startswith("emb5")}
    assert sorted(marks.values()) == sorted(want.values())
    assert [label for label, on in marks.items() if on] == [
        "fetch_priority [int8:int4:int2]", "fetch @int8", "fetch · cache_aware(lam=0.3)",
        "fetch"]
    by = {r[0]: r for r in emb5}
    assert by["fetch"][1:8] == ["0 (exact)", "100.0%", "+0.0000", "100.0%", "100", "4.00 ms",
                                "baseline"]
    assert by["drop(keep=1)"][1:5] == ["0.3000", "80.0%", "+0.2000", "0.0%"]
    assert by["drop(keep=1)"][7] == "+0.3000 / 1.50×"
    assert by["fetch · cache_aware(lam=0.3)"][7] == "+0.0010 / 1.40×"
    # The cascade compares with plain fetch at its first pool's precision (int8); plain fetch
    # at any precision with native.
    assert by["fetch_priority [int8:int4:int2]"][7] == "+0.0080 / 1.24×"
    assert by["fetch @int2"][7] == "+0.5000 / 1.70×"
    assert [r[7] for r in emb5].count("baseline") == 1
    assert ("On the frontier (slowest first): fetch (100 tok/s, kl_mean 0 (exact)); "
            "fetch · cache_aware(lam=0.3) (140 tok/s") in section
    mx = _table_rows(section, "### mixtral/tiny — capacity 5% of the model")
    assert [(r[0], r[-1]) for r in mx] == [("fetch", report.FRONT_MARK),
                                           ("fetch · cache_aware(lam=1.0)", "")]

    path = os.path.join(str(tmp_path), report.QUALITY_FIGURE)
    assert_png(path)
    img = matplotlib.image.imread(path)
    assert img.shape[0] > img.shape[1] / 2  # two model rows of panels
    with open(os.path.join(str(tmp_path), "cells.csv")) as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(CELLS)
    prio = next(r for r in table if r["name"] == "emb5_prio")
    assert (prio["model"], prio["precision"], prio["kl_mean"], prio["decode_tok_per_s"]) == (
        "embedded", "int8", "0.01", "180.0")
    for fig in report.FIGURES:  # the other figures still draw
        assert_png(os.path.join(str(tmp_path), fig))


def test_all_exact_cells_still_show(tmp_path):
    """KL 0 everywhere (exact configurations): the figure has no positive KL to scale by and
    still draws; every equal point is on the frontier."""
    for i, speed in enumerate((10.0, 10.0)):
        write_json_atomic(str(tmp_path / "cells" / f"c{i}" / "results.json"),
                          quality_results(seed=i, decode_tok_per_s=speed,
                                          routing="standard" if i == 0 else
                                          "cache_aware(lam=0.1)"))
    text = open(report.write_report(str(tmp_path))).read()
    rows = _table_rows(text, "### embedded — capacity 5% of the model")
    assert [r[-1] for r in rows] == [report.FRONT_MARK] * 2
    assert_png(os.path.join(str(tmp_path), report.QUALITY_FIGURE))


def test_replay_only_sweep_has_no_quality_section(tmp_path):
    synthetic_sweep(str(tmp_path))
    stale = os.path.join(str(tmp_path), report.QUALITY_FIGURE)
    with open(stale, "wb") as f:  # an earlier report's
        f.write(b"old")
    text = open(report.write_report(str(tmp_path))).read()
    assert "Quality" not in text and report.QUALITY_FIGURE not in text
    assert not os.path.exists(stale)
    with open(os.path.join(str(tmp_path), "cells.csv")) as f:
        header = f.readline().strip().split(",")
    assert header == [*report.CSV_COLUMNS, "layer_collision_miss_rate"]


def test_mixed_sweep(tmp_path):
    """Quality cells beside replay cells: both reported, the frontier only of the first."""
    synthetic_sweep(str(tmp_path), traces=("prose_0",), capacities=(0.05,), bad_cells=False)
    _write(tmp_path, names=("emb5_fetch", "emb5_drop"))
    text = open(report.write_report(str(tmp_path))).read()
    assert "### prose_0" in text and QUALITY_SECTION in text
    rows = _table_rows(text.split(QUALITY_SECTION, 1)[1],
                       "### embedded — capacity 5% of the model")
    assert [r[0] for r in rows] == ["drop(keep=1)", "fetch"]
