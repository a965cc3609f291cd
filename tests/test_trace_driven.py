"""Trace-driven live runs (`policies.routing='trace(path=T)'`, moejax/traces/driven.py) and
`model.width`: a live run driven by a trace takes the decisions its replay takes — the same
counters, and on the same model's sizes the same bytes and virtual times — on the shipped OLMoE
capture (a preset narrowed with `model.width`) and on a scored trace of the embedded model
(its weights, probabilities and speculative scores, under the default score-based prefetch);
the experts step computes the trace's experts; the warm-up walks a driver of its own; and the
mistakes a user can make are one line each."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax import bundled, jobs
from moejax.errors import ConfigError
from moejax.families import FAMILIES, WIDTH_STEP, preset
from moejax.jobs.schema import base_config
from moejax.models.stepped import SteppedDecoder
from moejax.seam import LayerGate
from moejax.serving.runtime import CachedExperts
from moejax.traces import driven
from moejax.traces.format import FORMAT, Trace
from moejax.traces.importers import load_traces
from tests.fuzzing import examples

CAPTURE = bundled.capture_path("olmoe_code")
SCORED = bundled.scored_trace_files()[0]  # the embedded model's: weights, probs, spec
PASSES = 20  # of each trace, to stay fast


def _routing(path: str) -> str:
    return f"trace(path={path!r})"


def _live(path: str, passes: int, *, width: bool, warmup: bool = False, **cache) -> dict:
    c = base_config()
    c.policies.routing = _routing(path)
    if width:
        c.model.preset, c.model.width = "olmoe-1b-7b", 32
    c.run.max_new_tokens, c.run.warmup = passes, warmup
    c.log.progress = c.log.tensorboard = False
    for k, v in cache.items():
        setattr(c.policies if k in ("eviction", "prefetch") else c.cache, k, v)
    return c


def _replay(tmp_path, trace: Trace, name: str, **cache) -> dict:
    path = str(tmp_path / f"{name}.npz")
    trace.save(path)
    c = base_config()
    c.job, c.replay.trace, c.model.preset, c.clock.kind = "replay", path, "", "virtual"
    c.log.progress = c.log.tensorboard = False
    for k, v in cache.items():
        setattr(c.policies if k in ("eviction", "prefetch") else c.cache, k, v)
    return jobs.run(c, str(tmp_path / f"{name}-replay"))


@pytest.fixture
def steps(monkeypatch) -> list:
    """What every experts step of the run computed (the warm-up's first): per pass, per MoE
    layer in the order they ran, the waves' (ids, weights) as the runtime handed them to the
    step. A layer a speculative pass re-ran (a failed check) appears again: its last steps are
    the pass's."""
    seen, experts_for, forward = [], CachedExperts.experts_for, SteppedDecoder.forward_next

    def spy(self, gate):
        waves = []
        seen[-1].append((gate.layer, waves))
        for wave in experts_for(self, gate):
            waves.append((np.asarray(wave.ids), np.asarray(wave.weights)))
            yield wave

    def each_pass(self, tokens):
        seen.append([])
        return forward(self, tokens)

    monkeypatch.setattr(CachedExperts, "experts_for", spy)
    monkeypatch.setattr(SteppedDecoder, "forward_next", each_pass)
    return seen


def _check_steps(steps: list, trace: Trace, passes: int, warmup: bool,
                 speculated: bool = False) -> None:
    """Each experts step got the trace's ids, pass by pass and layer by layer, and its weights
    (or 1/K each where it has none) spread over the layer's waves; never the router's. So did
    the steps of a layer a failed speculative check made run again (`speculated`: some ran
    again; a layer whose dispatch the failed check stopped ran none the first time), and each
    pass ran every layer, in order, its last time with its steps."""
    layers = len(trace.layers)
    if warmup:  # the warm-up's two passes ran first, on a driver of its own
        steps = steps[2:]
    assert len(steps) == passes
    reruns = 0
    for p, run in enumerate(steps):
        rows = trace.pass_rows(p)
        last = {layer: waves for layer, waves in run}
        assert list(last) == list(trace.layers) and all(last.values())  # in order
        reruns += len(run) - layers
        for layer, waves in filter(lambda call: call[1], run):
            pos = trace.layers.index(layer)
            want = (np.full(trace.ids[rows, pos].shape, np.float32(1 / trace.top_k))
                    if trace.weights is None else trace.weights[rows, pos])
            for ids, _ in waves:
                np.testing.assert_array_equal(ids, trace.ids[rows, pos])
            # Each contribution runs in one wave, 0.0 in the others.
            np.testing.assert_array_equal(sum(w for _, w in waves), want)
    assert (reruns > 0) == speculated


@pytest.mark.parametrize("cell", [
    dict(eviction="lru", slots=128, warmup=True),  # prefetch: the default, none (no scores)
    # A staging share for the prefetches (a used one joins the demand share).
    dict(eviction="least_stale", prefetch="temporal", slots=300, prefetch_share=0.25),
    dict(eviction="lfu", prefetch="temporal", slots=64, prefetch_queue="watchdog"),
])
def test_a_capture_drives_a_narrowed_preset_as_its_replay_runs(tmp_path, steps, cell):
    """The OLMoE capture (ids only) drives OLMoE-1B-7B at width 32; its replay, on the same
    model's sizes and starting at the same position (the live run's prompt is the capture's
    first pass), counts, moves and stalls exactly the same; the experts steps computed the
    capture's experts, 1/K each."""
    cell = dict(cell)
    warmup = cell.pop("warmup", False)
    config = _live(CAPTURE, PASSES, width=True, warmup=warmup, **cell)
    live = jobs.run(config, str(tmp_path / "live"))
    assert live["trace_driven"]["passes_run"] == PASSES  # (not the warm-up's)
    (capture,) = load_traces(CAPTURE)
    model = live["model"]["config"]
    cut = capture.first_passes(PASSES, model=model, expert_bytes=live["cache"]["expert_bytes"],
                               info={**capture.meta["info"], "prompt_tokens": 0})
    replayed = _replay(tmp_path, cut, "capture", **cell)
    ran, rep = live["cache"], replayed["cache"]
    assert ran["slots"] == rep["slots"] == cell["slots"]
    assert ran["total"] == rep["total"]
    assert ran["per_layer"] == rep["per_layer"]
    assert ran["timing"]["total_s"] == rep["timing"]["total_s"]
    assert ran.get("staging") == rep.get("staging")
    assert ("staging" in ran) == ("prefetch_share" in cell)
    assert ran["total"]["requests"] == PASSES * 16 * 8
    assert 0 < ran["total"]["hits"] and 0 < ran["total"]["misses"]
    if cell.get("prefetch"):
        assert ran["total"]["prefetch_issued"] > 0
    _check_steps(steps, capture, PASSES, warmup, _speculated(live, cell))


@pytest.mark.parametrize("cell", [
    dict(capacity_frac=0.3, warmup=True),  # the default policies: least_stale, score_percentile
    dict(eviction="lru", prefetch="topk(overfetch=1.5, lookahead=2)", capacity_frac=0.15),
    dict(eviction="fifo", capacity_frac=0.6, prefetch_queue="watchdog"),
])
def test_a_scored_trace_drives_the_embedded_model_as_its_replay_runs(tmp_path, steps, cell):
    """A trace of the embedded model, with its weights, probabilities and speculative scores,
    drives the embedded model: everything results.json's cache section counts and times equals
    the replay's (same positions: the trace's prefill is the live prompt), and the experts
    steps computed the trace's experts with its weights."""
    cell = dict(cell)
    warmup = cell.pop("warmup", False)
    live = jobs.run(_live(SCORED, PASSES, width=False, warmup=warmup, **cell),
                    str(tmp_path / "live"))
    assert live["trace_driven"]["passes_run"] == PASSES  # (not the warm-up's)
    (trace,) = load_traces(SCORED)
    replayed = _replay(tmp_path, trace.first_passes(PASSES), "scored", **cell)
    ran, rep = live["cache"], replayed["cache"]
    for part in ("slots", "pools", "total", "per_layer", "timing"):
        assert ran[part] == rep[part], part
    assert ran["policies"]["prefetch"] == rep["policies"]["prefetch"]
    assert ran["total"]["prefetch_issued"] > 0 and ran["total"]["late_hits"] > 0
    assert live["prompt_ids"] == trace.tokens[trace.pass_rows(0)].tolist()
    assert live["trace_driven"]["weights"] == "the trace's"
    _check_steps(steps, trace, PASSES, warmup, _speculated(live, cell))


def test_a_trace_driven_run_over_a_whole_cache_speculates_every_decode_pass(tmp_path, steps):
    """Every expert resident from the start: each decode pass runs every layer's experts step
    on the trace's experts without waiting for its router step, every check holds (no layer
    runs twice), and the counters and virtual times are the replay's."""
    cell = dict(capacity_frac=1.0, warm_start="all")
    live = jobs.run(_live(SCORED, PASSES, width=False, **cell), str(tmp_path / "live"))
    (trace,) = load_traces(SCORED)
    rep = _replay(tmp_path, trace.first_passes(PASSES), "scored", **cell)["cache"]
    for part in ("slots", "total", "per_layer", "timing"):
        assert live["cache"][part] == rep[part], part
    assert live["cache"]["total"]["misses"] == 0
    assert live["speculation"]["speculative_passes"] == PASSES - 1
    assert live["speculation"]["failed_checks"] == 0
    _check_steps(steps, trace, PASSES, False, speculated=False)


def _speculated(live: dict, cell: dict) -> bool:
    """A trace-driven run's decode passes speculated (not all of them: after failed checks
    past `speculation.RETRIES` some decide layer by layer), but for the watchdog queue's, which
    decide layer by layer; whether one of their checks failed (then its layer ran again)."""
    ran = live["speculation"]
    if cell.get("prefetch_queue") == "watchdog":
        assert ran["speculative_passes"] == 0
    else:
        assert 0 < ran["speculative_passes"] <= PASSES - 1
    return ran["failed_checks"] > 0


def _counts(row: dict) -> dict:
    """A results row's counts and rates (no bytes or times: a replay without expert sizes has
    none)."""
    return {k: v for k, v in row.items() if "bytes" not in k and not k.endswith("_s")}


def test_each_sequence_of_a_trace_is_a_request(tmp_path):
    """A vLLM log's problems, each a sequence of decode steps, run as requests one after
    another through one cache, as replay runs them (sequence after sequence)."""
    rng = np.random.default_rng(1)
    lines = []
    for problem, tokens in (("p1", 4), ("p2", 7), ("p3", 5)):
        for tok in range(tokens):
            for layer in range(8):  # the embedded model's shape: 8 MoE layers x 32, top-4
                probs = rng.dirichlet(np.ones(4)).round(4).tolist()
                lines.append(json.dumps({"problem_id": problem, "layer": layer,
                                         "experts": rng.permutation(32)[:4].tolist(),
                                         "gating_probs": probs, "token_idx": tok}))
    path = tmp_path / "vllm.jsonl"
    path.write_text("\n".join(lines) + "\n")
    cell = dict(eviction="lru", prefetch="none", slots=40)
    config = _live(str(path), base_config().run.max_new_tokens, width=False, warmup=True,
                   **cell)
    config.replay.num_experts = 32
    live = jobs.run(config, str(tmp_path / "live"))
    assert [len(r["generated_token_ids"]) for r in live["requests"]] == [4, 7, 5]
    assert live["trace_driven"]["passes_run"] == 16
    c = base_config()
    c.job, c.replay.trace, c.model.preset, c.replay.num_experts = "replay", str(path), "", 32
    c.log.progress = c.log.tensorboard = False
    c.policies.eviction, c.policies.prefetch, c.cache.slots = "lru", "none", 40
    replayed = jobs.run(c, str(tmp_path / "replay"))
    assert _counts(live["cache"]["total"]) == _counts(replayed["cache"]["total"])
    assert [_counts(r) for r in live["cache"]["per_layer"]] == [
        _counts(r) for r in replayed["cache"]["per_layer"]]
    assert live["cache"]["total"]["requests"] == replayed["cache"]["total"]["requests"] == 16 * 8 * 4


# -- the driver on its own --------------------------------------------------------------------

def _tiny_trace(passes: list[int], layers=(3, 5)) -> driven.DrivingTrace:
    rows = sum(passes)
    ids = np.arange(rows * len(layers) * 2).reshape(rows, len(layers), 2) % 4
    meta = {"format": FORMAT, "model": {}, "layers": list(layers), "num_experts": 4, "top_k": 2,
            "lookahead": 0, "prefill_passes": 1, "source": "test", "info": {}}
    trace = Trace(meta, np.concatenate([[0], np.cumsum(passes)]), np.full(rows, -1, np.int32),
                  ids)
    return driven.DrivingTrace("t.npz", (trace,), None)


def _gate(layer: int, tokens: int) -> LayerGate:
    return LayerGate(layer, np.zeros((tokens, 2), np.int32), None, None)


def test_the_driver_walks_passes_and_relabels_layers():
    driver = driven.TraceDriver(_tiny_trace([3, 1, 1]), model_layers=(0, 2))
    trace = driver.driving.first
    for p, tokens in enumerate([3, 1, 1]):
        for pos, layer in enumerate((0, 2)):
            got = driver(_gate(layer, tokens))
            assert got.layer == layer  # the model's numbering, not the trace's (3, 5)
            np.testing.assert_array_equal(got.ids, trace.ids[trace.pass_rows(p), pos])
    assert driver.passes_run == 3
    with pytest.raises(ConfigError, match="has 3 passes; the run asked for more"):
        driver(_gate(0, 1))
    driver.start(0)  # a request starts the sequence again
    assert driver(_gate(0, 3)).layer == 0


def test_a_pass_of_another_token_count_is_refused():
    driver = driven.TraceDriver(_tiny_trace([3, 1]), model_layers=(3, 5))
    with pytest.raises(ConfigError, match="pass 0 has 3 tokens and the model's has 4"):
        driver(_gate(3, 4))


# -- mistakes -----------------------------------------------------------------------------------

def _config(**fields) -> object:
    c = base_config()
    c.log.progress = c.log.tensorboard = False
    c.run.warmup = False
    for dotted, value in fields.items():
        group, name = dotted.split("__")
        setattr(c[group], name, value)
    return c


@pytest.mark.parametrize("fields, message", [
    ({"policies__routing": _routing(CAPTURE)},
     r"the model has 8 MoE layers x 32 experts, top-4; the trace .*olmoe_code.jsonl has "
     r"16 x 64, top-8"),
    ({"policies__routing": _routing(CAPTURE), "model__preset": "olmoe-1b-7b",
      "model__width": 32, "run__max_new_tokens": 513},
     r"run.max_new_tokens=513: .*olmoe_code.jsonl has 512 passes"),
    ({"policies__routing": _routing(SCORED), "cache__enabled": False},
     r"cache.enabled=False runs none"),
    ({"policies__routing": "trace"}, r"needs the trace to follow: trace\(path=T\)"),
    ({"policies__routing": _routing("no/such.npz")}, r"'no/such.npz' is not a file"),
    ({"policies__routing": _routing(SCORED), "job": "perplexity"},
     r"drives the generate job"),
    ({"policies__routing": _routing(SCORED), "run__batch_size": 2}, r"batch_size=1"),
    ({"policies__routing": _routing(SCORED), "tracing__record": True},
     r"the trace is its record"),
    ({"model__width": 32}, r"model.preset='embedded' is trained at its own"),
    ({"model__width": 32, "model__checkpoint": bundled.EMBEDDED_DIR}, r"has its own widths"),
    ({"model__width": 12, "model__preset": "tiny"}, r"model.width=12 must be a multiple of 8"),
])
def test_mistakes_are_one_line(tmp_path, fields, message):
    c = _config(**{k: v for k, v in fields.items() if k != "job"})
    c.job = fields.get("job", "generate")
    if c.job == "perplexity":
        c.perplexity.text_file = bundled.heldout_path("code")
    with pytest.raises(ConfigError, match=message) as e:
        jobs.run(c, str(tmp_path / "w"))
    assert "\n" not in str(e.value)


def test_a_replay_refuses_trace_routing(tmp_path):
    c = _config(policies__routing=_routing(CAPTURE))
    c.job, c.replay.trace, c.model.preset = "replay", CAPTURE, ""
    with pytest.raises(ConfigError, match="a replay already follows its own"):
        jobs.run(c, str(tmp_path / "w"))


# -- model.width ------------------------------------------------------------------------------

PRESETS = [(f, n) for f, fam in sorted(FAMILIES.items()) for n in sorted(fam.presets)]


@settings(max_examples=examples(60))
@given(which=st.sampled_from(PRESETS), steps=st.integers(1, 512))
def test_a_narrowed_preset_keeps_its_routing_structure(which, steps):
    family, name = which
    width = steps * WIDTH_STEP
    full, cfg = preset(family, name), preset(family, name, width)
    cfg.validate()
    same = ("num_layers", "moe_layers", "num_experts", "top_k", "router", "norm_topk_prob",
            "vocab_size", "max_position_embeddings", "sliding_window")
    assert {k: getattr(cfg, k) for k in same} == {k: getattr(full, k) for k in same}
    assert cfg.hidden_size == cfg.expert_intermediate_size == width
    for field in ("dense_intermediate_size", "shared_expert_intermediate_size"):
        assert getattr(cfg, field) == (width if getattr(full, field) else 0), field
    assert cfg.num_heads * cfg.head_dim == width and cfg.head_dim % 2 == 0
    assert cfg.head_dim >= WIDTH_STEP and cfg.num_heads <= full.num_heads
    assert cfg.num_heads % cfg.num_kv_heads == 0
    # The grouping of query heads over key/value heads is the preset's where the heads allow.
    group = full.num_heads // full.num_kv_heads
    if cfg.num_heads % group == 0:
        assert cfg.num_heads // cfg.num_kv_heads == group


def test_a_preset_at_its_own_width_keeps_its_heads():
    for family, name in PRESETS:
        full = preset(family, name)
        cfg = preset(family, name, full.hidden_size)
        assert cfg.rope == full.rope, (family, name)
        assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
            full.num_heads, full.num_kv_heads, full.head_dim), (family, name)
