"""An eviction policy of your own: the most recently used expert goes first (MRU).

    python -m moejax.main --config=configs/replay.py --config.cache.slots=256 \
        --config.replay.trace=moejax/assets/captures/olmoe_code.jsonl \
        --config.policies.modules=examples/policies/mru.py --config.policies.eviction=mru
"""

from moejax.policies import EvictionPolicy, register


@register("eviction", "mru")
class MRU(EvictionPolicy):
    """Most recently used first: the expert used last is the first to go."""

    def __init__(self):
        self.order = {}  # every resident key, the least recently used first

    def on_admit(self, key, pos, prefetch):
        self.on_access(key, pos)

    def on_access(self, key, pos):
        self.order.pop(key, None)
        self.order[key] = None

    def on_evict(self, key):
        del self.order[key]

    def victim(self, pos, evictable, incoming=None):
        return next((key for key in reversed(self.order) if evictable(key)), None)
