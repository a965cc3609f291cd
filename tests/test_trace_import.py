"""Importers of other tools' routing traces (moejax/traces/importers.py): the bundled capture
traces, format detection from content, and an error naming file and line for every malformed
capture or vLLM routing-logger file."""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest

from moejax import bundled
from moejax.traces.format import FORMAT, Trace, TraceError
from moejax.traces.importers import load_traces, sniff

TRACES = bundled.CAPTURES_DIR
SHAPES = {"olmoe_code": (512, 16, 8, 64), "olmoe_prose": (512, 16, 8, 64),
          "qwen_code": (512, 24, 4, 60), "qwen_prose": (512, 24, 4, 60)}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def shared(request):
    path = os.path.join(TRACES, f"{request.param}.jsonl")
    return request.param, path, load_traces(path)


def test_shared_traces_load_with_their_shapes(shared):
    name, path, traces = shared
    steps, layers, k, e = SHAPES[name]
    assert len(traces) == 1
    t = traces[0]
    assert t.ids.shape == (steps, layers, k)
    assert (t.num_experts, t.top_k, t.layers) == (e, k, list(range(layers)))
    assert t.pass_offsets.tolist() == list(range(steps + 1))
    assert t.decode_ids().shape == (steps, layers, k)
    assert (t.tokens == -1).all()
    assert t.weights is None and t.probs is None and t.spec is None
    assert t.meta["format"] == FORMAT and t.meta["info"]["steps"] == steps
    assert 0 <= t.ids.min() and t.ids.max() < e
    # Top-k ids of one token are distinct experts.
    s = np.sort(t.ids, -1)
    assert (np.diff(s, axis=-1) > 0).all()


def test_shared_traces_match_a_plain_json_parse(shared):
    name, path, traces = shared
    with open(path) as f:
        lines = f.read().splitlines()
    meta = json.loads(lines[0])["meta"]
    assert meta["steps"] == len(lines) - 1
    for step in (0, 1, 255, meta["steps"] - 1):
        row = json.loads(lines[1 + step])
        assert row["step"] == step
        want = [row["routed"][str(l)] for l in range(meta["layers"])]
        assert traces[0].ids[step].tolist() == want


def test_sniff_reads_content_not_extension(tmp_path):
    src = os.path.join(TRACES, "qwen_code.jsonl")
    txt = str(tmp_path / "routing.txt")
    shutil.copy(src, txt)
    assert sniff(txt) == "capture"
    [t] = load_traces(txt)
    assert t.ids.shape == (512, 24, 4)

    npz_as_bin = str(tmp_path / "trace.bin")
    t.save(npz_as_bin)
    assert sniff(npz_as_bin) == "moejax"
    [back] = load_traces(npz_as_bin)
    np.testing.assert_array_equal(back.ids, t.ids)

    vllm = str(tmp_path / "rows.npz")  # JSONL despite the name
    _write(vllm, [_vrow("p", 0, 0, [1, 2])])
    assert sniff(vllm) == "vllm"


def test_sniff_rejects_unknown_content(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"hello": 1}\n')
    with pytest.raises(TraceError, match=re.escape(f"{p}:1")):
        sniff(str(p))
    p.write_text("not json at all\n")
    with pytest.raises(TraceError, match=re.escape(f"{p}:1")):
        load_traces(str(p))


# --- capture JSONL ------------------------------------------------------------------------

L, K, E = 3, 2, 6


def _capture_lines(steps=4, meta_steps=None):
    meta = {"model": "m", "prompt": "p", "steps": steps if meta_steps is None else meta_steps,
            "layers": L, "top_k": K, "n_experts": E, "prompt_tokens": 5, "decode": True}
    rng = np.random.default_rng(0)
    rows = [{"step": s, "routed": {str(l): sorted(rng.choice(E, K, replace=False).tolist())
                                   for l in range(L)}} for s in range(steps)]
    return [json.dumps({"meta": meta})] + [json.dumps(r) for r in rows], rows


def _write(path, lines):
    with open(path, "w") as f:
        f.write("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return str(path)


def test_capture_well_formed(tmp_path):
    lines, rows = _capture_lines()
    [t] = load_traces(_write(tmp_path / "ok.jsonl", lines))
    assert t.ids.tolist() == [[r["routed"][str(l)] for l in range(L)] for r in rows]
    assert (t.num_experts, t.top_k, t.layers) == (E, K, [0, 1, 2])


def _mutate(lines, n, fn):
    """Line `n` (1-based) replaced by fn(parsed row)."""
    out = list(lines)
    row = json.loads(out[n - 1])
    fn(row)
    out[n - 1] = json.dumps(row)
    return out


def test_capture_truncated_last_line(tmp_path):
    lines, _ = _capture_lines()
    path = str(tmp_path / "cut.jsonl")
    with open(path, "w") as f:
        f.write("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    with pytest.raises(TraceError, match=re.escape(f"{path}:5:") + ".*truncated"):
        load_traces(path)


@pytest.mark.parametrize("case,line,what", [
    ("missing-layer", 3, r"routes layers \['0', '2'\]"),
    ("extra-layer", 3, "routes layers"),
    ("too-few-ids", 4, "layer 1 has 1 experts, expected top_k=2"),
    ("too-many-ids", 2, "layer 0 has 3 experts"),
    ("id-too-large", 5, "outside 0..5"),
    ("negative-id", 5, "outside 0..5"),
    ("out-of-order", 4, "step 3 out of order"),
    ("repeated-step", 4, "step 1 out of order"),
    ("no-routed", 3, "expected"),
])
def test_capture_malformed_step(tmp_path, case, line, what):
    lines, _ = _capture_lines()
    fn = {
        "missing-layer": lambda r: r["routed"].pop("1"),
        "extra-layer": lambda r: r["routed"].__setitem__("3", [0, 1]),
        "too-few-ids": lambda r: r["routed"].__setitem__("1", [0]),
        "too-many-ids": lambda r: r["routed"].__setitem__("0", [0, 1, 2]),
        "id-too-large": lambda r: r["routed"].__setitem__("2", [1, E]),
        "negative-id": lambda r: r["routed"].__setitem__("2", [-1, 1]),
        "out-of-order": lambda r: r.__setitem__("step", 3),
        "repeated-step": lambda r: r.__setitem__("step", 1),
        "no-routed": lambda r: r.pop("routed"),
    }[case]
    path = _write(tmp_path / f"{case}.jsonl", _mutate(lines, line, fn))
    with pytest.raises(TraceError, match=re.escape(f"{path}:{line}:") + ".*" + what):
        load_traces(path)


def test_capture_fewer_steps_than_meta(tmp_path):
    lines, _ = _capture_lines(steps=4, meta_steps=6)
    path = _write(tmp_path / "short.jsonl", lines)
    with pytest.raises(TraceError, match=re.escape(path) + ".*truncated: 4 steps, meta says 6"):
        load_traces(path)


def test_capture_blank_line_is_an_error(tmp_path):
    lines, _ = _capture_lines()
    path = _write(tmp_path / "blank.jsonl", lines[:3] + [""] + lines[3:])
    with pytest.raises(TraceError, match=re.escape(f"{path}:4:")):
        load_traces(path)


@pytest.mark.parametrize("field", ["layers", "top_k"])
def test_capture_bad_meta(tmp_path, field):
    """The layer count and top-k cannot be inferred: a header without them is an error naming
    the file's first line (a missing expert count is inferred: test_replay_foreign_traces)."""
    lines, _ = _capture_lines()
    head = json.loads(lines[0])
    del head["meta"][field]
    path = _write(tmp_path / "meta.jsonl", [json.dumps(head)] + lines[1:])
    with pytest.raises(TraceError, match=re.escape(f"{path}:1:")):
        load_traces(path)


def test_capture_repeated_expert_in_one_step(tmp_path):
    lines, _ = _capture_lines()
    bad = _mutate(lines, 3, lambda r: r["routed"].__setitem__("0", [3, 3]))
    path = _write(tmp_path / "dup.jsonl", bad)
    with pytest.raises(TraceError, match=re.escape(f"{path}:3:")):
        load_traces(path)


# --- vLLM routing-logger rows -------------------------------------------------------------


def _vrow(problem, tok, layer, experts, probs=None):
    row = {"problem_id": problem, "layer": layer, "experts": experts, "token_idx": tok}
    row["gating_probs"] = probs if probs is not None else [0.6, 0.4][: len(experts)]
    return row


def _vllm_rows():
    """2 problems x 3 tokens x 2 layers (layers 1 and 5), ids and weights a function of
    (problem, token, layer), rows shuffled."""
    rows = []
    for pi, problem in enumerate(["gsm-7", "gsm-2"]):
        for tok in range(3):
            for li, layer in enumerate([5, 1]):
                a = (pi * 5 + tok * 2 + li) % 8
                rows.append(_vrow(problem, tok, layer, [a, (a + 3) % 8],
                                  [0.5 + 0.1 * tok, 0.1 * (li + 1)]))
    order = np.random.default_rng(4).permutation(len(rows))
    return [rows[i] for i in order]


def _expected(problem):
    pi = ["gsm-7", "gsm-2"].index(problem)
    ids, w = [], []
    for tok in range(3):
        ids.append([]), w.append([])
        for layer, li in ((1, 1), (5, 0)):  # sorted layers
            a = (pi * 5 + tok * 2 + li) % 8
            ids[-1].append([a, (a + 3) % 8])
            w[-1].append([0.5 + 0.1 * tok, 0.1 * (li + 1)])
    return np.array(ids), np.array(w, np.float32)


def test_vllm_rows_become_one_trace_per_problem(tmp_path):
    rows = _vllm_rows()
    traces = load_traces(_write(tmp_path / "v.jsonl", rows))
    assert len(traces) == 2
    by_problem = {t.meta["info"]["problem_id"]: t for t in traces}
    assert set(by_problem) == {"gsm-7", "gsm-2"}
    for problem, t in by_problem.items():
        ids, w = _expected(problem)
        assert t.layers == [1, 5] and t.top_k == 2
        assert t.ids.shape == (3, 2, 2)
        np.testing.assert_array_equal(t.ids, ids)
        np.testing.assert_array_equal(t.weights, w)
        assert t.pass_offsets.tolist() == [0, 1, 2, 3]
        # No expert count in this format: it is inferred from the largest id in the file.
        assert t.num_experts == 1 + max(max(r["experts"]) for r in rows)
        assert t.decode_ids().shape == (3, 2, 2)


def test_vllm_rows_without_full_weights_have_none(tmp_path):
    rows = _vllm_rows()
    rows[3] = {k: v for k, v in rows[3].items() if k != "gating_probs"}
    traces = load_traces(_write(tmp_path / "v.jsonl", rows))
    problem = rows[3]["problem_id"]
    t = {t.meta["info"]["problem_id"]: t for t in traces}[problem]
    assert t.weights is None
    np.testing.assert_array_equal(t.ids, _expected(problem)[0])


def test_vllm_duplicate_row(tmp_path):
    rows = _vllm_rows()
    rows.insert(7, dict(rows[2]))
    path = _write(tmp_path / "dup.jsonl", rows)
    with pytest.raises(TraceError, match=re.escape(f"{path}:8:") + ".*duplicate"):
        load_traces(path)


def test_vllm_token_missing_a_layer(tmp_path):
    rows = [r for r in _vllm_rows()
            if not (r["problem_id"] == "gsm-2" and r["token_idx"] == 1 and r["layer"] == 5)]
    path = _write(tmp_path / "hole.jsonl", rows)
    with pytest.raises(TraceError, match=re.escape(path) + ".*'gsm-2' token 1 lacks layers \\[5\\]"):
        load_traces(path)


def test_vllm_gap_in_token_idx(tmp_path):
    rows = [r for r in _vllm_rows() if not (r["problem_id"] == "gsm-7" and r["token_idx"] == 1)]
    path = _write(tmp_path / "gap.jsonl", rows)
    with pytest.raises(TraceError, match=re.escape(path) + ".*'gsm-7' has gaps in token_idx"):
        load_traces(path)


@pytest.mark.parametrize("case,what", [
    ("cut", "malformed or truncated JSON"),
    ("missing-key", r"lacks \['token_idx'\]"),
    ("wrong-k", "has 3 experts, expected top_k=2"),
    ("negative", "outside"),
    ("empty-experts", "non-empty list"),
])
def test_vllm_malformed_line(tmp_path, case, what):
    rows = [json.dumps(r) for r in _vllm_rows()]
    n = 6
    r = json.loads(rows[n - 1])
    if case == "cut":
        rows[n - 1] = rows[n - 1][:20]
    elif case == "missing-key":
        del r["token_idx"]
    elif case == "wrong-k":
        r["experts"] = [0, 1, 2]
    elif case == "negative":
        r["experts"] = [-1, 2]
    elif case == "empty-experts":
        r["experts"] = []
    if case != "cut":
        rows[n - 1] = json.dumps(r)
    path = _write(tmp_path / f"{case}.jsonl", rows)
    with pytest.raises(TraceError, match=re.escape(f"{path}:{n}:") + ".*" + what):
        load_traces(path)


def test_loaded_traces_are_valid_moejax_traces(tmp_path):
    """An imported trace saves and reloads as a moejax trace with the same arrays."""
    [t] = load_traces(_write(tmp_path / "c.jsonl", _capture_lines()[0]))
    out = str(tmp_path / "c.npz")
    t.save(out)
    [back] = load_traces(out)
    assert isinstance(back, Trace)
    np.testing.assert_array_equal(back.ids, t.ids)
    np.testing.assert_array_equal(back.pass_offsets, t.pass_offsets)


_CAP_META = json.dumps({"meta": {"steps": 1, "layers": 1, "top_k": 2, "n_experts": 4}})
_V = {"problem_id": "a", "layer": 0, "experts": [0, 1], "token_idx": 0}


@pytest.mark.parametrize("case", ["sniff-first-line-not-object", "capture-routed-not-object",
                                  "capture-bool-ids", "vllm-row-not-object",
                                  "vllm-layer-not-int", "vllm-fractional-token-idx"])
def test_every_malformed_line_names_file_and_line(tmp_path, case):
    lines, line = {
        "sniff-first-line-not-object": (["5"], 1),
        "capture-routed-not-object": ([_CAP_META, json.dumps({"step": 0, "routed": [[0, 1]]})],
                                      2),
        "capture-bool-ids": ([_CAP_META, json.dumps({"step": 0, "routed": {"0": [True, False]}})],
                             2),
        "vllm-row-not-object": ([json.dumps(_V), "5"], 2),
        "vllm-layer-not-int": ([json.dumps(_V), json.dumps({**_V, "token_idx": 1, "layer": "x"})],
                               2),
        "vllm-fractional-token-idx": ([json.dumps(_V), json.dumps({**_V, "token_idx": 1.5})], 2),
    }[case]
    path = _write(tmp_path / "bad.jsonl", lines)
    with pytest.raises(TraceError, match=re.escape(f"{path}:{line}:")):
        load_traces(path)
