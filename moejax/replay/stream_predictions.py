"""The predictions of the prefetchers whose choice is a function of the request stream alone,
taken for the whole stream at once in numpy instead of from the policy object gate by gate in
Python (`compiled.stepped_predictions`): `oracle`, the target layer's requests in the same
pass, `temporal`, the target layer's requests in the previous pass, and `noisy_oracle`, the
oracle's perturbed by the policy's own `perturbed_groups` (numpy's seeded draws, compiled).
Gate by gate, a prefetching replay of a million requests spent seconds in Python before its
kernel ran (`benchmarks/replay_limit.py`); here it is a few array operations and one compiled
loop.

The same groups, in the same order, as `compiled.stepped_predictions` builds from `predict`:
per pass-layer, the targets `lookahead` MoE layers on (those the model has), each with the
target's requests in rank order — the compiled engine's own request arrays,
`keys[starts[pl]:starts[pl + 1]]`. Taken only where that equality is structural, and checked
(`tests/test_compiled_replay.py`, random traces against the policy stepped gate by gate):
- the exact class (a subclass may answer otherwise: `noisy_oracle` is an oracle that
  perturbs its answer, taken here as itself);
- the policy in its first state (a temporal prefetcher that saw nothing yet) and the cache
  before its first pass;
- every trace with the cache's MoE layers, in increasing order.
Anything else is stepped gate by gate: this fails closed. A temporal prefetcher is left as
stepping would leave it (each layer's last requests); an oracle's future is not set (it is set
anew before any replay that steps it).
"""

from __future__ import annotations

import numpy as np

from moejax.policies.prefetch import NoisyOraclePrefetch, OraclePrefetch, TemporalPrefetch


def stream_predictions(cache, traces, keys: np.ndarray, starts: np.ndarray) -> tuple | None:
    """`compiled.stepped_predictions`'s `(grp_off, grp_target, grp_start, experts)` for the
    cache's prefetcher over `traces`' requests (`keys`, `starts`: `compiled.requests`), or
    None where this module does not take them (the module's docstring)."""
    prefetch = cache.prefetch
    layers = list(cache.shape.layers)
    if type(prefetch) in (OraclePrefetch, NoisyOraclePrefetch):
        back = 0  # the target's requests in the same pass
    elif type(prefetch) is TemporalPrefetch and not prefetch.last and not prefetch.order:
        back = 1  # in the previous pass
    else:
        return None
    if (cache.pass_id != -1 or layers != sorted(set(layers))
            or any(list(t.layers) != layers for t in traces)):
        return None
    n_layers, n_experts, ahead = len(layers), cache.shape.num_experts, prefetch.lookahead
    n_pl = len(starts) - 1
    pos = np.arange(n_pl, dtype=np.int64) % n_layers
    # Groups per pass-layer: one per target layer ahead that the model has; none in a
    # temporal prefetcher's first pass (no layer after the gate's was seen yet).
    count = np.minimum(ahead, n_layers - 1 - pos)
    if back:
        count[:n_layers] = 0
    grp_off = np.zeros(n_pl + 1, np.int64)
    np.cumsum(count, out=grp_off[1:])
    n_groups = int(grp_off[-1])
    of = np.repeat(np.arange(n_pl, dtype=np.int64), count)  # each group's pass-layer
    step = np.arange(n_groups, dtype=np.int64) - grp_off[:-1][of] + 1  # 1..lookahead
    target = pos[of] + step
    source = of + step - back * n_layers  # the pass-layer whose requests it predicts
    sizes = starts[source + 1] - starts[source]
    grp_start = np.zeros(n_groups + 1, np.int64)
    np.cumsum(sizes, out=grp_start[1:])
    at = np.repeat(starts[source] - grp_start[:-1], sizes) + np.arange(grp_start[-1])
    experts = keys[at].astype(np.int64) - np.repeat(target * n_experts, sizes)
    if type(prefetch) is NoisyOraclePrefetch:  # each group as the policy perturbs it
        experts = prefetch.perturbed_groups(of // n_layers,
                                            np.asarray(layers, np.int64)[target], experts,
                                            grp_start)
    if back:  # as stepping leaves it: each layer's requests in the last pass
        last = n_pl - n_layers
        prefetch.last = {layer: (keys[starts[last + i]:starts[last + i + 1]]
                                 - i * n_experts).tolist()
                         for i, layer in enumerate(layers)} if n_pl else {}
        prefetch.order = list(layers) if n_pl else []
    return grp_off, target, grp_start, experts
