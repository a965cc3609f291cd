"""What every job that ran an expert cache ends with: the cache's report (results.json's `cache`
section, the TensorBoard series, the printed table under a header naming the cache's size,
policies, hardware and clock), and the lines every job prints (a progress bar, where the results
went). No JAX here: the replay and curve jobs, which never run the model, import only this.

What they print says what each number is: every speed names its clock (`summary.clock_words`,
`summary.WALL_CLOCK`), every capacity percentage what it is a share of (`cache_header`), and
every job ends with the line `results -> W/results.json` (`announce_results`).
"""

from __future__ import annotations

import contextlib

import ml_collections

from moejax.cache import ExpertCache, summary
from moejax.metrics_writer import MetricsWriter
from moejax.policies import presets


def progress(enabled: bool, total: int, desc: str, unit: str = "tok"):
    """A tqdm bar the job updates (None, in a null context, when `log.progress` is off)."""
    if not enabled:
        return contextlib.nullcontext(None)
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=False)


def announce_results(path: str) -> None:
    """Every job's last line: where its results went."""
    print(f"results -> {path}")


def settle(cache: ExpertCache) -> ExpertCache:
    """`cache` with every finished pass's decisions taken: the live runtime may still hold the
    last ones (a complete cache takes a pass's decisions while the next pass runs,
    `CachedExperts.sync`). Whoever reads a cache's metrics or clock calls this first."""
    sync = getattr(cache.sink, "sync", None)
    if sync is not None:
        sync()
    return cache


def requested_capacity(config: ml_collections.ConfigDict) -> str:
    """What the capacity was asked as, and of what: "5% of the routed experts' native bytes",
    "5% of the model's native bytes" or "cache.slots=12" (and cache.min_slots when set)."""
    c = config.cache
    if c.slots > 0:
        asked = f"cache.slots={c.slots}"
    else:
        of = ("the model's native bytes" if c.capacity_of == "model"
              else "the routed experts' native bytes")
        asked = f"{100 * c.capacity_frac:g}% of {of}"
    return asked + (f", at least cache.min_slots={c.min_slots} per pool" if c.min_slots else "")


def cache_header(config: ml_collections.ConfigDict, cache: ExpertCache,
                 policies: dict | None = None, bytes_known: bool = True) -> str:
    """One line naming the cache's size (and what each share is of: the slots of the experts,
    the request of the bytes, and how much smaller a quantized expert is), policies, hardware
    and clock (above the table)."""
    hw, s = cache.clock.hw, cache.shape
    p = policies or presets.resolve(config.policies)
    if len(s.pools) == 1:
        slots = (f"{s.num_slots}/{s.total_experts} expert slots at {s.precision} = "
                 f"{100 * s.num_slots / s.total_experts:.1f}% of the experts")
    else:
        slots = " + ".join(f"{pool.num_slots} {pool.precision}" for pool in s.pools) + \
            f" slots for {s.total_experts} experts"
    native = dict(s.precision_bytes).get("native")
    smaller = [f"an {pool.precision} expert is {pool.expert_bytes / native:.2f} of a native one"
               for pool in s.pools if pool.precision != "native" and native and bytes_known]
    requested = "; ".join([f"requested {requested_capacity(config)}", *smaller])
    return (f"cache: {slots} ({requested}), eviction "
            f"{p['eviction']}, prefetch {p['prefetch']}, miss {p['miss']}, routing "
            f"{p['routing']}; {hw.name} at {hw.h2d_gbps:g} GB/s host->device, "
            f"{cache.clock.kind} clock{_host_words(cache)}")


def _host_words(cache: ExpertCache) -> str:
    """The host that computes experts, when the run computes any there."""
    path = cache.host_path
    if path is None or not (cache.miss.computes_on_host or cache.host_layers):
        return ""
    layers = f", the first {len(cache.host_layers)} MoE layers" if cache.host_layers else ""
    return f"; experts computed on host {path.host.name}{layers}"


def cache_clock_words(cache: ExpertCache) -> str:
    """The clock the cache's times are on, in words (`summary.clock_words`)."""
    return summary.clock_words(cache.clock.kind, cache.clock.hw.name, cache.clock.hw.h2d_gbps,
                               summary.model_words(cache))


def cache_table(config: ml_collections.ConfigDict, cache: ExpertCache, *, header: str = "",
                bytes_known: bool = True, policies: dict | None = None,
                no_ttft: str = summary.NO_PREFILL) -> str:
    """The printed table of a cache (`summary.table`) under `cache_header` (or `header`), its
    timing line naming the cache's clock."""
    header = header or cache_header(config, cache, policies, bytes_known)
    return summary.table(settle(cache).metrics, header,
                         bytes_known=bytes_known, host=cache.host,
                         clock=cache_clock_words(cache), no_ttft=no_ttft,
                         staging=cache.staging)


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
        summary.write_tensorboard(writer, cache.metrics, bytes_known=expert_bytes_known,
                                  clock=cache.clock.kind)
        writer.close()
    return summary.cache_results(cache, policies or presets.report(config.policies),
                                passes=passes, expert_bytes_known=expert_bytes_known)
