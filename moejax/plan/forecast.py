"""A candidate configuration's forecast: the workload replayed through a fresh cache of that
configuration on the virtual clock of the given machine, and the band the clock's own
validation puts around it.

A candidate is a set of config overrides (`cache.slots`, `cache.precision`, the policies, the
queue, the miss handling). Its forecast is what a replay job of the plan's config with those
overrides would report: the decode rate and the cold TTFT of the cache's timing
(`CacheMetrics.timing`), summed over the workload's traces (tokens over seconds), its hit
rate, and the bytes it holds and moves. Nothing here is estimated apart from the replay: the
numbers are the replay engine's, counter for counter (the compiled engine where it covers the
candidate, the reference otherwise).

The band (`band_of`): a hardware.json validated by `python -m moejax.calibration.validate`
records the clock's error over its live cells, `e = (virtual - wall) / wall` of a time, and a
live run decodes at `forecast x (1 + e)` tokens a second (`tokens / wall`, `wall = virtual /
(1 + e)`). The band is the central 90% of those errors: `[forecast x (1 + e5), forecast x (1 +
e95)]` with `e5`, `e95` the 5th and 95th percentiles of the signed errors
(`validation.decode.signed_p5`, `signed_p95`), so it holds the live rate of 90% of the
validation's cells and carries the clock's bias (a clock that predicts less time than the runs
take has a band below its forecast's mirror image); a TTFT's is `[forecast / (1 + e95),
forecast / (1 + e5)]`. A validation summary written before those percentiles were recorded
gives the symmetric band of its 90th percentile of |error|, `forecast x (1 -+ p90)`, said as
such. A preset, or a file never validated, has no band: its clock was never compared with this
machine. A candidate outside the conditions the validation's cells ran (its evictions,
prefetchers, queues, precisions and miss policies, recorded as `validation.covers`) gets no
band: the errors were measured on other policies, whose live costs the clock may model less
well; nor do the conditions the validation found the clock far off in (the disk tier, host
compute: docs/findings/clock_validation.md). Each says why.
"""

from __future__ import annotations

import dataclasses
import json

import ml_collections

from moejax.errors import ConfigError
from moejax.jobs import replay as replay_job
from moejax.jobs.cache_report import settle
from moejax.model_config import ModelConfig
from moejax.replay import replay

# Where the clock's validation measured it 30-76% off (docs/findings/clock_validation.md):
# no band is drawn for a candidate that runs them.
UNVALIDATED = ("the disk tier", "host compute")


@dataclasses.dataclass(frozen=True)
class Validation:
    """What a hardware.json's validation says of its clock, per metric ("decode", "ttft"):
    the 5th and 95th percentiles of the signed error (None in a summary written before they
    were recorded) and the 90th percentile of |error|, over `cells` live cells on `date`."""

    signed: dict[str, tuple[float, float] | None]
    p90: dict[str, float | None]
    cells: int
    date: str
    source: str
    # The settings its cells ran, per field (`moejax.calibration.validate.covers`; None in a
    # summary written before they were recorded).
    covers: dict[str, list[str]] | None = None

    def outside(self, overrides: dict) -> list[str]:
        """The candidate's settings the validation's cells never ran, in words."""
        if not self.covers:
            return []
        out = []
        for field, ran in self.covers.items():
            value = overrides.get(field)
            if value is not None and str(value) not in ran:
                out.append(f"{field.split('.')[-1]} {value} (the validation ran "
                           f"{', '.join(ran)})")
        return out

    def errors(self, metric: str) -> tuple[float, float] | None:
        """The error range the band spans: the signed 5th-95th percentiles, else -+ p90."""
        if self.signed.get(metric) is not None:
            return self.signed[metric]
        p90 = self.p90.get(metric)
        return None if p90 is None else (-p90, p90)

    def words(self) -> str:
        def pct(x):
            return f"{100 * x:+.1f}%"

        def span(metric):
            e = self.errors(metric)
            return "n/a" if e is None else f"{pct(e[0])} to {pct(e[1])}"
        kind = ("the central 90% of its signed errors" if self.signed.get("decode") is not None
                else "-+ its 90th percentile of |error| (a summary without signed percentiles)")
        return (f"the clock's validation of {self.date} on {self.cells} live cells, {kind}: "
                f"decode {span('decode')}, TTFT {span('ttft')}")


def validation_of(hardware_file: str) -> Validation | None:
    """The validation recorded in `hardware_file` (None: none recorded, or no file)."""
    if not hardware_file:
        return None
    with open(hardware_file) as f:  # (read and checked already: the run's hardware profile)
        doc = json.load(f)
    v = doc.get("validation") if isinstance(doc, dict) else None
    if not isinstance(v, dict):
        return None

    def number(metric, key):
        m = v.get(metric)
        x = m.get(key) if isinstance(m, dict) else None
        return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None

    signed, p90 = {}, {}
    for metric in ("decode", "ttft"):
        low, high = number(metric, "signed_p5"), number(metric, "signed_p95")
        signed[metric] = (low, high) if low is not None and high is not None else None
        p90[metric] = number(metric, "p90")
    covers = v.get("covers")
    if not (isinstance(covers, dict) and all(isinstance(x, list) for x in covers.values())):
        covers = None
    return Validation(signed, p90, int(v.get("cells") or 0), str(v.get("date", "?")),
                      hardware_file, covers)


def band_of(value: float | None, errors: tuple[float, float] | None, rate: bool
            ) -> list[float] | None:
    """The band around a forecast `value` (tok/s when `rate`, else seconds) for a clock whose
    time errors span `errors` = (low, high) (module docstring); None without either."""
    if value is None or errors is None:
        return None
    low, high = errors
    if rate:
        return [max(0.0, value * (1 + low)), value * (1 + high)]
    return [value / (1 + high), value / (1 + low) if low > -1 else float("inf")]


def apply(base: ml_collections.ConfigDict, overrides: dict) -> ml_collections.ConfigDict:
    """`base` with the dotted-field `overrides` set (a fresh copy)."""
    c = ml_collections.ConfigDict(base.to_dict())
    for field, value in overrides.items():
        section, name = field.split(".")
        c[section][name] = value
    return c


def unvalidated_parts(overrides: dict, host_bytes: int) -> list[str]:
    """The parts of `UNVALIDATED` a candidate runs."""
    out = []
    if host_bytes:
        out.append(UNVALIDATED[0])
    miss = str(overrides.get("policies.miss", ""))
    if miss.startswith(("host_compute", "latency_aware")) or overrides.get(
            "cache.host_compute_layers"):
        out.append(UNVALIDATED[1])
    return out


class Forecaster:
    """Forecasts of candidates over one workload (`paths`: its trace files) for one model on
    one machine (`base`: the plan's config, its job set to replay), each made once."""

    def __init__(self, base: ml_collections.ConfigDict, paths: list[str], model: ModelConfig,
                 validation: Validation | None):
        self.base, self.paths, self.model, self.validation = base, paths, model, validation
        self.made: dict[tuple, dict] = {}
        self.replays = 0

    def loaded(self, overrides: dict, path: str) -> replay_job.Loaded:
        config = apply(self.base, {**overrides, "replay.trace": path})
        return replay_job.load(config, by_slots=True, model=self.model)

    def forecast(self, overrides: dict) -> dict:
        key = tuple(sorted((k, str(v)) for k, v in overrides.items()))
        if key not in self.made:
            self.made[key] = self._forecast(overrides)
        return self.made[key]

    def _forecast(self, overrides: dict) -> dict:
        decode_s = tokens = requests = hits = 0.0
        h2d = stall = 0.0
        ttft, engines = None, set()
        device_bytes = host_bytes = disk_tier = 0
        for path in self.paths:
            try:
                loaded = self.loaded(overrides, path)
                cache = replay_job.build(loaded)
            except ConfigError as e:
                return {"error": str(e)}
            decision = replay(cache, loaded.traces, loaded.context)
            self.replays += 1
            settle(cache).finish()
            engines.add(decision.engine)
            t, totals = cache.metrics.timing(), cache.metrics.totals()
            decode_s += t["decode_s"]
            tokens += t["decode_tokens"]
            if ttft is None:  # the first trace's cold TTFT: the cache starts empty there
                ttft = t["ttft_s"]
            requests += totals["requests"]
            hits += totals["hits"] + totals["late_hits"]
            h2d += totals["h2d_bytes"]
            stall += t["decode_stall_s"] + t["prefill_stall_s"]
            device_bytes = sum(p.num_slots * p.expert_bytes for p in cache.shape.pools)
            disk_tier = loaded.spec.cache.host_bytes if loaded.spec.cache.host_tier else 0
            # What host memory holds of the experts: the host tier's bound behind a disk
            # tier, else every expert at the plain precision.
            host_bytes = disk_tier or cache.shape.total_experts * cache.shape.expert_bytes
            slots = cache.shape.num_slots
            precision = cache.shape.precision
        decode = tokens / decode_s if decode_s > 0 and tokens else None
        out = {"ttft_s": ttft, "decode_tok_per_s": decode,
               "hit_rate": hits / requests if requests else None,
               "slots": slots, "precision": precision,
               "device_bytes": int(device_bytes), "host_bytes": int(host_bytes),
               "disk_tier": bool(disk_tier),
               "h2d_bytes": h2d, "stall_s": stall, "decode_tokens": int(tokens),
               "engine": "/".join(sorted(engines))}
        off = unvalidated_parts(overrides, disk_tier)
        v = self.validation
        if v is None:
            out["band"], out["ttft_band"] = None, None
            out["band_basis"] = "none: the hardware profile was never validated on a machine"
        elif off:
            out["band"], out["ttft_band"] = None, None
            out["band_basis"] = (f"none: it runs {' and '.join(off)}, where the clock's "
                                 "validation found it 30-76% off")
        elif v.outside(overrides):
            out["band"], out["ttft_band"] = None, None
            out["band_basis"] = ("none: outside the validated conditions: "
                                 + "; ".join(v.outside(overrides)))
        else:
            out["band"] = band_of(decode, v.errors("decode"), rate=True)
            out["ttft_band"] = band_of(ttft, v.errors("ttft"), rate=False)
            out["band_basis"] = v.words()
        return out
