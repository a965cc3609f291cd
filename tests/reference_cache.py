"""From-scratch reference caches over a flat request stream, written independently of
`moejax.cache` so that tests can compare the real replay against the textbook definitions:
one global cache of `slots` keys, demand fetch, every request in order."""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, Sequence


def lru_hits(requests: Sequence[Hashable], slots: int) -> int:
    """Hits of least-recently-used replacement."""
    cache: OrderedDict = OrderedDict()
    hits = 0
    for key in requests:
        if key in cache:
            hits += 1
            cache.move_to_end(key)
            continue
        if len(cache) >= slots:
            cache.popitem(last=False)
        cache[key] = None
    return hits


def min_hits(requests: Sequence[Hashable], slots: int) -> int:
    """Hits of Belady's MIN: evict the key whose next use is furthest (never used again
    first; ties broken by the smallest key)."""
    uses: dict = {}
    for t, key in enumerate(requests):
        uses.setdefault(key, []).append(t)
    cache, seen, hits = set(), {k: 0 for k in uses}, 0
    for key in requests:
        seen[key] += 1
        if key in cache:
            hits += 1
            continue
        if len(cache) >= slots:
            def next_use(k):
                u = uses[k]
                return u[seen[k]] if seen[k] < len(u) else float("inf")
            cache.remove(max(sorted(cache), key=next_use))
        cache.add(key)
    return hits
