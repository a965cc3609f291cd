"""What a policy class declares about itself besides its code.

* `ARGS` — the values each of its spec arguments takes (`Choice`, `Ints`, `Floats`,
  `Levels`): the registry checks that every constructor argument a spec can give has one, and
  refuses a given value of the wrong kind (`Domain.refuses`) before the constructor sees it,
  naming the argument and what it takes (`Domain.takes`); the docs list them, and the
  equality fuzzer (`tests/test_compiled_replay.py`) draws every policy's arguments from
  them, so a new argument is fuzzed the day it is added.
* `KERNEL` — what the compiled replay kernel (`moejax/replay/kernel.py`) implements of it: a
  `KernelForm` naming the kernel's form of the policy and, for each spec argument, the values
  the kernel handles. Fail closed: a class that declares no `KERNEL` in its own body (a
  subclass inherits nothing), a spec argument the form does not name, a value outside the
  named ones, or a policy built without the registry (its arguments unknown) all run on the
  reference engine (`moejax/replay/coverage.py` says which and why).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping


class Domain:
    """The values a policy argument takes (`contains`: whether `value` is one of them; the
    registry's tests hold every default to its domain)."""

    def contains(self, value: Any) -> bool:
        raise NotImplementedError

    def refuses(self, value: Any) -> bool:
        """Whether the registry refuses `value` before the constructor sees it: a value of
        the wrong kind (a string for a number), or outside a range that is the argument's
        meaning. A range the fuzzer merely draws from (`Floats`) is the constructor's to
        check, not this."""
        return not self.contains(value)

    def takes(self) -> str:
        """What the argument takes, in words, for the message that refuses a value."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Choice(Domain):
    values: tuple

    def contains(self, value):
        return any(value == v and type(value) is type(v) for v in self.values)

    def takes(self):
        return "one of " + ", ".join(repr(v) for v in self.values)


@dataclasses.dataclass(frozen=True)
class Ints(Domain):
    """Integers in `[lo, hi]` (`hi` None: unbounded; the fuzzer draws up to `fuzz_hi`)."""

    lo: int
    hi: int | None = None
    fuzz_hi: int = 4

    def contains(self, value):
        return (isinstance(value, int) and not isinstance(value, bool) and value >= self.lo
                and (self.hi is None or value <= self.hi))

    def takes(self):
        return (f"an integer >= {self.lo}" if self.hi is None
                else f"an integer from {self.lo} to {self.hi}")


@dataclasses.dataclass(frozen=True)
class Floats(Domain):
    """Numbers in `[lo, hi]` (`hi_open`: `[lo, hi)`): the values the fuzzer draws. Some of
    these ranges are narrower than what the argument means (`topk`'s `overfetch` takes any
    positive number), so what the registry refuses is the argument's meaning, declared apart:
    `at_least` / `above` (a lower bound, inclusive / exclusive) and `at_most` / `below` (an
    upper one), each None for unbounded; and always a value that is not a finite number. The
    bounds are checked wherever a spec is (`registry.check`), so a sweep refuses
    `score_percentile(p=150)` at its launch, not in its cell; the constructor checks them
    again for a policy built by hand."""

    lo: float
    hi: float
    hi_open: bool = False
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    below: float | None = None

    def contains(self, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return self.lo <= value and (value < self.hi if self.hi_open else value <= self.hi)

    def refuses(self, value):
        # `not v - v == 0`: inf and nan (a spec may give `1e999`, a literal inf).
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not value - value == 0):
            return True
        return ((self.at_least is not None and value < self.at_least)
                or (self.above is not None and value <= self.above)
                or (self.at_most is not None and value > self.at_most)
                or (self.below is not None and value >= self.below))

    def takes(self):
        low = (f"[{self.at_least:g}" if self.at_least is not None
               else f"({self.above:g}" if self.above is not None else None)
        high = (f"{self.at_most:g}]" if self.at_most is not None
                else f"{self.below:g})" if self.below is not None else None)
        if low and high:
            return f"a number in {low}, {high}"
        if low:
            return f"a number {'>=' if low[0] == '[' else '>'} {low[1:]}"
        if high:
            return f"a number {'<=' if high[-1] == ']' else '<'} {high[:-1]}"
        return "a finite number"


@dataclasses.dataclass(frozen=True)
class Levels(Domain):
    """Precision levels, high to low, `"int8:int4"`: at least `min_len` of `pool` in order
    (`optional`: or None, the policy's default levels)."""

    pool: tuple[str, ...] = ("native", "int8", "int4", "int2")
    min_len: int = 1
    optional: bool = False

    def contains(self, value):
        if value is None:
            return self.optional
        if not isinstance(value, str):
            return False
        items = value.split(":")
        ranks = [self.pool.index(p) for p in items if p in self.pool]
        return (len(ranks) == len(items) >= self.min_len
                and all(a < b for a, b in zip(ranks, ranks[1:])))

    def refuses(self, value):
        # Only the kind: the constructor parses the levels (`formats.parse_levels`, which
        # also takes SpecMD's "int8:4") and says what is wrong with them.
        return not (isinstance(value, str) or (value is None and self.optional))

    def takes(self):
        return (f"precisions from high to low joined by ':' (of {', '.join(self.pool)}), "
                f"e.g. {':'.join(self.pool[1:])!r}")


ANY = None  # a KernelForm argument the kernel handles whatever its value


@dataclasses.dataclass(frozen=True)
class KernelForm:
    """What the compiled replay kernel implements of a policy class: its `form` (the kernel's
    name for it, or a function of the built policy giving one) for argument values in `args`
    (argument -> the values handled, or `ANY`). An argument the class takes that is not a key
    of `args` makes every policy of the class uncovered."""

    form: str | Callable[[Any], str]
    args: Mapping[str, tuple | None] = dataclasses.field(default_factory=dict)

    def form_of(self, policy, arguments: Mapping[str, Any]) -> str | None:
        """The kernel form of `policy` built with `arguments` (every spec argument with its
        value, defaults included), or None where this declaration does not cover them."""
        if set(arguments) != set(self.args):
            return None
        for name, allowed in self.args.items():
            if allowed is not ANY and not Choice(tuple(allowed)).contains(arguments[name]):
                return None
        return self.form(policy) if callable(self.form) else self.form
