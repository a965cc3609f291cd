"""Both clocks of a live run (moejax/jobs/clocks.py): results.json's `clocks` section. The wall
figures are the job's own timings; the virtual ones are the cache's clock when it ran on the
virtual clock, else the replay of the run's recorded routing — which must be exactly what the
virtual clock gives the same run live (routing does not depend on the clock), on a plain run,
several requests, every expert resident, and a trace-driven run."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from moejax.calibration.cells import LiveRuns
from moejax.jobs import clocks
from moejax.jobs.cache_report import settle
from moejax.jobs.common import cache_of, configured_decoder
from moejax.jobs.schema import base_config
from moejax.jobs.specs import resolve
from moejax.model_source import load_model_for

# Every run here has the default prompt's length and 6 tokens: the steps compiled once serve all.
PROMPT = np.frombuffer(b"The Python interpreter", np.uint8).astype(np.int32)[None]
MAX_LEN = PROMPT.shape[1] + 6
TIMING = ("ttft_s", "ttft_per_request_s", "cold_ttft_s", "warm_ttft_s", "decode_s",
          "decode_tokens", "decode_tok_per_s")


def _config(**fields):
    """OLMoE's tiny preset (random weights: 4 MoE layers x 16 experts, top-4), a few tokens,
    no warm-up (no timing is asserted), then `fields` ("group.field": value)."""
    c = base_config()
    c.model.family, c.model.preset = "olmoe", "tiny"
    c.run.max_new_tokens, c.run.warmup, c.run.stop_at_eos = 6, False, False
    c.log.progress = c.log.tensorboard = False
    c.hardware.preset = "cpu"
    c.cache.capacity_frac = 0.25
    for key, value in fields.items():
        group, name = key.split(".")
        c[group][name] = value
    return c


def _run(config, loaded=None, speculation=None):
    loaded = loaded or load_model_for(resolve(config))
    out = LiveRuns(config, loaded).run()
    if speculation is not None:
        speculation.update(out["speculation"])
    return out["clocks"]


@dataclasses.dataclass
class _Generation:  # what `wall_figures` reads of a `models.stepped.Generation`
    prefill_s: float
    decode_s: float
    generated_ids: list


def test_wall_figures_are_the_requests_own_timings():
    gens = [_Generation(0.25, 2.0, [[1, 2, 3, 4, 5]]), _Generation(0.5, 1.0, [[7, 8]]),
            _Generation(0.75, 0.0, [[9]])]
    wall = clocks.wall_figures(gens, warmup=True)
    # TTFT: the first request's; warm: the mean of the others ((0.5 + 0.75) / 2).
    assert (wall["ttft_s"], wall["cold_ttft_s"], wall["warm_ttft_s"]) == (0.25, 0.25, 0.625)
    assert wall["ttft_per_request_s"] == [0.25, 0.5, 0.75]
    # Decode: 4 + 1 + 0 tokens after the first of each, over 3 s.
    assert (wall["decode_tokens"], wall["decode_s"]) == (5, 3.0)
    assert wall["decode_tok_per_s"] == pytest.approx(5 / 3)
    assert "wall clock" in wall["what"] and "compiles excluded" in wall["what"]
    one = clocks.wall_figures([_Generation(0.1, 0.0, [[1]])], warmup=False)
    assert one["warm_ttft_s"] is None and one["decode_tok_per_s"] is None
    assert "compiles included" in one["what"]


def test_a_wall_clock_run_reports_the_virtual_clock_of_the_same_run():
    config = _config(**{"clock.kind": "virtual"})
    loaded = load_model_for(resolve(config))
    virtual_run = _run(config, loaded)
    assert virtual_run["virtual"]["source"] == "cache clock"
    speculation = {}
    wall_run = _run(_config(**{"clock.kind": "wall"}), loaded, speculation)
    # Speculative passes ran, and re-ran layers (the recorder saw their gates twice).
    assert speculation["speculative_passes"] > 0 and speculation["failed_checks"] > 0
    got = wall_run["virtual"]
    assert got["source"] == "replay" and got["replay_counters_equal_live"] is True
    assert got["hardware"] == "cpu" and "replayed on the virtual clock" in got["what"]
    # The replay of the wall run's routing is the virtual clock's run, figure for figure.
    assert {k: got[k] for k in TIMING} == {k: virtual_run["virtual"][k] for k in TIMING}
    assert got["decode_tokens"] == wall_run["wall"]["decode_tokens"] == 5
    assert got["ttft_s"] > 0 and got["decode_s"] > 0


def test_the_recorded_routing_replays_to_the_cache_clock_exactly():
    """On the virtual clock the cache's own figures are reported; the recorder attached all
    the same gives traces whose replay reproduces them (and the counters) exactly. (Steps
    read slots only, so that misses fail checks and layers run again.)"""
    config = _config(**{"clock.kind": "virtual", "cache.speculate_from_host": False})
    run = resolve(config)
    loaded = load_model_for(run)
    experts, decoder = configured_decoder(run, loaded, max_len=MAX_LEN)
    cache = cache_of(experts)
    assert clocks.routing_recorder(run, loaded, decoder, experts, cache) is None
    routing = clocks.RunRouting(loaded.cfg, config.model.lookahead, loaded.source)
    routing.attach(decoder, experts)
    for _ in range(2):
        decoder.generate(PROMPT, 6)
    # Speculative passes ran beside the recorder, and re-ran layers (their gates seen twice).
    assert experts.speculative_passes > 0 and experts.speculation_misses > 0
    assert routing.requests == 2
    traces = routing.traces()
    assert [t.prefill_passes for t in traces] == [1, 1]
    assert [t.num_passes for t in traces] == [6, 6]
    replayed = clocks.replay_run(clocks.virtual_run(run), loaded.cfg,
                                 loaded.precision_bytes(), traces,
                                 clocks.replay_specs(run, None))
    live = settle(cache_of(experts))
    live.finish()
    assert replayed.metrics.timing() == live.metrics.timing()
    assert replayed.metrics.totals() == live.metrics.totals()


def test_several_requests_report_each_clocks_cold_and_warm_ttft():
    # (two prompts of the default's length: the steps compiled for it serve them)
    got = _run(_config(**{"clock.kind": "wall",
                          "run.prompts": ("The Python interpreter", "def main(): return 42")}))
    for clock in ("wall", "virtual"):
        figures = got[clock]
        assert len(figures["ttft_per_request_s"]) == 2, clock
        assert figures["warm_ttft_s"] == figures["ttft_per_request_s"][1] > 0, clock
        assert figures["decode_tokens"] == 10, clock


def test_no_cache_is_timed_as_every_expert_resident_compute_only():
    config = _config(**{"cache.enabled": False, "clock.kind": "wall"})
    loaded = load_model_for(resolve(config))
    got = _run(config, loaded)["virtual"]
    assert got["source"] == "replay" and got["replay_counters_equal_live"] is None
    assert "every expert resident" in got["what"] and "cache.enabled=False" in got["what"]
    # The same: a cache of every expert, placed before the first token, on the virtual clock.
    resident = _run(_config(**{"clock.kind": "virtual", "cache.capacity_frac": 1.0,
                               "cache.warm_start": "all", "policies.prefetch": "none"}), loaded)
    assert {k: got[k] for k in TIMING} == {k: resident["virtual"][k] for k in TIMING}


def test_a_batch_above_one_says_why_it_has_no_virtual_figures():
    class Recorded:  # a run's routing, one request recorded (batch row 0)
        requests = 1

    got = clocks.virtual_figures(resolve(_config(**{"clock.kind": "wall",
                                                    "run.batch_size": 2})), None, None, Recorded())
    assert all(got[k] is None for k in TIMING)
    assert "run.batch_size=2" in got["what"] and got["hardware"] == "cpu"


def test_a_trace_driven_run_replays_the_trace_it_followed(tmp_path):
    """A trace recorded from one run, its passes unmarked as a capture's are, drives another
    on the wall clock: its virtual figures are the driven run's on the virtual clock (TTFT:
    its first pass, prefilled as the prompt), and its counters the live cache's."""
    config = _config(**{"clock.kind": "virtual"})
    run = resolve(config)
    loaded = load_model_for(run)
    experts, decoder = configured_decoder(run, loaded, max_len=MAX_LEN)
    routing = clocks.RunRouting(loaded.cfg, config.model.lookahead, loaded.source)
    routing.attach(decoder, experts)
    decoder.generate(PROMPT, 6)
    path = str(tmp_path / "driving.npz")
    trace = routing.traces()[0]
    # As a capture is: no pass marked prefill (the live run prefills the first as its prompt).
    trace.meta["prefill_passes"] = 0
    trace.save(path)

    def driven(kind):
        return _config(**{"clock.kind": kind, "policies.routing": f"trace(path={path!r})",
                          "run.max_new_tokens": 6, "policies.prefetch": "temporal"})

    on_virtual = _run(driven("virtual"), loaded)["virtual"]
    got = _run(driven("wall"), loaded)["virtual"]
    assert got["source"] == "replay" and got["replay_counters_equal_live"] is True
    assert {k: got[k] for k in TIMING} == {k: on_virtual[k] for k in TIMING}
    assert got["decode_tokens"] == 5


def test_line_names_each_clock():
    got = {"wall": {"ttft_s": 0.0123, "decode_tok_per_s": 85.9},
           "virtual": {"ttft_s": 0.00341, "decode_tok_per_s": None, "hardware": "h200",
                       "source": "replay"}}
    assert clocks.line(got) == (
        "wall clock (this machine): TTFT 12.30 ms, decode 85.9 tok/s; virtual clock (modelled "
        "h200, a replay of this run's routing): TTFT 3.41 ms, decode n/a")
