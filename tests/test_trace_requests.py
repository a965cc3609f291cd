"""Replaying a sequence as several requests (`replay.request_tokens`, `replay.prefill_tokens`):
cold and warm TTFT from a recorded trace, decode-only captures included."""

from __future__ import annotations

import numpy as np
import pytest

from moejax import bundled, jobs
from moejax.errors import ConfigError
from moejax.jobs.schema import base_config
from moejax.traces.format import load as load_trace
from moejax.traces.requests import as_requests

SCORED = f"{bundled.SCORED_TRACES_DIR}/prose_0.npz"  # a 64-token prefill, 191 decode steps


def _replay(tmp_path, trace: str, name: str, **cfg):
    c = base_config()
    c.job, c.replay.trace, c.model.preset, c.clock.kind = "replay", trace, "", "virtual"
    c.log.progress = c.log.tensorboard = False
    c.cache.slots = 16
    for k, v in cfg.items():
        section, _, field = k.rpartition(".")
        setattr(c.get(section) if section else c, field, v)
    return jobs.run(c, str(tmp_path / name))


def test_cut_regroups_the_rows_and_keeps_them():
    t = load_trace(SCORED)
    assert t.prefill_passes == 1 and int(np.diff(t.pass_offsets)[0]) == 64
    assert as_requests(t, 0, 0) == [t]
    parts = as_requests(t, 100, 10)
    assert [int(p.pass_offsets[-1]) for p in parts] == [100, 100, 55]  # the rest is kept
    for p in parts:
        assert p.prefill_passes == 1 and int(np.diff(p.pass_offsets)[0]) == 10
        assert np.all(np.diff(p.pass_offsets)[1:] == 1)
        p.validate()
    for field in ("ids", "weights", "probs", "spec", "tokens"):
        np.testing.assert_array_equal(np.concatenate([getattr(p, field) for p in parts]),
                                      getattr(t, field))
    assert [p.meta["info"]["request"]["first_row"] for p in parts] == [0, 100, 200]


def test_recutting_to_the_recorded_passes_replays_identically(tmp_path):
    # The trace's own prefill is 64 rows: one request with a 64-row prefill is the trace.
    as_recorded = _replay(tmp_path, SCORED, "a")
    recut = _replay(tmp_path, SCORED, "b",
                    **{"replay.request_tokens": 0, "replay.prefill_tokens": 64})
    assert recut["cache"]["total"] == as_recorded["cache"]["total"]
    assert recut["cache"]["timing"] == as_recorded["cache"]["timing"]


def test_several_requests_report_cold_and_warm_ttft(tmp_path):
    r = _replay(tmp_path, SCORED, "r", **{"replay.request_tokens": 64, "replay.prefill_tokens": 16})
    tm = r["cache"]["timing"]
    assert r["trace"]["requests"] == 4 and len(tm["ttft_per_request_s"]) == 4
    assert tm["cold_ttft_s"] == tm["ttft_s"] == tm["ttft_per_request_s"][0]
    assert tm["warm_ttft_s"] == pytest.approx(np.mean(tm["ttft_per_request_s"][1:]))
    # The later requests find experts the earlier ones left: fewer misses per prefill.
    assert tm["warm_ttft_s"] < tm["cold_ttft_s"]


def test_a_decode_only_capture_gets_a_ttft(tmp_path):
    kw = {"model.family": "olmoe", "model.preset": "olmoe-1b-7b", "cache.slots": 64,
          "policies.eviction": "lru", "policies.prefetch": "none"}
    plain = _replay(tmp_path, bundled.capture_path("olmoe_code"), "p", **kw)
    assert plain["cache"]["timing"]["ttft_s"] is None
    cut = _replay(tmp_path, bundled.capture_path("olmoe_code"), "c", **kw,
                  **{"replay.request_tokens": 128, "replay.prefill_tokens": 32})
    assert cut["trace"]["requests"] == 4 and cut["cache"]["timing"]["warm_ttft_s"] > 0
    # Regrouping changes no routing: every token's requests are still there.
    assert cut["cache"]["total"]["requests"] <= plain["cache"]["total"]["requests"]
    assert cut["cache"]["total"]["products"] == plain["cache"]["total"]["products"]


@pytest.mark.parametrize("request_tokens, prefill_tokens, match", [
    (-1, 0, ">= 0"),
    (64, 0, "needs replay.prefill_tokens >= 1"),
    (64, 64, "must be below replay.request_tokens=64"),
    (0, 255, "not below the 255 token rows"),
])
def test_bad_cuts_are_clear_errors(request_tokens, prefill_tokens, match):
    with pytest.raises(ConfigError, match=match):
        as_requests(load_trace(SCORED), request_tokens, prefill_tokens, SCORED)


def test_a_batched_trace_cannot_be_recut():
    t = load_trace(SCORED)
    offsets = np.r_[0, np.arange(64, 255, 2), 255].astype(np.int64)  # 2-row decode passes
    batched = type(t)(t.meta, offsets, t.tokens, t.ids, t.weights, t.probs, t.spec)
    with pytest.raises(ConfigError, match="batch > 1"):
        as_requests(batched, 128, 16, "batched.npz")
