"""The cache's bookkeeping invariants (DESIGN.md "Invariants"), as checks both replay engines'
outputs are held to: the reference's after every pass (`tests/test_policy_space.py`), the
compiled engine's over its per-pass running totals and final state
(`tests/test_compiled_replay.py`)."""

from __future__ import annotations


def check_row(row: dict) -> None:
    """One layer's counters, or the totals."""
    assert row["hits"] + row["late_hits"] + row["misses"] == row["requests"], row
    assert row["collision_misses"] <= row["misses"], row
    assert row["prefetch_used"] <= row["prefetch_issued"], row
    assert row["recall_served"] <= row["recall_requests"], row
    assert row["predicted_routed"] <= min(row["predicted"], row["routed"]), row
    assert row["upgrades"] <= row["misses"], row
    # Host compute: misses that moved no weights, and contributions the host computed.
    assert row["host_computed"] + row["upgrades"] <= row["misses"], row
    assert row["host_products"] <= row["products"], row
    if "stall_behind_prefetch_s" in row:  # (snapshots carry counts only)
        assert 0.0 <= row["stall_behind_prefetch_s"] <= row["stall_s"] + 1e-12, row
        if not row["misses"]:  # only a wave with a demand fetch waits behind prefetches
            assert row["stall_behind_prefetch_s"] == 0.0, row


def check_totals(totals: dict, expert_bytes: int | None = None) -> None:
    """Running totals (a snapshot, or `CacheMetrics.totals()`); `expert_bytes` of the one pool
    when the cache has one (demand bytes are then misses times it)."""
    check_row(totals)
    assert totals["h2d_bytes"] == totals["demand_bytes"] + totals["prefetch_bytes"]
    if expert_bytes is not None:  # (a miss computed on the host fetched nothing)
        assert totals["demand_bytes"] == (totals["misses"] - totals["host_computed"]) * \
            expert_bytes
        assert totals["prefetch_bytes"] == totals["prefetch_issued"] * expert_bytes


def check_final(cache) -> None:
    """After a replay: every layer's counters, the totals, the slots' bookkeeping and budget
    (`ExpertCache.check_invariants`), wasted prefetch bytes within the prefetched."""
    one_pool = len(cache.shape.pools) == 1
    for row in cache.metrics.layer_table():
        check_row(row)
    t = cache.metrics.totals()
    check_totals(t, cache.shape.expert_bytes if one_pool else None)
    assert sum(t["requests_by_precision"].values()) == t["requests"]
    assert sum(t["products_by_precision"].values()) == t["products"]
    assert sum(t["h2d_bytes_by_precision"].values()) == t["h2d_bytes"]
    assert t["wasted_prefetch_bytes"] <= t["prefetch_bytes"]
    assert not cache.queue, "the watchdog queue outlived its pass"
    cache.check_invariants()
