"""Parsed traces kept by the content of their file (moejax/traces/memo.py): a reuse is what a
fresh parse returns, a changed file is parsed again, a caller's changes never reach the kept
parse, and the import's warnings are said on every call."""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pytest

from moejax.traces import TraceError, memo
from moejax.traces.importers import import_traces


def _capture(path, steps, n_experts=4, layers=2):
    """A capture JSONL of `steps`, each a list of `layers` id lists."""
    head = {"meta": {"layers": layers, "top_k": 2, "n_experts": n_experts, "steps": len(steps),
                     "model": "m"}}
    rows = [json.dumps(head)] + [
        json.dumps({"step": i, "routed": {str(l): ids for l, ids in enumerate(step)}})
        for i, step in enumerate(steps)]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


STEPS = [[[0, 1], [2, 3]], [[1, 2], [3, 0]], [[0, 3], [1, 2]]]


@pytest.fixture(autouse=True)
def empty_memo():
    memo.clear()
    yield
    memo.clear()


def _same(a, b) -> None:
    """Two imports are equal: every sequence's meta and arrays (dtype too), and the notes."""
    assert a.notes == b.notes
    assert len(a.traces) == len(b.traces)
    for x, y in zip(a.traces, b.traces):
        assert x.meta == y.meta
        for field in dataclasses.fields(x):
            u, v = getattr(x, field.name), getattr(y, field.name)
            if isinstance(u, np.ndarray) or isinstance(v, np.ndarray):
                assert u.dtype == v.dtype and np.array_equal(u, v), field.name


def test_the_same_content_is_parsed_once_and_reused_as_parsed(tmp_path):
    path = _capture(tmp_path / "t.jsonl", STEPS)
    first = memo.import_traces_memo(path)
    again = memo.import_traces_memo(path)
    assert memo.stats() == {"parsed": 1, "reused": 1, "kept": 1}
    _same(first, import_traces(path))
    _same(again, import_traces(path))
    assert again.traces[0].ids is not first.traces[0].ids  # a copy each time
    # Other options are another parse; so is the same content at another path (the trace
    # names its source).
    memo.import_traces_memo(path, num_experts=4)
    other = _capture(tmp_path / "u.jsonl", STEPS)
    assert memo.import_traces_memo(other).traces[0].meta["source"] == other
    assert memo.stats()["parsed"] == 3


def test_a_changed_file_is_parsed_again(tmp_path):
    path = _capture(tmp_path / "t.jsonl", STEPS)
    assert memo.import_traces_memo(path).traces[0].ids[0, 0].tolist() == [0, 1]
    changed = [[[2, 3], [2, 3]]] + STEPS[1:]  # same length, same size on disk
    _capture(tmp_path / "t.jsonl", changed)
    now = memo.import_traces_memo(path)
    assert now.traces[0].ids[0, 0].tolist() == [2, 3]
    _same(now, import_traces(path))
    assert memo.stats()["parsed"] == 2
    # Back to the first content: the first parse, kept, is what it gives.
    _capture(tmp_path / "t.jsonl", STEPS)
    _same(memo.import_traces_memo(path), import_traces(path))


def test_a_callers_changes_never_reach_the_kept_parse(tmp_path):
    path = _capture(tmp_path / "t.jsonl", STEPS)
    for _ in range(2):  # the first call's answer, then a reuse's
        got = memo.import_traces_memo(path)
        got.traces[0].ids[:] = 0
        got.traces[0].meta["info"]["steps"] = -1
        got.traces[0].meta["layers"].append(9)
        got.notes.skipped_tokens.append({"problem": "x"})
    _same(memo.import_traces_memo(path), import_traces(path))


def test_a_file_that_does_not_import_is_an_error_every_time(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"meta": {"layers": 2, "top_k": 2, "n_experts": 4}}\n{"step": 0}\n')
    for _ in range(2):
        with pytest.raises(TraceError, match=r"t\.jsonl:2: expected"):
            memo.import_traces_memo(str(path))
    assert memo.stats()["kept"] == 0
    _capture(path, STEPS)  # repaired
    _same(memo.import_traces_memo(str(path)), import_traces(str(path)))


def test_a_file_that_changes_while_it_is_parsed_is_not_kept(tmp_path, monkeypatch):
    path = _capture(tmp_path / "t.jsonl", STEPS)
    digests = iter(["before", "after"])
    monkeypatch.setattr(memo, "digest", lambda p: next(digests))
    _same(memo.import_traces_memo(path), import_traces(path))
    assert memo.stats()["kept"] == 0


def test_the_imports_warnings_are_said_on_every_call(tmp_path, caplog):
    path = tmp_path / "t.jsonl"
    _capture(path, STEPS, n_experts=None)  # no expert count: inferred, with a warning
    caplog.set_level(logging.WARNING, logger="moejax.traces.importers")
    said = []
    for _ in range(3):
        caplog.clear()
        memo.import_traces_memo(str(path))
        said.append([r.getMessage() for r in caplog.records])
    assert memo.stats()["reused"] == 2
    assert said[0] == said[1] == said[2] and "inferred 4" in said[0][0], said


def test_old_entries_make_room(tmp_path, monkeypatch):
    monkeypatch.setattr(memo, "MAX_ENTRIES", 2)
    paths = [_capture(tmp_path / f"t{i}.jsonl", STEPS) for i in range(3)]
    for p in paths:
        memo.import_traces_memo(p)
    assert memo.stats()["kept"] == 2
    memo.import_traces_memo(paths[0])  # the oldest went
    assert memo.stats()["parsed"] == 4
