"""Hypothesis strategies for policy specs, drawn from the registry: every registered policy of
a kind, each spec argument drawn from the values its class declares (`ARGS`,
`moejax/policies/declare.py`) or left at its default. A policy or an argument added tomorrow
is fuzzed without editing a test."""

from __future__ import annotations

from hypothesis import strategies as st

from moejax.policies import declare
from moejax.policies.registry import names, policy_class, spec_arguments


def _values(domain: declare.Domain) -> st.SearchStrategy:
    if isinstance(domain, declare.Choice):
        return st.sampled_from(domain.values)
    if isinstance(domain, declare.Ints):
        return st.integers(domain.lo, domain.hi if domain.hi is not None else domain.fuzz_hi)
    if isinstance(domain, declare.Floats):
        # Round numbers, as a user writes them (and as a spec string keeps them exactly).
        steps = 40
        return st.integers(0, steps - (1 if domain.hi_open else 0)).map(
            lambda i: round(domain.lo + (domain.hi - domain.lo) * i / steps, 6))
    if isinstance(domain, declare.Levels):
        pool = domain.pool
        chains = [":".join(pool[i] for i in sorted(c)) for c in _subsets(len(pool))
                  if len(c) >= domain.min_len]
        return st.sampled_from(chains)
    raise TypeError(f"no strategy for the domain {domain!r}")


def _subsets(n: int) -> list[tuple[int, ...]]:
    return [tuple(i for i in range(n) if mask >> i & 1) for mask in range(1, 1 << n)]


def spec(kind: str, name: str) -> st.SearchStrategy[str]:
    """`name(arg=value, ...)` with each argument drawn or left out (its default)."""
    cls = policy_class(kind, name)
    args = list(spec_arguments(cls))

    @st.composite
    def specs(draw):
        given = {}
        for arg in args:
            if draw(st.booleans()):
                given[arg] = draw(_values(cls.ARGS[arg]))
        if not given:
            return name
        return f"{name}({', '.join(f'{k}={v!r}' for k, v in given.items())})"

    return specs()


def any_spec(kind: str, keep=lambda cls: True) -> st.SearchStrategy[str]:
    """A spec of any registered `kind` policy whose class `keep` accepts."""
    chosen = [n for n in names(kind) if keep(policy_class(kind, n))]
    return st.sampled_from(chosen).flatmap(lambda n: spec(kind, n))
