"""Replay of traces no one here produced, built in tmp_path from the bundled real captures:

* a capture whose header lacks the expert count (`"n_experts": null` or no key): inferred as
  the largest id + 1, or stated with `replay.num_experts`, and reported in results.json;
* a vLLM routing log whose last tokens lack some layers (logging stopped mid-token): the
  complete tokens replay, the skipped ones are named in results.json and warned about;
* an id-only trace with no model named: expert bytes unknown, so bytes and times print and
  save as unknown while the counts stay exact.

The LRU hit counts at `pin_scope=request` are checked against a from-scratch LRU over the
complete tokens' request stream.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from reference_cache import lru_hits

from moejax import bundled, jobs
from moejax.cache import summary
from moejax.cache.metrics import CacheMetrics
from moejax.errors import ConfigError
from moejax.jobs.schema import base_config
from moejax.traces import importers
from moejax.traces.format import TraceError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OLMOE = bundled.capture_path("olmoe_code")  # 16 layers, top-8, 64 experts
QWEN = bundled.capture_path("qwen_code")  # 24 layers, top-4, 60 experts
IMPORTER_LOG = "moejax.traces.importers"


ENGINES = ("reference", "auto")  # the policy objects; the compiled engine where it covers


def _replay_config(trace: str, slots: int, engine: str = "auto", **policies):
    c = base_config()
    c.replay.engine = engine
    c.job, c.replay.trace, c.model.preset, c.clock.kind = "replay", trace, "", "virtual"
    c.log.progress = c.log.tensorboard = False
    c.cache.slots = slots
    c.cache.pin_scope = "request"  # the classic cache model the simulation below implements
    c.policies.eviction, c.policies.prefetch = "lru", "none"
    c.policies.miss, c.policies.routing = "fetch", "standard"
    for k, v in policies.items():
        setattr(c.policies, k, v)
    return c


def _read_capture(path: str):
    with open(path) as f:
        meta = json.loads(f.readline())["meta"]
        steps = [json.loads(line)["routed"] for line in f]
    return meta, steps


def _write_jsonl(path, rows) -> str:
    with open(path, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# -- the independent simulation --------------------------------------------------------------


def _lru_hits(sequences, slots: int) -> int:
    """A from-scratch LRU over one cache keyed by (layer, expert): `sequences` is a list of
    sequences, each a list of tokens, each a list of (layer, [experts in trace order]) in layer
    order. Every distinct expert of a row is one request."""
    return lru_hits([(layer, e) for tokens in sequences for token in tokens
                     for layer, experts in token for e in dict.fromkeys(experts)], slots)


def _capture_sequence(path: str):
    meta, steps = _read_capture(path)
    return [[[(l, step[str(l)]) for l in range(meta["layers"])] for step in steps]]


def test_the_simulation_itself():
    """One layer, experts 0 1 2 0 1 2 with 2 slots: LRU always evicts the next one needed."""
    seq = [[[(0, [e])] for e in (0, 1, 2, 0, 1, 2)]]
    assert _lru_hits(seq, 2) == 0
    assert _lru_hits(seq, 3) == 3
    assert _lru_hits([[[(0, [1, 2])], [(0, [2, 1])]], [[(1, [1])]]], 3) == 2


def _hits(res: dict) -> int:
    total = res["cache"]["total"]
    return total["hits"] + total["late_hits"]


def _replay(path: str, slots: int, engine: str, workdir) -> dict:
    """The replay job on `path` with `engine`, checked to have run the engine asked for
    (auto: the compiled one, which covers LRU, demand fetch and standard routing)."""
    res = jobs.run(_replay_config(path, slots, engine), str(workdir))
    assert res["replay"]["engine"] == {"reference": "reference", "auto": "compiled"}[engine], \
        res["replay"]["engine_reason"]
    return res


# -- a capture whose header lacks the expert count -------------------------------------------


def _capture_without_count(tmp_path, src=OLMOE, how="null", name="nocount.jsonl") -> str:
    with open(src) as f:
        lines = f.read().splitlines()
    head = json.loads(lines[0])
    if how == "null":
        head["meta"]["n_experts"] = None
    else:
        del head["meta"]["n_experts"]
    path = tmp_path / name
    path.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    return str(path)


@pytest.mark.parametrize("how", ["null", "absent"])
def test_capture_without_expert_count_infers_it_and_says_so(tmp_path, how, caplog):
    path = _capture_without_count(tmp_path, how=how)
    with caplog.at_level(logging.WARNING, logger=IMPORTER_LOG):
        res = jobs.run(_replay_config(path, 256), str(tmp_path / "w"))
    t = res["trace"]
    assert t["num_experts"] == 64
    assert t["num_experts_inferred"] is True and t["num_experts_source"] == "inferred"
    assert t["max_expert_id"] == 63 and t["skipped_token_count"] == 0
    assert any("inferred 64" in r.getMessage() and path in r.getMessage()
               for r in caplog.records)
    with open(tmp_path / "w" / "results.json") as f:
        assert json.load(f)["trace"]["num_experts_inferred"] is True
    # Same counts as the original capture, whose header states 64.
    orig = jobs.run(_replay_config(OLMOE, 256), str(tmp_path / "orig"))
    assert orig["trace"]["num_experts_source"] == "header"
    assert orig["trace"]["num_experts_inferred"] is False
    assert res["cache"]["total"] == orig["cache"]["total"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("slots", [10, 130, 256])
def test_capture_without_count_lru_matches_an_independent_simulation(tmp_path, slots, engine):
    path = _capture_without_count(tmp_path)
    res = _replay(path, slots, engine, tmp_path / "w")
    assert _hits(res) == _lru_hits(_capture_sequence(path), slots)
    assert res["cache"]["total"]["requests"] == 512 * 16 * 8
    assert (_hits(res) > 0) == (slots > 128)  # 128 requests a token


def test_replay_num_experts_states_the_count(tmp_path):
    path = _capture_without_count(tmp_path)
    c = _replay_config(path, 256)
    c.replay.num_experts = 64
    res = jobs.run(c, str(tmp_path / "a"))
    assert res["trace"]["num_experts"] == 64
    assert res["trace"]["num_experts_source"] == "config"
    assert res["trace"]["num_experts_inferred"] is False
    c.replay.num_experts = 80  # more experts than were ever routed to: allowed
    res = jobs.run(c, str(tmp_path / "b"))
    assert res["trace"]["num_experts"] == 80 and res["cache"]["slots"] == 256
    # A header that states the count, and the same count given: fine.
    c = _replay_config(OLMOE, 256)
    c.replay.num_experts = 64
    assert jobs.run(c, str(tmp_path / "c"))["trace"]["num_experts_source"] == "header"


def _first_id_at_least(path: str, n: int):
    """(line, id) of the first layer row routing to an expert >= n, as the importer scans."""
    meta, steps = _read_capture(path)
    for s, step in enumerate(steps):
        for l in range(meta["layers"]):
            if max(step[str(l)]) >= n:
                return s + 2, max(step[str(l)])
    raise AssertionError


def test_replay_num_experts_too_small_is_an_error_naming_file_and_id(tmp_path):
    path = _capture_without_count(tmp_path)
    line, bad = _first_id_at_least(path, 60)
    c = _replay_config(path, 256)
    c.replay.num_experts = 60
    with pytest.raises(ConfigError, match=re.escape(f"{path}:{line}:") +
                       f".*routes to expert {bad}.*replay.num_experts=60"):
        jobs.run(c, str(tmp_path / "w"))


def test_replay_num_experts_disagreeing_with_the_header_is_an_error(tmp_path):
    c = _replay_config(OLMOE, 256)
    c.replay.num_experts = 65
    with pytest.raises(ConfigError, match=re.escape(f"{OLMOE}:1:") +
                       ".*n_experts=64.*replay.num_experts=65"):
        jobs.run(c, str(tmp_path / "w"))
    # A moejax .npz trace records its count too.
    [t] = importers.load_traces(OLMOE)
    npz = str(tmp_path / "t.npz")
    t.save(npz)
    with pytest.raises(TraceError, match=re.escape(npz) + ".*num_experts=64.*=65"):
        importers.import_traces(npz, num_experts=65)
    assert importers.import_traces(npz, num_experts=64).notes.num_experts_source == "header"


def test_inferred_count_named_in_a_model_shape_mismatch(tmp_path):
    """An inferred count that undercounts the named model is refused with the way out."""
    with open(OLMOE) as f:
        head = json.loads(f.readline())
    head["meta"]["n_experts"] = None
    _, orig_steps = _read_capture(OLMOE)
    rows = []
    for s, step in enumerate(orig_steps):  # nobody routes to expert 63 any more
        routed = {}
        for k, v in step.items():
            kept = [e for e in v if e != 63]
            if len(kept) < len(v):
                kept.append(next(e for e in range(63) if e not in kept))
            routed[k] = sorted(kept)
        rows.append({"step": s, "routed": routed})
    path = _write_jsonl(tmp_path / "no63.jsonl", [head] + rows)
    c = _replay_config(path, 256)
    c.model.family, c.model.preset = "olmoe", "olmoe-1b-7b"
    with pytest.raises(ConfigError, match="16 x 63.*inferred.*replay.num_experts"):
        jobs.run(c, str(tmp_path / "a"))
    c.replay.num_experts = 64
    res = jobs.run(c, str(tmp_path / "b"))
    assert res["trace"]["num_experts"] == 64 and res["cache"]["expert_bytes"] is not None


# -- a vLLM routing log with incomplete tokens at the end ------------------------------------

# Problem "a" is steps 0..59 of the qwen capture, "b" steps 60..119, each as token_idx 0..59.
PROBLEMS = {"a": range(0, 60), "b": range(60, 120)}
# Logging stopped mid-token at the end of problem "a": its last two tokens lack layers.
CUT = {("a", 58): [23], ("a", 59): list(range(10, 24))}


def _vllm_rows(problems=PROBLEMS, cut=CUT, src=QWEN):
    """vLLM routing-logger rows (one per problem, token, layer), experts in a shuffled router
    order, rows of `cut[(problem, token)]` layers left out."""
    meta, steps = _read_capture(src)
    rng = np.random.default_rng(0)
    rows = []
    for problem, span in problems.items():
        for tok, s in enumerate(span):
            for l in range(meta["layers"]):
                if l in cut.get((problem, tok), ()):
                    continue
                experts = [int(e) for e in rng.permutation(steps[s][str(l)])]
                rows.append({"problem_id": problem, "layer": l, "experts": experts,
                             "gating_probs": [1 / len(experts)] * len(experts),
                             "token_idx": tok})
    return rows


def _vllm_complete_sequences(rows):
    """The request stream of the complete tokens, built from the rows alone."""
    layers = sorted({r["layer"] for r in rows})
    by = {}
    for r in rows:
        by.setdefault(r["problem_id"], {}).setdefault(r["token_idx"], {})[r["layer"]] = \
            r["experts"]
    seqs = []
    for problem, tokens in by.items():
        complete = [t for t in sorted(tokens) if sorted(tokens[t]) == layers]
        seqs.append([[(l, tokens[t][l]) for l in layers] for t in complete])
    return seqs


def test_vllm_log_with_incomplete_trailing_tokens_replays_the_complete_ones(tmp_path, caplog):
    path = _write_jsonl(tmp_path / "vllm.jsonl", _vllm_rows())
    with caplog.at_level(logging.WARNING, logger=IMPORTER_LOG):
        res = jobs.run(_replay_config(path, 150), str(tmp_path / "w"))
    t = res["trace"]
    assert t["format"] == "vllm" and t["sequences"] == 2 and t["passes"] == 58 + 60
    assert t["skipped_token_count"] == 2
    assert t["skipped_tokens"] == [
        {"problem": "a", "token": 58, "missing_layers": [23]},
        {"problem": "a", "token": 59, "missing_layers": list(range(10, 24))}]
    assert t["skipped_problems"] == []
    assert t["num_experts"] == 60 and t["num_experts_inferred"] is True
    messages = [r.getMessage() for r in caplog.records if r.name == IMPORTER_LOG]
    assert any(m.startswith(f"{path}: problem 'a' token 58 lacks layers [23]") for m in messages)
    assert any(m.startswith(f"{path}: problem 'a' token 59 lacks layers [10, 11,")
               for m in messages)
    with open(tmp_path / "w" / "results.json") as f:
        assert json.load(f)["trace"]["skipped_tokens"] == t["skipped_tokens"]
    assert res["cache"]["total"]["requests"] == (58 + 60) * 24 * 4


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("slots", [8, 150, 400])
def test_vllm_lru_matches_an_independent_simulation_of_the_complete_tokens(tmp_path, slots,
                                                                           engine):
    rows = _vllm_rows()
    path = _write_jsonl(tmp_path / "vllm.jsonl", rows)
    res = _replay(path, slots, engine, tmp_path / "w")
    seqs = _vllm_complete_sequences(rows)
    assert [len(s) for s in seqs] == [58, 60]
    assert _hits(res) == _lru_hits(seqs, slots)
    assert (_hits(res) > 0) == (slots > 100)  # fewer slots than a token requests: 0 hits


def test_vllm_incomplete_tokens_are_errors_when_strict(tmp_path):
    path = _write_jsonl(tmp_path / "vllm.jsonl", _vllm_rows())
    c = _replay_config(path, 150)
    c.replay.strict = True
    with pytest.raises(ConfigError, match=re.escape(path) +
                       r": problem 'a' token 58 lacks layers \[23\].*replay.strict"):
        jobs.run(c, str(tmp_path / "w"))


def test_vllm_incomplete_token_in_the_middle_is_an_error(tmp_path):
    """A gap in the middle would give every later token a wrong cache context."""
    path = _write_jsonl(tmp_path / "vllm.jsonl",
                        _vllm_rows(cut={**CUT, ("b", 30): [4, 5]}))
    with pytest.raises(TraceError, match=re.escape(path) +
                       r": problem 'b' token 30 lacks layers \[4, 5\], in the middle"):
        importers.load_traces(path)


def test_vllm_problem_with_no_complete_token_is_skipped(tmp_path, caplog):
    problems = {"a": range(0, 20), "x": range(20, 25), "b": range(25, 45)}
    cut = {**{("x", t): [7] for t in range(5)}, ("b", 19): [0, 1]}
    rows = _vllm_rows(problems, cut)
    path = _write_jsonl(tmp_path / "vllm.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger=IMPORTER_LOG):
        imported = importers.import_traces(path)
    assert [t.meta["info"]["problem_id"] for t in imported.traces] == ["a", "b"]
    assert [t.num_passes for t in imported.traces] == [20, 19]
    notes = imported.notes
    assert notes.skipped_problems == [{"problem": "x", "tokens": 5}]
    assert len(notes.skipped_tokens) == 6
    assert any("problem 'x': none of its 5 tokens" in r.getMessage() for r in caplog.records)
    want = _lru_hits(_vllm_complete_sequences(rows), 150)
    for engine in ENGINES:
        res = _replay(path, 150, engine, tmp_path / engine)
        assert res["trace"]["skipped_problems"] == [{"problem": "x", "tokens": 5}]
        assert _hits(res) == want, engine


def test_vllm_file_with_nothing_complete_is_an_error(tmp_path):
    problems = {"a": range(0, 3), "b": range(3, 6)}
    cut = {(p, t): [t % 24] for p in problems for t in range(3)}
    path = _write_jsonl(tmp_path / "vllm.jsonl", _vllm_rows(problems, cut))
    with pytest.raises(TraceError, match=re.escape(path) + ": no problem has a token"):
        importers.load_traces(path)


def test_vllm_replay_num_experts(tmp_path):
    rows = _vllm_rows()
    path = _write_jsonl(tmp_path / "vllm.jsonl", rows)
    line, bad = next((n, max(r["experts"])) for n, r in enumerate(rows, 1)
                     if max(r["experts"]) >= 50)
    with pytest.raises(TraceError, match=re.escape(f"{path}:{line}:") +
                       f" row routes to expert {bad}, but replay.num_experts=50"):
        importers.import_traces(path, num_experts=50)
    c = _replay_config(path, 150)
    c.replay.num_experts = 64
    res = jobs.run(c, str(tmp_path / "w"))
    assert res["trace"]["num_experts"] == 64 and res["trace"]["num_experts_source"] == "config"
    assert res["trace"]["num_experts_inferred"] is False
    assert res["trace"]["skipped_token_count"] == 2


# -- unknown expert bytes --------------------------------------------------------------------


def test_table_prints_none_and_unknown_instead_of_crashing():
    m = CacheMetrics([0, 1])  # nothing ran: every rate and the TTFT are None
    text = summary.table(m, "header")
    assert "TTFT n/a (no prefill pass ran)" in text and "decode n/a (no decode pass ran)" in text
    text = summary.table(m, "header", bytes_known=False)
    assert "TTFT unknown" in text and "H2D unknown" in text
    lines = text.splitlines()
    assert len(lines) == 7, text  # header, columns, layers 0 and 1, all, rates, timing
    rows = lines[2:5]
    assert [line.split()[0] for line in rows] == ["0", "1", "all"], text
    assert all(line.rstrip().endswith("unknown") for line in rows), text


def test_unknown_expert_bytes_print_and_save_as_unknown(tmp_path, capsys):
    """An id-only trace, no model named, no cache.expert_bytes: exact counts, unknown sizes."""
    c = _replay_config(QWEN, 150)
    c.log.progress = True
    res = jobs.run(c, str(tmp_path / "w"))
    out = capsys.readouterr().out
    assert "TTFT unknown, decode unknown, stall unknown; H2D unknown" in out
    assert re.search(r"^\s+all\s+49152\s.*unknown$", out, re.M), out
    with open(tmp_path / "w" / "results.json") as f:
        saved = json.load(f)
    cache = saved["cache"]
    assert cache["expert_bytes"] is None
    for key in ("h2d_bytes", "demand_bytes", "prefetch_bytes", "stall_s"):
        assert cache["total"][key] is None, key
        assert all(p.get(key) is None for p in cache["per_layer"]), key
    assert cache["timing"]["ttft_s"] is None and cache["timing"]["decode_s"] is None
    assert cache["timing"]["decode_tokens"] == 512
    assert cache["total"]["requests"] == 512 * 24 * 4 and cache["total"]["misses"] > 0
    want = _lru_hits(_capture_sequence(QWEN), 150)
    assert _hits(res) == want and res["replay"]["engine"] == "compiled"
    assert _hits(_replay(QWEN, 150, "reference", tmp_path / "reference")) == want
    # Named model: sizes known; a decode-only trace has no TTFT, printed as n/a with why.
    c.model.family, c.model.preset = "qwen2_moe", "qwen1.5-moe-a2.7b"
    named = jobs.run(c, str(tmp_path / "named"))
    out = capsys.readouterr().out
    assert "TTFT n/a (the trace has no prefill pass, only decode steps" in out
    assert "H2D unknown" not in out
    assert named["cache"]["expert_bytes"] > 0 and named["cache"]["total"]["h2d_bytes"] > 0
    assert named["cache"]["total"]["hits"] == res["cache"]["total"]["hits"]


# -- the real command line -------------------------------------------------------------------


def _id_only_without_model(tmp_path) -> str:
    """The prose capture with no model in its header (ids only, nothing to size experts)."""
    src = bundled.capture_path("qwen_prose")
    with open(src) as f:
        lines = f.read().splitlines()
    head = json.loads(lines[0])
    del head["meta"]["model"]
    path = tmp_path / "ids_only.jsonl"
    path.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("kind, engine", [("capture_without_count", "auto"),
                                          ("vllm_incomplete", "reference"),
                                          ("id_only", "reference")])
def test_command_line_replays_foreign_traces(tmp_path, kind, engine):
    if kind == "capture_without_count":
        trace, slots = _capture_without_count(tmp_path), 256
        expected = _lru_hits(_capture_sequence(trace), slots)
    elif kind == "vllm_incomplete":
        rows = _vllm_rows()
        trace, slots = _write_jsonl(tmp_path / "vllm.jsonl", rows), 150
        expected = _lru_hits(_vllm_complete_sequences(rows), slots)
    else:
        trace, slots = _id_only_without_model(tmp_path), 150
        expected = _lru_hits(_capture_sequence(trace), slots)
    workdir = tmp_path / "w"
    proc = subprocess.run(
        [sys.executable, "-m", "moejax.main", "--config=configs/replay.py",
         f"--config.replay.trace={trace}", f"--config.cache.slots={slots}",
         "--config.policies.eviction=lru", "--config.cache.pin_scope=request",
         f"--config.replay.engine={engine}",
         "--config.log.tensorboard=False", f"--workdir={workdir}"],
        cwd=REPO_ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
        text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(workdir / "results.json") as f:
        res = json.load(f)
    assert _hits(res) == expected
    assert res["replay"]["engine"] == {"reference": "reference", "auto": "compiled"}[engine]
    assert res["cache"]["expert_bytes"] is None
    # No prefetch was chosen and the trace has no scores: the default score-based prefetcher
    # gives way to none, and results.json and the log say so.
    assert res["cache"]["policies"]["prefetch"] == "none"
    assert res["cache"]["policies"]["source"]["prefetch"] == "default (trace has no scores)"
    assert "carries no speculative scores" in proc.stderr
    assert "TTFT unknown" in proc.stdout and "Traceback" not in proc.stderr
    if kind == "capture_without_count":
        assert res["trace"]["num_experts_inferred"] is True
        assert "inferred 64" in proc.stderr
    if kind == "vllm_incomplete":
        assert res["trace"]["skipped_token_count"] == 2
        assert f"{trace}: problem 'a' token 58 lacks layers [23]" in proc.stderr
        assert f"{trace}: problem 'a' token 59 lacks layers [10, 11," in proc.stderr
