"""What the jobs share: a decoder over the configured expert source, and the cache's report.

Every job that runs the model builds its `SteppedDecoder` with `make_decoder` (so `model.*`
options mean the same everywhere), and every job that ran an expert cache closes it with
`report_cache` (so results.json's `cache` section, the TensorBoard series and the printed
table are the same everywhere: generate, perplexity and replay).
"""

from __future__ import annotations

import contextlib

import ml_collections
import numpy as np

from moejax.cache import summary
from moejax.cache.expert_cache import ExpertCache
from moejax.metrics_writer import MetricsWriter
from moejax.model_source import LoadedModel
from moejax.models.stepped import SteppedDecoder
from moejax.policies import presets
from moejax.seam import ExpertSource
from moejax.serving.build import expert_source, resident_precision
from moejax.serving.runtime import CachedExperts
from moejax.tokenizer import ByteTokenizer, Tokenizer


def progress(enabled: bool, total: int, desc: str, unit: str = "tok"):
    """A tqdm bar the job updates (None, in a null context, when `log.progress` is off)."""
    if not enabled:
        return contextlib.nullcontext(None)
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=False)


def scored_bytes(tokenizer: Tokenizer, ids: np.ndarray) -> int:
    """UTF-8 bytes of `ids[1:]`, the tokens a sequence scores (its first is context only):
    the denominator of bits per byte."""
    if isinstance(tokenizer, ByteTokenizer):
        return len(ids) - 1
    return len(tokenizer.decode(np.asarray(ids[1:]).tolist()).encode("utf-8"))


def make_decoder(config: ml_collections.ConfigDict, loaded: LoadedModel, experts: ExpertSource,
                 *, max_len: int, batch: int = 1, gate_observers=(),
                 pass_observers=()) -> SteppedDecoder:
    """A decoder of `loaded.model` over `experts`, with the config's `model.*` options."""
    m = config.model
    return SteppedDecoder(loaded.model, experts, max_len=max_len, batch=batch,
                          lookahead=m.lookahead, gmm_impl=m.gmm_impl, gate_path=m.gate_path,
                          gate_observers=tuple(gate_observers),
                          pass_observers=tuple(pass_observers))


def configured_decoder(config: ml_collections.ConfigDict, loaded: LoadedModel, *, max_len: int,
                       batch: int = 1) -> tuple[ExpertSource, SteppedDecoder]:
    """The configured expert source (the cache runtime, or every expert resident when
    `cache.enabled` is False) and a decoder over it."""
    experts = expert_source(config, loaded)
    return experts, make_decoder(config, loaded, experts, max_len=max_len, batch=batch)


def cache_of(experts: ExpertSource) -> ExpertCache | None:
    """The expert cache behind a source, None when every expert is resident."""
    return experts.cache if isinstance(experts, CachedExperts) else None


def settle(cache: ExpertCache) -> ExpertCache:
    """`cache` with every finished pass's decisions taken: the live runtime may still hold the
    last ones (a complete cache takes a pass's decisions while the next pass runs,
    `CachedExperts.sync`). Whoever reads a cache's metrics or clock calls this first."""
    sync = getattr(cache.sink, "sync", None)
    if sync is not None:
        sync()
    return cache


def experts_precision(config: ml_collections.ConfigDict, experts: ExpertSource) -> str:
    """The precision the experts run at: every resident expert's (`cache.enabled` False), or
    the cache's plain precision (its pools, in results.json's `cache` section, say the rest)."""
    cache = cache_of(experts)
    return cache.shape.precision if cache is not None else resident_precision(config)


def cache_header(config: ml_collections.ConfigDict, cache: ExpertCache,
                 policies: dict | None = None) -> str:
    """One line naming the cache's size, policies, hardware and clock (above the table)."""
    hw, s = cache.clock.hw, cache.shape
    p = policies or presets.resolve(config.policies)
    if len(s.pools) == 1:
        slots = (f"{s.num_slots}/{s.total_experts} expert slots at {s.precision} "
                 f"({100 * s.num_slots / s.total_experts:.1f}% of the experts)")
    else:
        slots = " + ".join(f"{pool.num_slots} {pool.precision}" for pool in s.pools) + \
            f" slots for {s.total_experts} experts"
    return (f"cache: {slots}, eviction {p['eviction']}, prefetch "
            f"{p['prefetch']}, miss {p['miss']}, routing {p['routing']}; {hw.name} at "
            f"{hw.h2d_gbps:g} GB/s host->device, {cache.clock.kind} clock")


def report_cache(config: ml_collections.ConfigDict, cache: ExpertCache, workdir: str, *,
                 passes: bool = True, expert_bytes_known: bool = True,
                 policies: dict | None = None) -> dict:
    """Ends the run (unused prefetches become wasted bytes), writes the TensorBoard series
    when `log.tensorboard`, and returns results.json's `cache` section. `policies`: what ran
    (`presets.report`), when the job adjusted the config's choice. Unknown expert bytes leave
    every byte and time value out (counts stay exact)."""
    settle(cache)
    cache.finish()
    if config.log.tensorboard:
        writer = MetricsWriter(workdir)
        summary.write_tensorboard(writer, cache.metrics, bytes_known=expert_bytes_known)
        writer.close()
    return summary.cache_results(cache, policies or presets.report(config.policies),
                                passes=passes, expert_bytes_known=expert_bytes_known)
