"""What the jobs that run the model share: a decoder over the configured expert source
(`make_decoder`, so `model.*` options mean the same everywhere), the cache behind it, the XLA
compiles a timed phase saw, and the checks of a text file a job scores (`check_text_file`).
The cache's report every job ends with is `cache_report`'s (no JAX there).
"""

from __future__ import annotations

import contextlib
import re

import jax.monitoring
import numpy as np

from moejax import cli
from moejax.cache import ExpertCache
from moejax.errors import ConfigError
from moejax.model_source import LoadedModel
from moejax.models import SteppedDecoder
from moejax.run_spec import RunSpec
from moejax.seam import ExpertSource
from moejax.serving.build import expert_source, resident_precision
from moejax.serving.runtime import CachedExperts
from moejax.tokenizer import ByteTokenizer, Tokenizer

# A text file with more than this share of its bytes not text (not valid UTF-8, or control
# characters other than whitespace) is refused: its score would be the score of noise. Below
# it, a warning says the share (a Latin-1 file's accented letters, a stray binary line).
NOT_TEXT_LIMIT = 0.10
# Control characters that are not text: C0 but tab, newline, vertical tab, form feed, carriage
# return; DEL; C1. Invalid UTF-8 bytes decode (surrogateescape) to U+DC80..U+DCFF, one each.
_CONTROL = re.compile("[\x00-\x08\x0e-\x1f\x7f]")
_C1 = re.compile("[\x80-\x9f]")  # two bytes each in UTF-8
_INVALID = re.compile("[\udc80-\udcff]")


# jax's event for one executable built (jax/_src/dispatch.py, BACKEND_COMPILE_EVENT): an
# XLA compile, or its read from jax's persistent compilation cache when one is set (the event
# wraps both); a call that jit's in-memory cache answers records none.
XLA_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class XlaCompiles:
    """The XLA compiles (or persistent-cache reads) made while a `xla_compiles()` block ran:
    how many, and their seconds (this machine's wall clock, as jax measures them; tracing and
    lowering, which come before each, are not in them)."""

    def __init__(self):
        self.count, self.seconds = 0, 0.0

    def __call__(self, event: str, duration: float, **_) -> None:
        if event == XLA_COMPILE_EVENT:
            self.count += 1
            self.seconds += duration


@contextlib.contextmanager
def xla_compiles():
    """Counts the XLA compiles made in the block (`XlaCompiles`), from jax's own events: what
    tells a timed phase that a compile fell inside it."""
    seen = XlaCompiles()
    jax.monitoring.register_event_duration_secs_listener(seen)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(seen)


def not_text_share(data: bytes) -> float:
    """The share of `data`'s bytes that are not text: bytes that are not valid UTF-8, and
    control characters other than whitespace."""
    if not data:
        return 0.0
    text = data.decode("utf-8", "surrogateescape")
    bad = (len(_INVALID.findall(text)) + len(_CONTROL.findall(text))
           + 2 * len(_C1.findall(text)))
    return bad / len(data)


def check_windows(section: str, window: int, stride: int, max_tokens: int) -> None:
    """The windows a text is scored in (the perplexity job's `perplexity.*`, the eval job's
    heldout task's `eval.*`): `window` tokens advanced by `stride`, at most `max_tokens`."""
    if window < 2:
        raise ConfigError(f"{section}.window={window} must be >= 2")
    if not 1 <= stride <= window - 1:
        raise ConfigError(f"{section}.stride={stride} must be in 1..{section}.window-1="
                          f"{window - 1}")
    if max_tokens < 0:
        raise ConfigError(f"{section}.max_tokens={max_tokens} must be >= 0 (0: all)")


def check_text_file(path: str, field: str) -> None:
    """`ConfigError` naming the field (`perplexity.text_file`), `path` and the share when more
    than `NOT_TEXT_LIMIT` of its bytes are not text; a warning when some are (they are scored
    as U+FFFD)."""
    with open(path, "rb") as f:
        data = f.read()
    share = not_text_share(data)
    what = (f"{field}={path!r}: {100 * share:.1f}% of its {len(data)} bytes are not text "
            "(invalid UTF-8 or control characters)")
    if share > NOT_TEXT_LIMIT:
        raise ConfigError(f"{what}, above the {100 * NOT_TEXT_LIMIT:g}% a text file may have: "
                          "give a UTF-8 text file")
    if share > 0:
        cli.warn(f"{what}; they are scored as the replacement character U+FFFD")


def scored_bytes(tokenizer: Tokenizer, ids: np.ndarray) -> int:
    """UTF-8 bytes of `ids[1:]`, the tokens a sequence scores (its first is context only):
    the denominator of bits per byte."""
    if isinstance(tokenizer, ByteTokenizer):
        return len(ids) - 1
    return len(tokenizer.decode(np.asarray(ids[1:]).tolist()).encode("utf-8"))


def make_decoder(run: RunSpec, loaded: LoadedModel, experts: ExpertSource, *, max_len: int,
                 batch: int = 1, gate_observers=(), pass_observers=()) -> SteppedDecoder:
    """A decoder of `loaded.model` over `experts`, with the run's `model.*` options."""
    m = run.model
    return SteppedDecoder(loaded.model, experts, max_len=max_len, batch=batch,
                          lookahead=m.lookahead, gmm_impl=m.gmm_impl, gate_path=m.gate_path,
                          gate_observers=tuple(gate_observers),
                          pass_observers=tuple(pass_observers))


def configured_decoder(run: RunSpec, loaded: LoadedModel, *, max_len: int,
                       batch: int = 1) -> tuple[ExpertSource, SteppedDecoder]:
    """The run's expert source (the cache runtime, or every expert resident when
    `cache.enabled` is False) and a decoder over it."""
    experts = expert_source(run, loaded)
    if isinstance(experts, CachedExperts):
        experts.speculate = run.cache.speculate
        experts.read_host_copies = run.cache.speculate_from_host
    return experts, make_decoder(run, loaded, experts, max_len=max_len, batch=batch)


def cache_of(experts: ExpertSource) -> ExpertCache | None:
    """The expert cache behind a source, None when every expert is resident."""
    return experts.cache if isinstance(experts, CachedExperts) else None


def experts_precision(run: RunSpec, experts: ExpertSource) -> str:
    """The precision the experts run at: every resident expert's (`cache.enabled` False), or
    the cache's plain precision (its pools, in results.json's `cache` section, say the rest)."""
    cache = cache_of(experts)
    return cache.shape.precision if cache is not None else resident_precision(run)
