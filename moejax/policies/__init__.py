"""Eviction, prefetch, miss and routing policies, chosen by spec strings (see `registry`)."""

from moejax.policies import eviction, miss, prefetch, routing  # noqa: F401  (registration)
from moejax.policies.registry import build, names, parse

__all__ = ["build", "names", "parse"]
