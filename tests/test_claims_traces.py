"""`python -m studies.specmd.claims --traces=...` as a new user runs it on traces moejax has
never seen: no grid config, each trace identified by its own metadata (not its folder or file
name), the claims' cells run into --workdir, claims.json beside the table.

Two traces: a Qwen1.5-MoE-shaped capture whose generation repeats with period 2 (as the
issue's unseen Qwen math trace did), written here; and the first 48 decode steps of the
bundled OLMoE capture (real routing), renamed so the file name says nothing."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from moejax import bundled
from studies.specmd import claims

QWEN = "Qwen1.5-MoE-A2.7B · 24 layers × 60 experts, top-4"
OLMOE = "OLMoE-1B-7B · 16 layers × 64 experts, top-8"


def _period_two_capture(path: str, steps: int = 96) -> None:
    """24 layers × 60 experts, top-4; steps alternate between two routings, one expert in
    ten swapped for a random one (the cache sees repeats and some novelty)."""
    rng = np.random.default_rng(0)
    layers, experts, k = 24, 60, 4
    base = [[rng.choice(experts, k, replace=False) for _ in range(layers)] for _ in range(2)]
    meta = {"model": "/models/some-qwen-moe-math", "prompt": "math", "steps": steps,
            "layers": layers, "top_k": k, "n_experts": experts, "prompt_tokens": 64,
            "decode": True}
    with open(path, "w") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        for s in range(steps):
            routed = {}
            for layer in range(layers):
                ids = set(int(x) for x in base[s % 2][layer])
                if rng.random() < 0.1:
                    ids.discard(min(ids))
                while len(ids) < k:
                    ids.add(int(rng.integers(experts)))
                routed[str(layer)] = sorted(ids)
            f.write(json.dumps({"step": s, "routed": routed}) + "\n")


def _olmoe_head(path: str, steps: int = 48) -> None:
    with open(os.path.join(bundled.ASSETS, "captures", "olmoe_prose.jsonl")) as f:
        lines = [next(f) for _ in range(steps + 1)]
    meta = json.loads(lines[0])
    meta["meta"]["steps"] = steps
    with open(path, "w") as f:
        f.write(json.dumps(meta) + "\n" + "".join(lines[1:]))


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    root = tmp_path_factory.mktemp("claims_traces")
    os.makedirs(root / "traces")
    _period_two_capture(str(root / "traces" / "unseen_a.jsonl"))
    _olmoe_head(str(root / "traces" / "unseen_b.jsonl"))
    out = root / "claims.json"
    code = claims.main(["--traces", str(root / "traces" / "*.jsonl"),
                        f"--workdir={root / 'w'}", f"--json={out}"])
    assert code == 0
    with open(out) as f:
        return root, json.load(f)["records"]


def _one(records, claim, trace, measure="", **cond):
    (r,) = [r for r in records if r["claim"] == claim and r["trace"] == trace
            and measure in r["measure"]
            and all(r["condition"][k] == v for k, v in cond.items())]
    return r


DECODE_5PCT = {"queue": "immediate", "prefetch": "none", "capacity_frac": 0.05,
               "precision": "int4", "request_tokens": 0}


def test_fewer_collisions_bought_with_hits_is_not_reproduced(judged):
    _, records = judged
    r = _one(records, "specmd.least_stale", "unseen_a", **DECODE_5PCT)
    assert r["group"] == QWEN  # by its metadata: the shape of Qwen1.5-MoE, a /models/ path
    m = r["metrics"]
    assert m["hit_rate"] < m["lru_hit_rate"]  # §4's stale order drops a period-2 reuse
    assert r["verdict"].startswith("refuted on ") and "hit rate" in r["verdict"]
    assert r["failing_metric"] in ("collisions", "hit rate")
    assert r["condition"]["capacity_passes"] > 1  # the cache holds more than a pass
    # The cyclic reading keeps more of LRU's hits on the same trace (claim 7, moejax's).
    cyclic = _one(records, "moejax.least_stale_order", "unseen_a", "order=cyclic",
                  **DECODE_5PCT)
    assert cyclic["condition"]["slots"] == r["condition"]["slots"]
    assert cyclic["metrics"]["hit_rate"] > m["hit_rate"] and cyclic["verdict"] is None


def test_least_stale_equal_to_lru_below_one_pass_is_structural(judged):
    _, records = judged
    r = _one(records, "specmd.collision_reduction", "unseen_b",
             **{**DECODE_5PCT, "capacity_frac": 0.01})
    assert r["group"] == OLMOE
    assert r["condition"]["capacity_passes"] < 1
    assert r["verdict"] == "structural"
    assert r["rule"].startswith(f"capacity below one pass: {r['condition']['slots']} slots "
                                "< 128 experts a pass requests")


def test_every_record_names_its_whole_condition(judged):
    root, records = judged
    assert {r["trace"] for r in records} == {"unseen_a", "unseen_b"}
    for r in records:
        assert set(r["condition"]) >= {"queue", "prefetch", "capacity_frac", "capacity_of",
                                       "slots", "capacity_passes", "precision", "h2d_gbps",
                                       "hardware", "request_tokens", "prefill_tokens"}
        assert (r["condition"]["precision"], r["condition"]["h2d_gbps"],
                r["condition"]["hardware"]) == ("int4", 5.0, "a100_specmd")
    # Re-running finds every cell finished: nothing runs again, the same records come out.
    again = root / "again.json"
    assert claims.main(["--traces", str(root / "traces" / "*.jsonl"),
                        f"--workdir={root / 'w'}", f"--json={again}"]) == 0
    with open(again) as f:
        assert json.load(f)["records"] == records


def test_bad_traces_are_one_line_errors(tmp_path, capsys):
    prog = "python -m studies.specmd.claims: error: "
    assert claims.main(["--traces", str(tmp_path / "none*.jsonl"),
                        f"--workdir={tmp_path / 'w'}"]) == 2
    assert capsys.readouterr().err == (f"{prog}--traces={tmp_path / 'none*.jsonl'}: no such "
                                       "file (a path or a glob of trace files)\n")
    odd = tmp_path / "granite.jsonl"
    meta = {"model": "granite", "steps": 1, "layers": 3, "top_k": 2, "n_experts": 40}
    odd.write_text(json.dumps({"meta": meta}) + "\n" + json.dumps(
        {"step": 0, "routed": {"0": [0, 1], "1": [2, 3], "2": [4, 5]}}) + "\n")
    assert claims.main(["--traces", str(odd), f"--workdir={tmp_path / 'w'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{prog}{odd}: records no expert bytes and its shape (3 layers × 40 "
                          "experts, top-2) is no moejax preset's") and err.count("\n") == 1
    assert claims.main(["--traces", str(odd)]) == 2
    assert "--traces needs --workdir=W" in capsys.readouterr().err
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("mine")
    assert claims.main(["--traces", str(odd), "--model=olmoe/olmoe-1b-7b",
                        f"--workdir={tmp_path / 'used'}"]) == 2
    assert "is not empty and holds no claims run" in capsys.readouterr().err
    assert (tmp_path / "used" / "notes.txt").read_text() == "mine"
