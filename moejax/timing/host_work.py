"""The host's work in the virtual clock: what the live runtime pays besides the device's compute
and the transfers, measured on the machine a profile was calibrated on (DESIGN.md "The host's
work in the virtual clock").

A `HostWork` is hardware.json's `host_work` section (`python -m moejax.calibration` writes
it, `from_file` reads it). Its terms, each in seconds:

* `steps`: per model shape (`model_key`: a step's time is the model's), each compiled step
  the runtime dispatches as a measured table over its size (`StepTable`: tokens, or bytes for
  a slot load) — what the host spends dispatching it (`dispatch_s`) and how long after that
  its results are on the host when waited for (`complete_s`: the device's execution and the
  read back). Interpolated linearly between measured sizes; outside them, or for a model not
  measured, the cost model's roofline is charged instead, and results say how many steps were
  (`StepTable.at` returns None there);
* scalar terms fitted to live runs of the calibration's cells (`TERMS`): a pass's fixed host
  cost, a layer's round trip (its gate read to the host and the runtime's work around a
  decision), a speculative step (its preparation and check), a request decided, a slot load
  and a batch of them dispatched, a prefetch issued. Not a term yet: the disk tier's storage
  reader's CPU (DESIGN.md says what that leaves out).

A profile without this section (every preset: `a100_specmd`, `h200`, ...) keeps the device-only
model: the roofline and the transfers, and every time it prints says "host work not modelled".
"""

from __future__ import annotations

import bisect
import dataclasses
import numbers

from moejax.errors import ConfigError
from moejax.timing.profiles import read_json

SECTION = "host_work"
# Step kinds a table may hold: the runtime's compiled steps. An experts step is measured per
# precision ("experts:int4"); a slot load by the bytes it moves.
STEP_KINDS = ("embed", "attention_router", "dense_layer", "experts", "logits", "load")
# The scalar terms, in the order fits and tables list them, with what each one is.
TERMS = {
    "pass_s": "per forward pass: the generation loop, the pass's begin and end, the next "
              "token read back",
    "round_trip_s": "per MoE layer decided before its experts step (layer by layer), or after "
                    "a complete pass: its gate read back and the runtime's work around the "
                    "decision",
    "speculative_layer_s": "per experts step dispatched speculatively: its slot map and "
                           "arguments, and its check (its gate read back, landed by then)",

    "request_s": "per request the cache decides (routing, miss policy, hit or admission)",
    "load_s": "per slot load dispatched: the cache's admission and eviction, the runtime's "
              "queueing and dispatch, beyond the load step's own",
    "load_batch_s": "per batch of slot loads dispatched together (a wave's demand loads, a "
                    "layer's prefetches): the runtime's fixed work around a batch",
    "prefetch_s": "per prefetch issued: the prediction",
}


@dataclasses.dataclass(frozen=True)
class StepTable:
    """One compiled step's measured time by size (ascending `sizes`)."""

    sizes: tuple[int, ...]
    dispatch_s: tuple[float, ...]
    complete_s: tuple[float, ...]

    def at(self, size: float, extrapolate: bool = False) -> tuple[float, float] | None:
        """`(dispatch_s, complete_s)` at `size`, linear between the two measured sizes around
        it; outside the measured range None (the caller charges the roofline), or with
        `extrapolate` the nearest size's dispatch and its completion scaled by size (a slot
        load of another precision's bytes: a load has no roofline)."""
        sizes = self.sizes
        if size < sizes[0] or size > sizes[-1]:
            if not extrapolate:
                return None
            i = 0 if size < sizes[0] else -1
            return self.dispatch_s[i], self.complete_s[i] * size / sizes[i]
        i = bisect.bisect_left(sizes, size)
        if sizes[i] == size:
            return self.dispatch_s[i], self.complete_s[i]
        lo, hi = i - 1, i
        f = (size - sizes[lo]) / (sizes[hi] - sizes[lo])
        return (self.dispatch_s[lo] + f * (self.dispatch_s[hi] - self.dispatch_s[lo]),
                self.complete_s[lo] + f * (self.complete_s[hi] - self.complete_s[lo]))

    def to_dict(self) -> dict:
        return {"sizes": list(self.sizes), "dispatch_s": list(self.dispatch_s),
                "complete_s": list(self.complete_s)}


def model_key(cfg) -> str:
    """The shape a step table was measured at: what a compiled step's time depends on."""
    return (f"{cfg.family}:hidden={cfg.hidden_size}:expert={cfg.expert_intermediate_size}"
            f":experts={cfg.num_experts}:top_k={cfg.top_k}:heads={cfg.num_heads}/"
            f"{cfg.num_kv_heads}x{cfg.head_dim}:shared={cfg.shared_expert_intermediate_size}"
            f":vocab={cfg.vocab_size}:{cfg.dtype}")


@dataclasses.dataclass(frozen=True)
class HostWork:
    """The host-work terms of a calibrated profile (module docstring)."""

    name: str
    # model_key -> step kind (an experts step: "experts:<precision>") -> StepTable
    steps: dict
    pass_s: float = 0.0
    round_trip_s: float = 0.0
    speculative_layer_s: float = 0.0
    request_s: float = 0.0
    load_s: float = 0.0
    load_batch_s: float = 0.0
    prefetch_s: float = 0.0
    # How far this clock was from the live runtime when last validated (the hardware.json's
    # `validation`, written by `python -m moejax.calibration.validate`), None when it never was.
    validated: dict | None = dataclasses.field(default=None, compare=False)

    def tables(self, cfg) -> dict:
        """The step tables measured for `cfg`'s shape ({} when it was not measured)."""
        return self.steps.get(model_key(cfg), {})

    def terms(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in TERMS}

    def with_terms(self, **terms: float) -> "HostWork":
        return dataclasses.replace(self, **terms)

    def to_dict(self) -> dict:
        return {"name": self.name,
                "steps": {m: {k: t.to_dict() for k, t in tables.items()}
                          for m, tables in self.steps.items()},
                **self.terms()}


def _number(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not v - v == 0 or v < 0:
        raise ConfigError(f"{where}={v!r} must be a finite number >= 0")
    return float(v)


def _table(name: str, doc, where: str) -> StepTable:
    kind = name.split(":")[0]
    if kind not in STEP_KINDS:
        raise ConfigError(f"{where}: step {name!r} is not one of {list(STEP_KINDS)}")
    if not isinstance(doc, dict) or set(doc) != {"sizes", "dispatch_s", "complete_s"}:
        raise ConfigError(f"{where}: step {name!r} takes sizes, dispatch_s and complete_s")
    columns = [doc[k] for k in ("sizes", "dispatch_s", "complete_s")]
    if not all(isinstance(c, list) and c and len(c) == len(columns[0]) for c in columns):
        raise ConfigError(f"{where}: step {name!r} needs three lists of one length")
    sizes = [_number(v, f"{where}: {name}.sizes") for v in columns[0]]
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise ConfigError(f"{where}: step {name!r}'s sizes must increase")
    return StepTable(tuple(int(s) for s in sizes),
                     tuple(_number(v, f"{where}: {name}.dispatch_s") for v in columns[1]),
                     tuple(_number(v, f"{where}: {name}.complete_s") for v in columns[2]))


def from_dict(doc, where: str, validated: dict | None = None) -> HostWork:
    """A `host_work` section as a `HostWork` (`validated`: the file's validation summary); a
    bad field is a ConfigError naming `where`."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: its {SECTION} section must be an object")
    known = {"name", "steps", *TERMS, "fit"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ConfigError(f"{where}: its {SECTION} section has a field {unknown[0]!r} "
                          f"(it takes {sorted(known)})")
    if not isinstance(doc.get("name"), str) or not doc["name"]:
        raise ConfigError(f"{where}: its {SECTION} section needs a name")
    steps = doc.get("steps", {})
    if not isinstance(steps, dict) or not all(isinstance(v, dict) for v in steps.values()):
        raise ConfigError(f"{where}: {SECTION}.steps must map a model's shape to its steps")
    tables = {m: {k: _table(k, v, where) for k, v in kinds.items()}
              for m, kinds in steps.items()}
    return HostWork(doc["name"], tables,
                    **{k: _number(doc.get(k, 0.0), f"{where}: {SECTION}.{k}") for k in TERMS},
                    validated=validated)


def from_file(path: str) -> HostWork | None:
    """The `host_work` section of the hardware.json at `path`, None when it has none (a
    calibration from before the host's work was modelled, or a hand-written profile)."""
    where = f"hardware.file={path!r}"
    doc = read_json(path, where)
    if not isinstance(doc, dict) or doc.get(SECTION) is None:
        return None
    validated = doc.get("validation")
    return from_dict(doc[SECTION], where, validated if isinstance(validated, dict) else None)


def words(work: HostWork | None) -> str:
    """What a virtual time modelled, for every line that prints one: "host work not
    modelled" (a preset), or the calibrated host work and how far it was from the live runtime
    when last validated."""
    if work is None:
        return "host work not modelled"
    v = work.validated
    if not v:
        return f"with the live runtime's host work ({work.name}), not validated yet"
    def median(metric: str) -> str:  # (a summary written by hand may lack one)
        m = (v.get(metric) or {}).get("median") if isinstance(v.get(metric), dict) else None
        return "n/a" if not isinstance(m, (int, float)) else f"{100 * m:.0f}%"

    return (f"with the live runtime's host work ({work.name}), validated {v.get('date', '?')}"
            f" on {v.get('cells', '?')} live cells: median |error| TTFT {median('ttft')}, "
            f"decode {median('decode')}")
