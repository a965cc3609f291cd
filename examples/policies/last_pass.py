"""A prefetcher of your own: each MoE layer's experts of the previous pass, fetched while the
layer before it runs (the built-in `temporal`, written short: the same numbers).

    python -m moejax.main --config=configs/replay.py --config.cache.slots=256 \
        --config.replay.trace=moejax/assets/captures/olmoe_code.jsonl \
        --config.policies.modules=examples/policies/last_pass.py --config.policies.prefetch=last_pass
"""

from moejax.policies import PrefetchPolicy, register
from moejax.seam import requests_in_rank_order


@register("prefetch", "last_pass")
class LastPass(PrefetchPolicy):
    """The next MoE layer's experts of the previous pass."""

    lookahead = 1  # it predicts one MoE layer ahead

    def __init__(self):
        self.layers = []  # the MoE layers seen so far, in order
        self.used = {}  # layer -> its experts in the last pass, in router-rank order

    def predict(self, gate):
        if gate.layer not in self.layers:
            self.layers = sorted([*self.layers, gate.layer])
        self.used[gate.layer] = requests_in_rank_order(gate.ids)
        after = self.layers[self.layers.index(gate.layer) + 1:][:1]
        return [(layer, self.used[layer]) for layer in after if layer in self.used]
