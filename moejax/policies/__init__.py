"""The four policy kinds of the expert cache (SpecMD §3), chosen by spec strings
(`"least_stale(order=cyclic)"`) from one registry: eviction, prefetch, miss, routing
(`eviction.py` ... `routing.py`), their base classes and capabilities (`base.py`), what each
class declares about its arguments and its compiled form (`declare.py`), and SpecMD's Table 2
combinations (`presets.py`)."""

from moejax.policies import (  # noqa: F401 (registration)
    arc,
    cooccurrence,
    eviction,
    miss,
    prefetch,
    presets,
    routing,
    s3fifo,
)
from moejax.policies.base import (
    KINDS,
    EvictionPolicy,
    MissDecision,
    MissPolicy,
    Policy,
    PrefetchPolicy,
    RoutingPolicy,
)
from moejax.policies.registry import (
    build,
    check,
    names,
    parse,
    policy_class,
    register,
    spec_arguments,
)

__all__ = ["KINDS", "EvictionPolicy", "MissDecision", "MissPolicy", "Policy", "PrefetchPolicy",
           "RoutingPolicy", "build", "check", "names", "parse", "policy_class", "presets", "register",
           "spec_arguments"]
