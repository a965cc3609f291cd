"""The per-layer cache table's columns say what they count, in the words of the line under it
(issue 39): a hit is ready (its expert was resident) or late (it waited for its transfer); the
table has a column of each, and the line's hit rate is their sum, named by the same words.

The counts are those of `tests/test_cache_unit.py`'s prefetch example, worked out by hand
there: MoE layers 1, 3, 5, four slots, top-k prefetch of the next layer, two passes."""

from __future__ import annotations

from moejax.cache import summary
from tests.test_cache_unit import T, make_cache, make_gate, run_layer

TO3 = [0, 0, .5, .4, .1, 0]  # predicts layer 3 needs [2, 3]
TO5 = [.3, 0, 0, 0, .5, .2]  # predicts layer 5 needs [4, 0] (it will need [4, 5])


def _two_passes():
    cache = make_cache(4, prefetch="topk", layers=(1, 3, 5), num_layers=6)
    cache.begin_pass("decode", 1, 1)  # cold: layer 3 two late hits, layer 5 one (and a miss)
    run_layer(cache, make_gate(1, [[0, 1]], 3, TO3))
    run_layer(cache, make_gate(3, [[2, 3]], 5, TO5))
    run_layer(cache, make_gate(5, [[4, 5]]))
    cache.end_pass()
    cache.begin_pass("decode", 1, 2)  # compute time first: layer 3 two ready hits
    run_layer(cache, make_gate(1, [[0, 1]], 3, TO3))
    cache.clock.compute(5 * T)  # layer 1's experts and layer 3's attention, as there
    run_layer(cache, make_gate(3, [[2, 3]], 5, [0, 0, 0, 0, .3, .6]))
    run_layer(cache, make_gate(5, [[4, 5]]))  # two late hits
    cache.end_pass()
    return cache


def test_the_table_has_a_ready_and_a_late_column_and_the_line_sums_them():
    text = summary.table(_two_passes().metrics, "header")
    lines = text.splitlines()
    head = lines[1].split()
    assert head[:5] == ["layer", "req", "ready", "late", "miss"], head
    assert "hit" not in head  # no column whose name hides which hits it counts
    rows = {line.split()[0]: dict(zip(head, line.split())) for line in lines[2:6]}
    # Per layer (requests, ready, late, miss), by hand.
    want = {"1": ("4", "0", "0", "4"), "3": ("4", "2", "2", "0"), "5": ("4", "0", "3", "1"),
            "all": ("12", "2", "5", "5")}
    for layer, (req, ready, late, miss) in want.items():
        assert (rows[layer]["req"], rows[layer]["ready"], rows[layer]["late"],
                rows[layer]["miss"]) == (req, ready, late, miss), rows[layer]
    # The line names the same two kinds, and its hit rate is their sum: 7/12 = 2/12 + 5/12.
    assert lines[6].startswith("hit rate 58.3% = ready 16.7% + late 41.7%, "), lines[6]
