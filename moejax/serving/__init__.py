"""The live runtime, in JAX: the device slot pools holding real expert bytes (`slot_pool.py`),
`CachedExperts`, the `ExpertSource` the stepped decoder asks for each layer's experts
(`runtime.py`), the host-memory store a host tier reads into (`host_store.py`), and what builds
them for a loaded model (`build.py`). What to load and evict is the cache's (`moejax.cache`)."""

from moejax.serving.build import build_cached_experts, expert_source, resident_precision
from moejax.serving.host_store import HostExperts, expert_templates
from moejax.serving.runtime import CachedExperts
from moejax.serving.slot_pool import SlotPool, SlotPools

__all__ = ["CachedExperts", "HostExperts", "SlotPool", "SlotPools", "build_cached_experts",
           "expert_source", "expert_templates", "resident_precision"]
