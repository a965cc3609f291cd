"""When the live runtime speculates, and where it checks: the rules of `CachedExperts`'
speculative decode passes (DESIGN.md "Speculative passes"), kept apart from how it runs them so
that the virtual clock's model of the runtime (`moejax.cache.runtime_timing`) follows the very
same rules.

A speculative pass whose check fails re-runs from that layer speculatively up to `RETRIES`
times; past that it goes on layer by layer and the next passes decide layer by layer (1, 2, 4
... up to `BACKOFF_MAX`, reset by a pass whose checks held). Where a pass checks its layers:
`MID_PASS_CHECKS` — "adaptive" checks mid-pass in a pass after one whose residency changed or
whose check failed, and for the rest of a pass once one of its checks failed.
"""

from __future__ import annotations

# Failed checks a speculative pass re-runs speculatively from; past them it goes on layer by
# layer. The most passes then decided layer by layer.
RETRIES = 2
BACKOFF_MAX = 16
MID_PASS_CHECKS = ("adaptive", "always", "never")


class SpeculationSchedule:
    """The state behind those rules: failed checks this pass (`retries`), the passes left to
    decide layer by layer (`skip`) and the next such run's length (`backoff`), and what the
    last pass began with (`mark`: the residency changes and failed checks counted then)."""

    def __init__(self, mid_pass_checks: str = "adaptive"):
        self.mid_pass_checks = mid_pass_checks
        self.retries = 0
        self.backoff = 0
        self.skip = 0
        self.mark: tuple[int, int] | None = None

    def checks_mid_pass(self, changes: int, failed: int) -> bool:
        """Whether the pass beginning now checks mid-pass, given the residency changes
        (`ExpertCache.layer_changes` summed; 0 where a change cannot fail a check) and the
        failed checks counted so far. Asked at every pass's beginning: it keeps the mark."""
        mode = self.mid_pass_checks
        if mode not in MID_PASS_CHECKS:
            raise ValueError(f"mid_pass_checks={mode!r}; known: {MID_PASS_CHECKS}")
        mark = (changes, failed)
        changed, self.mark = mark != self.mark, mark
        return mode == "always" or (mode == "adaptive" and changed)

    def may_start(self) -> bool:
        """Whether a pass that could speculate does (asked once the other conditions hold): not
        while passes are left to decide layer by layer, each asking counting one."""
        if self.skip:
            self.skip -= 1
            return False
        return True

    def start(self) -> None:
        """A speculative pass begins."""
        self.retries = 0

    def failed(self) -> bool:
        """A check failed: True when the pass re-runs speculatively from that layer, False
        when it goes on layer by layer (and the next passes back off)."""
        self.retries += 1
        if self.retries <= RETRIES:
            return True
        self.skip = self.backoff = min(max(1, 2 * self.backoff), BACKOFF_MAX)
        return False

    def held(self) -> None:
        """A speculative pass ended with every check held."""
        self.backoff = 0

    @property
    def eager_after_failure(self) -> bool:
        """Whether the rest of a pass checks mid-pass once one of its checks failed."""
        return self.mid_pass_checks != "never"
