"""The four policy kinds (SpecMD §3) and the capabilities each policy declares.

The cache calls them in this order for every MoE layer of a pass:

routing (may change the selection) -> miss (drop / substitute / fetch) -> eviction (victims
for demand fetches) -> prefetch (experts for the next layers, admitted when a slot is free
or evictable).

Every registered policy subclasses its kind's base class here (the registry checks), so the
cache, the jobs and the registry read a policy's needs from its declared capabilities rather
than probing for attributes:

* `needs_probs`: reads the full router probabilities (`LayerGate.probs`); the live runtime then
  copies them to the host, an id-only trace cannot drive it;
* `needs_spec`: reads the speculative scores (`LayerGate.spec`);
* `needs_future`: reads the trace's future routing, handed over by `set_future` before replay;
* `replay_only`: cannot run live (every policy that needs the future);
* `needs_precision` (eviction): is told the precision each use was served at
  (`on_use_precision`); the cache calls that hook only for policies that declare it.

A class that overrides `set_future`, `on_scores` or `on_use_precision` gets the capabilities
they imply unless its own body declares them (`Policy.INFERRED`); the flags are set on the
class when it is defined, so the registry, the jobs and the cache read them as declared.

Precisions (`moejax/quant/formats.py`, high to low: native, int8, int4, int2). A policy whose
constructor declares `cache_precision` receives the cache's plain precision (`cache.precision`:
what a plain fetch and a prefetch move); a miss policy receives the *given* `cache.precision`,
"" when it was not given, since a precision-aware miss policy's own `levels` then define it.
A miss policy's `levels` are the precisions it may fetch, high to low: the cache keeps one slot
pool per level (`CacheShape.pools`), prefetches at `levels[0]`, and fetches a missing expert at
the precision its `MissDecision.precision` names (`levels[0]` when it names none).

Keys are `(layer, expert)`. Layer *positions* (0..L-1 over the MoE layers) order the pass.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar

import numpy as np

from moejax.policies.declare import Domain, KernelForm
from moejax.seam import Key, LayerGate

__all__ = ["EvictionPolicy", "Key", "LayerGate", "MissDecision", "MissPolicy", "Policy",
           "PrefetchPolicy", "RoutingPolicy", "KINDS"]


class Policy:
    """What every policy declares. Subclasses set `name` (the registry name) and override the
    capability flags they have."""

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    needs_probs: ClassVar[bool] = False
    needs_spec: ClassVar[bool] = False
    needs_future: ClassVar[bool] = False
    replay_only: ClassVar[bool] = False
    needs_precision: ClassVar[bool] = False
    # The values of each spec argument, and what the compiled replay kernel implements of the
    # class (`moejax/policies/declare.py`; `KERNEL` is read from the class's own body only).
    ARGS: ClassVar[dict[str, Domain]] = {}
    KERNEL: ClassVar[KernelForm | None] = None
    # Every spec argument's value, defaults included, as the registry built the policy (None
    # when built without the registry: its compiled form is then unknown).
    arguments: dict | None = None

    # Capabilities a hook implies, set for a class that overrides the hook and does not
    # declare them in its own body (a declaration wins): it reads the future (so it runs in
    # replay only), the router's probabilities, or the precision of each use. What a policy
    # reads of a gate (`needs_probs` for `gate.probs`, `needs_spec`) is not inferred: declare it.
    INFERRED: ClassVar[dict[str, tuple[str, ...]]] = {
        "set_future": ("needs_future", "replay_only"), "on_scores": ("needs_probs",),
        "on_use_precision": ("needs_precision",)}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__module__ != __name__:  # the kinds' base classes define the hooks' defaults
            for hook, flags in Policy.INFERRED.items():
                if hook in cls.__dict__:
                    for flag in flags:
                        if flag not in cls.__dict__:
                            setattr(cls, flag, True)
        if cls.needs_future and not cls.replay_only:
            raise TypeError(f"{cls.__name__} needs the future, so it must be replay_only")

    def kernel_form(self) -> str | None:
        """The compiled replay kernel's form of this policy, or None when it has none for this
        class and these arguments (then the reference engine runs)."""
        declared = type(self).__dict__.get("KERNEL")
        if declared is None or self.arguments is None:
            return None
        return declared.form_of(self, self.arguments)

    def set_future(self, future, cache) -> None:
        """Replay hands the future routing (`moejax.replay.Future`) and the cache to a
        policy that `needs_future`, before the first pass."""
        raise NotImplementedError(f"{type(self).__name__} does not read the future")


class EvictionPolicy(Policy):
    """Chooses victims. The hooks keep the policy's own view of residency and recency; the
    defaults do nothing."""

    kind = "eviction"

    def set_layer_positions(self, pos_of: dict[int, int]) -> None:
        """MoE layer index -> position, once, before the first pass."""
        self.pos_of = dict(pos_of)

    def on_pass_start(self, pass_id: int) -> None:
        pass

    def on_admit(self, key: Key, pos: int, prefetch: bool) -> None:
        """`key` took a slot (a demand fetch or a prefetch) while the pass is at `pos`."""

    def on_access(self, key: Key, pos: int) -> None:
        """`key` was requested (hit, late hit, or just fetched) by the layer at `pos`."""

    def on_touch(self, key: Key, pos: int) -> None:
        """`key`, already resident, was selected by the prefetcher."""

    def on_evict(self, key: Key) -> None:
        """`key` left its slot: evicted, or (an upgrade) about to re-enter at a higher precision
        (then `on_admit` follows; the cache does not count that as an eviction)."""

    def on_use_precision(self, key: Key, precision: str) -> None:
        """`key` was used (after `on_access`) at `precision`, the precision of its resident
        copy. Called only for policies that declare `needs_precision`."""

    def on_scores(self, layer: int, probs: np.ndarray) -> None:
        """Router probabilities `[N, E]` of `layer` in this pass (called when `needs_probs`)."""

    def victim(self, pos: int, evictable: Callable[[Key], bool],
               incoming: Key | None = None) -> Key | None:
        """A resident key to evict, while the layer at `pos` runs, to make room for `incoming`;
        `evictable(key)` says whether a key may go (not pinned by the running layer's wave, nor
        selected by the same prefetch call; an in-flight key may go, its slot being reused
        once its transfer lands). None if nothing may."""
        raise NotImplementedError

    def may_take_free(self, incoming: Key, evictable: Callable[[Key], bool]) -> bool:
        """Whether `incoming` may take a free slot. The cache asks before it takes one; when
        the answer is False it asks `victim` instead (with the same `evictable`), so a policy
        answers False only where its `victim` has a key to give. Default: always (a free slot
        first, for every policy but a strict per-layer quota)."""
        return True


class PrefetchPolicy(Policy):
    kind = "prefetch"
    lookahead: int = 0  # MoE layers ahead it predicts (0: none)

    def predict(self, gate: LayerGate) -> list[tuple[int, list[int]]]:
        """`[(layer, experts in priority order), ...]` to prefetch for the layers ahead."""
        raise NotImplementedError


@dataclasses.dataclass
class MissDecision:
    """What the miss policy made of a layer's selection: the (possibly edited) ids and weights
    the experts step runs, and the experts dropped or substituted."""

    ids: np.ndarray  # [N, K]
    weights: np.ndarray  # [N, K]
    active: np.ndarray  # [N, K] bool: contributions that run (dropped ones do not)
    dropped: int = 0  # distinct experts dropped
    substituted: int = 0  # distinct experts replaced
    # Expert -> the precision to fetch it at if it misses (or to upgrade to, see
    # `MissPolicy.upgrade`); experts not named (and all when None) want `levels[0]`.
    precision: dict[int, str] | None = None
    # Missing experts computed on the host from its copy (at the plain precision) instead of
    # fetched: their contributions stay `active` (they run), but take no slot and no transfer
    # (`moejax/cache/host_path.py`). Only a policy that declares `computes_on_host` names any.
    host: frozenset[int] = frozenset()


class MissPolicy(Policy):
    """Decides what runs of a layer's selection, and at which precision a miss is fetched.

    * `levels`: the precisions it may fetch, high to low (default: the plain precision only);
    * `upgrade`: an expert wanted at a higher precision than its resident copy is fetched again
      at the wanted one, its low copy's slot freed (True), or served by the low copy (False,
      counted `served_below_wanted`);
    * `fallback`: when the wanted precision's pool has no room left for the running wave (its
      slots all held by the wave), fetch at the next lower level that has room instead of
      splitting the wave (SpecMD's "fallback levels ... under capacity constraints");
    * `computes_on_host`: may name experts to compute on the host (`MissDecision.host`); the
      cache then needs a host model (`moejax/cache/host_path.py`) and hands the policy its
      layer planner (`set_planner`) before the first pass."""

    kind = "miss"
    levels: tuple[str, ...] = ("native",)
    upgrade: bool = False
    fallback: ClassVar[bool] = False
    computes_on_host: ClassVar[bool] = False

    def set_planner(self, planner) -> None:
        """The cache's `moejax.cache.host_path.LayerPlanner`, handed once to a policy that
        `computes_on_host`: its `plan(layer, ids, active)` is the running layer's modelled end
        for any choice of host experts."""

    def _set_levels(self, precision: str, levels=None) -> None:
        """`levels` given: checked and parsed (and `precision`, when given, must be the
        first); else the plain precision alone."""
        from moejax.quant import formats

        if precision:
            formats.check(precision, "cache.precision")
        if levels is None:
            self.levels = (precision or "native",)
            return
        self.levels = formats.parse_levels(levels, f"{self.name} levels")
        if precision and self.levels[0] != precision:
            raise ValueError(f"levels={levels!r} start at {self.levels[0]}, but "
                             f"cache.precision={precision} (what a plain fetch and a prefetch "
                             "move: the first level). Leave cache.precision unset or make "
                             "the levels start with it")

    def handle(self, gate: LayerGate, ids: np.ndarray, weights: np.ndarray,
               resident: set[int]) -> MissDecision:
        """`resident`: experts of this layer resident or in flight now."""
        raise NotImplementedError


class RoutingPolicy(Policy):
    kind = "routing"

    def select(self, gate: LayerGate, cached: set[int]) -> tuple[np.ndarray, np.ndarray | None]:
        """`(ids, weights)` the layer runs, given the experts of this layer in the cache."""
        raise NotImplementedError


KINDS: dict[str, type[Policy]] = {c.kind: c for c in (EvictionPolicy, PrefetchPolicy,
                                                       MissPolicy, RoutingPolicy)}
