"""`python -m launch.diff`: two sweeps compared cell by cell, matched by their overrides with
each checkout's root made relative, the wall-clock fields left out."""

from __future__ import annotations

import json
import os

from launch import diff


def _sweep(root: str, checkout: str, cells: dict[str, dict], field: str = "replay.trace") -> str:
    """A sweep directory as launch.sweep lays it out: sweep.json and cells/<name>/results.json;
    each cell's trace path (the override `field`) under `checkout`, and its name carrying a
    checkout-dependent hash."""
    manifest = []
    for i, (trace, results) in enumerate(cells.items()):
        name = f"trace={trace}-h{hash((checkout, trace)) & 0xffff:04x}"
        overrides = {field: f"{checkout}/moejax/assets/{trace}", "cache.slots": 8}
        manifest.append({"name": name, "overrides": overrides})
        os.makedirs(os.path.join(root, "cells", name))
        with open(os.path.join(root, "cells", name, "results.json"), "w") as f:
            json.dump({**results, "trace": {"path": overrides[field]}}, f)
    with open(os.path.join(root, "sweep.json"), "w") as f:
        json.dump({"cells": manifest}, f)
    return root


def _results(hits: int, seconds: float) -> dict:
    # How the kernel was loaded differs between identical runs too: numba compiled it on the
    # first run, read it from its disk cache on the next (and a worker's later cells say "in
    # process").
    return {"cache": {"total": {"hits": hits, "stall_s": 0.125}},
            "replay": {"seconds": seconds, "requests_per_s": 1000 / seconds,
                       "setup_s": seconds / 2,
                       "setup": "compiled" if seconds < 2 else "numba disk cache"}}


def test_identical_sweeps_from_two_checkouts_agree_but_for_wall_clock_and_kernel_load(
        tmp_path, capsys):
    a = _sweep(str(tmp_path / "a"), "/old", {"x.npz": _results(5, 1.0), "y.npz": _results(7, 2.0)})
    b = _sweep(str(tmp_path / "b"), "/new", {"x.npz": _results(5, 3.0), "y.npz": _results(7, 9.0)})
    assert diff.compare(a, b, root_a="/old", root_b="/new") == (2, {}, [])
    assert diff.main([a, b, "--root_a=/old", "--root_b=/new"]) == 0
    assert "2 cells in both; 0 differ" in capsys.readouterr().out
    # Without the roots the cells do not match (their traces' paths differ).
    n, differ, one_sided = diff.compare(a, b)
    assert n == 0 and len(one_sided) == 4


def test_a_changed_number_and_a_missing_cell_are_named(tmp_path, capsys):
    a = _sweep(str(tmp_path / "a"), "/r", {"x.npz": _results(5, 1.0), "y.npz": _results(7, 1.0)})
    b = _sweep(str(tmp_path / "b"), "/r", {"x.npz": _results(6, 1.0)})
    n, differ, one_sided = diff.compare(a, b, root_a="/r", root_b="/r")
    assert n == 1 and list(differ.values()) == [["cache.total.hits"]]
    assert len(one_sided) == 1 and "y.npz" in one_sided[0]
    assert diff.main([a, b, "--root_a=/r", "--root_b=/r"]) == 1
    out = capsys.readouterr().out
    assert "1 differ" in out and "cache.total.hits" in out and "only on one side" in out
    # Ignoring nothing, the wall clock differs too.
    c = _sweep(str(tmp_path / "c"), "/r", {"x.npz": _results(6, 2.0)})
    assert diff.compare(b, c, ignore=(), root_a="/r", root_b="/r")[1] != {}


def test_differences_walks_nested_values():
    assert diff.differences({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}]}) == ["a[1].b"]
    assert diff.differences({"a": 1}, {"a": 1, "c": 2}) == ["c (only in B)"]
    assert diff.differences([1, 2], [1, 2, 3]) == ["<top>"]


def test_a_sweep_written_before_fields_moved_pairs_with_one_written_since(tmp_path):
    """Its overrides (`trace`) and results.json's `config` (`trace`, `trace_request_tokens`,
    `cache.replay_engine`) read by the current names (`replay.trace`, ...)."""
    from moejax.jobs.schema import current_config

    old = {"job": "replay", "trace": "t.npz", "trace_request_tokens": 128,
           "cache": {"slots": 8, "replay_engine": "auto"}}
    a = _sweep(str(tmp_path / "a"), "/r", {"x.npz": {**_results(5, 1.0), "config": old}},
               field="trace")
    b = _sweep(str(tmp_path / "b"), "/r",
               {"x.npz": {**_results(5, 2.0), "config": current_config(old)}})
    assert current_config(old)["replay"]["request_tokens"] == 128
    assert diff.compare(a, b, root_a="/r", root_b="/r") == (1, {}, [])
